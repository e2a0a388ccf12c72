//! Redis Cluster: many names from many threads without `CROSSSLOT` or overlap, a failover
//! in the middle of contention, a held lock across the migration of its slot (also as the
//! README's least-privilege user). Refusals that last (`CLUSTERDOWN`, a slot migrating for
//! seconds) against the bounds of each call, the honesty of its outcome, a waiter's
//! patience and a cancel: each of those tests failed before the fix it names.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use super::quick;
use crate::support::deploy::LocalCluster;
use crate::support::{self, RedisServer, eventually, within};

/// Lock names chosen to be hard to keep in one slot: braces, existing hash tags, binary-safe
/// UTF-8.
fn adversarial_names(n: usize) -> Vec<String> {
    let shapes = [
        "plain-{i}",
        "{{user:{i}}}:job",
        "{{}}{i}",
        "x{{}}y{i}",
        "a}}b{i}",
        "}}{{{i}",
        "a{{b{i}",
        "{{{{nested}}}}{i}",
        "{{a{{b}}c}}{i}",
        "{{}}{{real{i}}}",
        "é{{ü}}{i}",
        "\u{1}\u{7f}bin{i}",
    ];
    (0..n)
        .map(|i| {
            shapes[i % shapes.len()]
                .replace("{i}", &i.to_string())
                .replace("{{", "{")
                .replace("}}", "}")
        })
        .collect()
}

/// Cluster: 10,000 acquisitions over 1,000 adversarial names from 8 threads, no CROSSSLOT,
/// no overlap (a non-atomic counter per name stays exact), fencing tokens increasing per
/// name.
#[test]
fn a_cluster_serves_many_names_from_many_threads_without_overlap() {
    // Not a failover test: nodes slow to time each other out.
    let cluster = LocalCluster::start_with_node_timeout(3, 1, 10_000);
    let client = Client::open(&cluster.url()).unwrap();
    let names = Arc::new(adversarial_names(1000));
    let counters: Arc<Vec<Mutex<(u64, u64)>>> =
        Arc::new((0..names.len()).map(|_| Mutex::new((0, 0))).collect());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (client, names, counters, errors) = (
                client.clone(),
                names.clone(),
                counters.clone(),
                errors.clone(),
            );
            std::thread::spawn(move || {
                for k in 0..1250 {
                    let i = (k * 7 + t * 131) % names.len();
                    match client
                        .lock(&names[i])
                        .acquire_timeout(Duration::from_secs(10))
                    {
                        Ok(guard) => {
                            // Read, yield, write: only the lock keeps this exact.
                            let (count, last_fence) = *counters[i].lock().unwrap();
                            std::thread::yield_now();
                            if guard.fencing_token() <= last_fence {
                                errors.lock().unwrap().push(format!(
                                    "{:?}: fencing token {} after {last_fence}",
                                    names[i],
                                    guard.fencing_token()
                                ));
                            }
                            *counters[i].lock().unwrap() = (count + 1, guard.fencing_token());
                            guard.release().unwrap();
                        }
                        Err(e) => errors.lock().unwrap().push(format!("{:?}: {e}", names[i])),
                    }
                }
            })
        })
        .collect();
    within(Duration::from_secs(240), move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    let total: u64 = counters.iter().map(|c| c.lock().unwrap().0).sum();
    assert_eq!(total, 10_000);
}

