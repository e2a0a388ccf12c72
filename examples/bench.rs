//! The redlease benchmark (shared/DESIGN.md §7). Prints one JSON object per workload.
//!
//! Every figure is also given as a ratio to the **floor** measured in the same run: a loop on
//! one persistent redis-crate connection sending exactly `SET key tok NX PX 30000` then
//! `EVALSHA <release script>` per cycle (and, for W2, eight threads polling that every 1 ms).
//!
//! ```text
//! cargo run --release --example bench -- [--duration S] [--reps N] [--threads N]
//!     [--cs-ms 0,1] [--w3-locks N] [--w3-secs S] [--python PYTHON|none] [--only w1|w2|w3]
//!     [--smoke]
//! ```
//! Starts its own redis-server unless `REDIS_URL` is set.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use redlease::Client;

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

struct Config {
    duration: Duration,
    reps: usize,
    threads: usize,
    w3_locks: usize,
    w3_secs: u64,
    python: Option<String>,
    only: Option<String>,
    /// W2 critical-section lengths, ms.
    cs_ms: Vec<u64>,
}

impl Config {
    fn from_args() -> Config {
        let mut c = Config {
            duration: Duration::from_secs(3),
            reps: 3,
            threads: 8,
            w3_locks: 1000,
            w3_secs: 60,
            python: Some("python3".into()),
            only: None,
            cs_ms: vec![0, 1],
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let value = || args.get(i + 1).cloned().unwrap_or_default();
            match args[i].as_str() {
                "--smoke" => {
                    c.duration = Duration::from_millis(400);
                    c.reps = 1;
                    c.w3_locks = 50;
                    c.w3_secs = 2;
                    i += 1;
                    continue;
                }
                "--duration" => {
                    c.duration = Duration::from_secs_f64(value().parse().unwrap_or(3.0))
                }
                "--reps" => c.reps = value().parse().unwrap_or(3),
                "--threads" => c.threads = value().parse().unwrap_or(8),
                "--w3-locks" => c.w3_locks = value().parse().unwrap_or(1000),
                "--w3-secs" => c.w3_secs = value().parse().unwrap_or(60),
                "--only" => c.only = Some(value().to_lowercase()),
                "--cs-ms" => {
                    c.cs_ms = value()
                        .split(',')
                        .filter_map(|ms| ms.trim().parse().ok())
                        .collect()
                }
                "--python" => c.python = Some(value()).filter(|p| !p.is_empty() && p != "none"),
                other => panic!("unknown option {other}"),
            }
            i += 2;
        }
        c
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A tiny JSON object writer (values are numbers, strings or nested objects).
#[derive(Default)]
struct Json(Vec<(String, String)>);

impl Json {
    fn num(mut self, k: &str, v: f64) -> Self {
        let text = if v.is_finite() {
            format!("{v:.4}")
        } else {
            "null".into()
        };
        self.0.push((k.into(), text));
        self
    }
    fn int(mut self, k: &str, v: u64) -> Self {
        self.0.push((k.into(), v.to_string()));
        self
    }
    fn str(mut self, k: &str, v: &str) -> Self {
        self.0.push((k.into(), format!("{v:?}")));
        self
    }
    fn obj(mut self, k: &str, v: Json) -> Self {
        self.0.push((k.into(), v.render()));
        self
    }
    fn render(&self) -> String {
        let fields: Vec<String> = self.0.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", fields.join(", "))
    }
}

struct Bench {
    server: Option<support::RedisServer>,
    url: String,
    cfg: Config,
}

impl Bench {
    fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str())
            .and_then(|c| c.get_connection())
            .expect("connect to redis")
    }

