//! Taking a lock: an attempt stores a fresh token with the ttl, fencing tokens strictly
//! increase, a held lock is busy for everyone else (eight threads keep a non-atomic counter
//! exact), and what an attempt reports is true: an attempt whose reply is lost reports an
//! unknown outcome and holds nothing, and an acquire never reports a lease that already
//! ended as acquired (`settle`, below).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind, LockGuard};

use crate::support::proxy::{Action, Proxy};
use crate::support::{self, RedisServer, client, eventually, options_ms, warm};

#[test]
fn acquire_stores_the_token_with_the_ttl_and_release_deletes_it() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let guard = client
        .lock("order:1001")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .unwrap();
    let stored: String = server.cmd(&["GET", "order:1001"]);
    assert_eq!(stored, guard.token());
    assert!(
        guard.token().len() > 36,
        "uuid plus owner label: {}",
        guard.token()
    );
    let pttl: i64 = server.cmd(&["PTTL", "order:1001"]);
    assert!(pttl > 0 && pttl <= 10_000, "pttl {pttl}");
    assert!(guard.is_held());
    assert!(client.is_locked("order:1001").unwrap());
    guard.release().unwrap();
    let exists: bool = server.cmd(&["EXISTS", "order:1001"]);
    assert!(!exists);
    assert!(!client.is_locked("order:1001").unwrap());
}

#[test]
fn every_acquisition_gets_a_fresh_token() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mut tokens = BTreeSet::new();
    for _ in 0..20 {
        let guard = client.lock("fresh").try_acquire().unwrap();
        assert!(tokens.insert(guard.token().to_owned()));
        guard.release().unwrap();
    }
}

#[test]
fn a_held_lock_is_busy_for_others_until_released() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let guard = client.lock("busy").try_acquire().unwrap();
    let err = client.lock("busy").try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let started = Instant::now();
    let err = client
        .lock("busy")
        .acquire_timeout(Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up before its deadline"
    );
    guard.release().unwrap();
    client
        .lock("busy")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn fencing_tokens_strictly_increase_per_name() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mut last = 0;
    for _ in 0..50 {
        let guard = client.lock("fenced").try_acquire().unwrap();
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().unwrap();
    }
}

/// A single attempt draws its fencing token from the client's estimate of the server's
/// clock when that passed the last token, and from the counter when it did not: a counter
/// ahead of the clock (left by a server whose clock ran ahead, before a failover) gives
/// the next tokens, one by one, and a lost counter gives the server's clock, read then.
#[test]
fn a_single_attempts_fencing_token_follows_the_counter_when_the_clock_is_behind() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let clock_us = || {
        let time: Vec<String> = server.cmd(&["TIME"]);
        time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap()
    };
    let counter = "redlease:fence:{ahead}";
    let first = client.lock("ahead").try_acquire().unwrap();
    let token = first.fencing_token();
    first.release().unwrap();
    assert!(
        token <= clock_us(),
        "an estimate never runs ahead of the clock"
    );
    // An hour ahead of the clock.
    let ahead = clock_us() + 3_600_000_000;
    server.cmd::<()>(&["SET", counter, &ahead.to_string()]);
    for n in 1..=3 {
        let guard = client.lock("ahead").try_acquire().unwrap();
        assert_eq!(guard.fencing_token(), ahead + n);
        guard.release().unwrap();
        let stored: String = server.cmd(&["GET", counter]);
        assert_eq!(
            stored,
            (ahead + n).to_string(),
            "the counter holds the last token"
        );
    }
    // Lost: the clock, read by the script (an estimate may lag the tokens before the loss).
    server.cmd::<()>(&["DEL", counter]);
    let before = clock_us();
    let guard = client.lock("ahead").try_acquire().unwrap();
    assert!(
        guard.fencing_token() >= before,
        "{} < {before}",
        guard.fencing_token()
    );
    assert!(guard.fencing_token() <= clock_us());
    guard.release().unwrap();
}

/// An uncontended acquire and release cost six server commands together: the two scripts,
/// `SET NX` and the fencing counter's `SET ... GET` in one, `MGET` (the key and the
/// waiting flag) and `DEL` in the other. Nobody waiting, nothing about waiters is read;
/// the client's estimate of the server's clock spares the `TIME`.
#[test]
fn an_uncontended_cycle_costs_six_server_commands() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let cycle = || {
        let guard = client.lock("cheap").try_acquire().unwrap();
        guard.release().unwrap();
    };
    // Warm: a pooled connection, the scripts cached, the server's clock read once.
    cycle();
    server.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        cycle();
    }
    let run = server.commands_run();
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    assert_eq!(run, 20 * 6, "{stats}");
}

