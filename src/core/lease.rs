//! The clock of a held lock: until when it is surely held, when it is next renewed, and
//! when it is lost. Pure arithmetic on instants the caller passes in.
//!
//! Every local deadline is conservative: it is computed from the moment *before* the
//! request that set or extended the key's expiry was written, so the key surely lives at
//! least that long on the server (minus the drift allowance). The one way the server's
//! expiry could end up earlier than a deadline computed so is an extend to a *shorter* ttl
//! whose reply was lost: it may still run later. So after such an extend the lease never
//! again assumes more than that shorter ttl (the `cap`).
//!
//! An extend in flight may already have run: while it is on its way, the lease assumes no
//! more than what it may set (a shorter ttl from the moment it was attempted), and only an
//! extend that surely never ran gives the earlier deadline back.
//!
//! A loss is final: once the deadline passed (so `is_held` said no) or the key was found
//! without the token, nothing makes the lease held again, not even an extend whose reply
//! comes late.

use std::fmt;
use std::time::{Duration, Instant};

use crate::core::reply::ExtendReply;
use crate::error::{Error, Result};

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The key no longer held our token when renewing or extending: it expired, was deleted,
    /// or another owner has it now.
    NotHeld,
    /// Redis could not be reached before the lease's local deadline passed.
    Unreachable,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => "the key no longer holds this lock's token",
            LostReason::Unreachable => "Redis was unreachable until the lease ran out",
        })
    }
}

/// The largest ttl accepted (about 34 years); also keeps deadlines far from overflow.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// The shortest ttl accepted: a lease must outlive the round trip that sets it and the drift
/// allowance, or it is lost before it can be used.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// Validates a ttl and converts it to whole milliseconds.
///
/// Errors: [`crate::ErrorKind::InvalidArgument`] for less than [`MIN_TTL`] or more than
/// [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl < MIN_TTL {
        return Err(Error::invalid(format!(
            "the ttl must be at least {MIN_TTL:?} (shorter leases end before they can be used), got {ttl:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "the ttl of {ttl:?} is over the maximum of {MAX_TTL:?}"
        )));
    }
    Ok(ttl.as_millis() as u64)
}

/// Safety margin subtracted from a lease for clock drift (the Redlock paper's 1 % plus 2 ms).
pub(crate) fn drift(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)).min(ttl)
}

/// The local deadline of a lease of `ttl` whose request was written at `sent_at`.
pub(crate) fn local_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - drift(ttl)
}

/// Shortest pause between two renewal attempts after a failed one.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// What an extend (or a renewal) of a held lock came to, as the server told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtendOutcome {
    /// The script answered; its request was written at `sent_at`.
    Replied {
        reply: ExtendReply,
        sent_at: Instant,
    },
    /// The script extended the hold on the primary, written at `sent_at`, but too few
    /// replicas acknowledged it: the lease counts as not extended, and no longer than
    /// what the extend set.
    Unacknowledged { sent_at: Instant },
    /// No answer: the extend may have run (`unknown`) or surely did not.
    Failed { unknown: bool },
}

/// What a lease made of an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtendVerdict {
    /// Extended; the request went out `late` after the renewal was due (zero when early).
    Extended { late: Duration },
    /// The lock is lost, now or before; `decided`: by this extend (the holder must be told).
    Lost { reason: LostReason, decided: bool },
    /// Not extended; the lease goes on as before (or shorter, to what the extend may have
    /// set), and may be extended again.
    Failed,
}

/// Why a lease may have left its critical section unprotected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broken {
    /// It was lost.
    Lost(LostReason),
    /// Its local deadline passed without a renewal.
    Outlived,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Lost(reason) => write!(f, "was lost ({reason})"),
            Broken::Outlived => f.write_str("outlived its lease"),
        }
    }
}

/// Why a release is not reported `Ok` (see [`release_verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotReleased {
    /// The server did not find the hold under its token.
    NotFound,
    /// The lease was broken before the release was sent (the key was deleted all the
    /// same if it still held the token).
    Before(Broken),
    /// The lease ended while the release was in flight: the release may have run after
    /// the key expired.
    InFlight(Broken),
}

