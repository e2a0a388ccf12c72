//! What a simulated client process is made of: its clock, its threads and what each is
//! doing, and the leases it holds. How its threads behave is [`crate::sim::threads`].

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Replicas;
use crate::core::acquire::{AcquireMachine, AcquireSpec};
use crate::core::backoff::Wait;
use crate::core::group::GroupMachine;
use crate::core::lease::{Broken, LeaseClock};
use crate::core::line::Line;
use crate::core::server_time::ServerTime;
use crate::error::Error;
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::sim::config::{Config, Micros};

/// A thread of a client.
pub(crate) type TaskId = usize;
/// A lease a client holds (never reused within a run).
pub(crate) type LeaseId = usize;
/// A request in the world.
pub(crate) type ReqId = u64;

/// A simulated client process.
pub(crate) struct Client {
    pub id: usize,
    /// Its clock's rate against virtual time.
    pub rate: f64,
    /// Paused (SIGSTOP) until then: nothing of it runs.
    pub paused_until: Option<Micros>,
    /// How many times it was paused (a call that spans a pause is not held to its bound).
    pub pauses: u64,
    pub tasks: Vec<Task>,
    pub leases: Vec<SimLease>,
    next_token: u64,
    /// Waiters of this client blocked on a server now (the blocking lane).
    pub blocking: usize,
    /// Renewals pipelined together (the node's batcher).
    pub batch: Batch,
    /// Its estimate of the servers' clock, for fencing tokens.
    pub server_time: ServerTime,
    /// Its threads waiting for each name, where the deployment cannot queue them
    /// (Redlock), as the runtime's [`crate::line::Lines`] keeps them.
    pub lines: std::collections::HashMap<usize, Line<TaskId>>,
}

/// A client's renewal batcher: renewals queued for the next batch, and the batches in
/// flight.
#[derive(Default)]
pub(crate) struct Batch {
    pub queue: Vec<Queued>,
    /// A batch is being gathered (its write is due shortly).
    pub gathering: bool,
    pub in_flight: std::collections::BTreeMap<ReqId, Vec<Queued>>,
}

/// A renewal queued in a batch; its lease's gate is held until its outcome.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub lease: LeaseId,
    pub ttl: Duration,
    pub attempt_at: Instant,
    /// Nothing of it may run past this (its lease's deadline).
    pub cutoff: Instant,
    pub queued_at: Instant,
}

/// One thread of a client.
pub(crate) struct Task {
    pub ops_left: usize,
    pub op: Op,
}

/// What a thread is doing.
pub(crate) enum Op {
    /// Between two operations (or not started yet).
    Idle,
    Acquiring(Box<Acquiring>),
    /// In its critical section, until its wake.
    Holding(Holding),
    /// Extending (since the instant, by its clock, and the pauses its process had had).
    Extending(Holding, GateStage, (Instant, u64)),
    /// Releasing (since the instant, by its clock).
    Releasing(Holding, GateStage, Instant),
    /// Adopting a mutex another thread holds, under its token.
    Adopting(Box<Adopting>),
    /// Taking several mutexes all or none (`Client::lock_all`): a group attempt in flight
    /// (a wait for one of its names alone is an [`Op::Acquiring`] carrying the group).
    Grouping(Box<Grouping>),
    /// A lock over several names taken without renewal: its run-down names extended one
    /// after the other before it is held, or a pause before it starts again.
    Keeping(Box<Keeping>),
    Done,
}

/// A lock over several names in progress, run by [`GroupMachine`] as the runtime's
/// `MultiLockBuilder` runs it.
pub(crate) struct Grouping {
    /// The names, in the order they are taken (their keys').
    pub names: Vec<usize>,
    pub machine: GroupMachine,
    pub ttl: Duration,
    pub renew: bool,
    pub wait: Wait,
    pub started: Instant,
    pub pauses: u64,
    /// The group attempt in flight, with its held flags.
    pub pending: Option<(ReqId, Vec<bool>)>,
    /// Per name, the lease of the ordinary acquire that took it alone.
    pub alone: Vec<Option<LeaseId>>,
    /// The name being waited for alone.
    pub waiting_for: usize,
    /// When the server ran the last group attempt answered.
    pub ran_at: Micros,
    /// Pausing after a failure, until its wake.
    pub sleeping: bool,
    pub cancelled: bool,
    /// The pause before it starts again after a run-down name was lost (as
    /// `core::group::start_again` decides for the runtime too).
    pub restart_pause: Duration,
}

