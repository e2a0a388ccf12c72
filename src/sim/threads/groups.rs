//! Threads that take several mutexes at once (`Client::lock_all`), as the runtime's
//! `MultiLockBuilder` does on one server: a [`GroupMachine`] whose attempts are the real
//! acquire-all script, whose waits for one name are ordinary acquires (an
//! [`Op::Acquiring`] that carries the group), and whose give-backs go out in the
//! background. The names it holds are leases of their own, renewed and released as any
//! other; the checker sees each as a holder of its name. Without renewal, the names whose
//! leases ran down are extended one after the other before the lock is held
//! ([`crate::core::group::run_down`]); one found lost sends every name back, and the lock
//! starts again after a pause while its wait lasts, as the runtime does.
//!
//! Two liberties, both giving more interleavings than the runtime has, not fewer: a name
//! taken alone that the machine gives back, or every name of a lock that starts again, is
//! released in the background (the runtime waits for those releases), and the names of a
//! held group are released one after the other by the thread after its critical section
//! (the runtime too, last taken first).

use std::time::Duration;

use crate::core::acquire::{AcquireSpec, Event};
use crate::core::backoff::Wait;
use crate::core::group::{self, GroupAction, GroupEvent, GroupGrant, GroupMachine, GroupSpec};
use crate::core::lease::{ExtendVerdict, LeaseClock};
use crate::core::reply::{self, Answer, GroupReply};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::protocol::calls;
use crate::sim::client::{
    Acquiring, Grouping, Holding, Keeping, LeaseId, NewLease, Op, Pending, ReqId, TaskId,
};
use crate::sim::config::{Micros, micros};
use crate::sim::threads::{Answered, args};
use crate::sim::trace::short;
use crate::sim::world::{Event as WorldEvent, Purpose, World};

impl World {
    /// The run's mutexes (by index), when a lock over several names can be taken here:
    /// two of them at least, on one server (not Redlock).
    pub(super) fn group_names(&self) -> Vec<usize> {
        if self.redlock() {
            return Vec::new();
        }
        let mutexes: Vec<usize> = (0..self.cfg.names.len())
            .filter(|n| self.cfg.names[*n].kind == Kind::Mutex)
            .collect();
        if mutexes.len() < 2 {
            Vec::new()
        } else {
            mutexes
        }
    }

