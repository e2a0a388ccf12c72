//! Attack: Cluster refusals that last (`CLUSTERDOWN`, a slot migrating for seconds) against
//! the bounds of each call, the honesty of its outcome, and a waiter's patience; and a
//! migration seen by the README's least-privilege user. Each test failed before the fix it
//! names.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};
use support::deploy::LocalCluster;
use support::{RedisServer, eventually, within};

/// Connect and I/O timeouts of 0.5 s: a refused call may be tried again for 1 s.
fn quick(url: &str) -> Client {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500));
    Client::with_options(url, options).unwrap()
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
