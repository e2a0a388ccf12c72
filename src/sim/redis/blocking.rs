//! Blocking commands: `BLPOP` (served first-come-first-served across the connections
//! blocked on a key, or timed out) and the block of `WAIT`; deadlines are on the server's
//! wall clock, as Redis keeps them.

use std::collections::BTreeMap;

use super::args::timeout_secs;
use super::connection::{ConnId, Connection};
use super::keyspace::Keyspace;
use super::lists;
use super::reply::Reply;

/// What a blocked command waits for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Blocked {
    /// `BLPOP` on these keys.
    Pop {
        /// The keys, in the order given.
        keys: Vec<Vec<u8>>,
    },
    /// `WAIT` for `replicas` acknowledgements of the stream up to `offset`.
    Wait {
        /// The connection's write offset when it called `WAIT`.
        offset: u64,
        /// How many replicas it asked for.
        replicas: i64,
    },
}

/// A blocked command.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Block {
    /// What it waits for.
    pub on: Blocked,
    /// When it times out (server wall clock, ms; it does once the clock is past it), or
    /// `None` to wait forever.
    pub deadline: Option<i64>,
    /// Order of blocking (first come, first served).
    pub since: u64,
}

/// What running a command did.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It replied.
    Reply(Reply),
    /// It blocked (until the deadline, server wall clock).
    Block(Blocked, Option<i64>),
    /// Nothing at all (an empty command, which Redis ignores).
    Silent,
}

/// The deadline of a timeout of `ms` from `now` (0: none).
pub(crate) fn deadline(now: i64, ms: i64) -> Option<i64> {
    (ms > 0).then(|| now.saturating_add(ms))
}

/// `BLPOP key [key ...] timeout`: pops at once when a key holds a non-empty list,
/// otherwise blocks (a timeout is checked first, a key of another type before a non-empty
/// list fails the command).
pub(crate) fn blpop(ks: &mut Keyspace, args: &[Vec<u8>]) -> Outcome {
    let (timeout, keys) = args[1..].split_last().expect("BLPOP's arity is at least 3");
    let timeout = match timeout_secs(timeout) {
        Ok(ms) => ms,
        Err(e) => return Outcome::Reply(e),
    };
    match lists::pop_first(ks, keys) {
        Err(e) => Outcome::Reply(e),
        Ok(Some(reply)) => Outcome::Reply(reply),
        Ok(None) => Outcome::Block(
            Blocked::Pop {
                keys: keys.to_vec(),
            },
            deadline(ks.now(), timeout),
        ),
    }
}

/// Serves the connections blocked in `BLPOP` on the lists in `ready` (keys just changed):
/// for each key, the connections blocked on it in the order they blocked, one element
/// each while the list lasts. Returns the served connections in the order served (their
/// reply added, their block cleared).
pub(crate) fn serve_lists(
    ks: &mut Keyspace,
    conns: &mut BTreeMap<ConnId, Connection>,
    ready: &[Vec<u8>],
) -> Vec<ConnId> {
    let mut served = Vec::new();
    for key in ready {
        let mut waiting: Vec<(u64, ConnId)> = conns
            .iter()
            .filter_map(|(id, c)| match &c.block {
                Some(Block {
                    on: Blocked::Pop { keys },
                    since,
                    ..
                }) if keys.contains(key) => Some((*since, *id)),
                _ => None,
            })
            .collect();
        waiting.sort();
        for (_, id) in waiting {
            let Some(reply) = lists::pop(ks, key) else {
                break;
            };
            if let Some(conn) = conns.get_mut(&id) {
                conn.block = None;
                conn.replies.push(reply);
                served.push(id);
            }
        }
    }
    served
}

/// The connections whose block has timed out at `now` (server wall clock), in the order
/// of their deadlines, then of blocking.
pub(crate) fn timed_out(conns: &BTreeMap<ConnId, Connection>, now: i64) -> Vec<ConnId> {
    let mut due: Vec<(i64, u64, ConnId)> = conns
        .iter()
        .filter_map(|(id, c)| {
            let block = c.block.as_ref()?;
            let deadline = block.deadline?;
            (now > deadline).then_some((deadline, block.since, *id))
        })
        .collect();
    due.sort();
    due.into_iter().map(|(_, _, id)| id).collect()
}

/// The earliest deadline of a blocked connection (server wall clock).
pub(crate) fn next_deadline(conns: &BTreeMap<ConnId, Connection>) -> Option<i64> {
    conns
        .values()
        .filter_map(|c| c.block.as_ref()?.deadline)
        .min()
}
