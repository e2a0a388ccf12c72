//! What the lock scripts are asked (their modes) and what their replies mean, as types.
//!
//! The scripts themselves, with their KEYS and ARGV, are in [`crate::scripts`]; the calls
//! that carry them are built in [`crate::kinds`]. Here only the meaning of the numbers
//! that go in and come back.

use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Error, ErrorKind, Result};

/// How an acquire attempt treats the waiters' queue (ARGV[4] of the acquire scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A single attempt; never registered as a waiter.
    Once,
    /// A waiter's attempt before it blocks: registers (or refreshes) it if the lock is held.
    Waiter,
    /// A waiter's attempt right after a block (pipelined behind its `BLPOP`): may take a
    /// pending grant, whose wake element it may have popped; registers if still held.
    AfterBlock,
    /// As [`Mode::AfterBlock`], but the waiter's wait is over: withdraws its registration
    /// if the lock is still held.
    Last,
    /// A waiter's first attempt, pipelined ahead of its first block (and the attempt after
    /// it): registers as [`Mode::Waiter`] does, and when it takes the lock wakes the block
    /// through the waiter's own wake list.
    Lead,
}

impl Mode {
    /// The number the scripts take.
    pub fn arg(self) -> u8 {
        match self {
            Mode::Once => 0,
            Mode::Waiter => 1,
            Mode::AfterBlock => 2,
            Mode::Last => 3,
            Mode::Lead => 4,
        }
    }

    /// Whether a waiter in this mode still waits afterwards (its registration stays).
    pub fn keeps_waiting(self) -> bool {
        matches!(self, Mode::Waiter | Mode::AfterBlock | Mode::Lead)
    }
}

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptReply {
    /// Taken: the key was set to the attempt's token for `lease` (the ttl, or less for a
    /// grant taken from a release), with this fencing token; `server_clock`: the server's
    /// clock in microseconds when the script read it (see [`super::server_time`]).
    Granted {
        fencing_token: u64,
        lease: Duration,
        server_clock: Option<u64>,
    },
    /// A reentrant lock its owner already held: one more hold of the acquisition whose
    /// token is `lock_token`; the lease is now at least `lease`.
    Reentered {
        fencing_token: u64,
        lease: Duration,
        lock_token: String,
    },
    /// Held by another owner, whose lease ends in `holder_pttl` (`None`: unknown, or a key
    /// without expiry).
    Busy { holder_pttl: Option<Duration> },
}

/// What an acquire of several names in one script found
/// ([`crate::scripts::ACQUIRE_ALL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupReply {
    /// Every name is the caller's: per name, the fencing token and lease of a name this
    /// attempt took (`None` for one the caller held already); `server_clock` as in
    /// [`AttemptReply::Granted`].
    Taken {
        grants: Vec<Option<(u64, Duration)>>,
        server_clock: Option<u64>,
    },
    /// Name `index` (the first in the caller's order) is another token's, or a name the
    /// caller held is no longer its own; nothing was written.
    Busy {
        index: usize,
        holder_pttl: Option<Duration>,
    },
    /// Name `index` is a lock of another kind; nothing was written.
    OtherKind { index: usize },
}

/// What a token-checked extend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtendReply {
    /// The hold has the new ttl.
    Extended,
    /// The key no longer held the token.
    NotHeld,
}

/// What an adopt's check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adopted {
    /// The key holds the token: its lease left (`None`: no expiry) and the last fencing
    /// token drawn for it.
    Held {
        pttl: Option<std::time::Duration>,
        fencing_token: u64,
    },
    /// The key does not hold the token.
    NotHeld,
    /// The token is a reentrant lock's.
    Reentrant,
    /// The name is a lock of another kind.
    OtherKind,
}

/// What a token-checked release (or a waiter's withdrawal) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// The hold was there and is given back.
    Released,
    /// The hold was there; the lock went straight to a registered waiter.
    HandedOff,
    /// One hold of a reentrant lock was given back; others remain.
    HoldReturned,
    /// The key no longer held the token (or, reentrant, another owner's hold).
    NotHeld,
}

