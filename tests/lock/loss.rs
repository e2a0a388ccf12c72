//! Lost-lock reporting: when a lock is lost (its key deleted or overwritten, the server
//! silent past the lease) the holder is told once, by the `lost()` channel and the
//! `on_lost` callback, at the lease's local deadline, not when a late reply or a reconnect
//! finally comes; renewal stops; and a loss is final: `is_held()` stays false, extend and
//! release answer `NotHeld`. (Losses through a late extend: `extend`; through a restart:
//! `faults`; of reentrant holds: `kinds::reentrant`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ErrorKind, LostReason};

use crate::renewal::TTL;
use crate::support::proxy::{Action, Proxy};
use crate::support::{RedisServer, eventually, options, options_ms, warm, within};

fn assert_loss_detected(tamper: &[&str], expected_value: Option<&str>) {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let guard = client
        .lock("victim")
        .ttl(TTL)
        .on_lost(move |reason| {
            assert_eq!(reason, LostReason::NotHeld);
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    server.cmd::<()>(tamper);
    let tampered = Instant::now();
    let reason = lost
        .recv_timeout(TTL / 3 + Duration::from_millis(1500))
        .expect("the loss was not signalled within ttl/3 plus a margin");
    eprintln!("loss signalled {:?} after tampering", tampered.elapsed());
    assert_eq!(reason, LostReason::NotHeld);
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(LostReason::NotHeld));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // No renewal after the loss: the script count stays put over several renewal periods.
    let after_loss = server.calls("evalsha");
    std::thread::sleep(TTL);
    assert_eq!(
        server.calls("evalsha"),
        after_loss,
        "a renewal ran after the loss"
    );

    let err = guard.release().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    let stored: Option<String> = server.cmd(&["GET", "victim"]);
    assert_eq!(
        stored.as_deref(),
        expected_value,
        "the release touched a foreign value"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the callback ran twice");
}

#[test]
fn deleting_the_key_fires_the_lost_signal_and_stops_renewal() {
    assert_loss_detected(&["DEL", "victim"], None);
}

#[test]
fn overwriting_the_key_fires_the_lost_signal_and_keeps_the_new_value() {
    assert_loss_detected(&["SET", "victim", "someone-else"], Some("someone-else"));
}

/// A foreign `DEL` of the key between renewals: the next renewal (batched) finds the token
/// gone, the loss is reported (`NotHeld`), it is final (extend `NotHeld`, even once another
/// client holds the key), and the release reports `NotHeld` and leaves the other client's
/// key alone.
#[test]
fn a_foreign_delete_between_renewals_is_a_final_loss() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(500)).unwrap();
    let name = "foreign-del";
    let guard = client
        .lock(name)
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .unwrap();
    let lost = guard.lost();
    std::thread::sleep(Duration::from_millis(350));
    let _: i64 = server.cmd(&["DEL", name]);
    let reason = lost.recv_timeout(Duration::from_secs(3));
    assert_eq!(reason, Ok(LostReason::NotHeld));
    assert!(!guard.is_held());
    let other = Client::open(&server.url()).unwrap();
    let second = other.lock(name).try_acquire().unwrap();
    let extended = guard.extend(Duration::from_millis(900));
    assert!(
        matches!(&extended, Err(e) if e.kind() == ErrorKind::NotHeld),
        "{extended:?}"
    );
    let err = guard.release().unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(server.get(name).as_deref(), Some(second.token()));
    assert!(second.is_held());
    second.release().unwrap();
}

