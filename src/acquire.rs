//! Acquiring a lock: one attempt, or a wait that blocks on the server for a grant.
//!
//! The protocol is the one of [`crate::scripts`]: an attempt that finds the lock held
//! registers the waiter; the waiter then sends `BLPOP wake` with an `ACQUIRE` pipelined
//! behind it, so the server runs the attempt the moment the `BLPOP` returns, and the grant
//! a release made is confirmed against the key before anyone believes it. Each attempt's
//! lease is timed from the moment its request was written, never from when the reply came.
//!
//! A waiter that gives up (its deadline, a cancellation, an error it cannot recover from)
//! withdraws: its last attempt does so on the server, or the release script runs with the
//! waiter's token, which also hands back a grant it may have taken without hearing of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::{self, Backend, Call, Exec, Lane, Replicas};
use crate::cancel::Watch;
use crate::connection;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::{Kind, wrong_kind};
use crate::lease::{local_deadline, release_hold};
use crate::scripts;
use crate::waiting::{self, Backoff, Wait};

/// One acquisition in progress.
pub(crate) struct Acquire<'a> {
    pub backend: &'a Arc<Backend>,
    pub keys: &'a LockKeys,
    pub token: &'a str,
    pub ttl: Duration,
    pub wait: Wait,
    pub watch: Watch,
    pub replicas: Option<Replicas>,
    pub kind: Kind,
}

/// A lock acquired: its fencing token, the lease the key was given (the ttl, or less for a
/// grant taken from a release), and when the request that set that lease was written (the
/// conservative start of the lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    pub fencing_token: u64,
    pub lease: Duration,
    pub sent_at: Instant,
}

/// How long a cancelled acquire may spend withdrawing.
const QUICK_WITHDRAW: Duration = Duration::from_millis(100);
/// Pause before a waiter tries again after a connection failure.
const RECOVERY_PAUSE: Duration = Duration::from_millis(100);

/// What [`Acquire::settle`] made of a grant.
enum Settled {
    /// Held, with this lease.
    Held(Granted),
    /// Not held after all; nothing is held.
    Again,
    /// The lock could not be kept, nor was it confirmed given back.
    Failed(Error),
}

/// What one attempt found.
enum Attempt {
    Granted(Granted),
    /// A reentrant lock its owner already held: one more hold of the acquisition whose
    /// token this is.
    Reentered(Granted, String),
    /// Held by another owner for this long (ms; -1 without expiry).
    Busy(i64),
}

