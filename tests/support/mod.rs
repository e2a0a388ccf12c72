//! Test fixture: a real `redis-server` of the test's own, on a free port or a unix socket in
//! a temporary directory, killed by its pid on drop (its log is printed if the test failed).
#![allow(dead_code)]

pub mod deploy;
pub mod fake_sentinel;
pub mod proxy;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind, LockGuard};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
    unix: bool,
    /// Contents of a config file given first on the command line (Sentinels need one).
    config: Option<String>,
    sentinel: bool,
}

fn server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

/// A TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

impl RedisServer {
    /// A server on a free TCP port, without persistence.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::launch(extra, false)
    }

    /// A server listening only on a unix socket in its temporary directory.
    pub fn start_unix() -> Self {
        Self::launch(&[], true)
    }

    fn launch(extra: &[&str], unix: bool) -> Self {
        Self::launch_full(extra, unix, None, false)
    }

    /// A Sentinel monitoring the primary on `primary_port` as `master`, with a short
    /// down-after time.
    pub fn start_sentinel(
        master: &str,
        primary_port: u16,
        quorum: u32,
        down_after_ms: u64,
    ) -> Self {
        let config = format!(
            "sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {master} {down_after_ms}\n\
             sentinel failover-timeout {master} 10000\n\
             sentinel parallel-syncs {master} 2\n"
        );
        Self::launch_full(&[], false, Some(config), true)
    }

    fn launch_full(extra: &[&str], unix: bool, config: Option<String>, sentinel: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            args: extra.iter().map(|s| s.to_string()).collect(),
            unix,
            config,
            sentinel,
        };
        server.spawn_on(if unix { 0 } else { free_port() });
        server
    }

    fn spawn_on(&mut self, port: u16) {
        for attempt in 0..5 {
            let port = if attempt == 0 || self.unix {
                port
            } else {
                free_port()
            };
            self.spawn(port);
            if self.wait_ready() {
                return;
            }
            self.kill();
            if self.unix {
                break;
            }
        }
        panic!("redis-server did not start; log:\n{}", self.log());
    }

    fn spawn(&mut self, port: u16) {
        let mut cmd = Command::new(server_bin());
        if let Some(config) = &self.config {
            let path = self.dir.path().join("redis.conf");
            if !path.exists() {
                std::fs::write(&path, config).expect("write the config file");
            }
            cmd.arg(&path);
            if self.sentinel {
                cmd.arg("--sentinel");
            }
        }
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .args(["--save", "", "--appendonly", "no"])
            // Replicas sync at once (the default waits 5 s for more replicas to join).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path());
        if self.unix {
            cmd.arg("--unixsocket").arg(self.socket_path());
        }
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start {}: {e} (install redis-server)", server_bin())
        });
        self.child = Some(child);
        self.port = port;
    }

    fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            if let Ok(mut c) = self.try_conn() {
                // Any answer will do: a server with a password answers NOAUTH.
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return true,
                    Err(e) if e.code().is_some() => return true,
                    Err(_) => {}
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server not running").id() as i32
    }

    /// The URL a client uses.
    pub fn url(&self) -> String {
        if self.unix {
            format!("redis+unix://{}", self.socket_path().display())
        } else {
            format!("redis://127.0.0.1:{}/0", self.port)
        }
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(conn)
    }

    /// A plain connection of the test's own, for setting up and checking.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect to the test server")
    }

    /// Runs one command on a fresh connection.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).expect("command")
    }

    /// The value of `key` (`GET`), on a fresh connection.
    pub fn get(&self, key: &str) -> Option<String> {
        self.cmd(&["GET", key])
    }

    /// The time `key` has left in ms (`PTTL`: -2 when it is gone, -1 without expiry).
    pub fn pttl(&self, key: &str) -> i64 {
        self.cmd(&["PTTL", key])
    }

    /// Every command the server ran (those scripts ran counted too) since its statistics
    /// were last reset, but for `INFO` and `CONFIG` (the test's own). Failed calls count
    /// too (an `EVALSHA` answered `NOSCRIPT`).
    pub fn commands_run(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info:") && !l.starts_with("config"))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|kv| kv.split(':').next_back()?.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    }

    /// How many calls of `command` succeeded, from `INFO commandstats` (e.g. "evalsha").
    /// Failed calls (such as an `EVALSHA` answered `NOSCRIPT`) are not counted.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:");
        let Some(stats) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        field("calls") - field("failed_calls")
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of our own child process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    /// SIGSTOP: the server keeps its sockets open but answers nothing.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts a new one on the same port (data is lost: no
    /// persistence).
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        let start = Instant::now();
        loop {
            self.spawn(port);
            if self.wait_ready() {
                return;
            }
            self.kill();
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not restart on port {port}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- redis-server log ---\n{}", self.log());
        }
        if self.child.is_some() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.resume();
            }));
        }
        self.kill();
    }
}

