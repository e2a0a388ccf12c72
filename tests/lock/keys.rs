//! Keys: how a lock name becomes its key and its companion keys (fencing counter, queue,
//! wake-up list, pending grant, holds record). A key prefix and an owner label shape key
//! and token; companion keys hash to the lock key's Cluster slot, whatever the name; names
//! that look like companion keys are refused; and no lock name can affect another lock. The
//! design says "No lock name may be able to affect another lock": `src/keys.rs` once
//! wrapped a lock key `K` without a hash tag as `{K}` for its companions and used a key
//! that had one as is, so the locks `x` and `{x}` got the very same companion keys and
//! waiters of one were seen by releases of the other. They now share only the fencing
//! counter, by design (it keeps 0.1's name: see `upgrade`).

use std::time::Duration;

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::{RedisServer, client, eventually, grant_to_a_vanished_waiter, within};

#[test]
fn key_prefix_and_owner_label_shape_key_and_token() {
    let server = RedisServer::start();
    let options = ClientOptions::default()
        .key_prefix("app:")
        .owner_label("worker-7");
    let client = Client::with_options(&server.url(), options).unwrap();
    let guard = client.lock("job").try_acquire().unwrap();
    assert_eq!(guard.key(), "app:job");
    assert!(guard.token().ends_with(":worker-7"));
    let stored: String = server.cmd(&["GET", "app:job"]);
    assert_eq!(stored, guard.token());
}

/// Lock names whose companion keys are hard to keep in the lock key's slot.
const ADVERSARIAL_NAMES: &[&str] = &[
    "plain",
    "{user:42}:job",
    "{}",
    "{}x",
    "x{}y",
    "a}b",
    "}{",
    "a{b",
    "{{nested}}",
    "{a{b}c}",
    "{}{real}",
    "}",
    "{",
    "\u{0}\u{1}\u{7f}binary\u{ff}",
    "é{ü}",
];

#[test]
fn companion_keys_hash_to_the_lock_key_slot_on_a_real_cluster() {
    let server = RedisServer::start();
    let cluster_dir = tempfile::tempdir().unwrap();
    let conf = cluster_dir.path().join("nodes.conf");
    let cluster = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        conf.to_str().unwrap(),
    ]);
    let client = client(&server.url());
    let mut cluster_conn = cluster.conn();
    for name in ADVERSARIAL_NAMES {
        server.cmd::<()>(&["FLUSHALL"]);
        grant_to_a_vanished_waiter(&server, &client, name);
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            keys.len(),
            6,
            "lock, fence, wakeup, queue, grant, waiting for {name:?}: {keys:?}"
        );
        let lock_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name.as_bytes())
            .query(&mut cluster_conn)
            .unwrap();
        for key in keys {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut cluster_conn)
                .unwrap();
            assert_eq!(
                slot,
                lock_slot,
                "{name:?}: {}",
                String::from_utf8_lossy(&key)
            );
            assert_eq!(slot, i64::from(redlease::key_slot(&key)));
        }
    }
}

/// Issue 8, item 9: no lock name can touch another lock's companion keys.
#[test]
fn lock_names_cannot_collide_with_companion_keys() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let a = client.lock("a").try_acquire().unwrap();
    for name in [
        "redlease:fence:{a}",
        "redlease:queue:{a}",
        "redlease:anything",
    ] {
        let err = client.lock(name).try_acquire().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name}: {err}");
    }
    a.release().unwrap();
    let again = client.lock("a").try_acquire().unwrap();
    again.release().unwrap();
    let err = Client::with_options(
        &server.url(),
        ClientOptions::default().key_prefix("redlease:"),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A waiter on lock `{x}` must not make a release of lock `x` hand `x` to nobody (when the
/// two shared their companion keys, `x` stayed held by a handoff token, refusing redlease
/// and plain `SET NX` clients, although nobody waited for it).
#[test]
fn a_waiter_on_a_braced_name_never_blocks_the_plain_name() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();

    // Lock "{x}" is held; a waiter waits for it (registered in redlease:queue:{x}).
    let braced = client.lock("{x}").try_acquire().unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock("{x}")
                .acquire_timeout(Duration::from_secs(6))
                .map(|g| g.fencing_token())
        })
    };
    // Blocked on the server (so registered).
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));

    // An unrelated lock "x": taken and released, nobody ever waits for it.
    let plain = client.lock("x").try_acquire().unwrap();
    plain.release().unwrap();

    // "x" must be free now.
    let value: Option<String> = server.cmd(&["GET", "x"]);
    let foreign_set: Option<String> =
        server.cmd(&["SET", "x", "foreign-token", "NX", "PX", "10000"]);
    // Clean up before asserting.
    drop(braced);
    let _ = within(Duration::from_secs(10), move || waiter.join().unwrap());
    assert!(
        value.is_none(),
        "lock \"x\" was released with nobody waiting for it, yet its key holds {value:?} \
         (a handoff to a waiter of lock \"{{x}}\")"
    );
    assert!(
        foreign_set.is_some(),
        "a plain SET NX client is refused lock \"x\""
    );
}

