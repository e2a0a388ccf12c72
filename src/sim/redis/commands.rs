//! The command table (names, arities and flags as Redis 7.0 declares them) and the checks
//! Redis makes before running a command, in its order: for a client (unknown command,
//! arity, out of memory, read-only replica) and for a script (unknown, arity, not allowed
//! from scripts, read-only replica, out of memory, each of the last two only until the
//! script's first write).

use super::args::is;
use super::keyspace::Keyspace;
use super::reply::{OOM, READONLY, Reply};
use super::{hashes, keys, lists, strings, zsets};

/// A command that only touches the keyspace (and its clock).
pub(crate) type Handler = fn(&mut Keyspace, &[Vec<u8>]) -> Reply;

/// What runs a command.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// The keyspace alone.
    Data(Handler),
    /// `EVAL`.
    Eval,
    /// `EVALSHA`.
    EvalSha,
    /// `SCRIPT LOAD`.
    ScriptLoad,
    /// `SCRIPT FLUSH`.
    ScriptFlush,
    /// `SCRIPT EXISTS`.
    ScriptExists,
    /// `WAIT`.
    Wait,
    /// `BLPOP`.
    Blpop,
    /// `SCRIPT` without a subcommand (always refused by its arity).
    Container,
}

/// One command as Redis declares it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The name in errors: lower case, `container|sub` for a subcommand.
    pub name: &'static str,
    /// Redis's arity: exactly `n` arguments (with the name), or at least `-n`.
    pub arity: i32,
    /// A write command (refused on a replica, marks a script dirty).
    pub write: bool,
    /// May add data (refused under `maxmemory`).
    pub deny_oom: bool,
    /// Not callable from a script.
    pub no_script: bool,
    /// What runs it.
    pub kind: Kind,
}

const fn spec(name: &'static str, arity: i32, flags: &str, kind: Kind) -> Spec {
    let f = flags.as_bytes();
    Spec {
        name,
        arity,
        write: !f.is_empty() && f[0] == b'w',
        deny_oom: f.len() > 1 && f[1] == b'm',
        no_script: f.len() > 2 && f[2] == b's',
        kind,
    }
}

/// Flags, by position: `w` write, `m` deny-oom, `s` no-script (`-` for none).
const TABLE: &[Spec] = &[
    spec("get", 2, "", Kind::Data(strings::get)),
    spec("mget", -2, "", Kind::Data(strings::mget)),
    spec("set", -3, "wm", Kind::Data(strings::set)),
    spec("del", -2, "w", Kind::Data(keys::del)),
    spec("exists", -2, "", Kind::Data(keys::exists)),
    spec("pexpire", -3, "w", Kind::Data(keys::pexpire)),
    spec("pttl", 2, "", Kind::Data(keys::pttl)),
    spec("type", 2, "", Kind::Data(keys::type_of)),
    spec("time", 1, "", Kind::Data(time)),
    spec("ping", -1, "", Kind::Data(ping)),
    spec("rpush", -3, "wm", Kind::Data(lists::rpush)),
    spec("llen", 2, "", Kind::Data(lists::llen)),
    spec("blpop", -3, "w-s", Kind::Blpop),
    spec("zadd", -4, "wm", Kind::Data(zsets::zadd)),
    spec("zrem", -3, "w", Kind::Data(zsets::zrem)),
    spec("zrange", -4, "", Kind::Data(zsets::zrange)),
    spec(
        "zremrangebyscore",
        4,
        "w",
        Kind::Data(zsets::zremrangebyscore),
    ),
    spec("zcount", 4, "", Kind::Data(zsets::zcount)),
    spec("zscore", 3, "", Kind::Data(zsets::zscore)),
    spec("zcard", 2, "", Kind::Data(zsets::zcard)),
    spec("hset", -4, "wm", Kind::Data(hashes::hset)),
    spec("hget", 3, "", Kind::Data(hashes::hget)),
    spec("hmget", -3, "", Kind::Data(hashes::hmget)),
    spec("hgetall", 2, "", Kind::Data(hashes::hgetall)),
    spec("hdel", -3, "w", Kind::Data(hashes::hdel)),
    spec("hlen", 2, "", Kind::Data(hashes::hlen)),
    spec("hexists", 3, "", Kind::Data(hashes::hexists)),
    spec("eval", -3, "--s", Kind::Eval),
    spec("evalsha", -3, "--s", Kind::EvalSha),
    spec("wait", 3, "--s", Kind::Wait),
    spec("script", -2, "--s", Kind::Container),
];

