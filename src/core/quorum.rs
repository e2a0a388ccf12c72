//! Redlock's verdicts: what the members' answers to one round come to.
//!
//! A round sends the same script to every member; each member answers, or fails (no
//! answer in time, an error). These functions count the answers; the round itself is
//! [`crate::backend::members`], and the protocol over it [`crate::protocol::quorum`].
//!
//! - Acquire: granted when a majority (N/2 + 1) said yes *and* the validity `ttl -
//!   elapsed - drift` (elapsed from before the first write) is positive. Otherwise the
//!   attempt is given back on every member, those that did not answer included: busy when
//!   a majority answered (an error reply is an answer) and some member was held by another
//!   owner (or a majority granted it too late), a connection error when fewer than a
//!   majority answered (no majority can be formed then, so a waiter's wait ends once that
//!   has lasted a grace), a server error when so many members refused (an error reply)
//!   that the others cannot make a majority and none holds it for another owner.
//! - Extend: extended when a majority extended it; the token is gone for good when so many
//!   members no longer hold it that no majority ever can again; otherwise unknown.
//! - Release: released when a majority gave the hold back (a member that handed the lock to
//!   a waiter of its own gave it back too); not held when a majority reported the token
//!   gone, or every member answered; otherwise unknown.

use std::time::{Duration, Instant};

use crate::core::lease::local_deadline;
use crate::core::reply::{AttemptReply, ExtendReply, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};

/// How many members make a majority of `n`.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The first two members that are one server: those whose connections reported the same
/// server id (`run_id`); members without one (not connected, or not telling) are never
/// matched. One server listed twice passes for two members: losing it loses both.
pub(crate) fn one_server_twice<S: AsRef<str>>(ids: &[Option<S>]) -> Option<(usize, usize)> {
    ids.iter().enumerate().find_map(|(j, id)| {
        let id = id.as_ref()?.as_ref();
        ids[..j]
            .iter()
            .position(|earlier| earlier.as_ref().is_some_and(|e| e.as_ref() == id))
            .map(|i| (i, j))
    })
}

/// What the members' answers to an acquire round come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireVerdict {
    /// A majority granted it in time: the lock is held, its lease counted from `start`.
    Granted,
    /// Not held: give the attempt back on every member, then fail with this error.
    GiveBack(Error),
}

/// Counts an acquire round that started (before its first write) at `start` for a lease of
/// `ttl`, read at `now`. `names` names the members, for the message.
pub(crate) fn acquire(
    key: &str,
    answers: &[Result<AttemptReply>],
    names: &[&str],
    start: Instant,
    ttl: Duration,
    now: Instant,
) -> AcquireVerdict {
    let n = answers.len();
    let yes = answers
        .iter()
        .filter(|a| matches!(a, Ok(AttemptReply::Granted { .. })))
        .count();
    if yes >= quorum(n) && now < local_deadline(start, ttl) {
        return AcquireVerdict::Granted;
    }
    let held = answers
        .iter()
        .filter(|a| matches!(a, Ok(AttemptReply::Busy { .. })))
        .count();
    // Members that answered, with an error too (`OOM`, `NOPERM`): reachable.
    let answered = answers
        .iter()
        .filter(|a| !matches!(a, Err(e) if e.kind() != ErrorKind::Server))
        .count();
    let detail: Vec<String> = answers
        .iter()
        .zip(names)
        .map(|(a, name)| match a {
            Ok(AttemptReply::Busy { .. }) => format!("{name}: held by another owner"),
            Ok(_) => format!("{name}: granted (given back)"),
            Err(e) if e.kind() == ErrorKind::Server => format!("{name}: refused ({e})"),
            Err(e) => format!("{name}: no answer ({e})"),
        })
        .collect();
    let message = format!(
        "lock {key:?}: {yes} of {n} members granted it, {} needed{}: {}",
        quorum(n),
        if yes >= quorum(n) {
            " but its validity ran out first"
        } else {
            ""
        },
        detail.join("; ")
    );
    // Refusals (an error reply) from so many members that the others cannot make a
    // majority: the servers' answer, which trying again does not change.
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(e) if e.kind() == ErrorKind::Server))
        .count();
    let kind = if yes >= quorum(n) || (held > 0 && answered >= quorum(n)) {
        ErrorKind::Busy
    } else if refused > n - quorum(n) {
        ErrorKind::Server
    } else {
        ErrorKind::Connection
    };
    AcquireVerdict::GiveBack(Error::new(kind, message))
}

