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

/// `now_us()` and `now_ms()`: the server's clock in microseconds and in milliseconds
/// (`TIME`).
const NOW: &str = r"
local function now_us()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end
local function now_ms()
  return math.floor(now_us() / 1000)
end
";

/// The handoff of the release scripts (after [`next_fence`]'s text):
///
/// - `first_waiter(queue, now)`: the member and score of the first live registration in
///   `queue` (registrations that lapsed are pruned first), or nothing. `ZRANGE` and `ZREM`,
///   not `ZPOPMIN`: the commands a least-privilege user of 0.2 was granted suffice.
/// - `hand_over(member, score, queue, wake, fence, us, min_claim, max_claim, give, undo)`:
///   when `member` is a direct waiter's (`!<ttl>|<token>`), removes its registration (both
///   forms), makes the hold with `give(token, lease)` (a `redis.pcall` reply) for the
///   shorter of its ttl and its claim (what is left of its registration, between the two
///   bounds), draws its fencing token from `fence`, and pushes `g<fencing token>:<lease
///   ms>` to its own wake list, which expires with the lease. Returns the waiter's token
///   and the lease; `false` for a member that is not a direct waiter's; `nil` when a write
///   was refused (memory pressure), after `undo(token)` and the own list's removal.
///   `us`: the server's clock in microseconds.
/// - `own_list(wake, token)`: the own wake list of the waiter whose token is `token`,
///   beside the wake list `wake` (as [`crate::keys::LockKeys::own_wake`] names it).
/// - `written(...)`: whether none of the `redis.pcall` replies given is an error (a write
///   refused under memory pressure).
fn handoff() -> String {
    use crate::keys::{OWN_WAKE, RESERVED_PREFIX, WAKE};
    format!(
        r"
local function written(...)
  for _, reply in ipairs({{...}}) do
    if type(reply) == 'table' and reply.err then
      return false
    end
  end
  return true
end
local function own_list(wake, token)
  return '{RESERVED_PREFIX}{OWN_WAKE}' .. string.sub(wake, {}) .. ':' .. token
end
local function first_waiter(queue, now)
  local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) <= now then
    redis.call('ZREMRANGEBYSCORE', queue, '-inf', now)
    head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  end
  return head[1], tonumber(head[2])
end
local function hand_over(member, score, queue, wake, fence, us, min_claim, max_claim, give, undo)
  local ttl, waiter = string.match(member, '^!(%d+)|(.+)$')
  if not waiter then
    return false
  end
  local claim = math.min(math.max(score - math.floor(us / 1000), min_claim), max_claim)
  local lease = math.min(tonumber(ttl), claim)
  local own = own_list(wake, waiter)
  redis.call('ZREM', queue, member, waiter)
  local drawn, token = pcall(next_fence, fence, 0, us)
  local pushed = drawn and written(
    give(waiter, lease),
    redis.pcall('RPUSH', own, 'g' .. string.format('%.0f', token) .. ':' .. lease)
  )
  if pushed then
    redis.call('PEXPIRE', own, lease)
    return waiter, lease
  end
  undo(waiter)
  redis.call('DEL', own)
  return nil
end
",
        RESERVED_PREFIX.len() + WAKE.len() + 1
    )
}

/// `next_fence(key, estimate, read[, sent, last])`: the next fencing token of a lock and the
/// reading of the server's clock it made, if any. The token is the larger of the last one
/// plus one and the server's clock in microseconds (a hybrid logical clock), so tokens
/// strictly increase on one server, and also across a loss of the counter (a restart without persistence, an
/// expiry) or a failover to a replica that missed its last writes, as long as the new
/// server's clock is not behind the old one's by more than the time between the last token
/// issued before and the first after (seconds, for a failover). The clock is `read` when
/// the caller read it already; else the client's `estimate` (see
/// [`crate::core::server_time`], never ahead of the clock), or `TIME` when there is none
/// (0) or when the counter turns out to be missing: tokens before a loss followed the
/// clock, which an estimate may lag. One write in the common case: the clock goes in and
/// the last token comes back in the same `SET ... GET` (Redis 6.2); a second `SET` only
/// when the clock had not passed the last token. The counter's expiry is refreshed with
/// each token. `sent`: the caller already wrote `estimate` (a positive integer, written as
/// this function writes one) to the counter that way, and `last` is what came back (see
/// [`ACQUIRE`]'s single attempt).
fn next_fence() -> String {
    format!(
        r"
local function next_fence(key, estimate, read, sent, last)
  local clock = read or estimate
  if not sent then
    if clock <= 0 then
      read = now_us()
      clock = read
    end
    last = redis.call('SET', key, string.format('%.0f', clock), 'PX', {FENCE_TTL_MS}, 'GET')
  end
  local after = last and tonumber(last) + 1
  if not last and not read then
    read = now_us()
    after = read
  end
  if after and after > clock then
    redis.call('SET', key, string.format('%.0f', after), 'PX', {FENCE_TTL_MS})
    return after, read
  end
  return clock, read
end
"
    )
}

