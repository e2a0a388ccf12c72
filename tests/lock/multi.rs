//! One lock over several names (`Client::lock_all`): all or none, without deadlock, each
//! name still exclusive with single-name locks, nothing held after a failure halfway, bad
//! input refused before anything is sent, one lost signal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind, LockGuard, LostReason};

use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, eventually};

/// Takes and releases `names` (one server or slot) so that the server has the acquire-all
/// script cached: the next `EVALSHA` runs, rather than being answered `NOSCRIPT`.
fn cache_the_script(client: &Client, names: [&str; 2]) {
    client
        .lock_all(&names)
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
}

/// `names` taken by `client` at once without renewal, in a thread of its own, waiting up
/// to 20 s.
fn lock_all_unrenewed(
    client: &Client,
    names: &'static [&'static str],
    ttl: Duration,
) -> std::thread::JoinHandle<redlease::Result<redlease::MultiGuard>> {
    let client = client.clone();
    std::thread::spawn(move || {
        client
            .lock_all(names)
            .ttl(ttl)
            .renew(false)
            .acquire_timeout(Duration::from_secs(20))
    })
}

/// Releases `guard` (of another client), on which a `lock_all` waits, and waits until
/// `server` shows its key taken under another token: the waiter took it alone.
fn hand_to_the_waiter(guard: LockGuard, server: &RedisServer) {
    let (key, token) = (guard.key().to_owned(), guard.token().to_owned());
    std::thread::sleep(Duration::from_millis(200));
    guard.release().unwrap();
    assert!(eventually(Duration::from_secs(5), || server
        .get(&key)
        .is_some_and(|t| t != token)));
}

#[test]
fn callers_taking_two_names_in_opposite_orders_never_deadlock_nor_overlap() {
    let server = RedisServer::start();
    let url = server.url();
    let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let runs: Vec<_> = [["acct:a", "acct:b"], ["acct:b", "acct:a"]]
        .into_iter()
        .map(|names| {
            let (url, inside, overlaps) = (url.clone(), inside.clone(), overlaps.clone());
            std::thread::spawn(move || {
                let client = Client::open(&url).unwrap();
                for _ in 0..60 {
                    let both = client
                        .lock_all(&names)
                        .acquire_timeout(Duration::from_secs(20))
                        .expect("never a deadlock: each acquire gets both");
                    for counter in inside.iter() {
                        if counter.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    for counter in inside.iter() {
                        counter.fetch_sub(1, Ordering::SeqCst);
                    }
                    both.release().unwrap();
                }
            })
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[test]
fn each_name_stays_exclusive_with_single_name_locks_and_a_busy_name_leaves_nothing() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let single = client.lock("set:b").try_acquire().unwrap();
    let err = client
        .lock_all(&["set:c", "set:a", "set:b"])
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    // Taken in one script, all or none: neither set:a nor set:c was taken.
    assert!(!client.is_locked("set:a").unwrap() && !client.is_locked("set:c").unwrap());
    let waited = client
        .lock_all(&["set:a", "set:b"])
        .acquire_timeout(Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(waited.kind(), ErrorKind::Busy);
    assert!(!client.is_locked("set:a").unwrap());
    single.release().unwrap();

    let all = client
        .lock_all(&["set:c", "set:a", "set:b"])
        .try_acquire()
        .unwrap();
    assert_eq!(all.names().collect::<Vec<_>>(), ["set:a", "set:b", "set:c"]);
    let fences = all.fencing_tokens();
    assert!(fences.iter().all(|(_, f)| *f > 0));
    assert_eq!(all.fencing_token("set:b"), Some(fences[1].1));
    assert_eq!(
        client.lock("set:c").try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    all.extend(Duration::from_secs(60)).unwrap();
    assert!(all.remaining() > Duration::from_secs(50));
    all.release().unwrap();
    for name in ["set:a", "set:b", "set:c"] {
        assert!(!client.is_locked(name).unwrap());
    }
}

#[test]
fn a_lost_reply_leaves_nothing_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::open(&proxy.url()).unwrap();
    // The script is cached first, so that the request below runs (not answered NOSCRIPT).
    cache_the_script(&client, ["warm:a", "warm:b"]);
    // The script that takes both names runs on the server but its reply never arrives.
    proxy.on_request(b"half:b", 1, Action::ResetBeforeReply);
    let err = client
        .lock_all(&["half:a", "half:b"])
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .unwrap_err();
    assert!(err.outcome_unknown(), "{err:?}");
    // Only the withdrawal in the background frees them: no guard was ever made.
    let plain = Client::open(&server.url()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            !plain.is_locked("half:a").unwrap() && !plain.is_locked("half:b").unwrap()
        }),
        "both names are free again (withdrawn)"
    );
}

#[test]
fn bad_input_is_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    for names in [
        &[][..],
        &["x", "y", "x"],
        &["ok", ""],
        &["redlease:reserved"],
    ] {
        let err = client.lock_all(names).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{names:?}");
    }
    let too_many: Vec<String> = (0..=redlease::MAX_NAMES).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_eq!(
        client.lock_all(&refs).try_acquire().unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 0, "nothing was sent");
    // A name in use by another kind: refused by the server, and nothing stays held.
    let permit = client.semaphore("kind:b", 2).try_acquire().unwrap();
    let err = client
        .lock_all(&["kind:a", "kind:b"])
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err:?}");
    assert!(!client.is_locked("kind:a").unwrap());
    permit.release().unwrap();
}

