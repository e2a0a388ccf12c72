//! A fork in caller code that runs when the library drops a Rust closure it was given
//! (the captured values' `Drop`, the Rust counterpart of the C ABI's `user_data_free`):
//! the thread comes back in the child in the middle of its parent's call, which must not
//! go on there (no guard, no renewal, no release for the parent's lock).

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use redlease::{Client, ErrorKind};

use crate::support::{self, RedisServer};

/// Forks when dropped (with `_Fork()`, which runs no fork handlers, when `raw`). In the
/// parent: records the child's pid in `child`, and when `wait` waits for the child to end
/// (its exit status in `status`) before returning. In the child: sets `child` to -1 and
/// returns.
struct ForkOnDrop {
    child: &'static AtomicI32,
    status: &'static AtomicI32,
    wait: bool,
    raw: bool,
}

impl Drop for ForkOnDrop {
    fn drop(&mut self) {
        let pid = if self.raw {
            support::fork_without_handlers()
        } else {
            // SAFETY: fork; the child returns into the library's call and later _exits.
            unsafe { libc::fork() }
        };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            self.child.store(-1, Ordering::SeqCst);
            return;
        }
        self.child.store(pid, Ordering::SeqCst);
        if self.wait {
            let status = support::exit_status(pid, Duration::from_secs(20));
            self.status.store(status.unwrap_or(-99), Ordering::SeqCst);
        }
    }
}

static HOOK_CHILD: AtomicI32 = AtomicI32::new(0);
static HOOK_STATUS: AtomicI32 = AtomicI32::new(-100);

/// The acquire's interrupt hook captures a value whose Drop forks. The hook is dropped
/// with the acquire's `Watch` after the grant was read and before the guard is made: the
/// child's acquire fails, and the parent keeps its lock.
#[test]
fn a_fork_in_the_drop_of_an_interrupt_hook_does_not_give_the_child_its_parents_lock() {
    fork_in_the_drop_of_an_interrupt_hook("fork-drop:hook", false, &HOOK_CHILD, &HOOK_STATUS);
}

static RAW_HOOK_CHILD: AtomicI32 = AtomicI32::new(0);
static RAW_HOOK_STATUS: AtomicI32 = AtomicI32::new(-100);

/// As above with `_Fork()`, which moves no fork generation: the library drops the hook as
/// caller code, and sees the pid change across the drop.
#[test]
fn a_fork_without_the_fork_handlers_in_the_drop_of_an_interrupt_hook_does_not_give_the_child_its_parents_lock()
 {
    fork_in_the_drop_of_an_interrupt_hook(
        "fork-drop:raw-hook",
        true,
        &RAW_HOOK_CHILD,
        &RAW_HOOK_STATUS,
    );
}

