//! The renewal thread (watchdog) of each held lock.
//!
//! Every renewed lock has a thread of its own for as long as it is held. The thread renews
//! every ttl/3 with the token-checked script, sleeping in between on a condition variable
//! with a deadline. (Not a `crossbeam_channel` receive: it spins and yields a few times
//! before blocking, which `perf` showed to be a tenth of the renewal CPU with 1000 locks.)
//! A renewal that finds the token gone, or that cannot reach Redis before the lease's local
//! deadline, marks the lock lost and ends the renewal: no renewal is sent after that.
//!
//! No renewal after a release: each renewal is sent while holding the lease's gate (which
//! `extend` takes too, so the two never race), and [`Renewal::stop`] closes that gate
//! (waiting for a renewal in flight) before the release is sent. From then on the thread is
//! free. The thread holds only a weak reference to the lease, so a released lock (and its
//! client's connections) is freed when its guard is, not when the thread next wakes.
//!
//! Timing: a renewal is due a third of the way into the current lease (counted from when
//! the request that set it was written), so it follows the ttl of the last extend; an
//! extend that succeeds reschedules the thread. A renewal is cut off at the lease's local
//! deadline (connecting included): if it has not succeeded by then, the lock is lost at
//! that moment. It is not joined: it parks, ready to
//! renew the next lock, so acquiring a lock costs no thread spawn. A parked thread whose own
//! wake-up comes before the next lock's first renewal gets that lock without even being
//! woken. Parked threads exit after [`IDLE_TIMEOUT`].

use std::time::{Duration, Instant};

use crate::core::lease::{LostReason, RenewalStep, coalescing};
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::lease::{Extended, Lease};
use crate::process::{self, Process};
use crate::sync::{self, Arc, Condvar, Mutex, MutexGuard, Weak, thread};

/// How soon a renewal thread looks again at a lease whose gate an extend holds.
const GATE_RETRY: Duration = Duration::from_millis(10);
/// How long a parked renewal thread waits for another lock before it exits.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Parked renewal threads kept at most; more exit when their lock is released.
const MAX_IDLE: usize = 256;

/// The renewal of one held lock; stop it with [`Renewal::stop`].
pub(crate) struct Renewal {
    lease: Arc<Lease>,
    worker: Arc<Worker>,
    job: u64,
}

/// A lock for a renewal thread, and when it is next due.
struct Job {
    id: u64,
    lease: Weak<Lease>,
    due: Instant,
}

/// A renewal thread, as seen by the others.
struct Worker {
    /// The job the thread works for, 0 when free. Changed only under [`PARKED`]'s lock.
    assigned: Mutex<u64>,
    /// Handed-over job and the thread's next wake-up, under one lock so that a job is
    /// never left unseen.
    state: Mutex<WorkerState>,
    /// Wakes the thread early.
    poke: Condvar,
    /// The process the thread runs in: a forked child must never hand it work.
    process: Process,
}

struct WorkerState {
    mailbox: Option<Job>,
    /// The job's lease was extended: its next renewal is due at this (earlier) moment.
    rescheduled: Option<(u64, Instant)>,
    wake_at: Instant,
    /// Awake and working (renewing, or in a lost-lock callback). A busy thread is not put
    /// back among the parked ones by [`free`]; it parks itself when done, so a callback that
    /// blocks cannot hold up renewals of later locks.
    busy: bool,
}

/// How a worker's sleep ended.
enum Woke {
    /// A job was handed over.
    Job(Job),
    /// The job with this id is now due at this moment.
    Rescheduled(u64, Instant),
    /// Its own deadline passed.
    Timer,
}

impl Worker {
    fn state(&self) -> MutexGuard<'_, WorkerState> {
        sync::lock(&self.state)
    }

    fn assigned(&self) -> MutexGuard<'_, u64> {
        sync::lock(&self.assigned)
    }

    /// Hands `job` over, waking the thread only if it would otherwise sleep past the due
    /// time.
    fn hand_over(&self, job: Job) {
        let due = job.due;
        let mut state = self.state();
        state.mailbox = Some(job);
        if state.wake_at > due {
            self.poke.notify_one();
        }
    }

    /// Moves job `id`'s next renewal to `due`, waking the thread if it would sleep past it.
    fn reschedule(&self, id: u64, due: Instant) {
        let mut state = self.state();
        state.rescheduled = Some((id, due));
        if state.wake_at > due {
            self.poke.notify_one();
        }
    }

    /// Sleeps until `wake_at`, a handed-over job or a reschedule.
    fn sleep_until(&self, wake_at: Instant) -> Woke {
        let mut state = self.state();
        state.wake_at = wake_at;
        state.busy = false;
        loop {
            if let Some(job) = state.mailbox.take() {
                state.busy = true;
                return Woke::Job(job);
            }
            if let Some((id, due)) = state.rescheduled.take() {
                state.busy = true;
                return Woke::Rescheduled(id, due);
            }
            let left = wake_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.busy = true;
                return Woke::Timer;
            }
            state = sync::wait_timeout(&self.poke, state, left);
        }
    }
}