/// A lock over several names, every name held, without renewal: the names whose leases
/// ran down (`core::group::run_down`) are extended, first to last, before it is returned;
/// one found lost sends every name back and the lock starts again after a pause.
pub(crate) struct Keeping {
    pub group: Box<Grouping>,
    /// Every name's lease and token, in the order of the names.
    pub held: Vec<(LeaseId, String)>,
    /// The indexes (into `held`) still to extend, the next first.
    pub run_down: Vec<usize>,
    /// How many extends this pass sent, for the bound of the whole acquire.
    pub extends: u32,
    /// The extend in flight, and when it was attempted.
    pub pending: Option<(Request, Instant)>,
    /// Pausing before it starts again, until its wake.
    pub sleeping: bool,
}

/// An adopt in flight: the check of a mutex held under `token`, sent at `sent_at`.
pub(crate) struct Adopting {
    pub name: usize,
    pub token: String,
    pub ttl: Duration,
    pub renew: bool,
    pub sent_at: Instant,
    pub request: Request,
}

impl Op {
    /// What the thread is doing, for a stuck run's report.
    pub fn describe(&self) -> String {
        match self {
            Op::Idle => "idle".into(),
            Op::Acquiring(a) => format!(
                "acquiring {:?} ({:?}), waiting for {}",
                a.spec.key,
                a.spec.wait,
                match &a.pending {
                    Pending::Nothing => "nothing".to_owned(),
                    Pending::Attempt { request, .. } =>
                        format!("an attempt {}", request.describe()),
                    Pending::Extend(r) => format!("a settle {}", r.describe()),
                    Pending::GiveBack(r) => format!("a give-back {}", r.describe()),
                    Pending::Sleep => "a pause".to_owned(),
                }
            ),
            Op::Adopting(a) => format!("adopting name {} under {}", a.name, a.token),
            Op::Grouping(g) => format!("taking names {:?} at once ({:?})", g.names, g.pending),
            Op::Keeping(k) => format!(
                "keeping names {:?}: {} to extend, {}",
                k.group.names,
                k.run_down.len(),
                match (&k.pending, k.sleeping) {
                    (Some((request, _)), _) => format!("an extend {}", request.describe()),
                    (None, true) => "a pause before it starts again".to_owned(),
                    (None, false) => "nothing".to_owned(),
                }
            ),
            Op::Holding(h) => format!("holding lease {}", h.lease),
            Op::Extending(h, _, _) => format!("extending lease {}", h.lease),
            Op::Releasing(h, stage, _) => format!(
                "releasing lease {} ({})",
                h.lease,
                match stage {
                    GateStage::Waiting => "waiting for the gate".to_owned(),
                    GateStage::Extend { request, .. } | GateStage::Release { request, .. } =>
                        request.describe(),
                }
            ),
            Op::Done => "done".into(),
        }
    }
}

impl Op {
    /// Whether this thread waits for name `name` with more than `grace` of its wait left
    /// at `now` (by its clock), not cancelled.
    pub fn waits_for(&self, name: usize, now: Instant, grace: Duration) -> bool {
        let Op::Acquiring(a) = self else {
            return false;
        };
        if a.name != name || a.cancelled || matches!(a.pending, Pending::GiveBack(_)) {
            return false;
        }
        match a.spec.wait {
            crate::core::backoff::Wait::No => false,
            crate::core::backoff::Wait::Forever => true,
            crate::core::backoff::Wait::Until(deadline) => deadline > now + grace,
        }
    }
}

impl Request {
    fn describe(&self) -> String {
        match self {
            Request::One(id) => format!("#{id}"),
            Request::Round(round) => format!("round {:?} {:?}", round.what, round.requests),
        }
    }
}

/// The hold a thread is in: its lease and its own token.
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub lease: LeaseId,
    pub hold: String,
    /// The ttl of the extend the thread means to make before it releases.
    pub extend: Option<Duration>,
    /// It already looked at whether it holds, before writing to the fenced resource.
    pub checked: bool,
    /// The other names of a lock over several names, with their leases and tokens:
    /// released one after the other after this one.
    pub rest: Vec<(LeaseId, String)>,
}

/// Where an extend or a release stands with its lease's gate.
pub(crate) enum GateStage {
    /// Waiting for an extend or renewal in flight.
    Waiting,
    /// An extend sent: when it was attempted, with which ttl.
    Extend {
        request: Request,
        attempt_at: Instant,
        ttl: Duration,
    },
    /// A release sent; why the lease was broken before it, if it was.
    Release {
        request: Request,
        broken: Option<Broken>,
        /// When the release was sent (its bound counts from there), and how many pauses
        /// its process had had by then.
        sent: (Instant, u64),
    },
}

/// A request of a thread in flight: one server's, or a Redlock round's.
pub(crate) enum Request {
    One(ReqId),
    Round(Round),
}

