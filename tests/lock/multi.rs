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
    // set:a was taken first (key order), then given back; set:c never taken.
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
fn a_reply_lost_halfway_leaves_nothing_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::open(&proxy.url()).unwrap();
    // The acquire of the second name runs on the server but its reply never arrives.
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
    let first = "cl:a".to_owned();
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