/// Cluster: a failover of the primary holding a hot lock in the middle of contention:
/// every call returns within its bounds, and the holder keeps its lock or is told it is
/// lost; never two holders at once.
#[test]
fn a_cluster_failover_mid_run_keeps_calls_bounded_and_holders_honest() {
    let cluster = LocalCluster::start(3, 1);
    let client = quick(&cluster.url());
    let name = "hot";
    let primary = cluster.primary_of(redlease::key_slot(name.as_bytes()));
    // The primary learns of its replica by gossip, which may come after the cluster is ok.
    let primary_id = LocalCluster::id(primary);
    assert!(
        eventually(Duration::from_secs(10), || {
            !primary
                .cmd::<Vec<String>>(&["CLUSTER", "REPLICAS", &primary_id])
                .is_empty()
        }),
        "the primary of {name:?} never listed its replica"
    );
    let replica_port = cluster.replica_of(primary).port;
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let slow = Arc::new(Mutex::new(Vec::new()));
    let acquired = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (client, stop, inside, overlaps, slow, acquired) = (
                client.clone(),
                stop.clone(),
                inside.clone(),
                overlaps.clone(),
                slow.clone(),
                acquired.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let result = client
                        .lock(name)
                        .ttl(Duration::from_secs(3))
                        .acquire_timeout(Duration::from_secs(1));
                    // Bound: the wait, plus one request's connect and I/O timeouts, plus
                    // redirections (each bounded the same way), plus slack.
                    if started.elapsed() > Duration::from_secs(4) {
                        slow.lock().unwrap().push(started.elapsed());
                    }
                    let Ok(guard) = result else { continue };
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 && guard.is_held() {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    let still = guard.is_held();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    acquired.fetch_add(1, Ordering::SeqCst);
                    let released = Instant::now();
                    let r = guard.release();
                    if released.elapsed() > Duration::from_secs(3) {
                        slow.lock().unwrap().push(released.elapsed());
                    }
                    if still {
                        // A release may find the lock lost (the failover lost the key): it
                        // must say so, not pretend.
                        if let Err(e) = r {
                            assert!(e.is_not_held() || e.is_unreachable(), "{e}");
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let before = acquired.load(Ordering::SeqCst);
    let replica = cluster
        .nodes
        .iter()
        .find(|n| n.port == replica_port)
        .unwrap();
    replica.cmd::<()>(&["CLUSTER", "FAILOVER", "FORCE"]);
    assert!(eventually(Duration::from_secs(20), || {
        cluster.primary_of(redlease::key_slot(name.as_bytes())).port == replica_port
    }));
    let after_failover = acquired.load(Ordering::SeqCst);
    assert!(eventually(Duration::from_secs(10), || acquired
        .load(Ordering::SeqCst)
        > after_failover + 5));
    stop.store(true, Ordering::SeqCst);
    within(Duration::from_secs(30), move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    assert!(before > 0);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let slow = slow.lock().unwrap();
    assert!(slow.is_empty(), "calls over their bounds: {slow:?}");
}

/// Cluster: migrating a held lock's slot to another primary (MIGRATING/IMPORTING, then
/// MIGRATE of its keys, then SETSLOT NODE): renewal, acquire and release go on working,
/// also by `ASK` to a target whose script cache is empty (a `NOSCRIPT` resend once went
/// without `ASKING`, was answered `MOVED`, and every call failed until the slot moved).
/// Each phase lasts until the renewals were seen where the key is (from the nodes' `INFO
/// commandstats`, which count only calls that ran), not for a fixed time.
#[test]
fn a_held_lock_survives_the_migration_of_its_slot() {
    let cluster = LocalCluster::start(3, 0);
    let client = Client::open(&cluster.url()).unwrap();
    let name = "migrating";
    let slot = redlease::key_slot(name.as_bytes());
    // Scripts that ran on `node`, in either form (EVAL after a NOSCRIPT).
    let scripts = |node: &RedisServer| node.calls("evalsha") + node.calls("eval");
    // Waits until `count` has grown by `by`.
    let grows = |count: &dyn Fn() -> u64, by: u64| {
        let before = count();
        eventually(Duration::from_secs(10), || count() >= before + by)
    };
    let lost = Arc::new(AtomicBool::new(false));
    let guard = {
        let lost = lost.clone();
        client
            .lock(name)
            .ttl(Duration::from_secs(3))
            .on_lost(move |_| lost.store(true, Ordering::SeqCst))
            .acquire()
            .unwrap()
    };
    let (source, target) = cluster.start_migrating(slot);
    // Renewal runs across the migration (every second): on the source while the key is
    // there,
    assert!(
        grows(&|| scripts(source), 1),
        "no renewal on the source while migrating"
    );
    target.cmd::<()>(&["SCRIPT", "FLUSH"]);
    let keys = LocalCluster::migrate_keys(source, target, slot);
    assert!(keys.contains(&name.to_owned()), "{keys:?}");
    // on the target by ASK once the key moved, though its script cache was empty,
    assert!(
        grows(&|| scripts(target), 1),
        "no renewal ran on the target by ASK"
    );
    assert!(target.calls("asking") >= 1);
    // A new lock of the slot has keys on neither side yet: Redis answers its acquire
    // `TRYAGAIN` until the slot settles, and the acquire waits for that within its bounds
    // (here 1.5 s, longer than the six quick tries it once gave up after).
    let taker = {
        let (client, fresh) = (client.clone(), format!("{{{name}}}:fresh"));
        std::thread::spawn(move || client.lock(&fresh).try_acquire())
    };
    let refusals = |node: &RedisServer| -> u64 {
        let info: String = node.cmd(&["INFO", "errorstats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(
        eventually(Duration::from_secs(5), || refusals(target) >= 1),
        "the new lock's acquire was never refused TRYAGAIN"
    );
    std::thread::sleep(Duration::from_millis(1500));
    cluster.finish_migrating(slot, target);
    let fresh = within(Duration::from_secs(10), move || taker.join().unwrap())
        .expect("the acquire did not wait for the slot to settle");
    let fresh_key = fresh.key().to_owned();
    let stored: String = target.cmd(&["GET", &fresh_key]);
    assert_eq!(stored, fresh.token());
    fresh.release().unwrap();
    assert!(!target.cmd::<bool>(&["EXISTS", &fresh_key]));
    // and on the target by MOVED once the slot moved (twice: one may have been on its way
    // by ASK).
    assert!(
        grows(&|| scripts(target), 2),
        "no renewal ran on the target after the slot moved"
    );
    assert!(guard.is_held(), "renewal failed across the migration");
    assert!(!lost.load(Ordering::SeqCst));
    let stored: String = target.cmd(&["GET", name]);
    assert_eq!(stored, guard.token());
    guard.release().unwrap();
    assert!(!target.cmd::<bool>(&["EXISTS", name]));
}

/// The README's least-privilege user keeps a lock across a migration: its renewals reach
/// the target by `ASK` (the line once lacked `+asking`, every `ASKING` was refused, and the
/// renewals were answered `MOVED` until the lock was lost).
#[test]
fn the_least_privilege_user_keeps_a_lock_across_a_migration() {
    let cluster = LocalCluster::start(3, 0);
    let line = support::readme_acl_line();
    for node in &cluster.nodes {
        let mut acl = redis::cmd("ACL");
        for word in line.split_whitespace().skip(1) {
            acl.arg(word);
        }
        acl.query::<()>(&mut node.conn()).unwrap();
    }
    let hosts: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://locker:locker-pw@{}", hosts.join(","));
    let client = Client::with_options(&url, ClientOptions::default().key_prefix("app:")).unwrap();
    let lost = Arc::new(AtomicBool::new(false));
    let guard = {
        let lost = lost.clone();
        client
            .lock("migrating")
            .ttl(Duration::from_secs(2))
            .on_lost(move |_| lost.store(true, Ordering::SeqCst))
            .acquire()
            .unwrap()
    };
    let slot = redlease::key_slot(guard.key().as_bytes());
    let (source, target) = cluster.start_migrating(slot);
    target.cmd::<()>(&["SCRIPT", "FLUSH"]);
    LocalCluster::migrate_keys(source, target, slot);
    // Two renewals ran on the target by ASK, as the locker user: longer than the lease
    // would last without them.
    let scripts = || target.calls("evalsha") + target.calls("eval");
    let before = scripts();
    let renewed = eventually(Duration::from_secs(10), || scripts() >= before + 2);
    let refused: String = target.cmd(&["INFO", "errorstats"]);
    cluster.finish_migrating(slot, target);
    assert!(renewed, "no renewals ran on the target: {refused}");
    assert!(!refused.contains("NOPERM"), "{refused}");
    assert!(guard.is_held() && !lost.load(Ordering::SeqCst));
    guard.release().unwrap();
}

/// Waiting acquires of new locks in a slot that migrates for 3 s (three times what one
/// request may spend on refusals) wait it out, with a timeout and without one. (A refusal
/// once ended a wait: `acquire()` failed with a raw `ASK` or `TRYAGAIN`.)
#[test]
fn waiting_acquires_wait_out_a_long_migration() {
    let cluster = LocalCluster::start(3, 0);
    let client = quick(&cluster.url());
    let base = "moving";
    let slot = redlease::key_slot(base.as_bytes());
    // A key of the slot, so that the source answers TRYAGAIN or ASK, not a plain grant.
    let held = client.lock(base).try_acquire().unwrap();
    let (source, target) = cluster.start_migrating(slot);
    LocalCluster::migrate_keys(source, target, slot);
    let waiter = |name: String, timeout: Option<Duration>| {
        let client = client.clone();
        std::thread::spawn(move || {
            let lock = client.lock(&name);
            match timeout {
                Some(t) => lock.acquire_timeout(t),
                None => lock.acquire(),
            }
            .map(|g| g.release())
        })
    };
    let forever = waiter(format!("{{{base}}}:forever"), None);
    let timed = waiter(format!("{{{base}}}:timed"), Some(Duration::from_secs(30)));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !forever.is_finished(),
        "acquire() ended during the migration"
    );
    assert!(
        !timed.is_finished(),
        "acquire_timeout ended during the migration"
    );
    cluster.finish_migrating(slot, target);
    within(Duration::from_secs(10), move || {
        forever.join().unwrap().unwrap().unwrap();
        timed.join().unwrap().unwrap().unwrap();
    });
    held.release().unwrap();
}

/// Slack for a loaded host, on top of a documented bound.
const SLACK: Duration = Duration::from_secs(1);

/// Puts `node` in `cluster_state:fail` by unassigning another slot it serves: every keyed
/// command it gets is answered `CLUSTERDOWN`. Returns that slot, for [`cluster_up`].
fn cluster_down(node: &RedisServer, lock_slot: u16) -> String {
    let other = if lock_slot > 0 { lock_slot - 1 } else { 1 }.to_string();
    node.cmd::<()>(&["CLUSTER", "DELSLOTS", &other]);
    assert!(eventually(Duration::from_secs(5), || {
        node.cmd::<String>(&["CLUSTER", "INFO"])
            .contains("cluster_state:fail")
    }));
    other
}

fn cluster_up(node: &RedisServer, other: &str) {
    node.cmd::<()>(&["CLUSTER", "ADDSLOTS", other]);
    assert!(eventually(Duration::from_secs(10), || {
        node.cmd::<String>(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
    }));
}

/// An `extend()` refused `CLUSTERDOWN` throughout returns within its documented bound (one
/// connect and one I/O timeout) with the refusal, and the lock is still held. (It once
/// tried again until the lease's local deadline, 10 s here, holding the renewal gate, and
/// then declared the lock lost.)
#[test]
fn an_extend_refused_throughout_returns_within_connect_and_io() {
    let cluster = LocalCluster::start(3, 0);
    let client = quick(&cluster.url());
    let name = "extended";
    let slot = redlease::key_slot(name.as_bytes());
    let guard = client
        .lock(name)
        .ttl(Duration::from_secs(10))
        .renew(false)
        .acquire()
        .unwrap();
    let primary = cluster.primary_of(slot);
    let other = cluster_down(primary, slot);
    let started = Instant::now();
    let result = guard.extend(Duration::from_secs(10));
    let took = started.elapsed();
    cluster_up(primary, &other);
    let err = result.unwrap_err();
    assert!(
        took < Duration::from_secs(1) + SLACK,
        "extend took {took:?} ({err})"
    );
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.message().contains("CLUSTERDOWN"), "{err}");
    assert!(!err.outcome_unknown(), "{err}");
    assert!(guard.is_held());
    guard.release().unwrap();
}

/// A `try_acquire` refused `CLUSTERDOWN` throughout reports the refusal, outcome known,
/// within one connect and one I/O timeout. (It once tried again until the acquire's whole
/// cutoff, the pool wait included, and a last try sent at that cutoff was abandoned
/// unread: a `Timeout` whose outcome was unknown.)
#[test]
fn a_try_acquire_refused_throughout_reports_a_known_outcome() {
    let cluster = LocalCluster::start(3, 0);
    let client = quick(&cluster.url());
    let name = "refused";
    let slot = redlease::key_slot(name.as_bytes());
    client.ping().unwrap();
    let primary = cluster.primary_of(slot);
    let other = cluster_down(primary, slot);
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let err = client.lock(name).try_acquire().unwrap_err();
        outcomes.push((err, started.elapsed()));
    }
    cluster_up(primary, &other);
    for (err, took) in &outcomes {
        assert_eq!(err.kind(), ErrorKind::Server, "{err}");
        assert!(err.message().contains("CLUSTERDOWN"), "{err}");
        assert!(!err.outcome_unknown(), "{err}");
        assert!(*took < Duration::from_secs(1) + SLACK, "{took:?}");
    }
    assert!(!client.is_locked(name).unwrap());
}

/// An `extend()` refused `CLUSTERDOWN` until its lease ends says so: the refusal is the
/// reason, and nothing was left to run after the call gave up. (Its last try was once sent
/// as the lease ended and abandoned unread, reported as a timeout.)
#[test]
fn an_extend_refused_until_the_lease_ends_reports_the_refusal() {
    let cluster = LocalCluster::start(3, 0);
    let client = quick(&cluster.url());
    let name = "ending";
    let slot = redlease::key_slot(name.as_bytes());
    let primary = cluster.primary_of(slot);
    for round in 0..3 {
        let guard = client
            .lock(name)
            .ttl(Duration::from_millis(1500))
            .renew(false)
            .acquire()
            .unwrap();
        let other = cluster_down(primary, slot);
        // Less lease left than one connect and one I/O timeout.
        let left = guard.remaining().saturating_sub(Duration::from_millis(600));
        std::thread::sleep(left);
        let result = guard.extend(Duration::from_secs(10));
        cluster_up(primary, &other);
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "round {round}: {err}");
        assert!(
            err.message().contains("CLUSTERDOWN"),
            "round {round}: {err}"
        );
        assert!(!guard.is_held());
        let _ = guard.release();
        server_del(primary, name);
    }
}

fn server_del(node: &RedisServer, key: &str) {
    let _: i64 = node.cmd(&["DEL", key]);
}

/// `acquire_timeout(wait)` refused `CLUSTERDOWN` throughout returns within its documented
/// bound (`wait` + connect + I/O + 0.25 s). (An attempt started just before the wait ended
/// was once tried again for a whole connect and I/O timeout, and the last attempt then got
/// another: up to connect + I/O over.)
#[test]
fn a_wait_refused_throughout_ends_within_its_bound() {
    let cluster = LocalCluster::start(3, 0);
    let client = quick(&cluster.url());
    let name = "bounded";
    let slot = redlease::key_slot(name.as_bytes());
    client.ping().unwrap();
    let primary = cluster.primary_of(slot);
    let other = cluster_down(primary, slot);
    let mut over = Vec::new();
    for wait_ms in [1150, 1250, 2300] {
        let wait = Duration::from_millis(wait_ms);
        let started = Instant::now();
        let err = client.lock(name).acquire_timeout(wait).unwrap_err();
        let took = started.elapsed();
        // connect + I/O of 0.5 s each, then 0.25 s; and a little for a loaded host.
        let bound = wait + Duration::from_millis(1250 + 300);
        if took > bound || err.outcome_unknown() {
            over.push(format!("wait {wait:?}: {took:?} ({err})"));
        }
    }
    cluster_up(primary, &other);
    assert!(over.is_empty(), "{over:?}");
}

/// A cancel, or an interrupt hook asking to stop, ends a wait refused `CLUSTERDOWN` at
/// once. (The pauses between the backend's tries once slept through it: up to a connect
/// and an I/O timeout, 4 s here.)
#[test]
fn a_cancel_ends_a_refused_wait_at_once() {
    let cluster = LocalCluster::start(3, 0);
    let client = Client::open(&cluster.url()).unwrap();
    let name = "cancelled";
    let slot = redlease::key_slot(name.as_bytes());
    client.ping().unwrap();
    let primary = cluster.primary_of(slot);
    let other = cluster_down(primary, slot);
    let token = redlease::CancelToken::new();
    let waiter = {
        let (client, token) = (client.clone(), token.clone());
        std::thread::spawn(move || {
            let result = client.lock(name).cancel_token(&token).acquire();
            (result.map(drop), Instant::now())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let hooked = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            let result = client
                .lock(name)
                .on_interrupt(move || stop.load(Ordering::SeqCst))
                .acquire();
            (result.map(drop), Instant::now())
        })
    };
    // Both are in the backend's tries by now.
    std::thread::sleep(Duration::from_millis(1500));
    let cancelled_at = Instant::now();
    token.cancel();
    stop.store(true, Ordering::SeqCst);
    let results = within(Duration::from_secs(10), move || {
        [waiter.join().unwrap(), hooked.join().unwrap()]
    });
    cluster_up(primary, &other);
    for (result, returned) in results {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
        let took = returned.saturating_duration_since(cancelled_at);
        assert!(took < Duration::from_millis(500) + SLACK, "{took:?}");
    }
}
