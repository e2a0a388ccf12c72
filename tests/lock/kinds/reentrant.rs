//! Reentrant locks: one owner (the calling thread, or an owner string shared by clients and
//! processes) takes holds of one acquisition, with one token, one fencing token and one
//! renewed lease; the lock is released with the last hold. Leases shared between clients,
//! re-entries joining lost, fixed or expired leases, releases racing re-entries, lost and
//! late replies, foreign clients and stale holds records, and owners at their limits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind, LockGuard, LostReason};

use super::{Jitter, believed, cross_overlap, exists};
use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, client, eventually, now_ns, options, quick_client};

/// Issue 15, items 1 and 6: a thread takes a reentrant lock 100 times: one token, one
/// fencing token, one lease renewed once (not per hold); another thread is refused
/// meanwhile; the key is released with the 100th release, not before.
#[test]
fn a_reentrant_lock_is_taken_100_deep_and_released_with_the_last_hold() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let ttl = Duration::from_secs(1);
    let guards: Vec<_> = (0..100)
        .map(|_| {
            client
                .lock("deep")
                .reentrant()
                .ttl(ttl)
                .try_acquire()
                .unwrap()
        })
        .collect();
    let first = &guards[0];
    assert!(guards.iter().all(|g| g.token() == first.token()));
    assert!(
        guards
            .iter()
            .all(|g| g.fencing_token() == first.fencing_token())
    );
    let stored: Option<String> = server.cmd(&["GET", "deep"]);
    assert_eq!(
        stored.as_deref(),
        Some(first.token()),
        "GET key still works"
    );
    // Another thread (another owner) is refused, and so is a plain mutex.
    let other = client.clone();
    let refused = std::thread::spawn(move || {
        other
            .lock("deep")
            .reentrant()
            .try_acquire()
            .map(drop)
            .unwrap_err()
    })
    .join()
    .unwrap();
    assert_eq!(refused.kind(), ErrorKind::Busy, "{refused}");
    assert_eq!(
        client.lock("deep").try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    // One renewal for the lock, not one per hold: ~3 renewals per ttl (~6 here, ~600 if
    // each hold renewed).
    let before = server.calls("evalsha");
    std::thread::sleep(ttl * 2);
    let renewals = server.calls("evalsha") - before;
    assert!(
        renewals <= 20,
        "{renewals} renewals in 2 ttls for 100 holds"
    );
    assert!(guards.iter().all(|g| g.is_held()));
    let mut guards = guards;
    let last = guards.pop().unwrap();
    for guard in guards {
        guard.release().unwrap();
        assert!(server.cmd::<bool>(&["EXISTS", "deep"]));
    }
    assert!(last.is_held(), "the holds left share the lease");
    last.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "deep"]));
    assert!(
        !server.cmd::<bool>(&["EXISTS", "redlease:holds:{deep}"]),
        "the holds record goes with the lock"
    );
}

