//! W1, uncontended: one thread, sequential acquire + release on one key. The floor, the
//! Rust API and the C ABI are measured in alternating slices of 200 ms, so that the
//! machine's drift hits them alike; then, likewise, the floor, the Rust API and Redlock over
//! 3 and 5 independent primaries, each beside its N-node floor (both commands written to
//! every member before any reply is read). Python runs in a process of its own, with the floor
//! measured right before and after it. For the single-server variants it also gives the CPU
//! per cycle of the server and of this process, which tells what the protocol costs the
//! server from what the client adds.

use std::ffi::CString;
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions};

use crate::report::{Json, Spread, median};
use crate::{Bench, TAG, cpu_seconds, python, support, timed_loop};

pub(crate) const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

const SLICE: Duration = Duration::from_millis(200);

/// The W1 floor: `SET NX PX` then `EVALSHA` of the release script, one connection.
pub(crate) fn floor_cycle(bench: &Bench) -> impl FnMut() + use<> {
    let mut conn = bench.conn();
    let script = redis::Script::new(RELEASE_LUA);
    let sha = script.get_hash().to_owned();
    let _: String = script.prepare_invoke().load(&mut conn).expect("load");
    let key = format!("{TAG}:floor");
    move || {
        let ok: Option<String> = redis::cmd("SET")
            .arg(&key)
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
            .arg(&key)
            .arg("tok")
            .query(&mut conn)
            .expect("EVALSHA");
    }
}

/// The floor's mean cycle time (µs) over the configured duration.
pub(crate) fn floor_us(bench: &Bench) -> f64 {
    timed_loop(bench.cfg.duration, &mut floor_cycle(bench))
}

/// The N-node floor for Redlock: `SET NX PX` written to every member before any reply is
/// read, then the release script likewise: two round trips to the slowest member, the
/// least a quorum protocol can cost.
fn nodes_floor_cycle(urls: &[String]) -> impl FnMut() + use<> {
    let mut conns: Vec<redis::Connection> = urls
        .iter()
        .map(|u| {
            redis::Client::open(u.as_str())
                .and_then(|c| c.get_connection())
                .unwrap_or_else(|e| panic!("connect to {u}: {e}"))
        })
        .collect();
    let script = redis::Script::new(RELEASE_LUA);
    let sha = script.get_hash().to_owned();
    for conn in &mut conns {
        let _: String = script.prepare_invoke().load(conn).expect("load");
    }
    let key = format!("{TAG}:nodesfloor");
    let set = redis::cmd("SET")
        .arg(&key)
        .arg("tok")
        .arg("NX")
        .arg("PX")
        .arg(30000)
        .get_packed_command();
    let del = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(&key)
        .arg("tok")
        .get_packed_command();
    move || {
        for packed in [&set, &del] {
            for conn in &mut conns {
                conn.send_packed_command(packed).expect("send");
            }
            for conn in &mut conns {
                let _ = conn.recv_response().expect("reply");
            }
        }
    }
}

/// A cycle of the Rust API on `client`.
fn rust_cycle(client: Client, name: String) -> impl FnMut() {
    move || {
        let guard = client.lock(&name).try_acquire().expect("acquire");
        guard.release().expect("release");
    }
}

/// A cycle through the C ABI, as a C program would call it.
fn ffi_cycle(bench: &Bench) -> impl FnMut() + use<> {
    use redlease::ffi::*;
    let url = CString::new(bench.url.clone()).unwrap_or_default();
    let name = CString::new(format!("{TAG}:ffi")).unwrap_or_default();
    let mut client: lock_client_t = 0;
    assert_eq!(
        // SAFETY: valid NUL-terminated strings and out-pointers.
        unsafe { lock_client_open(url.as_ptr(), &mut client) },
        LOCK_OK
    );
    move || {
        let mut lock: lock_t = 0;
        // SAFETY: as above.
        let rc = unsafe { lock_acquire(client, name.as_ptr(), 30_000, 0, &mut lock) };
        assert_eq!(rc, LOCK_OK);
        assert_eq!(lock_release(lock), LOCK_OK);
    }
}