fn fork_in_the_drop_of_an_interrupt_hook(
    key: &str,
    raw: bool,
    child: &'static AtomicI32,
    child_status: &'static AtomicI32,
) {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let on_drop = ForkOnDrop {
        child,
        status: child_status,
        wait: true,
        raw,
    };
    let result = client
        .lock(key)
        .ttl(Duration::from_secs(30))
        .on_interrupt(move || {
            let _ = &on_drop;
            false
        })
        .try_acquire();
    if child.load(Ordering::SeqCst) == -1 {
        // The child: 0 when its parent's call failed there (Internal), 1 when it got a
        // guard and released its parent's lock with it, 2 when it got a guard whose
        // release failed, 3 for another error.
        let code = match result {
            Err(e) if e.kind() == ErrorKind::Internal => 0,
            Err(_) => 3,
            Ok(guard) => {
                eprintln!("child: got Ok, token {}", guard.token());
                match guard.release() {
                    Ok(()) => 1,
                    Err(e) => {
                        eprintln!("child: release: {e}");
                        2
                    }
                }
            }
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    let status = child_status.load(Ordering::SeqCst);
    let guard = result.expect("the parent's acquire");
    eprintln!("parent: token {}, child status {status}", guard.token());
    let key_after_child = server.get(key);
    let released = guard.release();
    assert_eq!(
        status, 0,
        "child exit {status} (1: the child got Ok and its release deleted its parent's \
         lock; key after the child: {key_after_child:?}; the parent's release then: \
         {released:?})"
    );
    released.unwrap();
}

static RENEW_CHILD: AtomicI32 = AtomicI32::new(0);
static RENEW_STATUS: AtomicI32 = AtomicI32::new(-100);

/// As above, with renewal on: nothing in the child renews the parent's lock, which ends
/// within its ttl once the parent abandons it (as if it had crashed).
#[test]
fn a_fork_in_the_drop_of_an_interrupt_hook_does_not_renew_the_parents_lock_in_the_child() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let on_drop = ForkOnDrop {
        child: &RENEW_CHILD,
        status: &RENEW_STATUS,
        wait: false,
        raw: false,
    };
    let result = client
        .lock("fork-drop:renew")
        .ttl(Duration::from_millis(600))
        .renew(true)
        .on_interrupt(move || {
            let _ = &on_drop;
            false
        })
        .try_acquire();
    if RENEW_CHILD.load(Ordering::SeqCst) == -1 {
        let code = match result {
            Err(e) if e.kind() == ErrorKind::Internal => 0,
            Err(_) => 3,
            Ok(guard) => {
                // Hold it (renewed by a thread of the child) for 4 s, then let it lapse.
                std::thread::sleep(Duration::from_secs(4));
                guard.abandon();
                1
            }
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    let child = RENEW_CHILD.load(Ordering::SeqCst);
    let guard = result.expect("the parent's acquire");
    let token = guard.token().to_owned();
    // The parent lets the lock go without releasing it: it should lapse within 600 ms.
    guard.abandon();
    std::thread::sleep(Duration::from_secs(2));
    let still = server.get("fork-drop:renew");
    let pttl: i64 = server.cmd(&["PTTL", "fork-drop:renew"]);
    let status = support::exit_status(child, Duration::from_secs(20));
    assert!(
        still.is_none(),
        "2 s after the parent abandoned its 600 ms lock the key still holds {still:?} \
         (parent's token {token:?}, pttl {pttl} ms): renewed by the child (exit {status:?})"
    );
    assert_eq!(status, Some(0));
}

static LOST_CHILD: AtomicI32 = AtomicI32::new(0);
static LOST_STATUS: AtomicI32 = AtomicI32::new(-100);

/// The on_lost closure captures a value whose Drop forks. A release drops the callback
/// (`forget_on_lost`) after its process check and before it sends: the child's release
/// fails and sends nothing, and the parent's own release succeeds.
#[test]
fn a_fork_in_the_drop_of_an_on_lost_callback_does_not_release_the_parents_lock_in_the_child() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let on_drop = ForkOnDrop {
        child: &LOST_CHILD,
        status: &LOST_STATUS,
        wait: true,
        raw: false,
    };
    let guard = client
        .lock("fork-drop:lost")
        .ttl(Duration::from_secs(30))
        .on_lost(move |_| {
            let _ = &on_drop;
        })
        .try_acquire()
        .unwrap();
    let result = guard.release();
    if LOST_CHILD.load(Ordering::SeqCst) == -1 {
        // 0: the child's call failed (Internal); 1: Ok (it released its parent's lock);
        // 2: NotHeld (it sent its parent's release, too late); 3: another error.
        let code = match &result {
            Err(e) if e.kind() == ErrorKind::Internal => 0,
            Ok(()) => 1,
            Err(e) if e.kind() == ErrorKind::NotHeld => 2,
            Err(_) => 3,
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    let status = LOST_STATUS.load(Ordering::SeqCst);
    assert_eq!(
        status, 0,
        "child exit {status} (1: the child released its parent's lock); the parent's \
         release: {result:?}"
    );
    result.unwrap();
}

/// How a child's own work (a client of its own, a lock of its own) ended, as an exit code:
/// 0 done, 1 `Internal` (taken for its parent's call), 2 another error.
fn own_work(url: &str, name: &str) -> i32 {
    let done = Client::open(url).and_then(|c| {
        c.lock(name)
            .ttl(Duration::from_secs(5))
            .try_acquire()
            .and_then(|g| g.release())
    });
    match done {
        Ok(()) => 0,
        Err(e) if e.kind() == ErrorKind::Internal => 1,
        Err(_) => 2,
    }
}

static OWN_WORK_IN_DROP: AtomicI32 = AtomicI32::new(-100);

/// Forks when dropped; the child does its own work with the library there and exits (it
/// never returns into the call that dropped this); the parent waits for it.
struct ForkAndWorkOnDrop(String);

impl Drop for ForkAndWorkOnDrop {
    fn drop(&mut self) {
        // SAFETY: fork; the child only uses the library and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = own_work(&self.0, "fork-in-a-drop:own");
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) }
        }
        let status = support::exit_status(pid, Duration::from_secs(20));
        OWN_WORK_IN_DROP.store(status.unwrap_or(-99), Ordering::SeqCst);
    }
}

/// A child forked in the `Drop` of a closure the library drops during an acquire, which
/// does its own work there and exits without returning into its parent's call: its own
/// calls are its own, not failed as its parent's.
#[test]
fn a_child_forked_in_a_drop_can_use_the_library_before_it_exits() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let on_drop = ForkAndWorkOnDrop(server.url());
    let guard = client
        .lock("fork-in-a-drop:parent")
        .on_interrupt(move || {
            let _ = &on_drop;
            false
        })
        .try_acquire()
        .unwrap();
    guard.release().unwrap();
    let status = OWN_WORK_IN_DROP.load(Ordering::SeqCst);
    assert_eq!(
        status, 0,
        "the child's own work: 1: Internal, 2: another error"
    );
}

static OWN_WORK_IN_HOOK: AtomicI32 = AtomicI32::new(-100);

/// The same from an interrupt hook during a wait (as a Python signal handler that starts
/// a multiprocessing worker would): the child's own work succeeds.
#[test]
fn a_child_forked_in_an_interrupt_hook_can_use_the_library_before_it_exits() {
    let server = RedisServer::start();
    let held = Client::open(&server.url())
        .unwrap()
        .lock("fork-in-a-hook:parent")
        .try_acquire()
        .unwrap();
    let client = Client::open(&server.url()).unwrap();
    let url = server.url();
    let forked = std::sync::atomic::AtomicBool::new(false);
    let waited = client
        .lock("fork-in-a-hook:parent")
        .on_interrupt(move || {
            if !forked.swap(true, Ordering::SeqCst) {
                // SAFETY: fork; the child only uses the library and exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    let code = own_work(&url, "fork-in-a-hook:own");
                    // SAFETY: ends the child at once.
                    unsafe { libc::_exit(code) }
                }
                let status = support::exit_status(pid, Duration::from_secs(20));
                OWN_WORK_IN_HOOK.store(status.unwrap_or(-99), Ordering::SeqCst);
            }
            false
        })
        .acquire_timeout(Duration::from_secs(1));
    assert_eq!(waited.map(drop).unwrap_err().kind(), ErrorKind::Busy);
    drop(held);
    let status = OWN_WORK_IN_HOOK.load(Ordering::SeqCst);
    assert_eq!(
        status, 0,
        "the child's own work: 1: Internal, 2: another error"
    );
}
