//! The backend seam: the one module that knows how a deployment is reached.
//!
//! The lock code asks a [`Backend`] to run a few calls (scripts and commands, pipelined on
//! one connection) on the server that owns a lock key, and gets the replies and the moment
//! the request went out. It never sees connections, pools or topology. The single server is
//! one implementation ([`single`]); Cluster and Sentinel are others.
//!
//! What every implementation promises:
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
pub(crate) mod cluster;
pub(crate) mod node;
pub(crate) mod redlock;
pub(crate) mod sentinel;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::cancel::Watch;
use crate::connection::{Connection, server_error};
use crate::error::{Error, ErrorKind, Result};
use crate::scripts::Lua;
use crate::url::{Addr, Target, Topology};

use self::cluster::Cluster;
use self::node::{Node, NodeFactory};
use self::redlock::Redlock;
use self::sentinel::Sentinel;

/// How late Redis may end a blocking command past its timeout: it checks blocked clients'
/// timeouts when its event loop wakes, at least every 1/hz s (100 ms at the default `hz 10`).
pub(crate) const BLOCK_LATENESS: Duration = Duration::from_millis(250);

/// One command of a request, packed once; cheap to clone (a renewal reuses its lock's).
#[derive(Clone)]
pub(crate) struct Call {
    packed: Arc<[u8]>,
    /// The script and its keys and arguments, to resend as `EVAL` after `NOSCRIPT`.
    script: Option<(&'static Lua, Arc<[Vec<u8>]>)>,
    /// A blocking command: how long the server may hold it.
    block: Option<Duration>,
}

impl Call {
    /// A plain command.
    pub fn cmd(cmd: &redis::Cmd) -> Call {
        Call {
            packed: cmd.get_packed_command().into(),
            script: None,
            block: None,
        }
    }

    /// A command the server holds up to `block` before it answers (`BLPOP`).
    pub fn blocking(cmd: &redis::Cmd, block: Duration) -> Call {
        Call {
            block: Some(block),
            ..Call::cmd(cmd)
        }
    }

    /// `EVALSHA` of `lua` with `keys`, then `args`.
    pub fn script(lua: &'static Lua, keys: &[&str], args: &[&dyn ScriptArg]) -> Call {
        let mut tail: Vec<Vec<u8>> = Vec::with_capacity(1 + keys.len() + args.len());
        tail.push(keys.len().to_string().into_bytes());
        tail.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
        tail.extend(args.iter().map(|a| a.bytes()));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&lua.sha).arg(&tail);
        Call {
            packed: cmd.get_packed_command().into(),
            script: Some((lua, tail.into())),
            block: None,
        }
    }

    /// The same call with a script as `EVAL`: it cannot be answered `NOSCRIPT`.
    pub fn evaluated(&self) -> Call {
        Call {
            packed: self.as_eval().into(),
            script: None,
            block: self.block,
        }
    }

    /// The same call as `EVAL` with the script's text (for `NOSCRIPT`).
    fn as_eval(&self) -> Vec<u8> {
        match &self.script {
            Some((lua, tail)) => redis::cmd("EVAL")
                .arg(&lua.code)
                .arg(&tail[..])
                .get_packed_command(),
            None => self.packed.to_vec(),
        }
    }
}

/// An argument of a script: a string or a number, as the bytes Redis receives.
pub(crate) trait ScriptArg {
    fn bytes(&self) -> Vec<u8>;
}

impl ScriptArg for &str {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl ScriptArg for String {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl ScriptArg for u64 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl ScriptArg for u8 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

/// Replica acknowledgement asked for a lock: `WAIT n timeout` after each write that may
/// grant or extend it, on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub count: u32,
    pub timeout: Duration,
}

impl Replicas {
    /// The `WAIT` call (its reply may take the timeout).
    pub fn call(&self) -> Call {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.count)
            .arg(self.timeout.as_millis().max(1) as u64);
        Call::blocking(&wait, self.timeout)
    }

    /// Fails with [`ErrorKind::Replication`] unless the `WAIT` reply counts enough replicas.
    pub fn check(&self, value: Option<Value>, doing: &str) -> Result<()> {
        let acked: i64 = reply(value.unwrap_or(Value::Nil))?;
        if acked >= i64::from(self.count) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Replication,
                format!(
                    "{doing}: {acked} of the {} replicas asked for acknowledged the write within {:?}",
                    self.count, self.timeout
                ),
            ))
        }
    }
}

/// Which connections a request may use (see [`crate::pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A caller's request; waits for a pooled connection until the given instant.
    Caller(Instant),
    /// A blocked wait; `Ok(None)` when every blocking connection is taken.
    Blocking,
    /// A release or an extend: never waits for a pooled connection.
    Urgent,
    /// A renewal: connections of its own, never waited for.
    Renewal,
}

