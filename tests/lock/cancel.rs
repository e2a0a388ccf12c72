//! Cancelling a waiting acquire (`CancelToken`; the C ABI's cancel handles and
//! `lock_cancel_all`, and Python's Ctrl-C, take the same path). Issue 9 item 2: "Ctrl-C
//! (SIGINT) interrupts `acquire()` ... within 0.5 s", and "a C daemon shutting down on
//! SIGTERM must be able to make its threads' blocked `lock_acquire` calls return at once
//! with `LOCK_CANCELLED`"; `CancelToken::cancel`: "Makes every acquire waiting with this
//! token return [`Cancelled`] promptly." It does, even when Redis has gone silent, and a
//! waiter cancelled after its attempt took a grant gives the lock back. (A cancel ending a
//! wait refused by a Cluster: `deployments::cluster`; a writer that gives up:
//! `kinds::rwlock`.)

use std::time::{Duration, Instant};

use redlease::{CancelToken, Client, ClientOptions, ErrorKind};

use crate::support::proxy::Proxy;
use crate::support::{self, RedisServer, eventually, within};

/// A waiter blocked on a server that stopped answering (a partition, a stopped server)
/// returns at once when cancelled: the withdrawal it then sends waits only briefly (it
/// once waited a whole I/O timeout, 2 s at the defaults). The bound leaves a loaded host
/// about a second beyond that brief wait.
#[test]
fn cancel_returns_at_once_even_when_redis_is_silent() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = Client::open(&server.url())
        .unwrap()
        .lock("quiet")
        .try_acquire()
        .unwrap();
    let client = Client::with_options(&proxy.url(), ClientOptions::default()).unwrap();
    let cancel = CancelToken::new();
    let waiter = {
        let (client, cancel) = (client.clone(), cancel.clone());
        std::thread::spawn(move || {
            let r = client
                .lock("quiet")
                .cancel_token(&cancel)
                .acquire()
                .map(drop);
            (r, Instant::now())
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));
    proxy.blackhole(true);
    std::thread::sleep(Duration::from_millis(100));
    let cancelled_at = Instant::now();
    cancel.cancel();
    let (result, returned) = within(Duration::from_secs(20), move || waiter.join().unwrap());
    proxy.blackhole(false);
    drop(holder);
    let took = returned - cancelled_at;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Cancelled);
    assert!(
        took < Duration::from_millis(1200),
        "the cancelled acquire returned {took:?} after cancel()"
    );
}

/// Held up: a waiter cancelled after its pipelined attempt took a grant on the server (its
/// reply held back by the proxy) gives the lock back at once on its way out.
#[test]
fn a_waiter_cancelled_after_its_claim_ran_gives_the_lock_back() {
    use support::proxy::Action;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = Client::open(&server.url())
        .unwrap()
        .lock("claim")
        .try_acquire()
        .unwrap();
    let client = Client::open(&proxy.url()).unwrap();
    proxy.on_request(b"BLPOP", 1, Action::DelayReply(Duration::from_secs(2)));
    let cancel = CancelToken::new();
    let waiter = {
        let (client, cancel) = (client.clone(), cancel.clone());
        std::thread::spawn(move || {
            client
                .lock("claim")
                .cancel_token(&cancel)
                .acquire()
                .map(drop)
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));
    holder.release().unwrap();
    // The waiter's attempt took the grant on the server.
    assert!(eventually(Duration::from_secs(2), || {
        server
            .cmd::<Option<String>>(&["GET", "claim"])
            .is_some_and(|v| !v.ends_with(":handoff"))
    }));
    cancel.cancel();
    let result = within(Duration::from_secs(10), move || waiter.join().unwrap());
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Cancelled);
    let key: Option<String> = server.cmd(&["GET", "claim"]);
    assert_eq!(key, None, "the cancelled waiter left the lock held");
}

/// A waiter cancelled while blocked, in a process that forked meanwhile (the child holds a
/// copy of every socket): its connection still ends at once on the server, so the attempt
/// written behind its block never runs and takes nothing after the caller was told
/// `Cancelled`.
#[test]
fn a_cancelled_waiter_in_a_process_that_forked_leaves_no_request_behind() {
    let server = RedisServer::start();
    let holder = support::client(&server.url())
        .lock("forked")
        .try_acquire()
        .unwrap();
    let cancel = CancelToken::new();
    let waiter = {
        let (client, cancel) = (support::client(&server.url()), cancel.clone());
        std::thread::spawn(move || {
            client
                .lock("forked")
                .cancel_token(&cancel)
                .acquire()
                .map(drop)
        })
    };
    let blocked = || -> Option<String> {
        let clients: String = server.cmd(&["CLIENT", "LIST"]);
        clients
            .lines()
            .find(|l| l.contains("cmd=blpop"))
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
    };
    assert!(eventually(Duration::from_secs(5), || blocked().is_some()));
    let id = blocked().unwrap();
    // SAFETY: the child only sleeps and exits (async-signal-safe calls).
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: sleep and _exit are async-signal-safe.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    assert!(child > 0);
    cancel.cancel();
    let cancelled = within(Duration::from_secs(10), move || waiter.join().unwrap());
    assert_eq!(cancelled.unwrap_err().kind(), ErrorKind::Cancelled);
    let gone = eventually(Duration::from_secs(10), || {
        let clients: String = server.cmd(&["CLIENT", "LIST"]);
        !clients.lines().any(|l| l.starts_with(&format!("{id} ")))
    });
    holder.release().unwrap();
    // SAFETY: the child is ours.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(
        gone,
        "the cancelled waiter's connection ({id}) stayed open on the server"
    );
    assert_eq!(server.get("forked"), None);
}

