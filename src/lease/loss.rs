//! Telling a holder its lock was lost: the lost-lock callbacks of its holds and the
//! channels that subscribed, each told once.
//!
//! The state lives beside the lease's clock, under the lease's one lock (so a subscriber
//! never misses a loss declared while it subscribes); the callbacks run outside it.

use crossbeam_channel::{Receiver, Sender};

use crate::core::lease::LostReason;
use crate::sync::Arc;

/// A function told once when a lock is lost; runs on the renewal thread (or on the thread
/// whose `extend` found the lock gone), so it must not block for long. A panic in it is
/// caught and logged.
pub type LostCallback = Arc<dyn Fn(LostReason) + Send + Sync>;

/// Who is told of a loss, and whether they were.
#[derive(Default)]
pub(crate) struct Loss {
    /// The holder was told (callbacks and subscribers run once).
    notified: bool,
    subscribers: Vec<Sender<LostReason>>,
    /// The lost-lock callbacks, each with the token of its hold: the acquire's, and those
    /// of the later holds of a reentrant lock that share the lease. A hold's release takes
    /// its own out.
    callbacks: Vec<(String, LostCallback)>,
}

impl Loss {
    /// Told of a loss: the callback of the hold `hold`, if any.
    pub fn new(on_lost: Option<(String, LostCallback)>) -> Self {
        Loss {
            callbacks: on_lost.into_iter().collect(),
            ..Loss::default()
        }
    }

    /// A receiver for `lost` (the reason, when the lock is already lost) or a later loss;
    /// disconnected at once when `released`.
    pub fn subscribe(&mut self, lost: Option<LostReason>, released: bool) -> Receiver<LostReason> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        match lost {
            Some(reason) => {
                let _ = tx.try_send(reason);
            }
            None if !released => self.subscribers.push(tx),
            None => {}
        }
        rx
    }

    /// The lock was released: nobody waits for a loss any more.
    pub fn released(&mut self) {
        self.subscribers.clear();
    }

    /// Starts telling of `lost`: `None` when there is nothing to tell (not lost, or told
    /// already); otherwise the subscribers to tell, and whether anyone listens at all.
    pub fn start_telling(
        &mut self,
        lost: Option<LostReason>,
    ) -> Option<(LostReason, Vec<Sender<LostReason>>, bool)> {
        let reason = lost.filter(|_| !self.notified)?;
        self.notified = true;
        let listened = !self.subscribers.is_empty() || !self.callbacks.is_empty();
        Some((reason, std::mem::take(&mut self.subscribers), listened))
    }

    /// The next callback to run for a loss being told (taken out: each runs once).
    pub fn next_callback(&mut self) -> Option<(String, LostCallback)> {
        (!self.callbacks.is_empty()).then(|| self.callbacks.remove(0))
    }

    /// Adds the callback of the hold `hold`; returns it with the reason instead when the
    /// holder was already told of a loss (the caller runs it at once).
    pub fn add(
        &mut self,
        lost: Option<LostReason>,
        hold: &str,
        callback: LostCallback,
    ) -> Option<(LostReason, LostCallback)> {
        match lost {
            Some(reason) if self.notified => Some((reason, callback)),
            _ => {
                self.callbacks.push((hold.to_owned(), callback));
                None
            }
        }
    }

    /// Takes out the callbacks of the hold `hold` (to be dropped outside the lock).
    pub fn forget(&mut self, hold: &str) -> Vec<(String, LostCallback)> {
        let (gone, kept) = std::mem::take(&mut self.callbacks)
            .into_iter()
            .partition(|(h, _)| h == hold);
        self.callbacks = kept;
        gone
    }
}
