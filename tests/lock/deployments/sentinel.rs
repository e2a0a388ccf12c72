//! Sentinel: a failover moves clients to the new primary (a lock held across it is still
//! held or reported lost, never held by two; fencing tokens keep increasing), and silent
//! Sentinels listed first do not hide the one that answers.

use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use super::quick;
use crate::support::deploy::SentinelDeployment;
use crate::support::eventually;
use crate::support::proxy::Proxy;

/// Sentinel: the primary is stopped until the Sentinels fail over; clients continue on the
/// new primary; a lock held across the failover is still held or reported lost, never held
/// by two; fencing tokens after the failover are above those before.
#[test]
fn a_sentinel_failover_moves_clients_to_the_new_primary() {
    let deployment = SentinelDeployment::start(2, 3, 1000);
    let client = quick(&deployment.url());
    let mut last_fence = 0;
    for _ in 0..20 {
        let guard = client.lock("before").try_acquire().unwrap();
        last_fence = last_fence.max(guard.fencing_token());
        guard.release().unwrap();
    }
    let held = client
        .lock("across")
        .ttl(Duration::from_secs(2))
        .acquire()
        .unwrap();
    let old_port = deployment.primary_port();
    deployment.primary().pause();
    let stopped = Instant::now();
    let new_port = deployment.wait_for_failover(old_port, Duration::from_secs(30));
    let failover_took = stopped.elapsed();
    // Clients continue on the new primary within the failover time and their bounds.
    let resumed = eventually(Duration::from_secs(10), || {
        client.lock("after").try_acquire().is_ok()
    });
    assert!(
        resumed,
        "no acquire succeeded on the new primary {new_port}"
    );
    let after = client.lock("before").try_acquire().unwrap();
    assert!(
        after.fencing_token() > last_fence,
        "fencing token {} after the failover, {last_fence} before",
        after.fencing_token()
    );
    after.release().unwrap();
    // The lock held across: still held with its key on the new primary, or lost. (Default
    // timeouts: this one must answer Busy, not time out on a loaded host.)
    let other = Client::open(&deployment.url()).unwrap();
    match other.lock("across").try_acquire() {
        Ok(second) => {
            assert!(
                !held.is_held(),
                "two holders: the first still believes it holds the lock"
            );
            second.release().unwrap();
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Busy, "{e}"),
    }
    eprintln!("failover took {failover_took:?}; old primary {old_port}, new {new_port}");
    deployment
        .servers
        .iter()
        .find(|s| s.port == old_port)
        .unwrap()
        .resume();
}

/// Sentinel: Sentinels that do not answer, listed first, cost their timeouts, and the one
/// that answers is still asked within the call's bounds. (The Sentinel client once shared
/// the Cluster's retry window of one connect and one I/O timeout, which two silent
/// Sentinels used up: every call failed though a Sentinel and the primary were healthy.)
#[test]
fn silent_sentinels_listed_first_do_not_hide_the_one_that_answers() {
    let deployment = SentinelDeployment::start(0, 1, 5000);
    let sentinel = &deployment.sentinels[0];
    let silent: Vec<Proxy> = (0..2).map(|_| Proxy::start(sentinel.port)).collect();
    for proxy in &silent {
        proxy.blackhole(true);
    }
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/{}",
        silent[0].port(),
        silent[1].port(),
        sentinel.port,
        deployment.master
    );
    let options = ClientOptions::default()
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    let client = Client::with_options(&url, options).unwrap();
    let guard = client.lock("found").try_acquire().unwrap();
    guard.release().unwrap();
}