/// How to run one request.
pub(crate) struct Exec<'a> {
    pub lane: Lane,
    /// Longest wait for each reply (a blocking call's reply gets its blocking time on top).
    pub io: Duration,
    /// Nothing (connecting, writing, reading) runs past this instant.
    pub cutoff: Option<Instant>,
    /// What may cancel the wait for the replies, and the pauses between tries.
    pub watch: &'a Watch,
    /// No refused request is tried again after this instant (a waiter's attempt before
    /// the end of its wait: the wait's deadline), on top of the usual window.
    pub retry_until: Option<Instant>,
}

/// The replies of a request, and when it was written: the server ran it after `sent_at`,
/// so a lease it set ends after `sent_at + ttl` (the conservative base of local deadlines).
pub(crate) struct Replies {
    pub values: Vec<Value>,
    pub sent_at: Instant,
}

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
    Redlock(Redlock),
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

    /// A Redlock deployment over `members` (each a single server or a Sentinel deployment).
    pub fn redlock(
        members: Vec<Backend>,
        io_timeout: Duration,
        pool_wait: Duration,
        connect_timeout: Duration,
    ) -> Backend {
        let describe = format!(
            "redlock({})",
            members
                .iter()
                .map(|m| m.describe.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Backend {
            deployment: Deployment::Redlock(Redlock::new(members)),
            io_timeout,
            pool_wait,
            connect_timeout,
            describe,
        }
    }

    /// The Redlock members, when this is a Redlock deployment: the lock code then runs the
    /// quorum protocol of [`crate::redlock`] instead of single requests.
    pub fn redlock_members(&self) -> Option<&Redlock> {
        match &self.deployment {
            Deployment::Redlock(r) => Some(r),
            _ => None,
        }
    }

    /// The node that owns `key` now (discovering or refreshing the topology within
    /// `deadline`). Not for Redlock deployments.
    pub fn node_for(&self, key: &str, deadline: Instant) -> Result<Arc<Node>> {
        match &self.deployment {
            Deployment::Single(node) => Ok(node.clone()),
            Deployment::Sentinel(sentinel) => sentinel.primary_node(deadline),
            Deployment::Cluster(cluster) => cluster.node_for_key(key, deadline),
            Deployment::Redlock(_) => Err(Error::new(
                ErrorKind::InvalidArgument,
                "a Redlock deployment has no single node for a key",
            )),
        }
    }

    /// `node` failed a request: stop using it until rediscovered (Sentinel).
    pub fn node_failed(&self, node: &Arc<Node>) {
        if let Deployment::Sentinel(sentinel) = &self.deployment {
            sentinel.forget(node);
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
            Deployment::Redlock(_) => Err(Error::new(
                ErrorKind::InvalidArgument,
                "this operation is not available on a Redlock client (only locks are)",
            )),
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

    /// Until when a Sentinel client may look for the primary and try it (at most four
    /// times): the whole cutoff, for Sentinels that do not answer may come first in the
    /// list, or one connect and one reply from now; never past `retry_until`.
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

    /// The URL with its password hidden.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Every key matching `pattern` (`SCAN ... MATCH`, never `KEYS`), on every primary of
    /// the deployment; at most `limit` keys. Bounded by one request's bounds per `SCAN` page.
    pub fn scan(&self, pattern: &str, limit: usize) -> Result<Vec<String>> {
        let nodes = match &self.deployment {
            Deployment::Single(node) => vec![node.clone()],
            Deployment::Sentinel(sentinel) => {
                vec![
                    sentinel
                        .primary_node(Instant::now() + self.connect_timeout + self.io_timeout)?,
                ]
            }
            Deployment::Cluster(cluster) => {
                cluster.primaries(Instant::now() + self.connect_timeout + self.io_timeout)?
            }
            Deployment::Redlock(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "listing locks is not available on a Redlock client",
                ));
            }
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
            Deployment::Redlock(redlock) => {
                for member in &redlock.members {
                    member.close_idle();
                }
            }
        }
    }

    /// The settings of an ordinary request on `lane`: each reply within the I/O timeout,
    /// a caller-lane checkout within the pool wait.
    pub fn exec_on(&self, lane: Lane) -> Exec<'static> {
        static NONE: std::sync::LazyLock<Watch> = std::sync::LazyLock::new(Watch::none);
        Exec {
            lane,
            io: self.io_timeout,
            cutoff: None,
            watch: &NONE,
            retry_until: None,
        }
    }

    /// The caller lane, waiting for a pooled connection up to the pool wait (cut to
    /// `until` when given).
    pub fn caller_lane(&self, until: Option<Instant>) -> Lane {
        let by = Instant::now() + self.pool_wait;
        Lane::Caller(until.map_or(by, |u| u.min(by)))
    }
}

/// A reply saying that a command did not run where it was sent, and where to go instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `MOVED slot host:port`: the slot lives on another node now.
    Moved(Addr),
    /// `ASK slot host:port`: this one key is being migrated; ask there, once, after `ASKING`.
    Ask(Addr),
    /// `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`: not now; the same node, later.
    Later,
    /// `READONLY`: a replica (a demoted primary); find the primary.
    ReadOnly,
}

