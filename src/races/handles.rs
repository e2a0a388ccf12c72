//! The C ABI's handle table ([`crate::ffi::handles`]), and the bookkeeping of a client
//! close racing an acquire and a release: `lock_client_close` takes the client and its
//! locks out with [`close_parent`], an acquire stores its lock with [`insert_child`]
//! (which gives it back when the client closed meanwhile), `lock_release` takes its
//! handle out with `remove`. The Redis side of each (the acquire's wait, the release
//! script) is what a stand-in lock counts: how many times it was released.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::explore;
use crate::ffi::handles::{ChildError, HandleTable, Kind, close_parent, insert_child};
use crate::sync::{Arc, thread};

/// Every handle issued so far, and those removed.
#[derive(Default)]
struct Issued {
    issued: StdMutex<Vec<u64>>,
    removed: StdMutex<Vec<u64>>,
}

impl Issued {
    fn issue(&self, handle: u64) {
        let mut issued = self.issued.lock().expect("the issued handles");
        assert!(
            !issued.contains(&handle),
            "handle {handle:#x} was issued twice"
        );
        issued.push(handle);
    }

    fn removed(&self, handle: u64) {
        self.removed
            .lock()
            .expect("the removed handles")
            .push(handle);
    }

    fn snapshot(&self) -> (Vec<u64>, Vec<u64>) {
        let issued = self.issued.lock().expect("the issued handles").clone();
        let removed = self.removed.lock().expect("the removed handles").clone();
        (issued, removed)
    }
}

/// Handles that cannot be live while `handle` is: 0, another kind's, an index never
/// used, and the same slot's next and previous generations.
fn forged(handle: u64) -> [u64; 5] {
    [
        0,
        (handle & !(0xff << 56)) | ((Kind::Client as u64) << 56),
        handle + 1000,
        handle + (1 << 32),
        handle - (1 << 32),
    ]
}

/// Three threads insert (one with `insert_with`, whose value is made while its slot is
/// reserved and someone tries to remove the reserved handle), look up and remove handles,
/// their own and each other's: no handle is issued twice (removed slots are reused under a
/// new generation), a removed, reserved-then-guessed or forged handle never resolves, and
/// a live one always resolves to its own value.
#[test]
fn no_handle_is_issued_twice_and_removed_or_forged_ones_never_resolve() {
    explore(super::SCHEDULES, || {
        let table = Arc::new(HandleTable::<u64>::new(Kind::Lock));
        let seen = Arc::new(Issued::default());
        // The handle `insert_with` reserved, and whether the guesser has tried it.
        let reserved = Arc::new(StdMutex::new((None::<u64>, false)));
        let mut threads = Vec::new();
        for worker in 0..2u64 {
            let (table, seen) = (table.clone(), seen.clone());
            threads.push(thread::spawn(move || {
                for round in 0..2u64 {
                    let value = worker * 10 + round;
                    let handle = table.insert(value);
                    // Checked before the others may know of it (and remove it).
                    assert_eq!(table.get(handle).as_deref(), Some(&value));
                    for f in forged(handle) {
                        assert!(table.get(f).is_none(), "forged handle {f:#x} resolved");
                    }
                    seen.issue(handle);
                    thread::yield_now();
                    // Remove the newest handle of the others, or this one.
                    let (issued, removed) = seen.snapshot();
                    let victim = issued
                        .iter()
                        .rev()
                        .find(|h| **h != handle && !removed.contains(h))
                        .copied()
                        .unwrap_or(handle);
                    if table.remove(victim).is_some() {
                        seen.removed(victim);
                        assert!(table.get(victim).is_none(), "a removed handle resolved");
                        assert!(table.remove(victim).is_none(), "a handle removed twice");
                    }
                }
            }));
        }
        {
            let (table, seen, reserved) = (table.clone(), seen.clone(), reserved.clone());
            threads.push(thread::spawn(move || {
                let made = table.insert_with(|handle| -> Result<u64, ()> {
                    reserved.lock().expect("the reserved handle").0 = Some(handle);
                    while !reserved.lock().expect("the reserved handle").1 {
                        thread::yield_now();
                    }
                    Ok(99)
                });
                let handle = made.expect("insert_with's value");
                assert_eq!(
                    table.get(handle).as_deref(),
                    Some(&99),
                    "a handle from insert_with does not resolve to its value"
                );
                seen.issue(handle);
            }));
        }
        {
            let (table, reserved) = (table.clone(), reserved.clone());
            threads.push(thread::spawn(move || {
                loop {
                    let guess = reserved.lock().expect("the reserved handle").0;
                    if let Some(guess) = guess {
                        assert!(table.get(guess).is_none(), "a reserved handle resolved");
                        assert!(
                            table.remove(guess).is_none(),
                            "a reserved handle was removed before its value was stored"
                        );
                        reserved.lock().expect("the reserved handle").1 = true;
                        break;
                    }
                    thread::yield_now();
                }
            }));
        }
        for t in threads {
            t.join().expect("a handle thread");
        }
        let (issued, removed) = seen.snapshot();
        for handle in issued {
            let live = table.get(handle).is_some();
            assert_eq!(
                live,
                !removed.contains(&handle),
                "handle {handle:#x}: live {live}, but removed {}",
                removed.contains(&handle)
            );
        }
    });
}

