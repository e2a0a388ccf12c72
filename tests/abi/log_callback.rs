//! Changing the C log callback while it runs: `lock_set_log_callback` returns only once
//! no call of the callback it replaces is in flight, the last one set is the one called,
//! and a forked child (with or without the fork handlers) counts only its own calls.
//!
//! The callback is process-wide: each test here (and the packaging one that sets it) holds
//! [`ONE_AT_A_TIME`]. The callbacks act only on records of [`TARGET`], so that records of
//! other tests' threads cannot set them off.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redlease::ffi::*;

use crate::support::exit_status;

/// Held by every test that sets the log callback.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The log target of this file's records.
const TARGET: &str = "log-callback-test";

pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ours(target: *const c_char) -> bool {
    // SAFETY: a NUL-terminated string valid during the call.
    unsafe { CStr::from_ptr(target) }.to_bytes() == TARGET.as_bytes()
}

fn set(level: i32, callback: lock_log_cb) -> i32 {
    // SAFETY: this file's callbacks are callable from any thread and use no user_data.
    unsafe { lock_set_log_callback(level, callback, std::ptr::null_mut()) }
}

/// Polls `what` for up to 5 s.
fn within_5s(what: impl Fn() -> bool) -> bool {
    crate::support::eventually(Duration::from_secs(5), what)
}

/// A callback that, for this file's records, counts its calls and then blocks until
/// [`Gate::open`].
struct Gate {
    entered: AtomicUsize,
    open: AtomicBool,
}

impl Gate {
    const fn new() -> Gate {
        Gate {
            entered: AtomicUsize::new(0),
            open: AtomicBool::new(false),
        }
    }

    fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Logs one record from a new thread and waits until it is inside the callback.
    fn occupy(&self) -> std::thread::JoinHandle<()> {
        let call = std::thread::spawn(|| log::warn!(target: TARGET, "held in the callback"));
        assert!(
            within_5s(|| self.entered.load(Ordering::SeqCst) == 1),
            "the callback was not called"
        );
        call
    }
}

/// Two calls race to change the callback: the first (to none) waits for a call of the
/// callback it replaces; meanwhile the second sets a new one. Once both returned, records
/// reach the second's callback, the one set last.
#[test]
fn the_callback_set_last_gets_the_records_when_two_changes_race() {
    let _one = one_at_a_time();
    static GATE: Gate = Gate::new();
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    unsafe extern "C" fn blocking(_: i32, target: *const c_char, _: *const c_char, _: *mut c_void) {
        if ours(target) {
            GATE.pass();
        }
    }
    unsafe extern "C" fn collect(
        _: i32,
        target: *const c_char,
        message: *const c_char,
        _: *mut c_void,
    ) {
        if ours(target) {
            // SAFETY: a NUL-terminated string valid during the call.
            let message = unsafe { CStr::from_ptr(message) }
                .to_string_lossy()
                .into_owned();
            SEEN.lock().unwrap().push(message);
        }
    }
    assert_eq!(set(LOCK_LOG_WARN, Some(blocking)), LOCK_OK);
    let call = GATE.occupy();
    let clear = std::thread::spawn(|| set(LOCK_LOG_WARN, None));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !clear.is_finished(),
        "the change returned while a call of the callback it replaces was in flight"
    );
    assert_eq!(set(LOCK_LOG_TRACE, Some(collect)), LOCK_OK);
    GATE.open();
    assert_eq!(clear.join().unwrap(), LOCK_OK);
    call.join().unwrap();
    log::warn!(target: TARGET, "after both changes returned");
    let seen = SEEN.lock().unwrap().clone();
    let max = log::max_level();
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert!(
        seen.iter().any(|m| m == "after both changes returned"),
        "the callback set last got {seen:?} (log max level {max:?})"
    );
}

/// A child made without the fork handlers (`_Fork()`, a raw `fork` system call) while a
/// thread of its parent is inside the callback: that call is not the child's, so the
/// child's change of the callback returns at once.
#[test]
fn a_child_forked_without_the_fork_handlers_changes_the_callback_at_once() {
    let _one = one_at_a_time();
    static GATE: Gate = Gate::new();
    unsafe extern "C" fn blocking(_: i32, target: *const c_char, _: *const c_char, _: *mut c_void) {
        if ours(target) {
            GATE.pass();
        }
    }
    assert_eq!(set(LOCK_LOG_WARN, Some(blocking)), LOCK_OK);
    let call = GATE.occupy();
    // SAFETY: a raw fork; the child calls only the library and _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    if pid == 0 {
        let rc = set(LOCK_LOG_WARN, None);
        // SAFETY: ends the child without running its parent's destructors.
        unsafe { libc::_exit(i32::from(rc != LOCK_OK)) }
    }
    assert!(pid > 0, "fork failed");
    let status = exit_status(pid, Duration::from_secs(5));
    GATE.open();
    call.join().unwrap();
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert_eq!(
        status,
        Some(0),
        "None: the child's change waited for its parent's call in flight"
    );
}