impl Acquire<'_> {
    /// Acquires, waiting as the request says; `renew`: the lock will be renewed (a short
    /// lease then needs no extend before returning, see [`settle`](Self::settle)).
    ///
    /// Every request shares one cutoff: the end of the wait plus one request's bounds
    /// (pool wait, connect and I/O timeouts, and the lateness of a block), so the whole
    /// acquire, its withdrawal included, returns within it.
    ///
    /// Errors: [`ErrorKind::Busy`] when the wait ends while another owner holds the lock,
    /// [`ErrorKind::Cancelled`], and the errors of the requests. On every error this
    /// caller holds nothing (or, when Redis became unreachable, a withdrawal was tried and
    /// the docs of [`crate::Error::outcome_unknown`] apply).
    ///
    /// Returns the lock's token too when the hold is one more of an acquisition its owner
    /// made before (a reentrant lock); `None` when the lock was taken with this acquire's
    /// token.
    pub fn run(&self, renew: bool) -> Result<(Granted, Option<String>)> {
        self.run_inner(renew)
            .map_err(|e| wrong_kind(e, &self.kind, &self.keys.lock))
    }

    fn run_inner(&self, renew: bool) -> Result<(Granted, Option<String>)> {
        let backend = self.backend;
        let started = Instant::now();
        let one_request = backend.pool_wait
            + backend.connect_timeout
            + backend.io_timeout
            + crate::backend::BLOCK_LATENESS;
        let cutoff = match self.wait {
            Wait::No => Some(started + one_request),
            Wait::Until(deadline) => Some(deadline + one_request),
            Wait::Forever => None,
        };
        let grace = waiting::grace(backend.io_timeout);
        let mut backoff = Backoff::new();
        let mut registered = false;
        let mut plain_next = true;
        let mut failing_since: Option<Instant> = None;
        let mut refused_since: Option<Instant> = None;
        let mut warned = false;
        let mut pttl = -1;
        loop {
            let waits = self.wait != Wait::No;
            if waits && self.watch.cancelled() {
                return Err(self.give_up_by(cancelled(), registered, Some(QUICK_WITHDRAW), cutoff));
            }
            let left = self.wait.left(Instant::now());
            let last = left == Some(Duration::ZERO);
            // A waiter waits for a pooled connection no longer than its wait; its last
            // attempt (which withdraws) takes any connection rather than wait at all.
            let lane = match (waits, last) {
                (false, _) => backend.caller_lane(None),
                (true, false) => backend.caller_lane(self.wait.deadline()),
                (true, true) => Lane::Urgent,
            };
            let (outcome, was_last) = if !waits {
                (self.plain(scripts::MODE_ONCE, lane, cutoff), true)
            } else if plain_next || last {
                plain_next = false;
                let mode = match (last, registered) {
                    (true, _) => scripts::MODE_LAST,
                    (false, true) => scripts::MODE_AFTER_BLOCK,
                    (false, false) => scripts::MODE_WAITER,
                };
                (self.plain(mode, lane, cutoff), last)
            } else {
                let block = backoff.block_for(left, pttl, grace);
                let final_block = left.is_some_and(|left| left <= block);
                let mode = if final_block {
                    scripts::MODE_LAST
                } else {
                    scripts::MODE_AFTER_BLOCK
                };
                let outcome = match self.block_then_attempt(block, mode, cutoff) {
                    Ok(Some(outcome)) => Ok(outcome),
                    // Every blocking connection is taken: sleep instead, then try.
                    Ok(None) => connection::pause(block, &self.watch)
                        .and_then(|()| self.plain(mode, lane, cutoff)),
                    Err(e) => Err(e),
                };
                (outcome, final_block)
            };
            match outcome {
                // At least the ttl is left: nothing to settle.
                Ok(Attempt::Reentered(granted, token)) => return Ok((granted, Some(token))),
                Ok(Attempt::Granted(granted)) => match self.settle(granted, renew, cutoff) {
                    Settled::Held(granted) => return Ok((granted, None)),
                    // The key slipped away as it was taken: nothing is held; try again.
                    Settled::Again if waits && !was_last => {
                        registered = false;
                        plain_next = true;
                    }
                    Settled::Again => return Err(self.lapsed_as_taken()),
                    Settled::Failed(e) => return Err(self.give_up_by(e, true, None, cutoff)),
                },
                Ok(Attempt::Busy(_)) if was_last => {
                    // A last attempt withdrew on the server; a single attempt never
                    // registered.
                    return Err(self.busy());
                }
                Ok(Attempt::Busy(holder_pttl)) => {
                    failing_since = None;
                    refused_since = None;
                    registered = true;
                    pttl = holder_pttl;
                }
                Err(e) if e.is_cancelled() => {
                    return Err(self.give_up_by(e, registered, Some(QUICK_WITHDRAW), cutoff));
                }
                // A Cluster slot that is moving or unsettled, a cluster down, data still
                // loading: the server refused without running anything, and a waiter
                // tries again for as long as it may wait.
                Err(e) if e.refused_for_now() && waits && !was_last => {
                    let now = Instant::now();
                    if cutoff.is_some_and(|c| now >= c) {
                        return Err(self.give_up_by(e, registered, None, cutoff));
                    }
                    // Refused, so reachable: unreachable spells are counted afresh.
                    failing_since = None;
                    let since = *refused_since.get_or_insert(now);
                    if now.duration_since(since) > grace && !warned {
                        warned = true;
                        log::warn!(
                            "waiting for {:?}: {e} for {:?}; the wait goes on",
                            self.keys.lock,
                            now.duration_since(since)
                        );
                    } else {
                        log::debug!("waiting for {:?}: {e}; trying again", self.keys.lock);
                    }
                    let pause = RECOVERY_PAUSE.min(self.wait.left(now).unwrap_or(RECOVERY_PAUSE));
                    if let Err(cancel) = connection::pause(pause, &self.watch) {
                        return Err(self.give_up_by(
                            cancel,
                            registered,
                            Some(QUICK_WITHDRAW),
                            cutoff,
                        ));
                    }
                    plain_next = true;
                }
                // A connection reset, a restart, a timeout: a waiter tries again (on a
                // fresh connection, which also takes a grant popped on the dead one) for
                // as long as the failures last less than its grace.
                Err(e) if e.is_unreachable() && waits && !was_last => {
                    let now = Instant::now();
                    let since = *failing_since.get_or_insert(now);
                    if now.duration_since(since) > grace || cutoff.is_some_and(|c| now >= c) {
                        return Err(self.give_up_by(e, true, None, cutoff));
                    }
                    log::debug!("waiting for {:?}: {e}; trying again", self.keys.lock);
                    let pause = RECOVERY_PAUSE.min(self.wait.left(now).unwrap_or(RECOVERY_PAUSE));
                    if let Err(cancel) = connection::pause(pause, &self.watch) {
                        return Err(self.give_up_by(cancel, true, Some(QUICK_WITHDRAW), cutoff));
                    }
                    plain_next = true;
                    // The failed request may have registered this waiter.
                    registered = registered || e.outcome_unknown();
                }
                Err(e) => {
                    let may_hold = registered || e.outcome_unknown();
                    return Err(self.give_up_by(e, may_hold, None, cutoff));
                }
            }
        }
    }

    fn busy(&self) -> Error {
        Error::new(
            ErrorKind::Busy,
            format!("lock {:?} is held by another owner", self.keys.lock),
        )
    }

    /// The wait is over, and the last grant was lost as it was taken: its lease ran out
    /// before it could be confirmed, or someone deleted the key.
    fn lapsed_as_taken(&self) -> Error {
        Error::new(
            ErrorKind::Busy,
            format!(
                "lock {:?} was granted, but the lease ran out (or the key was deleted) \
                 before the grant could be confirmed; nothing is held",
                self.keys.lock
            ),
        )
    }

    /// Until when a refused attempt in `mode` may be tried again by the backend: a
    /// waiter's attempts before its last one, until the end of its wait.
    fn retry_until(&self, mode: u8) -> Option<Instant> {
        match mode {
            scripts::MODE_WAITER | scripts::MODE_AFTER_BLOCK => self.wait.deadline(),
            _ => None,
        }
    }

    fn attempt_call(&self, mode: u8) -> Call {
        let grace_ms = waiting::grace(self.backend.io_timeout).as_millis() as u64;
        self.kind.attempt(
            self.keys,
            self.token,
            self.ttl.as_millis() as u64,
            mode,
            grace_ms,
        )
    }

    /// The calls of one attempt: the script, then `WAIT` when replicas must acknowledge.
    fn attempt_calls(&self, mode: u8) -> Vec<Call> {
        let mut calls = vec![self.attempt_call(mode)];
        calls.extend(self.replicas.map(|r| r.call()));
        calls
    }

    /// Reads an attempt's replies (script, then `WAIT` if any). A grant (or a re-entry's
    /// hold) too few replicas acknowledged is rolled back (the re-entry's hold only) and
    /// reported as [`ErrorKind::Replication`].
    fn read_attempt(
        &self,
        mut values: impl Iterator<Item = Value>,
        sent_at: Instant,
    ) -> Result<Attempt> {
        let attempt = parse_attempt(values.next(), sent_at)?;
        let holds = matches!(attempt, Attempt::Granted(_) | Attempt::Reentered(..));
        if let (true, Some(replicas)) = (holds, &self.replicas) {
            if let Err(e) = replicas.check(values.next(), "acquiring") {
                let cutoff = Some(Instant::now() + self.backend.io_timeout);
                let rolled_back = release_hold(
                    self.backend,
                    &self.kind,
                    self.keys,
                    self.token,
                    cutoff,
                    true,
                );
                return Err(match rolled_back {
                    Ok(_) => e.context("rolled back"),
                    Err(undo) => e.context(&format!(
                        "could not roll back ({undo}); the lock lapses after its lease"
                    )),
                });
            }
        }
        Ok(attempt)
    }

    /// One attempt on its own. A waiter's may be cancelled, and one before the end of its
    /// wait tries a refused request again only until then (the last attempt has its own
    /// bounds).
    fn plain(&self, mode: u8, lane: Lane, cutoff: Option<Instant>) -> Result<Attempt> {
        let base = self.backend.exec_on(lane);
        let how = Exec {
            cutoff,
            watch: match self.wait {
                Wait::No => base.watch,
                Wait::Until(_) | Wait::Forever => &self.watch,
            },
            retry_until: self.retry_until(mode),
            ..base
        };
        let replies = self
            .backend
            .run(&self.keys.lock, &self.attempt_calls(mode), &how)?;
        self.read_attempt(replies.values.into_iter(), replies.sent_at)
    }

    /// Blocks on the wake list for up to `block`, then attempts (pipelined). `Ok(None)`
    /// when no blocking connection is free.
    fn block_then_attempt(
        &self,
        block: Duration,
        mode: u8,
        cutoff: Option<Instant>,
    ) -> Result<Option<Attempt>> {
        let mut blpop = redis::cmd("BLPOP");
        blpop
            .arg(self.kind.wake_list(self.keys))
            .arg(format!("{:.3}", block.as_secs_f64()));
        let mut calls = vec![Call::blocking(&blpop, block)];
        calls.extend(self.attempt_calls(mode));
        let how = Exec {
            watch: &self.watch,
            cutoff,
            retry_until: self.retry_until(mode),
            ..self.backend.exec_on(Lane::Blocking)
        };
        let Some(replies) = self.backend.exec(&self.keys.lock, &calls, &how)? else {
            return Ok(None);
        };
        let mut values = replies.values.into_iter();
        let popped = values.next();
        if let Some(Value::ServerError(e)) = &popped {
            return Err(connection::server_error(e));
        }
        self.read_attempt(values, replies.sent_at).map(Some)
    }

    /// Extends a lock that was acquired with less lease left than two thirds of its ttl: a
    /// grant taken from a release is leased for the waiter's grace only, and a lock taken
    /// after a long block has a conservative deadline well short of its real lease (the
    /// block's length short). With renewal on (`renew`), renewal does it at once, off the
    /// caller's path, as long as a third of the lease is left; a fixed lease must get the
    /// ttl its caller asked for. A guard is never built for a lease whose local deadline
    /// has passed: such a lock is given back and the acquire goes on ([`Settled::Again`]).
    fn settle(&self, granted: Granted, renew: bool, cutoff: Option<Instant>) -> Settled {
        let left = |g: &Granted| {
            local_deadline(g.sent_at, g.lease).saturating_duration_since(Instant::now())
        };
        let remaining = left(&granted);
        if remaining >= self.ttl * 2 / 3 || (renew && remaining >= granted.lease / 3) {
            return Settled::Held(granted);
        }
        let mut calls = vec![
            self.kind
                .extend(self.keys, self.token, self.ttl.as_millis() as u64),
        ];
        calls.extend(self.replicas.map(|r| r.call()));
        let how = Exec {
            cutoff,
            ..self.backend.exec_on(Lane::Urgent)
        };
        let result = self
            .backend
            .run(&self.keys.lock, &calls, &how)
            .and_then(|r| {
                let mut values = r.values.into_iter();
                let extended = backend::reply::<i64>(values.next().unwrap_or(Value::Nil))?;
                if let (1, Some(replicas)) = (extended, &self.replicas) {
                    replicas.check(values.next(), "extending a lock just acquired")?;
                }
                Ok((extended, r.sent_at))
            });
        let extended = match result {
            Ok((1, sent_at)) => Granted {
                sent_at,
                lease: self.ttl,
                ..granted
            },
            // The key changed hands as it was taken (deleted by someone): nothing is held.
            Ok(_) => return Settled::Again,
            // The extend failed; the lease as acquired, if enough of it is left.
            Err(e) => {
                let remaining = left(&granted);
                if remaining > Duration::ZERO && (renew || remaining >= self.ttl / 10) {
                    return Settled::Held(granted);
                }
                return self.given_back(Settled::Failed(e));
            }
        };
        if left(&extended) > Duration::ZERO {
            Settled::Held(extended)
        } else {
            // The extend's reply came too late to be of use.
            self.given_back(Settled::Again)
        }
    }

    /// Gives back a lock that cannot be used (best effort, within one I/O timeout).
    fn given_back(&self, settled: Settled) -> Settled {
        let cutoff = Some(Instant::now() + self.backend.io_timeout);
        if let Err(e) = release_hold(
            self.backend,
            &self.kind,
            self.keys,
            self.token,
            cutoff,
            true,
        ) {
            log::warn!(
                "could not give back lock {:?} ({e}); it lapses after its lease",
                self.keys.lock
            );
        }
        settled
    }

    /// Withdraws (best effort) and returns `error`: the caller must hold nothing after a
    /// failed acquire. A request whose outcome is unknown may have taken the lock, or
    /// registered the waiter; the release script with this token undoes both. The
    /// withdrawal gets one I/O timeout, or `quick` (a cancellation must return at once:
    /// whatever it cannot undo lapses within the waiter's grace).
    /// `registered`: an earlier attempt of this waiter registered it on the server.
    /// Never past `cutoff` (the acquire's own).
    fn give_up_by(
        &self,
        error: Error,
        registered: bool,
        quick: Option<Duration>,
        cutoff: Option<Instant>,
    ) -> Error {
        if error.outcome_unknown() || registered {
            let allowed = quick
                .unwrap_or(self.backend.io_timeout)
                .min(self.backend.io_timeout);
            let mut until = Instant::now() + allowed;
            if let Some(cutoff) = cutoff {
                // At least a moment: a withdrawal that cannot even be sent is pointless,
                // but one that is quick to answer should not be skipped.
                until = until.min(cutoff.max(Instant::now() + Duration::from_millis(20)));
            }
            let cutoff = Some(until);
            match release_hold(
                self.backend,
                &self.kind,
                self.keys,
                self.token,
                cutoff,
                true,
            ) {
                Ok(true) => log::debug!(
                    "withdrawing from {:?} undid a grant never heard of",
                    self.keys.lock
                ),
                Ok(false) => {}
                Err(e) => log::warn!(
                    "could not withdraw from lock {:?} ({e}); a grant this caller may hold \
                     lapses after its lease",
                    self.keys.lock
                ),
            }
        }
        error
    }
}

