//! The runtime's own races, explored by the [shuttle](https://docs.rs/shuttle) scheduler.
//!
//! Built only for `cargo test --features shuttle`: the feature makes [`crate::sync`] hand
//! out shuttle's mutexes, condition variables, atomics and threads, whose every operation is
//! a point where shuttle may switch threads. Each test runs its scenario under many
//! schedules (random ones and PCT ones, which favour the few-preemption bugs that random
//! schedules miss) and checks, in every one, what the runtime promises:
//!
//! - [`gate`]: the lease gate lets one extend or renewal in at a time and none after
//!   `close()` returned, and a close never misses one in flight;
//! - [`batcher`]: the renewal batcher completes every item exactly once unless it was
//!   withdrawn (then never), also when its node goes while items are queued or in flight;
//! - [`release`]: a release that races a batched renewal: no renewal is sent after the
//!   release closed the gate, and the release does not wait for another lock's stalled batch;
//! - [`loss`]: a loss report racing releases of holds and later holds of a reentrant lock:
//!   a hold released before the loss was found is never told, each callback runs at most
//!   once and is dropped (the C ABI's `user_data_free`) exactly once;
//! - [`handles`]: the C ABI's handle table, and its client close racing an acquire and a
//!   release: no handle is issued twice, a removed or forged handle never resolves, and a
//!   lock granted as its client closes is given back exactly once.
//!
//! Nothing here does I/O: where the runtime talks to Redis, a stand-in takes its place at
//! the seam the code already has (a [`Conduit`](crate::backend::batch::Conduit) for the
//! batcher, a [`LockServer`] for a lease).
//!
//! Each test explores [`SCHEDULES`] schedules of each kind; `REDLEASE_SHUTTLE_SCALE=N`
//! multiplies that for a longer run. A failure prints the schedule, which
//! `shuttle::replay` runs again.
//!
//! Shuttle has no timers. Under it a short timed wait (the batcher's gathering) lets the
//! other threads run and then times out, moving a virtual clock on; a long one (an idle
//! thread's) waits for a notification, so a lost wake-up shows as a deadlock (see
//! [`crate::sync::wait_timeout`]). Two of these tests found real races, since fixed: a
//! release during a renewal's hand-over to its batch waited for another lock's stalled
//! batch (`release.rs`), and a batching thread that idled out before its starter queued
//! an item stranded it (`batcher.rs`).

mod batcher;
mod gate;
mod handles;
mod loss;
mod release;

use std::time::{Duration, Instant};

use redis::Value;
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, MaxSteps, Runner};

use crate::backend::batch::{Batcher, Conduit, Item};
use crate::backend::call::{Call, Replicas};
use crate::backend::exec::{Exec, Replies};
use crate::core::acquire::Bounds;
use crate::core::lease::LeaseClock;
use crate::core::reply::{Answer, AttemptReply, ExtendReply, ReleaseReply};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lease::Lease;
use crate::lease::loss::LostCallback;
use crate::protocol::{AttemptRequest, Capabilities, Hold, LockServer, Queued};
use crate::sync::{self, Arc, thread, virtual_clock};

/// Schedules of each kind (random and PCT) a test explores by default.
const SCHEDULES: usize = 2000;

/// Steps one schedule may take: far more than any scenario here needs, so that reaching
/// it means a thread spins for ever (a completion that never comes).
const MAX_STEPS: usize = 50_000;

/// Runs `scenario` under `schedules` random schedules and as many PCT ones (depth 3),
/// times `REDLEASE_SHUTTLE_SCALE`. Panics (failing the test) on the first schedule whose
/// checks fail, that deadlocks, or that runs past [`MAX_STEPS`].
fn explore(schedules: usize, scenario: impl Fn() + Send + Sync + 'static) {
    let scale = std::env::var("REDLEASE_SHUTTLE_SCALE")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let schedules = schedules * scale;
    let scenario = Arc::new(scenario);
    let mut config = Config::new();
    // Shuttle's atomics are not the C++ memory model's: it says so on every run.
    config.silence_warnings = true;
    config.max_steps = MaxSteps::FailAfter(MAX_STEPS);
    let random = scenario.clone();
    Runner::new(RandomScheduler::new(schedules), config.clone()).run(move || {
        virtual_clock::reset();
        random();
    });
    Runner::new(PctScheduler::new(3, schedules), config).run(move || {
        virtual_clock::reset();
        scenario();
    });
}

