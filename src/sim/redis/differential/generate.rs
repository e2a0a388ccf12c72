//! The random operations of a run: plain commands, the real scripts with random
//! arguments, probe scripts for the Lua bridge, `BLPOP`s on the waiter connections, and
//! scenarios that line up the scripts' waiting and handoff paths.

use super::compare::Rule;
use super::{A, B, D, Step};
use crate::scripts::{
    ACQUIRE, ACQUIRE_ALL, ACQUIRE_PERMIT, ACQUIRE_RW, EXTEND, EXTEND_PERMIT, EXTEND_RW, Lua,
    RELEASE, RELEASE_PERMIT, RELEASE_RW,
};
use crate::sim::redis::{Command, command};

/// The key families: each script's keys come from its family, in their roles.
pub(super) const LOCK: [&str; 7] = [
    "{L}",
    "{L}:fence",
    "{L}:wake",
    "{L}:queue",
    "{L}:grant",
    "{L}:waiting",
    "{L}:holds",
];
pub(super) const SEM: [&str; 4] = ["{S}", "{S}:fence", "{S}:wake", "{S}:queue"];
pub(super) const RW: [&str; 6] = [
    "{R}",
    "{R}:fence",
    "{R}:wake",
    "{R}:wq",
    "{R}:rq",
    "{R}:rwake",
];
const OTHER: [&str; 3] = ["k1", "k2", "z"];

/// The own wake list of the waiter `token`, as the release scripts name it beside these
/// families' wake lists (`{X}:wake` is shorter than the prefix they cut: nothing is left
/// of it but the token).
fn own(token: &str) -> String {
    format!("redlease:wakeme::{token}")
}

/// The keys that hold each type when the scripts use them as they should.
const STRINGS: [&str; 8] = [
    "k1",
    "k2",
    "{L}",
    "{L}:fence",
    "{L}:grant",
    "{L}:waiting",
    "{S}:fence",
    "{R}:fence",
];
const LISTS: [&str; 4] = ["{L}:wake", "{S}:wake", "{R}:wake", "{R}:rwake"];
const ZSETS: [&str; 6] = ["{L}:queue", "{S}", "{S}:queue", "{R}:wq", "{R}:rq", "z"];
const HASHES: [&str; 2] = ["{L}:holds", "{R}"];

pub(super) fn all_keys() -> Vec<&'static str> {
    LOCK.iter()
        .chain(SEM.iter())
        .chain(RW.iter())
        .chain(OTHER.iter())
        .copied()
        .collect()
}

/// Draws operations for one seed.
pub(super) struct Generator {
    pub(super) rng: fastrand::Rng,
    pub(super) keys: Vec<&'static str>,
}

