//! Waiting for a held lock: the caller's deadline, backoff with jitter, and how long one
//! block on the server may last.
//!
//! A waiter blocks on the server (see [`crate::acquire`]) for at most its backoff delay,
//! cut to the time left before the caller's deadline, to just after the current holder's
//! lease ends, and to two thirds of its registration's grace (so that it is back to renew
//! its registration before the registration lapses). A release wakes it at once; a release
//! no waiter saw (a foreign client's `DEL`) costs at most one delay.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// First backoff delay; doubles per attempt up to [`MAX_DELAY`].
const MIN_DELAY: Duration = Duration::from_millis(500);
/// Largest backoff delay.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Upper bound of the jitter added after a holder's lease ends, so that waiters whose
/// holder expired do not all retry in the same millisecond.
const EXPIRY_JITTER_MS: u64 = 5;
/// What the grace of a waiter adds to its I/O timeout.
const GRACE_MARGIN: Duration = Duration::from_millis(500);

/// How long a waiter's registration, and a lock granted to it but not yet taken, live
/// unrefreshed: the I/O timeout plus half a second. A live waiter refreshes its
/// registration after every block, well within this; a crashed one's lapses after it.
pub(crate) fn grace(io_timeout: Duration) -> Duration {
    io_timeout + GRACE_MARGIN
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
    /// Errors: [`crate::ErrorKind::InvalidArgument`] when the deadline is not representable.
    pub fn up_to(wait: Duration) -> Result<Wait> {
        if wait.is_zero() {
            return Ok(Wait::No);
        }
        Instant::now()
            .checked_add(wait)
            .filter(|_| wait <= MAX_WAIT)
            .map(Wait::Until)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "the wait of {wait:?} is too long (at most {MAX_WAIT:?}; wait forever instead)"
                ))
            })
    }

    /// The instant the wait ends, `None` for no limit.
    pub fn deadline(self) -> Option<Instant> {
        match self {
            Wait::No => Some(Instant::now()),
            Wait::Until(deadline) => Some(deadline),
            Wait::Forever => None,
        }
    }

    /// Time left, `None` for no limit.
    pub fn left(self, now: Instant) -> Option<Duration> {
        match self {
            Wait::No => Some(Duration::ZERO),
            Wait::Until(deadline) => Some(deadline.saturating_duration_since(now)),
            Wait::Forever => None,
        }
    }
}

/// The longest finite wait accepted (about 34 years, as the longest ttl).
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(1 << 40);

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

    /// How long the next block may last: the backoff delay, cut to the time `left` of the
    /// caller's wait, to just after the holder's lease (`holder_pttl_ms`, negative when
    /// unknown), and to two thirds of the waiter's `grace`. At least 1 ms (`BLPOP` takes 0
    /// as "forever").
    pub fn block_for(
        &mut self,
        left: Option<Duration>,
        holder_pttl_ms: i64,
        grace: Duration,
    ) -> Duration {
        let mut delay = self.next_delay().min(grace * 2 / 3);
        if let Ok(pttl) = u64::try_from(holder_pttl_ms) {
            let jitter = fastrand::u64(1..=EXPIRY_JITTER_MS);
            delay = delay.min(Duration::from_millis(pttl + jitter));
        }
        if let Some(left) = left {
            delay = delay.min(left);
        }
        delay.max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let mut b = Backoff::new();
        let first = b.next_delay();
        assert!(first >= MIN_DELAY / 2 && first <= MIN_DELAY);
        for _ in 0..20 {
            assert!(b.next_delay() <= MAX_DELAY);
        }
    }

    #[test]
    fn a_block_is_cut_to_the_wait_the_holder_and_the_grace() {
        let grace = Duration::from_millis(900);
        let mut b = Backoff::new();
        for _ in 0..20 {
            assert!(b.block_for(None, -1, grace) <= Duration::from_millis(600));
        }
        let d = b.block_for(Some(Duration::from_millis(50)), -1, grace);
        assert!(d <= Duration::from_millis(50));
        let d = b.block_for(None, 10, grace);
        assert!(d <= Duration::from_millis(10 + EXPIRY_JITTER_MS));
        assert_eq!(
            b.block_for(Some(Duration::ZERO), -1, grace),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn waits_too_long_to_represent_are_refused() {
        assert!(Wait::up_to(Duration::MAX).is_err());
        assert!(Wait::up_to(MAX_WAIT + Duration::from_millis(1)).is_err());
        assert_eq!(Wait::up_to(Duration::ZERO).unwrap(), Wait::No);
    }
}
