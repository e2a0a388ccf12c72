//! The Lua bridge: an embedded Lua 5.1 set up as Redis 7.0 sets up its scripting engine,
//! and the conversions between Lua values and replies both ways.
//!
//! What a script sees: the base, table, string and math libraries (without `print`,
//! `dofile`, `loadfile`, `setfenv`, `getfenv`, `newproxy`, `io`, `os`, `debug`,
//! `package`), read-only globals (reading a missing one raises "Script attempted to access
//! nonexistent global variable", any assignment "Attempt to modify a readonly table"),
//! `KEYS`, `ARGV`, and `redis.call`, `redis.pcall`, `redis.error_reply`,
//! `redis.status_reply`, `redis.sha1hex`, `redis.log` and its levels. Scripts are compiled
//! as the chunk `@user_script`, so error texts name the same lines as Redis's.
//!
//! Errors follow Redis's handler: a raised error becomes a table `{err=...}` (a string
//! error gets the code `ERR`), the position of the Lua code that raised it is added, and
//! the reply reads `<err> script: <sha>, on @user_script:<line>.`. `redis.call` raises
//! the error table of a failed command; Rust functions cannot raise a Lua table through
//! mlua, so they leave their error text in a slot that the (Rust) handler picks up, which
//! keeps the stack levels the handler inspects the same as in Redis.

use std::cell::RefCell;

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value, Variadic};

use super::reply::{Reply, format_double, format_g};

/// The error text a Rust function raised, waiting for the error handler (Lua app data).
struct Raised(Option<String>);

/// The command runner a script's `redis.call` and `redis.pcall` use.
pub(crate) type Call<'a> = &'a mut dyn FnMut(&[Vec<u8>]) -> Reply;

/// One Lua interpreter, set up as Redis's.
pub(crate) struct Vm {
    lua: Lua,
    /// The real globals (libraries, `redis`, `KEYS`, `ARGV`).
    globals: Table,
    /// The scripts' environment: reads fall through to the globals, writes are refused.
    env: Table,
    xpcall: Function,
    handler: Function,
}

impl Vm {
    /// A fresh interpreter (Redis makes one at start and at `SCRIPT FLUSH`).
    pub(crate) fn new() -> Vm {
        Self::build().expect("setting up the Lua interpreter")
    }

    fn build() -> mlua::Result<Vm> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        lua.set_app_data(Raised(None));
        let globals = lua.globals();
        for name in [
            "print", "dofile", "loadfile", "setfenv", "getfenv", "newproxy", "module", "require",
            "package", "io", "os", "debug",
        ] {
            globals.raw_set(name, Value::Nil)?;
        }
        globals.raw_set("redis", redis_library(&lua)?)?;
        let xpcall: Function = globals.raw_get("xpcall")?;

        let missing =
            lua.create_function(|lua, (_table, name): (Value, Value)| -> mlua::Result<()> {
                let name = describe(lua, &name);
                let place = position_prefix(lua);
                Err(raise(
                    lua,
                    format!(
                        "ERR {place}Script attempted to access nonexistent global variable '{name}'"
                    ),
                ))
            })?;
        let readonly = lua.create_function(|lua, _: MultiValue| -> mlua::Result<()> {
            let place = position_prefix(lua);
            Err(raise(
                lua,
                format!("ERR {place}Attempt to modify a readonly table"),
            ))
        })?;
        let protect = lua.create_table()?;
        protect.raw_set("__index", missing)?;
        protect.raw_set("__newindex", readonly.clone())?;
        globals.set_metatable(Some(protect))?;
        let env = lua.create_table()?;
        let through = lua.create_table()?;
        through.raw_set("__index", globals.clone())?;
        through.raw_set("__newindex", readonly)?;
        env.set_metatable(Some(through))?;

        let handler = lua.create_function(error_handler)?;
        Ok(Vm {
            lua,
            globals,
            env,
            xpcall,
            handler,
        })
    }

    /// Compiles a script body, or returns Lua's message (`user_script:1: ...`).
    pub(crate) fn compile(&self, body: &[u8]) -> Result<Function, String> {
        self.lua
            .load(body)
            .set_name("@user_script")
            .set_environment(self.env.clone())
            .into_function()
            .map_err(|e| match e {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            })
    }

    /// Runs a compiled script with `KEYS` and `ARGV`; `call` runs the commands it calls.
    /// The script's return value (or its error) becomes the reply; `sha` names it in
    /// error texts.
    pub(crate) fn run(
        &self,
        script: &Function,
        sha: &str,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        call: Call<'_>,
    ) -> Reply {
        let call = RefCell::new(call);
        let outcome = self.lua.scope(|scope| {
            self.globals.raw_set("KEYS", self.strings(keys)?)?;
            self.globals.raw_set("ARGV", self.strings(argv)?)?;
            let redis: Table = self.globals.raw_get("redis")?;
            redis.raw_set(
                "call",
                scope.create_function(|lua, args: Variadic<Value>| {
                    redis_call(lua, &call, &args, true)
                })?,
            )?;
            redis.raw_set(
                "pcall",
                scope.create_function(|lua, args: Variadic<Value>| {
                    redis_call(lua, &call, &args, false)
                })?,
            )?;
            let results: MultiValue = self.xpcall.call((script.clone(), self.handler.clone()))?;
            let mut results = results.into_iter();
            let ok = matches!(results.next(), Some(Value::Boolean(true)));
            let value = results.next().unwrap_or(Value::Nil);
            Ok(if ok {
                to_reply(&value, 0)
            } else {
                script_error(&value, sha)
            })
        });
        outcome.unwrap_or_else(|e| Reply::error(format!("ERR sim: the Lua bridge failed: {e}")))
    }

    fn strings(&self, items: &[Vec<u8>]) -> mlua::Result<Table> {
        let table = self.lua.create_table_with_capacity(items.len(), 0)?;
        for (i, item) in items.iter().enumerate() {
            table.raw_set(i + 1, self.lua.create_string(item)?)?;
        }
        Ok(table)
    }
}

