-- redlease 0.2's RELEASE script (commit 7b73bd3, src/scripts.rs), unchanged: the upgrade test
-- runs it as a 0.2 client would.

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

local holder = redis.call('GET', KEYS[1])
local held = holder == ARGV[1]
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if ARGV[6] and holder then
  -- Reentrant: ARGV[1] is one hold of the owner's; the lock goes with the last hold.
  local h = redis.call('HMGET', KEYS[5], 't', 'o')
  if h[1] == holder then
    if h[2] ~= ARGV[6] then
      return 0
    end
    if redis.call('HDEL', KEYS[5], 'h:' .. ARGV[1]) == 1 then
      if redis.call('HLEN', KEYS[5]) > 3 then
        return 3
      end
      held = true
    end
  end
end
if not held then
  return 0
end
if ARGV[6] then
  redis.call('DEL', KEYS[5])
end
-- The registration that lapses last: if it has lapsed, so have all the others.
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local now = last[2] and now_ms()
if last[2] and tonumber(last[2]) <= now then
  redis.call('DEL', KEYS[3])
elseif last[2] then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
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
redis.call('DEL', KEYS[1])
return 1