/// 0 until the hook below forks; then the child's pid in the parent, -1 in the child.
static HOOK_FORKED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A Rust interrupt hook that forks while its thread waits: in the child the thread comes
/// back into its parent's wait. That acquire fails there (`Internal`, at once), and the
/// child's own calls afterwards (a client of its own: ping, is_locked, a lock of its own)
/// work. The parent waits on and gets the lock.
#[test]
fn a_child_forked_in_an_interrupt_hook_fails_its_parents_wait_and_then_works_on_its_own() {
    use std::sync::atomic::Ordering;
    let server = RedisServer::start();
    let url = server.url();
    let holder = Client::open(&url)
        .unwrap()
        .lock("fork-in-rust-hook")
        .acquire()
        .unwrap();
    let waiter = {
        let url = url.clone();
        std::thread::spawn(move || {
            let client = Client::open(&url).unwrap();
            let result = client
                .lock("fork-in-rust-hook")
                .on_interrupt(|| {
                    if HOOK_FORKED.load(Ordering::SeqCst) == 0 {
                        // SAFETY: fork; the child comes back into the wait.
                        let pid = unsafe { libc::fork() };
                        HOOK_FORKED.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
                    }
                    false
                })
                .acquire_timeout(Duration::from_secs(20));
            if HOOK_FORKED.load(Ordering::SeqCst) == -1 {
                // The child: 1 when it took its parent's lock, 2 for another failure than
                // Internal, 3 when its own client then fails.
                let code = match &result {
                    Ok(_) => 1,
                    Err(e) if e.kind() != ErrorKind::Internal => 2,
                    Err(_) => {
                        drop(result);
                        let own = Client::open(&url);
                        let works = own.is_ok_and(|own| {
                            own.ping().is_ok()
                                && own.is_locked("fork-in-rust-hook:other").is_ok()
                                && own
                                    .lock("fork-in-rust-hook:child")
                                    .try_acquire()
                                    .and_then(|g| g.release())
                                    .is_ok()
                        });
                        if works { 0 } else { 3 }
                    }
                };
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(code) }
            }
            result.and_then(|g| g.release())
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || HOOK_FORKED
            .load(Ordering::SeqCst)
            > 0),
        "the hook was not called during the wait"
    );
    let child = HOOK_FORKED.load(Ordering::SeqCst);
    let status = support::exit_status(child, Duration::from_secs(15));
    holder.release().unwrap();
    let parent = waiter.join().unwrap();
    assert_eq!(
        status,
        Some(0),
        "1: the child took its parent's lock; 2: another error; 3: its own client failed"
    );
    parent.unwrap();
}

unsafe extern "C" {
    /// glibc's fork without the fork handlers (2.34 and later).
    fn _Fork() -> libc::pid_t;
}

/// 0 until the hook below forks; then the child's pid in the parent, -1 in the child.
static PANIC_HOOK_FORKED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// An interrupt hook that calls `_Fork()` (no fork handlers: only the pid tells) and
/// panics in the child: the unwinding hook returns into its parent's wait all the same
/// (the library catches a hook's panic). The child must fail that wait (`Internal`), not
/// go on to take its parent's lock under its parent's token.
#[test]
fn a_child_made_by_fork_without_handlers_in_a_hook_that_panics_fails_its_parents_wait() {
    use std::sync::atomic::Ordering;
    let server = RedisServer::start();
    let url = server.url();
    let holder = Client::open(&url)
        .unwrap()
        .lock("fork-panic-hook")
        .ttl(Duration::from_millis(1_500))
        .renew(false)
        .try_acquire()
        .unwrap();
    let waiter = {
        let url = url.clone();
        std::thread::spawn(move || {
            let client = Client::open(&url).unwrap();
            let result = client
                .lock("fork-panic-hook")
                .renew(false)
                .on_interrupt(|| {
                    if PANIC_HOOK_FORKED.load(Ordering::SeqCst) == 0 {
                        // SAFETY: _Fork; the child unwinds out of the hook into the wait.
                        let pid = unsafe { _Fork() };
                        PANIC_HOOK_FORKED.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
                        if pid == 0 {
                            panic!("the hook panics in the child");
                        }
                    }
                    false
                })
                .acquire_timeout(Duration::from_secs(10));
            if PANIC_HOOK_FORKED.load(Ordering::SeqCst) == -1 {
                // The child: 0 when its parent's wait failed there, 1 when it took its
                // parent's lock, 2 for another error.
                let code = match &result {
                    Err(e) if e.kind() == ErrorKind::Internal => 0,
                    Ok(_) => 1,
                    Err(_) => 2,
                };
                std::mem::forget(result);
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(code) }
            }
            result.map(|g| g.token().to_owned())
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || PANIC_HOOK_FORKED
            .load(Ordering::SeqCst)
            > 0),
        "the hook was not called during the wait"
    );
    let child = PANIC_HOOK_FORKED.load(Ordering::SeqCst);
    let status = support::exit_status(child, Duration::from_secs(15));
    drop(holder);
    let parent = waiter.join().unwrap();
    assert_eq!(
        status,
        Some(0),
        "1: the child went on with its parent's wait and took the lock; 2: another error"
    );
    parent.unwrap();
}