/// What a release reports: `Ok` only when the server found the hold (`was_held`) and the
/// lease was unbroken both when the release was sent (`when_sent`) and when its answer
/// came (`when_answered`). An answer that comes after the lease's deadline cannot vouch for
/// the hold: the release may have run after the key expired, and a late attempt of the
/// same acquisition (under the same token) may have taken the key again in between, which
/// the release then found.
pub(crate) fn release_verdict(
    was_held: bool,
    when_sent: Option<Broken>,
    when_answered: Option<Broken>,
) -> Result<(), NotReleased> {
    match (was_held, when_sent, when_answered) {
        (false, _, _) => Err(NotReleased::NotFound),
        (true, Some(broken), _) => Err(NotReleased::Before(broken)),
        (true, None, Some(broken)) => Err(NotReleased::InFlight(broken)),
        (true, None, None) => Ok(()),
    }
}

/// How much renewals of a lease of `lease` may move so that the wake-ups of many renewal
/// threads coalesce: a thirtieth of the lease, from 50 µs to 15 ms. A renewal is due that
/// much early ([`LeaseClock::renewal_wait`]); its thread's timers may fire that much late.
/// With a thread per lock, waking is most of renewal's cost; wake-ups that fall on the
/// same instants, and timers the kernel may merge, cost much less.
pub(crate) fn coalescing(lease: Duration) -> Duration {
    (lease / 30).clamp(Duration::from_micros(50), Duration::from_millis(15))
}

/// What a renewal of the lease should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewalStep {
    /// Nothing yet: the next renewal is due at this instant.
    Wait(Instant),
    /// Renew with this ttl; nothing of it may run past `cutoff` (the local deadline).
    Renew { ttl: Duration, cutoff: Instant },
    /// The local deadline has passed without a renewal.
    Expired,
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Held, as long as the deadline has not passed.
    Held,
    /// Lost for good.
    Lost(LostReason),
    /// Given back (after a loss, when `lost`).
    Released { lost: Option<LostReason> },
}

/// The clock of one held lease (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct LeaseClock {
    /// The ttl asked for last (by the acquire or an extend); renewal uses it.
    ttl: Duration,
    /// The ttl the key was last set to (shorter than `ttl` for a grant just taken).
    leased: Duration,
    /// The shortest ttl of an extend whose outcome is unknown (see the module docs).
    cap: Option<Duration>,
    /// When the request that last set the key's expiry was written.
    start: Instant,
    /// Before this the key surely still holds the token (unless deleted).
    deadline: Instant,
    /// The deadline before the extend in flight lowered it to what that extend may set.
    before_extend: Option<Instant>,
    standing: Standing,
}

impl LeaseClock {
    /// A lease of `ttl` whose key was set to `leased` (at most `ttl`) by a request written
    /// at `sent_at`.
    pub fn new(ttl: Duration, leased: Duration, sent_at: Instant) -> Self {
        LeaseClock {
            ttl,
            leased,
            cap: None,
            start: sent_at,
            deadline: local_deadline(sent_at, leased),
            before_extend: None,
            standing: Standing::Held,
        }
    }

    /// The lease the deadline assumes: what the key was set to, never more than the cap.
    fn effective_lease(&self) -> Duration {
        self.cap.map_or(self.leased, |cap| cap.min(self.leased))
    }

    /// The ttl renewal uses: the last one asked for, never more than the cap.
    pub fn renewal_ttl(&self) -> Duration {
        self.cap.map_or(self.ttl, |cap| cap.min(self.ttl))
    }

    /// Before this instant the key surely holds the token (unless someone deleted it).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When the next renewal is due: a third of the way into the current lease.
    pub fn next_renewal(&self) -> Instant {
        self.start + self.effective_lease() / 3
    }

    /// Why the lock was lost, if it was (also after its release).
    pub fn lost(&self) -> Option<LostReason> {
        match self.standing {
            Standing::Held | Standing::Released { lost: None } => None,
            Standing::Lost(reason) | Standing::Released { lost: Some(reason) } => Some(reason),
        }
    }

    pub fn released(&self) -> bool {
        matches!(self.standing, Standing::Released { .. })
    }

    /// Held, and the local deadline not passed.
    pub fn is_held(&self, now: Instant) -> bool {
        self.standing == Standing::Held && now < self.deadline
    }