/// An acquire in progress.
pub(crate) struct Acquiring {
    /// Index of the name in the run's names.
    pub name: usize,
    pub kind: Kind,
    pub machine: AcquireMachine,
    pub spec: AcquireSpec,
    pub started: Instant,
    pub pauses: u64,
    pub pending: Pending,
    /// When the request that granted the lock ran on the server.
    pub granted_at: Option<Micros>,
    pub cancelled: bool,
    /// Replicas that must acknowledge its writes (`min_replicas`).
    pub replicas: Option<Replicas>,
    /// The lock over several names this acquire takes one name of, alone.
    pub group: Option<Box<Grouping>>,
    /// In its client's line for the name, and woken by a release while it was not
    /// sleeping: its next pause ends at once (as the runtime's eventfd, left readable,
    /// ends it).
    pub woken: bool,
}

/// What an acquire's machine waits for.
pub(crate) enum Pending {
    /// Nothing: it is stepped at once.
    Nothing,
    Attempt {
        request: Request,
        blocked: bool,
        /// A lead attempt went ahead of the block.
        lead: bool,
    },
    Extend(Request),
    GiveBack(Request),
    Sleep,
}

/// A Redlock round: the same calls to every member, counted when every member answered
/// or gave up.
pub(crate) struct Round {
    pub what: RoundFor,
    /// Per member: the request still awaited.
    pub requests: Vec<Option<ReqId>>,
    /// Per member: its replies, or why there are none.
    pub answers: Vec<Option<Result<Vec<Value>, Error>>>,
    /// When the round started, by its client's clock.
    pub started: Instant,
    /// When the round started, in virtual time (no member ran it earlier).
    pub sent_at: Micros,
    pub ttl: Duration,
}

/// What a round is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RoundFor {
    Attempt,
    Extend,
    Release,
}

/// A lease a client holds, shared by the holds of one reentrant owner.
pub(crate) struct SimLease {
    pub name: usize,
    pub token: String,
    pub kind: Kind,
    pub keys: LockKeys,
    pub clock: LeaseClock,
    pub fencing: u64,
    pub renew: bool,
    /// The tokens of the holds (guards) still on it.
    pub holds: Vec<String>,
    /// When the grant that made it ran on the server.
    pub granted_at: Micros,
    pub gate_busy: bool,
    pub gate_closed: bool,
    /// Threads waiting for the gate.
    pub gate_waiters: Vec<TaskId>,
    /// A renewal in flight: its request, when it was attempted, its ttl.
    pub renewal: Option<(Request, Instant, Duration)>,
    /// Replicas that must acknowledge its extends and renewals.
    pub replicas: Option<Replicas>,
    /// Its renewal waits in the client's batch queue (not written yet).
    pub queued: bool,
    /// The last batched renewal failed: the next one goes on its own.
    pub batch_failed: bool,
    /// Its clock was once seen saying it is no longer held (it must never say so again).
    pub seen_ended: bool,
    /// Its token was handed to a thread that adopts the lock: from then on this lease is
    /// not relied on, renewed nor released (the hand-over contract of `LockBuilder::adopt`).
    pub handed_over: bool,
}

/// What differs between the leases a client comes to hold (an acquire, an adopt, a
/// group's script): `World::add_lease` (in `threads`) makes the rest.
pub(crate) struct NewLease {
    pub name: usize,
    /// The lease's token (a reentrant lock's, for a re-entry of its own).
    pub token: String,
    /// The token of the first hold on it.
    pub hold: String,
    pub kind: Kind,
    pub clock: LeaseClock,
    pub fencing: u64,
    pub renew: bool,
    pub granted_at: Micros,
    pub replicas: Option<Replicas>,
}

impl SimLease {
    /// Whether this process believes it holds the lock: some hold on it, and its clock
    /// says held.
    pub fn believed(&self, now: Instant) -> bool {
        !self.holds.is_empty() && self.clock.is_held(now)
    }
}

impl Client {
    pub fn new(id: usize, rate: f64, cfg: &Config) -> Client {
        Client {
            id,
            rate,
            paused_until: None,
            pauses: 0,
            tasks: (0..cfg.tasks)
                .map(|_| Task {
                    ops_left: cfg.ops,
                    op: Op::Idle,
                })
                .collect(),
            leases: Vec::new(),
            next_token: 0,
            blocking: 0,
            batch: Batch::default(),
            server_time: ServerTime::default(),
            lines: std::collections::HashMap::new(),
        }
    }

    /// Every thread is done.
    pub fn done(&self) -> bool {
        self.tasks.iter().all(|t| matches!(t.op, Op::Done))
    }

    /// A fresh token of this client (`c<client>-<n>`).
    pub fn token(&mut self) -> String {
        self.next_token += 1;
        format!("c{}-{}", self.id, self.next_token)
    }
}
