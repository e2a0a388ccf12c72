//! One lock over several names (`Client::lock_all`): all or none, without deadlock, each
//! name still exclusive with single-name locks, nothing held after a failure halfway, bad
//! input refused before anything is sent, one lost signal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlease::{Client, ErrorKind, LostReason};

use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, eventually};

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
    // The script that takes both names runs on the server but its reply never arrives.
    proxy.on_request(b"half:b", 1, Action::ResetBeforeReply);
    let err = client
        .lock_all(&["half:a", "half:b"])
        .try_acquire()
        .unwrap_err();
    assert!(
        err.outcome_unknown() || err.kind() == ErrorKind::Connection,
        "{err:?}"
    );
    let plain = Client::open(&server.url()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            !plain.is_locked("half:a").unwrap() && !plain.is_locked("half:b").unwrap()
        }),
        "both names are free again (given back or withdrawn)"
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
    let warm = client
        .lock_all(&["warm:a", "warm:b"])
        .try_acquire()
        .unwrap();
    warm.release().unwrap();
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
    let warm = client
        .lock_all(&["{warm}:1", "{warm}:2"])
        .try_acquire()
        .unwrap();
    warm.release().unwrap();
    let warm = client
        .lock_all(&["{acct}:warm", "{acct}:warm2"])
        .try_acquire()
        .unwrap();
    warm.release().unwrap();
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
