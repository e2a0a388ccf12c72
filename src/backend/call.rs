//! One command of a request, packed once, and the `WAIT` that asks replicas to acknowledge.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::core::reply;
use crate::error::{Error, ErrorKind};
use crate::scripts::Lua;

/// One command of a request, packed once; cheap to clone (a renewal reuses its lock's).
#[derive(Clone)]
pub(crate) struct Call {
    packed: Arc<[u8]>,
    /// The script and its keys and arguments, to resend as `EVAL` after `NOSCRIPT`.
    script: Option<(&'static Lua, Arc<[Vec<u8>]>)>,
    /// A blocking command: how long the server may hold it.
    block: Option<Duration>,
}

impl Call {
    /// A plain command.
    pub fn cmd(cmd: &redis::Cmd) -> Call {
        Call {
            packed: cmd.get_packed_command().into(),
            script: None,
            block: None,
        }
    }

    /// A command the server holds up to `block` before it answers (`BLPOP`).
    pub fn blocking(cmd: &redis::Cmd, block: Duration) -> Call {
        Call {
            block: Some(block),
            ..Call::cmd(cmd)
        }
    }

    /// `EVALSHA` of `lua` with `keys`, then `args`.
    pub fn script(lua: &'static Lua, keys: &[&str], args: &[&dyn ScriptArg]) -> Call {
        let mut tail: Vec<Vec<u8>> = Vec::with_capacity(1 + keys.len() + args.len());
        tail.push(keys.len().to_string().into_bytes());
        tail.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        tail.extend(args.iter().map(|a| a.bytes()));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&lua.sha).arg(&tail);
        Call {
            packed: cmd.get_packed_command().into(),
            script: Some((lua, tail.into())),
            block: None,
        }
    }

    /// The same call with a script as `EVAL`: it cannot be answered `NOSCRIPT`.
    pub fn evaluated(&self) -> Call {
        Call {
            packed: self.as_eval().into(),
            script: None,
            block: self.block,
        }
    }

    /// The packed request.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// How long the server may hold this call before it answers (a blocking command).
    pub fn block(&self) -> Option<Duration> {
        self.block
    }

    /// The same call as `EVAL` with the script's text (for `NOSCRIPT`).
    pub fn as_eval(&self) -> Vec<u8> {
        match &self.script {
            Some((lua, tail)) => redis::cmd("EVAL")
                .arg(&lua.code)
                .arg(&tail[..])
                .get_packed_command(),
            None => self.packed.to_vec(),
        }
    }
}

/// An argument of a script: a string or a number, as the bytes Redis receives.
pub(crate) trait ScriptArg {
    fn bytes(&self) -> Vec<u8>;
}

impl ScriptArg for &str {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl ScriptArg for String {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl ScriptArg for u64 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl ScriptArg for u8 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

/// Replica acknowledgement asked for a lock: `WAIT n timeout` after each write that may
/// grant or extend it, on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub count: u32,
    pub timeout: Duration,
}

impl Replicas {
    /// The `WAIT` call (its reply may take the timeout).
    pub fn call(&self) -> Call {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.count)
            .arg(self.timeout.as_millis().max(1) as u64);
        Call::blocking(&wait, self.timeout)
    }

    /// `None` when the `WAIT` reply counts enough replicas, else the
    /// [`ErrorKind::Replication`] error that says so (or the reply's own error).
    pub fn shortfall(&self, value: Option<Value>, doing: &str) -> Option<Error> {
        match reply::acknowledged(value) {
            Ok(acked) if acked >= u64::from(self.count) => None,
            Ok(acked) => Some(Error::new(
                ErrorKind::Replication,
                format!(
                    "{doing}: {acked} of the {} replicas asked for acknowledged the write within {:?}",
                    self.count, self.timeout
                ),
            )),
            Err(e) => Some(e),
        }
    }
}
