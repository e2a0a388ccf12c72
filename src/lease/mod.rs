//! The lease of a held lock, as this process has it: its token, its clock, its gate, who
//! is told when it is lost, and its batched renewals.
//!
//! Shared (behind an `Arc`) by the guards of its holds and the lock's renewal thread. The
//! decisions are the clock's ([`crate::core::lease::LeaseClock`]); this module carries
//! them out: it sends extends and releases through the deployment's
//! [`LockServer`](crate::protocol::LockServer), keeps them one at a time
//! ([`gate`]), tells the holder of a loss ([`loss`]) and hands renewals to the node's
//! batcher ([`batching`]).

pub(crate) mod batching;
pub(crate) mod gate;
pub(crate) mod loss;

use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use redis::Value;

use crate::backend::batch::Item;
use crate::backend::call::Replicas;
use crate::backend::exec::Exec;
use crate::core::lease::{
    Broken, ExtendOutcome, ExtendVerdict, LeaseClock, LostReason, RenewalStep, ttl_millis,
};
use crate::core::reply::{self, Answer, ExtendReply, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lane::Lane;
use crate::process;
use crate::protocol::{Hold, LockServer};
use crate::stats;
use crate::sync::{self, Arc, Mutex, MutexGuard};

use self::batching::{BATCH_MIN_TTL, Batching};
use self::gate::{Gate, GateTicket, OwnedGateTicket};
use self::loss::{Loss, LostCallback};

/// What an extend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extended {
    /// The key held our token and has the new ttl.
    Yes,
    /// The lock is lost (now or before): the key no longer held our token, or the local
    /// deadline had passed. The caller calls [`Lease::notify_lost`] after the gate.
    Lost(LostReason),
}

/// The clock and the loss reporting, under one lock.
struct State {
    clock: LeaseClock,
    loss: Loss,
}

pub(crate) struct Lease {
    pub server: Arc<dyn LockServer>,
    pub keys: LockKeys,
    pub token: String,
    pub fencing_token: u64,
    /// What the hold is on the server.
    pub kind: Kind,
    /// The process that acquired the lock; after `fork()` the child must not touch it.
    process: process::Process,
    /// Replicas that must acknowledge each extend.
    replicas: Option<Replicas>,
    state: Mutex<State>,
    /// Taken while an extend or a renewal is in flight; closed by a release.
    gate: Arc<Gate>,
    batching: Batching,
}

