//! Blocking Redis connections: how to open one, and a pool that reuses them.
//!
//! A hand-written pool rather than r2d2: r2d2 opens connections on its own worker threads and
//! reports a failed connect as text, while here a connect runs on the caller's thread under
//! the caller's time budget and keeps its typed error (refused, timeout, WRONGPASS, ...).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::error::{Error, ErrorKind, Result};
use crate::process;

/// Opens connections to one Redis server with the client's timeouts.
pub(crate) struct Connector {
    client: redis::Client,
    connect_timeout: Duration,
    io_timeout: Duration,
    /// The URL password, removed from every message.
    secret: Option<String>,
    /// The URL with its password replaced, for messages.
    pub describe: String,
}

impl Connector {
    pub fn new(
        client: redis::Client,
        connect_timeout: Duration,
        io_timeout: Duration,
        describe: String,
    ) -> Self {
        let secret = client
            .get_connection_info()
            .redis_settings()
            .password()
            .map(str::to_owned);
        Connector {
            client,
            connect_timeout,
            io_timeout,
            secret,
            describe,
        }
    }

    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// Converts a redis crate error, with the password removed.
    pub fn error(&self, err: &redis::RedisError) -> Error {
        Error::from_redis(err, self.secret.as_deref())
    }

    /// Connects within `budget` (capped at the connect timeout), authenticates, selects the
    /// database, and sets the I/O timeout on the socket.
    fn connect(&self, budget: Duration) -> Result<redis::Connection> {
        let timeout = budget
            .min(self.connect_timeout)
            .max(Duration::from_millis(1));
        let conn = self
            .client
            .get_connection_with_timeout(timeout)
            .map_err(|e| {
                self.error(&e)
                    .context(&format!("connecting to {}", self.describe))
            })?;
        set_timeouts(&conn, self.io_timeout).map_err(|e| self.error(&e))?;
        Ok(conn)
    }
}

fn set_timeouts(conn: &redis::Connection, timeout: Duration) -> redis::RedisResult<()> {
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))
}

/// A pool of blocking connections.
///
/// `max_open: None` makes a pool that never waits: when no idle connection is left it opens
/// another. The renewal threads use such a pool of their own, so callers holding every
/// connection of the main pool can never starve a renewal.
pub(crate) struct Pool {
    pub connector: Connector,
    max_open: Option<usize>,
    max_idle: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    /// Idle connections with their current socket timeout.
    idle: Vec<(redis::Connection, Duration)>,
    /// Connections idle or checked out.
    open: usize,
    /// Callers waiting for a connection to come back (so returns wake only when needed).
    waiting: usize,
    /// The process the connections belong to; after `fork()` the child starts afresh.
    process: u64,
}

