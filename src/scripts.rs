//! The server-side Lua scripts of the lock protocol, one immutable value per script.
//!
//! Each runs with `EVALSHA`; [`redis::Script`] computes the SHA once and falls back to
//! `SCRIPT LOAD` on `NOSCRIPT` (a restarted or failed-over server has an empty cache).
//! Every key a script touches is passed in `KEYS[]`, and all of them share one cluster slot
//! (see [`crate::keys`]).

use std::sync::LazyLock;

use redis::Script;

/// How long a fencing counter survives without acquisitions. Expiry is safe: a missing
/// counter is seeded from the server clock, which is above every token handed out before.
pub(crate) const FENCE_IDLE_MS: u64 = 7 * 24 * 3600 * 1000;

/// How long a release's wake-up signal waits for a waiter to take it.
pub(crate) const WAKE_TTL_MS: u64 = 1000;

/// Acquire: `SET lock token NX PX ttl`, and on success the next fencing token.
///
/// - KEYS[1] lock key, KEYS[2] fencing counter
/// - ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] idle expiry of the counter in ms
/// - Returns `{1, fencing_token}` when acquired, `{0, pttl_ms}` when another owner holds it
///   (`pttl_ms` is -1 for a key without expiry).
///
/// A key that already holds the same token counts as acquired (its ttl is reset), so an
/// attempt repeated after a lost reply does not lock its own caller out.
///
/// A missing counter (first use, expiry, or a restart without persistence) is seeded with
/// the server time in microseconds, so tokens keep increasing across such a loss as long as
/// the server clock does not step backwards.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
   or (redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 1) then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local now = redis.call('TIME')
    redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

/// Release: delete the lock only while it holds our token, and leave one wake-up signal.
///
/// - KEYS[1] lock key, KEYS[2] wake list
/// - ARGV[1] token, ARGV[2] lifetime of the wake signal in ms
/// - Returns 1 when released, 0 when the key no longer held the token.
///
/// The wake list holds at most one element, so one release wakes at most one waiter
/// blocked in `BLPOP`, and an unclaimed signal expires.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Extend (renew): set a new ttl only while the lock holds our token.
///
/// - KEYS[1] lock key
/// - ARGV[1] token, ARGV[2] new ttl in ms (never 0: `PEXPIRE key 0` deletes the key)
/// - Returns 1 when extended, 0 when the key no longer held the token.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});
