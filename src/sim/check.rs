//! The promises, checked at every virtual instant of a run and at its end:
//!
//! - **exclusion**: never two callers believing they hold a mutex at once (at most
//!   `permits` for a semaphore; a writer never beside another holder of a read-write lock;
//!   several holds of a reentrant lock only for one owner), unless a server lost its data
//!   (a restart without persistence) after the earlier grant, which the design documents;
//!   a holder that pauses past its lease stops believing at its deadline (its own clock
//!   goes on), so a pause never excuses an overlap;
//! - **fencing**: fencing tokens strictly increase in the order their grants ran on the
//!   server, restarts included;
//! - **bounds**: every call returns within the README's bounds table, by its caller's own
//!   clock (a call that spans a pause of its process is not held to it);
//! - **true outcomes**: a release reported `Ok` gave back a hold that nobody else was
//!   granted since its own grant; an acquire reported `Busy` after a wait ran while the
//!   lock was held by another;
//! - **liveness**, in runs without faults: a free lock with a live waiter is taken within
//!   the waiter's grace;
//! - **clean end**: once every hold is released or expired, nothing but fencing counters
//!   is left on the servers (checked by the world).

use std::time::Duration;

use redis::Value;

use crate::core::acquire::{AcquireSpec, BLOCK_LATENESS};
use crate::core::backoff::Wait;
use crate::kinds::Kind;
use crate::scripts;
use crate::sim::config::{Config, Micros, Name};
use crate::sim::trace::short;

/// Slack for rounding between virtual and local time.
const SLACK: Duration = Duration::from_millis(2);

/// Whether `command` runs `script` (by its SHA1, or by its text after a `NOSCRIPT`).
fn runs(command: &[Vec<u8>], script: &scripts::Lua) -> bool {
    command.get(1).is_some_and(|s| {
        s.as_slice() == script.sha.as_bytes() || s.as_slice() == script.code.as_bytes()
    })
}

/// A caller that believes it holds a lock now.
#[derive(Debug, Clone)]
pub(crate) struct Belief {
    /// Index of the name.
    pub name: usize,
    /// Who it holds for: the token, or a reentrant lock's owner.
    pub owner: String,
    pub token: String,
    /// Not a reader of a read-write lock.
    pub writer: bool,
    pub granted_at: Micros,
}

/// What the checkers remember of a run.
pub(crate) struct Checker {
    /// Per name: the grants the servers made, as they ran (virtual time, token).
    server_grants: Vec<Vec<(Micros, String)>>,
    /// Per name: the grants callers were told of (when they ran, fencing token, token).
    told_grants: Vec<Vec<(Micros, u64, String)>>,
    /// What went wrong, in order.
    failures: Vec<String>,
    bounds: crate::core::acquire::Bounds,
    /// Lock operations done (acquires, extends, releases), for the soak's count.
    pub ops: u64,
    /// How often the run-down paths of locks over several names without renewal ran.
    pub keeps: Keeps,
}

/// How often locks over several names, without renewal, extended a run-down name, started
/// again after one was lost, or gave up (the wait over, cancelled, an extend that failed).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Keeps {
    pub extended: u64,
    pub started_again: u64,
    pub given_up: u64,
}

impl Checker {
    pub fn new(cfg: &Config) -> Checker {
        Checker {
            server_grants: vec![Vec::new(); cfg.names.len()],
            told_grants: vec![Vec::new(); cfg.names.len()],
            failures: Vec::new(),
            bounds: crate::core::acquire::Bounds {
                pool_wait: cfg.pool_wait,
                connect: cfg.connect_timeout,
                io: cfg.io_timeout,
            },
            ops: 0,
            keeps: Keeps::default(),
        }
    }

    fn fail(&mut self, now: Micros, what: String) {
        self.failures
            .push(format!("at {:.3} ms: {what}", now as f64 / 1000.0));
    }

