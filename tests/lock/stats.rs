//! `stats()`: the process-wide figures count acquisitions, busy ends, waits and their
//! durations, handoffs, lost locks by reason and unknown outcomes; `since` gives an
//! interval's. (Other tests of this binary run at the same time: counts only grow, so an
//! interval's are at least this test's.)

use std::time::Duration;

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::{RedisServer, eventually};

#[test]
fn stats_count_what_happened_to_acquires_and_locks() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let before = redlease::stats();

    let holder = client.lock("st").try_acquire().unwrap();
    let busy = client.lock("st").try_acquire().unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Busy);
    let waiter = std::thread::scope(|s| {
        let waiting = s.spawn(|| client.lock("st").acquire_timeout(Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(300));
        holder.release().unwrap(); // handed to the registered waiter
        waiting.join().unwrap().unwrap()
    });
    waiter.release().unwrap();

    let doomed = client
        .lock("st-lost")
        .ttl(Duration::from_millis(300))
        .try_acquire()
        .unwrap();
    let lost = doomed.lost();
    server.cmd::<i64>(&["DEL", "st-lost"]);
    assert!(lost.recv_timeout(Duration::from_secs(5)).is_ok());

    // An extend whose reply never comes: its outcome is unknown.
    let quick = ClientOptions::default().io_timeout(Duration::from_millis(200));
    let paused = Client::with_options(&server.url(), quick).unwrap();
    let guard = paused
        .lock("st-unknown")
        .renew(false)
        .try_acquire()
        .unwrap();
    server.pause();
    let extended = guard.extend(Duration::from_secs(10));
    server.resume();
    assert!(extended.unwrap_err().outcome_unknown());

    let d = redlease::stats().since(&before);
    assert!(d.acquisitions >= 4, "{d:?}");
    assert!(d.busy >= 1 && d.waits >= 1 && d.handoffs >= 1, "{d:?}");
    assert!(d.lost_not_held >= 1 && d.unknown_outcomes >= 1, "{d:?}");
    assert!(d.wait_quantile(0.5) <= d.max_wait && d.wait_quantile(1.0) <= d.max_wait);
    assert!(d.max_wait >= Duration::from_millis(250), "{d:?}");
    assert!(eventually(Duration::from_secs(2), || redlease::stats()
        .acquisitions
        >= before.acquisitions + 4));
    drop(doomed);
    drop(guard);
}