struct Variant {
    name: String,
    cycle: Box<dyn FnMut()>,
    /// Per rep: the median cycle time (µs) of its slices.
    reps: Vec<f64>,
    /// Per rep: the median ratio of its slices to the floor's slices of the same round.
    ratios: Vec<f64>,
    /// As `ratios`, to the Rust API on one server (for Redlock).
    to_single: Vec<f64>,
    /// Per rep: CPU µs per cycle of the benchmark's server and of this process, over all
    /// the rep's slices (single-server variants only).
    server_cpu: Vec<f64>,
    client_cpu: Vec<f64>,
}

pub(crate) fn run(bench: &Bench) {
    let client = Client::open(&bench.url).expect("client");
    let local = bench.cfg.url.is_none() && !bench.cfg.cluster;
    // Independent primaries for Redlock, started here (only against local servers).
    let primaries: Vec<support::RedisServer> = if local {
        (0..bench.cfg.redlock.iter().copied().max().unwrap_or(0))
            .map(|_| support::RedisServer::start())
            .collect()
    } else {
        Vec::new()
    };
    let mut variants = vec![
        Variant::new("floor", Box::new(floor_cycle(bench))),
        Variant::new(
            "rust",
            Box::new(rust_cycle(client.clone(), format!("{TAG}:w1"))),
        ),
        Variant::new("c_abi", Box::new(ffi_cycle(bench))),
    ];
    // Redlock is measured in rounds of its own (floor, Rust API on one server, then each
    // Redlock size): interleaved with the others, its bursts over several servers changed
    // the floor's round trip time by up to a quarter on the VM this was developed on.
    let mut redlock_variants = vec![
        Variant::new("floor", Box::new(floor_cycle(bench))),
        Variant::new(
            "rust",
            Box::new(rust_cycle(client.clone(), format!("{TAG}:w1"))),
        ),
    ];
    for &n in bench.cfg.redlock.iter().filter(|_| local) {
        let urls: Vec<String> = primaries[..n].iter().map(|s| s.url()).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let redlock = Client::redlock(&urls, ClientOptions::default()).expect("redlock client");
        let owned: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
        redlock_variants.push(Variant::new(
            &format!("nodes_floor_{n}"),
            Box::new(nodes_floor_cycle(&owned)),
        ));
        redlock_variants.push(Variant::new(
            &format!("redlock_{n}"),
            Box::new(rust_cycle(redlock, format!("{TAG}:w1redlock"))),
        ));
    }
    let slices = (bench.cfg.duration.as_millis() / SLICE.as_millis()).max(1) as usize;
    bench.reset_stats();
    measure(&mut variants, bench.cfg.reps, slices, Some(bench));
    if redlock_variants.len() > 2 {
        measure(&mut redlock_variants, bench.cfg.reps, slices, None);
        variants.extend(redlock_variants.drain(2..));
    }
    let script_loads = bench.calls(&["script|load"]);
    let evals = bench.calls(&["eval"]);
    let mut json = Json::default()
        .str("workload", "W1 uncontended acquire+release")
        .int("slices_of_200ms_per_rep", slices as u64);
    for v in &variants {
        json = json.spread(&format!("{}_cycle_us", v.name), Spread::of(&v.reps));
        if v.name != "floor" {
            json = json.spread(&format!("{}_ratio_to_floor", v.name), Spread::of(&v.ratios));
        }
        if !v.server_cpu.is_empty() {
            json = json
                .spread(
                    &format!("{}_server_cpu_us_per_cycle", v.name),
                    Spread::of(&v.server_cpu),
                )
                .spread(
                    &format!("{}_client_cpu_us_per_cycle", v.name),
                    Spread::of(&v.client_cpu),
                );
        }
        if let Some(n) = v.name.strip_prefix("redlock_") {
            json = json.spread(
                &format!("{}_ratio_to_single_server", v.name),
                Spread::of(&v.to_single),
            );
            let floor = variants
                .iter()
                .find(|f| f.name == format!("nodes_floor_{n}"));
            if let Some(floor) = floor {
                let ratios: Vec<f64> = v.reps.iter().zip(&floor.reps).map(|(a, b)| a / b).collect();
                json = json.spread(
                    &format!("{}_ratio_to_nodes_floor", v.name),
                    Spread::of(&ratios),
                );
            }
        }
    }
    json = json
        .int("script_loads", script_loads)
        .int("eval_with_script_text", evals);
    println!("{}", json.render());
    if let Some(py) = &bench.cfg.python {
        python_w1(bench, py);
    }
}

