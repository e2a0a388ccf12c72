//! How to run one request (its lane and bounds), and what comes back.

use std::time::{Duration, Instant};

use redis::Value;

use crate::cancel::Watch;
use crate::lane::Lane;

/// How to run one request. Made with [`Exec::new`] and narrowed with the setters.
#[derive(Clone, Copy)]
pub(crate) struct Exec<'a> {
    pub lane: Lane,
    /// Longest wait for each reply (a blocking call's reply gets its blocking time on top).
    pub io: Duration,
    /// Nothing (connecting, writing, reading) runs past this instant.
    pub cutoff: Option<Instant>,
    /// What may cancel the wait for the replies, and the pauses between tries.
    pub watch: &'a Watch,
    /// No refused request is tried again after this instant (a waiter's attempt before
    /// the end of its wait: the wait's deadline), on top of the usual window.
    pub retry_until: Option<Instant>,
}

/// A watch nothing but its deadline ends.
static NO_WATCH: std::sync::LazyLock<Watch> = std::sync::LazyLock::new(Watch::none);

impl Exec<'static> {
    /// A request on `lane` whose replies each come within `io`: no cutoff, nothing but
    /// its timeouts ends it, refusals tried again within the usual window.
    pub fn new(lane: Lane, io: Duration) -> Self {
        Exec {
            lane,
            io,
            cutoff: None,
            watch: &NO_WATCH,
            retry_until: None,
        }
    }
}

impl<'a> Exec<'a> {
    /// Nothing runs past `cutoff` (when given).
    pub fn cutoff(self, cutoff: Option<Instant>) -> Self {
        Exec { cutoff, ..self }
    }

    /// `watch` may end the waits of this request.
    pub fn watch<'b>(self, watch: &'b Watch) -> Exec<'b> {
        Exec {
            lane: self.lane,
            io: self.io,
            cutoff: self.cutoff,
            watch,
            retry_until: self.retry_until,
        }
    }

    /// A refused request is not tried again after `until` (when given).
    pub fn retry_until(self, until: Option<Instant>) -> Self {
        Exec {
            retry_until: until,
            ..self
        }
    }
}

/// The replies of a request, and when it was written: the server ran it after `sent_at`,
/// so a lease it set ends after `sent_at + ttl` (the conservative base of local deadlines).
pub(crate) struct Replies {
    pub values: Vec<Value>,
    pub sent_at: Instant,
}
