//! All or none: one lock over several names ([`crate::Client::lock_all`]).
//!
//! The names are taken one by one, each with the ordinary protocol of a lock (its own
//! token, lease, renewal and fencing token), in one global order: the order of their keys.
//! Two callers wanting overlapping sets therefore never wait for each other in a circle: the
//! one that holds the first name they share goes first. When a name cannot be taken (busy
//! after the wait, cancelled, an error), every name already taken is given back, so a
//! failure holds nothing. A loss of any name is a loss of the whole lock.
//!
//! Names that hash to one Cluster slot are still taken one by one: an all-in-one script
//! for them is not written yet.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::cancel::CancelToken;
use crate::core::lease::LostReason;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::lock::{LockBuilder, LockGuard};
use crate::shared::Shared;
use crate::sync::{Arc, Mutex};

/// The most names one [`crate::Client::lock_all`] takes.
pub const MAX_NAMES: usize = 1024;

/// Called with the name first lost and why.
type MultiLostCallback = Arc<dyn Fn(&str, LostReason) + Send + Sync>;

/// Describes a lock over several names; made by [`crate::Client::lock_all`].
#[must_use = "a MultiLockBuilder does nothing until one of its acquire methods is called"]
pub struct MultiLockBuilder<'a> {
    shared: &'a Shared,
    names: Vec<String>,
    ttl: Option<Duration>,
    renew: bool,
    cancel: Option<CancelToken>,
    on_lost: Option<MultiLostCallback>,
}

impl<'a> MultiLockBuilder<'a> {
    pub(crate) fn new(shared: &'a Shared, names: &[&str]) -> Self {
        MultiLockBuilder {
            shared,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            ttl: None,
            renew: true,
            cancel: None,
            on_lost: None,
        }
    }

    /// The lease of every name (default [`crate::DEFAULT_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Whether every name is renewed while held (default true).
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Lets `token` end a waiting acquire ([`ErrorKind::Cancelled`], nothing held).
    pub fn cancel_token(mut self, token: &CancelToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    /// Called once, on a renewal thread, when the first of the names is lost (with that
    /// name): the whole lock is lost then.
    pub fn on_lost(mut self, callback: impl Fn(&str, LostReason) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    /// Tries each name once. Errors as [`crate::LockBuilder::try_acquire`], for the first
    /// name that could not be taken (the others given back); [`ErrorKind::InvalidArgument`]
    /// for no names, more than [`MAX_NAMES`], a name given twice or a bad name, before
    /// anything is sent.
    pub fn try_acquire(self) -> Result<MultiGuard> {
        self.acquire_until(Some(Instant::now()), false)
    }

    /// Waits up to `wait` in all (a zero `wait` tries once). Returns within `wait` plus one
    /// request's bounds per name still to take.
    pub fn acquire_timeout(self, wait: Duration) -> Result<MultiGuard> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid(format!("a wait of {wait:?} overflows the clock")))?;
        self.acquire_until(Some(deadline), true)
    }

    /// Waits as long as it takes.
    pub fn acquire(self) -> Result<MultiGuard> {
        self.acquire_until(None, true)
    }

    fn acquire_until(self, deadline: Option<Instant>, waits: bool) -> Result<MultiGuard> {
        let order = self.order()?;
        let hub = Arc::new(LossHub::default());
        let mut guards: Vec<(String, LockGuard)> = Vec::with_capacity(order.len());
        for name in order {
            let mut builder = LockBuilder::new(self.shared, &name).renew(self.renew);
            if let Some(ttl) = self.ttl {
                builder = builder.ttl(ttl);
            }
            if let Some(cancel) = &self.cancel {
                builder = builder.cancel_token(cancel);
            }
            let (lost_name, hub2, callback) = (name.clone(), hub.clone(), self.on_lost.clone());
            builder = builder.on_lost(move |reason| {
                if hub2.lost(reason) {
                    if let Some(callback) = &callback {
                        callback(&lost_name, reason);
                    }
                }
            });
            let taken = match (waits, deadline) {
                (false, _) => builder.try_acquire(),
                (true, None) => builder.acquire(),
                (true, Some(deadline)) => {
                    builder.acquire_timeout(deadline.saturating_duration_since(Instant::now()))
                }
            };
            match taken {
                Ok(guard) => guards.push((name, guard)),
                Err(e) => {
                    give_back(guards);
                    return Err(e);
                }
            }
        }
        Ok(MultiGuard { guards, hub })
    }

