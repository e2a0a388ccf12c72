//! Lock kinds (issue 15): reentrant locks, counting semaphores and read-write locks, against real servers,
//! with interval logs checked offline and the fault proxy.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};
use support::proxy::{Action, Proxy};
use support::{RedisServer, client, eventually, max_overlap, now_ns, within};

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

#[test]
fn a_name_in_use_by_one_kind_refuses_the_others_clearly() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mutex = client.lock("shared-name").try_acquire().unwrap();
    for err in [
        client
            .semaphore("shared-name", 2)
            .try_acquire()
            .unwrap_err(),
        client
            .rwlock("shared-name")
            .read()
            .try_acquire()
            .unwrap_err(),
        client
            .rwlock("shared-name")
            .write()
            .try_acquire()
            .unwrap_err(),
    ] {
        assert!(err.message().contains("another kind of lock"), "{err}");
    }
    assert!(mutex.is_held());
    mutex.release().unwrap();
    let permit = client.semaphore("shared-name", 2).try_acquire().unwrap();
    let err = client.lock("shared-name").try_acquire().unwrap_err();
    assert!(err.message().contains("another kind of lock"), "{err}");
    permit.release().unwrap();
}

#[test]
fn read_write_locks_share_reads_and_exclude_writes() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let rw = client.rwlock("rw");
    let r1 = rw.read().try_acquire().unwrap();
    let r2 = rw.read().try_acquire().unwrap();
    assert_eq!(
        rw.write().try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    r1.release().unwrap();
    r2.release().unwrap();
    let w = rw.write().try_acquire().unwrap();
    assert_eq!(rw.read().try_acquire().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(
        rw.write().try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    assert!(w.fencing_token() > 0);
    // Readers blocked on the writer are all woken by its release: released once they are
    // in about their third blocks (1 to 1.7 s long, their backoff's third delay), they are
    // all in (together: none gives its hold back before the checks) well before those end.
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || {
                let r = client
                    .rwlock("rw")
                    .read()
                    .acquire_timeout(Duration::from_secs(10))?;
                Ok::<_, redlease::Error>((r, Instant::now()))
            })
        })
        .collect();
    let blocked = || server.calls("blpop") >= 9;
    assert!(eventually(Duration::from_secs(10), blocked));
    let released = Instant::now();
    w.release().unwrap();
    let readers: Vec<_> = readers
        .into_iter()
        .map(|r| r.join().unwrap().unwrap())
        .collect();
    for (_, granted) in &readers {
        let waited = granted.saturating_duration_since(released);
        assert!(
            waited < Duration::from_millis(700),
            "in {waited:?} after the release"
        );
    }
    for (r, _) in readers {
        r.release().unwrap();
    }
}

/// A stream of readers (each holding 30 ms, always one or more in) cannot starve a writer:
/// it registers, new readers then stay out, and it gets in once the readers inside leave.
#[test]
fn a_stream_of_readers_cannot_starve_a_writer() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (client, stop, inside, violations) = (
                client.clone(),
                stop.clone(),
                inside.clone(),
                violations.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(r) = client
                        .rwlock("stream")
                        .read()
                        .acquire_timeout(Duration::from_secs(5))
                    else {
                        continue;
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) < 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(30));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let _ = r.release();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let w = client
        .rwlock("stream")
        .write()
        .acquire_timeout(Duration::from_secs(5))
        .unwrap();
    let waited = started.elapsed();
    // Exclusive: no reader inside while the writer holds.
    if inside.swap(-1000, Ordering::SeqCst) != 0 {
        violations.fetch_add(1, Ordering::SeqCst);
    }
    std::thread::sleep(Duration::from_millis(100));
    inside.fetch_add(1000, Ordering::SeqCst);
    w.release().unwrap();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    // Readers hold 30 ms each: the writer is in within a few of their holds (a margin for
    // a busy machine).
    assert!(
        waited < Duration::from_secs(2),
        "the writer waited {waited:?}"
    );
}

/// A holder killed with SIGKILL frees its permit after its ttl.
#[test]
fn a_killed_holders_permit_frees_itself_after_its_ttl() {
    let server = RedisServer::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "permit_holder", "--ignored", "--nocapture"])
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
                .args(["--exact", "semaphore_worker", "--ignored", "--nocapture"])
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

