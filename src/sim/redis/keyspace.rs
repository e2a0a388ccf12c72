//! The keyspace: keys, their values by type, and their expiry by the server's clock.
//!
//! Expiry is absolute, in milliseconds of the server's wall clock (as Redis stores it), and
//! a key is expired once that clock is past its expiry (`now > expires_at`, so a key is
//! still there, with a `PTTL` of 0, at its expiry instant). The clock is set before each
//! command or script and stays frozen for it, as in Redis 7. A primary deletes an expired
//! key when it meets it (and in [`Keyspace::expire_due`]), which the replication stream
//! carries as a deletion; a replica only hides it and waits for that deletion.
//!
//! Every key a command may have changed is remembered until [`Keyspace::take_changes`], which
//! is how the server learns what to replicate and which lists became ready for `BLPOP`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::hashes::Hash;
use super::reply::{Reply, WRONGTYPE};
use super::zsets::ZSet;

/// A key's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// A string.
    Str(Vec<u8>),
    /// A list (never empty in the keyspace).
    List(VecDeque<Vec<u8>>),
    /// A sorted set (never empty in the keyspace).
    ZSet(ZSet),
    /// A hash (never empty in the keyspace).
    Hash(Hash),
}

impl Data {
    /// Whether this is an empty aggregate, which Redis never keeps.
    fn is_empty(&self) -> bool {
        match self {
            Data::Str(_) => false,
            Data::List(l) => l.is_empty(),
            Data::ZSet(z) => z.is_empty(),
            Data::Hash(h) => h.is_empty(),
        }
    }
}

/// A key's value and its expiry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    /// The value.
    pub data: Data,
    /// When the key expires, in ms of the server's wall clock; `None`: never.
    pub expires_at: Option<i64>,
}

impl Entry {
    /// A value without expiry.
    pub(crate) fn new(data: Data) -> Entry {
        Entry {
            data,
            expires_at: None,
        }
    }
}

/// One change to replicate: the key's new entry, or `None` when it was deleted.
pub(crate) type Change = (Vec<u8>, Option<Entry>);

/// All keys of one server (one database).
#[derive(Clone, Debug, Default)]
pub(crate) struct Keyspace {
    entries: BTreeMap<Vec<u8>, Entry>,
    changed: BTreeSet<Vec<u8>>,
    /// The server's wall clock for the command being run, ms.
    now: i64,
    /// A replica hides expired keys but does not delete them.
    replica: bool,
}

impl Keyspace {
    /// Sets the clock the next commands see (frozen until set again).
    pub(crate) fn set_clock(&mut self, now_ms: i64) {
        self.now = now_ms;
    }

    /// The clock commands see, ms of the server's wall clock.
    pub(crate) fn now(&self) -> i64 {
        self.now
    }

    /// Makes expired keys hidden but kept (a replica) or deleted when met (a primary).
    pub(crate) fn set_replica(&mut self, replica: bool) {
        self.replica = replica;
    }

    fn is_expired(&self, entry: &Entry) -> bool {
        entry.expires_at.is_some_and(|at| self.now > at)
    }

    /// Deletes `key` if it has expired (on a primary); returns whether it is live.
    fn check_expiry(&mut self, key: &[u8]) -> bool {
        let Some(entry) = self.entries.get(key) else {
            return false;
        };
        if !self.is_expired(entry) {
            return true;
        }
        if !self.replica {
            self.entries.remove(key);
            self.changed.insert(key.to_vec());
        }
        false
    }

    /// The live entry of `key`, for reading.
    pub(crate) fn get(&mut self, key: &[u8]) -> Option<&Entry> {
        if self.check_expiry(key) {
            self.entries.get(key)
        } else {
            None
        }
    }

