-- redlease 0.2's ACQUIRE script (commit 7b73bd3, src/scripts.rs), unchanged: the upgrade test
-- runs it as a 0.2 client would.

local function next_fence(key, expiry_ms)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = math.max(tonumber(redis.call('GET', key) or '0') + 1, clock)
  redis.call('SET', key, string.format('%.0f', fence), 'PX', expiry_ms)
  return fence
end

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

local token = ARGV[1]
local mode = tonumber(ARGV[4])
local owner = ARGV[6]
if owner then
  -- Reentrant: the owner of the current hold takes it once more.
  local holder = redis.call('GET', KEYS[1])
  local h = holder and redis.call('HMGET', KEYS[6], 't', 'o', 'f')
  if h and h[1] == holder and h[2] == owner then
    redis.call('HSET', KEYS[6], 'h:' .. token, 1)
    local lease = math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2]))
    redis.call('PEXPIRE', KEYS[1], lease)
    redis.call('PEXPIRE', KEYS[6], lease)
    if mode ~= 0 then
      redis.call('ZREM', KEYS[4], token)
    end
    return {2, tonumber(h[3]), lease, holder}
  end
end
local function granted(lease)
  if mode ~= 0 then
    redis.call('ZREM', KEYS[4], token)
  end
  local fence = next_fence(KEYS[2], ARGV[3])
  if owner then
    redis.call('DEL', KEYS[6])
    redis.call('HSET', KEYS[6], 't', token, 'o', owner, 'f', string.format('%.0f', fence), 'h:' .. token, 1)
    redis.call('PEXPIRE', KEYS[6], lease)
  end
  return {1, fence, lease}
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
