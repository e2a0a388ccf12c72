//! What a lease keeps for its batched renewals (see [`crate::backend::batch`]): the packed
//! extend it sends each time, the renewal it queued last (to take back while it is
//! unsent), and whether the last batched renewal failed.

use std::time::{Duration, Instant};

use crate::backend::call::Call;
use crate::error::Result;
use crate::protocol::Queued;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{self, Mutex};

/// The shortest lease whose renewals are batched: a batch waits a few milliseconds to
/// gather renewals, a few percent of this.
pub(crate) const BATCH_MIN_TTL: Duration = Duration::from_millis(200);

#[derive(Default)]
pub(crate) struct Batching {
    /// The packed extend for a ttl, kept so that a renewal does not format its arguments
    /// again each time.
    packed: Mutex<Option<(Duration, Call)>>,
    /// The renewal queued last, and when.
    queued: Mutex<Option<(Queued, Instant)>>,
    /// The last batched renewal failed: the next one goes on its own.
    failed: AtomicBool,
}

impl Batching {
    /// The extend call for `ttl`, packed by `make` the first time.
    pub fn extend_call(&self, ttl: Duration, make: impl FnOnce() -> Result<Call>) -> Result<Call> {
        let mut packed = sync::lock(&self.packed);
        match packed.as_ref() {
            Some((cached, call)) if *cached == ttl => Ok(call.clone()),
            _ => {
                let call = make()?;
                *packed = Some((ttl, call.clone()));
                Ok(call)
            }
        }
    }

    /// Remembers the renewal just queued, at `at`.
    pub fn queued(&self, queued: Queued, at: Instant) {
        *sync::lock(&self.queued) = Some((queued, at));
    }

    /// Takes back the renewal queued last if it has waited for at least `patience` by
    /// `now` and is still unsent (a batch held up by a slow reply keeps everything queued
    /// behind it). Its completion is dropped without running, which gives the lease's gate
    /// back: nothing was sent, so nothing failed. `true` when one was taken back.
    pub fn take_back(&self, patience: Duration, now: Instant) -> bool {
        let queued = {
            let mut queued = sync::lock(&self.queued);
            match queued.as_ref() {
                Some((_, at)) if now.saturating_duration_since(*at) >= patience => queued.take(),
                _ => None,
            }
        };
        let Some((queued, _)) = queued else {
            return false;
        };
        let item = queued.batcher.upgrade().and_then(|b| b.withdraw(queued.id));
        // Dropped here, outside every lock: its completion holds the gate.
        item.is_some()
    }

    /// Records that the last batched renewal failed.
    pub fn set_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Whether the last batched renewal failed (the next one then goes on its own,
    /// following redirections); clears it.
    pub fn take_failed(&self) -> bool {
        self.failed.swap(false, Ordering::SeqCst)
    }
}
