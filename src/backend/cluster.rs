//! A Redis Cluster (`redis+cluster://`): requests routed by slot, on connections of ours.
//!
//! The redis crate's sync cluster connection is not used: it retries up to 16 times by
//! default, sends a command again after an I/O timeout (a blind repeat of a script), sleeps
//! on `CLUSTERDOWN` without a deadline and sends `WAIT` to every primary. Here the slot map
//! comes from `CLUSTER SLOTS` (asked of a known node or a seed), every lock's keys share one
//! slot ([`crate::keys`]), and a request goes to that slot's primary on one connection (so a
//! `WAIT` after a script waits for that script's write). Redirections are followed: `MOVED`
//! updates the map (and a full refresh follows), `ASK` sends the calls once to the
//! migration's target, each after `ASKING` (scripts as `EVAL`: the target may not have them
//! cached), `TRYAGAIN` and `CLUSTERDOWN` wait a little and try again; each only for calls
//! that did not run, and only within the request's bounds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::backend::node::{Node, NodeFactory};
use crate::backend::redirect::{self, Redirect, Route};
use crate::backend::wire::run_calls;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::key_slot;
use crate::lane::Lane;
use crate::sync::{self, Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::url::Addr;

/// Number of hash slots.
const SLOTS: usize = 16384;
/// Shortest time between two full refreshes of the slot map.
const REFRESH_EVERY: Duration = Duration::from_millis(100);

pub(crate) struct Cluster {
    factory: NodeFactory,
    seeds: Vec<Addr>,
    io_timeout: Duration,
    map: RwLock<SlotMap>,
}

struct SlotMap {
    /// The primary of each slot, when known.
    slots: Vec<Option<Arc<Node>>>,
    /// Every node met, by address (their pools live as long as the client).
    nodes: HashMap<Addr, Arc<Node>>,
    /// A redirection showed the map out of date.
    stale: bool,
    refreshed: Option<Instant>,
}

impl Cluster {
    pub fn new(factory: NodeFactory, seeds: Vec<Addr>, io_timeout: Duration) -> Self {
        Cluster {
            factory,
            seeds,
            io_timeout,
            map: RwLock::new(SlotMap {
                slots: vec![None; SLOTS],
                nodes: HashMap::new(),
                stale: true,
                refreshed: None,
            }),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, SlotMap> {
        sync::read(&self.map)
    }

    fn write(&self) -> RwLockWriteGuard<'_, SlotMap> {
        sync::write(&self.map)
    }

    /// Runs `calls` on the primary of `key`'s slot (any node for an empty key), following
    /// redirections until `deadline` (see [`redirect::follow`]).
    pub fn exec(
        &self,
        key: &str,
        calls: &[Call],
        how: &Exec<'_>,
        deadline: Instant,
    ) -> Result<Option<Replies>> {
        let slot = (!key.is_empty()).then(|| usize::from(key_slot(key.as_bytes())));
        redirect::follow(
            &SlotRoute {
                cluster: self,
                slot,
            },
            calls,
            how,
            deadline,
        )
    }

    /// The primary of `key`'s slot.
    pub fn node_for_key(&self, key: &str, deadline: Instant) -> Result<Arc<Node>> {
        let slot = (!key.is_empty()).then(|| usize::from(key_slot(key.as_bytes())));
        self.node_for(slot, deadline)
    }

    /// Every primary that serves a slot (refreshing the map first).
    pub fn primaries(&self, deadline: Instant) -> Result<Vec<Arc<Node>>> {
        self.refresh(deadline)?;
        let map = self.read();
        let mut out: Vec<Arc<Node>> = Vec::new();
        for node in map.slots.iter().flatten() {
            if !out.iter().any(|n| Arc::ptr_eq(n, node)) {
                out.push(node.clone());
            }
        }
        Ok(out)
    }

    /// The primary of `slot` (any node for `None`), refreshing the map when it is stale or
    /// does not know the slot.
    fn node_for(&self, slot: Option<usize>, deadline: Instant) -> Result<Arc<Node>> {
        let lookup = |map: &SlotMap| match slot {
            Some(slot) => map.slots[slot].clone(),
            None => map.nodes.values().next().cloned(),
        };
        let (found, stale, recent) = {
            let map = self.read();
            let recent = map.refreshed.is_some_and(|t| t.elapsed() < REFRESH_EVERY);
            (lookup(&map), map.stale, recent)
        };
        if let Some(node) = &found {
            if !stale || recent {
                return Ok(node.clone());
            }
        }
        match self.refresh(deadline) {
            Ok(()) => {}
            Err(e) if found.is_none() => return Err(e),
            Err(e) => log::debug!("refreshing the cluster's slot map: {e}"),
        }
        lookup(&self.read()).or(found).ok_or_else(|| {
            Error::new(
                ErrorKind::Connection,
                format!("no node of the cluster serves slot {slot:?}"),
            )
        })
    }

    /// Reads the slot map from a known node or a seed (`CLUSTER SLOTS`).
    fn refresh(&self, deadline: Instant) -> Result<()> {
        let mut candidates: Vec<Addr> = self.read().nodes.keys().cloned().collect();
        candidates.extend(self.seeds.iter().cloned());
        candidates.dedup();
        let mut problems = Vec::new();
        for addr in candidates {
            if Instant::now() >= deadline {
                break;
            }
            match self.slots_from(&addr, deadline) {
                Ok(ranges) => {
                    let mut map = self.write();
                    let mut slots = vec![None; SLOTS];
                    for (start, end, primary) in ranges {
                        let node = node_at(&mut map, &self.factory, &primary);
                        for slot in slots.iter_mut().take(end + 1).skip(start) {
                            *slot = Some(node.clone());
                        }
                    }
                    map.slots = slots;
                    map.stale = false;
                    map.refreshed = Some(Instant::now());
                    return Ok(());
                }
                Err(e) => problems.push(format!("{addr}: {e}")),
            }
        }
        self.write().refreshed = Some(Instant::now());
        Err(Error::new(
            ErrorKind::Connection,
            format!(
                "no node of the cluster answered CLUSTER SLOTS: {}",
                problems.join("; ")
            ),
        ))
    }

    /// `CLUSTER SLOTS` of one node: `(first slot, last slot, primary)` ranges.
    fn slots_from(&self, addr: &Addr, deadline: Instant) -> Result<Vec<(usize, usize, Addr)>> {
        let mut conn = self
            .factory
            .connector(addr, &self.factory.login)
            .connect(deadline)?;
        let how = Exec::new(Lane::Urgent, self.io_timeout).cutoff(Some(deadline));
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let replies = run_calls(&mut conn, &[Call::cmd(&cmd)], &how)?;
        let bad = || Error::new(ErrorKind::Server, "unexpected reply to CLUSTER SLOTS");
        let Some(Value::Array(ranges)) = replies.values.into_iter().next() else {
            return Err(bad());
        };
        let mut out = Vec::new();
        for range in ranges {
            let Value::Array(parts) = range else {
                return Err(bad());
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return Err(bad());
            };
            let host = match primary.first() {
                Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                Some(Value::SimpleString(h)) => h.clone(),
                _ => return Err(bad()),
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                return Err(bad());
            };
            // An empty host means "the host you asked".
            let host = match (host.as_str(), addr) {
                ("", Addr::Tcp { host, .. }) | ("?", Addr::Tcp { host, .. }) => host.clone(),
                _ => host,
            };
            let (start, end) = (*start as usize, *end as usize);
            if start > end || end >= SLOTS {
                return Err(bad());
            }
            out.push((
                start,
                end,
                Addr::Tcp {
                    host,
                    port: *port as u16,
                },
            ));
        }
        Ok(out)
    }

    pub fn close_idle(&self) {
        for node in self.read().nodes.values() {
            node.close_idle();
        }
    }
}

/// How one request on one slot is routed.
struct SlotRoute<'a> {
    cluster: &'a Cluster,
    slot: Option<usize>,
}

impl Route for SlotRoute<'_> {
    fn node(&self, deadline: Instant) -> Result<Arc<Node>> {
        self.cluster.node_for(self.slot, deadline)
    }

    fn forget(&self, _node: &Arc<Node>) {
        self.cluster.write().stale = true;
    }

    fn redirected(&self, redirect: &Redirect, addr: &Addr) -> Option<Arc<Node>> {
        let mut map = self.cluster.write();
        let node = node_at(&mut map, &self.cluster.factory, addr);
        if let Redirect::Moved(_) = redirect {
            log::debug!("slot {:?} moved to {addr}", self.slot);
            if let Some(slot) = self.slot {
                map.slots[slot] = Some(node.clone());
            }
            map.stale = true;
        }
        Some(node)
    }
}

/// The node at `addr`, made on first use.
fn node_at(map: &mut SlotMap, factory: &NodeFactory, addr: &Addr) -> Arc<Node> {
    map.nodes
        .entry(addr.clone())
        .or_insert_with(|| factory.node(addr))
        .clone()
}