/// Yields until `done` holds, at most a few thousand times (far more than any scenario
/// here needs while its threads make progress); then fails, saying what never happened.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..5_000 {
        if done() {
            return;
        }
        thread::yield_now();
    }
    panic!("never happened: {what}");
}

/// A node that answers every call with 1, letting the other threads run while the batch
/// is on the wire.
#[derive(Default)]
struct Answers;

impl Conduit for Answers {
    fn run(&self, calls: &[Call], _: &Exec<'_>) -> Result<Replies> {
        thread::yield_now();
        Ok(Replies {
            values: calls.iter().map(|_| Value::Int(1)).collect(),
            sent_at: sync::now(),
        })
    }
}

/// A [`LockServer`] that only queues renewals, in `batcher`, run through `conduit`; every
/// other call fails (nothing in these tests makes one).
struct QueueOnly {
    batcher: Arc<Batcher>,
    conduit: Arc<dyn Conduit>,
}

fn unused<T>() -> Result<T> {
    Err(Error::new(
        ErrorKind::Internal,
        "not part of the race tests' stand-in",
    ))
}

impl LockServer for QueueOnly {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            every_kind: false,
            blocking: false,
            fencing: false,
            replicas: false,
            batching: true,
            inspection: false,
        }
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            pool_wait: Duration::from_secs(1),
            connect: Duration::from_secs(1),
            io: Duration::from_secs(1),
        }
    }

    fn describe(&self) -> &str {
        "race stand-in"
    }

    fn attempt(&self, _: &AttemptRequest<'_>) -> Result<Option<Answer<AttemptReply>>> {
        unused()
    }

    fn extend(
        &self,
        _: Hold<'_>,
        _: Duration,
        _: Option<Replicas>,
        _: &Exec<'_>,
    ) -> Result<Answer<ExtendReply>> {
        unused()
    }

    fn release(&self, _: Hold<'_>, _: Duration, _: bool, _: &Exec<'_>) -> Result<ReleaseReply> {
        unused()
    }

    fn queue_renewal(&self, _: &str, item: Item, _: Instant) -> Result<Queued> {
        let id = Batcher::submit(
            &self.batcher,
            Arc::downgrade(&self.conduit),
            item,
            Duration::from_secs(1),
        )?;
        Ok(Queued {
            batcher: Arc::downgrade(&self.batcher),
            id,
        })
    }

    fn is_locked(&self, _: &LockKeys) -> Result<bool> {
        unused()
    }

    fn ping(&self) -> Result<()> {
        unused()
    }

    fn run(&self, _: &str, _: &[Call], _: &Exec<'_>) -> Result<Replies> {
        unused()
    }

    fn scan(&self, _: &str, _: usize) -> Result<Vec<String>> {
        unused()
    }

    fn close_idle(&self) {}
}

/// A held lease of ten minutes (no deadline passes during a test) under `token`, with the
/// acquire's lost-lock callback `on_lost`.
fn lease(
    server: Arc<dyn LockServer>,
    token: &str,
    on_lost: Option<(String, LostCallback)>,
) -> Arc<Lease> {
    let ttl = Duration::from_secs(600);
    let keys = LockKeys::new("races:", "lock").expect("a valid lock name");
    let clock = LeaseClock::new(ttl, ttl, Instant::now());
    Arc::new(Lease::new(
        server,
        keys,
        token.to_owned(),
        1,
        Kind::Mutex,
        None,
        clock,
        on_lost,
    ))
}
