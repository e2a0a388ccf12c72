//! What the threads of simulated clients do: they run the real protocol core
//! ([`crate::core`]) with the runtime's policies, over the world's network.
//!
//! - An acquire drives an [`AcquireMachine`] exactly as [`crate::acquire`] does: each
//!   attempt, settle and give-back goes out with the calls of [`crate::protocol::calls`];
//!   a block needs a place on the client's blocking lane (or the machine is told there is
//!   none); a give-back the machine sends in the background is not waited for; a cancel
//!   ends a pause and the wait for an attempt (not a settle or a give-back). On Redlock,
//!   each request is a round on every member, counted by [`crate::core::quorum`], and an
//!   attempt not granted is given back on every member first.
//! - A held lease follows its [`LeaseClock`]: renewal a third of the way into the lease,
//!   retried after a failure, lost at the deadline; extends and renewals take the lease's
//!   gate one at a time; the last hold's release closes the gate (waiting for the one in
//!   flight) and decides whether the lease was broken before it sends the release.
//! - A re-entry joins the lease its owner holds on this client when it is still held
//!   there, as the runtime's registry does; otherwise it gets a lease of its own, or, for a
//!   single attempt answered after that lease ran out, gives its hold back and fails.

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Replicas;
use crate::core::acquire::{AcquireMachine, AcquireSpec, Acquired, Action, Bounds, Event};
use crate::core::backoff::{self, Wait};
use crate::core::lease::{
    self as lease_clock, ExtendOutcome, ExtendVerdict, LeaseClock, LostReason, NotReleased,
    RenewalStep,
};
use crate::core::line::Line;
use crate::core::quorum::{self, AcquireVerdict};
use crate::core::reply::{self, Adopted, Answer, AttemptReply, ExtendReply, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lease::batching::BATCH_MIN_TTL;
use crate::protocol::{Hold, calls};
use crate::sim::client::{
    Acquiring, Adopting, GateStage, Holding, LeaseId, NewLease, Op, Pending, Queued, ReqId,
    Request, Round, RoundFor, SimLease, TaskId,
};
use crate::sim::config::{Deployment, Micros, micros};
use crate::sim::trace::short;
use crate::sim::world::{Event as WorldEvent, Purpose, World};

mod groups;

/// How long a thread thinks between two operations, at most.
const MAX_THINK: Micros = 50_000;
/// How soon a renewal looks again at a lease whose gate an extend holds.
const GATE_RETRY: Micros = 10_000;
/// How long a batch gathers renewals after the first arrives (the batcher's `GATHER`).
const GATHER: Micros = 3_000;
/// How long a queued renewal may wait before its lease takes it back (`QUEUE_PATIENCE`).
const QUEUE_PATIENCE: Duration = Duration::from_millis(10);
/// A renewal thread's extra wait for its batch's outcome (`BATCH_SLACK`).
const BATCH_SLACK: Duration = Duration::from_millis(2);

/// A request's answer as the world hands it over: the replies and when the request was
/// written, or why there are none.
type Answered = std::result::Result<(Vec<Value>, Instant), Error>;

impl World {
    fn bounds(&self) -> Bounds {
        Bounds {
            pool_wait: self.cfg.pool_wait,
            connect: self.cfg.connect_timeout,
            io: self.cfg.io_timeout,
        }
    }

    fn grace(&self) -> Duration {
        backoff::grace(self.cfg.io_timeout)
    }

    fn op(&mut self, client: usize, task: TaskId) -> &mut Op {
        &mut self.clients[client].tasks[task].op
    }

    fn keys(&self, name: usize) -> LockKeys {
        LockKeys::new("", &self.cfg.names[name].name).expect("the run's names are valid")
    }

    /// A thread's timer: it starts its next operation, its critical section ends, or a
    /// pause of its acquire ends. Sometimes the whole process pauses first.
    pub(crate) fn task_wakes(&mut self, client: usize, task: TaskId) {
        if self.rng.f64() < self.cfg.faults.client_pause {
            self.pause_client(client);
            self.at(self.now, WorldEvent::Wake { client, task });
            return;
        }
        match std::mem::replace(self.op(client, task), Op::Idle) {
            Op::Idle => self.start_op(client, task),
            Op::Holding(holding) => self.hold_ends(client, task, holding),
            Op::Grouping(group) if group.sleeping => self.group_wakes(client, task, group),
            Op::Keeping(keeping) if keeping.sleeping => self.group_restarts(client, task, *keeping),
            Op::Acquiring(mut acq) if matches!(acq.pending, Pending::Sleep) => {
                acq.pending = Pending::Nothing;
                self.step(client, task, acq, Event::Paused(Ok(())));
            }
            op => *self.op(client, task) = op,
        }
    }

    /// The caller of a waiting acquire cancels it.
    pub(crate) fn cancel(&mut self, client: usize, task: TaskId) {
        if matches!(self.op(client, task), Op::Grouping(_) | Op::Keeping(_)) {
            return self.cancel_group(client, task);
        }
        if !matches!(self.op(client, task), Op::Acquiring(_)) {
            // Too late: the acquire is over.
            return;
        }
        let Op::Acquiring(mut acq) = std::mem::replace(self.op(client, task), Op::Idle) else {
            return;
        };
        if acq.spec.wait == Wait::No || acq.cancelled {
            *self.op(client, task) = Op::Acquiring(acq);
            return;
        }
        self.trace
            .line(self.now, || format!("c{client}/t{task} cancels its wait"));
        acq.cancelled = true;
        match std::mem::replace(&mut acq.pending, Pending::Nothing) {
            Pending::Sleep => {
                let error = Error::new(ErrorKind::Cancelled, "the wait was cancelled");
                self.step(client, task, acq, Event::Paused(Err(error)));
            }
            // A waiter's attempts watch the cancel (a quorum round does not).
            Pending::Attempt {
                request: Request::One(id),
                blocked,
                ..
            } => {
                self.abandon(id);
                if blocked {
                    self.clients[client].blocking -= 1;
                }
                let error = Error::new(ErrorKind::Cancelled, "the wait was cancelled").sent();
                self.step(client, task, acq, Event::Attempted(Err(error)));
            }
            pending => {
                acq.pending = pending;
                *self.op(client, task) = Op::Acquiring(acq);
            }
        }
    }

    fn start_op(&mut self, client: usize, task: TaskId) {
        let left = &mut self.clients[client].tasks[task].ops_left;
        if *left == 0 {
            *self.op(client, task) = Op::Done;
            return;
        }
        *left -= 1;
        if self.groups && self.group_rng.bool() {
            return self.start_group(client, task);
        }
        if self.adopts && self.adopt_rng.u32(0..4) == 0 {
            if let Some((holder, lease, name, token)) = self.adoptable() {
                // The holder hands its token over: it stops relying on the lock, renewing
                // it and releasing it (it lets it go as `LockGuard::abandon` does).
                self.clients[holder].leases[lease].handed_over = true;
                return self.start_adopt(client, task, name, token);
            }
        }
        let name = self.rng.usize(0..self.cfg.names.len());
        let kind = match &self.cfg.names[name].kind {
            // The owner is the client: its threads share their holds.
            Kind::Reentrant(_) => Kind::Reentrant(format!("c{client}").into()),
            Kind::Read | Kind::Write => {
                if self.rng.bool() {
                    Kind::Read
                } else {
                    Kind::Write
                }
            }
            kind => kind.clone(),
        };
        let ttl = Duration::from_millis(
            *self
                .rng
                .choice(&[20u64, 100, 300, 1000, 3000])
                .unwrap_or(&300),
        );
        let now = self.local(client);
        let wait = match self.rng.u32(0..4) {
            0 => Wait::No,
            1 => Wait::Forever,
            _ => Wait::Until(now + Duration::from_millis(self.rng.u64(1..=3000))),
        };
        let renew = self.rng.u32(0..3) != 0;
        // Replica acknowledgement takes the replication lag (up to 50 ms) on every write:
        // only for leases that outlive it several times over (a shorter one could never
        // be taken: every grant would have lapsed by the time the replica has it).
        let replicas = (matches!(self.cfg.deployment, Deployment::Replicated { .. })
            && ttl >= Duration::from_millis(300)
            && self.rng.bool())
        .then(|| Replicas {
            count: 1,
            timeout: Duration::from_millis(self.rng.u64(20..=300)),
        });
        // A Redlock waiter joins its client's line for the name, as the runtime's does.
        let behind = self.in_line(wait)
            && self.clients[client]
                .lines
                .entry(name)
                .or_default()
                .join(task);
        self.line_paths.behind += u64::from(behind);
        let spec = AcquireSpec {
            key: self.cfg.names[name].name.clone(),
            ttl,
            wait,
            renew,
            blocks: !self.redlock(),
            bounds: self.bounds(),
            replicas: wait_time(replicas),
            direct: kind.hands_over() && replicas.is_none(),
            behind,
        };
        let stream = self.rng.u64(..) % 1_000_000;
        let seed = self.rng.u64(..);
        let machine = self.acquire_machine(client, &spec, now, stream, seed);
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} acquires {:?} as {kind:?} for {ttl:?}, {wait:?}, renew {renew}",
                spec.key
            )
        });
        if wait != Wait::No && self.rng.u32(0..6) == 0 {
            let after = self.rng.u64(0..2_000_000);
            self.at(self.now + after, WorldEvent::Cancel { client, task });
        }
        let acq = Box::new(Acquiring {
            name,
            kind,
            machine,
            spec,
            started: now,
            pauses: self.clients[client].pauses,
            pending: Pending::Nothing,
            granted_at: None,
            cancelled: false,
            replicas,
            group: None,
            woken: false,
        });
        self.step(client, task, acq, Event::Start);
    }

    /// An acquire's machine for `spec`: its first token is the client's next, the ones
    /// after a give-back come from the token stream `stream`; its jitter from `seed`.
    fn acquire_machine(
        &mut self,
        client: usize,
        spec: &AcquireSpec,
        now: Instant,
        stream: u64,
        seed: u64,
    ) -> AcquireMachine {
        let label = format!("c{client}");
        let mut first = Some(self.clients[client].token());
        let mut drawn = 0u64;
        let tokens = Box::new(move || {
            if let Some(first) = first.take() {
                return first;
            }
            drawn += 1;
            format!("{label}-r{stream}.{drawn}")
        });
        AcquireMachine::new(spec.clone(), now, tokens, fastrand::Rng::with_seed(seed))
    }

    /// Steps an acquire's machine with `event` and carries out what it decides.
    fn step(&mut self, client: usize, task: TaskId, mut acq: Box<Acquiring>, event: Event) {
        let now = self.local(client);
        let action = acq.machine.step(event, now, acq.cancelled);
        let keys = self.keys(acq.name);
        let kind = acq.kind.clone();
        let hold = |token: &str| -> (Kind, LockKeys, String) {
            (kind.clone(), keys.clone(), token.to_owned())
        };
        match action {
            Action::Done(result) => return self.acquire_done(client, task, acq, result),
            Action::Attempt(plan) => {
                // A grant given back before is no part of what this attempt may be granted.
                acq.granted_at = None;
                if plan.block.is_some() && self.clients[client].blocking >= self.cfg.blocking_lane {
                    return self.step(client, task, acq, Event::NoBlockingConnection);
                }
                let (kind, keys, token) = hold(&plan.token);
                let h = Hold {
                    kind: &kind,
                    keys: &keys,
                    token: &token,
                };
                let blocked = plan.block.is_some();
                let request = if self.redlock() {
                    let call = calls::member_attempt(h, acq.spec.ttl);
                    Request::Round(self.round(
                        client,
                        Purpose::Task(task),
                        RoundFor::Attempt,
                        vec![args(&call)],
                        acq.spec.ttl,
                        plan.cutoff,
                    ))
                } else {
                    let clock = self.clients[client]
                        .server_time
                        .estimate(self.local(client));
                    let calls = calls::attempt(
                        h,
                        acq.spec.ttl,
                        plan.mode,
                        self.grace(),
                        plan.block,
                        plan.lead,
                        plan.direct,
                        plan.first_lead,
                        acq.replicas,
                        clock,
                    );
                    let waits = plan.block.unwrap_or_default() + wait_time(acq.replicas);
                    let deadline = self.reply_deadline(client, Some(waits), plan.cutoff);
                    let commands = calls.iter().map(args).collect();
                    if blocked {
                        self.clients[client].blocking += 1;
                    }
                    Request::One(self.send(
                        client,
                        Purpose::Task(task),
                        self.primary,
                        commands,
                        deadline,
                    ))
                };
                acq.pending = Pending::Attempt {
                    request,
                    blocked,
                    lead: plan.lead,
                };
            }
            Action::Extend { token, ttl, cutoff } => {
                let (kind, keys, token) = hold(&token);
                let h = Hold {
                    kind: &kind,
                    keys: &keys,
                    token: &token,
                };
                let commands = calls::extend(h, ttl, acq.replicas)
                    .iter()
                    .map(args)
                    .collect();
                let request = self.request(
                    client,
                    Purpose::Task(task),
                    RoundFor::Extend,
                    commands,
                    ttl,
                    cutoff,
                    Some(wait_time(acq.replicas)),
                );
                acq.pending = Pending::Extend(request);
            }
            Action::GiveBack {
                token,
                cutoff,
                background,
            } => {
                let (kind, keys, token) = hold(&token);
                let ttl = acq.spec.ttl;
                let commands = vec![self.release_args(client, &kind, &keys, &token, true, ttl)];
                let (purpose, what) = if background {
                    (Purpose::Background, RoundFor::Release)
                } else {
                    (Purpose::Task(task), RoundFor::Release)
                };
                let request = self.request(
                    client,
                    purpose,
                    what,
                    commands,
                    acq.spec.ttl,
                    Some(cutoff),
                    None,
                );
                if background {
                    return self.step(client, task, acq, Event::GaveBack(None));
                }
                acq.pending = Pending::GiveBack(request);
            }
            Action::Pause { until } => {
                acq.pending = Pending::Sleep;
                let at = if std::mem::take(&mut acq.woken) {
                    self.now
                } else {
                    self.virtual_at(client, until)
                };
                self.at(at, WorldEvent::Wake { client, task });
            }
        }
        *self.op(client, task) = Op::Acquiring(acq);
    }

    /// Whether an acquire that waits so joins its client's line (Redlock waiters do).
    fn in_line(&self, wait: Wait) -> bool {
        self.redlock() && wait.waits()
    }

    /// Wakes `task`, in its client's line: a pause it sleeps ends now, or its next pause
    /// does.
    fn wake_in_line(&mut self, client: usize, task: TaskId) {
        self.trace
            .line(self.now, || format!("c{client}/t{task} woken in line"));
        if let Op::Acquiring(acq) = self.op(client, task) {
            if matches!(acq.pending, Pending::Sleep) {
                self.at(self.now, WorldEvent::Wake { client, task });
            } else {
                acq.woken = true;
            }
        }
    }

    /// The release script's call for `token` of `kind` on `keys` (a withdrawal of a waiter
    /// for `ttl` when `withdraw`), with a fresh handoff token of the client's.
    pub(super) fn release_args(
        &mut self,
        client: usize,
        kind: &Kind,
        keys: &LockKeys,
        token: &str,
        withdraw: bool,
        ttl: Duration,
    ) -> Vec<Vec<u8>> {
        let handoff = format!("{}-handoff", self.clients[client].token());
        let h = Hold { kind, keys, token };
        args(&calls::release(h, &handoff, self.grace(), withdraw, ttl))
    }

    /// Sends `commands` to the one server, or as a Redlock round.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &mut self,
        client: usize,
        purpose: Purpose,
        what: RoundFor,
        commands: Vec<Vec<Vec<u8>>>,
        ttl: Duration,
        cutoff: Option<Instant>,
        block: Option<Duration>,
    ) -> Request {
        if self.redlock() {
            Request::Round(self.round(client, purpose, what, commands, ttl, cutoff))
        } else {
            let deadline = self.reply_deadline(client, block, cutoff);
            Request::One(self.send(client, purpose, self.primary, commands, deadline))
        }
    }

    /// Starts a round on every member: each given ttl/10 (at least 10 ms, at most the I/O
    /// timeout), never past `cutoff`.
    fn round(
        &mut self,
        client: usize,
        purpose: Purpose,
        what: RoundFor,
        commands: Vec<Vec<Vec<u8>>>,
        ttl: Duration,
        cutoff: Option<Instant>,
    ) -> Round {
        let started = self.local(client);
        let per = crate::backend::members::per_member(ttl, self.cfg.io_timeout);
        let mut until = started + per;
        if let Some(cutoff) = cutoff {
            until = until.min(cutoff);
        }
        let deadline = self.virtual_at(client, until).max(self.now);
        let requests: Vec<Option<ReqId>> = (0..self.servers.len())
            .map(|server| Some(self.send(client, purpose, server, commands.clone(), deadline)))
            .collect();
        let answers = requests.iter().map(|_| None).collect();
        Round {
            what,
            requests,
            answers,
            started,
            sent_at: self.now,
            ttl,
        }
    }

    /// Notes a member's answer in a round; the round, when every member answered.
    fn round_answer(request: &mut Request, id: ReqId, answer: Answered) -> Option<Round> {
        let Request::Round(round) = request else {
            return None;
        };
        let member = round.requests.iter().position(|r| *r == Some(id))?;
        round.requests[member] = None;
        round.answers[member] = Some(answer.map(|(values, _)| values));
        if round.answers.iter().any(Option::is_none) {
            return None;
        }
        Some(Round {
            what: round.what,
            requests: Vec::new(),
            answers: std::mem::take(&mut round.answers),
            started: round.started,
            sent_at: round.sent_at,
            ttl: round.ttl,
        })
    }

    /// Whether `request` is the one that `id` answers (a round's member, or itself).
    /// What an extend's `request` came to, once `answer` (to `id`) completes it: at once
    /// for one server, after the last member's answer for a Redlock round.
    fn extend_answered(
        request: &mut Request,
        id: ReqId,
        answer: Answered,
        replicas: Option<Replicas>,
    ) -> Option<ExtendOutcome> {
        match request {
            Request::One(_) => Some(extend_outcome(answer, replicas)),
            Request::Round(_) => {
                Self::round_answer(request, id, answer).map(|round| match extend_verdict(&round) {
                    Ok(reply) => ExtendOutcome::Replied {
                        reply,
                        sent_at: round.started,
                    },
                    Err(e) => ExtendOutcome::Failed {
                        unknown: e.outcome_unknown(),
                    },
                })
            }
        }
    }

    fn answers(request: &Request, id: ReqId) -> bool {
        match request {
            Request::One(one) => *one == id,
            Request::Round(round) => round.requests.contains(&Some(id)),
        }
    }

    /// A request's answer reached its client.
    pub(crate) fn answered(&mut self, id: ReqId, answer: Answered) {
        let Some(sent) = self.sent.get(&id) else {
            return;
        };
        let (client, purpose) = (sent.client, sent.purpose);
        let times = sent.reply_times.clone();
        match purpose {
            Purpose::Background => {}
            Purpose::Task(task) => self.task_answered(client, task, id, &times, answer),
            Purpose::Renewal(lease) => self.renewal_answered(client, lease, id, answer),
            Purpose::Batch => self.batch_answered(client, id, answer),
        }
    }

    /// `times`: when each of the request's commands ran on the server.
    fn task_answered(
        &mut self,
        client: usize,
        task: TaskId,
        id: ReqId,
        times: &[Micros],
        answer: Answered,
    ) {
        match std::mem::replace(self.op(client, task), Op::Idle) {
            Op::Acquiring(mut acq) => {
                let pending = std::mem::replace(&mut acq.pending, Pending::Nothing);
                match pending {
                    Pending::Attempt {
                        request,
                        blocked,
                        lead,
                    } if Self::answers(&request, id) => {
                        self.attempt_answered(
                            client, task, acq, request, blocked, lead, id, times, answer,
                        );
                    }
                    Pending::Extend(mut request) if Self::answers(&request, id) => {
                        let result = match &mut request {
                            // As the runtime's settle: an extend too few replicas
                            // acknowledged is a failed one.
                            Request::One(_) => Some(answer.and_then(|(values, sent_at)| {
                                let a = calls::read_extend(values, acq.replicas, sent_at)?;
                                match a.unacknowledged {
                                    Some(short) => Err(short),
                                    None => Ok((a.reply, a.sent_at)),
                                }
                            })),
                            Request::Round(_) => Self::round_answer(&mut request, id, answer)
                                .map(|round| extend_verdict(&round).map(|r| (r, round.started))),
                        };
                        match result {
                            Some(result) => self.step(client, task, acq, Event::Extended(result)),
                            None => {
                                acq.pending = Pending::Extend(request);
                                *self.op(client, task) = Op::Acquiring(acq);
                            }
                        }
                    }
                    Pending::GiveBack(mut request) if Self::answers(&request, id) => {
                        let result = match &mut request {
                            Request::One(_) => {
                                Some(answer.and_then(|(values, _)| calls::read_release(values)))
                            }
                            Request::Round(_) => Self::round_answer(&mut request, id, answer)
                                .map(|round| release_verdict(&round)),
                        };
                        match result {
                            Some(result) => {
                                self.step(client, task, acq, Event::GaveBack(Some(result)))
                            }
                            None => {
                                acq.pending = Pending::GiveBack(request);
                                *self.op(client, task) = Op::Acquiring(acq);
                            }
                        }
                    }
                    pending => {
                        acq.pending = pending;
                        *self.op(client, task) = Op::Acquiring(acq);
                    }
                }
            }
            Op::Extending(
                holding,
                GateStage::Extend {
                    mut request,
                    attempt_at,
                    ttl,
                },
                started,
            ) if Self::answers(&request, id) => {
                let replicas = self.clients[client].leases[holding.lease].replicas;
                match Self::extend_answered(&mut request, id, answer, replicas) {
                    Some(outcome) => {
                        self.extended(client, task, holding, attempt_at, ttl, outcome, started)
                    }
                    None => {
                        let stage = GateStage::Extend {
                            request,
                            attempt_at,
                            ttl,
                        };
                        *self.op(client, task) = Op::Extending(holding, stage, started);
                    }
                }
            }
            Op::Releasing(
                holding,
                GateStage::Release {
                    mut request,
                    broken,
                    sent,
                },
                started,
            ) if Self::answers(&request, id) => {
                let reply = match &mut request {
                    Request::One(_) => {
                        Some(answer.and_then(|(values, _)| calls::read_release(values)))
                    }
                    Request::Round(_) => Self::round_answer(&mut request, id, answer)
                        .map(|round| release_verdict(&round)),
                };
                match reply {
                    Some(reply) => {
                        let ran_at = times.first().copied();
                        self.released(client, task, holding, broken, reply, sent, ran_at)
                    }
                    None => {
                        let stage = GateStage::Release {
                            request,
                            broken,
                            sent,
                        };
                        *self.op(client, task) = Op::Releasing(holding, stage, started);
                    }
                }
            }
            Op::Adopting(adopting) if Self::answers(&adopting.request, id) => {
                self.adopt_answered(client, task, *adopting, times.first().copied(), answer)
            }
            Op::Grouping(group) if group.pending.as_ref().is_some_and(|(r, _)| *r == id) => {
                self.group_answered(client, task, group, times, answer)
            }
            Op::Keeping(keeping)
                if keeping
                    .pending
                    .as_ref()
                    .is_some_and(|(r, _)| Self::answers(r, id)) =>
            {
                self.keep_answered(client, task, keeping, id, answer)
            }
            op => *self.op(client, task) = op,
        }
    }

    /// A mutex some thread of any client holds and is not extending or releasing (a
    /// holder hands its token over while it just holds), as its client, lease, name and
    /// token, picked at random.
    fn adoptable(&mut self) -> Option<(usize, LeaseId, usize, String)> {
        let mut found = Vec::new();
        for c in 0..self.clients.len() {
            let now = self.local(c);
            for t in 0..self.clients[c].tasks.len() {
                let Op::Holding(holding) = &self.clients[c].tasks[t].op else {
                    continue;
                };
                if !holding.rest.is_empty() {
                    // A lock over several names is not handed over.
                    continue;
                }
                let lease = &self.clients[c].leases[holding.lease];
                if lease.kind == Kind::Mutex
                    && lease.replicas.is_none()
                    && !lease.gate_closed
                    && !lease.handed_over
                    && lease.believed(now)
                {
                    found.push((c, holding.lease, lease.name, lease.token.clone()));
                }
            }
        }
        if found.is_empty() {
            return None;
        }
        let pick = self.adopt_rng.usize(0..found.len());
        Some(found.swap_remove(pick))
    }

    /// Sends the check of an adopt of `name` held under `token` (as a process handed the
    /// token would: `LockBuilder::adopt`).
    fn start_adopt(&mut self, client: usize, task: TaskId, name: usize, token: String) {
        let ttl = Duration::from_millis(
            *self
                .adopt_rng
                .choice(&[20u64, 100, 300, 1000, 3000])
                .unwrap_or(&300),
        );
        let renew = self.adopt_rng.bool();
        let keys = self.keys(name);
        let call = calls::adopt(&keys, &token);
        let sent_at = self.local(client);
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} adopts {:?} under {} for {ttl:?}, renew {renew}",
                keys.lock,
                short(&token)
            )
        });
        let request = self.request(
            client,
            Purpose::Task(task),
            RoundFor::Extend,
            vec![args(&call)],
            ttl,
            None,
            None,
        );
        *self.op(client, task) = Op::Adopting(Box::new(Adopting {
            name,
            token,
            ttl,
            renew,
            sent_at,
            request,
        }));
    }

    /// An adopt's check answered: a lease of its own under the token, counted from the
    /// send, when the key held it. `ran_at`: when the server ran the check (the key held
    /// the token then: a server's data lost after it may have been this lease's).
    fn adopt_answered(
        &mut self,
        client: usize,
        task: TaskId,
        adopting: Adopting,
        ran_at: Option<Micros>,
        answer: Answered,
    ) {
        self.check.ops += 1;
        let adopted = answer.and_then(|(values, _)| {
            calls::read_adopt(values.into_iter().next().unwrap_or(redis::Value::Nil))
        });
        let (pttl, fencing) = match adopted {
            Ok(Adopted::Held {
                pttl,
                fencing_token,
            }) => (pttl, fencing_token),
            other => {
                self.trace.line(self.now, || {
                    format!(
                        "c{client}/t{task} adopt of {} answered {other:?}",
                        short(&adopting.token)
                    )
                });
                return self.think(client, task);
            }
        };
        let id = self.add_lease(
            client,
            NewLease {
                name: adopting.name,
                token: adopting.token.clone(),
                hold: adopting.token.clone(),
                kind: Kind::Mutex,
                clock: LeaseClock::new(
                    adopting.ttl,
                    pttl.unwrap_or(adopting.ttl),
                    adopting.sent_at,
                ),
                fencing,
                renew: adopting.renew,
                granted_at: ran_at.unwrap_or(self.now),
                replicas: None,
            },
        );
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} adopted {} (lease {id}, fencing {fencing}, {pttl:?} left)",
                short(&adopting.token)
            )
        });
        let now = self.local(client);
        let length = Duration::from_micros(self.rng.u64(0..=micros(adopting.ttl) * 3 / 2));
        let extend = (self.rng.u32(0..4) == 0)
            .then(|| Duration::from_millis(*self.rng.choice(&[20u64, 200, 1000]).unwrap_or(&200)));
        let at = self.virtual_at(client, now + length);
        *self.op(client, task) = Op::Holding(Holding {
            lease: id,
            hold: adopting.token,
            extend,
            checked: false,
            rest: Vec::new(),
        });
        self.at(at, WorldEvent::Wake { client, task });
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt_answered(
        &mut self,
        client: usize,
        task: TaskId,
        mut acq: Box<Acquiring>,
        mut request: Request,
        blocked: bool,
        lead: bool,
        id: ReqId,
        times: &[Micros],
        answer: Answered,
    ) {
        if let Request::One(_) = request {
            if blocked {
                self.clients[client].blocking -= 1;
            }
            let event = match answer {
                Ok((values, sent_at)) => {
                    // The script that answers: the lead attempt when it took the lock, else
                    // the one after the block (if there was one). A direct waiter's block
                    // answers with a grant a release made: it ran when that release ran.
                    let direct = acq.spec.direct && blocked;
                    let lead_took = lead
                        && values.first().is_some_and(|v| {
                            crate::core::reply::attempt(Some(v.clone()))
                                .is_ok_and(|r| !matches!(r, AttemptReply::Busy { .. }))
                        });
                    let script = match (lead, lead_took) {
                        (true, true) => 0,
                        (true, false) => 2,
                        (false, _) => usize::from(blocked),
                    };
                    let mut ran_at = times.get(script).copied();
                    let own_wake = self.keys(acq.name).own_wake(acq.machine.token());
                    let read = calls::read_attempt(
                        values,
                        blocked,
                        lead,
                        direct.then_some(calls::Direct {
                            own_wake: &own_wake,
                            ttl: acq.spec.ttl,
                        }),
                        acq.replicas,
                        sent_at,
                    );
                    let handed = matches!(
                        &read,
                        Ok(Answer {
                            reply: AttemptReply::Granted { .. },
                            ..
                        })
                    );
                    if direct && !lead_took && handed {
                        ran_at = self.check.handed_at(acq.name, acq.machine.token());
                        let key = &acq.spec.key;
                        self.trace.line(self.now, || {
                            format!("c{client}/t{task} was handed {key:?} by a release")
                        });
                    }
                    // When the server last saw the lock held for this acquisition (a
                    // re-entry joins a hold its owner took earlier).
                    if let Ok(Answer {
                        reply: AttemptReply::Granted { .. } | AttemptReply::Reentered { .. },
                        ..
                    }) = &read
                    {
                        acq.granted_at = ran_at;
                    }
                    if let Ok(Answer {
                        reply:
                            AttemptReply::Granted {
                                server_clock: Some(clock),
                                ..
                            },
                        sent_at,
                        ..
                    }) = &read
                    {
                        let now = self.local(client);
                        self.clients[client]
                            .server_time
                            .observed(*clock, *sent_at, now);
                    }
                    Event::Attempted(read)
                }
                Err(e) => Event::Attempted(Err(e)),
            };
            return self.step(client, task, acq, event);
        }
        let Some(round) = Self::round_answer(&mut request, id, answer) else {
            acq.pending = Pending::Attempt {
                request,
                blocked,
                lead,
            };
            *self.op(client, task) = Op::Acquiring(acq);
            return;
        };
        let answers: Vec<Result<AttemptReply>> = round
            .answers
            .iter()
            .map(|a| match a {
                Some(Ok(values)) => reply::member_attempt(values.first().cloned(), round.ttl),
                Some(Err(e)) => Err(e.clone()),
                None => Err(Error::new(ErrorKind::Timeout, "no reply").sent()),
            })
            .collect();
        let names = member_names(answers.len());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let now = self.local(client);
        // As `protocol::quorum` answers: granted on a majority in time, busy, or an error;
        // the machine gives back what was not granted.
        let event = match quorum::acquire(
            &acq.spec.key,
            &answers,
            &names,
            round.started,
            round.ttl,
            now,
        ) {
            AcquireVerdict::Granted => {
                // Its writes ran after the round was sent: a member's data lost since then
                // may have been this grant's.
                acq.granted_at = Some(round.sent_at);
                Event::Attempted(Ok(Answer {
                    reply: AttemptReply::Granted {
                        fencing_token: 0,
                        lease: round.ttl,
                        server_clock: None,
                    },
                    sent_at: round.started,
                    unacknowledged: None,
                }))
            }
            AcquireVerdict::GiveBack(error) if error.kind() == ErrorKind::Busy => {
                Event::Attempted(Ok(Answer {
                    reply: AttemptReply::Busy { holder_pttl: None },
                    sent_at: round.started,
                    unacknowledged: None,
                }))
            }
            AcquireVerdict::GiveBack(error) => Event::Attempted(Err(error)),
        };
        self.step(client, task, acq, event);
    }

    /// An acquire ended: a hold (joined to the lease its owner holds here, or a lease of
    /// its own), or nothing.
    fn acquire_done(
        &mut self,
        client: usize,
        task: TaskId,
        mut acq: Box<Acquiring>,
        result: Result<Acquired>,
    ) {
        if acq.group.is_none() && self.in_line(acq.spec.wait) {
            let line = self.clients[client].lines.entry(acq.name).or_default();
            let next = line.leave(task, result.is_ok());
            if let Some(next) = next {
                self.line_paths.passed += 1;
                self.wake_in_line(client, next);
            }
        }
        let now = self.local(client);
        let took = now.saturating_duration_since(acq.started);
        let paused = self.clients[client].pauses != acq.pauses;
        let vnow = self.now;
        self.check
            .acquire_took(vnow, &acq.spec, acq.started, took, paused);
        if let Some(group) = acq.group.take() {
            // One name of a lock over several names, taken alone while its caller waited.
            let waited = result.map(|acquired| {
                let lease = self.new_lease(client, &acq, &acquired);
                (lease, acquired.token)
            });
            return self.group_waited(client, task, group, waited);
        }
        let Acquired {
            granted,
            token,
            reentered,
        } = match result {
            Ok(acquired) => acquired,
            Err(e) => {
                self.trace.line(self.now, || {
                    format!(
                        "c{client}/t{task} acquire of {:?} failed: {e}",
                        acq.spec.key
                    )
                });
                return self.think(client, task);
            }
        };
        let joined = reentered
            .as_deref()
            .and_then(|lock_token| self.join(client, &acq, lock_token, &granted, &token));
        if let (None, Some(lock_token), Wait::No) = (joined, &reentered, acq.spec.wait) {
            if lease_clock::local_deadline(granted.sent_at, granted.lease) <= now {
                // As the runtime does: a single attempt's re-entry answered after its lease
                // ran out gives its hold back at once (a lease of its own, never renewed,
                // released now) and the acquire fails.
                let lease = self.add_lease(
                    client,
                    NewLease {
                        name: acq.name,
                        token: lock_token.clone(),
                        hold: token.clone(),
                        kind: acq.kind.clone(),
                        clock: LeaseClock::new(acq.spec.ttl, granted.lease, granted.sent_at),
                        fencing: granted.fencing_token,
                        renew: false,
                        granted_at: acq.granted_at.unwrap_or(self.now),
                        replicas: acq.replicas,
                    },
                );
                self.trace.line(self.now, || {
                    format!(
                        "c{client}/t{task} re-entry of {:?} answered after its lease: given back",
                        acq.spec.key
                    )
                });
                *self.op(client, task) = Op::Holding(Holding {
                    lease,
                    hold: token,
                    extend: None,
                    checked: false,
                    rest: Vec::new(),
                });
                return self.at(self.now, WorldEvent::Wake { client, task });
            }
        }
        let lease = match joined {
            Some(lease) => lease,
            None => self.new_lease(
                client,
                &acq,
                &Acquired {
                    granted,
                    token: token.clone(),
                    reentered,
                },
            ),
        };
        if self.trace.enabled {
            let l = &self.clients[client].leases[lease];
            let until = self.virtual_at(client, l.clock.deadline()) as f64 / 1000.0;
            let line = format!(
                "c{client}/t{task} holds {:?} as {} (lease {}, fencing {}) until {until:.3} ms",
                acq.spec.key,
                short(&token),
                short(&l.token),
                l.fencing,
            );
            self.trace.line(self.now, || line);
        }
        // The critical section: shorter or longer than the lease.
        let length = Duration::from_micros(self.rng.u64(0..=micros(acq.spec.ttl) * 3 / 2));
        let extend = (self.rng.u32(0..4) == 0)
            .then(|| Duration::from_millis(*self.rng.choice(&[20u64, 200, 1000]).unwrap_or(&200)));
        let at = self.virtual_at(client, now + length);
        *self.op(client, task) = Op::Holding(Holding {
            lease,
            hold: token,
            extend,
            checked: false,
            rest: Vec::new(),
        });
        self.at(at, WorldEvent::Wake { client, task });
    }

    /// A lease this client now holds, its renewal scheduled when it renews.
    fn add_lease(&mut self, client: usize, new: NewLease) -> LeaseId {
        let id = self.clients[client].leases.len();
        let keys = self.keys(new.name);
        self.clients[client].leases.push(SimLease {
            name: new.name,
            token: new.token,
            kind: new.kind,
            keys,
            clock: new.clock,
            fencing: new.fencing,
            renew: new.renew,
            holds: vec![new.hold],
            granted_at: new.granted_at,
            gate_busy: false,
            gate_closed: false,
            gate_waiters: Vec::new(),
            renewal: None,
            replicas: new.replicas,
            queued: false,
            batch_failed: false,
            seen_ended: false,
            handed_over: false,
        });
        if new.renew {
            self.schedule_renewal(client, id);
        }
        id
    }

    /// A lease of its own for what `acq` acquired (not a re-entry joined to a lease held
    /// here), with its renewal, told to the checker.
    fn new_lease(&mut self, client: usize, acq: &Acquiring, acquired: &Acquired) -> LeaseId {
        let Acquired {
            granted,
            token,
            reentered,
        } = acquired;
        let granted_at = acq.granted_at.unwrap_or(self.now);
        let lease_token = reentered.clone().unwrap_or_else(|| token.clone());
        let id = self.add_lease(
            client,
            NewLease {
                name: acq.name,
                token: lease_token.clone(),
                hold: token.clone(),
                kind: acq.kind.clone(),
                clock: LeaseClock::new(acq.spec.ttl, granted.lease, granted.sent_at),
                fencing: granted.fencing_token,
                renew: acq.spec.renew,
                granted_at,
                replicas: acq.replicas,
            },
        );
        if reentered.is_none() {
            self.check
                .told_granted(acq.name, granted_at, granted.fencing_token, &lease_token);
        }
        id
    }

    /// A re-entry: the new hold joins the lease this client holds under `lock_token` if it
    /// is still held here, and is the acquisition the re-entry joined on the server (the
    /// same fencing token); `None` otherwise (the hold gets a lease of its own).
    fn join(
        &mut self,
        client: usize,
        acq: &Acquiring,
        lock_token: &str,
        granted: &crate::core::acquire::Granted,
        hold: &str,
    ) -> Option<LeaseId> {
        let now = self.local(client);
        let id = self.clients[client].leases.iter().position(|l| {
            l.name == acq.name
                && l.token == lock_token
                && l.fencing == granted.fencing_token
                && !l.gate_closed
                && l.believed(now)
        })?;
        let start_renewal = {
            let lease = &mut self.clients[client].leases[id];
            lease
                .clock
                .reentered(acq.spec.ttl, granted.lease, granted.sent_at);
            lease.holds.push(hold.to_owned());
            let start = acq.spec.renew && !lease.renew;
            lease.renew |= acq.spec.renew;
            start
        };
        if start_renewal {
            self.schedule_renewal(client, id);
        }
        Some(id)
    }

    fn think(&mut self, client: usize, task: TaskId) {
        *self.op(client, task) = Op::Idle;
        let at = self.now + self.rng.u64(0..MAX_THINK);
        self.at(at, WorldEvent::Wake { client, task });
    }

    /// A critical section ends: perhaps an extend first, then the release.
    fn hold_ends(&mut self, client: usize, task: TaskId, mut holding: Holding) {
        let now = self.local(client);
        if self.clients[client].leases[holding.lease].handed_over {
            // Handed over: let go without releasing.
            self.clients[client].leases[holding.lease].gate_closed = true;
            return self.think(client, task);
        }
        holding.checked = true;
        if holding.extend.is_some() {
            let pauses = self.clients[client].pauses;
            *self.op(client, task) = Op::Extending(holding, GateStage::Waiting, (now, pauses));
            return self.enter_gate(client, task);
        }
        *self.op(client, task) = Op::Releasing(holding, GateStage::Waiting, now);
        self.leave_hold(client, task);
    }

    /// A thread wants its lease's gate for an extend: takes it, or waits for it.
    fn enter_gate(&mut self, client: usize, task: TaskId) {
        let Op::Extending(holding, _, started) = std::mem::replace(self.op(client, task), Op::Idle)
        else {
            return;
        };
        let now = self.local(client);
        let lease = &mut self.clients[client].leases[holding.lease];
        if lease.gate_closed {
            // Released meanwhile by another hold: the extend finds it not held.
            *self.op(client, task) = Op::Extending(holding, GateStage::Waiting, started);
            return self.extend_refused(client, task, LostReason::NotHeld);
        }
        if lease.gate_busy {
            lease.gate_waiters.push(task);
            *self.op(client, task) = Op::Extending(holding, GateStage::Waiting, started);
            return;
        }
        lease.gate_busy = true;
        let ttl = holding.extend.unwrap_or(Duration::from_millis(200));
        if let Err(reason) = lease.clock.before_extend(now, ttl) {
            *self.op(client, task) = Op::Extending(holding, GateStage::Waiting, started);
            return self.extend_refused(client, task, reason);
        }
        let cutoff = lease.clock.deadline();
        let request = self.send_extend(client, Purpose::Task(task), holding.lease, ttl, cutoff);
        let stage = GateStage::Extend {
            request,
            attempt_at: now,
            ttl,
        };
        // The extend's bound counts from the gate.
        let pauses = self.clients[client].pauses;
        *self.op(client, task) = Op::Extending(holding, stage, (now, pauses));
    }

    /// An extend that found the lock lost before sending anything: the thread releases.
    fn extend_refused(&mut self, client: usize, task: TaskId, reason: LostReason) {
        let Op::Extending(mut holding, _, _) = std::mem::replace(self.op(client, task), Op::Idle)
        else {
            return;
        };
        self.trace.line(self.now, || {
            format!("c{client}/t{task} extend: lost ({reason})")
        });
        let lease = &self.clients[client].leases[holding.lease];
        if lease.gate_busy && !lease.gate_closed {
            self.free_gate(client, holding.lease);
        }
        holding.extend = None;
        let now = self.local(client);
        *self.op(client, task) = Op::Releasing(holding, GateStage::Waiting, now);
        self.leave_hold(client, task);
    }

    #[allow(clippy::too_many_arguments)]
    fn extended(
        &mut self,
        client: usize,
        task: TaskId,
        mut holding: Holding,
        attempt_at: Instant,
        ttl: Duration,
        outcome: ExtendOutcome,
        (started, pauses): (Instant, u64),
    ) {
        let now = self.local(client);
        let verdict = self.clients[client].leases[holding.lease]
            .clock
            .after_extend(ttl, attempt_at, outcome, now);
        self.trace.line(self.now, || {
            format!("c{client}/t{task} extend to {ttl:?}: {outcome:?} -> {verdict:?}")
        });
        self.free_gate(client, holding.lease);
        let vnow = self.now;
        let paused = self.clients[client].pauses != pauses;
        let replicas = wait_time(self.clients[client].leases[holding.lease].replicas);
        self.check.extend_took(
            vnow,
            now.saturating_duration_since(started),
            replicas,
            paused,
        );
        holding.extend = None;
        // A little more of the critical section; then the release.
        let at = self.now + self.rng.u64(0..MAX_THINK);
        *self.op(client, task) = Op::Holding(holding);
        self.at(at, WorldEvent::Wake { client, task });
    }

    /// The gate of a lease is free again: the waiting threads try it in turn (a release
    /// that waited closes it).
    fn free_gate(&mut self, client: usize, lease: LeaseId) {
        let l = &mut self.clients[client].leases[lease];
        l.gate_busy = false;
        for task in std::mem::take(&mut l.gate_waiters) {
            match &self.clients[client].tasks[task].op {
                Op::Extending(..) => self.enter_gate(client, task),
                Op::Releasing(..) => self.close_gate_and_release(client, task),
                _ => {}
            }
        }
    }

    /// A thread gives its hold back: the last hold of a lease closes its gate (waiting for
    /// an extend or renewal in flight), which stops renewal; then the release is sent.
    fn leave_hold(&mut self, client: usize, task: TaskId) {
        let Op::Releasing(holding, _, _) = &self.clients[client].tasks[task].op else {
            return;
        };
        let (lease, hold) = (holding.lease, holding.hold.clone());
        let l = &mut self.clients[client].leases[lease];
        l.holds.retain(|h| *h != hold);
        if l.holds.is_empty() {
            self.close_gate_and_release(client, task);
        } else {
            self.send_release(client, task);
        }
    }

    fn close_gate_and_release(&mut self, client: usize, task: TaskId) {
        let Op::Releasing(holding, _, _) = &self.clients[client].tasks[task].op else {
            return;
        };
        let lease = holding.lease;
        // A renewal still queued is taken back (unsent) rather than waited for.
        self.take_back(client, lease);
        let l = &mut self.clients[client].leases[lease];
        if l.gate_busy {
            l.gate_waiters.push(task);
            return;
        }
        l.gate_closed = true;
        self.send_release(client, task);
    }

    fn send_release(&mut self, client: usize, task: TaskId) {
        let Op::Releasing(holding, _, started) = std::mem::replace(self.op(client, task), Op::Idle)
        else {
            return;
        };
        let now = self.local(client);
        let l = &mut self.clients[client].leases[holding.lease];
        // Decided before the release is sent.
        let broken = l.clock.broken(now);
        if l.gate_closed {
            l.clock.mark_released();
        }
        let ttl = l.clock.renewal_ttl();
        let (kind, keys) = (l.kind.clone(), l.keys.clone());
        let commands = vec![self.release_args(client, &kind, &keys, &holding.hold, false, ttl)];
        let request = self.request(
            client,
            Purpose::Task(task),
            RoundFor::Release,
            commands,
            ttl,
            None,
            None,
        );
        let pauses = self.clients[client].pauses;
        let stage = GateStage::Release {
            request,
            broken,
            sent: (now, pauses),
        };
        *self.op(client, task) = Op::Releasing(holding, stage, started);
    }

    #[allow(clippy::too_many_arguments)]
    fn released(
        &mut self,
        client: usize,
        task: TaskId,
        holding: Holding,
        broken: Option<crate::core::lease::Broken>,
        reply: Result<ReleaseReply>,
        (sent, pauses): (Instant, u64),
        ran_at: Option<Micros>,
    ) {
        let now = self.local(client);
        let l = &self.clients[client].leases[holding.lease];
        let verdict = match &reply {
            Ok(r) => lease_clock::release_verdict(r.was_held(), broken, l.clock.broken(now)),
            Err(_) => Err(NotReleased::NotFound),
        };
        let ok = verdict.is_ok();
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} released {}: {reply:?}, broken {broken:?} -> {verdict:?}",
                short(&holding.hold),
            )
        });
        let (name, kind, token, granted_at) =
            (l.name, l.kind.clone(), l.token.clone(), l.granted_at);
        if self.redlock() {
            // The first of the client's waiters for the name tries now.
            let first = self.clients[client]
                .lines
                .get_mut(&name)
                .and_then(Line::released);
            if let Some(first) = first {
                self.line_paths.woken += 1;
                self.wake_in_line(client, first);
            }
        }
        let exempt = self.redlock() || self.data_lost_at.iter().any(|t| *t >= granted_at);
        let paused = self.clients[client].pauses != pauses;
        let at = ran_at.unwrap_or(self.now);
        self.check.released(
            at,
            now.saturating_duration_since(sent),
            paused,
            ok,
            name,
            &kind,
            &token,
            granted_at,
            exempt,
        );
        let mut rest = holding.rest;
        if !rest.is_empty() {
            // The next name of a lock over several names.
            let (lease, hold) = rest.remove(0);
            let next = Holding {
                lease,
                hold,
                extend: None,
                checked: true,
                rest,
            };
            *self.op(client, task) = Op::Releasing(next, GateStage::Waiting, now);
            return self.leave_hold(client, task);
        }
        self.think(client, task);
    }

    fn schedule_renewal(&mut self, client: usize, lease: LeaseId) {
        let due = self.clients[client].leases[lease].clock.next_renewal();
        self.wake_for_renewal(client, lease, due);
    }

    /// Wakes a lease's renewal for `due`, as its thread would: on time, or early by up to
    /// the coalescing of its wake-ups (rounded to a grid, the thread may come a little
    /// before the renewal is due, and then renews rather than sleeping again).
    fn wake_for_renewal(&mut self, client: usize, lease: LeaseId, due: Instant) {
        let early_ns = self.clients[client].leases[lease]
            .clock
            .renewal_early()
            .as_nanos() as u64;
        let early = match self.rng.u32(0..3) {
            0 => 0,
            1 => early_ns,
            _ => self.rng.u64(0..=early_ns),
        };
        let at = self.virtual_at(
            client,
            due.checked_sub(Duration::from_nanos(early)).unwrap_or(due),
        );
        self.at(at, WorldEvent::Renew { client, lease });
    }

    /// A lease's renewal is due: it renews (with the gate: in the client's batch, or on its
    /// own), or finds the lease lost.
    pub(crate) fn renewal_due(&mut self, client: usize, lease: LeaseId) {
        let now = self.local(client);
        let batching = !self.redlock();
        let l = &mut self.clients[client].leases[lease];
        if l.gate_closed || l.handed_over || l.clock.lost().is_some() || l.renewal.is_some() {
            return;
        }
        match l.clock.renewal_step(now) {
            RenewalStep::Wait(due) => self.wake_for_renewal(client, lease, due),
            RenewalStep::Expired => {
                // A renewal still queued behind a slow batch must not hold up the loss.
                self.take_back(client, lease);
                let l = &mut self.clients[client].leases[lease];
                l.clock.lose_if_expired(now);
                self.trace.line(self.now, || {
                    format!("c{client} lease {lease} lost: not renewed before its deadline")
                });
            }
            RenewalStep::Renew { ttl, cutoff } => {
                if l.gate_busy {
                    // The renewal queued last waits behind a slow batch: taken back, it goes
                    // on its own; otherwise an extend is in flight: look again shortly.
                    let patience_over = l.queued
                        && self.clients[client].batch.queue.iter().any(|q| {
                            q.lease == lease
                                && now.saturating_duration_since(q.queued_at) >= QUEUE_PATIENCE
                        });
                    if !patience_over {
                        self.at(self.now + GATE_RETRY, WorldEvent::Renew { client, lease });
                        return;
                    }
                    self.take_back(client, lease);
                    self.clients[client].leases[lease].batch_failed = true;
                    return self.renewal_due(client, lease);
                }
                let l = &mut self.clients[client].leases[lease];
                let batched =
                    batching && ttl >= BATCH_MIN_TTL && !std::mem::take(&mut l.batch_failed);
                l.gate_busy = true;
                if l.clock.before_extend(now, ttl).is_err() {
                    l.gate_busy = false;
                    return;
                }
                if batched {
                    l.queued = true;
                    let batch = &mut self.clients[client].batch;
                    batch.queue.push(Queued {
                        lease,
                        ttl,
                        attempt_at: now,
                        cutoff,
                        queued_at: now,
                    });
                    if !batch.gathering {
                        batch.gathering = true;
                        self.at(self.now + GATHER, WorldEvent::Gather(client));
                    }
                    // The thread sleeps until about the next renewal; it is woken at once
                    // if this one fails.
                    let next = (now + ttl / 3 + BATCH_SLACK).min(cutoff);
                    let at = self.virtual_at(client, next);
                    self.at(at, WorldEvent::Renew { client, lease });
                    return;
                }
                let request = self.send_extend(client, Purpose::Renewal(lease), lease, ttl, cutoff);
                self.clients[client].leases[lease].renewal = Some((request, now, ttl));
            }
        }
    }

    /// Sends the extend of `lease` to `ttl` (for a caller's extend or a renewal), cut off
    /// at `cutoff`.
    fn send_extend(
        &mut self,
        client: usize,
        purpose: Purpose,
        lease: LeaseId,
        ttl: Duration,
        cutoff: Instant,
    ) -> Request {
        let l = &self.clients[client].leases[lease];
        let (kind, keys, token) = (l.kind.clone(), l.keys.clone(), l.token.clone());
        let replicas = l.replicas;
        let h = Hold {
            kind: &kind,
            keys: &keys,
            token: &token,
        };
        let commands = calls::extend(h, ttl, replicas).iter().map(args).collect();
        self.request(
            client,
            purpose,
            RoundFor::Extend,
            commands,
            ttl,
            Some(cutoff),
            Some(wait_time(replicas)),
        )
    }

    /// Takes `lease`'s renewal back from the batch queue if it is still there (unsent):
    /// its gate is free again.
    fn take_back(&mut self, client: usize, lease: LeaseId) {
        let batch = &mut self.clients[client].batch;
        let Some(at) = batch.queue.iter().position(|q| q.lease == lease) else {
            return;
        };
        batch.queue.remove(at);
        let now = self.local(client);
        let l = &mut self.clients[client].leases[lease];
        l.queued = false;
        l.clock.extend_not_sent(now);
        self.trace.line(self.now, || {
            format!("c{client} lease {lease}: renewal taken back from its batch")
        });
        self.free_gate(client, lease);
    }

    /// A client's batcher writes the renewals gathered: one request, cut halfway to the
    /// earliest deadline among them (a slow reply holds up every renewal in it); those whose
    /// deadline passed before the write fail unsent.
    pub(crate) fn gather(&mut self, client: usize) {
        let now = self.local(client);
        let batch = &mut self.clients[client].batch;
        batch.gathering = false;
        let (items, late): (Vec<Queued>, Vec<Queued>) = std::mem::take(&mut batch.queue)
            .into_iter()
            .partition(|q| q.cutoff > now);
        for q in late {
            self.batch_outcome(client, &q, ExtendOutcome::Failed { unknown: false });
        }
        if items.is_empty() {
            return;
        }
        let Some(earliest) = items.iter().map(|q| q.cutoff).min() else {
            return;
        };
        let cutoff = now + earliest.saturating_duration_since(now) / 2;
        let mut commands = Vec::with_capacity(items.len());
        for q in &items {
            let l = &mut self.clients[client].leases[q.lease];
            l.queued = false;
            let h = Hold {
                kind: &l.kind,
                keys: &l.keys,
                token: &l.token,
            };
            commands.extend(calls::extend(h, q.ttl, None).iter().map(args));
        }
        let deadline = self.reply_deadline(client, None, Some(cutoff));
        let id = self.send(client, Purpose::Batch, self.primary, commands, deadline);
        self.clients[client].batch.in_flight.insert(id, items);
    }

    fn batch_answered(&mut self, client: usize, id: ReqId, answer: Answered) {
        let Some(items) = self.clients[client].batch.in_flight.remove(&id) else {
            return;
        };
        match answer {
            Ok((values, sent_at)) => {
                let mut values = values.into_iter();
                for q in items {
                    let value = values.next();
                    let outcome = extend_outcome(
                        value.map(|v| (vec![v], sent_at)).ok_or_else(|| {
                            Error::new(ErrorKind::Connection, "a batch came back short").sent()
                        }),
                        None,
                    );
                    self.batch_outcome(client, &q, outcome);
                }
            }
            Err(e) => {
                for q in items {
                    let outcome = ExtendOutcome::Failed {
                        unknown: e.outcome_unknown(),
                    };
                    self.batch_outcome(client, &q, outcome);
                }
            }
        }
    }

    /// Applies a batched renewal's outcome to its lease, gives its gate back, and wakes
    /// the renewal when it failed or found the lease lost.
    fn batch_outcome(&mut self, client: usize, q: &Queued, outcome: ExtendOutcome) {
        let now = self.local(client);
        let l = &mut self.clients[client].leases[q.lease];
        let verdict = l.clock.after_extend(q.ttl, q.attempt_at, outcome, now);
        let trouble = !matches!(verdict, ExtendVerdict::Extended { .. });
        if matches!(verdict, ExtendVerdict::Failed) {
            l.batch_failed = true;
        }
        let lease = q.lease;
        self.trace.line(self.now, || {
            format!("c{client} lease {lease} batched renewal: {outcome:?} -> {verdict:?}")
        });
        self.free_gate(client, lease);
        if trouble {
            self.at(self.now, WorldEvent::Renew { client, lease });
        }
    }

    fn renewal_answered(&mut self, client: usize, lease: LeaseId, id: ReqId, answer: Answered) {
        let Some((mut request, attempt_at, ttl)) =
            self.clients[client].leases[lease].renewal.take()
        else {
            return;
        };
        if !Self::answers(&request, id) {
            self.clients[client].leases[lease].renewal = Some((request, attempt_at, ttl));
            return;
        }
        let replicas = self.clients[client].leases[lease].replicas;
        let outcome = match &mut request {
            Request::One(_) => Some(extend_outcome(answer, replicas)),
            Request::Round(_) => Self::round_answer(&mut request, id, answer).map(|round| {
                match extend_verdict(&round) {
                    Ok(reply) => ExtendOutcome::Replied {
                        reply,
                        sent_at: round.started,
                    },
                    Err(e) => ExtendOutcome::Failed {
                        unknown: e.outcome_unknown(),
                    },
                }
            }),
        };
        let Some(outcome) = outcome else {
            self.clients[client].leases[lease].renewal = Some((request, attempt_at, ttl));
            return;
        };
        let now = self.local(client);
        let l = &mut self.clients[client].leases[lease];
        let verdict = l.clock.after_extend(ttl, attempt_at, outcome, now);
        let next = match verdict {
            ExtendVerdict::Extended { .. } => Some(l.clock.next_renewal()),
            ExtendVerdict::Lost { .. } => None,
            ExtendVerdict::Failed if l.clock.lose_if_expired(now) => None,
            ExtendVerdict::Failed => Some(l.clock.retry_at(now, ttl)),
        };
        self.trace.line(self.now, || {
            format!("c{client} lease {lease} renewal: {outcome:?} -> {verdict:?}")
        });
        self.free_gate(client, lease);
        if let Some(next) = next {
            let at = self.virtual_at(client, next);
            self.at(at, WorldEvent::Renew { client, lease });
        }
    }
}

