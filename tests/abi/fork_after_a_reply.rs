//! A callback that forks after a call has read its reply: the C log callback forking on
//! the once-per-node eviction-policy warning, which `Node::exec` logs after the first
//! request's reply was read, so that the child comes back with its parent's reply in hand.
//! The child must get no lock of its parent's (no handle, no guard), release nothing of
//! its parent's, and not hang; the parent keeps its lock.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use redlease::ffi::*;

use crate::log_callback::one_at_a_time;
use crate::support::{RedisServer, exit_status};

static FORK_THREAD: AtomicU64 = AtomicU64::new(0);
static CHILD: AtomicI32 = AtomicI32::new(0);

/// Forks once, on FORK_THREAD, at the eviction-policy warning.
unsafe extern "C" fn fork_on_policy(_: i32, _: *const c_char, msg: *const c_char, _: *mut c_void) {
    // SAFETY: a NUL-terminated string valid during the call.
    let msg = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    if me != FORK_THREAD.load(Ordering::SeqCst)
        || !msg.contains("maxmemory-policy")
        || CHILD.load(Ordering::SeqCst) != 0
    {
        return;
    }
    // SAFETY: fork; the child comes back into the library.
    let pid = unsafe { libc::fork() };
    CHILD.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
}

fn arm() {
    CHILD.store(0, Ordering::SeqCst);
    // SAFETY: no preconditions.
    FORK_THREAD.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
    // SAFETY: a callback callable from any thread, no user_data.
    let rc =
        // SAFETY: valid arguments and out-pointers for the call.
        unsafe { lock_set_log_callback(LOCK_LOG_WARN, Some(fork_on_policy), std::ptr::null_mut()) };
    assert_eq!(rc, LOCK_OK);
}

fn disarm() {
    // SAFETY: clearing the callback.
    let rc = unsafe { lock_set_log_callback(LOCK_LOG_WARN, None, std::ptr::null_mut()) };
    assert_eq!(rc, LOCK_OK);
}

/// A new client of `server` (its first request still to come), and acquire options
/// without renewal.
fn client_without_renewal(server: &RedisServer) -> (lock_client_t, lock_acquire_options_t) {
    let url = CString::new(server.url()).unwrap();
    let mut client: lock_client_t = 0;
    // SAFETY: a NUL-terminated URL and a valid out-pointer.
    let rc = unsafe { lock_client_open(url.as_ptr(), &mut client) };
    assert_eq!(rc, LOCK_OK);
    // SAFETY: all-zero bytes are a valid value of this C struct, which init then fills.
    let mut opts: lock_acquire_options_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid struct of the size given.
    let rc = unsafe { lock_acquire_options_init(&mut opts, std::mem::size_of_val(&opts)) };
    assert_eq!(rc, LOCK_OK);
    opts.renew = false;
    (client, opts)
}

fn evicting_server() -> RedisServer {
    RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"])
}