/// The other direction: a release of `{x}` with its own waiter, while lock `x` is held and
/// has a waiter too. Each release must wake a waiter of its own lock (when the wake-ups and
/// grants of the two locks were one list and one grant key, a release of one lock could
/// overwrite the pending grant of the other and leave that lock held by a handoff token
/// nobody could take).
#[test]
fn grants_of_two_locks_never_overwrite_each_other() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let a = client.lock("x").try_acquire().unwrap();
    let b = client.lock("{x}").try_acquire().unwrap();
    // Fake a registration that has not lapsed (a waiter of either lock that is busy
    // between two attempts); its score is far in the future.
    let far = (u64::MAX >> 12).to_string();
    server.cmd::<()>(&["ZADD", "redlease:queue:{x}", &far, "someone"]);
    server.cmd::<()>(&["SET", "redlease:waiting:{x}", "1", "PX", "60000"]);
    a.release().unwrap();
    let x_holds: String = server.cmd(&["GET", "x"]);
    assert!(x_holds.ends_with(":handoff"), "{x_holds}");
    b.release().unwrap();
    let grant: String = server.cmd(&["GET", "redlease:grant:{x}"]);
    // The grant of "x" was overwritten by the release of "{x}".
    let x_now: String = server.cmd(&["GET", "x"]);
    assert_eq!(
        grant, x_now,
        "lock \"x\" holds the handoff {x_now} but the (shared) grant key names {grant}: \
         the release of lock \"{{x}}\" orphaned the grant of lock \"x\""
    );
}

/// The fencing counter is the one companion key the two names still share, by design: it
/// keeps redlease 0.1's name so both versions draw from it during an upgrade. Sharing is
/// harmless: each name's tokens still strictly increase.
#[test]
fn braced_and_plain_names_share_only_an_increasing_fencing_counter() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let mut last = 0;
    for name in ["x", "{x}", "x", "{x}"] {
        let guard = client.lock(name).try_acquire().unwrap();
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().unwrap();
    }
    let counters: Vec<String> = server.cmd(&["KEYS", "redlease:fence:*"]);
    assert_eq!(counters, vec!["redlease:fence:{x}".to_owned()]);
}

/// What the shared counter changes: `adopt` and `inspect` read the counter, so for one of
/// the two names they report the last token either drew, which may be the other name's.
/// Fencing stays sound: that token is above every token of an earlier acquisition of
/// either name and below every later one.
#[test]
fn adopt_and_inspect_of_one_name_report_the_shared_counters_last_token() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let plain = client
        .lock("y")
        .renew(false)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let braced = client.lock("{y}").try_acquire().unwrap();
    let last = braced.fencing_token();
    assert!(last > plain.fencing_token());
    let adopted = client.adopt("y", plain.token()).unwrap();
    assert_eq!(adopted.fencing_token(), last);
    let info = client.inspect("y").unwrap();
    assert_eq!(info.fencing_token, Some(last));
    adopted.abandon();
    plain.release().unwrap();
    braced.release().unwrap();
    let next = client.lock("y").try_acquire().unwrap();
    assert!(next.fencing_token() > last);
}
