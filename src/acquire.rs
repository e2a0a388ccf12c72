//! Carrying out an acquire: the runtime half of [`crate::core::acquire`].
//!
//! The machine decides; this sends its requests through the deployment's
//! [`LockServer`], sleeps its pauses (cancellable), reads the clock, and feeds back what
//! happened. A give-back the machine sends in the background goes out on a short-lived
//! thread of its own, bounded by one I/O timeout.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::call::Replicas;
use crate::backend::exec::Exec;
use crate::cancel::Watch;
use crate::connection;
use crate::core::acquire::{AcquireMachine, AcquireSpec, Acquired, Action, Event};
use crate::core::backoff::{self, Wait};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::kinds::{Kind, wrong_kind};
use crate::lane::Lane;
use crate::process::{self, Process};
use crate::protocol::{AttemptRequest, Hold, LockServer};
use crate::{stats, token};

/// One acquisition to make.
pub(crate) struct Acquire<'a> {
    pub server: &'a Arc<dyn LockServer>,
    pub keys: &'a LockKeys,
    pub kind: &'a Kind,
    /// The label tokens end with (`host/pid`).
    pub owner_label: &'a str,
    pub ttl: Duration,
    pub wait: Wait,
    pub renew: bool,
    pub watch: Watch,
    pub replicas: Option<Replicas>,
}

impl Acquire<'_> {
    /// Acquires, waiting as asked. Blocks the calling thread for at most the wait plus one
    /// request's bounds (the connect and I/O timeouts, and the lateness of a block); a
    /// try-acquire for at most the pool wait plus the connect and I/O timeouts.
    ///
    /// Errors: [`crate::ErrorKind::Busy`] when the wait ends while another owner holds
    /// the lock, [`crate::ErrorKind::Cancelled`], and the errors of the requests. On every
    /// error this caller holds nothing: what the server may hold under its token was
    /// withdrawn, or lapses within the waiter's grace or the attempt's lease.
    ///
    /// The statistics record the acquire when the caller hands its outcome to the returned
    /// [`Ending`] (what the caller does with a grant may still fail the acquire).
    pub fn run(&self) -> (Result<Acquired>, Ending) {
        let bounds = self.server.bounds();
        let spec = AcquireSpec {
            key: self.keys.lock.clone(),
            ttl: self.ttl,
            wait: self.wait,
            renew: self.renew,
            blocks: self.server.capabilities().blocking,
            bounds,
            replicas: self.replicas.map_or(Duration::ZERO, |r| r.timeout),
            direct: self.kind.hands_over() && self.replicas.is_none(),
            behind: false,
        };
        // The waiters of a deployment that cannot queue them wait in this client's line.
        let mut place = match self.server.lines() {
            Some(lines) if self.wait.waits() => Some(lines.join(&self.keys.lock)),
            _ => None,
        };
        let spec = AcquireSpec {
            behind: place.as_ref().is_some_and(|p| p.behind),
            ..spec
        };
        let label = self.owner_label.to_owned();
        let tokens = Box::new(move || token::new_token(&label));
        let mut machine = AcquireMachine::new(spec, Instant::now(), tokens, fastrand::Rng::new());
        let grace = backoff::grace(bounds.io);
        let started = Instant::now();
        let mut waited = false;
        let mut event = Event::Start;
        loop {
            let action = machine.step(event, Instant::now(), self.watch.cancelled());
            event = match action {
                Action::Done(result) => {
                    if let (Some(place), Ok(_)) = (place.as_mut(), &result) {
                        place.took();
                    }
                    let result = result.map_err(|e| wrong_kind(e, self.kind, &self.keys.lock));
                    return (result, Ending { started, waited });
                }
                Action::Attempt(plan) => {
                    waited |= plan.block.is_some();
                    let exec = Exec::new(plan.lane, bounds.io)
                        .cutoff(plan.cutoff)
                        .retry_until(plan.retry_until);
                    // A single attempt may be cancelled only by its own timeouts.
                    let exec = match self.wait {
                        Wait::No => exec,
                        Wait::Until(_) | Wait::Forever => exec.watch(&self.watch),
                    };
                    let request = AttemptRequest {
                        hold: self.hold(&plan.token),
                        ttl: self.ttl,
                        mode: plan.mode,
                        grace,
                        block: plan.block,
                        lead: plan.lead,
                        direct: plan.direct,
                        first_lead: plan.first_lead,
                        exec,
                        replicas: self.replicas,
                    };
                    match self.server.attempt(&request) {
                        Ok(Some(answer)) => Event::Attempted(Ok(answer)),
                        Ok(None) => Event::NoBlockingConnection,
                        Err(e) => Event::Attempted(Err(e)),
                    }
                }
                Action::Extend { token, ttl, cutoff } => {
                    let exec = Exec::new(Lane::Urgent, bounds.io).cutoff(cutoff);
                    let extended = self
                        .server
                        .extend(self.hold(&token), ttl, self.replicas, &exec)
                        .and_then(|answer| match answer.unacknowledged {
                            Some(short) => Err(short),
                            None => Ok((answer.reply, answer.sent_at)),
                        });
                    Event::Extended(extended)
                }
                Action::GiveBack {
                    token,
                    cutoff,
                    background,
                } => {
                    if background {
                        self.give_back_in_background(token, cutoff);
                        Event::GaveBack(None)
                    } else {
                        let exec = Exec::new(Lane::Urgent, bounds.io).cutoff(Some(cutoff));
                        let reply = self
                            .server
                            .release(self.hold(&token), self.ttl, true, &exec);
                        Event::GaveBack(Some(reply))
                    }
                }
                Action::Pause { until } => {
                    waited = true;
                    let left = until.saturating_duration_since(Instant::now());
                    Event::Paused(match &place {
                        Some(place) => place.pause(left, &self.watch),
                        None => connection::pause(left, &self.watch),
                    })
                }
            };
        }
    }

    fn hold<'h>(&'h self, token: &'h str) -> Hold<'h> {
        Hold {
            kind: self.kind,
            keys: self.keys,
            token,
        }
    }

    /// Withdraws `token` on a thread of its own, nothing past `cutoff`.
    fn give_back_in_background(&self, token: String, cutoff: Instant) {
        give_back_in_background(
            self.server.clone(),
            self.keys.clone(),
            self.kind.clone(),
            self.ttl,
            token,
            cutoff,
        );
    }
}

