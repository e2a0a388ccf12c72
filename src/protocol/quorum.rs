//! The lock protocol over N independent primaries (Redlock, as the Redis documentation
//! describes it, with no corners cut): every call is one round on every member, and the
//! answers are counted ([`crate::core::quorum`]).
//!
//! - An attempt sends the same token to every member (`SET NX PX`, no script: see
//!   [`calls::member_attempt`]). When it is not granted on a majority in time, the acquire
//!   gives it back on every member, those that did not answer included (the machine of
//!   [`crate::core::acquire`] does, within the call's bounds), before it goes on. A waiter
//!   sleeps between attempts (no wake-up across members) and never repeats a token; the
//!   waiters of this client for one name wait in a line ([`crate::core::line`]), and a
//!   release by this client wakes the first of them at once.
//! - Each member gets much less than the ttl per round: ttl/10, at least 10 ms, at most
//!   the I/O timeout (the Redis documentation's "5-50 ms for a 10 s ttl" is for a LAN).
//! - Fencing tokens: none. Each member's counter increases, but the largest token of one
//!   majority need not exceed that of an earlier majority (they may differ in the member
//!   with the highest counter), so no token here is monotonic: `fencing_token()` is 0.

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::Backend;
use crate::backend::batch::Item;
use crate::backend::call::{Call, Replicas};
use crate::backend::exec::{Exec, Replies};
use crate::backend::members::{Members, per_member};
use crate::core::acquire::Bounds;
use crate::core::backoff;
use crate::core::quorum::{self, AcquireVerdict};
use crate::core::reply::{self, Answer, AttemptReply, ExtendReply, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lane::Lane;
use crate::line::Lines;
use crate::protocol::{AttemptRequest, Capabilities, Hold, LockServer, Queued, calls};
use crate::token;

/// A Redlock deployment.
pub(crate) struct Quorum {
    members: Members,
    bounds: Bounds,
    describe: String,
    /// This client's waiters per name: a release wakes the first at once.
    lines: Lines,
}

impl Quorum {
    /// A quorum over `members` (each a single server or a Sentinel deployment).
    pub fn new(members: Vec<Backend>, bounds: Bounds) -> Self {
        let describe = format!(
            "redlock({})",
            members
                .iter()
                .map(Backend::describe)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Quorum {
            members: Members::new(members),
            bounds,
            describe,
            lines: Lines::default(),
        }
    }

    /// Sends `call` on `key` to every member, within a round's time for a lease of `ttl`
    /// (never past `cutoff`), and reads each member's answer with `read`. Also returns the
    /// error of a member left out for being another member's server (its answer is that
    /// error: see [`Members::round`]).
    fn round<T>(
        &self,
        key: &str,
        call: Call,
        lane: Lane,
        ttl: Duration,
        cutoff: Option<Instant>,
        read: impl Fn(Option<Value>) -> Result<T>,
    ) -> (Vec<Result<T>>, Option<Error>) {
        let mut until = Instant::now() + per_member(ttl, self.bounds.io);
        if let Some(cutoff) = cutoff {
            until = until.min(cutoff);
        }
        let round = self.members.round(key, &[call], lane, until);
        let answers = round
            .outcomes
            .into_iter()
            .map(|outcome| outcome.and_then(|values| read(values.into_iter().next())))
            .collect();
        (answers, round.one_server)
    }

    /// One command on every member, within one I/O timeout; the answers of those that
    /// answered, or an error when fewer than a majority did.
    fn on_members(&self, key: &str, cmd: &redis::Cmd) -> Result<Vec<Value>> {
        let deadline = Instant::now() + self.bounds.io;
        let round = self
            .members
            .round(key, &[Call::cmd(cmd)], Lane::Urgent, deadline);
        let names = self.members.names();
        let mut answers = Vec::new();
        let mut failures = Vec::new();
        for (outcome, name) in round.outcomes.into_iter().zip(&names) {
            match outcome.map(|v| v.into_iter().next()) {
                Ok(Some(Value::ServerError(e))) => {
                    failures.push(format!("{name}: {}", Error::server(&e)));
                }
                Ok(Some(value)) => answers.push(value),
                Ok(None) => failures.push(format!("{name}: no reply")),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        let n = names.len();
        if answers.len() >= quorum::quorum(n) {
            Ok(answers)
        } else {
            Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "{} of {n} primaries answered, {} needed: {}",
                    answers.len(),
                    quorum::quorum(n),
                    failures.join("; ")
                ),
            ))
        }
    }

    fn not_available(&self, what: &str) -> Error {
        Error::invalid(format!("{what} is not available on a Redlock client"))
    }
}

impl LockServer for Quorum {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            every_kind: false,
            blocking: false,
            fencing: false,
            replicas: false,
            batching: false,
            inspection: false,
        }
    }

    fn bounds(&self) -> Bounds {
        self.bounds
    }

    fn describe(&self) -> &str {
        &self.describe
    }

    fn attempt(&self, request: &AttemptRequest<'_>) -> Result<Option<Answer<AttemptReply>>> {
        let keys = request.hold.keys;
        // Redlock hands out no fencing tokens: the members' counters would only count.
        let call = calls::member_attempt(request.hold, request.ttl);
        let start = Instant::now();
        let (answers, one_server) = self.round(
            &keys.lock,
            call,
            Lane::Urgent,
            request.ttl,
            request.exec.cutoff,
            |value| reply::member_attempt(value, request.ttl),
        );
        if let Some(e) = one_server {
            // Refused, so that the mistake is seen, after the round went to the other
            // members: it may have taken the lock there, and the acquire gives it back
            // before it returns, as after any failed attempt of a quorum (a release round
            // leaves the member out and counts it as not answering).
            return Err(e);
        }
        let names = self.members.names();
        match quorum::acquire(
            &keys.lock,
            &answers,
            &names,
            start,
            request.ttl,
            Instant::now(),
        ) {
            AcquireVerdict::Granted => Ok(Some(Answer {
                reply: AttemptReply::Granted {
                    fencing_token: 0,
                    lease: request.ttl,
                    server_clock: None,
                },
                // The validity counts from before the first write.
                sent_at: start,
                unacknowledged: None,
            })),
            // Not held: the caller gives the attempt back (a minority may hold it) before
            // it goes on, within its own bounds.
            AcquireVerdict::GiveBack(error) if error.kind() == ErrorKind::Busy => {
                Ok(Some(Answer {
                    reply: AttemptReply::Busy { holder_pttl: None },
                    sent_at: start,
                    unacknowledged: None,
                }))
            }
            AcquireVerdict::GiveBack(error) => Err(error),
        }
    }

    fn extend(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        _replicas: Option<Replicas>,
        exec: &Exec<'_>,
    ) -> Result<Answer<ExtendReply>> {
        let call = hold
            .kind
            .extend(hold.keys, hold.token, ttl.as_millis() as u64);
        let start = Instant::now();
        let answers = self
            .round(
                &hold.keys.lock,
                call,
                Lane::Renewal,
                ttl,
                exec.cutoff,
                reply::extend,
            )
            .0;
        let reply = quorum::extend(&hold.keys.lock, &answers, &self.members.names())?;
        Ok(Answer {
            reply,
            sent_at: start,
            unacknowledged: None,
        })
    }

    fn release(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        withdraw: bool,
        exec: &Exec<'_>,
    ) -> Result<ReleaseReply> {
        let call = self.release_call(hold.kind, hold.keys, hold.token, withdraw);
        let answers = self
            .round(
                &hold.keys.lock,
                call,
                Lane::Urgent,
                ttl,
                exec.cutoff,
                reply::release,
            )
            .0;
        if !withdraw {
            // Whatever the answers say, the members that deleted the key are free now.
            self.lines.released(&hold.keys.lock);
        }
        quorum::release(&hold.keys.lock, &answers, &self.members.names())
    }

    fn lines(&self) -> Option<&Lines> {
        Some(&self.lines)
    }

    fn queue_renewal(&self, _key: &str, _item: Item, _deadline: Instant) -> Result<Queued> {
        Err(self.not_available("batching renewals"))
    }

    fn is_locked(&self, keys: &LockKeys) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        let answers = self.on_members(&keys.lock, &cmd)?;
        let held = answers.iter().filter(|v| **v == Value::Int(1)).count();
        Ok(held >= quorum::quorum(self.members.members.len()))
    }

    fn ping(&self) -> Result<()> {
        self.on_members("", &redis::cmd("PING")).map(drop)
    }

    fn run(&self, _key: &str, _calls: &[Call], _exec: &Exec<'_>) -> Result<Replies> {
        Err(self.not_available("this operation"))
    }

    fn scan(&self, _pattern: &str, _limit: usize) -> Result<Vec<String>> {
        Err(self.not_available("listing locks"))
    }

    fn close_idle(&self) {
        for member in &self.members.members {
            member.close_idle();
        }
    }
}

impl Quorum {
    fn release_call(&self, kind: &Kind, keys: &LockKeys, token: &str, withdraw: bool) -> Call {
        let handoff = token::handoff_token(token);
        let hold = Hold { kind, keys, token };
        // A quorum's attempts never register, so no registration names a ttl.
        let ttl = Duration::ZERO;
        calls::release(
            hold,
            &handoff,
            backoff::grace(self.bounds.io),
            withdraw,
            ttl,
        )
    }
}