/// Acquire: `SET lock token NX PX ttl`, and on success the next fencing token.
///
/// A mutex's single attempt (mode 0) runs first, before the script defines any helper:
/// defining one costs the server a closure on every call (about 2.5 µs of server CPU per
/// acquire, measured on a fast loopback against the same logic written inline). When it takes the lock and the client's estimate of the clock
/// passed the last token, the estimate is the token ([`next_fence`]'s common case, written
/// out); otherwise [`next_fence`] goes on from the counter's reply.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] wake list, KEYS[4] queue, KEYS[5]
///   grant, KEYS[6] waiting flag, and for a reentrant lock KEYS[7] its holds (see
///   [`crate::kinds::Kind`]); then, for an attempt that leads a block, the waiter's own
///   wake list. A mutex's single attempt (mode 0) touches only the first two and passes
///   only those.
/// - ARGV[1] token, ARGV[2] ttl ms, ARGV[3] the client's estimate of the server's clock in
///   microseconds for the fencing token (0: unknown, the script reads `TIME`; see
///   [`crate::core::server_time`]; 1: no fencing token wanted, the counter is left alone
///   and the token returned is 0), ARGV[4] mode ([`crate::core::reply::Mode`]), ARGV[5]
///   the waiter's grace ms: how long its registration lives unrefreshed, and the longest
///   lease a taken grant gets; ARGV[6] how a waiter registers
///   ([`crate::kinds::Registration`]): `0` to be woken, `1` or `2` as a direct waiter,
///   whose registration names its ttl (`!<ttl>|<token>`) so that a release can hand it
///   the lock (see [`RELEASE`]), `2` when no attempt under the token led a block before;
///   for a reentrant lock ARGV[7] the owner
/// - Returns `{1, fencing_token, lease_ms}` when acquired (`lease_ms` is the ttl the key
///   was set to; a fourth element, the server's clock in microseconds, when the script
///   read it), `{0, pttl_ms}` when another owner holds it (`pttl_ms` is -1 for a key
///   without expiry; for an attempt that leads a block, a bulk string of 11 characters,
///   zero-padded, so that the reply is always 26 bytes long: see
///   `connection::QUIET_BYTES`), and for a reentrant lock its owner already holds `{2,
///   fencing_token, lease_ms, token}`: one more hold of that acquisition (its token and
///   fencing token), whose lease is now at least the ttl.
///
/// A registration also sets the waiting flag, to expire with the queue: a release looks
/// at the queue only when the flag is there. Both are given twice a registration's life
/// when less than one is left, so that most registrations need not refresh them. A
/// registration's lapse is counted from `TIME`, and releases serve registrations in the
/// order they lapse: the order waiters last registered, to the millisecond.
///
/// An attempt that leads a block (a waiter's first, mode 4; a direct waiter's every one,
/// mode 4 or 2) goes in one write with the block on its own wake list and the wake list.
/// It registers like mode 1, after emptying its own wake list: what the block pops was
/// then pushed after the attempt ran. (Only releases that hand the lock to a registration
/// of the token, which an attempt leading a block made, and such attempts push there: the
/// first of them under a token, ARGV[6] `2`, finds the list empty, and leaves it.) When
/// it takes the lock (or finds it handed to its token already) it pushes to the own wake
/// list, so that the block returns at once.
///
/// A taken grant is leased for the shorter of the ttl and the grace, not for the ttl: if
/// the waiter died right after its pipelined attempt ran, nobody would hear of the grant,
/// and the lock must not stay blocked for a whole ttl. The waiter's renewal (or, for a
/// fixed lease, an extend right after the acquire) lengthens it to the ttl.
///
/// Also acquired: a key that already holds the same token (an attempt repeated after a lost
/// reply, or a late copy of one: the lease restarts from this attempt but is never
/// shortened, since an extend may have lengthened it), and a pending grant, by a waiter
/// just back from a block, or by a registered waiter when the grant's wake element is
/// still unpopped (nobody was blocked when it was made). A caller that is not a registered
/// waiter never takes a grant: it would jump the queue.
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{}{NOW}{}{}",
        format_args!(
            r"
-- A mutex's single attempt, the most common acquire, runs before any helper is defined (a
-- definition costs a closure on every call). When it takes the lock with an estimate of
-- the clock that passed the last fencing token (the common case), that is the token: the
-- estimate goes to the counter as it came (an integer as next_fence would write it: no
-- leading zero, exact in a Lua number), and the last token comes back in one SET.
local single = ARGV[4] == '0' and not ARGV[7]
local taken, estimate, last
local sent = false
if single then
  taken = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
  estimate = tonumber(ARGV[3]) or 0
  if taken and estimate > 1 and estimate < 9007199254740992
      and string.find(ARGV[3], '^[1-9]%d*$') then
    sent = true
    last = redis.call('SET', KEYS[2], ARGV[3], 'PX', '{FENCE_TTL_MS}', 'GET')
    if last and tonumber(last) + 1 <= estimate then
      return {{1, estimate, tonumber(ARGV[2])}}
    end
  end
end
"
        ),
        next_fence(),
        r"
if taken then
  -- The single attempt took it: the fencing token, from where it left off.
  local fence, read = 0, nil
  if ARGV[3] ~= '1' then
    fence, read = next_fence(KEYS[2], estimate, nil, sent, last)
  end
  if read then
    return {1, fence, tonumber(ARGV[2]), read}
  end
  return {1, fence, tonumber(ARGV[2])}