/// Item 1 and 6: a thread takes a reentrant lock 100 times: one token, one fencing token,
/// one lease renewed once (not per hold); another thread is refused meanwhile; the key is
/// released with the 100th release, not before.
#[test]
fn a_reentrant_lock_is_taken_100_deep_and_released_with_the_last_hold() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let ttl = Duration::from_secs(1);
    let guards: Vec<_> = (0..100)
        .map(|_| {
            client
                .lock("deep")
                .reentrant()
                .ttl(ttl)
                .try_acquire()
                .unwrap()
        })
        .collect();
    let first = &guards[0];
    assert!(guards.iter().all(|g| g.token() == first.token()));
    assert!(
        guards
            .iter()
            .all(|g| g.fencing_token() == first.fencing_token())
    );
    let stored: Option<String> = server.cmd(&["GET", "deep"]);
    assert_eq!(
        stored.as_deref(),
        Some(first.token()),
        "GET key still works"
    );
    // Another thread (another owner) is refused, and so is a plain mutex.
    let other = client.clone();
    let refused = std::thread::spawn(move || {
        other
            .lock("deep")
            .reentrant()
            .try_acquire()
            .map(drop)
            .unwrap_err()
    })
    .join()
    .unwrap();
    assert_eq!(refused.kind(), ErrorKind::Busy, "{refused}");
    assert_eq!(
        client.lock("deep").try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    // One renewal for the lock, not one per hold: ~3 renewals per ttl (~6 here, ~600 if
    // each hold renewed).
    let before = server.calls("evalsha");
    std::thread::sleep(ttl * 2);
    let renewals = server.calls("evalsha") - before;
    assert!(
        renewals <= 20,
        "{renewals} renewals in 2 ttls for 100 holds"
    );
    assert!(guards.iter().all(|g| g.is_held()));
    let mut guards = guards;
    let last = guards.pop().unwrap();
    for guard in guards {
        guard.release().unwrap();
        assert!(server.cmd::<bool>(&["EXISTS", "deep"]));
    }
    assert!(last.is_held(), "the holds left share the lease");
    last.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "deep"]));
    assert!(
        !server.cmd::<bool>(&["EXISTS", "redlease:holds:{deep}"]),
        "the holds record goes with the lock"
    );
}

/// Item 1: a caller-supplied owner is shared by every client that uses it (here two
/// clients, as two processes would): each takes a hold of the same acquisition, and the
/// lock is released with the last hold, whichever client gives it back. Another owner is
/// refused.
#[test]
fn a_caller_supplied_owner_reenters_from_another_client() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()), client(&server.url()));
    let owner = "job-6f1c0e2a-5d9b-4d1e-9a6e-0c8f6a2b7d11";
    let first = a.lock("job").reentrant_as(owner).try_acquire().unwrap();
    let second = b.lock("job").reentrant_as(owner).try_acquire().unwrap();
    assert_eq!(first.token(), second.token());
    assert_eq!(first.fencing_token(), second.fencing_token());
    let stranger = b.lock("job").reentrant_as("someone-else").try_acquire();
    assert_eq!(stranger.unwrap_err().kind(), ErrorKind::Busy);
    let info = a.inspect("job").unwrap();
    assert_eq!(info.reentrant, Some((owner.to_owned(), 2)), "{info:?}");
    first.release().unwrap();
    assert!(server.cmd::<bool>(&["EXISTS", "job"]), "one hold is left");
    assert_eq!(
        a.inspect("job").unwrap().reentrant,
        Some((owner.to_owned(), 1))
    );
    assert!(second.is_held());
    second.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "job"]));
    // Bad owners are refused before anything is sent.
    for bad in ["".to_owned(), "x".repeat(257)] {
        let err = a.lock("job").reentrant_as(&bad).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

/// Items 1 and 6, under faults: a re-entry whose reply is dropped reports an unknown
/// outcome and withdraws its own hold, so the lock is released with the holds that were
/// reported (not left held until its ttl); a delayed reply changes nothing.
#[test]
fn a_reentry_whose_reply_is_lost_leaves_no_hold_behind() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    // The dropped reply is timed out after 1 s; the delayed one (150 ms) comes well before.
    let options = ClientOptions::default()
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    let owner = "owner-under-faults-0b7e";
    let first = client
        .lock("faulty")
        .reentrant_as(owner)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let rule = proxy.on_request(owner.as_bytes(), 1, Action::DropReply);
    let err = client
        .lock("faulty")
        .reentrant_as(owner)
        .try_acquire()
        .map(drop)
        .unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.outcome_unknown(), "{err}");
    proxy.on_request(
        owner.as_bytes(),
        1,
        Action::DelayReply(Duration::from_millis(150)),
    );
    let second = client
        .lock("faulty")
        .reentrant_as(owner)
        .try_acquire()
        .unwrap();
    second.release().unwrap();
    assert!(server.cmd::<bool>(&["EXISTS", "faulty"]));
    first.release().unwrap();
    assert!(
        !server.cmd::<bool>(&["EXISTS", "faulty"]),
        "the lost re-entry's hold was withdrawn"
    );
}

/// Item 5: a reentrant lock is a mutex: the same name cannot be a semaphore at once, and
/// a Redlock client refuses reentrant locks clearly.
#[test]
fn reentrant_locks_keep_to_their_kind() {
    let server = RedisServer::start();
    let c = client(&server.url());
    let held = c.lock("mixed").reentrant().try_acquire().unwrap();
    let err = c.semaphore("mixed", 2).try_acquire().unwrap_err();
    assert!(err.to_string().contains("another kind"), "{err}");
    drop(held);
    let err = c.semaphore("s", 2).reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = c.rwlock("rw").read().reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let redlock = Client::redlock(&[&server.url()], ClientOptions::default()).unwrap();
    let err = redlock.lock("r").reentrant().try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}
