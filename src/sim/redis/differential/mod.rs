//! The differential test: random sequences of commands, and of the project's real scripts
//! with random arguments, go to a real `redis-server` (started by the test) and to the
//! model, and must get the same replies.
//!
//! Keys come from a small set shared by the commands and the scripts' roles, so types
//! collide and `WRONGTYPE` happens inside scripts too. Four connections: A sends most
//! commands; B and D block in `BLPOP` (often with an `ACQUIRE` pipelined behind it, as a
//! waiter does), so the order in which blocked connections are served is compared too; C
//! is a foreign client that deletes locks and flips the memory limit (`CONFIG SET
//! maxmemory 1` on the real server, [`Server::set_oom`] on the model).
//!
//! Time: the model's virtual time follows the test's real elapsed time (read once before
//! each command), its wall clock starts at the real clock. Values that embed a clock are
//! compared within [`TOLERANCE_MS`] (`PTTL`, `TIME`, the times and fencing tokens in the
//! scripts' replies, scores and hash values that are timestamps); everything else,
//! errors included, must be equal. So that both sides see the same outcome of every
//! time-dependent decision, no command is sent within [`MARGIN_MS`] of an instant at which
//! one changes (a key's expiry, a timestamp score or hash value crossing the clock, a
//! blocked `BLPOP`'s deadline up to the server's next wake-up): the test waits until it
//! is past.
//!
//! A divergence prints the seed, the commands so far with the model's replies, and both
//! replies, and fails the test. The seeds are [`SEEDS`], or the one in
//! `REDLEASE_SIM_SEED`. One exception for loaded machines: if some real reply came back
//! more than half the margin after the model's time was read for its command, the real
//! server may have acted on the other side of an instant; the seed then runs once more
//! and the test fails only if that run diverges too.
//!
//! Files: `generate.rs` draws the operations, `run.rs` sends them to both sides and keeps
//! the clocks in step, `compare.rs` holds the comparison rules, `real.rs` starts the real
//! server and speaks RESP2 to it.

mod compare;
mod generate;
mod real;
mod run;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use self::compare::Rule;
use self::generate::{Generator, LOCK, RW, SEM, all_keys, s, script_call, send};
use self::real::RealServer;
use self::run::Run;
use super::{Command, ConnId, Server, ServerId, command};

/// The seeds run when `REDLEASE_SIM_SEED` is not set.
const SEEDS: &[u64] = &[1, 2, 3, 4];
/// Operations per seed.
const OPS_PER_SEED: usize = 350;
/// How far apart the two sides' clock readings may be, ms.
const TOLERANCE_MS: i64 = 100;
/// How far from a time-dependent instant a command must be sent, ms.
const MARGIN_MS: i64 = 25;
/// The real server's event loop wakes this often (`hz 10`), ms.
const WAKEUP_MS: i64 = 100;

const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const D: usize = 3;
/// The connections that block in `BLPOP` between steps.
const WAITERS: [usize; 2] = [B, D];

/// One step of a run: commands for one connection (their replies compared), or an
/// action on the side.
#[derive(Clone)]
enum Step {
    Send {
        who: usize,
        commands: Vec<(Command, Rule)>,
        label: String,
        /// Sent next if the model answers `NOSCRIPT` (the client's `EVAL` fallback).
        fallback: Option<Box<Step>>,
    },
    Oom(bool),
    Sleep(u64),
}

/// Runs a step; an `EVALSHA` answered `NOSCRIPT` queues its `EVAL` next.
fn run_step(run: &mut Run, step: Step, queue: &mut VecDeque<Step>) -> Result<(), Divergence> {
    let fallback = match &step {
        Step::Send { fallback, .. } => fallback.clone(),
        _ => None,
    };
    run.last_reply = Value::Nil;
    run.step(step)?;
    if let Some(fallback) = fallback {
        if matches!(&run.last_reply, Value::ServerError(e) if e.code() == "NOSCRIPT") {
            queue.push_front(*fallback);
        }
    }
    Ok(())
}

/// A disagreement between the model and the real server.
struct Divergence {
    report: String,
    /// Some real reply came late enough that the real server may have acted on the other
    /// side of a time-dependent instant than the model did.
    late: bool,
}

