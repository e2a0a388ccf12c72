//! Redlock: one lock over N independent Redis primaries (the algorithm of the Redis
//! documentation, with no corners cut).
//!
//! - Acquire: the same token on every primary, in parallel (one round), each bounded by a
//!   per-member time much smaller than the ttl; granted when a majority (N/2 + 1) said yes
//!   *and* the validity `ttl - elapsed - drift` (drift = 1 % of ttl + 2 ms; elapsed from
//!   before the first write) is positive. The validity is the local deadline. Otherwise
//!   the lock is released on every member, those that did not answer included, and the
//!   acquire fails: busy when some member was held by another owner, a connection error
//!   when too few answered to know.
//! - Extend (and renewal): on every member; succeeds only on a majority with positive
//!   validity. A renewal that cannot reach a majority before the deadline loses the lock.
//! - Release: on every member; released when the lease was still valid and a majority
//!   confirmed the delete; not held when a majority reported the token gone; a connection
//!   error when too few answered.
//! - Waiting: attempts with exponential backoff and jitter, no handoff (a grant is not
//!   atomic across primaries), up to the caller's deadline.
//! - Fencing tokens: none. Each member's counter increases, but the largest token of one
//!   majority need not exceed that of an earlier majority (they may differ in the member
//!   with the highest counter), so no token here is monotonic: `fencing_token()` is 0.

use std::time::{Duration, Instant};

use redis::Value;

use crate::acquire::Granted;
use crate::backend::redlock::{Redlock, per_member};
use crate::backend::{Backend, Call, Lane, reply};
use crate::cancel::Watch;
use crate::connection;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::lease::local_deadline;
use crate::scripts::{self, ACQUIRE, EXTEND, RELEASE};
use crate::token;
use crate::waiting::Wait;

/// First delay between two attempts of a waiting acquire; doubles up to [`MAX_RETRY`].
const MIN_RETRY: Duration = Duration::from_millis(10);
const MAX_RETRY: Duration = Duration::from_millis(500);

/// What one member said to an acquire attempt.
enum Vote {
    Yes,
    Held,
    Failed(String),
}

/// Acquires on a majority of `redlock`'s members, waiting as `wait` says.
pub(crate) fn acquire(
    backend: &Backend,
    redlock: &Redlock,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
    wait: Wait,
    watch: &Watch,
) -> Result<Granted> {
    let mut delay = MIN_RETRY;
    loop {
        match attempt(backend, redlock, keys, token, ttl) {
            Ok(granted) => return Ok(granted),
            Err(e) if wait == Wait::No => return Err(e),
            Err(e)
                if !matches!(
                    e.kind(),
                    ErrorKind::Busy | ErrorKind::Connection | ErrorKind::Timeout
                ) =>
            {
                return Err(e);
            }
            Err(e) => {
                let left = wait.left(Instant::now());
                if left == Some(Duration::ZERO) {
                    return Err(e);
                }
                let jittered = delay / 2 + (delay / 2).mul_f64(fastrand::f64());
                let pause = left.map_or(jittered, |l| l.min(jittered));
                connection::pause(pause, watch)?;
                if watch.cancelled() {
                    return Err(Error::new(ErrorKind::Cancelled, "the wait was cancelled"));
                }
                delay = (delay * 2).min(MAX_RETRY);
            }
        }
    }
}

/// One attempt: a round of `SET NX PX` (the acquire script, once) on every member.
fn attempt(
    backend: &Backend,
    redlock: &Redlock,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
) -> Result<Granted> {
    let ttl_ms = ttl.as_millis() as u64;
    let call = Call::script(
        &ACQUIRE,
        &[
            &keys.lock,
            &keys.fence,
            &keys.wake,
            &keys.queue,
            &keys.grant,
        ],
        &[
            &token,
            &ttl_ms,
            &scripts::FENCE_TTL_MS,
            &scripts::MODE_ONCE,
            &0u64,
        ],
    );
    let start = Instant::now();
    let per = per_member(ttl, backend.io_timeout);
    let round = redlock.round(&keys.lock, &[call], Lane::Urgent, start + per);
    let votes: Vec<Vote> = round
        .outcomes
        .into_iter()
        .map(|outcome| {
            match outcome.and_then(|values| {
                reply::<Vec<i64>>(values.into_iter().next().unwrap_or(Value::Nil))
            }) {
                Ok(v) if v.first() == Some(&1) => Vote::Yes,
                Ok(_) => Vote::Held,
                Err(e) => Vote::Failed(e.to_string()),
            }
        })
        .collect();
    let yes = votes.iter().filter(|v| matches!(v, Vote::Yes)).count();
    // The validity is the local deadline: start + ttl - drift, measured from before the
    // first write (the round's sent_at is later than `start`: `start` is the safe base).
    let deadline = local_deadline(start, ttl);
    if yes >= redlock.quorum() && Instant::now() < deadline {
        return Ok(Granted {
            fencing_token: 0,
            lease: ttl,
            sent_at: start,
        });
    }
    // Failed: release everywhere, the members that did not answer included.
    let (_, undo_failed) = release_all(backend, redlock, keys, token, ttl);
    let held = votes.iter().filter(|v| matches!(v, Vote::Held)).count();
    let detail: Vec<String> = votes
        .iter()
        .map(|v| match v {
            Vote::Yes => "granted (given back)".to_owned(),
            Vote::Held => "held by another owner".to_owned(),
            Vote::Failed(why) => format!("no answer ({why})"),
        })
        .collect();
    let mut message = format!(
        "lock {:?}: {yes} of {} members granted it, {} needed{}: {}",
        keys.lock,
        redlock.members.len(),
        redlock.quorum(),
        if yes >= redlock.quorum() {
            " but its validity ran out first"
        } else {
            ""
        },
        redlock.describe_outcomes(&detail)
    );
    if !undo_failed.is_empty() {
        message.push_str(&format!(
            "; giving it back failed on {} (it lapses there after its ttl)",
            undo_failed.join("; ")
        ));
    }
    let kind = if held > 0 || yes >= redlock.quorum() {
        ErrorKind::Busy
    } else {
        ErrorKind::Connection
    };
    Err(Error::new(kind, message))
}

