//! Routes the library's `log` records to a C callback (`lock_set_log_callback`).
//!
//! One [`log::Log`] implementation is installed in the process the first time a callback
//! is set. It forwards each record at or above the caller's level to the callback, counted
//! in flight while it runs; `lock_set_log_callback` waits until none of the previous
//! callback's calls is in flight (new calls go to the new one, so the wait ends), so once
//! it returns, the previous callback is never called again and its `user_data` may be
//! freed.
//!
//! No lock is held while the callback runs: a callback may wait for something the thread
//! that forks holds (Python's GIL), and the lock of the count is held across `fork()` (see
//! [`crate::process`]). The calls in flight at a fork are the parent's: a forked child does
//! not wait for them.

use std::cell::Cell;
use std::ffi::{CString, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use log::{Level, LevelFilter, Log, Metadata, Record};

use super::status::{Failure, LOCK_ERR_INTERNAL};

/// Log level: errors (a renewal thread panicked, fork detection unavailable).
pub const LOCK_LOG_ERROR: i32 = 1;
/// Log level: warnings (a renewal failed and is retried, a lock was lost with nobody told,
/// a release on drop failed, a server may evict locks).
pub const LOCK_LOG_WARN: i32 = 2;
/// Log level: notable events (a lost lock that its owner was told about, a Sentinel
/// failover seen).
pub const LOCK_LOG_INFO: i32 = 3;
/// Log level: details for debugging (retries of waits, dropped idle connections, slot
/// map refreshes).
pub const LOCK_LOG_DEBUG: i32 = 4;
/// Log level: everything, including the TLS library's tracing.
pub const LOCK_LOG_TRACE: i32 = 5;

/// Receives one log record: `level` is one of `LOCK_LOG_ERROR` ... `LOCK_LOG_TRACE`,
/// `target` the part of the library that wrote it (`"redlease::renewal"`, ...), `message`
/// the text (no trailing newline); both strings are NUL-terminated UTF-8, valid only during
/// the call. Runs on whichever thread logs: a renewal thread, or one of your threads inside
/// a call into this library, possibly while the library holds internal locks. So it must
/// be quick, must not block on a lock that one of your threads may hold while calling the
/// library, and must not call any function of this library except `lock_status_name` and
/// `lock_version` (`lock_set_log_callback` from inside it fails with
/// `LOCK_ERR_ARGUMENT`).
pub type lock_log_cb = Option<
    unsafe extern "C" fn(
        level: i32,
        target: *const c_char,
        message: *const c_char,
        user_data: *mut c_void,
    ),
>;

/// The caller's callback with its `user_data` and level.
struct Sink {
    callback: unsafe extern "C" fn(i32, *const c_char, *const c_char, *mut c_void),
    user_data: *mut c_void,
    max: LevelFilter,
    /// Calls of this callback running now (changed only under [`ROUTE`]'s lock).
    in_flight: AtomicUsize,
}

// SAFETY: `user_data` is only handed back to the caller's callback; the header tells the
// caller that the callback runs on any thread that logs.
unsafe impl Send for Sink {}
// SAFETY: as for Send; the callback and `user_data` are never changed once set, the count
// is atomic.
unsafe impl Sync for Sink {}

/// The current sink, and the process ([`crate::process::generation`]) that counted its
/// calls in flight.
struct Route {
    sink: Option<Arc<Sink>>,
    generation: u64,
}

static ROUTE: Mutex<Route> = Mutex::new(Route {
    sink: None,
    generation: 0,
});

/// Signalled when a call in flight ends.
static ENDED: Condvar = Condvar::new();

/// The route, locked (held only for bookkeeping, never while a callback runs). In a forked
/// child, the calls counted in flight were the parent's threads': none is in flight here.
fn route() -> MutexGuard<'static, Route> {
    let mut route = ROUTE.lock().unwrap_or_else(PoisonError::into_inner);
    let current = crate::process::generation();
    if route.generation != current {
        route.generation = current;
        if let Some(sink) = &route.sink {
            sink.in_flight.store(0, Ordering::Relaxed);
        }
    }
    route
}

/// The route's lock, held across `fork()` (see [`crate::process`]).
fn hold_for_fork() -> Vec<Box<dyn std::any::Any>> {
    vec![Box::new(
        ROUTE.lock().unwrap_or_else(PoisonError::into_inner),
    )]
}

/// One call of `sink` in flight, counted until dropped.
struct InFlight {
    sink: Arc<Sink>,
    generation: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let route = route();
        if route.generation == self.generation {
            self.sink.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        drop(route);
        ENDED.notify_all();
    }
}

/// Whether the process's `log` logger is ours (set once, on the first call).
static INSTALLED: OnceLock<bool> = OnceLock::new();

