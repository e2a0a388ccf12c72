//! Following a deployment's redirections: one loop for Cluster and Sentinel.
//!
//! A request goes to the node a [`Route`] names. What comes back may say the calls did not
//! run there: `MOVED` (the slot lives elsewhere now), `ASK` (one key is being migrated;
//! ask there, once, after `ASKING`), `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`
//! (not now), `READONLY` (a replica, a demoted primary). The calls from the first refused
//! one on are sent again where the route says, after a short pause for "not now"; a node
//! that cannot be reached is forgotten and the request sent again only if it surely did
//! not run. Everything within the request's deadline; a refusal still standing then is
//! the outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::backend::node::Node;
use crate::cancel::Watch;
use crate::error::Result;
use crate::url::Addr;

/// Most tries of one request on nodes that could not be reached, and most `MOVED` and
/// `ASK` redirections followed in a row (a "not now" is tried again until the deadline).
const MAX_TRIES: u32 = 6;

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

/// How a deployment routes a request, and what it learns from redirections.
pub(crate) trait Route {
    /// The node to send to now (discovering it within `deadline` if needed).
    fn node(&self, deadline: Instant) -> Result<Arc<Node>>;
    /// `node` could not be reached, or answered as a replica or "not now": look at the
    /// deployment again before the next request.
    fn forget(&self, node: &Arc<Node>);
    /// A `MOVED` or `ASK` to `addr`: the node there, when this deployment follows them
    /// (a `MOVED` also moves the slot in its map); `None` to stop at the redirect.
    fn redirected(&self, redirect: &Redirect, addr: &Addr) -> Option<Arc<Node>>;
}

/// Runs `calls` where `route` says, following redirections until `deadline`. `Ok(None)`
/// only on the blocking lane when no blocking connection is free.
pub(crate) fn follow(
    route: &impl Route,
    calls: &[Call],
    how: &Exec<'_>,
    deadline: Instant,
) -> Result<Option<Replies>> {
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
            None => route.node(deadline)?,
        };
        let result = if asking {
            exec_asking(&node, &calls[from..], how)
        } else {
            node.exec(&calls[from..], how)
        };
        let replies = match result {
            Ok(None) => return Ok(None),
            Ok(Some(replies)) => replies,
            Err(e) if e.is_unreachable() => {
                route.forget(&node);
                unreachable += 1;
                if e.outcome_unknown() || unreachable >= MAX_TRIES || Instant::now() >= deadline {
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
        let Some((i, redirect)) = first_redirect(&merged.values[from..], &node.addr) else {
            return Ok(Some(merged));
        };
        if Instant::now() >= deadline {
            return Ok(Some(merged));
        }
        match &redirect {
            Redirect::Moved(addr) | Redirect::Ask(addr) => {
                // A migrating slot may answer `ASK` after `TRYAGAIN`: counted apart from
                // "not now", which the deadline bounds.
                if hops >= MAX_TRIES {
                    return Ok(Some(merged));
                }
                let Some(target) = route.redirected(&redirect, addr) else {
                    return Ok(Some(merged));
                };
                hops += 1;
                if matches!(redirect, Redirect::Ask(_)) {
                    ask = Some(target);
                }
            }
            Redirect::Later | Redirect::ReadOnly => {
                hops = 0;
                log::debug!("{}: {redirect:?}; trying again", node.addr);
                route.forget(&node);
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

/// Runs `calls` on `node` each after its own `ASKING` (`ASKING` admits only the command
/// after it, and a `NOSCRIPT` resend would go without it and be answered `MOVED`), scripts
/// as `EVAL`.
fn exec_asking(node: &Node, calls: &[Call], how: &Exec<'_>) -> Result<Option<Replies>> {
    let asking = Call::cmd(&redis::cmd("ASKING"));
    let with_asking: Vec<Call> = calls
        .iter()
        .flat_map(|call| [asking.clone(), call.evaluated()])
        .collect();
    node.exec(&with_asking, how).map(|r| {
        r.map(|r| Replies {
            values: without_asking(r.values),
            sent_at: r.sent_at,
        })
    })
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

/// The first reply that is a redirect, and where it is.
pub(crate) fn first_redirect(values: &[Value], from: &Addr) -> Option<(usize, Redirect)> {
    values
        .iter()
        .enumerate()
        .find_map(|(i, v)| Redirect::of(v, from).map(|r| (i, r)))
}

/// Replaces the replies from `from` on with `more` (the calls from there, sent again).
fn splice(mut replies: Replies, from: usize, more: Replies) -> Replies {
    replies.values.truncate(from);
    replies.values.extend(more.values);
    // The earlier send time stays: it is the conservative one.
    replies
}

/// Sleeps a little before trying again, never past `deadline`.
/// Errors: [`crate::ErrorKind::Cancelled`] when `watch` ends the pause (nothing is in
/// flight).
fn back_off(attempt: u32, deadline: Instant, watch: &Watch) -> Result<()> {
    let wait = Duration::from_millis(20 << attempt.min(4));
    let left = deadline.saturating_duration_since(Instant::now());
    crate::connection::pause(wait.min(left), watch)
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

    #[test]
    fn redirects_are_read_with_the_answering_nodes_host() {
        let from = Addr::Tcp {
            host: "10.0.0.1".into(),
            port: 7000,
        };
        assert_eq!(
            Redirect::of(&error("MOVED 12 :7001"), &from),
            Some(Redirect::Moved(Addr::Tcp {
                host: "10.0.0.1".into(),
                port: 7001
            }))
        );
        assert_eq!(
            Redirect::of(&error("TRYAGAIN multi-key"), &from),
            Some(Redirect::Later)
        );
        assert_eq!(Redirect::of(&error("ERR nope"), &from), None);
    }
}
