//! Attack on the recent lease-gate, release-honesty and batched-renewal changes
//! (e847b7e, 704eabf, 6df3b1e, 594f767, f12bf42): late and dropped replies, a paused
//! server, foreign writes, script flushes, reentrant holds and hostile timing.
//!
//! Timings are never pass/fail criteria except as generous bounds.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind, LostReason};
use support::proxy::{Action, Proxy};
use support::{RedisServer, eventually, options, within};

/// Samples `is_held()` on a thread until `stop`; returns whether it was ever seen false and
/// then true again (a lease that came back after it had ended).
fn watch_for_flip(
    guard: Arc<redlease::LockGuard>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(bool, bool)> {
    std::thread::spawn(move || {
        let mut seen_false = false;
        let mut flipped = false;
        while !stop.load(Ordering::SeqCst) {
            let held = guard.is_held();
            if !held {
                seen_false = true;
            } else if seen_false {
                flipped = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (seen_false, flipped)
    })
}

// ---------------------------------------------------------------------------------------
// Breaks the attack found (each of these failed before its fix)
// ---------------------------------------------------------------------------------------

/// One node's renewals go through a single batching thread that runs one batch at a time.
/// Before the fix, a batch held up by a slow reply (here: lock X's renewal reply is 3 s
/// late, within the 5 s I/O timeout and within X's own lease) kept every renewal queued
/// behind it waiting, holding its lock's gate: lock Y, taken meanwhile with a 1.5 s lease
/// (half of X's stall) on a server that answers Y at once, was neither renewed nor reported
/// lost at its deadline. Now a renewal that waits in the queue is taken back by its thread
/// and sent on its own, and a queued one whose cutoff passes is completed unsent.
///
/// Promise: a lock's renewal either succeeds or reports the loss on time (at the local
/// deadline); never a lock neither renewed nor reported lost. Here the server answers, so
/// it succeeds.
#[test]
fn a_slow_batch_of_one_lock_does_not_hold_up_the_renewal_of_another() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    // X's first renewal (about 2 s in) runs on the server at once; its reply comes 3 s late.
    let slow = support::stall_batcher(&proxy, &client, "stall-slow", Duration::from_secs(3));
    let taken = Instant::now();
    let quick = client
        .lock("stall-quick")
        .ttl(Duration::from_millis(1500))
        .try_acquire()
        .unwrap();
    let lost = quick.lost();
    let outcome = lost.recv_timeout(Duration::from_secs(4));
    let late = taken.elapsed();
    let held_after = quick.is_held();
    let renewed_on_server = server.pttl("stall-quick");
    drop(quick);
    drop(slow);
    // The server answers Y at once: Y's renewal, stuck behind X's batch, is taken back
    // and sent on its own, so Y stays held through X's 3 s stall. (Before the fix Y was
    // reported lost only when X's batch ended, seconds after its deadline.)
    match outcome {
        Err(_) => assert!(held_after, "Y neither lost nor held after 4 s"),
        Ok(reason) => panic!(
            "Y (1.5 s lease, server answering it at once) was lost ({reason:?}) {late:?} \
             after it was taken: its renewal waited behind X's batch (server PTTL of Y then: \
             {renewed_on_server} ms)"
        ),
    }
    assert!(renewed_on_server > 0, "Y's key is gone on the server");
}

/// As above, but Y's own requests are slow too (its renewal, batched or on its own, gets
/// no reply before its deadline): Y's loss is reported at its deadline, not when X's slow
/// batch ends (4 s) nor when Y's own late reply comes (4 s after its renewal).
#[test]
fn a_slow_batch_of_one_lock_does_not_hold_up_the_loss_report_of_another() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    // X's first renewal (about 2 s in) runs on the server at once; its reply comes 4 s late.
    let slow = support::stall_batcher(&proxy, &client, "stall-slow", Duration::from_secs(4));
    let quick = client
        .lock("stall-quick")
        .ttl(Duration::from_millis(600))
        .try_acquire()
        .unwrap();
    let taken = Instant::now();
    // From now on every request about Y gets its reply 4 s late.
    let _slow_y = proxy.on_request(
        b"stall-quick",
        100,
        Action::DelayReply(Duration::from_secs(4)),
    );
    let reason = quick.lost().recv_timeout(Duration::from_secs(8));
    let late = taken.elapsed();
    drop(quick);
    drop(slow);
    assert!(reason.is_ok(), "Y was never reported lost");
    // A margin of almost 2 s past the deadline for a loaded host; a loss reported with X's
    // batch or Y's late reply would come over 3.5 s in.
    assert!(
        late < Duration::from_millis(2500),
        "Y (600 ms lease) was reported lost {late:?} after it was taken"
    );
}

/// What the extend's thread returns: its result, then `is_held()` and `remaining()` right
/// after it.
type ExtendOutcome = (redlease::Result<()>, bool, Duration);

/// Sets up a renewed lock of `ttl_ms` whose extend to `extend_ms` has its reply held back
/// `reply_delay` (the request runs on the server at once); returns the guard, the moment
/// the extend was called, and the extend's thread.
fn lock_with_late_extend(
    proxy: &Proxy,
    client: &Client,
    name: &str,
    ttl_ms: u64,
    extend_ms: u64,
    reply_delay: Duration,
) -> (
    Arc<redlease::LockGuard>,
    Instant,
    std::thread::JoinHandle<ExtendOutcome>,
) {
    let guard = Arc::new(
        client
            .lock(name)
            .ttl(Duration::from_millis(ttl_ms))
            .try_acquire()
            .unwrap(),
    );
    // Scripts loaded, so that the held reply is the extend's own.
    guard.extend(Duration::from_millis(ttl_ms)).unwrap();
    let needle = extend_ms.to_string();
    let rule = proxy.on_request(needle.as_bytes(), 1, Action::DelayReply(reply_delay));
    let called = Instant::now();
    let extender = {
        let guard = guard.clone();
        std::thread::spawn(move || {
            let result = guard.extend(Duration::from_millis(extend_ms));
            (result, guard.is_held(), guard.remaining())
        })
    };
    assert!(
        eventually(Duration::from_secs(2), || proxy.matched(rule) == 1),
        "the extend was not sent"
    );
    (guard, called, extender)
}

/// `extend(1777 ms)` runs on the server at once but its reply comes 3 s later (within the
/// I/O timeout). The key expires on the server 1.78 s after the extend, and another client
/// takes the lock. Before the fix the first holder's `extend` then returned `Ok`, after
/// the lease it set had already ended, while another client held the lock.
///
/// Promise: a grant is believed only after it was confirmed against the key, and every
/// local deadline is conservative; at no moment may two callers both be told they hold
/// the lock.
#[test]
fn an_extend_whose_reply_comes_after_its_lease_ended_is_not_reported_as_success() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    let name = "late-extend-ok";
    let (guard, called, extender) =
        lock_with_late_extend(&proxy, &client, name, 1000, 1777, Duration::from_secs(3));
    // The key expires on the server ~1.78 s after the extend ran; someone else takes it.
    let other = Client::open(&server.url()).unwrap();
    let second = other
        .lock(name)
        .acquire_timeout(Duration::from_secs(4))
        .expect("the key expired on the server: another client takes the lock");
    let second_at = called.elapsed();
    let (result, held_after, remaining_after) = extender.join().unwrap();
    let returned_at = called.elapsed();
    let second_held = second.is_held();
    let owner = server.get(name);
    drop(second);
    drop(guard);
    assert!(second_held);
    assert!(
        result.is_err() || (held_after && !remaining_after.is_zero()),
        "extend returned {result:?} at {returned_at:?} while another client held the lock \
         (taken at {second_at:?}, key owned by {owner:?}); right after it is_held() = \
         {held_after}, remaining() = {remaining_after:?}"
    );
}

