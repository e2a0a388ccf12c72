//! Attack: lock names that share companion keys with another lock.
//!
//! `src/keys.rs` once wrapped a lock key `K` that has no hash tag and no `}` as `{K}` for its
//! companions (`redlease:queue:{K}`, ...), and used a key that already had a hash tag as
//! is. So the lock named `x` and the lock named `{x}` once got the very same companion keys
//! (`redlease:fence:{x}`, `redlease:wakeup:{x}`, `redlease:queue:{x}`, `redlease:grant:{x}`):
//! waiters of one were seen by releases of the other. The design says "No lock name may be
//! able to affect another lock"; these tests keep it so.

mod support;

use std::time::Duration;

use redlease::Client;
use support::{RedisServer, eventually, within};

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