/// Counts an extend round.
///
/// Errors: [`ErrorKind::Connection`], marked of unknown outcome, when too few answered to
/// know.
pub(crate) fn extend(
    key: &str,
    answers: &[Result<ExtendReply>],
    names: &[&str],
) -> Result<ExtendReply> {
    let n = answers.len();
    let yes = answers
        .iter()
        .filter(|a| matches!(a, Ok(ExtendReply::Extended)))
        .count();
    let gone = answers
        .iter()
        .filter(|a| matches!(a, Ok(ExtendReply::NotHeld)))
        .count();
    if yes >= quorum(n) {
        return Ok(ExtendReply::Extended);
    }
    if gone > n - quorum(n) {
        return Ok(ExtendReply::NotHeld);
    }
    let detail: Vec<String> = answers
        .iter()
        .zip(names)
        .map(|(a, name)| match a {
            Ok(ExtendReply::Extended) => format!("{name}: extended"),
            Ok(ExtendReply::NotHeld) => format!("{name}: token gone"),
            Err(e) => format!("{name}: no answer ({e})"),
        })
        .collect();
    Err(Error::new(
        ErrorKind::Connection,
        format!(
            "extending {key:?}: {yes} of {n} members, {} needed: {}",
            quorum(n),
            detail.join("; ")
        ),
    )
    .sent())
}