/// As above (without a second client): while the extend's reply is late, the lease's local
/// deadline (1 s) passes and `is_held()` turns false. Before the fix `lost()` fired only
/// when the extend's reply came (3 s later): the renewal thread that finds the deadline
/// passed waits for the extend in flight, and the extend was cut off only by the I/O
/// timeout, not at the lease's deadline.
///
/// Promise: a loss is reported on time (at the local deadline).
#[test]
fn the_loss_is_reported_at_the_deadline_while_an_extend_reply_is_late() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    let name = "late-extend-lost";
    let (guard, called, extender) =
        lock_with_late_extend(&proxy, &client, name, 1000, 1777, Duration::from_secs(3));
    let lost = guard.lost();
    let reason = lost.recv_timeout(Duration::from_secs(8));
    let lost_at = called.elapsed();
    let (result, _, _) = extender.join().unwrap();
    drop(guard);
    assert!(reason.is_ok(), "never reported lost (extend: {result:?})");
    // The lease assumed at most 1 s from before the extend; the key itself expired on the
    // server 1.78 s after it. Lost reported 3 s in (with the reply) is after another holder
    // could be in; the bound leaves a loaded host 1.5 s past the deadline.
    assert!(
        lost_at < Duration::from_millis(2500),
        "lost() fired {lost_at:?} after the extend was called (deadline ~1 s, server expiry \
         ~1.78 s, extend reply at 3 s; extend returned {result:?})"
    );
}

