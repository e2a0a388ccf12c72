//! W3, renewal: many locks (ttl 1 s) held doing nothing, renewed every ttl/3 by the
//! library. The floor runs at the same time, in one thread of this process: one pipelined
//! batch of token-checked `PEXPIRE` scripts for as many keys of its own every ttl/3 (the
//! least renewal can cost); its thread's CPU is taken out of the process's. The window is
//! cut into `--reps` slices for the spread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlease::Client;

use crate::report::{Json, Spread};
use crate::{Bench, TAG, cpu_seconds, open_sockets, proc_status, thread_cpu_seconds};

const TTL: Duration = Duration::from_secs(1);

const EXTEND_LUA: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// The floor, running in a thread until `stop`: its CPU seconds so far (f64 bits) in
/// `cpu`, keys it found gone in `lost`.
fn floor(
    bench: &Bench,
    locks: usize,
    stop: Arc<AtomicBool>,
    cpu: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let mut conn = bench.conn();
    let script = redis::Script::new(EXTEND_LUA);
    let sha = script.get_hash().to_owned();
    let _: String = script.prepare_invoke().load(&mut conn).expect("load");
    let keys: Vec<String> = (0..locks).map(|i| format!("{TAG}:w3floor:{i}")).collect();
    let ttl_ms = TTL.as_millis() as u64;
    let mut set = redis::pipe();
    for key in &keys {
        set.cmd("SET")
            .arg(key)
            .arg("tok")
            .arg("PX")
            .arg(ttl_ms)
            .ignore();
    }
    let _: () = set.query(&mut conn).expect("SET");
    std::thread::spawn(move || {
        let mut batch = redis::pipe();
        for key in &keys {
            batch
                .cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(key)
                .arg("tok")
                .arg(ttl_ms);
        }
        let mut due = Instant::now() + TTL / 3;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(100)));
                continue;
            }
            let replies: Vec<i64> = batch.query(&mut conn).expect("EVALSHA batch");
            lost.fetch_add(
                replies.iter().filter(|r| **r != 1).count() as u64,
                Ordering::Relaxed,
            );
            due += TTL / 3;
            cpu.store(thread_cpu_seconds().to_bits(), Ordering::Relaxed);
        }
    })
}