/// Issue 15, item 1: a caller-supplied owner is shared by every client that uses it (here
/// two clients, as two processes would): each takes a hold of the same acquisition, and the
/// lock is released with the last hold, whichever client gives it back. Another owner is
/// refused.
#[test]
fn a_caller_supplied_owner_reenters_from_another_client() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()), client(&server.url()));
    let owner = "job-6f1c0e2a-5d9b-4d1e-9a6e-0c8f6a2b7d11";
    let first = a.lock("job").reentrant_as(owner).try_acquire().unwrap();
    let second = b.lock("job").reentrant_as(owner).try_acquire().unwrap();
    assert_eq!(first.token(), second.token());
    assert_eq!(first.fencing_token(), second.fencing_token());
    let stranger = b.lock("job").reentrant_as("someone-else").try_acquire();
    assert_eq!(stranger.unwrap_err().kind(), ErrorKind::Busy);
    let info = a.inspect("job").unwrap();
    assert_eq!(info.reentrant, Some((owner.to_owned(), 2)), "{info:?}");
    first.release().unwrap();
    assert!(server.cmd::<bool>(&["EXISTS", "job"]), "one hold is left");
    assert_eq!(
        a.inspect("job").unwrap().reentrant,
        Some((owner.to_owned(), 1))
    );
    assert!(second.is_held());
    second.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "job"]));
    // Bad owners are refused before anything is sent.
    for bad in ["".to_owned(), "x".repeat(257)] {
        let err = a.lock("job").reentrant_as(&bad).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

/// Issue 15, item 5: a reentrant lock is a mutex: the same name cannot be a semaphore at
/// once, and a Redlock client refuses reentrant locks clearly.
#[test]
fn reentrant_locks_keep_to_their_kind() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let held = c.lock("mixed").reentrant().try_acquire().unwrap();
    let err = c.semaphore("mixed", 2).try_acquire().unwrap_err();
    assert!(err.to_string().contains("another kind"), "{err}");
    drop(held);
    let err = c.semaphore("s", 2).reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = c.rwlock("rw").read().reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let redlock = Client::redlock(&[&server.url()], ClientOptions::default()).unwrap();
    let err = redlock.lock("r").reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// Attacks the owner's validation and its binary safety: 256 bytes (ASCII or multi-byte)
/// are accepted, 257 refused before anything is sent; owners that differ only after a
/// NUL, or that look like the holds record's field names, are distinct owners (the Lua
/// scripts and the protocol are binary-safe); an owner with NUL re-enters its own lock.
#[test]
fn owners_at_the_length_limit_and_with_nul_bytes_are_exact() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let c = client(&proxy.url());
    let long = "o".repeat(256);
    let wide = "é".repeat(128);
    assert_eq!(wide.len(), 256);
    for owner in [&long, &wide] {
        let g = c
            .lock("long-owner")
            .reentrant_as(owner)
            .try_acquire()
            .unwrap();
        let h = c
            .lock("long-owner")
            .reentrant_as(owner)
            .try_acquire()
            .unwrap();
        assert_eq!(
            c.inspect("long-owner").unwrap().reentrant,
            Some((owner.clone(), 2))
        );
        drop((g, h));
        assert!(!exists(&server, "long-owner"));
    }
    proxy.clear_requests();
    for bad in ["o".repeat(257), format!("{wide}x"), String::new()] {
        let err = c
            .lock("bad-owner")
            .reentrant_as(&bad)
            .try_acquire()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    assert_eq!(
        proxy.count_requests(b"bad-owner"),
        0,
        "sent before validation"
    );
    let nul = "job\0a";
    let held = c.lock("nul-owner").reentrant_as(nul).try_acquire().unwrap();
    for other in ["job\0b", "job", "job\0", "job\0a\0", "t", "o", "h:job\0a"] {
        let err = c
            .lock("nul-owner")
            .reentrant_as(other)
            .try_acquire()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{other:?}: {err}");
    }
    let again = c.lock("nul-owner").reentrant_as(nul).try_acquire().unwrap();
    assert_eq!(again.token(), held.token());
    assert_eq!(
        c.inspect("nul-owner").unwrap().reentrant,
        Some((nul.to_owned(), 2))
    );
    drop(held);
    assert!(exists(&server, "nul-owner"));
    again.release().unwrap();
    assert!(!exists(&server, "nul-owner"));
}

/// Issue 15, items 1 and 6, under faults: a re-entry whose reply is dropped reports an
/// unknown outcome and withdraws its own hold, so the lock is released with the holds that
/// were reported (not left held until its ttl); a delayed reply changes nothing.
#[test]
fn a_reentry_whose_reply_is_lost_leaves_no_hold_behind() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    // The dropped reply is timed out after 1 s; the delayed one (150 ms) comes well before.
    let options = ClientOptions::default()
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    let owner = "owner-under-faults-0b7e";
    let first = client
        .lock("faulty")
        .reentrant_as(owner)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let rule = proxy.on_request(owner.as_bytes(), 1, Action::DropReply);
    let err = client
        .lock("faulty")
        .reentrant_as(owner)
        .try_acquire()
        .map(drop)
        .unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.outcome_unknown(), "{err}");
    proxy.on_request(
        owner.as_bytes(),
        1,
        Action::DelayReply(Duration::from_millis(150)),
    );
    let second = client
        .lock("faulty")
        .reentrant_as(owner)
        .try_acquire()
        .unwrap();
    second.release().unwrap();
    assert!(server.cmd::<bool>(&["EXISTS", "faulty"]));
    first.release().unwrap();
    // The lost re-entry's withdrawal goes out in the background (a give-back of an attempt
    // whose reply never came never holds up the caller): it may land just after.
    assert!(
        eventually(Duration::from_secs(5), || !server
            .cmd::<bool>(&["EXISTS", "faulty"])),
        "the lost re-entry's hold was withdrawn"
    );
}

