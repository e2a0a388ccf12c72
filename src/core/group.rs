//! Several mutexes of one server taken all or none, as a state machine.
//!
//! [`GroupMachine::step`] takes what happened (a [`GroupEvent`]) with the time and whether
//! the caller cancelled, and returns what to do next (a [`GroupAction`]); the runtime
//! ([`crate::multi`]) and the simulation carry it out.
//!
//! The names come in one global order (the caller sorts them). An attempt is one script,
//! [`crate::scripts::ACQUIRE_ALL`]: it takes every name or none. When name `i` is busy, a
//! waiting caller keeps the names before `i` it holds, gives back those from `i` on, and
//! takes name `i` alone with the ordinary acquire (registered as a waiter, woken by its
//! release, in turn); then it tries the whole group again, the names it holds only
//! checked. It so waits for a name only while it holds none after it in the order: two
//! callers never wait for each other in a circle.
//!
//! Invariants:
//!
//! - Each attempt draws fresh tokens for the names it takes: a token whose give-back was
//!   sent is never sent in an attempt again.
//! - A failed acquire holds nothing: the names taken while waiting are released, and an
//!   attempt whose outcome is unknown is given back in the background (what it may have
//!   taken lapses after its lease if that give-back is lost too).
//! - Once the wait is over, no new wait starts: a busy name ends the acquire.
//! - A waiting caller rides out failures as an ordinary waiter does: a refusal that passes
//!   (a slot moving, `LOADING`, `CLUSTERDOWN`) until its wait ends, a connection reset, a
//!   restart or a timeout while such failures last no longer than its grace; each time
//!   after a short pause, under fresh tokens, an attempt of unknown outcome withdrawn
//!   first.

use std::time::{Duration, Instant};

use crate::core::acquire::Granted;
use crate::core::backoff::Wait;
use crate::core::reply::{Answer, GroupReply};
use crate::error::{Error, ErrorKind, Result};

/// What a group acquire is asked for.
#[derive(Debug, Clone)]
pub(crate) struct GroupSpec {
    /// The lock keys, in the order they are taken (for messages).
    pub keys: Vec<String>,
    pub wait: Wait,
    /// The longest wait for one reply: a background give-back's bound.
    pub io: Duration,
    /// How long a waiting caller tries again while Redis cannot be reached
    /// ([`crate::core::backoff::grace`]).
    pub grace: Duration,
}

/// Pause before a waiting caller tries again after a failure (as the acquire machine's).
const RECOVERY_PAUSE: Duration = Duration::from_millis(100);

/// A name the last attempt took: its index in the group, its token and its grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupGrant {
    pub index: usize,
    pub token: String,
    pub granted: Granted,
}

/// What the machine decides.
#[derive(Debug)]
pub(crate) enum GroupAction {
    /// Send the acquire-all script: per name its token, and whether it is held already
    /// (checked only). Answer with [`GroupEvent::Attempted`].
    Attempt {
        tokens: Vec<String>,
        held: Vec<bool>,
    },
    /// Withdraw these names' tokens in the background (an attempt whose outcome is
    /// unknown may have taken them), nothing past `cutoff`; answer with
    /// [`GroupEvent::GaveBack`] without waiting.
    GiveBack {
        tokens: Vec<(usize, String)>,
        cutoff: Instant,
    },
    /// Release the locks taken alone for these names (ordinary releases); answer with
    /// [`GroupEvent::Released`].
    Release(Vec<usize>),
    /// Take name `i` alone with the ordinary acquire, waiting as the caller asked; answer
    /// with [`GroupEvent::Waited`] and the token it holds.
    WaitFor(usize),
    /// Sleep until `until` (cancellable), then answer with [`GroupEvent::Paused`].
    Pause { until: Instant },
    /// The acquire is over: the names the last attempt took (with the ones held already,
    /// every name is the caller's), or why it failed (nothing held).
    Done(Result<Vec<GroupGrant>>),
}

/// What happened.
#[derive(Debug)]
pub(crate) enum GroupEvent {
    Start,
    Attempted(Result<Answer<GroupReply>>),
    GaveBack,
    Released,
    Waited(usize, Result<String>),
    /// A pause ended (`Err`: cancelled).
    Paused(Result<()>),
}

/// After a release or a give-back: what comes next.
#[derive(Debug)]
enum Then {
    WaitFor(usize),
    Fail(Error),
    /// Pause, then attempt again.
    Retry,
}