end
local token = ARGV[1]
local mode = tonumber(ARGV[4])
local owner = ARGV[7]
-- A waiter's registration: a direct waiter's names its ttl, so that a release can hand it
-- the lock itself (see RELEASE). Its other form, if any, goes with it.
local direct = '!' .. ARGV[2] .. '|' .. token
local handed = ARGV[6] == '1' or ARGV[6] == '2'
local member = handed and direct or token
-- A leading attempt (its waiter's own wake list passed last) that takes the lock leaves a
-- wake-up there, which the block pipelined behind it pops at once.
local own = KEYS[owner and 8 or 7]
-- A busy reply; an attempt that leads a block gives its pttl as a bulk string of a fixed
-- width, so that the reply's length is known (see QUIET_BYTES in the client).
local function busy(pttl)
  if own then
    return {0, string.format('%011d', pttl)}
  end
  return {0, pttl}
end
local function wake_self()
  if own then
    redis.call('RPUSH', own, '1')
    redis.call('PEXPIRE', own, ARGV[5])
  end
end
if owner then
  -- Reentrant: the owner of the current hold takes it once more.
  local holder = redis.call('GET', KEYS[1])
  local h = holder and redis.call('HMGET', KEYS[7], 't', 'o', 'f')
  if h and h[1] == holder and h[2] == owner then
    redis.call('HSET', KEYS[7], 'h:' .. token, 1)
    local lease = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2]))
    redis.call('PEXPIRE', KEYS[1], lease)
    redis.call('PEXPIRE', KEYS[7], lease)
    if mode ~= 0 then
      redis.call('ZREM', KEYS[4], token, direct)
    end
    wake_self()
    return {2, tonumber(h[3]), lease, holder}
  end
end
local function granted(lease)
  if mode ~= 0 then
    redis.call('ZREM', KEYS[4], token, direct)
  end
  wake_self()
  local fence, read = 0, nil
  if ARGV[3] ~= '1' then
    fence, read = next_fence(KEYS[2], tonumber(ARGV[3]) or 0, nil)
  end
  if owner then
    redis.call('DEL', KEYS[7])
    redis.call('HSET', KEYS[7], 't', token, 'o', owner, 'f', string.format('%.0f', fence), 'h:' .. token, 1)
    redis.call('PEXPIRE', KEYS[7], lease)
  end
  if read then
    return {1, fence, lease, read}
  end
  return {1, fence, lease}
end
local function take_grant()
  local lease = math.min(tonumber(ARGV[2]), tonumber(ARGV[5]))
  redis.call('DEL', KEYS[5], KEYS[3])
  redis.call('SET', KEYS[1], token, 'PX', lease)
  return granted(lease)
end
local holder
if mode == 0 then
  -- (A mutex's single attempt tried this above.)
  if owner and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
    return granted(tonumber(ARGV[2]))
  end
  holder = redis.call('GET', KEYS[1])
else
  if mode == 2 or mode == 3 then
    -- After a block: perhaps for a grant through the wake list (checked first).
    local got = redis.call('MGET', KEYS[5], KEYS[1])
    if got[1] and got[1] == got[2] then
      return take_grant()
    end
    -- MGET reads another kind's key (a semaphore, a read-write lock that took the name
    -- meanwhile) as nil: GET fails on it with WRONGTYPE, as every other attempt does.
    holder = got[2] or redis.call('GET', KEYS[1])
  else
    holder = redis.call('GET', KEYS[1])
  end
  if not holder then
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
    return granted(tonumber(ARGV[2]))
  end
end
if holder == token then
  -- An attempt repeated (its reply was lost), a stale copy of one arriving late, or a
  -- waiter finding the lock a release handed it: the lease is never shortened (an extend
  -- may have lengthened it since).
  local lease = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2]))
  redis.call('PEXPIRE', KEYS[1], lease)
  return granted(lease)
end
if mode == 1 and holder == redis.call('GET', KEYS[5])
    and redis.call('ZSCORE', KEYS[4], member) and redis.call('LLEN', KEYS[3]) > 0 then
  return take_grant()
end
local pttl = redis.call('PTTL', KEYS[1])
if mode == 0 then
  return {0, pttl}
end
if mode == 3 then
  redis.call('ZREM', KEYS[4], token, direct)
  return {0, pttl}
end
local lives = tonumber(ARGV[5])
if own and ARGV[6] ~= '2' then
  -- Whatever a block behind this attempt pops was pushed after it ran: a lock handed to
  -- this token before now (and lost since, or this attempt would have found it) is gone.
  -- (The first attempt under a token to lead a block finds nothing to empty.)
  redis.call('DEL', own)
end
-- By the server's clock: releases hand the lock over in the order of these scores (a
-- client's estimate of the clock may lag another's).
redis.call('ZADD', KEYS[4], now_ms() + lives, member)
if redis.call('PTTL', KEYS[4]) < lives then
  -- Twice the registration's life: the next registrations need not refresh it.
  redis.call('PEXPIRE', KEYS[4], 2 * lives)
  redis.call('SET', KEYS[6], '1', 'PX', 2 * lives)
end
return busy(pttl)
"
    ))
});