impl Lease {
    /// A lease of `ttl` whose key was set to `leased` (at most `ttl`) by a request written
    /// at `sent_at`; `on_lost` is the callback of the hold it was acquired as.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        server: Arc<dyn LockServer>,
        keys: LockKeys,
        token: String,
        fencing_token: u64,
        kind: Kind,
        replicas: Option<Replicas>,
        clock: LeaseClock,
        on_lost: Option<(String, LostCallback)>,
    ) -> Self {
        Lease {
            server,
            keys,
            token,
            fencing_token,
            kind,
            process: process::Process::current(),
            replicas,
            state: Mutex::new(State {
                clock,
                loss: Loss::new(on_lost),
            }),
            gate: Arc::new(Gate::new()),
            batching: Batching::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    fn hold(&self) -> Hold<'_> {
        Hold {
            kind: &self.kind,
            keys: &self.keys,
            token: &self.token,
        }
    }

    /// Takes the gate for an extend or a renewal (waiting for one in flight); `None` once
    /// a release closed it.
    pub fn gate(&self) -> Option<GateTicket<'_>> {
        self.gate.enter()
    }

    /// Takes the gate without waiting: `Err(())` while an extend or renewal is in flight,
    /// `Ok(None)` once closed.
    pub fn try_gate_owned(&self) -> std::result::Result<Option<OwnedGateTicket>, ()> {
        self.gate.try_enter_owned()
    }

    /// Closes the gate, waiting for an extend or renewal in flight: none is sent afterwards.
    /// A renewal still queued behind another lock's slow batch is taken back (unsent)
    /// rather than waited for.
    pub fn close_gate(&self) {
        self.gate.begin_close();
        self.withdraw_queued_renewal(Duration::ZERO);
        self.gate.close();
    }

    /// Whether a release closed the gate.
    pub fn gate_closed(&self) -> bool {
        self.gate.closed()
    }

    /// Whether a release closed the gate or is waiting to close it: no renewal will be
    /// sent any more.
    pub fn gate_closing(&self) -> bool {
        self.gate.closing()
    }

    /// The ttl renewal uses: the last one asked for, never more than the cap.
    pub fn ttl(&self) -> Duration {
        self.state().clock.renewal_ttl()
    }

    pub fn deadline(&self) -> Instant {
        self.state().clock.deadline()
    }

    /// When the next renewal is due: a third of the way into the current lease.
    pub fn next_renewal(&self) -> Instant {
        self.state().clock.next_renewal()
    }

    /// When the next renewal is due, while it is not yet at `now` (see
    /// [`LeaseClock::renewal_wait`](crate::core::lease::LeaseClock::renewal_wait)).
    pub fn renewal_wait(&self, now: Instant) -> Option<Instant> {
        self.state().clock.renewal_wait(now)
    }

    /// What the renewal should do at `now`.
    pub fn renewal_step(&self, now: Instant) -> RenewalStep {
        self.state().clock.renewal_step(now)
    }

    /// When to try again after a renewal of `ttl` failed at `now`.
    pub fn retry_at(&self, now: Instant, ttl: Duration) -> Instant {
        self.state().clock.retry_at(now, ttl)
    }

    pub fn lost(&self) -> Option<LostReason> {
        self.state().clock.lost()
    }

    /// Not released, not lost, the local deadline not passed, and this is the process that
    /// acquired it.
    pub fn is_held(&self) -> bool {
        // The process first: a forked child must not wait for a lock a parent's thread held.
        self.process.is_current() && self.state().clock.is_held(Instant::now())
    }

    /// Why the lock may have been unprotected for a while before now; `None` while it has
    /// been held without a break.
    pub fn broken(&self) -> Option<Broken> {
        self.state().clock.broken(Instant::now())
    }

    pub fn remaining(&self) -> Duration {
        self.state().clock.remaining(Instant::now())
    }

    pub fn mark_released(&self) {
        let mut s = self.state();
        s.clock.mark_released();
        s.loss.released();
    }

    /// A receiver that gets the reason once if the lock is lost. It is disconnected when
    /// the lock is released.
    pub fn subscribe(&self) -> Receiver<LostReason> {
        let mut s = self.state();
        let (lost, released) = (s.clock.lost(), s.clock.released());
        s.loss.subscribe(lost, released)
    }

    /// Records a loss: under the gate, so that no extend is in flight and none starts and
    /// succeeds after it; then tells the holder (outside the gate: the callback may
    /// release). Does nothing once released.
    pub fn mark_lost(&self, reason: LostReason) {
        let decided = match self.gate() {
            Some(_gate) => self.state().clock.declare_lost(reason),
            None => false,
        };
        if decided {
            self.notify_lost();
        }
    }

    /// Records a loss for lack of renewal: under the gate, and only if the local deadline
    /// has still passed then (an extend that was in flight may have moved it on). `true`
    /// when the lock is lost.
    pub fn lose_if_expired(&self) -> bool {
        if let Some(_gate) = self.gate() {
            if !self.state().clock.lose_if_expired(Instant::now()) {
                return false;
            }
        }
        // Also when an extend that ran into the deadline declared it: the holder is told
        // once, whoever declared it.
        let lost = self.lost().is_some();
        if lost {
            self.notify_lost();
        }
        lost
    }

    /// Runs the lost-lock callbacks, then tells every subscriber, once. Call without the
    /// gate.
    pub fn notify_lost(&self) {
        let telling = {
            let mut s = self.state();
            let lost = s.clock.lost();
            s.loss.start_telling(lost)
        };
        let Some((reason, subscribers, listened)) = telling else {
            return;
        };
        stats::lost(reason);
        if listened {
            log::info!("lock {:?} lost: {reason}", self.keys.lock);
        } else {
            log::warn!("lock {:?} lost: {reason}", self.keys.lock);
        }
        // One at a time, each taken out just before its call: a hold released meanwhile
        // (`forget_on_lost`) is not called after its release. Each is dropped after its
        // call, outside the state's lock (dropping may run caller code).
        loop {
            let next = self.state().loss.next_callback();
            let Some((_, callback)) = next else {
                break;
            };
            self.run_callback(&callback, reason);
            if crate::process::orphaned() {
                // The callback forked and returned in the child: the other holds' handlers
                // and listeners are the parent's to tell.
                return;
            }
        }
        for tx in subscribers {
            let _ = tx.try_send(reason);
        }
    }

    fn run_callback(&self, callback: &LostCallback, reason: LostReason) {
        // A panicking callback must not take the renewal thread (reused for other locks)
        // down with it.
        let call = std::panic::AssertUnwindSafe(|| crate::process::call_out(|| callback(reason)));
        if std::panic::catch_unwind(call).is_err() {
            log::error!("the lost-lock callback of {:?} panicked", self.keys.lock);
        }
    }

    /// Adds the lost-lock callback of a later hold (token `hold`) of a reentrant lock that
    /// shares this lease. Called at once (on this thread) if the holder was already told of
    /// a loss.
    pub fn add_on_lost(&self, hold: &str, callback: LostCallback) {
        let told = {
            let mut s = self.state();
            let lost = s.clock.lost();
            s.loss.add(lost, hold, callback)
        };
        if let Some((reason, callback)) = told {
            self.run_callback(&callback, reason);
        }
    }

    /// Takes the lost-lock callback of the hold `hold` out: a loss found later is not
    /// reported to it. (One being reported on another thread right now runs to its end.)
    pub fn forget_on_lost(&self, hold: &str) {
        let forgotten = self.state().loss.forget(hold);
        // Dropped after the state's lock: dropping a callback may run caller code (the C
        // ABI's `user_data_free`).
        drop(forgotten);
    }

    /// Applies what a re-entry of a reentrant lock set on the server (the key leased for
    /// `leased` by a request written at `sent_at`, renewals of at least `ttl` from then
    /// on) to this shared lease: its deadline moves on if that is later, never back.
    pub fn reentered(&self, ttl: Duration, leased: Duration, sent_at: Instant) {
        self.state().clock.reentered(ttl, leased, sent_at);
    }

    /// Fails with [`ErrorKind::NotHeld`] unless called from the process that acquired the
    /// lock: a forked child does not hold its parent's locks and must not touch them.
    pub fn check_process(&self) -> Result<()> {
        if self.process.is_current() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::NotHeld,
                format!(
                    "lock {:?} is held by the process that acquired it, not by this forked child",
                    self.keys.lock
                ),
            ))
        }
    }

    /// Sends the token-checked extend on `lane`; the caller holds the gate. Nothing runs
    /// past `cutoff`. The clock decides what the answer means (see
    /// [`LeaseClock::after_extend`]); a lock already lost, or whose local deadline has
    /// passed, is not extended: a loss is final.
    ///
    /// Errors: the extend's own when it failed and the lease goes on; [`ErrorKind::NotHeld`]
    /// when it failed and the lease ended meanwhile (the lock is then lost).
    pub fn extend_gated(
        &self,
        ttl: Duration,
        lane: Lane,
        cutoff: Option<Instant>,
    ) -> Result<Extended> {
        ttl_millis(ttl)?;
        let attempt_at = Instant::now();
        if let Err(reason) = self.state().clock.before_extend(attempt_at, ttl) {
            return Ok(Extended::Lost(reason));
        }
        let exec = Exec::new(lane, self.server.bounds().io).cutoff(cutoff);
        let (outcome, error) = match self.server.extend(self.hold(), ttl, self.replicas, &exec) {
            Ok(Answer {
                reply: ExtendReply::Extended,
                sent_at,
                unacknowledged: Some(short),
            }) => (ExtendOutcome::Unacknowledged { sent_at }, Some(short)),
            Ok(Answer { reply, sent_at, .. }) => (ExtendOutcome::Replied { reply, sent_at }, None),
            Err(e) => (
                ExtendOutcome::Failed {
                    unknown: e.outcome_unknown(),
                },
                Some(e),
            ),
        };
        match (
            self.apply(ttl, attempt_at, outcome, lane == Lane::Renewal),
            error,
        ) {
            (ExtendVerdict::Extended { .. }, _) => Ok(Extended::Yes),
            (ExtendVerdict::Lost { reason, .. }, None) => Ok(Extended::Lost(reason)),
            // Not confirmed before the lease ended: the lock is lost at its deadline (the
            // caller tells the holder, after the gate).
            (ExtendVerdict::Lost { .. }, Some(e)) => Err(Error::new(
                ErrorKind::NotHeld,
                format!(
                    "lock {:?} was lost: its lease ended before the extend was confirmed ({e})",
                    self.keys.lock
                ),
            )),
            (ExtendVerdict::Failed, Some(e)) => Err(e),
            (ExtendVerdict::Failed, None) => Err(Error::new(
                ErrorKind::Internal,
                "an extend failed without an error",
            )),
        }
    }

    /// Applies an extend's outcome to the clock; a `renewal`'s timing and failures go into
    /// [`crate::stats`].
    fn apply(
        &self,
        ttl: Duration,
        attempt_at: Instant,
        outcome: ExtendOutcome,
        renewal: bool,
    ) -> ExtendVerdict {
        let verdict = self
            .state()
            .clock
            .after_extend(ttl, attempt_at, outcome, Instant::now());
        if renewal {
            match (verdict, outcome) {
                (ExtendVerdict::Extended { late }, _) => stats::renewed(late),
                // The key without the token: not a failure to renew, a loss.
                (
                    _,
                    ExtendOutcome::Replied {
                        reply: ExtendReply::NotHeld,
                        ..
                    },
                ) => {}
                _ => stats::renewal_failed(),
            }
        }
        verdict
    }

    /// Whether renewals can be batched with other locks' (see [`crate::backend::batch`]):
    /// where the deployment batches, not with `min_replicas` (its `WAIT` belongs to its
    /// own connection), nor for leases under [`BATCH_MIN_TTL`], whose renewals cannot
    /// spare the batch's gathering time.
    pub fn can_batch(&self) -> bool {
        self.replicas.is_none()
            && self.server.capabilities().batching
            && self.ttl() >= BATCH_MIN_TTL
    }

    /// Hands one renewal (with the ttl renewal uses) to the batching thread of the lock's
    /// node, holding the gate (`ticket`) until its reply is applied. Returns at once. When
    /// the renewal fails or finds the lock lost, `on_trouble` runs (on the batching thread;
    /// it must only wake the lock's renewal thread, which then takes over).
    ///
    /// Errors: the node could not be found or no batching thread started; nothing was sent.
    pub fn submit_renewal(
        self: &Arc<Self>,
        ticket: OwnedGateTicket,
        on_trouble: impl FnOnce() + Send + 'static,
    ) -> Result<()> {
        let attempt_at = Instant::now();
        let (ttl, deadline) = {
            let mut s = self.state();
            let ttl = s.clock.renewal_ttl();
            if s.clock.before_extend(attempt_at, ttl).is_err() {
                drop(s);
                // Lost meanwhile: the renewal thread finds it so and tells the holder.
                drop(ticket);
                on_trouble();
                return Ok(());
            }
            (ttl, s.clock.deadline())
        };
        let call = self
            .batching
            .extend_call(ttl, || {
                Ok(self.kind.extend(&self.keys, &self.token, ttl_millis(ttl)?))
            })
            .inspect_err(|_| self.not_sent())?;
        let lease = self.clone();
        let done: crate::backend::batch::Done = Box::new(move |value: Result<Value>, sent_at| {
            let (outcome, error) = match value.and_then(|v| reply::extend(Some(v))) {
                Ok(reply) => (ExtendOutcome::Replied { reply, sent_at }, None),
                Err(e) => (
                    ExtendOutcome::Failed {
                        unknown: e.outcome_unknown(),
                    },
                    Some(e),
                ),
            };
            let verdict = lease.apply(ttl, attempt_at, outcome, true);
            drop(ticket);
            match (verdict, error) {
                (ExtendVerdict::Extended { .. }, _) => {}
                (ExtendVerdict::Lost { .. }, _) => on_trouble(),
                (ExtendVerdict::Failed, error) => {
                    if let Some(e) = error {
                        log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
                    }
                    lease.batching.set_failed();
                    on_trouble();
                }
            }
        });
        let item = Item {
            call,
            cutoff: deadline,
            done,
        };
        let queued = self
            .server
            .queue_renewal(&self.keys.lock, item, deadline)
            .inspect_err(|_| self.not_sent())?;
        self.batching.queued(queued, Instant::now());
        if self.gate.closing() {
            // A release began while this renewal was being handed over: it found nothing
            // queued to take back, and must not wait for another lock's slow batch.
            self.withdraw_queued_renewal(Duration::ZERO);
        }
        Ok(())
    }

    /// The extend announced to the clock was never sent.
    fn not_sent(&self) {
        self.state().clock.extend_not_sent(Instant::now());
    }

    /// Takes back this lease's batched renewal if it has waited in its batcher's queue
    /// for at least `patience`, unsent: its gate is free again and the next renewal goes
    /// on its own. `true` when one was taken back.
    pub fn withdraw_queued_renewal(&self, patience: Duration) -> bool {
        let taken = self.batching.take_back(patience, Instant::now());
        if taken {
            self.not_sent();
        }
        taken
    }

    /// Whether the last batched renewal failed (the next one then goes on its own,
    /// following redirections); clears it.
    pub fn take_batch_failed(&self) -> bool {
        self.batching.take_failed()
    }

    /// Sends the token-checked release (which grants the lock to a waiter if there is
    /// one) on the urgent lane, which never waits for a pooled connection. `hold` names
    /// the hold given back: the lock's token, or one of a reentrant lock's later holds
    /// (the lock is then released with its last hold). `Ok(false)`: the key no longer held
    /// the token.
    pub fn release_on_server(&self, hold: &str) -> Result<bool> {
        let exec = Exec::new(Lane::Urgent, self.server.bounds().io);
        let hold = Hold {
            token: hold,
            ..self.hold()
        };
        let reply = self.server.release(hold, self.ttl(), false, &exec)?;
        if reply == ReleaseReply::HandedOff {
            stats::handed_off();
        }
        Ok(reply.was_held())
    }
}