/// Attacks the lease of a re-entry made through another client (another process, as a
/// caller-supplied owner allows): the re-entry is told its lease is at least its own ttl
/// (20 s here), but the first holder's renewal keeps setting the key's expiry to *its*
/// ttl (1 s). Once the first holder gives back its hold (its renewal stops), the key
/// expires within 1 s while the second guard still says it is held, and a stranger takes
/// the lock: two holders.
///
/// Found: a renewal of one process's lease shortens the key under another process's re-entry
/// of the same owner (fixed).
#[test]
fn a_reentry_from_another_client_keeps_its_ttl_when_the_first_holder_renews_shorter() {
    let server = RedisServer::start();
    let (c1, c2, c3) = (
        client(&server.url()),
        client(&server.url()),
        client(&server.url()),
    );
    let owner = "job-2b1d9c3e-7f64-4a8e-b1a0-5d2c9e8f7a61";
    let first = c1
        .lock("shared-job")
        .reentrant_as(owner)
        .ttl(Duration::from_secs(1))
        .try_acquire()
        .unwrap();
    let second = c2
        .lock("shared-job")
        .reentrant_as(owner)
        .ttl(Duration::from_secs(20))
        .try_acquire()
        .unwrap();
    assert_eq!(first.token(), second.token(), "one acquisition, two holds");
    assert!(
        server.pttl("shared-job") > 15_000,
        "the re-entry set the lease to at least its ttl"
    );
    // The first holder's renewal (every ~333 ms) runs at least once.
    std::thread::sleep(Duration::from_millis(600));
    let after_renewal = server.pttl("shared-job");
    first.release().unwrap();
    std::thread::sleep(Duration::from_millis(1300));
    assert!(second.is_held(), "the second guard believes it holds");
    let stranger = c3.lock("shared-job").try_acquire();
    assert!(
        stranger.is_err(),
        "a stranger took the lock while the re-entry's guard says it is held \
         (remaining {:?}); the key's PTTL right after the first holder's renewal was \
         {after_renewal} ms, not the 20 s the re-entry was promised",
        second.remaining()
    );
}

/// Attacks the in-process sharing of a lease: a re-entry with a ttl of 20 s joins the
/// lease of an outer hold with a fixed 300 ms lease. The server extends the key to 20 s
/// ("a re-entry extends the lease to at least its ttl"), but the shared local lease keeps
/// the outer hold's deadline: the inner guard says it is not held after 300 ms while the
/// key (with its token) still has ~19.5 s, and its release reports `NotHeld` for a lock
/// that was never lost.
///
/// Found: a re-entry that joins a shared lease does not extend the local lease to its ttl
/// (fixed).
#[test]
fn a_reentry_joining_a_fixed_lease_is_held_for_its_own_ttl() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let outer = c
        .lock("fixed-outer")
        .reentrant()
        .ttl(Duration::from_millis(300))
        .renew(false)
        .try_acquire()
        .unwrap();
    let inner = c
        .lock("fixed-outer")
        .reentrant()
        .ttl(Duration::from_secs(20))
        .try_acquire()
        .unwrap();
    assert!(server.pttl("fixed-outer") > 15_000);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.get("fixed-outer").as_deref(),
        Some(inner.token()),
        "the key still holds the token"
    );
    assert!(
        inner.is_held(),
        "the re-entry with a 20 s ttl is no longer held locally after 500 ms \
         (remaining {:?}, key PTTL {} ms)",
        inner.remaining(),
        server.pttl("fixed-outer")
    );
    drop(outer);
    inner.release().unwrap();
}

/// Attacks the registry of shared leases: the lease of a reentrant lock is lost (its
/// renewal's reply came after the local deadline) while the key still holds its token.
/// A re-entry by the same thread then succeeds on the server (one more hold) and must
/// give a guard that is held; it joins the lost lease instead, so `acquire` returns `Ok`
/// with a guard that is not held, is never renewed, and reports a loss.
///
/// Found: a re-entry joins a lease that is already lost and returns a dead guard (fixed).
#[test]
fn a_reentry_never_returns_a_guard_that_is_already_lost() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let c = client(&proxy.url());
    // Load the extend script: a renewal answered NOSCRIPT late would never run.
    let warm = c.lock("warm-up").reentrant().try_acquire().unwrap();
    warm.extend(Duration::from_secs(5)).unwrap();
    warm.release().unwrap();
    let ttl = Duration::from_millis(1500);
    let first = c
        .lock("lost-then-reentered")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let lost = first.lost();
    // The requests naming the token are the renewals (a third into the lease, then their
    // retries on their own): they run (the key gets 1.5 s more) but their replies come
    // too late, so the lease is lost.
    let rule = proxy.on_request(
        first.token().as_bytes(),
        100,
        Action::DelayReply(Duration::from_secs(3)),
    );
    let reason = lost.recv_timeout(Duration::from_secs(4)).unwrap();
    assert_eq!(reason, LostReason::Unreachable);
    assert!(proxy.matched(rule) >= 1, "no renewal ran");
    proxy.clear_rules();
    // The renewals that ran keep the key ~0.5 to 1 s past the local deadline; the test
    // keeps it longer, so that a slow host cannot let it expire before the re-entry.
    assert!(
        server.cmd::<bool>(&["PEXPIRE", "lost-then-reentered", "60000"]),
        "the key outlived the local deadline"
    );
    assert_eq!(
        server.get("lost-then-reentered").as_deref(),
        Some(first.token()),
        "the key still holds the token"
    );
    match c
        .lock("lost-then-reentered")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
    {
        Ok(again) => {
            assert!(
                again.is_held(),
                "acquire returned Ok with a guard that is not held (lost: {:?}); the \
                 server recorded one more hold under token {}",
                again.lost_reason(),
                again.token()
            );
        }
        // Refusing the re-entry would be honest too.
        Err(e) => assert_ne!(e.kind(), ErrorKind::Internal, "{e}"),
    }
}