/// An extend to 30 s whose reply is 2 s late, on a renewed 1 s lock: `is_held()` turns
/// false at the 1 s deadline. Before the fix it turned true again when the reply came (the
/// server key held the token throughout, but a holder that saw `is_held() == false` and
/// stopped could see it held again).
///
/// Promise (as stated): once `is_held()` is false the lock is never silently re-taken.
#[test]
fn is_held_never_turns_true_again_after_it_turned_false() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    let (guard, _, extender) = lock_with_late_extend(
        &proxy,
        &client,
        "flip",
        1000,
        30_017,
        Duration::from_secs(2),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_for_flip(guard.clone(), stop.clone());
    let (result, held_after, _) = extender.join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let (seen_false, flipped) = watcher.join().unwrap();
    drop(guard);
    assert!(
        !flipped,
        "is_held() was false (seen_false = {seen_false}) and then true again: extend \
         returned {result:?}, is_held() right after = {held_after}"
    );
}

// ---------------------------------------------------------------------------------------
// Attacks that held (regression tests)
// ---------------------------------------------------------------------------------------

/// A release while a batched renewal is in flight whose reply never comes: the release
/// waits for it (bounded by the I/O timeout), then releases; the lock was held without a
/// break (the renewal's outcome unknown only lowers the deadline), so `Ok`, and the key is
/// gone. Nothing extends the key after the release.
#[test]
fn a_release_during_a_batched_renewal_whose_reply_is_dropped_is_bounded_and_honest() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(600)).unwrap();
    let name = "drop-batch";
    let guard = client
        .lock(name)
        .ttl(Duration::from_millis(3011))
        .try_acquire()
        .unwrap();
    let rule = proxy.on_request(b"3011", 1, Action::DropReply);
    assert!(
        eventually(Duration::from_secs(4), || proxy.matched(rule) == 1),
        "the renewal was not sent"
    );
    let held = guard.is_held();
    let started = Instant::now();
    let released = within(Duration::from_secs(10), move || guard.release());
    let took = started.elapsed();
    assert!(held);
    assert!(took < Duration::from_secs(3), "release took {took:?}");
    released.expect("held without a break: Ok");
    assert!(!server.cmd::<bool>(&["EXISTS", name]), "key still there");
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        !server.cmd::<bool>(&["EXISTS", name]),
        "something recreated or extended the key after the release"
    );
}

/// Redis paused (SIGSTOP) while a renewed lock is held, resumed after its deadline: the
/// loss is reported near the deadline (not at the resume), `is_held()` is false by the
/// deadline, a later extend fails `NotHeld`, and the release is bounded and reports
/// `NotHeld`. Calls made while the server is paused return within their bounds. (The I/O
/// timeout is longer than the lease: a renewal is cut off at the lease's deadline anyway,
/// and the release just after the resume has time to be answered.)
#[test]
fn a_paused_server_reports_the_loss_on_time_and_a_loss_is_final() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(1000)).unwrap();
    let guard = client
        .lock("paused")
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let lost = guard.lost();
    let deadline_left = guard.remaining();
    server.pause();
    let paused = Instant::now();
    let reason = lost.recv_timeout(Duration::from_secs(5));
    let lost_after = paused.elapsed();
    let held = guard.is_held();
    // A call while paused is bounded.
    let started = Instant::now();
    let extended = guard.extend(Duration::from_millis(900));
    let extend_took = started.elapsed();
    std::thread::sleep(Duration::from_millis(1200));
    server.resume();
    let extended_after = guard.extend(Duration::from_millis(900));
    let released = within(Duration::from_secs(5), move || guard.release());
    assert_eq!(reason, Ok(LostReason::Unreachable));
    assert!(
        lost_after < deadline_left + Duration::from_millis(1200),
        "lost {lost_after:?} after the pause, deadline was {deadline_left:?} away"
    );
    assert!(!held);
    assert!(
        matches!(&extended, Err(e) if e.kind() == ErrorKind::NotHeld),
        "{extended:?}"
    );
    assert!(extend_took < Duration::from_secs(2), "{extend_took:?}");
    assert!(
        matches!(&extended_after, Err(e) if e.kind() == ErrorKind::NotHeld),
        "extend after the resume: {extended_after:?}"
    );
    let err = released.unwrap_err();
    assert!(err.is_not_held(), "{err}");
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

