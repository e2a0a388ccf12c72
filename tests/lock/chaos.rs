//! Chaos (ignored: randomised, run by hand with `CHAOS_SEED` and `CHAOS_SECS`): many
//! clients contend for one lock through fault-injecting proxies while the server is paused,
//! scripts are flushed, replies are delayed, dropped and cut. The invariants checked:
//!
//! - no two callers (redlease or a foreign `SET NX PX` client) believe they hold the lock
//!   at overlapping moments (a belief interval runs from the return of the acquire to the
//!   last moment `is_held()` said yes);
//! - fencing tokens increase with the order of the belief intervals;
//! - a release reported `NotHeld` was really not held: it did not run while the local view
//!   still guaranteed the key (`is_held()` with `remaining()` covering the whole release);
//! - every call returns within a generous bound;
//! - once everyone has stopped, the server holds no key without an expiry but the fencing
//!   counter, and nothing of the lock lingers past the grace.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::proxy::{Action, Proxy};
use crate::support::{self, RedisServer, Rng};

const NAME: &str = "chaos";

#[derive(Debug, Clone)]
struct Held {
    who: String,
    start: Instant,
    end: Instant,
    fence: Option<u64>,
    /// Whether `is_held()` was true when first asked, right after the acquire returned.
    fresh: bool,
}

#[derive(Default)]
struct Log {
    held: Vec<Held>,
    problems: Vec<String>,
    outcomes: std::collections::BTreeMap<String, usize>,
}

fn note(log: &Mutex<Log>, what: String) {
    *log.lock().unwrap().outcomes.entry(what).or_default() += 1;
}

