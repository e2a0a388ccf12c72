//! Which connections a request may use: the lanes of a node's pools (see [`crate::pool`]),
//! chosen by the protocol core for each request it sends.

use std::time::Instant;

/// Which share of a node's connections a request draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// A caller's request (an acquire attempt, a query): at most the pool size at once;
    /// waits for a free slot until the given instant, first come first served.
    Caller(Instant),
    /// A waiter blocked on the server: at most the pool size at once; when all are taken
    /// the waiter is told so (and sleeps instead).
    Blocking,
    /// A release, an extend, a waiter's last attempt: never waits for a slot.
    Urgent,
    /// A renewal: connections of their own, never waited for, so callers cannot starve
    /// the renewal of a lease.
    Renewal,
}