/// Leaves `text` (an error with its code) for the handler and returns the error that
/// raises it.
fn raise(lua: &Lua, text: String) -> mlua::Error {
    if let Some(mut slot) = lua.app_data_mut::<Raised>() {
        slot.0 = Some(text.clone());
    }
    mlua::Error::runtime(text)
}

/// The error text a Rust function left for the handler, if any.
fn take_raised(lua: &Lua) -> Option<String> {
    lua.app_data_mut::<Raised>()
        .and_then(|mut slot| slot.0.take())
}

/// `luaL_where(L, 1)` seen from a Rust function: `user_script:3: `, or nothing when its
/// caller is not Lua code with a line.
fn position_prefix(lua: &Lua) -> String {
    lua.inspect_stack(1, |d| {
        let line = d.current_line()?;
        let source = d.source().short_src?.into_owned();
        Some(format!("{source}:{line}: "))
    })
    .flatten()
    .unwrap_or_default()
}

/// `tostring(value)`, for error texts.
fn describe(lua: &Lua, value: &Value) -> String {
    lua.globals()
        .raw_get::<Function>("tostring")
        .and_then(|f| f.call::<mlua::String>(value.clone()))
        .map(|s| String::from_utf8_lossy(&s.as_bytes()).into_owned())
        .unwrap_or_else(|_| value.type_name().to_owned())
}

/// Redis's `__redis__err__handler`: turns the error into a table `{err=...}` and adds
/// `source` and `line` of the Lua code that raised it (the caller, when the error came
/// from a C or Rust function such as `error` or `redis.call`).
fn error_handler(lua: &Lua, err: Value) -> mlua::Result<Table> {
    let table = match err {
        Value::Table(t) => t,
        Value::Error(_) | Value::UserData(_) => {
            let text = take_raised(lua).unwrap_or_else(|| format!("ERR {}", describe(lua, &err)));
            let t = lua.create_table()?;
            t.raw_set("err", text)?;
            t
        }
        other => {
            let t = lua.create_table()?;
            t.raw_set("err", format!("ERR {}", describe(lua, &other)))?;
            t
        }
    };
    let frame = |level: usize| {
        lua.inspect_stack(level, |d| {
            let source = d.source();
            (
                source.what,
                source.source.map(|s| s.into_owned()),
                d.current_line(),
            )
        })
    };
    let mut info = frame(1);
    if matches!(info, Some(("C", _, _))) {
        info = frame(2);
    }
    if let Some((_, source, line)) = info {
        if let Some(source) = source {
            table.raw_set("source", source)?;
        }
        if let Some(line) = line {
            table.raw_set("line", line)?;
        }
    }
    Ok(table)
}

/// The reply of a script that raised `value` (the handler's table).
fn script_error(value: &Value, sha: &str) -> Reply {
    let Value::Table(table) = value else {
        return Reply::error(format!("ERR Error running script {sha}, execution failure"));
    };
    let text = |field: &str| match table.raw_get::<Value>(field) {
        Ok(Value::String(s)) => Some(String::from_utf8_lossy(&s.as_bytes()).into_owned()),
        Ok(Value::Number(n)) => Some(format_g(n, 14)),
        Ok(Value::Integer(n)) => Some(n.to_string()),
        _ => None,
    };
    let message = text("err").unwrap_or_default();
    match (text("source"), text("line")) {
        (Some(source), Some(line)) => {
            Reply::error(format!("{message} script: {sha}, on {source}:{line}."))
        }
        _ => Reply::error(message),
    }
}