/// One group acquire in progress. See the module documentation.
pub(crate) struct GroupMachine {
    spec: GroupSpec,
    tokens: Box<dyn FnMut() -> String + Send>,
    /// Per name, the token of the ordinary acquire that holds it.
    held: Vec<Option<String>>,
    /// The tokens of the attempt in flight.
    sent: Vec<String>,
    then: Option<Then>,
    /// Since when requests have failed to reach Redis (a reply clears it).
    failing_since: Option<Instant>,
}

impl GroupMachine {
    /// A machine for `spec`, drawing tokens from `tokens`.
    pub fn new(spec: GroupSpec, tokens: Box<dyn FnMut() -> String + Send>) -> Self {
        let n = spec.keys.len();
        GroupMachine {
            spec,
            tokens,
            held: vec![None; n],
            sent: Vec::new(),
            then: None,
            failing_since: None,
        }
    }

    /// The next action, given `event` at `now`; `cancelled`: the caller cancelled the
    /// wait.
    pub fn step(&mut self, event: GroupEvent, now: Instant, cancelled: bool) -> GroupAction {
        match event {
            GroupEvent::Start => self.attempt(),
            GroupEvent::Attempted(Ok(answer)) => self.answered(answer, now, cancelled),
            GroupEvent::Attempted(Err(error)) => {
                let then = if self.retries(&error, now, cancelled) {
                    Then::Retry
                } else {
                    Then::Fail(error.clone())
                };
                if error.outcome_unknown() {
                    let tokens = std::mem::take(&mut self.sent)
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| self.held[*i].is_none())
                        .collect();
                    self.then = Some(then);
                    return GroupAction::GiveBack {
                        tokens,
                        cutoff: now + self.spec.io,
                    };
                }
                self.after(then, now)
            }
            GroupEvent::GaveBack | GroupEvent::Released => match self.then.take() {
                Some(Then::WaitFor(i)) => GroupAction::WaitFor(i),
                Some(Then::Fail(error)) => self.fail(error),
                Some(Then::Retry) => self.pause(now),
                None => self.attempt(),
            },
            GroupEvent::Paused(Err(error)) => self.fail(error),
            GroupEvent::Paused(Ok(())) => {
                if cancelled {
                    return self.fail(cancelled_error());
                }
                self.attempt()
            }
            GroupEvent::Waited(i, Ok(token)) => {
                if let Some(slot) = self.held.get_mut(i) {
                    *slot = Some(token);
                }
                if cancelled {
                    return self.fail(cancelled_error());
                }
                self.attempt()
            }
            GroupEvent::Waited(_, Err(error)) => self.fail(error),
        }
    }

    /// Whether a waiting caller tries again after `error` (see the module documentation).
    fn retries(&mut self, error: &Error, now: Instant, cancelled: bool) -> bool {
        let time_left = match self.spec.wait {
            Wait::No => false,
            Wait::Until(deadline) => now < deadline,
            Wait::Forever => true,
        };
        if cancelled || error.is_cancelled() || !time_left {
            return false;
        }
        if error.refused_for_now() {
            // Refused, so reachable: an unreachable spell is counted afresh.
            self.failing_since = None;
            return true;
        }
        if error.is_unreachable() {
            let since = *self.failing_since.get_or_insert(now);
            return now.duration_since(since) <= self.spec.grace;
        }
        false
    }

    fn after(&mut self, then: Then, now: Instant) -> GroupAction {
        match then {
            Then::Retry => self.pause(now),
            Then::Fail(error) => self.fail(error),
            Then::WaitFor(i) => GroupAction::WaitFor(i),
        }
    }

    /// A short pause before the next attempt, never past the end of the wait.
    fn pause(&mut self, now: Instant) -> GroupAction {
        let left = self.spec.wait.left(now).unwrap_or(RECOVERY_PAUSE);
        GroupAction::Pause {
            until: now + RECOVERY_PAUSE.min(left),
        }
    }

    fn attempt(&mut self) -> GroupAction {
        let mut held = Vec::with_capacity(self.held.len());
        let mut tokens = Vec::with_capacity(self.held.len());
        for h in &self.held {
            held.push(h.is_some());
            tokens.push(match h {
                Some(token) => token.clone(),
                None => (self.tokens)(),
            });
        }
        self.sent = tokens.clone();
        GroupAction::Attempt { tokens, held }
    }

    fn answered(
        &mut self,
        answer: Answer<GroupReply>,
        now: Instant,
        cancelled: bool,
    ) -> GroupAction {
        let sent = std::mem::take(&mut self.sent);
        self.failing_since = None;
        match answer.reply {
            GroupReply::Taken { grants, .. } => {
                let taken = grants
                    .into_iter()
                    .zip(sent)
                    .enumerate()
                    .filter_map(|(index, (grant, token))| {
                        let (fencing_token, lease) = grant?;
                        Some(GroupGrant {
                            index,
                            token,
                            granted: Granted {
                                fencing_token,
                                lease,
                                sent_at: answer.sent_at,
                            },
                        })
                    })
                    .collect();
                GroupAction::Done(Ok(taken))
            }
            GroupReply::OtherKind { index } => {
                let key = self.key(index);
                self.fail(Error::new(
                    ErrorKind::Server,
                    format!(
                        "{key:?} is in use by another kind of lock than a mutex (a name may be \
                         a mutex, a semaphore or a read-write lock, not several at once)"
                    ),
                ))
            }
            GroupReply::Busy { index, .. } => {
                if cancelled {
                    return self.fail(cancelled_error());
                }
                let over = match self.spec.wait {
                    Wait::No => true,
                    Wait::Until(deadline) => now >= deadline,
                    Wait::Forever => false,
                };
                if over {
                    let key = self.key(index);
                    return self.fail(Error::new(
                        ErrorKind::Busy,
                        format!("lock {key:?} is held by another owner"),
                    ));
                }
                let from_here: Vec<usize> = (index..self.held.len())
                    .filter(|i| self.held[*i].take().is_some())
                    .collect();
                if from_here.is_empty() {
                    return GroupAction::WaitFor(index);
                }
                self.then = Some(Then::WaitFor(index));
                GroupAction::Release(from_here)
            }
        }
    }

    /// Ends with `error`, releasing every name taken alone first.
    fn fail(&mut self, error: Error) -> GroupAction {
        let held: Vec<usize> = (0..self.held.len())
            .filter(|i| self.held[*i].take().is_some())
            .collect();
        if held.is_empty() {
            return GroupAction::Done(Err(error));
        }
        self.then = Some(Then::Fail(error));
        GroupAction::Release(held)
    }

    fn key(&self, index: usize) -> &str {
        self.spec.keys.get(index).map_or("?", String::as_str)
    }
}

