//! Deployments of several servers, started by the test: a local Redis Cluster, and a
//! primary with replicas watched by Sentinels. Every process is the test's own and is
//! killed when the value is dropped.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisServer, eventually};

/// A local Redis Cluster: `primaries` primaries, each with `replicas` replicas.
pub struct LocalCluster {
    pub nodes: Vec<RedisServer>,
}

fn cli() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into())
}

impl LocalCluster {
    /// A cluster whose nodes time each other out after 1 s: quick failovers, and a quick
    /// return to `cluster_state:ok`.
    pub fn start(primaries: usize, replicas: usize) -> Self {
        Self::start_with_node_timeout(primaries, replicas, 1000)
    }

    /// A cluster whose nodes time each other out after `node_timeout_ms`. A test with
    /// replicas that is not about failovers wants several seconds: on a loaded host a
    /// stall of a second makes the nodes fail each other over, and a lock whose key had not
    /// reached the promoted replica is lost.
    pub fn start_with_node_timeout(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> Self {
        let node_timeout = node_timeout_ms.to_string();
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            // The cluster config file is relative to the node's own directory.
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &node_timeout,
                "--cluster-replica-validity-factor",
                "0",
            ]));
        }
        let mut create = Command::new(cli());
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let out = create
            .output()
            .expect("redis-cli must be installed (redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = LocalCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on the slots.
    pub fn wait_until_ok(&self, limit: Duration) {
        let ok = eventually(limit, || {
            self.nodes.iter().all(|n| {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            })
        });
        assert!(ok, "the cluster did not become ok");
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The node that serves `slot` as primary, by the view of the first reachable node.
    pub fn primary_of(&self, slot: u16) -> &RedisServer {
        let port = self.primary_port_of(slot);
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the slot's primary is one of ours")
    }

    fn primary_port_of(&self, slot: u16) -> u16 {
        let mut conn = self.nodes[0].conn();
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("CLUSTER SLOTS");
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(a)),
                Some(redis::Value::Int(b)),
                Some(redis::Value::Array(p)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*a..=*b).contains(&i64::from(slot)) {
                if let Some(redis::Value::Int(port)) = p.get(1) {
                    return *port as u16;
                }
            }
        }
        panic!("no primary for slot {slot}");
    }

    /// Starts moving `slot` from its primary to another primary (IMPORTING on the target,
    /// then MIGRATING on the source); returns the source and the target.
    pub fn start_migrating(&self, slot: u16) -> (&RedisServer, &RedisServer) {
        let source = self.primary_of(slot);
        let target = self
            .nodes
            .iter()
            .find(|n| n.port != source.port)
            .expect("another primary");
        let (source_id, target_id) = (Self::id(source), Self::id(target));
        let slot = slot.to_string();
        target.cmd::<()>(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        source.cmd::<()>(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
        (source, target)
    }

    /// Moves the keys of `slot` from `source` to `target` (`MIGRATE`); returns them.
    pub fn migrate_keys(source: &RedisServer, target: &RedisServer, slot: u16) -> Vec<String> {
        let keys: Vec<String> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
        assert!(!keys.is_empty(), "no keys in slot {slot}");
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(target.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let _: () = migrate.query(&mut source.conn()).expect("MIGRATE");
        keys
    }

    /// Ends the migration of `slot`: every node assigns it to `target`.
    pub fn finish_migrating(&self, slot: u16, target: &RedisServer) {
        let target_id = Self::id(target);
        for node in &self.nodes {
            node.cmd::<()>(&["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &target_id]);
        }
    }

    /// A replica of the node `primary` (by `CLUSTER REPLICAS`).
    pub fn replica_of(&self, primary: &RedisServer) -> &RedisServer {
        let id: String = primary.cmd(&["CLUSTER", "MYID"]);
        let replicas: Vec<String> = primary.cmd(&["CLUSTER", "REPLICAS", &id]);
        let line = replicas.first().expect("the primary has a replica");
        let port: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|a| a.split('@').next())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .expect("replica address");
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the replica is one of ours")
    }

    /// `CLUSTER MYID` of a node.
    pub fn id(node: &RedisServer) -> String {
        node.cmd(&["CLUSTER", "MYID"])
    }
}

/// A primary, its replicas, and Sentinels watching it as `master`.
pub struct SentinelDeployment {
    pub master: String,
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelDeployment {
    /// `replicas` replicas of one primary; `sentinels` Sentinels with quorum 2 (or 1 for a
    /// single Sentinel) and the given down-after time.
    pub fn start(replicas: usize, sentinels: usize, down_after_ms: u64) -> Self {
        Self::start_with(replicas, sentinels, down_after_ms, &[])
    }

    /// As [`start`](Self::start), the primary started with `primary_args` too.
    pub fn start_with(
        replicas: usize,
        sentinels: usize,
        down_after_ms: u64,
        primary_args: &[&str],
    ) -> Self {
        let master = "mymaster".to_owned();
        let primary = RedisServer::start_with(primary_args);
        let mut servers = vec![];
        let primary_port = primary.port.to_string();
        servers.push(primary);
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &primary_port,
            ]));
        }
        let quorum = if sentinels > 1 { 2 } else { 1 };
        let sentinels = (0..sentinels)
            .map(|_| RedisServer::start_sentinel(&master, servers[0].port, quorum, down_after_ms))
            .collect();
        let deployment = SentinelDeployment {
            master,
            servers,
            sentinels,
        };
        deployment.wait_for_replicas(Duration::from_secs(20));
        deployment
    }

    /// `redis+sentinel://` naming every Sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master)
    }

    /// Waits until the replicas are in sync and every Sentinel knows all of them.
    pub fn wait_for_replicas(&self, limit: Duration) {
        let replicas = self.servers.len() - 1;
        let ok = eventually(limit, || {
            let primary = self.primary();
            let info: String = primary.cmd(&["INFO", "replication"]);
            let synced = info.matches("state=online").count() >= replicas;
            synced
                && self.sentinels.iter().all(|s| {
                    let known: Vec<redis::Value> = s.cmd(&["SENTINEL", "REPLICAS", &self.master]);
                    known.len() >= replicas
                })
        });
        assert!(ok, "replicas or Sentinels not ready");
    }

    /// The server the Sentinels currently name as primary.
    pub fn primary(&self) -> &RedisServer {
        let port = self.primary_port();
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("the primary is one of ours")
    }

    pub fn primary_port(&self) -> u16 {
        for s in &self.sentinels {
            let mut conn = s.conn();
            let addr: redis::RedisResult<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master)
                .query(&mut conn);
            if let Ok((_, port)) = addr {
                return port;
            }
        }
        panic!("no Sentinel answered");
    }

    /// Waits until the Sentinels name a primary other than `old_port`, and it says it is one.
    pub fn wait_for_failover(&self, old_port: u16, limit: Duration) -> u16 {
        let start = Instant::now();
        loop {
            let port = self.primary_port();
            if port != old_port {
                let server = self.servers.iter().find(|s| s.port == port);
                if let Some(server) = server {
                    let role: Vec<redis::Value> = server.cmd(&["ROLE"]);
                    if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
                        return port;
                    }
                }
            }
            assert!(start.elapsed() < limit, "no failover within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
