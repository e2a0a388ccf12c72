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
    /// The script, and where its keys and arguments begin in `packed` (after the SHA1), to
    /// resend it as `EVAL` after `NOSCRIPT`.
    script: Option<(&'static Lua, usize)>,
    /// A blocking command: how long the server may hold it.
    block: Option<Duration>,
    /// A pop that waits for a push (`BLPOP`), unlike `WAIT`: what is answered ahead of it
    /// in its request comes long before its own reply.
    pop: bool,
}

impl Call {
    /// A plain command.
    pub fn cmd(cmd: &redis::Cmd) -> Call {
        Call {
            packed: cmd.get_packed_command().into(),
            script: None,
            block: None,
            pop: false,
        }
    }

    /// A command the server holds up to `block` before it answers (`WAIT`).
    pub fn blocking(cmd: &redis::Cmd, block: Duration) -> Call {
        Call {
            block: Some(block),
            ..Call::cmd(cmd)
        }
    }

    /// A pop the server holds up to `block`, until something is pushed to its list
    /// (`BLPOP`).
    pub fn blocking_pop(cmd: &redis::Cmd, block: Duration) -> Call {
        Call {
            pop: true,
            ..Call::blocking(cmd, block)
        }
    }

    /// `EVALSHA` of `lua` with `keys`, then `args`, packed in one buffer (a request per
    /// acquire and per release builds these: no intermediate strings).
    pub fn script(lua: &'static Lua, keys: &[&str], args: &[&dyn ScriptArg]) -> Call {
        let size = 96 + keys.iter().map(|k| k.len() + 16).sum::<usize>() + args.len() * 64;
        let mut packed = Vec::with_capacity(size);
        resp::array(&mut packed, 3 + keys.len() + args.len());
        resp::bulk(&mut packed, b"EVALSHA");
        resp::bulk(&mut packed, lua.sha.as_bytes());
        let tail = packed.len();
        resp::number(&mut packed, keys.len() as u64);
        for key in keys {
            resp::bulk(&mut packed, key.as_bytes());
        }
        for arg in args {
            arg.write(&mut packed);
        }
        Call {
            packed: packed.into(),
            script: Some((lua, tail)),
            block: None,
            pop: false,
        }
    }

    /// The same call with a script as `EVAL`: it cannot be answered `NOSCRIPT`.
    pub fn evaluated(&self) -> Call {
        Call {
            packed: self.as_eval().into(),
            script: None,
            block: self.block,
            pop: self.pop,
        }
    }

    /// The SHA1 of the script this call runs by `EVALSHA`, if it does.
    pub fn script_sha(&self) -> Option<&'static str> {
        self.script.map(|(lua, _)| lua.sha.as_str())
    }

    /// The packed request.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// How long the server may hold this call before it answers (a blocking command).
    pub fn block(&self) -> Option<Duration> {
        self.block
    }

    /// How long the server may hold this call, if it is a pop that waits for a push.
    pub fn pop_block(&self) -> Option<Duration> {
        self.block.filter(|_| self.pop)
    }

    /// The same call as `EVAL` with the script's text (for `NOSCRIPT`).
    pub fn as_eval(&self) -> Vec<u8> {
        match self.script {
            Some((lua, tail)) => {
                // The array header (`*N\r\n`) stays: EVAL takes as many arguments.
                let header = self
                    .packed
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .map_or(0, |i| i + 2);
                let rest = &self.packed[tail..];
                let mut out = Vec::with_capacity(header + lua.code.len() + rest.len() + 32);
                out.extend_from_slice(&self.packed[..header]);
                resp::bulk(&mut out, b"EVAL");
                resp::bulk(&mut out, lua.code.as_bytes());
                out.extend_from_slice(rest);
                out
            }
            None => self.packed.to_vec(),
        }
    }
}

/// Writing RESP: an array header, a bulk string, a number as a bulk string.
mod resp {
    pub fn array(out: &mut Vec<u8>, len: usize) {
        out.push(b'*');
        decimal(out, len as u64);
        out.extend_from_slice(b"\r\n");
    }

    pub fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
        out.push(b'$');
        decimal(out, bytes.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
    }

    pub fn number(out: &mut Vec<u8>, n: u64) {
        let mut digits = [0u8; 20];
        let len = format(&mut digits, n);
        bulk(out, &digits[20 - len..]);
    }

    fn decimal(out: &mut Vec<u8>, n: u64) {
        let mut digits = [0u8; 20];
        let len = format(&mut digits, n);
        out.extend_from_slice(&digits[20 - len..]);
    }

    /// Writes `n`'s decimal digits at the end of `digits`; returns how many.
    fn format(digits: &mut [u8; 20], mut n: u64) -> usize {
        let mut i = 20;
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return 20 - i;
            }
        }
    }
}

/// An argument of a script: a string or a number, written as the bulk string Redis
/// receives.
pub(crate) trait ScriptArg {
    fn write(&self, out: &mut Vec<u8>);
}

impl ScriptArg for &str {
    fn write(&self, out: &mut Vec<u8>) {
        resp::bulk(out, self.as_bytes());
    }
}

impl ScriptArg for String {
    fn write(&self, out: &mut Vec<u8>) {
        resp::bulk(out, self.as_bytes());
    }
}

impl ScriptArg for u64 {
    fn write(&self, out: &mut Vec<u8>) {
        resp::number(out, *self);
    }
}

impl ScriptArg for u8 {
    fn write(&self, out: &mut Vec<u8>) {
        resp::number(out, u64::from(*self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed script call is exactly what the redis crate packs, and so is its `EVAL`
    /// form.
    #[test]
    fn a_script_call_packs_as_the_redis_crate_does() {
        let lua: &'static Lua = Box::leak(Box::new(Lua::new("return 1".to_owned())));
        let call = Call::script(
            lua,
            &["k1", "{k}2"],
            &[&"tok", &0u64, &18446744073709551615u64, &7u8],
        );
        let args: [&[u8]; 7] = [
            b"2",
            b"k1",
            b"{k}2",
            b"tok",
            b"0",
            b"18446744073709551615",
            b"7",
        ];
        let expected = redis::cmd("EVALSHA")
            .arg(&lua.sha)
            .arg(&args[..])
            .get_packed_command();
        assert_eq!(call.packed(), &expected[..]);
        let eval = redis::cmd("EVAL")
            .arg(&lua.code)
            .arg(&args[..])
            .get_packed_command();
        assert_eq!(call.as_eval(), eval);
        assert_eq!(call.evaluated().packed(), &eval[..]);
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
