//! The renewal thread (watchdog) of each held lock.
//!
//! Every renewed lock has a thread of its own for as long as it is held. The thread renews
//! every ttl/3 with the token-checked script, sleeping in between on a condition variable
//! with a deadline. (Not a `crossbeam_channel` receive: it spins and yields a few times
//! before blocking, which `perf` showed to be a tenth of the renewal CPU with 1000 locks.)
//! A renewal that finds the token gone, or that cannot reach Redis before the lease's local
//! deadline, marks the lock lost and ends the renewal: no renewal is sent after that.
//!
//! No renewal after a release: each renewal is sent while holding the lease's renewal gate,
//! and [`Renewal::stop`] closes that gate (waiting for a renewal in flight) before the
//! release is sent. From then on the thread is free. It is not joined: it parks, ready to
//! renew the next lock, so acquiring a lock costs no thread spawn. A parked thread whose own
//! wake-up comes before the next lock's first renewal gets that lock without even being
//! woken. Parked threads exit after [`IDLE_TIMEOUT`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::lease::{Lease, LostReason};
use crate::process;

/// Shortest pause between two renewal attempts after a failed one.
const MIN_RETRY: Duration = Duration::from_millis(10);
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

/// A lock for a renewal thread, and when it is first due.
struct Job {
    id: u64,
    lease: Arc<Lease>,
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
    process: u64,
}

struct WorkerState {
    mailbox: Option<Job>,
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
    /// Its own deadline passed.
    Timer,
}

impl Worker {
    fn state(&self) -> MutexGuard<'_, WorkerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn assigned(&self) -> MutexGuard<'_, u64> {
        self.assigned.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Sleeps until `wake_at` or a handed-over job.
    fn sleep_until(&self, wake_at: Instant) -> Woke {
        let mut state = self.state();
        state.wake_at = wake_at;
        state.busy = false;
        loop {
            if let Some(job) = state.mailbox.take() {
                state.busy = true;
                return Woke::Job(job);
            }
            let left = wake_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.busy = true;
                return Woke::Timer;
            }
            state = self
                .poke
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Free renewal threads.
struct Parked {
    /// The process the threads belong to; after `fork()` the child has none of them.
    process: u64,
    next_job: u64,
    idle: Vec<Arc<Worker>>,
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    process: 0,
    next_job: 0,
    idle: Vec::new(),
});

fn parked() -> MutexGuard<'static, Parked> {
    let mut p = PARKED.lock().unwrap_or_else(|e| e.into_inner());
    let current = process::generation();
    if p.process != current {
        p.idle.clear();
        p.process = current;
    }
    p
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
        let due = Instant::now() + lease.ttl() / 3;
        let (worker, id) = {
            let mut p = parked();
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
            lease: lease.clone(),
            due,
        };
        let worker = match worker {
            Some(worker) => {
                worker.hand_over(job);
                worker
            }
            None => spawn(job)?,
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
        self.lease.close_renewal_gate();
        free(&self.worker, self.job);
    }
}

fn spawn(job: Job) -> Result<Arc<Worker>> {
    let id = job.id;
    let worker = Arc::new(Worker {
        assigned: Mutex::new(id),
        state: Mutex::new(WorkerState {
            mailbox: Some(job),
            wake_at: Instant::now(),
            busy: true,
        }),
        poke: Condvar::new(),
        process: process::generation(),
    });
    let me = worker.clone();
    std::thread::Builder::new()
        .name("redlease-renew".into())
        .stack_size(128 * 1024)
        .spawn(move || work(&me))
        .map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("cannot start a renewal thread: {e}"),
            )
        })?;
    Ok(worker)
}

/// A renewal thread: renews one lock at a time, parking in between.
fn work(me: &Arc<Worker>) {
    let mut current: Option<Job> = None;
    let mut idle_since = Instant::now();
    loop {
        if current.is_none() {
            park(me);
        }
        let wake_at = match &current {
            Some(job) => job.due,
            None => idle_since + IDLE_TIMEOUT,
        };
        if let Woke::Job(job) = me.sleep_until(wake_at) {
            current = Some(job);
            continue;
        }
        match current.take() {
            Some(job) if job.lease.renewal_gate().is_none() => idle_since = Instant::now(),
            Some(mut job) => {
                // A bug must not leave a dead thread among the parked ones: a panic ends
                // this lock's renewal (reported as lost) and the thread goes on.
                let renewed =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| renew(&job.lease)))
                        .unwrap_or_else(|_| {
                            log::error!("renewing lock {:?} panicked", job.lease.keys.lock);
                            job.lease.mark_lost(LostReason::Unreachable);
                            None
                        });
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

/// One renewal of `lease`: the time of the next one, or `None` when the renewal is over
/// (the lock was lost or released).
fn renew(lease: &Lease) -> Option<Instant> {
    let deadline = lease.deadline();
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        lease.mark_lost(LostReason::Unreachable);
        return None;
    }
    let ttl = lease.ttl();
    let renewed = {
        let _gate = lease.renewal_gate()?;
        if lease.lost().is_some() {
            return None;
        }
        lease.extend_on(&lease.client.renewal_pool, ttl, left, Some(left))
    };
    match renewed {
        Ok(true) => Some(Instant::now() + ttl / 3),
        Ok(false) => {
            lease.mark_lost(LostReason::NotHeld);
            None
        }
        Err(e) => {
            log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
            let left = deadline.saturating_duration_since(Instant::now());
            Some(Instant::now() + (ttl / 10).max(MIN_RETRY).min(left))
        }
    }
}