/// C ABI: `lock_adopt` (renew off) as a fresh client's first request. The child gets
/// `LOCK_ERR_INTERNAL` and no live handle, and its `lock_client_close` of the client it
/// inherited releases nothing: the parent keeps its lock.
#[test]
fn a_child_forked_after_an_adopts_reply_holds_nothing_and_releases_nothing() {
    let _one = one_at_a_time();
    let server = evicting_server();
    let holder = redlease::Client::open(&server.url()).unwrap();
    let guard = holder
        .lock("fork-after-reply:adopt")
        .renew(false)
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .unwrap();
    let token = guard.token().to_owned();

    let (client, opts) = client_without_renewal(&server);
    let key = c"fork-after-reply:adopt";
    let ctoken = CString::new(token.clone()).unwrap();
    let mut lock: lock_t = 0;
    arm();
    // SAFETY: valid arguments.
    let rc = unsafe {
        lock_adopt(
            client,
            key.as_ptr(),
            ctoken.as_ptr(),
            60_000,
            &opts,
            &mut lock,
        )
    };
    if CHILD.load(Ordering::SeqCst) == -1 {
        let mut held = false;
        // SAFETY: valid arguments and out-pointers for the call.
        let held_rc = unsafe { lock_is_held(lock, &mut held) };
        let close_rc = lock_client_close(client);
        eprintln!(
            "CHILD: lock_adopt rc={rc} handle={lock} lock_is_held rc={held_rc} held={held} \
             lock_client_close rc={close_rc}"
        );
        // SAFETY: ends the child.
        unsafe { libc::_exit(if held { 1 } else { 0 }) }
    }
    disarm();
    let child = CHILD.load(Ordering::SeqCst);
    assert!(child > 0, "no policy warning: the callback never forked");
    assert_eq!(rc, LOCK_OK, "the parent's adopt");
    let status = exit_status(child, Duration::from_secs(10));
    let key_now = server.get("fork-after-reply:adopt");
    eprintln!(
        "PARENT: child status {status:?}; key now {key_now:?} (token {token}); parent guard is_held {}",
        guard.is_held()
    );
    assert_eq!(
        key_now.as_deref(),
        Some(token.as_str()),
        "the child released the parent's lock (child exit {status:?}: 1 = is_held true in child)"
    );
    lock_release(lock);
    lock_client_close(client);
    drop(guard);
}

/// Rust API: `LockBuilder::adopt` (renew off) as a fresh client's first request: in the
/// child it fails (`Internal`), no guard of its parent's lock is made, and the parent
/// keeps its lock.
#[test]
fn a_rust_adopt_forked_after_its_reply_fails_in_the_child() {
    let _one = one_at_a_time();
    let server = evicting_server();
    let holder = redlease::Client::open(&server.url()).unwrap();
    let guard = holder
        .lock("fork-after-reply:radopt")
        .renew(false)
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .unwrap();
    let token = guard.token().to_owned();
    let fresh = redlease::Client::open(&server.url()).unwrap();
    arm();
    let adopted = fresh
        .lock("fork-after-reply:radopt")
        .renew(false)
        .ttl(Duration::from_secs(60))
        .adopt(&token);
    if CHILD.load(Ordering::SeqCst) == -1 {
        let code = match adopted {
            Ok(g) => {
                let held = g.is_held();
                let ext = g.extend(Duration::from_secs(120));
                let rel = g.release();
                eprintln!("CHILD: adopt Ok; is_held {held}; extend {ext:?}; release {rel:?}");
                1
            }
            Err(e) => {
                eprintln!("CHILD: adopt Err {e}");
                0
            }
        };
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) }
    }
    disarm();
    let child = CHILD.load(Ordering::SeqCst);
    assert!(child > 0, "no policy warning: the callback never forked");
    let adopted = adopted.expect("the parent's adopt");
    let status = exit_status(child, Duration::from_secs(10));
    let key_now = server.get("fork-after-reply:radopt");
    eprintln!(
        "PARENT: child status {status:?}; key now {key_now:?}; pttl {}",
        server.pttl("fork-after-reply:radopt")
    );
    assert_eq!(
        status,
        Some(0),
        "1: the child's adopt returned Ok for its parent's lock"
    );
    assert_eq!(
        key_now.as_deref(),
        Some(token.as_str()),
        "the child released the parent's lock"
    );
    adopted.abandon();
    drop(guard);
}

