//! A client's estimate of a server's wall clock, so that an acquire can draw its fencing
//! token without asking the server for the time.
//!
//! Fencing tokens follow the server's clock in microseconds (see `next_fence` in
//! [`crate::scripts`]): that is what keeps them increasing across a counter the server
//! lost or a failover to a replica that missed its last writes. Reading the clock costs the
//! acquire script a `TIME` call; instead the client sends its estimate, kept from the last
//! time a script read the clock for it.
//!
//! The estimate is never ahead of the server's clock while the two clocks' rates differ by
//! no more than the drift allowance (1 %): the server read its clock before the reply that
//! carried the reading arrived, so "the reading plus 99 % of the time since the reply
//! arrived" cannot be ahead. It lags the clock by at most the reading's round trip (only
//! readings whose round trip took at most [`MAX_ROUND_TRIP`] are kept) plus 2 % of its
//! age (at most [`FRESH_FOR`]): together under 50 ms. After that, or before any reading,
//! the client sends 0 and the script reads `TIME` itself (as it does when it finds the
//! counter missing, the one case where a lagging estimate would matter at once).
//!
//! The estimate never makes a token smaller than the last one plus one (the script takes
//! the larger); it only decides how far a token jumps when the clock has moved on.

use std::time::{Duration, Instant};

/// How long a reading of the server's clock is used.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(2);

/// The longest round trip of a request whose reading of the server's clock is kept: the
/// estimate lags the clock by up to the round trip of its reading.
pub(crate) const MAX_ROUND_TRIP: Duration = Duration::from_millis(10);

/// The last reading of a server's clock (see the module documentation). Plain data: the
/// caller keeps one per client and guards it as it needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerTime {
    /// The server's clock in microseconds, and when the reply that carried it arrived.
    reading: Option<(u64, Instant)>,
}

impl ServerTime {
    /// The server's clock in microseconds at `now`, never ahead of it (clock rates within
    /// the drift allowance); 0 when there is no reading fresh enough, which tells the
    /// script to read the clock itself.
    pub fn estimate(&self, now: Instant) -> u64 {
        match self.reading {
            Some((clock, at)) => {
                let since = now.saturating_duration_since(at);
                if since >= FRESH_FOR {
                    return 0;
                }
                let since = since.as_micros() as u64;
                clock.saturating_add(since - since / 100)
            }
            None => 0,
        }
    }

    /// A script read the server's clock as `clock` (microseconds), for a request written
    /// at `sent` whose reply arrived at `arrived`. A reading whose round trip took longer
    /// than [`MAX_ROUND_TRIP`], or that arrived before the one kept, is ignored.
    pub fn observed(&mut self, clock: u64, sent: Instant, arrived: Instant) {
        if clock == 0 || arrived.saturating_duration_since(sent) > MAX_ROUND_TRIP {
            return;
        }
        match self.reading {
            Some((_, at)) if at > arrived => {}
            _ => self.reading = Some((clock, arrived)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn no_reading_asks_the_script_to_read_the_clock() {
        assert_eq!(ServerTime::default().estimate(Instant::now()), 0);
    }

    #[test]
    fn the_estimate_counts_from_the_replys_arrival_at_the_slowest_allowed_rate() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(1_000_000, t0 - MS, t0);
        assert_eq!(time.estimate(t0), 1_000_000);
        assert_eq!(time.estimate(t0 + 100 * MS), 1_099_000);
        // A clock read before the reading's arrival is not moved back.
        assert_eq!(time.estimate(t0 - MS), 1_000_000);
    }

    #[test]
    fn a_stale_reading_is_not_used() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(5, t0, t0);
        assert_ne!(time.estimate(t0 + FRESH_FOR - MS), 0);
        assert_eq!(time.estimate(t0 + FRESH_FOR), 0);
    }

    #[test]
    fn a_reading_from_a_slow_round_trip_is_not_kept() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(1_000, t0, t0 + MAX_ROUND_TRIP + MS);
        assert_eq!(time.estimate(t0 + 20 * MS), 0);
        time.observed(1_000, t0, t0 + MAX_ROUND_TRIP);
        assert_ne!(time.estimate(t0 + 20 * MS), 0);
    }

    #[test]
    fn a_later_reading_wins_over_an_earlier_one_that_arrived_last() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(2_000, t0, t0 + 2 * MS);
        time.observed(1_000, t0, t0 + MS);
        assert_eq!(time.estimate(t0 + 2 * MS), 2_000);
        time.observed(0, t0, t0 + 3 * MS);
        assert_eq!(time.estimate(t0 + 2 * MS), 2_000);
    }
}