/// Polls `cond` every 5 ms until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// Starts `n` threads that each wait up to `wait` for the lock `name`, which the caller
/// holds: they block on the server, then give up.
pub fn waiters_giving_up(
    client: &redlease::Client,
    name: &str,
    n: usize,
    wait: Duration,
) -> Vec<std::thread::JoinHandle<redlease::Result<()>>> {
    (0..n)
        .map(|_| {
            let (client, name) = (client.clone(), name.to_owned());
            std::thread::spawn(move || client.lock(&name).acquire_timeout(wait).map(drop))
        })
        .collect()
}

/// Runs `f` on a thread and returns its result, or panics when it has not finished within
/// `limit`: a test that could hang (a join on a silent server) fails instead.
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(_) => panic!("did not finish within {limit:?}"),
    }
}

/// Installs a do-nothing handler for `signal` (with `SA_RESTART` when `restart`), so that
/// the signal interrupts system calls instead of killing the process.
pub fn install_noop_handler(signal: i32, restart: bool) {
    extern "C" fn noop(_: i32) {}
    // SAFETY: sigaction with a zeroed struct, an empty mask and a handler that does
    // nothing (async-signal-safe).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = noop as *const () as usize;
        action.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
    }
}

/// A renewed lock `name` of 6 s, taken through `proxy`, whose first renewal (about 2 s in)
/// runs on the server at once but whose reply is held back `delay`: the node's batching
/// thread is then stuck in that batch for `delay`. Returns once that renewal was written.
pub fn stall_batcher(
    proxy: &proxy::Proxy,
    client: &redlease::Client,
    name: &str,
    delay: Duration,
) -> redlease::LockGuard {
    let slow = client
        .lock(name)
        .ttl(Duration::from_millis(6000))
        .try_acquire()
        .expect("the slow lock");
    let rule = proxy.on_request(name.as_bytes(), 1, proxy::Action::DelayReply(delay));
    assert!(
        eventually(Duration::from_secs(5), || proxy.matched(rule) == 1),
        "the slow lock's renewal was not sent"
    );
    std::thread::sleep(Duration::from_millis(30));
    slow
}

/// A client with the default options.
pub fn client(url: &str) -> Client {
    Client::open(url).expect("client")
}

/// Options with an I/O timeout of `io` and a connect timeout of `connect` milliseconds.
pub fn options_ms(io: u64, connect: u64) -> ClientOptions {
    ClientOptions::default()
        .io_timeout(Duration::from_millis(io))
        .connect_timeout(Duration::from_millis(connect))
}

/// A client whose connect and I/O timeouts are both `io_ms`, for tests under faults.
pub fn quick_client(url: &str, io_ms: u64) -> Client {
    Client::with_options(url, options_ms(io_ms, io_ms)).expect("client")
}

/// The options of the tests that hold replies back: an owner label, an I/O timeout of
/// `io_ms` and a connect timeout of the same, at most 2 s.
pub fn options(io_ms: u64) -> ClientOptions {
    options_ms(io_ms, io_ms.min(2000)).owner_label("attacker")
}

/// Loads the acquire, extend and release scripts through `client`, so that a reply a test
/// holds back is never a NOSCRIPT one.
pub fn warm(client: &Client) {
    let g = client.lock("warm-scripts").try_acquire().unwrap();
    g.extend(Duration::from_secs(5)).unwrap();
    g.release().unwrap();
}

/// Makes a release grant `name` to a waiter that is gone, which leaves every key a lock
/// uses in Redis: the lock (holding a grant nobody took), the fencing counter, the queue
/// (with a registration that has not lapsed yet), the wake-up list and the pending grant.
/// A waiter blocks (so it is registered in the queue) and is cancelled; a registration
/// with a far score stands for a waiter busy between two attempts, and the release grants
/// the lock to it. Returns the queue's key.
pub fn grant_to_a_vanished_waiter(server: &RedisServer, client: &Client, name: &str) -> Vec<u8> {
    let holder = client.lock(name).try_acquire().unwrap();
    let cancel = redlease::CancelToken::new();
    let waiter = {
        let (client, name, cancel) = (client.clone(), name.to_owned(), cancel.clone());
        std::thread::spawn(move || client.lock(&name).cancel_token(&cancel).acquire().map(drop))
    };
    // This name's queue only (another name's may still be there).
    let queue = || -> Vec<Vec<u8>> {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("redlease:queue:*")
            .query(&mut server.conn())
            .unwrap();
        keys.into_iter()
            .filter(|k| String::from_utf8_lossy(k).contains(name))
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(5), || queue().len() == 1),
        "{name:?}"
    );
    let queue = queue().remove(0);
    // A registration whose waiter is gone but has not lapsed yet...
    redis::cmd("ZADD")
        .arg(&queue)
        .arg(u64::MAX >> 12)
        .arg("ghost")
        .query::<()>(&mut server.conn())
        .unwrap();
    cancel.cancel();
    assert_eq!(
        waiter.join().unwrap().unwrap_err().kind(),
        ErrorKind::Cancelled
    );
    // ...makes the release grant the lock to it.
    holder.release().unwrap();
    let value: String = server.cmd(&["GET", name]);
    assert!(value.ends_with(":handoff"), "{value}");
    queue
}

