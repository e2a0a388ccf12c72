//! The acquire, as a state machine: attempt, register, block, confirm a grant, settle,
//! give back, withdraw, back off, give up.
//!
//! [`AcquireMachine::step`] takes what happened (an [`Event`]: a reply, a refusal, a
//! timeout, an unknown outcome, a pause that ended) with the time and whether the caller
//! cancelled, and returns what to do next (an [`Action`]: a request to send, a pause, or
//! the result). It never touches a socket, a thread or the clock; the runtime
//! ([`crate::acquire`]) and the simulation drive it.
//!
//! The protocol is the one of [`crate::scripts`]. A waiter's attempt that finds the lock
//! held registers it; the waiter then blocks on the wake list with an attempt pipelined
//! behind the block, so the server runs the attempt the moment the block returns, and a
//! grant a release made is believed only once that attempt confirmed it against the key.
//! Each attempt's lease is timed from the moment its request was written. A deployment
//! that cannot block (Redlock) sleeps between attempts instead.
//!
//! Invariants:
//!
//! - A token names one acquisition attempt: once a give-back (a release or a withdrawal)
//!   was sent under a token, no attempt is ever sent under it again; the machine draws a
//!   fresh one. (A late give-back could otherwise delete the key a later attempt took.)
//! - Every request, give-backs included, is cut at the acquire's own cutoff: the end of
//!   the wait plus one request's bounds. A give-back that no longer fits goes out in the
//!   background, bounded by one I/O timeout: the call does not wait for it.
//! - A failed acquire holds nothing: whatever the server may hold under the token (a
//!   registration, a grant an unanswered attempt took) is withdrawn, or lapses within the
//!   waiter's grace or the attempt's lease.

use std::fmt;
use std::time::{Duration, Instant};

use crate::core::backoff::{self, Backoff, Wait};
use crate::core::lease::local_deadline;
use crate::core::reply::{Answer, AttemptReply, ExtendReply, Mode, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;

/// How long a Redis server may end a blocking command past its timeout: it checks blocked
/// clients' timeouts when its event loop wakes, at least every 1/hz s (100 ms at the
/// default `hz 10`).
pub(crate) const BLOCK_LATENESS: Duration = Duration::from_millis(250);
/// How long a cancelled acquire may spend withdrawing.
const QUICK_WITHDRAW: Duration = Duration::from_millis(100);
/// Pause before a waiter tries again after a connection failure or a refusal.
const RECOVERY_PAUSE: Duration = Duration::from_millis(100);
/// A give-back with less time than this left in the call's bounds goes out in the
/// background.
const MIN_INLINE: Duration = Duration::from_millis(20);

/// The bounds of one request: waiting for a pooled connection, connecting, each reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub pool_wait: Duration,
    pub connect: Duration,
    pub io: Duration,
}

/// What an acquire is asked for.
#[derive(Debug, Clone)]
pub(crate) struct AcquireSpec {
    /// The lock key, for messages.
    pub key: String,
    pub ttl: Duration,
    pub wait: Wait,
    /// The lock will be renewed: a short lease needs no extend before the acquire returns.
    pub renew: bool,
    /// The deployment lets waiters block on the server for a release (registrations, wake
    /// lists, grants); otherwise (a quorum) a waiter sleeps between attempts, and every
    /// attempt that is not granted is given back first: it may hold part of the lock (a
    /// minority of members).
    pub blocks: bool,
    pub bounds: Bounds,
    /// How long replicas are waited for after each write (`min_replicas`; zero without).
    pub replicas: Duration,
    /// A waiter that blocks lets a release hand it the lock itself (a kind that
    /// [`crate::kinds::Kind::hands_over`], whose writes no replica must acknowledge):
    /// every attempt leads its block, and a grant arrives on the waiter's own wake list
    /// (see [`crate::scripts::RELEASE`]).
    pub direct: bool,
    /// A waiter of a deployment that cannot block came while others of its process waited
    /// for the name ([`crate::core::line`]): it sleeps for a backoff's delay (or until it
    /// is woken) before its first attempt.
    pub behind: bool,
}

/// A lock taken: its fencing token, the lease the key was given (the ttl, or less for a
/// grant taken from a release), and when the request that set that lease was written (the
/// conservative start of the lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub fencing_token: u64,
    pub lease: Duration,
    pub sent_at: Instant,
}

/// What a successful acquire holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub granted: Granted,
    /// The token the hold was taken under (tokens change after a give-back).
    pub token: String,
    /// For one more hold of a reentrant lock its owner held: the lock's token.
    pub reentered: Option<String>,
}

/// An attempt to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptPlan {
    pub token: String,
    pub mode: Mode,
    /// Block on the wake list for this long first, the attempt pipelined behind the block.
    pub block: Option<Duration>,
    /// A waiter's first attempt ([`Mode::Lead`]) goes ahead of the block, in the same
    /// write: it registers, or takes the lock and wakes the block at once.
    pub lead: bool,
    /// As [`AcquireSpec::direct`]: nothing follows the block, a release's grant comes
    /// through it.
    pub direct: bool,
    /// A leading attempt, the first under its token: nothing can have been pushed to the
    /// waiter's own wake list yet, so the attempt need not empty it.
    pub first_lead: bool,
    pub lane: Lane,
    /// Nothing of the request runs past this.
    pub cutoff: Option<Instant>,
    /// A request the server refuses for now is tried again by the backend until then.
    pub retry_until: Option<Instant>,
}

/// What the runtime should do next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Send this attempt; answer with [`Event::Attempted`] (or
    /// [`Event::NoBlockingConnection`] for a block that found every blocking connection
    /// taken).
    Attempt(AttemptPlan),
    /// Extend the hold just taken under `token` to `ttl` (its lease was short); answer
    /// with [`Event::Extended`].
    Extend {
        token: String,
        ttl: Duration,
        cutoff: Option<Instant>,
    },
    /// Send the release script for `token` as a waiter's withdrawal: it gives back a hold
    /// and a registration. When `background`, send it without waiting, and answer with
    /// [`Event::GaveBack`]`(None)` at once; otherwise wait for it, nothing past `cutoff`.
    GiveBack {
        token: String,
        cutoff: Instant,
        background: bool,
    },
    /// Sleep until this instant, unless cancelled; answer with [`Event::Paused`].
    Pause { until: Instant },
    /// The acquire is over.
    Done(Result<Acquired>),
}

/// What happened to the last action.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// Nothing yet: the first step.
    Start,
    Attempted(Result<Answer<AttemptReply>>),
    /// A block found every blocking connection taken: nothing was sent.
    NoBlockingConnection,
    /// The settling extend's reply, and when its request was written; a replication
    /// shortfall is an error.
    Extended(Result<(ExtendReply, Instant)>),
    /// The give-back's reply; `None` when it went out in the background.
    GaveBack(Option<Result<ReleaseReply>>),
    /// A pause ended (`Err`: cancelled).
    Paused(Result<()>),
}

