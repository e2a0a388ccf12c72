//! The lease of a held lock: its token, its local deadline, and whether it was lost.
//!
//! Shared (behind an `Arc`) by the guard and the lock's renewal thread.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::client::ClientInner;
use crate::connections::Pool;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::process;
use crate::scripts;
use crate::token;

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
    pub client: Arc<ClientInner>,
    pub keys: LockKeys,
    pub token: String,
    pub fencing_token: u64,
    /// The process that acquired the lock; after `fork()` the child must not touch it.
    process: u64,
    on_lost: Option<LostCallback>,
    state: Mutex<LeaseState>,
    /// Held while a renewal is sent; `true` once closed by a release (see
    /// [`crate::renewal`]).
    renewal_gate: Mutex<bool>,
}

struct LeaseState {
    ttl: Duration,
    /// Monotonic time by which the lease has surely ended on the server.
    deadline: Instant,
    lost: Option<LostReason>,
    released: bool,
    subscribers: Vec<Sender<LostReason>>,
}

/// Safety margin subtracted from a lease for clock drift and the request's flight time
/// (the Redlock paper's 1 % plus 2 ms).
pub(crate) fn local_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - (ttl / 100 + Duration::from_millis(2)).min(ttl)
}

impl Lease {
    pub fn new(
        client: Arc<ClientInner>,
        keys: LockKeys,
        token: String,
        fencing_token: u64,
        ttl: Duration,
        sent_at: Instant,
        on_lost: Option<LostCallback>,
    ) -> Self {
        Lease {
            client,
            keys,
            token,
            fencing_token,
            process: process::generation(),
            on_lost,
            state: Mutex::new(LeaseState {
                ttl,
                deadline: local_deadline(sent_at, ttl),
                lost: None,
                released: false,
                subscribers: Vec::new(),
            }),
            renewal_gate: Mutex::new(false),
        }
    }

    /// The renewal gate, held while a renewal is sent; `None` once closed.
    pub fn renewal_gate(&self) -> Option<MutexGuard<'_, bool>> {
        let gate = self.renewal_gate.lock().unwrap_or_else(|p| p.into_inner());
        (!*gate).then_some(gate)
    }

    /// Closes the renewal gate, waiting for a renewal in flight: none is sent afterwards.
    pub fn close_renewal_gate(&self) {
        *self.renewal_gate.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ttl(&self) -> Duration {
        self.state().ttl
    }

    pub fn deadline(&self) -> Instant {
        self.state().deadline
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

    /// Records the loss once: runs the callback, then tells every subscriber.
    pub fn mark_lost(&self, reason: LostReason) {
        let subscribers = {
            let mut s = self.state();
            if s.lost.is_some() || s.released {
                return;
            }
            s.lost = Some(reason);
            std::mem::take(&mut s.subscribers)
        };
        log::warn!("lock {:?} lost: {reason}", self.keys.lock);
        if let Some(callback) = &self.on_lost {
            // A panicking callback must not take the renewal thread (reused for other
            // locks) down with it.
            let call = std::panic::AssertUnwindSafe(|| callback(reason));
            if std::panic::catch_unwind(call).is_err() {
                log::error!("the lost-lock callback of {:?} panicked", self.keys.lock);
            }
        }
        for tx in subscribers {
            let _ = tx.try_send(reason);
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

    /// Sends the token-checked extend through `pool`, waiting up to `checkout` for a
    /// connection and up to `io` (or the I/O timeout) for the reply. On success the ttl and
    /// local deadline are updated; `Ok(false)` means the key no longer held the token (the
    /// caller records the loss, outside any lock it holds).
    pub fn extend_on(
        &self,
        pool: &Pool,
        ttl: Duration,
        checkout: Duration,
        io: Option<Duration>,
    ) -> Result<bool> {
        let ttl_ms = ttl_millis(ttl)?;
        let sent_at = Instant::now();
        let extended: i64 = pool.run(checkout, io, |c| {
            scripts::EXTEND
                .key(&self.keys.lock)
                .arg(&self.token)
                .arg(ttl_ms)
                .invoke(c)
        })?;
        if extended == 1 {
            let mut s = self.state();
            s.ttl = ttl;
            s.deadline = local_deadline(sent_at, ttl);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Sends the token-checked release (which hands the lock to a waiter if there is one).
    /// `Ok(false)`: the key no longer held the token.
    pub fn release_on_server(&self) -> Result<bool> {
        let client = &self.client;
        let handoff_token = token::new_token("handoff");
        let ttl_ms = self.ttl().as_millis() as u64;
        let released: i64 = client.pool.run(client.options.pool_wait, None, |c| {
            scripts::RELEASE
                .key(&self.keys.lock)
                .key(&self.keys.fence)
                .key(&self.keys.wake)
                .key(&self.keys.waiters)
                .arg(&self.token)
                .arg(&handoff_token)
                .arg(ttl_ms)
                .arg(scripts::FENCE_TTL_MS)
                .invoke(c)
        })?;
        Ok(released != 0)
    }
}

/// The largest ttl accepted (about 34 years); also keeps deadlines far from overflow.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// Validates a ttl and converts it to whole milliseconds.
///
/// Errors: [`ErrorKind::InvalidArgument`] for less than 1 ms (a ttl of 0 would make
/// `PEXPIRE` delete the key) or more than [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::invalid(format!(
            "the ttl must be at least 1 ms, got {ttl:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "the ttl of {ttl:?} is over the maximum of {MAX_TTL:?}"
        )));
    }
    Ok(ttl.as_millis() as u64)
}
