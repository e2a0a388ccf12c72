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

/// How the hook of [`wait_with_a_forking_hook`] forks.
#[derive(Clone, Copy)]
enum HookFork {
    /// `fork()`; the child returns from the hook.
    Fork,
    /// `_Fork()` (no fork handlers: only the pid tells); the child panics out of the hook
    /// (the library catches a hook's panic and goes on).
    RawThenPanic,
}

/// A thread waits for `name`, held by another client until the child has ended, with an
/// interrupt hook that forks (once, as `how` says) during the wait: in the child the
/// thread comes back into its parent's wait, and `in_child` (given the wait's result and
/// the server's URL) gives the child's exit status. Returns that status, and the parent's
/// wait's result once the holder has let go. `forked` is the test's own: 0 until the hook
/// forks, then the child's pid in the parent, -1 in the child.
fn wait_with_a_forking_hook(
    name: &'static str,
    how: HookFork,
    forked: &'static std::sync::atomic::AtomicI32,
    in_child: fn(redlease::Result<redlease::LockGuard>, &str) -> i32,
) -> (Option<i32>, redlease::Result<()>) {
    use std::sync::atomic::Ordering;
    let server = RedisServer::start();
    let url = server.url();
    let holder = Client::open(&url).unwrap().lock(name).acquire().unwrap();
    let waiter = {
        let url = url.clone();
        std::thread::spawn(move || {
            let client = Client::open(&url).unwrap();
            let result = client
                .lock(name)
                .on_interrupt(move || {
                    if forked.load(Ordering::SeqCst) == 0 {
                        let pid = match how {
                            // SAFETY: fork; the child comes back into the wait.
                            HookFork::Fork => unsafe { libc::fork() },
                            HookFork::RawThenPanic => support::fork_without_handlers(),
                        };
                        forked.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
                        if pid == 0 && matches!(how, HookFork::RawThenPanic) {
                            panic!("the hook panics in the child");
                        }
                    }
                    false
                })
                .acquire_timeout(Duration::from_secs(20));
            if forked.load(Ordering::SeqCst) == -1 {
                let code = in_child(result, &url);
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(code) }
            }
            result.and_then(|g| g.release())
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || forked.load(Ordering::SeqCst) > 0),
        "the hook was not called during the wait"
    );
    let status = support::exit_status(forked.load(Ordering::SeqCst), Duration::from_secs(15));
    holder.release().unwrap();
    (status, waiter.join().unwrap())
}

static HOOK_FORKED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A Rust interrupt hook that forks while its thread waits: in the child the thread comes
/// back into its parent's wait. That acquire fails there (`Internal`, at once), and the
/// child's own calls afterwards (a client of its own: ping, is_locked, a lock of its own)
/// work. The parent waits on and gets the lock.
#[test]
fn a_child_forked_in_an_interrupt_hook_fails_its_parents_wait_and_then_works_on_its_own() {
    let (status, parent) = wait_with_a_forking_hook(
        "fork-in-rust-hook",
        HookFork::Fork,
        &HOOK_FORKED,
        |result, url| {
            // 1 when it took its parent's lock, 2 for another failure than Internal, 3
            // when its own client then fails.
            match &result {
                Ok(_) => 1,
                Err(e) if e.kind() != ErrorKind::Internal => 2,
                Err(_) => {
                    drop(result);
                    let own = Client::open(url);
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
            }
        },
    );
    assert_eq!(
        status,
        Some(0),
        "1: the child took its parent's lock; 2: another error; 3: its own client failed"
    );
    parent.unwrap();
}

static PANIC_HOOK_FORKED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// An interrupt hook that calls `_Fork()` (no fork handlers: only the pid tells) and
/// panics in the child: the unwinding hook returns into its parent's wait all the same
/// (the library catches a hook's panic). The child must fail that wait (`Internal`), not
/// go on to take its parent's lock under its parent's token.
#[test]
fn a_child_made_by_fork_without_handlers_in_a_hook_that_panics_fails_its_parents_wait() {
    let (status, parent) = wait_with_a_forking_hook(
        "fork-panic-hook",
        HookFork::RawThenPanic,
        &PANIC_HOOK_FORKED,
        |result, _| {
            // 0 when its parent's wait failed there, 1 when it took its parent's lock, 2
            // for another error.
            let code = match &result {
                Err(e) if e.kind() == ErrorKind::Internal => 0,
                Ok(_) => 1,
                Err(_) => 2,
            };
            std::mem::forget(result);
            code
        },
    );
    assert_eq!(
        status,
        Some(0),
        "1: the child went on with its parent's wait and took the lock; 2: another error"
    );
    parent.unwrap();
}