/// Acquire all: several mutexes on one server (one Cluster slot), all or none, in one
/// step. Each name is taken as a single attempt ([`ACQUIRE`] in mode 0) would take it; a
/// name already held under its given token counts as taken.
///
/// - KEYS: per name, its lock and its fencing counter (`KEYS[2i-1]`, `KEYS[2i]`), in the
///   caller's order.
/// - ARGV[1] ttl ms, ARGV[2] the client's estimate of the server's clock in microseconds
///   (as [`ACQUIRE`]'s ARGV[3]), ARGV[3] one character per name: `1` for a name the caller
///   already holds (taken by an ordinary acquire while it waited) under its token, which is
///   only checked, `0` for one to take; then ARGV[3+i] the token of name i.
/// - Returns `{1, clock_us or 0, fence_1, lease_1, ..., fence_n, lease_n}` when every name
///   is the caller's now (a held name's pair is `0, 0`: it keeps its own lease and fencing
///   token); `{0, i, pttl_ms}` when name `i` (the first in the caller's order) is held by
///   another token, or is a held name whose key no longer holds its token: nothing was
///   written then; `{3, i}` when name `i` is a lock of another kind.
pub(crate) static ACQUIRE_ALL: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}{}",
        next_fence(),
        r"
local n = #KEYS / 2
local ttl = tonumber(ARGV[1])
local held = ARGV[3]
local holders = {}
for i = 1, n do
  local got = redis.pcall('GET', KEYS[2 * i - 1])
  if type(got) == 'table' and got.err then
    return {3, i}
  end
  local token = ARGV[3 + i]
  if got ~= token and (got or string.sub(held, i, i) == '1') then
    return {0, i, redis.call('PTTL', KEYS[2 * i - 1])}
  end
  holders[i] = got
end
local out = {1, 0}
local read = nil
for i = 1, n do
  if string.sub(held, i, i) == '1' then
    out[2 * i + 1] = 0
    out[2 * i + 2] = 0
  else
    local key, token = KEYS[2 * i - 1], ARGV[3 + i]
    local lease = ttl
    if holders[i] == token then
      -- An attempt repeated: the lease is never shortened.
      lease = math.max(redis.call('PTTL', key), ttl)
      redis.call('PEXPIRE', key, lease)
    else
      redis.call('SET', key, token, 'PX', ttl)
    end
    local fence = 0
    if ARGV[2] ~= '1' then
      fence, read = next_fence(KEYS[2 * i], tonumber(ARGV[2]) or 0, read)
    end
    out[2 * i + 1] = fence
    out[2 * i + 2] = lease
  end
end
out[2] = read or 0
return out
"
    ))
});

/// Release: only while the lock holds our token. Without a live registered waiter the key
/// is deleted. With one, the lock goes to the waiter that registered first (whose
/// registration lapses first):
///
/// - a *direct* waiter's registration names its ttl. The release sets the key to that
///   waiter's token for the shorter of its ttl and its claim lease, draws its fencing token,
///   and pushes `g<fencing token>:<lease ms>` to the waiter's own wake list (which expires
///   with the key), where the waiter is blocked: the lock is the waiter's at once, and the
///   reply is `{2, waiter's token}`;
/// - any other registration (a waiter of version 0.2, of a reentrant lock, or one whose
///   writes replicas must acknowledge) is served through the wake list and the pending
///   grant, as the module documentation says; the reply is 2.
///
/// Registrations that lapsed are pruned. A waiter that gives up runs it with its own token
/// and ARGV[5] = 1 (withdraw): that also removes its registration and undoes a grant it
/// may have been handed or have taken without hearing of it.
///
/// - KEYS[1] lock, KEYS[2] wake list, KEYS[3] queue, KEYS[4] grant, KEYS[5] waiting flag,
///   KEYS[6] fencing counter, and for a reentrant lock KEYS[7] its holds. A direct waiter's
///   own wake list is KEYS[2], `:` and its token: in the same slot, named by the waiter.
/// - ARGV[1] token, ARGV[2] fresh handoff token, ARGV[3] shortest claim lease ms, ARGV[4]
///   longest claim lease ms (the releaser's grace), ARGV[5] 1 to withdraw a waiter,
///   ARGV[6] the withdrawing waiter's ttl ms (which its registration names); for a
///   reentrant lock ARGV[7] the owner. Between the two leases, a grant lives as long as the
///   registration of the waiter it goes to (through the wake list: of the last waiter to
///   refresh it).
/// - Returns 1 when released, 2 or `{2, token}` when granted to a waiter, 3 when one hold
///   of a reentrant lock was given back and others remain, 0 when the key no longer held
///   the token (or, reentrant, it is another owner's, or the hold named is not there). For
///   a reentrant lock ARGV[1] names one hold (the token of the acquire that made it; the
///   first hold's is the key's token), and the key is released with the last hold: a hold
///   given back twice releases nothing the second time, even under the key's token.
///
/// Under memory pressure (`maxmemory` with `noeviction`) a write that adds data may be
/// refused; the release then deletes the key without a handoff (a delete is never refused)
/// and the waiters find the lock free at their next attempt.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{}{NOW}{}{}{}",
        r"
local got = redis.call('MGET', KEYS[1], KEYS[5])
if got[1] == ARGV[1] and not got[2] and ARGV[5] ~= '1' and not ARGV[7] then
  -- A mutex released with nobody registered, the most common release: nothing more to
  -- define.
  redis.call('DEL', KEYS[1])
  return 1
end
",
        next_fence(),
        handoff(),
        r"
