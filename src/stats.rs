//! Process-wide figures, for monitoring and graphs: acquisitions and how they ended, waits
//! and how long they lasted, handoffs, lost locks by reason, unknown outcomes, and
//! renewals (how many ran, failed, and how late they were sent).
//!
//! Lateness is what decides whether a lock survives a slow moment: a renewal is due a
//! third of the way into the lease, so one sent later than two thirds of the ttl after
//! that mark arrives after the key expired. Recording costs a few relaxed atomic additions
//! per event; a snapshot ([`stats`]) a few hundred atomic loads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::core::lease::LostReason;
use crate::error::{Error, ErrorKind};

/// Buckets per doubling of a duration: a quantile is known to within 2^(1/4) ≈ 19 %.
const STEPS: u32 = 4;
/// Buckets: 0 µs to about 2^27 µs (134 s); longer durations fall in the last one.
pub(crate) const BUCKETS: usize = 4 + (STEPS as usize) * 26;

/// A histogram of durations in µs, updated with relaxed atomics.
struct Histogram {
    counts: [AtomicU64; BUCKETS],
    max_us: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Histogram {
            counts: [const { AtomicU64::new(0) }; BUCKETS],
            max_us: AtomicU64::new(0),
        }
    }

    fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Durations {
        Durations {
            counts: self
                .counts
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            max: Duration::from_micros(self.max_us.load(Ordering::Relaxed)),
        }
    }
}

/// A snapshot of a histogram of durations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Durations {
    pub(crate) counts: Vec<u64>,
    /// The longest ever recorded (not reset by `since`).
    pub(crate) max: Duration,
}

impl Durations {
    fn since(&self, earlier: &Durations) -> Durations {
        Durations {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
            max: self.max,
        }
    }

    /// The smallest duration that `q` (0.0 to 1.0) of the recorded ones did not exceed,
    /// rounded up (to within 19 %) but never above the longest recorded. Zero when none
    /// were recorded.
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        let total = self.counts.iter().fold(0u64, |a, n| a.saturating_add(*n));
        if total == 0 {
            return Duration::ZERO;
        }
        let wanted = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, n) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(*n);
            if seen >= wanted {
                return Duration::from_micros(bucket_top(i)).min(self.max);
            }
        }
        self.max
    }
}

static RENEWED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static LATENESS: Histogram = Histogram::new();
static ACQUIRED: AtomicU64 = AtomicU64::new(0);
static BUSY: AtomicU64 = AtomicU64::new(0);
static CANCELLED: AtomicU64 = AtomicU64::new(0);
static FAILED_ACQUIRES: AtomicU64 = AtomicU64::new(0);
static WAITS: Histogram = Histogram::new();
static HANDOFFS: AtomicU64 = AtomicU64::new(0);
static LOST_NOT_HELD: AtomicU64 = AtomicU64::new(0);
static LOST_UNREACHABLE: AtomicU64 = AtomicU64::new(0);
static UNKNOWN: AtomicU64 = AtomicU64::new(0);

/// The bucket of a duration of `us` microseconds: exact below 4 µs, then four buckets per
/// doubling.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let log = 63 - us.leading_zeros(); // 2 or more
    let step = ((us >> (log - 2)) & 3) as usize;
    (4 + (log as usize - 2) * STEPS as usize + step).min(BUCKETS - 1)
}

/// The largest duration (µs) that falls in bucket `i`.
pub(crate) fn bucket_top(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let log = (i - 4) / STEPS as usize + 2;
    let step = ((i - 4) % STEPS as usize) as u64;
    ((4 + step + 1) << (log - 2)) - 1
}

/// Records a renewal that succeeded, sent `late` after it was due.
pub(crate) fn renewed(late: Duration) {
    RENEWED.fetch_add(1, Ordering::Relaxed);
    LATENESS.record(late);
}

/// Records a renewal attempt that failed (no reply in time, or an error).
pub(crate) fn renewal_failed() {
    FAILED.fetch_add(1, Ordering::Relaxed);
}

