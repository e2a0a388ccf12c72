//! A forked child of a process whose threads use the library: its calls on its parent's
//! handles report `LOCK_NOT_HELD` and never wait for a lock a parent's thread held at the
//! fork, a new client of its own works, and a child made without the fork handlers
//! (`_Fork()`, a raw `fork` system call) cannot release its parent's lock either, nor
//! draw its parent's tokens or reentrant owner, nor end its parent's connections.

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redlease::ffi::*;
use redlease::{Client, ClientOptions};

use crate::support::{self, RedisServer};

fn open(url: &str) -> lock_client_t {
    let url = CString::new(url).unwrap();
    let mut client: lock_client_t = 0;
    // SAFETY: a NUL-terminated URL and a valid out-pointer.
    let rc = unsafe { lock_client_open(url.as_ptr(), &mut client) };
    assert_eq!(rc, LOCK_OK);
    client
}

fn acquire(client: lock_client_t, name: &str) -> lock_t {
    let name = CString::new(name).unwrap();
    let mut lock: lock_t = 0;
    // SAFETY: a NUL-terminated name and a valid out-pointer.
    let rc = unsafe { lock_acquire(client, name.as_ptr(), 30_000, 0, &mut lock) };
    assert_eq!(rc, LOCK_OK);
    lock
}

/// Waits up to 10 s for `pid` to exit (see [`support::exit_status`]).
fn exit_status(pid: libc::pid_t) -> Option<i32> {
    support::exit_status(pid, Duration::from_secs(10))
}

/// Forks while two threads keep calling into the library on a held lock; each child
/// releases the parent's handle (must be `LOCK_NOT_HELD`), then takes and releases a lock
/// of a new client of its own. No child may hang.
#[test]
fn a_child_forked_while_threads_use_the_library_neither_hangs_nor_holds() {
    let server = RedisServer::start();
    let url = server.url();
    let client = open(&url);
    let lock = acquire(client, "fork:held");
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (mut held, mut fence) = (false, 0u64);
                    // SAFETY: valid out-pointers.
                    unsafe {
                        lock_is_held(lock, &mut held);
                        lock_fencing_token(lock, &mut fence);
                    }
                }
            })
        })
        .collect();
    let child_url = CString::new(url.clone()).unwrap();
    let child_name = CString::new("fork:child").unwrap();
    for _ in 0..100 {
        // SAFETY: the child calls only the library and _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above; pointers are to memory copied from the parent.
            unsafe {
                let code = if lock_release(lock) != LOCK_NOT_HELD {
                    1
                } else {
                    let (mut own, mut taken) = (0, 0);
                    if lock_client_open(child_url.as_ptr(), &mut own) != LOCK_OK
                        || lock_acquire(own, child_name.as_ptr(), 30_000, 0, &mut taken) != LOCK_OK
                        || lock_release(taken) != LOCK_OK
                    {
                        2
                    } else {
                        0
                    }
                };
                libc::_exit(code);
            }
        }
        assert!(pid > 0, "fork failed");
        assert_eq!(exit_status(pid), Some(0), "the child hung or failed");
    }
    stop.store(true, Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert_eq!(server.cmd::<i64>(&["EXISTS", "fork:held"]), 1);
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(lock_client_close(client), LOCK_OK);
}

/// A child made by the `fork` system call itself, which runs no fork handlers (as glibc's
/// `_Fork()`). Only the child runs `child`, then exits with its return value; the parent
/// gets the child's pid.
fn raw_fork(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: a raw fork; the child runs only `child` (calls of the library) and _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    if pid == 0 {
        let code = child();
        // SAFETY: ends the child without running its parent's destructors.
        unsafe { libc::_exit(code) }
    }
    assert!(pid > 0, "fork failed");
    pid
}