/// Attacks `min_replicas` on a re-entry: an acquire asking for one replica's
/// acknowledgement on a server without replicas must fail with `Replication` and hold
/// nothing (as a mutex's does); the re-entry path skips the `WAIT` check and succeeds.
///
/// Found: a re-entry with min_replicas never checks the WAIT reply (fixed).
#[test]
fn a_reentry_with_min_replicas_is_refused_without_replicas() {
    let server = RedisServer::start();
    let (c1, c2) = (client(&server.url()), client(&server.url()));
    let owner = "job-min-replicas-4c0b7d1e-2a9f";
    let wait = Duration::from_millis(100);
    // A mutex asking for a replica that does not exist is refused.
    let err = c1
        .lock("no-replica")
        .min_replicas(1, wait)
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Replication, "{err}");
    // A reentrant first hold asking for it is refused too.
    let err = c1
        .lock("replicated-job")
        .reentrant_as(owner)
        .min_replicas(1, wait)
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Replication, "{err}");
    let first = c1
        .lock("replicated-job")
        .reentrant_as(owner)
        .try_acquire()
        .unwrap();
    let again = c2
        .lock("replicated-job")
        .reentrant_as(owner)
        .min_replicas(1, wait)
        .try_acquire();
    let err = again
        .map(|g| format!("acquired: {g:?}"))
        .expect_err("a re-entry that no replica acknowledged was reported acquired");
    assert_eq!(err.kind(), ErrorKind::Replication, "{err}");
    first.release().unwrap();
    assert!(
        !exists(&server, "replicated-job"),
        "the re-entry's hold was rolled back"
    );
}

/// Attacks the same lease from the default owner (the calling thread): one thread, two
/// clients (two handles, as two libraries of one program would have). The second hold's
/// guard is promised 10 s; the first guard's `extend` to 100 ms shortens the key under it,
/// and once the first guard is released the key expires while the second guard says it
/// is held.
///
/// Found: an extend of one client's lease shortens the key under another client's re-entry
/// of the same thread (fixed).
#[test]
fn a_thread_owned_reentry_through_a_second_client_is_not_shortened_by_an_extend() {
    let server = RedisServer::start();
    let (c1, c2, c3) = (
        client(&server.url()),
        client(&server.url()),
        client(&server.url()),
    );
    let ttl = Duration::from_secs(10);
    let first = c1
        .lock("two-handles")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let second = c2
        .lock("two-handles")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    assert_eq!(first.token(), second.token());
    first.extend(Duration::from_millis(100)).unwrap();
    first.release().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(second.is_held());
    assert_eq!(
        server.get("two-handles").as_deref(),
        Some(second.token()),
        "the key expired under a guard that says it holds it for {:?} more; a stranger \
         can take it: {:?}",
        second.remaining(),
        c3.lock("two-handles")
            .try_acquire()
            .map(|g| g.fencing_token())
    );
}

