//! Deployments (issue 10): Redis Cluster, Sentinel failover, and replica acknowledgement,
//! against real processes the tests start (`tests/support/deploy.rs`).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};
use support::deploy::{LocalCluster, SentinelDeployment};
use support::proxy::Proxy;
use support::{RedisServer, eventually, within};

fn quick(url: &str) -> Client {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500));
    Client::with_options(url, options).expect("client")
}

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

/// Sentinel: the primary is stopped until the Sentinels fail over; clients continue on the
/// new primary; a lock held across the failover is still held or reported lost, never held
/// by two; fencing tokens after the failover are above those before.
#[test]
fn a_sentinel_failover_moves_clients_to_the_new_primary() {
    let deployment = SentinelDeployment::start(2, 3, 1000);
    let client = quick(&deployment.url());
    let mut last_fence = 0;
    for _ in 0..20 {
        let guard = client.lock("before").try_acquire().unwrap();
        last_fence = last_fence.max(guard.fencing_token());
        guard.release().unwrap();
    }
    let held = client
        .lock("across")
        .ttl(Duration::from_secs(2))
        .acquire()
        .unwrap();
    let old_port = deployment.primary_port();
    deployment.primary().pause();
    let stopped = Instant::now();
    let new_port = deployment.wait_for_failover(old_port, Duration::from_secs(30));
    let failover_took = stopped.elapsed();
    // Clients continue on the new primary within the failover time and their bounds.
    let resumed = eventually(Duration::from_secs(10), || {
        client.lock("after").try_acquire().is_ok()
    });
    assert!(
        resumed,
        "no acquire succeeded on the new primary {new_port}"
    );
    let after = client.lock("before").try_acquire().unwrap();
    assert!(
        after.fencing_token() > last_fence,
        "fencing token {} after the failover, {last_fence} before",
        after.fencing_token()
    );
    after.release().unwrap();
    // The lock held across: still held with its key on the new primary, or lost. (Default
    // timeouts: this one must answer Busy, not time out on a loaded host.)
    let other = Client::open(&deployment.url()).unwrap();
    match other.lock("across").try_acquire() {
        Ok(second) => {
            assert!(
                !held.is_held(),
                "two holders: the first still believes it holds the lock"
            );
            second.release().unwrap();
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Busy, "{e}"),
    }
    eprintln!("failover took {failover_took:?}; old primary {old_port}, new {new_port}");
    deployment
        .servers
        .iter()
        .find(|s| s.port == old_port)
        .unwrap()
        .resume();
}

/// Replica acknowledgement: without `WAIT`, a failover right after an acquire can let a
/// second client in on the promoted replica (shown here); with `min_replicas(1, ..)` the
/// acquire is acknowledged (the promoted replica has the key) or reported, and no run of
/// 100 grants the lock twice.
#[test]
fn min_replicas_prevents_a_double_grant_after_a_failover() {
    let primary = RedisServer::start();
    // The replica replicates through a proxy, so the test can hold its replication back.
    let link = support::proxy::Proxy::start(primary.port);
    let replica = RedisServer::start();
    let follow = |r: &RedisServer| {
        r.cmd::<()>(&["REPLICAOF", "127.0.0.1", &link.port().to_string()]);
        assert!(eventually(Duration::from_secs(10), || {
            let info: String = r.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up")
        }));
    };
    follow(&replica);
    // Default timeouts: only a replication failure may fail these calls.
    let a = Client::open(&primary.url()).unwrap();
    let b = Client::open(&replica.url()).unwrap();

    // Without WAIT: the write is not yet on the replica when it is promoted.
    link.blackhole(true);
    let first = a.lock("no-wait").try_acquire().unwrap();
    replica.cmd::<()>(&["REPLICAOF", "NO", "ONE"]);
    let second = b.lock("no-wait").try_acquire();
    assert!(
        second.is_ok(),
        "expected the double grant WAIT exists to prevent"
    );
    drop(second);
    first.release().unwrap();
    link.blackhole(false);

    let mut acknowledged = 0;
    let mut reported = 0;
    for run in 0..100 {
        follow(&replica);
        let name = format!("wait-{run}");
        // Half the runs hold replication back, so that WAIT cannot be satisfied.
        link.blackhole(run % 2 == 1);
        let got = a
            .lock(&name)
            .min_replicas(1, Duration::from_millis(100))
            .try_acquire();
        replica.cmd::<()>(&["REPLICAOF", "NO", "ONE"]);
        let second = b.lock(&name).try_acquire();
        match got {
            Ok(guard) => {
                acknowledged += 1;
                assert!(second.is_err(), "run {run}: granted twice");
                drop(guard);
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Replication, "run {run}: {e}");
                reported += 1;
            }
        }
        drop(second);
        link.blackhole(false);
    }
    assert!(
        acknowledged > 0 && reported > 0,
        "{acknowledged} acknowledged, {reported} reported"
    );
}

/// Sentinel: Sentinels that do not answer, listed first, cost their timeouts, and the one
/// that answers is still asked within the call's bounds. (The Sentinel client once shared
/// the Cluster's retry window of one connect and one I/O timeout, which two silent
/// Sentinels used up: every call failed though a Sentinel and the primary were healthy.)
#[test]
fn silent_sentinels_listed_first_do_not_hide_the_one_that_answers() {
    let deployment = SentinelDeployment::start(0, 1, 5000);
    let sentinel = &deployment.sentinels[0];
    let silent: Vec<Proxy> = (0..2).map(|_| Proxy::start(sentinel.port)).collect();
    for proxy in &silent {
        proxy.blackhole(true);
    }
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/{}",
        silent[0].port(),
        silent[1].port(),
        sentinel.port,
        deployment.master
    );
    let options = ClientOptions::default()
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    let client = Client::with_options(&url, options).unwrap();
    let guard = client.lock("found").try_acquire().unwrap();
    guard.release().unwrap();
}
