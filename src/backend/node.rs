//! One Redis server and its connections: the unit every deployment is made of (a single
//! server is one node; a Sentinel deployment uses the primary's node; a Cluster has one per
//! primary).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::batch::{Batcher, Conduit};
use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::backend::wire::{reply, run_calls};
use crate::connection::{Connection, Connector};
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::pool::{Pool, Pooled};
use crate::tls::TlsSetup;
use crate::url::{Addr, Login};

/// Longest the one-off eviction-policy probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// Idle connections the renewal pool keeps. Renewals of locks taken together come in
/// bursts; with too few idle connections each burst opens (and closes) new ones.
const RENEWAL_IDLE: usize = 64;

/// Makes the nodes of a deployment: every node shares the TLS setup, the login and the
/// pool settings of the client.
pub(crate) struct NodeFactory {
    pub tls: Arc<TlsSetup>,
    pub login: Login,
    pub connect_timeout: Duration,
    pub pool_size: usize,
    /// Whether connections ask the server's `run_id` (Redlock members: see
    /// [`crate::backend::members`]).
    pub identify: bool,
}

impl NodeFactory {
    pub fn node(&self, addr: &Addr) -> Arc<Node> {
        let connector = || {
            Connector::new(
                addr.clone(),
                self.tls.clone(),
                self.login.clone(),
                self.connect_timeout,
            )
            .identifying(self.identify)
        };
        Arc::new(Node {
            addr: addr.clone(),
            pool: Pool::new(connector(), self.pool_size, self.pool_size),
            renewal: Pool::new(connector(), usize::MAX, RENEWAL_IDLE),
            policy_checked: AtomicBool::new(false),
            batcher: Arc::default(),
        })
    }

    /// A one-off connection to `addr` with `login` (Sentinels, and checking a node's role).
    pub fn connector(&self, addr: &Addr, login: &Login) -> Connector {
        Connector::new(
            addr.clone(),
            self.tls.clone(),
            login.clone(),
            self.connect_timeout,
        )
    }
}

/// One server: a pool for callers, waiters and releases, and one for renewals.
pub(crate) struct Node {
    pub addr: Addr,
    pool: Pool,
    renewal: Pool,
    policy_checked: AtomicBool,
    /// Renewals pipelined on one connection (see [`crate::backend::batch`]).
    pub batcher: Arc<Batcher>,
}

impl Conduit for Node {
    fn run(&self, calls: &[Call], how: &Exec<'_>) -> Result<Replies> {
        let mut pooled = self.checkout(how)?.ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "no connection on a lane that never lacks one",
            )
        })?;
        run_calls(pooled.conn(), calls, how)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.batcher.close();
    }
}

impl Node {
    /// Runs `calls` on this node (see [`crate::backend`]). `Ok(None)` on the blocking lane
    /// when all its connections are taken.
    pub fn exec(&self, calls: &[Call], how: &Exec<'_>) -> Result<Option<Replies>> {
        let Some(mut pooled) = self.checkout(how)? else {
            return Ok(None);
        };
        let replies = run_calls(pooled.conn(), calls, how)
            .map_err(|e| e.context(&format!("talking to {}", self.addr)))?;
        if !self.policy_checked.swap(true, Ordering::Relaxed) {
            // Once, after a request went through (so that a probe of a server that does not
            // answer never eats into a caller's bounds): a short one on the same connection.
            let probe = Exec::new(how.lane, how.io)
                .cutoff(Some(Instant::now() + PROBE_TIMEOUT.min(how.io)));
            check_eviction_policy(pooled.conn(), &self.addr.to_string(), &probe);
        }
        Ok(Some(replies))
    }

    /// A connection on `how.lane` (connecting by the cutoff, or within the connect
    /// timeout). `Ok(None)` on the blocking lane when all its connections are taken.
    pub fn checkout(&self, how: &Exec<'_>) -> Result<Option<Pooled<'_>>> {
        let pool = self.pool_of(how.lane);
        let connect_by = how
            .cutoff
            .unwrap_or_else(|| Instant::now() + pool.connector.connect_timeout);
        pool.checkout(how.lane, connect_by)
    }

    /// An idle connection on `lane`, not looked at yet (see [`Pool::checkout_idle`]);
    /// `Ok(None)` when none is at hand. Never connects.
    pub fn checkout_idle(&self, lane: Lane) -> Result<Option<Pooled<'_>>> {
        self.pool_of(lane).checkout_idle(lane)
    }

    fn pool_of(&self, lane: Lane) -> &Pool {
        match lane {
            Lane::Renewal => &self.renewal,
            Lane::Caller(_) | Lane::Blocking | Lane::Urgent => &self.pool,
        }
    }

    pub fn close_idle(&self) {
        self.pool.close_idle();
        self.renewal.close_idle();
    }
}

/// Warns once when the server may evict lock keys: every `maxmemory-policy` but
/// `noeviction` can delete a held lock under memory pressure (the `volatile-*` ones pick
/// among keys with an expiry, which every lock key has). Skipped silently when `CONFIG` is
/// not permitted (ACL, a managed service).
pub(crate) fn check_eviction_policy(conn: &mut Connection, describe: &str, how: &Exec<'_>) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let Ok(replies) = run_calls(conn, &[Call::cmd(&cmd)], how) else {
        return;
    };
    let Some(value) = replies.values.into_iter().next() else {
        return;
    };
    if let Ok(pair) = reply::<Vec<String>>(value) {
        if let Some(policy) = pair.get(1) {
            if policy != "noeviction" {
                log::warn!(
                    "{describe} has maxmemory-policy {policy}: under memory pressure Redis may \
                     evict a held lock's key and let a second holder in; a lock server needs \
                     maxmemory-policy noeviction"
                );
            }
        }
    }
}