/// Polls until `guard` says it no longer holds the lock (at most `limit`), asserting at
/// every step that while it says so, the server's key still holds its token. The guard is
/// read first and the key after, and the time between the two readings is allowed for (a
/// loaded host may take many milliseconds to answer), so the check is exact: the local
/// deadline must never be later than the key's expiry.
pub fn assert_held_only_while_the_key_is_ours(
    server: &RedisServer,
    guard: &LockGuard,
    limit: Duration,
) {
    let key = guard.key().to_owned();
    let start = Instant::now();
    while start.elapsed() < limit {
        let asked = Instant::now();
        let held = guard.is_held();
        let remaining = guard.remaining();
        let value: Option<String> = server.cmd(&["GET", &key]);
        let pttl: i64 = server.cmd(&["PTTL", &key]);
        let between = asked.elapsed();
        if !held {
            return;
        }
        // +2 ms: PTTL and `remaining` are rounded to whole milliseconds.
        assert!(
            remaining.as_millis() as i64 <= pttl + between.as_millis() as i64 + 2,
            "the guard believes {remaining:?} are left, the key has {pttl} ms \
             ({between:?} later)"
        );
        if remaining > between + Duration::from_millis(2) {
            assert_eq!(
                value.as_deref(),
                Some(guard.token()),
                "the guard says held ({remaining:?} left) but the key holds {value:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The line of the README's least-privilege ACL user (`ACL SETUSER locker ...`): tests
/// run as exactly this user, so the README and what locks need stay in step.
pub fn readme_acl_line() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    readme
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER locker"))
        .expect("the README has an ACL SETUSER locker line")
        .trim()
        .to_owned()
}

/// Nanoseconds on `CLOCK_MONOTONIC`, which every process of the host shares: intervals
/// logged by several processes can be compared.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec; CLOCK_MONOTONIC is shared by every process of the host.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The largest number of intervals `(start, end)` that overlap at any instant (touching is
/// not overlapping).
pub fn max_overlap(intervals: &[(u64, u64)]) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for &(start, end) in intervals {
        events.push((start, 1));
        events.push((end, -1));
    }
    // Ends before starts at the same instant: touching is not overlapping.
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        max = max.max(now);
    }
    max as usize
}

/// A tiny deterministic random source (xorshift), for jitter and chaos: a seed gives the
/// same run again.
pub struct Rng(pub u64);

impl Rng {
    /// A source whose state is mixed from `seed` (and never zero).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Polls for `name` with `rival` for up to `limit`; when it gets the lock, `holder` must
/// no longer believe it holds it.
pub fn no_second_holder(
    rival: &redlease::Client,
    name: &str,
    holder: &redlease::LockGuard,
    limit: Duration,
) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(second) = rival.lock(name).ttl(Duration::from_secs(5)).try_acquire() {
            assert!(
                !holder.is_held(),
                "two holders: the rival got {name:?} (token {}) while the first holder still \
                 believes it holds it ({:?} left, token {})",
                second.token(),
                holder.remaining(),
                holder.token()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The library's log records at `Warn` and above, captured by a logger installed once per
/// test process (a process may have only one logger): records of other tests running at
/// the same time are there too, so look for those that name your own lock.
pub fn warnings() -> Vec<String> {
    use std::sync::{Mutex, OnceLock};
    static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static INSTALLED: OnceLock<()> = OnceLock::new();
    struct Capture;
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            if record.level() <= log::Level::Warn {
                RECORDS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{}: {}", record.level(), record.args()));
            }
        }
        fn flush(&self) {}
    }
    INSTALLED.get_or_init(|| {
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Warn);
    });
    RECORDS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The captured warnings (see [`warnings`]) that mention `needle`.
pub fn warnings_about(needle: &str) -> Vec<String> {
    warnings()
        .into_iter()
        .filter(|w| w.contains(needle))
        .collect()
}

/// Waits up to `limit` for our child `pid` to exit: its exit status, or `None` (the child
/// then killed and reaped) if it hung or died of a signal.
pub fn exit_status(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    let mut status = 0;
    while Instant::now() < deadline {
        // SAFETY: waitpid on our own child, writing into a local.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill and reap our own hung child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    None
}

unsafe extern "C" {
    /// glibc's fork without the fork handlers (2.34 and later).
    fn _Fork() -> libc::pid_t;
}

/// `_Fork()`: a fork that runs no fork handlers (the library tells its child only by the
/// pid). The child must `_exit`.
pub fn fork_without_handlers() -> libc::pid_t {
    // SAFETY: _Fork takes nothing; the caller's child ends with _exit.
    unsafe { _Fork() }
}