/// A child made without the fork handlers still cannot release its parent's lock: the pid
/// tells it apart.
#[test]
fn a_child_forked_without_the_fork_handlers_cannot_release_its_parents_lock() {
    let server = RedisServer::start();
    let client = open(&server.url());
    let lock = acquire(client, "fork:raw");
    // SAFETY: a raw fork; the child calls only the library and _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::_exit(if lock_release(lock) == LOCK_NOT_HELD {
                0
            } else {
                1
            })
        }
    }
    assert!(pid > 0, "fork failed");
    assert_eq!(exit_status(pid), Some(0), "the child released or hung");
    assert_eq!(server.cmd::<i64>(&["EXISTS", "fork:raw"]), 1);
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(lock_client_close(client), LOCK_OK);
}

/// The parent's thread holds a reentrant lock. A child made without the fork handlers, on
/// a client of its own, is another process: it must find the lock busy, not join the hold
/// as the same thread (its owner id is drawn again).
#[test]
fn a_child_forked_without_the_fork_handlers_is_not_its_parents_reentrant_owner() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::open(&url).unwrap();
    let held = client
        .lock("fork:reentrant")
        .reentrant()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let pid = raw_fork(|| match Client::open(&url) {
        Err(_) => 3,
        Ok(own) => match own
            .lock("fork:reentrant")
            .reentrant()
            .renew(false)
            .try_acquire()
        {
            Ok(hold) => {
                std::mem::forget(hold);
                1
            }
            Err(e) if e.is_busy() => 0,
            Err(_) => 2,
        },
    });
    let status = exit_status(pid);
    held.release().unwrap();
    assert_eq!(
        status,
        Some(0),
        "1: the child joined its parent's reentrant hold; 2, 3: an error; None: it hung"
    );
}

/// Both processes label their tokens alike (`owner_label`), and the parent's thread has
/// drawn a token before the fork. A child made without the fork handlers takes a lock and
/// keeps it; the parent's next acquire of that name must find it busy: it would take it
/// for a repeated attempt of its own if it drew the child's token.
#[test]
fn a_child_forked_without_the_fork_handlers_draws_tokens_of_its_own() {
    let server = RedisServer::start();
    let url = server.url();
    let options = || ClientOptions::default().owner_label("billing");
    let client = Client::with_options(&url, options()).unwrap();
    client
        .lock("fork:warm")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let pid = raw_fork(|| match Client::with_options(&url, options()) {
        Err(_) => 3,
        Ok(own) => match own
            .lock("fork:token")
            .renew(false)
            .ttl(Duration::from_secs(30))
            .try_acquire()
        {
            Ok(hold) => {
                std::mem::forget(hold);
                0
            }
            Err(_) => 2,
        },
    });
    assert_eq!(
        exit_status(pid),
        Some(0),
        "the child could not take the lock"
    );
    let childs = server.get("fork:token").expect("the child's hold");
    match client.lock("fork:token").try_acquire() {
        Ok(hold) => panic!(
            "the parent took the child's lock with the child's token: {} and {childs}",
            hold.token()
        ),
        Err(e) => assert!(e.is_busy(), "{e}"),
    }
}

/// A child made without the fork handlers closes the client it inherited (as a C program
/// tidies up before it exits): its copies of the parent's connections must not end them
/// on the server.
#[test]
fn a_child_forked_without_the_fork_handlers_leaves_its_parents_connections_open() {
    let server = RedisServer::start();
    let client = open(&server.url());
    let lock = acquire(client, "fork:connections");
    assert_eq!(lock_extend(lock, 30_000), LOCK_OK); // an idle connection in the pool
    let connections = || server.cmd::<String>(&["CLIENT", "LIST"]).lines().count();
    let before = connections();
    let pid = raw_fork(|| i32::from(lock_client_close(client) != LOCK_OK));
    assert_eq!(
        exit_status(pid),
        Some(0),
        "the child's close failed or hung"
    );
    // (A connection the child ended goes from the list as soon as the server reads it.)
    let cut = crate::support::eventually(Duration::from_millis(500), || connections() < before);
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(lock_client_close(client), LOCK_OK);
    assert!(!cut, "the child's close ended its parent's connections");
}

