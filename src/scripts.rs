//! The server-side Lua scripts of the lock protocol, one immutable value per script.
//!
//! Each runs with `EVALSHA`; [`redis::Script`] computes the SHA once and falls back to
//! `SCRIPT LOAD` on `NOSCRIPT` (a restarted or failed-over server has an empty cache).
//! Every key a script touches is passed in `KEYS[]`, and all of them share one cluster slot
//! (see [`crate::keys`]).
//!
//! Waiting and handoff: a waiter that finds the lock held counts itself in the `waiters`
//! counter and blocks in `BLPOP` on the `wake` list. A release that sees waiters does not
//! delete the lock: it gives it to a fresh token and pushes `"<fence> <ttl_ms> <token>"` to
//! the wake list; Redis hands that element to the waiter that blocked first, which then
//! holds the lock under that token. One release wakes exactly one waiter, and the lock
//! passes in the order waiters blocked. If nobody was blocked after all, the next acquire
//! attempt claims the pending handoff.

use std::sync::LazyLock;

use redis::Script;

/// How long a fencing counter lives. Expiry is safe: a missing counter is seeded from the
/// server clock, which is above every token handed out before; so the counter is given its
/// expiry once, when seeded, and never refreshed (one command less per acquisition).
pub(crate) const FENCE_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// `next_fence(key, expiry_ms)`: the next fencing token of a lock. A missing counter (first
/// use, expiry, or a restart without persistence) is seeded with the server time in
/// microseconds, so tokens keep increasing across such a loss as long as the server clock
/// does not step backwards.
const NEXT_FENCE: &str = r"
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

/// Acquire modes (ARGV[4] of [`ACQUIRE`]): a single attempt, counted as no waiter.
pub(crate) const MODE_ONCE: u8 = 0;
/// A failed attempt counts the caller as a new waiter.
pub(crate) const MODE_NEW_WAITER: u8 = 1;
/// The caller is already counted as a waiter; a grant uncounts it.
pub(crate) const MODE_COUNTED_WAITER: u8 = 2;
/// The last attempt of a counted waiter whose wait is over: uncounted whatever the outcome.
pub(crate) const MODE_LAST_ATTEMPT: u8 = 3;

/// Acquire: `SET lock token NX PX ttl`, and on success the next fencing token.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] wake list, KEYS[4] waiters counter
/// - ARGV[1] token, ARGV[2] ttl ms, ARGV[3] counter expiry ms (when seeded), ARGV[4] mode
///   (`MODE_*`), ARGV[5] how long a waiter's count lives, ms
/// - Returns `{1, fencing_token}` when acquired, `{0, pttl_ms}` when another owner holds it
///   (`pttl_ms` is -1 for a key without expiry).
///
/// Also acquired: a key that already holds the same token (an attempt repeated after a lost
/// reply), and a pending handoff nobody was blocked to take (the handoff's fencing token is
/// kept). The release that made the handoff uncounted one waiter for it: a counted caller
/// is that waiter; anyone else took it from a waiter still waiting, whose count comes back.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NEXT_FENCE}{}",
        r"
local mode = tonumber(ARGV[4])
local function uncount()
  if tonumber(redis.call('GET', KEYS[4]) or '0') > 0 then
    redis.call('DECR', KEYS[4])
  end
end
local function granted(fence)
  if mode >= 2 then
    uncount()
  end
  return {1, fence}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return granted(next_fence(KEYS[2], ARGV[3]))
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] and redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 1 then
  return granted(next_fence(KEYS[2], ARGV[3]))
end
local pending = redis.call('LINDEX', KEYS[3], 0)
if holder and pending then
  local fence, token = string.match(pending, '^(%d+) %d+ (.*)$')
  if token == holder then
    redis.call('DEL', KEYS[3])
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if mode < 2 and redis.call('EXISTS', KEYS[4]) == 1 then
      redis.call('INCR', KEYS[4])
    end
    return {1, tonumber(fence)}
  end
end
if mode == 3 then
  uncount()
  return {0, redis.call('PTTL', KEYS[1])}
end
if mode == 1 then
  redis.call('INCR', KEYS[4])
elseif mode == 2 and redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], 1)
end
if mode ~= 0 and redis.call('PTTL', KEYS[4]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
return {0, redis.call('PTTL', KEYS[1])}
"
    ))
});

/// Release: only while the lock holds our token. Without waiters the key is deleted; with
/// waiters the lock is handed to one of them (see the module documentation).
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] wake list, KEYS[4] waiters counter
/// - ARGV[1] token, ARGV[2] fresh token for a handoff, ARGV[3] ttl of a handoff in ms,
///   ARGV[4] counter expiry ms (when seeded)
/// - Returns 1 when released, 2 when handed to a waiter, 0 when the key no longer held the
///   token.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NEXT_FENCE}{}",
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(redis.call('GET', KEYS[4]) or '0') > 0 then
  redis.call('DECR', KEYS[4])
  local fence = next_fence(KEYS[2], ARGV[4])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], string.format('%d', fence) .. ' ' .. ARGV[3] .. ' ' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  return 2
end
redis.call('DEL', KEYS[1])
return 1
"
    ))
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