impl Pool {
    pub fn new(connector: Connector, max_open: Option<usize>, max_idle: usize) -> Self {
        Pool {
            connector,
            max_open,
            max_idle,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
                waiting: 0,
                process: process::generation(),
            }),
            freed: Condvar::new(),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, PoolState> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let current = process::generation();
        if state.process != current {
            // A forked child: the sockets are the parent's. Drop our copies (closing a
            // descriptor in the child does not affect the parent) and start afresh.
            state.idle.clear();
            state.open = 0;
            state.waiting = 0;
            state.process = current;
        }
        state
    }

    /// Checks out a connection, waiting up to `budget` for a free slot; a new connection is
    /// made within `connect_within` (and never longer than the connect timeout).
    ///
    /// Errors: [`ErrorKind::Timeout`] when no slot frees up in time, or the connect error.
    pub fn get(&self, budget: Duration, connect_within: Duration) -> Result<Conn<'_>> {
        let deadline = Instant::now() + budget;
        let mut state = self.lock_state();
        loop {
            if let Some(taken) = self.take(&mut state) {
                drop(state);
                return self.finish(taken, connect_within);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "no connection to {} became free within {budget:?} (pool size {})",
                        self.connector.describe,
                        self.max_open.unwrap_or(0)
                    ),
                ));
            }
            state.waiting += 1;
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.waiting -= 1;
        }
    }

    /// Checks out a connection without waiting for one: `None` when all are in use (a new
    /// one may still be made, within the connect timeout).
    pub fn try_get(&self) -> Option<Result<Conn<'_>>> {
        let taken = self.take(&mut self.lock_state())?;
        Some(self.finish(taken, self.connector.connect_timeout))
    }

    /// An idle connection, or a reserved slot for a new one, if either is to be had.
    fn take(&self, state: &mut PoolState) -> Option<Taken> {
        if let Some((conn, timeout)) = state.idle.pop() {
            return Some(Taken::Idle(conn, timeout));
        }
        if self.max_open.is_none_or(|max| state.open < max) {
            state.open += 1;
            return Some(Taken::Slot);
        }
        None
    }

    /// Turns what [`take`](Self::take) gave into a connection (connecting for a slot).
    fn finish(&self, taken: Taken, connect_within: Duration) -> Result<Conn<'_>> {
        match taken {
            Taken::Idle(conn, timeout) => Ok(Conn::new(self, conn, timeout, true)),
            Taken::Slot => match self.connector.connect(connect_within) {
                Ok(conn) => Ok(Conn::new(self, conn, self.connector.io_timeout, false)),
                Err(e) => {
                    self.forget_one();
                    Err(e)
                }
            },
        }
    }

    /// Runs `f` on a pooled connection, waiting up to `checkout` for one; each reply is
    /// awaited for the I/O timeout, or `io` when that is shorter.
    ///
    /// When a connection taken from the idle list turns out to be dead (the server
    /// restarted), the other idle ones are dropped too and `f` runs once more on a fresh
    /// connection, so a restart is invisible to the caller. `f` must be safe to repeat.
    pub fn run<T>(
        &self,
        checkout: Duration,
        io: Option<Duration>,
        f: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let io_timeout = self.connector.io_timeout;
        let attempt = |conn: &mut Conn<'_>| {
            match io.filter(|&io| io < io_timeout) {
                // A shorter budget: any timeout from half of it to an eighth over it will
                // do, so a steady caller (a renewal thread) rarely resets the socket.
                Some(io) => conn.ensure_timeout(io / 2, io + io / 8)?,
                None => conn.ensure_timeout(io_timeout, io_timeout)?,
            }
            conn.run(&f)
        };
        let connect_timeout = self.connector.connect_timeout;
        let connect_within = io.map_or(connect_timeout, |io| io.min(connect_timeout));
        let mut conn = self.get(checkout, connect_within)?;
        match attempt(&mut conn) {
            Err(e) if conn.reused && e.kind() == ErrorKind::Connection => {
                drop(conn);
                log::debug!("retrying on a fresh connection after: {e}");
                self.discard_idle();
                attempt(&mut self.get(checkout, connect_within)?)
            }
            other => other,
        }
    }

    /// Drops every idle connection (after one of them was found dead).
    fn discard_idle(&self) {
        let mut state = self.lock_state();
        let dropped = state.idle.len();
        state.idle.clear();
        state.open = state.open.saturating_sub(dropped);
    }

    fn forget_one(&self) {
        let mut state = self.lock_state();
        state.open = state.open.saturating_sub(1);
        let wake = state.waiting > 0;
        drop(state);
        if wake {
            self.freed.notify_one();
        }
    }

    fn put_back(&self, conn: redis::Connection, timeout: Duration, process: u64) {
        let mut state = self.lock_state();
        if state.process != process {
            return;
        }
        if state.idle.len() < self.max_idle {
            state.idle.push((conn, timeout));
        } else {
            state.open = state.open.saturating_sub(1);
        }
        let wake = state.waiting > 0;
        drop(state);
        if wake {
            self.freed.notify_one();
        }
    }
}

/// What checking out found: an idle connection (with its socket timeout), or a free slot.
enum Taken {
    Idle(redis::Connection, Duration),
    Slot,
}

/// A checked-out connection; goes back to the pool on drop unless it broke.
pub(crate) struct Conn<'a> {
    pool: &'a Pool,
    conn: Option<redis::Connection>,
    /// Taken from the idle list (it may have died while idle).
    reused: bool,
    /// An I/O error or timeout left the stream in an unknown state: never reuse it.
    broken: bool,
    /// The socket's current read and write timeout.
    timeout: Duration,
    process: u64,
}

impl<'a> Conn<'a> {
    fn new(pool: &'a Pool, conn: redis::Connection, timeout: Duration, reused: bool) -> Self {
        Conn {
            pool,
            conn: Some(conn),
            reused,
            broken: false,
            timeout,
            process: process::generation(),
        }
    }

    /// Runs `f` on the connection; any error other than a server reply marks it broken.
    pub fn run<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(Error::new(
                ErrorKind::Internal,
                "connection already returned",
            ));
        };
        f(conn).map_err(|e| {
            if !matches!(
                e.kind(),
                redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
            ) {
                self.broken = true;
            }
            self.pool.connector.error(&e)
        })
    }

    /// Makes the read and write timeout for the calls that follow lie within `[lo, hi]`,
    /// setting it to `hi` only when it does not already (each change is two system calls).
    pub fn ensure_timeout(&mut self, lo: Duration, hi: Duration) -> Result<()> {
        if (lo..=hi).contains(&self.timeout) {
            return Ok(());
        }
        let hi = hi.max(Duration::from_millis(1));
        self.run(|c| set_timeouts(c, hi))?;
        self.timeout = hi;
        Ok(())
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.broken || !conn.is_open() {
            if self.process == process::generation() {
                self.pool.forget_one();
            }
        } else {
            self.pool.put_back(conn, self.timeout, self.process);
        }
    }
}
