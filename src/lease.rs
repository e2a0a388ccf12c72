//! The lease of a held lock: its token, its local deadline, and whether it was lost.
//!
//! Shared (behind an `Arc`) by the guard and the lock's renewal thread.
//!
//! Every local deadline is conservative: it is computed from the moment *before* the
//! request that set or extended the key's expiry was written, so the key surely lives at
//! least that long on the server (minus the drift allowance). The one way the server's
//! expiry could end up earlier than a deadline computed so is an extend to a *shorter* ttl
//! whose reply was lost: it may still run later. So after such an extend the lease never
//! again assumes more than that shorter ttl (the `cap`).
//!
//! Extends and renewals take the lease's *gate*, one at a time; a release closes the gate
//! (waiting for the one in flight), so nothing extends a lock after its release was sent.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::backend::batch::Batcher;
use crate::backend::{self, Backend, Exec, Lane, Replicas};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::process;
use crate::redlock;
use crate::scripts;
use crate::stats;
use crate::waiting;

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The key no longer held our token when renewing or extending: it expired, was deleted,
    /// or another owner has it now.
    NotHeld,
    /// Redis could not be reached before the lease's local deadline passed.
    Unreachable,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => "the key no longer holds this lock's token",
            LostReason::Unreachable => "Redis was unreachable until the lease ran out",
        })
    }
}

/// A function told once when a lock is lost; runs on the renewal thread (or on the thread
/// whose `extend` found the lock gone), so it must not block for long. A panic in it is
/// caught and logged.
pub type LostCallback = Arc<dyn Fn(LostReason) + Send + Sync>;

pub(crate) struct Lease {
    pub backend: Arc<Backend>,
    pub keys: LockKeys,
    pub token: String,
    pub fencing_token: u64,
    /// The process that acquired the lock; after `fork()` the child must not touch it.
    process: u64,
    /// Replicas that must acknowledge each extend.
    replicas: Option<Replicas>,
    /// What the hold is on the server.
    pub kind: Kind,
    state: Mutex<LeaseState>,
    /// Taken while an extend or a renewal is in flight; closed by a release.
    gate: Gate,
    /// The packed extend request for the current ttl, kept so that a renewal does not
    /// format its arguments again each time.
    packed_extend: Mutex<Option<(Duration, crate::backend::Call)>>,
    /// The batched renewal this lease last queued: its batcher, its id there, and when it
    /// was queued (see [`Lease::withdraw_queued_renewal`]).
    queued: Mutex<Option<(Weak<Batcher>, u64, Instant)>>,
    /// The last batched renewal failed.
    batch_failed: std::sync::atomic::AtomicBool,
}

/// One extend or renewal at a time, and none after a release. Unlike a mutex guard, a
/// [`GateTicket`] can travel to another thread (a batched renewal holds it until its reply
/// has been applied).
struct Gate {
    state: Mutex<GateState>,
    freed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    busy: bool,
    closed: bool,
    /// A release waits to close the gate: nothing new may enter before it.
    closing: bool,
    /// Threads waiting for the gate (a wake-up is a system call: made only for them).
    waiting: usize,
}