/// Records how an acquire ended, after `took`; `waited`: it blocked or slept at least once
/// (its first attempt found the lock held).
pub(crate) fn acquire_ended<T>(result: &Result<T, Error>, took: Duration, waited: bool) {
    if waited {
        WAITS.record(took);
    }
    match result {
        Ok(_) => ACQUIRED.fetch_add(1, Ordering::Relaxed),
        Err(e) if e.kind() == ErrorKind::Busy => BUSY.fetch_add(1, Ordering::Relaxed),
        Err(e) if e.kind() == ErrorKind::Cancelled => CANCELLED.fetch_add(1, Ordering::Relaxed),
        Err(_) => FAILED_ACQUIRES.fetch_add(1, Ordering::Relaxed),
    };
    if let Err(e) = result {
        unknown_if(e);
    }
}

/// Records a release that handed the lock straight to a waiter.
pub(crate) fn handed_off() {
    HANDOFFS.fetch_add(1, Ordering::Relaxed);
}

/// Records a lock lost (once per lock).
pub(crate) fn lost(reason: LostReason) {
    match reason {
        LostReason::NotHeld => LOST_NOT_HELD.fetch_add(1, Ordering::Relaxed),
        LostReason::Unreachable => LOST_UNREACHABLE.fetch_add(1, Ordering::Relaxed),
    };
}

/// Records a call that failed with its outcome unknown (a request out, no reply).
pub(crate) fn unknown_if(e: &Error) {
    if e.outcome_unknown() {
        UNKNOWN.fetch_add(1, Ordering::Relaxed);
    }
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
    lateness: Durations,
}

impl RenewalStats {
    /// The figures of the interval from `earlier` (a snapshot taken before) to this one.
    pub fn since(&self, earlier: &RenewalStats) -> RenewalStats {
        RenewalStats {
            renewals: self.renewals.saturating_sub(earlier.renewals),
            failures: self.failures.saturating_sub(earlier.failures),
            max_lateness: self.max_lateness,
            lateness: self.lateness.since(&earlier.lateness),
        }
    }

    /// How late (past the moment a third of the way into the lease) the renewals were
    /// sent: the smallest lateness that `q` (0.0 to 1.0) of them did not exceed, rounded
    /// up (to within 19 %), but never above [`max_lateness`](Self::max_lateness). Zero
    /// when there were none.
    pub fn lateness_quantile(&self, q: f64) -> Duration {
        self.lateness.quantile(q)
    }

    pub(crate) fn lateness(&self) -> &Durations {
        &self.lateness
    }
}

/// The renewal figures of this process so far: renewals, failures and lateness.
/// Thread-safe, non-blocking, cheap (a few hundred atomic loads).
pub fn renewal_stats() -> RenewalStats {
    let lateness = LATENESS.snapshot();
    RenewalStats {
        renewals: RENEWED.load(Ordering::Relaxed),
        failures: FAILED.load(Ordering::Relaxed),
        max_lateness: lateness.max,
        lateness,
    }
}

/// A snapshot of this process's figures since it started (every client): counters only
/// grow. Take two and subtract with [`Stats::since`] for the figures of an interval (what
/// a graph wants); a Prometheus exporter can publish the counters as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquires that took the lock (every kind; a reentrant lock's extra holds included).
    pub acquisitions: u64,
    /// Acquires that ended busy (the wait ended while it was held elsewhere).
    pub busy: u64,
    /// Acquires cancelled on purpose.
    pub cancelled: u64,
    /// Acquires that failed otherwise (connection, server, replication errors).
    pub failed: u64,
    /// Acquires that had to wait (their first attempt found the lock held), however they
    /// ended.
    pub waits: u64,
    /// The longest such wait ever (not reset by `since`).
    pub max_wait: Duration,
    /// Releases that handed the lock straight to a waiter.
    pub handoffs: u64,
    /// Locks lost because the key no longer held their token.
    pub lost_not_held: u64,
    /// Locks lost because Redis stayed unreachable until their lease ran out.
    pub lost_unreachable: u64,
    /// Calls (acquire, extend, release) that failed with their outcome unknown: a request
    /// went out and its reply never came.
    pub unknown_outcomes: u64,
    /// The renewals.
    pub renewals: RenewalStats,
    waited: Durations,
}

