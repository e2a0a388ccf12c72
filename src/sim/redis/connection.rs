//! A client connection as a server keeps it: the commands it sent that have not run yet
//! (those behind a blocked command wait), the replies not yet taken, what it is blocked
//! on, and how far into the replication stream its own writes reach (for `WAIT`).

use std::collections::VecDeque;

use super::blocking::Block;
use super::reply::Reply;

/// One command: its name and arguments, as sent.
pub(crate) type Command = Vec<Vec<u8>>;

/// A connection's handle on one server; never reused, so a handle from before a restart
/// stays closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ConnId(pub(crate) u64);

/// The server's side of one connection.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    /// Commands received and not run yet, in order.
    pub pending: VecDeque<Command>,
    /// Replies produced and not taken yet, in order.
    pub replies: Vec<Reply>,
    /// The blocked command, if one is blocked (nothing behind it runs until it returns).
    pub block: Option<Block>,
    /// The replication offset right after this connection's last write (Redis's `woff`).
    pub woff: u64,
}

/// A command as `["SET", "k", "v"]`.
pub(crate) fn command(args: &[&str]) -> Command {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// The command a [`redis::Cmd`] packs (how the protocol machines' calls reach the model).
pub(crate) fn from_cmd(cmd: &redis::Cmd) -> Command {
    cmd.args_iter()
        .filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_cmd_becomes_its_arguments() {
        let mut cmd = redis::cmd("SET");
        cmd.arg("k").arg(42).arg("PX").arg(100u64);
        assert_eq!(from_cmd(&cmd), command(&["SET", "k", "42", "PX", "100"]));
    }
}
