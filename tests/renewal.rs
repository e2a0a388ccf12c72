//! Renewal (the watchdog) and loss detection against a real redis-server.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind, LostReason};
use support::RedisServer;

const TTL: Duration = Duration::from_millis(300);

#[test]
fn renewal_keeps_a_short_lock_held_for_ten_ttls() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client.lock("renewed").ttl(TTL).try_acquire().unwrap();
    let lost = guard.lost();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert!(guard.is_held(), "lost after {:?}", started.elapsed());
        let stored: Option<String> = server.cmd(&["GET", "renewed"]);
        assert_eq!(stored.as_deref(), Some(guard.token()));
        assert!(lost.try_recv().is_err());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.calls("evalsha") >= 5, "renewal did not run");
    guard.release().unwrap();
    assert!(
        lost.recv_timeout(Duration::from_secs(1)).is_err(),
        "release must disconnect the lost channel without a loss message"
    );
}

fn assert_loss_detected(tamper: &[&str], expected_value: Option<&str>) {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let guard = client
        .lock("victim")
        .ttl(TTL)
        .on_lost(move |reason| {
            assert_eq!(reason, LostReason::NotHeld);
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    server.cmd::<()>(tamper);
    let tampered = Instant::now();
    let reason = lost
        .recv_timeout(TTL / 3 + Duration::from_millis(700))
        .expect("the loss was not signalled within ttl/3 plus a margin");
    eprintln!("loss signalled {:?} after tampering", tampered.elapsed());
    assert_eq!(reason, LostReason::NotHeld);
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(LostReason::NotHeld));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // No renewal after the loss: the script count stays put over several renewal periods.
    let after_loss = server.calls("evalsha");
    std::thread::sleep(TTL * 2);
    assert_eq!(
        server.calls("evalsha"),
        after_loss,
        "a renewal ran after the loss"
    );

    let err = guard.release().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    let stored: Option<String> = server.cmd(&["GET", "victim"]);
    assert_eq!(
        stored.as_deref(),
        expected_value,
        "the release touched a foreign value"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the callback ran twice");
}

#[test]
fn deleting_the_key_fires_the_lost_signal_and_stops_renewal() {
    assert_loss_detected(&["DEL", "victim"], None);
}

#[test]
fn overwriting_the_key_fires_the_lost_signal_and_keeps_the_new_value() {
    assert_loss_detected(&["SET", "victim", "someone-else"], Some("someone-else"));
}

#[test]
fn a_fixed_lease_is_not_renewed_and_ends_after_its_ttl() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client
        .lock("fixed")
        .ttl(TTL)
        .renew(false)
        .try_acquire()
        .unwrap();
    assert!(guard.remaining() <= TTL);
    assert!(support::eventually(Duration::from_secs(5), || {
        !server.cmd::<bool>(&["EXISTS", "fixed"])
    }));
    assert!(!guard.is_held());
    assert_eq!(
        server.calls("evalsha") + server.calls("eval"),
        1,
        "only the acquire: nothing renewed it"
    );
    assert_eq!(guard.release().unwrap_err().kind(), ErrorKind::NotHeld);
}

#[test]
fn extend_sets_the_new_ttl_and_renewal_follows_it() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client.lock("extended").ttl(TTL).try_acquire().unwrap();
    guard.extend(Duration::from_secs(60)).unwrap();
    let pttl: i64 = server.cmd(&["PTTL", "extended"]);
    assert!(pttl > 30_000, "pttl {pttl}");
    assert!(guard.remaining() > Duration::from_secs(30));
    // Renewal now runs every 20 s: after the one already scheduled, nothing more.
    std::thread::sleep(TTL / 2);
    let calls = server.calls("evalsha");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(server.calls("evalsha"), calls);
    guard.release().unwrap();
}

#[test]
fn renewal_is_not_starved_when_callers_hold_every_pooled_connection() {
    let server = RedisServer::start();
    let options = redlease::ClientOptions::default()
        .pool_size(1)
        .pool_wait(Duration::from_millis(100));
    let client = Client::with_options(&server.url(), options).unwrap();
    let guard = client.lock("starved").ttl(TTL).try_acquire().unwrap();
    // A waiter occupies the only pooled connection in BLPOP for a long time...
    let holder = client
        .lock("other")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || client.lock("other").acquire_timeout(Duration::from_secs(2)))
    };
    // ...while renewal keeps the short lock alive on its own connections.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(guard.is_held());
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(waiter.join().unwrap().unwrap_err().kind(), ErrorKind::Busy);
    drop(holder);
    guard.release().unwrap();
}

#[test]
fn a_reused_renewal_thread_renews_its_next_lock_in_time() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    // A long lease leaves its renewal thread parked with a wake-up 10 s away; the short
    // lock that reuses the thread needs its first renewal within 100 ms.
    for ttl in [Duration::from_secs(30), TTL, Duration::from_secs(30), TTL] {
        client
            .lock("first")
            .ttl(ttl)
            .try_acquire()
            .unwrap()
            .release()
            .unwrap();
        let guard = client.lock("second").ttl(TTL).try_acquire().unwrap();
        std::thread::sleep(TTL * 3);
        assert!(
            guard.is_held(),
            "after a {ttl:?} lease, the next lock was not renewed"
        );
        let stored: Option<String> = server.cmd(&["GET", "second"]);
        assert_eq!(stored.as_deref(), Some(guard.token()));
        guard.release().unwrap();
    }
}

#[test]
fn a_panicking_lost_callback_does_not_stop_renewal_of_later_locks() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client
        .lock("panicky")
        .ttl(TTL)
        .on_lost(|_| panic!("a callback that panics"))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    server.cmd::<()>(&["DEL", "panicky"]);
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(5)),
        Ok(LostReason::NotHeld)
    );
    drop(guard);
    // The same renewal thread serves the next lock, and renews it.
    let next = client.lock("after-panic").ttl(TTL).try_acquire().unwrap();
    std::thread::sleep(TTL * 3);
    assert!(next.is_held());
    let stored: Option<String> = server.cmd(&["GET", "after-panic"]);
    assert_eq!(stored.as_deref(), Some(next.token()));
}

#[test]
fn a_blocking_lost_callback_does_not_hold_up_renewal_of_later_locks() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let (started, in_callback) = crossbeam_channel::bounded(1);
    let guard = client
        .lock("slow-callback")
        .ttl(TTL)
        .on_lost(move |_| {
            let _ = started.send(());
            std::thread::sleep(Duration::from_secs(2)); // a callback that blocks (a bug)
        })
        .try_acquire()
        .unwrap();
    server.cmd::<()>(&["DEL", "slow-callback"]);
    in_callback
        .recv_timeout(Duration::from_secs(5))
        .expect("the callback did not run");
    drop(guard);
    // The blocked thread must not be handed the next lock.
    let next = client.lock("after-slow").ttl(TTL).try_acquire().unwrap();
    std::thread::sleep(TTL * 3);
    assert!(next.is_held(), "the next lock was not renewed");
    let stored: Option<String> = server.cmd(&["GET", "after-slow"]);
    assert_eq!(stored.as_deref(), Some(next.token()));
}