    /// The live entry of `key`, for changing it (the key counts as changed).
    pub(crate) fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        if !self.check_expiry(key) {
            return None;
        }
        self.changed.insert(key.to_vec());
        self.entries.get_mut(key)
    }

    /// Sets `key` to `entry`, replacing whatever it held.
    pub(crate) fn insert(&mut self, key: &[u8], entry: Entry) {
        self.changed.insert(key.to_vec());
        self.entries.insert(key.to_vec(), entry);
    }

    /// Deletes `key`; returns whether a live key was deleted.
    pub(crate) fn remove(&mut self, key: &[u8]) -> bool {
        let live = self.check_expiry(key);
        if live {
            self.entries.remove(key);
            self.changed.insert(key.to_vec());
        }
        live
    }

    /// Deletes `key` if it is an empty list, sorted set or hash (after a removal).
    pub(crate) fn remove_if_empty(&mut self, key: &[u8]) {
        if self.entries.get(key).is_some_and(|e| e.data.is_empty()) {
            self.entries.remove(key);
            self.changed.insert(key.to_vec());
        }
    }

    /// Deletes every expired key (a primary's active expiry; nothing on a replica).
    pub(crate) fn expire_due(&mut self) {
        if self.replica {
            return;
        }
        let now = self.now;
        let due: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(_, e)| e.expires_at.is_some_and(|at| now > at))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.entries.remove(&key);
            self.changed.insert(key);
        }
    }

    /// The earliest expiry instant of any key (server wall clock), if a key has one.
    pub(crate) fn next_expiry(&self) -> Option<i64> {
        self.entries.values().filter_map(|e| e.expires_at).min()
    }

    /// The keys changed since the last call, each with its entry now (`None`: deleted).
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|key| {
                let entry = self.entries.get(&key).cloned();
                (key, entry)
            })
            .collect()
    }

    /// Applies changes streamed from a primary, as they are (expired or not).
    pub(crate) fn apply(&mut self, changes: &[Change]) {
        for (key, entry) in changes {
            match entry {
                Some(entry) => self.entries.insert(key.clone(), entry.clone()),
                None => self.entries.remove(key),
            };
        }
    }

    /// Deletes every key (nothing is remembered as changed).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.changed.clear();
    }

    /// The live keys and their entries, in key order (expired ones are left out).
    pub(crate) fn live(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.entries
            .iter()
            .filter(|(_, e)| !self.is_expired(e))
            .map(|(k, e)| (k.as_slice(), e))
    }

    /// Every key as stored, expired or not: what a full resynchronisation copies.
    pub(crate) fn snapshot(&self) -> Vec<Change> {
        self.entries
            .iter()
            .map(|(k, e)| (k.clone(), Some(e.clone())))
            .collect()
    }
}

/// The value of `key` if it is of the type `pick` accepts; `WRONGTYPE` if it is of
/// another; `None` if there is no such key.
pub(crate) fn typed<'a, T>(
    keyspace: &'a mut Keyspace,
    key: &[u8],
    pick: impl FnOnce(&'a Data) -> Option<&'a T>,
) -> Result<Option<&'a T>, Reply> {
    match keyspace.get(key) {
        None => Ok(None),
        Some(entry) => pick(&entry.data)
            .map(Some)
            .ok_or_else(|| Reply::error(WRONGTYPE)),
    }
}

/// As [`typed`], for changing the value (the key counts as changed when it exists).
pub(crate) fn typed_mut<'a, T>(
    keyspace: &'a mut Keyspace,
    key: &[u8],
    pick: impl FnOnce(&'a mut Data) -> Option<&'a mut T>,
) -> Result<Option<&'a mut T>, Reply> {
    match keyspace.get_mut(key) {
        None => Ok(None),
        Some(entry) => pick(&mut entry.data)
            .map(Some)
            .ok_or_else(|| Reply::error(WRONGTYPE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(v: &str) -> Entry {
        Entry::new(Data::Str(v.as_bytes().to_vec()))
    }

    #[test]
    fn a_key_lives_through_its_expiry_instant_and_is_gone_after() {
        let mut ks = Keyspace::default();
        ks.set_clock(1000);
        ks.insert(
            b"k",
            Entry {
                expires_at: Some(1100),
                ..string("v")
            },
        );
        ks.take_changes();
        ks.set_clock(1100);
        assert!(ks.get(b"k").is_some());
        ks.set_clock(1101);
        assert!(ks.get(b"k").is_none());
        assert_eq!(ks.take_changes(), vec![(b"k".to_vec(), None)]);
    }

    #[test]
    fn a_replica_hides_expired_keys_but_keeps_them_for_the_primary_to_delete() {
        let mut ks = Keyspace::default();
        ks.set_replica(true);
        ks.set_clock(1000);
        ks.apply(&[(
            b"k".to_vec(),
            Some(Entry {
                expires_at: Some(1000),
                ..string("v")
            }),
        )]);
        ks.set_clock(2000);
        assert!(ks.get(b"k").is_none());
        ks.expire_due();
        assert!(ks.take_changes().is_empty());
        assert_eq!(ks.snapshot().len(), 1);
        ks.apply(&[(b"k".to_vec(), None)]);
        assert!(ks.snapshot().is_empty());
    }

    #[test]
    fn active_expiry_deletes_due_keys_and_reports_them() {
        let mut ks = Keyspace::default();
        ks.set_clock(0);
        ks.insert(
            b"a",
            Entry {
                expires_at: Some(10),
                ..string("1")
            },
        );
        ks.insert(
            b"b",
            Entry {
                expires_at: Some(20),
                ..string("2")
            },
        );
        ks.insert(b"c", string("3"));
        ks.take_changes();
        assert_eq!(ks.next_expiry(), Some(10));
        ks.set_clock(15);
        ks.expire_due();
        assert_eq!(ks.take_changes(), vec![(b"a".to_vec(), None)]);
        assert_eq!(ks.next_expiry(), Some(20));
        assert_eq!(ks.live().count(), 2);
    }
}
