//! Status codes, this thread's last error message, and the panic boundary.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, ErrorKind};

/// Done.
pub const LOCK_OK: i32 = 0;
/// Acquire: the wait ended while another owner held the lock (for a semaphore: while no
/// permit was free; for a read-write lock: while that side was unavailable).
pub const LOCK_BUSY: i32 = 1;
/// Release or extend: the key no longer holds this lock's token (the lease ended or another
/// owner took it), or the lock was already lost (a loss is final, even while the key still
/// holds the token for a moment after its local deadline), or the call came from a forked
/// child.
pub const LOCK_NOT_HELD: i32 = 2;
/// Acquire: a blocked wait was cancelled on purpose (`lock_cancel`, `lock_cancel_all`, or an
/// interrupt callback that asked for it); never by a stray signal. Nothing is held.
pub const LOCK_CANCELLED: i32 = 3;
/// A NULL pointer, an empty, over-long or reserved key, a ttl under 10 ms, bad UTF-8, a bad
/// URL or option, a semaphore of 0 permits, an unknown read-write side, or a kind of lock
/// other than a mutex asked of a Redlock client.
/// Nothing was sent to Redis.
pub const LOCK_ERR_ARGUMENT: i32 = -1;
/// An unknown, released or closed handle.
pub const LOCK_ERR_HANDLE: i32 = -2;
/// Redis unreachable, connection dropped, or an I/O timeout.
pub const LOCK_ERR_CONNECTION: i32 = -3;
/// The server answered with an error (NOAUTH, READONLY, OOM, ...).
pub const LOCK_ERR_REDIS: i32 = -4;
/// A bug: a Rust panic caught at the boundary, or the OS refused a thread.
pub const LOCK_ERR_INTERNAL: i32 = -5;
/// Too few replicas acknowledged the write (`min_replicas`): the acquire was rolled back.
pub const LOCK_ERR_REPLICATION: i32 = -6;

/// `cause` of `lock_error_info_t`: nothing more to say (also after `LOCK_OK`).
pub const LOCK_CAUSE_NONE: i32 = 0;
/// `cause`: no reply (or no connection, or no pooled connection) in time.
pub const LOCK_CAUSE_TIMEOUT: i32 = 1;
/// `cause`: the connection failed: refused, unreachable, closed by the server, or broken
/// while a request was out (`outcome_unknown` tells which).
pub const LOCK_CAUSE_CONNECTION: i32 = 2;

/// What this thread's last call ended with, beyond its status: fill with
/// `lock_last_error_info(&info, sizeof info)`. A later version may add fields at the end.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lock_error_info_t {
    /// `sizeof` the struct, as the caller passed it.
    pub size: usize,
    /// The last call's status.
    pub status: i32,
    /// A request was sent whose reply never came: it may have run on the server. After an
    /// acquire, the library tried to give back what it may have taken (at worst it lapses
    /// after its lease); after a release, the lock may or may not be released yet.
    pub outcome_unknown: bool,
    /// `LOCK_CAUSE_TIMEOUT`, `LOCK_CAUSE_CONNECTION`, or `LOCK_CAUSE_NONE`.
    pub cause: i32,
}

/// An error on its way to C: a status, a message, and what more it knows.
pub(crate) struct Failure {
    pub status: i32,
    pub message: String,
    pub outcome_unknown: bool,
    pub cause: i32,
}

