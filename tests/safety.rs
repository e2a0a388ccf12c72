//! Safety (issue 8): at no moment may two callers both be told they hold the same lock, and
//! no lock stays blocked much longer than its holder needs it. Each test names the item of
//! the issue it covers; the fault-injecting proxy of `tests/support` delays, drops and cuts
//! replies deterministically.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};
use support::proxy::{Action, Proxy};
use support::{
    RedisServer, assert_held_only_while_the_key_is_ours, client, eventually,
    grant_to_a_vanished_waiter, quick_client, within,
};

/// Item 1: a wake-up left for a grant whose key then vanished (a foreign `DEL` of a stuck
/// grant, an eviction) and was taken by a new caller must not make its popper a holder.
#[test]
fn a_stale_wake_up_never_makes_a_second_holder() {
    let server = RedisServer::start();
    let client = client(&server.url());
    grant_to_a_vanished_waiter(&server, &client, "stale");
    assert_eq!(server.cmd::<i64>(&["LLEN", "redlease:wakeup:{stale}"]), 1);
    // An operator clears the stuck lock; someone else takes it.
    server.cmd::<()>(&["DEL", "stale"]);
    let holder = client.lock("stale").try_acquire().unwrap();
    // A waiter now blocks and pops the stale wake-up.
    let err = client
        .lock("stale")
        .acquire_timeout(Duration::from_secs(2))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    assert_eq!(
        server.cmd::<i64>(&["LLEN", "redlease:wakeup:{stale}"]),
        0,
        "the stale wake-up was not popped: the test did not exercise it"
    );
    assert!(holder.is_held());
    let stored: String = server.cmd(&["GET", "stale"]);
    assert_eq!(stored, holder.token());
    holder.release().unwrap();
}

/// Item 2: a waiter's lease is timed from before the server set it, never from when the
/// (delayed) reply was read, on the handoff path, with a fixed lease and with renewal.
#[test]
fn a_handed_over_lease_is_never_believed_past_the_keys_expiry() {
    for renew in [false, true] {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port);
        let holder = client(&server.url()).lock("late").try_acquire().unwrap();
        let rule = proxy.on_request(b"BLPOP", 1, Action::DelayReply(Duration::from_millis(400)));
        let waiter = {
            let url = proxy.url();
            std::thread::spawn(move || {
                client(&url)
                    .lock("late")
                    .ttl(Duration::from_secs(1))
                    .renew(renew)
                    .acquire_timeout(Duration::from_secs(10))
            })
        };
        assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));
        holder.release().unwrap();
        let guard = waiter.join().unwrap().unwrap();
        assert_eq!(proxy.matched(rule), 1, "the reply was not delayed");
        if renew {
            // Renewal keeps it; then a partition stops renewal and the lease must end
            // locally no later than on the server.
            assert_held_only_while_the_key_is_ours(&server, &guard, Duration::from_millis(600));
            assert!(guard.is_held());
            proxy.blackhole(true);
        }
        assert_held_only_while_the_key_is_ours(&server, &guard, Duration::from_secs(5));
        assert!(!guard.is_held());
        proxy.blackhole(false);
    }
}

/// Item 3: `extend()` takes the renewal gate, and the local deadline follows the last
/// extend the server ran: with `extend(60 s)`'s reply delayed past the moment a 1 s
/// lease's renewal is due (but not past the lease: a later reply loses the lock, see
/// `tests/attack_final.rs`), then a partition, the holder never believes in more lease
/// than the key has. (Before the fix a renewal ran while the extend's reply was on its way
/// and cut the key back to 1 s, while the holder counted on 60 s.)
#[test]
fn an_extend_racing_renewal_never_outlives_the_key() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = client(&proxy.url());
    let guard = client
        .lock("raced")
        .ttl(Duration::from_secs(1))
        .acquire()
        .unwrap();
    // The extend script is in the server's cache (else the delayed reply is NOSCRIPT).
    guard.extend(Duration::from_secs(1)).unwrap();
    // Past the renewal due a third of the lease after the warm-up extend.
    let rule = proxy.on_request(b"60000", 1, Action::DelayReply(Duration::from_millis(500)));
    guard.extend(Duration::from_secs(60)).unwrap();
    assert_eq!(proxy.matched(rule), 1);
    proxy.blackhole(true);
    // Longer than the 1 s a renewal racing the extend would have left on the key.
    assert_held_only_while_the_key_is_ours(&server, &guard, Duration::from_millis(2500));
    // The extend ran last on the server: the key has its 60 s, and so does the guard.
    assert!(guard.is_held());
    assert!(server.cmd::<i64>(&["PTTL", "raced"]) > 50_000);
    proxy.blackhole(false);
    guard.release().unwrap();
}

