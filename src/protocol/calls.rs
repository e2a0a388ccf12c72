//! The requests of the lock protocol on one server, and how their replies are read: one
//! place for what an attempt, an extend and a release send, shared by every deployment
//! (and by the simulation, which sends them over its own network).

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::{Call, Replicas};
use crate::core::reply::{self, Answer, AttemptReply, ExtendReply, Mode, ReleaseReply};
use crate::error::{Error, Result};
use crate::kinds::Registration;
use crate::protocol::Hold;

/// The calls of one attempt: a block on the wake list for `block` first (the attempt then
/// runs the moment the block returns), the kind's acquire script, and `WAIT` when replicas
/// must acknowledge. With `lead` (a waiter's first attempt, [`Mode::Lead`]) an attempt goes
/// ahead of the block, which then also watches the waiter's own wake list (first), where
/// that attempt leaves a wake-up when it takes the lock. A `direct` waiter's attempt (see
/// [`crate::kinds::Kind::hands_over`]) always leads, in `mode`, and nothing follows
/// the block: a release hands it the lock through its own wake list. `first_lead`: no
/// attempt under the token led a block before this one (its own wake list is empty).
/// `clock_us`: the client's estimate of the server's clock (see
/// [`crate::core::server_time`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attempt(
    hold: Hold<'_>,
    ttl: Duration,
    mode: Mode,
    grace: Duration,
    block: Option<Duration>,
    lead: bool,
    direct: bool,
    first_lead: bool,
    replicas: Option<Replicas>,
    clock_us: u64,
) -> Vec<Call> {
    let Hold {
        kind, keys, token, ..
    } = hold;
    let mut calls = Vec::with_capacity(4);
    let script = |mode, lead| {
        hold.kind.attempt(
            keys,
            token,
            ttl.as_millis() as u64,
            mode,
            grace.as_millis() as u64,
            clock_us,
            lead,
            // Registered as a direct waiter only ahead of a block, where a handoff is
            // popped at once (a waiter sleeping instead would hold a lock handed to it).
            match (direct && lead, first_lead) {
                (false, _) => Registration::Woken,
                (true, false) => Registration::Handed,
                (true, true) => Registration::HandedFirst,
            },
        )
    };
    if let Some(block) = block {
        let mut blpop = redis::cmd("BLPOP");
        if lead {
            calls.push(script(if direct { mode } else { Mode::Lead }, true));
            blpop.arg(keys.own_wake(token));
        }
        blpop
            .arg(kind.wake_list(keys))
            .arg(format!("{:.3}", block.as_secs_f64()));
        calls.push(Call::blocking_pop(&blpop, block));
        if direct {
            return calls;
        }
    }
    calls.push(script(mode, false));
    calls.extend(replicas.map(|r| r.call()));
    calls
}

/// A Redlock member's attempt at a mutex: `SET key token NX PX ttl`, no script. A quorum
/// wants no fencing token, and never sends an attempt again under its token (one that is
/// not granted is given back first, and the next goes under a fresh token), so the
/// acquire script's checks are not needed; read the reply with
/// [`reply::member_attempt`].
pub(crate) fn member_attempt(hold: Hold<'_>, ttl: Duration) -> Call {
    let mut set = redis::cmd("SET");
    set.arg(&hold.keys.lock)
        .arg(hold.token)
        .arg("NX")
        .arg("PX")
        .arg(ttl.as_millis() as u64);
    Call::cmd(&set)
}

/// A direct waiter's block (see [`attempt`]): its own wake list, and the ttl it asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Direct<'a> {
    pub own_wake: &'a str,
    pub ttl: Duration,
}

