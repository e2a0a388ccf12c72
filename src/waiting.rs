//! Waiting for a held lock: deadlines, backoff with jitter, and blocking for a handoff.
//!
//! After a failed attempt a waiter blocks on the server (`BLPOP` on the lock's wake list,
//! see [`crate::scripts`]) for at most the backoff delay, cut to the time left before the
//! caller's deadline and to just after the current holder's lease ends. A release hands the
//! lock over through that list, to the waiter that blocked first; an expired holder is
//! noticed when its lease ends; a release that no waiter saw (a foreign client's `DEL`, a
//! waiter that vanished) costs at most one backoff delay. Without a free pooled connection
//! a waiter sleeps instead of blocking.

use std::time::{Duration, Instant};

use crate::connections::Pool;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;

/// First backoff delay; doubles per attempt up to [`MAX_DELAY`].
const MIN_DELAY: Duration = Duration::from_millis(500);
/// Largest backoff delay.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Upper bound of the jitter added after a holder's lease ends, so that waiters whose
/// holder expired do not all retry in the same millisecond.
const EXPIRY_JITTER_MS: u64 = 5;

/// How long a waiter's count lives on the server without being refreshed: one full backoff
/// delay plus a reply's time. After a crash the count cannot outlive its waiter for long.
pub(crate) fn registration_ms(io_timeout: Duration) -> u64 {
    (MAX_DELAY + io_timeout).as_millis() as u64
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// One attempt.
    No,
    /// Until this instant.
    Until(Instant),
    /// Until acquired or an error occurs.
    Forever,
}

impl Wait {
    /// Waiting up to `wait` from now.
    ///
    /// Errors: [`ErrorKind::InvalidArgument`] when the deadline is not representable.
    pub fn up_to(wait: Duration) -> Result<Wait> {
        if wait.is_zero() {
            return Ok(Wait::No);
        }
        Instant::now()
            .checked_add(wait)
            .map(Wait::Until)
            .ok_or_else(|| Error::invalid(format!("the wait of {wait:?} is too long")))
    }

    /// Time left, `None` for no limit.
    fn left(self, now: Instant) -> Option<Duration> {
        match self {
            Wait::No => Some(Duration::ZERO),
            Wait::Until(deadline) => Some(deadline.saturating_duration_since(now)),
            Wait::Forever => None,
        }
    }
}

/// Exponential backoff with jitter: each delay is drawn from `[d/2, d]`, then `d` doubles.
pub(crate) struct Backoff {
    delay: Duration,
}

impl Backoff {
    pub fn new() -> Self {
        Backoff { delay: MIN_DELAY }
    }

    fn next_delay(&mut self) -> Duration {
        let full = self.delay;
        self.delay = (self.delay * 2).min(MAX_DELAY);
        let half = full / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// How a blocked wait ended.
#[derive(Debug)]
pub(crate) enum Woken {
    /// A release handed the lock to this waiter under `token`, for `ttl` from `at`.
    Handoff {
        token: String,
        fencing_token: u64,
        ttl: Duration,
        at: Instant,
    },
    /// Time for another attempt.
    Retry,
    /// The caller's wait is over.
    Expired,
}

/// After a failed attempt, blocks until a handoff, the backoff delay, the holder's lease end
/// (`holder_pttl_ms`, negative when unknown) or the caller's deadline, whichever is first.
///
/// Errors only when the wait itself could not reach Redis.
pub(crate) fn block(
    pool: &Pool,
    keys: &LockKeys,
    wait: Wait,
    backoff: &mut Backoff,
    holder_pttl_ms: i64,
) -> Result<Woken> {
    let now = Instant::now();
    let mut delay = backoff.next_delay();
    if let Ok(pttl) = u64::try_from(holder_pttl_ms) {
        let jitter = fastrand::u64(1..=EXPIRY_JITTER_MS);
        delay = delay.min(Duration::from_millis(pttl + jitter));
    }
    if let Some(left) = wait.left(now) {
        if left.is_zero() {
            return Ok(Woken::Expired);
        }
        delay = delay.min(left);
    }
    // BLPOP takes seconds with millisecond resolution; 0 would mean "forever".
    let delay = delay.max(Duration::from_millis(1));
    let Some(conn) = pool.try_get() else {
        std::thread::sleep(delay);
        return Ok(Woken::Retry);
    };
    let mut conn = conn?;
    let io = pool.connector.io_timeout();
    conn.ensure_timeout(delay + io / 2, delay + io * 2)?;
    let seconds = format!("{:.3}", delay.as_secs_f64());
    let popped = conn.run(|c| {
        redis::cmd("BLPOP")
            .arg(&keys.wake)
            .arg(&seconds)
            .query::<Option<(String, String)>>(c)
    })?;
    match popped {
        Some((_, element)) => parse_handoff(&element),
        None => Ok(Woken::Retry),
    }
}

/// Parses a handoff element, `"<fencing token> <ttl ms> <token>"`.
fn parse_handoff(element: &str) -> Result<Woken> {
    let at = Instant::now();
    let mut parts = element.splitn(3, ' ');
    let mut number = || parts.next().and_then(|n| n.parse::<u64>().ok());
    let (fencing_token, ttl_ms) = (number(), number());
    match (fencing_token, ttl_ms, parts.next()) {
        (Some(fencing_token), Some(ttl_ms), Some(token)) if !token.is_empty() => {
            Ok(Woken::Handoff {
                token: token.to_owned(),
                fencing_token,
                ttl: Duration::from_millis(ttl_ms),
                at,
            })
        }
        _ => Err(Error::new(
            ErrorKind::Server,
            format!("malformed handoff {element:?} on the wake list"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_handoff_elements() {
        match parse_handoff("17 3000 abc:handoff x").unwrap() {
            Woken::Handoff {
                token,
                fencing_token,
                ttl,
                ..
            } => {
                assert_eq!(token, "abc:handoff x");
                assert_eq!(fencing_token, 17);
                assert_eq!(ttl, Duration::from_secs(3));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_handoff("x 1 t").is_err());
        assert!(parse_handoff("1 2").is_err());
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let mut b = Backoff::new();
        let first = b.next_delay();
        assert!(first >= MIN_DELAY / 2 && first <= MIN_DELAY);
        for _ in 0..20 {
            assert!(b.next_delay() <= MAX_DELAY);
        }
    }
}