    /// A server ran `commands` and answered `replies`, each when its command ran: the grants
    /// among them are noted (ground truth for the outcome checks).
    pub fn server_replied(
        &mut self,
        names: &[Name],
        commands: &[Vec<Vec<u8>>],
        replies: &[(Value, Micros)],
    ) {
        for (command, (reply, now)) in commands.iter().zip(replies) {
            self.handed_over(names, command, reply, *now);
        }
        let acquires = [
            &*scripts::ACQUIRE,
            &*scripts::ACQUIRE_PERMIT,
            &*scripts::ACQUIRE_RW,
        ];
        for (command, (reply, now)) in commands.iter().zip(replies) {
            if runs(command, &scripts::ACQUIRE_ALL) {
                self.group_replied(names, command, reply, *now);
                continue;
            }
            let is_acquire = acquires.iter().any(|script| runs(command, script));
            let Value::Array(items) = reply else {
                continue;
            };
            if !is_acquire || items.first() != Some(&Value::Int(1)) {
                continue;
            }
            let numkeys: usize = command
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let key = command
                .get(3)
                .map(|k| String::from_utf8_lossy(k).into_owned());
            let token = command
                .get(3 + numkeys)
                .map(|t| String::from_utf8_lossy(t).into_owned());
            if let (Some(key), Some(token)) = (key, token) {
                if let Some(name) = names.iter().position(|n| n.name == key) {
                    self.server_grants[name].push((*now, token));
                }
            }
        }
    }

    /// A release that ran at `now` and handed the lock to a direct waiter: a grant, to the
    /// waiter's token (its reply names it).
    fn handed_over(&mut self, names: &[Name], command: &[Vec<u8>], reply: &Value, now: Micros) {
        let releases = [
            &*scripts::RELEASE,
            &*scripts::RELEASE_PERMIT,
            &*scripts::RELEASE_RW,
        ];
        if !releases.iter().any(|script| runs(command, script)) {
            return;
        }
        let Value::Array(items) = reply else {
            return;
        };
        let (Some(Value::Int(1 | 2)), Some(Value::BulkString(token))) =
            (items.first(), items.get(1))
        else {
            return;
        };
        let key = command
            .get(3)
            .map(|k| String::from_utf8_lossy(k).into_owned());
        if let Some(name) = key.and_then(|k| names.iter().position(|n| n.name == k)) {
            let token = String::from_utf8_lossy(token).into_owned();
            self.server_grants[name].push((now, token));
        }
    }

    /// When a release last handed `name` to `token` (see [`Checker::handed_over`]).
    pub fn handed_at(&self, name: usize, token: &str) -> Option<Micros> {
        self.server_grants[name]
            .iter()
            .rev()
            .find(|(_, t)| t == token)
            .map(|(at, _)| *at)
    }

