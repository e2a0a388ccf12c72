//! Lock names: validation, and the companion keys that live beside a lock key.
//!
//! Companion keys must hash to the lock key's Redis Cluster slot so that every script stays
//! single-slot. For a lock key `K`:
//!
//! - `K` has no hash tag and no `}` (most names): companions are `redlease:fence:{K}`, whose
//!   tag is all of `K`, which is what the cluster hashes for `K` itself.
//! - `K` has a hash tag (`{...}` with something inside): companions are
//!   `redlease:queue:=K` and so on; the prefix holds no brace, so the tag is unchanged. (The
//!   `=` keeps `{abc}`'s companions apart from those of `abc`.) The fencing counter is the
//!   exception: it keeps redlease 0.1's name `redlease:fence:K`, so that clients of both
//!   versions share it and tokens keep increasing across a rolling upgrade; `abc` and
//!   `{abc}` then share a counter, which is harmless (each name's tokens still increase).
//! - `K` has no hash tag but contains `}` (such as `a}b` or `x{}y`): no wrapping of `K`
//!   keeps its slot, so companions are `redlease:fence:{T}K` where `T` is the shortest decimal
//!   number that hashes to `K`'s slot.
//!
//! So every valid name works, on a single server and on a Cluster alike, and no two lock
//! keys share wake-up state: the three forms cannot be confused (the part after the prefix
//! starts with `=`, or is `{...}` with nothing after it, or `{digits}` with something after
//! it). [`lock_keys_of`] reads the lock keys a fencing counter may belong to.
//!
//! Companion keys all begin with [`RESERVED_PREFIX`], and lock keys may not: no lock name
//! can equal, or be mistaken for, another lock's companion key, so no lock can disturb
//! another (a lock named like a fencing counter would otherwise make that lock's acquires
//! fail after their `SET` had taken the key).
//!
//! The wake-up state (`wakeup`, `queue`, `grant`, `waiting`) has names of its own, distinct from those
//! of redlease 0.1 (`wake`, `waiters`): clients of both versions stay mutually exclusive on
//! the same lock names (they share the lock key and the fencing counter) but never share
//! wake-up state, so neither can be confused by the other's handoffs.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The longest lock key accepted, in bytes (including the client's key prefix).
pub const MAX_KEY_LEN: usize = 1024;

/// Lock keys may not begin with this: it is where companion keys live.
pub const RESERVED_PREFIX: &str = "redlease:";

/// The kind of a lock's wake list (`redlease:wakeup:<tail>`).
pub(crate) const WAKE: &str = "wakeup:";
/// The kind of a waiter's own wake list (`redlease:wakeme:<tail>:<token>`): a kind of its
/// own, so that no companion of another lock (whose name may end in `:<token>`) is ever
/// one.
pub(crate) const OWN_WAKE: &str = "wakeme:";

/// Number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// The lock key and its companions, all in one cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The key the token is stored under (`SET key token NX PX ttl`).
    pub lock: String,
    /// The fencing counter.
    pub fence: String,
    /// The wake-up list a release pushes one element to and waiters block on.
    pub wake: String,
    /// The registered waiters: a sorted set of tokens scored by when each lapses.
    pub queue: String,
    /// The handoff token of a grant not yet taken.
    pub grant: String,
    /// A string that lives at least as long as any registration in `queue`: a release
    /// reads it with the lock key (`MGET`) and looks for waiters only when it is there.
    pub waiting: String,
    /// Read-write locks: the readers waiting.
    pub readers: String,
    /// Read-write locks: the wake-up list of readers (writers use `wake`).
    pub reader_wake: String,
    /// Reentrant locks: the owner and count of holds of the current token.
    pub holds: String,
}

