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
