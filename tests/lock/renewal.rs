//! Renewal (the watchdog): a renewed lock stays held across many ttls, a fixed lease is not
//! renewed, renewal follows the ttl of the last extend (longer or shorter), is not starved
//! of connections by callers, and its threads are reused, survive `on_lost` callbacks that
//! panic or block, and where no thread fits an acquire fails clearly; `renewal_stats()`
//! counts renewals and failures; closing a client closes the connections its renewals used.
//! (A loss found by renewal: `loss`; renewals sharing a batch: `batching`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind, LostReason};

use crate::support::{self, RedisServer, client, eventually};

/// The renewed lease of most tests: short enough that renewal must run for the lock to
/// outlive a few of them, long enough that a loaded host's stalls (a renewal every ttl/3,
/// ~667 ms of slack) do not lose it.
pub(crate) const TTL: Duration = Duration::from_secs(1);

#[test]
fn renewal_keeps_a_short_lock_held_for_three_ttls() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client.lock("renewed").ttl(TTL).try_acquire().unwrap();
    let lost = guard.lost();
    let started = Instant::now();
    while started.elapsed() < TTL * 3 {
        assert!(guard.is_held(), "lost after {:?}", started.elapsed());
        let stored: Option<String> = server.cmd(&["GET", "renewed"]);
        assert_eq!(stored.as_deref(), Some(guard.token()));
        assert!(lost.try_recv().is_err());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.calls("evalsha") >= 5, "renewal did not run");
    guard.release().unwrap();
    assert!(
        lost.recv_timeout(Duration::from_secs(1)).is_err(),
        "release must disconnect the lost channel without a loss message"
    );
}

#[test]
fn a_fixed_lease_is_not_renewed_and_ends_after_its_ttl() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client
        .lock("fixed")
        .ttl(TTL)
        .renew(false)
        .try_acquire()
        .unwrap();
    assert!(guard.remaining() <= TTL);
    assert!(support::eventually(Duration::from_secs(5), || {
        !server.cmd::<bool>(&["EXISTS", "fixed"])
    }));
    assert!(!guard.is_held());
    assert_eq!(
        server.calls("evalsha") + server.calls("eval"),
        1,
        "only the acquire: nothing renewed it"
    );
    assert_eq!(guard.release().unwrap_err().kind(), ErrorKind::NotHeld);
}

#[test]
fn extend_sets_the_new_ttl_and_renewal_follows_it() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client.lock("extended").ttl(TTL).try_acquire().unwrap();
    guard.extend(Duration::from_secs(60)).unwrap();
    let pttl: i64 = server.cmd(&["PTTL", "extended"]);
    assert!(pttl > 30_000, "pttl {pttl}");
    assert!(guard.remaining() > Duration::from_secs(30));
    // Renewal now runs every 20 s: after the one already scheduled (due ttl/3 in, if the
    // extend came later than that), nothing more.
    std::thread::sleep(TTL);
    let calls = server.calls("evalsha");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(server.calls("evalsha"), calls);
    guard.release().unwrap();
}

/// An extend to a shorter ttl reschedules renewal: the next renewal follows the new ttl,
/// so the lock is never lost under a holder that Redis answers.
#[test]
fn extend_to_a_shorter_ttl_reschedules_renewal() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let lost = Arc::new(AtomicBool::new(false));
    let guard = {
        let lost = lost.clone();
        client
            .lock("shorter")
            .ttl(Duration::from_secs(30))
            .on_lost(move |_| lost.store(true, Ordering::SeqCst))
            .acquire()
            .unwrap()
    };
    guard.extend(Duration::from_millis(1500)).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let value: Option<String> = server.cmd(&["GET", "shorter"]);
        assert_eq!(
            value.as_deref(),
            Some(guard.token()),
            "expired under its holder"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(guard.is_held() && !lost.load(Ordering::SeqCst));
    // The holder counts on the shorter ttl and renews within it; the key itself is never
    // shortened (another holder of the token may count on the longer lease).
    assert!(guard.remaining() <= Duration::from_millis(1500));
    let pttl: i64 = server.cmd(&["PTTL", "shorter"]);
    assert!(pttl > 20_000, "the key was shortened: {pttl}");
    guard.release().unwrap();
}

#[test]
fn renewal_is_not_starved_when_callers_hold_every_pooled_connection() {
    let server = RedisServer::start();
    let options = redlease::ClientOptions::default()
        .pool_size(1)
        .pool_wait(Duration::from_millis(100));
    let client = Client::with_options(&server.url(), options).unwrap();
    let guard = client.lock("starved").ttl(TTL).try_acquire().unwrap();
    // A waiter occupies the only pooled connection in BLPOP for a long time...
    let holder = client
        .lock("other")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || client.lock("other").acquire_timeout(Duration::from_secs(2)))
    };
    // ...while renewal keeps the short lock alive on its own connections.
    std::thread::sleep(TTL * 3 / 2);
    assert!(guard.is_held());
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(waiter.join().unwrap().unwrap_err().kind(), ErrorKind::Busy);
    drop(holder);
    guard.release().unwrap();
}