/// Rust API: a lock set (one group on one server: one script) without renewal as a fresh
/// client's first request: in the child it fails (`Internal`), and nothing of the
/// parent's names is released.
#[test]
fn a_rust_lock_set_forked_after_its_reply_fails_in_the_child() {
    let _one = one_at_a_time();
    let server = evicting_server();
    let fresh = redlease::Client::open(&server.url()).unwrap();
    arm();
    let set = fresh
        .lock_all(&["fork-after-reply:set:a", "fork-after-reply:set:b"])
        .renew(false)
        .ttl(Duration::from_secs(60))
        .try_acquire();
    if CHILD.load(Ordering::SeqCst) == -1 {
        let code = match set {
            Ok(m) => {
                let held = m.is_held();
                let rel = m.release();
                eprintln!("CHILD: lock_all Ok; is_held {held}; release {rel:?}");
                1
            }
            Err(e) => {
                eprintln!("CHILD: lock_all Err {e}");
                0
            }
        };
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) }
    }
    disarm();
    let child = CHILD.load(Ordering::SeqCst);
    assert!(child > 0, "no policy warning: the callback never forked");
    let set = set.expect("the parent's lock_all");
    let status = exit_status(child, Duration::from_secs(10));
    let (a, b) = (
        server.get("fork-after-reply:set:a"),
        server.get("fork-after-reply:set:b"),
    );
    eprintln!(
        "PARENT: child status {status:?}; keys now {a:?} {b:?}; parent is_held {}",
        set.is_held()
    );
    assert_eq!(
        status,
        Some(0),
        "1: the child's lock_all returned Ok for its parent's names"
    );
    assert!(
        a.is_some() && b.is_some(),
        "the child released the parent's names"
    );
    set.release().unwrap();
}

/// C ABI: `lock_acquire_all` without renewal as a fresh client's first request: the child
/// gets `LOCK_ERR_INTERNAL` and no live handles, and its `lock_client_close` of the
/// inherited client releases none of the parent's names.
#[test]
fn a_child_forked_after_a_lock_sets_reply_releases_nothing() {
    let _one = one_at_a_time();
    let server = evicting_server();
    let (client, opts) = client_without_renewal(&server);
    let names = [
        c"fork-after-reply:cset:a".as_ptr(),
        c"fork-after-reply:cset:b".as_ptr(),
    ];
    let mut out: [lock_t; 2] = [0; 2];
    arm();
    // SAFETY: valid arguments.
    let rc = unsafe {
        lock_acquire_all(
            client,
            names.as_ptr(),
            2,
            60_000,
            0,
            &opts,
            out.as_mut_ptr(),
        )
    };
    if CHILD.load(Ordering::SeqCst) == -1 {
        let mut held = false;
        // SAFETY: valid arguments and out-pointers for the call.
        let held_rc = unsafe { lock_is_held(out[0], &mut held) };
        let close_rc = lock_client_close(client);
        eprintln!(
            "CHILD: lock_acquire_all rc={rc} handles={out:?} lock_is_held rc={held_rc} held={held} \
             lock_client_close rc={close_rc}"
        );
        // SAFETY: ends the child.
        unsafe { libc::_exit(if held { 1 } else { 0 }) }
    }
    disarm();
    let child = CHILD.load(Ordering::SeqCst);
    assert!(child > 0, "no policy warning: the callback never forked");
    assert_eq!(rc, LOCK_OK, "the parent's lock_acquire_all");
    let status = exit_status(child, Duration::from_secs(10));
    let (a, b) = (
        server.get("fork-after-reply:cset:a"),
        server.get("fork-after-reply:cset:b"),
    );
    eprintln!("PARENT: child status {status:?}; keys now {a:?} {b:?}");
    assert!(
        a.is_some() && b.is_some(),
        "the child released the parent's names (child exit {status:?})"
    );
    lock_client_close(client);
}

static ON_LOST_CHILD: AtomicI32 = AtomicI32::new(0);