/// How long a `WAIT` for `replicas` may take (none without replicas).
fn wait_time(replicas: Option<Replicas>) -> Duration {
    replicas.map_or(Duration::ZERO, |r| r.timeout)
}

/// The arguments of a call, as the server receives them.
fn args(call: &crate::backend::call::Call) -> Vec<Vec<u8>> {
    match redis::parse_redis_value(call.packed()) {
        Ok(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::BulkString(b) => b,
                other => format!("{other:?}").into_bytes(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An extend's answer as the clock takes it.
fn extend_outcome(answer: Answered, replicas: Option<Replicas>) -> ExtendOutcome {
    match answer.and_then(|(values, sent_at)| calls::read_extend(values, replicas, sent_at)) {
        Ok(Answer {
            reply: ExtendReply::Extended,
            sent_at,
            unacknowledged: Some(_),
        }) => ExtendOutcome::Unacknowledged { sent_at },
        Ok(answer) => ExtendOutcome::Replied {
            reply: answer.reply,
            sent_at: answer.sent_at,
        },
        Err(e) => ExtendOutcome::Failed {
            unknown: e.outcome_unknown(),
        },
    }
}

fn member_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s{i}")).collect()
}

/// A Redlock extend round, counted.
fn extend_verdict(round: &Round) -> Result<ExtendReply> {
    let answers: Vec<Result<ExtendReply>> = round
        .answers
        .iter()
        .map(|a| match a {
            Some(Ok(values)) => {
                calls::read_extend(values.clone(), None, round.started).map(|a| a.reply)
            }
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::new(ErrorKind::Timeout, "no reply").sent()),
        })
        .collect();
    let names = member_names(answers.len());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    quorum::extend("m", &answers, &names)
}

/// A Redlock release round, counted.
fn release_verdict(round: &Round) -> Result<ReleaseReply> {
    let answers: Vec<Result<ReleaseReply>> = round
        .answers
        .iter()
        .map(|a| match a {
            Some(Ok(values)) => calls::read_release(values.clone()),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::new(ErrorKind::Timeout, "no reply").sent()),
        })
        .collect();
    let names = member_names(answers.len());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    quorum::release("m", &answers, &names)
}
