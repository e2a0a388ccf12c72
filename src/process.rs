//! Which process we are in, cheaply: a counter of `fork()`s seen in this address space.
//!
//! Locks, pooled connections and renewal threads belong to the process that made them; a
//! forked child must not use them. Comparing `getpid()` on every call would cost a system
//! call each time, so a `pthread_atfork` child handler bumps a counter instead.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static FORKS: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child_after_fork() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// Identifies the current process among this one and its forked children: equal values
/// mean the same process.
pub(crate) fn generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only touches an atomic, which is
        // async-signal-safe as a fork handler must be.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child_after_fork)) };
        if rc != 0 {
            log::error!("pthread_atfork failed ({rc}): forked children are not detected");
        }
    });
    FORKS.load(Ordering::SeqCst)
}
