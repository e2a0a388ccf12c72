//! The redlease benchmark (shared/DESIGN.md §7). Prints one JSON object per workload.
//!
//! Every figure is also given as a ratio to a **floor** measured in the same run: for W1 a
//! loop on one persistent redis-crate connection sending exactly `SET key tok NX PX 30000`
//! then `EVALSHA <release script>` per cycle; for W2 eight threads polling that every 1 ms;
//! for W3 one thread pipelining one token-checked `PEXPIRE` script per lock every ttl/3;
//! for the semaphore, threads polling a minimal semaphore script every 1 ms. Each figure
//! is the median over `--reps` reps, with the spread (min-max) beside it.
//!
//! ```text
//! cargo run --release --example bench -- [--duration S] [--reps N] [--threads N]
//!     [--cs-ms 0,1] [--redlock 3,5|none] [--w3-locks 1000,10000] [--w3-secs S]
//!     [--sem-permits N] [--sem-threads N] [--python PYTHON|none]
//!     [--only w1,w2,sem,rw,w3] [--url URL | --cluster] [--smoke]
//! ```
//! Starts its own redis-server (and, for `--redlock`, its own independent primaries; for
//! `--cluster`, its own 3-primary cluster) unless `--url` (or `REDIS_URL`) names one.

#[path = "../../tests/support/mod.rs"]
mod support;

mod python;
mod report;
mod rw;
mod sem;
mod w1;
mod w2;
mod w3;

use std::time::{Duration, Instant};

use report::Json;

/// The hash tag of every key the benchmark uses, so that on a cluster the floor and the
/// library talk to the same node.
pub(crate) const TAG: &str = "{bench}";

pub(crate) struct Config {
    pub(crate) duration: Duration,
    pub(crate) reps: usize,
    pub(crate) threads: usize,
    pub(crate) cs_ms: Vec<u64>,
    pub(crate) redlock: Vec<usize>,
    pub(crate) w3_locks: Vec<usize>,
    pub(crate) w3_secs: u64,
    pub(crate) sem_permits: u32,
    pub(crate) sem_threads: usize,
    pub(crate) python: Option<String>,
    pub(crate) only: Option<Vec<String>>,
    pub(crate) url: Option<String>,
    pub(crate) cluster: bool,
}

fn list<T: std::str::FromStr>(value: &str) -> Vec<T> {
    value
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn usage(problem: &str) -> ! {
    eprintln!("bench: {problem}\nusage: see the comment at the top of examples/bench/main.rs");
    std::process::exit(2)
}

impl Config {
    fn from_args() -> Config {
        let mut c = Config {
            duration: Duration::from_secs(3),
            reps: 5,
            threads: 8,
            cs_ms: vec![0, 1],
            redlock: vec![3, 5],
            w3_locks: vec![1000],
            w3_secs: 60,
            sem_permits: 4,
            sem_threads: 16,
            python: Some("python3".into()),
            only: None,
            url: std::env::var("REDIS_URL").ok(),
            cluster: false,
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let flag = args[i].as_str();
            match flag {
                "--smoke" => {
                    c.duration = Duration::from_millis(300);
                    c.reps = 1;
                    c.w3_locks = vec![50];
                    c.w3_secs = 2;
                    c.redlock = vec![3];
                    i += 1;
                    continue;
                }
                "--cluster" => {
                    c.cluster = true;
                    i += 1;
                    continue;
                }
                _ => {}
            }
            let Some(value) = args.get(i + 1) else {
                usage(&format!("{flag} needs a value"))
            };
            let number = |v: &str| -> f64 {
                v.parse()
                    .ok()
                    .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                    .unwrap_or_else(|| usage(&format!("{flag}: not a number: {v}")))
            };
            match flag {
                "--duration" => c.duration = Duration::from_secs_f64(number(value)),
                "--reps" => c.reps = (number(value) as usize).max(1),
                "--threads" => c.threads = (number(value) as usize).max(1),
                "--cs-ms" => c.cs_ms = list(value),
                "--redlock" => c.redlock = list(value),
                "--w3-locks" => c.w3_locks = list(value),
                "--w3-secs" => c.w3_secs = number(value) as u64,
                "--sem-permits" => c.sem_permits = (number(value) as u32).max(1),
                "--sem-threads" => c.sem_threads = (number(value) as usize).max(1),
                "--python" => {
                    c.python = Some(value.clone()).filter(|p| !p.is_empty() && p != "none")
                }
                "--only" => c.only = Some(list(&value.to_lowercase())),
                "--url" => c.url = Some(value.clone()),
                other => usage(&format!("unknown option {other}")),
            }
            i += 2;
        }
        c
    }
}

/// The deployment under test and the helpers every workload uses.
pub(crate) struct Bench {
    /// What the library connects to.
    pub(crate) url: String,
    /// A plain `redis://` URL of the node that serves the benchmark's keys (the floor's).
    pub(crate) node_url: String,
    pub(crate) cfg: Config,
    /// The servers the benchmark started, killed when it ends.
    _servers: Box<dyn std::any::Any>,
}

impl Bench {
    /// A new connection of the redis crate to the node of the benchmark's keys.
    pub(crate) fn conn(&self) -> redis::Connection {
        redis::Client::open(self.node_url.as_str())
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.node_url))
    }

    /// Calls of `commands` on the node, from INFO commandstats (commands a script runs
    /// included).
    pub(crate) fn calls(&self, commands: &[&str]) -> u64 {
        self.calls_where(|name| commands.contains(&name))
    }

    /// Every call on the node but the benchmark's own `INFO`, `CONFIG` and `DBSIZE`.
    pub(crate) fn all_calls(&self) -> u64 {
        self.calls_where(|name| name != "info" && name != "dbsize" && !name.starts_with("config"))
    }

    fn calls_where(&self, wanted: impl Fn(&str) -> bool) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap_or_default();
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| l.split_once(":calls="))
            .filter(|(name, _)| wanted(name))
            .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The node's CPU seconds (user + system), from INFO cpu.
    pub(crate) fn server_cpu(&self) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query(&mut self.conn())
            .unwrap_or_default();
        info.lines()
            .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
            .filter_map(|l| l.split_once(':')?.1.trim().parse::<f64>().ok())
            .sum()
    }

    pub(crate) fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.conn())
            .unwrap_or(());
    }

    /// `total_connections_received` from INFO stats.
    pub(crate) fn connections_received(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.conn())
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn key_count(&self) -> u64 {
        redis::cmd("DBSIZE").query(&mut self.conn()).unwrap_or(0)
    }

    pub(crate) fn wanted(&self, workload: &str) -> bool {
        self.cfg
            .only
            .as_ref()
            .is_none_or(|only| only.iter().any(|w| w == workload))
    }
}