/// How an acquire ended, for the statistics.
#[must_use = "an acquire's outcome is recorded with `record`"]
pub(crate) struct Ending {
    started: Instant,
    /// It blocked or slept at least once.
    waited: bool,
}

impl Ending {
    /// Records `result` as the acquire's outcome.
    pub fn record<T>(self, result: &Result<T>) {
        stats::acquire_ended(result, self.started.elapsed(), self.waited);
    }
}

/// Withdraws `token` from the lock `keys` (of `kind`, a lease of `ttl`) on a thread of its
/// own, nothing past `cutoff` (when no thread can be had, what it would have undone lapses
/// after its lease).
pub(crate) fn give_back_in_background(
    server: Arc<dyn LockServer>,
    keys: LockKeys,
    kind: Kind,
    ttl: Duration,
    token: String,
    cutoff: Instant,
) {
    if crate::process::orphaned() {
        return; // the token is the parent's (see `process::call_out`)
    }
    let give_back = move || {
        let hold = Hold {
            kind: &kind,
            keys: &keys,
            token: &token,
        };
        let exec = Exec::new(Lane::Urgent, server.bounds().io).cutoff(Some(cutoff));
        match server.release(hold, ttl, true, &exec) {
            Ok(reply) if reply.was_held() => log::debug!(
                "withdrawing from {:?} in the background undid a grant never heard of",
                keys.lock
            ),
            Ok(_) => {}
            Err(e) => log::warn!(
                "could not withdraw from lock {:?} ({e}); a grant this caller may hold \
                 lapses after its lease",
                keys.lock
            ),
        }
    };
    let me = Process::current();
    withdrawals().started(me);
    let spawned = crate::process::spawn_without_signals(|| {
        std::thread::Builder::new()
            .name("redlease-giveback".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                let _counted = Counted(me);
                give_back();
            })
    });
    if let Err(e) = spawned {
        withdrawals().ended(me);
        log::debug!("no thread for a background withdrawal ({e}); it lapses after its lease");
    }
}

/// The withdrawals in flight on threads of their own, counted for
/// [`wait_for_background_withdrawals`]: the process they belong to (a forked child has
/// none of its parent's threads) and how many.
struct Withdrawals {
    process: Process,
    in_flight: usize,
}

impl Withdrawals {
    fn own(&mut self, me: Process) {
        if self.process != me {
            self.process = me;
            self.in_flight = 0;
        }
    }

    fn started(&mut self, me: Process) {
        self.own(me);
        self.in_flight += 1;
    }

    fn ended(&mut self, me: Process) {
        if self.process == me {
            self.in_flight = self.in_flight.saturating_sub(1);
            WITHDRAWN.notify_all();
        }
    }
}

/// Counts a withdrawal's end when dropped: also when it panicked.
struct Counted(Process);

impl Drop for Counted {
    fn drop(&mut self) {
        withdrawals().ended(self.0);
    }
}

static WITHDRAWALS: Mutex<Withdrawals> = Mutex::new(Withdrawals {
    process: Process::NONE,
    in_flight: 0,
});
static WITHDRAWN: Condvar = Condvar::new();

/// The count, locked (never while anything else is done); held across `fork()`.
fn withdrawals() -> MutexGuard<'static, Withdrawals> {
    static HELD_ACROSS_FORK: AtomicBool = AtomicBool::new(false);
    process::hold_across_fork_once(&HELD_ACROSS_FORK, || {
        vec![Box::new(
            WITHDRAWALS.lock().unwrap_or_else(PoisonError::into_inner),
        )]
    });
    WITHDRAWALS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits up to `limit` for the withdrawals this process sends in the background, and
/// returns whether none is left. An attempt whose reply never came (lost, or late past the
/// call's bound) is given back on a thread of its own, bounded by one I/O timeout, so that
/// the call that made it keeps its own bound; a program that exits at once (a command-line
/// tool after a failed acquire) calls this first, or what such an attempt may have taken
/// on the server stays there until its ttl. Blocks the calling thread; returns at once
/// when nothing is in flight. Thread-safe.
pub fn wait_for_background_withdrawals(limit: Duration) -> bool {
    // A limit past what the clock can hold (`Duration::MAX`) is no limit.
    let deadline = Instant::now().checked_add(limit);
    let me = Process::current();
    let mut w = withdrawals();
    w.own(me);
    while w.in_flight > 0 {
        let left = deadline.map_or(Duration::from_secs(3600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return false;
        }
        w = WITHDRAWN
            .wait_timeout(w, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit the clock cannot add (`Duration::MAX`, the C ABI's `UINT64_MAX` ms) is no
    /// limit, not a panic.
    #[test]
    fn an_unbounded_wait_for_background_withdrawals_ends_when_none_is_left() {
        assert!(wait_for_background_withdrawals(Duration::MAX));
        assert!(wait_for_background_withdrawals(Duration::from_millis(
            u64::MAX
        )));
    }
}