/// Rust API: a lock set's `on_lost` for a name lost while later names were waited for,
/// called as the set is completed: a fork in it fails the call in the child (`Internal`).
#[test]
fn a_fork_in_a_lock_sets_on_lost_fails_the_call_in_the_child() {
    let server = RedisServer::start();
    let url = server.url();
    let opts = redlease::ClientOptions::default();
    let other = redlease::Client::redlock(&[&url], opts.clone()).unwrap();
    let blocker = other
        .lock("fork-after-reply:ml:b")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .unwrap();
    let waiter = {
        let url = url.clone();
        std::thread::spawn(move || {
            let client =
                redlease::Client::redlock(&[&url], redlease::ClientOptions::default()).unwrap();
            let result = client
                .lock_all(&["fork-after-reply:ml:a", "fork-after-reply:ml:b"])
                .ttl(Duration::from_millis(1500))
                .on_lost(|name, reason| {
                    if ON_LOST_CHILD.load(Ordering::SeqCst) == 0 {
                        // SAFETY: fork; the child returns into the library.
                        let pid = unsafe { libc::fork() };
                        ON_LOST_CHILD.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
                        if pid == 0 {
                            eprintln!("CHILD: on_lost({name}, {reason:?}) forked");
                        }
                    }
                })
                .acquire_timeout(Duration::from_secs(15));
            if ON_LOST_CHILD.load(Ordering::SeqCst) == -1 {
                let code = match &result {
                    Ok(m) => {
                        eprintln!("CHILD: lock_all Ok (is_held {})", m.is_held());
                        1
                    }
                    Err(e) if e.kind() == redlease::ErrorKind::Internal => 0,
                    Err(e) => {
                        eprintln!("CHILD: lock_all Err {e}");
                        2
                    }
                };
                std::mem::forget(result);
                // SAFETY: ends the child.
                unsafe { libc::_exit(code) }
            }
            result.map(|m| m.release())
        })
    };
    assert!(crate::support::eventually(Duration::from_secs(5), || {
        server.get("fork-after-reply:ml:a").is_some()
    }));
    let _: i64 = server.cmd(&["DEL", "fork-after-reply:ml:a"]);
    std::thread::sleep(Duration::from_millis(1500));
    blocker.release().unwrap();
    assert!(
        crate::support::eventually(Duration::from_secs(10), || ON_LOST_CHILD
            .load(Ordering::SeqCst)
            != 0),
        "on_lost never ran"
    );
    let child = ON_LOST_CHILD.load(Ordering::SeqCst);
    let status = exit_status(child, Duration::from_secs(10));
    let parent = waiter.join().unwrap();
    eprintln!(
        "PARENT: child status {status:?}; parent result {:?}",
        parent.as_ref().map(|_| ())
    );
    assert_eq!(
        status,
        Some(0),
        "1: the child's lock_all returned Ok after on_lost forked"
    );
}

/// The same fork after the reply in `lock_acquire_opts`, `lock_semaphore_acquire` and
/// `lock_rwlock_acquire` (renew off) as a fresh client's first request: the child gets
/// no handle, and the parent keeps its hold.
#[test]
fn a_child_forked_after_an_acquires_reply_holds_nothing() {
    let _one = one_at_a_time();
    for kind in 0..3 {
        let server = evicting_server();
        let (client, opts) = client_without_renewal(&server);
        let name = c"fork-after-reply:ctl";
        let mut lock: lock_t = 0;
        arm();
        // SAFETY: valid arguments and out-pointers for the call.
        let rc = unsafe {
            match kind {
                0 => lock_acquire_opts(client, name.as_ptr(), 60_000, 0, &opts, &mut lock),
                1 => lock_semaphore_acquire(client, name.as_ptr(), 2, 60_000, 0, &opts, &mut lock),
                _ => lock_rwlock_acquire(
                    client,
                    name.as_ptr(),
                    LOCK_RW_WRITE,
                    60_000,
                    0,
                    &opts,
                    &mut lock,
                ),
            }
        };
        if CHILD.load(Ordering::SeqCst) == -1 {
            let mut held = false;
            // SAFETY: valid arguments and out-pointers for the call.
            let held_rc = unsafe { lock_is_held(lock, &mut held) };
            let close_rc = lock_client_close(client);
            eprintln!(
                "CHILD kind {kind}: rc={rc} handle={lock} is_held rc={held_rc} {held} close {close_rc}"
            );
            // SAFETY: valid arguments and out-pointers for the call.
            unsafe {
                libc::_exit(if rc == LOCK_ERR_INTERNAL && !held {
                    0
                } else {
                    1
                })
            }
        }
        disarm();
        let child = CHILD.load(Ordering::SeqCst);
        assert!(child > 0, "no fork");
        assert_eq!(rc, LOCK_OK);
        let status = exit_status(child, Duration::from_secs(10));
        let mut held = false;
        // SAFETY: valid arguments and out-pointers for the call.
        unsafe { lock_is_held(lock, &mut held) };
        eprintln!(
            "PARENT kind {kind}: child {status:?}; parent held {held}; release {}",
            lock_release(lock)
        );
        assert_eq!(status, Some(0), "kind {kind}");
        lock_client_close(client);
    }
}

