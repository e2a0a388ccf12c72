//! The transport under the lock protocol: how calls reach the server that owns a key.
//!
//! A [`Backend`] runs a few calls (scripts and commands, pipelined on one connection) on
//! the server that owns a lock key, and returns the replies and the moment the request went
//! out. It hides connections, pools and topology: a single server is one node, a Sentinel
//! deployment finds its primary, a Cluster routes by slot ([`redirect`] follows what they
//! answer). Redlock's independent primaries are several backends ([`members`]). The lock
//! protocol over them is [`crate::protocol`].
//!
//! What every backend promises:
//!
//! - Calls go out together in one write, on one connection, in order; the replies come
//!   back in order. A blocking call (`BLPOP`) holds the calls after it until it returns.
//! - A script answered `NOSCRIPT` did not run: it is sent again with `EVAL` (the calls after
//!   it are sent again too).
//! - Nothing is repeated once it may have run: a failure after the request was written is
//!   returned with [`crate::Error::outcome_unknown`] set. A request is retried only when it
//!   surely did not run (no connection could be made, or the server refused it without
//!   running it, such as `MOVED` or `READONLY`), and only within the call's bounds.
//! - Every step is bounded: waiting for a pooled connection by the caller's deadline,
//!   connecting by the connect timeout, each reply by the I/O timeout (plus the blocking
//!   time of a blocking call), and all of it by the optional cutoff.

pub(crate) mod batch;
pub(crate) mod call;
pub(crate) mod cluster;
pub(crate) mod exec;
pub(crate) mod members;
pub(crate) mod node;
pub(crate) mod redirect;
pub(crate) mod sentinel;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Call;
use crate::backend::cluster::Cluster;
use crate::backend::exec::{Exec, Replies};
use crate::backend::node::{Node, NodeFactory};
use crate::backend::sentinel::Sentinel;
use crate::backend::wire::reply;
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::url::{Target, Topology};

/// The deployment a client talks to, and the timeouts every request keeps.
pub(crate) struct Backend {
    deployment: Deployment,
    /// Longest wait for one reply.
    pub io_timeout: Duration,
    /// Longest wait for a pooled connection on the caller lane.
    pub pool_wait: Duration,
    /// Longest time to connect.
    pub connect_timeout: Duration,
    describe: String,
}

enum Deployment {
    Single(Arc<Node>),
    Sentinel(Sentinel),
    Cluster(Cluster),
}

impl Backend {
    /// The backend for `target`; no connection is made yet.
    pub fn open(
        target: &Target,
        factory: NodeFactory,
        io_timeout: Duration,
        pool_wait: Duration,
    ) -> Backend {
        let connect_timeout = factory.connect_timeout;
        let deployment = match &target.topology {
            Topology::Single(addr) => Deployment::Single(factory.node(addr)),
            Topology::Sentinel {
                sentinels,
                master,
                sentinel_login,
            } => Deployment::Sentinel(Sentinel::new(
                factory,
                sentinels.clone(),
                master.clone(),
                sentinel_login.clone(),
                io_timeout,
            )),
            Topology::Cluster(seeds) => {
                Deployment::Cluster(Cluster::new(factory, seeds.clone(), io_timeout))
            }
        };
        Backend {
            deployment,
            io_timeout,
            pool_wait,
            connect_timeout,
            describe: target.describe.clone(),
        }
    }

    /// The node that owns `key` now (discovering or refreshing the topology within
    /// `deadline`).
    pub fn node_for(&self, key: &str, deadline: Instant) -> Result<Arc<Node>> {
        match &self.deployment {
            Deployment::Single(node) => Ok(node.clone()),
            Deployment::Sentinel(sentinel) => sentinel.primary_node(deadline),
            Deployment::Cluster(cluster) => cluster.node_for_key(key, deadline),
        }
    }

    /// The node that owns `key` when that is known without asking anyone: a single
    /// server's, a Sentinel deployment's primary while it is trusted (named less than a
    /// second ago); `None` when [`node_for`](Self::node_for) would ask (Sentinels, a
    /// cluster's topology).
    pub fn known_node(&self, _key: &str) -> Option<Arc<Node>> {
        match &self.deployment {
            Deployment::Single(node) => Some(node.clone()),
            Deployment::Sentinel(sentinel) => sentinel.trusted_primary(),
            Deployment::Cluster(_) => None,
        }
    }

