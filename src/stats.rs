//! Process-wide renewal figures, for monitoring: how many renewals ran, how many failed,
//! and how late they were sent.
//!
//! Lateness is what decides whether a lock survives a slow moment: a renewal is due a
//! third of the way into the lease, so one sent later than two thirds of the ttl after
//! that mark arrives after the key expired. Recording costs two relaxed atomic additions
//! per renewal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets per doubling of the lateness: a quantile is known to within 2^(1/4) ≈ 19 %.
const STEPS: u32 = 4;
/// Buckets: 0 µs to about 2^27 µs (134 s); later renewals fall in the last one.
const BUCKETS: usize = 4 + (STEPS as usize) * 26;

static RENEWED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static MAX_LATE_US: AtomicU64 = AtomicU64::new(0);
static LATENESS: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

/// The bucket of a lateness of `us` microseconds: exact below 4 µs, then four buckets per
/// doubling.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let log = 63 - us.leading_zeros(); // 2 or more
    let step = ((us >> (log - 2)) & 3) as usize;
    (4 + (log as usize - 2) * STEPS as usize + step).min(BUCKETS - 1)
}

/// The largest lateness (µs) that falls in bucket `i`.
fn bucket_top(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let log = (i - 4) / STEPS as usize + 2;
    let step = ((i - 4) % STEPS as usize) as u64;
    ((4 + step + 1) << (log - 2)) - 1
}

/// Records a renewal that succeeded, sent `late` after it was due.
pub(crate) fn renewed(late: Duration) {
    let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
    RENEWED.fetch_add(1, Ordering::Relaxed);
    LATENESS[bucket(us)].fetch_add(1, Ordering::Relaxed);
    MAX_LATE_US.fetch_max(us, Ordering::Relaxed);
}

/// Records a renewal attempt that failed (no reply in time, or an error).
pub(crate) fn renewal_failed() {
    FAILED.fetch_add(1, Ordering::Relaxed);
}

/// A snapshot of the renewal figures of this process since it started (all clients).
///
/// Take two and subtract with [`RenewalStats::since`] for the figures of an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewalStats {
    /// Renewals that succeeded.
    pub renewals: u64,
    /// Renewal attempts that failed (a lock is lost only when none succeeds before its
    /// local deadline).
    pub failures: u64,
    /// The latest renewal ever sent, past its due time (not reset by `since`).
    pub max_lateness: Duration,
    lateness: Vec<u64>,
}

impl RenewalStats {
    /// The figures of the interval from `earlier` (a snapshot taken before) to this one.
    pub fn since(&self, earlier: &RenewalStats) -> RenewalStats {
        RenewalStats {
            renewals: self.renewals.saturating_sub(earlier.renewals),
            failures: self.failures.saturating_sub(earlier.failures),
            max_lateness: self.max_lateness,
            lateness: self
                .lateness
                .iter()
                .zip(&earlier.lateness)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        }
    }

    /// How late (past the moment a third of the way into the lease) the renewals were
    /// sent: the smallest lateness that `q` (0.0 to 1.0) of them did not exceed, rounded
    /// up (to within 19 %), but never above [`max_lateness`](Self::max_lateness). Zero
    /// when there were none.
    pub fn lateness_quantile(&self, q: f64) -> Duration {
        let total: u64 = self.lateness.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let wanted = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.lateness.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                return Duration::from_micros(bucket_top(i)).min(self.max_lateness);
            }
        }
        self.max_lateness
    }
}

/// The renewal figures of this process so far: renewals, failures and lateness.
/// Thread-safe, non-blocking, cheap (a few hundred atomic loads).
pub fn renewal_stats() -> RenewalStats {
    RenewalStats {
        renewals: RENEWED.load(Ordering::Relaxed),
        failures: FAILED.load(Ordering::Relaxed),
        max_lateness: Duration::from_micros(MAX_LATE_US.load(Ordering::Relaxed)),
        lateness: LATENESS.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_lateness_in_order() {
        let mut last = 0;
        for us in (0..100_000).chain([1 << 30, u64::MAX]) {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            assert!(
                b == BUCKETS - 1 || us <= bucket_top(b),
                "{us} in bucket {b} (top {})",
                bucket_top(b)
            );
            if b > 0 && b < BUCKETS - 1 {
                assert!(us > bucket_top(b - 1), "{us}");
            }
            last = b;
        }
    }

    #[test]
    fn quantiles_round_up_within_a_fifth() {
        let mut stats = RenewalStats {
            renewals: 0,
            failures: 0,
            max_lateness: Duration::from_micros(1000),
            lateness: vec![0; BUCKETS],
        };
        for us in 1..=1000u64 {
            stats.lateness[bucket(us)] += 1;
        }
        let p99 = stats.lateness_quantile(0.99).as_micros() as f64;
        assert!((990.0..=990.0 * 1.2).contains(&p99), "{p99}");
        let p50 = stats.lateness_quantile(0.5).as_micros() as f64;
        assert!((500.0..=600.0).contains(&p50), "{p50}");
    }

    #[test]
    fn a_quantile_never_exceeds_the_largest_lateness() {
        let mut stats = RenewalStats {
            renewals: 1,
            failures: 0,
            max_lateness: Duration::from_micros(1000),
            lateness: vec![0; BUCKETS],
        };
        stats.lateness[bucket(1000)] += 1;
        assert!(
            bucket_top(bucket(1000)) > 1000,
            "the bucket's top is above the value"
        );
        assert_eq!(stats.lateness_quantile(1.0), stats.max_lateness);
        assert_eq!(stats.lateness_quantile(0.5), stats.max_lateness);
    }
}