/// A foreign `DEL` of the key between renewals: the next renewal (batched) finds the token
/// gone, the loss is reported (`NotHeld`), it is final (extend `NotHeld`, even once another
/// client holds the key), and the release reports `NotHeld` and leaves the other client's
/// key alone.
#[test]
fn a_foreign_delete_between_renewals_is_a_final_loss() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(500)).unwrap();
    let name = "foreign-del";
    let guard = client
        .lock(name)
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    std::thread::sleep(Duration::from_millis(350));
    let _: i64 = server.cmd(&["DEL", name]);
    let reason = lost.recv_timeout(Duration::from_secs(3));
    assert_eq!(reason, Ok(LostReason::NotHeld));
    assert!(!guard.is_held());
    let other = Client::open(&server.url()).unwrap();
    let second = other.lock(name).try_acquire().unwrap();
    let extended = guard.extend(Duration::from_millis(900));
    assert!(
        matches!(&extended, Err(e) if e.kind() == ErrorKind::NotHeld),
        "{extended:?}"
    );
    let err = guard.release().unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(server.get(name).as_deref(), Some(second.token()));
    assert!(second.is_held());
    second.release().unwrap();
}

/// Many locks of different ttls sharing batches; the scripts are flushed (the batched
/// EVALSHAs come back NOSCRIPT) and one lock's key is overwritten by a foreign write (its
/// renewal in a batch answers 0). Every other lock stays held and keeps being renewed on
/// the server; the overwritten one alone is lost, with `NotHeld`.
#[test]
fn a_script_flush_and_a_foreign_write_in_shared_batches_lose_only_the_overwritten_lock() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(800)).unwrap();
    // Each renewal after a flush costs a NOSCRIPT and a resend: the shortest lease leaves
    // 400 ms for it, time enough on a loaded host; every lock is renewed during the 1.5 s.
    let ttls = [600u64, 750, 900, 1200, 1500, 600, 750, 900];
    let guards: Vec<_> = ttls
        .iter()
        .enumerate()
        .map(|(i, ttl)| {
            client
                .lock(&format!("mix-{i}"))
                .ttl(Duration::from_millis(*ttl))
                .try_acquire()
                .unwrap()
        })
        .collect();
    let victim = guards[2].lost();
    for round in 0..6 {
        let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
        if round == 2 {
            let _: String = server.cmd(&["SET", "mix-2", "intruder", "PX", "60000"]);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let reason = victim.recv_timeout(Duration::from_secs(3));
    assert_eq!(reason, Ok(LostReason::NotHeld));
    assert_eq!(server.get("mix-2").as_deref(), Some("intruder"));
    for (i, guard) in guards.iter().enumerate() {
        if i == 2 {
            assert!(!guard.is_held());
            continue;
        }
        let key = format!("mix-{i}");
        assert!(
            guard.is_held(),
            "lock {key} (ttl {} ms) lost: {:?}",
            ttls[i],
            guard.lost_reason()
        );
        assert_eq!(server.get(&key).as_deref(), Some(guard.token()));
        assert!(server.pttl(&key) > 0);
    }
    for (i, guard) in guards.into_iter().enumerate() {
        let released = guard.release();
        if i == 2 {
            assert!(released.unwrap_err().is_not_held());
        } else {
            released.unwrap();
        }
    }
    assert_eq!(server.get("mix-2").as_deref(), Some("intruder"));
}

/// A release after a loss whose reply is dropped reports a connection error of unknown
/// outcome, never `NotHeld` nor `Ok` (and the script ran: the key is gone).
#[test]
fn a_release_after_a_loss_whose_reply_is_lost_reports_an_unknown_outcome() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(1000)).unwrap();
    // Loads the acquire, extend and release scripts: a dropped NOSCRIPT reply would keep
    // the renewals below from ever running.
    let warm = client.lock("warm").try_acquire().unwrap();
    warm.extend(Duration::from_secs(5)).unwrap();
    warm.release().unwrap();
    let name = "lost-then-dropped";
    let guard = client
        .lock(name)
        .ttl(Duration::from_millis(1733))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    let scripts_before = server.calls("evalsha");
    let rule = proxy.on_request(b"1733", 1000, Action::DropReply);
    lost.recv_timeout(Duration::from_secs(5)).expect("lost");
    assert!(proxy.matched(rule) >= 1);
    proxy.clear_rules();
    assert!(
        server.calls("evalsha") > scripts_before,
        "renewals ran on the server"
    );
    // They kept the key at least a third of the ttl past the local deadline; kept longer
    // (with the token they left), so that the release finds it however late this thread
    // gets here on a loaded host.
    let _: () = server.cmd(&["SET", name, guard.token(), "PX", "60000"]);
    let drop_release = proxy.on_request(b":handoff", 1, Action::DropReply);
    let err = guard.release().unwrap_err();
    assert_eq!(proxy.matched(drop_release), 1);
    assert!(err.is_unreachable() && err.outcome_unknown(), "{err}");
    assert!(!server.cmd::<bool>(&["EXISTS", name]), "the release ran");
}