fn cancelled() -> Error {
    Error::new(ErrorKind::Cancelled, "the wait was cancelled")
}

/// Reads an `ACQUIRE` reply: `{1, fencing_token}` or `{0, pttl}`.
fn parse_attempt(value: Option<Value>, sent_at: Instant) -> Result<Attempt> {
    let mut reply: Vec<Value> = backend::reply(value.unwrap_or(Value::Nil))?;
    let token = match reply.len() {
        4 => Some(backend::reply::<String>(reply.remove(3))?),
        _ => None,
    };
    let reply = reply
        .into_iter()
        .map(backend::reply::<i64>)
        .collect::<Result<Vec<i64>>>()?;
    match (&reply[..], token) {
        ([2, fence, lease_ms], Some(token)) => {
            let Attempt::Granted(granted) = parse_attempt(
                Some(Value::Array(vec![
                    Value::Int(1),
                    Value::Int(*fence),
                    Value::Int(*lease_ms),
                ])),
                sent_at,
            )?
            else {
                unreachable!("a reply of 1 parses as granted")
            };
            Ok(Attempt::Reentered(granted, token))
        }
        ([1, fence, lease_ms], None) => {
            let (fence, lease_ms) = (*fence, *lease_ms);
            let fencing_token = u64::try_from(fence)
                .map_err(|_| Error::new(ErrorKind::Server, format!("bad fencing token {fence}")))?;
            let lease = u64::try_from(lease_ms)
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| Error::new(ErrorKind::Server, format!("bad lease {lease_ms}")))?;
            Ok(Attempt::Granted(Granted {
                fencing_token,
                lease,
                sent_at,
            }))
        }
        ([0, pttl], None) => Ok(Attempt::Busy(*pttl)),
        (reply, _) => Err(Error::new(
            ErrorKind::Server,
            format!("unexpected reply to the acquire script: {reply:?}"),
        )),
    }
}
