//! Looking at locks from outside: who holds one, every lock held, and breaking one by hand.
//! For operators (the `redlease` command) and dashboards; a holder learns about its own
//! lock from its guard.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::Exec;
use crate::backend::wire::reply;
use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{self, LockKeys, RESERVED_PREFIX};
use crate::lane::Lane;
use crate::scripts::Lua;

/// What a lock looks like on the server right now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock key (prefix included).
    pub key: String,
    /// The value under the key: the holder's token (`uuid:host/pid` for redlease holders),
    /// or `None` when nobody holds the lock.
    pub holder: Option<String>,
    /// How long the key lives unless renewed; `None` when free or without expiry.
    pub remaining: Option<Duration>,
    /// The last fencing token handed out for this name, if any.
    pub fencing_token: Option<u64>,
    /// Waiters registered now (their registrations not lapsed), each once, a read-write
    /// lock's waiting readers included. Past 10,000
    /// registrations, registrations are counted instead: a waiter registered both to be
    /// woken and to be handed the lock may count twice then.
    pub waiters: u64,
    /// For a reentrant lock: its owner and how many holds the owner has.
    pub reentrant: Option<(String, u64)>,
    /// What the name is held as now; `None` when free.
    pub held_as: Option<HeldAs>,
}

/// What kind of lock holds a name now ([`LockInfo::held_as`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldAs {
    /// A mutex, reentrant or not: [`LockInfo::holder`] is its token.
    Mutex,
    /// A counting semaphore with this many permits held.
    Semaphore {
        /// Permits held now (their leases not ended).
        permits: u64,
    },
    /// A read-write lock: held for writing ([`LockInfo::holder`] is the writer's token) or
    /// by this many readers.
    ReadWrite {
        /// Readers holding it now (their leases not ended).
        readers: u64,
    },
}

/// `INSPECT`: a consistent view of a lock, of whatever kind holds the name.
///
/// - KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] queue, KEYS[4] reentrant holds,
///   KEYS[5] a read-write lock's waiting readers
/// - Returns `{holder or false, pttl, fence or false, live waiters, reentrant owner
///   or false, holds, kind, count}`: kind `mutex`, `semaphore` (count: live permits),
///   `rwlock` (holder: the live writer's token; count: live readers) or false (free).
static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1]).ok
local fence = redis.call('GET', KEYS[2])
-- A waiter registered in both forms (plain, and `!<ttl>|<token>` to be handed the lock)
-- counts once; past 10,000 registrations they are counted, not read (the server must not
-- be blocked on a huge queue).
local waiters = redis.call('ZCOUNT', KEYS[3], now_ms, '+inf')
  + redis.call('ZCOUNT', KEYS[5], now_ms, '+inf')
if waiters <= 10000 then
  local seen = {}
  waiters = 0
  for _, queue in ipairs({KEYS[3], KEYS[5]}) do
    for _, member in ipairs(redis.call('ZRANGE', queue, now_ms, '+inf', 'BYSCORE')) do
      local token = string.match(member, '^!%d+|(.+)$') or member
      if not seen[token] then
        seen[token] = true
        waiters = waiters + 1
      end
    end
  end
end
local pttl = redis.call('PTTL', KEYS[1])
if kind == 'zset' then
  local permits = redis.call('ZCOUNT', KEYS[1], now_ms, '+inf')
  return {false, pttl, fence, waiters, false, 0, permits > 0 and 'semaphore', permits}
end
if kind == 'hash' then
  local writer, readers = false, 0
  local size = redis.call('HLEN', KEYS[1])
  if size > 100000 then
    -- Not a read-write lock of ours (one field per reader): do not block the server on it.
    return redis.error_reply('not a lock: ' .. KEYS[1] .. ' is a hash of ' .. size .. ' fields')
  end
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    local space = string.find(value, ' ')
    local expiry = tonumber(space and string.sub(value, 1, space - 1) or value)
    if expiry and expiry > now_ms then
      if name == 'w' then
        writer = space and string.sub(value, space + 1) or false
      else
        readers = readers + 1
      end
    end
  end
  local held = writer or readers > 0
  return {writer, pttl, fence, waiters, false, 0, held and 'rwlock', readers}
