//! The protocol core: every decision of the client half of the lock protocol, without I/O.
//!
//! The code here takes events (a reply, a refusal, a timeout, an unknown outcome, a pause
//! that ended, a cancel) and the time, read by the caller from whatever clock it runs on,
//! and returns what to send next and until when. It never touches a socket, a thread, a
//! condition variable or the system clock, and draws its randomness (tokens, jitter) from
//! sources it is given. So a unit test drives it with a fake clock and scripted replies,
//! and the deterministic simulation runs it against simulated servers; the runtime
//! ([`crate::acquire`], [`crate::lease`], [`crate::renewal`]) only carries out what it
//! decides.
//!
//! - [`acquire`]: an acquire as a state machine (attempt, register, block, confirm a grant,
//!   settle, give back, withdraw, back off, give up).
//! - [`group`]: several mutexes of one server taken all or none, in one script.
//! - [`lease`]: the clock of a held lock (deadline, cap, renewal schedule, loss).
//! - [`line`]: a process's waiters for one name in the order they came, where the
//!   deployment cannot queue them (Redlock).
//! - [`quorum`]: Redlock's verdicts on a round of answers.
//! - [`backoff`]: the caller's wait, the waiter's grace, backoff with jitter.
//! - [`reply`]: the scripts' modes and the meaning of their replies, as types.
//! - [`server_time`]: the client's estimate of the server's clock, for fencing tokens.
//!
//! Invariants the machines keep, on top of the protocol's (see `DESIGN.md` §1 and §9):
//!
//! - a token names one acquisition attempt: no attempt is sent under a token whose
//!   release or withdrawal was sent;
//! - a lease believed lost is never believed held again;
//! - every give-back fits inside the bound of the call that makes it (or goes out in the
//!   background).

pub(crate) mod acquire;
pub(crate) mod backoff;
pub(crate) mod group;
pub(crate) mod lease;
pub(crate) mod line;
pub(crate) mod quorum;
pub(crate) mod reply;
pub(crate) mod server_time;