#[test]
fn eight_threads_keep_a_non_atomic_counter_exact() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 500;
    let server = RedisServer::start();
    let client = client(&server.url());
    let fences = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let fences = fences.clone();
            let mut conn = server.conn();
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let guard = client
                        .lock("counter-lock")
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(60))
                        .unwrap();
                    // Read, pause, write: loses updates unless the lock excludes.
                    let n: i64 = redis::cmd("GET")
                        .arg("counter")
                        .query::<Option<i64>>(&mut conn)
                        .unwrap()
                        .unwrap_or(0);
                    std::thread::yield_now();
                    redis::cmd("SET")
                        .arg("counter")
                        .arg(n + 1)
                        .query::<()>(&mut conn)
                        .unwrap();
                    fences.lock().unwrap().push(guard.fencing_token());
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let count: i64 = server.cmd(&["GET", "counter"]);
    assert_eq!(count, (THREADS * ROUNDS) as i64);
    let waiting: Option<i64> = server.cmd(&["GET", "redlease:waiters:{counter-lock}"]);
    assert_eq!(waiting.unwrap_or(0), 0, "every waiter was uncounted");
    // Nothing piles up: besides the counter and the fencing counter, every key expires.
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.len() <= 4, "{keys:?}");
    for key in keys.iter().filter(|k| *k != "counter") {
        let pttl: i64 = server.cmd(&["PTTL", key]);
        assert!(pttl > 0, "{key} does not expire");
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), THREADS * ROUNDS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in the order of critical sections"
    );
}

/// Issue 9, item 4: a single attempt whose reply is lost reports a connection error, and
/// the lock it may have taken is given back (nobody is left holding it under a token no one
/// has).
#[test]
fn an_acquire_whose_reply_is_lost_reports_an_error_and_holds_nothing() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options_ms(1000, 1000)).unwrap();
    client.ping().unwrap();
    let rule = proxy.on_request(b"lost-acquire", 1, Action::DropReply);
    let err = client.lock("lost-acquire").try_acquire().unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.is_unreachable() && err.outcome_unknown(), "{err}");
    assert!(
        eventually(Duration::from_secs(2), || !server
            .cmd::<bool>(&["EXISTS", "lost-acquire"])),
        "the lock taken by the lost attempt was not given back"
    );
}

// `settle`: an acquire must never report "acquired" for a lease that has already ended,
// while another caller holds the lock.
//
// `Acquire::settle` (src/acquire.rs) extends a lock acquired with less than two thirds of
// its ttl left (a fixed lease whose acquire reply was slow, a grant taken from a release).
// Two of its exits once returned the lock as acquired without looking at the clock again:
//
// - the `EXTEND` succeeded, but its reply came after the ttl it set had run out: the
//   deadline (`sent_at + ttl - drift`) is already in the past when `Ok` is returned;
// - the `EXTEND` failed (timeout, reset): `Err(_) if remaining > Duration::ZERO =>
//   Ok(granted)`, where `remaining` was computed *before* the extend, which took up to an
//   I/O timeout.
//
// In both cases another caller may have taken the lock meanwhile, and this caller was told
// it acquired it: two callers told they hold the same lock at the same moment. (A careful
// caller might check `is_held()` first; the API promises that an `Ok` from acquire means
// acquired.)

/// Another client polls for the lock; returns the guard it got and when.
fn rival(url: String, name: &'static str) -> std::thread::JoinHandle<Option<(Instant, LockGuard)>> {
    std::thread::spawn(move || {
        let client = Client::open(&url).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(g) = client.lock(name).ttl(Duration::from_secs(5)).try_acquire() {
                return Some((Instant::now(), g));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    })
}

fn attack(second_reply: Action) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("victim")
        .io_timeout(Duration::from_millis(700));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    warm(&client);
    // The acquire's reply is 150 ms late (less than 2/3 of the 300 ms ttl left: settle
    // extends); the extend's reply is late past the ttl, or lost.
    proxy.on_request(b"stale", 1, Action::DelayReply(Duration::from_millis(150)));
    proxy.on_request(b"stale", 1, second_reply);
    let victim = std::thread::spawn(move || {
        let result = client
            .lock("stale")
            .ttl(Duration::from_millis(300))
            .renew(false)
            .try_acquire();
        let returned = Instant::now();
        let held = result.as_ref().map(|g| g.is_held()).unwrap_or(false);
        (result, returned, held)
    });
    // The rival starts once the victim's attempt has taken the key.
    assert!(support::eventually(Duration::from_secs(5), || {
        server
            .cmd::<Option<String>>(&["GET", "stale"])
            .is_some_and(|v| v.ends_with(":victim"))
    }));
    let other = rival(server.url(), "stale");
    let (result, returned, victim_held_at_return) =
        support::within(Duration::from_secs(10), move || victim.join().unwrap());
    let rival_got = other.join().unwrap();
    let key: Option<String> = server.cmd(&["GET", "stale"]);
    match (&result, &rival_got) {
        (Ok(victim), Some((at, rival))) if *at <= returned => {
            panic!(
                "acquire returned Ok (is_held() {victim_held_at_return}, remaining {:?}) at a \
                 moment another client had held the lock for {:?} (its token {}, the key holds \
                 {key:?}; the victim's token {})",
                victim.remaining(),
                returned - *at,
                rival.token(),
                victim.token()
            );
        }
        _ => {}
    }
}

