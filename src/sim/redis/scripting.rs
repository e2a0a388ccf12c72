//! Scripting commands: `EVAL`, `EVALSHA`, `SCRIPT LOAD`, `SCRIPT EXISTS`, `SCRIPT FLUSH`,
//! and the script cache (compiled functions by SHA1, emptied by a flush or a restart).

use std::collections::BTreeMap;

use mlua::Function;

use super::args::{is, parse_int};
use super::lua::{Call, Vm, sha1_hex};
use super::reply::{NOSCRIPT, NOT_INTEGER, Reply};

/// A server's Lua interpreter and script cache.
pub(crate) struct Scripting {
    vm: Vm,
    cache: BTreeMap<String, Function>,
}

impl Scripting {
    /// An interpreter with an empty cache.
    pub(crate) fn new() -> Scripting {
        Scripting {
            vm: Vm::new(),
            cache: BTreeMap::new(),
        }
    }

    /// Forgets every script and starts a fresh interpreter (`SCRIPT FLUSH`, a restart).
    pub(crate) fn flush(&mut self) {
        *self = Scripting::new();
    }

    /// Compiles and caches `body` unless it is cached; its SHA1, or the compile error.
    fn load_body(&mut self, body: &[u8]) -> Result<String, Reply> {
        let sha = sha1_hex(body);
        if !self.cache.contains_key(&sha) {
            let function = self.vm.compile(body).map_err(|message| {
                Reply::error(format!(
                    "ERR Error compiling script (new function): {message}"
                ))
            })?;
            self.cache.insert(sha.clone(), function);
        }
        Ok(sha)
    }

    /// `EVAL body numkeys key... arg...` (`by_sha`: `EVALSHA sha ...`): checks in Redis's
    /// order (the SHA's length, then `numkeys`, then the cache), then runs the script with
    /// `call` running the commands it calls.
    pub(crate) fn eval(&mut self, args: &[Vec<u8>], by_sha: bool, call: Call<'_>) -> Reply {
        if by_sha && args[1].len() != 40 {
            return Reply::error(NOSCRIPT);
        }
        let Some(numkeys) = parse_int(&args[2]) else {
            return Reply::error(NOT_INTEGER);
        };
        let available = (args.len() - 3) as i64;
        if numkeys > available {
            return Reply::error("ERR Number of keys can't be greater than number of args");
        }
        if numkeys < 0 {
            return Reply::error("ERR Number of keys can't be negative");
        }
        let sha = if by_sha {
            String::from_utf8_lossy(&args[1]).to_ascii_lowercase()
        } else {
            match self.load_body(&args[1]) {
                Ok(sha) => sha,
                Err(e) => return e,
            }
        };
        let Some(function) = self.cache.get(&sha) else {
            return Reply::error(NOSCRIPT);
        };
        let split = 3 + numkeys as usize;
        self.vm
            .run(function, &sha, &args[3..split], &args[split..], call)
    }

    /// `SCRIPT LOAD body`: its SHA1.
    pub(crate) fn load(&mut self, args: &[Vec<u8>]) -> Reply {
        match self.load_body(&args[2]) {
            Ok(sha) => Reply::bulk(sha),
            Err(e) => e,
        }
    }

    /// `SCRIPT EXISTS sha [sha ...]`: 1 or 0 for each (SHAs compared without case).
    pub(crate) fn exists(&self, args: &[Vec<u8>]) -> Reply {
        Reply::Array(
            args[2..]
                .iter()
                .map(|sha| {
                    let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                    Reply::Int(i64::from(self.cache.contains_key(&sha)))
                })
                .collect(),
        )
    }

    /// `SCRIPT FLUSH [ASYNC|SYNC]`.
    pub(crate) fn flush_command(&mut self, args: &[Vec<u8>]) -> Reply {
        let valid = match args.len() {
            2 => true,
            3 => is(&args[2], "sync") || is(&args[2], "async"),
            _ => false,
        };
        if !valid {
            return Reply::error("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
        }
        self.flush();
        Reply::ok()
    }
}
