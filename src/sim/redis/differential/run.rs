//! One run of one seed: the connections to both servers, the clocks kept in step, the
//! waits away from time-dependent instants, and the comparison of every reply.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use redis::Value;

use super::compare::{Rule, leading_number, same};
use super::generate::to_command;
use super::real::RealConn;
use super::{C, Divergence, MARGIN_MS, Step, WAITERS, WAKEUP_MS};
use crate::sim::redis::{Command, ConnId, Data, Server};

/// One run of one seed against one real server.
pub(super) struct Run {
    pub(super) seed: u64,
    pub(super) conns: Vec<RealConn>,
    pub(super) model: Server,
    pub(super) model_conns: Vec<ConnId>,
    pub(super) start: Instant,
    pub(super) clock_offset: i64,
    pub(super) history: Vec<String>,
    /// For each connection, the rules of its commands whose replies are still to come
    /// (used for the waiters, whose replies come when the model serves them).
    pub(super) waiting: Vec<VecDeque<Rule>>,
    /// The model's last reply on A or C.
    pub(super) last_reply: Value,
    /// How many replies of each kind were compared (printed per seed: what was covered).
    pub(super) seen: BTreeMap<String, usize>,
    /// The longest a real reply took to come back after the model's time was read for
    /// its command (for a block, after the model's block ended), ms: how late the real
    /// server may have acted on the model's clock.
    pub(super) slowest_ms: u64,
}

impl Run {
    pub(super) fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The windows of the model's wall clock in which a command could see a different
    /// outcome on the two sides.
    pub(super) fn windows(&self) -> Vec<(i64, i64)> {
        let around = |t: i64| (t - MARGIN_MS, t + MARGIN_MS);
        let timestamp = |v: f64| (1e11..1e14).contains(&v);
        let mut windows = Vec::new();
        for (_, entry) in self.model.entries() {
            if let Some(at) = entry.expires_at {
                windows.push(around(at));
            }
            match &entry.data {
                Data::ZSet(set) => windows.extend(
                    set.iter()
                        .map(|(_, score)| score)
                        .filter(|s| timestamp(*s))
                        .map(|s| around(s as i64)),
                ),
                Data::Hash(hash) => windows.extend(
                    hash.iter()
                        .filter_map(|(_, v)| leading_number(v))
                        .filter(|n| timestamp(*n as f64))
                        .map(around),
                ),
                _ => {}
            }
        }
        for who in WAITERS {
            if let Some(deadline) = self.model.block_deadline(self.model_conns[who]) {
                windows.push((deadline - MARGIN_MS, deadline + WAKEUP_MS + MARGIN_MS));
            }
        }
        windows
    }

    /// Waits until the clock is outside every window.
    pub(super) fn avoid_instants(&mut self) {
        for _ in 0..1000 {
            let now = self.clock_offset + self.elapsed_ms() as i64;
            let Some(&(_, until)) = self
                .windows()
                .iter()
                .filter(|(from, to)| *from <= now && now <= *to)
                .max_by_key(|(_, to)| *to)
            else {
                return;
            };
            std::thread::sleep(Duration::from_millis((until - now + 1) as u64));
        }
    }

    pub(super) fn report(&self, what: &str, model: &Value, real: &Value) -> Divergence {
        let mut text = format!(
            "the model diverged from redis-server (seed {}, replay with REDLEASE_SIM_SEED={}):\n{what}\n  model: {model:?}\n  real:  {real:?}\nslowest real reply: {} ms after the model's time\ncommands so far (ms since start, connection):\n",
            self.seed, self.seed, self.slowest_ms
        );
        for line in self.history.iter().rev().take(120).rev() {
            text.push_str(line);
            text.push('\n');
        }
        Divergence {
            report: text,
            late: self.slowest_ms as i64 > MARGIN_MS / 2,
        }
    }

    /// The real server's next reply on `who`, where the model replied `model` (reported
    /// if none comes within 5 s).
    pub(super) fn recv(&mut self, who: usize, model: &Value) -> Result<Value, Divergence> {
        self.conns[who].recv().map_err(|e| {
            let what = format!(
                "{}: the model replied, redis-server did not ({e})",
                name(who)
            );
            self.report(&what, model, &Value::Nil)
        })
    }

    /// Compares the waiters' replies that the model produced with the real server's, and
    /// checks that the real server sent nothing the model did not.
    pub(super) fn check_waiters(&mut self) -> Result<(), Divergence> {
        for who in WAITERS {
            let replies = self.model.take_replies(self.model_conns[who]);
            if replies.is_empty() {
                if self.conns[who].has_data() {
                    let real = self.recv(who, &Value::Nil)?;
                    let what = format!("{}: redis-server replied, the model did not", name(who));
                    return Err(self.report(&what, &Value::Nil, &real));
                }
                continue;
            }
            for model in replies {
                let rule = self.waiting[who].pop_front().unwrap_or(Rule::Exact);
                let real = self.recv(who, &model)?;
                if !same(rule, &model, &real) {
                    return Err(self.report(&format!("{}'s reply", name(who)), &model, &real));
                }
                let script = matches!(rule, Rule::Script).then_some("ACQUIRE");
                self.note(who, &model, script);
            }
        }
        Ok(())
    }