    /// Top-level calls of `commands`, from INFO commandstats.
    fn calls(&self, commands: &[&str]) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap_or_default();
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| l.split_once(":calls="))
            .filter(|(name, _)| commands.contains(name))
            .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.conn())
            .unwrap_or(());
    }

    /// `total_connections_received` from INFO stats.
    fn connections_received(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.conn())
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    fn key_count(&self) -> u64 {
        redis::cmd("DBSIZE").query(&mut self.conn()).unwrap_or(0)
    }

    /// Mean cycle time (µs) of `cycle`, run for `duration` after a warm-up.
    fn timed_loop(duration: Duration, cycle: &mut dyn FnMut()) -> f64 {
        for _ in 0..50 {
            cycle(); // warm-up: connections, script cache, renewal threads
        }
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            for _ in 0..20 {
                cycle();
            }
            n += 20;
        }
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    }

    /// The W1 floor: `SET NX PX` then `EVALSHA` of the release script, one connection.
    fn floor_cycle(&self) -> impl FnMut() + use<> {
        let mut conn = self.conn();
        let script = redis::Script::new(RELEASE_LUA);
        let sha = script.get_hash().to_owned();
        let _: String = script.prepare_invoke().load(&mut conn).expect("load");
        move || {
            let ok: Option<String> = redis::cmd("SET")
                .arg("bench:floor")
                .arg("tok")
                .arg("NX")
                .arg("PX")
                .arg(30000)
                .query(&mut conn)
                .expect("SET");
            assert!(ok.is_some());
            let _: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg("bench:floor")
                .arg("tok")
                .query(&mut conn)
                .expect("EVALSHA");
        }
    }

    fn floor_w1(&self) -> f64 {
        Self::timed_loop(self.cfg.duration, &mut self.floor_cycle())
    }

    /// W1 through the C ABI, as a C program would call it.
    fn ffi_cycle(&self) -> impl FnMut() + use<> {
        use redlease::ffi::*;
        let url = CString::new(self.url.clone()).unwrap_or_default();
        let mut client: lock_client_t = 0;
        assert_eq!(
            // SAFETY: valid NUL-terminated strings and out-pointers.
            unsafe { lock_client_open(url.as_ptr(), &mut client) },
            LOCK_OK
        );
        move || {
            let mut lock: lock_t = 0;
            // SAFETY: as above.
            let rc = unsafe { lock_acquire(client, c"bench:ffi".as_ptr(), 30_000, 0, &mut lock) };
            assert_eq!(rc, LOCK_OK);
            assert_eq!(lock_release(lock), LOCK_OK);
        }
    }

    /// W1: the floor, the Rust API and the C ABI measured in alternating slices of 200 ms,
    /// so that the machine's drift hits all three alike; medians over the slices.
    fn run_w1(&self) {
        let client = Client::open(&self.url).expect("client");
        let mut floor = self.floor_cycle();
        let mut rust = || {
            let guard = client.lock("bench:w1").try_acquire().expect("acquire");
            guard.release().expect("release");
        };
        let mut ffi = self.ffi_cycle();
        let slice = Duration::from_millis(200);
        let rounds =
            self.cfg.reps * (self.cfg.duration.as_millis() / slice.as_millis()).max(1) as usize;
        let (mut f, mut r, mut c, mut rr, mut cr) = (vec![], vec![], vec![], vec![], vec![]);
        self.reset_stats();
        for _ in 0..rounds {
            let floor_us = Self::timed_loop(slice, &mut floor);
            let rust_us = Self::timed_loop(slice, &mut rust);
            let ffi_us = Self::timed_loop(slice, &mut ffi);
            f.push(floor_us);
            r.push(rust_us);
            c.push(ffi_us);
            rr.push(rust_us / floor_us);
            cr.push(ffi_us / floor_us);
        }
        let script_loads = self.calls(&["script|load"]);
        let evals = self.calls(&["eval"]);
        let floor = median(f);
        println!(
            "{}",
            Json::default()
                .str("workload", "W1 uncontended acquire+release")
                .int("slices", rounds as u64)
                .num("floor_cycle_us", floor)
                .num("rust_cycle_us", median(r))
                .num("rust_ratio_to_floor", median(rr))
                .num("c_abi_cycle_us", median(c))
                .num("c_abi_ratio_to_floor", median(cr))
                .int("script_loads", script_loads)
                .int("eval_with_script_text", evals)
                .render()
        );
        if let Some(python) = &self.cfg.python {
            // Python runs in another process: its floor is measured right before and after.
            let before = self.floor_w1();
            let fields = self.python("w1", python, 1);
            let floor = (before + self.floor_w1()) / 2.0;
            if let Some(fields) = fields {
                let cycle = fields.get("cycle_us").copied().unwrap_or(f64::NAN);
                let json = Self::python_json("W1", &fields)
                    .num("floor_cycle_us", floor)
                    .num("cycles_per_s_ratio_to_floor", floor / cycle);
                println!("{}", json.render());
            }
        }
    }

    /// W2 floor: threads polling `SET NX PX` every 1 ms, releasing with EVALSHA.
    fn floor_w2(&self, cs: Duration) -> W2Result {
        let script = redis::Script::new(RELEASE_LUA);
        let sha = script.get_hash().to_owned();
        let _: String = script
            .prepare_invoke()
            .load(&mut self.conn())
            .expect("load");
        self.contend(cs, &["set", "evalsha"], |i| {
            let mut conn = self.conn();
            let token = format!("tok-{i}");
            let sha = sha.clone();
            move |acquired: &mut dyn FnMut()| loop {
                let ok: Option<String> = redis::cmd("SET")
                    .arg("bench:w2floor")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30000)
                    .query(&mut conn)
                    .expect("SET");
                if ok.is_some() {
                    acquired();
                    let _: i64 = redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg("bench:w2floor")
                        .arg(&token)
                        .query(&mut conn)
                        .expect("EVALSHA");
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    }

    fn rust_w2(&self, client: &Client, cs: Duration) -> W2Result {
        self.contend(cs, &["evalsha", "eval", "blpop"], |_| {
            let client = client.clone();
            move |acquired: &mut dyn FnMut()| {
                let guard = client.lock("bench:w2").acquire().expect("acquire");
                acquired();
                guard.release().expect("release");
            }
        })
    }

    /// Runs `threads` contenders for the configured duration. `make(i)` returns thread i's
    /// cycle: acquire, call `acquired` (which runs the critical section), release.
    fn contend<F, C>(&self, cs: Duration, commands: &[&str], make: F) -> W2Result
    where
        F: Fn(usize) -> C,
        C: FnMut(&mut dyn FnMut()) + Send,
    {
        let threads = self.cfg.threads;
        let stop = AtomicBool::new(false);
        let epoch = Instant::now();
        // Acquisitions are numbered in order (the number is drawn inside the critical
        // section); handoff latency of acquisition n = its acquire's return minus the
        // return of release n - 1 (negative when the lock reached n before that release
        // returned).
        let sequence = AtomicU64::new(0);
        let events = Mutex::new(Vec::<(u64, u64, u64)>::new()); // (n, acquired ns, released ns)
        let counts = Mutex::new(vec![0u64; threads]);
        let barrier = Barrier::new(threads + 1);
        let before = self.calls(commands);
        let mut elapsed = Duration::ZERO;
        std::thread::scope(|s| {
            for i in 0..threads {
                let mut cycle = make(i);
                let (stop, sequence, events, counts, barrier) =
                    (&stop, &sequence, &events, &counts, &barrier);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut n = 0;
                    barrier.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let mut entry = (0, 0);
                        let mut acquired = || {
                            let at = epoch.elapsed().as_nanos() as u64;
                            entry = (sequence.fetch_add(1, Ordering::SeqCst), at);
                            if !cs.is_zero() {
                                std::thread::sleep(cs);
                            }
                        };
                        cycle(&mut acquired);
                        mine.push((entry.0, entry.1, epoch.elapsed().as_nanos() as u64));
                        n += 1;
                    }
                    events
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(mine);
                    counts.lock().unwrap_or_else(|p| p.into_inner())[i] = n;
                });
            }
            barrier.wait();
            let start = Instant::now();
            std::thread::sleep(self.cfg.duration);
            stop.store(true, Ordering::Relaxed);
            elapsed = start.elapsed();
        });
        let mut events = events.into_inner().unwrap_or_default();
        events.sort_unstable();
        let mut lat: Vec<f64> = events
            .windows(2)
            .filter(|w| w[1].0 == w[0].0 + 1)
            .map(|w| (w[1].1 as i64 - w[0].2 as i64) as f64 / 1000.0)
            .collect();
        let requests = self.calls(commands) - before;
        let counts = counts.into_inner().unwrap_or_default();
        let total: u64 = counts.iter().sum();
        lat.sort_by(|a, b| a.total_cmp(b));
        W2Result {
            per_sec: total as f64 / elapsed.as_secs_f64(),
            fairness: *counts.iter().min().unwrap_or(&0) as f64
                / (*counts.iter().max().unwrap_or(&1)).max(1) as f64,
            p50_us: percentile(&lat, 0.5),
            p99_us: percentile(&lat, 0.99),
            requests_per_acquisition: requests as f64 / total.max(1) as f64,
        }
    }

    fn run_w2(&self, floor_rtt_us: f64) {
        let client = Client::open(&self.url).expect("client");
        for &cs_ms in &self.cfg.cs_ms {
            let cs = Duration::from_millis(cs_ms);
            let (mut floor, mut ours) = (vec![], vec![]);
            for _ in 0..self.cfg.reps {
                floor.push(self.floor_w2(cs));
                ours.push(self.rust_w2(&client, cs));
            }
            let floor = W2Result::median(floor);
            let ours = W2Result::median(ours);
            println!(
                "{}",
                Json::default()
                    .str(
                        "workload",
                        &format!(
                            "W2 contended, {} threads, {cs_ms} ms critical section",
                            self.cfg.threads
                        )
                    )
                    .obj("floor_polling_1ms", floor.json())
                    .obj("redlease", ours.json())
                    .num("acquisitions_ratio_to_floor", ours.per_sec / floor.per_sec)
                    .num("floor_round_trip_us", floor_rtt_us)
                    .num("handoff_p50_in_round_trips", ours.p50_us / floor_rtt_us)
                    .int("keys_after", self.key_count())
                    .render()
            );
        }
        if let Some(python) = &self.cfg.python {
            if let Some(fields) = self.python("w2", python, self.cfg.threads) {
                let p50 = fields.get("handoff_p50_us").copied().unwrap_or(f64::NAN);
                let json = Self::python_json("W2", &fields)
                    .num("floor_round_trip_us", floor_rtt_us)
                    .num("handoff_p50_in_round_trips", p50 / floor_rtt_us);
                println!("{}", json.render());
            }
        }
    }

    fn run_w3(&self) {
        let client = Client::open(&self.url).expect("client");
        let lost = Arc::new(AtomicU64::new(0));
        let ttl = Duration::from_secs(1);
        let threads_before = proc_status("Threads");
        let rss_before = proc_status("VmRSS");
        let guards: Vec<_> = (0..self.cfg.w3_locks)
            .map(|i| {
                let lost = lost.clone();
                client
                    .lock(&format!("bench:w3:{i}"))
                    .ttl(ttl)
                    .on_lost(move |_| {
                        lost.fetch_add(1, Ordering::SeqCst);
                    })
                    .try_acquire()
                    .expect("acquire")
            })
            .collect();
        let cpu_before = cpu_seconds();
        self.reset_stats();
        let connections_before = self.connections_received();
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs(self.cfg.w3_secs));
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu_before;
        let renewals = self.calls(&["evalsha"]);
        // Minus the bench's own connections for INFO.
        let connections = self
            .connections_received()
            .saturating_sub(connections_before + 2);
        let threads_held = proc_status("Threads");
        let rss_held = proc_status("VmRSS");
        let still_held = guards.iter().filter(|g| g.is_held()).count();
        drop(guards);
        println!(
            "{}",
            Json::default()
                .str("workload", "W3 renewal")
                .int("locks", self.cfg.w3_locks as u64)
                .num("ttl_s", ttl.as_secs_f64())
                .num("held_s", wall)
                .int("lost", lost.load(Ordering::SeqCst))
                .int("still_held_at_end", still_held as u64)
                .int("renewals", renewals)
                .num(
                    "renewals_per_lock_per_s",
                    renewals as f64 / wall / self.cfg.w3_locks as f64
                )
                .int("connections_opened_while_held", connections)
                .num("cpu_percent_of_one_core", cpu / wall * 100.0)
                .int("threads_before", threads_before)
                .int("threads_while_held", threads_held)
                .int("rss_kib_before", rss_before)
                .int("rss_kib_while_held", rss_held)
                .render()
        );
    }

    /// Runs bindings/python/benchmarks/bench.py; its JSON object's numbers.
    fn python(
        &self,
        workload: &str,
        python: &str,
        threads: usize,
    ) -> Option<BTreeMap<String, f64>> {
        let root = env!("CARGO_MANIFEST_DIR");
        let lib = format!("{root}/target/release/libredlease.so");
        let out = std::process::Command::new(python)
            .arg(format!("{root}/bindings/python/benchmarks/bench.py"))
            .args([
                workload,
                &self.url,
                &self.cfg.duration.as_secs_f64().to_string(),
                &threads.to_string(),
            ])
            .env("REDLEASE_LIB", &lib)
            .env("PYTHONPATH", format!("{root}/bindings/python"))
            .output();
        let out = match out {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(out) => {
                eprintln!(
                    "python bench failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return None;
            }
            Err(e) => {
                eprintln!("python bench not run: {e}");
                return None;
            }
        };
        Some(
            out.trim()
                .trim_matches(['{', '}'])
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once(':')?;
                    Some((
                        k.trim().trim_matches('"').to_owned(),
                        v.trim().parse().ok()?,
                    ))
                })
                .collect(),
        )
    }

    fn python_json(workload: &str, fields: &BTreeMap<String, f64>) -> Json {
        let mut json = Json::default().str("workload", &format!("{workload} from Python threads"));
        for (k, v) in fields {
            json = json.num(k, *v);
        }
        json
    }
}