    /// What is left of the lease: zero once lost or released.
    pub fn remaining(&self, now: Instant) -> Duration {
        match self.standing {
            Standing::Held => self.deadline.saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }

    /// Why the lock may have been unprotected for a while before `now`; `None` while it has
    /// been held without a break.
    pub fn broken(&self, now: Instant) -> Option<Broken> {
        match self.lost() {
            Some(reason) => Some(Broken::Lost(reason)),
            None if now >= self.deadline => Some(Broken::Outlived),
            None => None,
        }
    }

    pub fn mark_released(&mut self) {
        self.standing = Standing::Released { lost: self.lost() };
    }

    /// Records a loss. `true` when this call decided it (the lock was held: neither lost
    /// nor released before).
    pub fn declare_lost(&mut self, reason: LostReason) -> bool {
        if self.standing != Standing::Held {
            return false;
        }
        self.standing = Standing::Lost(reason);
        true
    }

    /// Declares the lock lost for lack of renewal if its deadline has passed by `now`.
    /// `true` when it is lost (now or before).
    pub fn lose_if_expired(&mut self, now: Instant) -> bool {
        if now >= self.deadline {
            self.declare_lost(LostReason::Unreachable);
        }
        self.lost().is_some()
    }

    /// A re-entry of a reentrant lock set the key's lease to `leased` by a request written
    /// at `sent_at`, and asks for renewals of at least `ttl` from now on: the deadline
    /// moves on if that is later, never back.
    pub fn reentered(&mut self, ttl: Duration, leased: Duration, sent_at: Instant) {
        if self.standing != Standing::Held {
            return;
        }
        self.ttl = self.ttl.max(ttl);
        let lease = self.cap.map_or(leased, |cap| cap.min(leased));
        let deadline = local_deadline(sent_at, lease);
        if deadline > self.deadline {
            self.start = sent_at;
            self.leased = leased;
            self.deadline = deadline;
        }
    }

    /// An extend of `ttl` is about to be sent at `now`: `Err` with the reason when the lock
    /// is lost, or its deadline has passed (the loss is then declared: a loss is final).
    /// Otherwise, from now until its outcome is known, the deadline is no later than what
    /// the extend may set (it may run at once: an extend to a shorter ttl shortens the key's
    /// life on the server before its reply is read).
    pub fn before_extend(
        &mut self,
        now: Instant,
        ttl: Duration,
    ) -> std::result::Result<(), LostReason> {
        if let Some(reason) = self.lost() {
            return Err(reason);
        }
        if now >= self.deadline {
            self.declare_lost(LostReason::Unreachable);
            return Err(LostReason::Unreachable);
        }
        let could_set = local_deadline(now, self.cap.map_or(ttl, |cap| cap.min(ttl)));
        self.before_extend = Some(self.deadline);
        self.deadline = self.deadline.min(could_set);
        Ok(())
    }

    /// Applies what an extend of `ttl`, attempted at `attempt_at` (before its request was
    /// written), came to, read at `now`.
    pub fn after_extend(
        &mut self,
        ttl: Duration,
        attempt_at: Instant,
        outcome: ExtendOutcome,
        now: Instant,
    ) -> ExtendVerdict {
        let before = self.before_extend.take().unwrap_or(self.deadline);
        if let Some(reason) = self.lost() {
            // A loss is final, whatever the server says now.
            return ExtendVerdict::Lost {
                reason,
                decided: false,
            };
        }
        let verdict = match outcome {
            ExtendOutcome::Replied {
                reply: ExtendReply::Extended,
                sent_at,
            } => {
                let effective = self.cap.map_or(ttl, |cap| cap.min(ttl));
                if now >= self.deadline || local_deadline(sent_at, effective) <= now {
                    // The reply came after the lease ended (the holder was already told it
                    // is not held), or it set a lease that is already over: a loss is final.
                    self.lost_verdict(LostReason::Unreachable)
                } else {
                    let late = sent_at.saturating_duration_since(self.next_renewal());
                    self.ttl = ttl;
                    self.leased = ttl;
                    self.start = sent_at;
                    self.deadline = local_deadline(sent_at, self.effective_lease());
                    ExtendVerdict::Extended { late }
                }
            }
            ExtendOutcome::Replied {
                reply: ExtendReply::NotHeld,
                ..
            } => self.lost_verdict(LostReason::NotHeld),
            ExtendOutcome::Unacknowledged { sent_at } => {
                // It ran: the key now expires after `ttl` from about then, which may be
                // sooner than the lease assumed (an extend to a shorter ttl).
                self.deadline = before.min(local_deadline(sent_at, ttl));
                ExtendVerdict::Failed
            }
            ExtendOutcome::Failed { unknown: true } => {
                // It may still run, later: never more than its ttl again.
                self.cap = Some(self.cap.map_or(ttl, |cap| cap.min(ttl)));
                self.deadline = before.min(local_deadline(attempt_at, ttl));
                ExtendVerdict::Failed
            }
            ExtendOutcome::Failed { unknown: false } => {
                self.restore(before, now);
                ExtendVerdict::Failed
            }
        };
        match verdict {
            // Not extended before the lease ended: the lock is lost at its deadline.
            ExtendVerdict::Failed if now >= self.deadline => {
                self.lost_verdict(LostReason::Unreachable)
            }
            verdict => verdict,
        }
    }

    /// An extend that [`before_extend`](Self::before_extend) announced was never sent.
    pub fn extend_not_sent(&mut self, now: Instant) -> ExtendVerdict {
        let before = self.before_extend.take().unwrap_or(self.deadline);
        if let Some(reason) = self.lost() {
            return ExtendVerdict::Lost {
                reason,
                decided: false,
            };
        }
        self.restore(before, now);
        if now >= self.deadline {
            return self.lost_verdict(LostReason::Unreachable);
        }
        ExtendVerdict::Failed
    }

    /// An extend never ran: the deadline it lowered comes back, if the lowered one has not
    /// passed by `now` (then every `is_held` in between said yes).
    fn restore(&mut self, before: Instant, now: Instant) {
        if now < self.deadline {
            self.deadline = before;
        }
    }

    fn lost_verdict(&mut self, reason: LostReason) -> ExtendVerdict {
        let decided = self.declare_lost(reason);
        ExtendVerdict::Lost {
            reason: self.lost().unwrap_or(reason),
            decided,
        }
    }

    /// `Some(due)` while the next renewal is not yet due at `now`, `None` once it is. A
    /// renewal is due up to [`coalescing`] of the lease early: a renewal thread that wakes a
    /// little before it (its wake-ups are rounded to coalesce with other threads') renews
    /// then rather than sleeping again.
    pub fn renewal_wait(&self, now: Instant) -> Option<Instant> {
        let due = self.next_renewal();
        (due > now + self.renewal_early()).then_some(due)
    }

    /// How early before [`next_renewal`](Self::next_renewal) a renewal may go: the
    /// [`coalescing`] of the current lease.
    pub fn renewal_early(&self) -> Duration {
        coalescing(self.effective_lease())
    }

    /// What the renewal should do at `now`.
    pub fn renewal_step(&self, now: Instant) -> RenewalStep {
        if now >= self.deadline {
            return RenewalStep::Expired;
        }
        if let Some(due) = self.renewal_wait(now) {
            return RenewalStep::Wait(due);
        }
        RenewalStep::Renew {
            ttl: self.renewal_ttl(),
            cutoff: self.deadline,
        }
    }

    /// When to try again after a renewal of `ttl` failed at `now`: a tenth of the ttl
    /// later (at least 10 ms), never past the deadline.
    pub fn retry_at(&self, now: Instant, ttl: Duration) -> Instant {
        let left = self.deadline.saturating_duration_since(now);
        now + (ttl / 10).max(MIN_RETRY).min(left)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_release_is_ok_only_for_a_hold_unbroken_until_its_answer() {
        let lost = Broken::Lost(LostReason::NotHeld);
        assert_eq!(release_verdict(true, None, None), Ok(()));
        assert_eq!(
            release_verdict(false, None, None),
            Err(NotReleased::NotFound)
        );
        assert_eq!(
            release_verdict(true, Some(lost), Some(lost)),
            Err(NotReleased::Before(lost))
        );
        assert_eq!(
            release_verdict(true, None, Some(Broken::Outlived)),
            Err(NotReleased::InFlight(Broken::Outlived))
        );
    }

    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn replied(reply: ExtendReply, sent_at: Instant) -> ExtendOutcome {
        ExtendOutcome::Replied { reply, sent_at }
    }

    #[test]
    fn the_deadline_counts_from_the_send_minus_the_drift() {
        let t0 = Instant::now();
        let clock = LeaseClock::new(10 * S, 10 * S, t0);
        assert_eq!(clock.deadline(), t0 + 10 * S - 102 * MS);
        assert!(clock.is_held(t0 + 9 * S));
        assert!(!clock.is_held(t0 + 10 * S - 102 * MS));
        assert_eq!(clock.next_renewal(), t0 + 10 * S / 3);
    }

    #[test]
    fn a_renewal_is_due_up_to_a_thirtieth_of_the_lease_early_and_no_more() {
        let t0 = Instant::now();
        // 3 s lease: a thirtieth is 100 ms, past the 15 ms cap.
        let clock = LeaseClock::new(3 * S, 3 * S, t0);
        let due = t0 + S;
        assert_eq!(clock.renewal_early(), 15 * MS);
        assert_eq!(clock.renewal_wait(due - 16 * MS), Some(due));
        assert!(matches!(
            clock.renewal_step(due - 16 * MS),
            RenewalStep::Wait(_)
        ));
        assert_eq!(clock.renewal_wait(due - 15 * MS), None);
        assert!(matches!(
            clock.renewal_step(due - 15 * MS),
            RenewalStep::Renew { .. }
        ));
        // 300 ms lease (a granted one, say): 10 ms.
        let short = LeaseClock::new(30 * S, 300 * MS, t0);
        let due = t0 + 100 * MS;
        assert_eq!(short.renewal_early(), 10 * MS);
        assert_eq!(short.renewal_wait(due - 11 * MS), Some(due));
        assert_eq!(short.renewal_wait(due - 10 * MS), None);
    }

    #[test]
    fn a_granted_lease_shorter_than_the_ttl_is_renewed_early_and_then_at_the_ttl() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(30 * S, 3 * S, t0);
        assert_eq!(clock.renewal_step(t0), RenewalStep::Wait(t0 + S));
        assert_eq!(
            clock.renewal_step(t0 + S),
            RenewalStep::Renew {
                ttl: 30 * S,
                cutoff: clock.deadline()
            }
        );
        let sent = t0 + S;
        let v = clock.after_extend(30 * S, sent, replied(ExtendReply::Extended, sent), sent);
        assert_eq!(
            v,
            ExtendVerdict::Extended {
                late: Duration::ZERO
            }
        );
        assert_eq!(clock.deadline(), local_deadline(sent, 30 * S));
        assert_eq!(clock.next_renewal(), sent + 10 * S);
    }

    #[test]
    fn an_extend_of_unknown_outcome_caps_every_later_lease() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(30 * S, 30 * S, t0);
        let at = t0 + S;
        let v = clock.after_extend(2 * S, at, ExtendOutcome::Failed { unknown: true }, at);
        assert_eq!(v, ExtendVerdict::Failed);
        assert_eq!(clock.deadline(), local_deadline(at, 2 * S));
        assert_eq!(clock.renewal_ttl(), 2 * S);
        // A later extend to 30 s is believed for 2 s only: the lost one may still run.
        let later = t0 + 2 * S;
        let v = clock.after_extend(
            30 * S,
            later,
            replied(ExtendReply::Extended, later),
            later + 10 * MS,
        );
        assert!(matches!(v, ExtendVerdict::Extended { .. }));
        assert_eq!(clock.deadline(), local_deadline(later, 2 * S));
    }