/// Counts a release round.
///
/// Errors: [`ErrorKind::Connection`], marked of unknown outcome, when too few answered to
/// know.
pub(crate) fn release(
    key: &str,
    answers: &[Result<ReleaseReply>],
    names: &[&str],
) -> Result<ReleaseReply> {
    let n = answers.len();
    let released = answers
        .iter()
        .filter(|a| a.as_ref().is_ok_and(|r| r.was_held()))
        .count();
    let gone = answers
        .iter()
        .filter(|a| matches!(a, Ok(ReleaseReply::NotHeld)))
        .count();
    let failed: Vec<String> = answers
        .iter()
        .zip(names)
        .filter_map(|(a, name)| a.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    if released >= quorum(n) {
        Ok(ReleaseReply::Released)
    } else if gone >= quorum(n) || failed.is_empty() {
        Ok(ReleaseReply::NotHeld)
    } else {
        Err(Error::new(
            ErrorKind::Connection,
            format!(
                "releasing {key:?}: confirmed by {released} of {n} members, {} needed; no answer from {}",
                quorum(n),
                failed.join("; ")
            ),
        )
        .sent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_under_two_names_is_found_by_its_id() {
        assert_eq!(one_server_twice::<&str>(&[]), None);
        assert_eq!(one_server_twice(&[Some("a"), Some("b"), Some("c")]), None);
        assert_eq!(
            one_server_twice(&[Some("a"), None, Some("a")]),
            Some((0, 2))
        );
        assert_eq!(
            one_server_twice(&[Some("a"), Some("b"), Some("b"), Some("a")]),
            Some((1, 2))
        );
        // Members not connected, or not telling, are not one server.
        assert_eq!(one_server_twice::<&str>(&[None, None]), None);
    }

    const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

    fn granted() -> Result<AttemptReply> {
        Ok(AttemptReply::Granted {
            fencing_token: 1,
            lease: Duration::from_secs(1),
            server_clock: None,
        })
    }

    fn busy() -> Result<AttemptReply> {
        Ok(AttemptReply::Busy { holder_pttl: None })
    }

    fn down<T>() -> Result<T> {
        Err(Error::new(ErrorKind::Timeout, "no reply").sent())
    }

    /// Every subset of unavailable members, as go-redsync's tests do.
    #[test]
    fn an_acquire_needs_a_majority_of_grants_in_time_for_every_subset_of_members_down() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        for n in 1..=5usize {
            for down_mask in 0u32..(1 << n) {
                let answers: Vec<_> = (0..n)
                    .map(|i| {
                        if down_mask & (1 << i) != 0 {
                            down()
                        } else {
                            granted()
                        }
                    })
                    .collect();
                let up = n - down_mask.count_ones() as usize;
                let verdict = acquire("k", &answers, &NAMES[..n], t0, ttl, t0);
                assert_eq!(
                    verdict == AcquireVerdict::Granted,
                    up >= quorum(n),
                    "n={n} down={down_mask:b}"
                );
                if let AcquireVerdict::GiveBack(e) = verdict {
                    assert_eq!(e.kind(), ErrorKind::Connection);
                }
            }
        }
    }

    #[test]
    fn a_majority_too_late_or_a_member_held_is_busy() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        let answers = [granted(), granted(), busy()];
        assert_eq!(
            acquire("k", &answers, &NAMES, t0, ttl, t0),
            AcquireVerdict::Granted
        );
        match acquire("k", &answers, &NAMES, t0, ttl, t0 + ttl) {
            AcquireVerdict::GiveBack(e) => {
                assert_eq!(e.kind(), ErrorKind::Busy);
                assert!(e.message().contains("validity ran out"), "{e}");
            }
            v => panic!("{v:?}"),
        }
        match acquire("k", &[granted(), busy(), down()], &NAMES, t0, ttl, t0) {
            AcquireVerdict::GiveBack(e) => assert_eq!(e.kind(), ErrorKind::Busy),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_member_held_with_no_majority_answering_is_unreachable_not_busy() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        for answers in [[busy(), down(), down()], [down(), down(), busy()]] {
            match acquire("k", &answers, &NAMES, t0, ttl, t0) {
                AcquireVerdict::GiveBack(e) => {
                    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
                    assert!(e.message().contains("held by another owner"), "{e}");
                }
                v => panic!("{v:?}"),
            }
        }
        match acquire("k", &[busy(), busy(), down()], &NAMES, t0, ttl, t0) {
            AcquireVerdict::GiveBack(e) => assert_eq!(e.kind(), ErrorKind::Busy),
            v => panic!("{v:?}"),
        }
        // Members that refused (out of memory) answered: the one that holds it decides.
        let oom = || Err(Error::new(ErrorKind::Server, "OOM command not allowed"));
        match acquire("k", &[busy(), oom(), oom()], &NAMES, t0, ttl, t0) {
            AcquireVerdict::GiveBack(e) => {
                assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
                assert!(e.message().contains("refused"), "{e}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn refusals_that_leave_no_majority_are_a_server_error() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(1);
        let oom = || Err(Error::new(ErrorKind::Server, "OOM command not allowed"));
        let kind =
            |answers: &[Result<AttemptReply>]| match acquire("k", answers, &NAMES, t0, ttl, t0) {
                AcquireVerdict::GiveBack(e) => e.kind(),
                v => panic!("{v:?}"),
            };
        assert_eq!(kind(&[oom(), oom(), oom()]), ErrorKind::Server);
        assert_eq!(kind(&[granted(), oom(), oom()]), ErrorKind::Server);
        // One refusal: the member that did not answer may yet make a majority.
        assert_eq!(kind(&[granted(), oom(), down()]), ErrorKind::Connection);
        // One holding it for another owner, beside the refusals: busy, as before.
        assert_eq!(kind(&[busy(), oom(), oom()]), ErrorKind::Busy);
    }

    #[test]
    fn an_extend_is_lost_only_when_no_majority_can_hold_any_more() {
        let yes = || Ok(ExtendReply::Extended);
        let gone = || Ok(ExtendReply::NotHeld);
        assert_eq!(
            extend("k", &[yes(), yes(), gone()], &NAMES).unwrap(),
            ExtendReply::Extended
        );
        assert_eq!(
            extend("k", &[gone(), gone(), yes()], &NAMES).unwrap(),
            ExtendReply::NotHeld
        );
        let e = extend("k", &[yes(), gone(), down()], &NAMES).unwrap_err();
        assert!(e.outcome_unknown());
    }

    #[test]
    fn a_release_handed_to_a_waiter_counts_as_released() {
        let r = |reply| Ok(reply);
        assert_eq!(
            release(
                "k",
                &[
                    r(ReleaseReply::HandedOff),
                    r(ReleaseReply::Released),
                    down()
                ],
                &NAMES
            )
            .unwrap(),
            ReleaseReply::Released
        );
        assert_eq!(
            release(
                "k",
                &[
                    r(ReleaseReply::NotHeld),
                    r(ReleaseReply::Released),
                    r(ReleaseReply::NotHeld)
                ],
                &NAMES
            )
            .unwrap(),
            ReleaseReply::NotHeld
        );
        let e = release("k", &[r(ReleaseReply::Released), down(), down()], &NAMES).unwrap_err();
        assert!(e.outcome_unknown());
    }
}
