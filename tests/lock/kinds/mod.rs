//! Lock kinds besides the plain mutex (issue 15): reentrant locks, counting semaphores and
//! read-write locks, each in a module of its own, against real servers, with interval logs
//! checked offline and the fault proxy. A name is one kind at a time: the tests here.
//!
//! Tests named "Attacks ..." say what they attack; those that found a bug say "Found:" and
//! what was wrong (they failed on the code they were written against).

mod reentrant;
mod rwlock;
mod semaphore;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlease::{ErrorKind, LostReason};

use crate::support::Rng as Jitter;
use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, client};

#[test]
fn a_name_in_use_by_one_kind_refuses_the_others_clearly() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mutex = client.lock("shared-name").try_acquire().unwrap();
    for err in [
        client
            .semaphore("shared-name", 2)
            .try_acquire()
            .unwrap_err(),
        client
            .rwlock("shared-name")
            .read()
            .try_acquire()
            .unwrap_err(),
        client
            .rwlock("shared-name")
            .write()
            .try_acquire()
            .unwrap_err(),
    ] {
        assert!(err.message().contains("another kind of lock"), "{err}");
    }
    assert!(mutex.is_held());
    mutex.release().unwrap();
    let permit = client.semaphore("shared-name", 2).try_acquire().unwrap();
    let err = client.lock("shared-name").try_acquire().unwrap_err();
    assert!(err.message().contains("another kind of lock"), "{err}");
    permit.release().unwrap();
}

/// Attacks the names across kinds: a name held as a reentrant lock, a semaphore or a
/// read-write lock refuses the other kinds with a clear error and changes nothing (no
/// holds record, no fencing token drawn, the holder still holds); a reentrant lock and a
/// plain mutex on one name exclude each other (both are strings), both ways.
#[test]
fn names_across_kinds_with_reentrant_locks_refuse_cleanly_and_change_nothing() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let fence = |name: &str| -> Option<String> {
        server.cmd(&["GET", &format!("redlease:fence:{{{name}}}")])
    };
    let permit = c.semaphore("k-sem", 3).try_acquire().unwrap();
    let reader = c.rwlock("k-rw").read().try_acquire().unwrap();
    let writer_name = "k-rww";
    let writer = c.rwlock(writer_name).write().try_acquire().unwrap();
    for name in ["k-sem", "k-rw", writer_name] {
        let before = fence(name);
        for owner in [None, Some("job-kinds-1")] {
            let builder = c.lock(name);
            let builder = match owner {
                Some(o) => builder.reentrant_as(o),
                None => builder.reentrant(),
            };
            let err = builder.try_acquire().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Server, "{name}: {err}");
            assert!(err.message().contains("another kind"), "{name}: {err}");
            let err = c
                .lock(name)
                .reentrant()
                .acquire_timeout(Duration::from_millis(200))
                .unwrap_err();
            assert!(err.message().contains("another kind"), "{name}: {err}");
        }
        assert_eq!(fence(name), before, "{name}: a fencing token was drawn");
        assert!(
            !exists(&server, &format!("redlease:holds:{{{name}}}")),
            "{name}"
        );
    }
    assert!(permit.is_held() && reader.is_held() && writer.is_held());
    drop((permit, reader, writer));
    let re = c.lock("k-re").reentrant().try_acquire().unwrap();
    let before = fence("k-re");
    for err in [
        c.semaphore("k-re", u32::MAX).try_acquire().unwrap_err(),
        c.rwlock("k-re").read().try_acquire().unwrap_err(),
        c.rwlock("k-re").write().try_acquire().unwrap_err(),
    ] {
        assert!(err.message().contains("another kind"), "{err}");
    }
    assert_eq!(fence("k-re"), before);
    // Another thread's plain mutex is refused (busy), and so is another owner.
    let other = c.clone();
    let busy = std::thread::spawn(move || {
        (
            other
                .lock("k-re")
                .try_acquire()
                .map(drop)
                .unwrap_err()
                .kind(),
            other
                .lock("k-re")
                .reentrant()
                .try_acquire()
                .map(drop)
                .unwrap_err()
                .kind(),
        )
    })
    .join()
    .unwrap();
    assert_eq!(busy, (ErrorKind::Busy, ErrorKind::Busy));
    re.release().unwrap();
    let plain = c.lock("k-re").try_acquire().unwrap();
    let err = c.lock("k-re").reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    plain.release().unwrap();
}

// Shared by the modules of each kind: checks on the server, interval logs checked offline,
// and a schedule of faults.