/// Runs one seed; the divergence if the model and the real server disagreed.
fn run_seed(real: &RealServer, seed: u64) -> Result<(), Divergence> {
    let mut admin = real.connect();
    for cmd in [
        &["FLUSHALL"][..],
        &["SCRIPT", "FLUSH"],
        &["CONFIG", "SET", "maxmemory", "0"],
    ] {
        let reply = admin.query(&command(cmd)).expect("reset the real server");
        assert_eq!(reply, Value::Okay, "{cmd:?}");
    }
    let mut model = Server::new(ServerId(1));
    let model_conns: Vec<ConnId> = (0..4).map(|_| model.connect()).collect();
    let start = Instant::now();
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as i64;
    model.set_clock_offset(wall_ms);
    let mut run = Run {
        seed,
        conns: (0..4).map(|_| real.connect()).collect(),
        model,
        model_conns,
        start,
        clock_offset: wall_ms,
        history: Vec::new(),
        waiting: vec![VecDeque::new(); 4],
        last_reply: Value::Nil,
        seen: BTreeMap::new(),
        slowest_ms: 0,
    };
    let mut generator = Generator {
        rng: fastrand::Rng::with_seed(seed),
        keys: all_keys(),
    };
    let mut oom_left = 0;
    let mut queue: VecDeque<Step> = VecDeque::new();
    for _ in 0..OPS_PER_SEED {
        if let Some(step) = queue.pop_front() {
            run_step(&mut run, step, &mut queue)?;
            continue;
        }
        if oom_left > 0 {
            oom_left -= 1;
            if oom_left == 0 {
                run.step(Step::Oom(false))?;
            }
        }
        let g = &mut generator;
        let idle: Vec<usize> = WAITERS
            .into_iter()
            .filter(|&w| run.waiting[w].is_empty())
            .collect();
        let deadline = WAITERS
            .iter()
            .any(|&w| run.model.block_deadline(run.model_conns[w]).is_some());
        let step = match g.rng.u8(..100) {
            0..=34 => {
                let (args, rule) = g.plain();
                send(A, &args, None, rule)
            }
            35..=66 => {
                let (name, script, keys, args) = g.script();
                let by_sha = g.chance(60);
                script_call(name, script, keys, args, by_sha)
            }
            67..=73 => {
                let (args, rule) = g.probe();
                send(A, &args, None, rule)
            }
            74..=79 if idle.len() == WAITERS.len() => {
                queue.extend(g.scenario());
                continue;
            }
            80..=82 if !idle.is_empty() => {
                let who = g.pick(&idle);
                g.blpop(who)
            }
            83 | 84 => {
                let key = g.pick(&[LOCK[0], SEM[0], RW[0], LOCK[2]]);
                send(C, &[s("DEL"), s(key)], None, Rule::Exact)
            }
            85 => send(A, &[s("SCRIPT"), s("FLUSH")], None, Rule::Exact),
            86 => {
                let (name, script, _, _) = g.script();
                send(
                    A,
                    &[s("SCRIPT"), s("LOAD"), script.code.clone()],
                    Some(name),
                    Rule::Exact,
                )
            }
            87 if oom_left == 0 => {
                oom_left = 12;
                Step::Oom(true)
            }
            88..=92 => Step::Sleep(g.rng.u64(5..80)),
            // A blocking command on A could outlast a waiter's deadline and cross its window.
            93..=96 if deadline => Step::Sleep(1),
            93 | 94 => {
                let key = g.pick(&["{L}:wake", "k1", "k2", "{S}"]);
                let timeout = g.pick(&["0.05", "0.2"]);
                send(A, &[s("BLPOP"), s(key), s(timeout)], None, Rule::Exact)
            }
            95 => Step::Send {
                who: A,
                commands: vec![
                    (command(&["WAIT", "0", "0"]), Rule::Exact),
                    (command(&["WAIT", "1", "20"]), Rule::Exact),
                ],
                label: "WAIT 0 0; WAIT 1 20".into(),
                fallback: None,
            },
            _ => Step::Sleep(1),
        };
        run_step(&mut run, step, &mut queue)?;
    }
    // A final sweep: every key read every way.
    for key in all_keys() {
        for (args, rule) in [
            (vec!["EXISTS", key], Rule::Exact),
            (vec!["PTTL", key], Rule::Duration),
            (vec!["GET", key], Rule::Text),
            (vec!["LLEN", key], Rule::Exact),
            (vec!["ZRANGE", key, "0", "-1", "WITHSCORES"], Rule::Pairs),
            (vec!["HGETALL", key], Rule::Pairs),
        ] {
            run.step(Step::Send {
                who: A,
                commands: vec![(command(&args), rule)],
                label: args.join(" "),
                fallback: None,
            })?;
        }
    }
    let _ = run.conns[C].query(&command(&["CONFIG", "SET", "maxmemory", "0"]));
    eprintln!("seed {seed}: replies compared: {:?}", run.seen);
    Ok(())
}

#[test]
fn the_model_answers_as_a_real_redis_server() {
    let seeds: Vec<u64> = match std::env::var("REDLEASE_SIM_SEED") {
        Ok(seed) => vec![seed.trim().parse().expect("REDLEASE_SIM_SEED is a number")],
        Err(_) => SEEDS.to_vec(),
    };
    let real = RealServer::start();
    for seed in seeds {
        let started = Instant::now();
        if let Err(first) = run_seed(&real, seed) {
            assert!(first.late, "{}", first.report);
            eprintln!(
                "{}\nreplaying seed {seed} once: a real reply came late enough to cross an instant",
                first.report
            );
            if let Err(again) = run_seed(&real, seed) {
                panic!(
                    "{}\n--- the replay diverged too ---\n{}",
                    first.report, again.report
                );
            }
        }
        eprintln!(
            "seed {seed}: {OPS_PER_SEED} operations in {:?}",
            started.elapsed()
        );
    }
}
