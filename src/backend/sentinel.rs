//! A primary found through Sentinels (`redis+sentinel://`).
//!
//! Discovery is ours rather than the redis crate's, whose sentinel support connects to the
//! nodes it discovers without a timeout (a stopped primary would hang it): each Sentinel is
//! asked `SENTINEL GET-MASTER-ADDR-BY-NAME`, and the address it names is checked with
//! `ROLE` before it is used, every step on a connection with the client's timeouts. The
//! primary is rediscovered when it answers `READONLY` (it was demoted) or cannot be
//! reached; a request refused without running is sent again to the new primary within the
//! request's bounds, never in a loop.
//!
//! A failover does not demote the old primary at once: it takes writes until the
//! Sentinels next look at it (seconds), and a client that kept using it would hold locks
//! there while others are granted them on the new primary. So the primary in use is
//! trusted for [`RECHECK`] at most: the first request after that asks the Sentinels
//! (within [`RECHECK_TIMEOUT`]) and moves to the primary a majority of them name, if that
//! one says it is a primary. Sentinels that do not answer in time leave the primary in use
//! as it is.
//!
//! The data nodes are logged in to with the URL's user and password; the Sentinels with
//! the `sentinel_user` / `sentinel_pass` query parameters (none by default). One connection
//! to each Sentinel is kept between questions.

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::backend::node::{Node, NodeFactory};
use crate::backend::redirect::{self, Redirect, Route};
use crate::backend::wire::{reply, run_calls};
use crate::connection::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::process;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{self, Arc, Mutex, MutexGuard};
use crate::url::{Addr, Login};

/// How long the primary in use is trusted without asking a Sentinel again.
const RECHECK: Duration = Duration::from_secs(1);
/// The longest a recheck may add to the request that makes it (less with a shorter I/O
/// timeout, or with less time left).
const RECHECK_TIMEOUT: Duration = Duration::from_millis(250);

pub(crate) struct Sentinel {
    factory: NodeFactory,
    sentinels: Vec<Addr>,
    master: String,
    sentinel_login: Login,
    io_timeout: Duration,
    /// The primary in use and when a Sentinel last named it; `None` until discovered, and
    /// after it failed.
    primary: Mutex<Option<(Arc<Node>, Instant)>>,
    /// Which Sentinel to ask first: discovery sets it to the one that answered, and each
    /// recheck moves it on by one.
    first: AtomicUsize,
    /// A connection to each Sentinel (by index), kept for the next question: a Sentinel
    /// is asked every [`RECHECK`] while locks are used, and a connection each time would
    /// cost a connect and a login. Taken out while in use; one that failed, timed out
    /// with its reply unread, or belongs to the parent of a forked child is not kept.
    kept: Vec<Mutex<Option<(u64, Connection)>>>,
}

impl Sentinel {
    pub fn new(
        factory: NodeFactory,
        sentinels: Vec<Addr>,
        master: String,
        sentinel_login: Login,
        io_timeout: Duration,
    ) -> Self {
        let kept = sentinels.iter().map(|_| Mutex::new(None)).collect();
        Sentinel {
            kept,
            factory,
            sentinels,
            master,
            sentinel_login,
            io_timeout,
            primary: Mutex::new(None),
            first: AtomicUsize::new(0),
        }
    }