local holder, waiting = got[1], got[2]
local held = holder == ARGV[1]
local owner = ARGV[7]
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1], '!' .. ARGV[6] .. '|' .. ARGV[1])
end
if owner and holder then
  -- Reentrant: ARGV[1] is one hold of the owner's; the lock goes with the last hold.
  local h = redis.call('HMGET', KEYS[7], 't', 'o')
  if h[1] == holder then
    if h[2] ~= owner then
      return 0
    end
    if redis.call('HDEL', KEYS[7], 'h:' .. ARGV[1]) == 0 then
      -- That hold was given back already: nothing of the lock goes with it.
      return 0
    end
    if redis.call('HLEN', KEYS[7]) > 3 then
      return 3
    end
    held = true
  end
end
if not held then
  return 0
end
if owner then
  redis.call('DEL', KEYS[7])
end
if not waiting then
  -- Nobody registered since the flag last lapsed: no queue to look at.
  redis.call('DEL', KEYS[1])
  return 1
end
local us = now_us()
local now = math.floor(us / 1000)
local member, score = first_waiter(KEYS[3], now)
if not member then
  redis.call('DEL', KEYS[1], KEYS[5])
  return 1
end
-- A direct waiter: the lock is its own now, with its fencing token.
local waiter = hand_over(member, score, KEYS[3], KEYS[2], KEYS[6], us, tonumber(ARGV[3]),
  tonumber(ARGV[4]), function(token, lease)
    return redis.pcall('SET', KEYS[1], token, 'PX', lease)
  end, function()
    redis.call('DEL', KEYS[1])
  end)
if waiter then
  return {2, waiter}
elseif waiter == nil then
  return 1
end
-- Another waiter: through the wake list, which its first blocked waiter pops.
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local claim = math.min(math.max(tonumber(last[2]) - now, tonumber(ARGV[3])), tonumber(ARGV[4]))
local pushed = written(redis.pcall('SET', KEYS[1], ARGV[2], 'PX', claim))
if pushed then
  redis.call('DEL', KEYS[2])
  pushed = written(
    redis.pcall('SET', KEYS[4], ARGV[2], 'PX', claim),
    redis.pcall('RPUSH', KEYS[2], ARGV[2])
  )
end
if pushed then
  redis.call('PEXPIRE', KEYS[2], claim)
  return 2
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
return 1
"
    ))
});

/// Adopt: whether a mutex's key holds `token` now, with the lease it has left and the last
/// fencing token drawn for it (the holder's: no later acquisition can have drawn one while
/// the key held the token). Reads only.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] a reentrant lock's holds
/// - ARGV[1] token
/// - Returns `{1, pttl_ms, fence or false}` when the key holds the token, `{0}` when it does
///   not, `{2}` when it is a reentrant lock's (whose holds belong to their owner), `{3}`
///   when the name is a lock of another kind (a semaphore, a read-write lock).
pub(crate) static ADOPT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' then
  return {kind == 'none' and 0 or 3}
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
if redis.call('HGET', KEYS[3], 't') == ARGV[1] then
  return {2}
end
return {1, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"
        .to_owned(),
    )
});

/// Extend (renew): a lease of at least the new ttl, only while the lock holds our token.
///
/// - KEYS[1] lock key, and for a reentrant lock KEYS[2] its holds (extended alike). The
///   lease is never shortened: another holder of the same token (a reentrant lock's other
///   holds, a process that adopted the lock) counts on the longest ttl any of them asked
///   for, and learns of no other's extend.
/// - ARGV[1] token, ARGV[2] new ttl in ms (never 0: `PEXPIRE key 0` deletes the key)
/// - Returns 1 when extended, 0 when the key no longer held the token.
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local ttl = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2]))
  if KEYS[2] then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  return redis.call('PEXPIRE', KEYS[1], ttl)
end
return 0
"
        .to_owned(),
    )
});

/// Helpers of the semaphore and read-write lock scripts: a registration of a waiter (as in
/// [`ACQUIRE`]; `now`, the server's clock in ms, which the attempt has read already), the
/// wake-up an attempt that leads a block and took a hold leaves on its own wake list (its
/// last key, passed only then), and the wake-ups a release leaves for blocked waiters:
/// added to those not popped yet (another release's), up to one per live registration.
const WAITERS: &str = r"
local function register(queue, token, member, direct, mode, lives, own, first, now)
  if mode == 3 then
    redis.call('ZREM', queue, token, direct)
  elseif mode ~= 0 then
    if own and not first then
      -- What the block behind this attempt pops was pushed after it ran (see ACQUIRE).
      redis.call('DEL', own)
    end
    redis.call('ZADD', queue, now + lives, member)
    if redis.call('PTTL', queue) < lives then
      redis.call('PEXPIRE', queue, 2 * lives)
    end
  end
end
local function wake_self(own, lives)
  if own then
    redis.call('RPUSH', own, '1')
    redis.call('PEXPIRE', own, lives)
  end
end
local function busy(ms, own)
  if own then
    -- (A fixed width: see ACQUIRE.)
    return {0, string.format('%011d', ms)}
  end
  return {0, ms}
end
local function wake(wakeup, queue, count, lives)
  if redis.call('EXISTS', queue) == 0 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', queue, '-inf', now_ms())
  local have = redis.call('LLEN', wakeup)
  local want = math.min(redis.call('ZCARD', queue), have + count)
  if want > have then
    for _ = have + 1, want do
      redis.call('RPUSH', wakeup, '1')
    end
    redis.call('PEXPIRE', wakeup, lives)
  end
end
";

