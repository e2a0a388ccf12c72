//! The members of a Redlock deployment (independent primaries, each a single server or a
//! Sentinel deployment), and one *round*: the same calls sent to every member, in parallel.
//!
//! A round writes the request to every member before it reads any reply, so its time is
//! that of the slowest member (bounded by the per-member deadline), not the sum. It spawns
//! no thread when every member has an idle connection; only members that must connect
//! are connected to from short-lived threads of their own, which write to their member
//! once connected, so that a member whose connect hangs cannot use up the others' time.
//!
//! Each connection asks its server's `run_id` when it is made: two members that reach one
//! server (two names or addresses of it, which the URL check cannot tell apart) would
//! pass for two, so the later one is sent nothing.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ScopedJoinHandle;
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
use crate::pool::Pooled;

/// The members of a Redlock deployment.
pub(crate) struct Members {
    pub members: Vec<Backend>,
}

/// What every member answered in one round.
pub(crate) struct Round {
    /// Per member, in order: its replies, or why there are none.
    pub outcomes: Vec<Result<Vec<Value>>>,
    /// Set when a member was left out for being another member's server (see
    /// [`Members::round`]).
    pub one_server: Option<Error>,
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
    /// `deadline`. Members with an idle connection are written to at once; each member
    /// that must connect (none idle, or the idle one closed) does so on a thread of its
    /// own and is written to as soon as it is connected, so that a member whose connect
    /// hangs (a host cut off or powered off: its SYNs go unanswered) costs the others
    /// nothing. The round ends when every member answered or ran out of time.
    ///
    /// A member whose connection reached the same server as another member's (the same
    /// `run_id`) is sent nothing: its outcome is an [`crate::ErrorKind::InvalidArgument`]
    /// error, also in [`Round::one_server`].
    pub fn round(&self, key: &str, calls: &[Call], lane: Lane, deadline: Instant) -> Round {
        let how = Exec::new(lane, deadline.saturating_duration_since(Instant::now()))
            .cutoff(Some(deadline));
        // Members whose server is known without asking anyone; the others (a Sentinel
        // deployment to ask) find it on their connecting thread.
        let nodes: Vec<Option<Arc<Node>>> =
            self.members.iter().map(|m| m.known_node(key)).collect();
        let mut slots: Vec<Slot<'_>> = nodes
            .iter()
            .map(|node| match node.as_ref().map(|n| n.checkout_idle(lane)) {
                None | Some(Ok(None)) => Slot::Connect,
                Some(Ok(Some(pooled))) => Slot::Ready(pooled),
                Some(Err(e)) => Slot::Done(Err(e)),
            })
            .collect();
        look_at_idle(&mut slots);
        // The servers this round's connections reached, by member: a member found to be
        // an earlier one's server is left out.
        let claims = Mutex::new(Claims {
            ids: vec![None; slots.len()],
            one_server: None,
        });
        for (i, slot) in slots.iter_mut().enumerate() {
            if let Slot::Ready(pooled) = slot {
                if let Err(e) = self.claim(&claims, i, pooled.conn()) {
                    *slot = Slot::Done(Err(e));
                }
            }
        }
        if !slots.iter().any(|s| matches!(s, Slot::Connect)) {
            let outcomes = self.exchange_ready(&nodes, slots, calls, &how, &claims);
            return self.finish_round(outcomes, claims);
        }
        let outcomes = std::thread::scope(|scope| {
            let (nodes, how, claims) = (&nodes, &how, &claims);
            let connect_and_send = move |i: usize| {
                let node = nodes[i].as_ref();
                move || self.connect_and_send(i, (key, node, deadline), calls, how, claims)
            };
            // Per member that must connect: its thread, or `None` when no thread could
            // be had (the process's limit): it then connects here, after the others.
            let connecting: Vec<(usize, Option<Connecting<'_>>)> = (0..slots.len())
                .filter(|&i| matches!(slots[i], Slot::Connect))
                .map(|i| {
                    let thread = crate::process::spawn_without_signals(|| {
                        std::thread::Builder::new()
                            .name("redlease-connect".into())
                            .stack_size(128 * 1024)
                            .spawn_scoped(scope, connect_and_send(i))
                    });
                    (i, thread.ok())
                })
                .collect();
            let mut outcomes = self.exchange_ready(nodes, slots, calls, how, claims);
            for (i, thread) in connecting {
                outcomes[i] = match thread {
                    Some(thread) => thread.join().unwrap_or_else(|_| {
                        Err(Error::new(
                            crate::error::ErrorKind::Internal,
                            "a connecting thread panicked",
                        ))
                    }),
                    None => connect_and_send(i)(),
                };
            }
            outcomes
        });
        self.finish_round(outcomes, claims)
    }

    /// Writes `calls` to every member with a connection at hand, then reads their replies;
    /// the others' outcomes are left as they are (a placeholder for those connecting).
    fn exchange_ready(
        &self,
        nodes: &[Option<Arc<Node>>],
        slots: Vec<Slot<'_>>,
        calls: &[Call],
        how: &Exec<'_>,
        claims: &Mutex<Claims>,
    ) -> Vec<Result<Vec<Value>>> {
        let in_flight: Vec<Flight<'_, '_>> = slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Ready(mut pooled) => {
                    let sent = with_identity(pooled.conn(), calls);
                    match send_calls(pooled.conn(), &sent, how) {
                        Ok(at) => Flight::Sent(pooled, sent, at),
                        Err(e) => Flight::Done(Err(e)),
                    }
                }
                Slot::Done(outcome) => Flight::Done(outcome),
                Slot::Connect => Flight::Done(Ok(Vec::new())),
            })
            .collect();
        in_flight
            .into_iter()
            .enumerate()
            .map(|(i, flight)| match flight {
                Flight::Sent(mut pooled, sent, at) => {
                    let node = nodes[i].as_ref();
                    self.read_replies(i, node, pooled.conn(), (&sent, at), how, claims)
                }
                Flight::Done(outcome) => outcome,
            })
            .collect()
    }

    /// A member without a connection at hand: finds the server of `key` (`known`, or by
    /// asking its Sentinels before `deadline`), connects, then writes and reads, unless the
    /// connection reached a server another member's did.
    fn connect_and_send(
        &self,
        i: usize,
        (key, known, deadline): (&str, Option<&Arc<Node>>, Instant),
        calls: &[Call],
        how: &Exec<'_>,
        claims: &Mutex<Claims>,
    ) -> Result<Vec<Value>> {
        let node = match known {
            Some(node) => node.clone(),
            None => self.members[i].node_for(key, deadline)?,
        };
        let mut pooled = node.checkout(how)?.ok_or_else(|| {
            Error::new(
                crate::error::ErrorKind::Internal,
                "no connection on the lane",
            )
        })?;
        self.claim(claims, i, pooled.conn())?;
        let sent = with_identity(pooled.conn(), calls);
        let at = send_calls(pooled.conn(), &sent, how)?;
        self.read_replies(i, Some(&node), pooled.conn(), (&sent, at), how, claims)
    }

    /// Reads member `i`'s replies to `sent` (written at `at`): with the server's id first
    /// when the connection asked it (see [`with_identity`]), which is then claimed: a
    /// member found to be another's server has its replies set aside. A member that answers
    /// `READONLY` (demoted) is forgotten.
    fn read_replies(
        &self,
        i: usize,
        node: Option<&Arc<Node>>,
        conn: &mut Connection,
        (sent, at): (&Cow<'_, [Call]>, Instant),
        how: &Exec<'_>,
        claims: &Mutex<Claims>,
    ) -> Result<Vec<Value>> {
        let mut values = finish_calls(conn, sent, at, how)?.values;
        // Owned only with `INFO server` ahead of the calls (see with_identity).
        if matches!(sent, Cow::Owned(_)) && !values.is_empty() {
            let info = values.remove(0);
            conn.identified(&info);
            self.claim(claims, i, conn)?;
        }
        if let (Some(node), Some(Value::ServerError(_))) = (node, values.first()) {
            if matches!(
                Redirect::of(&values[0], &node.addr),
                Some(Redirect::ReadOnly)
            ) {
                self.members[i].node_failed(node);
            }
        }
        Ok(values)
    }

    /// Records the server member `i`'s connection reached.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] when another member's connection of
    /// this round reached the same server (the same `run_id`).
    fn claim(&self, claims: &Mutex<Claims>, i: usize, conn: &Connection) -> Result<()> {
        let Some(id) = conn.server_id() else {
            return Ok(());
        };
        let mut claims = claims.lock().unwrap_or_else(PoisonError::into_inner);
        claims.ids[i] = Some(id.clone());
        let Some((a, b)) = crate::core::quorum::one_server_twice(&claims.ids) else {
            return Ok(());
        };
        let other = if a == i { b } else { a };
        claims.ids[i] = None;
        let names = self.names();
        let error = Error::invalid(format!(
            "Redlock members {} and {} are one server (run_id {id}): list each primary once \
             (one server under two names passes for two members, and losing it loses both)",
            names[other.min(i)],
            names[other.max(i)],
        ));
        claims.one_server.get_or_insert_with(|| error.clone());
        Err(error)
    }

    /// The round, with the error of a member left out for being another's server.
    fn finish_round(&self, outcomes: Vec<Result<Vec<Value>>>, claims: Mutex<Claims>) -> Round {
        let claims = claims.into_inner().unwrap_or_else(PoisonError::into_inner);
        Round {
            outcomes,
            one_server: claims.one_server,
        }
    }
}