impl LockKeys {
    /// Validates `prefix + name` and derives the companion keys.
    ///
    /// Errors with [`crate::ErrorKind::InvalidArgument`] for an empty name, a key longer
    /// than [`MAX_KEY_LEN`], or a key that begins with [`RESERVED_PREFIX`].
    pub fn new(prefix: &str, name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid("the lock name is empty"));
        }
        let mut lock = String::with_capacity(prefix.len() + name.len());
        lock.push_str(prefix);
        lock.push_str(name);
        if lock.len() > MAX_KEY_LEN {
            return Err(Error::invalid(format!(
                "the lock key is {} bytes long; the maximum is {MAX_KEY_LEN}",
                lock.len()
            )));
        }
        if lock.starts_with(RESERVED_PREFIX) {
            return Err(Error::invalid(format!(
                "the lock key {lock:?} begins with {RESERVED_PREFIX:?}, which is reserved for \
                 redlease's companion keys"
            )));
        }
        let tagged = hash_tag(lock.as_bytes()).is_some();
        let tail = if tagged {
            let mut t = String::with_capacity(lock.len() + 1);
            t.push('=');
            t.push_str(&lock);
            t
        } else if !lock.contains('}') {
            let mut t = String::with_capacity(lock.len() + 2);
            t.push('{');
            t.push_str(&lock);
            t.push('}');
            t
        } else {
            format!("{{{}}}{lock}", slot_tag(key_slot(lock.as_bytes())))
        };
        let fence_tail = if tagged { lock.as_str() } else { tail.as_str() };
        // Built by hand, not with `format!`: every acquire derives them.
        let companion = |kind: &str, tail: &str| {
            let mut key = String::with_capacity(RESERVED_PREFIX.len() + kind.len() + tail.len());
            key.push_str(RESERVED_PREFIX);
            key.push_str(kind);
            key.push_str(tail);
            key
        };
        Ok(LockKeys {
            fence: companion("fence:", fence_tail),
            wake: companion(WAKE, &tail),
            queue: companion("queue:", &tail),
            grant: companion("grant:", &tail),
            waiting: companion("waiting:", &tail),
            readers: companion("readers:", &tail),
            reader_wake: companion("rwakeup:", &tail),
            holds: companion("holds:", &tail),
            lock,
        })
    }
}

impl LockKeys {
    /// The wake list of the waiter whose token is `token` (where a release hands it the
    /// lock, and its leading attempt wakes its own block): the wake list's name under
    /// [`OWN_WAKE`], then `:` and the token, so in the same slot (the hash tag comes before
    /// the token). The release scripts derive it the same way (`own_list` in their
    /// handoff).
    pub fn own_wake(&self, token: &str) -> String {
        let tail = &self.wake[RESERVED_PREFIX.len() + WAKE.len()..];
        let mut key = String::with_capacity(self.wake.len() + 1 + token.len());
        key.push_str(RESERVED_PREFIX);
        key.push_str(OWN_WAKE);
        key.push_str(tail);
        key.push(':');
        key.push_str(token);
        key
    }
}

/// The lock keys whose fencing counter `fence` may be (a counter `redlease:fence:{abc}`
/// serves both `abc` and `{abc}`); empty when `fence` is not a fencing counter.
pub(crate) fn lock_keys_of(fence: &str) -> Vec<String> {
    let Some(tail) = fence
        .strip_prefix(RESERVED_PREFIX)
        .and_then(|t| t.strip_prefix("fence:"))
    else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    if hash_tag(tail.as_bytes()).is_some() {
        // A name with its own tag keeps its counter under its own name.
        keys.push(tail.to_owned());
    }
    if let Some(inner) = tail.strip_prefix('{') {
        if let Some(close) = inner.find('}') {
            let rest = &inner[close + 1..];
            if rest.is_empty() && close > 0 {
                keys.push(inner[..close].to_owned());
            } else if !rest.is_empty() && inner[..close].bytes().all(|b| b.is_ascii_digit()) {
                keys.push(rest.to_owned());
            }
        }
    }
    keys.retain(|k| LockKeys::new("", k).is_ok_and(|l| l.fence == fence));
    keys.dedup();
    keys
}