/// Semaphore acquire: a permit is the token as a member of the sorted set under the
/// semaphore's key, scored by when it expires (the server's clock, so a crashed holder's
/// permit frees itself after its ttl whatever the clients' clocks say).
///
/// - KEYS[1] semaphore, KEYS[2] fencing counter, KEYS[3] wake list, KEYS[4] queue; then,
///   for an attempt that leads a block, the waiter's own wake list
/// - ARGV[1] token, ARGV[2] ttl ms, ARGV[3] (unused: permits expire by the server's
///   clock, which the script reads anyway), ARGV[4] mode ([`crate::core::reply::Mode`]),
///   ARGV[5] the waiter's grace ms, ARGV[6] permits, ARGV[7] how the waiter registers (as
///   [`ACQUIRE`]'s ARGV[6]; a direct waiter's registration lets a release hand it its
///   permit, see [`RELEASE_PERMIT`])
/// - Returns `{1, fencing_token, ttl_ms, clock_us}` when a permit is taken (`clock_us`:
///   the server's clock), `{0, ms}` when all are held (`ms`, of a fixed width for an
///   attempt that leads a block as in [`ACQUIRE`]: until the first of them
///   expires).
///
/// A permit held under the token already (a repeated or late attempt, or a permit a
/// release handed to this waiter) counts as taken. A free permit goes to whoever asks
/// first: a newcomer may take it before a registered waiter.
pub(crate) static ACQUIRE_PERMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}{WAITERS}{}",
        next_fence(),
        r"
local token, ttl, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local direct = '!' .. ARGV[2] .. '|' .. token
local member = (ARGV[7] == '1' or ARGV[7] == '2') and direct or token
local clock = now_us()
local now = math.floor(clock / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local taken = redis.call('ZSCORE', KEYS[1], token)
if taken or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[6]) then
  -- A permit this token holds already (a repeated or late attempt) is never shortened.
  local expiry = math.max(now + ttl, tonumber(taken) or 0)
  redis.call('ZADD', KEYS[1], expiry, token)
  if redis.call('PTTL', KEYS[1]) < expiry - now then
    redis.call('PEXPIRE', KEYS[1], expiry - now)
  end
  if mode ~= 0 then
    redis.call('ZREM', KEYS[4], token, direct)
  end
  wake_self(KEYS[5], ARGV[5])
  return {1, (next_fence(KEYS[2], clock, clock)), expiry - now, clock}
end
register(KEYS[4], token, member, direct, mode, tonumber(ARGV[5]), KEYS[5], ARGV[7] == '2', now)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return busy(math.max(tonumber(first[2]) - now, 0), KEYS[5])
"
    ))
});

/// Semaphore extend: the permit's new expiry, if it is still held.
///
/// - KEYS[1] semaphore; ARGV[1] token, ARGV[2] ttl ms
/// - Returns 1 when extended, 0 when the permit was gone.
pub(crate) static EXTEND_PERMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}",
        r"
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"
    ))
});

/// Semaphore release: gives the permit back, and hands it to the first live registration
/// when that is a direct waiter's (as [`RELEASE`] hands a mutex: the permit under the
/// waiter's token for the shorter of its ttl and what is left of its registration, its
/// fencing token drawn, `g<fencing token>:<lease ms>` pushed to its own wake list); else
/// wakes one waiter, which tries again. With ARGV[3] = 1 a waiter that gives up withdraws
/// its registration (and a permit it may have been handed or taken unawares).
///
/// - KEYS[1] semaphore, KEYS[2] wake list, KEYS[3] queue, KEYS[4] fencing counter
/// - ARGV[1] token, ARGV[2] grace ms (how long a wake-up waits, and the longest a handed
///   permit lives before its waiter renews it), ARGV[3] withdraw, ARGV[4] the withdrawing
///   waiter's ttl ms, ARGV[5] the shortest lease of a handed permit, ms
/// - Returns 1 when the permit was held (and is given back), `{1, token}` when it was
///   handed to the waiter whose token that is, 0 when it was not held (also when the name
///   is a lock of another kind now, `WRONGTYPE`; any other error is the reply).
pub(crate) static RELEASE_PERMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}{}{WAITERS}{}",
        next_fence(),
        handoff(),
        r"
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1], '!' .. ARGV[4] .. '|' .. ARGV[1])
end
local expiry = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(expiry) == 'table' then
  -- Not held when the name is a lock of another kind now; any other error is the reply.
  return string.find(expiry.err, '^WRONGTYPE') and 0 or expiry
end
if not expiry then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
local us = now_us()
local now = math.floor(us / 1000)
if tonumber(expiry) <= now then
  return 0
end
local member, score = first_waiter(KEYS[3], now)
if member then
  -- A direct waiter: the permit is its own now, with its fencing token.
  local waiter, lease = hand_over(member, score, KEYS[3], KEYS[2], KEYS[4], us,
    tonumber(ARGV[5]), tonumber(ARGV[2]), function(token, lease)
      return redis.pcall('ZADD', KEYS[1], now + lease, token)
    end, function(token)
      redis.call('ZREM', KEYS[1], token)
    end)
  if waiter then
    if redis.call('PTTL', KEYS[1]) < lease then
      redis.call('PEXPIRE', KEYS[1], lease)
    end
    return {1, waiter}
  end
end
wake(KEYS[2], KEYS[3], 1, tonumber(ARGV[2]))
return 1
"
    ))
});