/// Where the machine is.
#[derive(Debug)]
enum Phase {
    Start,
    /// An attempt is in flight; `last`: the wait is over once it is answered.
    Attempting {
        mode: Mode,
        last: bool,
        block: Option<Duration>,
        lead: bool,
    },
    /// A block found no connection: sleeping for it, then attempting in `mode`.
    SleepingInsteadOfBlocking {
        mode: Mode,
        last: bool,
        lane: Lane,
    },
    /// Sleeping before the next attempt.
    BackingOff,
    /// The extend of a grant with a short lease is in flight.
    Settling {
        granted: Granted,
        last: bool,
    },
    /// A give-back is in flight.
    GivingBack(AfterGiveBack),
    Done,
}

/// What follows a give-back.
#[derive(Debug)]
enum AfterGiveBack {
    /// A grant that could not be used was given back: try again (under a fresh token).
    TryAgain { last: bool },
    /// A quorum attempt that was not granted was given back: back off, then try again.
    BackOff { holder_pttl: Option<Duration> },
    /// A quorum attempt that failed was given back: pause, then try again.
    Recover,
    /// The acquire fails with this error.
    Fail(Error),
    /// A grant too few replicas acknowledged was rolled back: fail with this error.
    RolledBack(Error),
}

/// One acquire in progress (see the module documentation).
pub(crate) struct AcquireMachine {
    spec: AcquireSpec,
    tokens: Box<dyn FnMut() -> String + Send>,
    token: String,
    /// Nothing of the acquire runs past this: the end of the wait plus one request's
    /// bounds. `None` for a wait without end.
    cutoff: Option<Instant>,
    grace: Duration,
    backoff: Backoff,
    phase: Phase,
    /// The server may hold something under `token`: a registration, or a grant an
    /// attempt whose reply was lost took.
    registered: bool,
    /// An attempt under `token` led a block (or was planned to): releases may have
    /// pushed to the waiter's own wake list.
    led: bool,
    /// The next attempt goes on its own, without a block first.
    plain_next: bool,
    failing_since: Option<Instant>,
    refused_since: Option<Instant>,
    warned: bool,
    holder_pttl: Option<Duration>,
}

impl fmt::Debug for AcquireMachine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireMachine")
            .field("key", &self.spec.key)
            .field("token", &self.token)
            .field("phase", &self.phase)
            .field("registered", &self.registered)
            .finish()
    }
}

impl AcquireMachine {
    /// An acquire of `spec`, started at `now`, that draws its tokens from `tokens` and the
    /// jitter of its backoff from `rng`.
    pub fn new(
        spec: AcquireSpec,
        now: Instant,
        mut tokens: Box<dyn FnMut() -> String + Send>,
        rng: fastrand::Rng,
    ) -> Self {
        let b = spec.bounds;
        let cutoff = match spec.wait {
            Wait::No => Some(now + b.pool_wait + b.connect + b.io + spec.replicas),
            // A waiter waits for a pooled connection no longer than its wait.
            Wait::Until(deadline) => {
                Some(deadline + b.connect + b.io + BLOCK_LATENESS + spec.replicas)
            }
            Wait::Forever => None,
        };
        let delays = if spec.blocks {
            backoff::BLOCKING
        } else {
            backoff::POLLING
        };
        AcquireMachine {
            grace: backoff::grace(b.io),
            token: tokens(),
            tokens,
            cutoff,
            backoff: Backoff::new(delays, rng),
            spec,
            phase: Phase::Start,
            registered: false,
            led: false,
            plain_next: true,
            failing_since: None,
            refused_since: None,
            warned: false,
            holder_pttl: None,
        }
    }

    /// The token the next request goes under.
    #[cfg(test)]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Nothing of the acquire runs past this (`None`: no limit).
    #[cfg(test)]
    pub fn cutoff(&self) -> Option<Instant> {
        self.cutoff
    }