impl Generator {
    pub(super) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.usize(..items.len())]
    }

    pub(super) fn chance(&mut self, percent: u8) -> bool {
        self.rng.u8(..100) < percent
    }

    pub(super) fn any_key(&mut self) -> String {
        let keys = self.keys.clone();
        self.pick(&keys).to_owned()
    }

    /// A script's key in its role, or now and then any key (types collide).
    pub(super) fn role(&mut self, key: &str) -> String {
        if self.chance(5) {
            self.any_key()
        } else {
            key.to_owned()
        }
    }

    /// A key of the type a command works on, or now and then any key (types collide).
    pub(super) fn key_of(&mut self, keys: &[&str]) -> String {
        if self.chance(12) {
            self.any_key()
        } else {
            self.pick(keys).to_owned()
        }
    }

    pub(super) fn token(&mut self) -> String {
        if self.chance(5) {
            "g1".into()
        } else {
            self.pick(&["t1", "t2", "t3"]).into()
        }
    }

    pub(super) fn ttl(&mut self) -> String {
        if self.chance(4) {
            self.pick(&["0", "x", "-5", "1.5"]).into()
        } else {
            self.pick(&["30", "100", "250", "1000", "5000", "30000"])
                .into()
        }
    }

    pub(super) fn grace(&mut self) -> String {
        self.pick(&["50", "200", "1000", "5000"]).into()
    }

    pub(super) fn mode(&mut self) -> String {
        if self.chance(2) {
            "x".into()
        } else {
            self.pick(&["0", "1", "2", "3"]).into()
        }
    }

    /// The client's estimate of the server's clock (µs) an acquire carries: none (0), a
    /// plausible one, one far behind or far ahead, or garbage.
    pub(super) fn clock(&mut self) -> String {
        if self.chance(3) {
            self.pick(&["x", "-5"]).into()
        } else {
            self.pick(&["0", "0", "1", "1700000000000000", "4000000000000000"])
                .into()
        }
    }

    /// One of the real scripts with random arguments: its name, keys and arguments.
    pub(super) fn script(&mut self) -> (&'static str, &'static Lua, Vec<String>, Vec<String>) {
        let keys = |g: &mut Self, family: &[&str], roles: &[usize]| -> Vec<String> {
            roles.iter().map(|&i| g.role(family[i])).collect()
        };
        let reentrant = self.chance(25);
        match self.rng.u8(..10) {
            0 => {
                let mut k = keys(self, &LOCK, &[0, 1, 2, 3, 4, 5]);
                let mut a = vec![
                    self.token(),
                    self.ttl(),
                    self.clock(),
                    self.mode(),
                    self.grace(),
                    self.pick(&["0", "1", "2"]).into(),
                ];
                if reentrant {
                    k.push(self.role(LOCK[6]));
                    a[5] = "0".into();
                    a.push(self.pick(&["o1", "o2"]).into());
                } else if a[3] == "0" && self.chance(50) {
                    // A single attempt passes the key and the fencing counter only.
                    k.truncate(2);
                }
                if a[3] != "0" && self.chance(40) {
                    // An attempt that leads a block: the waiter's own list last.
                    k.push(own(&a[0]));
                }
                ("ACQUIRE", &ACQUIRE, k, a)
            }
            1 => {
                let mut k = keys(self, &LOCK, &[0, 2, 3, 4, 5, 1]);
                let mut a = vec![
                    self.token(),
                    self.pick(&["g1", "g2"]).into(),
                    "200".into(),
                    self.grace(),
                    self.pick(&["0", "1"]).into(),
                    self.ttl(),
                ];
                if reentrant {
                    k.push(self.role(LOCK[6]));
                    a.push(self.pick(&["o1", "o2"]).into());
                }
                ("RELEASE", &RELEASE, k, a)
            }
            2 => {
                let mut k = keys(self, &LOCK, &[0]);
                if reentrant {
                    k.push(self.role(LOCK[6]));
                }
                ("EXTEND", &EXTEND, k, vec![self.token(), self.ttl()])
            }
            3 => {
                let mut k = keys(self, &SEM, &[0, 1, 2, 3]);
                let a = vec![
                    self.token(),
                    self.ttl(),
                    self.clock(),
                    self.mode(),
                    self.grace(),
                    self.pick(&["1", "2", "3"]).into(),
                    self.pick(&["0", "1", "2"]).into(),
                ];
                if a[3] != "0" && self.chance(40) {
                    k.push(own(&a[0]));
                }
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
                let k = keys(self, &SEM, &[0, 2, 3, 1]);
                let a = vec![
                    self.token(),
                    self.grace(),
                    self.pick(&["0", "1"]).into(),
                    self.ttl(),
                    "200".into(),
                ];
                ("RELEASE_PERMIT", &RELEASE_PERMIT, k, a)
            }
            6 => {
                let mut k = keys(self, &RW, &[0, 1, 2, 3, 4, 5]);
                let a = vec![
                    self.token(),
                    self.ttl(),
                    self.clock(),
                    self.mode(),
                    self.grace(),
                    self.pick(&["w", "r"]).into(),
                    self.pick(&["0", "1", "2"]).into(),
                ];
                if a[3] != "0" && self.chance(40) {
                    k.push(own(&a[0]));
                }
                ("ACQUIRE_RW", &ACQUIRE_RW, k, a)
            }
            7 => {
                let k = keys(self, &RW, &[0]);
                let a = vec![self.token(), self.ttl(), self.pick(&["w", "r"]).into()];
                ("EXTEND_RW", &EXTEND_RW, k, a)
            }
            9 => {
                // Two mutexes at once: the lock family's and the plain keys as a second.
                let mut k = keys(self, &LOCK, &[0, 1]);
                k.push(self.role("k1"));
                k.push(self.role("k2"));
                let a = vec![
                    self.ttl(),
                    self.clock(),
                    self.pick(&["00", "01", "10", "11", "0"]).into(),
                    self.token(),
                    self.token(),
                ];
                ("ACQUIRE_ALL", &ACQUIRE_ALL, k, a)
            }
            _ => {
                let k = keys(self, &RW, &[0, 2, 3, 4, 5, 1]);
                let a = vec![
                    self.token(),
                    self.grace(),
                    self.pick(&["0", "1"]).into(),
                    self.pick(&["w", "r"]).into(),
                    self.ttl(),
                    "200".into(),
                ];
                ("RELEASE_RW", &RELEASE_RW, k, a)
            }
        }
    }

    /// A call of a real script on A in a scenario (by `EVALSHA` or `EVAL`).
    pub(super) fn call(&mut self, name: &str, script: &Lua, keys: &[&str], args: &[&str]) -> Step {
        let by_sha = self.chance(50);
        let keys = keys.iter().map(|k| s(k)).collect();
        let args = args.iter().map(|a| s(a)).collect();
        script_call(name, script, keys, args, by_sha)
    }

    /// `BLPOP` on a waiter connection, with a waiter's `ACQUIRE` (mode 2) of `token`
    /// pipelined behind it when there is a token.
    pub(super) fn blpop_on(
        &mut self,
        who: usize,
        key: &str,
        timeout: &str,
        token: Option<&str>,
    ) -> Step {
        let mut commands = vec![(command(&["BLPOP", key, timeout]), Rule::Exact)];
        let mut label = format!("BLPOP {key} {timeout}");
        if let Some(token) = token {
            let grace = self.grace();
            let clock = self.clock();
            let mut acquire = vec!["EVAL", &ACQUIRE.code, "6"];
            acquire.extend(&LOCK[..6]);
            acquire.extend([token, "1000", &clock, "2", &grace]);
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
    pub(super) fn blpop(&mut self, who: usize) -> Step {
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
    pub(super) fn scenario(&mut self) -> Vec<Step> {
        let lock6 = &LOCK[..6];
        let release6 = [LOCK[0], LOCK[2], LOCK[3], LOCK[4], LOCK[5], LOCK[1]];
        // Waiters to be handed the lock (their registrations name their ttl), or woken.
        let direct = self.pick(&["0", "1", "2"]);
        let holder = self.pick(&["t1", "t2"]);
        let ttl = self.pick(&["1000", "5000", "30000"]);
        let grace = self.pick(&["1000", "5000"]);
        let fence = self.clock();
        let fence = fence.as_str();
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
                    lock6,
                    &[holder, ttl, fence, "0", grace, "0"],
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
                        lock6,
                        &[token, ttl, fence, "1", grace, direct],
                    ));
                    if self.chance(85) {
                        let timeout = self.pick(&["1", "2", "0"]);
                        if direct == "1" {
                            let own = own(token);
                            let blpop = [s("BLPOP"), own, s(LOCK[2]), s(timeout)];
                            steps.push(send(who, &blpop, None, Rule::Text));
                        } else {
                            steps.push(self.blpop_on(who, LOCK[2], timeout, Some(token)));
                        }
                    }
                }
                if self.chance(30) {
                    steps.push(Step::Sleep(self.rng.u64(1..40)));
                }
                let withdraw = if self.chance(20) { "1" } else { "0" };
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release6,
                    &[holder, "g1", "200", grace, withdraw, ttl],
                ));
                let next = self.pick(&["t3", "g1", holder]);
                let mode = self.pick(&["1", "2", "3"]);
                steps.push(self.call(
                    "ACQUIRE",
                    &ACQUIRE,
                    lock6,
                    &[next, ttl, fence, mode, grace, direct],
                ));
                let first = order[0].1;
                if self.chance(50) {
                    steps.push(self.call("EXTEND", &EXTEND, &[LOCK[0]], &[first, ttl]));
                }
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release6,
                    &[first, "g2", "200", grace, "0", ttl],
                ));
                let second = order[1].1;
                steps.push(self.call(
                    "RELEASE",
                    &RELEASE,
                    &release6,
                    &[second, "g1", "200", grace, "1", ttl],
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
                        &[token, ttl, fence, mode, grace, permits, direct],
                    )
                };
                steps.push(acquire(self, "t1", "0"));
                steps.push(acquire(self, "t2", "0"));
                steps.push(acquire(self, "t3", "1"));
                if self.chance(70) {
                    let blpop = [s("BLPOP"), own("t3"), s(SEM[2]), s("1")];
                    steps.push(send(B, &blpop, None, Rule::Text));
                }
                if self.chance(50) {
                    steps.push(send(
                        D,
                        &[s("BLPOP"), s(SEM[2]), s("0.3")],
                        None,
                        Rule::Exact,
                    ));
                }
                let sem_release = [SEM[0], SEM[2], SEM[3], SEM[1]];
                steps.push(self.call(
                    "RELEASE_PERMIT",
                    &RELEASE_PERMIT,
                    &sem_release,
                    &["t1", grace, "0", ttl, "200"],
                ));
                steps.push(acquire(self, "t3", "2"));
                steps.push(self.call("EXTEND_PERMIT", &EXTEND_PERMIT, &[SEM[0]], &["t3", ttl]));
                let withdraw = self.pick(&["0", "1"]);
                steps.push(self.call(
                    "RELEASE_PERMIT",
                    &RELEASE_PERMIT,
                    &sem_release,
                    &["t2", grace, withdraw, ttl, "200"],
                ));
            }
            2 => {
                // Read-write lock: a writer, waiting readers and a waiting writer; the
                // writer's release or a waiting writer giving up wakes them.
                let release6 = [RW[0], RW[2], RW[3], RW[4], RW[5], RW[1]];
                let acquire = |g: &mut Self, token: &str, mode: &str, side: &str| {
                    g.call(
                        "ACQUIRE_RW",
                        &ACQUIRE_RW,
                        &RW,
                        &[token, ttl, fence, mode, grace, side, direct],
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
                if direct == "1" && self.chance(60) {
                    let blpop = [s("BLPOP"), own(other), s(RW[2]), s("1")];
                    steps.push(send(D, &blpop, None, Rule::Text));
                }
                steps.push(self.call(
                    "RELEASE_RW",
                    &RELEASE_RW,
                    &release6,
                    &[holder, grace, "0", "w", ttl, "200"],
                ));
                steps.push(acquire(self, "t3", "2", "r"));
                steps.push(acquire(self, other, "2", "w"));
                let withdraw = self.pick(&["0", "1"]);
                steps.push(self.call(
                    "RELEASE_RW",
                    &RELEASE_RW,
                    &release6,
                    &["t3", grace, withdraw, "r", ttl, "200"],
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
                        &[token, ttl, fence, "0", grace, "0", owner],
                    )
                };
                let release = |g: &mut Self, token: &str, owner: &str| {
                    let keys = [
                        LOCK[0], LOCK[2], LOCK[3], LOCK[4], LOCK[5], LOCK[1], LOCK[6],
                    ];
                    g.call(
                        "RELEASE",
                        &RELEASE,
                        &keys,
                        &[token, "g1", "200", grace, "0", ttl, owner],
                    )
                };
                steps.push(acquire(self, "t1", owner));
                steps.push(acquire(self, "t2", owner));
                steps.push(acquire(self, "t3", "o3"));
                steps.push(self.call("EXTEND", &EXTEND, &[LOCK[0], LOCK[6]], &["t1", ttl]));
                steps.push(release(self, "t2", owner));
                steps.push(release(self, "t1", "o3"));
                steps.push(release(self, "t1", owner));
            }
        }
        steps
    }

    /// A plain command on keys of the shared set, now and then a malformed one.
    pub(super) fn plain(&mut self) -> (Vec<String>, Rule) {
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
            0 => (s(&["GET", &k]), Rule::Text),
            1 => (s(&["MGET", &k, &k2]), Rule::Text),
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
                let mut scores = false;
                for opt in ["REV", "WITHSCORES", "BYSCORE", "LIMIT"] {
                    if self.chance(15) {
                        c.push(opt.into());
                        scores |= opt == "WITHSCORES";
                        if opt == "LIMIT" {
                            c.extend(["0".into(), "2".into()]);
                        }
                    }
                }
                // A script may have used `z` in a role of its own (a semaphore), scoring
                // its members by the clock: scores are then timestamps, within the
                // tolerance.
                (c, if scores { Rule::Text } else { Rule::Exact })
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
    pub(super) fn probe(&mut self) -> (Vec<String>, Rule) {
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

pub(super) fn to_command(args: &[String]) -> Command {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// A readable form of a command for the report (scripts by name, bodies shortened).
pub(super) fn describe(args: &[String], script: Option<&str>) -> String {
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

pub(super) fn s(text: &str) -> String {
    text.to_owned()
}

/// A step sending one command on `who` (`script` names the script whose body is its
/// second argument, for the report).
pub(super) fn send(who: usize, args: &[String], script: Option<&str>, rule: Rule) -> Step {
    Step::Send {
        who,
        label: describe(args, script),
        commands: vec![(to_command(args), rule)],
        fallback: None,
    }
}

/// A step calling a real script on A, by `EVALSHA` (then by `EVAL` if the model answers
/// `NOSCRIPT`, as the client does) or by `EVAL`.
pub(super) fn script_call(
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
