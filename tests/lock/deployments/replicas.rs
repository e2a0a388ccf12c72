//! Replica acknowledgement (`min_replicas`): an acquire waits for a replica to have the
//! key, or reports that none did, so a failover right after it cannot grant the lock twice.
//! (A re-entry asking for it: `kinds::reentrant`.)

use std::time::Duration;

use redlease::{Client, ErrorKind};

use crate::support::{self, RedisServer, eventually};

/// Replica acknowledgement: without `WAIT`, a failover right after an acquire can let a
/// second client in on the promoted replica (shown here); with `min_replicas(1, ..)` the
/// acquire is acknowledged (the promoted replica has the key) or reported, and no run of
/// 100 grants the lock twice.
#[test]
fn min_replicas_prevents_a_double_grant_after_a_failover() {
    let primary = RedisServer::start();
    // The replica replicates through a proxy, so the test can hold its replication back.
    let link = support::proxy::Proxy::start(primary.port);
    let replica = RedisServer::start();
    let follow = |r: &RedisServer| {
        r.cmd::<()>(&["REPLICAOF", "127.0.0.1", &link.port().to_string()]);
        assert!(eventually(Duration::from_secs(10), || {
            let info: String = r.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up")
        }));
    };
    follow(&replica);
    // Default timeouts: only a replication failure may fail these calls.
    let a = Client::open(&primary.url()).unwrap();
    let b = Client::open(&replica.url()).unwrap();

    // Without WAIT: the write is not yet on the replica when it is promoted.
    link.blackhole(true);
    let first = a.lock("no-wait").try_acquire().unwrap();
    replica.cmd::<()>(&["REPLICAOF", "NO", "ONE"]);
    let second = b.lock("no-wait").try_acquire();
    assert!(
        second.is_ok(),
        "expected the double grant WAIT exists to prevent"
    );
    drop(second);
    first.release().unwrap();
    link.blackhole(false);

    let mut acknowledged = 0;
    let mut reported = 0;
    for run in 0..100 {
        follow(&replica);
        let name = format!("wait-{run}");
        // Half the runs hold replication back, so that WAIT cannot be satisfied.
        link.blackhole(run % 2 == 1);
        let got = a
            .lock(&name)
            .min_replicas(1, Duration::from_millis(100))
            .try_acquire();
        replica.cmd::<()>(&["REPLICAOF", "NO", "ONE"]);
        let second = b.lock(&name).try_acquire();
        match got {
            Ok(guard) => {
                acknowledged += 1;
                assert!(second.is_err(), "run {run}: granted twice");
                drop(guard);
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Replication, "run {run}: {e}");
                reported += 1;
            }
        }
        drop(second);
        link.blackhole(false);
    }
    assert!(
        acknowledged > 0 && reported > 0,
        "{acknowledged} acknowledged, {reported} reported"
    );
}
