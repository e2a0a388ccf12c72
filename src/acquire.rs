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
use crate::lease::{local_deadline, release_token};
use crate::scripts::{self, ACQUIRE, EXTEND};
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

/// What one attempt found.
enum Attempt {
    Granted(Granted),
    /// Held by another owner for this long (ms; -1 without expiry).
    Busy(i64),
}

impl Acquire<'_> {
    /// Acquires, waiting as the request says.
    ///
    /// Errors: [`ErrorKind::Busy`] when the wait ends while another owner holds the lock,
    /// [`ErrorKind::Cancelled`], and the errors of the requests. On every error this
    /// caller holds nothing (or, when Redis became unreachable, a withdrawal was tried and
    /// the docs of [`crate::Error::outcome_unknown`] apply).
    pub fn run(&self) -> Result<Granted> {
        let grace = waiting::grace(self.backend.io_timeout);
        let first_mode = if self.wait == Wait::No {
            scripts::MODE_ONCE
        } else {
            scripts::MODE_WAITER
        };
        let lane = self
            .backend
            .caller_lane(self.wait.deadline().filter(|_| self.wait != Wait::No));
        let mut pttl = match self.plain(first_mode, lane) {
            Ok(Attempt::Granted(g)) => return Ok(g),
            Ok(Attempt::Busy(pttl)) => pttl,
            Err(e) => return Err(self.give_up(e, false)),
        };
        if self.wait == Wait::No {
            return Err(self.busy());
        }
        let mut backoff = Backoff::new();
        loop {
            if self.watch.cancelled() {
                return Err(self.give_up(cancelled(), true));
            }
            let left = self.wait.left(Instant::now());
            if left == Some(Duration::ZERO) {
                // The wait ended between two blocks: one last attempt, which withdraws.
                return match self.plain(scripts::MODE_LAST, self.backend.caller_lane(None)) {
                    Ok(Attempt::Granted(g)) => Ok(g),
                    Ok(Attempt::Busy(_)) => Err(self.busy()),
                    Err(e) => Err(self.give_up(e, true)),
                };
            }
            let block = backoff.block_for(left, pttl, grace);
            let last = left.is_some_and(|left| left <= block);
            let mode = if last {
                scripts::MODE_LAST
            } else {
                scripts::MODE_AFTER_BLOCK
            };
            let outcome = match self.block_then_attempt(block, mode) {
                // Every blocking connection is taken: sleep instead, then try.
                Ok(None) => connection::pause(block, &self.watch)
                    .and_then(|()| self.plain(mode, self.backend.caller_lane(None))),
                Ok(Some(outcome)) => Ok(outcome),
                Err(e) if e.is_cancelled() => return Err(self.give_up(e, true)),
                // The blocked connection failed (reset, timeout): a fresh attempt on
                // another connection also takes a grant popped on the dead one.
                Err(e) if e.is_unreachable() => {
                    log::debug!("waiting for {:?}: {e}; trying again", self.keys.lock);
                    self.plain(mode, self.backend.caller_lane(None))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(Attempt::Granted(g)) => return Ok(g),
                Ok(Attempt::Busy(_)) if last => return Err(self.busy()),
                Ok(Attempt::Busy(holder_pttl)) => pttl = holder_pttl,
                Err(e) => return Err(self.give_up(e, true)),
            }
        }
    }

    fn busy(&self) -> Error {
        Error::new(
            ErrorKind::Busy,
            format!("lock {:?} is held by another owner", self.keys.lock),
        )
    }

    fn attempt_call(&self, mode: u8) -> Call {
        let keys = self.keys;
        let grace_ms = waiting::grace(self.backend.io_timeout).as_millis() as u64;
        Call::script(
            &ACQUIRE,
            &[
                &keys.lock,
                &keys.fence,
                &keys.wake,
                &keys.queue,
                &keys.grant,
            ],
            &[
                &self.token,
                &(self.ttl.as_millis() as u64),
                &scripts::FENCE_TTL_MS,
                &mode,
                &grace_ms,
            ],
        )
    }

    /// The calls of one attempt: the script, then `WAIT` when replicas must acknowledge.
    fn attempt_calls(&self, mode: u8) -> Vec<Call> {
        let mut calls = vec![self.attempt_call(mode)];
        calls.extend(self.replicas.map(|r| r.call()));
        calls
    }

    /// Reads an attempt's replies (script, then `WAIT` if any). A grant too few replicas
    /// acknowledged is rolled back and reported as [`ErrorKind::Replication`].
    fn read_attempt(
        &self,
        mut values: impl Iterator<Item = Value>,
        sent_at: Instant,
    ) -> Result<Attempt> {
        let attempt = parse_attempt(values.next(), sent_at)?;
        if let (Attempt::Granted(_), Some(replicas)) = (&attempt, &self.replicas) {
            if let Err(e) = replicas.check(values.next(), "acquiring") {
                let cutoff = Some(Instant::now() + self.backend.io_timeout);
                let rolled_back = release_token(self.backend, self.keys, self.token, cutoff, true);
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

    /// One attempt on its own.
    fn plain(&self, mode: u8, lane: Lane) -> Result<Attempt> {
        let how = self.backend.exec_on(lane);
        let replies = self
            .backend
            .run(&self.keys.lock, &self.attempt_calls(mode), &how)?;
        self.read_attempt(replies.values.into_iter(), replies.sent_at)
    }

    /// Blocks on the wake list for up to `block`, then attempts (pipelined). `Ok(None)`
    /// when no blocking connection is free.
    fn block_then_attempt(&self, block: Duration, mode: u8) -> Result<Option<Attempt>> {
        let mut blpop = redis::cmd("BLPOP");
        blpop
            .arg(&self.keys.wake)
            .arg(format!("{:.3}", block.as_secs_f64()));
        let mut calls = vec![Call::blocking(&blpop, block)];
        calls.extend(self.attempt_calls(mode));
        let how = Exec {
            watch: &self.watch,
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
    /// caller's path; a fixed lease must get the ttl its caller asked for.
    pub fn settle(&self, granted: Granted, renew: bool) -> Result<Granted> {
        let remaining = local_deadline(granted.sent_at, granted.lease)
            .saturating_duration_since(Instant::now());
        if remaining >= self.ttl * 2 / 3 || (renew && remaining >= granted.lease / 3) {
            return Ok(granted);
        }
        let call = Call::script(
            &EXTEND,
            &[&self.keys.lock],
            &[&self.token, &(self.ttl.as_millis() as u64)],
        );
        let how = self.backend.exec_on(Lane::Urgent);
        let result = self
            .backend
            .run(&self.keys.lock, &[call], &how)
            .and_then(|r| {
                let value = r.values.into_iter().next().unwrap_or(Value::Nil);
                Ok((backend::reply::<i64>(value)?, r.sent_at))
            });
        match result {
            Ok((1, sent_at)) => Ok(Granted {
                sent_at,
                lease: self.ttl,
                ..granted
            }),
            // The key changed hands at once (deleted by someone): nothing is held.
            Ok(_) => Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "lock {:?} was taken from this caller as it was acquired",
                    self.keys.lock
                ),
            )),
            // Still held with the shorter lease, if any of it is left.
            Err(_) if remaining > Duration::ZERO => Ok(granted),
            Err(e) => Err(self.give_up(e, true)),
        }
    }

    /// Withdraws (best effort, within one I/O timeout) and returns `error`: the caller
    /// must hold nothing after a failed acquire. A request whose outcome is unknown may
    /// have taken the lock, or registered the waiter; the release script with this token
    /// undoes both.
    /// `registered`: an earlier attempt of this waiter registered it on the server.
    fn give_up(&self, error: Error, registered: bool) -> Error {
        if error.outcome_unknown() || registered {
            let cutoff = Some(Instant::now() + self.backend.io_timeout);
            match release_token(self.backend, self.keys, self.token, cutoff, true) {
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
    let reply: Vec<i64> = backend::reply(value.unwrap_or(Value::Nil))?;
    match reply[..] {
        [1, fence, lease_ms] => {
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
        [0, pttl] => Ok(Attempt::Busy(pttl)),
        _ => Err(Error::new(
            ErrorKind::Server,
            format!("unexpected reply to the acquire script: {reply:?}"),
        )),
    }
}