impl Gate {
    fn new() -> Self {
        Gate {
            state: Mutex::new(GateState::default()),
            freed: std::sync::Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits while an extend or renewal is in flight, then takes the gate; `false` once
    /// closed.
    fn enter(&self) -> bool {
        let mut s = self.state();
        while s.busy && !s.closing {
            s.waiting += 1;
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiting -= 1;
        }
        if s.closed || s.closing {
            return false;
        }
        s.busy = true;
        true
    }

    /// Takes the gate only if nothing is in flight: `None` when busy, `Some(false)` when
    /// closed.
    fn try_enter(&self) -> Option<bool> {
        let mut s = self.state();
        if s.closed || s.closing {
            return Some(false);
        }
        if s.busy {
            return None;
        }
        s.busy = true;
        Some(true)
    }

    fn leave(&self) {
        let mut s = self.state();
        s.busy = false;
        let wake = s.waiting > 0;
        drop(s);
        if wake {
            self.freed.notify_all();
        }
    }

    /// Lets nothing enter any more: a release is about to close the gate.
    fn begin_close(&self) {
        self.state().closing = true;
    }

    /// Waits while an extend or renewal is in flight, then closes the gate for good.
    fn close(&self) {
        let mut s = self.state();
        // From now on nothing enters: the release waits for the one in flight only.
        s.closing = true;
        while s.busy {
            s.waiting += 1;
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiting -= 1;
        }
        s.closed = true;
    }
}

/// The gate of a lease, taken; given back when dropped.
pub(crate) struct GateTicket<'a>(&'a Gate);

impl Drop for GateTicket<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// As [`GateTicket`], owning its lease, so that it can travel with a batched renewal.
pub(crate) struct OwnedGateTicket(Arc<Lease>);

impl Drop for OwnedGateTicket {
    fn drop(&mut self) {
        self.0.gate.leave();
    }
}

struct LeaseState {
    /// The ttl asked for last (by the acquire or an extend); renewal uses it.
    ttl: Duration,
    /// The ttl the key was last set to (shorter than `ttl` for a grant just taken).
    leased: Duration,
    /// The shortest ttl of an extend whose outcome is unknown (see the module docs).
    cap: Option<Duration>,
    /// When the request that last set the key's expiry was written.
    start: Instant,
    /// Monotonic time before which the key surely still holds our token (unless deleted).
    deadline: Instant,
    lost: Option<LostReason>,
    /// The holder was told of the loss (callback and subscribers run once).
    notified: bool,
    released: bool,
    subscribers: Vec<Sender<LostReason>>,
    /// The lost-lock callbacks, each with the token of its hold: the acquire's, and those
    /// of the later holds of a reentrant lock that share this lease. A hold's release takes
    /// its own out.
    callbacks: Vec<(String, LostCallback)>,
}

impl LeaseState {
    /// The lease the deadline assumes: what the key was set to, never more than the cap.
    fn effective_lease(&self) -> Duration {
        self.cap.map_or(self.leased, |cap| cap.min(self.leased))
    }
}

/// The shortest lease whose renewals are batched: a batch waits a few milliseconds to
/// gather renewals, a few percent of this.
const BATCH_MIN_TTL: Duration = Duration::from_millis(200);

/// Safety margin subtracted from a lease for clock drift (the Redlock paper's 1 % plus 2 ms).
pub(crate) fn drift(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)).min(ttl)
}

/// The local deadline of a lease of `ttl` whose request was written at `sent_at`.
pub(crate) fn local_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - drift(ttl)
}

/// What an extend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extended {
    /// The key held our token and has the new ttl.
    Yes,
    /// The lock is lost (now or before): the key no longer held our token, or the local
    /// deadline had passed. The caller calls [`Lease::notify_lost`] after the gate.
    Lost(LostReason),
}

