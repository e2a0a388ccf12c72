//! The renewal thread (watchdog) of one held lock.
//!
//! It renews every ttl/3 with the token-checked script, waiting between renewals on a
//! `crossbeam_channel` receive with a timeout so that a release stops it at once. A renewal
//! that finds the token gone, or that cannot reach Redis before the lease's local deadline,
//! marks the lock lost and ends the thread: no renewal is sent after that.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::{Error, ErrorKind, Result};
use crate::lease::{Lease, LostReason};

/// Shortest pause between two renewal attempts after a failed one.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// A running renewal thread; stop it with [`Renewal::stop`].
pub(crate) struct Renewal {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Renewal {
    /// Starts the renewal thread of `lease`.
    ///
    /// Errors: [`ErrorKind::Internal`] when the OS refuses a new thread.
    pub fn start(lease: Arc<Lease>) -> Result<Renewal> {
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let thread = std::thread::Builder::new()
            .name("redlease-renew".into())
            .stack_size(128 * 1024)
            .spawn(move || run(&lease, &stopped))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("cannot start a renewal thread: {e}"),
                )
            })?;
        Ok(Renewal { stop, thread })
    }

    /// Stops the thread and waits until it has ended, so that no renewal runs afterwards.
    /// Returns at once if the thread is between renewals; otherwise after the renewal in
    /// flight, which is bounded by the lease's remaining validity.
    ///
    /// Called from the renewal thread itself (a lost-lock callback that releases the lock),
    /// it only signals: the thread ends when the callback returns.
    pub fn stop(self) {
        drop(self.stop);
        if self.thread.thread().id() == std::thread::current().id() {
            return;
        }
        if self.thread.join().is_err() {
            log::error!("a renewal thread panicked");
        }
    }

    /// For a forked child: the thread does not exist in this process, so it cannot be
    /// joined; forget it without touching the parent's lock.
    pub fn abandon(self) {
        std::mem::forget(self.thread);
    }
}

fn run(lease: &Lease, stopped: &Receiver<()>) {
    let mut pause = lease.ttl() / 3;
    loop {
        match stopped.recv_timeout(pause) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if lease.lost().is_some() {
            return;
        }
        let deadline = lease.deadline();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            lease.mark_lost(LostReason::Unreachable);
            return;
        }
        let ttl = lease.ttl();
        let pool = &lease.client.renewal_pool;
        match lease.extend_on(pool, ttl, left) {
            Ok(true) => pause = ttl / 3,
            Ok(false) => return,
            Err(e) => {
                log::warn!("renewing lock {:?} failed, retrying: {e}", lease.keys.lock);
                let left = deadline.saturating_duration_since(Instant::now());
                pause = (ttl / 10).max(MIN_RETRY).min(left);
            }
        }
    }
}
