//! The differential test: random sequences of commands, and of the project's real scripts
//! with random arguments, go to a real `redis-server` (started by the test) and to the
//! model, and must get the same replies.
//!
//! Keys come from a small set shared by the commands and the scripts' roles, so types
//! collide and `WRONGTYPE` happens inside scripts too. Three connections: A sends most
//! commands, B blocks in `BLPOP` (with an `ACQUIRE` pipelined behind it, as a waiter does),
//! C is a foreign client that deletes locks and flips the memory limit (`CONFIG SET
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

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::real::{RealConn, RealServer};
use super::{Command, ConnId, Data, Server, ServerId, command};
use crate::scripts::{
    ACQUIRE, ACQUIRE_PERMIT, ACQUIRE_RW, EXTEND, EXTEND_PERMIT, EXTEND_RW, Lua, RELEASE,
    RELEASE_PERMIT, RELEASE_RW,
};

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

/// How two replies are compared.
#[derive(Clone, Copy, Debug)]
enum Rule {
    /// Equal.
    Exact,
    /// An integer that is a duration (`PTTL`): within the tolerance (-1 and -2 exact).
    Duration,
    /// `TIME`: within the tolerance.
    Time,
    /// A lock script's reply: an array's first element exact, its other integers within
    /// the tolerance, its strings as [`Rule::Text`]; anything else exact.
    Script,
    /// Strings equal, or both a timestamp (ms or µs, possibly followed by ` rest`) within
    /// the tolerance and the rest equal; arrays element by element.
    Text,
    /// Field/value or member/score pairs in any order (large hashes and timestamp ties
    /// order differently), values as [`Rule::Text`].
    Pairs,
    /// Members in any order (timestamp ties order differently).
    Members,
}

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

/// The key families: each script's keys come from its family, in their roles.
const LOCK: [&str; 6] = [
    "{L}",
    "{L}:fence",
    "{L}:wake",
    "{L}:queue",
    "{L}:grant",
    "{L}:holds",
];
const SEM: [&str; 4] = ["{S}", "{S}:fence", "{S}:wake", "{S}:queue"];
const RW: [&str; 6] = [
    "{R}",
    "{R}:fence",
    "{R}:wake",
    "{R}:wq",
    "{R}:rq",
    "{R}:rwake",
];
const OTHER: [&str; 3] = ["k1", "k2", "z"];

/// The keys that hold each type when the scripts use them as they should.
const STRINGS: [&str; 7] = [
    "k1",
    "k2",
    "{L}",
    "{L}:fence",
    "{L}:grant",
    "{S}:fence",
    "{R}:fence",
];
const LISTS: [&str; 4] = ["{L}:wake", "{S}:wake", "{R}:wake", "{R}:rwake"];
const ZSETS: [&str; 6] = ["{L}:queue", "{S}", "{S}:queue", "{R}:wq", "{R}:rq", "z"];
const HASHES: [&str; 2] = ["{L}:holds", "{R}"];

fn all_keys() -> Vec<&'static str> {
    LOCK.iter()
        .chain(SEM.iter())
        .chain(RW.iter())
        .chain(OTHER.iter())
        .copied()
        .collect()
}

/// Draws operations for one seed.
struct Generator {
    rng: fastrand::Rng,
    keys: Vec<&'static str>,
}