fn worker(
    id: usize,
    url: String,
    io_ms: u64,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    seed: u64,
) {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(io_ms))
        .connect_timeout(Duration::from_millis(200))
        .pool_size(2)
        .owner_label(format!("w{id}"));
    let client = Client::with_options(&url, options).unwrap();
    let mut rng = Rng(seed);
    while !stop.load(Ordering::SeqCst) {
        let ttl = Duration::from_millis(rng.pick(&[30, 120, 400, 1500]));
        let renew = rng.below(3) != 0;
        let wait_ms = rng.pick(&[0, 100, 700, 2500]);
        let began = Instant::now();
        let builder = client.lock(NAME).ttl(ttl).renew(renew);
        let result = if wait_ms == 0 {
            builder.try_acquire()
        } else {
            builder.acquire_timeout(Duration::from_millis(wait_ms))
        };
        let took = began.elapsed();
        // wait + pool wait (2 s) + connect + a few io timeouts + block lateness.
        let bound = Duration::from_millis(wait_ms + 2000 + 200 + 4 * io_ms + 250 + 500);
        if took > bound {
            log.lock().unwrap().problems.push(format!(
                "w{id}: acquire (wait {wait_ms} ms, io {io_ms} ms) took {took:?}"
            ));
        }
        let guard = match result {
            Ok(g) => g,
            Err(e) => {
                note(
                    &log,
                    format!(
                        "acquire {:?}{}",
                        e.kind(),
                        if e.outcome_unknown() {
                            " (unknown)"
                        } else {
                            ""
                        }
                    ),
                );
                std::thread::sleep(Duration::from_millis(rng.below(20)));
                continue;
            }
        };
        note(&log, "acquired".into());
        let start = Instant::now();
        let fence = guard.fencing_token();
        let mut end = start;
        let mut last_remaining = guard.remaining();
        let fresh = guard.is_held();
        let hold = Duration::from_millis(rng.below(250));
        while start.elapsed() < hold {
            let t = Instant::now();
            let remaining = guard.remaining();
            if guard.is_held() {
                end = t;
                last_remaining = remaining;
            } else {
                break;
            }
            if rng.below(40) == 0 {
                let ttl = Duration::from_millis(rng.pick(&[30, 200, 900]));
                match guard.extend(ttl) {
                    Ok(()) => note(&log, "extend ok".into()),
                    Err(e) => note(&log, format!("extend {:?}", e.kind())),
                }
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        {
            let mut l = log.lock().unwrap();
            l.held.push(Held {
                who: format!("w{id} {}", guard.token()),
                start,
                end,
                fence: Some(fence),
                fresh,
            });
        }
        let r0 = Instant::now();
        let released = guard.release();
        let r1 = Instant::now();
        match released {
            Ok(()) => note(&log, "release ok".into()),
            Err(e) => {
                note(&log, format!("release {:?}", e.kind()));
                // The local view promised the key until end + last_remaining.
                if e.kind() == ErrorKind::NotHeld
                    && end + last_remaining > r1
                    && end >= r0 - Duration::from_millis(5)
                {
                    log.lock().unwrap().problems.push(format!(
                        "w{id}: release said NotHeld while the lease was guaranteed until {:?} after it returned",
                        (end + last_remaining) - r1
                    ));
                }
            }
        }
        if r1 - r0 > Duration::from_millis(2 * io_ms + 2 * 200 + 500) {
            log.lock()
                .unwrap()
                .problems
                .push(format!("w{id}: release took {:?}", r1 - r0));
        }
    }
}

/// A client of the canonical protocol only (SET NX PX, token-checked DEL), on a direct
/// connection. Believes it holds from the reply until sent + ttl - 5 ms.
fn foreign(url: String, stop: Arc<AtomicBool>, log: Arc<Mutex<Log>>, seed: u64) {
    let mut rng = Rng(seed);
    let client = redis::Client::open(url).unwrap();
    let mut conn = None;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if conn.is_none() {
            conn = client
                .get_connection_with_timeout(Duration::from_millis(300))
                .ok()
                .inspect(|c: &redis::Connection| {
                    let _ = c.set_read_timeout(Some(Duration::from_millis(300)));
                });
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        }
        let c = conn.as_mut().unwrap();
        n += 1;
        let token = format!("foreign-{seed}-{n}");
        let ttl = 300u64;
        let sent = Instant::now();
        let got: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(NAME)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl)
            .query(c);
        match got {
            Ok(Some(_)) => {
                let start = Instant::now();
                let until = sent + Duration::from_millis(ttl - 5);
                let hold = Duration::from_millis(rng.below(100));
                std::thread::sleep(hold.min(until.saturating_duration_since(Instant::now())));
                let end = Instant::now().min(until);
                if end > start {
                    log.lock().unwrap().held.push(Held {
                        who: format!("foreign {token}"),
                        start,
                        end,
                        fence: None,
                        fresh: true,
                    });
                }
                let _: redis::RedisResult<i64> = redis::cmd("EVAL")
                    .arg("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
                    .arg(1)
                    .arg(NAME)
                    .arg(&token)
                    .query(c);
            }
            Ok(None) => {}
            Err(_) => conn = None,
        }
        std::thread::sleep(Duration::from_millis(5 + rng.below(30)));
    }
}

fn chaos(server: &RedisServer, proxies: &[Proxy], stop: Arc<AtomicBool>, seed: u64, run: Duration) {
    let mut rng = Rng(seed);
    let started = Instant::now();
    let needles: [&[u8]; 4] = [NAME.as_bytes(), b"BLPOP", b"EVALSHA", b"EVAL"];
    while started.elapsed() < run {
        let p = &proxies[rng.below(proxies.len() as u64) as usize];
        match rng.below(10) {
            0 => {
                p.set_reply_delay(Duration::from_millis(rng.below(300)));
                std::thread::sleep(Duration::from_millis(100 + rng.below(400)));
                p.set_reply_delay(Duration::ZERO);
            }
            1 => {
                p.blackhole(true);
                std::thread::sleep(Duration::from_millis(50 + rng.below(700)));
                p.blackhole(false);
            }
            2 => p.reset_all(),
            3 => {
                let action = rng.pick(&[
                    Action::DropReply,
                    Action::ResetBeforeReply,
                    Action::ResetBeforeRequest,
                    Action::DelayReply(Duration::from_millis(250)),
                    Action::DelayRequest(Duration::from_millis(350)),
                    Action::DelayReply(Duration::from_millis(900)),
                ]);
                p.on_request(rng.pick(&needles), 1 + rng.below(2) as usize, action);
            }
            4 => {
                server.pause();
                std::thread::sleep(Duration::from_millis(50 + rng.below(600)));
                server.resume();
            }
            5 => {
                let _: redis::RedisResult<()> =
                    redis::cmd("SCRIPT").arg("FLUSH").query(&mut server.conn());
            }
            6 => {
                p.set_request_delay(Duration::from_millis(rng.below(200)));
                std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
                p.set_request_delay(Duration::ZERO);
            }
            _ => std::thread::sleep(Duration::from_millis(50 + rng.below(200))),
        }
        std::thread::sleep(Duration::from_millis(rng.below(100)));
    }
    for p in proxies {
        p.clear_rules();
        p.blackhole(false);
        p.set_reply_delay(Duration::ZERO);
        p.set_request_delay(Duration::ZERO);
    }
    server.resume();
    stop.store(true, Ordering::SeqCst);
}