/// Redis paused (SIGSTOP) while a renewed lock is held, resumed after its deadline: the
/// loss is reported near the deadline (not at the resume), `is_held()` is false by the
/// deadline, a later extend fails `NotHeld`, and the release is bounded and reports
/// `NotHeld`. Calls made while the server is paused return within their bounds. (The I/O
/// timeout is longer than the lease: a renewal is cut off at the lease's deadline anyway,
/// and the release just after the resume has time to be answered.)
#[test]
fn a_paused_server_reports_the_loss_on_time_and_a_loss_is_final() {
    let server = RedisServer::start();
    let client = Client::with_options(&server.url(), options(1000)).unwrap();
    let guard = client
        .lock("paused")
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let lost = guard.lost();
    let deadline_left = guard.remaining();
    server.pause();
    let paused = Instant::now();
    let reason = lost.recv_timeout(Duration::from_secs(5));
    let lost_after = paused.elapsed();
    let held = guard.is_held();
    // A call while paused is bounded.
    let started = Instant::now();
    let extended = guard.extend(Duration::from_millis(900));
    let extend_took = started.elapsed();
    std::thread::sleep(Duration::from_millis(1200));
    server.resume();
    let extended_after = guard.extend(Duration::from_millis(900));
    let released = within(Duration::from_secs(5), move || guard.release());
    assert_eq!(reason, Ok(LostReason::Unreachable));
    assert!(
        lost_after < deadline_left + Duration::from_millis(1200),
        "lost {lost_after:?} after the pause, deadline was {deadline_left:?} away"
    );
    assert!(!held);
    assert!(
        matches!(&extended, Err(e) if e.kind() == ErrorKind::NotHeld),
        "{extended:?}"
    );
    assert!(extend_took < Duration::from_secs(2), "{extend_took:?}");
    assert!(
        matches!(&extended_after, Err(e) if e.kind() == ErrorKind::NotHeld),
        "extend after the resume: {extended_after:?}"
    );
    let err = released.unwrap_err();
    assert!(err.is_not_held(), "{err}");
}

/// Issue 9, item 3: the lost signal fires at the lease's local deadline, even when the
/// renewal has to reconnect to a server whose handshake never answers. The lateness is
/// printed (the benchmark reports it as a figure); the assertion only has a margin for a
/// busy machine (a signal that waited for the reconnect would come over 2 s late: the first
/// renewal, a third of the ttl in, plus the 3 s connect timeout, against the 1 s deadline).
#[test]
fn the_lost_signal_fires_at_the_deadline_not_after_a_reconnect() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]);
    let proxy = Proxy::start(server.port);
    let url = format!("redis://:pw@127.0.0.1:{}/0", proxy.port());
    let client = Client::with_options(&url, options_ms(2000, 3000)).unwrap();
    let lost_at = Arc::new(Mutex::new(None));
    let guard = {
        let lost_at = lost_at.clone();
        client
            .lock("late-loss")
            .ttl(Duration::from_secs(1))
            .on_lost(move |_| *lost_at.lock().unwrap() = Some(Instant::now()))
            .acquire()
            .unwrap()
    };
    let acquired = Instant::now();
    // Every connection dies, and new ones get nowhere.
    proxy.blackhole(true);
    proxy.reset_all();
    assert!(eventually(Duration::from_secs(5), || lost_at
        .lock()
        .unwrap()
        .is_some()));
    let lost = lost_at.lock().unwrap().unwrap();
    let deadline = acquired + Duration::from_millis(1000 - 12);
    let late = lost.saturating_duration_since(deadline);
    eprintln!("lost signal {late:?} after the local deadline");
    assert!(
        late < Duration::from_millis(1000),
        "lost {late:?} after the deadline"
    );
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(LostReason::Unreachable));
    proxy.blackhole(false);
}

/// An extend whose reply is held back past the lease's deadline: both the extend's thread
/// and the renewal thread find the loss. The holder is told once (callback count 1, the
/// `lost()` channel once) near the deadline; the extend answers `NotHeld`; `is_held()`
/// stays false after the late reply; the release answers `NotHeld`.
#[test]
fn a_loss_found_by_both_an_extend_and_the_renewal_is_told_once_at_the_deadline() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options(5000)).unwrap();
    warm(&client);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let guard = Arc::new(
        client
            .lock("told-once")
            .ttl(Duration::from_millis(800))
            .on_lost(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .try_acquire()
            .unwrap(),
    );
    guard.extend(Duration::from_millis(800)).unwrap();
    let lost = guard.lost();
    let rule = proxy.on_request(b"1999", 1, Action::DelayReply(Duration::from_secs(2)));
    let called = Instant::now();
    let extender = {
        let guard = guard.clone();
        std::thread::spawn(move || guard.extend(Duration::from_millis(1999)))
    };
    let reason = lost.recv_timeout(Duration::from_secs(4));
    let lost_at = called.elapsed();
    let extended = extender.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let second = lost.try_recv();
    let held = guard.is_held();
    let guard = Arc::try_unwrap(guard).unwrap();
    let released = guard.release();
    assert_eq!(proxy.matched(rule), 1);
    assert!(reason.is_ok(), "never told");
    assert!(lost_at < Duration::from_millis(1500), "told {lost_at:?} in");
    assert!(second.is_err(), "told twice on the channel");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "callback count");
    assert!(
        matches!(&extended, Err(e) if e.kind() == ErrorKind::NotHeld),
        "{extended:?}"
    );
    assert!(!held);
    assert!(released.unwrap_err().is_not_held());
}

