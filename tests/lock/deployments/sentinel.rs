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

/// Sentinel: after a failover the old primary takes writes until the Sentinels demote it
/// (here never: it cannot run `REPLICAOF`). A client that used it moves to the primary the
/// Sentinels name within a recheck, so it never holds a lock on the old primary that a
/// client of the new one is granted too. (Clients kept the old primary until it answered
/// `READONLY`: an auditor saw two holders of one lock for 20 s after a failover that lost
/// no write.)
#[test]
fn a_client_moves_to_the_primary_the_sentinels_name_while_the_old_one_takes_writes() {
    let deployment = SentinelDeployment::start_with(
        1,
        3,
        1000,
        &[
            "--rename-command",
            "REPLICAOF",
            "",
            "--rename-command",
            "SLAVEOF",
            "",
        ],
    );
    let client = quick(&deployment.url());
    client
        .lock("warm")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let old_port = deployment.primary_port();
    // A Sentinel that has not yet looked at the replica refuses (NOGOODSLAVE) for a while.
    let failover = eventually(Duration::from_secs(30), || {
        let mut conn = deployment.sentinels[0].conn();
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&deployment.master)
            .query::<String>(&mut conn)
            .is_ok()
    });
    assert!(failover, "no Sentinel failover started");
    let new_port = deployment.wait_for_failover(old_port, Duration::from_secs(30));
    let server = |port| deployment.servers.iter().find(|s| s.port == port).unwrap();
    let (old, new) = (server(old_port), server(new_port));
    let role = |s: &crate::support::RedisServer| {
        let role: Vec<redis::Value> = s.cmd(&["ROLE"]);
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
    };
    // The client moves once a majority of the Sentinels name the new primary: the others
    // learn it from the leader's hello messages (every 2 s); a loaded host adds to that.
    // Without the recheck it would never move (the old primary is never demoted).
    let moved_by = Instant::now() + redlease_recheck() + Duration::from_secs(8);
    let mut on_old = 0;
    loop {
        // The window this test is about: both say they are the primary.
        assert!(role(old) && role(new));
        let guard = client.lock("after").try_acquire().unwrap();
        let on_new = new.cmd::<bool>(&["EXISTS", "after"]);
        guard.release().unwrap();
        if on_new {
            break;
        }
        on_old += 1;
        assert!(
            Instant::now() < moved_by,
            "{on_old} locks taken on the old primary {old_port}; the Sentinels name {new_port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // From now on one lock, one holder: a fresh client (on the new primary) is refused.
    let held = client.lock("y").try_acquire().unwrap();
    let other = quick(&deployment.url());
    assert_eq!(
        other.lock("y").try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    assert!(!old.cmd::<bool>(&["EXISTS", "y"]));
    held.release().unwrap();
    eprintln!("{on_old} acquires went to the old primary before the client moved");
}

/// How long a Sentinel client trusts its primary without asking again (the library's
/// `RECHECK`).
fn redlease_recheck() -> Duration {
    Duration::from_secs(1)
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