/// Other threads of the parent use the same client's pool at the fork (its lock, which is
/// not held across fork, may be taken by one of them then): the child fails its parent's
/// call with `LOCK_ERR_INTERNAL` without touching the pool, and does not hang.
#[test]
fn a_child_forked_while_other_threads_use_the_pool_does_not_hang() {
    let _one = one_at_a_time();
    let server = evicting_server();
    let url = server.url();
    let (mut hung, mut forks) = (0, 0);
    for _ in 0..1000 {
        let client = std::sync::Arc::new(redlease::Client::open(&url).unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hot: Vec<_> = (0..2)
            .map(|_| {
                let (client, stop) = (client.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !HOT_GO.load(Ordering::SeqCst) && !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    while !stop.load(Ordering::Relaxed) {
                        let _ = client.is_locked("fork-after-reply:hot");
                    }
                })
            })
            .collect();
        HOT_GO.store(false, Ordering::SeqCst);
        arm_hot();
        // SAFETY: ping through the C ABI is not reachable with a Rust client; use is_locked.
        let r = client.is_locked("fork-after-reply:main");
        if CHILD.load(Ordering::SeqCst) == -1 {
            // SAFETY: ends the child.
            unsafe { libc::_exit(if r.is_err() { 0 } else { 1 }) }
        }
        disarm();
        stop.store(true, Ordering::Relaxed);
        for h in hot {
            h.join().unwrap();
        }
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            forks += 1;
            let mut st = 0;
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            let mut done = false;
            while std::time::Instant::now() < deadline {
                // SAFETY: waits for our own child.
                if unsafe { libc::waitpid(child, &mut st, libc::WNOHANG) } == child {
                    done = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if !done {
                hung += 1;
                let out = std::process::Command::new("gdb")
                    .args(["-batch", "-p", &child.to_string(), "-ex", "bt"])
                    .output();
                if let Ok(o) = out {
                    let text = String::from_utf8_lossy(&o.stdout);
                    eprintln!(
                        "HUNG CHILD {child} STACK:\n{}",
                        text.lines()
                            .filter(|l| l.starts_with('#'))
                            .collect::<Vec<_>>()
                            .join("\n")
                    );
                }
                // SAFETY: valid arguments and out-pointers for the call.
                unsafe {
                    libc::kill(child, libc::SIGKILL);
                    libc::waitpid(child, &mut st, 0);
                }
            }
        }
    }
    eprintln!("PARENT: {forks} forks, {hung} children hung");
    assert_eq!(
        hung, 0,
        "{hung} of {forks} children hung in their parent's call"
    );
}

static HOT_GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// As fork_on_policy, but lets the hot threads run for a moment first.
unsafe extern "C" fn fork_on_policy_hot(
    l: i32,
    t: *const c_char,
    msg: *const c_char,
    u: *mut c_void,
) {
    // SAFETY: a NUL-terminated string valid during the call.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    if me == FORK_THREAD.load(Ordering::SeqCst)
        && m.contains("maxmemory-policy")
        && CHILD.load(Ordering::SeqCst) == 0
    {
        HOT_GO.store(true, Ordering::SeqCst);
        let until = std::time::Instant::now() + Duration::from_millis(3);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    // SAFETY: valid arguments and out-pointers for the call.
    unsafe { fork_on_policy(l, t, msg, u) }
}

fn arm_hot() {
    CHILD.store(0, Ordering::SeqCst);
    // SAFETY: no preconditions.
    FORK_THREAD.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
    // SAFETY: valid arguments and out-pointers for the call.
    let rc = unsafe {
        lock_set_log_callback(
            LOCK_LOG_WARN,
            Some(fork_on_policy_hot),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, LOCK_OK);
}
