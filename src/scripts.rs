//! The server-side Lua scripts of the lock protocol, one immutable value per script.
//!
//! Each runs with `EVALSHA` and falls back to `EVAL` on `NOSCRIPT` (a restarted or
//! failed-over server has an empty script cache; see [`crate::backend`]). Every key a
//! script touches is passed in `KEYS[]`, and all of them share one cluster slot (see
//! [`crate::keys`]).
//!
//! Waiting and handoff. A waiter that finds the lock held registers its own token in the
//! `queue` (a sorted set scored by when the registration lapses, by the server clock) and
//! blocks in `BLPOP` on the `wake` list, with an `ACQUIRE` pipelined behind the `BLPOP` so
//! that the server runs it the moment the `BLPOP` returns. A release that finds a live
//! registration does not delete the lock: it sets the key to a fresh handoff token for a
//! short *claim lease*, records that token as the pending `grant`, and pushes one element
//! to the wake list. Redis gives the element to the waiter that blocked first; that
//! waiter's `ACQUIRE` then finds the key still holding the pending grant and takes it,
//! setting the key to the waiter's own token with the waiter's ttl and drawing the next
//! fencing token. So a grant is only ever believed after it was confirmed against the key
//! (a stale wake element, a foreign `DEL`, an eviction or an expired grant changes the key,
//! and the waiter just tries again), one release wakes one waiter, the lock passes in the
//! order waiters blocked, and a grant nobody takes lapses after its claim lease.

use std::sync::LazyLock;

/// How long a fencing counter lives unused. Expiry is safe: tokens follow the server clock
/// anyway (see `NEXT_FENCE`).
pub(crate) const FENCE_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Shortest claim lease of a grant, ms: enough for a blocked waiter, which takes its grant
/// in the same server iteration, and for one that is between two round trips.
pub(crate) const MIN_CLAIM_MS: u64 = 200;

/// A Lua script: its text and SHA1, computed once.
pub(crate) struct Lua {
    pub code: String,
    pub sha: String,
}

impl Lua {
    pub(crate) fn new(code: String) -> Self {
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Lua { code, sha }
    }
}

/// `next_fence(key, expiry_ms)`: the next fencing token of a lock: the larger of the last
/// one plus one and the server's clock in microseconds (a hybrid logical clock). So tokens
/// strictly increase on one server, and also across a loss of the counter (a restart
/// without persistence, an expiry) or a failover to a replica that missed its last writes,
/// as long as the new server's clock is not behind the old one's by more than the time
/// between the last token issued before and the first after (seconds, for a failover).
/// The counter's expiry is refreshed with each token.
const NEXT_FENCE: &str = r"
local function next_fence(key, expiry_ms)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = math.max(tonumber(redis.call('GET', key) or '0') + 1, clock)
  redis.call('SET', key, string.format('%.0f', fence), 'PX', expiry_ms)
  return fence
end
";

/// `now_ms()`: the server's clock in milliseconds, for registrations' expiry.
const NOW_MS: &str = r"
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
";

/// Acquire modes (ARGV[4] of [`ACQUIRE`]): a single attempt; never registered as a waiter.
pub(crate) const MODE_ONCE: u8 = 0;
/// A waiter's attempt before it blocks: registers (or refreshes) it if the lock is held.
pub(crate) const MODE_WAITER: u8 = 1;
/// A waiter's attempt right after a block (pipelined behind its `BLPOP`): may take a
/// pending grant, whose wake element it may have popped; registers if still held.
pub(crate) const MODE_AFTER_BLOCK: u8 = 2;
/// As [`MODE_AFTER_BLOCK`], but the waiter's wait is over: withdraws its registration if
/// the lock is still held.
pub(crate) const MODE_LAST: u8 = 3;

/// Acquire: `SET lock token NX PX ttl`, and on success the next fencing token.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] wake list, KEYS[4] queue, KEYS[5] grant
/// - ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fencing counter expiry ms, ARGV[4] mode
///   (`MODE_*`), ARGV[5] the waiter's grace ms: how long its registration lives
///   unrefreshed, and the longest lease a taken grant gets
/// - Returns `{1, fencing_token, lease_ms}` when acquired (`lease_ms` is the ttl the key
///   was set to), `{0, pttl_ms}` when another owner holds it (`pttl_ms` is -1 for a key
///   without expiry).
///
/// A taken grant is leased for the shorter of the ttl and the grace, not for the ttl: if
/// the waiter died right after its pipelined attempt ran, nobody would hear of the grant,
/// and the lock must not stay blocked for a whole ttl. The waiter's renewal (or, for a
/// fixed lease, an extend right after the acquire) lengthens it to the ttl.
///
/// Also acquired: a key that already holds the same token (an attempt repeated after a lost
/// reply; the lease restarts from this attempt), and a pending grant, by a waiter just back
/// from a block, or by a registered waiter when the grant's wake element is still unpopped
/// (nobody was blocked when it was made). A caller that is not a registered waiter never
/// takes a grant: it would jump the queue.
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NEXT_FENCE}{NOW_MS}{}",
        r"
