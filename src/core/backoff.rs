//! Waiting for a held lock: the caller's deadline, the waiter's grace, and backoff with
//! jitter.
//!
//! A waiter that can block on the server waits there for at most its backoff delay, cut
//! to the time left before the caller's deadline, to just after the current holder's lease
//! ends, and to two thirds of its registration's grace (so that it is back to renew its
//! registration before the registration lapses). A release wakes it at once; a release no
//! waiter saw (a foreign client's `DEL`) costs at most one delay. A deployment that cannot
//! block (Redlock) sleeps for the delay between attempts instead, with shorter delays.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// What the grace of a waiter adds to its I/O timeout.
const GRACE_MARGIN: Duration = Duration::from_millis(500);
/// Upper bound of the jitter added after a holder's lease ends, so that waiters whose
/// holder expired do not all retry in the same millisecond.
const EXPIRY_JITTER_MS: u64 = 5;

/// How long a waiter's registration, and a lock granted to it but not yet taken, live
/// unrefreshed: the I/O timeout plus half a second. A live waiter refreshes its
/// registration after every block, well within this; a crashed one's lapses after it.
/// Also how long a waiter goes on trying while Redis cannot be reached.
pub(crate) fn grace(io_timeout: Duration) -> Duration {
    io_timeout + GRACE_MARGIN
}

/// The longest finite wait accepted (about 34 years, as the longest ttl).
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(1 << 40);

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
    /// Waiting up to `wait` from `now`.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] when the deadline is not representable.
    pub fn up_to(wait: Duration, now: Instant) -> Result<Wait> {
        if wait.is_zero() {
            return Ok(Wait::No);
        }
        now.checked_add(wait)
            .filter(|_| wait <= MAX_WAIT)
            .map(Wait::Until)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "the wait of {wait:?} is too long (at most {MAX_WAIT:?}; wait forever instead)"
                ))
            })
    }

    /// Whether the acquire may wait at all.
    pub fn waits(self) -> bool {
        self != Wait::No
    }

    /// The instant the wait ends: `now` for a single attempt, `None` for no limit.
    pub fn deadline(self, now: Instant) -> Option<Instant> {
        match self {
            Wait::No => Some(now),
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

/// The delays of a backoff: the first, and the largest it doubles up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delays {
    pub first: Duration,
    pub max: Duration,
}

/// Delays of a waiter that blocks on the server: a release wakes it early, so a block can
/// be long.
pub(crate) const BLOCKING: Delays = Delays {
    first: Duration::from_millis(500),
    max: Duration::from_secs(2),
};

/// Delays of a waiter that cannot block (Redlock: no wake-up across members), which sleeps
/// between attempts.
pub(crate) const POLLING: Delays = Delays {
    first: Duration::from_millis(10),
    max: Duration::from_millis(500),
};

/// Exponential backoff with jitter: each delay is drawn from `[d/2, d]`, then `d` doubles
/// up to the maximum. Deterministic for a given random source.
pub(crate) struct Backoff {
    delays: Delays,
    delay: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff with `delays`, drawing its jitter from `rng`.
    pub fn new(delays: Delays, rng: fastrand::Rng) -> Self {
        Backoff {
            delays,
            delay: delays.first,
            rng,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let full = self.delay;
        self.delay = (self.delay * 2).min(self.delays.max);
        let half = full / 2;
        half + half.mul_f64(self.rng.f64())
    }

    /// How long the next block (or sleep) may last: the backoff delay, cut to the time
    /// `left` of the caller's wait, to just after the holder's lease (`holder_pttl`, when
    /// known), and to two thirds of the waiter's `grace`. At least 1 ms (`BLPOP` takes 0
    /// as "forever").
    pub fn next(
        &mut self,
        left: Option<Duration>,
        holder_pttl: Option<Duration>,
        grace: Duration,
    ) -> Duration {
        let mut delay = self.next_delay().min(grace * 2 / 3);
        if let Some(pttl) = holder_pttl {
            let jitter = Duration::from_millis(self.rng.u64(1..=EXPIRY_JITTER_MS));
            delay = delay.min(pttl + jitter);
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

    fn backoff() -> Backoff {
        Backoff::new(BLOCKING, fastrand::Rng::with_seed(7))
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let mut b = backoff();
        let first = b.next_delay();
        assert!(first >= BLOCKING.first / 2 && first <= BLOCKING.first);
        for _ in 0..20 {
            assert!(b.next_delay() <= BLOCKING.max);
        }
    }

    #[test]
    fn a_block_is_cut_to_the_wait_the_holder_and_the_grace() {
        let grace = Duration::from_millis(900);
        let mut b = backoff();
        for _ in 0..20 {
            assert!(b.next(None, None, grace) <= Duration::from_millis(600));
        }
        let d = b.next(Some(Duration::from_millis(50)), None, grace);
        assert!(d <= Duration::from_millis(50));
        let d = b.next(None, Some(Duration::from_millis(10)), grace);
        assert!(d <= Duration::from_millis(10 + EXPIRY_JITTER_MS));
        assert_eq!(
            b.next(Some(Duration::ZERO), None, grace),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let grace = Duration::from_secs(10);
        let mut a = backoff();
        let mut b = backoff();
        for _ in 0..10 {
            assert_eq!(a.next(None, None, grace), b.next(None, None, grace));
        }
    }

    #[test]
    fn waits_too_long_to_represent_are_refused() {
        let now = Instant::now();
        assert!(Wait::up_to(Duration::MAX, now).is_err());
        assert!(Wait::up_to(MAX_WAIT + Duration::from_millis(1), now).is_err());
        assert_eq!(Wait::up_to(Duration::ZERO, now).unwrap(), Wait::No);
    }
}