/// Free renewal threads.
struct Parked {
    /// The process the threads belong to; a forked child has none of them.
    process: Process,
    next_job: u64,
    idle: Vec<Arc<Worker>>,
}

impl Parked {
    /// Makes the list `process`'s: the threads of another one (the parent of a forked
    /// child) are forgotten.
    fn belong_to(&mut self, process: Process) {
        if self.process != process {
            self.idle.clear();
            self.process = process;
        }
    }
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    process: Process::NONE,
    next_job: 0,
    idle: Vec::new(),
});

/// The parked threads, locked; forgotten in a child forked with the fork handlers. (A
/// child made by `_Fork()` is told apart only by its pid, which [`Renewal::start`] checks
/// before it hands a thread work.)
fn parked() -> MutexGuard<'static, Parked> {
    static HELD_ACROSS_FORK: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    process::hold_across_fork_once(&HELD_ACROSS_FORK, hold_for_fork);
    let mut p = sync::lock(&PARKED);
    if !p.process.same_generation() {
        p.belong_to(Process::current());
    }
    p
}

/// The parked threads' lock, held across `fork()` (see [`crate::process`]).
fn hold_for_fork() -> Vec<Box<dyn std::any::Any>> {
    #[cfg(not(feature = "shuttle"))]
    {
        vec![Box::new(sync::lock(&PARKED))]
    }
    #[cfg(feature = "shuttle")]
    {
        Vec::new()
    }
}

/// Frees `worker` from `job` (once: later calls for the same job do nothing), and parks it
/// unless it is busy (then it parks itself when done).
fn free(worker: &Arc<Worker>, job: u64) {
    let mut p = parked();
    let mut assigned = worker.assigned();
    if *assigned != job || worker.process != p.process {
        return;
    }
    *assigned = 0;
    if !worker.state().busy && p.idle.len() < MAX_IDLE {
        p.idle.push(worker.clone());
    }
}

/// Puts a free worker among the parked ones, if it is not there yet.
fn park(worker: &Arc<Worker>) {
    let mut p = parked();
    let free = *worker.assigned() == 0;
    if free && p.idle.len() < MAX_IDLE && !p.idle.iter().any(|w| Arc::ptr_eq(w, worker)) {
        p.idle.push(worker.clone());
    }
}

impl Renewal {
    /// Gives `lease` a renewal thread: a parked one, or a new one.
    ///
    /// Errors: [`ErrorKind::Internal`] when the OS refuses a new thread.
    pub fn start(lease: Arc<Lease>) -> Result<Renewal> {
        if process::orphaned() {
            return Err(process::orphaned_error());
        }
        let due = on_grid(lease.next_renewal(), coalescing(lease.ttl()));
        let me = Process::current();
        let (worker, id) = {
            let mut p = parked();
            p.belong_to(me);
            p.next_job += 1;
            let id = p.next_job;
            // Prefer a thread that wakes up on its own in time.
            let pick = p
                .idle
                .iter()
                .position(|w| w.state().wake_at <= due)
                .or_else(|| p.idle.len().checked_sub(1));
            let worker = pick.map(|i| p.idle.swap_remove(i));
            if let Some(w) = &worker {
                *w.assigned() = id;
            }
            (worker, id)
        };
        let job = Job {
            id,
            lease: Arc::downgrade(&lease),
            due,
        };
        let worker = match worker {
            Some(worker) => {
                worker.hand_over(job);
                worker
            }
            None => spawn(job, me)?,
        };
        Ok(Renewal {
            lease,
            worker,
            job: id,
        })
    }

    /// Stops renewing: when this returns, no renewal of the lock is in flight and none will
    /// be sent. Waits only for a renewal in flight (bounded by the lease's validity); safe
    /// to call from the renewal thread itself (a lost-lock callback that releases).
    pub fn stop(self) {
        self.lease.close_gate();
        free(&self.worker, self.job);
    }