/// The servers a round's connections reached, by member.
struct Claims {
    /// Each member's server id (`run_id`), once its connection is known.
    ids: Vec<Option<Arc<str>>>,
    /// The error of the first member left out for being another's server.
    one_server: Option<Error>,
}

/// The thread of a member that connects during a round.
type Connecting<'scope> = ScopedJoinHandle<'scope, Result<Vec<Value>>>;

/// A member's connection at the start of a round.
enum Slot<'a> {
    /// An idle connection, not looked at yet (then looked at).
    Ready(Pooled<'a>),
    /// No connection at hand: one must be made.
    Connect,
    /// Nothing to send: the member's outcome.
    Done(Result<Vec<Value>>),
}

/// A member's request in a round: what was written (the round's calls, behind `INFO
/// server` on a new connection), and when.
#[allow(clippy::large_enum_variant)] // a few per round, kept in place in one Vec
enum Flight<'a, 'c> {
    Sent(Pooled<'a>, Cow<'c, [Call]>, Instant),
    Done(Result<Vec<Value>>),
}

/// `INFO server`, which asks a server's `run_id`.
fn info_call() -> &'static Call {
    static INFO: std::sync::LazyLock<Call> = std::sync::LazyLock::new(|| {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        Call::cmd(&cmd)
    });
    &INFO
}

