//! Bad input is refused with `InvalidArgument` before anything is sent: empty and long
//! names, ttls out of range (the minimum named in the message), waits that overflow, URLs
//! and client options that make no sense. (Owners of reentrant locks: `kinds::reentrant`;
//! Redlock member lists: `deployments::redlock`; names that look like companion keys:
//! `keys`.)

use std::time::Duration;

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::{RedisServer, client};

#[test]
fn invalid_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let long = "k".repeat(redlease::MAX_KEY_LEN + 1);
    let cases: Vec<(&str, redlease::Result<redlease::LockGuard>)> = vec![
        ("empty name", client.lock("").try_acquire()),
        ("long name", client.lock(&long).try_acquire()),
        ("ttl 0", client.lock("k").ttl(Duration::ZERO).try_acquire()),
        (
            "ttl under 1 ms",
            client
                .lock("k")
                .ttl(Duration::from_micros(999))
                .try_acquire(),
        ),
        (
            "ttl too long",
            client.lock("k").ttl(Duration::MAX).try_acquire(),
        ),
        (
            "wait overflow",
            client.lock("k").acquire_timeout(Duration::MAX),
        ),
    ];
    for (what, result) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
    }
    let scripts_sent = server.calls("evalsha") + server.calls("eval") + server.calls("script|load");
    assert_eq!(scripts_sent, 0, "a rejected call sent a script");
    assert!(!server.cmd::<bool>(&["EXISTS", "k"]));

    let guard = client.lock("held").renew(false).try_acquire().unwrap();
    let sent = server.calls("evalsha");
    let err = guard.extend(Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        server.calls("evalsha"),
        sent,
        "a rejected extend sent a script"
    );
    assert!(guard.is_held(), "a rejected extend must not touch the lock");
    guard.release().unwrap();

    for url in [
        "",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:6379/notadb",
        "redis://",
        "redis://:pw@[::1",
    ] {
        let err = Client::open(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url:?}: {err}");
    }
    for options in [
        ClientOptions::default().io_timeout(Duration::ZERO),
        ClientOptions::default().connect_timeout(Duration::ZERO),
        ClientOptions::default().pool_size(0),
        ClientOptions::default().owner_label("has space"),
        ClientOptions::default().io_timeout(Duration::MAX),
    ] {
        let err = Client::with_options(&server.url(), options).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

/// Issue 9, item 13: ttls too short to be held are refused with the minimum in the message;
/// a pool wait of zero is valid; once a lock is lost, extend never succeeds again.
#[test]
fn short_ttls_zero_pool_wait_and_extend_after_a_loss() {
    let server = RedisServer::start();
    let client = Client::with_options(
        &server.url(),
        ClientOptions::default().pool_wait(Duration::ZERO),
    )
    .unwrap();
    for ms in [1, 2, 9] {
        let err = client
            .lock("tiny")
            .ttl(Duration::from_millis(ms))
            .try_acquire()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("10ms"), "{err}");
    }
    let shortest = client
        .lock("tiny")
        .ttl(redlease::MIN_TTL)
        .renew(false)
        .try_acquire()
        .unwrap();
    drop(shortest);
    // Lost by expiry (a fixed lease), then by a foreign delete (renewal on).
    let fixed = client
        .lock("lost-fixed")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(!fixed.is_held());
    assert_eq!(
        fixed.extend(Duration::from_secs(10)).unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let renewed = client
        .lock("lost-renewed")
        .ttl(Duration::from_millis(300))
        .try_acquire()
        .unwrap();
    let lost = renewed.lost();
    server.cmd::<()>(&["DEL", "lost-renewed"]);
    assert!(lost.recv_timeout(Duration::from_secs(2)).is_ok());
    server.cmd::<()>(&["SET", "lost-renewed", renewed.token()]);
    for _ in 0..20 {
        assert_eq!(
            renewed.extend(Duration::from_secs(10)).unwrap_err().kind(),
            ErrorKind::NotHeld,
            "extend succeeded after the loss"
        );
        assert!(!renewed.is_held());
    }
}