impl Stats {
    /// The figures of the interval from `earlier` (a snapshot taken before) to this one.
    /// The maxima stay those of the whole life of the process.
    pub fn since(&self, earlier: &Stats) -> Stats {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        Stats {
            acquisitions: d(self.acquisitions, earlier.acquisitions),
            busy: d(self.busy, earlier.busy),
            cancelled: d(self.cancelled, earlier.cancelled),
            failed: d(self.failed, earlier.failed),
            waits: d(self.waits, earlier.waits),
            max_wait: self.max_wait,
            handoffs: d(self.handoffs, earlier.handoffs),
            lost_not_held: d(self.lost_not_held, earlier.lost_not_held),
            lost_unreachable: d(self.lost_unreachable, earlier.lost_unreachable),
            unknown_outcomes: d(self.unknown_outcomes, earlier.unknown_outcomes),
            renewals: self.renewals.since(&earlier.renewals),
            waited: self.waited.since(&earlier.waited),
        }
    }

    /// How long the waits lasted: the smallest wait that `q` (0.0 to 1.0) of them did not
    /// exceed, rounded up (to within 19 %), never above [`max_wait`](Self::max_wait).
    /// Zero when there were none.
    pub fn wait_quantile(&self, q: f64) -> Duration {
        self.waited.quantile(q)
    }

    pub(crate) fn waited(&self) -> &Durations {
        &self.waited
    }
}

/// The parts of a [`Stats`] snapshot, for the C ABI (which hands snapshots back to
/// `lock_stats_since`).
pub(crate) struct Parts {
    pub acquisitions: u64,
    pub busy: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub handoffs: u64,
    pub lost_not_held: u64,
    pub lost_unreachable: u64,
    pub unknown_outcomes: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
    pub wait_counts: Vec<u64>,
    pub max_wait: Duration,
    pub lateness_counts: Vec<u64>,
    pub max_lateness: Duration,
}

/// A [`Stats`] made of its parts.
pub(crate) fn from_parts(p: Parts) -> Stats {
    let waited = Durations {
        counts: p.wait_counts,
        max: p.max_wait,
    };
    Stats {
        acquisitions: p.acquisitions,
        busy: p.busy,
        cancelled: p.cancelled,
        failed: p.failed,
        waits: waited.counts.iter().fold(0u64, |a, n| a.saturating_add(*n)),
        max_wait: p.max_wait,
        handoffs: p.handoffs,
        lost_not_held: p.lost_not_held,
        lost_unreachable: p.lost_unreachable,
        unknown_outcomes: p.unknown_outcomes,
        renewals: RenewalStats {
            renewals: p.renewals,
            failures: p.renewal_failures,
            max_lateness: p.max_lateness,
            lateness: Durations {
                counts: p.lateness_counts,
                max: p.max_lateness,
            },
        },
        waited,
    }
}

/// This process's figures so far. Thread-safe, non-blocking, cheap (a few hundred atomic
/// loads).
pub fn stats() -> Stats {
    let waited = WAITS.snapshot();
    Stats {
        acquisitions: ACQUIRED.load(Ordering::Relaxed),
        busy: BUSY.load(Ordering::Relaxed),
        cancelled: CANCELLED.load(Ordering::Relaxed),
        failed: FAILED_ACQUIRES.load(Ordering::Relaxed),
        waits: waited.counts.iter().fold(0u64, |a, n| a.saturating_add(*n)),
        max_wait: waited.max,
        handoffs: HANDOFFS.load(Ordering::Relaxed),
        lost_not_held: LOST_NOT_HELD.load(Ordering::Relaxed),
        lost_unreachable: LOST_UNREACHABLE.load(Ordering::Relaxed),
        unknown_outcomes: UNKNOWN.load(Ordering::Relaxed),
        renewals: renewal_stats(),
        waited,
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
        let mut stats = Durations {
            counts: vec![0; BUCKETS],
            max: Duration::from_micros(1000),
        };
        for us in 1..=1000u64 {
            stats.counts[bucket(us)] += 1;
        }
        let p99 = stats.quantile(0.99).as_micros() as f64;
        assert!((990.0..=990.0 * 1.2).contains(&p99), "{p99}");
        let p50 = stats.quantile(0.5).as_micros() as f64;
        assert!((500.0..=600.0).contains(&p50), "{p50}");
    }

    #[test]
    fn a_quantile_never_exceeds_the_largest_value() {
        let mut stats = Durations {
            counts: vec![0; BUCKETS],
            max: Duration::from_micros(1000),
        };
        stats.counts[bucket(1000)] += 1;
        assert!(
            bucket_top(bucket(1000)) > 1000,
            "the bucket's top is above the value"
        );
        assert_eq!(stats.quantile(1.0), stats.max);
        assert_eq!(stats.quantile(0.5), stats.max);
    }
}