/// The extend ran at once on the server; its reply came 600 ms later (past the 300 ms it
/// set): the acquire must not hand out a guard for that lease.
#[test]
fn a_late_settle_extend_reply_never_reports_an_expired_lease_as_acquired() {
    attack(Action::DelayReply(Duration::from_millis(600)));
}

/// The extend timed out (its reply 1 s late, the I/O timeout 0.7 s): what is left of the
/// lease must be measured after it, not before.
#[test]
fn a_failed_settle_extend_never_reports_an_expired_lease_as_acquired() {
    attack(Action::DelayReply(Duration::from_millis(1000)));
}

/// The other side of `settle`: when its `EXTEND` finds the key gone (the lease the attempt
/// set ran out while its reply was on its way), a wait with time left tries again; it once
/// failed at once with a false `Busy` although nobody held the lock.
#[test]
fn a_lease_lost_before_settle_tries_again_instead_of_a_false_busy() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("victim")
        .io_timeout(Duration::from_millis(700));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    warm(&client);
    // The attempt's reply comes 250 ms late: the 100 ms lease it set is over.
    proxy.on_request(b"late", 1, Action::DelayReply(Duration::from_millis(250)));
    let started = Instant::now();
    let result = client
        .lock("late")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .acquire_timeout(Duration::from_secs(5));
    let took = started.elapsed();
    let key: Option<String> = server.cmd(&["GET", "late"]);
    match result {
        Ok(g) => {
            g.release().ok();
        }
        Err(e) => panic!(
            "acquire_timeout(5 s) gave up after {took:?} with {:?}: {} (the key holds {key:?}: \
             nobody holds the lock)",
            e.kind(),
            e
        ),
    }
}

/// Without time left to try again, the same lapse ends the acquire as `Busy`, and its
/// message tells what happened: it once said the lock was "held by another owner" while
/// nobody held it.
#[test]
fn a_grant_that_lapsed_as_it_was_taken_is_not_blamed_on_another_owner() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), ClientOptions::default()).unwrap();
    warm(&client);
    // The attempt's reply comes 250 ms late: the 100 ms lease it set is over, and settle's
    // EXTEND finds the key gone.
    proxy.on_request(b"lapsed", 1, Action::DelayReply(Duration::from_millis(250)));
    let result = client
        .lock("lapsed")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .try_acquire();
    let e = result
        .map(|_| ())
        .expect_err("a lease over before it was confirmed is not held");
    assert_eq!(e.kind(), redlease::ErrorKind::Busy);
    let message = e.to_string();
    assert!(!message.contains("another owner"), "{message}");
    assert!(message.contains("lease ran out"), "{message}");
    assert_eq!(server.cmd::<Option<String>>(&["GET", "lapsed"]), None);
}

/// No attempt goes under a token whose give-back may still land (the protocol-core issue's
/// settle case): a late give-back would delete what a later attempt took.
/// A waiting acquire whose grant came with a short lease extends it (settle); the extend's
/// reply comes after the lease it set ended, so the grant is given back; that give-back is
/// held in the network past the I/O timeout. The waiter goes on: if it tried again under
/// the same token, it would take the (expired) key afresh, and the late give-back would
/// delete it under its feet.
#[test]
fn a_settle_give_back_that_lands_late_never_deletes_a_later_grant() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("victim")
        .io_timeout(Duration::from_secs(1));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    // Warm the script cache: the attack's requests must not be answered NOSCRIPT.
    warm(&client);
    // The attempt's reply 300 ms late (less than 2/3 of the 800 ms ttl left: settle
    // extends; the attempt and the block pipelined behind it, which its wake-up answers at
    // once, are two requests); the extend's reply 900 ms late (past the 800 ms it set,
    // within the I/O timeout); the give-back held 1.3 s (past the I/O timeout, so the
    // waiter goes on, and within the lease a new grant would get).
    let name = "settled";
    proxy.on_request(
        name.as_bytes(),
        2,
        Action::DelayReply(Duration::from_millis(300)),
    );
    proxy.on_request(
        name.as_bytes(),
        1,
        Action::DelayReply(Duration::from_millis(900)),
    );
    let give_back = proxy.on_request(
        name.as_bytes(),
        1,
        Action::DelayRequest(Duration::from_millis(1300)),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let guard = client
            .lock(name)
            .ttl(Duration::from_millis(800))
            .renew(false)
            .acquire_timeout(Duration::from_secs(10));
        let _ = tx.send(guard);
    });
    let holder = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert_eq!(proxy.matched(give_back), 1, "the grant was not given back");
    let holder = holder.expect("the waiter gets the lock under a fresh token");
    let rival = Client::open(&server.url()).unwrap();
    support::no_second_holder(&rival, name, &holder, Duration::from_secs(2));
}