/// Runs `reps` rounds of `slices` slices per variant, alternating variants slice by slice so
/// that the machine's drift hits all alike, and records each rep's figures: the median
/// cycle time, and the median slice-by-slice ratio to variant 0 (the floor) and to variant 1
/// (the Rust API on one server). With `server` (the variants' one server), also the CPU
/// per cycle of that server and of this process, which tells the protocol's cost on the
/// server from the client's.
fn measure(variants: &mut [Variant], reps: usize, slices: usize, server: Option<&Bench>) {
    for _ in 0..reps {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        // Per variant: cycles, server CPU s and client CPU s, summed over the slices.
        let mut cpu = vec![(0.0, 0.0, 0.0); variants.len()];
        for _ in 0..slices {
            for (i, v) in variants.iter_mut().enumerate() {
                let server_before = server.map(Bench::server_cpu);
                let (client_before, started) = (cpu_seconds(), Instant::now());
                let cycle_us = timed_loop(SLICE, &mut v.cycle);
                let client = cpu_seconds() - client_before;
                if let Some((bench, before)) = server.zip(server_before) {
                    // Its warm-up cycles included, at about the same pace.
                    let cycles = started.elapsed().as_secs_f64() * 1e6 / cycle_us;
                    cpu[i].0 += cycles;
                    cpu[i].1 += bench.server_cpu() - before;
                    cpu[i].2 += client;
                }
                times[i].push(cycle_us);
            }
        }
        for (i, v) in variants.iter_mut().enumerate() {
            let (cycles, server_s, client_s) = cpu[i];
            if cycles > 0.0 {
                v.server_cpu.push(server_s * 1e6 / cycles);
                v.client_cpu.push(client_s * 1e6 / cycles);
            }
            let ratio = |base: usize| -> f64 {
                let r: Vec<f64> = times[i]
                    .iter()
                    .zip(&times[base])
                    .map(|(t, b)| t / b)
                    .collect();
                median(&r)
            };
            v.reps.push(median(&times[i]));
            v.ratios.push(ratio(0));
            v.to_single.push(ratio(1));
        }
    }
}

impl Variant {
    fn new(name: &str, cycle: Box<dyn FnMut()>) -> Variant {
        Variant {
            name: name.into(),
            cycle,
            reps: Vec::new(),
            ratios: Vec::new(),
            to_single: Vec::new(),
            server_cpu: Vec::new(),
            client_cpu: Vec::new(),
        }
    }
}

/// W1 from Python threads, bracketed by floor measurements, once per rep; with redis-py's
/// `Lock`, and the package's drop-in for it, beside it when that Python has redis-py.
fn python_w1(bench: &Bench, py: &str) {
    let (mut cycles, mut ratios) = (Vec::new(), Vec::new());
    let (mut peer_cycles, mut peer_ratios) = (Vec::new(), Vec::new());
    let (mut drop_in_cycles, mut drop_in_ratios) = (Vec::new(), Vec::new());
    for _ in 0..bench.cfg.reps {
        let before = floor_us(bench);
        let Some(fields) = python::run(bench, py, "w1", 1) else {
            return;
        };
        let floor = (before + floor_us(bench)) / 2.0;
        let cycle = fields.get("cycle_us").copied().unwrap_or(f64::NAN);
        cycles.push(cycle);
        ratios.push(cycle / floor);
        if let Some(peer) = fields.get("redis_py_lock_cycle_us") {
            peer_cycles.push(*peer);
            peer_ratios.push(peer / floor);
        }
        if let Some(drop_in) = fields.get("drop_in_cycle_us") {
            drop_in_cycles.push(*drop_in);
            drop_in_ratios.push(drop_in / floor);
        }
    }
    let mut json = Json::default()
        .str("workload", "W1 from Python")
        .spread("python_cycle_us", Spread::of(&cycles))
        .spread("python_ratio_to_floor", Spread::of(&ratios));
    if peer_cycles.len() == cycles.len() {
        json = json
            .spread("redis_py_lock_cycle_us", Spread::of(&peer_cycles))
            .spread("redis_py_lock_ratio_to_floor", Spread::of(&peer_ratios));
    }
    if drop_in_cycles.len() == cycles.len() {
        json = json
            .spread("drop_in_cycle_us", Spread::of(&drop_in_cycles))
            .spread("drop_in_ratio_to_floor", Spread::of(&drop_in_ratios));
    }
    println!("{}", json.render());
}