    /// `node` failed a request: stop using it until rediscovered (Sentinel).
    pub fn node_failed(&self, node: &Arc<Node>) {
        if let Deployment::Sentinel(sentinel) = &self.deployment {
            sentinel.forget_primary(node);
        }
    }

    /// Runs `calls` on the server that owns `key` (any server for an empty key).
    /// `Ok(None)` only on [`Lane::Blocking`] when no blocking connection is free.
    pub fn exec(&self, key: &str, calls: &[Call], how: &Exec<'_>) -> Result<Option<Replies>> {
        match &self.deployment {
            Deployment::Single(node) => node.exec(calls, how),
            Deployment::Sentinel(sentinel) => {
                sentinel.exec(calls, how, self.discovery_deadline(how))
            }
            Deployment::Cluster(cluster) => cluster.exec(key, calls, how, self.retry_deadline(how)),
        }
    }

    /// Until when a request refused without running (a failover, a moved slot) may be
    /// tried again: one connect and one reply from now, never past its cutoff. (A caller
    /// that may wait longer, a waiting acquire, tries the request again itself.)
    fn retry_deadline(&self, how: &Exec<'_>) -> Instant {
        let own = Instant::now() + self.connect_timeout + self.io_timeout;
        [how.cutoff, how.retry_until]
            .into_iter()
            .flatten()
            .fold(own, Instant::min)
    }

    /// Until when a Sentinel client may look for the primary and try it: the whole cutoff,
    /// for Sentinels that do not answer may come first in the list, or one connect and one
    /// reply from now; never past `retry_until`.
    fn discovery_deadline(&self, how: &Exec<'_>) -> Instant {
        let own = how
            .cutoff
            .unwrap_or_else(|| Instant::now() + self.connect_timeout + self.io_timeout);
        how.retry_until.map_or(own, |until| own.min(until))
    }

    /// As [`exec`](Self::exec) on a lane that always gets a connection.
    pub fn run(&self, key: &str, calls: &[Call], how: &Exec<'_>) -> Result<Replies> {
        self.exec(key, calls, how)?.ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "no connection on a lane that never lacks one",
            )
        })
    }

    /// Whether this is a Redis Cluster (a script's keys must share a slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.deployment, Deployment::Cluster(_))
    }

    /// The URL with its password hidden.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Every key matching `pattern` (`SCAN ... MATCH`, never `KEYS`), on every primary of
    /// the deployment; at most `limit` keys. Bounded by one request's bounds per `SCAN` page.
    pub fn scan(&self, pattern: &str, limit: usize) -> Result<Vec<String>> {
        let deadline = Instant::now() + self.connect_timeout + self.io_timeout;
        let nodes = match &self.deployment {
            Deployment::Single(node) => vec![node.clone()],
            Deployment::Sentinel(sentinel) => vec![sentinel.primary_node(deadline)?],
            Deployment::Cluster(cluster) => cluster.primaries(deadline)?,
        };
        let mut keys = Vec::new();
        for node in nodes {
            let mut cursor = "0".to_owned();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let how = self.exec_on(self.caller_lane(None));
                let replies = node.exec(&[Call::cmd(&cmd)], &how)?.ok_or_else(|| {
                    Error::new(ErrorKind::Internal, "no connection on the caller lane")
                })?;
                let value = replies.values.into_iter().next().unwrap_or(Value::Nil);
                let (next, page): (String, Vec<String>) = reply(value)?;
                keys.extend(page);
                if next == "0" || keys.len() >= limit {
                    break;
                }
                cursor = next;
            }
        }
        keys.truncate(limit);
        Ok(keys)
    }

    /// Closes idle connections (the client is closing; connections in use close when
    /// their requests end).
    pub fn close_idle(&self) {
        match &self.deployment {
            Deployment::Single(node) => node.close_idle(),
            Deployment::Sentinel(sentinel) => sentinel.close_idle(),
            Deployment::Cluster(cluster) => cluster.close_idle(),
        }
    }

    /// The settings of an ordinary request on `lane`: each reply within the I/O timeout.
    pub fn exec_on(&self, lane: Lane) -> Exec<'static> {
        Exec::new(lane, self.io_timeout)
    }

    /// The caller lane, waiting for a pooled connection up to the pool wait (cut to
    /// `until` when given).
    pub fn caller_lane(&self, until: Option<Instant>) -> Lane {
        let by = Instant::now() + self.pool_wait;
        Lane::Caller(until.map_or(by, |u| u.min(by)))
    }
}