/// Reads the replies of [`attempt`]'s calls (`blocked`: a block went first, `lead`: with an
/// attempt ahead of it, `direct`: a direct waiter's, with nothing after the block), written
/// at `sent_at`. A lead attempt that took the lock is the answer (the attempt after the
/// block found the key already under the token). A direct waiter's block that popped a
/// grant from its own wake list is a lock taken, with the grant's fencing token and lease
/// (at most the ttl asked for): the attempt ahead of the block cleared the list, so the
/// release that made the grant ran after it, after `sent_at`.
///
/// Errors: the server's error (also one answering the block), or a reply of another shape.
pub(crate) fn read_attempt(
    mut values: Vec<Value>,
    blocked: bool,
    lead: bool,
    direct: Option<Direct<'_>>,
    replicas: Option<Replicas>,
    sent_at: Instant,
) -> Result<Answer<AttemptReply>> {
    if lead && blocked && !values.is_empty() {
        let first = reply::attempt(Some(values.remove(0)))?;
        if !matches!(first, AttemptReply::Busy { .. }) {
            let wait = replicas.and_then(|_| values.pop());
            let unacknowledged = replicas.and_then(|r| r.shortfall(wait, "acquiring"));
            return Ok(Answer {
                reply: first,
                sent_at,
                unacknowledged,
            });
        }
        if let Some(direct) = direct {
            let block = values.into_iter().next();
            let reply = match reply::woken(block, direct.own_wake, direct.ttl)? {
                Some(granted) => granted,
                None => first,
            };
            return Ok(Answer {
                reply,
                sent_at,
                unacknowledged: None,
            });
        }
    }
    answer(
        values,
        blocked,
        replicas,
        sent_at,
        "acquiring",
        reply::attempt,
        |reply| !matches!(reply, AttemptReply::Busy { .. }),
    )
}

/// The acquire-all script for `keys` under `tokens` (`held`: per name, whether it is held
/// already, and only checked), for `ttl`, with the server's clock estimated as `clock_us`.
pub(crate) fn attempt_all(
    keys: &[crate::keys::LockKeys],
    tokens: &[String],
    held: &[bool],
    ttl: Duration,
    clock_us: u64,
) -> Call {
    let mut k: Vec<&str> = Vec::with_capacity(2 * keys.len());
    for key in keys {
        k.push(&key.lock);
        k.push(&key.fence);
    }
    let flags: String = held.iter().map(|h| if *h { '1' } else { '0' }).collect();
    let ttl_ms = ttl.as_millis() as u64;
    let mut args: Vec<&dyn crate::backend::call::ScriptArg> = Vec::with_capacity(3 + tokens.len());
    args.push(&ttl_ms);
    args.push(&clock_us);
    args.push(&flags);
    for token in tokens {
        args.push(token);
    }
    Call::script(&crate::scripts::ACQUIRE_ALL, &k, &args)
}

/// The calls of one extend of `hold` to `ttl`: the kind's extend script, and `WAIT` when
/// replicas must acknowledge.
pub(crate) fn extend(hold: Hold<'_>, ttl: Duration, replicas: Option<Replicas>) -> Vec<Call> {
    let mut calls = vec![
        hold.kind
            .extend(hold.keys, hold.token, ttl.as_millis() as u64),
    ];
    calls.extend(replicas.map(|r| r.call()));
    calls
}

/// Reads the replies of [`extend`]'s calls, written at `sent_at`.
pub(crate) fn read_extend(
    values: Vec<Value>,
    replicas: Option<Replicas>,
    sent_at: Instant,
) -> Result<Answer<ExtendReply>> {
    answer(
        values,
        false,
        replicas,
        sent_at,
        "extending",
        reply::extend,
        |reply| *reply == ExtendReply::Extended,
    )
}

/// The release of `hold` (or, `withdraw`, the withdrawal of a waiter for `ttl`); a mutex
/// handed to a waiter through the wake list goes under `handoff` until the waiter takes
/// it, for at most `grace`.
pub(crate) fn release(
    hold: Hold<'_>,
    handoff: &str,
    grace: Duration,
    withdraw: bool,
    ttl: Duration,
) -> Call {
    hold.kind.release(
        hold.keys,
        hold.token,
        handoff,
        grace.as_millis() as u64,
        withdraw,
        ttl.as_millis() as u64,
    )
}