impl ReleaseReply {
    /// Whether the hold was there (and no longer is).
    pub fn was_held(self) -> bool {
        !matches!(self, ReleaseReply::NotHeld)
    }
}

/// A script's reply, with when its request was written and whether the replicas asked for
/// acknowledged its write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer<T> {
    pub reply: T,
    /// When the request was written: the server ran it after this.
    pub sent_at: Instant,
    /// Too few replicas acknowledged the write (`min_replicas`): why.
    pub unacknowledged: Option<Error>,
}

/// The server's error reply as an error, anything else as itself.
fn value(value: Option<Value>) -> Result<Value> {
    match value.unwrap_or(Value::Nil) {
        Value::ServerError(e) => Err(Error::server(&e)),
        value => Ok(value),
    }
}

fn unexpected(what: &str, value: &Value) -> Error {
    Error::new(
        ErrorKind::Server,
        format!("unexpected reply to the {what} script: {value:?}"),
    )
}

fn int(value: &Value) -> Option<i64> {
    redis::from_redis_value::<i64>(value.clone()).ok()
}

/// Reads an acquire script's reply: `{1, fencing_token, lease_ms[, clock_us]}`, `{2,
/// fencing_token, lease_ms, token}` or `{0, pttl_ms}`.
///
/// Errors: the server's error, or [`ErrorKind::Server`] for a reply of another shape.
pub(crate) fn attempt(reply: Option<Value>) -> Result<AttemptReply> {
    let reply = value(reply)?;
    let Value::Array(items) = &reply else {
        return Err(unexpected("acquire", &reply));
    };
    let ints: Vec<Option<i64>> = items.iter().map(int).collect();
    let lease = |ms: i64| {
        u64::try_from(ms)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .ok_or_else(|| Error::new(ErrorKind::Server, format!("bad lease {ms}")))
    };
    let fence = |f: i64| {
        u64::try_from(f)
            .map_err(|_| Error::new(ErrorKind::Server, format!("bad fencing token {f}")))
    };
    match ints[..] {
        [Some(1), Some(f), Some(ms)] => Ok(AttemptReply::Granted {
            fencing_token: fence(f)?,
            lease: lease(ms)?,
            server_clock: None,
        }),
        [Some(1), Some(f), Some(ms), Some(clock)] => Ok(AttemptReply::Granted {
            fencing_token: fence(f)?,
            lease: lease(ms)?,
            server_clock: u64::try_from(clock).ok(),
        }),
        [Some(2), Some(f), Some(ms), _] => {
            let lock_token = redis::from_redis_value::<String>(items[3].clone())
                .map_err(|_| unexpected("acquire", &reply))?;
            Ok(AttemptReply::Reentered {
                fencing_token: fence(f)?,
                lease: lease(ms)?,
                lock_token,
            })
        }
        [Some(0), Some(pttl)] => Ok(AttemptReply::Busy {
            holder_pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        }),
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// Reads the reply of a Redlock member's `SET key token NX PX ttl` (see
/// [`crate::protocol::calls::member_attempt`]): `OK` is the key taken for `ttl`, without a
/// fencing token; nil is the key held by another owner, for a time not known.
///
/// Errors: the server's error, or [`ErrorKind::Server`] for no reply or one of another
/// shape.
pub(crate) fn member_attempt(reply: Option<Value>, ttl: Duration) -> Result<AttemptReply> {
    let Some(reply) = reply else {
        return Err(Error::new(ErrorKind::Server, "no reply to the attempt"));
    };
    let granted = AttemptReply::Granted {
        fencing_token: 0,
        lease: ttl,
        server_clock: None,
    };
    match value(Some(reply))? {
        Value::Okay => Ok(granted),
        Value::SimpleString(s) if s == "OK" => Ok(granted),
        Value::Nil => Ok(AttemptReply::Busy { holder_pttl: None }),
        other => Err(Error::new(
            ErrorKind::Server,
            format!("unexpected reply to an attempt: {other:?}"),
        )),
    }
}

/// Reads the reply of a direct waiter's block: a grant a release left on the waiter's own
/// wake list `own_wake` (`g<fencing token>:<lease ms>`, see [`crate::scripts::RELEASE`])
/// is the lock taken, leased for at most the `ttl` the waiter asked for; anything else (a
/// timeout, the waiter's own wake-up, an element of another list) is not.
///
/// Errors: the server's error, or [`ErrorKind::Server`] for a grant that does not parse.
pub(crate) fn woken(
    reply: Option<Value>,
    own_wake: &str,
    ttl: Duration,
) -> Result<Option<AttemptReply>> {
    let reply = value(reply)?;
    let Value::Array(items) = &reply else {
        return Ok(None);
    };
    let (Some(Value::BulkString(list)), Some(Value::BulkString(element))) =
        (items.first(), items.get(1))
    else {
        return Ok(None);
    };
    if list.as_slice() != own_wake.as_bytes() {
        return Ok(None);
    }
    let Some(grant) = element.strip_prefix(b"g") else {
        return Ok(None);
    };
    let parsed = std::str::from_utf8(grant).ok().and_then(|g| {
        let (fence, ms) = g.split_once(':')?;
        let ms: u64 = ms.parse().ok().filter(|ms| *ms > 0)?;
        Some((fence.parse::<u64>().ok()?, Duration::from_millis(ms)))
    });
    match parsed {
        Some((fencing_token, lease)) => Ok(Some(AttemptReply::Granted {
            fencing_token,
            lease: lease.min(ttl),
            server_clock: None,
        })),
        None => Err(unexpected("release (its grant)", &reply)),
    }
}

/// Reads the acquire-all script's reply for `held` (per name, whether it was held
/// already): see [`crate::scripts::ACQUIRE_ALL`].
///
/// Errors: the server's error, or [`ErrorKind::Server`] for a reply of another shape (a
/// name index out of range, a taken name without a lease).
pub(crate) fn attempt_all(reply: Option<Value>, held: &[bool]) -> Result<GroupReply> {
    let reply = value(reply)?;
    let Value::Array(items) = &reply else {
        return Err(unexpected("acquire-all", &reply));
    };
    let ints: Vec<Option<i64>> = items.iter().map(int).collect();
    let index = |i: i64| {
        usize::try_from(i)
            .ok()
            .filter(|i| (1..=held.len()).contains(i))
            .map(|i| i - 1)
            .ok_or_else(|| unexpected("acquire-all", &reply))
    };
    match ints[..] {
        [Some(0), Some(i), Some(pttl)] => Ok(GroupReply::Busy {
            index: index(i)?,
            holder_pttl: u64::try_from(pttl)
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
        }),
        [Some(3), Some(i)] => Ok(GroupReply::OtherKind { index: index(i)? }),
        [Some(1), Some(clock), ..] if ints.len() == 2 + 2 * held.len() => {
            let mut grants = Vec::with_capacity(held.len());
            for (i, was_held) in held.iter().enumerate() {
                if *was_held {
                    grants.push(None);
                    continue;
                }
                let (Some(fence), Some(ms)) = (ints[2 + 2 * i], ints[3 + 2 * i]) else {
                    return Err(unexpected("acquire-all", &reply));
                };
                let fence = u64::try_from(fence).map_err(|_| unexpected("acquire-all", &reply))?;
                let lease = u64::try_from(ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| unexpected("acquire-all", &reply))?;
                grants.push(Some((fence, lease)));
            }
            Ok(GroupReply::Taken {
                grants,
                server_clock: u64::try_from(clock).ok().filter(|c| *c > 0),
            })
        }
        _ => Err(unexpected("acquire-all", &reply)),
    }
}

/// Reads an extend script's reply: 1 extended, 0 not held. A `WRONGTYPE` error is not
/// held too: the name is a lock of another kind now, which no hold of this kind can be
/// part of (each extend script reads the lock key, the only key that can be of another
/// type, before it writes).
pub(crate) fn extend(reply: Option<Value>) -> Result<ExtendReply> {
    if let Some(Value::ServerError(e)) = &reply
        && e.code() == "WRONGTYPE"
    {
        return Ok(ExtendReply::NotHeld);
    }
    let reply = value(reply)?;
    match int(&reply) {
        Some(1) => Ok(ExtendReply::Extended),
        Some(0) => Ok(ExtendReply::NotHeld),
        _ => Err(unexpected("extend", &reply)),
    }
}

/// Reads a release script's reply: 1 released, 2 (or `{2, token}`) handed off, 3 one hold
/// of several given back, 0 not held (the scripts say so also when the name is a lock of
/// another kind now). A `WRONGTYPE` error is the server's error: it came from a companion
/// key, which the script may have failed on after it wrote.
pub(crate) fn release(reply: Option<Value>) -> Result<ReleaseReply> {
    let reply = value(reply)?;
    // A grant to a direct waiter names the waiter: `{2, token}`.
    let code = match &reply {
        Value::Array(items) if items.len() == 2 => items.first().and_then(int),
        _ => int(&reply),
    };
    match code {
        Some(0) => Ok(ReleaseReply::NotHeld),
        Some(1) => Ok(ReleaseReply::Released),
        Some(2) => Ok(ReleaseReply::HandedOff),
        Some(3) => Ok(ReleaseReply::HoldReturned),
        _ => Err(unexpected("release", &reply)),
    }
}

/// Reads a `WAIT` reply: how many replicas acknowledged.
pub(crate) fn acknowledged(reply: Option<Value>) -> Result<u64> {
    let reply = value(reply)?;
    int(&reply)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| unexpected("WAIT", &reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(items: Vec<Value>) -> Option<Value> {
        Some(Value::Array(items))
    }

    #[test]
    fn a_redlock_members_set_is_taken_on_ok_and_busy_on_nothing() {
        let ttl = Duration::from_secs(10);
        let granted = AttemptReply::Granted {
            fencing_token: 0,
            lease: ttl,
            server_clock: None,
        };
        assert_eq!(member_attempt(Some(Value::Okay), ttl).unwrap(), granted);
        let ok = Value::SimpleString("OK".into());
        assert_eq!(member_attempt(Some(ok), ttl).unwrap(), granted);
        assert_eq!(
            member_attempt(Some(Value::Nil), ttl).unwrap(),
            AttemptReply::Busy { holder_pttl: None }
        );
        let oom = redis::parse_redis_value(b"-OOM command not allowed\r\n").unwrap();
        assert!(matches!(oom, Value::ServerError(_)), "{oom:?}");
        assert!(member_attempt(Some(oom), ttl).is_err());
        assert!(member_attempt(Some(Value::Int(1)), ttl).is_err());
        assert!(member_attempt(None, ttl).is_err());
    }

    #[test]
    fn an_extend_failing_on_a_key_of_another_type_is_not_held() {
        let error = |text: &[u8]| redis::parse_redis_value(text).unwrap();
        let wrong = error(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value script: x\r\n",
        );
        assert_eq!(extend(Some(wrong)).unwrap(), ExtendReply::NotHeld);
        assert!(extend(Some(error(b"-OOM command not allowed\r\n"))).is_err());
        assert_eq!(extend(Some(Value::Int(1))).unwrap(), ExtendReply::Extended);
        assert_eq!(extend(Some(Value::Int(0))).unwrap(), ExtendReply::NotHeld);
    }

    #[test]
    fn a_busy_reply_of_fixed_width_reads_as_its_number() {
        for (text, pttl) in [("00000012345", Some(12_345)), ("-0000000001", None)] {
            let reply = array(vec![Value::Int(0), Value::BulkString(text.into())]);
            assert_eq!(
                attempt(reply).unwrap(),
                AttemptReply::Busy {
                    holder_pttl: pttl.map(Duration::from_millis)
                }
            );
        }
    }

    #[test]
    fn attempt_replies_are_read_by_shape() {
        assert_eq!(
            attempt(array(vec![Value::Int(1), Value::Int(7), Value::Int(500)])).unwrap(),
            AttemptReply::Granted {
                fencing_token: 7,
                lease: Duration::from_millis(500),
                server_clock: None,
            }
        );
        assert_eq!(
            attempt(array(vec![
                Value::Int(1),
                Value::Int(7),
                Value::Int(500),
                Value::Int(1_700_000_000_000_000)
            ]))
            .unwrap(),
            AttemptReply::Granted {
                fencing_token: 7,
                lease: Duration::from_millis(500),
                server_clock: Some(1_700_000_000_000_000),
            }
        );
        assert_eq!(
            attempt(array(vec![
                Value::Int(2),
                Value::Int(3),
                Value::Int(900),
                Value::BulkString(b"tok".to_vec())
            ]))
            .unwrap(),
            AttemptReply::Reentered {
                fencing_token: 3,
                lease: Duration::from_millis(900),
                lock_token: "tok".into()
            }
        );
        assert_eq!(
            attempt(array(vec![Value::Int(0), Value::Int(-1)])).unwrap(),
            AttemptReply::Busy { holder_pttl: None }
        );
        for bad in [
            array(vec![Value::Int(1), Value::Int(-4), Value::Int(5)]),
            array(vec![Value::Int(1), Value::Int(4), Value::Int(0)]),
            array(vec![Value::Int(9)]),
            Some(Value::Int(1)),
            None,
        ] {
            assert_eq!(attempt(bad).unwrap_err().kind(), ErrorKind::Server);
        }
    }

    #[test]
    fn release_replies_say_whether_the_hold_was_there() {
        let read = |n| release(Some(Value::Int(n))).unwrap();
        assert!(!read(0).was_held());
        assert!(read(1).was_held());
        assert_eq!(read(2), ReleaseReply::HandedOff);
        assert!(read(2).was_held());
        assert!(read(3).was_held());
        assert!(release(Some(Value::Int(4))).is_err());
        let direct = Value::Array(vec![Value::Int(2), Value::BulkString(b"t".to_vec())]);
        assert_eq!(release(Some(direct)).unwrap(), ReleaseReply::HandedOff);
    }

    #[test]
    fn a_block_is_a_lock_taken_only_when_it_popped_a_grant() {
        let from = |list: &str, element: &[u8]| {
            Some(Value::Array(vec![
                Value::BulkString(list.as_bytes().to_vec()),
                Value::BulkString(element.to_vec()),
            ]))
        };
        let popped = |element: &[u8]| from("own", element);
        let read = |reply| woken(reply, "own", Duration::from_secs(10));
        assert_eq!(
            read(popped(b"g1700000000000123:2500")).unwrap(),
            Some(AttemptReply::Granted {
                fencing_token: 1_700_000_000_000_123,
                lease: Duration::from_millis(2500),
                server_clock: None,
            })
        );
        // Never longer than the waiter asked for.
        match woken(popped(b"g7:2500"), "own", Duration::from_secs(1)).unwrap() {
            Some(AttemptReply::Granted { lease, .. }) => assert_eq!(lease, Duration::from_secs(1)),
            other => panic!("{other:?}"),
        }
        // Only from the waiter's own list.
        assert_eq!(read(from("shared", b"g7:2500")).unwrap(), None);
        assert_eq!(read(Some(Value::Nil)).unwrap(), None);
        assert_eq!(read(popped(b"1")).unwrap(), None);
        assert_eq!(read(popped(b"3f2a-handoff-token")).unwrap(), None);
        for bad in [&b"g12"[..], b"g:5", b"g5:0", b"gx:5", b"g-1:5"] {
            assert_eq!(read(popped(bad)).unwrap_err().kind(), ErrorKind::Server);
        }
    }
}