#[test]
fn losing_any_name_loses_the_whole_lock_once() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let told = Arc::new(AtomicUsize::new(0));
    let told2 = told.clone();
    let all = client
        .lock_all(&["lost:a", "lost:b"])
        .ttl(Duration::from_millis(300))
        .on_lost(move |name, reason| {
            assert_eq!((name, reason), ("lost:b", LostReason::NotHeld));
            told2.fetch_add(1, Ordering::SeqCst);
        })
        .try_acquire()
        .unwrap();
    let lost = all.lost();
    server.cmd::<i64>(&["DEL", "lost:b"]);
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(5)).unwrap(),
        LostReason::NotHeld
    );
    assert!(!all.is_held());
    assert_eq!(all.lost_reason(), Some(LostReason::NotHeld));
    assert_eq!(all.release().unwrap_err().kind(), ErrorKind::NotHeld);
    assert_eq!(told.load(Ordering::SeqCst), 1);
    assert!(
        !client.is_locked("lost:a").unwrap(),
        "the other name is released too"
    );
}

/// On a cluster, names on different primaries: a stopped primary halfway (the second name's,
/// in the order names are taken: by slot) ends the acquire with an error and leaves the
/// first name free.
#[test]
fn a_stopped_cluster_node_halfway_leaves_nothing_held() {
    use redlease::ClientOptions;

    use crate::support::deploy::LocalCluster;

    let cluster = LocalCluster::start(3, 0);
    cluster.wait_until_ok(Duration::from_secs(30));
    // Two names on two different primaries.
    let first = (0..1000)
        .map(|i| format!("cl:a{i}"))
        .find(|n| redlease::key_slot(n.as_bytes()) < 4000)
        .expect("a name of a low slot");
    let first_slot = redlease::key_slot(first.as_bytes());
    let first_node = cluster.primary_of(first_slot).port;
    let second = (0..1000)
        .map(|i| format!("cl:b{i}"))
        .find(|n| {
            let slot = redlease::key_slot(n.as_bytes());
            slot > first_slot && cluster.primary_of(slot).port != first_node
        })
        .expect("a name on another primary, taken after the first");
    let stopped = cluster.primary_of(redlease::key_slot(second.as_bytes()));
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let client = Client::with_options(&cluster.url(), options).unwrap();
    client.ping().unwrap();
    stopped.pause();
    let err = client.lock_all(&[&second, &first]).try_acquire();
    stopped.resume();
    let err = err.unwrap_err();
    assert!(
        err.is_unreachable() || err.kind() == ErrorKind::Timeout,
        "{err:?}"
    );
    let plain = Client::open(&cluster.url()).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            !plain.is_locked(&first).unwrap_or(true) && !plain.is_locked(&second).unwrap_or(true)
        }),
        "both names are free again"
    );
}

/// On one server every name is in one group: one script takes them all, and a busy name
/// means nothing was written (no key, no fencing counter), not names taken and given back.
#[test]
fn names_on_one_server_are_taken_in_one_script_and_a_busy_one_writes_nothing() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    // Loads the script (a first EVALSHA may be answered NOSCRIPT).
    cache_the_script(&client, ["warm:a", "warm:b"]);
    server.cmd::<String>(&["CONFIG", "RESETSTAT"]);
    let all = client
        .lock_all(&["one:c", "one:a", "one:b"])
        .try_acquire()
        .unwrap();
    assert_eq!(server.calls("evalsha"), 1, "one script for the three names");
    assert!(all.fencing_tokens().iter().all(|(_, f)| *f > 0));
    all.release().unwrap();

    let other = Client::open(&server.url()).unwrap();
    let busy = other.lock("two:c").try_acquire().unwrap();
    let before = server.cmd::<i64>(&["DBSIZE"]);
    let err = client
        .lock_all(&["two:a", "two:b", "two:c"])
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(err.to_string().contains("two:c"), "{err}");
    assert_eq!(
        server.cmd::<i64>(&["DBSIZE"]),
        before,
        "neither two:a nor two:b, nor their fencing counters, was written"
    );
    busy.release().unwrap();
}