/// The hash tag of `key` as Redis Cluster defines it: the bytes between the first `{` and
/// the first `}` after it, when that is not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The Redis Cluster slot of `key` (CRC16-XMODEM of the hash tag or whole key, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    (crc16(hash_tag(key).unwrap_or(key)) as usize % SLOTS) as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The shortest decimal number whose text hashes to `slot`.
fn slot_tag(slot: u16) -> u32 {
    static TABLE: OnceLock<Vec<u32>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = vec![u32::MAX; SLOTS];
        let mut missing = SLOTS;
        let mut n: u32 = 0;
        while missing > 0 {
            let s = (crc16(n.to_string().as_bytes()) as usize) % SLOTS;
            if table[s] == u32::MAX {
                table[s] = n;
                missing -= 1;
            }
            n += 1;
        }
        table
    });
    table[usize::from(slot)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec_example() {
        // From the Redis Cluster specification: CRC16 of "123456789" is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn every_slot_has_a_tag() {
        for slot in 0..SLOTS as u16 {
            assert_eq!(key_slot(slot_tag(slot).to_string().as_bytes()), slot);
        }
    }

    #[test]
    fn companions_share_the_slot_of_the_lock_key() {
        for name in [
            "plain",
            "{tag}x",
            "a}b",
            "x{}y",
            "{}",
            "}{",
            "a{b",
            "{{a}}",
            "\u{0}\u{1}",
        ] {
            let keys = LockKeys::new("", name).unwrap();
            let slot = key_slot(keys.lock.as_bytes());
            assert_eq!(key_slot(keys.fence.as_bytes()), slot, "{name}");
            assert_eq!(key_slot(keys.wake.as_bytes()), slot, "{name}");
            assert_eq!(key_slot(keys.queue.as_bytes()), slot, "{name}");
            assert_eq!(key_slot(keys.grant.as_bytes()), slot, "{name}");
            assert_eq!(key_slot(keys.waiting.as_bytes()), slot, "{name}");
            let own = keys.own_wake("a{b}c:host/1");
            assert_eq!(key_slot(own.as_bytes()), slot, "{name}");
            assert_eq!(key_slot(keys.holds.as_bytes()), slot, "{name}");
        }
    }

    #[test]
    fn rejects_empty_and_overlong_names() {
        assert!(LockKeys::new("", "").is_err());
        assert!(LockKeys::new("", &"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(LockKeys::new("p:", &"k".repeat(MAX_KEY_LEN - 1)).is_err());
    }

    /// A waiter's own wake list, where a release hands it the lock, is never a key of
    /// another lock: not even of a lock named after the first one and the waiter's token
    /// (whose wake list was the own list when own lists were named after the wake list).
    #[test]
    fn no_own_wake_list_is_a_key_of_another_lock() {
        let token = "0d5b6a6e-6f4e-4d55-9a0f-1f2b3c4d5e6f:host/1";
        for name in ["plain", "{s}", "x{t}y", "a}b", "{}"] {
            let keys = LockKeys::new("", name).unwrap();
            let own = keys.own_wake(token);
            assert!(own.starts_with("redlease:wakeme:"), "{own}");
            let other = LockKeys::new("", &format!("{name}:{token}")).unwrap();
            for key in [
                &other.lock,
                &other.fence,
                &other.wake,
                &other.queue,
                &other.grant,
                &other.waiting,
                &other.readers,
                &other.reader_wake,
                &other.holds,
            ] {
                assert_ne!(key, &own, "{name}");
            }
        }
    }

    /// Safety item 9: no two lock keys share a companion key (`abc` and `{abc}` did), and
    /// the lock key can be read back from its fencing counter.
    #[test]
    fn companion_keys_are_distinct_per_lock_and_reversible() {
        let names = [
            "abc",
            "{abc}",
            "{abc}x",
            "x{abc}",
            "a}b",
            "{1}a}b",
            "=x",
            "{=x}",
            "123",
            "{123}",
            "{}",
            "}{",
            "a{b",
            "{{a}}",
            "{a{b}c}",
            "{}{real}",
            "é{ü}",
            "\u{0}\u{1}",
        ];
        let mut seen = std::collections::HashMap::new();
        for name in names {
            let keys = LockKeys::new("", name).unwrap();
            assert!(
                lock_keys_of(&keys.fence).contains(&name.to_owned()),
                "{name:?} from {}",
                keys.fence
            );
            for companion in [
                &keys.wake,
                &keys.queue,
                &keys.grant,
                &keys.waiting,
                &keys.readers,
                &keys.reader_wake,
                &keys.holds,
            ] {
                if let Some(other) = seen.insert(companion.clone(), name) {
                    panic!("{name:?} and {other:?} share {companion}");
                }
            }
        }
        assert_eq!(lock_keys_of("redlease:fence:{abc}"), vec!["{abc}", "abc"]);
        assert!(lock_keys_of("redlease:queue:{a}").is_empty());
        assert!(lock_keys_of("other").is_empty());
    }

    /// The fencing counter keeps redlease 0.1's name, so both versions share it.
    #[test]
    fn fencing_counters_keep_their_0_1_names() {
        assert_eq!(LockKeys::new("", "a").unwrap().fence, "redlease:fence:{a}");
        assert_eq!(
            LockKeys::new("", "{u}1").unwrap().fence,
            "redlease:fence:{u}1"
        );
    }

    /// Safety item 9: a lock name can never be another lock's companion key.
    #[test]
    fn lock_keys_never_equal_companion_keys() {
        for name in ["redlease:fence:{a}", "redlease:wakeup:{a}", "redlease:x"] {
            assert!(LockKeys::new("", name).is_err(), "{name}");
        }
        assert!(LockKeys::new("redlease", ":fence:{a}").is_err());
        let a = LockKeys::new("", "a").unwrap();
        for companion in [
            &a.fence,
            &a.wake,
            &a.queue,
            &a.grant,
            &a.waiting,
            &a.readers,
            &a.reader_wake,
            &a.holds,
        ] {
            assert!(companion.starts_with(RESERVED_PREFIX));
            assert!(LockKeys::new("", companion).is_err());
        }
        assert!(
            LockKeys::new("", "Redlease:fence:{a}").is_ok(),
            "case matters in Redis"
        );
    }
}
