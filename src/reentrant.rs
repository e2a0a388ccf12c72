//! A held lock as this process has it ([`Held`]: its lease and its renewal, shared by the
//! guards of its holds), and the registry of the reentrant ones a client holds, so that
//! another hold of the same owner joins the lease it already has.

use std::collections::HashMap;

use crate::lease::Lease;
use crate::renewal::Renewal;
use crate::sync::{self, Arc, Mutex, MutexGuard, Weak};

/// A held lock as this process has it: its lease and its renewal, shared by the guards of
/// the holds of one reentrant owner (one guard otherwise).
pub(crate) struct Held {
    pub lease: Arc<Lease>,
    renewal: Mutex<Option<Renewal>>,
    /// Guards of this process that hold it; changed under the registry's lock when there
    /// is one.
    guards: Mutex<usize>,
    /// The client's reentrant locks, for a reentrant lock.
    registry: Option<Arc<Registry>>,
}

impl Held {
    /// A lock just taken, with its first guard; on `registry` (not yet: see
    /// [`Registry::insert`]) when it is reentrant.
    pub fn new(lease: Arc<Lease>, registry: Option<Arc<Registry>>) -> Arc<Held> {
        Arc::new(Held {
            lease,
            renewal: Mutex::new(None),
            guards: Mutex::new(1),
            registry,
        })
    }

    /// Its renewal, if it has one.
    pub fn renewal(&self) -> MutexGuard<'_, Option<Renewal>> {
        sync::lock(&self.renewal)
    }

    fn guards(&self) -> MutexGuard<'_, usize> {
        sync::lock(&self.guards)
    }

    /// The registry it is on, for a reentrant lock.
    pub fn registry(&self) -> Option<&Arc<Registry>> {
        self.registry.as_ref()
    }

    /// One guard less; `true` when it was the last (the lock is then off the registry).
    pub fn leave(self: &Arc<Self>) -> bool {
        let Some(registry) = &self.registry else {
            return true;
        };
        let mut map = registry.map();
        let mut guards = self.guards();
        *guards = guards.saturating_sub(1);
        if *guards > 0 {
            return false;
        }
        let token = &self.lease.token;
        if map
            .get(token)
            .is_some_and(|w| w.ptr_eq(&Arc::downgrade(self)))
        {
            map.remove(token);
        }
        true
    }
}

/// The reentrant locks a client holds, by token, so that more holds of one share its lease
/// and renewal.
#[derive(Default)]
pub(crate) struct Registry(Mutex<HashMap<String, Weak<Held>>>);

impl Registry {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Weak<Held>>> {
        sync::lock(&self.0)
    }

    /// The lock with `token` as held here, with one more guard; `None` when this process
    /// does not hold it (any more), or its lease here is over (lost, or its local deadline
    /// passed), or the re-entry was into another acquisition under the same token
    /// (`fencing_token`, the one the server's holds name, differs: an acquire whose reply
    /// was lost took the token again after the lock expired, so the hold the re-entry
    /// made went with the old one): the new hold then gets a lease of its own, from what
    /// the server just set.
    pub fn join(&self, token: &str, fencing_token: u64) -> Option<Arc<Held>> {
        let map = self.map();
        let held = map.get(token)?.upgrade()?;
        let mut guards = held.guards();
        if *guards == 0
            || held.lease.fencing_token != fencing_token
            || held.lease.gate_closed()
            || !held.lease.is_held()
        {
            return None;
        }
        *guards += 1;
        drop(guards);
        Some(held)
    }

    /// Puts a lock just taken on the registry.
    pub fn insert(&self, held: &Arc<Held>) {
        let mut map = self.map();
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(held.lease.token.clone(), Arc::downgrade(held));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::client::Client;
    use crate::core::lease::LeaseClock;
    use crate::keys::LockKeys;
    use crate::kinds::Kind;

    /// A reentrant lock held here under `token` with `fencing_token`, on `registry`, with a
    /// lease of ten minutes. The client connects to nothing: a lease does no I/O until it
    /// is extended or released, and neither happens here.
    fn held(registry: &Arc<Registry>, token: &str, fencing_token: u64) -> Arc<Held> {
        let client = Client::open("redis://127.0.0.1:1/0").expect("a valid URL");
        let ttl = Duration::from_secs(600);
        let lease = Lease::new(
            client.inner.server.clone(),
            LockKeys::new("registry:", "lock").expect("a valid lock name"),
            token.to_owned(),
            fencing_token,
            Kind::Reentrant("owner".into()),
            None,
            LeaseClock::new(ttl, ttl, Instant::now()),
            None,
        );
        let held = Held::new(Arc::new(lease), Some(Arc::clone(registry)));
        registry.insert(&held);
        held
    }

    #[test]
    fn a_reentry_joins_only_the_acquisition_its_fencing_token_names() {
        let registry = Arc::new(Registry::default());
        let first = held(&registry, "A", 7);
        // The same token taken again after the key expired: the server drew 8, and the
        // holds hash of 7 went with the key. A re-entry answered with 7 made its hold in
        // that old hash, so it must not share the lease of 8.
        let second = held(&registry, "A", 8);
        assert!(registry.join("A", 7).is_none());
        let joined = registry.join("A", 8).expect("a re-entry into 8 joins it");
        assert!(Arc::ptr_eq(&joined, &second));
        assert!(!joined.leave(), "the first guard of 8 still holds it");
        assert!(
            registry.join("B", 8).is_none(),
            "another token joins nothing"
        );
        drop(first);
    }
}