/// Attacks the interleaving of the release of the last local guard with a concurrent
/// re-entry by the same caller-supplied owner from another thread (the registry entry
/// removed, the gate closed, the `RELEASE` in flight while the re-entry's `ACQUIRE` runs
/// and joins or builds a lease), plus a second client with the same owner and a stranger
/// (another owner) contending: the owner's holds never overlap the stranger's, every
/// release of a hold held without a break reports `Ok`, and when every guard is gone the
/// key and its holds record are gone too (no hold leaked).
#[test]
fn reentries_racing_the_release_of_the_last_local_guard_keep_exclusion_and_leak_nothing() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let other = client(&server.url());
    let stranger = client(&server.url());
    let owner = "job-race-0d6a4e1f-93b2-4c7e-8f15-a2b3c4d5e6f7";
    let name = "race";
    let stop = Arc::new(AtomicBool::new(false));
    let owner_log = Arc::new(Mutex::new(Vec::new()));
    let stranger_log = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let cl = if t == 3 { other.clone() } else { c.clone() };
        let (stop, log, failures) = (stop.clone(), owner_log.clone(), failures.clone());
        threads.push(std::thread::spawn(move || {
            let mut jitter = Jitter::new(t + 1);
            let mut nested: Vec<LockGuard> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match cl
                    .lock(name)
                    .reentrant_as(owner)
                    .ttl(Duration::from_secs(2))
                    .acquire_timeout(Duration::from_secs(3))
                {
                    Ok(g) => {
                        let start = now_ns();
                        let remaining = g.remaining();
                        if jitter.below(3) == 0 {
                            // Sometimes a nested hold outlives this one for a while.
                            nested.push(g);
                            if nested.len() > 2 {
                                let g = nested.remove(0);
                                if let Err(e) = g.release() {
                                    failures.lock().unwrap().push(format!("nested: {e}"));
                                }
                            }
                            continue;
                        }
                        std::thread::sleep(Duration::from_micros(jitter.below(1500)));
                        let held = g.is_held();
                        let end = now_ns();
                        log.lock()
                            .unwrap()
                            .push(believed(start, remaining, end, held));
                        if let Err(e) = g.release() {
                            failures.lock().unwrap().push(format!("release: {e}"));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Busy => {}
                    Err(e) => failures.lock().unwrap().push(format!("acquire: {e}")),
                }
                if nested.is_empty() || jitter.below(4) == 0 {
                    for g in nested.drain(..) {
                        if let Err(e) = g.release() {
                            failures.lock().unwrap().push(format!("nested: {e}"));
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(jitter.below(3000)));
            }
            for g in nested {
                if let Err(e) = g.release() {
                    failures.lock().unwrap().push(format!("nested at end: {e}"));
                }
            }
        }));
    }
    {
        let (stop, log, failures) = (stop.clone(), stranger_log.clone(), failures.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match stranger
                    .lock(name)
                    .ttl(Duration::from_secs(2))
                    .try_acquire()
                {
                    Ok(g) => {
                        let start = now_ns();
                        let remaining = g.remaining();
                        std::thread::sleep(Duration::from_millis(1));
                        let held = g.is_held();
                        log.lock()
                            .unwrap()
                            .push(believed(start, remaining, now_ns(), held));
                        if let Err(e) = g.release() {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("stranger release: {e}"));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Busy => {}
                    Err(e) => failures.lock().unwrap().push(format!("stranger: {e}")),
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let (owner_log, stranger_log) = (owner_log.lock().unwrap(), stranger_log.lock().unwrap());
    assert!(owner_log.len() > 50, "{} owner holds", owner_log.len());
    assert!(!stranger_log.is_empty(), "the stranger never got in");
    assert_eq!(cross_overlap(&owner_log, &stranger_log), None);
    assert!(
        !exists(&server, name),
        "a hold leaked: the key is still held"
    );
    assert!(
        !exists(&server, "redlease:holds:{race}"),
        "the holds record outlived the lock"
    );
}

/// Attacks the release of reentrant holds whose replies are dropped: a later hold's
/// release runs but its reply is lost (an unknown outcome), then the first hold's release
/// also loses its reply. The lock must still be held between the two (one hold left) and
/// gone after the second, with nothing left to lapse.
#[test]
fn reentrant_releases_whose_replies_are_dropped_still_release_with_the_last_hold() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    // A dropped reply is an unknown outcome after the I/O timeout, whatever its length.
    let c = quick_client(&proxy.url(), 1000);
    let name = "dropped-release";
    // Load the scripts first: a dropped NOSCRIPT reply would mean the release never ran.
    c.lock("warm-up")
        .reentrant()
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let first = c.lock(name).reentrant().try_acquire().unwrap();
    let second = c.lock(name).reentrant().try_acquire().unwrap();
    // Only releases of a mutex-like kind carry a handoff token.
    let rule = proxy.on_request(b":handoff", 1, Action::DropReply);
    let err = second.release().unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.outcome_unknown(), "{err}");
    assert!(first.is_held());
    assert_eq!(server.get(name).as_deref(), Some(first.token()));
    let rule = proxy.on_request(b":handoff", 1, Action::DropReply);
    let err = first.release().unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.outcome_unknown(), "{err}");
    assert!(!exists(&server, name), "the last hold's release ran");
    assert!(!exists(&server, &format!("redlease:holds:{{{name}}}")));
}

/// Attacks the holds record against foreign plain clients: the key is deleted and taken
/// with a plain `SET NX` by a client that is not redlease, while the holds record of the
/// old token is still there. The old owner's re-entry must not take a hold of the foreign
/// lock, its renewal must find the lock lost, and its release must report `NotHeld` and
/// leave the foreign key alone; a foreign `DEL` afterwards lets the owner in afresh with a
/// larger fencing token.
#[test]
fn a_stale_holds_record_never_lets_an_owner_into_a_foreign_lock() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let other = client(&server.url());
    let owner = "job-foreign-8e2f1a3b-4c5d-6e7f-8091-a2b3c4d5e6f7";
    let name = "foreign";
    let first = c
        .lock(name)
        .reentrant_as(owner)
        .ttl(Duration::from_millis(600))
        .try_acquire()
        .unwrap();
    let lost = first.lost();
    server.cmd::<i64>(&["DEL", name]);
    let set: Option<String> = server.cmd(&["SET", name, "foreign-holder", "NX", "PX", "5000"]);
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(
        exists(&server, "redlease:holds:{foreign}"),
        "the record is stale now"
    );
    for cl in [&c, &other] {
        let err = cl.lock(name).reentrant_as(owner).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    }
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(2)).unwrap(),
        LostReason::NotHeld
    );
    let err = first.release().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(server.get(name).as_deref(), Some("foreign-holder"));
    server.cmd::<i64>(&["DEL", name]);
    let again = other.lock(name).reentrant_as(owner).try_acquire().unwrap();
    let plain = c.lock(name).try_acquire().unwrap_err();
    assert_eq!(plain.kind(), ErrorKind::Busy, "{plain}");
    let info = c.inspect(name).unwrap();
    assert_eq!(info.reentrant, Some((owner.to_owned(), 1)), "{info:?}");
    again.release().unwrap();
    assert!(!exists(&server, name));
}

