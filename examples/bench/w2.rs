//! W2, contended: threads, one key, blocking acquire, a critical section of a few ms.
//! Acquisitions/s, fairness (min/max acquisitions per thread), handoff latency, server
//! commands per acquisition (from INFO commandstats, a script's own included), and CPU per acquisition
//! of this process and of the server. The floor (threads polling `SET NX PX` every 1 ms)
//! and the library alternate rep by rep, and beside the library the fair floor
//! ([`fair_floor`]: the least a lock that serves threads in order costs). [`contend`] also
//! runs the semaphore workload.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions};

use crate::report::{Json, Spread, percentile};
use crate::w1::{RELEASE_LUA, floor_us};
use crate::{Bench, TAG, cpu_seconds, python, support};

/// The figures of one contended run.
#[derive(Clone, Copy)]
pub(crate) struct Contended {
    pub(crate) per_sec: f64,
    pub(crate) fairness: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) server_commands_per_acquisition: f64,
    pub(crate) client_cpu_us: f64,
    pub(crate) server_cpu_us: f64,
    /// The most holders seen in the critical section at once.
    pub(crate) max_holders: usize,
}

/// Per-rep figures of one contender (the floor or the library).
#[derive(Default)]
pub(crate) struct Reps(Vec<Contended>);

impl Reps {
    pub(crate) fn push(&mut self, c: Contended) {
        self.0.push(c);
    }

    pub(crate) fn spread(&self, f: fn(&Contended) -> f64) -> Spread {
        Spread::of(&self.0.iter().map(f).collect::<Vec<_>>())
    }

    /// The figures measured in this process (no server's counters).
    pub(crate) fn client_json(&self) -> Json {
        Json::default()
            .spread("acquisitions_per_s", self.spread(|c| c.per_sec))
            .spread("fairness_min_over_max", self.spread(|c| c.fairness))
            .spread("handoff_p50_us", self.spread(|c| c.p50_us))
            .spread("handoff_p99_us", self.spread(|c| c.p99_us))
            .spread(
                "client_cpu_us_per_acquisition",
                self.spread(|c| c.client_cpu_us),
            )
            .int(
                "max_holders_at_once",
                self.0.iter().map(|c| c.max_holders).max().unwrap_or(0) as u64,
            )
    }

    pub(crate) fn json(&self) -> Json {
        Json::default()
            .spread("acquisitions_per_s", self.spread(|c| c.per_sec))
            .spread("fairness_min_over_max", self.spread(|c| c.fairness))
            .spread("handoff_p50_us", self.spread(|c| c.p50_us))
            .spread("handoff_p99_us", self.spread(|c| c.p99_us))
            .spread(
                "server_commands_per_acquisition",
                self.spread(|c| c.server_commands_per_acquisition),
            )
            .spread(
                "client_cpu_us_per_acquisition",
                self.spread(|c| c.client_cpu_us),
            )
            .spread(
                "server_cpu_us_per_acquisition",
                self.spread(|c| c.server_cpu_us),
            )
            .int(
                "max_holders_at_once",
                self.0.iter().map(|c| c.max_holders).max().unwrap_or(0) as u64,
            )
    }
}