#[derive(Clone, Copy)]
struct W2Result {
    per_sec: f64,
    fairness: f64,
    p50_us: f64,
    p99_us: f64,
    requests_per_acquisition: f64,
}

impl W2Result {
    fn median(v: Vec<W2Result>) -> W2Result {
        let pick = |f: fn(&W2Result) -> f64| median(v.iter().map(f).collect());
        W2Result {
            per_sec: pick(|r| r.per_sec),
            fairness: pick(|r| r.fairness),
            p50_us: pick(|r| r.p50_us),
            p99_us: pick(|r| r.p99_us),
            requests_per_acquisition: pick(|r| r.requests_per_acquisition),
        }
    }

    fn json(&self) -> Json {
        Json::default()
            .num("acquisitions_per_s", self.per_sec)
            .num("fairness_min_over_max", self.fairness)
            .num("handoff_p50_us", self.p50_us)
            .num("handoff_p99_us", self.p99_us)
            .num("requests_per_acquisition", self.requests_per_acquisition)
    }
}

fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn main() {
    let cfg = Config::from_args();
    let (server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = support::RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    let bench = Bench { server, url, cfg };
    eprintln!(
        "# redlease bench: {} s per measurement, median of {}; server {}{}",
        bench.cfg.duration.as_secs_f64(),
        bench.cfg.reps,
        bench.url,
        if bench.server.is_some() {
            " (started by the bench)"
        } else {
            ""
        }
    );
    let wanted = |w: &str| bench.cfg.only.as_deref().is_none_or(|only| only == w);
    if wanted("w1") {
        bench.run_w1();
    }
    if wanted("w2") {
        let floor = bench.floor_w1();
        bench.run_w2(floor / 2.0);
    }
    if wanted("w3") {
        bench.run_w3();
    }
}
