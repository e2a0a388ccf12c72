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
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::node::{Node, NodeFactory};
use crate::backend::{
    Call, Exec, Lane, Redirect, Replies, back_off, first_redirect, run_calls, splice,
};
use crate::cancel::Watch;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::key_slot;
use crate::url::Addr;

/// Number of hash slots.
const SLOTS: usize = 16384;
/// Most tries of one request on a node that could not be reached, and most `MOVED` and
/// `ASK` redirections followed in a row (a "not now" is tried again until the request's
/// deadline).
const MAX_ATTEMPTS: u32 = 6;
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, SlotMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, SlotMap> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `calls` on the primary of `key`'s slot (any node for an empty key), following
    /// redirections until `deadline`.
    pub fn exec(
        &self,
        key: &str,
        calls: &[Call],
        how: &Exec<'_>,
        deadline: Instant,
    ) -> Result<Option<Replies>> {
        let slot = (!key.is_empty()).then(|| usize::from(key_slot(key.as_bytes())));
        let mut done: Option<Replies> = None;
        let mut from = 0;
        let mut ask: Option<Arc<Node>> = None;
        let mut attempt = 0;
        let mut unreachable = 0;
        let mut hops = 0;
        loop {
            attempt += 1;
            let asking = ask.is_some();
            let node = match ask.take() {
                Some(node) => node,
                None => self.node_for(slot, deadline)?,
            };
            let result = if asking {
                // `ASKING` admits only the command after it, and a `NOSCRIPT` resend would
                // go without it (and be answered `MOVED`): each call gets its own, and
                // scripts go as `EVAL`.
                let asking = Call::cmd(&redis::cmd("ASKING"));
                let with_asking: Vec<Call> = calls[from..]
                    .iter()
                    .flat_map(|call| [asking.clone(), call.evaluated()])
                    .collect();
                node.exec(&with_asking, how).map(|r| {
                    r.map(|r| Replies {
                        values: without_asking(r.values),
                        sent_at: r.sent_at,
                    })
                })
            } else {
                node.exec(&calls[from..], how)
            };
            let replies = match result {
                Ok(None) => return Ok(None),
                Ok(Some(replies)) => replies,
                Err(e) if e.is_unreachable() => {
                    self.write().stale = true;
                    unreachable += 1;
                    if e.outcome_unknown()
                        || unreachable >= MAX_ATTEMPTS
                        || Instant::now() >= deadline
                    {
                        return Err(e);
                    }
                    back_off(attempt, deadline, how.watch)?;
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let merged = match done.take() {
                Some(earlier) => splice(earlier, from, replies),
                None => replies,
            };
            let redirect = first_redirect(&merged.values[from..], &node.addr);
            // A migrating slot answers `TRYAGAIN` to multi-key requests until its keys
            // settle on one node: worth waiting for within the request's deadline.
            let Some((i, redirect)) = redirect.filter(|(_, redirect)| {
                let moves = matches!(redirect, Redirect::Moved(_) | Redirect::Ask(_));
                Instant::now() < deadline && !(moves && hops >= MAX_ATTEMPTS)
            }) else {
                return Ok(Some(merged));
            };
            match redirect {
                Redirect::Moved(addr) => {
                    hops += 1;
                    log::debug!("slot {slot:?} moved to {addr}");
                    let mut map = self.write();
                    let node = node_at(&mut map, &self.factory, &addr);
                    if let Some(slot) = slot {
                        map.slots[slot] = Some(node);
                    }
                    map.stale = true;
                }
                Redirect::Ask(addr) => {
                    hops += 1;
                    ask = Some(node_at(&mut self.write(), &self.factory, &addr));
                }
                Redirect::Later | Redirect::ReadOnly => {
                    // Counted by the deadline: the `ASK` that follows a `TRYAGAIN` during
                    // a migration is no ping-pong.
                    hops = 0;
                    self.write().stale = true;
                    back_off(attempt, deadline, how.watch)?;
                    // Nothing is sent past the deadline: the refusal is the outcome.
                    if Instant::now() >= deadline {
                        return Ok(Some(merged));
                    }
                }
            }
            from += i;
            done = Some(merged);
        }
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
        let how = Exec {
            lane: Lane::Urgent,
            io: self.io_timeout,
            cutoff: Some(deadline),
            watch: &Watch::none(),
            retry_until: None,
        };
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

/// The replies of `[ASKING, call, ASKING, call, ...]`, one per call. A refused `ASKING` (an
/// ACL without `+asking`) stands for its call when that call failed too: the call went
/// without it, and the refusal is the reason.
fn without_asking(values: Vec<Value>) -> Vec<Value> {
    let mut values = values.into_iter();
    let mut replies = Vec::with_capacity(values.len() / 2);
    while let (Some(asking), Some(reply)) = (values.next(), values.next()) {
        let refused = matches!(asking, Value::ServerError(_));
        replies.push(match reply {
            Value::ServerError(_) if refused => asking,
            reply => reply,
        });
    }
    replies
}

/// The node at `addr`, made on first use.
fn node_at(map: &mut SlotMap, factory: &NodeFactory, addr: &Addr) -> Arc<Node> {
    map.nodes
        .entry(addr.clone())
        .or_insert_with(|| factory.node(addr))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> Value {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap()
    }

    #[test]
    fn a_refused_asking_stands_for_its_call_only_when_the_call_failed_too() {
        let ok = || Value::Okay;
        let replies = without_asking(vec![
            ok(),
            Value::Int(1),
            error("NOPERM no asking"),
            error("MOVED 1 127.0.0.1:7000"),
            error("NOPERM no asking"),
            Value::Int(2),
        ]);
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0], Value::Int(1));
        assert!(matches!(&replies[1], Value::ServerError(e) if e.code() == "NOPERM"));
        assert_eq!(replies[2], Value::Int(2));
    }
}
