//! The members of a Redlock deployment (independent primaries, each a single server or a
//! Sentinel deployment), and one *round*: the same calls sent to every member, in parallel.
//!
//! A round writes the request to every member before it reads any reply, so its time is
//! that of the slowest member (bounded by the per-member deadline), not the sum. It spawns
//! no thread when every member has an idle connection; only members that must connect
//! are connected to from short-lived threads of their own, so that a member whose connect
//! hangs cannot use up the others' time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::Backend;
use crate::backend::call::Call;
use crate::backend::exec::Exec;
use crate::backend::node::Node;
use crate::backend::redirect::Redirect;
use crate::backend::wire::{finish_calls, send_calls};
use crate::connection::{Connection, usable_together};
use crate::error::{Error, Result};
use crate::lane::Lane;
use crate::pool::{Check, Pooled};

/// The members of a Redlock deployment.
pub(crate) struct Members {
    pub members: Vec<Backend>,
}

/// What every member answered in one round.
pub(crate) struct Round {
    /// Per member, in order: its replies, or why there are none.
    pub outcomes: Vec<Result<Vec<Value>>>,
}

impl Members {
    pub fn new(members: Vec<Backend>) -> Self {
        Members { members }
    }

    /// A short description of each member, for messages.
    pub fn names(&self) -> Vec<&str> {
        self.members.iter().map(Backend::describe).collect()
    }

    /// Sends `calls` on `key` to every member and reads the replies, nothing past
    /// `deadline`.
    pub fn round(&self, key: &str, calls: &[Call], lane: Lane, deadline: Instant) -> Round {
        let how = Exec::new(lane, deadline.saturating_duration_since(Instant::now()))
            .cutoff(Some(deadline));
        let nodes: Vec<Result<Arc<Node>>> = self
            .members
            .iter()
            .map(|m| m.node_for(key, deadline))
            .collect();
        let mut checkouts = checkout_all(&nodes, &how);
        replace_closed(&mut checkouts, deadline);
        let mut in_flight: Vec<Result<(Pooled<'_>, Instant)>> = Vec::with_capacity(nodes.len());
        for checkout in checkouts {
            in_flight.push(checkout.and_then(|mut pooled| {
                let at = send_calls(pooled.conn(), calls, &how)?;
                Ok((pooled, at))
            }));
        }
        let outcomes = in_flight
            .into_iter()
            .enumerate()
            .map(|(i, flight)| {
                let (mut pooled, at) = flight?;
                let replies = finish_calls(pooled.conn(), calls, at, &how)?;
                if let (Ok(node), Some(Value::ServerError(_))) = (&nodes[i], replies.values.first())
                {
                    if matches!(
                        Redirect::of(&replies.values[0], &node.addr),
                        Some(Redirect::ReadOnly)
                    ) {
                        self.members[i].node_failed(node);
                    }
                }
                Ok(replies.values)
            })
            .collect();
        Round { outcomes }
    }
}

/// Checks out one connection per node; nodes without an idle connection connect in
/// threads of their own, in parallel.
fn checkout_all<'a>(nodes: &'a [Result<Arc<Node>>], how: &Exec<'_>) -> Vec<Result<Pooled<'a>>> {
    let take = |node: &'a Result<Arc<Node>>| -> Result<Pooled<'a>> {
        let node = node.as_ref().map_err(Clone::clone)?;
        node.checkout_with(how, Check::Later)?.ok_or_else(|| {
            Error::new(
                crate::error::ErrorKind::Internal,
                "no connection on the lane",
            )
        })
    };
    let must_connect = nodes
        .iter()
        .filter(|n| n.as_ref().is_ok_and(|n| !n.has_idle(how.lane)))
        .count();
    if must_connect <= 1 {
        return nodes.iter().map(take).collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|node| {
                let connects = node.as_ref().is_ok_and(|n| !n.has_idle(how.lane));
                let thread = connects.then(|| {
                    crate::process::spawn_without_signals(|| {
                        std::thread::Builder::new()
                            .name("redlease-connect".into())
                            .stack_size(128 * 1024)
                            .spawn_scoped(scope, move || take(node))
                    })
                });
                match thread {
                    Some(Ok(thread)) => Err(thread),
                    // No thread to spare (the process's limit): connect here, in turn.
                    Some(Err(_)) | None => Ok(take(node)),
                }
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(done) => done,
                Err(thread) => thread.join().unwrap_or_else(|_| {
                    Err(Error::new(
                        crate::error::ErrorKind::Internal,
                        "a connecting thread panicked",
                    ))
                }),
            })
            .collect()
    })
}

/// Looks at the idle connections [`checkout_all`] handed out, all at once (one system call
/// rather than one per member), and replaces those a server closed while they were idle
/// (a restarted member), connecting before `connect_by`. A member whose connect fails has
/// that error as its checkout.
fn replace_closed(checkouts: &mut [Result<Pooled<'_>>], connect_by: Instant) {
    let unchecked: Vec<usize> = (0..checkouts.len())
        .filter(|&i| checkouts[i].as_ref().is_ok_and(Pooled::unchecked))
        .collect();
    if unchecked.is_empty() {
        return;
    }
    let usable = {
        let mut conns: Vec<&mut Connection> = checkouts
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| unchecked.contains(i))
            .filter_map(|(_, c)| c.as_mut().ok().map(Pooled::conn))
            .collect();
        usable_together(&mut conns)
    };
    for (i, usable) in unchecked.into_iter().zip(usable) {
        if let Ok(pooled) = &mut checkouts[i] {
            if usable {
                pooled.checked();
            } else if let Err(e) = pooled.replace(connect_by) {
                checkouts[i] = Err(e);
            }
        }
    }
}

/// The time each member is given in a round: much less than the ttl, at most the I/O
/// timeout (the Redis documentation's "5-50 ms for a 10 s ttl" is for a LAN; this is
/// ttl/10, at least 10 ms).
pub(crate) fn per_member(ttl: Duration, io_timeout: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(10)).min(io_timeout)
}