/// Attacks the release of holds of a lock that changed hands to the same owner: a lock
/// with two holds in one client is deleted by an operator, and another client of the same
/// owner takes it afresh. The old holds' releases must report `NotHeld` and give back none
/// of the new holder's holds; a re-entry through the old client joins the new acquisition
/// (its fencing token, larger than the old one's), not the old lease.
#[test]
fn old_holds_of_a_lock_taken_again_by_the_same_owner_release_nothing_of_the_new_one() {
    let server = RedisServer::start();
    let (c1, c2) = (client(&server.url()), client(&server.url()));
    let owner = "job-handover-5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d";
    let name = "handover";
    let old_outer = c1.lock(name).reentrant_as(owner).try_acquire().unwrap();
    let old_inner = c1.lock(name).reentrant_as(owner).try_acquire().unwrap();
    server.cmd::<i64>(&["DEL", name]);
    let new = c2.lock(name).reentrant_as(owner).try_acquire().unwrap();
    assert_ne!(new.token(), old_outer.token());
    assert!(new.fencing_token() > old_outer.fencing_token());
    let rejoined = c1.lock(name).reentrant_as(owner).try_acquire().unwrap();
    assert_eq!(rejoined.token(), new.token());
    assert_eq!(rejoined.fencing_token(), new.fencing_token());
    assert!(rejoined.is_held());
    assert_eq!(old_inner.release().unwrap_err().kind(), ErrorKind::NotHeld);
    assert_eq!(old_outer.release().unwrap_err().kind(), ErrorKind::NotHeld);
    assert_eq!(
        c1.inspect(name).unwrap().reentrant,
        Some((owner.to_owned(), 2)),
        "the new acquisition's two holds are intact"
    );
    rejoined.release().unwrap();
    assert_eq!(server.get(name).as_deref(), Some(new.token()));
    new.release().unwrap();
    assert!(!exists(&server, name));
    assert!(!exists(&server, "redlease:holds:{handover}"));
}

/// Attacks a re-entry after the lock expired under its guard (a fixed lease that ran out):
/// the same thread's next acquire must take the lock afresh (a new token, a larger fencing
/// token, one hold), not join the dead lease, and the old guard's release must report
/// `NotHeld` and give back nothing of the new acquisition.
#[test]
fn a_reentry_after_the_lock_expired_takes_it_afresh() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let old = c
        .lock("expired-reentry")
        .reentrant()
        .ttl(Duration::from_millis(100))
        .renew(false)
        .try_acquire()
        .unwrap();
    assert!(eventually(Duration::from_secs(2), || !exists(
        &server,
        "expired-reentry"
    )));
    assert!(!exists(&server, "redlease:holds:{expired-reentry}"));
    let new = c.lock("expired-reentry").reentrant().try_acquire().unwrap();
    assert_ne!(new.token(), old.token());
    assert!(new.fencing_token() > old.fencing_token());
    assert!(new.is_held());
    assert_eq!(old.release().unwrap_err().kind(), ErrorKind::NotHeld);
    let info = c.inspect("expired-reentry").unwrap();
    assert_eq!(
        info.reentrant.as_ref().map(|(_, n)| *n),
        Some(1),
        "{info:?}"
    );
    new.release().unwrap();
    assert!(!exists(&server, "expired-reentry"));
}

