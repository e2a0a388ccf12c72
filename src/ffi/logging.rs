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
//! not wait for them, except for the forking thread's own (a callback that forked).

use std::cell::Cell;
use std::ffi::{CString, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use log::{Level, LevelFilter, Log, Metadata, Record};

use super::status::{Failure, LOCK_ERR_INTERNAL};
use crate::process::Process;

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
/// `LOCK_ERR_ARGUMENT`). A callback that forks with `fork()` is still a call in flight in
/// the child, on its thread; one that calls `_Fork()` (no fork handlers) is not, and a
/// change of the callback in that child does not wait for it. Either way, when it returns
/// in the child, the library call it logged from sends nothing more and fails with
/// `LOCK_ERR_INTERNAL`, and a renewal thread it logged from ends.
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

/// The current sink, and the process that counted its calls in flight.
struct Route {
    sink: Option<Arc<Sink>>,
    process: Process,
}

static ROUTE: Mutex<Route> = Mutex::new(Route {
    sink: None,
    process: Process::NONE,
});

/// Signalled when a call in flight ends.
static ENDED: Condvar = Condvar::new();

/// The route, locked (held only for bookkeeping, never while a callback runs), and made
/// the calling process's (see [`Route::adopt`]).
fn route() -> MutexGuard<'static, Route> {
    let mut route = ROUTE.lock().unwrap_or_else(PoisonError::into_inner);
    if !route.process.is_current() {
        route.adopt();
    }
    route
}

impl Route {
    /// Makes the route this (forked) process's: the calls counted in flight were its
    /// parent's threads', none of which is here, except the calling thread's own (a
    /// callback that forked). With the fork handlers this runs on the forking thread
    /// (see [`HeldAcrossFork`]); in a child made by `_Fork()`, on the first thread that
    /// logs or changes the callback, so a callback that calls `_Fork()` is not counted
    /// in the child.
    fn adopt(&mut self) {
        let me = Process::current();
        let mut own = 0;
        let _ = CALL.try_with(|call| {
            if let Some((counted_in, sink)) = call.get()
                && counted_in == self.process
                && self
                    .sink
                    .as_ref()
                    .is_some_and(|s| Arc::as_ptr(s) as usize == sink)
            {
                call.set(Some((me, sink)));
                own = 1;
            }
        });
        self.process = me;
        if let Some(sink) = &self.sink {
            sink.in_flight.store(own, Ordering::Relaxed);
        }
    }
}

/// The route's lock, held across `fork()` (see [`crate::process`]); in the child, the
/// route is adopted on the forking thread as the lock is given back.
struct HeldAcrossFork(MutexGuard<'static, Route>);

impl Drop for HeldAcrossFork {
    fn drop(&mut self) {
        if !self.0.process.is_current() {
            self.0.adopt();
        }
    }
}

fn hold_for_fork() -> Vec<Box<dyn std::any::Any>> {
    vec![Box::new(HeldAcrossFork(
        ROUTE.lock().unwrap_or_else(PoisonError::into_inner),
    ))]
}

/// The calling thread's call of a sink in flight, counted until dropped.
struct InFlight {
    sink: Arc<Sink>,
}

impl InFlight {
    /// Counts a call of `route`'s sink on this thread; `None` without a sink.
    fn start(route: &Route) -> Option<InFlight> {
        let sink = route.sink.clone()?;
        sink.in_flight.fetch_add(1, Ordering::Relaxed);
        let address = Arc::as_ptr(&sink) as usize;
        let _ = CALL.try_with(|call| call.set(Some((route.process, address))));
        Some(InFlight { sink })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counted_in = CALL.try_with(Cell::take).ok().flatten();
        let route = route();
        if counted_in.is_some_and(|(process, _)| process == route.process) {
            self.sink.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        drop(route);
        ENDED.notify_all();
    }
}

/// Whether the process's `log` logger is ours (set once, on the first call).
static INSTALLED: OnceLock<bool> = OnceLock::new();

thread_local! {
    /// Set on a thread while it runs the callback: the process that counted the call and
    /// the sink's address. A record logged from inside the callback is dropped, and
    /// `lock_set_log_callback` refused, rather than deadlocking.
    static CALL: Cell<Option<(Process, usize)>> = const { Cell::new(None) };
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
            if route.sink.as_ref().is_none_or(|s| record.level() > s.max) {
                return;
            }
            let Some(call) = InFlight::start(&route) else {
                return;
            };
            call
        };
        let sink = &call.sink;
        let message = c_string(record.args().to_string());
        let target = c_string(record.target().to_owned());
        // SAFETY: the caller of lock_set_log_callback promised a function callable from any
        // thread with these arguments; both strings live until the call returns, and the
        // call is counted in flight, which keeps a replacing lock_set_log_callback from
        // returning (so the caller's `user_data` stays valid) until it ends.
        crate::process::call_out(|| unsafe {
            (sink.callback)(
                level_code(record.level()),
                target.as_ptr(),
                message.as_ptr(),
                sink.user_data,
            )
        });
    }

    fn flush(&self) {}
}

fn in_callback() -> bool {
    CALL.try_with(|call| call.get().is_some()).unwrap_or(true)
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
    let mut route = route();
    let previous = std::mem::replace(&mut route.sink, sink.map(Arc::new));
    // Waits for the previous callback's calls in flight: after this, it is never called.
    if let Some(previous) = previous {
        while previous.in_flight.load(Ordering::Relaxed) > 0 {
            route = ENDED.wait(route).unwrap_or_else(PoisonError::into_inner);
        }
    }
    // The sink now current, which a call that ran while this one waited may have set.
    log::set_max_level(route.sink.as_ref().map_or(LevelFilter::Off, |s| s.max));
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