    /// The acquire-all script ran at `now`: when it took its names, each is a grant.
    fn group_replied(&mut self, names: &[Name], command: &[Vec<u8>], reply: &Value, now: Micros) {
        let Value::Array(items) = reply else {
            return;
        };
        if items.first() != Some(&Value::Int(1)) {
            return;
        }
        let text = |i: usize| {
            command
                .get(i)
                .map(|a| String::from_utf8_lossy(a).into_owned())
        };
        let numkeys: usize = text(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        let flags = text(3 + numkeys + 2).unwrap_or_default();
        for (i, flag) in flags.chars().enumerate() {
            if flag != '0' {
                continue;
            }
            let (Some(key), Some(token)) = (text(3 + 2 * i), text(3 + numkeys + 3 + i)) else {
                continue;
            };
            if let Some(name) = names.iter().position(|n| n.name == key) {
                self.server_grants[name].push((now, token));
            }
        }
    }

    /// A caller was told it holds `name` under `token` (a first hold, not a re-entry), with
    /// `fencing`, granted by a request that ran at `ran_at`.
    pub fn told_granted(&mut self, name: usize, ran_at: Micros, fencing: u64, token: &str) {
        self.told_grants[name].push((ran_at, fencing, token.to_owned()));
    }

    /// An acquire of `spec` took `took` by its caller's clock (which read `started` when it
    /// began); `paused`: its process was paused meanwhile.
    pub fn acquire_took(
        &mut self,
        now: Micros,
        spec: &AcquireSpec,
        started: std::time::Instant,
        took: Duration,
        paused: bool,
    ) {
        self.ops += 1;
        let b = self.bounds;
        let bound = match spec.wait {
            Wait::No => b.pool_wait + b.connect + b.io + spec.replicas,
            Wait::Until(deadline) => {
                deadline.saturating_duration_since(started)
                    + b.connect
                    + b.io
                    + BLOCK_LATENESS
                    + spec.replicas
            }
            Wait::Forever => return,
        };
        if !paused && took > bound + SLACK {
            self.fail(
                now,
                format!(
                    "an acquire of {:?} ({:?}) took {took:?}, over its bound of {bound:?}",
                    spec.key, spec.wait
                ),
            );
        }
    }

    /// A lock over several names waiting as `wait` took `took` by its caller's clock
    /// (which read `started` when it began): its last wait for one name ends within the
    /// wait plus one request's bounds and a block's lateness, and one more attempt follows;
    /// without renewal, its last pass's `extends` of run-down names each add one more.
    pub fn group_took(
        &mut self,
        now: Micros,
        wait: Wait,
        started: std::time::Instant,
        took: Duration,
        extends: u32,
        paused: bool,
    ) {
        self.ops += 1;
        let b = self.bounds;
        let request = b.pool_wait + b.connect + b.io;
        // Without renewal, the last pass extended its run-down names one after the other.
        let extending = extends * request;
        let bound = match wait {
            Wait::No => request + extending,
            Wait::Until(deadline) => {
                deadline.saturating_duration_since(started)
                    + 2 * request
                    + extending
                    + BLOCK_LATENESS
            }
            Wait::Forever => return,
        };
        if !paused && took > bound + SLACK {
            self.fail(
                now,
                format!("a lock over several names ({wait:?}) took {took:?}, over {bound:?}"),
            );
        }
    }

    /// Fails the run: `what` happened at `now`.
    pub fn fail_now(&mut self, now: Micros, what: &str) {
        self.fail(now, what.to_owned());
    }

    /// An extend took `took` from the moment it had its lease's gate (`replicas`: how
    /// long its `WAIT` may take).
    pub fn extend_took(&mut self, now: Micros, took: Duration, replicas: Duration, paused: bool) {
        self.ops += 1;
        let lateness = if replicas.is_zero() {
            Duration::ZERO
        } else {
            BLOCK_LATENESS
        };
        let bound = self.bounds.connect + self.bounds.io + replicas + lateness;
        if !paused && took > bound + SLACK {
            self.fail(now, format!("an extend took {took:?}, over {bound:?}"));
        }
    }

    /// A release of a hold, which ran on the server at `now`, took `took` from the moment
    /// it was sent, and came to `ok`. When it is `Ok`, the hold's lease (`token`, of `kind` on `name`, granted at
    /// `granted_at`) must not have been granted to anyone else since (`exempt`: a server
    /// lost its data since, or the deployment is a quorum).
    #[allow(clippy::too_many_arguments)]
    pub fn released(
        &mut self,
        now: Micros,
        took: Duration,
        paused: bool,
        ok: bool,
        name: usize,
        kind: &Kind,
        token: &str,
        granted_at: Micros,
        exempt: bool,
    ) {
        self.ops += 1;
        let bound = self.bounds.connect + self.bounds.io;
        if !paused && took > bound + SLACK {
            self.fail(now, format!("a release took {took:?}, over {bound:?}"));
        }
        if !ok || exempt || !matches!(kind, Kind::Mutex | Kind::Reentrant(_)) {
            return;
        }
        if let Some((at, other)) = self.server_grants[name]
            .iter()
            .find(|(at, t)| *at > granted_at && *at < now && t != token)
        {
            let what = format!(
                "{} was released with Ok, but the server granted the lock to {} at {:.3} ms, \
                 after this hold's grant at {:.3} ms",
                short(token),
                short(other),
                *at as f64 / 1000.0,
                granted_at as f64 / 1000.0
            );
            self.fail(now, what);
        }
    }

    /// Exclusion among `beliefs`, now.
    pub fn exclusion(
        &self,
        now: Micros,
        names: &[Name],
        beliefs: &[Belief],
        data_lost_at: &[Micros],
    ) -> Result<(), String> {
        if let Some(first) = self.failures.first() {
            return Err(first.clone());
        }
        for (n, name) in names.iter().enumerate() {
            let holders: Vec<&Belief> = beliefs.iter().filter(|b| b.name == n).collect();
            if holders.len() < 2 {
                continue;
            }
            let mut owners: Vec<&str> = holders.iter().map(|b| b.owner.as_str()).collect();
            owners.sort_unstable();
            owners.dedup();
            let writers = holders.iter().filter(|b| b.writer).count();
            let wrong = match &name.kind {
                Kind::Mutex | Kind::Reentrant(_) => owners.len() > 1,
                Kind::Permit(permits) => owners.len() > *permits as usize,
                Kind::Read | Kind::Write => writers > 1 || (writers == 1 && owners.len() > 1),
            };
            if !wrong {
                continue;
            }
            let earliest = holders.iter().map(|b| b.granted_at).min().unwrap_or(0);
            if data_lost_at.iter().any(|t| *t >= earliest) {
                // Losing the server's data lets two holders in: documented.
                continue;
            }
            return Err(format!(
                "at {:.3} ms, {} callers believe they hold {:?} ({:?}): {}",
                now as f64 / 1000.0,
                holders.len(),
                name.name,
                name.kind,
                holders
                    .iter()
                    .map(|b| format!(
                        "{} granted at {:.3} ms{}",
                        short(&b.token),
                        b.granted_at as f64 / 1000.0,
                        if b.writer { "" } else { " (reader)" }
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(())
    }

    /// A name was free on the server from `since` to `now` while a waiter with time left
    /// waited for it all along (runs without faults only).
    pub fn free_while_waited(&mut self, now: Micros, name: &str, since: Micros, grace: Duration) {
        // A block ends at most a server wake-up (100 ms) late, after at most two thirds
        // of the grace; then the attempt runs.
        let bound = grace + BLOCK_LATENESS;
        if Duration::from_micros(now - since) > bound {
            self.fail(
                now,
                format!(
                    "{name:?} was free for {:.3} ms while a waiter waited for it (bound {bound:?})",
                    (now - since) as f64 / 1000.0
                ),
            );
        }
    }

    /// The fencing order, and what failed on the way, at the end of a run.
    pub fn finish(&mut self, names: &[Name], quorum: bool) -> Result<(), String> {
        if let Some(first) = self.failures.first() {
            return Err(first.clone());
        }
        if quorum {
            // Redlock has no fencing tokens (every one is 0).
            return Ok(());
        }
        for (n, grants) in self.told_grants.iter().enumerate() {
            let mut grants = grants.clone();
            grants.sort_by_key(|g| g.0);
            for pair in grants.windows(2) {
                let ((at_a, fence_a, token_a), (at_b, fence_b, token_b)) = (&pair[0], &pair[1]);
                if fence_b <= fence_a && at_b > at_a {
                    return Err(format!(
                        "fencing tokens of {:?} out of order: {} granted at {:.3} ms got \
                         {fence_a}, {} granted later, at {:.3} ms, got {fence_b}",
                        names[n].name,
                        short(token_a),
                        *at_a as f64 / 1000.0,
                        short(token_b),
                        *at_b as f64 / 1000.0
                    ));
                }
            }
        }
        Ok(())
    }
}