/// Item 6: a grant taken by a waiter that then vanished (its reply lost, unable to reach
/// Redis again) blocks the lock for the waiter's grace, not for its ttl, for redlease and
/// plain `SET NX` clients alike.
#[test]
fn a_grant_whose_waiter_vanished_lapses_within_the_grace() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = client(&server.url()).lock("vanish").try_acquire().unwrap();
    let rule = proxy.on_request(b"BLPOP", 1, Action::DelayReply(Duration::from_secs(30)));
    let waiter = {
        let url = proxy.url();
        std::thread::spawn(move || {
            quick_client(&url, 200)
                .lock("vanish")
                .ttl(Duration::from_secs(60))
                .acquire_timeout(Duration::from_secs(30))
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));
    proxy.blackhole(true);
    holder.release().unwrap();
    let taken = Instant::now();
    // The waiter's pipelined attempt took the grant on the server; the waiter never hears.
    assert!(eventually(Duration::from_secs(2), || {
        server
            .cmd::<Option<String>>(&["GET", "vanish"])
            .is_some_and(|v| !v.ends_with(":handoff"))
    }));
    assert_eq!(proxy.matched(rule), 1);
    assert!(eventually(Duration::from_secs(5), || {
        server
            .cmd::<Option<String>>(&["SET", "vanish", "foreign", "NX", "PX", "10000"])
            .is_some()
    }));
    // The waiter's grace is its I/O timeout (0.2 s) plus 0.5 s (its ttl is 60 s).
    assert!(
        taken.elapsed() < Duration::from_secs(3),
        "blocked for {:?}",
        taken.elapsed()
    );
    let err = within(Duration::from_secs(10), move || waiter.join().unwrap()).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
}

/// Item 7: an extend to a shorter ttl reschedules renewal: the next renewal follows the
/// new ttl, so the key never expires under a holder that Redis answers.
#[test]
fn extend_to_a_shorter_ttl_reschedules_renewal() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let lost = Arc::new(AtomicBool::new(false));
    let guard = {
        let lost = lost.clone();
        client
            .lock("shorter")
            .ttl(Duration::from_secs(30))
            .on_lost(move |_| lost.store(true, Ordering::SeqCst))
            .acquire()
            .unwrap()
    };
    guard.extend(Duration::from_millis(1500)).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let value: Option<String> = server.cmd(&["GET", "shorter"]);
        assert_eq!(
            value.as_deref(),
            Some(guard.token()),
            "expired under its holder"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(guard.is_held() && !lost.load(Ordering::SeqCst));
    let pttl: i64 = server.cmd(&["PTTL", "shorter"]);
    assert!(pttl <= 1500, "renewal did not follow the new ttl: {pttl}");
    guard.release().unwrap();
}

