//! Routes the library's `log` records to a C callback (`lock_set_log_callback`).
//!
//! One [`log::Log`] implementation is installed in the process the first time a callback
//! is set. It forwards each record at or above the caller's level to the callback, under a
//! read lock that `lock_set_log_callback` takes for writing: once that call returns, the
//! previous callback is never called again, so its `user_data` may be freed.

use std::cell::Cell;
use std::ffi::{CString, c_char, c_void};
use std::sync::{OnceLock, PoisonError, RwLock};

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
}

// SAFETY: `user_data` is only handed back to the caller's callback; the header tells the
// caller that the callback runs on any thread that logs.
unsafe impl Send for Sink {}
// SAFETY: as for Send; the sink is never mutated while shared (it is replaced whole under
// the write lock).
unsafe impl Sync for Sink {}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

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
        let sink = SINK.read().unwrap_or_else(PoisonError::into_inner);
        sink.as_ref().is_some_and(|s| metadata.level() <= s.max)
    }

    fn log(&self, record: &Record<'_>) {
        if in_callback() {
            return;
        }
        let sink = SINK.read().unwrap_or_else(PoisonError::into_inner);
        let Some(sink) = sink.as_ref() else { return };
        if record.level() > sink.max {
            return;
        }
        let message = c_string(record.args().to_string());
        let target = c_string(record.target().to_owned());
        let _flag = CallbackFlag::set();
        // SAFETY: the caller of lock_set_log_callback promised a function callable from any
        // thread with these arguments; both strings live until the call returns, and the
        // read lock keeps the sink (and the caller's `user_data`) current during it.
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
    let max = sink.as_ref().map_or(LevelFilter::Off, |s| s.max);
    // Waits for callbacks in flight: after this, the previous callback is never called.
    *SINK.write().unwrap_or_else(PoisonError::into_inner) = sink;
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