/// `SCRIPT`'s subcommands (`script|<sub>`).
const SCRIPT: &[(&str, Spec)] = &[
    ("load", spec("script|load", 3, "--s", Kind::ScriptLoad)),
    ("flush", spec("script|flush", -2, "--s", Kind::ScriptFlush)),
    (
        "exists",
        spec("script|exists", -3, "--s", Kind::ScriptExists),
    ),
];

/// What a command name resolves to.
enum Lookup {
    Found(&'static Spec),
    Unknown,
    UnknownSubcommand,
}

fn lookup(args: &[Vec<u8>]) -> Lookup {
    let Some(name) = args.first() else {
        return Lookup::Unknown;
    };
    let Some(spec) = TABLE.iter().find(|s| is(name, s.name)) else {
        return Lookup::Unknown;
    };
    if !matches!(spec.kind, Kind::Container) || args.len() == 1 {
        return Lookup::Found(spec);
    }
    match SCRIPT.iter().find(|(sub, _)| is(&args[1], sub)) {
        Some((_, sub)) => Lookup::Found(sub),
        None => Lookup::UnknownSubcommand,
    }
}

fn arity_ok(spec: &Spec, argc: usize) -> bool {
    let argc = argc as i64;
    let arity = i64::from(spec.arity);
    if arity > 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

/// The server's state that decides whether a command may run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Gates {
    /// Out of memory: commands that add data are refused.
    pub oom: bool,
    /// A read-only replica: writes are refused.
    pub replica: bool,
}

/// The command a client sent, if Redis would run it, or the error Redis replies instead.
pub(crate) fn check_client(args: &[Vec<u8>], gates: Gates) -> Result<&'static Spec, Reply> {
    let spec = match lookup(args) {
        Lookup::Found(spec) => spec,
        Lookup::Unknown => return Err(unknown_command(args)),
        Lookup::UnknownSubcommand => {
            return Err(Reply::error(format!(
                "ERR unknown subcommand '{}'. Try {} HELP.",
                truncated(&args[1], 128),
                String::from_utf8_lossy(&args[0]).to_uppercase()
            )));
        }
    };
    if !arity_ok(spec, args.len()) {
        return Err(Reply::arity(spec.name));
    }
    if spec.deny_oom && gates.oom {
        return Err(Reply::error(OOM));
    }
    if spec.write && gates.replica {
        return Err(Reply::error(READONLY));
    }
    Ok(spec)
}

/// The command a script calls, if Redis would run it, or the error text (with its code)
/// that `redis.call` raises and `redis.pcall` returns. `dirty` is whether the script has
/// already run a write command; a write that passes the checks sets it (even if it then
/// fails, say with `WRONGTYPE`), after which a full memory no longer refuses anything.
pub(crate) fn check_script(
    args: &[Vec<u8>],
    gates: Gates,
    dirty: &mut bool,
) -> Result<Handler, String> {
    let spec = match lookup(args) {
        Lookup::Found(spec) if arity_ok(spec, args.len()) => spec,
        Lookup::Found(_) => {
            return Err("ERR Wrong number of args calling Redis command from script".into());
        }
        _ => return Err("ERR Unknown Redis command called from script".into()),
    };
    if spec.no_script {
        return Err("ERR This Redis command is not allowed from script".into());
    }
    if spec.write && !*dirty {
        if gates.replica {
            return Err(READONLY.into());
        }
        if spec.deny_oom && gates.oom {
            return Err(OOM.into());
        }
    }
    if spec.write {
        *dirty = true;
    }
    match spec.kind {
        Kind::Data(handler) => Ok(handler),
        _ => Err("ERR This Redis command is not allowed from script".into()),
    }
}

/// `ERR unknown command '<name>', with args beginning with: '<a>' '<b>' ` (Redis lists
/// arguments while it has written fewer than 128 bytes of them).
fn unknown_command(args: &[Vec<u8>]) -> Reply {
    let mut listed = String::new();
    for arg in args.iter().skip(1) {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        listed.push_str(&format!("'{}' ", truncated(arg, room)));
    }
    let name = args.first().map_or(String::new(), |n| truncated(n, 128));
    Reply::error(format!(
        "ERR unknown command '{name}', with args beginning with: {listed}"
    ))
}