/// Attacks the renewal of a lease shared by two holds after one guard's release: the
/// first guard (the one whose token is the key's) is released; the lease keeps being
/// renewed for the second over two ttls, and the key goes with the second.
#[test]
fn a_shared_lease_is_renewed_after_the_first_guard_is_released() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let ttl = Duration::from_secs(1);
    let first = c
        .lock("shared-renewal")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let second = c
        .lock("shared-renewal")
        .reentrant()
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let token = first.token().to_owned();
    first.release().unwrap();
    std::thread::sleep(ttl * 2);
    assert!(second.is_held());
    assert_eq!(
        server.get("shared-renewal").as_deref(),
        Some(token.as_str())
    );
    second.release().unwrap();
    assert!(!exists(&server, "shared-renewal"));
}

/// Attacks the withdrawal of a re-entry whose request (not its reply) is delayed past the
/// I/O timeout (1.5 s against 1 s): the withdrawal reaches Redis first and finds nothing;
/// the late re-entry then adds a hold nobody will give back. The lock then outlives its
/// last guard, but no longer than the ttl (the documented bound of a late request), and a
/// stranger gets it.
#[test]
fn a_late_reentry_hold_lapses_within_its_ttl_after_every_guard_is_gone() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let c = quick_client(&proxy.url(), 1000);
    let stranger = client(&server.url());
    let owner = "job-late-7f8e9d0c-1b2a-4394-8576-a1b2c3d4e5f6";
    let ttl = Duration::from_millis(1000);
    let first = c
        .lock("late")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let rule = proxy.on_request(
        owner.as_bytes(),
        1,
        Action::DelayRequest(Duration::from_millis(1500)),
    );
    let err = c
        .lock("late")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire()
        .map(drop)
        .unwrap_err();
    assert!(err.outcome_unknown(), "{err}");
    assert_eq!(proxy.matched(rule), 1);
    // Wait for the late re-entry to run (its hold is the second).
    let late_ran = eventually(Duration::from_secs(5), || {
        c.inspect("late").unwrap().reentrant.map(|(_, n)| n) == Some(2)
    });
    first.release().unwrap();
    let gone_at = Instant::now();
    assert!(
        eventually(ttl + Duration::from_millis(1500), || !exists(
            &server, "late"
        )),
        "the lock outlived its last guard by more than its ttl (the late re-entry ran: \
         {late_ran})"
    );
    assert!(gone_at.elapsed() <= ttl + Duration::from_millis(1500));
    stranger
        .lock("late")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
}

/// Attacks the options of a re-entry that joins a shared lease: its `on_lost` callback.
/// The key is deleted by an operator; the renewal finds the lock lost, and every hold that
/// asked to be told must be told. The joined hold's callback is silently dropped (only the
/// first hold's lease, and so its callback, exist).
///
/// Found: the on_lost callback of a re-entry that joins a shared lease is never called
/// (fixed).
#[test]
fn a_joined_reentrys_lost_callback_is_called() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let ttl = Duration::from_secs(1);
    let outer_told = Arc::new(AtomicUsize::new(0));
    let inner_told = Arc::new(AtomicUsize::new(0));
    let outer = {
        let told = outer_told.clone();
        c.lock("told")
            .reentrant()
            .ttl(ttl)
            .on_lost(move |_| {
                told.fetch_add(1, Ordering::SeqCst);
            })
            .try_acquire()
            .unwrap()
    };
    let inner = {
        let told = inner_told.clone();
        c.lock("told")
            .reentrant()
            .ttl(ttl)
            .on_lost(move |_| {
                told.fetch_add(1, Ordering::SeqCst);
            })
            .try_acquire()
            .unwrap()
    };
    server.cmd::<i64>(&["DEL", "told"]);
    assert!(eventually(Duration::from_secs(2), || outer_told
        .load(Ordering::SeqCst)
        == 1));
    assert_eq!(inner.lost_reason(), Some(LostReason::NotHeld));
    let inner_called = || inner_told.load(Ordering::SeqCst) >= 1;
    assert!(
        eventually(Duration::from_secs(2), inner_called),
        "the inner hold's on_lost callback was never called, though its guard reports the loss"
    );
    assert_eq!(inner_told.load(Ordering::SeqCst), 1);
    drop((outer, inner));
}