    #[test]
    fn an_extend_that_ran_without_its_replicas_shortens_but_never_lengthens() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(30 * S, 30 * S, t0);
        let at = t0 + S;
        let v = clock.after_extend(2 * S, at, ExtendOutcome::Unacknowledged { sent_at: at }, at);
        assert_eq!(v, ExtendVerdict::Failed);
        assert_eq!(clock.deadline(), local_deadline(at, 2 * S));
        let v = clock.after_extend(
            60 * S,
            at,
            ExtendOutcome::Unacknowledged { sent_at: at },
            at,
        );
        assert_eq!(v, ExtendVerdict::Failed);
        assert_eq!(clock.deadline(), local_deadline(at, 2 * S));
    }

    #[test]
    fn a_reply_after_the_deadline_is_a_loss_for_good() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(S, S, t0);
        let late = clock.deadline() + MS;
        let v = clock.after_extend(S, t0, replied(ExtendReply::Extended, t0 + MS), late);
        assert_eq!(
            v,
            ExtendVerdict::Lost {
                reason: LostReason::Unreachable,
                decided: true
            }
        );
        assert!(!clock.is_held(t0));
        assert_eq!(clock.before_extend(t0, S), Err(LostReason::Unreachable));
        // Nothing brings it back.
        let v = clock.after_extend(S, t0, replied(ExtendReply::Extended, t0), t0);
        assert!(matches!(v, ExtendVerdict::Lost { decided: false, .. }));
    }

    #[test]
    fn a_reply_that_sets_a_lease_already_over_is_a_loss() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(10 * S, 10 * S, t0);
        // Sent at t0, extended to 100 ms, read 200 ms later: the key may already be gone.
        let v = clock.after_extend(
            100 * MS,
            t0,
            replied(ExtendReply::Extended, t0),
            t0 + 200 * MS,
        );
        assert!(matches!(v, ExtendVerdict::Lost { decided: true, .. }));
    }

    #[test]
    fn a_failed_extend_at_the_deadline_loses_the_lock() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(S, S, t0);
        let v = clock.after_extend(
            S,
            t0,
            ExtendOutcome::Failed { unknown: false },
            clock.deadline(),
        );
        assert_eq!(
            v,
            ExtendVerdict::Lost {
                reason: LostReason::Unreachable,
                decided: true
            }
        );
    }

    #[test]
    fn a_token_gone_is_a_loss_and_a_released_lease_is_never_lost() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(S, S, t0);
        let v = clock.after_extend(S, t0, replied(ExtendReply::NotHeld, t0), t0);
        assert_eq!(
            v,
            ExtendVerdict::Lost {
                reason: LostReason::NotHeld,
                decided: true
            }
        );
        let mut released = LeaseClock::new(S, S, t0);
        released.mark_released();
        assert!(!released.declare_lost(LostReason::NotHeld));
        assert_eq!(released.lost(), None);
    }

    #[test]
    fn a_reentry_moves_the_deadline_on_never_back() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(S, S, t0);
        let before = clock.deadline();
        clock.reentered(S / 2, S / 2, t0);
        assert_eq!(clock.deadline(), before);
        clock.reentered(5 * S, 5 * S, t0 + 100 * MS);
        assert_eq!(clock.deadline(), local_deadline(t0 + 100 * MS, 5 * S));
        assert_eq!(clock.renewal_ttl(), 5 * S);
    }

    #[test]
    fn an_extend_to_a_shorter_ttl_shortens_the_lease_while_it_is_in_flight() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::new(30 * S, 30 * S, t0);
        let at = t0 + S;
        clock.before_extend(at, 20 * MS).unwrap();
        // It may run at once: the lease assumes no more than it may set.
        assert!(clock.is_held(at + 10 * MS));
        assert!(!clock.is_held(at + 20 * MS));
        // Surely never sent, and in time: the earlier deadline comes back.
        let mut unsent = LeaseClock::new(30 * S, 30 * S, t0);
        unsent.before_extend(at, 20 * MS).unwrap();
        let v = unsent.after_extend(
            20 * MS,
            at,
            ExtendOutcome::Failed { unknown: false },
            at + MS,
        );
        assert_eq!(v, ExtendVerdict::Failed);
        assert!(unsent.is_held(at + 10 * S));
        // Unanswered: it may still run later.
        let v = clock.after_extend(
            20 * MS,
            at,
            ExtendOutcome::Failed { unknown: true },
            at + MS,
        );
        assert_eq!(v, ExtendVerdict::Failed);
        assert!(!clock.is_held(at + 20 * MS));
        // Not sent but told too late (the lowered deadline passed): lost, for good.
        let mut late = LeaseClock::new(30 * S, 30 * S, t0);
        late.before_extend(at, 20 * MS).unwrap();
        let v = late.after_extend(
            20 * MS,
            at,
            ExtendOutcome::Failed { unknown: false },
            at + 100 * MS,
        );
        assert!(matches!(v, ExtendVerdict::Lost { .. }));
    }

    #[test]
    fn a_failed_renewal_is_retried_within_the_deadline() {
        let t0 = Instant::now();
        let clock = LeaseClock::new(S, S, t0);
        let now = t0 + 900 * MS;
        assert_eq!(clock.retry_at(now, S), clock.deadline());
        assert!(clock.retry_at(now, S) <= clock.deadline());
        assert_eq!(clock.renewal_step(clock.deadline()), RenewalStep::Expired);
    }
}