    /// The next action, given what happened to the last one, the time, and whether the
    /// caller has cancelled the wait.
    pub fn step(&mut self, event: Event, now: Instant, cancelled: bool) -> Action {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, event) {
            (Phase::Start, Event::Start) if self.waits_its_turn() => {
                if cancelled {
                    return self.give_up(cancelled_error(), true, now);
                }
                let left = self.spec.wait.left(now);
                let pause = self.backoff.next(left, None, self.grace);
                self.phase = Phase::BackingOff;
                Action::Pause { until: now + pause }
            }
            (Phase::Start, Event::Start) => self.next_attempt(now, cancelled),
            (Phase::Attempting { last, lead, .. }, Event::Attempted(result)) => {
                if let (true, Err(e)) = (lead, &result) {
                    // The lead attempt may have registered before a later call failed.
                    self.registered |= e.outcome_unknown() || e.kind() == ErrorKind::Server;
                }
                self.attempted(last, result, now, cancelled)
            }
            // A first attempt that found no blocking connection goes on its own at once.
            (Phase::Attempting { lead: true, .. }, Event::NoBlockingConnection)
                if !self.registered =>
            {
                let lane = self.caller_lane(now, false);
                self.attempt(Mode::Waiter, None, lane, false, now)
            }
            (
                Phase::Attempting {
                    mode,
                    last,
                    block: Some(block),
                    ..
                },
                Event::NoBlockingConnection,
            ) => {
                let lane = self.caller_lane(now, last);
                self.phase = Phase::SleepingInsteadOfBlocking { mode, last, lane };
                Action::Pause { until: now + block }
            }
            (Phase::SleepingInsteadOfBlocking { mode, last, lane }, Event::Paused(Ok(()))) => {
                self.attempt(mode, None, lane, last, now)
            }
            (Phase::BackingOff, Event::Paused(Ok(()))) => self.next_attempt(now, cancelled),
            (
                Phase::SleepingInsteadOfBlocking { .. } | Phase::BackingOff,
                Event::Paused(Err(e)),
            ) => self.give_up(e, true, now),
            (Phase::Settling { granted, last }, Event::Extended(result)) => {
                self.settled(granted, last, result, now, cancelled)
            }
            (Phase::GivingBack(then), Event::GaveBack(result)) => {
                self.gave_back(then, result, now, cancelled)
            }
            (phase, event) => Action::Done(Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the acquire of {:?} got {event:?} in {phase:?}",
                    self.spec.key
                ),
            ))),
        }
    }

    /// The caller lane of an attempt at `now`: a waiter waits for a pooled connection no
    /// longer than its wait, and its last attempt (which withdraws) takes any connection
    /// rather than wait at all.
    fn caller_lane(&self, now: Instant, last: bool) -> Lane {
        let by = now + self.spec.bounds.pool_wait;
        match self.spec.wait {
            Wait::No => Lane::Caller(by),
            _ if last => Lane::Urgent,
            wait => Lane::Caller(wait.deadline(now).map_or(by, |d| d.min(by))),
        }
    }

    /// The top of the loop: the next attempt, plain or after a block.
    /// A waiter that lets others of its process try first (see [`AcquireSpec::behind`]).
    fn waits_its_turn(&self) -> bool {
        self.spec.behind && self.spec.wait.waits() && !self.spec.blocks
    }

    fn next_attempt(&mut self, now: Instant, cancelled: bool) -> Action {
        let wait = self.spec.wait;
        if wait.waits() && cancelled {
            return self.give_up(cancelled_error(), true, now);
        }
        let left = wait.left(now);
        let last = left == Some(Duration::ZERO);
        let lane = self.caller_lane(now, last);
        if !wait.waits() || !self.spec.blocks {
            return self.attempt(Mode::Once, None, lane, !wait.waits() || last, now);
        }
        if self.spec.direct && !last {
            // Every round is one write: an attempt that registers the waiter (or takes the
            // lock, or finds it handed over already) with the block pipelined behind it.
            // After a block an attempt may also take a grant made through the wake list
            // (by a release of version 0.2).
            self.plain_next = false;
            let block = self.backoff.next(left, self.holder_pttl, self.grace);
            let mode = if self.registered {
                Mode::AfterBlock
            } else {
                Mode::Lead
            };
            self.phase = Phase::Attempting {
                mode,
                last: false,
                block: Some(block),
                lead: true,
            };
            return Action::Attempt(self.plan(mode, Some(block), true, Lane::Blocking, now));
        }
        let lead = self.plain_next && !last && !self.registered;
        if (self.plain_next || last) && !lead {
            self.plain_next = false;
            let mode = if last { Mode::Last } else { Mode::AfterBlock };
            return self.attempt(mode, None, lane, last, now);
        }
        self.plain_next = false;
        let block = self.backoff.next(left, self.holder_pttl, self.grace);
        let last = left.is_some_and(|left| left <= block);
        let mode = if last { Mode::Last } else { Mode::AfterBlock };
        if lead {
            // A waiter's first attempt, its block and the attempt after the block, in one
            // write.
            self.phase = Phase::Attempting {
                mode,
                last,
                block: Some(block),
                lead: true,
            };
            return Action::Attempt(self.plan(mode, Some(block), true, Lane::Blocking, now));
        }
        self.attempt(mode, Some(block), Lane::Blocking, last, now)
    }

    fn attempt(
        &mut self,
        mode: Mode,
        block: Option<Duration>,
        lane: Lane,
        last: bool,
        now: Instant,
    ) -> Action {
        self.phase = Phase::Attempting {
            mode,
            last,
            block,
            lead: false,
        };
        if !self.spec.blocks {
            // A quorum may hold part of any attempt under this token until it is given back.
            self.registered = true;
        }
        Action::Attempt(self.plan(mode, block, false, lane, now))
    }

    fn plan(
        &mut self,
        mode: Mode,
        block: Option<Duration>,
        lead: bool,
        lane: Lane,
        now: Instant,
    ) -> AttemptPlan {
        let first_lead = lead && !self.led;
        self.led |= lead;
        AttemptPlan {
            token: self.token.clone(),
            mode,
            block,
            lead,
            direct: self.spec.direct && self.spec.blocks,
            first_lead,
            lane,
            cutoff: self.cutoff,
            // A waiter's attempts before its last one are tried again, when refused for
            // now, only until the end of its wait.
            retry_until: if mode.keeps_waiting() || lead {
                self.spec.wait.deadline(now)
            } else {
                None
            },
        }
    }

    fn attempted(
        &mut self,
        last: bool,
        result: Result<Answer<AttemptReply>>,
        now: Instant,
        cancelled: bool,
    ) -> Action {
        let attempted = match result {
            Ok(attempted) => attempted,
            Err(e) => return self.failed(last, e, now),
        };
        let Answer {
            reply,
            sent_at,
            unacknowledged,
        } = attempted;
        if let (Some(short), AttemptReply::Granted { .. } | AttemptReply::Reentered { .. }) =
            (unacknowledged, &reply)
        {
            // Taken, but too few replicas have it: roll back (for a re-entry, its own hold
            // only), within one I/O timeout.
            return self.give_back(AfterGiveBack::RolledBack(short), false, false, now);
        }
        match reply {
            AttemptReply::Reentered {
                fencing_token,
                lease,
                lock_token,
            } => {
                let granted = Granted {
                    fencing_token,
                    lease,
                    sent_at,
                };
                if self.grant_lapsed(&granted, now) {
                    // The acquisition it joined may be over: its owner may hold the token
                    // again in another one, without this hold (see `settle`).
                    return self.give_back(AfterGiveBack::TryAgain { last }, false, false, now);
                }
                self.done(granted, Some(lock_token))
            }
            AttemptReply::Granted {
                fencing_token,
                lease,
                ..
            } => self.settle(
                Granted {
                    fencing_token,
                    lease,
                    sent_at,
                },
                last,
                now,
            ),
            // A last attempt withdrew on the server; a single attempt never registered.
            // A quorum may hold part of the attempt (a minority): given back first.
            AttemptReply::Busy { .. } if last && !self.spec.blocks => {
                let busy = self.busy();
                self.give_back(AfterGiveBack::Fail(busy), false, false, now)
            }
            AttemptReply::Busy { holder_pttl } if !self.spec.blocks => {
                self.give_back(AfterGiveBack::BackOff { holder_pttl }, false, false, now)
            }
            // A last attempt withdrew on the server; a single attempt never registered.
            AttemptReply::Busy { .. } if last => Action::Done(Err(self.busy())),
            AttemptReply::Busy { holder_pttl } => {
                self.failing_since = None;
                self.refused_since = None;
                self.holder_pttl = holder_pttl;
                self.registered = true;
                self.next_attempt(now, cancelled)
            }
        }
    }

    /// An attempt failed with `e`.
    fn failed(&mut self, last: bool, e: Error, now: Instant) -> Action {
        let waits = self.spec.wait.waits();
        if e.is_cancelled() {
            self.registered |= e.outcome_unknown();
            return self.give_up(e, true, now);
        }
        let retry = waits && !last;
        // A Cluster slot that is moving or unsettled, a cluster down, data still loading:
        // the server refused without running anything, and a waiter tries again for as
        // long as it may wait.
        if e.refused_for_now() && retry {
            if self.cutoff.is_some_and(|c| now >= c) {
                return self.give_up(e, false, now);
            }
            // Refused, so reachable: unreachable spells are counted afresh.
            self.failing_since = None;
            let since = *self.refused_since.get_or_insert(now);
            if now.duration_since(since) > self.grace && !self.warned {
                self.warned = true;
                log::warn!(
                    "waiting for {:?}: {e} for {:?}; the wait goes on",
                    self.spec.key,
                    now.duration_since(since)
                );
            } else {
                log::debug!("waiting for {:?}: {e}; trying again", self.spec.key);
            }
            return self.recover(now);
        }
        // A connection reset, a restart, a timeout: a waiter tries again (on a fresh
        // connection, which also takes a grant popped on the dead one) for as long as the
        // failures last less than its grace.
        if e.is_unreachable() && retry {
            // The failed request may have registered this waiter (or taken a grant).
            self.registered |= e.outcome_unknown();
            let since = *self.failing_since.get_or_insert(now);
            if now.duration_since(since) > self.grace || self.cutoff.is_some_and(|c| now >= c) {
                return self.give_up(e, false, now);
            }
            log::debug!("waiting for {:?}: {e}; trying again", self.spec.key);
            if !self.spec.blocks {
                let unanswered = e.outcome_unknown();
                return self.give_back(AfterGiveBack::Recover, false, unanswered, now);
            }
            return self.recover(now);
        }
        self.registered |= e.outcome_unknown();
        self.give_up(e, false, now)
    }

    /// Whether a waiter learns of `granted` only after its lease ran out, by `now`: an
    /// attempt of its token held in the network may have taken the key since (see
    /// [`Self::settle`]), so the waiter must give the grant back. A single attempt sends no
    /// earlier attempt under its token, so nothing of its own can have retaken the key.
    fn grant_lapsed(&self, granted: &Granted, now: Instant) -> bool {
        self.spec.wait.waits() && left_of(granted, now).is_zero()
    }

    /// Pauses a little after a failure, then tries again with a plain attempt.
    fn recover(&mut self, now: Instant) -> Action {
        let left = self.spec.wait.left(now).unwrap_or(RECOVERY_PAUSE);
        self.plain_next = true;
        self.phase = Phase::BackingOff;
        Action::Pause {
            until: now + RECOVERY_PAUSE.min(left),
        }
    }

    /// A grant whose lease is short is extended before the acquire returns: a grant taken
    /// from a release is leased for the waiter's grace only, and a lock taken after a long
    /// block has a conservative deadline well short of its real lease. With renewal on,
    /// renewal does it at once, off the caller's path, as long as a third of the lease is
    /// left; a fixed lease must get the ttl its caller asked for.
    ///
    /// A waiter that learns of its grant only once the grant's lease has run out gives it
    /// back instead: an attempt of its token (a copy held in the network, sent before a lost
    /// reply) may have taken the key again since, with a fencing token drawn after another
    /// holder's, and an extend that finds the token cannot tell that hold from the grant's.
    fn settle(&mut self, granted: Granted, last: bool, now: Instant) -> Action {
        if self.grant_lapsed(&granted, now) {
            return self.give_back(AfterGiveBack::TryAgain { last }, false, false, now);
        }
        let remaining = left_of(&granted, now);
        let ttl = self.spec.ttl;
        if remaining >= ttl * 2 / 3 || (self.spec.renew && remaining >= granted.lease / 3) {
            return self.done(granted, None);
        }
        self.phase = Phase::Settling { granted, last };
        Action::Extend {
            token: self.token.clone(),
            ttl,
            cutoff: self.cutoff,
        }
    }

    fn settled(
        &mut self,
        granted: Granted,
        last: bool,
        result: Result<(ExtendReply, Instant)>,
        now: Instant,
        cancelled: bool,
    ) -> Action {
        match result {
            Ok((ExtendReply::Extended, sent_at)) => {
                let extended = Granted {
                    sent_at,
                    lease: self.spec.ttl,
                    ..granted
                };
                // Read after the grant's own lease ran out, the extend may have found the
                // token through a late copy of an earlier attempt (see `settle`): a waiter
                // gives it back. Read before, it ran while the grant still held the key.
                if !self.grant_lapsed(&granted, now) && left_of(&extended, now) > Duration::ZERO {
                    self.done(extended, None)
                } else {
                    // The extend's reply came too late to be of use: give it back.
                    self.give_back(AfterGiveBack::TryAgain { last }, false, false, now)
                }
            }
            // The key changed hands as it was taken (deleted by someone): nothing is held,
            // nothing was given back.
            Ok((ExtendReply::NotHeld, _)) => self.try_again(last, now, cancelled),
            // The extend failed: the lease as acquired, if enough of it is left.
            Err(e) => {
                let remaining = left_of(&granted, now);
                if remaining > Duration::ZERO
                    && (self.spec.renew || remaining >= self.spec.ttl / 10)
                {
                    return self.done(granted, None);
                }
                let unanswered = e.outcome_unknown();
                self.give_back(AfterGiveBack::Fail(e), false, unanswered, now)
            }
        }
    }

    /// The last grant came to nothing: a waiter goes on, a last attempt fails.
    fn try_again(&mut self, last: bool, now: Instant, cancelled: bool) -> Action {
        if self.spec.wait.waits() && !last {
            self.registered = false;
            self.plain_next = true;
            return self.next_attempt(now, cancelled);
        }
        Action::Done(Err(self.lapsed_as_taken()))
    }

    /// Withdraws (when the server may hold anything under the token) and fails with
    /// `error`: the caller must hold nothing after a failed acquire. `quick`: the caller
    /// cancelled, and the withdrawal gets at most [`QUICK_WITHDRAW`].
    fn give_up(&mut self, error: Error, quick: bool, now: Instant) -> Action {
        if !(self.registered || error.outcome_unknown()) {
            return Action::Done(Err(error));
        }
        // (A cancelled wait was answered by nobody because the caller stopped listening:
        // the server may well be there, and a quick withdrawal tidies it up.)
        let unanswered = error.outcome_unknown() && !error.is_cancelled();
        self.give_back(AfterGiveBack::Fail(error), quick, unanswered, now)
    }

    /// Sends the release script for the current token as a withdrawal, within the call's
    /// bounds. It goes out in the background when they are used up, and when the request
    /// before it went `unanswered` (a server that did not answer that is not waited for a
    /// second time: the call returns, and the give-back lands when it can).
    fn give_back(
        &mut self,
        then: AfterGiveBack,
        quick: bool,
        unanswered: bool,
        now: Instant,
    ) -> Action {
        let io = self.spec.bounds.io;
        let allowed = if quick { QUICK_WITHDRAW.min(io) } else { io };
        let mut cutoff = now + allowed;
        if let Some(c) = self.cutoff {
            cutoff = cutoff.min(c);
        }
        let background = unanswered || cutoff.saturating_duration_since(now) < MIN_INLINE;
        let token = self.token.clone();
        self.phase = Phase::GivingBack(then);
        Action::GiveBack {
            token,
            cutoff: if background { now + io } else { cutoff },
            background,
        }
    }

    fn gave_back(
        &mut self,
        then: AfterGiveBack,
        result: Option<Result<ReleaseReply>>,
        now: Instant,
        cancelled: bool,
    ) -> Action {
        // Whatever the give-back did, no attempt goes under this token again.
        self.fresh_token();
        let key = &self.spec.key;
        match then {
            AfterGiveBack::RolledBack(short) => Action::Done(Err(match result {
                Some(Ok(_)) => short.context("rolled back"),
                Some(Err(undo)) => short.context(&format!(
                    "could not roll back ({undo}); the lock lapses after its lease"
                )),
                None => {
                    short.context("rolling back; failing that, the lock lapses after its lease")
                }
            })),
            AfterGiveBack::Fail(error) => {
                match result {
                    Some(Ok(reply)) if reply.was_held() => {
                        log::debug!("withdrawing from {key:?} undid a grant never heard of");
                    }
                    Some(Ok(_)) | None => {}
                    Some(Err(e)) => log::warn!(
                        "could not withdraw from lock {key:?} ({e}); a grant this caller may \
                         hold lapses after its lease"
                    ),
                }
                Action::Done(Err(error))
            }
            AfterGiveBack::TryAgain { last } => {
                if let Some(Err(e)) = result {
                    log::warn!("could not give back lock {key:?} ({e}); it lapses after its lease");
                }
                self.try_again(last, now, cancelled)
            }
            AfterGiveBack::BackOff { holder_pttl } => {
                self.failing_since = None;
                self.refused_since = None;
                if self.spec.wait.waits() && cancelled {
                    return Action::Done(Err(cancelled_error()));
                }
                let left = self.spec.wait.left(now);
                let pause = self.backoff.next(left, holder_pttl, self.grace);
                self.phase = Phase::BackingOff;
                Action::Pause { until: now + pause }
            }
            AfterGiveBack::Recover => self.recover(now),
        }
    }

    /// Draws a fresh token: nothing the server holds is under it.
    fn fresh_token(&mut self) {
        self.token = (self.tokens)();
        self.registered = false;
        self.led = false;
    }

    fn done(&mut self, granted: Granted, reentered: Option<String>) -> Action {
        Action::Done(Ok(Acquired {
            granted,
            token: self.token.clone(),
            reentered,
        }))
    }

    fn busy(&self) -> Error {
        Error::new(
            ErrorKind::Busy,
            format!("lock {:?} is held by another owner", self.spec.key),
        )
    }

    /// The wait is over, and the last grant was lost as it was taken: its lease ran out
    /// before it could be confirmed, or someone deleted the key.
    fn lapsed_as_taken(&self) -> Error {
        Error::new(
            ErrorKind::Busy,
            format!(
                "lock {:?} was granted, but the lease ran out (or the key was deleted) \
                 before the grant could be confirmed; nothing is held",
                self.spec.key
            ),
        )
    }
}

