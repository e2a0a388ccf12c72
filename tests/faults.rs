//! Faults injected into a real redis-server: a stopped process, a killed and restarted one.

mod support;

use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind, LostReason};
use support::RedisServer;

/// Short enough to keep the stopped-server calls quick, long enough for the calls to a
/// running server on a loaded host.
const IO_TIMEOUT: Duration = Duration::from_millis(1000);

fn client(server: &RedisServer) -> Client {
    let options = ClientOptions::default()
        .io_timeout(IO_TIMEOUT)
        .connect_timeout(IO_TIMEOUT)
        .pool_wait(IO_TIMEOUT);
    Client::with_options(&server.url(), options).unwrap()
}

/// Generous bound for "returned within its timeouts": the I/O timeout, another for a
/// withdrawal, and slack for a loaded machine. Nothing may hang.
const NO_HANG: Duration = Duration::from_secs(5);

#[test]
fn a_stopped_server_gives_timeouts_and_a_held_lock_is_reported_lost() {
    let server = RedisServer::start();
    let client = client(&server);
    let held = client
        .lock("held")
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .unwrap();
    let fixed = client.lock("fixed").renew(false).try_acquire().unwrap();
    let lost = held.lost();

    server.pause();
    let stopped = Instant::now();

    let started = Instant::now();
    let err = client.lock("new").try_acquire().unwrap_err();
    assert!(err.is_unreachable(), "acquire: {err}");
    assert!(started.elapsed() < NO_HANG);

    let started = Instant::now();
    let err = fixed.extend(Duration::from_secs(10)).unwrap_err();
    assert!(err.is_unreachable(), "extend: {err}");
    assert!(started.elapsed() < NO_HANG);

    let started = Instant::now();
    let err = fixed.release().unwrap_err();
    assert!(err.is_unreachable(), "release: {err}");
    assert!(started.elapsed() < NO_HANG);

    let reason = lost
        .recv_timeout(NO_HANG)
        .expect("the lock was not reported lost");
    assert_eq!(reason, LostReason::Unreachable);
    eprintln!(
        "reported lost {:?} after the server stopped",
        stopped.elapsed()
    );
    assert!(!held.is_held());

    server.resume();
    // The server is back: the client recovers with no action from the caller. ("new" may
    // be held now: the server ran the timed-out acquire when it woke; that lock expires
    // after its ttl, as documented.)
    let again = client.lock("after").try_acquire().unwrap();
    again.release().unwrap();
}

#[test]
fn a_killed_and_restarted_server_is_reconnected_transparently() {
    let mut server = RedisServer::start();
    let client = client(&server);
    // Fill the pool with idle connections that the restart will kill: four waiters block
    // at once, each on a connection of its own (their wait leaves a loaded host time to get
    // them to the server).
    let holder = client.lock("busy").try_acquire().unwrap();
    let waiters = support::waiters_giving_up(&client, "busy", 4, Duration::from_secs(2));
    for w in waiters {
        assert!(w.join().unwrap().unwrap_err().is_busy());
    }
    assert!(server.calls("blpop") >= 4);
    drop(holder);
    server.restart();
    for i in 0..8 {
        let guard = client
            .lock(&format!("after{i}"))
            .try_acquire()
            .unwrap_or_else(|e| panic!("acquire {i} after the restart: {e}"));
        guard.release().unwrap();
    }
}

#[test]
fn fencing_tokens_keep_increasing_after_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let client = client(&server);
    let mut last = 0;
    for round in 0..3 {
        for _ in 0..5 {
            let guard = client.lock("fenced").try_acquire().unwrap();
            assert!(
                guard.fencing_token() > last,
                "round {round}: {} after {last}",
                guard.fencing_token()
            );
            last = guard.fencing_token();
            guard.release().unwrap();
        }
        server.restart();
        let exists: bool = server.cmd(&["EXISTS", "redlease:fence:{fenced}"]);
        assert!(!exists, "the restart should have lost the counter");
    }
}

#[test]
fn a_server_that_never_answers_does_not_hang_a_blocking_acquire() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = client
        .lock("blocked")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || client.lock("blocked").acquire().map(drop))
    };
    assert!(support::eventually(Duration::from_secs(5), || {
        server.calls("blpop") > 0
    }));
    server.pause();
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(matches!(
        err.kind(),
        ErrorKind::Timeout | ErrorKind::Connection
    ));
    server.resume();
    drop(holder);
}

#[test]
fn a_restart_that_loses_the_data_makes_held_locks_lost_and_they_are_not_retaken() {
    let mut server = RedisServer::start();
    let client = client(&server);
    // A lease that outlasts a slow restart: the renewal after it finds the key gone
    // (NotHeld), instead of finding no server until the deadline (Unreachable).
    let guard = client
        .lock("volatile")
        .ttl(Duration::from_secs(3))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    server.restart();
    let reason = lost
        .recv_timeout(NO_HANG)
        .expect("the loss was not signalled");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(!guard.is_held());
    // Renewal stopped and never re-created the key (in more than a renewal period).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!server.cmd::<bool>(&["EXISTS", "volatile"]));
    assert_eq!(guard.release().unwrap_err().kind(), ErrorKind::NotHeld);
}