/// A released hold of a reentrant lock is never told of a later loss of the lease the
/// other holds share: its `on_lost` (in C, with a `user_data` the caller may free once the
/// hold is released) was once called after its release had returned.
#[test]
fn a_released_hold_is_never_told_of_a_later_loss() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let told = Arc::new(Mutex::new(Vec::new()));
    let hold = |which: &'static str| {
        let told = told.clone();
        client
            .lock("released-hold")
            .reentrant()
            .ttl(Duration::from_millis(300))
            .on_lost(move |_| told.lock().unwrap().push(which))
            .try_acquire()
            .unwrap()
    };
    let first = hold("first");
    let second = hold("second");
    second.release().unwrap();
    server.cmd::<i64>(&["DEL", "released-hold"]);
    assert!(eventually(Duration::from_secs(5), || !told
        .lock()
        .unwrap()
        .is_empty()));
    std::thread::sleep(Duration::from_millis(200)); // any other report arrives meanwhile
    assert_eq!(*told.lock().unwrap(), vec!["first"]);
    assert!(first.release().is_err());
}

/// Reentrant holds (one owner, two threads) share one lease and renewal: one thread
/// extends its guard in a loop while the renewal runs and the other releases its own
/// guard: that release is `Ok` and leaves the lock held (key, token, `is_held`); the
/// extends keep succeeding; the last release is `Ok`, deletes the key, and an extend
/// through a released guard answers `NotHeld`.
#[test]
fn reentrant_guards_extending_and_releasing_from_two_threads_stay_consistent() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(1000)).unwrap();
    let name = "reentrant-two";
    let owner = "final-attacker-owner-5f1c2b7e";
    let first = client
        .lock(name)
        .ttl(Duration::from_millis(600))
        .reentrant_as(owner)
        .try_acquire()
        .unwrap();
    let second = client
        .lock(name)
        .ttl(Duration::from_millis(600))
        .reentrant_as(owner)
        .try_acquire()
        .unwrap();
    assert_eq!(first.token(), second.token());
    let stop = Arc::new(AtomicBool::new(false));
    let extender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut extends = 0;
            while !stop.load(Ordering::SeqCst) {
                match first.extend(Duration::from_millis(600)) {
                    Ok(()) => extends += 1,
                    Err(e) => failures.push(e.to_string()),
                }
                std::thread::sleep(Duration::from_millis(7));
            }
            (first, extends, failures)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    second
        .release()
        .expect("a hold of a lock held without a break");
    std::thread::sleep(Duration::from_millis(1000));
    let key_after_first_release = server.get(name);
    stop.store(true, Ordering::SeqCst);
    let (first, extends, failures) = extender.join().unwrap();
    assert!(failures.is_empty(), "extends failed: {failures:?}");
    assert!(extends > 10, "only {extends} extends");
    assert!(first.is_held(), "the remaining hold lost its lease");
    assert_eq!(key_after_first_release.as_deref(), Some(first.token()));
    let token = first.token().to_owned();
    first
        .release()
        .expect("the last hold, held without a break");
    assert!(
        !server.cmd::<bool>(&["EXISTS", name]),
        "the key outlived its last hold"
    );
    // A new holder gets it at once, with another token.
    let next = client.lock(name).try_acquire().unwrap();
    assert_ne!(next.token(), token);
    next.release().unwrap();
}

/// A re-entry whose reply comes back only after the lease it set has run out holds
/// nothing this client can rely on: the acquire gives its hold back (in the background)
/// and fails as busy, as a grant confirmed too late does. (It used to return `Ok` with a guard that was never
/// held.) The owner's first hold, renewed by another client, is untouched.
#[test]
fn a_reentry_answered_after_its_lease_ran_out_is_given_back_and_fails() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let owner = "owner-of-a-late-reentry";
    let ttl = Duration::from_millis(300);
    let first = client(&server.url())
        .lock("late-reentry")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let late = client(&proxy.url());
    // Load the scripts while replies are on time.
    late.lock("warm-up")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    proxy.set_reply_delay(2 * ttl);
    let reentry = late
        .lock("late-reentry")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire();
    proxy.set_reply_delay(Duration::ZERO);
    match reentry {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Busy, "{e}"),
        Ok(guard) => panic!(
            "a re-entry answered after its {ttl:?} lease returned a guard (held: {})",
            guard.is_held()
        ),
    }
    // Given back in the background: the acquire's bounds were spent waiting for the reply.
    assert!(
        eventually(Duration::from_secs(5), || {
            late.inspect("late-reentry").unwrap().reentrant == Some((owner.to_owned(), 1))
        }),
        "the late hold was given back: {:?}",
        late.inspect("late-reentry")
    );
    assert!(first.is_held());
    first.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "late-reentry"]));
}
