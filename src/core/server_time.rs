//! A client's estimate of a server's wall clock, so that an acquire can draw its fencing
//! token without asking the server for the time.
//!
//! Fencing tokens follow the server's clock in microseconds (see `next_fence` in
//! [`crate::scripts`]): that is what keeps them increasing across a counter the server
//! lost. Reading the clock costs the acquire script a `TIME` call; instead the client
//! sends its estimate, kept from the last time a script read the clock for it. The
//! estimate is a lower bound as long as the two clocks run at the same rate: the server
//! read its clock before the reply that carried it arrived, so "that reading plus the time
//! since the reply arrived" is never ahead of the server. It is trusted for
//! [`FRESH_FOR`]; after that (or before any reading) the client sends 0 and the script
//! reads `TIME` again.
//!
//! The estimate never makes a token smaller than the last one plus one (the script takes
//! the larger); it only decides how far a token jumps when the clock has moved on.

use std::time::{Duration, Instant};

/// How long a reading of the server's clock is used: a rate difference within the drift
/// allowance (1 %) moves the estimate by at most 100 ms over this time.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(10);

/// The last reading of a server's clock (see the module documentation). Plain data: the
/// caller keeps one per client and guards it as it needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerTime {
    /// The server's clock in microseconds, and when the reply that carried it arrived.
    reading: Option<(u64, Instant)>,
}

impl ServerTime {
    /// The server's clock in microseconds at `now`, never ahead of it (clock rates
    /// agreeing); 0 when there is no reading fresh enough, which tells the script to read
    /// the clock itself.
    pub fn estimate(&self, now: Instant) -> u64 {
        match self.reading {
            Some((clock, at)) => {
                let since = now.saturating_duration_since(at);
                if since >= FRESH_FOR {
                    return 0;
                }
                clock.saturating_add(since.as_micros() as u64)
            }
            None => 0,
        }
    }

    /// A script read the server's clock as `clock` (microseconds), in a reply that arrived
    /// at `arrived`. A reading that arrived earlier than the one kept is ignored.
    pub fn observed(&mut self, clock: u64, arrived: Instant) {
        if clock == 0 {
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
    fn the_estimate_counts_from_the_replys_arrival() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(1_000_000, t0);
        assert_eq!(time.estimate(t0), 1_000_000);
        assert_eq!(time.estimate(t0 + 7 * MS), 1_007_000);
        // A clock read before the reading's arrival is not moved back.
        assert_eq!(time.estimate(t0 - MS), 1_000_000);
    }

    #[test]
    fn a_stale_reading_is_not_used() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(5, t0);
        assert_eq!(time.estimate(t0 + FRESH_FOR - MS), 5 + 9_999_000);
        assert_eq!(time.estimate(t0 + FRESH_FOR), 0);
    }

    #[test]
    fn a_later_reading_wins_over_an_earlier_one_that_arrived_last() {
        let t0 = Instant::now();
        let mut time = ServerTime::default();
        time.observed(2_000, t0 + 2 * MS);
        time.observed(1_000, t0 + MS);
        assert_eq!(time.estimate(t0 + 2 * MS), 2_000);
        time.observed(0, t0 + 3 * MS);
        assert_eq!(time.estimate(t0 + 3 * MS), 3_000);
    }
}