/// Read-write lock acquire. The lock's key is a hash: field `w` holds
/// `"<expiry ms> <token>"` of the writer, fields `r:<token>` the expiry of each reader (the
/// server's clock). A waiting writer registers in the writers' queue, which keeps new
/// readers out (no writer starvation); readers that wait register in the readers' queue.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] (unused: the wake list, declared for
///   symmetry), KEYS[4] writers' queue, KEYS[5] readers' queue, KEYS[6] readers' wake list
///   (a writer that gives up wakes the readers it kept out); then, for an attempt that
///   leads a block, the waiter's own wake list
/// - ARGV[1] token, ARGV[2] ttl ms, ARGV[3] (unused, as for a semaphore), ARGV[4] mode,
///   ARGV[5] the waiter's grace ms, ARGV[6] `w` or `r`, ARGV[7] how a waiting writer
///   registers (as [`ACQUIRE`]'s ARGV[6]; a direct writer's registration lets a release
///   hand it the lock, see [`RELEASE_RW`])
/// - Returns `{1, fencing_token, ttl_ms, clock_us}` or `{0, ms}` (`ms` of a fixed width
///   for an attempt that leads a block, as in [`ACQUIRE`]; until the first holder
///   expires).
pub(crate) static ACQUIRE_RW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}{WAITERS}{}",
        next_fence(),
        r"
local token, ttl, mode, side = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), ARGV[6]
local direct = '!' .. ARGV[2] .. '|' .. token
local member = (ARGV[7] == '1' or ARGV[7] == '2') and direct or token
local clock = now_us()
local now = math.floor(clock / 1000)
-- Prune holders whose lease ended; note the first expiry left.
local first = nil
local fields = redis.call('HGETALL', KEYS[1])
local writer = nil
-- Live holds by field: their expiry.
local expiries = {}
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  local expiry, holder = string.match(value, '^(%d+) ?(.*)$')
  expiry = tonumber(expiry)
  if not expiry or expiry <= now then
    redis.call('HDEL', KEYS[1], name)
  else
    if name == 'w' then writer = holder end
    expiries[name] = expiry
    if not first or expiry < first then first = expiry end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
-- `field` taken (again) until now + ttl, or later if it was held under this token
-- already (a repeated or late attempt never shortens a hold an extend lengthened).
local function granted(field, suffix)
  local expiry = math.max(now + ttl, expiries[field] or 0)
  redis.call('HSET', KEYS[1], field, string.format('%.0f', expiry) .. suffix)
  if redis.call('PTTL', KEYS[1]) < expiry - now then
    redis.call('PEXPIRE', KEYS[1], expiry - now)
  end
  if mode ~= 0 then
    redis.call('ZREM', side == 'w' and KEYS[4] or KEYS[5], token, direct)
  end
  wake_self(KEYS[7], ARGV[5])
  return {1, (next_fence(KEYS[2], clock, clock)), expiry - now, clock}
end
if side == 'w' then
  if writer == token or redis.call('HLEN', KEYS[1]) == 0 then
    return granted('w', ' ' .. token)
  end
  register(KEYS[4], token, member, direct, mode, tonumber(ARGV[5]), KEYS[7], ARGV[7] == '2', now)
  if mode == 3 and not writer and redis.call('ZCOUNT', KEYS[4], now, '+inf') == 0 then
    -- This writer gave up, and no other waits: the readers it kept out may come in.
    wake(KEYS[6], KEYS[5], 64, tonumber(ARGV[5]))
  end
else
  local again = redis.call('HEXISTS', KEYS[1], 'r:' .. token) == 1
  if again or (not writer and redis.call('ZCARD', KEYS[4]) == 0) then
    return granted('r:' .. token, '')
  end
  register(KEYS[5], token, token, token, mode, tonumber(ARGV[5]), KEYS[7], false, now)
end
return busy(first and math.max(first - now, 0) or -1, KEYS[7])
"
    ))
});

/// Read-write lock extend: the hold's new expiry, if it is still held.
///
/// - KEYS[1] lock; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] `w` or `r`
/// - Returns 1 when extended, 0 when the hold was gone.
pub(crate) static EXTEND_RW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}",
        r"
local now, ttl = now_ms(), tonumber(ARGV[2])
local field = ARGV[3] == 'w' and 'w' or 'r:' .. ARGV[1]
local value = redis.call('HGET', KEYS[1], field)
if not value then
  return 0
end
local expiry, holder = string.match(value, '^(%d+) ?(.*)$')
if tonumber(expiry) <= now or (ARGV[3] == 'w' and holder ~= ARGV[1]) then
  return 0
end
if ARGV[3] == 'w' then
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', now + ttl) .. ' ' .. ARGV[1])
else
  redis.call('HSET', KEYS[1], field, string.format('%.0f', now + ttl))
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
"
    ))
});