/// `calls`, behind `INFO server` when `conn` is to ask its server's id with its first
/// request ([`Connection::asks_identity`]): in the same write, so that asking costs no
/// round trip.
fn with_identity<'c>(conn: &mut Connection, calls: &'c [Call]) -> Cow<'c, [Call]> {
    if !conn.asks_identity() {
        return Cow::Borrowed(calls);
    }
    let mut with = Vec::with_capacity(calls.len() + 1);
    with.push(info_call().clone());
    with.extend_from_slice(calls);
    Cow::Owned(with)
}

/// Looks at the idle connections of a round all at once (one system call rather than one
/// per member): one a server closed while idle (a restarted member) is dropped, and its
/// member connects afresh.
fn look_at_idle(slots: &mut [Slot<'_>]) {
    let unchecked: Vec<usize> = (0..slots.len())
        .filter(|&i| matches!(&slots[i], Slot::Ready(p) if p.unchecked()))
        .collect();
    if unchecked.is_empty() {
        return;
    }
    let usable = {
        let mut conns: Vec<&mut Connection> = slots
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| unchecked.contains(i))
            .filter_map(|(_, slot)| match slot {
                Slot::Ready(pooled) => Some(pooled.conn()),
                _ => None,
            })
            .collect();
        usable_together(&mut conns)
    };
    for (i, usable) in unchecked.into_iter().zip(usable) {
        if usable {
            if let Slot::Ready(pooled) = &mut slots[i] {
                pooled.checked();
            }
        } else if let Slot::Ready(pooled) = std::mem::replace(&mut slots[i], Slot::Connect) {
            pooled.discard();
        }
    }
}

/// The time each member is given in a round: much less than the ttl, at most the I/O
/// timeout (the Redis documentation's "5-50 ms for a 10 s ttl" is for a LAN; this is
/// ttl/10, at least 10 ms).
pub(crate) fn per_member(ttl: Duration, io_timeout: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(10)).min(io_timeout)
}