    /// The lease was extended: the next renewal is due a third of the way into it.
    pub fn reschedule(&self) {
        if *self.worker.assigned() == self.job {
            self.worker.reschedule(self.job, self.lease.next_renewal());
        }
    }
}

/// Starts a renewal thread of `process` (the caller's) for `job`.
fn spawn(job: Job, process: Process) -> Result<Arc<Worker>> {
    let id = job.id;
    let worker = Arc::new(Worker {
        assigned: Mutex::new(id),
        state: Mutex::new(WorkerState {
            mailbox: Some(job),
            rescheduled: None,
            wake_at: Instant::now(),
            busy: true,
        }),
        poke: Condvar::new(),
        process,
    });
    let me = worker.clone();
    process::spawn_without_signals(|| {
        thread::Builder::new()
            .name("redlease-renew".into())
            .stack_size(128 * 1024)
            .spawn(move || work(&me))
    })
    .map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!(
                "cannot start a renewal thread (each renewed lock has one; see the \
                     process's thread limits: ulimit -u, /proc/sys/kernel/threads-max): {e}"
            ),
        )
    })?;
    Ok(worker)
}

/// A renewal thread: renews one lock at a time, parking in between.
fn work(me: &Arc<Worker>) {
    let mut current: Option<Job> = None;
    let mut idle_since = Instant::now();
    let mut slack = Duration::ZERO;
    loop {
        if process::orphaned() || !me.process.same_generation() {
            // This thread forked (in a callback, or in the drop of one), and goes on in
            // the child: the locks it renews are the parent's.
            return;
        }
        if current.is_none() {
            park(me);
        }
        let wake_at = match &current {
            Some(job) => job.due,
            None => idle_since + IDLE_TIMEOUT,
        };
        match me.sleep_until(wake_at) {
            Woke::Job(job) => {
                current = Some(job);
                continue;
            }
            Woke::Rescheduled(id, due) => {
                if let Some(job) = current.as_mut().filter(|job| job.id == id) {
                    job.due = due;
                }
                continue;
            }
            Woke::Timer => {}
        }
        match current.take() {
            Some(mut job) => {
                let lease = job.lease.upgrade().filter(|lease| !lease.gate_closed());
                let Some(lease) = lease else {
                    // Released (and perhaps dropped) meanwhile.
                    idle_since = Instant::now();
                    continue;
                };
                // A bug must not leave a dead thread among the parked ones: a panic ends
                // this lock's renewal (reported as lost) and the thread goes on.
                let job_id = job.id;
                let wanted = coalescing(lease.ttl());
                if wanted != slack {
                    set_timer_slack(wanted);
                    slack = wanted;
                }
                let renewed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    renew(&lease, me, job_id)
                }))
                .unwrap_or_else(|_| {
                    log::error!("renewing lock {:?} panicked", lease.keys.lock);
                    lease.mark_lost(LostReason::Unreachable);
                    None
                });
                drop(lease);
                match renewed {
                    Some(next) => {
                        job.due = next;
                        current = Some(job);
                    }
                    None => {
                        free(me, job.id);
                        idle_since = Instant::now();
                    }
                }
            }
            None => {
                let mut p = parked();
                if *me.assigned() == 0 {
                    p.idle.retain(|w| !Arc::ptr_eq(w, me));
                    return;
                }
                // Just taken for a new lock: its job is being handed over.
                idle_since = Instant::now();
            }
        }
    }
}

/// Extra time a renewal thread gives a batched renewal before it looks at the outcome:
/// the batch's write happens a little after the hand-over.
const BATCH_SLACK: Duration = Duration::from_millis(2);
/// How long a batched renewal may wait in its batcher's queue (normally a few
/// milliseconds) before its thread takes it back and renews on its own.
const QUEUE_PATIENCE: Duration = Duration::from_millis(10);