impl Failure {
    pub fn new(status: i32, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
            outcome_unknown: false,
            cause: LOCK_CAUSE_NONE,
        }
    }

    pub fn argument(message: impl Into<String>) -> Self {
        Failure::new(LOCK_ERR_ARGUMENT, message)
    }

    pub fn handle(what: &str) -> Self {
        Failure::new(
            LOCK_ERR_HANDLE,
            format!("unknown, released or closed {what} handle"),
        )
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match e.kind() {
            ErrorKind::Busy => LOCK_BUSY,
            ErrorKind::NotHeld => LOCK_NOT_HELD,
            ErrorKind::Cancelled => LOCK_CANCELLED,
            ErrorKind::Connection | ErrorKind::Timeout => LOCK_ERR_CONNECTION,
            ErrorKind::Server => LOCK_ERR_REDIS,
            ErrorKind::Replication => LOCK_ERR_REPLICATION,
            ErrorKind::InvalidArgument => LOCK_ERR_ARGUMENT,
            _ => LOCK_ERR_INTERNAL,
        };
        let cause = match e.kind() {
            ErrorKind::Timeout => LOCK_CAUSE_TIMEOUT,
            ErrorKind::Connection => LOCK_CAUSE_CONNECTION,
            _ => LOCK_CAUSE_NONE,
        };
        Failure {
            outcome_unknown: e.outcome_unknown(),
            cause,
            ..Failure::new(status, e.to_string())
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_INFO: Cell<(i32, bool, i32)> = const { Cell::new((LOCK_OK, false, LOCK_CAUSE_NONE)) };
}

fn set_last_info(status: i32, outcome_unknown: bool, cause: i32) {
    let _ = LAST_INFO.try_with(|i| i.set((status, outcome_unknown, cause)));
}

/// This thread's last call's status, whether its outcome is unknown, and its cause.
pub(crate) fn last_info() -> (i32, bool, i32) {
    LAST_INFO
        .try_with(Cell::get)
        .unwrap_or((LOCK_OK, false, LOCK_CAUSE_NONE))
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // Fails only while the thread is exiting; the message is then of no use anyway.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = text);
}

/// This thread's last message; valid until this thread's next call into the library.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|m| m.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Runs an exported body: a panic becomes `LOCK_ERR_INTERNAL`, a failure its status, and
/// the thread's last error message is set (empty on success).
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Failure>) -> i32 {
    super::hold_tables_across_fork();
    let call = crate::process::ApiCall::enter();
    let mut outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Failure::new(
            LOCK_ERR_INTERNAL,
            format!("internal error (a bug in redlease): {what}"),
        ))
    });
    if call.orphaned() {
        outcome = Err(crate::process::orphaned_error().into());
    }
    drop(call);
    match outcome {
        Ok(()) => {
            set_last_error("");
            set_last_info(LOCK_OK, false, LOCK_CAUSE_NONE);
            LOCK_OK
        }
        Err(failure) => {
            set_last_error(&failure.message);
            set_last_info(failure.status, failure.outcome_unknown, failure.cause);
            failure.status
        }
    }
}

/// The name of a status code, as a static string.
pub(crate) fn status_name(status: i32) -> &'static CStr {
    match status {
        LOCK_OK => c"LOCK_OK",
        LOCK_BUSY => c"LOCK_BUSY",
        LOCK_NOT_HELD => c"LOCK_NOT_HELD",
        LOCK_CANCELLED => c"LOCK_CANCELLED",
        LOCK_ERR_ARGUMENT => c"LOCK_ERR_ARGUMENT",
        LOCK_ERR_HANDLE => c"LOCK_ERR_HANDLE",
        LOCK_ERR_CONNECTION => c"LOCK_ERR_CONNECTION",
        LOCK_ERR_REDIS => c"LOCK_ERR_REDIS",
        LOCK_ERR_INTERNAL => c"LOCK_ERR_INTERNAL",
        LOCK_ERR_REPLICATION => c"LOCK_ERR_REPLICATION",
        _ => c"LOCK_UNKNOWN_STATUS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: last_error never returns NULL and points to a NUL-terminated string.
        unsafe { CStr::from_ptr(last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        let status = boundary(|| panic!("boom"));
        assert_eq!(status, LOCK_ERR_INTERNAL);
        assert!(last().contains("boom"));
        assert_eq!(boundary(|| Ok(())), LOCK_OK);
        assert_eq!(last(), "");
    }

    #[test]
    fn error_kinds_map_to_their_status_codes() {
        let cases = [
            (ErrorKind::Busy, LOCK_BUSY),
            (ErrorKind::NotHeld, LOCK_NOT_HELD),
            (ErrorKind::Cancelled, LOCK_CANCELLED),
            (ErrorKind::Replication, LOCK_ERR_REPLICATION),
            (ErrorKind::Connection, LOCK_ERR_CONNECTION),
            (ErrorKind::Timeout, LOCK_ERR_CONNECTION),
            (ErrorKind::Server, LOCK_ERR_REDIS),
            (ErrorKind::InvalidArgument, LOCK_ERR_ARGUMENT),
            (ErrorKind::Internal, LOCK_ERR_INTERNAL),
        ];
        for (kind, status) in cases {
            assert_eq!(Failure::from(Error::new(kind, "x")).status, status);
            assert_ne!(status_name(status).to_bytes(), b"LOCK_UNKNOWN_STATUS");
        }
    }
}