/// Releases `token` on every member (best effort, one round): per member, the script's
/// answer (1 released, 0 not held) or `None`, and what went wrong with those.
fn release_all(
    backend: &Backend,
    redlock: &Redlock,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
) -> (Vec<Option<i64>>, Vec<String>) {
    let handoff = token::new_token("handoff");
    let call = Call::script(
        &RELEASE,
        &[&keys.lock, &keys.wake, &keys.queue, &keys.grant],
        &[
            &token,
            &handoff,
            &scripts::MIN_CLAIM_MS,
            &scripts::MIN_CLAIM_MS,
            &0u8,
        ],
    );
    let per = per_member(ttl, backend.io_timeout);
    let round = redlock.round(&keys.lock, &[call], Lane::Urgent, Instant::now() + per);
    let mut failed = Vec::new();
    let results = round
        .outcomes
        .into_iter()
        .enumerate()
        .map(|(i, outcome)| {
            match outcome.and_then(|v| reply::<i64>(v.into_iter().next().unwrap_or(Value::Nil))) {
                Ok(n) => Some(n),
                Err(e) => {
                    failed.push(format!("{}: {e}", redlock.name(i)));
                    None
                }
            }
        })
        .collect();
    (results, failed)
}

/// What a Redlock extend found.
pub(crate) enum ExtendOutcome {
    /// A majority extended it, with validity left; the request went out at this instant.
    Extended(Instant),
    /// So many members no longer hold the token that no majority ever can again.
    Lost,
}

/// Extends on every member; see the module documentation. Nothing runs past `cutoff`.
pub(crate) fn extend(
    backend: &Backend,
    redlock: &Redlock,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
    cutoff: Option<Instant>,
) -> Result<ExtendOutcome> {
    let ttl_ms = ttl.as_millis() as u64;
    let call = Call::script(&EXTEND, &[&keys.lock], &[&token, &ttl_ms]);
    let start = Instant::now();
    let mut until = start + per_member(ttl, backend.io_timeout);
    if let Some(cutoff) = cutoff {
        until = until.min(cutoff);
    }
    let round = redlock.round(&keys.lock, &[call], Lane::Renewal, until);
    let mut yes = 0;
    let mut gone = 0;
    let mut detail = Vec::new();
    for outcome in round.outcomes {
        match outcome.and_then(|v| reply::<i64>(v.into_iter().next().unwrap_or(Value::Nil))) {
            Ok(1) => {
                yes += 1;
                detail.push("extended".to_owned());
            }
            Ok(_) => {
                gone += 1;
                detail.push("token gone".to_owned());
            }
            Err(e) => detail.push(format!("no answer ({e})")),
        }
    }
    let n = redlock.members.len();
    if yes >= redlock.quorum() && Instant::now() < local_deadline(start, ttl) {
        return Ok(ExtendOutcome::Extended(start));
    }
    if gone > n - redlock.quorum() {
        return Ok(ExtendOutcome::Lost);
    }
    Err(Error::new(
        ErrorKind::Connection,
        format!(
            "extending {:?}: {yes} of {n} members, {} needed: {}",
            keys.lock,
            redlock.quorum(),
            redlock.describe_outcomes(&detail)
        ),
    )
    .sent())
}

/// Releases on every member. `Ok(true)`: released while still valid, confirmed by a
/// majority; `Ok(false)`: a majority reported the token gone, or the lease had run out
/// (part of the critical section ran unprotected); a connection error when too few
/// answered to know.
pub(crate) fn release(
    backend: &Backend,
    redlock: &Redlock,
    keys: &LockKeys,
    token: &str,
    ttl: Duration,
    valid_until: Instant,
) -> Result<bool> {
    let still_valid = Instant::now() < valid_until;
    let (results, failed) = release_all(backend, redlock, keys, token, ttl);
    let released = results.iter().filter(|r| **r == Some(1)).count();
    let gone = results.iter().filter(|r| **r == Some(0)).count();
    if released >= redlock.quorum() {
        Ok(still_valid)
    } else if gone >= redlock.quorum() || failed.is_empty() {
        Ok(false)
    } else {
        Err(Error::new(
            ErrorKind::Connection,
            format!(
                "releasing {:?}: confirmed by {released} of {} members, {} needed; no answer from {}",
                keys.lock,
                results.len(),
                redlock.quorum(),
                failed.join("; ")
            ),
        )
        .sent())
    }
}
