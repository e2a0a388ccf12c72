//! The one place that takes the crate's synchronisation primitives: mutexes, condition
//! variables, read-write locks, atomics and threads.
//!
//! A panic while a lock is held poisons it; every lock of this crate guards state that
//! stays consistent at each statement (a panic is caught at the renewal thread's and the C
//! boundary's edge), so poisoning is ignored here, once, instead of at every call site.
//!
//! With the cargo feature `shuttle` (for the tests of `src/races`, never for a shipped
//! library) the same names are the [shuttle](https://docs.rs/shuttle) crate's, whose
//! scheduler then picks every interleaving; without it they are std's. Shuttle has no
//! timers, so under it a timed wait ([`wait_timeout`]) is simulated on a virtual clock
//! ([`now`]): the code that measures such a wait reads [`now`], not `Instant::now()`.

use std::time::{Duration, Instant};

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{
    Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak, atomic,
};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::thread;
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak, atomic,
};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::thread;

/// Locks `mutex`, whether or not a panic poisoned it.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads `lock`, whether or not a panic poisoned it.
pub(crate) fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

/// Writes `lock`, whether or not a panic poisoned it.
pub(crate) fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `condvar`, whether or not a panic poisoned its mutex.
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// Waits on `condvar` for at most `timeout`, whether or not a panic poisoned its mutex.
///
/// Under shuttle, a wait shorter than the virtual clock's horizon (a second, unless a test
/// moves it: see `virtual_clock::set_horizon`) is a timer the code counts on: it lets the
/// other threads run (holding the mutex), then times out, with [`now`] moved on by
/// `timeout` (a notification that would have ended it early goes unseen). A longer one (an
/// idle thread's) is taken to outlast the test: it ends only when notified, so a
/// notification that never comes shows as a deadlock.
#[cfg(not(feature = "shuttle"))]
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    condvar
        .wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner())
        .0
}

/// See the other `wait_timeout`: shuttle's condition variables never time out, so the
/// timeout is simulated on the virtual clock.
#[cfg(feature = "shuttle")]
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    if timeout >= virtual_clock::horizon() {
        return wait(condvar, guard);
    }
    thread::yield_now();
    virtual_clock::advance(timeout);
    guard
}

/// The monotonic clock for code whose timing a timed wait ([`wait_timeout`]) drives:
/// `Instant::now()`, or under shuttle the virtual clock, which moves only when a timed
/// wait times out (so a schedule replays the same whatever the machine's speed).
#[cfg(not(feature = "shuttle"))]
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// See the other `now`: the virtual clock.
#[cfg(feature = "shuttle")]
pub(crate) fn now() -> Instant {
    virtual_clock::now()
}

/// The virtual clock of shuttle runs. All the threads of one shuttle execution run on the
/// one OS thread that runs the test, so a thread-local of that OS thread is one clock for
/// the whole execution; tests call [`reset`](virtual_clock::reset) at the start of each.
#[cfg(feature = "shuttle")]
pub(crate) mod virtual_clock {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    /// The default horizon: timed waits shorter than this time out.
    const HORIZON: Duration = Duration::from_secs(1);

    std::thread_local! {
        static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
        static HORIZON_NOW: Cell<Duration> = const { Cell::new(HORIZON) };
    }

    /// Timed waits at least this long wait for a notification instead of timing out.
    pub(crate) fn horizon() -> Duration {
        HORIZON_NOW.with(Cell::get)
    }

    /// Sets the [`horizon`] for the rest of the execution (`Duration::MAX`: every timed
    /// wait times out, idle threads' too).
    #[cfg(test)]
    pub(crate) fn set_horizon(horizon: Duration) {
        HORIZON_NOW.with(|h| h.set(horizon));
    }

    /// The virtual time: where the last [`reset`] set it, plus every timeout since.
    pub(crate) fn now() -> Instant {
        NOW.with(|now| match now.get() {
            Some(at) => at,
            None => {
                let at = Instant::now();
                now.set(Some(at));
                at
            }
        })
    }

    /// Moves the virtual time on by `by`.
    pub(crate) fn advance(by: Duration) {
        let at = now() + by;
        NOW.with(|now| now.set(Some(at)));
    }

    /// Starts the virtual time again from the real time, with the default horizon: each
    /// execution starts alike.
    #[cfg(test)]
    pub(crate) fn reset() {
        NOW.with(|now| now.set(Some(Instant::now())));
        HORIZON_NOW.with(|h| h.set(HORIZON));
    }
}