/// The parent has renewed a lock and released it, so its renewal thread is parked, ready
/// for the next lock. A child made without the fork handlers opens a client of its own (as
/// the header tells it to) and takes a renewed lock with a short lease: the renewal must be
/// the child's own thread's, not handed to the parent's parked one, which the child does
/// not have (its lock would then expire while the child believes it holds it).
#[test]
fn a_child_forked_without_the_fork_handlers_gets_its_own_locks_renewed() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::open(&url).unwrap();
    client
        .lock("fork:parked-renewal")
        .ttl(Duration::from_millis(600))
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let pid = raw_fork(|| {
        let Ok(own) = Client::open(&url) else {
            return 3;
        };
        let Ok(hold) = own
            .lock("fork:child-renewed")
            .ttl(Duration::from_millis(600))
            .try_acquire()
        else {
            return 2;
        };
        // More than three leases: held only if renewed.
        std::thread::sleep(Duration::from_millis(2_000));
        let code = if hold.is_held() { 0 } else { 1 };
        std::mem::forget(hold);
        code
    });
    assert_eq!(
        exit_status(pid),
        Some(0),
        "1: the child's lock expired unrenewed; 2, 3: the child could not take it; None: \
         the child hung"
    );
}

/// A thread that forks once (the library's fork handlers registered), then forks again
/// from a thread-local destructor as it exits, when the thread's other thread-locals may
/// be gone already: the fork handlers must not need one (the process aborted). Run in a
/// child, so that an abort fails this test only.
#[test]
fn a_fork_from_a_thread_local_destructor_does_not_abort_the_process() {
    fn fork_and_reap() {
        // SAFETY: fork; the grandchild _exits at once, the caller reaps it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: ends the grandchild.
            unsafe { libc::_exit(0) }
        }
        let mut status = 0;
        // SAFETY: reaps our own child into a local.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    struct ForksOnDrop;
    impl Drop for ForksOnDrop {
        fn drop(&mut self) {
            fork_and_reap();
        }
    }
    thread_local! {
        static FORKS_AT_EXIT: std::cell::RefCell<Option<ForksOnDrop>> =
            const { std::cell::RefCell::new(None) };
    }
    // SAFETY: fork; the child uses the library, starts one thread and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // Registers the fork handlers (in this child only).
        // SAFETY: a NULL callback.
        unsafe { lock_set_log_callback(LOCK_LOG_WARN, None, std::ptr::null_mut()) };
        std::thread::spawn(|| {
            // Registered before any of the library's, so destroyed after them.
            FORKS_AT_EXIT.with(|f| *f.borrow_mut() = Some(ForksOnDrop));
            fork_and_reap();
        })
        .join()
        .ok();
        // SAFETY: ends the child.
        unsafe { libc::_exit(0) }
    }
    assert_eq!(
        exit_status(pid),
        Some(0),
        "the process died when a thread forked from a thread-local destructor"
    );
}

