//! Counting semaphores: never more holders than permits (within a process, across
//! processes, under faults), a waiter woken by a release, a killed holder's permit freed
//! after its ttl, and exact bookkeeping at the largest permit count and ttl.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use super::{Jitter, Log, believed, exists, faults};
use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, client, eventually, max_overlap, now_ns, quick_client, within};

#[test]
fn a_semaphore_admits_at_most_its_permits() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let permits: Vec<_> = (0..3)
        .map(|_| client.semaphore("sem", 3).try_acquire().unwrap())
        .collect();
    let err = client.semaphore("sem", 3).try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let fences: Vec<u64> = permits.iter().map(|p| p.fencing_token()).collect();
    assert!(fences.windows(2).all(|w| w[1] > w[0]), "{fences:?}");
    let stored: Vec<String> = server.cmd(&["ZRANGE", "sem", "0", "-1"]);
    assert_eq!(stored.len(), 3);
    // A waiter is woken by a release, not by its backoff: released as its third block
    // begins (1 to 1.7 s long, its backoff's third delay), it is in well before that ends.
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let permit = client
                .semaphore("sem", 3)
                .acquire_timeout(Duration::from_secs(10))?;
            Ok::<_, redlease::Error>((permit, Instant::now()))
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 3));
    let mut permits = permits;
    let released = Instant::now();
    permits.pop().unwrap().release().unwrap();
    let (permit, granted) = waiter.join().unwrap().unwrap();
    let waited = granted.saturating_duration_since(released);
    assert!(
        waited < Duration::from_millis(700),
        "in {waited:?} after the release"
    );
    permit.release().unwrap();
    for p in permits {
        p.release().unwrap();
    }
    assert_eq!(server.cmd::<i64>(&["ZCARD", "sem"]), 0);
    let err = client.semaphore("zero", 0).try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A release hands its permit to the blocked waiter that registered first, with a fencing
/// token above the releaser's, and the waiter sends nothing after its block; a permit
/// handed to a waiter that vanished lapses with what was left of its registration.
#[test]
fn a_release_hands_its_permit_to_the_first_blocked_waiter() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let holder = client.semaphore("hand", 1).try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let p = client
                .semaphore("hand", 1)
                .ttl(Duration::from_secs(2))
                .renew(false)
                .acquire_timeout(Duration::from_secs(20))
                .unwrap();
            (p.token().to_owned(), p.fencing_token(), p)
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") > 0));
    let scripts = || server.calls("evalsha") + server.calls("eval");
    let before = scripts();
    let first = holder.fencing_token();
    holder.release().unwrap();
    let (token, fencing, permit) = within(Duration::from_secs(10), move || waiter.join().unwrap());
    assert_eq!(
        scripts(),
        before + 1,
        "the waiter sent a script after its block"
    );
    assert!(fencing > first);
    let stored: Vec<String> = server.cmd(&["ZRANGE", "hand", "0", "-1"]);
    assert_eq!(stored, vec![token]);
    permit.release().unwrap();
    assert_eq!(server.cmd::<i64>(&["ZCARD", "hand"]), 0);

    // A waiter that registered and vanished: handed the permit for what is left of its
    // registration (1.5 s), not for its ttl (a minute).
    let holder = client.semaphore("hand", 1).try_acquire().unwrap();
    let now: Vec<String> = server.cmd(&["TIME"]);
    let now_ms = now[0].parse::<u64>().unwrap() * 1000 + now[1].parse::<u64>().unwrap() / 1000;
    let _: i64 = server.cmd(&[
        "ZADD",
        "redlease:queue:{hand}",
        &(now_ms + 1500).to_string(),
        "!60000|ghost",
    ]);
    holder.release().unwrap();
    let expiry: f64 = server.cmd(&["ZSCORE", "hand", "ghost"]);
    assert!(expiry <= (now_ms + 1500) as f64, "{expiry} {now_ms}");
    let started = Instant::now();
    let next = client
        .semaphore("hand", 1)
        .acquire_timeout(Duration::from_secs(10))
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    next.release().unwrap();
}