impl Generator {
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.usize(..items.len())]
    }

    fn chance(&mut self, percent: u8) -> bool {
        self.rng.u8(..100) < percent
    }

    fn any_key(&mut self) -> String {
        let keys = self.keys.clone();
        self.pick(&keys).to_owned()
    }

    /// A script's key in its role, or now and then any key (types collide).
    fn role(&mut self, key: &str) -> String {
        if self.chance(5) {
            self.any_key()
        } else {
            key.to_owned()
        }
    }

    /// A key of the type a command works on, or now and then any key (types collide).
    fn key_of(&mut self, keys: &[&str]) -> String {
        if self.chance(12) {
            self.any_key()
        } else {
            self.pick(keys).to_owned()
        }
    }

    fn token(&mut self) -> String {
        if self.chance(5) {
            "g1".into()
        } else {
            self.pick(&["t1", "t2", "t3"]).into()
        }
    }

    fn ttl(&mut self) -> String {
        if self.chance(4) {
            self.pick(&["0", "x", "-5", "1.5"]).into()
        } else {
            self.pick(&["30", "100", "250", "1000", "5000", "30000"])
                .into()
        }
    }

    fn grace(&mut self) -> String {
        self.pick(&["50", "200", "1000", "5000"]).into()
    }

    fn mode(&mut self) -> String {
        if self.chance(2) {
            "x".into()
        } else {
            self.pick(&["0", "1", "2", "3"]).into()
        }
    }

    fn fence_expiry(&mut self) -> String {
        if self.chance(3) {
            "0".into()
        } else {
            self.pick(&["604800000", "60000"]).into()
        }
    }

    /// One of the real scripts with random arguments: its name, keys and arguments.
    fn script(&mut self) -> (&'static str, &'static Lua, Vec<String>, Vec<String>) {
        let keys = |g: &mut Self, family: &[&str], roles: &[usize]| -> Vec<String> {
            roles.iter().map(|&i| g.role(family[i])).collect()
        };
        let reentrant = self.chance(25);
        match self.rng.u8(..9) {
            0 => {
                let mut k = keys(self, &LOCK, &[0, 1, 2, 3, 4]);
                let mut a = vec![
                    self.token(),
                    self.ttl(),
                    self.fence_expiry(),
                    self.mode(),
                    self.grace(),
                ];
                if reentrant {
                    k.push(self.role(LOCK[5]));
                    a.push(self.pick(&["o1", "o2"]).into());
                }
                ("ACQUIRE", &ACQUIRE, k, a)
            }
            1 => {
                let mut k = keys(self, &LOCK, &[0, 2, 3, 4]);
                let mut a = vec![
                    self.token(),
                    self.pick(&["g1", "g2"]).into(),
                    "200".into(),
                    self.grace(),
                    self.pick(&["0", "1"]).into(),
                ];
                if reentrant {
                    k.push(self.role(LOCK[5]));
                    a.push(self.pick(&["o1", "o2"]).into());
                }
                ("RELEASE", &RELEASE, k, a)
            }
            2 => {
                let mut k = keys(self, &LOCK, &[0]);
                if reentrant {
                    k.push(self.role(LOCK[5]));
                }
                ("EXTEND", &EXTEND, k, vec![self.token(), self.ttl()])
            }
            3 => {
                let k = keys(self, &SEM, &[0, 1, 2, 3]);
                let a = vec![
                    self.token(),
                    self.ttl(),
                    self.fence_expiry(),
                    self.mode(),
                    self.grace(),
                    self.pick(&["1", "2", "3"]).into(),
                ];
                ("ACQUIRE_PERMIT", &ACQUIRE_PERMIT, k, a)
            }
            4 => {
                let k = keys(self, &SEM, &[0]);
                (
                    "EXTEND_PERMIT",
                    &EXTEND_PERMIT,
                    k,
                    vec![self.token(), self.ttl()],
                )
            }
            5 => {
                let k = keys(self, &SEM, &[0, 2, 3]);
                let a = vec![self.token(), self.grace(), self.pick(&["0", "1"]).into()];
                ("RELEASE_PERMIT", &RELEASE_PERMIT, k, a)
            }
            6 => {
                let k = keys(self, &RW, &[0, 1, 2, 3, 4, 5]);
                let a = vec![
                    self.token(),
                    self.ttl(),
                    self.fence_expiry(),
                    self.mode(),
                    self.grace(),
                    self.pick(&["w", "r"]).into(),
                ];
                ("ACQUIRE_RW", &ACQUIRE_RW, k, a)
            }
            7 => {
                let k = keys(self, &RW, &[0]);
                let a = vec![self.token(), self.ttl(), self.pick(&["w", "r"]).into()];
                ("EXTEND_RW", &EXTEND_RW, k, a)
            }
            _ => {
                let k = keys(self, &RW, &[0, 2, 3, 4, 5]);
                let a = vec![
                    self.token(),
                    self.grace(),
                    self.pick(&["0", "1"]).into(),
                    self.pick(&["w", "r"]).into(),
                ];
                ("RELEASE_RW", &RELEASE_RW, k, a)
            }
        }
    }

    /// A call of a real script on A in a scenario (by `EVALSHA` or `EVAL`).
    fn call(&mut self, name: &str, script: &Lua, keys: &[&str], args: &[&str]) -> Step {
        let by_sha = self.chance(50);
        let keys = keys.iter().map(|k| s(k)).collect();
        let args = args.iter().map(|a| s(a)).collect();
        script_call(name, script, keys, args, by_sha)
    }

    /// `BLPOP` on a waiter connection, with a waiter's `ACQUIRE` (mode 2) of `token`
    /// pipelined behind it when there is a token.
    fn blpop_on(&mut self, who: usize, key: &str, timeout: &str, token: Option<&str>) -> Step {
        let mut commands = vec![(command(&["BLPOP", key, timeout]), Rule::Exact)];
        let mut label = format!("BLPOP {key} {timeout}");
        if let Some(token) = token {
            let grace = self.grace();
            let mut acquire = vec!["EVAL", &ACQUIRE.code, "5"];
            acquire.extend(&LOCK[..5]);
            acquire.extend([token, "1000", "604800000", "2", &grace]);
            commands.push((command(&acquire), Rule::Script));
            label.push_str(&format!(" + <ACQUIRE> {token} 1000 mode 2 grace {grace}"));
        }
        Step::Send {
            who,
            commands,
            label,
            fallback: None,
        }
    }

    /// A random `BLPOP` on a waiter connection.
    fn blpop(&mut self, who: usize) -> Step {
        let key = self.pick(&[
            "{L}:wake",
            "{L}:wake",
            "{S}:wake",
            "{R}:rwake",
            "{R}:wake",
            "k1",
        ]);
        let timeout = self.pick(&["0.1", "0.3", "1", "2", "0"]);
        let token = if self.chance(60) {
            Some(self.pick(&["t2", "t3"]))
        } else {
            None
        };
        self.blpop_on(who, key, timeout, token)
    }

    /// A coherent burst of steps that walks one primitive through its waiting and handoff
    /// paths (random commands alone rarely line them up).
    fn scenario(&mut self) -> Vec<Step> {
        let lock5 = &LOCK[..5];
        let release4 = [LOCK[0], LOCK[2], LOCK[3], LOCK[4]];
        let holder = self.pick(&["t1", "t2"]);
        let ttl = self.pick(&["1000", "5000", "30000"]);
        let grace = self.pick(&["1000", "5000"]);
        let fence = "604800000";
        let mut steps = Vec::new();
        match self.rng.u8(..4) {
            0 => {
                // Lock: a holder, two registered waiters blocked (on B and D, in either
                // order) with their attempts pipelined, a release that hands the lock to
                // the first, whose release hands it to the second.
                let holder = "t1";
                steps.push(self.call(
                    "ACQUIRE",
                    &ACQUIRE,
                    lock5,
                    &[holder, ttl, fence, "0", grace],
                ));
                let order = if self.chance(50) {
                    [(B, "t2"), (D, "t3")]
                } else {
                    [(D, "t3"), (B, "t2")]
                };
                for (who, token) in order {
                    steps.push(self.call(
                        "ACQUIRE",
                        &ACQUIRE,
                        lock5,
                        &[token, ttl, fence, "1", grace],
                    ));
                    if self.chance(85) {
                        let timeout = self.pick(&["1", "2", "0"]);
                        steps.push(self.blpop_on(who, LOCK[2], timeout, Some(token)));
                    }
                }
                if self.chance(30) {
                    steps.push(Step::Sleep(self.rng.u64(1..40)));
                }
                let withdraw = if self.chance(20) { "1" } else { "0" };
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release4,
                    &[holder, "g1", "200", grace, withdraw],
                ));
                let next = self.pick(&["t3", "g1", holder]);
                let mode = self.pick(&["1", "2", "3"]);
                steps.push(self.call("ACQUIRE", &ACQUIRE, lock5, &[next, ttl, fence, mode, grace]));
                let first = order[0].1;
                if self.chance(50) {
                    steps.push(self.call("EXTEND", &EXTEND, &[LOCK[0]], &[first, ttl]));
                }
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release4,
                    &[first, "g2", "200", grace, "0"],
                ));
                let second = order[1].1;
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release4,
                    &[second, "g1", "200", grace, "1"],
                ));
            }
            1 => {
                // Semaphore: permits taken, a waiter registered and woken by a release.
                let permits = self.pick(&["1", "2"]);
                let acquire = |g: &mut Self, token: &str, mode: &str| {
                    g.call(
                        "ACQUIRE_PERMIT",
                        &ACQUIRE_PERMIT,
                        &SEM,
                        &[token, ttl, fence, mode, grace, permits],
                    )
                };
                steps.push(acquire(self, "t1", "0"));
                steps.push(acquire(self, "t2", "0"));
                steps.push(acquire(self, "t3", "1"));
                if self.chance(70) {
                    steps.push(send(B, &[s("BLPOP"), s(SEM[2]), s("1")], None, Rule::Exact));
                }
                if self.chance(50) {
                    steps.push(send(
                        D,
                        &[s("BLPOP"), s(SEM[2]), s("0.3")],
                        None,
                        Rule::Exact,
                    ));
                }
                let sem_release = [SEM[0], SEM[2], SEM[3]];
                steps.push(self.call(
                    "RELEASE_PERMIT",
                    &RELEASE_PERMIT,
                    &sem_release,
                    &["t1", grace, "0"],
                ));
                steps.push(acquire(self, "t3", "2"));
                steps.push(self.call("EXTEND_PERMIT", &EXTEND_PERMIT, &[SEM[0]], &["t3", ttl]));
                let withdraw = self.pick(&["0", "1"]);
                steps.push(self.call(
                    "RELEASE_PERMIT",
                    &RELEASE_PERMIT,
                    &sem_release,
                    &["t2", grace, withdraw],
                ));
            }
            2 => {
                // Read-write lock: a writer, waiting readers and a waiting writer; the
                // writer's release or a waiting writer giving up wakes them.
                let release5 = [RW[0], RW[2], RW[3], RW[4], RW[5]];
                let acquire = |g: &mut Self, token: &str, mode: &str, side: &str| {
                    g.call(
                        "ACQUIRE_RW",
                        &ACQUIRE_RW,
                        &RW,
                        &[token, ttl, fence, mode, grace, side],
                    )
                };
                steps.push(acquire(self, holder, "0", "w"));
                steps.push(acquire(self, "t3", "1", "r"));
                if self.chance(70) {
                    let wake = self.pick(&[RW[5], RW[2]]);
                    steps.push(send(B, &[s("BLPOP"), s(wake), s("1")], None, Rule::Exact));
                    steps.push(send(D, &[s("BLPOP"), s(RW[5]), s("1")], None, Rule::Exact));
                }
                let other = if holder == "t1" { "t2" } else { "t1" };
                steps.push(acquire(self, other, "1", "w"));
                if self.chance(40) {
                    steps.push(acquire(self, other, "3", "w"));
                }
                steps.push(self.call("EXTEND_RW", &EXTEND_RW, &[RW[0]], &[holder, ttl, "w"]));
                steps.push(self.call(
                    "RELEASE_RW",
                    &RELEASE_RW,
                    &release5,
                    &[holder, grace, "0", "w"],
                ));
                steps.push(acquire(self, "t3", "2", "r"));
                steps.push(acquire(self, other, "2", "w"));
                let withdraw = self.pick(&["0", "1"]);
                steps.push(self.call(
                    "RELEASE_RW",
                    &RELEASE_RW,
                    &release5,
                    &["t3", grace, withdraw, "r"],
                ));
            }
            _ => {
                // Reentrant lock: holds of one owner, another owner refused, holds given
                // back one at a time.
                let owner = self.pick(&["o1", "o2"]);
                let acquire = |g: &mut Self, token: &str, owner: &str| {
                    g.call(
                        "ACQUIRE",
                        &ACQUIRE,
                        &LOCK,
                        &[token, ttl, fence, "0", grace, owner],
                    )
                };
                let release = |g: &mut Self, token: &str, owner: &str| {
                    let keys = [LOCK[0], LOCK[2], LOCK[3], LOCK[4], LOCK[5]];
                    g.call(
                        "RELEASE",
                        &RELEASE,
                        &keys,
                        &[token, "g1", "200", grace, "0", owner],
                    )
                };
                steps.push(acquire(self, "t1", owner));
                steps.push(acquire(self, "t2", owner));
                steps.push(acquire(self, "t3", "o3"));
                steps.push(self.call("EXTEND", &EXTEND, &[LOCK[0], LOCK[5]], &["t1", ttl]));
                steps.push(release(self, "t2", owner));
                steps.push(release(self, "t1", "o3"));
                steps.push(release(self, "t1", owner));
            }
        }
        steps
    }

    /// A plain command on keys of the shared set, now and then a malformed one.
    fn plain(&mut self) -> (Vec<String>, Rule) {
        let kind = self.rng.u8(..30);
        let keys: &[&str] = match kind {
            0..=9 => &STRINGS,
            10 | 11 => &LISTS,
            12..=19 => &ZSETS,
            20..=26 => &HASHES,
            _ => &OTHER,
        };
        let k = self.key_of(keys);
        let k2 = self.key_of(keys);
        let value = self
            .pick(&["v", "t1", "t2", "5", "-3", "1.5", ""])
            .to_owned();
        let member = self.pick(&["t1", "t2", "t3", "m"]).to_owned();
        let field = self
            .pick(&["w", "r:t1", "r:t2", "t", "o", "f", "h:t1"])
            .to_owned();
        let score = self
            .pick(&[
                "1", "2.5", "-1", "+inf", "-inf", "0.1", "x", "nan", "1e400", "3", "0x10",
            ])
            .to_owned();
        let bound = self
            .pick(&["-inf", "+inf", "(1", "2", "0", "x", "(", "", "1e400"])
            .to_owned();
        let px = self
            .pick(&["1", "30", "100", "250", "1000", "30000", "0", "-1", "x"])
            .to_owned();
        let s = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match kind {
            0 | 1 => (s(&["GET", &k]), Rule::Text),
            2 | 3 => {
                let mut c = s(&["SET", &k, &value]);
                for opt in ["NX", "XX", "GET", "KEEPTTL"] {
                    if self.chance(20) {
                        c.push(opt.into());
                    }
                }
                if self.chance(50) {
                    c.push(self.pick(&["PX", "EX", "px"]).into());
                    c.push(px);
                }
                (c, Rule::Text)
            }
            4 => (s(&["DEL", &k, &k2]), Rule::Exact),
            5 => (s(&["EXISTS", &k, &k2, &k]), Rule::Exact),
            6 => {
                let mut c = s(&["PEXPIRE", &k, &px]);
                if self.chance(30) {
                    c.push(self.pick(&["NX", "XX", "GT", "LT", "foo"]).into());
                }
                (c, Rule::Exact)
            }
            7 | 8 => (s(&["PTTL", &k]), Rule::Duration),
            9 => (s(&["TIME"]), Rule::Time),
            10 => (s(&["RPUSH", &k, &value, &member]), Rule::Exact),
            11 => (s(&["LLEN", &k]), Rule::Exact),
            12 => {
                let mut c = s(&["ZADD", &k]);
                for opt in ["NX", "XX", "GT", "LT", "CH", "INCR"] {
                    if self.chance(10) {
                        c.push(opt.into());
                    }
                }
                c.extend([score, member]);
                if self.chance(20) {
                    c.extend(["2".into(), "t2".into()]);
                }
                (c, Rule::Text)
            }
            13 => (s(&["ZREM", &k, &member, "t2"]), Rule::Exact),
            14 => {
                let mut c = s(&["ZRANGE", &k, "0", "-1"]);
                if self.chance(50) {
                    c.push("WITHSCORES".into());
                    (c, Rule::Pairs)
                } else {
                    (c, Rule::Members)
                }
            }
            15 => {
                // Ranks and options on a set of the test's own, without timestamp ties.
                let start = self.pick(&["0", "1", "-1", "-2", "5", "x"]);
                let stop = self.pick(&["0", "-1", "2", "100", "-100"]);
                let mut c = s(&["ZRANGE", "z", start, stop]);
                for opt in ["REV", "WITHSCORES", "BYSCORE", "LIMIT"] {
                    if self.chance(15) {
                        c.push(opt.into());
                        if opt == "LIMIT" {
                            c.extend(["0".into(), "2".into()]);
                        }
                    }
                }
                (c, Rule::Exact)
            }
            16 => (s(&["ZREMRANGEBYSCORE", &k, &bound, "+inf"]), Rule::Exact),
            17 => (s(&["ZCOUNT", &k, &bound, "(3"]), Rule::Exact),
            18 => (s(&["ZSCORE", &k, &member]), Rule::Text),
            19 => (s(&["ZCARD", &k]), Rule::Exact),
            20 => {
                let mut c = s(&["HSET", &k, &field, &value]);
                if self.chance(20) {
                    c.extend(["t".into(), "t1".into()]);
                }
                (c, Rule::Exact)
            }
            21 => (s(&["HGET", &k, &field]), Rule::Text),
            22 => (s(&["HMGET", &k, &field, "w", "t"]), Rule::Text),
            23 => (s(&["HGETALL", &k]), Rule::Pairs),
            24 => (s(&["HDEL", &k, &field, "o"]), Rule::Exact),
            25 => (s(&["HLEN", &k]), Rule::Exact),
            26 => (s(&["HEXISTS", &k, &field]), Rule::Exact),
            27 => (s(&["PING"]), Rule::Exact),
            28 => (s(&["ZADD", "z", &score, &member]), Rule::Exact),
            _ => {
                let bad: &[&[&str]] = &[
                    &["GET"],
                    &["NOPE", "a", "b"],
                    &["SET", "k1", "v", "NX", "XX"],
                    &["SET", "k1"],
                    &["ZADD", "k1", "1"],
                    &["HSET", "k1", "f"],
                    &["BLPOP", "k1"],
                    &["BLPOP", "k1", "x"],
                    &["BLPOP", "k1", "-1"],
                    &["WAIT", "x", "0"],
                    &["WAIT", "0", "-1"],
                    &["SCRIPT", "NOPE"],
                    &["SCRIPT"],
                    &["SCRIPT", "FLUSH", "LATER"],
                    &["EVAL", "return 1", "5"],
                    &["EVAL", "return 1", "-1"],
                    &["EVAL", "return 1", "x"],
                    &["EVAL", "return +", "0"],
                    &["EVALSHA", "abc", "0"],
                    &["ZRANGE", "z", "0", "-1", "LIMIT", "0", "1"],
                    &["PEXPIRE", "k1", "10", "NX", "XX"],
                    &["PING", "a", "b"],
                    &["TIME", "x"],
                ];
                let pick = self.pick(bad);
                (s(pick), Rule::Exact)
            }
        }
    }

    /// A small script probing the Lua bridge: conversions, errors, `OOM` in scripts.
    fn probe(&mut self) -> (Vec<String>, Rule) {
        let probes: &[(&str, Rule)] = &[
            ("return redis.call('GET', KEYS[1])", Rule::Text),
            ("return redis.pcall('LLEN', KEYS[1])", Rule::Exact),
            (
                "return {1, 'x', true, false, {ok='y'}, 2.5, -2.5, {err='e'}}",
                Rule::Exact,
            ),
            (
                "redis.call('SET', KEYS[1], ARGV[1])\nreturn redis.call('LLEN', KEYS[1])",
                Rule::Exact,
            ),
            (
                "return redis.call('ZADD', KEYS[1], ARGV[1], 'm')",
                Rule::Exact,
            ),
            (
                "return #redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')",
                Rule::Exact,
            ),
            ("return y", Rule::Exact),
            ("x = 1", Rule::Exact),
            (
                "return redis.call('SET', KEYS[1], 'x', 'PX', ARGV[1])",
                Rule::Exact,
            ),
            (
                "redis.call('DEL', KEYS[1])\nreturn redis.pcall('SET', KEYS[1], 'v')",
                Rule::Exact,
            ),
            ("return redis.pcall('SET', KEYS[1], 'v')", Rule::Exact),
            ("return redis.call('RPUSH', KEYS[1], ARGV[1])", Rule::Exact),
            ("return {err='custom failure'}", Rule::Exact),
            ("return redis.error_reply('MY failure')", Rule::Exact),
            ("return redis.call('NOPE')", Rule::Exact),
            ("return redis.call('GET')", Rule::Exact),
            ("return redis.call('SET', KEYS[1], {})", Rule::Exact),
            (
                "return string.format('%.0f', 2^53) .. ' ' .. tostring(1e15) .. ' ' .. tostring(0.1)",
                Rule::Exact,
            ),
            ("return redis.call('TIME')", Rule::Time),
            (
                "return redis.call('SET', KEYS[1], ARGV[1] + 0.5)",
                Rule::Exact,
            ),
            ("return {double=tonumber(ARGV[1])}", Rule::Exact),
            ("return redis.call('ZSCORE', KEYS[1], 'm')", Rule::Text),
            ("return redis.call('HMGET', KEYS[1], 'w', 't')", Rule::Text),
            (
                "local n = 0\nfor _, v in ipairs(redis.call('HGETALL', KEYS[1])) do n = n + #v end\nreturn n",
                Rule::Exact,
            ),
            (
                "return redis.call('EXISTS', KEYS[1], KEYS[1]) + redis.call('LLEN', 'k2')",
                Rule::Exact,
            ),
            ("return tonumber(ARGV[1]) * 2", Rule::Exact),
            (
                "redis.call('SET', KEYS[1], ARGV[1] / 3)\nreturn redis.call('GET', KEYS[1])",
                Rule::Exact,
            ),
            (
                "redis.call('SET', KEYS[1], 'v')\nredis.call('PEXPIRE', KEYS[1], ARGV[1])\nreturn {redis.call('EXISTS', KEYS[1]), redis.call('PTTL', KEYS[1])}",
                Rule::Exact,
            ),
            (
                "return {type(coroutine), type(unpack), type(loadstring), type(math.huge), _VERSION}",
                Rule::Exact,
            ),
        ];
        let (body, rule) = self.pick(probes);
        let key = self.any_key();
        let arg = self
            .pick(&["1", "1.5", "x", "-2", "1e20", "100", "0", "0.1"])
            .to_owned();
        (vec!["EVAL".into(), body.into(), "1".into(), key, arg], rule)
    }
}