/// Six threads fork 400 times each while a renewed lock is held, so that a fork often
/// comes while another thread waits in the fork handlers for the library's locks; each
/// child forks once more (a daemon's double fork) and then calls the library. No child
/// may hang: a child must never start with a lock of the library held by a thread it
/// does not have (the registry of the locks held across `fork()` included).
#[test]
fn children_of_concurrent_forks_can_fork_again_and_call_the_library() {
    fn child() -> i32 {
        // SAFETY: fork in the child; the grandchild _exits at once, the child reaps it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: ends the grandchild.
            unsafe { libc::_exit(0) }
        }
        let mut status = 0;
        // SAFETY: reaps our own child into a local.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        // SAFETY: a NULL callback.
        let rc = unsafe { lock_set_log_callback(LOCK_LOG_WARN, None, std::ptr::null_mut()) };
        i32::from(rc != LOCK_OK)
    }
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let _held = client
        .lock("fork:storm")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let failed = failed.clone();
            std::thread::spawn(move || {
                for _ in 0..400 {
                    // SAFETY: fork; the child runs `child` and _exits.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        let code = child();
                        // SAFETY: ends the child without its parent's destructors.
                        unsafe { libc::_exit(code) }
                    }
                    assert!(pid > 0, "fork failed");
                    if support::exit_status(pid, Duration::from_secs(5)) != Some(0) {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "children of 2,400 concurrent forks hung or failed"
    );
}

static HOOK_CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Calls of the hook in the child after the fork: each means the child waited on.
static CALLS_IN_CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// An interrupt hook that forks at its first call (the child returns into the wait) and
/// never cancels.
unsafe extern "C" fn fork_in_hook(_: *mut std::ffi::c_void) -> i32 {
    if HOOK_CHILD.load(Ordering::SeqCst) == -1 {
        CALLS_IN_CHILD.fetch_add(1, Ordering::SeqCst);
    }
    if HOOK_CHILD.load(Ordering::SeqCst) == 0 {
        // SAFETY: fork; the child comes back out of the hook into its parent's wait.
        let pid = unsafe { libc::fork() };
        HOOK_CHILD.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
    }
    0
}

/// An interrupt hook that forks while its thread waits in `lock_acquire_opts` (blocked on
/// the server, behind another holder): the child comes back into its parent's wait, on
/// its parent's connection and registration. It must fail the call at once, reading and
/// sending nothing (it does not wait on: the hook is not called again there, and the
/// parent's replies stay on the socket for the parent); the parent waits on and gets the
/// lock when the holder lets go.
#[test]
fn a_child_forked_in_an_interrupt_hook_does_not_finish_its_parents_wait() {
    let server = RedisServer::start();
    let holder_client = open(&server.url());
    let holder = acquire(holder_client, "fork-in-hook");
    let client = open(&server.url());
    let waiter = std::thread::spawn(move || {
        // SAFETY: all-zero bytes are a valid value of this C struct, which init fills.
        let mut opts: lock_acquire_options_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid struct of the size given.
        let rc = unsafe { lock_acquire_options_init(&mut opts, std::mem::size_of_val(&opts)) };
        assert_eq!(rc, LOCK_OK);
        opts.on_interrupt = Some(fork_in_hook);
        let name = CString::new("fork-in-hook").unwrap();
        let mut lock: lock_t = 0;
        // SAFETY: valid arguments; the hook is callable on this thread.
        let rc =
            unsafe { lock_acquire_opts(client, name.as_ptr(), 30_000, 10_000, &opts, &mut lock) };
        if HOOK_CHILD.load(Ordering::SeqCst) == -1 {
            // The child (this thread alone): 0 when the wait failed here at once, 1 when
            // it "acquired" its parent's lock, 2 for another result, 3 when it failed
            // but only after waiting on (reading its parent's socket).
            let code = match rc {
                LOCK_ERR_INTERNAL if CALLS_IN_CHILD.load(Ordering::SeqCst) == 0 => 0,
                LOCK_ERR_INTERNAL => 3,
                LOCK_OK => 1,
                _ => 2,
            };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) }
        }
        (rc, lock)
    });
    assert!(
        support::eventually(Duration::from_secs(5), || HOOK_CHILD.load(Ordering::SeqCst)
            > 0),
        "the interrupt hook was not called during the wait"
    );
    let child = HOOK_CHILD.load(Ordering::SeqCst);
    // The holder keeps the lock until the child has ended: a child that went on waiting
    // ends Busy after the wait (2), one that took the parent's grant first reports 1.
    let status = support::exit_status(child, Duration::from_secs(15));
    assert_eq!(lock_release(holder), LOCK_OK);
    let (rc, lock) = waiter.join().unwrap();
    assert_eq!(
        status,
        Some(0),
        "the child came back from the hook and went on with its parent's wait"
    );
    assert_eq!(rc, LOCK_OK, "the parent's wait failed");
    assert_eq!(lock_release(lock), LOCK_OK);
    lock_client_close(client);
    lock_client_close(holder_client);
}