    /// Counts a reply by its kind, and adds it to the history.
    pub(super) fn note(&mut self, who: usize, reply: &Value, script: Option<&str>) {
        let first = |v: &Value| match v {
            Value::Int(n) => n.to_string(),
            Value::ServerError(e) => e.code().to_owned(),
            Value::Array(items) => match items.first() {
                Some(Value::Int(n)) => format!("{{{n}, ..}}"),
                _ => "array".into(),
            },
            other => format!("{other:?}"),
        };
        let kind = match (reply, script) {
            (_, Some(name)) => format!("{name} {}", first(reply)),
            (Value::ServerError(e), None) => format!("error {}", e.code()),
            (Value::Array(items), None) if WAITERS.contains(&who) && items.len() == 2 => {
                "BLPOP served".into()
            }
            (Value::Nil, None) if WAITERS.contains(&who) => "BLPOP timed out".into(),
            (Value::Array(_), None) => "array".into(),
            (Value::Int(_), None) => "integer".into(),
            (Value::Nil, None) => "nil".into(),
            _ => "string or status".into(),
        };
        *self.seen.entry(kind).or_default() += 1;
        let mut text = format!("{reply:?}");
        if text.len() > 160 {
            text.truncate(160);
            text.push_str("...");
        }
        self.history.push(format!(
            "{:>7} {}:   -> {text}",
            self.elapsed_ms(),
            name(who)
        ));
    }

    pub(super) fn step(&mut self, step: Step) -> Result<(), Divergence> {
        match step {
            Step::Sleep(ms) => {
                std::thread::sleep(Duration::from_millis(ms));
                self.history
                    .push(format!("{:>7} -: (sleep {ms} ms)", self.elapsed_ms()));
                Ok(())
            }
            Step::Oom(on) => {
                let limit = if on { "1" } else { "0" };
                let reply = self.conns[C].query(&to_command(&[
                    "CONFIG".into(),
                    "SET".into(),
                    "maxmemory".into(),
                    limit.into(),
                ]));
                assert!(
                    matches!(reply, Ok(Value::Okay)),
                    "CONFIG SET maxmemory: {reply:?}"
                );
                self.model.set_oom(on);
                self.history.push(format!(
                    "{:>7} C: (maxmemory {limit} / model OOM {on})",
                    self.elapsed_ms()
                ));
                Ok(())
            }
            Step::Send {
                who,
                commands,
                label,
                ..
            } => self.send(who, commands, label),
        }
    }

    pub(super) fn send(
        &mut self,
        who: usize,
        commands: Vec<(Command, Rule)>,
        label: String,
    ) -> Result<(), Divergence> {
        self.avoid_instants();
        let now = self.elapsed_ms();
        self.model.advance(now);
        self.check_waiters()?;
        self.history
            .push(format!("{now:>7} {}: {label}", name(who)));
        let (cmds, rules): (Vec<Command>, Vec<Rule>) = commands.into_iter().unzip();
        self.conns[who]
            .send(&cmds)
            .map_err(|e| self.report(&format!("cannot send: {e}"), &Value::Nil, &Value::Nil))?;
        self.model
            .submit(self.model_conns[who], cmds)
            .expect("the model's connections stay open");
        if WAITERS.contains(&who) {
            self.waiting[who].extend(rules);
            return self.check_waiters();
        }
        let mut replies = self.model.take_replies(self.model_conns[who]);
        let blocked = replies.len() < rules.len();
        let give_up = Instant::now() + Duration::from_secs(10);
        // When the model's block ended (its timeout, or the push that served it).
        let mut block_ended = now;
        while replies.len() < rules.len() {
            // Blocked (BLPOP, WAIT): let virtual time follow real time to its timeout.
            let Some(due) = self.model.next_timer() else {
                return Err(self.report(
                    "the model blocked with nothing to wake it",
                    &Value::Nil,
                    &Value::Nil,
                ));
            };
            assert!(Instant::now() < give_up, "a blocked command did not return");
            let now = self.elapsed_ms();
            if due > now {
                std::thread::sleep(Duration::from_millis(due - now));
            }
            block_ended = due.max(self.elapsed_ms());
            self.model.advance(block_ended);
            replies.extend(self.model.take_replies(self.model_conns[who]));
        }
        for (i, (model, rule)) in replies.into_iter().zip(rules).enumerate() {
            let real = self.recv(who, &model)?;
            if i == 0 {
                // A block's reply: how long after the model's block ended the real one did
                // (a loaded server serves a timed-out block late, and runs what follows it
                // on a later clock than the model).
                let since = if blocked { block_ended } else { now };
                self.slowest_ms = self.slowest_ms.max(self.elapsed_ms().saturating_sub(since));
            }
            if !same(rule, &model, &real) {
                return Err(self.report(&format!("{}'s reply", name(who)), &model, &real));
            }
            let script = label
                .split_once('<')
                .and_then(|(_, rest)| rest.split_once('>'));
            let script = script.map(|(name, _)| name.to_owned());
            self.note(who, &model, script.as_deref());
            self.last_reply = model;
        }
        self.check_waiters()
    }
}

fn name(who: usize) -> &'static str {
    ["A", "B", "C", "D"][who]
}