/// Whether `guard`'s lease is renewed (its local deadline moves on) before it runs out;
/// waits at most until then.
fn renewed_in_time(guard: &redlease::LockGuard) -> bool {
    let first_deadline = Instant::now() + guard.remaining();
    support::eventually(TTL * 3 / 2, || {
        guard.is_held() && Instant::now() + guard.remaining() > first_deadline + TTL / 10
    })
}

#[test]
fn a_reused_renewal_thread_renews_its_next_lock_in_time() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    // A long lease leaves its renewal thread parked with a wake-up 10 s away; the short
    // lock that reuses the thread needs its first renewal within ttl/3.
    for ttl in [Duration::from_secs(30), TTL, Duration::from_secs(30), TTL] {
        client
            .lock("first")
            .ttl(ttl)
            .try_acquire()
            .unwrap()
            .release()
            .unwrap();
        let guard = client.lock("second").ttl(TTL).try_acquire().unwrap();
        assert!(
            renewed_in_time(&guard),
            "after a {ttl:?} lease, the next lock was not renewed"
        );
        let stored: Option<String> = server.cmd(&["GET", "second"]);
        assert_eq!(stored.as_deref(), Some(guard.token()));
        guard.release().unwrap();
    }
}

#[test]
fn a_panicking_lost_callback_does_not_stop_renewal_of_later_locks() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let guard = client
        .lock("panicky")
        .ttl(TTL)
        .on_lost(|_| panic!("a callback that panics"))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    server.cmd::<()>(&["DEL", "panicky"]);
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(5)),
        Ok(LostReason::NotHeld)
    );
    drop(guard);
    // The same renewal thread serves the next lock, and renews it.
    let next = client.lock("after-panic").ttl(TTL).try_acquire().unwrap();
    assert!(renewed_in_time(&next), "the next lock was not renewed");
    let stored: Option<String> = server.cmd(&["GET", "after-panic"]);
    assert_eq!(stored.as_deref(), Some(next.token()));
}

#[test]
fn a_blocking_lost_callback_does_not_hold_up_renewal_of_later_locks() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let (started, in_callback) = crossbeam_channel::bounded(1);
    let guard = client
        .lock("slow-callback")
        .ttl(TTL)
        .on_lost(move |_| {
            let _ = started.send(());
            std::thread::sleep(Duration::from_secs(2)); // a callback that blocks (a bug)
        })
        .try_acquire()
        .unwrap();
    server.cmd::<()>(&["DEL", "slow-callback"]);
    in_callback
        .recv_timeout(Duration::from_secs(5))
        .expect("the callback did not run");
    drop(guard);
    // The blocked thread must not be handed the next lock.
    let next = client.lock("after-slow").ttl(TTL).try_acquire().unwrap();
    assert!(renewed_in_time(&next), "the next lock was not renewed");
    let stored: Option<String> = server.cmd(&["GET", "after-slow"]);
    assert_eq!(stored.as_deref(), Some(next.token()));
}

/// `renewal_stats()` counts the renewals that ran and the attempts that failed, and gives
/// their lateness. (Other tests of this binary renew at the same time: counts only grow.)
#[test]
fn renewal_stats_count_renewals_and_failures() {
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port);
    // Short enough for the loss to show within the ttl, long enough for a loaded host.
    let options = redlease::ClientOptions::default()
        .io_timeout(Duration::from_millis(250))
        .connect_timeout(Duration::from_millis(250));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    let before = redlease::renewal_stats();
    let guard = client.lock("counted").ttl(TTL).try_acquire().unwrap();
    let lost = guard.lost();
    assert!(
        support::eventually(Duration::from_secs(10), || {
            redlease::renewal_stats().since(&before).renewals >= 5
        }),
        "{:?}",
        redlease::renewal_stats().since(&before)
    );
    let held = redlease::renewal_stats().since(&before);
    assert!(held.lateness_quantile(0.5) <= held.lateness_quantile(0.99));
    assert!(held.lateness_quantile(1.0) <= held.max_lateness + held.max_lateness / 4);
    proxy.blackhole(true);
    lost.recv_timeout(TTL + Duration::from_secs(2))
        .expect("lost once Redis stops answering");
    let failed = redlease::renewal_stats().since(&before);
    assert!(failed.failures >= 1, "{failed:?}");
    proxy.blackhole(false);
    drop(guard);
}