/// Item 8: registrations of waiters that are gone (their requests failed, they could not
/// withdraw) lapse within their grace, even while live waiters keep contending; then a
/// release with nobody waiting deletes the key instead of granting it to no one.
#[test]
fn registrations_of_vanished_waiters_lapse_under_steady_contention() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let live = client(&server.url());
    let holder = live.lock("drift").try_acquire().unwrap();
    let dead: Vec<_> = (0..3)
        .map(|_| {
            let url = proxy.url();
            std::thread::spawn(move || {
                quick_client(&url, 200)
                    .lock("drift")
                    .acquire_timeout(Duration::from_secs(30))
                    .map(drop)
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || {
        server.cmd::<i64>(&["ZCARD", "redlease:queue:{drift}"]) == 3
    }));
    proxy.blackhole(true);
    for d in dead {
        assert!(d.join().unwrap().unwrap_err().is_unreachable());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let contenders: Vec<_> = (0..2)
        .map(|_| {
            let (client, stop) = (live.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let guard = client
                        .lock("drift")
                        .acquire_timeout(Duration::from_secs(5))
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    holder.release().unwrap();
    // The dead waiters' grace is 0.7 s; sample well after it.
    std::thread::sleep(Duration::from_millis(2000));
    for _ in 0..50 {
        let registered: i64 = server.cmd(&["ZCARD", "redlease:queue:{drift}"]);
        assert!(
            registered <= 2,
            "{registered} registrations for 2 live waiters"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::SeqCst);
    for c in contenders {
        c.join().unwrap();
    }
    // Nobody waits now: a release deletes the key.
    let last = live.lock("drift").try_acquire().unwrap();
    last.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "drift"]));
    assert!(!live.is_locked("drift").unwrap());
    proxy.blackhole(false);
}

/// Item 9: no lock name can touch another lock's companion keys.
#[test]
fn lock_names_cannot_collide_with_companion_keys() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let a = client.lock("a").try_acquire().unwrap();
    for name in [
        "redlease:fence:{a}",
        "redlease:queue:{a}",
        "redlease:anything",
    ] {
        let err = client.lock(name).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name}: {err}");
    }
    a.release().unwrap();
    let again = client.lock("a").try_acquire().unwrap();
    again.release().unwrap();
    let err = Client::with_options(
        &server.url(),
        ClientOptions::default().key_prefix("redlease:"),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// Item 10: under `maxmemory` with `noeviction` a release still releases, even when a
/// waiter is registered (its grant would need memory).
#[test]
fn a_release_under_memory_pressure_still_releases() {
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
    let client = client(&server.url());
    grant_to_a_vanished_waiter(&server, &client, "warm-up");
    let holder = client.lock("oom").try_acquire().unwrap();
    let far = (u64::MAX >> 12).to_string();
    server.cmd::<()>(&["ZADD", "redlease:queue:{oom}", &far, "ghost"]);
    // Fill the memory until even small writes are refused (Redis counts a command's own
    // arguments, so a large value is refused well before a small one).
    let mut conn = server.conn();
    let mut i = 0;
    for size in [64 * 1024, 4096, 256, 16] {
        let filler = "x".repeat(size);
        loop {
            i += 1;
            assert!(i < 100_000, "the server never ran out of memory");
            let r: redis::RedisResult<()> = redis::cmd("SET")
                .arg(format!("filler:{i}"))
                .arg(&filler)
                .query(&mut conn);
            if r.is_err() {
                break;
            }
        }
    }
    let err = client.lock("other").try_acquire().unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Server,
        "acquiring needs memory: {err}"
    );
    let token = holder.token().to_owned();
    holder.release().unwrap();
    // Released: deleted, or granted to the registered waiter (Redis lets a script that has
    // already written go on writing; if it refuses the grant, the key is deleted).
    let value: Option<String> = server.cmd(&["GET", "oom"]);
    assert_ne!(value.as_deref(), Some(token.as_str()));
    assert!(
        value.as_ref().is_none_or(|v| v.ends_with(":handoff")),
        "{value:?}"
    );
}

/// Item 10: a server whose eviction policy may delete lock keys is warned about.
#[test]
fn an_evicting_maxmemory_policy_is_warned_about() {
    static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    struct Capture;
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            if record.level() <= log::Level::Warn {
                RECORDS.lock().unwrap().push(record.args().to_string());
            }
        }
        fn flush(&self) {}
    }
    let _ = log::set_logger(&Capture);
    log::set_max_level(log::LevelFilter::Warn);
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    client(&server.url())
        .lock("evictable")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let records = RECORDS.lock().unwrap();
    assert!(
        records
            .iter()
            .any(|r| r.contains("maxmemory-policy allkeys-lru") && r.contains("noeviction")),
        "{records:?}"
    );
}
