//! Deploys where clients of earlier versions and of this one contend for the same lock
//! names. The upgrade rule (src/keys.rs, README "Upgrading"): clients of both versions stay
//! mutually exclusive on the same lock names (they share the lock key and the fencing
//! counter), and fencing tokens strictly increase per lock name whatever version drew
//! them.
//!
//! The 0.1 client is simulated with 0.1's own acquire and release scripts (from commit
//! e76483e, `src/scripts.rs`, single attempts only) and its key layout
//! (`redlease:fence:K` for a key `K` with a hash tag, `redlease:fence:{K}` otherwise); the
//! 0.2 client with 0.2's scripts, unchanged (below).

use std::time::Duration;

use redlease::Client;

use crate::support::RedisServer;

const V01_NEXT_FENCE: &str = r"
local function next_fence(key, expiry_ms)
  local fence = redis.call('INCR', key)
  if fence == 1 then
    local now = redis.call('TIME')
    local seeded = now[1] .. string.format('%06d', tonumber(now[2]))
    redis.call('SET', key, seeded, 'PX', expiry_ms)
    fence = tonumber(seeded)
  end
  return fence
end
";

/// 0.1's ACQUIRE in mode 0 (a single attempt): the parts that run when the key is free.
const V01_ACQUIRE_ONCE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_fence(KEYS[2], ARGV[3])}
end
return {0, redis.call('PTTL', KEYS[1])}
";

const V01_RELEASE_NO_WAITERS: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
";

/// One acquire + release by a 0.1 client; its fencing token.
fn v01_cycle(server: &RedisServer, key: &str, n: u32) -> u64 {
    let fence = if key.contains('{') {
        format!("redlease:fence:{key}")
    } else {
        format!("redlease:fence:{{{key}}}")
    };
    let token = format!("v01-token-{n}");
    let mut conn = server.conn();
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(format!("{V01_NEXT_FENCE}{V01_ACQUIRE_ONCE}"))
        .arg(2)
        .arg(key)
        .arg(&fence)
        .arg(&token)
        .arg(30_000)
        .arg(7 * 24 * 3600 * 1000u64)
        .query(&mut conn)
        .unwrap();
    assert_eq!(reply[0], 1, "the 0.1 client could not take {key}");
    let released: i64 = redis::cmd("EVAL")
        .arg(V01_RELEASE_NO_WAITERS)
        .arg(1)
        .arg(key)
        .arg(&token)
        .query(&mut conn)
        .unwrap();
    assert_eq!(released, 1);
    reply[1] as u64
}

fn new_cycle(client: &Client, key: &str) -> u64 {
    let g = client.lock(key).try_acquire().unwrap();
    let f = g.fencing_token();
    g.release().unwrap();
    f
}

