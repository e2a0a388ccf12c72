//! The renewal thread (watchdog) of each held lock.
//!
//! Every renewed lock has a thread of its own for as long as it is held. The thread renews
//! every ttl/3 with the token-checked script and waits between renewals on a
//! `crossbeam_channel` receive with a timeout, so that a release stops it at once. A
//! renewal that finds the token gone, or that cannot reach Redis before the lease's local
//! deadline, marks the lock lost and ends the renewal: no renewal is sent after that.
//!
//! No renewal after a release: each renewal is sent while holding the lease's renewal gate,
//! and [`Renewal::stop`] closes that gate (waiting for a renewal in flight) before the
//! release is sent. The thread itself is not joined: once it sees the stop it parks, ready
//! to serve the next lock, so acquiring a lock does not cost a thread spawn. Parked threads
//! exit after [`IDLE_TIMEOUT`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

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
    stop: Sender<()>,
}

/// A lock for a renewal thread to renew until `stopped` fires or disconnects.
struct Job {
    lease: Arc<Lease>,
    stopped: Receiver<()>,
}

impl Renewal {
    /// Gives `lease` a renewal thread: a parked one, or a new one.
    ///
    /// Errors: [`ErrorKind::Internal`] when the OS refuses a new thread.
    pub fn start(lease: Arc<Lease>) -> Result<Renewal> {
        let (stop, stopped) = crossbeam_channel::bounded(0);
        dispatch(Job {
            lease: lease.clone(),
            stopped,
        })?;
        Ok(Renewal { lease, stop })
    }

    /// Stops renewing: when this returns, no renewal of the lock is in flight and none will
    /// be sent. Waits only for a renewal in flight (bounded by the lease's validity); safe
    /// to call from the renewal thread itself (a lost-lock callback that releases).
    pub fn stop(self) {
        self.lease.close_renewal_gate();
        drop(self.stop);
    }
}

fn run(lease: &Lease, stopped: &Receiver<()>) {
    let mut pause = lease.ttl() / 3;
    loop {
        match stopped.recv_timeout(pause) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let deadline = lease.deadline();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            lease.mark_lost(LostReason::Unreachable);
            return;
        }
        let ttl = lease.ttl();
        let renewed = {
            let Some(_gate) = lease.renewal_gate() else {
                return; // released meanwhile
            };
            if lease.lost().is_some() {
                return;
            }
            lease.extend_on(&lease.client.renewal_pool, ttl, left)
        };
        match renewed {
            Ok(true) => pause = ttl / 3,
            Ok(false) => {
                lease.mark_lost(LostReason::NotHeld);
                return;
            }
            Err(e) => {
                log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
                let left = deadline.saturating_duration_since(Instant::now());
                pause = (ttl / 10).max(MIN_RETRY).min(left);
            }
        }
    }
}

/// Parked renewal threads, each waiting on its own channel for a job.
struct Parked {
    /// The process the threads belong to; after `fork()` the child has none of them.
    process: u64,
    next_id: u64,
    idle: Vec<(u64, Sender<Job>)>,
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    process: 0,
    next_id: 0,
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

fn dispatch(mut job: Job) -> Result<()> {
    loop {
        let Some((_, worker)) = parked().idle.pop() else {
            break;
        };
        match worker.send(job) {
            Ok(()) => return Ok(()),
            Err(crossbeam_channel::SendError(returned)) => job = returned,
        }
    }
    let id = {
        let mut p = parked();
        p.next_id += 1;
        p.next_id
    };
    let (worker, jobs) = crossbeam_channel::bounded(1);
    let _ = worker.send(job);
    std::thread::Builder::new()
        .name("redlease-renew".into())
        .stack_size(128 * 1024)
        .spawn(move || work(id, worker, &jobs))
        .map(drop)
        .map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("cannot start a renewal thread: {e}"),
            )
        })
}

/// A renewal thread: renews one lock at a time, parking in between.
fn work(id: u64, me: Sender<Job>, jobs: &Receiver<Job>) {
    loop {
        let job = match jobs.recv_timeout(IDLE_TIMEOUT) {
            Ok(job) => job,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let mut p = parked();
                match p.idle.iter().position(|(i, _)| *i == id) {
                    Some(at) => {
                        p.idle.swap_remove(at);
                        return;
                    }
                    // Taken off the list a moment ago: its job is on the way.
                    None => {
                        drop(p);
                        match jobs.recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        }
                    }
                }
            }
        };
        run(&job.lease, &job.stopped);
        drop(job);
        let mut p = parked();
        if p.idle.len() >= MAX_IDLE || p.process != process::generation() {
            return;
        }
        p.idle.push((id, me.clone()));
    }
}