/// Issue 9, item 9: closing a client closes its connections at once, also after renewal
/// threads served its locks. (The check allows a loaded host 5 s; a connection kept by a
/// parked renewal or batching thread would stay open for their 30 s idle time.)
#[test]
fn a_closed_client_closes_its_connections() {
    let server = RedisServer::start();
    let connected = || -> i64 {
        let info: String = server.cmd(&["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    let scripts = || server.calls("evalsha") + server.calls("eval");
    let baseline = connected();
    let client = Client::open(&server.url()).unwrap();
    for i in 0..5 {
        let guard = client
            .lock(&format!("close-{i}"))
            .ttl(Duration::from_millis(1000))
            .try_acquire()
            .unwrap();
        // Until its first renewal ran (a third of the ttl in).
        let before = scripts();
        assert!(
            eventually(Duration::from_secs(5), || scripts() > before),
            "close-{i} was never renewed"
        );
        guard.release().unwrap();
    }
    assert!(connected() > baseline);
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || connected() <= baseline),
        "{} connections left open",
        connected() - baseline
    );
}

const THREAD_LIMIT_CHILD: &str = "REDLEASE_TEST_THREAD_LIMIT_URL";

/// Tasks (threads) whose real user is `uid`: what `RLIMIT_NPROC` counts.
fn tasks_of(uid: u32) -> u64 {
    let mut n = 0;
    for proc_dir in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let tasks = std::fs::read_dir(proc_dir.path().join("task"));
        for task in tasks.into_iter().flatten().flatten() {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            let real = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok());
            n += u64::from(real == Some(uid));
        }
    }
    n
}

/// Issue 13, item 2: where a thread per lock cannot fit (here a child process with a small
/// `RLIMIT_NPROC`), the acquire fails with an error naming the limit and holds nothing;
/// nothing crashes, the locks already held keep renewing, and a released lock's parked
/// thread serves the next acquire.
#[test]
fn the_thread_limit_fails_an_acquire_clearly_and_crashes_nothing() {
    if let Ok(url) = std::env::var(THREAD_LIMIT_CHILD) {
        return thread_limit_child(&url);
    }
    use std::os::unix::process::CommandExt;
    let server = RedisServer::start();
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let root = me == 0;
    // Root is exempt from RLIMIT_NPROC: the child runs as nobody.
    let uid: u32 = if root { 65534 } else { me };
    let limit = tasks_of(uid) + 40;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "renewal::the_thread_limit_fails_an_acquire_clearly_and_crashes_nothing",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(THREAD_LIMIT_CHILD, server.url());
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions
    // (setgid, setuid, setrlimit) on values computed before the fork.
    unsafe {
        child.pre_exec(move || {
            if root && (libc::setgid(65534) != 0 || libc::setuid(65534) != 0) {
                return Err(std::io::Error::last_os_error());
            }
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NPROC, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let out = child.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("thread limit child: ok"),
        "the child failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!(
        "{}",
        stdout
            .lines()
            .find(|l| l.contains("child: ok"))
            .unwrap_or("")
    );
}

fn thread_limit_child(url: &str) {
    let client = Client::open(url).unwrap();
    let ttl = Duration::from_secs(1);
    let mut held = Vec::new();
    let err = loop {
        match client
            .lock(&format!("limited:{}", held.len()))
            .ttl(ttl)
            .try_acquire()
        {
            Ok(guard) => held.push(guard),
            Err(e) => break e,
        }
        assert!(held.len() < 1000, "the thread limit was never reached");
    };
    assert!(!held.is_empty(), "no lock at all: {err}");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(
        err.to_string().contains("renewal thread") && err.to_string().contains("ulimit -u"),
        "{err}"
    );
    let refused = format!("limited:{}", held.len());
    assert!(
        !client.is_locked(&refused).unwrap(),
        "the refused acquire gave its lock back"
    );
    std::thread::sleep(ttl * 3 / 2);
    let dropped: Vec<_> = held
        .iter()
        .filter(|g| !g.is_held())
        .map(|g| (g.key().to_owned(), g.lost_reason()))
        .collect();
    assert!(
        dropped.is_empty(),
        "the held locks kept renewing; of {}, lost: {dropped:?}",
        held.len()
    );
    held.pop().unwrap().release().unwrap();
    let again = client.lock(&refused).ttl(ttl).try_acquire().unwrap();
    std::thread::sleep(ttl * 3 / 2);
    assert!(again.is_held(), "a parked thread renews the next lock");
    println!(
        "thread limit child: ok, {} locks held, then: {err}",
        held.len() + 1
    );
}