    /// Starts a lock over two or more of the run's mutexes.
    pub(super) fn start_group(&mut self, client: usize, task: TaskId) {
        let mut names = self.group_names();
        self.group_rng.shuffle(&mut names);
        let count = self.group_rng.usize(2..=names.len());
        names.truncate(count);
        // The order of their keys, as `MultiLockBuilder::order` sorts them on one server.
        names.sort_by_key(|n| self.cfg.names[*n].name.clone());
        let ttl = Duration::from_millis(
            *self
                .group_rng
                .choice(&[20u64, 100, 300, 1000, 3000])
                .unwrap_or(&300),
        );
        let now = self.local(client);
        let wait = match self.group_rng.u32(0..4) {
            0 => Wait::No,
            1 => Wait::Forever,
            _ => Wait::Until(now + Duration::from_millis(self.group_rng.u64(1..=3000))),
        };
        let renew = self.group_rng.u32(0..3) != 0;
        if wait != Wait::No && self.group_rng.u32(0..6) == 0 {
            let after = self.group_rng.u64(0..2_000_000);
            self.at(self.now + after, WorldEvent::Cancel { client, task });
        }
        let machine = self.group_machine(client, &names, wait);
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} takes {names:?} at once for {ttl:?}, {wait:?}, renew {renew}"
            )
        });
        let group = Box::new(Grouping {
            alone: vec![None; names.len()],
            names,
            machine,
            ttl,
            renew,
            wait,
            started: now,
            pauses: self.clients[client].pauses,
            pending: None,
            waiting_for: 0,
            ran_at: 0,
            sleeping: false,
            cancelled: false,
            restart_pause: group::RESTART_PAUSE,
        });
        self.group_step(client, task, group, GroupEvent::Start);
    }

    /// A fresh machine for taking `names` (the run's mutexes, in order) at once, drawing
    /// tokens of its own.
    fn group_machine(&mut self, client: usize, names: &[usize], wait: Wait) -> GroupMachine {
        let label = format!("c{client}");
        let stream = self.group_rng.u64(..) % 1_000_000;
        let mut drawn = 0u64;
        let tokens = Box::new(move || {
            drawn += 1;
            format!("{label}-g{stream}.{drawn}")
        });
        let spec = GroupSpec {
            keys: names.iter().map(|n| self.keys(*n).lock).collect(),
            wait,
            io: self.cfg.io_timeout,
            grace: self.grace(),
        };
        GroupMachine::new(spec, tokens)
    }

    /// Steps a group's machine with `event` and carries out what it decides.
    fn group_step(
        &mut self,
        client: usize,
        task: TaskId,
        mut group: Box<Grouping>,
        mut event: GroupEvent,
    ) {
        loop {
            let now = self.local(client);
            let action = group.machine.step(event, now, group.cancelled);
            event = match action {
                GroupAction::Attempt { tokens, held } => {
                    let keys: Vec<LockKeys> = group.names.iter().map(|n| self.keys(*n)).collect();
                    let clock = self.clients[client].server_time.estimate(now);
                    let call = calls::attempt_all(&keys, &tokens, &held, group.ttl, clock);
                    let deadline = self.reply_deadline(client, None, None);
                    let id = self.send(
                        client,
                        Purpose::Task(task),
                        self.primary,
                        vec![args(&call)],
                        deadline,
                    );
                    group.pending = Some((id, held));
                    *self.op(client, task) = Op::Grouping(group);
                    return;
                }
                GroupAction::GiveBack { tokens, cutoff } => {
                    for (i, token) in tokens {
                        let keys = self.keys(group.names[i]);
                        self.release_unwatched(client, &keys, &token, true, Some(cutoff));
                    }
                    GroupEvent::GaveBack
                }
                GroupAction::Release(indices) => {
                    for i in indices {
                        if let Some(lease) = group.alone[i].take() {
                            self.release_in_background(client, lease);
                        }
                    }
                    GroupEvent::Released
                }
                GroupAction::Pause { until } => {
                    self.trace.line(self.now, || {
                        format!("c{client}/t{task} pauses its group after a failure")
                    });
                    group.sleeping = true;
                    let at = self.virtual_at(client, until);
                    self.at(at, WorldEvent::Wake { client, task });
                    *self.op(client, task) = Op::Grouping(group);
                    return;
                }
                GroupAction::WaitFor(i) => return self.wait_alone(client, task, group, i),
                GroupAction::Done(result) => return self.group_done(client, task, group, result),
            };
        }
    }

    /// Takes name `i` of the group alone with the ordinary acquire, as the runtime's
    /// `take_one` does, the group waiting inside it.
    fn wait_alone(&mut self, client: usize, task: TaskId, mut group: Box<Grouping>, i: usize) {
        let name = group.names[i];
        let now = self.local(client);
        let spec = AcquireSpec {
            key: self.cfg.names[name].name.clone(),
            ttl: group.ttl,
            wait: group.wait,
            renew: group.renew,
            blocks: true,
            bounds: self.bounds(),
            replicas: Duration::ZERO,
            direct: true,
            behind: false,
        };
        let stream = self.group_rng.u64(..) % 1_000_000;
        let seed = self.group_rng.u64(..);
        let machine = self.acquire_machine(client, &spec, now, stream, seed);
        self.trace.line(self.now, || {
            format!(
                "c{client}/t{task} waits for {:?} alone, for its group",
                spec.key
            )
        });
        group.waiting_for = i;
        let cancelled = group.cancelled;
        let acq = Box::new(Acquiring {
            name,
            kind: Kind::Mutex,
            machine,
            spec,
            started: now,
            pauses: self.clients[client].pauses,
            pending: Pending::Nothing,
            granted_at: None,
            cancelled,
            replicas: None,
            group: Some(group),
            woken: false,
        });
        self.step(client, task, acq, Event::Start);
    }

    /// A wait for one name alone ended: with its lease and token, or not.
    pub(super) fn group_waited(
        &mut self,
        client: usize,
        task: TaskId,
        mut group: Box<Grouping>,
        waited: Result<(LeaseId, String)>,
    ) {
        let i = group.waiting_for;
        let event = match waited {
            Ok((lease, token)) => {
                group.alone[i] = Some(lease);
                GroupEvent::Waited(i, Ok(token))
            }
            Err(e) => GroupEvent::Waited(i, Err(e)),
        };
        self.group_step(client, task, group, event);
    }

    /// A group's pause after a failure ended.
    pub(super) fn group_wakes(&mut self, client: usize, task: TaskId, mut group: Box<Grouping>) {
        group.sleeping = false;
        self.group_step(client, task, group, GroupEvent::Paused(Ok(())));
    }

    /// The caller of a waiting group cancels it: the machine sees it at its next step (a
    /// wait alone in progress is an acquire, cancelled as any).
    pub(super) fn cancel_group(&mut self, client: usize, task: TaskId) {
        let group = match self.op(client, task) {
            Op::Grouping(group) => group,
            Op::Keeping(keeping) => &mut keeping.group,
            _ => return,
        };
        if group.wait != Wait::No {
            group.cancelled = true;
        }
    }

    /// A group attempt answered.
    pub(super) fn group_answered(
        &mut self,
        client: usize,
        task: TaskId,
        mut group: Box<Grouping>,
        times: &[Micros],
        answer: Answered,
    ) {
        let Some((_, held)) = group.pending.take() else {
            *self.op(client, task) = Op::Grouping(group);
            return;
        };
        let result = answer.and_then(|(values, sent_at)| {
            let reply = reply::attempt_all(values.into_iter().next(), &held)?;
            Ok(Answer {
                reply,
                sent_at,
                unacknowledged: None,
            })
        });
        if let Ok(Answer {
            reply:
                GroupReply::Taken {
                    server_clock: Some(clock),
                    ..
                },
            sent_at,
            ..
        }) = &result
        {
            let now = self.local(client);
            self.clients[client]
                .server_time
                .observed(*clock, *sent_at, now);
        }
        // When the server ran it: the grants' time for the checker.
        group.ran_at = times.first().copied().unwrap_or(self.now);
        self.group_step(client, task, group, GroupEvent::Attempted(result));
    }

    /// The group is over: every name held (leases for the names the last attempt took,
    /// with those taken alone), or nothing. Without renewal, the names whose leases ran
    /// down are extended first, as the runtime's `MultiLockBuilder` does.
    fn group_done(
        &mut self,
        client: usize,
        task: TaskId,
        group: Box<Grouping>,
        result: Result<Vec<GroupGrant>>,
    ) {
        let vnow = self.now;
        let grants = match result {
            Ok(grants) => grants,
            Err(e) => {
                self.trace.line(self.now, || {
                    format!(
                        "c{client}/t{task} taking {:?} at once failed: {e}",
                        group.names
                    )
                });
                self.group_ended(client, &group, 0);
                return self.think(client, task);
            }
        };
        let mut leases = group.alone.clone();
        let granted_at = group.ran_at;
        for grant in grants {
            let name = group.names[grant.index];
            let id = self.add_lease(
                client,
                NewLease {
                    name,
                    token: grant.token.clone(),
                    hold: grant.token.clone(),
                    kind: Kind::Mutex,
                    clock: LeaseClock::new(group.ttl, grant.granted.lease, grant.granted.sent_at),
                    fencing: grant.granted.fencing_token,
                    renew: group.renew,
                    granted_at,
                    replicas: None,
                },
            );
            self.check
                .told_granted(name, granted_at, grant.granted.fencing_token, &grant.token);
            leases[grant.index] = Some(id);
        }
        let mut held: Vec<(LeaseId, String)> = Vec::with_capacity(leases.len());
        for lease in leases {
            let Some(lease) = lease else {
                // The machine reports every name held once it is done: a defect.
                self.check
                    .fail_now(vnow, "a group was done without every name held");
                return self.think(client, task);
            };
            held.push((lease, self.clients[client].leases[lease].token.clone()));
        }
        if !group.renew {
            let now = self.local(client);
            let left: Vec<Duration> = held
                .iter()
                .map(|(lease, _)| self.clients[client].leases[*lease].clock.remaining(now))
                .collect();
            let run_down = group::run_down(&left, group.ttl);
            if !run_down.is_empty() {
                self.trace.line(self.now, || {
                    format!("c{client}/t{task} extends names {run_down:?} (left {left:?})")
                });
                let keeping = Box::new(Keeping {
                    group,
                    held,
                    run_down,
                    extends: 0,
                    pending: None,
                    sleeping: false,
                });
                return self.keep_next(client, task, keeping);
            }
        }
        self.group_ended(client, &group, 0);
        self.hold_group(client, task, &group, held);
    }

    /// The acquire of a lock over several names ends (held, or not): its time is checked
    /// against its bound, `extends` (of its last pass) included.
    fn group_ended(&mut self, client: usize, group: &Grouping, extends: u32) {
        let now = self.local(client);
        let took = now.saturating_duration_since(group.started);
        let paused = self.clients[client].pauses != group.pauses;
        let vnow = self.now;
        self.check
            .group_took(vnow, group.wait, group.started, took, extends, paused);
    }

    /// Every name of `group` is held (`held`, in the order of the names): the thread's
    /// critical section.
    fn hold_group(
        &mut self,
        client: usize,
        task: TaskId,
        group: &Grouping,
        mut held: Vec<(LeaseId, String)>,
    ) {
        if self.trace.enabled {
            let line = format!(
                "c{client}/t{task} holds {:?} at once (leases {:?})",
                group.names,
                held.iter()
                    .map(|(l, t)| format!("{l}:{}", short(t)))
                    .collect::<Vec<_>>()
            );
            self.trace.line(self.now, || line);
        }
        // Released last taken first, as `MultiGuard::release` does.
        held.reverse();
        let (lease, hold) = held.remove(0);
        let now = self.local(client);
        let length = Duration::from_micros(self.rng.u64(0..=micros(group.ttl) * 3 / 2));
        let at = self.virtual_at(client, now + length);
        *self.op(client, task) = Op::Holding(Holding {
            lease,
            hold,
            extend: None,
            checked: false,
            rest: held,
        });
        self.at(at, WorldEvent::Wake { client, task });
    }

    /// Extends the next run-down name of `keeping` (as `LockGuard::extend`: under its
    /// lease's gate, cut off at its deadline), or holds them all when none is left.
    fn keep_next(&mut self, client: usize, task: TaskId, mut keeping: Box<Keeping>) {
        let Some(&i) = keeping.run_down.first() else {
            self.group_ended(client, &keeping.group, keeping.extends);
            let Keeping { group, held, .. } = *keeping;
            return self.hold_group(client, task, &group, held);
        };
        let now = self.local(client);
        let ttl = keeping.group.ttl;
        let lease = keeping.held[i].0;
        let l = &mut self.clients[client].leases[lease];
        if let Err(reason) = l.clock.before_extend(now, ttl) {
            let verdict = ExtendVerdict::Lost {
                reason,
                decided: false,
            };
            return self.not_kept(client, task, *keeping, verdict);
        }
        l.gate_busy = true;
        let cutoff = l.clock.deadline();
        let request = self.send_extend(client, Purpose::Task(task), lease, ttl, cutoff);
        keeping.extends += 1;
        keeping.pending = Some((request, now));
        *self.op(client, task) = Op::Keeping(keeping);
    }

    /// An answer to the extend in flight of a lock over several names.
    pub(super) fn keep_answered(
        &mut self,
        client: usize,
        task: TaskId,
        mut keeping: Box<Keeping>,
        id: ReqId,
        answer: Answered,
    ) {
        let (Some((mut request, attempt_at)), Some(&i)) =
            (keeping.pending.take(), keeping.run_down.first())
        else {
            *self.op(client, task) = Op::Keeping(keeping);
            return;
        };
        let lease = keeping.held[i].0;
        let replicas = self.clients[client].leases[lease].replicas;
        let Some(outcome) = Self::extend_answered(&mut request, id, answer, replicas) else {
            keeping.pending = Some((request, attempt_at));
            *self.op(client, task) = Op::Keeping(keeping);
            return;
        };
        let now = self.local(client);
        let ttl = keeping.group.ttl;
        let verdict = self.clients[client].leases[lease]
            .clock
            .after_extend(ttl, attempt_at, outcome, now);
        self.trace.line(self.now, || {
            format!("c{client}/t{task} extends lease {lease}: {outcome:?} -> {verdict:?}")
        });
        self.free_gate(client, lease);
        if let ExtendVerdict::Extended { .. } = verdict {
            self.check.keeps.extended += 1;
            keeping.run_down.remove(0);
            return self.keep_next(client, task, keeping);
        }
        self.not_kept(client, task, *keeping, verdict)
    }

    /// A run-down name was not extended: every name goes back; the acquire starts again
    /// after a pause if the name was lost and the wait goes on, and ends otherwise (busy,
    /// cancelled, or with the extend's error).
    fn not_kept(&mut self, client: usize, task: TaskId, keeping: Keeping, verdict: ExtendVerdict) {
        let Keeping {
            mut group,
            held,
            extends,
            ..
        } = keeping;
        for (lease, _) in held {
            self.release_in_background(client, lease);
        }
        let now = self.local(client);
        let lost = matches!(verdict, ExtendVerdict::Lost { .. });
        let again = group::start_again(group.wait, now, group.restart_pause, group.ttl);
        let Some((pause, next)) = again.filter(|_| lost && !group.cancelled) else {
            self.trace.line(self.now, || {
                format!("c{client}/t{task} gives its names back and ends ({verdict:?})")
            });
            self.check.keeps.given_up += 1;
            self.group_ended(client, &group, extends);
            return self.think(client, task);
        };
        self.check.keeps.started_again += 1;
        group.restart_pause = next;
        self.trace.line(self.now, || {
            format!("c{client}/t{task} gives its names back, starts again in {pause:?}")
        });
        let at = self.virtual_at(client, now + pause);
        self.at(at, WorldEvent::Wake { client, task });
        *self.op(client, task) = Op::Keeping(Box::new(Keeping {
            group,
            held: Vec::new(),
            run_down: Vec::new(),
            extends,
            pending: None,
            sleeping: true,
        }));
    }

    /// The pause before a lock over several names starts again ended: a fresh machine
    /// takes every name again, under fresh tokens (or the acquire ends, cancelled).
    pub(super) fn group_restarts(&mut self, client: usize, task: TaskId, keeping: Keeping) {
        let Keeping {
            mut group, extends, ..
        } = keeping;
        if group.cancelled {
            self.trace.line(self.now, || {
                format!("c{client}/t{task} is cancelled before it starts again")
            });
            self.group_ended(client, &group, extends);
            return self.think(client, task);
        }
        group.machine = self.group_machine(client, &group.names, group.wait);
        group.alone = vec![None; group.names.len()];
        group.pending = None;
        group.waiting_for = 0;
        group.sleeping = false;
        self.trace.line(self.now, || {
            format!("c{client}/t{task} starts its group again")
        });
        self.group_step(client, task, group, GroupEvent::Start);
    }

    /// Releases a lease in the background: no hold relies on it from now on.
    fn release_in_background(&mut self, client: usize, lease: LeaseId) {
        self.take_back(client, lease);
        let l = &mut self.clients[client].leases[lease];
        l.holds.clear();
        l.gate_closed = true;
        l.clock.mark_released();
        let (keys, token) = (l.keys.clone(), l.token.clone());
        self.trace.line(self.now, || {
            format!(
                "c{client} gives back lease {lease} ({}) in the background",
                short(&token)
            )
        });
        self.release_unwatched(client, &keys, &token, false, None);
    }

    /// Sends a mutex's release (a withdrawal when `withdraw`) of `token` that nobody waits
    /// for, nothing past `cutoff`.
    fn release_unwatched(
        &mut self,
        client: usize,
        keys: &LockKeys,
        token: &str,
        withdraw: bool,
        cutoff: Option<std::time::Instant>,
    ) {
        // The acquire-all script never registers a waiter: no registration names a ttl.
        let ttl = Duration::ZERO;
        let commands = vec![self.release_args(client, &Kind::Mutex, keys, token, withdraw, ttl)];
        let deadline = self.reply_deadline(client, None, cutoff);
        self.send(
            client,
            Purpose::Background,
            self.primary,
            commands,
            deadline,
        );
    }
}