local token = ARGV[1]
local mode = tonumber(ARGV[4])
local function granted(lease)
  if mode ~= 0 then
    redis.call('ZREM', KEYS[4], token)
  end
  return {1, next_fence(KEYS[2], ARGV[3]), lease}
end
local function take_grant()
  local lease = math.min(tonumber(ARGV[2]), tonumber(ARGV[5]))
  redis.call('DEL', KEYS[5], KEYS[3])
  redis.call('SET', KEYS[1], token, 'PX', lease)
  return granted(lease)
end
if mode >= 2 then
  -- Back from a block: most likely for a grant (checked first, it is the hot path).
  local grant = redis.call('GET', KEYS[5])
  if grant and grant == redis.call('GET', KEYS[1]) then
    return take_grant()
  end
end
if redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  return granted(tonumber(ARGV[2]))
end
local holder = redis.call('GET', KEYS[1])
if holder == token then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return granted(tonumber(ARGV[2]))
end
if mode == 1 and holder == redis.call('GET', KEYS[5])
    and redis.call('ZSCORE', KEYS[4], token) and redis.call('LLEN', KEYS[3]) > 0 then
  return take_grant()
end
local pttl = redis.call('PTTL', KEYS[1])
if mode == 0 then
  return {0, pttl}
end
if mode == 3 then
  redis.call('ZREM', KEYS[4], token)
  return {0, pttl}
end
local lives = tonumber(ARGV[5])
redis.call('ZADD', KEYS[4], now_ms() + lives, token)
if redis.call('PTTL', KEYS[4]) < lives then
  redis.call('PEXPIRE', KEYS[4], lives)
end
return {0, pttl}
"
    ))
});

/// Release: only while the lock holds our token. Without a live registered waiter the key
/// is deleted; with one, the lock is granted to the first waiter to take it (see the module
/// documentation). Registrations that lapsed are pruned. A waiter that gives up runs it
/// with its own token and ARGV[5] = 1 (withdraw): that also removes its registration and
/// undoes a grant it may have taken without hearing of it.
///
/// - KEYS[1] lock, KEYS[2] wake list, KEYS[3] queue, KEYS[4] grant
/// - ARGV[1] token, ARGV[2] fresh handoff token, ARGV[3] shortest claim lease ms, ARGV[4]
///   longest claim lease ms (the releaser's grace), ARGV[5] 1 to withdraw a waiter. Between
///   the two leases, a grant lives as long as the registration of the last waiter to
///   refresh it.
/// - Returns 1 when released, 2 when granted to a waiter, 0 when the key no longer held the
///   token.
///
/// Under memory pressure (`maxmemory` with `noeviction`) a write that adds data may be
/// refused; the release then deletes the key without a handoff (a delete is never refused)
/// and the waiters find the lock free at their next attempt.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW_MS}{}",
        r"
local held = redis.call('GET', KEYS[1]) == ARGV[1]
if redis.call('EXISTS', KEYS[3]) == 0 then
  if not held then
    return 0
  end
else
  if ARGV[5] == '1' then
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  if not held then
    return 0
  end
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if last[2] then
    local claim = math.min(math.max(tonumber(last[2]) - now, tonumber(ARGV[3])), tonumber(ARGV[4]))
    local set = redis.pcall('SET', KEYS[1], ARGV[2], 'PX', claim)
    local pushed = type(set) ~= 'table' or not set.err
    if pushed then
      redis.call('DEL', KEYS[2])
      for _, r in ipairs({
        redis.pcall('SET', KEYS[4], ARGV[2], 'PX', claim),
        redis.pcall('RPUSH', KEYS[2], ARGV[2]),
      }) do
        if type(r) == 'table' and r.err then
          pushed = false
        end
      end
    end
    if pushed then
      redis.call('PEXPIRE', KEYS[2], claim)
      return 2
    end
    redis.call('DEL', KEYS[2], KEYS[4])
  end
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
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"
        .to_owned(),
    )
});