impl Lease {
    /// A lease of `ttl` whose key was set to `leased` (at most `ttl`) by a request written
    /// at `sent_at`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Arc<Backend>,
        keys: LockKeys,
        token: String,
        fencing_token: u64,
        ttl: Duration,
        leased: Duration,
        sent_at: Instant,
        on_lost: Option<(String, LostCallback)>,
    ) -> Self {
        Lease {
            backend,
            keys,
            token,
            fencing_token,
            process: process::generation(),
            replicas: None,
            kind: Kind::Mutex,
            state: Mutex::new(LeaseState {
                ttl,
                leased,
                cap: None,
                start: sent_at,
                deadline: local_deadline(sent_at, leased),
                lost: None,
                notified: false,
                released: false,
                subscribers: Vec::new(),
                callbacks: on_lost.into_iter().collect(),
            }),
            gate: Gate::new(),
            packed_extend: Mutex::new(None),
            queued: Mutex::new(None),
            batch_failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Makes the lease one of `kind` (a mutex by default).
    pub fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Makes every extend and renewal wait for `replicas` to acknowledge it.
    pub fn with_replicas(mut self, replicas: Option<Replicas>) -> Self {
        self.replicas = replicas;
        self
    }

    /// Takes the gate for an extend or a renewal (waiting for one in flight); `None` once
    /// a release closed it.
    pub fn gate(&self) -> Option<GateTicket<'_>> {
        self.gate.enter().then(|| GateTicket(&self.gate))
    }

    /// Takes the gate without waiting: `Err(())` while an extend or renewal is in flight,
    /// `Ok(None)` once closed.
    pub fn try_gate_owned(self: &Arc<Self>) -> std::result::Result<Option<OwnedGateTicket>, ()> {
        match self.gate.try_enter() {
            None => Err(()),
            Some(false) => Ok(None),
            Some(true) => Ok(Some(OwnedGateTicket(self.clone()))),
        }
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
        self.gate.state().closed
    }

    /// Whether a release closed the gate or is waiting to close it: no renewal will be
    /// sent any more.
    pub fn gate_closing(&self) -> bool {
        let s = self.gate.state();
        s.closed || s.closing
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ttl renewal uses: the last one asked for, never more than the cap.
    pub fn ttl(&self) -> Duration {
        let s = self.state();
        s.cap.map_or(s.ttl, |cap| cap.min(s.ttl))
    }

    pub fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// When the next renewal is due: a third of the way into the current lease.
    pub fn next_renewal(&self) -> Instant {
        let s = self.state();
        s.start + s.effective_lease() / 3
    }

    pub fn lost(&self) -> Option<LostReason> {
        self.state().lost
    }

    /// Not released, not lost, the local deadline not passed, and this is the process that
    /// acquired it.
    pub fn is_held(&self) -> bool {
        let s = self.state();
        !s.released
            && s.lost.is_none()
            && Instant::now() < s.deadline
            && self.process == process::generation()
    }

    /// Why the lock may have been unprotected for a while before now: it was lost, or its
    /// local deadline passed. `None` while it has been held without a break.
    pub fn broken(&self) -> Option<String> {
        let s = self.state();
        match s.lost {
            Some(reason) => Some(format!("was lost ({reason})")),
            None if Instant::now() >= s.deadline => Some("outlived its lease".to_owned()),
            None => None,
        }
    }

    pub fn remaining(&self) -> Duration {
        let s = self.state();
        if s.released || s.lost.is_some() {
            return Duration::ZERO;
        }
        s.deadline.saturating_duration_since(Instant::now())
    }

    pub fn mark_released(&self) {
        let mut s = self.state();
        s.released = true;
        s.subscribers.clear();
    }

    /// A receiver that gets the reason once if the lock is lost. It is disconnected when
    /// the lock is released.
    pub fn subscribe(&self) -> Receiver<LostReason> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut s = self.state();
        match s.lost {
            Some(reason) => {
                let _ = tx.try_send(reason);
            }
            None if !s.released => s.subscribers.push(tx),
            None => {}
        }
        rx
    }

    /// Records a loss: under the gate, so that no extend is in flight and none starts and
    /// succeeds after it; then tells the holder (outside the gate: the callback may
    /// release). Does nothing once released.
    pub fn mark_lost(&self, reason: LostReason) {
        let decided = match self.gate() {
            Some(_gate) => self.declare_lost(reason),
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
            if Instant::now() < self.deadline() {
                return false;
            }
            self.declare_lost(LostReason::Unreachable);
        }
        // Also when an extend that ran into the deadline declared it: the holder is told
        // once, whoever declared it.
        let lost = self.lost().is_some();
        if lost {
            self.notify_lost();
        }
        lost
    }

    /// Sets the loss; the caller holds the gate. `true` when this call decided it (the
    /// caller then calls [`notify_lost`](Self::notify_lost) once it let go of the gate).
    fn declare_lost(&self, reason: LostReason) -> bool {
        let mut s = self.state();
        if s.lost.is_some() || s.released {
            return false;
        }
        s.lost = Some(reason);
        true
    }

    /// Runs the lost-lock callback, then tells every subscriber. Call without the gate.
    pub fn notify_lost(&self) {
        let (reason, subscribers, told) = {
            let mut s = self.state();
            match s.lost {
                Some(reason) if !s.notified => {
                    s.notified = true;
                    let told = !s.subscribers.is_empty() || !s.callbacks.is_empty();
                    (reason, std::mem::take(&mut s.subscribers), told)
                }
                _ => return,
            }
        };
        if told {
            log::info!("lock {:?} lost: {reason}", self.keys.lock);
        } else {
            log::warn!("lock {:?} lost: {reason}", self.keys.lock);
        }
        // One at a time, each taken out just before its call: a hold released meanwhile
        // (`forget_on_lost`) is not called after its release. Each is dropped after its
        // call, outside the state's lock (dropping may run caller code).
        loop {
            let next = {
                let mut s = self.state();
                if s.callbacks.is_empty() {
                    break;
                }
                s.callbacks.remove(0)
            };
            self.run_callback(&next.1, reason);
        }
        for tx in subscribers {
            let _ = tx.try_send(reason);
        }
    }

    fn run_callback(&self, callback: &LostCallback, reason: LostReason) {
        // A panicking callback must not take the renewal thread (reused for other locks)
        // down with it.
        let call = std::panic::AssertUnwindSafe(|| callback(reason));
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
            match s.lost {
                Some(reason) if s.notified => Some(reason),
                _ => {
                    s.callbacks.push((hold.to_owned(), callback.clone()));
                    None
                }
            }
        };
        if let Some(reason) = told {
            self.run_callback(&callback, reason);
        }
    }

    /// Takes the lost-lock callback of the hold `hold` out: a loss found later is not
    /// reported to it. (One being reported on another thread right now runs to its end.)
    pub fn forget_on_lost(&self, hold: &str) {
        let forgotten: Vec<_> = {
            let mut s = self.state();
            let (gone, kept) = std::mem::take(&mut s.callbacks)
                .into_iter()
                .partition(|(h, _)| h == hold);
            s.callbacks = kept;
            gone
        };
        // Dropped after the state's lock: dropping a callback may run caller code (the C
        // ABI's `user_data_free`).
        drop(forgotten);
    }

    /// Applies what a re-entry of a reentrant lock set on the server (the key leased for
    /// `leased` by a request written at `sent_at`, renewals of at least `ttl` from then
    /// on) to this shared lease: its deadline moves on if that is later, never back.
    pub fn reentered(&self, ttl: Duration, leased: Duration, sent_at: Instant) {
        let mut s = self.state();
        if s.lost.is_some() || s.released {
            return;
        }
        s.ttl = s.ttl.max(ttl);
        let lease = s.cap.map_or(leased, |cap| cap.min(leased));
        let deadline = local_deadline(sent_at, lease);
        if deadline > s.deadline {
            s.start = sent_at;
            s.leased = leased;
            s.deadline = deadline;
        }
    }

    /// Fails with [`ErrorKind::NotHeld`] unless called from the process that acquired the
    /// lock: a forked child does not hold its parent's locks and must not touch them.
    pub fn check_process(&self) -> Result<()> {
        if self.process == process::generation() {
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
    /// past `cutoff`. On success the ttl, the lease start and the local deadline follow
    /// the new ttl; when the outcome is unknown the deadline and cap are lowered to what
    /// the extend may have set. A lock already lost, or whose local deadline has passed,
    /// is not extended: a loss is final.
    pub fn extend_gated(
        &self,
        ttl: Duration,
        lane: Lane,
        cutoff: Option<Instant>,
    ) -> Result<Extended> {
        let ttl_ms = ttl_millis(ttl)?;
        {
            let lost = self.state().lost;
            if let Some(reason) = lost {
                return Ok(Extended::Lost(reason));
            }
            if Instant::now() >= self.deadline() {
                self.declare_lost(LostReason::Unreachable);
                return Ok(Extended::Lost(LostReason::Unreachable));
            }
        }
        let mut calls = vec![self.kind.extend(&self.keys, &self.token, ttl_ms)];
        calls.extend(self.replicas.map(|r| r.call()));
        let how = Exec {
            cutoff,
            ..self.backend.exec_on(lane)
        };
        let attempt_at = Instant::now();
        let result = if let Some(members) = self.backend.redlock_members() {
            let outcome =
                redlock::extend(&self.backend, members, &self.keys, &self.token, ttl, cutoff);
            match outcome {
                Ok(redlock::ExtendOutcome::Extended(sent_at)) => Ok((1, sent_at)),
                Ok(redlock::ExtendOutcome::Lost) => Ok((0, attempt_at)),
                Err(e) => Err(e),
            }
        } else {
            self.backend
                .run(&self.keys.lock, &calls, &how)
                .and_then(|replies| {
                    let mut values = replies.values.into_iter();
                    let extended =
                        backend::reply::<i64>(values.next().unwrap_or(redis::Value::Nil))?;
                    if let (1, Some(replicas)) = (extended, &self.replicas) {
                        // Extended on the primary but not known to the replicas: the previous
                        // deadline stays (the server's new expiry is only later).
                        replicas.check(values.next(), "extending")?;
                    }
                    Ok((extended, replies.sent_at))
                })
        };
        match self.apply_extend(ttl, attempt_at, result, lane == Lane::Renewal) {
            // Not confirmed before the lease ended: the lock is lost at its deadline (the
            // caller tells the holder, after the gate).
            Err(e) if Instant::now() >= self.deadline() => {
                self.declare_lost(LostReason::Unreachable);
                Err(Error::new(
                    ErrorKind::NotHeld,
                    format!(
                        "lock {:?} was lost: its lease ended before the extend was confirmed ({e})",
                        self.keys.lock
                    ),
                ))
            }
            outcome => outcome,
        }
    }

    /// Records what an extend of `ttl`, sent at `attempt_at` or later, found: `Ok((1,
    /// sent_at))` extended by a request written at `sent_at`; `Ok((0, _))` the key no
    /// longer held the token (the loss is declared; the caller holds the gate); an error
    /// (when its outcome is unknown, the deadline and cap are lowered to what it may have
    /// set). A `renewal`'s timing and failures go into [`crate::stats`].
    fn apply_extend(
        &self,
        ttl: Duration,
        attempt_at: Instant,
        result: Result<(i64, Instant)>,
        renewal: bool,
    ) -> Result<Extended> {
        let mut s = self.state();
        match result {
            Ok((1, sent_at)) => {
                let now = Instant::now();
                let effective = s.cap.map_or(ttl, |cap| cap.min(ttl));
                if now >= s.deadline || local_deadline(sent_at, effective) <= now {
                    // The reply came after the lease ended (the holder was already told
                    // it is not held), or it set a lease that is already over: a loss is
                    // final, and the lock is never believed held again.
                    if renewal {
                        stats::renewal_failed();
                    }
                    drop(s);
                    self.declare_lost(LostReason::Unreachable);
                    return Ok(Extended::Lost(LostReason::Unreachable));
                }
                if renewal {
                    let due = s.start + s.effective_lease() / 3;
                    stats::renewed(sent_at.saturating_duration_since(due));
                }
                s.ttl = ttl;
                s.leased = ttl;
                s.start = sent_at;
                s.deadline = local_deadline(sent_at, s.effective_lease());
                Ok(Extended::Yes)
            }
            Ok(_) => {
                drop(s);
                self.declare_lost(LostReason::NotHeld);
                Ok(Extended::Lost(LostReason::NotHeld))
            }
            Err(e) => {
                if renewal {
                    stats::renewal_failed();
                }
                if e.outcome_unknown() {
                    s.cap = Some(s.cap.map_or(ttl, |cap| cap.min(ttl)));
                    s.deadline = s.deadline.min(local_deadline(attempt_at, ttl));
                }
                Err(e)
            }
        }
    }

    /// Whether renewals can be batched with other locks' (see [`crate::backend::batch`]):
    /// not for Redlock (a renewal is a round on every member) nor with `min_replicas`
    /// (its `WAIT` belongs to its own connection), nor for leases under
    /// [`BATCH_MIN_TTL`], whose renewals cannot spare the batch's gathering time.
    pub fn can_batch(&self) -> bool {
        self.replicas.is_none()
            && self.backend.redlock_members().is_none()
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
        on_trouble: Box<dyn FnOnce() + Send>,
    ) -> Result<()> {
        let ttl = self.ttl();
        let deadline = self.deadline();
        let node = self.backend.node_for(&self.keys.lock, deadline)?;
        let call = {
            let mut cached = self.packed_extend.lock().unwrap_or_else(|p| p.into_inner());
            match cached.as_ref() {
                Some((cached_ttl, call)) if *cached_ttl == ttl => call.clone(),
                _ => {
                    let call = self.kind.extend(&self.keys, &self.token, ttl_millis(ttl)?);
                    *cached = Some((ttl, call.clone()));
                    call
                }
            }
        };
        let lease = self.clone();
        let attempt_at = Instant::now();
        let done: crate::backend::batch::Done = Box::new(move |reply, sent_at| {
            let result = reply.and_then(|value| Ok((backend::reply::<i64>(value)?, sent_at)));
            let outcome = lease.apply_extend(ttl, attempt_at, result, true);
            drop(ticket);
            match outcome {
                Ok(Extended::Yes) => {}
                Ok(Extended::Lost(_)) => on_trouble(),
                Err(e) => {
                    log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
                    lease
                        .batch_failed
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    on_trouble();
                }
            }
        });
        let item = crate::backend::batch::Item {
            call,
            cutoff: deadline,
            done,
        };
        let id = Batcher::submit(&node, item, self.backend.io_timeout)?;
        *self.queued.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Arc::downgrade(&node.batcher), id, Instant::now()));
        Ok(())
    }

    /// Takes back this lease's batched renewal if it has waited in its batcher's queue
    /// for at least `patience` (a batch held up by a slow reply keeps everything queued
    /// behind it), completing it as failed, unsent: its gate is free again and the next
    /// renewal goes on its own. `true` when one was withdrawn.
    pub fn withdraw_queued_renewal(&self, patience: Duration) -> bool {
        let queued = {
            let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
            match queued.as_ref() {
                Some((_, _, at)) if at.elapsed() >= patience => queued.take(),
                _ => None,
            }
        };
        let Some((batcher, id, _)) = queued else {
            return false;
        };
        let Some(item) = batcher.upgrade().and_then(|b| b.withdraw(id)) else {
            return false;
        };
        let withdrawn = Error::new(
            ErrorKind::Timeout,
            "the renewal was taken back from its batch before it was sent",
        );
        (item.done)(Err(withdrawn), Instant::now());
        true
    }

    /// Whether the last batched renewal failed (the next one then goes on its own,
    /// following redirections); clears it.
    pub fn take_batch_failed(&self) -> bool {
        self.batch_failed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Sends the token-checked release (which grants the lock to a waiter if there is
    /// one) on the urgent lane, which never waits for a pooled connection. `hold` names
    /// the hold given back: the lock's token, or one of a reentrant lock's later holds
    /// (the lock is then released with its last hold). `Ok(false)`: the key no longer held
    /// the token.
    pub fn release_on_server(&self, hold: &str) -> Result<bool> {
        if let Some(members) = self.backend.redlock_members() {
            let (ttl, valid_until) = {
                let s = self.state();
                (s.ttl, s.deadline)
            };
            return redlock::release(
                &self.backend,
                members,
                &self.keys,
                &self.token,
                ttl,
                valid_until,
            );
        }
        release_hold(&self.backend, &self.kind, &self.keys, hold, None, false)
    }
}

/// Runs the release script of `kind` for `token`: the release of a hold, or (`withdraw`)
/// the withdrawal of a waiter that gives up, which also undoes a hold it may have taken
/// unawares. `Ok(true)` when the hold was there and no longer is.
pub(crate) fn release_hold(
    backend: &Backend,
    kind: &Kind,
    keys: &LockKeys,
    token: &str,
    cutoff: Option<Instant>,
    withdraw: bool,
) -> Result<bool> {
    let grace = waiting::grace(backend.io_timeout).as_millis() as u64;
    let call = kind.release(keys, token, scripts::MIN_CLAIM_MS, grace, withdraw);
    let how = Exec {
        cutoff,
        ..backend.exec_on(Lane::Urgent)
    };
    let replies = backend.run(&keys.lock, &[call], &how)?;
    let value = replies
        .values
        .into_iter()
        .next()
        .unwrap_or(redis::Value::Nil);
    Ok(backend::reply::<i64>(value)? != 0)
}

/// The largest ttl accepted (about 34 years); also keeps deadlines far from overflow.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// The shortest ttl accepted: a lease must outlive the round trip that sets it and the drift
/// allowance, or it is lost before it can be used.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// Validates a ttl and converts it to whole milliseconds.
///
/// Errors: [`ErrorKind::InvalidArgument`] for less than [`MIN_TTL`] or more than
/// [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl < MIN_TTL {
        return Err(Error::invalid(format!(
            "the ttl must be at least {MIN_TTL:?} (shorter leases end before they can be used), got {ttl:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "the ttl of {ttl:?} is over the maximum of {MAX_TTL:?}"
        )));
    }
    Ok(ttl.as_millis() as u64)
}