/// A permit handed to a blocked waiter costs twenty-one server commands. Nine are the
/// waiter's attempt with its block: the script, `TIME` (once: its registration uses the
/// attempt's reading), `ZREMRANGEBYSCORE`, `ZSCORE`, `ZCARD`, `ZADD`, the queue's `PTTL`,
/// `ZRANGE` and `BLPOP`. Twelve are the release that hands the permit over: the script,
/// `ZSCORE` and `ZREM` (its permit), `TIME`, `ZRANGE` and `ZREM` (the first registration),
/// the fencing counter's `SET ... GET`, `ZADD` (the waiter's permit), `RPUSH` and `PEXPIRE`
/// (the waiter's own list), and the key's `PTTL` and `PEXPIRE`.
#[test]
fn a_permit_handed_to_a_blocked_waiter_costs_twenty_one_server_commands() {
    let server = RedisServer::start();
    let client = client(&server.url());
    // The scripts cached (a first run's NOSCRIPT counts as a call).
    client
        .semaphore("warm", 1)
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    crate::waiting::assert_handoff_costs(&server, &client, |c, name| c.semaphore(name, 1), (9, 12));
}

/// A release adds its wake-up to those no waiter has popped yet: two permits freed before
/// either of two registered waiters blocks again leave two wake-ups, not one (a waiter
/// would otherwise sit out its block beside a free permit).
#[test]
fn releases_before_a_waiter_wakes_leave_a_wake_up_for_each_freed_permit() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let first = client.semaphore("twice", 2).try_acquire().unwrap();
    let second = client.semaphore("twice", 2).try_acquire().unwrap();
    // Two waiters registered, between two blocks (registrations far from lapsing).
    let far = (u64::MAX >> 12).to_string();
    let queue = "redlease:queue:{twice}";
    let _: i64 = server.cmd(&["ZADD", queue, &far, "waiter-a", &far, "waiter-b"]);
    first.release().unwrap();
    second.release().unwrap();
    assert_eq!(server.cmd::<i64>(&["LLEN", "redlease:wakeup:{twice}"]), 2);
    // Never more wake-ups than registered waiters.
    let third = client.semaphore("twice", 2).try_acquire().unwrap();
    third.release().unwrap();
    assert_eq!(server.cmd::<i64>(&["LLEN", "redlease:wakeup:{twice}"]), 2);
}

/// A holder killed with SIGKILL frees its permit after its ttl.
#[test]
fn a_killed_holders_permit_frees_itself_after_its_ttl() {
    let server = RedisServer::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kinds::semaphore::permit_holder",
            "--ignored",
            "--nocapture",
        ])
        .env("KINDS_HOLDER_URL", server.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let client = client(&server.url());
    assert!(eventually(Duration::from_secs(10), || {
        server.cmd::<i64>(&["ZCARD", "killed"]) == 1
    }));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let killed = Instant::now();
    assert_eq!(
        client
            .semaphore("killed", 1)
            .try_acquire()
            .unwrap_err()
            .kind(),
        ErrorKind::Busy
    );
    let permit = client
        .semaphore("killed", 1)
        .acquire_timeout(Duration::from_secs(5))
        .unwrap();
    let freed = killed.elapsed();
    assert!(freed <= Duration::from_millis(2500), "{freed:?}");
    permit.release().unwrap();
}

/// The holder process of the test above (run only when its environment is set).
#[test]
#[ignore]
fn permit_holder() {
    let Ok(url) = std::env::var("KINDS_HOLDER_URL") else {
        return;
    };
    let permit = client(&url)
        .semaphore("killed", 1)
        .ttl(Duration::from_secs(1))
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_secs(60));
    drop(permit);
}