end
if kind ~= 'string' and kind ~= 'none' then
  return redis.error_reply('not a lock: ' .. KEYS[1] .. ' is a ' .. kind)
end
local holder = redis.call('GET', KEYS[1])
local h = redis.call('HMGET', KEYS[4], 't', 'o')
local reentrant = holder and h[1] == holder
return {
  holder,
  pttl,
  fence,
  waiters,
  reentrant and h[2],
  reentrant and redis.call('HLEN', KEYS[4]) - 3 or 0,
  holder and 'mutex',
  0,
}
"
        .to_owned(),
    )
});

/// `BREAK`: deletes the lock key if it still holds `expected` (what the operator was shown),
/// and any grant pending on it and a reentrant lock's holds; for a read-write lock held by
/// the writer `expected`, that writer's hold (and the key, when nothing else is left).
///
/// - KEYS[1] lock, KEYS[2] grant, KEYS[3] reentrant holds
/// - ARGV[1] expected value
/// - Returns 1 when deleted, 0 when the key held something else (or nothing, or only
///   readers), -1 for a counting semaphore (nothing deleted).
static BREAK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'zset' then
  return -1
end
if kind == 'hash' then
  local writer = redis.call('HGET', KEYS[1], 'w')
  if not writer or string.match(writer, '^%d+ (.*)$') ~= ARGV[1] then
    return 0
  end
  redis.call('HDEL', KEYS[1], 'w')
  if redis.call('HLEN', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1])
  end
  return 1
end
if kind ~= 'string' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"
        .to_owned(),
    )
});

impl Client {
    /// Runs `calls` on the server that owns `key`, on the caller lane (bounded like
    /// [`Client::is_locked`]).
    ///
    /// Errors: [`ErrorKind::InvalidArgument`] on a deployment without operators' views
    /// (Redlock).
    fn run_inspecting(&self, key: &str, calls: &[Call]) -> Result<Value> {
        let server = self.inspecting()?;
        let bounds = server.bounds();
        let lane = Lane::Caller(std::time::Instant::now() + bounds.pool_wait);
        let replies = server.run(key, calls, &Exec::new(lane, bounds.io))?;
        Ok(replies.values.into_iter().next().unwrap_or(Value::Nil))
    }

    /// The lock server, when it offers operators' views.
    fn inspecting(&self) -> Result<&dyn crate::protocol::LockServer> {
        let server = self.inner.server.as_ref();
        if server.capabilities().inspection {
            Ok(server)
        } else {
            Err(Error::invalid(
                "inspecting and listing locks is not available on a Redlock client",
            ))
        }
    }

    /// Who holds the lock `name` now, for how long, its last fencing token and its
    /// waiters. One round trip (bounded like [`Client::is_locked`]).
    pub fn inspect(&self, name: &str) -> Result<LockInfo> {
        crate::process::api_call(|| {
            let keys = LockKeys::new(&self.inner.options.key_prefix, name)?;
            self.inspect_keys(&keys)
        })
    }