/// Runs `threads` contenders for the configured duration. `make(i)` returns thread i's
/// cycle: acquire, call `acquired` (which runs the critical section), release. Every
/// command the server runs meanwhile counts (a script's own commands included).
pub(crate) fn contend<F, C>(bench: &Bench, threads: usize, cs: Duration, make: F) -> Contended
where
    F: Fn(usize) -> C,
    C: FnMut(&mut dyn FnMut()) + Send,
{
    let stop = AtomicBool::new(false);
    let epoch = Instant::now();
    // Acquisitions are numbered in order (the number is drawn inside the critical
    // section); handoff latency of acquisition n = its acquire's return minus the return
    // of release n - 1 (negative when the lock reached n before that release returned).
    let sequence = AtomicU64::new(0);
    let inside = AtomicUsize::new(0);
    let most_inside = AtomicUsize::new(0);
    let events = Mutex::new(Vec::<(u64, u64, u64)>::new()); // (n, acquired ns, released ns)
    let counts = Mutex::new(vec![0u64; threads]);
    let barrier = Barrier::new(threads + 1);
    let cycles: Vec<C> = (0..threads).map(&make).collect();
    let commands_before = bench.all_calls();
    let server_before = bench.server_cpu();
    let mut elapsed = Duration::ZERO;
    let mut client_cpu = 0.0;
    std::thread::scope(|s| {
        for (i, mut cycle) in cycles.into_iter().enumerate() {
            let (stop, sequence, events, counts, barrier, inside, most_inside) = (
                &stop,
                &sequence,
                &events,
                &counts,
                &barrier,
                &inside,
                &most_inside,
            );
            s.spawn(move || {
                let mut mine = Vec::new();
                let mut n = 0;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let mut entry = (0, 0);
                    let mut acquired = || {
                        let at = epoch.elapsed().as_nanos() as u64;
                        let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most_inside.fetch_max(now_inside, Ordering::SeqCst);
                        entry = (sequence.fetch_add(1, Ordering::SeqCst), at);
                        if !cs.is_zero() {
                            std::thread::sleep(cs);
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
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
        let cpu_start = cpu_seconds();
        std::thread::sleep(bench.cfg.duration);
        stop.store(true, Ordering::Relaxed);
        elapsed = start.elapsed();
        client_cpu = cpu_seconds() - cpu_start;
    });
    let server_cpu = bench.server_cpu() - server_before;
    let mut events = events.into_inner().unwrap_or_default();
    events.sort_unstable();
    let mut lat: Vec<f64> = events
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1)
        .map(|w| (w[1].1 as i64 - w[0].2 as i64) as f64 / 1000.0)
        .collect();
    let commands = bench.all_calls().saturating_sub(commands_before);
    let counts = counts.into_inner().unwrap_or_default();
    let total: u64 = counts.iter().sum();
    lat.sort_by(|a, b| a.total_cmp(b));
    let per_acquisition = |seconds: f64| seconds * 1e6 / total.max(1) as f64;
    Contended {
        per_sec: total as f64 / elapsed.as_secs_f64(),
        fairness: *counts.iter().min().unwrap_or(&0) as f64
            / (*counts.iter().max().unwrap_or(&1)).max(1) as f64,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        server_commands_per_acquisition: commands as f64 / total.max(1) as f64,
        client_cpu_us: per_acquisition(client_cpu),
        server_cpu_us: per_acquisition(server_cpu),
        max_holders: most_inside.load(Ordering::SeqCst),
    }
}

/// Runs the floor and the library `reps` times each, alternating so that the machine's
/// drift hits both alike: their per-rep figures, and the library's acquisitions/s over the
/// floor's, rep by rep.
pub(crate) fn alternate(
    reps: usize,
    mut floor: impl FnMut() -> Contended,
    mut ours: impl FnMut() -> Contended,
) -> (Reps, Reps, Vec<f64>) {
    let (mut floors, mut mine, mut ratios) = (Reps::default(), Reps::default(), Vec::new());
    for _ in 0..reps {
        let f = floor();
        let o = ours();
        ratios.push(o.per_sec / f.per_sec);
        floors.push(f);
        mine.push(o);
    }
    (floors, mine, ratios)
}

/// For each configured critical section: `floor` and `ours` in alternating reps, printed
/// as one JSON object named `workload` + ", N ms critical section".
pub(crate) fn run_against_floor(
    bench: &Bench,
    workload: &str,
    floor: impl Fn(Duration) -> Contended,
    ours: impl Fn(Duration) -> Contended,
) {
    for &cs_ms in &bench.cfg.cs_ms {
        let cs = Duration::from_millis(cs_ms);
        let (floors, mine, ratios) = alternate(bench.cfg.reps, || floor(cs), || ours(cs));
        println!(
            "{}",
            Json::default()
                .str(
                    "workload",
                    &format!("{workload}, {cs_ms} ms critical section")
                )
                .obj("floor_polling_1ms", floors.json())
                .obj("redlease", mine.json())
                .spread("acquisitions_ratio_to_floor", Spread::of(&ratios))
                .render()
        );
    }
}

/// The W2 floor: threads polling `SET NX PX` every 1 ms, releasing with EVALSHA.
pub(crate) fn floor(bench: &Bench, cs: Duration) -> Contended {
    let script = redis::Script::new(RELEASE_LUA);
    let sha = script.get_hash().to_owned();
    let _: String = script
        .prepare_invoke()
        .load(&mut bench.conn())
        .expect("load");
    let key = format!("{TAG}:w2floor");
    contend(bench, bench.cfg.threads, cs, |i| {
        let mut conn = bench.conn();
        let token = format!("tok-{i}");
        let (sha, key) = (sha.clone(), key.clone());
        move |acquired: &mut dyn FnMut()| loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(&key)
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
                    .arg(&key)
                    .arg(&token)
                    .query(&mut conn)
                    .expect("EVALSHA");
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// The fair floor's acquire: `SET NX PX`, then the next fencing token from the counter,
/// written as the client's estimate came (as the library's single attempt does).
const FAIR_ACQUIRE_LUA: &str = r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', '604800000', 'GET')
return 1
";

/// The fair floor's pass: while the key holds the releaser's token and no other process
/// registered a waiter (the flag), the key goes to the next thread's token with a fencing
/// token, in one script.
const FAIR_PASS_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'PX', '604800000', 'GET')
return 1
";

/// What a thread queued in the fair floor is told: the lock was passed to its token, or
/// it takes the lock from the server itself.
#[derive(Clone, Copy, PartialEq)]
enum Turn {
    Passed,
    TakeIt,
}

#[derive(Default)]
struct Slot {
    turn: Mutex<Option<Turn>>,
    ready: std::sync::Condvar,
}

/// The threads of the fair floor: whether one of them holds the lock, and who waits for
/// it, in order.
#[derive(Default)]
struct FairQueue {
    held: bool,
    waiting: std::collections::VecDeque<(String, std::sync::Arc<Slot>)>,
}

fn state(q: &Mutex<FairQueue>) -> std::sync::MutexGuard<'_, FairQueue> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fair floor, the least a fair lock costs: the threads of this process queue in
/// memory, and a release that finds a thread queued passes the key to that thread's token
/// with its fencing token in one script, then wakes it. One round trip and one thread
/// wake-up per acquisition, the lock taken in the order the threads asked; no waiter of
/// another process (none here) is served, no lease is renewed, no reply is lost.
pub(crate) fn fair_floor(bench: &Bench, cs: Duration) -> Contended {
    use std::sync::Arc;
    let acquire = redis::Script::new(FAIR_ACQUIRE_LUA);
    let pass = redis::Script::new(FAIR_PASS_LUA);
    let release = redis::Script::new(RELEASE_LUA);
    let queue = Arc::new(Mutex::new(FairQueue::default()));
    let fence = Arc::new(AtomicU64::new(1));
    let (key, fence_key, flag) = (
        format!("{TAG}:w2fair"),
        format!("{TAG}:w2fair:fence"),
        format!("{TAG}:w2fair:flag"),
    );
    contend(bench, bench.cfg.threads, cs, |i| {
        let mut conn = bench.conn();
        let (acquire, pass, release) = (acquire.clone(), pass.clone(), release.clone());
        let (queue, fence) = (queue.clone(), fence.clone());
        let (key, fence_key, flag) = (key.clone(), fence_key.clone(), flag.clone());
        let mut n = 0u64;
        move |acquired: &mut dyn FnMut()| {
            n += 1;
            let token = format!("fair-{i}-{n}");
            let queued = {
                let mut q = state(&queue);
                if q.held {
                    let slot = Arc::new(Slot::default());
                    q.waiting.push_back((token.clone(), slot.clone()));
                    Some(slot)
                } else {
                    q.held = true;
                    None
                }
            };
            let turn = match queued {
                Some(slot) => {
                    let mut turn = slot.turn.lock().unwrap_or_else(|p| p.into_inner());
                    while turn.is_none() {
                        turn = slot.ready.wait(turn).unwrap_or_else(|p| p.into_inner());
                    }
                    turn.unwrap_or(Turn::TakeIt)
                }
                None => Turn::TakeIt,
            };
            if turn == Turn::TakeIt {
                loop {
                    let taken: i64 = acquire
                        .key(&key)
                        .key(&fence_key)
                        .arg(&token)
                        .arg(30000)
                        .arg(fence.fetch_add(1, Ordering::Relaxed))
                        .invoke(&mut conn)
                        .expect("fair acquire");
                    if taken == 1 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            acquired();
            let next = state(&queue).waiting.pop_front();
            match next {
                Some((next_token, slot)) => {
                    let passed: i64 = pass
                        .key(&key)
                        .key(&fence_key)
                        .key(&flag)
                        .arg(&token)
                        .arg(&next_token)
                        .arg(30000)
                        .arg(fence.fetch_add(1, Ordering::Relaxed))
                        .invoke(&mut conn)
                        .expect("fair pass");
                    assert_eq!(passed, 1, "the fair floor's pass found the key changed");
                    *slot.turn.lock().unwrap_or_else(|p| p.into_inner()) = Some(Turn::Passed);
                    slot.ready.notify_one();
                }
                None => {
                    let _: i64 = release
                        .key(&key)
                        .arg(&token)
                        .invoke(&mut conn)
                        .expect("fair release");
                    // A thread that queued meanwhile takes the lock from the server.
                    let mut q = state(&queue);
                    match q.waiting.pop_front() {
                        Some((_, slot)) => {
                            *slot.turn.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(Turn::TakeIt);
                            slot.ready.notify_one();
                        }
                        None => q.held = false,
                    }
                }
            }
        }
    })
}

fn ours(bench: &Bench, client: &Client, cs: Duration) -> Contended {
    let name = format!("{TAG}:w2");
    contend(bench, bench.cfg.threads, cs, |_| {
        let client = client.clone();
        let name = name.clone();
        move |acquired: &mut dyn FnMut()| {
            let guard = client.lock(&name).acquire().expect("acquire");
            acquired();
            guard.release().expect("release");
        }
    })
}

/// The N-node W2 floor for Redlock: threads polling every 1 ms with `SET NX PX` written to
/// every member before any reply is read; a majority holds the lock (released on every
/// member that granted it), a minority is given back at once.
fn nodes_floor(bench: &Bench, urls: &[String], cs: Duration) -> Contended {
    let script = redis::Script::new(RELEASE_LUA);
    let sha = script.get_hash().to_owned();
    let key = format!("{TAG}:w2nodesfloor");
    contend(bench, bench.cfg.threads, cs, |i| {
        let mut conns: Vec<redis::Connection> = urls
            .iter()
            .map(|u| {
                let mut conn = redis::Client::open(u.as_str())
                    .and_then(|c| c.get_connection())
                    .unwrap_or_else(|e| panic!("connect to {u}: {e}"));
                let _: String = script.prepare_invoke().load(&mut conn).expect("load");
                conn
            })
            .collect();
        let token = format!("tok-{i}");
        let set = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30000)
            .get_packed_command();
        let del = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(&token)
            .get_packed_command();
        let majority = conns.len() / 2 + 1;
        move |acquired: &mut dyn FnMut()| loop {
            for conn in &mut conns {
                conn.send_packed_command(&set).expect("send SET");
            }
            let granted: Vec<bool> = conns
                .iter_mut()
                .map(|conn| !matches!(conn.recv_response().expect("SET"), redis::Value::Nil))
                .collect();
            let won = granted.iter().filter(|g| **g).count() >= majority;
            if won {
                acquired();
            }
            let holding: Vec<usize> = (0..conns.len()).filter(|m| granted[*m]).collect();
            for m in &holding {
                conns[*m].send_packed_command(&del).expect("send release");
            }
            for m in &holding {
                let _ = conns[*m].recv_response().expect("release");
            }
            if won {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// W2 over Redlock with 3 and 5 members (against local servers only): the library's
/// Redlock client beside the N-node floor, in alternating reps. The servers' counters are
/// not read (the figures are this process's).
fn run_redlock(bench: &Bench) {
    if bench.cfg.url.is_some() || bench.cfg.cluster {
        return;
    }
    let most = bench.cfg.redlock.iter().copied().max().unwrap_or(0);
    let primaries: Vec<support::RedisServer> =
        (0..most).map(|_| support::RedisServer::start()).collect();
    for &n in &bench.cfg.redlock {
        let urls: Vec<String> = primaries[..n].iter().map(|s| s.url()).collect();
        let borrowed: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = Client::redlock(&borrowed, ClientOptions::default()).expect("redlock");
        let name = format!("{TAG}:w2redlock");
        for &cs_ms in &bench.cfg.cs_ms {
            let cs = Duration::from_millis(cs_ms);
            let (floors, mine, ratios) = alternate(
                bench.cfg.reps,
                || nodes_floor(bench, &urls, cs),
                || {
                    contend(bench, bench.cfg.threads, cs, |_| {
                        let (client, name) = (client.clone(), name.clone());
                        move |acquired: &mut dyn FnMut()| {
                            let guard = client.lock(&name).acquire().expect("acquire");
                            acquired();
                            guard.release().expect("release");
                        }
                    })
                },
            );
            println!(
                "{}",
                Json::default()
                    .str(
                        "workload",
                        &format!(
                            "W2 Redlock {n}, {} threads, {cs_ms} ms critical section",
                            bench.cfg.threads
                        )
                    )
                    .obj("nodes_floor_polling_1ms", floors.client_json())
                    .obj("redlease", mine.client_json())
                    .spread("acquisitions_ratio_to_nodes_floor", Spread::of(&ratios))
                    .render()
            );
        }
    }
}

pub(crate) fn run(bench: &Bench) {
    run_single(bench);
    run_redlock(bench);
}

fn run_single(bench: &Bench) {
    let client = Client::open(&bench.url).expect("client");
    // Half the floor's W1 cycle: about one round trip.
    let round_trip = floor_us(bench) / 2.0;
    for &cs_ms in &bench.cfg.cs_ms {
        let cs = Duration::from_millis(cs_ms);
        let (mut fairs, mut to_fair, mut fair_to_floor) = (Reps::default(), vec![], vec![]);
        let (floors, mine, ratios) = alternate(
            bench.cfg.reps,
            || floor(bench, cs),
            || {
                let fair = fair_floor(bench, cs);
                let o = ours(bench, &client, cs);
                to_fair.push(o.per_sec / fair.per_sec);
                fairs.push(fair);
                o
            },
        );
        for (fair, floor) in fairs.0.iter().zip(&floors.0) {
            fair_to_floor.push(fair.per_sec / floor.per_sec);
        }
        let p50 = mine.spread(|c| c.p50_us).median;
        println!(
            "{}",
            Json::default()
                .str(
                    "workload",
                    &format!(
                        "W2 contended, {} threads, {cs_ms} ms critical section",
                        bench.cfg.threads
                    )
                )
                .obj("floor_polling_1ms", floors.json())
                .obj("redlease", mine.json())
                .spread("acquisitions_ratio_to_floor", Spread::of(&ratios))
                .obj("fair_floor_in_process_pass", fairs.json())
                .spread(
                    "fair_floor_acquisitions_ratio_to_floor",
                    Spread::of(&fair_to_floor),
                )
                .spread("acquisitions_ratio_to_fair_floor", Spread::of(&to_fair))
                .num("round_trip_us", round_trip)
                .num("handoff_p50_in_round_trips", p50 / round_trip)
                .int("keys_after", bench.key_count())
                .render()
        );
    }
    if let Some(py) = &bench.cfg.python {
        let mut runs = Vec::new();
        for _ in 0..bench.cfg.reps {
            match python::run(bench, py, "w2", bench.cfg.threads) {
                Some(fields) => runs.push(fields),
                None => return,
            }
        }
        let field = |k: &str| -> Spread {
            Spread::of(
                &runs
                    .iter()
                    .map(|f| f.get(k).copied().unwrap_or(f64::NAN))
                    .collect::<Vec<_>>(),
            )
        };
        println!(
            "{}",
            Json::default()
                .str("workload", "W2 from Python threads, 0 ms critical section")
                .spread("acquisitions_per_s", field("acquisitions_per_s"))
                .spread("fairness_min_over_max", field("fairness_min_over_max"))
                .spread("handoff_p50_us", field("handoff_p50_us"))
                .spread("handoff_p99_us", field("handoff_p99_us"))
                .render()
        );
    }
}