fn check(key: &str) {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let mut tokens = Vec::new();
    for n in 0..3 {
        tokens.push(("0.1", v01_cycle(&server, key, n)));
        std::thread::sleep(Duration::from_millis(5));
        tokens.push(("new", new_cycle(&client, key)));
        std::thread::sleep(Duration::from_millis(5));
    }
    for w in tokens.windows(2) {
        assert!(
            w[1].1 > w[0].1,
            "lock {key:?}: a {} client drew fencing token {} after a {} client drew {} \
             (all, in order: {tokens:?})",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
}

#[test]
fn fencing_tokens_increase_across_versions_for_a_plain_name() {
    check("upgrade");
}

/// A name with its own hash tag: both versions keep its counter in 0.1's
/// `redlease:fence:{u}1` (a counter of its own, `redlease:fence:={u}1`, would make tokens
/// go backwards whenever the version changes hands).
#[test]
fn fencing_tokens_increase_across_versions_for_a_tagged_name() {
    check("{u}1");
}

// --- 0.2 ---
//
// The 0.2 client is simulated with 0.2's own ACQUIRE and RELEASE scripts (commit 7b73bd3,
// kept unchanged in `upgrade_scripts/`) and its key layout, which this version keeps (it
// adds the `waiting` flag).

const V02_ACQUIRE: &str = include_str!("upgrade_scripts/v0_2_acquire.lua");
const V02_RELEASE: &str = include_str!("upgrade_scripts/v0_2_release.lua");

/// 0.2's keys of lock `key`: lock, fence, wakeup, queue, grant.
fn v02_keys(key: &str) -> [String; 5] {
    let tagged = key
        .find('{')
        .is_some_and(|o| key[o + 1..].find('}').is_some_and(|c| c > 0));
    let tail = if tagged {
        format!("={key}")
    } else {
        format!("{{{key}}}")
    };
    let fence_tail = if tagged { key.to_owned() } else { tail.clone() };
    [
        key.to_owned(),
        format!("redlease:fence:{fence_tail}"),
        format!("redlease:wakeup:{tail}"),
        format!("redlease:queue:{tail}"),
        format!("redlease:grant:{tail}"),
    ]
}

/// A 0.2 attempt (`mode` 0: once, 1: a waiter registering): its reply.
fn v02_attempt(server: &RedisServer, key: &str, token: &str, mode: u8) -> Vec<redis::Value> {
    redis::cmd("EVAL")
        .arg(V02_ACQUIRE)
        .arg(5)
        .arg(&v02_keys(key)[..])
        .arg(token)
        .arg(30_000)
        .arg(7 * 24 * 3600 * 1000u64)
        .arg(mode)
        .arg(2_500)
        .query(&mut server.conn())
        .unwrap()
}

/// A 0.2 release of `token`: 1 released, 2 handed to a waiter, 0 not held.
fn v02_release(server: &RedisServer, key: &str, token: &str) -> i64 {
    let k = v02_keys(key);
    redis::cmd("EVAL")
        .arg(V02_RELEASE)
        .arg(4)
        .arg(&k[0])
        .arg(&k[2])
        .arg(&k[3])
        .arg(&k[4])
        .arg(token)
        .arg(format!("{token}:handoff"))
        .arg(200)
        .arg(2_500)
        .arg(0)
        .query(&mut server.conn())
        .unwrap()
}

fn int(value: &redis::Value) -> i64 {
    match value {
        redis::Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

fn check_0_2(key: &str) {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let mut tokens = Vec::new();
    for n in 0..3 {
        let token = format!("v02-token-{n}");
        let reply = v02_attempt(&server, key, &token, 0);
        assert_eq!(
            int(&reply[0]),
            1,
            "the 0.2 client could not take {key}: {reply:?}"
        );
        tokens.push(("0.2", int(&reply[1]) as u64));
        assert_eq!(v02_release(&server, key, &token), 1);
        tokens.push(("new", new_cycle(&client, key)));
    }
    for w in tokens.windows(2) {
        assert!(
            w[1].1 > w[0].1,
            "lock {key:?}: a {} client drew fencing token {} after a {} client drew {} \
             (all, in order: {tokens:?})",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
}

#[test]
fn fencing_tokens_increase_across_0_2_and_this_version() {
    check_0_2("upgrade-0.2");
    check_0_2("{u}2");
}

#[test]
fn a_0_2_holder_and_a_holder_of_this_version_exclude_each_other() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    assert_eq!(int(&v02_attempt(&server, "mixed", "old", 0)[0]), 1);
    let err = client.lock("mixed").try_acquire().unwrap_err();
    assert_eq!(err.kind(), redlease::ErrorKind::Busy, "{err}");
    assert_eq!(v02_release(&server, "mixed", "old"), 1);
    let guard = client.lock("mixed").try_acquire().unwrap();
    assert_eq!(int(&v02_attempt(&server, "mixed", "old-2", 0)[0]), 0);
    // The 0.2 release script finds someone else's token: nothing happens.
    assert_eq!(v02_release(&server, "mixed", "old-2"), 0);
    assert!(guard.is_held());
    guard.release().unwrap();
}

/// A waiter of this version registers as 0.2 waiters did, so a 0.2 release hands it the
/// lock (a grant in 0.2's form, which this version takes).
#[test]
fn a_0_2_release_hands_the_lock_to_a_waiter_of_this_version() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    assert_eq!(int(&v02_attempt(&server, "handed", "old", 0)[0]), 1);
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let g = client
                .lock("handed")
                .acquire_timeout(Duration::from_secs(20))?;
            let token = g.token().to_owned();
            g.release()?;
            Ok::<_, redlease::Error>(token)
        })
    };
    let queue = &v02_keys("handed")[3];
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        server.cmd::<i64>(&["ZCARD", queue]) == 1
    }));
    assert_eq!(
        v02_release(&server, "handed", "old"),
        2,
        "handed to the waiter"
    );
    let token =
        crate::support::within(Duration::from_secs(20), move || waiter.join().unwrap()).unwrap();
    assert!(!token.is_empty());
}

/// A 0.2 waiter does not set the waiting flag, so a release of this version does not hand
/// it the lock: it frees the lock, and the 0.2 waiter takes it at its next attempt (within
/// its backoff, at most 2 s), as the README's upgrade notes say.
#[test]
fn a_0_2_waiter_finds_the_lock_freed_by_a_release_of_this_version() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client.lock("freed").try_acquire().unwrap();
    assert_eq!(int(&v02_attempt(&server, "freed", "old-waiter", 1)[0]), 0);
    guard.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "freed"]), "not handed off");
    assert_eq!(int(&v02_attempt(&server, "freed", "old-waiter", 2)[0]), 1);
    assert_eq!(v02_release(&server, "freed", "old-waiter"), 1);
}