/// Without renewal, the names of a lock over several names (all groups, in order) whose
/// leases ran down while later names were taken: the indexes of those to extend to the
/// ttl before the lock is returned. `left`: each name's lease left by the local clock (a
/// lost or ended lease is zero), read just now.
///
/// A lease of `ttl` just taken has the ttl less its drift allowance left by the local
/// clock ([`crate::core::lease::drift`]), less the round trip that took it. A name is run
/// down when it has less than that by more than the drift allowance again (so a name
/// taken one round trip ago is not, however long the ttl), or is over. Every name so has
/// at least the ttl less twice the drift allowance when the extends begin, and keeps at
/// least that less the time the extends take.
pub(crate) fn run_down(left: &[Duration], ttl: Duration) -> Vec<usize> {
    let enough = ttl.saturating_sub(crate::core::lease::drift(ttl) * 2);
    left.iter()
        .enumerate()
        .filter(|(_, l)| l.is_zero() || **l < enough)
        .map(|(i, _)| i)
        .collect()
}

/// The first pause before a lock over several names, without renewal, starts again after
/// one of its run-down names was lost; it doubles up to the ttl.
pub(crate) const RESTART_PAUSE: Duration = Duration::from_millis(10);

/// Whether a lock over several names, one of whose run-down names was lost at `now`,
/// starts again: `None` once its wait is over (it ends busy); else how long it pauses
/// first (`pause`, no longer than the wait left) and the pause after that (doubled, up to
/// the ttl).
pub(crate) fn start_again(
    wait: Wait,
    now: Instant,
    pause: Duration,
    ttl: Duration,
) -> Option<(Duration, Duration)> {
    if wait.deadline(now).is_some_and(|end| end <= now) {
        return None;
    }
    let this = wait.left(now).map_or(pause, |left| left.min(pause));
    Some((this, (pause * 2).min(ttl).max(RESTART_PAUSE)))
}

