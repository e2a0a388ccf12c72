//! Attack: extends and renewals whose replies are lost or late.
//!
//! Documented (src/lock.rs `extend`): "The renewal thread, if any, renews with the new ttl
//! from then on", and "After a connection error or timeout the extend may or may not have
//! happened: the lease then never assumes more than the shorter of the old and the new ttl
//! again, for the rest of the lock's life". (Found by the attacker: the docs first said
//! "until a later extend succeeds", which the code rightly does not do: a late extend to
//! the shorter ttl can still run after a later one.)

mod support;

use std::time::Duration;

use redlease::{Client, ClientOptions};
use support::RedisServer;
use support::proxy::{Action, Proxy};

/// An extend whose reply is lost caps the lease at its ttl (src/lease.rs: `cap`) for the rest
/// of the lock's life, as documented: after a later `extend(30 s)` the holder still counts
/// on at most 1.1 s, and renewal keeps the key alive with the capped ttl.
#[test]
fn a_lost_extend_reply_caps_the_lease_for_the_rest_of_the_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("attacker")
        .io_timeout(Duration::from_millis(500));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    let guard = client
        .lock("cap")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let rule = proxy.on_request(b"1111", 1, Action::ResetBeforeReply);
    let err = guard.extend(Duration::from_millis(1111)).unwrap_err();
    assert!(err.outcome_unknown(), "{err}");
    assert_eq!(proxy.matched(rule), 1);
    // A later extend succeeds.
    guard.extend(Duration::from_secs(30)).unwrap();
    let remaining = guard.remaining();
    std::thread::sleep(Duration::from_millis(1500));
    let pttl: i64 = server.cmd(&["PTTL", "cap"]);
    let renewals = proxy.count_requests(b"1111");
    let held = guard.is_held();
    guard.release().unwrap();
    assert!(
        remaining <= Duration::from_millis(1111),
        "the guard counts on {remaining:?} after an extend(1111 ms) of unknown outcome"
    );
    assert!(held, "renewal with the capped ttl did not keep the lock");
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");
    assert!(renewals >= 1, "renewal did not use the capped ttl");
}

/// A renewal whose reply is late (the request ran at once; only the reply is held past the
/// lease's local deadline) marks the lock lost, and `extend` then answers `NotHeld`: a loss
/// is final, as `ErrorKind::NotHeld` now documents, even though the key still holds the
/// token for a moment. (Found by the attacker: the docs said only "the key no longer holds
/// this lock's token".)
#[test]
fn extend_after_a_loss_is_not_held_even_while_the_key_holds_the_token() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("attacker")
        .io_timeout(Duration::from_secs(1));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    let guard = client
        .lock("late")
        .ttl(Duration::from_millis(613))
        .try_acquire()
        .unwrap();
    // Load the extend script (a first EVALSHA would be answered NOSCRIPT).
    guard.extend(Duration::from_millis(613)).unwrap();
    // The renewals (~204 ms later, then their retries on their own) run on the server at
    // once; their replies come 700 ms later, after the local deadline (~605 ms).
    let rule = proxy.on_request(b"613", 100, Action::DelayReply(Duration::from_millis(700)));
    let lost = guard.lost();
    lost.recv_timeout(Duration::from_secs(3)).unwrap();
    assert!(proxy.matched(rule) >= 1);
    proxy.clear_rules();
    let key: Option<String> = server.cmd(&["GET", "late"]);
    let pttl: i64 = server.cmd(&["PTTL", "late"]);
    let extended = guard.extend(Duration::from_millis(613));
    let released = guard.release();
    assert!(
        matches!(&extended, Err(e) if e.kind() == redlease::ErrorKind::NotHeld),
        "extend after a loss answered {extended:?} (key {key:?}, {pttl} ms left)"
    );
    let _ = released;
}
