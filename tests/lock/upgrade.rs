//! A deploy where redlease 0.1 clients and clients of this version contend for the same
//! lock names. The upgrade rule (src/keys.rs): "clients of both versions stay mutually
//! exclusive on the same lock names (they share the lock key and the fencing counter)".
//! Fencing tokens must strictly increase per lock name whatever version drew them.
//!
//! The 0.1 client is simulated with 0.1's own acquire and release scripts (from commit
//! e76483e, `src/scripts.rs`, single attempts only) and its key layout
//! (`redlease:fence:K` for a key `K` with a hash tag, `redlease:fence:{K}` otherwise).

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

/// A name with its own hash tag: since commit 9dfc3cb (after the change) new clients keep
/// its counter in `redlease:fence:={u}1` while 0.1 clients keep theirs in
/// `redlease:fence:{u}1`: two counters, so tokens go backwards whenever the version
/// changes hands.
#[test]
fn fencing_tokens_increase_across_versions_for_a_tagged_name() {
    check("{u}1");
}