/// `redis.call` (`raise`) or `redis.pcall`: converts the arguments, runs the command, and
/// converts its reply; an error reply is raised by `call` and returned as `{err=...}` by
/// `pcall`.
fn redis_call(
    lua: &Lua,
    call: &RefCell<Call<'_>>,
    args: &[Value],
    raise_errors: bool,
) -> mlua::Result<Value> {
    let reply = match command_args(args) {
        Ok(command) => (call.borrow_mut())(&command),
        Err(text) => Reply::Error(text),
    };
    match reply {
        Reply::Error(text) if raise_errors => Err(raise(lua, text)),
        reply => to_lua(lua, reply),
    }
}

/// The command a script's call names: strings as they are, numbers as `%.17g`.
fn command_args(args: &[Value]) -> Result<Vec<Vec<u8>>, String> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call".into());
    }
    args.iter()
        .map(|arg| match arg {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            Value::Integer(n) => Ok(format_double(*n as f64).into_bytes()),
            Value::Number(n) => Ok(format_double(*n).into_bytes()),
            _ => Err("ERR Lua redis lib command arguments must be strings or integers".into()),
        })
        .collect()
}

/// A reply as Lua sees it: integer → number, bulk → string, nil → false, array → table,
/// status → `{ok=...}`, error → `{err=...}`.
pub(crate) fn to_lua(lua: &Lua, reply: Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Int(n) => Value::Number(n as f64),
        Reply::Bulk(bytes) => Value::String(lua.create_string(&bytes)?),
        Reply::Nil => Value::Boolean(false),
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s)?;
            Value::Table(t)
        }
        Reply::Error(e) => {
            let t = lua.create_table()?;
            t.raw_set("err", e)?;
            Value::Table(t)
        }
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// How deep nested tables are followed before Redis's stack would run out.
const MAX_DEPTH: usize = 1000;

/// A Lua value as the reply Redis makes of it: number → integer (truncated; out of range
/// or NaN as x86 converts it, the smallest integer), string → bulk, true → 1, false and
/// nil → nil, `{err=}` → error, `{ok=}` → status, `{double=}` → a double, other tables →
/// arrays up to the first nil.
pub(crate) fn to_reply(value: &Value, depth: usize) -> Reply {
    match value {
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(n) => Reply::Int(*n),
        Value::Number(n) => Reply::Int(truncate(*n)),
        Value::Table(_) if depth >= MAX_DEPTH => Reply::error("ERR reached lua stack limit"),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(String::from_utf8_lossy(&e.as_bytes()).into_owned());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                let status = String::from_utf8_lossy(&s.as_bytes()).replace(['\r', '\n'], " ");
                return Reply::Status(status);
            }
            match t.raw_get::<Value>("double") {
                Ok(Value::Number(d)) => return Reply::double(d),
                Ok(Value::Integer(d)) => return Reply::double(d as f64),
                _ => {}
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(item) => items.push(to_reply(&item, depth + 1)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}

/// C's `(long long)` of a double on x86: truncation, and the smallest integer for NaN and
/// anything out of range.
fn truncate(n: f64) -> i64 {
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

/// The `redis` table, without `call` and `pcall` (set for each run).
fn redis_library(lua: &Lua) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.raw_set(
        "error_reply",
        lua.create_function(|lua, args: Variadic<Value>| {
            let t = lua.create_table()?;
            let text = match args.first() {
                Some(Value::String(s)) if args.len() == 1 => {
                    error_reply_text(&String::from_utf8_lossy(&s.as_bytes()))
                }
                _ => "ERR wrong number or type of arguments".to_owned(),
            };
            t.raw_set("err", text)?;
            Ok(t)
        })?,
    )?;
    redis.raw_set(
        "status_reply",
        lua.create_function(|lua, args: Variadic<Value>| {
            let t = lua.create_table()?;
            match args.first() {
                Some(Value::String(s)) if args.len() == 1 => t.raw_set("ok", s.clone())?,
                _ => t.raw_set("err", "ERR wrong number or type of arguments")?,
            }
            Ok(t)
        })?,
    )?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|_, s: mlua::String| Ok(sha1_hex(&s.as_bytes())))?,
    )?;
    redis.raw_set("log", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set("setresp", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set("set_repl", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set(
        "replicate_commands",
        lua.create_function(|_, _: MultiValue| Ok(true))?,
    )?;
    for (name, level) in [
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
    ] {
        redis.raw_set(name, level)?;
    }
    Ok(redis)
}

/// The text of `redis.error_reply(s)`: `-CODE msg` or `CODE msg` keeps its code, a text
/// without a space gets `ERR`.
fn error_reply_text(s: &str) -> String {
    let s = s.strip_prefix('-').unwrap_or(s);
    match s.split_once(' ') {
        Some((code, message)) => format!("{code} {}", message.trim_matches(['\r', '\n'])),
        None => format!("ERR {}", s.trim_matches(['\r', '\n'])),
    }
}

/// The SHA1 of a script body, in lower-case hex (as `EVAL` caches it).
pub(crate) fn sha1_hex(body: &[u8]) -> String {
    redis::Script::new(&String::from_utf8_lossy(body))
        .get_hash()
        .to_owned()
}