/// A semaphore of 3, 12 threads in 3 processes for 20 s: never more than 3 holders (an
/// interval log checked offline), and every thread makes progress. Each process talks to
/// Redis through a proxy that delays some replies and drops one.
#[test]
fn a_semaphore_of_three_holds_across_processes_and_faults() {
    let server = RedisServer::start();
    let secs: u64 = std::env::var("REDLEASE_KINDS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(server.port)).collect();
    for proxy in &proxies {
        proxy.on_request(
            b"EVALSHA",
            20,
            Action::DelayReply(Duration::from_millis(50)),
        );
    }
    proxies[0].on_request(b":permit-worker", 1, Action::DropReply);
    let children: Vec<_> = proxies
        .iter()
        .enumerate()
        .map(|(p, proxy)| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "kinds::semaphore::semaphore_worker",
                    "--ignored",
                    "--nocapture",
                ])
                .env("KINDS_WORKER_URL", proxy.url())
                .env("KINDS_WORKER_LOG", dir.path().join(format!("{p}.log")))
                .env("KINDS_WORKER_SECS", secs.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        let status = within(Duration::from_secs(secs + 60), move || {
            child.wait().unwrap()
        });
        assert!(status.success());
    }
    let mut intervals = Vec::new();
    let mut per_thread = std::collections::HashMap::new();
    for p in 0..3 {
        let text = std::fs::read_to_string(dir.path().join(format!("{p}.log"))).unwrap();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(a), Some(b), Some(who)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            intervals.push((a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()));
            *per_thread.entry(who.to_owned()).or_insert(0u64) += 1;
        }
    }
    assert!(intervals.len() > 30, "{} holds", intervals.len());
    assert!(
        max_overlap(&intervals) <= 3,
        "{} holders at once",
        max_overlap(&intervals)
    );
    assert_eq!(
        per_thread.len(),
        12,
        "threads without a permit: {per_thread:?}"
    );
}