/// Under `maxmemory` with `noeviction` and memory full (Redis 7 still runs a script's
/// `PEXPIRE`, refuses its `SET`s): renewals of several locks sharing batches keep every
/// lock held (and `is_held()` is never true while its key is gone); another client's
/// acquire is refused with an error, never a false grant; and each release's answer matches
/// the key: `Ok` only when the key is gone, an error otherwise.
#[test]
fn renewals_acquires_and_releases_under_maxmemory_stay_honest() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let client = Client::with_options(&server.url(), options(1000)).unwrap();
    // Each lock is renewed several times in the 3 s below, and any that was not would be
    // lost by then.
    let guards: Vec<_> = [1000u64, 1500, 2000]
        .iter()
        .enumerate()
        .map(|(i, ttl)| {
            client
                .lock(&format!("oom-{i}"))
                .ttl(Duration::from_millis(*ttl))
                .try_acquire()
                .unwrap()
        })
        .collect();
    let _: String = server.cmd(&["CONFIG", "SET", "maxmemory", "1000"]);
    let started = Instant::now();
    let mut violations = Vec::new();
    while started.elapsed() < Duration::from_millis(3000) {
        for (i, guard) in guards.iter().enumerate() {
            let held_before = guard.is_held();
            let key = format!("oom-{i}");
            let exists: bool = server.cmd(&["EXISTS", &key]);
            if held_before && !exists && guard.is_held() {
                violations.push(format!("{key} held while its key is gone"));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let other = Client::open(&server.url()).unwrap();
    let foreign = other.lock("oom-fresh").try_acquire();
    let mut releases = Vec::new();
    for (i, guard) in guards.into_iter().enumerate() {
        let held = guard.is_held();
        let released = guard.release();
        let exists: bool = server.cmd(&["EXISTS", &format!("oom-{i}")]);
        releases.push((i, held, released, exists));
    }
    let _: String = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        foreign.is_err(),
        "an acquire under OOM was granted: {:?}",
        foreign.map(|g| g.token().to_owned())
    );
    for (i, held, released, exists) in releases {
        assert!(held, "oom-{i} was not kept renewed");
        match released {
            Ok(()) => assert!(!exists, "oom-{i}: release Ok but the key remains"),
            Err(e) => assert!(
                !e.is_not_held(),
                "oom-{i}: held without a break, yet release said NotHeld: {e} (key exists: {exists})"
            ),
        }
    }
}