/// A name that switches kind while a waiter of the old kind is still registered (it
/// vanished without withdrawing) stays blocked for at most one grace (the I/O timeout +
/// 0.5 s): the release hands the lock to that waiter, and the grant nobody takes lapses.
#[test]
fn a_name_switching_kind_under_a_vanished_waiter_is_blocked_for_at_most_a_grace() {
    let server = RedisServer::start();
    let client = crate::support::client(&server.url());
    crate::support::grant_to_a_vanished_waiter(&server, &client, "switching");
    let started = std::time::Instant::now();
    let permit = loop {
        match client.semaphore("switching", 2).try_acquire() {
            Ok(permit) => break permit,
            Err(e) => {
                assert!(e.message().contains("another kind"), "{e}");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "still blocked: {e}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let grace = Duration::from_secs(2) + Duration::from_millis(500);
    assert!(
        started.elapsed() <= grace + Duration::from_millis(500),
        "blocked for {:?}, more than the grace of {grace:?}",
        started.elapsed()
    );
    permit.release().unwrap();
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

/// Whether some interval of `a` overlaps some interval of `b`; the first such pair.
fn cross_overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    for &x in a {
        for &y in b {
            if x.0 < y.1 && y.0 < x.1 {
                return Some((x, y));
            }
        }
    }
    None
}

/// The interval a holder may believe it held `guard` for: from `start` (just after the
/// acquire returned) to `end`, but never past the lease's local deadline as it stood at
/// the start (`remaining_at_start`); `None` when the guard was not held at the start.
fn believed(start: u64, remaining_at_start: Duration, end: u64, held_at_end: bool) -> (u64, u64) {
    let deadline = start + remaining_at_start.as_nanos() as u64;
    if held_at_end {
        (start, end)
    } else {
        (start, end.min(deadline))
    }
}

/// Injects a schedule of faults through `proxy` until `stop`: delayed replies of scripts,
/// dropped replies, replies lost to a reset, requests that never run, a short blackhole
/// and a reset of every connection.
fn faults(proxy: Arc<Proxy>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut round = 0;
        let pause = |ms| std::thread::sleep(Duration::from_millis(ms));
        while !stop.load(Ordering::SeqCst) {
            match round % 6 {
                0 => {
                    proxy.on_request(
                        b"EVALSHA",
                        20,
                        Action::DelayReply(Duration::from_millis(60)),
                    );
                }
                1 => {
                    proxy.on_request(b"EVALSHA", 2, Action::DropReply);
                }
                2 => {
                    proxy.on_request(b"EVALSHA", 2, Action::ResetBeforeReply);
                }
                3 => {
                    proxy.on_request(b"EVALSHA", 2, Action::ResetBeforeRequest);
                }
                4 => {
                    proxy.blackhole(true);
                    pause(150);
                    proxy.blackhole(false);
                }
                _ => proxy.reset_all(),
            }
            round += 1;
            pause(250);
            proxy.clear_rules();
        }
        proxy.clear_rules();
        proxy.blackhole(false);
        round
    })
}

/// One hold as its holder believed it: `(start, end)` in ns, and who.
type Log = Arc<Mutex<Vec<(u64, u64, usize)>>>;

/// A mutex waiter whose name was taken meanwhile by another kind (the key deleted, or its
/// holder's lease run out, while the waiter was blocked) gets the other-kind error at its
/// next attempt, and leaves that lock alone: it used to overwrite it, and a second holder
/// of a one-permit semaphore got in beside the first.
#[test]
fn a_mutex_waiter_never_overwrites_a_name_another_kind_took_meanwhile() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let holder = client.lock("switch").try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock("switch")
                .acquire_timeout(Duration::from_secs(10))
                .map(drop)
        })
    };
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        client.inspect("switch").unwrap().waiters == 1
    }));
    server.cmd::<i64>(&["DEL", "switch"]);
    let permit = client.semaphore("switch", 1).try_acquire().unwrap();
    let err = waiter.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.message().contains("another kind"), "{err}");
    assert_eq!(server.cmd::<String>(&["TYPE", "switch"]), "zset");
    assert!(permit.is_held());
    assert!(
        client
            .semaphore("switch", 1)
            .try_acquire()
            .unwrap_err()
            .is_busy()
    );
    permit.release().unwrap();
    drop(holder);
}

