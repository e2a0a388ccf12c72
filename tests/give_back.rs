//! No attempt is ever sent under a token whose give-back (a release or a withdrawal) was
//! sent and not confirmed: a late give-back would delete the key a later attempt took
//! under the same token, and let a second holder in while the first still holds.
//! (Both double holders here were found by reading the code of version 0.2.)

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, LockGuard};
use support::RedisServer;
use support::proxy::{Action, Proxy};

/// Polls for `name` with `rival` for up to `limit`; when it gets the lock, `holder` must
/// no longer believe it holds it.
fn no_second_holder(rival: &Client, name: &str, holder: &LockGuard, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(second) = rival.lock(name).ttl(Duration::from_secs(5)).try_acquire() {
            assert!(
                !holder.is_held(),
                "two holders: the rival got {name:?} (token {}) while the first holder still \
                 believes it holds it ({:?} left, token {})",
                second.token(),
                holder.remaining(),
                holder.token()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A waiting acquire whose grant came with a short lease extends it (settle); the extend's
/// reply comes after the lease it set ended, so the grant is given back; that give-back is
/// held in the network past the I/O timeout. The waiter goes on: if it tried again under
/// the same token, it would take the (expired) key afresh, and the late give-back would
/// delete it under its feet.
#[test]
fn a_settle_give_back_that_lands_late_never_deletes_a_later_grant() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let options = ClientOptions::default()
        .owner_label("victim")
        .io_timeout(Duration::from_secs(1));
    let client = Client::with_options(&proxy.url(), options).unwrap();
    // Warm the script cache: the attack's requests must not be answered NOSCRIPT.
    let warm = client.lock("warm").try_acquire().unwrap();
    warm.extend(Duration::from_secs(5)).unwrap();
    warm.release().unwrap();
    // The attempt's reply 300 ms late (less than 2/3 of the 800 ms ttl left: settle
    // extends); the extend's reply 900 ms late (past the 800 ms it set, within the I/O
    // timeout); the give-back held 1.3 s (past the I/O timeout, so the waiter goes on, and
    // within the lease a new grant would get).
    let name = "settled";
    proxy.on_request(
        name.as_bytes(),
        1,
        Action::DelayReply(Duration::from_millis(300)),
    );
    proxy.on_request(
        name.as_bytes(),
        1,
        Action::DelayReply(Duration::from_millis(900)),
    );
    let give_back = proxy.on_request(
        name.as_bytes(),
        1,
        Action::DelayRequest(Duration::from_millis(1300)),
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let guard = client
            .lock(name)
            .ttl(Duration::from_millis(800))
            .renew(false)
            .acquire_timeout(Duration::from_secs(10));
        let _ = tx.send(guard);
    });
    let holder = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert_eq!(proxy.matched(give_back), 1, "the grant was not given back");
    let holder = holder.expect("the waiter gets the lock under a fresh token");
    let rival = Client::open(&server.url()).unwrap();
    no_second_holder(&rival, name, &holder, Duration::from_secs(2));
}

/// Redlock: an attempt that is not granted on a majority is given back on every member;
/// the give-back to one member is held in the network past its round. The retry must not
/// count that member's key as its vote: once the late give-back lands, the lock would be
/// held on a minority only while the waiter believes it holds it.
#[test]
fn a_redlock_retry_never_counts_a_member_whose_give_back_is_late() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxy = Proxy::start(servers[0].port);
    let urls = [proxy.url(), servers[1].url(), servers[2].url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let options = ClientOptions::default().io_timeout(Duration::from_secs(1));
    let client = Client::redlock(&urls, options.clone()).unwrap();
    let warm = client.lock("warm").try_acquire().unwrap();
    warm.release().unwrap();
    let name = "quorum";
    // Another owner holds the lock on the two members without a proxy.
    for server in &servers[1..] {
        server.cmd::<()>(&["SET", name, "someone-else", "PX", "60000"]);
    }
    // The first give-back to the proxied member is held 3 s (its round gives up after
    // ttl/10 = 1 s).
    let late = proxy.on_request(b"handoff", 1, Action::DelayRequest(Duration::from_secs(3)));
    let waiter = std::thread::spawn(move || {
        client
            .lock(name)
            .ttl(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(20))
            .map(|g| (Instant::now(), g))
    });
    assert!(support::eventually(Duration::from_secs(10), || proxy
        .matched(late)
        == 1));
    let held_back = Instant::now();
    // The other owner leaves one member: a majority there is the proxied member (whose
    // key still holds the first attempt's token until the give-back lands) and this one.
    servers[1].cmd::<()>(&["DEL", name]);
    let (_, holder) = support::within(Duration::from_secs(30), move || waiter.join().unwrap())
        .expect("the waiter gets the lock");
    // Past the late give-back, the other owner leaves the last member too.
    std::thread::sleep(
        (held_back + Duration::from_millis(3500)).saturating_duration_since(Instant::now()),
    );
    servers[2].cmd::<()>(&["DEL", name]);
    let rival = Client::redlock(&urls, options).unwrap();
    no_second_holder(&rival, name, &holder, Duration::from_secs(2));
}