/// What is left at `now` of a lease taken as `granted`.
fn left_of(granted: &Granted, now: Instant) -> Duration {
    local_deadline(granted.sent_at, granted.lease).saturating_duration_since(now)
}

fn cancelled_error() -> Error {
    Error::new(ErrorKind::Cancelled, "the wait was cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    /// A machine with tokens `t1`, `t2`, ... and a fixed jitter.
    fn machine(
        wait: Wait,
        blocks: bool,
        renew: bool,
        ttl: Duration,
        t0: Instant,
    ) -> AcquireMachine {
        let mut n = 0;
        let tokens = Box::new(move || {
            n += 1;
            format!("t{n}")
        });
        let spec = AcquireSpec {
            key: "k".into(),
            ttl,
            wait,
            renew,
            blocks,
            bounds: Bounds {
                pool_wait: 100 * MS,
                connect: 100 * MS,
                io: 500 * MS,
            },
            replicas: Duration::ZERO,
            direct: false,
            behind: false,
        };
        AcquireMachine::new(spec, t0, tokens, fastrand::Rng::with_seed(1))
    }

    fn answer(reply: AttemptReply, sent_at: Instant) -> Event {
        Event::Attempted(Ok(Answer {
            reply,
            sent_at,
            unacknowledged: None,
        }))
    }

    fn granted(lease: Duration) -> AttemptReply {
        AttemptReply::Granted {
            fencing_token: 9,
            lease,
            server_clock: None,
        }
    }

    fn busy() -> AttemptReply {
        AttemptReply::Busy {
            holder_pttl: Some(5 * S),
        }
    }

    fn unanswered() -> Error {
        Error::new(ErrorKind::Timeout, "no reply").sent()
    }

    /// A quorum waiter that came behind others of its process sleeps a backoff's delay
    /// before its first attempt (a wake-up ends that sleep early); one that came first, a
    /// single attempt and a blocking deployment's waiter try at once.
    #[test]
    fn a_quorum_waiter_behind_others_of_its_process_sleeps_before_its_first_attempt() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), false, true, 10 * S, t0);
        m.spec.behind = true;
        let Action::Pause { until } = m.step(Event::Start, t0, false) else {
            panic!("a waiter behind others tried at once");
        };
        assert!(until > t0 && until <= t0 + 10 * MS, "{:?}", until - t0);
        // Woken before the pause ran out: it tries then, under its first token.
        let p = plan(m.step(Event::Paused(Ok(())), t0 + MS, false));
        assert_eq!((p.token.as_str(), p.mode), ("t1", Mode::Once));

        let cases = [
            (Wait::Until(t0 + 10 * S), false, false),
            (Wait::No, false, true),
            (Wait::Until(t0 + 10 * S), true, true),
        ];
        for (wait, blocks, behind) in cases {
            let mut m = machine(wait, blocks, true, 10 * S, t0);
            m.spec.behind = behind;
            assert!(
                matches!(m.step(Event::Start, t0, false), Action::Attempt(_)),
                "{wait:?} blocks {blocks} behind {behind}"
            );
        }

        // Cancelled before its turn: it ends at once, nothing sent.
        let mut m = machine(Wait::Forever, false, true, 10 * S, t0);
        m.spec.behind = true;
        match m.step(Event::Start, t0, true) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Cancelled),
            other => panic!("{other:?}"),
        }
        // Cancelled while it sleeps: the same.
        let mut m = machine(Wait::Forever, false, true, 10 * S, t0);
        m.spec.behind = true;
        m.step(Event::Start, t0, false);
        match m.step(Event::Paused(Err(cancelled_error())), t0 + MS, true) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Cancelled),
            other => panic!("{other:?}"),
        }
    }

    fn plan(action: Action) -> AttemptPlan {
        match action {
            Action::Attempt(plan) => plan,
            other => panic!("expected an attempt, got {other:?}"),
        }
    }

    #[test]
    fn a_try_acquire_is_one_attempt_bounded_by_one_request() {
        let t0 = Instant::now();
        let mut m = machine(Wait::No, true, true, 10 * S, t0);
        let p = plan(m.step(Event::Start, t0, false));
        assert_eq!(p.mode, Mode::Once);
        assert_eq!(p.block, None);
        assert_eq!(p.cutoff, Some(t0 + 700 * MS));
        assert_eq!(m.cutoff(), Some(t0 + 700 * MS));
        assert_eq!(p.lane, Lane::Caller(t0 + 100 * MS));
        match m.step(answer(busy(), t0), t0 + MS, false) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Busy),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_granted_try_with_its_whole_lease_is_held_at_once() {
        let t0 = Instant::now();
        let mut m = machine(Wait::No, true, false, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        match m.step(answer(granted(10 * S), t0), t0 + MS, false) {
            Action::Done(Ok(acquired)) => {
                assert_eq!(acquired.token, "t1");
                assert_eq!(acquired.granted.sent_at, t0);
                assert_eq!(acquired.granted.lease, 10 * S);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unanswered_try_is_withdrawn_in_the_background() {
        let t0 = Instant::now();
        let mut m = machine(Wait::No, true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        // Unanswered after the I/O timeout: the server is not waited for a second time.
        let now = t0 + 500 * MS;
        match m.step(Event::Attempted(Err(unanswered())), now, false) {
            Action::GiveBack {
                token, background, ..
            } => {
                assert_eq!(token, "t1");
                assert!(background);
            }
            other => panic!("{other:?}"),
        }
        match m.step(Event::GaveBack(None), now, false) {
            Action::Done(Err(e)) => assert!(e.outcome_unknown()),
            other => panic!("{other:?}"),
        }
        // A registration given up on for a reason of the caller's own is withdrawn within
        // the call's bound; with nothing of the bound left, in the background.
        let end = t0 + 300 * MS;
        let mut m = machine(Wait::Until(end), true, true, 10 * S, t0);
        // The lead attempt registered; the attempt after the block was refused.
        assert!(plan(m.step(Event::Start, t0, false)).lead);
        let refused = Error::new(ErrorKind::Server, "OOM command not allowed");
        match m.step(Event::Attempted(Err(refused)), t0 + 10 * MS, false) {
            Action::GiveBack {
                background, cutoff, ..
            } => {
                assert!(!background);
                assert_eq!(cutoff, t0 + 510 * MS);
            }
            other => panic!("{other:?}"),
        }
        let mut m = machine(Wait::Until(end), true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        let cutoff = m.cutoff().unwrap();
        let refused = Error::new(ErrorKind::Server, "OOM command not allowed");
        match m.step(Event::Attempted(Err(refused)), cutoff - 5 * MS, false) {
            Action::GiveBack { background, .. } => assert!(background),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_connection_is_not_withdrawn() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 10 * S, t0);
        let mut now = t0;
        plan(m.step(Event::Start, now, false));
        // Refused connections (nothing sent) until the grace (1 s) runs out.
        loop {
            now += 200 * MS;
            let refused = Error::new(ErrorKind::Connection, "connection refused");
            match m.step(Event::Attempted(Err(refused)), now, false) {
                Action::Pause { until } => {
                    plan(m.step(Event::Paused(Ok(())), until, false));
                    now = until;
                }
                Action::Done(Err(e)) => {
                    assert_eq!(e.kind(), ErrorKind::Connection);
                    break;
                }
                other => panic!("a withdrawal of nothing: {other:?}"),
            }
        }
        assert!(now <= t0 + 2 * S);
    }

    /// A machine for a direct waiter (a mutex a release hands over itself).
    fn direct(wait: Wait, t0: Instant) -> AcquireMachine {
        let mut m = machine(wait, true, true, 10 * S, t0);
        m.spec.direct = true;
        m
    }

    #[test]
    fn a_direct_waiter_leads_every_block_with_its_attempt_and_takes_a_handed_grant() {
        let t0 = Instant::now();
        let mut m = direct(Wait::Until(t0 + 10 * S), t0);
        // The first attempt and its block in one write; nothing after the block.
        let p = plan(m.step(Event::Start, t0, false));
        assert!(p.lead && p.direct);
        assert_eq!(p.mode, Mode::Lead);
        assert_eq!(p.lane, Lane::Blocking);
        assert!(p.block.is_some());
        // The block ended without a grant: the next attempt leads the next block, and may
        // take a grant made through the wake list.
        let p = plan(m.step(answer(busy(), t0), t0 + 400 * MS, false));
        assert!(p.lead && p.direct);
        assert_eq!(p.mode, Mode::AfterBlock);
        assert_eq!(p.token, "t1");
        // Handed over by a release: its grant's lease, from when the request was written.
        let sent = t0 + 400 * MS;
        match m.step(answer(granted(S), sent), sent + 10 * MS, false) {
            Action::Done(Ok(acquired)) => {
                assert_eq!(acquired.token, "t1");
                assert_eq!(acquired.granted.sent_at, sent);
                assert_eq!(acquired.granted.lease, S);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Only the first attempt under a token to lead a block may leave the waiter's own wake
    /// list as it is: a release can have pushed a grant there only for a registration that
    /// such an attempt made. Every later lead under the token (after a lost reply, or after
    /// a grant that came to nothing) empties it; a fresh token starts afresh.
    #[test]
    fn only_the_first_lead_under_a_token_leaves_its_own_wake_list_alone() {
        let t0 = Instant::now();
        let mut m = direct(Wait::Until(t0 + 60 * S), t0);
        let p = plan(m.step(Event::Start, t0, false));
        assert!(p.lead && p.first_lead);
        // The reply was lost: the attempt may have registered.
        let t = t0 + 500 * MS;
        let Action::Pause { until } = m.step(Event::Attempted(Err(unanswered())), t, false) else {
            panic!("a pause");
        };
        let p = plan(m.step(Event::Paused(Ok(())), until, false));
        assert_eq!(
            (p.token.as_str(), p.lead, p.first_lead),
            ("t1", true, false)
        );
        // Handed a lock whose settling extend finds the key changed hands: the same token
        // tries again, not registered, and still empties its list.
        let sent = until;
        let late = sent + 900 * MS;
        let Action::Extend { .. } = m.step(answer(granted(S), sent), late, false) else {
            panic!("an extend");
        };
        let p = plan(m.step(
            Event::Extended(Ok((ExtendReply::NotHeld, late))),
            late,
            false,
        ));
        assert_eq!((p.token.as_str(), p.mode), ("t1", Mode::Lead));
        assert!(p.lead && !p.first_lead);
        // A grant whose extend is answered too late is given back, and a fresh token
        // drawn: its first lead is first again.
        let sent = late;
        let later = sent + 900 * MS;
        let Action::Extend { .. } = m.step(answer(granted(S), sent), later, false) else {
            panic!("an extend");
        };
        let too_late = later + 11 * S;
        let Action::GiveBack { .. } = m.step(
            Event::Extended(Ok((ExtendReply::Extended, later))),
            too_late,
            false,
        ) else {
            panic!("a give-back");
        };
        let p = plan(m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::Released))),
            too_late + MS,
            false,
        ));
        assert_ne!(p.token, "t1");
        assert!(p.lead && p.first_lead);
    }

    #[test]
    fn a_direct_waiter_ends_its_wait_with_a_last_attempt_alone() {
        let t0 = Instant::now();
        let end = t0 + 300 * MS;
        let mut m = direct(Wait::Until(end), t0);
        let p = plan(m.step(Event::Start, t0, false));
        assert!(p.block.is_some_and(|b| b <= 300 * MS));
        let p = plan(m.step(answer(busy(), t0), end, false));
        assert_eq!(p.mode, Mode::Last);
        assert_eq!((p.block, p.lead), (None, false));
        match m.step(answer(busy(), end), end + MS, false) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Busy),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_registered_direct_waiter_without_a_blocking_connection_sleeps() {
        let t0 = Instant::now();
        let mut m = direct(Wait::Until(t0 + 10 * S), t0);
        plan(m.step(Event::Start, t0, false));
        // Not registered yet: the attempt goes alone at once, and registers.
        let p = plan(m.step(Event::NoBlockingConnection, t0, false));
        assert_eq!((p.mode, p.block, p.lead), (Mode::Waiter, None, false));
        let p = plan(m.step(answer(busy(), t0), t0 + MS, false));
        assert!(p.lead);
        // Registered: it sleeps for the block instead of attempting again at once.
        let block = p.block.expect("a block");
        match m.step(Event::NoBlockingConnection, t0 + MS, false) {
            Action::Pause { until } => assert_eq!(until, t0 + MS + block),
            other => panic!("{other:?}"),
        }
        let p = plan(m.step(Event::Paused(Ok(())), t0 + MS + block, false));
        assert_eq!((p.mode, p.block), (Mode::AfterBlock, None));
    }

    #[test]
    fn a_waiter_registers_blocks_and_takes_its_grant() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 10 * S, t0);
        // The first attempt, its block and the attempt after it go in one write.
        let p = plan(m.step(Event::Start, t0, false));
        assert!(p.lead);
        assert_eq!(p.mode, Mode::AfterBlock);
        assert_eq!(p.lane, Lane::Blocking);
        assert_eq!(p.retry_until, Some(t0 + 10 * S));
        assert!(p.block.is_some());
        // Still held after the block: registered, it blocks again (without a lead).
        let p = plan(m.step(answer(busy(), t0), t0 + MS, false));
        assert!(!p.lead);
        assert_eq!(p.mode, Mode::AfterBlock);
        assert_eq!(p.lane, Lane::Blocking);
        let block = p.block.expect("a block");
        assert!(block <= S && block >= 250 * MS, "{block:?}");
        // Granted from a release: leased for the grace only, renewal takes it from there.
        let sent = t0 + 2 * MS;
        match m.step(answer(granted(S), sent), sent + 300 * MS, false) {
            Action::Done(Ok(acquired)) => assert_eq!(acquired.token, "t1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_first_attempt_without_a_blocking_connection_goes_on_its_own_at_once() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 10 * S, t0);
        assert!(plan(m.step(Event::Start, t0, false)).lead);
        let p = plan(m.step(Event::NoBlockingConnection, t0, false));
        assert!(!p.lead);
        assert_eq!(p.mode, Mode::Waiter);
        assert_eq!(p.block, None);
        assert_eq!(p.lane, Lane::Caller(t0 + 100 * MS));
    }

    #[test]
    fn a_lead_write_whose_reply_is_lost_is_withdrawn() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 10 * S, t0);
        assert!(plan(m.step(Event::Start, t0, false)).lead);
        let cancelled = Error::new(ErrorKind::Cancelled, "cancelled").sent();
        match m.step(Event::Attempted(Err(cancelled)), t0 + 50 * MS, true) {
            Action::GiveBack { token, .. } => assert_eq!(token, "t1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_block_is_cut_to_the_wait_and_the_last_one_withdraws() {
        let t0 = Instant::now();
        let end = t0 + 300 * MS;
        let mut m = machine(Wait::Until(end), true, true, 10 * S, t0);
        let p = plan(m.step(Event::Start, t0, false));
        assert!(p.lead);
        assert_eq!(p.block, Some(300 * MS));
        assert_eq!(
            p.mode,
            Mode::Last,
            "the block that ends the wait withdraws after it"
        );
        match m.step(answer(busy(), t0 + MS), end + 5 * MS, false) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Busy),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.cutoff(), Some(end + 600 * MS + BLOCK_LATENESS));
    }

    #[test]
    fn a_refusal_near_the_end_of_a_wait_is_tried_again_only_within_it() {
        let t0 = Instant::now();
        let end = t0 + 2 * S;
        let mut m = machine(Wait::Until(end), true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        plan(m.step(answer(busy(), t0), t0 + MS, false));
        let tryagain = || Error::new(ErrorKind::Server, "TRYAGAIN").refused();
        let until = match m.step(Event::Attempted(Err(tryagain())), end - 50 * MS, false) {
            Action::Pause { until } => until,
            other => panic!("{other:?}"),
        };
        assert_eq!(until, end, "the pause is cut to the wait");
        let p = plan(m.step(Event::Paused(Ok(())), until, false));
        assert_eq!(p.mode, Mode::Last);
        assert_eq!(p.lane, Lane::Urgent);
        assert_eq!(
            p.retry_until, None,
            "the last attempt is not retried by the backend"
        );
        // Registered: withdrawn, then the refusal is the outcome.
        match m.step(Event::Attempted(Err(tryagain())), until + MS, false) {
            Action::GiveBack { background, .. } => assert!(!background),
            other => panic!("{other:?}"),
        }
        match m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::NotHeld))),
            until + 2 * MS,
            false,
        ) {
            Action::Done(Err(e)) => assert!(e.refused_for_now()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cancel_withdraws_quickly() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Forever, true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        plan(m.step(answer(busy(), t0), t0 + MS, false));
        let cancelled = Error::new(ErrorKind::Cancelled, "cancelled");
        match m.step(Event::Attempted(Err(cancelled)), t0 + 50 * MS, false) {
            Action::GiveBack {
                cutoff, background, ..
            } => {
                assert!(!background);
                assert_eq!(cutoff, t0 + 150 * MS);
            }
            other => panic!("{other:?}"),
        }
        match m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::NotHeld))),
            t0 + 60 * MS,
            false,
        ) {
            Action::Done(Err(e)) => assert!(e.is_cancelled()),
            other => panic!("{other:?}"),
        }
    }

    /// The settle case of the protocol-core issue: the settling extend's reply comes after
    /// the lease it set ended, the give-back's reply is lost, and the next attempt must not
    /// go under the token the late give-back may still delete.
    #[test]
    fn no_attempt_goes_under_a_token_whose_give_back_was_not_confirmed() {
        let t0 = Instant::now();
        let ttl = 100 * MS;
        let mut m = machine(Wait::Until(t0 + 10 * S), true, false, ttl, t0);
        plan(m.step(Event::Start, t0, false));
        plan(m.step(answer(busy(), t0), t0 + MS, false));
        // Granted with a short lease (a handoff): a fixed lease is extended first.
        let sent = t0 + 10 * MS;
        let extend = m.step(answer(granted(50 * MS), sent), sent + 5 * MS, false);
        assert!(
            matches!(&extend, Action::Extend { token, .. } if token == "t1"),
            "{extend:?}"
        );
        // The extend's reply comes after the lease it set ended.
        let extend_sent = sent + 6 * MS;
        let late = extend_sent + ttl;
        let give_back = m.step(
            Event::Extended(Ok((ExtendReply::Extended, extend_sent))),
            late,
            false,
        );
        assert!(matches!(&give_back, Action::GiveBack { token, .. } if token == "t1"));
        // The give-back is not confirmed.
        let next = m.step(
            Event::GaveBack(Some(Err(unanswered()))),
            late + 500 * MS,
            false,
        );
        let p = plan(next);
        assert_ne!(
            p.token, "t1",
            "an attempt under a token whose give-back may still land"
        );
        assert!(p.lead, "the fresh token registers afresh");
    }

    /// A waiter that learns of its grant only after the grant's lease ran out (the reply
    /// of its block held in the network) gives it back rather than extending it: the key
    /// may hold its token again through a late copy of an earlier attempt, which drew a
    /// fencing token after another holder's, and the grant's would go backwards.
    #[test]
    fn a_grant_learned_after_its_lease_ran_out_is_given_back_not_extended() {
        let t0 = Instant::now();
        let ttl = 100 * MS;
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, ttl, t0);
        plan(m.step(Event::Start, t0, false));
        let sent = t0 + 10 * MS;
        // The grant's lease (50 ms from the write) is over when its reply is read.
        let late = sent + 60 * MS;
        let give_back = m.step(answer(granted(50 * MS), sent), late, false);
        assert!(
            matches!(&give_back, Action::GiveBack { token, .. } if token == "t1"),
            "{give_back:?}"
        );
        let next = m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::Released))),
            late,
            false,
        );
        let p = plan(next);
        assert_ne!(p.token, "t1", "the next attempt goes under a fresh token");
        // While some of it is left, the same grant is settled as ever.
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, ttl, t0);
        plan(m.step(Event::Start, t0, false));
        match m.step(answer(granted(50 * MS), sent), sent + 20 * MS, false) {
            Action::Done(Ok(_)) | Action::Extend { .. } => {}
            other => panic!("{other:?}"),
        }
    }

    /// The same when the settling extend's reply, not the grant's, comes after the grant's
    /// lease ran out: the extend may have run after the key lapsed and was taken again by
    /// a late copy of the token's earlier attempt (found by an attacker, with a real server
    /// and the fault proxy).
    #[test]
    fn a_settling_extend_answered_after_the_grants_lease_ran_out_is_given_back() {
        let t0 = Instant::now();
        let ttl = 3 * S;
        let mut m = machine(Wait::Until(t0 + 30 * S), true, false, ttl, t0);
        plan(m.step(Event::Start, t0, false));
        // Taken, its reply read 1.2 s late: a fixed lease is extended first.
        let read = t0 + 1200 * MS;
        let extend = m.step(answer(granted(ttl), t0), read, false);
        assert!(matches!(extend, Action::Extend { .. }), "{extend:?}");
        // The extend's reply is read 2.6 s later, after the grant's lease (3 s from t0)
        // ran out, though within the lease the extend set.
        let give_back = m.step(
            Event::Extended(Ok((ExtendReply::Extended, read))),
            read + 2600 * MS,
            false,
        );
        assert!(
            matches!(&give_back, Action::GiveBack { token, .. } if token == "t1"),
            "{give_back:?}"
        );
        // Read while the grant's lease lasts, it settles the acquire.
        let mut m = machine(Wait::Until(t0 + 30 * S), true, false, ttl, t0);
        plan(m.step(Event::Start, t0, false));
        m.step(answer(granted(ttl), t0), read, false);
        match m.step(
            Event::Extended(Ok((ExtendReply::Extended, read))),
            read + 500 * MS,
            false,
        ) {
            Action::Done(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    /// The same for a re-entry of a reentrant lock: one whose reply comes after the lease
    /// it reports ran out may have joined an acquisition that is over, while its owner
    /// holds the same token again in a newer one, without this hold.
    #[test]
    fn a_reentry_learned_after_its_lease_ran_out_is_given_back() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 100 * MS, t0);
        plan(m.step(Event::Start, t0, false));
        let sent = t0 + 10 * MS;
        let reentered = AttemptReply::Reentered {
            fencing_token: 9,
            lease: 50 * MS,
            lock_token: "first".into(),
        };
        let give_back = m.step(answer(reentered.clone(), sent), sent + 60 * MS, false);
        assert!(
            matches!(&give_back, Action::GiveBack { token, .. } if token == "t1"),
            "{give_back:?}"
        );
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 100 * MS, t0);
        plan(m.step(Event::Start, t0, false));
        match m.step(answer(reentered, sent), sent + 20 * MS, false) {
            Action::Done(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    /// The Redlock case of the protocol-core issue: a deployment that cannot block may hold
    /// part of an attempt that was not granted; it is given back, and the retry goes under
    /// a fresh token, so that it never counts a member that still holds the old one.
    #[test]
    fn a_waiter_that_cannot_block_gives_back_and_retries_under_a_fresh_token_each_time() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), false, true, 10 * S, t0);
        let mut now = t0;
        let mut tokens = vec![plan(m.step(Event::Start, now, false)).token];
        for _ in 0..4 {
            now += 5 * MS;
            match m.step(answer(busy(), now), now, false) {
                Action::GiveBack {
                    token, background, ..
                } => {
                    assert_eq!(&token, tokens.last().unwrap(), "the attempt's own token");
                    assert!(!background);
                }
                other => panic!("{other:?}"),
            }
            // Even when the give-back's reply is lost.
            let until = match m.step(Event::GaveBack(Some(Err(unanswered()))), now, false) {
                Action::Pause { until } => until,
                other => panic!("{other:?}"),
            };
            assert!(until - now <= 500 * MS);
            let p = plan(m.step(Event::Paused(Ok(())), until, false));
            assert_eq!(p.mode, Mode::Once);
            assert_eq!(p.block, None);
            tokens.push(p.token);
            now = until;
        }
        let mut unique = tokens.clone();
        unique.dedup();
        assert_eq!(
            unique, tokens,
            "a token was used for two attempts: {tokens:?}"
        );
        // An unreachable quorum: given back and tried again under a fresh token too.
        let unreachable = Error::new(ErrorKind::Connection, "1 of 3");
        assert!(matches!(
            m.step(Event::Attempted(Err(unreachable)), now, false),
            Action::GiveBack { .. }
        ));
        let until = match m.step(Event::GaveBack(None), now, false) {
            Action::Pause { until } => until,
            other => panic!("{other:?}"),
        };
        let p = plan(m.step(Event::Paused(Ok(())), until, false));
        assert!(!tokens.contains(&p.token));
        // The last attempt that is not granted is given back too, then fails busy.
        let mut m = machine(Wait::No, false, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        assert!(matches!(
            m.step(answer(busy(), t0), t0 + MS, false),
            Action::GiveBack { .. }
        ));
        match m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::Released))),
            t0 + 2 * MS,
            false,
        ) {
            Action::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Busy),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unanswered_attempt_is_repeated_under_its_own_token() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Until(t0 + 10 * S), true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        let until = match m.step(Event::Attempted(Err(unanswered())), t0 + 500 * MS, false) {
            Action::Pause { until } => until,
            other => panic!("{other:?}"),
        };
        let p = plan(m.step(Event::Paused(Ok(())), until, false));
        // No give-back was sent: the same token, which takes the grant if the lost attempt
        // took one; and after a block (the attempt may have registered it).
        assert_eq!(p.token, "t1");
        assert_eq!(p.mode, Mode::AfterBlock);
    }

    #[test]
    fn a_grant_too_few_replicas_acknowledged_is_rolled_back() {
        let t0 = Instant::now();
        let mut m = machine(Wait::No, true, true, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        let short = Error::new(ErrorKind::Replication, "0 of 1");
        let event = Event::Attempted(Ok(Answer {
            reply: granted(10 * S),
            sent_at: t0,
            unacknowledged: Some(short),
        }));
        assert!(matches!(
            m.step(event, t0 + 10 * MS, false),
            Action::GiveBack {
                background: false,
                ..
            }
        ));
        match m.step(
            Event::GaveBack(Some(Ok(ReleaseReply::Released))),
            t0 + 20 * MS,
            false,
        ) {
            Action::Done(Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Replication);
                assert!(e.message().contains("rolled back"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reentry_is_held_at_once_with_the_locks_token() {
        let t0 = Instant::now();
        let mut m = machine(Wait::Forever, true, false, 10 * S, t0);
        plan(m.step(Event::Start, t0, false));
        let reply = AttemptReply::Reentered {
            fencing_token: 3,
            lease: 10 * S,
            lock_token: "first".into(),
        };
        match m.step(answer(reply, t0), t0 + MS, false) {
            Action::Done(Ok(acquired)) => {
                assert_eq!(acquired.reentered.as_deref(), Some("first"));
                assert_eq!(acquired.token, "t1");
                assert_eq!(acquired.granted.fencing_token, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_grant_whose_lease_ran_out_before_the_reply_ends_a_last_attempt_as_busy() {
        let t0 = Instant::now();
        let mut m = machine(Wait::No, true, false, 50 * MS, t0);
        m.token();
        plan(m.step(Event::Start, t0, false));
        let extend = m.step(answer(granted(50 * MS), t0), t0 + 40 * MS, false);
        assert!(matches!(extend, Action::Extend { .. }));
        match m.step(
            Event::Extended(Ok((ExtendReply::NotHeld, t0 + 41 * MS))),
            t0 + 60 * MS,
            false,
        ) {
            Action::Done(Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Busy);
                assert!(e.message().contains("granted"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