/// A release of one kind hands its hold to the first direct registration in the queue the
/// kinds share, which may be a waiter of another kind registered before the name switched
/// kind: the semaphore's count still holds (the permit is counted), and the waiter is told
/// at its first renewal that its lock is not held, not left to believe it until its lease
/// runs out.
#[test]
fn a_waiter_handed_a_hold_of_another_kind_is_told_at_its_renewal_that_it_is_not_held() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let holder = client.lock("switch").try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let guard = client
                .lock("switch")
                .ttl(Duration::from_secs(3))
                .acquire_timeout(Duration::from_secs(10))
                .unwrap();
            guard.lost().recv_timeout(Duration::from_secs(10))
        })
    };
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        client.inspect("switch").unwrap().waiters == 1
    }));
    server.cmd::<i64>(&["DEL", "switch"]);
    let permit = client.semaphore("switch", 1).try_acquire().unwrap();
    permit.release().unwrap();
    assert_eq!(server.cmd::<String>(&["TYPE", "switch"]), "zset");
    assert!(
        client
            .semaphore("switch", 1)
            .try_acquire()
            .unwrap_err()
            .is_busy(),
        "the permit handed to the mutex waiter is counted"
    );
    assert_eq!(waiter.join().unwrap(), Ok(LostReason::NotHeld));
    drop(holder);
}

/// A hold whose name was deleted (as an expiry would) and then taken by another kind: its
/// release says `NotHeld`, as its extend does, for every kind on either side (not a server
/// error about the key's type), and leaves the other kind's hold alone.
#[test]
fn a_release_after_the_name_changed_kind_is_not_held() {
    type Take = fn(&redlease::Client, &str) -> redlease::LockGuard;
    const TTL: Duration = Duration::from_secs(30);
    let ttl = TTL;
    let mutex: Take = |c, n| c.lock(n).ttl(TTL).renew(false).try_acquire().unwrap();
    let reentrant: Take = |c, n| {
        let lock = c.lock(n).reentrant().ttl(TTL).renew(false);
        lock.try_acquire().unwrap()
    };
    let permit: Take = |c, n| {
        c.semaphore(n, 2)
            .ttl(TTL)
            .renew(false)
            .try_acquire()
            .unwrap()
    };
    let read: Take = |c, n| {
        c.rwlock(n)
            .read()
            .ttl(TTL)
            .renew(false)
            .try_acquire()
            .unwrap()
    };
    let write: Take = |c, n| {
        c.rwlock(n)
            .write()
            .ttl(TTL)
            .renew(false)
            .try_acquire()
            .unwrap()
    };
    let server = RedisServer::start();
    let client = client(&server.url());
    let mut wrong = Vec::new();
    for (what, old, new) in [
        ("mutex, then semaphore", mutex, permit),
        ("reentrant, then semaphore", reentrant, permit),
        ("semaphore, then mutex", permit, mutex),
        ("read, then mutex", read, mutex),
        ("write, then mutex", write, mutex),
        ("mutex, then write", mutex, write),
        ("semaphore, then read", permit, read),
    ] {
        let name = format!("kind-switch:{what}");
        let first = old(&client, &name);
        server.cmd::<i64>(&["DEL", &name]);
        let second = new(&client, &name);
        let extend = first.extend(ttl).map_err(|e| e.kind());
        let release = first.release().map_err(|e| e.kind());
        if extend != Err(ErrorKind::NotHeld) || release != Err(ErrorKind::NotHeld) {
            wrong.push(format!("{what}: extend {extend:?}, release {release:?}"));
        }
        if second.extend(ttl).is_err() {
            wrong.push(format!("{what}: the other kind's hold was damaged"));
        }
        second.release().unwrap();
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A semaphore waiter whose name is deleted and taken by a mutex while it waits: its wait
/// ends (its give-back meets a key of another kind), it holds nothing, its registration
/// is gone from the queue the kinds share, and the mutex's hold is intact.
#[test]
fn a_waiter_whose_name_changed_kind_withdraws_cleanly() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let ttl = Duration::from_secs(30);
    let holder = client.semaphore("withdraw", 1).ttl(ttl).renew(false);
    let holder = holder.try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let permit = client.semaphore("withdraw", 1).ttl(ttl).renew(false);
            permit
                .acquire_timeout(Duration::from_millis(1_500))
                .map(std::mem::forget)
                .map_err(|e| e.kind())
        })
    };
    let queue = "redlease:queue:{withdraw}";
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        server.cmd::<i64>(&["ZCARD", queue]) == 1
    }));
    server.cmd::<i64>(&["DEL", "withdraw"]);
    let mutex = client
        .lock("withdraw")
        .ttl(ttl)
        .renew(false)
        .try_acquire()
        .unwrap();
    let outcome = waiter.join().unwrap();
    assert!(outcome.is_err(), "the waiter got a permit");
    assert_eq!(
        server.cmd::<i64>(&["ZCARD", queue]),
        0,
        "its registration stayed"
    );
    assert_eq!(
        holder.release().map_err(|e| e.kind()),
        Err(ErrorKind::NotHeld)
    );
    mutex.extend(ttl).unwrap();
    mutex.release().unwrap();
}