/// CPU % of one core of `locks` threads that only keep time: each wakes on the renewal
/// grid every ttl/3 with the renewal threads' timer slack, and does nothing. The least a
/// thread per lock can cost, whatever it does when awake; one figure per slice (none when
/// the OS refuses a thread).
fn bare_threads(locks: usize, slices: usize, slice: Duration) -> Vec<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let mut threads = Vec::with_capacity(locks);
    for i in 0..locks {
        let stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || {
                // As the renewal threads: timer slack and wake-ups on a grid, both
                // a thirtieth of the ttl up to 15 ms.
                let grid = (TTL / 30).min(Duration::from_millis(15));
                let slack = grid.as_nanos() as libc::c_ulong;
                // SAFETY: prctl(PR_SET_TIMERSLACK) takes a value and touches no memory.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack, 0, 0, 0) };
                let on_grid = |at: Instant| {
                    let since = at.saturating_duration_since(epoch).as_nanos();
                    let grid = grid.as_nanos();
                    epoch + Duration::from_nanos((since.div_ceil(grid) * grid) as u64)
                };
                let pair = (std::sync::Mutex::new(()), std::sync::Condvar::new());
                let mut due = on_grid(Instant::now() + TTL / 3 * (i as u32 % 3 + 1) / 3);
                while !stop.load(Ordering::Relaxed) {
                    let guard = pair.0.lock().unwrap_or_else(|p| p.into_inner());
                    let left = due.saturating_duration_since(Instant::now());
                    let _ = pair.1.wait_timeout(guard, left);
                    let now = Instant::now();
                    if now >= due {
                        due = on_grid(now + TTL / 3);
                    }
                }
            });
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                eprintln!(
                    "bench: the idle thread-per-lock reference could not start thread {i}: {e}"
                );
                break;
            }
        }
    }
    if threads.len() < locks {
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
        return Vec::new();
    }
    std::thread::sleep(TTL);
    let mut pct = Vec::new();
    for _ in 0..slices {
        let (t0, cpu0) = (Instant::now(), cpu_seconds());
        std::thread::sleep(slice);
        pct.push((cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64() * 100.0);
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    pct
}

pub(crate) fn run(bench: &Bench) {
    for &locks in &bench.cfg.w3_locks {
        run_one(bench, locks);
    }
}

fn run_one(bench: &Bench, locks: usize) {
    let sockets_before = open_sockets();
    let threads_before = proc_status("Threads");
    let rss_before = proc_status("VmRSS");
    let client = Client::open(&bench.url).expect("client");
    let lost = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let guards: Vec<_> = (0..locks)
        .map(|i| {
            let lost = lost.clone();
            client
                .lock(&format!("{TAG}:w3:{i}"))
                .ttl(TTL)
                .on_lost(move |_| {
                    lost.fetch_add(1, Ordering::SeqCst);
                })
                .try_acquire()
                .unwrap_or_else(|e| panic!("acquiring lock {i} of {locks}: {e}"))
        })
        .collect();
    let acquire_s = started.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    let floor_cpu = Arc::new(AtomicU64::new(0f64.to_bits()));
    let floor_lost = Arc::new(AtomicU64::new(0));
    let floor_thread = floor(
        bench,
        locks,
        stop.clone(),
        floor_cpu.clone(),
        floor_lost.clone(),
    );
    // Let the first renewals of both run before measuring.
    std::thread::sleep(TTL);
    let read_floor = || f64::from_bits(floor_cpu.load(Ordering::Relaxed));
    let stats_before = redlease::renewal_stats();
    let connections_before = bench.connections_received();
    let window = Duration::from_secs(bench.cfg.w3_secs.max(1));
    let slices = bench.cfg.reps.max(1);
    let (mut ours_pct, mut floor_pct, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    for _ in 0..slices {
        let (t0, cpu0, floor0) = (Instant::now(), cpu_seconds(), read_floor());
        std::thread::sleep(window / slices as u32);
        let wall = t0.elapsed().as_secs_f64();
        let floor = read_floor() - floor0;
        let ours = cpu_seconds() - cpu0 - floor;
        ours_pct.push(ours / wall * 100.0);
        floor_pct.push(floor / wall * 100.0);
        ratios.push(ours / floor);
    }
    let wall = start.elapsed().as_secs_f64();
    let stats = redlease::renewal_stats().since(&stats_before);
    let connections = bench
        .connections_received()
        .saturating_sub(connections_before + 2); // the two INFO connections of this count
    let threads_held = proc_status("Threads");
    let rss_held = proc_status("VmRSS");
    // The floor's one connection is not the library's.
    let sockets_held = open_sockets().saturating_sub(sockets_before + 1);
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    stop.store(true, Ordering::Relaxed);
    let _ = floor_thread.join();
    let released = Instant::now();
    drop(guards);
    let release_s = released.elapsed().as_secs_f64();
    // The renewal threads of the released locks exit (all but the parked ones) before the
    // reference starts as many threads again: both at once can pass the process's limits
    // (`vm.max_map_count`: each thread maps its stack and guard pages).
    let settle_by = Instant::now() + Duration::from_secs(30);
    while proc_status("Threads") > threads_before + 300 && Instant::now() < settle_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    let period_ms = TTL.as_secs_f64() * 1000.0 / 3.0;
    let slice = (window / slices as u32).min(Duration::from_secs(5));
    let bare = bare_threads(locks, slices, slice);
    let to_reference: Vec<f64> = ours_pct.iter().zip(&bare).map(|(o, b)| o / b).collect();
    let bare_ratio: Vec<f64> = bare.iter().zip(&floor_pct).map(|(b, f)| b / f).collect();
    println!(
        "{}",
        Json::default()
            .str("workload", "W3 renewal")
            .int("locks", locks as u64)
            .num("ttl_s", TTL.as_secs_f64())
            .num("held_s", wall)
            .int("slices", slices as u64)
            .int("lost", lost.load(Ordering::SeqCst))
            .int("still_held_at_end", still_held as u64)
            .int("floor_lost", floor_lost.load(Ordering::Relaxed))
            .int("renewals", stats.renewals)
            .int("renewal_failures", stats.failures)
            .num(
                "renewals_per_lock_per_s",
                stats.renewals as f64 / wall / locks as f64
            )
            .num(
                "renewal_lateness_p50_ms",
                stats.lateness_quantile(0.5).as_secs_f64() * 1e3
            )
            .num(
                "renewal_lateness_p99_ms",
                stats.lateness_quantile(0.99).as_secs_f64() * 1e3
            )
            .num(
                "renewal_lateness_max_ms",
                stats.max_lateness.as_secs_f64() * 1e3
            )
            .num("lateness_limit_ttl_over_6_ms", period_ms / 2.0)
            .spread("cpu_percent_of_one_core", Spread::of(&ours_pct))
            .spread("floor_cpu_percent_of_one_core", Spread::of(&floor_pct))
            .spread("cpu_ratio_to_floor", Spread::of(&ratios))
            .spread("idle_thread_per_lock_cpu_percent", Spread::of(&bare))
            .spread("cpu_ratio_to_reference", Spread::of(&to_reference))
            .spread(
                "idle_thread_per_lock_ratio_to_floor",
                Spread::of(&bare_ratio)
            )
            .int("threads_added", threads_held.saturating_sub(threads_before))
            .int("sockets_of_the_client", sockets_held)
            .int("connections_opened_while_held", connections)
            .num(
                "rss_kib_per_lock",
                rss_held.saturating_sub(rss_before) as f64 / locks as f64,
            )
            .num("acquire_all_s", acquire_s)
            .num("release_all_s", release_s)
            .render()
    );
}
