//! A server under `maxmemory`. With `noeviction` and memory full, a release still releases
//! (a waiter registered or not), renewals of locks sharing batches keep them held, another
//! client's acquire is refused with an error (never a false grant), and each release's
//! answer matches the key. An evicting policy, which may delete lock keys, is warned about.

use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind};

use crate::support::{RedisServer, client, grant_to_a_vanished_waiter, options};

/// Issue 8, item 10: under `maxmemory` with `noeviction` a release still releases, even
/// when a waiter is registered (its grant would need memory).
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

/// Issue 8, item 10: a server whose eviction policy may delete lock keys is warned about.
#[test]
fn an_evicting_maxmemory_policy_is_warned_about() {
    crate::support::warnings();
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    client(&server.url())
        .lock("evictable")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let records = crate::support::warnings();
    assert!(
        records
            .iter()
            .any(|r| r.contains("maxmemory-policy allkeys-lru") && r.contains("noeviction")),
        "{records:?}"
    );
}