impl Redirect {
    /// The redirect a reply stands for, if any. `from` is the node that answered (a
    /// redirect may leave the host empty, meaning that node's host).
    pub fn of(value: &Value, from: &Addr) -> Option<Redirect> {
        let Value::ServerError(e) = value else {
            return None;
        };
        let target = || {
            let text = e.details()?.split_whitespace().nth(1)?;
            let (host, port) = text.rsplit_once(':')?;
            let port = port.parse().ok()?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let host = match (host, from) {
                ("", Addr::Tcp { host, .. }) => host.clone(),
                _ => host.to_owned(),
            };
            Some(Addr::Tcp { host, port })
        };
        match e.code() {
            "MOVED" => target().map(Redirect::Moved),
            "ASK" => target().map(Redirect::Ask),
            "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN" => Some(Redirect::Later),
            "READONLY" => Some(Redirect::ReadOnly),
            _ => None,
        }
    }
}

/// The first reply that is a redirect, and where it is.
pub(crate) fn first_redirect(values: &[Value], from: &Addr) -> Option<(usize, Redirect)> {
    values
        .iter()
        .enumerate()
        .find_map(|(i, v)| Redirect::of(v, from).map(|r| (i, r)))
}

/// Replaces the replies from `from` on with `more` (the calls from there, sent again).
pub(crate) fn splice(mut replies: Replies, from: usize, more: Replies) -> Replies {
    replies.values.truncate(from);
    replies.values.extend(more.values);
    // The earlier send time stays: it is the conservative one.
    replies
}

/// Sleeps a little before trying a node that said "not now", never past `deadline`.
/// Errors: [`ErrorKind::Cancelled`] when `watch` ends the pause (nothing is in flight).
pub(crate) fn back_off(attempt: u32, deadline: Instant, watch: &Watch) -> Result<()> {
    let wait = Duration::from_millis(20 << attempt.min(4));
    let left = deadline.saturating_duration_since(Instant::now());
    crate::connection::pause(wait.min(left), watch)
}

/// Writes `calls` in one request on `conn` and reads their replies; resends from the first
/// script answered `NOSCRIPT`, as `EVAL`.
pub(crate) fn run_calls(conn: &mut Connection, calls: &[Call], how: &Exec<'_>) -> Result<Replies> {
    let sent_at = send_calls(conn, calls, how)?;
    finish_calls(conn, calls, sent_at, how)
}

/// The first half of [`run_calls`]: writes the request; returns when it was written.
pub(crate) fn send_calls(conn: &mut Connection, calls: &[Call], how: &Exec<'_>) -> Result<Instant> {
    let mut packed = Vec::with_capacity(calls.iter().map(|c| c.packed.len()).sum());
    for call in calls {
        packed.extend_from_slice(&call.packed);
    }
    let sent_at = Instant::now();
    let deadline = sent_at + how.io;
    conn.send(
        &packed,
        calls.len(),
        how.cutoff.map_or(deadline, |c| deadline.min(c)),
    )?;
    Ok(sent_at)
}

/// The second half of [`run_calls`]: reads the replies of a request written at `sent_at`.
pub(crate) fn finish_calls(
    conn: &mut Connection,
    calls: &[Call],
    sent_at: Instant,
    how: &Exec<'_>,
) -> Result<Replies> {
    let cut = |t: Instant| how.cutoff.map_or(t, |c| t.min(c));
    let mut values = read_replies(conn, calls, sent_at, how)?;
    if let Some(first) = values.iter().position(is_noscript) {
        let again = &calls[first..];
        let mut packed = Vec::new();
        for call in again {
            packed.extend_from_slice(&call.as_eval());
        }
        let resent_at = Instant::now();
        conn.send(&packed, again.len(), cut(resent_at + how.io))?;
        let more = read_replies(conn, again, resent_at, how)?;
        values.truncate(first);
        values.extend(more);
    }
    Ok(Replies { values, sent_at })
}

fn read_replies(
    conn: &mut Connection,
    calls: &[Call],
    sent_at: Instant,
    how: &Exec<'_>,
) -> Result<Vec<Value>> {
    let mut values = Vec::with_capacity(calls.len());
    let mut since = sent_at;
    for call in calls {
        let mut deadline = since + how.io;
        if let Some(block) = call.block {
            deadline += block + BLOCK_LATENESS;
        }
        if let Some(cutoff) = how.cutoff {
            deadline = deadline.min(cutoff);
        }
        values.push(conn.recv(deadline, how.watch)?);
        since = Instant::now();
    }
    Ok(values)
}

fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// The reply as `T`, or the server's error as [`ErrorKind::Server`].
pub(crate) fn reply<T: redis::FromRedisValue>(value: Value) -> Result<T> {
    if let Value::ServerError(e) = &value {
        return Err(server_error(e));
    }
    redis::from_redis_value(value)
        .map_err(|e| Error::new(ErrorKind::Server, format!("unexpected reply: {e}")).with_source(e))
}