/// A callback that forks (with the fork handlers): in the child, the forking thread is
/// still inside the callback, so a change of the callback on another thread of the child
/// waits until that call returns.
#[test]
fn a_callback_that_forks_is_still_in_flight_in_the_child() {
    let _one = one_at_a_time();
    /// 0 not run, 1 the child's change waited, 2 it returned early, 3 the child failed.
    static CHILD: AtomicI32 = AtomicI32::new(0);
    static CHANGED: AtomicBool = AtomicBool::new(false);
    unsafe extern "C" fn forking(_: i32, target: *const c_char, _: *const c_char, _: *mut c_void) {
        if !ours(target) {
            return;
        }
        // SAFETY: fork; the child below calls the library, starts one thread and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            std::thread::spawn(|| {
                set(LOCK_LOG_WARN, None);
                CHANGED.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(500));
            let early = CHANGED.load(Ordering::SeqCst);
            // SAFETY: ends the child (its thread may still wait, as it should).
            unsafe { libc::_exit(i32::from(early)) }
        }
        let result = match exit_status(pid, Duration::from_secs(10)) {
            Some(0) => 1,
            Some(1) => 2,
            _ => 3,
        };
        CHILD.store(result, Ordering::SeqCst);
    }
    assert_eq!(set(LOCK_LOG_WARN, Some(forking)), LOCK_OK);
    log::warn!(target: TARGET, "fork from inside the callback");
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert_eq!(
        CHILD.load(Ordering::SeqCst),
        1,
        "2: in the child, the change returned while the forking thread was still inside \
         the callback; 3: the child failed or hung; 0: the callback was not called"
    );
}

/// Four threads change the callback 1,200 times while three others log: once the final
/// change (to none) returned, no call of a replaced callback runs or starts, the log level
/// is off, and a callback set afterwards gets the records at its level.
#[test]
fn a_replaced_callback_is_never_called_once_racing_changes_returned() {
    let _one = one_at_a_time();
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static LAST_SEEN: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn counting(_: i32, target: *const c_char, _: *const c_char, _: *mut c_void) {
        if ours(target) {
            RUNNING.fetch_add(1, Ordering::SeqCst);
            CALLS.fetch_add(1, Ordering::SeqCst);
            std::thread::yield_now();
            RUNNING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    unsafe extern "C" fn last(level: i32, target: *const c_char, _: *const c_char, _: *mut c_void) {
        if ours(target) && level == LOCK_LOG_TRACE {
            LAST_SEEN.fetch_add(1, Ordering::SeqCst);
        }
    }
    /// Ends the loggers when the test ends, also when an assertion fails.
    struct StopOnDrop(std::sync::Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop_loggers = StopOnDrop(stop.clone());
    let loggers: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    log::warn!(target: TARGET, "w");
                    log::trace!(target: TARGET, "t");
                }
            })
        })
        .collect();
    let setters: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                for n in 0..300 {
                    let level = if (i + n) % 2 == 0 {
                        LOCK_LOG_WARN
                    } else {
                        LOCK_LOG_TRACE
                    };
                    let cb: lock_log_cb = if n % 7 == 0 { None } else { Some(counting) };
                    assert_eq!(set(level, cb), LOCK_OK);
                }
            })
        })
        .collect();
    for s in setters {
        s.join().unwrap();
    }
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert_eq!(
        RUNNING.load(Ordering::SeqCst),
        0,
        "a call of a replaced callback ran after the change returned"
    );
    let calls = CALLS.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        calls,
        "called after being turned off"
    );
    assert_eq!(log::max_level(), log::LevelFilter::Off);
    assert_eq!(set(LOCK_LOG_TRACE, Some(last)), LOCK_OK);
    assert_eq!(log::max_level(), log::LevelFilter::Trace);
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        LAST_SEEN.load(Ordering::SeqCst) > 0
    }));
    drop(stop_loggers);
    for l in loggers {
        l.join().unwrap();
    }
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
}
