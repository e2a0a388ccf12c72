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

/// The thread whose records the forking callback acts on ([`RENEWAL_THREADS`]: those of
/// every renewal thread).
static FORKING_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const RENEWAL_THREADS: u64 = u64::MAX;
static FORKED_CHILD: AtomicI32 = AtomicI32::new(0);

fn message_of(msg: *const c_char) -> String {
    // SAFETY: a NUL-terminated string valid during the call.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// Forks (once) on [`FORKING_THREAD`] at its first record whose message contains what
/// `user_data` points to (a NUL-terminated string); the child returns into the library.
unsafe extern "C" fn fork_at(_: i32, _: *const c_char, msg: *const c_char, wanted: *mut c_void) {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    if message_of(msg).contains("fork-in-log") {
        eprintln!(
            "DBG rec {:?}: {}",
            std::thread::current().name(),
            message_of(msg)
        );
    }
    // SAFETY: `wanted` is the test's NUL-terminated string, alive while the callback is set.
    let wanted = unsafe { CStr::from_ptr(wanted as *const c_char) }.to_string_lossy();
    let only = FORKING_THREAD.load(Ordering::SeqCst);
    let renewal_thread = std::thread::current().name() == Some("redlease-renew");
    if (if only == RENEWAL_THREADS {
        !renewal_thread
    } else {
        only != me
    }) || !message_of(msg).contains(wanted.as_ref())
        || FORKED_CHILD.load(Ordering::SeqCst) != 0
    {
        return;
    }
    // SAFETY: fork; the child comes back out of the callback into the library.
    let pid = unsafe { libc::fork() };
    if pid > 0 {
        FORKED_CHILD.store(pid, Ordering::SeqCst);
    } else if pid == 0 {
        FORKED_CHILD.store(-1, Ordering::SeqCst);
    }
}

fn fork_at_records_containing(wanted: &'static CStr, thread: u64) {
    FORKING_THREAD.store(thread, Ordering::SeqCst);
    FORKED_CHILD.store(0, Ordering::SeqCst);
    // SAFETY: `fork_at` is callable from any thread; `wanted` is static.
    let rc = unsafe {
        lock_set_log_callback(
            LOCK_LOG_DEBUG,
            Some(fork_at),
            wanted.as_ptr() as *mut c_void,
        )
    };
    assert_eq!(rc, LOCK_OK);
}

/// A log callback that forks while the logging thread is inside `lock_acquire` (checking
/// out a connection, whose dead idle predecessor it logs): the child comes back into its
/// parent's acquire, under its parent's token. It must fail the call without sending the
/// attempt, so that the parent alone holds the lock.
#[test]
fn a_child_forked_in_the_log_callback_does_not_finish_its_parents_acquire() {
    let _one = one_at_a_time();
    let server = crate::support::RedisServer::start();
    let url = std::ffi::CString::new(server.url()).unwrap();
    let mut client: lock_client_t = 0;
    // SAFETY: valid arguments.
    let rc = unsafe { lock_client_open(url.as_ptr(), &mut client) };
    assert_eq!(rc, LOCK_OK);
    // An idle pooled connection, which the server then closes.
    let warm = c"fork-in-log:warm";
    let mut lock: lock_t = 0;
    // SAFETY: valid arguments.
    let rc = unsafe { lock_acquire(client, warm.as_ptr(), 30_000, 0, &mut lock) };
    assert_eq!(rc, LOCK_OK);
    assert_eq!(lock_release(lock), LOCK_OK);
    let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    std::thread::sleep(Duration::from_millis(100));

    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    fork_at_records_containing(c"dead idle connection", me);
    let name = c"fork-in-log:acquire";
    let mut lock: lock_t = 0;
    // SAFETY: valid arguments.
    let rc = unsafe { lock_acquire(client, name.as_ptr(), 30_000, 0, &mut lock) };
    if FORKED_CHILD.load(Ordering::SeqCst) == -1 {
        // The child: 0 when its parent's acquire failed here, 1 when it "acquired".
        let code = match rc {
            LOCK_ERR_INTERNAL => 0,
            LOCK_OK => 1,
            _ => 2,
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    let child = FORKED_CHILD.load(Ordering::SeqCst);
    assert!(
        child > 0,
        "the callback never forked: no dead-connection record"
    );
    assert_eq!(rc, LOCK_OK, "the parent's acquire failed");
    assert_eq!(
        exit_status(child, Duration::from_secs(10)),
        Some(0),
        "the child came back from the callback and did not fail its parent's acquire (1: it \
         reported the lock held)"
    );
    let mut token = [0 as c_char; LOCK_TOKEN_MAX];
    // SAFETY: a buffer of LOCK_TOKEN_MAX bytes.
    let rc = unsafe { lock_token(lock, token.as_mut_ptr(), LOCK_TOKEN_MAX) };
    assert_eq!(rc, LOCK_OK);
    // SAFETY: lock_token wrote a NUL-terminated string.
    let token = unsafe { CStr::from_ptr(token.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        server.get("fork-in-log:acquire").as_deref(),
        Some(token.as_str())
    );
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(server.get("fork-in-log:acquire"), None);
    lock_client_close(client);
}

/// The server whose commands [`fork_and_wait_at_restart`] counts (set by the test using it).
static COUNTED_SERVER: Mutex<Option<std::sync::Arc<crate::support::RedisServer>>> =
    Mutex::new(None);
/// Commands the server ran while the parent waited, inside the callback, for its child.
static RUN_BY_THE_CHILD: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);
static RESTART_CHILD_STATUS: AtomicI32 = AtomicI32::new(-100);

fn counted_commands() -> u64 {
    COUNTED_SERVER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .expect("the counted server")
        .commands_run()
}

/// On [`FORKING_THREAD`], at the first record of a lock set starting again: forks; the
/// child returns into the library, and the parent waits inside the callback until the
/// child has ended, counting the commands the server ran meanwhile (all the child's).
unsafe extern "C" fn fork_and_wait_at_restart(
    _: i32,
    _: *const c_char,
    msg: *const c_char,
    _: *mut c_void,
) {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    if me != FORKING_THREAD.load(Ordering::SeqCst)
        || !message_of(msg).contains("lock_all starts again")
        || FORKED_CHILD.load(Ordering::SeqCst) != 0
    {
        return;
    }
    let before = counted_commands();
    // SAFETY: fork; the child comes back out of the callback into the library.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        FORKED_CHILD.store(-1, Ordering::SeqCst);
        return;
    }
    FORKED_CHILD.store(pid, Ordering::SeqCst);
    let status = exit_status(pid, Duration::from_secs(20));
    RESTART_CHILD_STATUS.store(status.unwrap_or(-99), Ordering::SeqCst);
    RUN_BY_THE_CHILD.store((counted_commands() - before) as i64, Ordering::SeqCst);
}

/// The Redlock client [`take_the_set`] uses.
static SET_CLIENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// What [`take_the_set`] got in the parent: status (-100 before), handles.
static SET_STATUS: AtomicI32 = AtomicI32::new(-100);
static SET_HANDLES: Mutex<[lock_t; 2]> = Mutex::new([0; 2]);

/// A server, a Redlock client of it in [`SET_CLIENT`] (for [`take_the_set`]) and a plain
/// one, by which another owner holds the set's second name for `held_ms`: the set then
/// gives its first name back and starts again, and [`fork_and_wait_at_restart`], set as
/// the log callback, forks there.
fn lock_set_that_starts_again(
    held_ms: u64,
) -> (std::sync::Arc<crate::support::RedisServer>, lock_client_t) {
    let server = std::sync::Arc::new(crate::support::RedisServer::start());
    *COUNTED_SERVER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(server.clone());
    RUN_BY_THE_CHILD.store(-1, Ordering::SeqCst);
    RESTART_CHILD_STATUS.store(-100, Ordering::SeqCst);
    SET_STATUS.store(-100, Ordering::SeqCst);
    FORKED_CHILD.store(0, Ordering::SeqCst);
    let url = std::ffi::CString::new(server.url()).unwrap();
    let urls = [url.as_ptr()];
    let (mut redlock, mut plain): (lock_client_t, lock_client_t) = (0, 0);
    // SAFETY: valid arguments and out-pointers.
    let rc = unsafe { lock_client_open_redlock(urls.as_ptr(), 1, std::ptr::null(), &mut redlock) };
    assert_eq!(rc, LOCK_OK);
    SET_CLIENT.store(redlock, Ordering::SeqCst);
    // SAFETY: valid arguments and out-pointers.
    let rc = unsafe { lock_client_open(url.as_ptr(), &mut plain) };
    assert_eq!(rc, LOCK_OK);
    let opts = options_without_renewal();
    let mut other: lock_t = 0;
    // SAFETY: valid arguments and out-pointers.
    let rc = unsafe {
        lock_acquire_opts(
            plain,
            c"fork-in-log:set:b".as_ptr(),
            held_ms,
            0,
            &opts,
            &mut other,
        )
    };
    assert_eq!(rc, LOCK_OK);
    // SAFETY: the callback is callable from any thread and uses no user_data.
    let rc = unsafe {
        lock_set_log_callback(
            LOCK_LOG_DEBUG,
            Some(fork_and_wait_at_restart),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, LOCK_OK);
    (server, plain)
}

fn options_without_renewal() -> lock_acquire_options_t {
    // SAFETY: all-zero bytes are a valid value of this C struct, which init then fills.
    let mut opts: lock_acquire_options_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid struct of the size given.
    let rc = unsafe { lock_acquire_options_init(&mut opts, std::mem::size_of_val(&opts)) };
    assert_eq!(rc, LOCK_OK);
    opts.renew = false;
    opts
}

/// Takes the set on this thread (whose log records [`fork_and_wait_at_restart`] forks
/// at). In the child: ends it, with 0 when its parent's call failed there with no live
/// handle, 1 when it returned another status, 2 when it failed but left a live handle.
/// In the parent: records the status and handles.
fn take_the_set() {
    // SAFETY: pthread_self has no preconditions.
    FORKING_THREAD.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
    let opts = options_without_renewal();
    let names = [c"fork-in-log:set:a".as_ptr(), c"fork-in-log:set:b".as_ptr()];
    let mut out: [lock_t; 2] = [0; 2];
    let client = SET_CLIENT.load(Ordering::SeqCst);
    // SAFETY: valid arguments and out-pointers.
    let rc = unsafe {
        lock_acquire_all(
            client,
            names.as_ptr(),
            2,
            100,
            5_000,
            &opts,
            out.as_mut_ptr(),
        )
    };
    if FORKED_CHILD.load(Ordering::SeqCst) == -1 {
        let live = out.iter().any(|&lock| {
            let mut held = false;
            // SAFETY: any handle value is accepted; `held` is writable.
            unsafe { lock_is_held(lock, &mut held) == LOCK_OK && held }
        });
        let code = match (rc, live) {
            (LOCK_ERR_INTERNAL, false) => 0,
            (LOCK_ERR_INTERNAL, true) => 2,
            _ => 1,
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    *SET_HANDLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = out;
    SET_STATUS.store(rc, Ordering::SeqCst);
}

/// After [`take_the_set`] in the parent: the child (forked in the log callback, and
/// returned into the set's call) failed it, kept no handle and sent nothing; the parent
/// got the set. Releases it and closes the clients.
fn the_child_did_not_go_on_with_the_set(plain: lock_client_t) {
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert!(
        FORKED_CHILD.load(Ordering::SeqCst) > 0,
        "the callback never forked: the lock set did not start again"
    );
    assert_eq!(
        SET_STATUS.load(Ordering::SeqCst),
        LOCK_OK,
        "the parent's lock_acquire_all"
    );
    let status = RESTART_CHILD_STATUS.load(Ordering::SeqCst);
    let sent = RUN_BY_THE_CHILD.load(Ordering::SeqCst);
    assert_eq!(
        (status, sent),
        (0, 0),
        "the child (exit status, commands the server ran for it): 1 = it did not fail the \
         call, 2 = it kept a live handle"
    );
    let handles = *SET_HANDLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for lock in handles {
        assert_eq!(lock_release(lock), LOCK_OK);
    }
    lock_client_close(SET_CLIENT.load(Ordering::SeqCst));
    lock_client_close(plain);
    COUNTED_SERVER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
}

/// A log callback that forks when a Redlock lock set gives its names back to start again
/// (a name was held elsewhere): the child comes back into its parent's `lock_acquire_all`,
/// whose next round takes the names with nested acquires. The child must send nothing
/// for it, fail it, and get no handle (a nested acquire entered after the callback
/// returned is its parent's call going on, not a call of the child's own).
#[test]
fn a_child_forked_in_the_log_callback_does_not_go_on_with_its_parents_lock_set() {
    let _one = one_at_a_time();
    let (_server, plain) = lock_set_that_starts_again(400);
    take_the_set();
    the_child_did_not_go_on_with_the_set(plain);
}

unsafe extern "C" fn ignore_the_loss(_: lock_t, _: i32, _: *mut c_void) {}

unsafe extern "C" fn take_the_set_when_freed(_: *mut c_void) {
    take_the_set();
}

unsafe extern "C" fn take_the_set_when_lost(_: lock_t, _: i32, _: *mut c_void) {
    take_the_set();
}

/// As above, with the set taken by caller code that `lock_release` runs (a
/// `user_data_free`): a callback that made the call around the fork is not one of the
/// call's own, and the set fails in the child all the same.
#[test]
fn a_lock_set_taken_in_a_user_data_free_does_not_go_on_in_a_child_forked_under_it() {
    let _one = one_at_a_time();
    let (_server, plain) = lock_set_that_starts_again(400);
    let mut opts = options_without_renewal();
    opts.on_lost = Some(ignore_the_loss);
    opts.user_data = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    opts.user_data_free = Some(take_the_set_when_freed);
    let mut outer: lock_t = 0;
    // SAFETY: valid arguments and out-pointers; the callbacks ignore user_data.
    let rc = unsafe {
        lock_acquire_opts(
            plain,
            c"fork-in-log:set:outer".as_ptr(),
            10_000,
            0,
            &opts,
            &mut outer,
        )
    };
    assert_eq!(rc, LOCK_OK);
    assert_eq!(lock_release(outer), LOCK_OK);
    the_child_did_not_go_on_with_the_set(plain);
}

/// As above, with the set taken by a lost-lock callback on a renewal thread.
#[test]
fn a_lock_set_taken_in_an_on_lost_does_not_go_on_in_a_child_forked_under_it() {
    let _one = one_at_a_time();
    let (server, plain) = lock_set_that_starts_again(1_500);
    let mut opts = options_without_renewal();
    opts.renew = true;
    opts.on_lost = Some(take_the_set_when_lost);
    let mut outer: lock_t = 0;
    // SAFETY: valid arguments and out-pointers.
    let rc = unsafe {
        lock_acquire_opts(
            plain,
            c"fork-in-log:set:lost".as_ptr(),
            900,
            0,
            &opts,
            &mut outer,
        )
    };
    assert_eq!(rc, LOCK_OK);
    let _: i64 = server.cmd(&["DEL", "fork-in-log:set:lost"]);
    assert!(
        within_5s(|| SET_STATUS.load(Ordering::SeqCst) != -100),
        "the lost-lock callback never took the set"
    );
    assert_eq!(lock_release(outer), LOCK_NOT_HELD);
    the_child_did_not_go_on_with_the_set(plain);
}

/// A log callback that forks on a renewal thread (its warning that a renewal failed): the
/// child's copy of the thread must not go on renewing its parent's lock, which must then
/// end with its parent (here: abandoned, as by a crash) within its ttl.
#[test]
fn a_renewal_thread_forked_in_the_log_callback_stops_in_the_child() {
    let _one = one_at_a_time();
    let server = crate::support::RedisServer::start();
    let proxy = crate::support::proxy::Proxy::start(server.port);
    let client = redlease::Client::open(&proxy.url()).unwrap();
    let ttl = Duration::from_millis(1500);
    let guard = client
        .lock("fork-in-log:renewed")
        .ttl(ttl)
        .try_acquire()
        .unwrap();
    let token = guard.token().to_owned();
    // On the thread renewing this lock, whichever it is: the record names the lock.
    fork_at_records_containing(c"\"fork-in-log:renewed\" failed, retrying", RENEWAL_THREADS);
    // The next two renewals are refused (the connection reset before the request runs):
    // the batched one, then the renewal thread's own, which logs the warning.
    proxy.on_request(
        b"fork-in-log:renewed",
        2,
        crate::support::proxy::Action::ResetBeforeRequest,
    );
    let forked = within_5s(|| FORKED_CHILD.load(Ordering::SeqCst) != 0);
    assert_eq!(set(LOCK_LOG_WARN, None), LOCK_OK);
    assert!(forked, "no renewal warning for the lock");
    // The child is the renewal thread's copy alone: this test goes on in the parent only.
    let child = FORKED_CHILD.load(Ordering::SeqCst);
    eprintln!(
        "DBG child {child} thread {:?}",
        std::thread::current().name()
    );
    guard.abandon();
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        eprintln!(
            "DBG key {:?} pttl {}",
            server.get("fork-in-log:renewed"),
            server.pttl("fork-in-log:renewed")
        );
    }
    let gone = crate::support::eventually(ttl * 3, || server.get("fork-in-log:renewed").is_none());
    let left = server.get("fork-in-log:renewed");
    // SAFETY: our own child.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let _ = exit_status(child, Duration::from_secs(5));
    assert!(
        gone,
        "the lock outlived its abandoned lease by two ttls: the forked child renewed it \
         (key {left:?}, parent token {token})"
    );
}