/// Nothing is wrong when a release takes back its lock's own renewal from a batch held up
/// by another lock's slow reply: no warning, as for any release (it once logged "renewing
/// lock ... failed, retrying: ... taken back from its batch" and counted a failed renewal).
#[test]
fn a_release_that_takes_back_its_queued_renewal_warns_of_nothing() {
    crate::support::warnings();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = crate::support::client(&proxy.url());
    warm(&client);
    let ttl = Duration::from_secs(6);
    // A lock whose renewal (due at 2 s) gets its reply 3 s late, holding up its batch...
    let _slow = client.lock("stalling").ttl(ttl).try_acquire().unwrap();
    let stalled = proxy.on_request(b"stalling", 1, Action::DelayReply(Duration::from_secs(3)));
    std::thread::sleep(Duration::from_millis(100));
    // ...and one whose renewal, due 0.1 s later, queues behind it.
    let name = "quiet-take-back";
    let guard = client.lock(name).ttl(ttl).try_acquire().unwrap();
    assert!(eventually(Duration::from_secs(10), || proxy
        .matched(stalled)
        == 1));
    std::thread::sleep(Duration::from_millis(300));
    guard.release().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let warned = crate::support::warnings_about(name);
    assert!(warned.is_empty(), "{warned:?}");
}

/// 0 until the handler below forks; then the child's pid in the parent, -1 in the child.
static HANDLER_FORKED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Handlers run in the parent (the forking one included).
static RAN_IN_PARENT: AtomicUsize = AtomicUsize::new(0);

/// Two reentrant holds of one lock, each with a lost-lock handler; the first handler run
/// forks and returns in the child. The child's copy of the renewal thread must not go on
/// with its parent's loss report: the other hold's handler runs in the parent only.
#[test]
fn a_child_forked_in_a_lost_lock_handler_runs_none_of_the_other_handlers() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ran_in_child = dir.path().join("ran-in-child");
    let parent = std::process::id();
    let handler = |which: &'static str| {
        let ran_in_child = ran_in_child.clone();
        move |_: LostReason| {
            if HANDLER_FORKED.load(Ordering::SeqCst) == 0 {
                // SAFETY: fork; the child returns into the library's loss report.
                let pid = unsafe { libc::fork() };
                HANDLER_FORKED.store(if pid == 0 { -1 } else { pid }, Ordering::SeqCst);
                if pid == 0 {
                    return;
                }
            }
            if std::process::id() == parent {
                RAN_IN_PARENT.fetch_add(1, Ordering::SeqCst);
            } else {
                let _ = std::fs::write(&ran_in_child, which);
            }
        }
    };
    let first = client
        .lock("loss:fork-in-handler")
        .ttl(Duration::from_millis(900))
        .reentrant()
        .on_lost(handler("first"))
        .try_acquire()
        .unwrap();
    let second = client
        .lock("loss:fork-in-handler")
        .ttl(Duration::from_millis(900))
        .reentrant()
        .on_lost(handler("second"))
        .try_acquire()
        .unwrap();
    let _: i64 = server.cmd(&["DEL", "loss:fork-in-handler"]);
    assert!(
        eventually(Duration::from_secs(10), || RAN_IN_PARENT
            .load(Ordering::SeqCst)
            == 2),
        "the parent was not told of the loss by both handlers"
    );
    let child = HANDLER_FORKED.load(Ordering::SeqCst);
    assert!(child > 0, "the handler never forked");
    // The child's renewal thread ends; the child itself lives on (its main thread is the
    // parent's copy, which never returns here): give it time, then end it.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: the child's pid, ours to end.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let _ = crate::support::exit_status(child, Duration::from_secs(5));
    assert_eq!(
        std::fs::read_to_string(&ran_in_child).ok(),
        None,
        "a handler of the parent's ran in the child"
    );
    drop((first, second));
}