/// At most `max` bytes of `arg`, as text.
fn truncated(arg: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&arg[..arg.len().min(max)]).into_owned()
}

/// `TIME`: the server's clock as `[seconds, microseconds]` (the model's clock has ms
/// resolution).
fn time(ks: &mut Keyspace, _args: &[Vec<u8>]) -> Reply {
    let now = ks.now();
    Reply::Array(vec![
        Reply::bulk(now.div_euclid(1000).to_string()),
        Reply::bulk((now.rem_euclid(1000) * 1000).to_string()),
    ])
}

/// `PING [message]`.
fn ping(_ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match args.len() {
        1 => Reply::Status("PONG".into()),
        2 => Reply::Bulk(args[1].clone()),
        _ => Reply::arity("ping"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs one keyspace command as a client would send it (the checks included).
    pub(crate) fn run(ks: &mut Keyspace, args: &[&str]) -> Reply {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        match check_client(&args, Gates::default()) {
            Ok(Spec {
                kind: Kind::Data(handler),
                ..
            }) => handler(ks, &args),
            Ok(spec) => panic!("{} is not a keyspace command", spec.name),
            Err(e) => e,
        }
    }

    fn text(reply: Reply) -> String {
        match reply {
            Reply::Error(e) => e,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn client_commands_are_checked_in_redis_order() {
        let mut ks = Keyspace::default();
        assert_eq!(
            text(run(&mut ks, &["foo", "a", "b"])),
            "ERR unknown command 'foo', with args beginning with: 'a' 'b' "
        );
        assert_eq!(
            text(run(&mut ks, &["GET"])),
            "ERR wrong number of arguments for 'get' command"
        );
        let args = |a: &[&str]| a.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let oom = Gates {
            oom: true,
            replica: false,
        };
        assert_eq!(
            text(check_client(&args(&["set", "k"]), oom).unwrap_err()),
            "ERR wrong number of arguments for 'set' command"
        );
        assert_eq!(
            text(check_client(&args(&["set", "k", "v", "zz"]), oom).unwrap_err()),
            OOM
        );
        assert!(check_client(&args(&["del", "k"]), oom).is_ok());
        let replica = Gates {
            oom: false,
            replica: true,
        };
        assert_eq!(
            text(check_client(&args(&["del", "k"]), replica).unwrap_err()),
            READONLY
        );
        assert!(check_client(&args(&["get", "k"]), replica).is_ok());
        assert_eq!(
            text(check_client(&args(&["script", "foo"]), oom).unwrap_err()),
            "ERR unknown subcommand 'foo'. Try SCRIPT HELP."
        );
        assert_eq!(
            text(check_client(&args(&["script"]), oom).unwrap_err()),
            "ERR wrong number of arguments for 'script' command"
        );
        assert_eq!(
            text(check_client(&args(&["script", "load"]), oom).unwrap_err()),
            "ERR wrong number of arguments for 'script|load' command"
        );
        assert_eq!(
            text(run(&mut ks, &["PING", "a", "b"])),
            "ERR wrong number of arguments for 'ping' command"
        );
    }

    #[test]
    fn a_script_may_add_data_under_oom_once_it_has_written() {
        let args = |a: &[&str]| a.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let oom = Gates {
            oom: true,
            replica: false,
        };
        let mut dirty = false;
        assert_eq!(
            check_script(&args(&["SET", "a", "1"]), oom, &mut dirty).unwrap_err(),
            OOM
        );
        assert!(check_script(&args(&["GET", "a"]), oom, &mut dirty).is_ok());
        assert!(!dirty);
        assert!(check_script(&args(&["DEL"]), oom, &mut dirty).is_err());
        assert!(!dirty);
        assert!(check_script(&args(&["ZREM", "z", "m"]), oom, &mut dirty).is_ok());
        assert!(dirty);
        assert!(check_script(&args(&["SET", "a", "1"]), oom, &mut dirty).is_ok());
        assert_eq!(
            check_script(&args(&["BLPOP", "l", "0"]), oom, &mut dirty).unwrap_err(),
            "ERR This Redis command is not allowed from script"
        );
        assert_eq!(
            check_script(&args(&["NOPE"]), oom, &mut dirty).unwrap_err(),
            "ERR Unknown Redis command called from script"
        );
    }
}