/// Read-write lock release: gives the hold back. When the lock is then free (no hold left
/// whose lease has not ended: those that have are pruned), it goes to a
/// waiting writer first (so a stream of readers cannot starve them): handed to the first
/// live registration when that is a direct writer's (as [`RELEASE`] hands a mutex over:
/// field `w` under the writer's token for the shorter of its ttl and what is left of its
/// registration, its fencing token drawn, `g<fencing token>:<lease ms>` pushed to its own
/// wake list), else one waiting writer is woken; without a waiting writer, every waiting
/// reader (up to 64) is woken. Readers and writers block on wake lists of their own.
///
/// - KEYS[1] lock, KEYS[2] writers' wake list, KEYS[3] writers' queue, KEYS[4] readers'
///   queue, KEYS[5] readers' wake list, KEYS[6] fencing counter
/// - ARGV[1] token, ARGV[2] grace ms, ARGV[3] withdraw, ARGV[4] `w` or `r`, ARGV[5] the
///   withdrawing waiter's ttl ms, ARGV[6] the shortest lease of a lock handed over, ms
/// - Returns 1 when the hold was there (and is given back), `{1, token}` when the lock was
///   then handed to the writer whose token that is, 0 when the hold was not there (also
///   when the name is a lock of another kind now, `WRONGTYPE`; any other error is the
///   reply).
pub(crate) static RELEASE_RW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}{}{}{WAITERS}{}",
        next_fence(),
        handoff(),
        r"
if ARGV[3] == '1' then
  -- (Registered in either form, or both.)
  local was_waiting_writer =
    redis.call('ZREM', KEYS[3], ARGV[1], '!' .. ARGV[5] .. '|' .. ARGV[1]) > 0
  redis.call('ZREM', KEYS[4], ARGV[1])
  if was_waiting_writer then
    local writer = redis.pcall('HGET', KEYS[1], 'w')
    if type(writer) == 'table' then
      -- Another kind now (no hold, nobody of this kind to wake), or another error.
      return string.find(writer.err, '^WRONGTYPE') and 0 or writer
    end
    if not writer and redis.call('ZCOUNT', KEYS[3], now_ms(), '+inf') == 0 then
      -- A writer that gives up wakes the readers it kept out.
      wake(KEYS[5], KEYS[4], 64, tonumber(ARGV[2]))
    end
  end
end
local field = ARGV[4] == 'w' and 'w' or 'r:' .. ARGV[1]
local value = redis.pcall('HGET', KEYS[1], field)
if type(value) == 'table' then
  -- Not held when the name is a lock of another kind now; any other error is the reply.
  return string.find(value.err, '^WRONGTYPE') and 0 or value
end
if not value then
  return 0
end
local expiry, holder = string.match(value, '^(%d+) ?(.*)$')
if ARGV[4] == 'w' and holder ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], field)
local us = now_us()
local now = math.floor(us / 1000)
if tonumber(expiry) <= now then
  return 0
end
local lives = tonumber(ARGV[2])
-- The holds left whose lease has not ended (a crashed holder's that has is pruned, as an
-- acquire would: it must not keep waiters out).
local live = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local left = tonumber(string.match(fields[i + 1], '^(%d+)'))
  if not left or left <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    live = live + 1
  end
end
if live == 0 then
  -- Free: a waiting writer first (handed over, or one wake-up); otherwise every waiting
  -- reader.
  local member, score = first_waiter(KEYS[3], now)
  if member then
    local waiter, lease = hand_over(member, score, KEYS[3], KEYS[2], KEYS[6], us,
      tonumber(ARGV[6]), lives, function(token, lease)
        return redis.pcall('HSET', KEYS[1], 'w', string.format('%.0f', now + lease) .. ' ' .. token)
      end, function()
        redis.call('DEL', KEYS[1])
      end)
    if waiter then
      redis.call('PEXPIRE', KEYS[1], lease)
      return {1, waiter}
    end
    wake(KEYS[2], KEYS[3], 1, lives)
  else
    wake(KEYS[5], KEYS[4], 64, lives)
  end
end
return 1
"
    ))
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::support::RedisServer;

    /// A mutex's single attempt on `lock`, with `estimate` as the client's clock (ARGV[3]):
    /// its fencing token.
    fn single_attempt(server: &RedisServer, lock: &str, estimate: &str) -> u64 {
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(&ACQUIRE.code)
            .arg(2)
            .arg(lock)
            .arg("fence")
            .arg(format!("token-of-{lock}"))
            .arg(30_000)
            .arg(estimate)
            .arg("0")
            .query(&mut server.conn())
            .expect("the acquire script runs");
        assert_eq!(reply[0], 1, "{lock} is taken: {reply:?}");
        reply[1] as u64
    }

    /// The single attempt's short way to a fencing token (the estimate as the token, written
    /// as it came) is taken only for an estimate written as `next_fence` would write it: a
    /// fraction, a leading zero or an exponent goes the long way, so that the token still
    /// passes the last one and the counter holds a plain integer.
    #[test]
    fn a_single_attempts_estimate_is_the_token_only_as_a_plain_integer() {
        let server = RedisServer::start();
        let counter = || server.get("fence").expect("the counter exists");
        server.cmd::<()>(&["SET", "fence", "5"]);
        assert_eq!(
            single_attempt(&server, "a", "5.5"),
            6,
            "past the last token, 5"
        );
        assert_eq!(counter(), "6");
        assert_eq!(single_attempt(&server, "b", "0007"), 7);
        assert_eq!(counter(), "7");
        assert_eq!(single_attempt(&server, "c", "1e3"), 1000);
        assert_eq!(counter(), "1000");
        // The common case: the estimate as it came.
        assert_eq!(single_attempt(&server, "d", "2000"), 2000);
        assert_eq!(counter(), "2000");
        // An estimate that did not pass the last token: the one after it.
        assert_eq!(single_attempt(&server, "e", "2000"), 2001);
        assert_eq!(counter(), "2001");
    }
}
