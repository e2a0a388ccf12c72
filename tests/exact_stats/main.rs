//! The process-wide statistics counted exactly. This binary holds one test, so nothing else
//! in its process acquires while it runs (the `lock` binary's `stats` module can only check
//! that counts grew: its tests run side by side).

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use redlease::{Client, ErrorKind};

use support::proxy::Proxy;
use support::{RedisServer, eventually};

/// Each acquire is counted once, as what it ended as: a success, or a busy ending, also
/// when the library had the lock on the server and gave it back before returning (a
/// re-entry answered after its lease ran out: see `kinds::reentrant` in the `lock` tests).
#[test]
fn each_acquire_is_counted_once_as_what_it_ended_as() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let direct = Client::open(&server.url()).unwrap();
    let late = Client::open(&proxy.url()).unwrap();
    let owner = "owner-of-a-counted-reentry";
    let ttl = Duration::from_millis(300);
    let before = redlease::stats();

    let first = direct
        .lock("counted")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    // Loads the scripts through the proxy while replies are on time.
    late.lock("warm-up")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let busy = late.lock("counted").try_acquire().unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Busy, "{busy}");
    let after_plain = redlease::stats().since(&before);
    let counts = |d: &redlease::Stats| (d.acquisitions, d.busy, d.cancelled, d.failed, d.waits);
    assert_eq!(counts(&after_plain), (2, 1, 0, 0, 0));

    proxy.set_reply_delay(2 * ttl);
    let reentry = late
        .lock("counted")
        .reentrant_as(owner)
        .ttl(ttl)
        .try_acquire();
    proxy.set_reply_delay(Duration::ZERO);
    let Err(e) = reentry else {
        panic!("a re-entry answered after its lease returned a guard");
    };
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(eventually(Duration::from_secs(5), || {
        late.inspect("counted").unwrap().reentrant == Some((owner.to_owned(), 1))
    }));
    first.release().unwrap();

    // Not three acquisitions and one busy ending: the re-entry is counted as it ended.
    assert_eq!(counts(&redlease::stats().since(&before)), (2, 2, 0, 0, 0));
}