/// Mean cycle time (µs) of `cycle`, run for `duration` after a short warm-up.
pub(crate) fn timed_loop(duration: Duration, cycle: &mut dyn FnMut()) -> f64 {
    for _ in 0..20 {
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

/// A field of /proc/self/status (kB for sizes).
pub(crate) fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(who, &mut usage) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

/// CPU seconds of this process (every thread).
pub(crate) fn cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// CPU seconds of the calling thread.
pub(crate) fn thread_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

/// Open sockets of this process.
pub(crate) fn open_sockets() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count() as u64
        })
        .unwrap_or(0)
}

/// The plain URL of the cluster node that serves the slot of [`TAG`], found from a seed.
fn cluster_node_url(cluster_url: &str) -> String {
    let rest = cluster_url
        .split_once("://")
        .map_or(cluster_url, |(_, rest)| rest);
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let seed = hosts.split([',', '/']).next().unwrap_or(hosts);
    let mut conn = redis::Client::open(format!("redis://{auth}{seed}"))
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("connect to the cluster seed {seed}: {e}"));
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(TAG)
        .query(&mut conn)
        .expect("CLUSTER KEYSLOT");
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .expect("CLUSTER SLOTS");
    for range in slots {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        let (Some(redis::Value::Int(first)), Some(redis::Value::Int(last))) =
            (fields.first(), fields.get(1))
        else {
            continue;
        };
        if (*first..=*last).contains(&slot) {
            if let Some(redis::Value::Array(node)) = fields.get(2) {
                let host = match node.first() {
                    Some(redis::Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                    _ => "127.0.0.1".into(),
                };
                if let Some(redis::Value::Int(port)) = node.get(1) {
                    return format!("redis://{auth}{host}:{port}");
                }
            }
        }
    }
    panic!("no node serves slot {slot}")
}

fn main() {
    let cfg = Config::from_args();
    let (servers, url, started): (Box<dyn std::any::Any>, String, &str) =
        match (&cfg.url, cfg.cluster) {
            (Some(url), _) => (Box::new(()), url.clone(), ""),
            (None, true) => {
                let cluster = support::deploy::LocalCluster::start(3, 0);
                let url = cluster.url();
                (
                    Box::new(cluster),
                    url,
                    " (a 3-primary cluster started by the bench)",
                )
            }
            (None, false) => {
                let server = support::RedisServer::start();
                let url = server.url();
                (Box::new(server), url, " (started by the bench)")
            }
        };
    let node_url = if url.contains("+cluster://") {
        cluster_node_url(&url)
    } else {
        url.clone()
    };
    let bench = Bench {
        url,
        node_url,
        cfg,
        _servers: servers,
    };
    let version = {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut bench.conn())
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };
    println!(
        "{}",
        Json::default()
            .str("bench", "redlease")
            .str("library_version", env!("CARGO_PKG_VERSION"))
            .str("server", &format!("{}{started}", bench.url))
            .str("redis_version", &version)
            .int(
                "cpus",
                std::thread::available_parallelism().map_or(0, |n| n.get() as u64)
            )
            .num("seconds_per_rep", bench.cfg.duration.as_secs_f64())
            .int("reps", bench.cfg.reps as u64)
            .render()
    );
    if bench.wanted("w1") {
        w1::run(&bench);
    }
    if bench.wanted("w2") {
        w2::run(&bench);
    }
    if bench.wanted("sem") {
        sem::run(&bench);
    }
    if bench.wanted("rw") {
        rw::run(&bench);
    }
    if bench.wanted("w3") {
        w3::run(&bench);
    }
}
