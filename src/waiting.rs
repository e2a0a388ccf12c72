//! Waiting for a held lock: deadlines, backoff with jitter, and blocking for a release.
//!
//! Between two attempts a waiter blocks on the server (`BLPOP` on the lock's wake list, where
//! a release leaves one signal) for at most the backoff delay, cut to the time left before
//! the caller's deadline and to just after the current holder's lease ends. So a release
//! wakes a waiter at once, an expired holder is noticed on time, and a missed signal costs at
//! most one backoff delay. Without a free pooled connection it sleeps instead.

use std::time::{Duration, Instant};

use crate::connections::Pool;
use crate::error::{Error, Result};

/// First backoff delay; doubles per attempt up to [`MAX_DELAY`].
const MIN_DELAY: Duration = Duration::from_millis(50);
/// Largest backoff delay.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Upper bound of the jitter added after a holder's lease ends, so that waiters whose
/// holder expired do not all retry in the same millisecond.
const EXPIRY_JITTER_MS: u64 = 5;

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
    /// Errors: [`crate::ErrorKind::InvalidArgument`] when the deadline is not representable.
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

/// After a failed attempt, waits for the next one. `holder_pttl_ms` is the current holder's
/// remaining lease as the attempt saw it (negative when unknown).
///
/// Returns `Ok(false)` when the caller's wait is over (no time left), `Ok(true)` when it is
/// time to try again. Errors only when the wait itself failed to reach Redis.
pub(crate) fn pause(
    pool: &Pool,
    wake_key: &str,
    wait: Wait,
    backoff: &mut Backoff,
    holder_pttl_ms: i64,
) -> Result<bool> {
    let now = Instant::now();
    let mut delay = backoff.next_delay();
    if let Ok(pttl) = u64::try_from(holder_pttl_ms) {
        let jitter = fastrand::u64(1..=EXPIRY_JITTER_MS);
        delay = delay.min(Duration::from_millis(pttl + jitter));
    }
    if let Some(left) = wait.left(now) {
        if left.is_zero() {
            return Ok(false);
        }
        delay = delay.min(left);
    }
    // BLPOP takes seconds with millisecond resolution; 0 would mean "forever".
    let delay = delay.max(Duration::from_millis(1));
    let Some(conn) = pool.try_get() else {
        std::thread::sleep(delay);
        return Ok(true);
    };
    let mut conn = conn?;
    conn.set_timeout(delay + pool.connector.io_timeout())?;
    let seconds = format!("{:.3}", delay.as_secs_f64());
    conn.run(|c| {
        redis::cmd("BLPOP")
            .arg(wake_key)
            .arg(&seconds)
            .query::<Option<(String, String)>>(c)
    })?;
    Ok(true)
}