    fn primary(&self) -> MutexGuard<'_, Option<(Arc<Node>, Instant)>> {
        sync::lock(&self.primary)
    }

    /// Runs `calls` on the primary, rediscovering it (until `deadline`) when it was demoted
    /// or cannot be reached (see [`redirect::follow`]).
    pub fn exec(
        &self,
        calls: &[Call],
        how: &Exec<'_>,
        deadline: Instant,
    ) -> Result<Option<Replies>> {
        redirect::follow(self, calls, how, deadline)
    }

    /// The primary in use while it is trusted without asking the Sentinels again (named
    /// less than [`RECHECK`] ago); `None` when [`primary_node`](Self::primary_node) would
    /// ask them.
    pub fn trusted_primary(&self) -> Option<Arc<Node>> {
        let primary = self.primary();
        let (node, named) = primary.as_ref()?;
        (Instant::now().saturating_duration_since(*named) < RECHECK).then(|| node.clone())
    }

    /// The primary's node, discovering it if needed.
    pub fn primary_node(&self, deadline: Instant) -> Result<Arc<Node>> {
        self.current(deadline)
    }

    /// The primary in use, discovering it if needed, and asking a Sentinel again whether
    /// it still is when it was last named [`RECHECK`] ago or more.
    fn current(&self, deadline: Instant) -> Result<Arc<Node>> {
        let now = Instant::now();
        let recheck = {
            let mut primary = self.primary();
            match primary.as_mut() {
                Some((node, named)) if now.saturating_duration_since(*named) < RECHECK => {
                    return Ok(node.clone());
                }
                Some((node, named)) => {
                    // This caller rechecks; the others go on with the primary meanwhile.
                    *named = now;
                    Some(node.clone())
                }
                None => None,
            }
        };
        if let Some(node) = recheck {
            return Ok(self.recheck(node, deadline));
        }
        let addr = self.discover(deadline)?;
        Ok(self.use_primary(&addr))
    }

    /// `addr` is the primary from now on.
    fn use_primary(&self, addr: &Addr) -> Arc<Node> {
        let mut primary = self.primary();
        match primary.as_mut() {
            Some((node, named)) if node.addr == *addr => {
                *named = Instant::now();
                node.clone()
            }
            _ => {
                let node = self.factory.node(addr);
                *primary = Some((node.clone(), Instant::now()));
                node
            }
        }
    }

    /// Asks the Sentinels whether `node` is still the primary: the primary to use, `node`
    /// unless a majority of the Sentinels listed name another one, which says it is a
    /// primary. One Sentinel is not believed alone: one cut off with the old primary would
    /// move a client back to it. Each recheck starts at the next Sentinel in turn, so one
    /// that keeps naming the old primary does not keep the client there. Takes
    /// [`RECHECK_TIMEOUT`] at most, and never more than a quarter of the time left before
    /// `deadline` (a renewal near its lease's end keeps the rest for itself).
    fn recheck(&self, node: Arc<Node>, deadline: Instant) -> Arc<Node> {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let by = now + RECHECK_TIMEOUT.min(self.io_timeout).min(left / 4);
        let n = self.sentinels.len();
        let majority = n / 2 + 1;
        let start = self.first.fetch_add(1, Ordering::Relaxed);
        let mut named: Option<(Addr, usize)> = None;
        let mut for_current = 0;
        for i in 0..n {
            if Instant::now() >= by {
                break;
            }
            let Ok(Some(addr)) = self.ask((start + i) % n, by) else {
                continue;
            };
            if addr == node.addr {
                for_current += 1;
                // The first answer names it (the common case: nothing changed), or too
                // many do for a majority to name another.
                if named.is_none() || n - for_current < majority {
                    return node;
                }
                continue;
            }
            let agreeing = match &mut named {
                Some((other, count)) if *other == addr => {
                    *count += 1;
                    *count
                }
                Some(_) => return node, // The Sentinels disagree: wait for them.
                None => {
                    named = Some((addr, 1));
                    1
                }
            };
            if agreeing >= majority {
                break;
            }
        }
        let Some((addr, agreeing)) = named else {
            return node;
        };
        if agreeing < majority || !matches!(self.is_primary(&addr, by), Ok(true)) {
            // Not a majority yet, not promoted yet, or not reachable in time.
            return node;
        }
        log::warn!(
            "the Sentinels name {addr} as the primary of {:?}, no longer {}; moving to it",
            self.master,
            node.addr
        );
        self.use_primary(&addr)
    }

    /// Stops using `node` (if it is still the one in use).
    pub fn forget_primary(&self, node: &Arc<Node>) {
        let mut primary = self.primary();
        if primary.as_ref().is_some_and(|(p, _)| Arc::ptr_eq(p, node)) {
            *primary = None;
        }
    }

    /// Asks the Sentinels, in turn, for the primary, and checks that it says it is one.
    fn discover(&self, deadline: Instant) -> Result<Addr> {
        let n = self.sentinels.len();
        let start = self.first.load(Ordering::Relaxed);
        let mut problems = Vec::new();
        for i in 0..n {
            if Instant::now() >= deadline {
                break;
            }
            let index = (start + i) % n;
            let sentinel = &self.sentinels[index];
            match self.ask(index, deadline) {
                Ok(Some(addr)) => match self.is_primary(&addr, deadline) {
                    Ok(true) => {
                        self.first.store(index, Ordering::Relaxed);
                        return Ok(addr);
                    }
                    Ok(false) => problems.push(format!("{sentinel} named {addr}, a replica")),
                    Err(e) => problems.push(format!("{sentinel} named {addr}: {e}")),
                },
                Ok(None) => {
                    problems.push(format!("{sentinel} does not know {:?}", self.master));
                }
                Err(e) => problems.push(format!("{sentinel}: {e}")),
            }
        }
        Err(Error::new(
            ErrorKind::Connection,
            format!(
                "no Sentinel named a reachable primary for {:?}: {}",
                self.master,
                if problems.is_empty() {
                    "no time left".to_owned()
                } else {
                    problems.join("; ")
                }
            ),
        ))
    }

    /// Sentinel `index`'s answer: the primary's address, or `None` when it does not know
    /// it. Asked on the connection kept for it, or a new one.
    fn ask(&self, index: usize, deadline: Instant) -> Result<Option<Addr>> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master);
        let generation = process::generation();
        let kept = sync::lock(&self.kept[index])
            .take()
            .filter(|(of, _)| *of == generation)
            .map(|(_, conn)| conn)
            .and_then(|mut conn| conn.is_usable().then_some(conn));
        let mut conn = match kept {
            Some(conn) => conn,
            None => self
                .factory
                .connector(&self.sentinels[index], &self.sentinel_login)
                .connect(deadline)?,
        };
        let how = Exec::new(Lane::Urgent, self.io_timeout).cutoff(Some(deadline));
        let replies = run_calls(&mut conn, &[Call::cmd(&cmd)], &how)?;
        let value = replies.values.into_iter().next().unwrap_or(Value::Nil);
        *sync::lock(&self.kept[index]) = Some((generation, conn));
        match reply::<Option<(String, u16)>>(value)? {
            Some((host, port)) => Ok(Some(Addr::Tcp { host, port })),
            None => Ok(None),
        }
    }

    /// Whether `addr` says it is a primary (`ROLE`).
    fn is_primary(&self, addr: &Addr, deadline: Instant) -> Result<bool> {
        let value = self.one_off(addr, &self.factory.login, &redis::cmd("ROLE"), deadline)?;
        let Value::Array(parts) = value else {
            return Err(Error::new(ErrorKind::Server, "unexpected reply to ROLE"));
        };
        let role: String = parts
            .into_iter()
            .next()
            .map(reply)
            .transpose()?
            .unwrap_or_default();
        Ok(role == "master")
    }

    /// One command on a connection of its own, within the timeouts and `deadline`.
    fn one_off(
        &self,
        addr: &Addr,
        login: &Login,
        cmd: &redis::Cmd,
        deadline: Instant,
    ) -> Result<Value> {
        let mut conn = self.factory.connector(addr, login).connect(deadline)?;
        let how = Exec::new(Lane::Urgent, self.io_timeout).cutoff(Some(deadline));
        let replies = run_calls(&mut conn, &[Call::cmd(cmd)], &how)?;
        Ok(replies.values.into_iter().next().unwrap_or(Value::Nil))
    }

    pub fn close_idle(&self) {
        if let Some((node, _)) = self.primary().as_ref() {
            node.close_idle();
        }
        for kept in &self.kept {
            sync::lock(kept).take();
        }
    }
}

impl Route for Sentinel {
    fn node(&self, deadline: Instant) -> Result<Arc<Node>> {
        self.current(deadline)
    }

    fn forget(&self, node: &Arc<Node>) {
        if self
            .primary()
            .as_ref()
            .is_some_and(|(p, _)| Arc::ptr_eq(p, node))
        {
            log::info!(
                "{} is no longer usable as the primary of {:?}; rediscovering",
                node.addr,
                self.master
            );
        }
        self.forget_primary(node);
    }

    /// A Sentinel deployment has no slots: a `MOVED` or `ASK` is an answer.
    fn redirected(&self, _redirect: &Redirect, _addr: &Addr) -> Option<Arc<Node>> {
        None
    }
}