/// A worker process of the test above.
#[test]
#[ignore]
fn semaphore_worker() {
    let Ok(url) = std::env::var("KINDS_WORKER_URL") else {
        return;
    };
    let log = std::env::var("KINDS_WORKER_LOG").unwrap();
    let secs: u64 = std::env::var("KINDS_WORKER_SECS").unwrap().parse().unwrap();
    let options = ClientOptions::default()
        .owner_label("permit-worker")
        .io_timeout(Duration::from_millis(500));
    let client = Client::with_options(&url, options).unwrap();
    let file = Arc::new(Mutex::new(std::fs::File::create(log).unwrap()));
    let stop = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (client, file) = (client.clone(), file.clone());
            std::thread::spawn(move || {
                let who = format!("{}-{t}", std::process::id());
                while Instant::now() < stop {
                    let Ok(permit) = client
                        .semaphore("three", 3)
                        .ttl(Duration::from_secs(2))
                        .acquire_timeout(Duration::from_secs(5))
                    else {
                        continue;
                    };
                    let start = now_ns();
                    std::thread::sleep(Duration::from_millis(20));
                    let end = now_ns();
                    // Only holds the permit really covered are logged.
                    if permit.is_held() {
                        writeln!(file.lock().unwrap(), "{start} {end} {who}").unwrap();
                    }
                    let _ = permit.release();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Attacks the semaphore's bound under faults: 2 permits, 6 threads, through a proxy that
/// delays, drops and resets replies, keeps requests from running, blackholes and resets
/// connections. Never more than 2 holders by the interval log, every thread gets a permit,
/// and once the faults stop no permit outlives its ttl: a newcomer then takes both.
#[test]
fn a_semaphore_never_exceeds_its_permits_under_faults_and_leaks_none_past_the_ttl() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port));
    let c = quick_client(&proxy.url(), 250);
    client(&proxy.url())
        .semaphore("warm-sem", 1)
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let ttl = Duration::from_millis(1000);
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let fault_thread = faults(proxy.clone(), stop.clone());
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (c, stop, log) = (c.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut jitter = Jitter::new(t as u64 + 11);
                while !stop.load(Ordering::SeqCst) {
                    let Ok(permit) = c
                        .semaphore("sem-faults", 2)
                        .ttl(ttl)
                        .acquire_timeout(Duration::from_secs(2))
                    else {
                        continue;
                    };
                    let start = now_ns();
                    let remaining = permit.remaining();
                    std::thread::sleep(Duration::from_millis(5 + jitter.below(15)));
                    let held = permit.is_held();
                    let (a, b) = believed(start, remaining, now_ns(), held);
                    log.lock().unwrap().push((a, b, t));
                    let _ = permit.release();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let rounds = fault_thread.join().unwrap();
    assert!(rounds >= 6, "{rounds} fault rounds");
    let log = log.lock().unwrap();
    let intervals: Vec<(u64, u64)> = log.iter().map(|&(a, b, _)| (a, b)).collect();
    assert!(intervals.len() > 20, "{} holds", intervals.len());
    assert!(
        max_overlap(&intervals) <= 2,
        "{} holders of 2 permits at once",
        max_overlap(&intervals)
    );
    let mut per_thread = HashMap::new();
    for &(_, _, t) in log.iter() {
        *per_thread.entry(t).or_insert(0) += 1;
    }
    assert_eq!(
        per_thread.len(),
        6,
        "threads without a permit: {per_thread:?}"
    );
    // No permit lives past its ttl once every holder is gone.
    let direct = client(&server.url());
    let gone = Instant::now();
    let both = within(Duration::from_secs(5), move || {
        let until = Instant::now() + ttl + Duration::from_millis(1200);
        loop {
            let a = direct.semaphore("sem-faults", 2).try_acquire();
            let b = direct.semaphore("sem-faults", 2).try_acquire();
            if let (Ok(a), Ok(b)) = (a, b) {
                return Some((a, b));
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(
        both.is_some(),
        "a permit outlived its ttl: {:?}",
        server.cmd::<Vec<String>>(&["ZRANGE", "sem-faults", "0", "-1", "WITHSCORES"])
    );
    assert!(gone.elapsed() <= ttl + Duration::from_millis(1300));
}

/// Attacks the semaphore's arithmetic with the largest permit count and the longest ttl:
/// permits are taken and given back, fencing tokens increase, and the expiry scores and
/// key expiry stay exact (no float overflow, no negative PTTL).
#[test]
fn a_semaphore_of_u32_max_permits_and_max_ttl_keeps_exact_bookkeeping() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let permits: Vec<_> = (0..20)
        .map(|_| {
            c.semaphore("huge", u32::MAX)
                .ttl(redlease::MAX_TTL)
                .renew(false)
                .try_acquire()
                .unwrap()
        })
        .collect();
    assert!(
        permits
            .windows(2)
            .all(|w| w[1].fencing_token() > w[0].fencing_token())
    );
    assert_eq!(server.cmd::<i64>(&["ZCARD", "huge"]), 20);
    assert!(server.pttl("huge") > (1i64 << 40) - 60_000);
    permits[0].extend(redlease::MAX_TTL).unwrap();
    // A caller counting 20 permits finds the same name full (the count is the caller's).
    assert_eq!(
        c.semaphore("huge", 20).try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    for p in permits {
        p.release().unwrap();
    }
    assert!(!exists(&server, "huge"));
    let rw = c
        .rwlock("huge-rw")
        .write()
        .ttl(redlease::MAX_TTL)
        .try_acquire()
        .unwrap();
    rw.extend(redlease::MAX_TTL).unwrap();
    rw.release().unwrap();
    let re = c
        .lock("huge-re")
        .reentrant()
        .ttl(redlease::MAX_TTL)
        .try_acquire()
        .unwrap();
    let again = c
        .lock("huge-re")
        .reentrant()
        .ttl(redlease::MAX_TTL)
        .try_acquire()
        .unwrap();
    assert!(server.pttl("huge-re") > (1i64 << 40) - 60_000);
    drop((again, re));
    assert!(!exists(&server, "huge-re"));
}