/// A waiting caller takes the busy name alone (queued, woken by its release) and holds
/// nothing before it meanwhile; then the rest in one script.
#[test]
fn a_waiting_caller_holds_nothing_while_it_waits_for_the_first_busy_name() {
    let server = RedisServer::start();
    let client = Arc::new(Client::open(&server.url()).unwrap());
    let holder = client.lock("w:b").try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock_all(&["w:a", "w:b", "w:c"])
                .acquire_timeout(Duration::from_secs(20))
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!client.is_locked("w:a").unwrap() && !client.is_locked("w:c").unwrap());
    let b_fence = holder.fencing_token();
    holder.release().unwrap();
    let all = waiter
        .join()
        .unwrap()
        .expect("all three once w:b is released");
    assert!(all.fencing_token("w:b").unwrap() > b_fence);
    for name in ["w:a", "w:b", "w:c"] {
        assert!(client.is_locked(name).unwrap(), "{name}");
    }
    all.release().unwrap();
}

/// Three callers whose sets overlap in a ring ({a, b}, {b, c}, {c, a}): with a wait for a
/// name only while holding none after it, none waits for another in a circle.
#[test]
fn callers_whose_sets_overlap_in_a_ring_never_deadlock_nor_overlap() {
    let server = RedisServer::start();
    let url = server.url();
    let inside = Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let runs: Vec<_> = [[0usize, 1], [1, 2], [2, 0]]
        .into_iter()
        .map(|pair| {
            let (url, inside, overlaps) = (url.clone(), inside.clone(), overlaps.clone());
            std::thread::spawn(move || {
                let client = Client::open(&url).unwrap();
                let names = pair.map(|i| ["ring:a", "ring:b", "ring:c"][i]);
                for _ in 0..40 {
                    let both = client
                        .lock_all(&names)
                        .acquire_timeout(Duration::from_secs(20))
                        .expect("never a deadlock");
                    for i in pair {
                        if inside[i].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    for i in pair {
                        inside[i].fetch_sub(1, Ordering::SeqCst);
                    }
                    both.release().unwrap();
                }
            })
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

/// A cancelled wait ends with `Cancelled` and leaves every name as it found it.
#[test]
fn a_cancelled_group_wait_holds_nothing() {
    let server = RedisServer::start();
    let client = Arc::new(Client::open(&server.url()).unwrap());
    let holder = client.lock("cx:b").try_acquire().unwrap();
    let cancel = redlease::CancelToken::new();
    let waiter = {
        let (client, cancel) = (client.clone(), cancel.clone());
        std::thread::spawn(move || {
            client
                .lock_all(&["cx:a", "cx:b"])
                .cancel_token(&cancel)
                .acquire()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    cancel.cancel();
    let err = waiter.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(!client.is_locked("cx:a").unwrap());
    assert!(holder.is_held());
    holder.release().unwrap();
}

/// On a cluster, names with one hash tag share a slot: one script on that slot's primary
/// takes them all, and a busy one writes nothing there. Names of other slots go group by
/// group.
#[test]
fn names_of_one_cluster_slot_are_taken_in_one_script() {
    use crate::support::deploy::LocalCluster;

    let cluster = LocalCluster::start(3, 0);
    cluster.wait_until_ok(Duration::from_secs(30));
    let names = ["{acct}:1", "{acct}:2", "{acct}:3"];
    let primary = cluster.primary_of(redlease::key_slot(b"acct"));
    let client = Client::open(&cluster.url()).unwrap();
    cache_the_script(&client, ["{warm}:1", "{warm}:2"]);
    cache_the_script(&client, ["{acct}:warm", "{acct}:warm2"]);
    primary.cmd::<String>(&["CONFIG", "RESETSTAT"]);
    let all = client.lock_all(&names).try_acquire().unwrap();
    assert_eq!(primary.calls("evalsha"), 1, "one script for the slot");
    all.release().unwrap();

    let busy = client.lock("{acct}:2").try_acquire().unwrap();
    let before = primary.cmd::<i64>(&["DBSIZE"]);
    let err = client
        .lock_all(&["{acct}:1", "{acct}:3", "{acct}:2", "elsewhere"])
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert_eq!(primary.cmd::<i64>(&["DBSIZE"]), before, "nothing written");
    busy.release().unwrap();
    let all = client
        .lock_all(&["{acct}:1", "{acct}:3", "{acct}:2", "elsewhere"])
        .try_acquire()
        .unwrap();
    assert_eq!(all.fencing_tokens().len(), 4);
    all.release().unwrap();
}

/// A name taken alone while the caller waits for a later one is lost (its key deleted:
/// eviction, an operator, a failover). The acquire notices (the held name is no longer the
/// caller's), gives it back and takes it again: the lock it returns is held, and that loss,
/// the acquire's own business, is told to nobody.
#[test]
fn a_name_lost_and_taken_again_while_waiting_leaves_the_lock_taken_held() {
    let server = RedisServer::start();
    let client = Arc::new(Client::open(&server.url()).unwrap());
    let on_a = client.lock("hp:a").try_acquire().unwrap();
    let on_b = client.lock("hp:b").try_acquire().unwrap();
    let told = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (client, told) = (client.clone(), told.clone());
        std::thread::spawn(move || {
            client
                .lock_all(&["hp:a", "hp:b"])
                .ttl(Duration::from_millis(600))
                .on_lost(move |name, reason| {
                    eprintln!("on_lost({name}, {reason}) called during the acquire");
                    told.fetch_add(1, Ordering::SeqCst);
                })
                .acquire_timeout(Duration::from_secs(20))
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // hp:a goes to the waiter (taken alone); it then waits for hp:b, holding hp:a.
    on_a.release().unwrap();
    assert!(eventually(Duration::from_secs(5), || server
        .get("hp:a")
        .is_some()));
    std::thread::sleep(Duration::from_millis(100));
    // hp:a's key goes away while the waiter holds it alone: its renewal finds it lost.
    server.cmd::<i64>(&["DEL", "hp:a"]);
    std::thread::sleep(Duration::from_millis(800));
    on_b.release().unwrap();
    let all = waiter
        .join()
        .unwrap()
        .expect("both names are taken in the end");
    // The names really are the caller's now ...
    assert_eq!(
        server.get("hp:a").as_deref(),
        Some(all.guard("hp:a").unwrap().token())
    );
    assert_eq!(
        server.get("hp:b").as_deref(),
        Some(all.guard("hp:b").unwrap().token())
    );
    // ... yet the guard says otherwise.
    let report = format!(
        "is_held={} lost_reason={:?} on_lost calls={}",
        all.is_held(),
        all.lost_reason(),
        told.load(Ordering::SeqCst)
    );
    let released = all.release();
    assert!(
        !report.contains("is_held=false") && released.is_ok() && told.load(Ordering::SeqCst) == 0,
        "a lock just taken is not lost: {report}; release: {released:?}"
    );
}

/// lock_all callers over random subsets, mixed with single-name waiters and try-lockers on
/// the same names: no name ever has two holders, nobody deadlocks.
#[test]
fn mixed_group_and_single_callers_never_overlap_nor_deadlock() {
    use crate::support::Rng;
    let server = RedisServer::start();
    let url = server.url();
    const NAMES: [&str; 4] = ["mx:a", "mx:b", "mx:c", "mx:d"];
    let inside = Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut runs = Vec::new();
    for t in 0..5u64 {
        let (url, inside, overlaps, failures) = (
            url.clone(),
            inside.clone(),
            overlaps.clone(),
            failures.clone(),
        );
        runs.push(std::thread::spawn(move || {
            let client = Client::open(&url).unwrap();
            let mut rng = Rng::new(t + 7);
            let deadline = Instant::now() + Duration::from_secs(6);
            while Instant::now() < deadline {
                let mut set: Vec<usize> = (0..4).filter(|_| rng.below(2) == 0).collect();
                if t >= 3 || set.is_empty() {
                    set = vec![rng.below(4) as usize];
                }
                let names: Vec<&str> = set.iter().map(|i| NAMES[*i]).collect();
                let pause = rng.below(3);
                let enter = |inside: &[AtomicUsize; 4]| {
                    for i in &set {
                        if inside[*i].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(pause));
                    for i in &set {
                        inside[*i].fetch_sub(1, Ordering::SeqCst);
                    }
                };
                if t >= 3 {
                    let r = if rng.below(2) == 0 {
                        client.lock(names[0]).try_acquire()
                    } else {
                        client
                            .lock(names[0])
                            .acquire_timeout(Duration::from_millis(500))
                    };
                    if let Ok(g) = r {
                        enter(&inside);
                        g.release().unwrap();
                    }
                } else {
                    match client
                        .lock_all(&names)
                        .ttl(Duration::from_secs(2))
                        .acquire_timeout(Duration::from_secs(8))
                    {
                        Ok(g) => {
                            enter(&inside);
                            if let Err(e) = g.release() {
                                eprintln!("release {names:?}: {e}");
                                failures.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Err(e) => {
                            eprintln!("lock_all {names:?}: {e}");
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }));
    }
    for run in runs {
        run.join().unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders of one name"
    );
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "a lock_all that timed out"
    );
    for name in NAMES {
        assert!(server.get(name).is_none(), "{name} left held");
    }
}

/// Fencing tokens strictly increase per name across group and single acquires, also for two
/// names sharing one fencing counter (`ft` and `{ft}`) taken in one script.
#[test]
fn fencing_tokens_increase_across_group_and_single_acquires() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let names = ["ft", "{ft}", "ft:b"];
    let mut last = [0u64; 3];
    for round in 0..200 {
        if round % 3 == 0 {
            for (i, n) in names.iter().enumerate() {
                let g = client.lock(n).try_acquire().unwrap();
                assert!(
                    g.fencing_token() > last[i],
                    "{n}: {} after {}",
                    g.fencing_token(),
                    last[i]
                );
                last[i] = g.fencing_token();
                g.release().unwrap();
            }
        } else {
            let all = client.lock_all(&names).try_acquire().unwrap();
            let mut seen = std::collections::HashSet::new();
            for (i, n) in names.iter().enumerate() {
                let f = all.fencing_token(n).unwrap();
                assert!(f > last[i], "{n}: {f} after {}", last[i]);
                if i < 2 {
                    assert!(
                        seen.insert(f),
                        "one token for two names sharing a counter: {f}"
                    );
                }
                last[i] = f;
            }
            if round % 7 == 0 {
                // The counters lost (a restart without persistence).
                server.cmd::<i64>(&["DEL", "redlease:fence:{ft}", "redlease:fence:{ft:b}"]);
            }
            all.release().unwrap();
        }
    }
}

/// The most names, each of the longest key, in one script; then a busy last one.
#[test]
fn the_most_names_of_the_longest_keys_in_one_script() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let names: Vec<String> = (0..redlease::MAX_NAMES)
        .map(|i| format!("{i:04}{}", "x".repeat(1020)))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let started = Instant::now();
    let all = client.lock_all(&refs).try_acquire().unwrap();
    eprintln!("took {} names in {:?}", refs.len(), started.elapsed());
    assert_eq!(all.fencing_tokens().len(), refs.len());
    all.release().unwrap();
    let busy = client.lock(refs[1023]).try_acquire().unwrap();
    let started = Instant::now();
    let err = client
        .lock_all(&refs)
        .acquire_timeout(Duration::from_millis(500))
        .unwrap_err();
    eprintln!("busy after {:?}: {err}", started.elapsed());
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(started.elapsed() < Duration::from_secs(3));
    busy.release().unwrap();
    assert_eq!(
        server.cmd::<i64>(&["DBSIZE"]) as usize,
        1024,
        "only fencing counters left"
    );
}

/// The same when the server restarts (no persistence) while the caller holds one name
/// alone and waits for the next.
#[test]
fn a_restart_while_waiting_leaves_the_lock_taken_afterwards_held() {
    let mut server = RedisServer::start();
    let client = Arc::new(Client::open(&server.url()).unwrap());
    let on_a = client.lock("rs:a").try_acquire().unwrap();
    let on_b = client
        .lock("rs:b")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock_all(&["rs:a", "rs:b"])
                .ttl(Duration::from_millis(900))
                .acquire_timeout(Duration::from_secs(20))
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    on_a.release().unwrap();
    assert!(eventually(Duration::from_secs(5), || server
        .get("rs:a")
        .is_some()));
    std::thread::sleep(Duration::from_millis(100));
    server.restart();
    let all = waiter.join().unwrap().expect("both names in the end");
    drop(on_b);
    let a = all.guard("rs:a").unwrap().token().to_owned();
    let b = all.guard("rs:b").unwrap().token().to_owned();
    assert_eq!(server.get("rs:a"), Some(a), "rs:a is the caller's");
    assert_eq!(server.get("rs:b"), Some(b), "rs:b is the caller's");
    assert!(
        all.is_held() && all.lost_reason().is_none(),
        "both keys hold the caller's tokens: the lock is held, not lost ({:?})",
        all.lost_reason()
    );
}

/// Cancelled while the group script's reply is held back (the script ran): Cancelled,
/// and both names are free again soon (withdrawn in the background), not left for the ttl.
#[test]
fn a_cancel_while_the_group_reply_is_late_leaves_nothing_held() {
    use crate::support::proxy::{Action, Proxy};
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Arc::new(Client::open(&proxy.url()).unwrap());
    let holder = client.lock("cl:b").try_acquire().unwrap();
    cache_the_script(&client, ["warm:a", "warm:b"]);
    let cancel = redlease::CancelToken::new();
    let waiter = {
        let (client, cancel) = (client.clone(), cancel.clone());
        std::thread::spawn(move || {
            client
                .lock_all(&["cl:a", "cl:b"])
                .cancel_token(&cancel)
                .acquire()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // The next group script (after cl:b is released and taken alone) answers late.
    proxy.on_request(b"cl:a", 1, Action::DelayReply(Duration::from_millis(1500)));
    holder.release().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cancel.cancel();
    let started = Instant::now();
    let err = waiter.join().unwrap().unwrap_err();
    eprintln!("{err:?} after {:?}", started.elapsed());
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(
        eventually(Duration::from_secs(5), || server.get("cl:a").is_none()
            && server.get("cl:b").is_none()),
        "left held: a={:?} b={:?}",
        server.get("cl:a"),
        server.get("cl:b")
    );
}

/// On a Cluster the names are taken by slot, then by key (on one server, by key): a caller
/// that takes single locks in that documented order never waits in a circle with
/// `lock_all` on the same names, even where the order by key alone is the other way round.
#[test]
fn on_a_cluster_callers_following_the_documented_order_never_wait_in_a_circle() {
    use crate::support::deploy::LocalCluster;
    let cluster = LocalCluster::start(3, 0);
    cluster.wait_until_ok(Duration::from_secs(30));
    // x < y by key, but y's slot is lower: y comes first.
    let (x, y) = (0..1000)
        .map(|i| (format!("ord:a{i}"), format!("ord:b{i}")))
        .find(|(x, y)| redlease::key_slot(y.as_bytes()) < redlease::key_slot(x.as_bytes()))
        .unwrap();
    let client = Arc::new(Client::open(&cluster.url()).unwrap());
    for _ in 0..10 {
        let group = {
            let (client, x, y) = (client.clone(), x.clone(), y.clone());
            std::thread::spawn(move || {
                client
                    .lock_all(&[x.as_str(), y.as_str()])
                    .acquire_timeout(Duration::from_secs(10))
                    .map(|all| {
                        std::thread::sleep(Duration::from_millis(5));
                        all.release()
                    })
            })
        };
        let first = client
            .lock(&y)
            .acquire_timeout(Duration::from_secs(10))
            .expect("y first, as documented");
        let second = client
            .lock(&x)
            .acquire_timeout(Duration::from_secs(10))
            .expect("then x: never a circle");
        std::thread::sleep(Duration::from_millis(5));
        second.release().unwrap();
        first.release().unwrap();
        group.join().unwrap().expect("the group too").unwrap();
    }
}

/// `stats()` counts one acquisition per name a lock over several names takes, and one
/// failure per failed lock: a failure of a wait for one name alone is not counted twice.
/// Runs in a process of its own (this test binary, this test only), where no other test
/// moves the process-wide counters, so the counts are exact.
#[test]
fn stats_count_one_acquisition_per_name_and_each_failure_once() {
    const CHILD: &str = "REDLEASE_MULTI_STATS_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "multi::stats_count_one_acquisition_per_name_and_each_failure_once",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();

    let before = redlease::stats();
    let all = client
        .lock_all(&["sx:a", "sx:b", "sx:c"])
        .try_acquire()
        .unwrap();
    let d = redlease::stats().since(&before);
    assert_eq!((d.acquisitions, d.busy, d.waits), (3, 0, 0), "{d:?}");
    all.release().unwrap();

    // Busy at the end of a wait for one name alone: one busy end, one wait.
    let holder = client.lock("sx:b").try_acquire().unwrap();
    let before = redlease::stats();
    let err = client
        .lock_all(&["sx:a", "sx:b"])
        .acquire_timeout(Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    let d = redlease::stats().since(&before);
    assert_eq!((d.acquisitions, d.busy, d.waits), (0, 1, 1), "{d:?}");

    // A try that finds a name busy: one busy end.
    let before = redlease::stats();
    client
        .lock_all(&["sx:a", "sx:b"])
        .try_acquire()
        .unwrap_err();
    let d = redlease::stats().since(&before);
    assert_eq!((d.acquisitions, d.busy), (0, 1), "{d:?}");

    // A wait that gets sx:b alone, then both: one acquisition per name.
    let before = redlease::stats();
    let waiting = std::thread::spawn({
        let url = server.url();
        move || {
            let c = Client::open(&url).unwrap();
            c.lock_all(&["sx:a", "sx:b"])
                .acquire_timeout(Duration::from_secs(5))
                .unwrap()
                .release()
                .unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    holder.release().unwrap();
    waiting.join().unwrap();
    let d = redlease::stats().since(&before);
    assert_eq!((d.acquisitions, d.busy), (2, 0), "{d:?}");
}

/// A waiting lock over several names rides out what an ordinary waiter rides out: a reset
/// before its script ran, and a reply lost after it ran (withdrawn, then taken again under
/// fresh tokens).
#[test]
fn a_waiting_lock_all_rides_out_a_reset_and_a_lost_reply() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::open(&proxy.url()).unwrap();
    cache_the_script(&client, ["rr:warm", "rr:warm2"]);
    proxy.on_request(b"rr:a", 1, Action::ResetBeforeRequest);
    let all = client
        .lock_all(&["rr:a", "rr:b"])
        .acquire_timeout(Duration::from_secs(5))
        .expect("one reset is ridden out");
    all.release().unwrap();
    proxy.on_request(b"rr:a", 1, Action::ResetBeforeReply);
    let all = client
        .lock_all(&["rr:a", "rr:b"])
        .acquire()
        .expect("one lost reply is ridden out");
    for name in ["rr:a", "rr:b"] {
        assert_eq!(
            server.get(name).as_deref(),
            Some(all.guard(name).unwrap().token()),
            "{name} holds the token of the attempt that answered"
        );
    }
    all.release().unwrap();
    // A try rides nothing out.
    proxy.on_request(b"rr:a", 1, Action::ResetBeforeRequest);
    assert!(
        client
            .lock_all(&["rr:a", "rr:b"])
            .try_acquire()
            .unwrap_err()
            .is_unreachable()
    );
}

/// Without renewal, a name taken while the caller still waits for a later one runs out of
/// lease during the wait (here a Redlock client: every name is taken on its own). The lock
/// returned must hold every name, each for its ttl from the return, as a single lock holds
/// its name for its ttl from the acquire; and no other client may take a name meanwhile.
#[test]
fn without_renewal_every_name_is_held_for_its_ttl_when_the_lock_is_returned() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::redlock(&urls, redlease::ClientOptions::default()).unwrap();
    let other = Client::redlock(&urls, redlease::ClientOptions::default()).unwrap();
    let on_b = other.lock("nr:b").try_acquire().unwrap();
    let ttl = Duration::from_millis(400);
    let waiter = lock_all_unrenewed(&client, &["nr:a", "nr:b"], ttl);
    // The waiter takes nr:a, then waits for nr:b for three times nr:a's ttl.
    assert!(eventually(Duration::from_secs(5), || {
        servers[0].get("nr:a").is_some()
    }));
    std::thread::sleep(3 * ttl);
    on_b.release().unwrap();
    let all = waiter.join().unwrap().expect("both names in the end");
    let returned = Instant::now();
    for name in ["nr:a", "nr:b"] {
        let guard = all.guard(name).unwrap();
        let holding = servers
            .iter()
            .filter(|s| s.get(name).as_deref() == Some(guard.token()))
            .count();
        assert!(
            holding >= 2 && guard.is_held() && guard.remaining() > ttl / 2,
            "{name}: held on {holding} of 3, is_held {}, remaining {:?} ({:?} after the return)",
            guard.is_held(),
            guard.remaining(),
            returned.elapsed()
        );
    }
    all.release().unwrap();
}

/// One server: "ra:a" is taken alone while "ra:b" is waited for, and "ra:b" is freed when
/// "ra:a" has about 12 ms left on the server (less than its drift allowance: by the local
/// clock it is over). The last script finds "ra:a" still there; before the lock is
/// returned, "ra:a" gets its ttl again.
#[test]
fn without_renewal_a_name_taken_alone_before_the_last_script_is_extended() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let other = Client::open(&server.url()).unwrap();
    let ttl = Duration::from_secs(2);
    let on_a = other.lock("ra:a").try_acquire().unwrap();
    let on_b = other.lock("ra:b").try_acquire().unwrap();
    let waiter = lock_all_unrenewed(&client, &["ra:a", "ra:b"], ttl);
    hand_to_the_waiter(on_a, &server);
    loop {
        let left = server.pttl("ra:a");
        if left <= 12 {
            break;
        }
        std::thread::sleep(Duration::from_millis(if left > 100 {
            left as u64 - 80
        } else {
            1
        }));
    }
    on_b.release().unwrap();
    let all = waiter.join().unwrap().expect("both names in the end");
    for name in ["ra:a", "ra:b"] {
        let guard = all.guard(name).unwrap();
        assert!(
            guard.is_held() && guard.remaining() > ttl / 2 && server.pttl(name) > 1000,
            "{name}: is_held {}, remaining {:?}, PTTL {} ms",
            guard.is_held(),
            guard.remaining(),
            server.pttl(name)
        );
    }
    all.release().unwrap();
}

/// Cluster, names of two slots: "{a}x" (the first step), "{t}a" and "{t}b" (the last step,
/// one slot). "{t}a" is taken alone while "{t}b" is waited for, for three quarters of the
/// ttl: it is extended before the lock is returned, as "{a}x" is.
#[test]
fn without_renewal_on_a_cluster_a_name_of_the_last_slot_taken_alone_is_extended() {
    use crate::support::deploy::LocalCluster;
    let cluster = LocalCluster::start(3, 0);
    cluster.wait_until_ok(Duration::from_secs(30));
    assert!(redlease::key_slot(b"a") < redlease::key_slot(b"t"));
    let client = Client::open(&cluster.url()).unwrap();
    let other = Client::open(&cluster.url()).unwrap();
    let ttl = Duration::from_millis(1500);
    let on_a = other.lock("{t}a").try_acquire().unwrap();
    let on_b = other.lock("{t}b").try_acquire().unwrap();
    let node = cluster.primary_of(redlease::key_slot(b"t"));
    let waiter = lock_all_unrenewed(&client, &["{a}x", "{t}a", "{t}b"], ttl);
    hand_to_the_waiter(on_a, node);
    std::thread::sleep(ttl * 3 / 4);
    on_b.release().unwrap();
    let all = waiter.join().unwrap().expect("every name in the end");
    for name in ["{a}x", "{t}a", "{t}b"] {
        let left = all.guard(name).unwrap().remaining();
        assert!(
            left > ttl / 2,
            "{name}: returned with {left:?} of {ttl:?} left"
        );
    }
    all.release().unwrap();
}

/// Without renewal, a ttl shorter than taking the names takes: a try ends `Busy`, nothing
/// held, and a wait ends `Busy` when it is over (starting again, paused, in between).
#[test]
fn without_renewal_a_ttl_shorter_than_the_steps_ends_busy_holding_nothing() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::redlock(&urls, redlease::ClientOptions::default()).unwrap();
    let names: Vec<String> = (0..400).map(|i| format!("short:{i:03}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // Redlock takes one name a round: 400 rounds take far longer than 20 ms.
    let ttl = Duration::from_millis(20);
    let tried = client.lock_all(&names).ttl(ttl).renew(false).try_acquire();
    assert_eq!(tried.err().map(|e| e.kind()), Some(ErrorKind::Busy));
    let started = Instant::now();
    let waited = client
        .lock_all(&names)
        .ttl(ttl)
        .renew(false)
        .acquire_timeout(Duration::from_millis(500));
    assert_eq!(waited.err().map(|e| e.kind()), Some(ErrorKind::Busy));
    assert!(started.elapsed() < Duration::from_secs(10));
    let held = |server: &RedisServer| server.cmd::<Vec<String>>(&["KEYS", "short:*"]).len();
    for server in &servers {
        assert!(
            eventually(Duration::from_secs(2), || held(server) == 0),
            "names left held: {}",
            held(server)
        );
    }
}

/// Cluster, two names of two slots; the later one is held by another client and freed
/// 200 ms into the wait. The waiter's lease of it counts from the request that waited, so
/// it is run down as much as the first name: both are extended before the lock is
/// returned (with the freshest name as the measure, neither was).
#[test]
fn without_renewal_a_last_step_that_waited_is_extended_too() {
    use crate::support::deploy::LocalCluster;
    let cluster = LocalCluster::start(3, 0);
    cluster.wait_until_ok(Duration::from_secs(30));
    let client = Client::open(&cluster.url()).unwrap();
    let other = Client::open(&cluster.url()).unwrap();
    assert!(redlease::key_slot(b"a") < redlease::key_slot(b"t"));
    let on_late = other.lock("{t}late").try_acquire().unwrap();
    let ttl = Duration::from_millis(750);
    let waiter = lock_all_unrenewed(&client, &["{a}early", "{t}late"], ttl);
    let early_node = cluster.primary_of(redlease::key_slot(b"a"));
    assert!(eventually(Duration::from_secs(5), || early_node
        .get("{a}early")
        .is_some()));
    std::thread::sleep(Duration::from_millis(200));
    on_late.release().unwrap();
    let all = waiter.join().unwrap().expect("both names");
    for name in ["{a}early", "{t}late"] {
        let left = all.guard(name).unwrap().remaining();
        assert!(
            left > ttl * 8 / 10,
            "{name}: returned with {left:?} of {ttl:?}"
        );
    }
    assert!(early_node.pttl("{a}early") > 650);
    all.release().unwrap();
}

/// Redlock behind a 3 ms reply delay, a ttl of 30 s: the first name, taken a round trip
/// before the second, is not extended before the lock is returned (as many requests name
/// it without renewal as with it).
#[test]
fn without_renewal_a_name_taken_a_round_trip_before_is_not_extended() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.port)).collect();
    for proxy in &proxies {
        proxy.set_reply_delay(Duration::from_millis(3));
    }
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::redlock(&urls, redlease::ClientOptions::default()).unwrap();
    let ttl = Duration::from_secs(30);
    // Every script cached first: each request below is the call itself.
    let warm = client
        .lock("rt:warm")
        .ttl(ttl)
        .renew(false)
        .try_acquire()
        .unwrap();
    warm.extend(ttl).unwrap();
    warm.release().unwrap();
    let requests_naming_the_first = |renew: bool| {
        proxies[0].clear_requests();
        let all = client
            .lock_all(&["rt:a", "rt:b"])
            .ttl(ttl)
            .renew(renew)
            .try_acquire()
            .unwrap();
        let n = proxies[0].count_requests(b"rt:a");
        all.release().unwrap();
        n
    };
    let renewed = requests_naming_the_first(true);
    for _ in 0..3 {
        assert_eq!(requests_naming_the_first(false), renewed);
    }
}

/// A wait longer than the longest one name accepts is refused alike, nothing sent.
#[test]
fn a_wait_past_the_longest_is_refused_as_for_one_name() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    for wait in [Duration::from_millis((1 << 40) + 1), Duration::MAX] {
        let err = client
            .lock_all(&["wait-a", "wait-b"])
            .acquire_timeout(wait)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let one = client.lock("wait-a").acquire_timeout(wait).unwrap_err();
        assert_eq!(one.kind(), ErrorKind::InvalidArgument, "{one}");
    }
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 0);
}