thread_local! {
    /// Set on a thread while it runs the callback: a record logged from inside it is
    /// dropped, and `lock_set_log_callback` refused, rather than deadlocking.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

struct Bridge;

static BRIDGE: Bridge = Bridge;

impl Log for Bridge {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        route()
            .sink
            .as_ref()
            .is_some_and(|s| metadata.level() <= s.max)
    }

    fn log(&self, record: &Record<'_>) {
        if in_callback() {
            return;
        }
        let call = {
            let route = route();
            let Some(sink) = route.sink.clone() else {
                return;
            };
            if record.level() > sink.max {
                return;
            }
            sink.in_flight.fetch_add(1, Ordering::Relaxed);
            InFlight {
                sink,
                generation: route.generation,
            }
        };
        let sink = &call.sink;
        let message = c_string(record.args().to_string());
        let target = c_string(record.target().to_owned());
        let _flag = CallbackFlag::set();
        // SAFETY: the caller of lock_set_log_callback promised a function callable from any
        // thread with these arguments; both strings live until the call returns, and the
        // call is counted in flight, which keeps a replacing lock_set_log_callback from
        // returning (so the caller's `user_data` stays valid) until it ends.
        unsafe {
            (sink.callback)(
                level_code(record.level()),
                target.as_ptr(),
                message.as_ptr(),
                sink.user_data,
            )
        };
    }

    fn flush(&self) {}
}

fn in_callback() -> bool {
    IN_CALLBACK.try_with(Cell::get).unwrap_or(true)
}

/// Marks this thread as running the callback until dropped.
struct CallbackFlag;

impl CallbackFlag {
    fn set() -> Self {
        let _ = IN_CALLBACK.try_with(|f| f.set(true));
        CallbackFlag
    }
}

impl Drop for CallbackFlag {
    fn drop(&mut self) {
        let _ = IN_CALLBACK.try_with(|f| f.set(false));
    }
}

fn c_string(text: String) -> CString {
    CString::new(text).unwrap_or_else(|e| {
        CString::new(e.into_vec().escape_ascii().to_string()).unwrap_or_default()
    })
}

fn level_code(level: Level) -> i32 {
    match level {
        Level::Error => LOCK_LOG_ERROR,
        Level::Warn => LOCK_LOG_WARN,
        Level::Info => LOCK_LOG_INFO,
        Level::Debug => LOCK_LOG_DEBUG,
        Level::Trace => LOCK_LOG_TRACE,
    }
}

fn level_filter(code: i32) -> Option<LevelFilter> {
    Some(match code {
        LOCK_LOG_ERROR => LevelFilter::Error,
        LOCK_LOG_WARN => LevelFilter::Warn,
        LOCK_LOG_INFO => LevelFilter::Info,
        LOCK_LOG_DEBUG => LevelFilter::Debug,
        LOCK_LOG_TRACE => LevelFilter::Trace,
        _ => return None,
    })
}

/// Sets (or, with `callback` None, clears) the destination of the library's records.
pub(crate) fn set_callback(
    min_level: i32,
    callback: lock_log_cb,
    user_data: *mut c_void,
) -> Result<(), Failure> {
    if in_callback() {
        return Err(Failure::argument(
            "lock_set_log_callback was called from inside the log callback",
        ));
    }
    let sink = match callback {
        None => None,
        Some(callback) => {
            let max = level_filter(min_level).ok_or_else(|| {
                Failure::argument(format!(
                    "min_level {min_level} is not a level: use LOCK_LOG_ERROR (1) to \
                     LOCK_LOG_TRACE (5)"
                ))
            })?;
            Some(Sink {
                callback,
                user_data,
                max,
                in_flight: AtomicUsize::new(0),
            })
        }
    };
    let ours = *INSTALLED.get_or_init(|| log::set_logger(&BRIDGE).is_ok());
    if !ours {
        return Err(Failure::new(
            LOCK_ERR_INTERNAL,
            "another `log` logger is already installed in this process (by the program that \
             links redlease as a Rust crate): the library's records go to it, not to a \
             callback",
        ));
    }
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    crate::process::hold_across_fork_once(&REGISTERED, hold_for_fork);
    let max = sink.as_ref().map_or(LevelFilter::Off, |s| s.max);
    let mut route = route();
    let previous = std::mem::replace(&mut route.sink, sink.map(Arc::new));
    // Waits for the previous callback's calls in flight: after this, it is never called.
    if let Some(previous) = previous {
        while previous.in_flight.load(Ordering::Relaxed) > 0 {
            route = ENDED.wait(route).unwrap_or_else(PoisonError::into_inner);
        }
    }
    drop(route);
    log::set_max_level(max);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_match_the_log_crate_order() {
        for (code, level) in [
            (LOCK_LOG_ERROR, Level::Error),
            (LOCK_LOG_WARN, Level::Warn),
            (LOCK_LOG_INFO, Level::Info),
            (LOCK_LOG_DEBUG, Level::Debug),
            (LOCK_LOG_TRACE, Level::Trace),
        ] {
            assert_eq!(level_code(level), code);
            assert_eq!(level_filter(code), Some(level.to_level_filter()));
        }
        assert_eq!(level_filter(0), None);
        assert_eq!(level_filter(6), None);
    }

    #[test]
    fn a_message_with_a_nul_survives() {
        assert_eq!(c_string("a\0b".into()).to_str().unwrap(), "a\\x00b");
    }
}