fn run_chaos(run: Duration, seed: u64) {
    eprintln!("seed {seed}");
    let server = RedisServer::start();
    let proxies: Vec<Proxy> = (0..4).map(|_| Proxy::start(server.port)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Log::default()));
    let mut threads = Vec::new();
    let ios = [100u64, 300, 800, 150];
    for id in 0..8 {
        let url = proxies[id % proxies.len()].url();
        let (stop, log) = (stop.clone(), log.clone());
        let io = ios[id % ios.len()];
        let s = seed.wrapping_mul(31).wrapping_add(id as u64 + 1);
        threads.push(std::thread::spawn(move || {
            worker(id, url, io, stop, log, s)
        }));
    }
    {
        let (stop, log) = (stop.clone(), log.clone());
        let url = server.url();
        threads.push(std::thread::spawn(move || {
            foreign(url, stop, log, seed ^ 0xabcdef)
        }));
    }
    chaos(&server, &proxies, stop.clone(), seed ^ 0x5555, run);
    support::within(Duration::from_secs(30), move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    // Leftovers: after every caller stopped and the longest grace (0.8 s + 0.5 s) and
    // ttl (1.5 s) passed, nothing but the fencing counter may remain.
    std::thread::sleep(Duration::from_millis(2500));
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    let mut problems = log.lock().unwrap().problems.clone();
    for key in &keys {
        let pttl: i64 = server.cmd(&["PTTL", key]);
        if !key.starts_with("redlease:fence:") {
            problems.push(format!("key {key} left behind (pttl {pttl})"));
        } else if pttl < 0 {
            problems.push(format!("fencing counter {key} without expiry"));
        }
    }
    let mut held = log.lock().unwrap().held.clone();
    held.sort_by_key(|h| h.start);
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if b.start > a.end {
                break;
            }
            let what = if a.fresh && b.fresh {
                "two holders"
            } else {
                "an acquire returned Ok for a lease already over (see the settle tests in acquire.rs), while another held it"
            };
            problems.push(format!(
                "{what}: {} [{:?}..{:?}] and {} [{:?}..{:?}]",
                a.who,
                a.start - held[0].start,
                a.end - held[0].start,
                b.who,
                b.start - held[0].start,
                b.end - held[0].start
            ));
        }
    }
    let fenced: Vec<&Held> = held.iter().filter(|h| h.fence.is_some()).collect();
    for w in fenced.windows(2) {
        if w[1].fence <= w[0].fence {
            problems.push(format!(
                "fencing tokens out of order: {} got {:?} after {} got {:?}",
                w[1].who, w[1].fence, w[0].who, w[0].fence
            ));
        }
    }
    let outcomes = std::mem::take(&mut log.lock().unwrap().outcomes);
    eprintln!("{} holds; outcomes: {outcomes:?}", held.len());
    assert!(problems.is_empty(), "seed {seed}:\n{}", problems.join("\n"));
}

fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1234_5678_9abc_def1)
}

#[test]
#[ignore = "randomised (timing): run with CHAOS_SEED=n; fails on the settle bug of acquire.rs now and then"]
fn every_invariant_holds_through_a_short_chaos_run() {
    run_chaos(Duration::from_secs(12), seed());
}

#[test]
#[ignore = "slow: CHAOS_SECS (default 120) of chaos"]
fn every_invariant_holds_through_a_long_chaos_run() {
    let secs = std::env::var("CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    run_chaos(Duration::from_secs(secs), seed());
}