fn cancelled_error() -> Error {
    Error::new(ErrorKind::Cancelled, "the wait was cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn run_down_leaves_names_taken_a_round_trip_ago_alone() {
        // A ttl of 1 s: 12 ms of drift allowance, so 976 ms is enough.
        assert!(run_down(&[ms(985), ms(988), ms(976)], ms(1000)).is_empty());
        assert!(run_down(&[], ms(1000)).is_empty());
        // 30 s: 302 ms of allowance; a name taken a few round trips before is fresh.
        assert!(run_down(&[ms(29_690), ms(29_697)], ms(30_000)).is_empty());
        // A repeated attempt never shortens a lease: more than the ttl is fresh too.
        assert!(run_down(&[ms(1500), ms(988)], ms(1000)).is_empty());
    }

    #[test]
    fn run_down_names_every_lease_short_of_a_fresh_one_by_the_allowance() {
        // An earlier step, and a name taken alone inside the last group.
        assert_eq!(
            run_down(&[ms(400), ms(988), ms(12), ms(975)], ms(1000)),
            vec![0, 2, 3]
        );
        // The last step run down too (its lease counted from a request that waited):
        // the measure is the ttl, not the freshest name.
        assert_eq!(run_down(&[ms(534), ms(535)], ms(750)), vec![0, 1]);
        // A lease over is run down, whatever the others.
        assert_eq!(run_down(&[ms(0), ms(988)], ms(1000)), vec![0]);
        // The shortest ttl, 10 ms: 2.1 ms of allowance, so 5.8 ms is enough.
        assert_eq!(run_down(&[ms(0), ms(7), ms(5)], ms(10)), vec![0, 2]);
    }

    #[test]
    fn start_again_pauses_within_the_wait_doubling_up_to_the_ttl() {
        let now = Instant::now();
        let ttl = ms(50);
        assert_eq!(start_again(Wait::No, now, RESTART_PAUSE, ttl), None);
        assert_eq!(start_again(Wait::Until(now), now, RESTART_PAUSE, ttl), None);
        assert_eq!(
            start_again(Wait::Forever, now, RESTART_PAUSE, ttl),
            Some((ms(10), ms(20)))
        );
        assert_eq!(
            start_again(Wait::Forever, now, ms(40), ttl),
            Some((ms(40), ms(50)))
        );
        // No longer than the wait left.
        let until = Wait::Until(now + ms(15));
        assert_eq!(start_again(until, now, ms(40), ttl), Some((ms(15), ms(50))));
        // A ttl under the first pause: the pause stays at the first.
        assert_eq!(
            start_again(Wait::Forever, now, RESTART_PAUSE, ms(5)),
            Some((ms(10), ms(10)))
        );
    }

    fn machine(n: usize, wait: Wait) -> GroupMachine {
        let mut next = 0;
        GroupMachine::new(
            GroupSpec {
                keys: (0..n).map(|i| format!("k{i}")).collect(),
                wait,
                io: Duration::from_secs(1),
                grace: Duration::from_millis(1500),
            },
            Box::new(move || {
                next += 1;
                format!("t{next}")
            }),
        )
    }

    fn answer(reply: GroupReply, sent_at: Instant) -> GroupEvent {
        GroupEvent::Attempted(Ok(Answer {
            reply,
            sent_at,
            unacknowledged: None,
        }))
    }

    fn busy(index: usize) -> GroupReply {
        GroupReply::Busy {
            index,
            holder_pttl: None,
        }
    }

    #[test]
    fn one_attempt_takes_every_name_with_its_own_token_timed_from_its_write() {
        let now = Instant::now();
        let mut m = machine(2, Wait::No);
        let GroupAction::Attempt { tokens, held } = m.step(GroupEvent::Start, now, false) else {
            panic!("no attempt");
        };
        assert_eq!(tokens, ["t1", "t2"]);
        assert_eq!(held, [false, false]);
        let grants = vec![
            Some((7, Duration::from_secs(1))),
            Some((9, Duration::from_secs(1))),
        ];
        let reply = GroupReply::Taken {
            grants,
            server_clock: None,
        };
        match m.step(answer(reply, now), now, false) {
            GroupAction::Done(Ok(taken)) => {
                assert_eq!(taken.len(), 2);
                assert_eq!(taken[1].token, "t2");
                assert_eq!(taken[1].granted.fencing_token, 9);
                assert_eq!(taken[1].granted.sent_at, now);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_try_that_finds_a_name_busy_fails_holding_nothing() {
        let now = Instant::now();
        let mut m = machine(3, Wait::No);
        m.step(GroupEvent::Start, now, false);
        match m.step(answer(busy(1), now), now, false) {
            GroupAction::Done(Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Busy);
                assert!(e.message().contains("k1"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_waiter_keeps_the_names_before_the_busy_one_and_gives_back_the_rest() {
        let now = Instant::now();
        let wait = Wait::Until(now + Duration::from_secs(10));
        let mut m = machine(3, wait);
        m.step(GroupEvent::Start, now, false);
        // Name 1 busy: wait for it alone (nothing held yet).
        assert!(matches!(
            m.step(answer(busy(1), now), now, false),
            GroupAction::WaitFor(1)
        ));
        // Taken alone; the next attempt only checks it, and draws fresh tokens.
        let GroupAction::Attempt { tokens, held } =
            m.step(GroupEvent::Waited(1, Ok("w1".into())), now, false)
        else {
            panic!("no attempt");
        };
        assert_eq!(held, [false, true, false]);
        assert_eq!(tokens, ["t4", "w1", "t5"]);
        // Now name 2 is busy: name 1 is before it and kept.
        assert!(matches!(
            m.step(answer(busy(2), now), now, false),
            GroupAction::WaitFor(2)
        ));
        let GroupAction::Attempt { held, .. } =
            m.step(GroupEvent::Waited(2, Ok("w2".into())), now, false)
        else {
            panic!("no attempt");
        };
        assert_eq!(held, [false, true, true]);
        // Name 0 was taken meanwhile: both held names come after it and are given back
        // before the wait for it.
        match m.step(answer(busy(0), now), now, false) {
            GroupAction::Release(names) => assert_eq!(names, [1, 2]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            m.step(GroupEvent::Released, now, false),
            GroupAction::WaitFor(0)
        ));
        let GroupAction::Attempt { held, .. } =
            m.step(GroupEvent::Waited(0, Ok("w0".into())), now, false)
        else {
            panic!("no attempt");
        };
        assert_eq!(held, [true, false, false]);
        let reply = GroupReply::Taken {
            grants: vec![
                None,
                Some((3, Duration::from_secs(1))),
                Some((4, Duration::from_secs(1))),
            ],
            server_clock: None,
        };
        match m.step(answer(reply, now), now, false) {
            GroupAction::Done(Ok(taken)) => {
                let indices: Vec<usize> = taken.iter().map(|g| g.index).collect();
                assert_eq!(indices, [1, 2]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lost_held_name_is_given_back_and_waited_for_again() {
        let now = Instant::now();
        let mut m = machine(2, Wait::Forever);
        m.step(GroupEvent::Start, now, false);
        m.step(answer(busy(0), now), now, false);
        m.step(GroupEvent::Waited(0, Ok("w0".into())), now, false);
        // The script says name 0 (held) is not ours any more.
        assert!(matches!(
            m.step(answer(busy(0), now), now, false),
            GroupAction::Release(ref names) if names == &[0]
        ));
        assert!(matches!(
            m.step(GroupEvent::Released, now, false),
            GroupAction::WaitFor(0)
        ));
    }

    #[test]
    fn an_unknown_outcome_is_given_back_under_the_attempts_new_tokens_only() {
        let now = Instant::now();
        let mut m = machine(3, Wait::Forever);
        m.step(GroupEvent::Start, now, false);
        m.step(answer(busy(1), now), now, false);
        m.step(GroupEvent::Waited(1, Ok("w1".into())), now, false);
        // A server error whose reply was lost (not one a waiter rides out).
        let lost = Error::new(ErrorKind::Server, "ERR something").sent();
        match m.step(GroupEvent::Attempted(Err(lost)), now, false) {
            GroupAction::GiveBack { tokens, cutoff } => {
                assert_eq!(tokens, [(0, "t4".to_owned()), (2, "t5".to_owned())]);
                assert_eq!(cutoff, now + Duration::from_secs(1));
            }
            other => panic!("{other:?}"),
        }
        // Then the name taken alone is released, and the acquire fails.
        assert!(matches!(
            m.step(GroupEvent::GaveBack, now, false),
            GroupAction::Release(ref names) if names == &[1]
        ));
        match m.step(GroupEvent::Released, now, false) {
            GroupAction::Done(Err(e)) => assert!(e.outcome_unknown()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_waiter_rides_out_resets_within_its_grace_and_refusals_until_its_wait_ends() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = machine(2, Wait::Until(t0 + Duration::from_secs(10)));
        m.step(GroupEvent::Start, t0, false);
        // A reset after the request was written: withdrawn, a pause, fresh tokens.
        let reset = Error::new(ErrorKind::Connection, "reset").sent();
        assert!(matches!(
            m.step(GroupEvent::Attempted(Err(reset)), t0, false),
            GroupAction::GiveBack { .. }
        ));
        match m.step(GroupEvent::GaveBack, t0, false) {
            GroupAction::Pause { until } => assert_eq!(until, t0 + ms(100)),
            other => panic!("{other:?}"),
        }
        let GroupAction::Attempt { tokens, .. } =
            m.step(GroupEvent::Paused(Ok(())), t0 + ms(100), false)
        else {
            panic!("no attempt");
        };
        assert_eq!(tokens, ["t3", "t4"]);
        // Refused for now (a slot moving): nothing to withdraw, a pause; and the refusal
        // shows Redis reachable, so the unreachable spell starts afresh.
        let refused = Error::new(ErrorKind::Server, "TRYAGAIN").refused();
        assert!(matches!(
            m.step(GroupEvent::Attempted(Err(refused)), t0 + ms(200), false),
            GroupAction::Pause { .. }
        ));
        m.step(GroupEvent::Paused(Ok(())), t0 + ms(300), false);
        // Unreachable from 1 s on: tried again up to the grace (1.5 s), then given up.
        let down = || Error::new(ErrorKind::Connection, "refused");
        let t1 = t0 + Duration::from_secs(1);
        assert!(matches!(
            m.step(GroupEvent::Attempted(Err(down())), t1, false),
            GroupAction::Pause { .. }
        ));
        m.step(GroupEvent::Paused(Ok(())), t1 + ms(100), false);
        assert!(matches!(
            m.step(GroupEvent::Attempted(Err(down())), t1 + ms(1400), false),
            GroupAction::Pause { .. }
        ));
        m.step(GroupEvent::Paused(Ok(())), t1 + ms(1500), false);
        match m.step(GroupEvent::Attempted(Err(down())), t1 + ms(1600), false) {
            GroupAction::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Connection),
            other => panic!("{other:?}"),
        }
        // A try does not ride anything out.
        let mut m = machine(2, Wait::No);
        m.step(GroupEvent::Start, t0, false);
        match m.step(GroupEvent::Attempted(Err(down())), t0, false) {
            GroupAction::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Connection),
            other => panic!("{other:?}"),
        }
        // Nor does a waiter whose wait is over, nor a cancelled one.
        let mut m = machine(2, Wait::Until(t0));
        m.step(GroupEvent::Start, t0, false);
        assert!(matches!(
            m.step(GroupEvent::Attempted(Err(down())), t0, false),
            GroupAction::Done(Err(_))
        ));
        let mut m = machine(2, Wait::Forever);
        m.step(GroupEvent::Start, t0, false);
        m.step(GroupEvent::Attempted(Err(down())), t0, false);
        match m.step(GroupEvent::Paused(Ok(())), t0 + ms(100), true) {
            GroupAction::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Cancelled),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_wait_starts_after_the_deadline_nor_after_a_cancel() {
        let now = Instant::now();
        let mut m = machine(2, Wait::Until(now));
        m.step(GroupEvent::Start, now, false);
        match m.step(answer(busy(0), now), now, false) {
            GroupAction::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Busy),
            other => panic!("{other:?}"),
        }
        let mut m = machine(2, Wait::Forever);
        m.step(GroupEvent::Start, now, false);
        m.step(answer(busy(1), now), now, false);
        // Cancelled while it waited, after the name was taken: given back.
        assert!(matches!(
            m.step(GroupEvent::Waited(1, Ok("w1".into())), now, true),
            GroupAction::Release(ref names) if names == &[1]
        ));
        match m.step(GroupEvent::Released, now, true) {
            GroupAction::Done(Err(e)) => assert_eq!(e.kind(), ErrorKind::Cancelled),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_name_of_another_kind_is_named_in_the_error() {
        let now = Instant::now();
        let mut m = machine(2, Wait::Forever);
        m.step(GroupEvent::Start, now, false);
        match m.step(answer(GroupReply::OtherKind { index: 1 }, now), now, false) {
            GroupAction::Done(Err(e)) => assert!(e.message().contains("\"k1\""), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