/// Lets the kernel fire this thread's timers up to `slack` late, so that it can serve
/// several with one interrupt (`PR_SET_TIMERSLACK`).
fn set_timer_slack(slack: Duration) {
    let ns = slack.as_nanos().max(1) as libc::c_ulong;
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes a value and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
    if rc != 0 {
        log::debug!(
            "PR_SET_TIMERSLACK refused: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// `at`, rounded up to a multiple of `grid` (counted from a fixed moment of the process),
/// so that the renewals of many locks fall on the same instants and share a batch.
fn on_grid(at: Instant, grid: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let grid_ns = grid.as_nanos().max(1);
    let since = at.saturating_duration_since(epoch).as_nanos();
    let rounded = since.div_ceil(grid_ns) * grid_ns;
    epoch + Duration::from_nanos(rounded.min(u64::MAX as u128) as u64)
}

/// One renewal of `lease`: the time of the next one, or `None` when the renewal is over
/// (the lock was lost or released).
///
/// Normally the extend is handed to the node's batching thread, which pipelines it with
/// the renewals of other locks due at about the same moment and applies the reply to the
/// lease; this thread then sleeps until the next renewal is due, and is woken early only if
/// that one failed or found the lock lost. After a batched failure the next attempt goes
/// on its own (following redirections), cut at the lease's deadline.
fn renew(lease: &Arc<Lease>, me: &Arc<Worker>, job: u64) -> Option<Instant> {
    if lease.lost().is_some() {
        // Found lost by a batched renewal: tell the holder, from this thread.
        lease.notify_lost();
        return None;
    }
    let deadline = lease.deadline();
    let now = Instant::now();
    if now >= deadline {
        // A renewal still queued behind a slow batch must not hold up the loss.
        lease.withdraw_queued_renewal(Duration::ZERO);
        if lease.lose_if_expired() || lease.gate_closing() {
            return None;
        }
        // An extend in flight moved the deadline on.
        return Some(lease.next_renewal().max(Instant::now()));
    }
    if lease.can_batch() && !lease.take_batch_failed() {
        match lease.try_gate_owned() {
            // An extend (or the previous renewal) is in flight: look again shortly, unless
            // the previous renewal still waits behind a slow batch: then it goes on its own.
            Err(()) => {
                if !lease.withdraw_queued_renewal(QUEUE_PATIENCE) {
                    return Some((now + GATE_RETRY).min(deadline));
                }
            }
            Ok(None) => return None,
            Ok(Some(ticket)) => {
                let ttl = lease.ttl();
                if let Some(due) = lease.renewal_wait(now) {
                    return Some(on_grid(due, coalescing(ttl)));
                }
                let worker = me.clone();
                let poke = move || worker.reschedule(job, Instant::now());
                match lease.submit_renewal(ticket, poke) {
                    Ok(()) => {
                        let next = on_grid(now + ttl / 3 + BATCH_SLACK, coalescing(ttl));
                        return Some(next.min(deadline));
                    }
                    Err(e) => log::debug!("renewal of {:?} not batched: {e}", lease.keys.lock),
                }
            }
        }
    }
    let mut ttl = lease.ttl();
    let renewed = {
        let _gate = lease.gate()?;
        if lease.lost().is_some() {
            return None;
        }
        // Before the gate was ours an extend may have moved the lease on.
        match lease.renewal_step(Instant::now()) {
            RenewalStep::Wait(due) => return Some(on_grid(due, coalescing(ttl))),
            RenewalStep::Renew {
                ttl: renewal_ttl,
                cutoff,
            } => {
                ttl = renewal_ttl;
                lease.extend_gated(ttl, Lane::Renewal, Some(cutoff))
            }
            // Declared lost without a request (a loss is final).
            RenewalStep::Expired => lease.extend_gated(ttl, Lane::Renewal, Some(deadline)),
        }
    };
    match renewed {
        Ok(Extended::Yes) => Some(on_grid(lease.next_renewal(), coalescing(ttl))),
        Ok(Extended::Lost(_)) => {
            lease.notify_lost();
            None
        }
        Err(e) => {
            // The deadline may have been lowered (an extend of unknown outcome).
            let deadline = lease.deadline();
            let now = Instant::now();
            if now >= deadline {
                log::warn!("renewing lock {:?} failed: {e}", lease.keys.lock);
                if lease.lose_if_expired() || lease.gate_closing() {
                    return None;
                }
                return Some(lease.next_renewal().max(Instant::now()));
            }
            log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
            Some(lease.retry_at(now, ttl))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal is never moved earlier by the grid, and later by less than one step: with
    /// the timer slack of the same size, a renewal goes out at most about two steps (30 ms
    /// at most) after a third of the lease, besides batching and scheduling.
    #[test]
    fn the_grid_moves_a_renewal_later_by_less_than_one_step() {
        let grid = coalescing(Duration::from_secs(1));
        assert_eq!(grid, Duration::from_millis(15));
        let base = Instant::now();
        for us in (0..40_000u64).step_by(977) {
            let at = base + Duration::from_micros(us);
            let moved = on_grid(at, grid);
            assert!(
                moved >= at && moved - at < grid,
                "{us} µs: {:?}",
                moved - at
            );
            assert_eq!(on_grid(moved, grid), moved);
        }
    }
}