/// One run of one seed against one real server.
struct Run {
    seed: u64,
    conns: Vec<RealConn>,
    model: Server,
    model_conns: Vec<ConnId>,
    start: Instant,
    clock_offset: i64,
    history: Vec<String>,
    /// For each connection, the rules of its commands whose replies are still to come
    /// (used for the waiters, whose replies come when the model serves them).
    waiting: Vec<VecDeque<Rule>>,
    /// The model's last reply on A or C.
    last_reply: Value,
    /// How many replies of each kind were compared (printed per seed: what was covered).
    seen: BTreeMap<String, usize>,
    /// The longest a real reply took to come back after the model's time was read for
    /// its command, ms (commands that block excepted): how late the real server may have
    /// acted on the model's clock.
    slowest_ms: u64,
}

fn to_command(args: &[String]) -> Command {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// A readable form of a command for the report (scripts by name, bodies shortened).
fn describe(args: &[String], script: Option<&str>) -> String {
    args.iter()
        .enumerate()
        .map(|(i, a)| match (i, script) {
            (1, Some(name)) => format!("<{name}>"),
            _ if a.len() > 60 => format!("{:?}...", &a[..60]),
            _ => format!("{a:?}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Run {
    fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The windows of the model's wall clock in which a command could see a different
    /// outcome on the two sides.
    fn windows(&self) -> Vec<(i64, i64)> {
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
    fn avoid_instants(&mut self) {
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

    fn report(&self, what: &str, model: &Value, real: &Value) -> Divergence {
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
    fn recv(&mut self, who: usize, model: &Value) -> Result<Value, Divergence> {
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
    fn check_waiters(&mut self) -> Result<(), Divergence> {
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
    fn note(&mut self, who: usize, reply: &Value, script: Option<&str>) {
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

    fn step(&mut self, step: Step) -> Result<(), Divergence> {
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

    fn send(
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
            self.model.advance(due.max(self.elapsed_ms()));
            replies.extend(self.model.take_replies(self.model_conns[who]));
        }
        for (i, (model, rule)) in replies.into_iter().zip(rules).enumerate() {
            let real = self.recv(who, &model)?;
            if i == 0 && !blocked {
                self.slowest_ms = self.slowest_ms.max(self.elapsed_ms().saturating_sub(now));
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

/// The number a string starts with (digits), if it is followed by nothing or a space.
fn leading_number(s: &[u8]) -> Option<i64> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (digits < s.len() && s[digits] != b' ') {
        return None;
    }
    std::str::from_utf8(&s[..digits]).ok()?.parse().ok()
}

/// Whether two clock-derived integers agree: equal, or both non-negative and within the
/// tolerance (in µs for µs timestamps).
fn close(a: i64, b: i64) -> bool {
    let tolerance = if a.max(b) > 100_000_000_000_000 {
        TOLERANCE_MS * 1000
    } else {
        TOLERANCE_MS
    };
    a == b || (a >= 0 && b >= 0 && (a - b).abs() <= tolerance)
}

/// Strings equal, or timestamps (ms or µs, with an optional ` rest`) within tolerance.
fn same_text(model: &Value, real: &Value) -> bool {
    match (model, real) {
        (Value::BulkString(m), Value::BulkString(r)) => {
            if m == r {
                return true;
            }
            match (leading_number(m), leading_number(r)) {
                (Some(a), Some(b)) if a > 100_000_000_000 && b > 100_000_000_000 => {
                    let rest = |s: &[u8]| {
                        s.iter()
                            .skip_while(|b| b.is_ascii_digit())
                            .copied()
                            .collect::<Vec<u8>>()
                    };
                    close(a, b) && rest(m) == rest(r)
                }
                _ => false,
            }
        }
        (Value::Array(m), Value::Array(r)) => {
            m.len() == r.len() && m.iter().zip(r).all(|(m, r)| same_text(m, r))
        }
        _ => model == real,
    }
}

fn same(rule: Rule, model: &Value, real: &Value) -> bool {
    match rule {
        Rule::Exact => model == real,
        Rule::Duration => match (model, real) {
            (Value::Int(a), Value::Int(b)) => close(*a, *b),
            _ => model == real,
        },
        Rule::Time => {
            let micros = |v: &Value| -> Option<i64> {
                let Value::Array(parts) = v else { return None };
                let [Value::BulkString(s), Value::BulkString(us)] = parts.as_slice() else {
                    return None;
                };
                let s: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
                let us: i64 = std::str::from_utf8(us).ok()?.parse().ok()?;
                Some(s * 1_000_000 + us)
            };
            match (micros(model), micros(real)) {
                (Some(a), Some(b)) => close(a, b),
                _ => model == real,
            }
        }
        Rule::Script => match (model, real) {
            (Value::Array(m), Value::Array(r)) if m.len() == r.len() && !m.is_empty() => {
                m[0] == r[0]
                    && m[1..].iter().zip(&r[1..]).all(|pair| match pair {
                        (Value::Int(a), Value::Int(b)) => close(*a, *b),
                        (m, r) => same_text(m, r),
                    })
            }
            _ => model == real,
        },
        Rule::Text => same_text(model, real),
        Rule::Members => match (model, real) {
            (Value::Array(m), Value::Array(r)) => {
                let sorted = |items: &[Value]| {
                    let mut items: Vec<String> = items.iter().map(|v| format!("{v:?}")).collect();
                    items.sort();
                    items
                };
                sorted(m) == sorted(r)
            }
            _ => model == real,
        },
        Rule::Pairs => match (model, real) {
            (Value::Array(m), Value::Array(r)) if m.len() == r.len() => {
                let sorted = |items: &[Value]| {
                    let mut pairs: Vec<Vec<Value>> =
                        items.chunks(2).map(<[Value]>::to_vec).collect();
                    pairs.sort_by_key(|p| format!("{:?}", p[0]));
                    pairs
                };
                let (m, r) = (sorted(m), sorted(r));
                m.iter().zip(&r).all(|(m, r)| {
                    m[0] == r[0] && m.iter().zip(r).skip(1).all(|(m, r)| same_text(m, r))
                })
            }
            _ => model == real,
        },
    }
}

fn s(text: &str) -> String {
    text.to_owned()
}

/// A step sending one command on `who` (`script` names the script whose body is its
/// second argument, for the report).
fn send(who: usize, args: &[String], script: Option<&str>, rule: Rule) -> Step {
    Step::Send {
        who,
        label: describe(args, script),
        commands: vec![(to_command(args), rule)],
        fallback: None,
    }
}

/// A step calling a real script on A, by `EVALSHA` (then by `EVAL` if the model answers
/// `NOSCRIPT`, as the client does) or by `EVAL`.
fn script_call(
    name: &str,
    script: &Lua,
    keys: Vec<String>,
    args: Vec<String>,
    by_sha: bool,
) -> Step {
    let mut eval = vec![s("EVAL"), script.code.clone(), keys.len().to_string()];
    eval.extend(keys);
    eval.extend(args);
    if !by_sha {
        return send(A, &eval, Some(name), Rule::Script);
    }
    let mut evalsha = eval.clone();
    evalsha[0] = s("EVALSHA");
    evalsha[1] = script.sha.clone();
    Step::Send {
        who: A,
        label: describe(&evalsha, Some(name)),
        commands: vec![(to_command(&evalsha), Rule::Script)],
        fallback: Some(Box::new(send(A, &eval, Some(name), Rule::Script))),
    }
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
