//! Signals never fail a call: a signal during a blocking wait (a handler installed with
//! `SA_RESTART`, whose socket reads are interrupted nevertheless) is resumed, and a storm
//! of signals through 2,000 acquire/release cycles fails nothing. (Issue 9, item 1.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::Client;

use crate::support::{RedisServer, install_noop_handler, within};

/// Sends `signal` to `thread` every `every` until `stop` is set.
fn storm(thread: libc::pthread_t, signal: i32, every: Duration, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            // SAFETY: the target thread is alive until `stop` is set (the test joins it
            // only after setting `stop` and this loop seeing it).
            unsafe { libc::pthread_kill(thread, signal) };
            std::thread::sleep(every);
        }
    });
}

/// Issue 9, item 1: a signal during a blocking wait (a handler installed with `SA_RESTART`,
/// whose socket reads are nevertheless interrupted) is resumed, never a failure.
#[test]
fn signals_during_a_wait_are_resumed() {
    install_noop_handler(libc::SIGUSR1, true);
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let holder = client.lock("sig-wait").try_acquire().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let started = Instant::now();
            let r = client
                .lock("sig-wait")
                .acquire_timeout(Duration::from_secs(3));
            (r.map(|g| g.release()), started.elapsed())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    storm(
        rx.recv().unwrap(),
        libc::SIGUSR1,
        Duration::from_millis(5),
        stop.clone(),
    );
    std::thread::sleep(Duration::from_secs(1));
    holder.release().unwrap();
    let (result, took) = within(Duration::from_secs(10), move || waiter.join().unwrap());
    stop.store(true, Ordering::SeqCst);
    result
        .expect("the wait failed")
        .expect("the release failed");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// Issue 9, item 1: a signal storm during 2,000 acquire/release cycles: no failed acquire,
/// no false "not held".
#[test]
fn a_signal_storm_never_fails_a_call() {
    install_noop_handler(libc::SIGUSR1, true);
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // SAFETY: pthread_self has no preconditions.
    storm(
        unsafe { libc::pthread_self() },
        libc::SIGUSR1,
        Duration::from_micros(500),
        stop.clone(),
    );
    let mut failures = Vec::new();
    for _ in 0..2000 {
        match client.lock("storm").try_acquire() {
            Ok(guard) => {
                if let Err(e) = guard.release() {
                    failures.push(format!("release: {e}"));
                }
            }
            Err(e) => failures.push(format!("acquire: {e}")),
        }
    }
    stop.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(10));
    assert!(
        failures.is_empty(),
        "{} failures: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// The signals blocked on thread `tid` of this process (`SigBlk` in its status).
fn blocked_signals(tid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
    u64::from_str_radix(mask.trim(), 16).ok()
}

/// The library's threads (renewal, batching, give-back, connecting, DNS) start with every
/// asynchronous signal blocked: the program's handlers run on its own threads only (a
/// handler that forked on a renewal thread would renew its parent's lock in the child),
/// whatever mask the thread that made them had. Checked in a child process of its own, so
/// that other tests' threads (one running a callback, with the program's mask) are not
/// among those looked at.
#[test]
fn the_librarys_threads_block_the_programs_signals() {
    let server = RedisServer::start();
    let url = server.url();
    // SAFETY: fork; the child runs `threads_of_a_child_block_signals` and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let verdict = std::panic::catch_unwind(|| threads_of_a_child_block_signals(&url));
        // SAFETY: ends the child without its parent's destructors.
        unsafe { libc::_exit(if verdict.is_ok() { 0 } else { 1 }) }
    }
    assert_eq!(
        crate::support::exit_status(pid, Duration::from_secs(20)),
        Some(0),
        "a thread of the library takes the program's signals (see the child's message)"
    );
}

/// In a child process: holds two renewed locks until the renewals are batched, then
/// checks every thread of the library.
fn threads_of_a_child_block_signals(url: &str) {
    let client = Client::open(url).unwrap();
    let guards: Vec<_> = (0..2)
        .map(|i| {
            client
                .lock(&format!("signals:threads:{i}"))
                .ttl(Duration::from_millis(600))
                .try_acquire()
                .unwrap()
        })
        .collect();
    // Renewals every 200 ms: by now batched, on the node's batching thread.
    std::thread::sleep(Duration::from_millis(700));
    let bit = |signal: i32| 1u64 << (signal - 1);
    let wanted = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGCHLD,
        libc::SIGALRM,
    ];
    let mut seen = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let tid = task.file_name().to_string_lossy().into_owned();
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let name = name.trim();
        if !name.starts_with("redlease-") {
            continue;
        }
        let Some(mask) = blocked_signals(&tid) else {
            continue; // ended meanwhile
        };
        for signal in wanted {
            assert!(
                mask & bit(signal) != 0,
                "thread {name} ({tid}) takes signal {signal} (blocked: {mask:#x})"
            );
        }
        assert_eq!(mask & bit(libc::SIGSEGV), 0, "thread {name} blocks SIGSEGV");
        seen.push(name.to_owned());
    }
    assert!(
        seen.iter().any(|n| n == "redlease-renew") && seen.iter().any(|n| n == "redlease-batch"),
        "no renewal or batching thread found: {seen:?}"
    );
    for guard in guards {
        guard.release().unwrap();
    }
}

/// The signals blocked on the calling thread.
fn my_blocked_signals() -> u64 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    blocked_signals(&tid.to_string()).expect("this thread's status")
}

/// Caller code that runs on a thread of the library (here a lost-lock handler, on the
/// renewal thread) runs with the library's mask, every signal blocked: a signal the
/// program blocks everywhere to read it itself (`sigwait`, a `signalfd`) is never taken
/// there, nor does a handler of the program run in the middle of a renewal.
#[test]
fn caller_code_on_the_librarys_threads_runs_with_signals_blocked() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let guard = {
        let seen = seen.clone();
        client
            .lock("signals:handler-mask")
            .ttl(Duration::from_millis(600))
            .on_lost(move |_| {
                let name = std::thread::current().name().map(str::to_owned);
                *seen.lock().unwrap() = Some((name, my_blocked_signals()));
            })
            .try_acquire()
            .unwrap()
    };
    let _: i64 = server.cmd(&["DEL", "signals:handler-mask"]);
    assert!(
        crate::support::eventually(Duration::from_secs(5), || seen.lock().unwrap().is_some()),
        "the lost-lock handler never ran"
    );
    let (thread, mask) = seen.lock().unwrap().clone().unwrap();
    assert_eq!(thread.as_deref(), Some("redlease-renew"));
    let bit = |signal: i32| 1u64 << (signal - 1);
    for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGUSR1] {
        assert!(
            mask & bit(signal) != 0,
            "the handler ran with signal {signal} unblocked (blocked: {mask:#x})"
        );
    }
    drop(guard);
}