    fn inspect_keys(&self, keys: &LockKeys) -> Result<LockInfo> {
        let call = Call::script(
            &INSPECT,
            &[
                &keys.lock,
                &keys.fence,
                &keys.queue,
                &keys.holds,
                &keys.readers,
            ],
            &[],
        );
        let value = self.run_inspecting(&keys.lock, &[call])?;
        type Inspected = (
            Option<String>,
            i64,
            Option<String>,
            u64,
            Option<String>,
            u64,
            Option<String>,
            u64,
        );
        let (holder, pttl, fence, waiters, owner, holds, kind, count): Inspected = reply(value)?;
        let held_as = match kind.as_deref() {
            Some("mutex") => Some(HeldAs::Mutex),
            Some("semaphore") => Some(HeldAs::Semaphore { permits: count }),
            Some("rwlock") => Some(HeldAs::ReadWrite { readers: count }),
            _ => None,
        };
        Ok(LockInfo {
            reentrant: owner.map(|owner| (owner, holds)),
            key: keys.lock.clone(),
            remaining: (held_as.is_some() && pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
            holder,
            fencing_token: fence.and_then(|f| f.parse().ok()),
            waiters,
            held_as,
        })
    }

    /// The locks held now whose keys begin with this client's key prefix and match the glob
    /// `pattern` (`*` and `?`; the prefix is part of the key), found through their fencing
    /// counters with
    /// `SCAN` (never `KEYS`), on every primary. A lock only ever taken by clients outside
    /// redlease (plain `SET NX`) has no counter and is not listed. At most `limit` locks.
    pub fn locks(&self, pattern: &str, limit: usize) -> Result<Vec<LockInfo>> {
        crate::process::api_call(|| {
            let counters = self
                .inspecting()?
                .scan(&format!("{RESERVED_PREFIX}fence:*"), usize::MAX)?;
            let mut out = Vec::new();
            'counters: for counter in counters {
                for key in keys::lock_keys_of(&counter) {
                    let prefix = &self.inner.options.key_prefix;
                    if !key.starts_with(prefix.as_str())
                        || !glob(pattern.as_bytes(), key.as_bytes())
                    {
                        continue;
                    }
                    let Ok(lock_keys) = LockKeys::new("", &key) else {
                        continue;
                    };
                    let info = match self.inspect_keys(&lock_keys) {
                        Ok(info) => info,
                        // A key this user may not read (ACL): not one of its locks.
                        Err(e) if e.kind() == ErrorKind::Server => {
                            log::debug!("not listing {key:?}: {e}");
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if info.held_as.is_some() {
                        out.push(info);
                        if out.len() >= limit {
                            break 'counters;
                        }
                    }
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
    }

    /// Deletes the lock `name` held by someone else, but only if its key still holds
    /// `holder` (the value the operator was shown by [`inspect`](Self::inspect)), so a
    /// lock that changed hands meanwhile is left alone. The old holder learns of it at its
    /// next renewal (its lock is lost). Its critical section may still be running: use
    /// this only when the holder is known to be gone, and rely on fencing tokens. Breaks a
    /// mutex (reentrant or not) or a read-write lock's writer; a counting semaphore's
    /// permits and a read-write lock's readers end with their own leases.
    ///
    /// Errors: [`ErrorKind::NotHeld`] when the key no longer holds `holder` (a read-write
    /// lock: has no writer, or another one); [`ErrorKind::InvalidArgument`] when `name` is
    /// a counting semaphore (nothing deleted).
    pub fn break_lock(&self, name: &str, holder: &str) -> Result<()> {
        crate::process::api_call(|| {
            let keys = LockKeys::new(&self.inner.options.key_prefix, name)?;
            let call = Call::script(&BREAK, &[&keys.lock, &keys.grant, &keys.holds], &[&holder]);
            let value = self.run_inspecting(&keys.lock, &[call])?;
            match reply::<i64>(value)? {
                1 => Ok(()),
                -1 => Err(Error::invalid(format!(
                    "lock {:?} is a counting semaphore: its permits cannot be broken, each ends \
                     with its own lease",
                    keys.lock
                ))),
                _ => Err(Error::new(
                    ErrorKind::NotHeld,
                    format!(
                        "lock {:?} no longer holds {holder:?}; nothing deleted",
                        keys.lock
                    ),
                )),
            }
        })
    }
}

/// Glob matching with `*` (any run) and `?` (any one byte). Iterative, with one
/// backtracking point (the last `*`): time proportional to the pattern's length times the
/// text's, whatever the pattern (`***...x` included), and no recursion.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: the pattern after it, and the text it reached.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((after, reached)) => {
                    p = after;
                    t = reached + 1;
                    star = Some((after, reached + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_match_like_redis() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"job:*", b"job:1"));
        assert!(!glob(b"job:*", b"jobs"));
        assert!(glob(b"a?c", b"abc"));
        assert!(glob(b"*:{x}*", b"a:{x}b"));
        assert!(!glob(b"", b"a"));
        assert!(glob(b"", b""));
        assert!(glob(b"a*", b"a"));
        assert!(glob(b"*a*b*", b"xxaxxbxx"));
        assert!(!glob(b"*a*b", b"xxaxxbxx"));
        assert!(glob(b"?", b"x") && !glob(b"?", b"") && !glob(b"??", b"x"));
    }

    #[test]
    fn hostile_globs_end_without_backtracking_or_recursion() {
        // A backtracking matcher takes exponential time on the first (it would never end)
        // and overflows its stack on the second.
        let text = vec![b'a'; 10_000];
        assert!(!glob(&[&b"*".repeat(50)[..], b"x"].concat(), &text));
        assert!(glob(&b"*".repeat(1_000_000), b"anything"));
    }
}

/// What `Client::check` found about the server (for a Cluster: one of its primaries).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerCheck {
    /// `redis_version` from `INFO server`.
    pub version: String,
    /// `maxmemory-policy`, or `None` when `CONFIG` is not permitted.
    pub maxmemory_policy: Option<String>,
    /// `save` (RDB snapshots), or `None` when `CONFIG` is not permitted.
    pub save: Option<String>,
    /// `appendonly` and `appendfsync`, or `None` when `CONFIG` is not permitted.
    pub appendonly: Option<(String, String)>,
    /// Round trips of a few `PING`s.
    pub round_trips: Vec<Duration>,
}

impl ServerCheck {
    /// Whether the eviction policy can delete lock keys (anything but `noeviction`).
    pub fn may_evict_locks(&self) -> bool {
        self.maxmemory_policy
            .as_deref()
            .is_some_and(|p| p != "noeviction")
    }

    /// Whether a restart loses data (no RDB snapshots and no AOF).
    pub fn loses_data_on_restart(&self) -> Option<bool> {
        let save = self.save.as_deref()?;
        let (aof, _) = self.appendonly.as_ref()?;
        Some(save.trim().is_empty() && aof != "yes")
    }
}

impl Client {
    /// Connects and reports the server's version, eviction policy and persistence, and the
    /// latency of a few round trips. Each request bounded as [`Client::is_locked`].
    pub fn check(&self) -> Result<ServerCheck> {
        crate::process::api_call(|| {
            let run =
                |cmd: &redis::Cmd| -> Result<Value> { self.run_inspecting("", &[Call::cmd(cmd)]) };
            let mut round_trips = Vec::new();
            for _ in 0..5 {
                let started = std::time::Instant::now();
                reply::<String>(run(&redis::cmd("PING"))?)?;
                round_trips.push(started.elapsed());
            }
            let mut info = redis::cmd("INFO");
            info.arg("server");
            let info: String = reply(run(&info)?)?;
            let version = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .unwrap_or("unknown")
                .trim()
                .to_owned();
            let config = |name: &str| -> Option<String> {
                let mut cmd = redis::cmd("CONFIG");
                cmd.arg("GET").arg(name);
                let pair: Vec<String> = reply(run(&cmd).ok()?).ok()?;
                pair.get(1).cloned()
            };
            let appendonly = config("appendonly").zip(config("appendfsync"));
            Ok(ServerCheck {
                version,
                maxmemory_policy: config("maxmemory-policy"),
                save: config("save"),
                appendonly,
                round_trips,
            })
        })
    }
}
