//! The one place that takes std's mutexes and condition variables.
//!
//! A panic while a lock is held poisons it; every lock of this crate guards state that
//! stays consistent at each statement (a panic is caught at the renewal thread's and the C
//! boundary's edge), so poisoning is ignored here, once, instead of at every call site.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

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