/// A lock of the stand-in ABI: its client's handle, and how often it was given back.
struct Lock {
    client: u64,
    released: Arc<AtomicUsize>,
}

impl Lock {
    /// `lock_release`'s, `lock_client_close`'s or the orphaned acquire's release script.
    fn release(&self) {
        self.released.fetch_add(1, SeqCst);
    }
}

/// The tables of the stand-in ABI, as `CLIENTS` and `LOCKS`, and every lock made.
struct Abi {
    clients: HandleTable<&'static str>,
    locks: HandleTable<Lock>,
    made: StdMutex<Vec<Arc<AtomicUsize>>>,
    /// Handles `lock_acquire` returned.
    granted: StdMutex<Vec<u64>>,
}

impl Abi {
    /// `lock_acquire` as `AcquireArgs::run` does it: the wait (where the client may close)
    /// inside `insert_child`, a lock given back when its client closed meanwhile.
    fn acquire(&self, client: u64) {
        let made = insert_child(&self.clients, &self.locks, client, |_client, _handle| {
            // The wait for the lock, then the grant.
            thread::yield_now();
            let released = Arc::new(AtomicUsize::new(0));
            self.made
                .lock()
                .expect("the made locks")
                .push(released.clone());
            Ok::<_, ()>(Lock { client, released })
        });
        match made {
            Ok(handle) => self.granted.lock().expect("the granted").push(handle),
            Err(ChildError::Orphaned(Some(lock))) => lock.release(),
            Err(ChildError::Orphaned(None) | ChildError::NoParent) => {}
            Err(ChildError::Make(())) => unreachable!("the stand-in acquire does not fail"),
        }
    }

    /// `lock_client_close`: the client and its locks out, each lock released.
    fn close(&self, client: u64) {
        if let Some((_client, locks)) =
            close_parent(&self.clients, &self.locks, client, |l| l.client)
        {
            for lock in locks {
                lock.release();
            }
        }
    }

    /// `lock_release` on every handle granted so far.
    fn release_granted(&self) {
        let granted = self.granted.lock().expect("the granted").clone();
        for handle in granted {
            if let Some(lock) = self.locks.remove(handle) {
                lock.release();
            }
        }
    }
}

/// Two acquires, a close of their client and a release of whatever was granted, all at
/// once: every lock made is given back exactly once (by `lock_release`, by the close, or by
/// the acquire that found its client closed), none stays in the table behind its closed
/// client, and no granted handle resolves once everything is done.
#[test]
fn a_lock_granted_as_its_client_closes_is_given_back_exactly_once() {
    explore(super::SCHEDULES, || {
        let abi = Arc::new(Abi {
            clients: HandleTable::new(Kind::Client),
            locks: HandleTable::new(Kind::Lock),
            made: StdMutex::new(Vec::new()),
            granted: StdMutex::new(Vec::new()),
        });
        let client = abi.clients.insert("client");
        let mut threads = Vec::new();
        for _ in 0..2 {
            let abi = abi.clone();
            threads.push(thread::spawn(move || abi.acquire(client)));
        }
        {
            let abi = abi.clone();
            threads.push(thread::spawn(move || {
                thread::yield_now();
                abi.close(client);
            }));
        }
        {
            let abi = abi.clone();
            threads.push(thread::spawn(move || {
                thread::yield_now();
                abi.release_granted();
            }));
        }
        for t in threads {
            t.join().expect("an ABI thread");
        }
        assert!(abi.clients.get(client).is_none());
        let left = abi.locks.remove_where(|_| true);
        assert!(
            left.is_empty(),
            "{} lock(s) stayed in the table behind their closed client",
            left.len()
        );
        for (i, released) in abi.made.lock().expect("the made locks").iter().enumerate() {
            let n = released.load(SeqCst);
            assert_eq!(n, 1, "lock {i} was given back {n} times");
        }
        for handle in abi.granted.lock().expect("the granted").iter() {
            assert!(abi.locks.get(*handle).is_none());
        }
    });
}