    /// The names in the order they are taken (their keys'), checked.
    fn order(&self) -> Result<Vec<String>> {
        if self.names.is_empty() || self.names.len() > MAX_NAMES {
            return Err(Error::invalid(format!(
                "a lock over several names takes 1 to {MAX_NAMES} names, got {}",
                self.names.len()
            )));
        }
        let prefix = &self.shared.options.key_prefix;
        let mut keyed = Vec::with_capacity(self.names.len());
        for name in &self.names {
            keyed.push((LockKeys::new(prefix, name)?.lock, name.clone()));
        }
        keyed.sort();
        if let Some(pair) = keyed.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::invalid(format!(
                "the name {:?} is given twice",
                pair[0].1
            )));
        }
        Ok(keyed.into_iter().map(|(_, name)| name).collect())
    }
}

/// Releases what a failed acquire took, last first.
fn give_back(guards: Vec<(String, LockGuard)>) {
    for (name, guard) in guards.into_iter().rev() {
        if let Err(e) = guard.release() {
            log::warn!("giving back {name:?} after a failed lock_all: {e}");
        }
    }
}

/// The loss of a lock over several names: the first name's loss, told once.
#[derive(Default)]
struct LossHub {
    state: Mutex<(Option<LostReason>, Vec<Sender<LostReason>>)>,
}

impl LossHub {
    /// Records a loss; `true` for the first.
    fn lost(&self, reason: LostReason) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.is_some() {
            return false;
        }
        state.0 = Some(reason);
        for tx in state.1.drain(..) {
            let _ = tx.try_send(reason);
        }
        true
    }

    fn subscribe(&self) -> Receiver<LostReason> {
        let (tx, rx) = bounded(1);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.0 {
            Some(reason) => {
                let _ = tx.try_send(reason);
            }
            None => state.1.push(tx),
        }
        rx
    }

    fn reason(&self) -> Option<LostReason> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// A held lock over several names. Dropping it releases every name.
#[must_use = "if unused the lock is released at once"]
pub struct MultiGuard {
    /// The names and their guards, in the order they were taken.
    guards: Vec<(String, LockGuard)>,
    hub: Arc<LossHub>,
}

impl MultiGuard {
    /// The names, in the order they were taken (their keys').
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(|(n, _)| n.as_str())
    }

    /// The fencing token of each name, in the order of [`names`](Self::names): pass each to
    /// the resource of that name.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.guards
            .iter()
            .map(|(n, g)| (n.as_str(), g.fencing_token()))
            .collect()
    }

    /// The fencing token of `name`, if it is one of this lock's.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guard(name).map(LockGuard::fencing_token)
    }

    /// The guard of `name`, if it is one of this lock's (its token, lease, ...).
    pub fn guard(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// Whether every name is held (the local view; sends nothing).
    pub fn is_held(&self) -> bool {
        self.hub.reason().is_none() && self.guards.iter().all(|(_, g)| g.is_held())
    }

    /// The shortest lease left of the names.
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|(_, g)| g.remaining())
            .min()
            .unwrap_or_default()
    }

    /// Why the lock was lost (the first name's loss), if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.hub.reason()
    }

    /// A receiver that gets the reason once, when the first name is lost.
    pub fn lost(&self) -> Receiver<LostReason> {
        self.hub.subscribe()
    }

    /// Extends every name to `ttl` from now. Errors: the first name's error
    /// ([`ErrorKind::NotHeld`] when it was lost: the whole lock is).
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        let mut first = None;
        for (_, guard) in &self.guards {
            if let Err(e) = guard.extend(ttl) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Releases every name, last taken first. `Ok` only when each was held without a break
    /// up to its release; otherwise the first error (every name is released all the same).
    pub fn release(mut self) -> Result<()> {
        let mut first: Option<Error> = None;
        for (_, guard) in std::mem::take(&mut self.guards).into_iter().rev() {
            if let Err(e) = guard.release() {
                first.get_or_insert(e);
            }
        }
        match (first, self.hub.reason()) {
            (Some(e), _) => Err(e),
            (None, Some(reason)) => Err(Error::new(
                ErrorKind::NotHeld,
                format!("the lock was lost before the release: {reason}"),
            )),
            (None, None) => Ok(()),
        }
    }

    /// Takes the guards out, in the order taken (for the C ABI, which gives each its own
    /// handle).
    pub(crate) fn into_guards(mut self) -> Vec<(String, LockGuard)> {
        std::mem::take(&mut self.guards)
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("fencing_tokens", &self.fencing_tokens())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.guards));
    }
}