/// Reads the reply of [`release`]'s call.
pub(crate) fn read_release(values: Vec<Value>) -> Result<ReleaseReply> {
    reply::release(values.into_iter().next())
}

/// Reads a script's reply after `blocked` leading blocking calls, then the `WAIT` reply
/// when `wrote` says the reply stands for a write the replicas must acknowledge.
fn answer<T>(
    values: Vec<Value>,
    blocked: bool,
    replicas: Option<Replicas>,
    sent_at: Instant,
    doing: &str,
    read: impl FnOnce(Option<Value>) -> Result<T>,
    wrote: impl FnOnce(&T) -> bool,
) -> Result<Answer<T>> {
    let mut values = values.into_iter();
    if blocked {
        // The block's own reply: an element, or nil at its timeout. An error there (the
        // wake list of another type) is the attempt's failure.
        if let Some(Value::ServerError(e)) = values.next() {
            return Err(Error::server(&e));
        }
    }
    let reply = read(values.next())?;
    let unacknowledged = match replicas {
        Some(replicas) if wrote(&reply) => replicas.shortfall(values.next(), doing),
        _ => None,
    };
    Ok(Answer {
        reply,
        sent_at,
        unacknowledged,
    })
}

/// The check of an adopt: whether `keys`' lock holds `token` ([`crate::scripts::ADOPT`]).
pub(crate) fn adopt(keys: &crate::keys::LockKeys, token: &str) -> Call {
    Call::script(
        &crate::scripts::ADOPT,
        &[&keys.lock, &keys.fence, &keys.holds],
        &[&token],
    )
}

/// Reads the reply of [`adopt`].
///
/// Errors: the server's error, or a reply of another shape.
pub(crate) fn read_adopt(value: Value) -> Result<reply::Adopted> {
    let shape = || {
        Error::new(
            crate::error::ErrorKind::Server,
            "unexpected reply to an adopt",
        )
    };
    let items = match value {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(Error::server(&e)),
        _ => return Err(shape()),
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    match int(items.first()) {
        Some(0) => Ok(reply::Adopted::NotHeld),
        Some(2) => Ok(reply::Adopted::Reentrant),
        Some(3) => Ok(reply::Adopted::OtherKind),
        Some(1) => {
            let pttl = int(items.get(1)).ok_or_else(shape)?;
            // 0: the key expires this very millisecond (time stands still in a script):
            // as good as gone. -1: no expiry.
            if pttl == 0 || pttl < -1 {
                return Ok(reply::Adopted::NotHeld);
            }
            let fencing_token = match items.get(2) {
                Some(Value::BulkString(b)) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0),
                _ => 0,
            };
            Ok(reply::Adopted::Held {
                pttl: (pttl > 0).then(|| Duration::from_millis(pttl as u64)),
                fencing_token,
            })
        }
        _ => Err(shape()),
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::read_adopt;
    use crate::core::reply::Adopted;

    fn reply(items: Vec<Value>) -> Adopted {
        read_adopt(Value::Array(items)).unwrap()
    }

    #[test]
    fn an_adopt_believes_no_more_than_the_lease_the_key_has_left() {
        let fence = Value::BulkString(b"42".to_vec());
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(1500), fence.clone()]),
            Adopted::Held {
                pttl: Some(std::time::Duration::from_millis(1500)),
                fencing_token: 42
            }
        );
        // Expiring this very millisecond (a script's frozen clock): as good as gone.
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(0), fence.clone()]),
            Adopted::NotHeld
        );
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(-2), fence.clone()]),
            Adopted::NotHeld
        );
        // No expiry at all: the adopter's own ttl.
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(-1), fence]),
            Adopted::Held {
                pttl: None,
                fencing_token: 42
            }
        );
        assert_eq!(reply(vec![Value::Int(0)]), Adopted::NotHeld);
        assert_eq!(reply(vec![Value::Int(2)]), Adopted::Reentrant);
        assert_eq!(reply(vec![Value::Int(3)]), Adopted::OtherKind);
        assert!(read_adopt(Value::Int(7)).is_err());
    }
}
