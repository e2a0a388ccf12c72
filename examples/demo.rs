//! The redlease demo: several workers contend for one lock and the demo shows what happened.
//!
//! Uses `REDIS_URL` when set; otherwise starts its own `redis-server` on a free port and
//! stops it at the end. Run: `cargo run --release --example demo [workers] [jobs-per-worker]`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind};

/// A storage that remembers the highest fencing token it has seen and rejects older ones:
/// what turns a lease into real protection.
#[derive(Default)]
struct FencedStore {
    highest: u64,
    accepted: u64,
    rejected: Vec<(usize, u64)>,
}

impl FencedStore {
    fn write(&mut self, worker: usize, token: u64) -> bool {
        if token <= self.highest {
            self.rejected.push((worker, token));
            return false;
        }
        self.highest = token;
        self.accepted += 1;
        true
    }
}

struct Section {
    worker: usize,
    token: u64,
    start: Instant,
    end: Instant,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let workers: usize = args.next().map_or(Ok(6), |a| a.parse())?;
    let jobs: usize = args.next().map_or(Ok(20), |a| a.parse())?;

    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = support::RedisServer::start();
            let url = server.url();
            println!("started redis-server on {url} (pid {})", server.pid());
            (Some(server), url)
        }
    };
    let client = Client::open(&url)?;
    client.ping()?;
    let lock_name = "demo:nightly-job";
    println!(
        "{workers} workers × {jobs} jobs contend for lock {lock_name:?} (ttl 2 s, renewed; each job takes 1-3 ms)\n"
    );

    let store = Arc::new(Mutex::new(FencedStore::default()));
    let sections = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|worker| {
            let client = client.clone();
            let store = store.clone();
            let sections = sections.clone();
            std::thread::spawn(move || -> redlease::Result<(usize, Duration, usize)> {
                let (mut done, mut waited, mut busy) = (0, Duration::ZERO, 0);
                for _ in 0..jobs {
                    let asked = Instant::now();
                    let guard = match client
                        .lock(lock_name)
                        .ttl(Duration::from_secs(2))
                        .acquire_timeout(Duration::from_secs(10))
                    {
                        Ok(guard) => guard,
                        Err(e) if e.kind() == ErrorKind::Busy => {
                            busy += 1;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let start = Instant::now();
                    waited += start - asked;
                    store.lock().unwrap().write(worker, guard.fencing_token());
                    std::thread::sleep(Duration::from_micros(fastrand::u64(1000..3000)));
                    let token = guard.fencing_token();
                    let end = Instant::now();
                    guard.release()?;
                    sections.lock().unwrap().push(Section {
                        worker,
                        token,
                        start,
                        end,
                    });
                    done += 1;
                }
                Ok((done, waited, busy))
            })
        })
        .collect();

    println!("worker  acquisitions  busy  mean wait");
    for (worker, thread) in threads.into_iter().enumerate() {
        let (done, waited, busy) = thread.join().map_err(|_| "worker panicked")??;
        let mean = waited.checked_div(done.max(1) as u32).unwrap_or_default();
        println!("{worker:>6}  {done:>12}  {busy:>4}  {mean:>9.2?}");
    }
    let elapsed = started.elapsed();

    let mut sections = std::mem::take(&mut *sections.lock().unwrap());
    sections.sort_by_key(|s| s.start);
    let overlaps = sections
        .windows(2)
        .filter(|w| w[1].start < w[0].end)
        .count();
    let in_order = sections.windows(2).all(|w| w[0].token < w[1].token);
    let tokens: Vec<String> = sections
        .iter()
        .take(12)
        .map(|s| format!("{}:w{}", s.token % 100_000, s.worker))
        .collect();
    println!(
        "\n{} critical sections in {elapsed:.2?}; fencing tokens (last 5 digits:worker) in order of entry:\n  {} ...",
        sections.len(),
        tokens.join(" ")
    );
    println!(
        "fencing tokens strictly increasing in order of entry: {}",
        if in_order { "yes" } else { "NO" }
    );
    println!(
        "overlapping critical sections: {overlaps} {}",
        if overlaps == 0 {
            "(mutual exclusion held)"
        } else {
            "(VIOLATION)"
        }
    );

    // A holder that pauses past its lease: the lock passes on, and only the fencing token
    // keeps the paused holder's late write out.
    println!("\nA paused holder (fixed 200 ms lease, pauses 400 ms, like a long GC pause):");
    let slow = client
        .lock(lock_name)
        .ttl(Duration::from_millis(200))
        .renew(false)
        .try_acquire()?;
    std::thread::sleep(Duration::from_millis(400));
    let next = client.lock(lock_name).try_acquire()?;
    let accepted = store.lock().unwrap().write(99, next.fencing_token());
    println!(
        "  next holder took the lock with token {}: write {}",
        next.fencing_token(),
        if accepted { "accepted" } else { "rejected" }
    );
    let late = store.lock().unwrap().write(98, slow.fencing_token());
    println!(
        "  paused holder wakes, still has token {}: its write is {} by the store",
        slow.fencing_token(),
        if late { "ACCEPTED (bug)" } else { "rejected" }
    );
    match slow.release() {
        Err(e) if e.is_not_held() => println!("  its release reports: {e}"),
        other => println!("  its release returned {other:?} (unexpected)"),
    }
    next.release()?;

    let store = store.lock().unwrap();
    let ok = overlaps == 0 && in_order && !late && store.rejected.len() == 1;
    println!(
        "\nstore: {} writes accepted, {} rejected; demo {}",
        store.accepted,
        store.rejected.len(),
        if ok { "OK" } else { "FAILED" }
    );
    if ok {
        Ok(())
    } else {
        Err("the demo found a violation".into())
    }
}
