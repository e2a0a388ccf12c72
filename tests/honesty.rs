//! Honest outcomes (issue 9): every call returns what is true, within the bound it
//! documents, under signals, short timeouts, lost replies, resets and starved pools. Each
//! test names the item of the issue it covers.

mod support;

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind, LostReason};
use support::proxy::{Action, Proxy};
use support::{RedisServer, eventually, install_noop_handler, options_ms, within};

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

/// Item 1: a signal during a blocking wait (a handler installed with `SA_RESTART`, whose
/// socket reads are nevertheless interrupted) is resumed, never a failure.
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

/// Item 1: a signal storm during 2,000 acquire/release cycles: no failed acquire, no
/// false "not held".
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

/// Item 3: the connect timeout bounds the whole handshake (a server that accepts TCP and
/// never answers costs one connect timeout, not one per handshake command: the second
/// URL's `AUTH` and `SELECT` would then take 2 s, as would a handshake bounded by the I/O
/// timeout).
#[test]
fn the_connect_timeout_bounds_the_handshake() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for url in [
        format!("redis://:pw@127.0.0.1:{port}/0"),
        format!("redis://u:pw@127.0.0.1:{port}/3"),
    ] {
        let client = Client::with_options(&url, options_ms(2000, 1000)).unwrap();
        let started = Instant::now();
        let err = client.ping().unwrap_err();
        let took = started.elapsed();
        assert!(err.is_unreachable(), "{err}");
        assert!(took < Duration::from_millis(1800), "{url}: {took:?}");
    }
    drop(silent);
}

/// Item 3: the lost signal fires at the lease's local deadline, even when the renewal has
/// to reconnect to a server whose handshake never answers. The lateness is printed (the
/// benchmark reports it as a figure); the assertion only has a margin for a busy machine (a
/// signal that waited for the reconnect would come over 2 s late: the first renewal, a
/// third of the ttl in, plus the 3 s connect timeout, against the 1 s deadline).
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

/// Item 4: a release whose reply is lost is reported as a connection error whose outcome
/// is unknown, never as a false "not held"; it is not repeated blindly. 3 of 3 runs. (The
/// I/O timeout, which each dropped reply costs, is 1 s: short, yet long enough for the other
/// calls on a loaded host.)
#[test]
fn a_release_whose_reply_is_lost_is_not_reported_as_not_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options_ms(1000, 1000)).unwrap();
    // Scripts cached, so that the dropped reply is the one of a release that ran.
    client
        .lock("warm")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    for run in 0..3 {
        let name = format!("lost-reply-{run}");
        let guard = client.lock(&name).renew(false).try_acquire().unwrap();
        let rule = proxy.on_request(b":handoff", 1, Action::DropReply);
        let err = guard.release().unwrap_err();
        assert_eq!(proxy.matched(rule), 1);
        assert!(err.is_unreachable() && err.outcome_unknown(), "{err}");
        assert!(
            !server.cmd::<bool>(&["EXISTS", &name]),
            "the release ran once"
        );
    }
}

/// Item 4: a single attempt whose reply is lost reports a connection error, and the lock
/// it may have taken is given back (nobody is left holding it under a token no one has).
#[test]
fn an_acquire_whose_reply_is_lost_reports_an_error_and_holds_nothing() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options_ms(1000, 1000)).unwrap();
    client.ping().unwrap();
    let rule = proxy.on_request(b"lost-acquire", 1, Action::DropReply);
    let err = client.lock("lost-acquire").try_acquire().unwrap_err();
    assert_eq!(proxy.matched(rule), 1);
    assert!(err.is_unreachable() && err.outcome_unknown(), "{err}");
    assert!(
        eventually(Duration::from_secs(2), || !server
            .cmd::<bool>(&["EXISTS", "lost-acquire"])),
        "the lock taken by the lost attempt was not given back"
    );
}

/// Item 5: a waiter whose blocked connection is reset reconnects and keeps waiting.
#[test]
fn a_waiter_survives_resets_of_its_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = Client::open(&server.url())
        .unwrap()
        .lock("reset")
        .try_acquire()
        .unwrap();
    let waiter = {
        let url = proxy.url();
        std::thread::spawn(move || {
            Client::open(&url)
                .unwrap()
                .lock("reset")
                .acquire_timeout(Duration::from_secs(20))
                .map(|g| g.release())
        })
    };
    for _ in 0..5 {
        assert!(eventually(Duration::from_secs(5), || proxy
            .open_connections()
            > 0));
        std::thread::sleep(Duration::from_millis(150));
        proxy.reset_all();
    }
    holder.release().unwrap();
    within(Duration::from_secs(10), move || waiter.join().unwrap())
        .expect("the waiter failed")
        .unwrap();
}

/// Item 6: releases never wait behind blocked waiters: with a pool of 4 and 40 waiters,
/// every release goes through at once (the bound leaves a loaded host time; a release
/// starved of a connection would wait out the 2 s pool wait, then fail), and every waiter
/// gets the lock in the end.
#[test]
fn releases_are_never_starved_by_blocked_waiters() {
    let server = RedisServer::start();
    let client =
        Client::with_options(&server.url(), ClientOptions::default().pool_size(4)).unwrap();
    let holder = client.lock("starve").try_acquire().unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let waiters: Vec<_> = (0..40)
        .map(|_| {
            let (client, got) = (client.clone(), got.clone());
            std::thread::spawn(move || {
                let guard = client
                    .lock("starve")
                    .acquire_timeout(Duration::from_secs(60))?;
                got.fetch_add(1, Ordering::SeqCst);
                guard.release()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    holder.release().unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    within(Duration::from_secs(60), move || {
        for w in waiters {
            w.join().unwrap().unwrap();
        }
    });
    assert_eq!(got.load(Ordering::SeqCst), 40);
}

/// Item 7: waiting works with every accepted I/O timeout, even one far shorter than the
/// ~100 ms by which Redis may end a block late. Only the waiter uses the 10 ms client: a
/// single call with so short a timeout may honestly time out on a loaded host (CI refused a
/// submission for the holder's `try_acquire` doing so), while a waiter rides out timeouts
/// for as long as they last less than its grace.
#[test]
fn waiting_works_with_a_10_ms_io_timeout() {
    let server = RedisServer::start();
    let steady = Client::open(&server.url()).unwrap();
    let short = Client::with_options(&server.url(), options_ms(10, 1000)).unwrap();
    for round in 0..3 {
        let name = format!("short-io-{round}");
        let holder = steady.lock(&name).try_acquire().unwrap();
        let waiter = {
            let (short, name) = (short.clone(), name.clone());
            std::thread::spawn(move || short.lock(&name).acquire_timeout(Duration::from_secs(5)))
        };
        std::thread::sleep(Duration::from_millis(700));
        holder.release().unwrap();
        let guard = within(Duration::from_secs(10), move || waiter.join().unwrap())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        // The wait ended in a grant the server agrees with.
        let key = guard.key().to_owned();
        let owner: Option<String> = server.cmd(&["GET", &key]);
        assert_eq!(owner.as_deref(), Some(guard.token()), "round {round}");
        // A release with a 10 ms timeout may itself time out: that outcome is unknown,
        // never false, and the steady client's release below makes the next round clean.
        if let Err(e) = guard.release() {
            assert_eq!(e.kind(), ErrorKind::Timeout, "round {round}: {e}");
        }
        let _: i64 = server.cmd(&["DEL", &key]);
    }
}

/// Item 9: closing a client closes its connections at once, also after renewal threads
/// served its locks. (The check allows a loaded host 5 s; a connection kept by a parked
/// renewal or batching thread would stay open for their 30 s idle time.)
#[test]
fn a_closed_client_closes_its_connections() {
    let server = RedisServer::start();
    let connected = || -> i64 {
        let info: String = server.cmd(&["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    let scripts = || server.calls("evalsha") + server.calls("eval");
    let baseline = connected();
    let client = Client::open(&server.url()).unwrap();
    for i in 0..5 {
        let guard = client
            .lock(&format!("close-{i}"))
            .ttl(Duration::from_millis(1000))
            .try_acquire()
            .unwrap();
        // Until its first renewal ran (a third of the ttl in).
        let before = scripts();
        assert!(
            eventually(Duration::from_secs(5), || scripts() > before),
            "close-{i} was never renewed"
        );
        guard.release().unwrap();
    }
    assert!(connected() > baseline);
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || connected() <= baseline),
        "{} connections left open",
        connected() - baseline
    );
}

/// Item 10: passwords as people paste them (with `/`, `#`, `?`, `@` unencoded) never
/// appear in errors or in `Debug` output.
#[test]
fn awkward_passwords_never_leak() {
    let port = support::free_port();
    for pw in [
        "Qx7-pa/zz9w0rd",
        "p#zz9w0rd",
        "p?zz9w0rd",
        "p@zz9w0rd",
        "a/b?c#d@e-zz9",
    ] {
        for url in [
            format!("redis://:{pw}@127.0.0.1:{port}/0"),
            format!("redis://alice:{pw}@127.0.0.1:{port}"),
            format!("redis+unix:///tmp/none.sock?pass={pw}&db=1"),
            format!("redis://:{pw}@[::1"),
        ] {
            let shown = match Client::with_options(&url, options_ms(200, 200)) {
                Ok(client) => {
                    let err = client.ping().unwrap_err();
                    format!("{err} {err:?} {client:?} {}", client.url())
                }
                Err(err) => format!("{err} {err:?}"),
            };
            assert!(!shown.contains(pw), "{url}: {shown}");
            assert!(!shown.contains("zz9"), "{url}: {shown}");
        }
    }
}

/// Item 11: a CA certificate path naming a FIFO (or a directory) is refused at once instead
/// of blocking `lock_client_open_opts` forever.
#[test]
fn a_ca_file_that_is_not_a_regular_file_is_refused_at_once() {
    use redlease::ffi::*;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ca.fifo");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let c_dir = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
    for path in [c_fifo, c_dir] {
        let status = within(Duration::from_secs(5), move || {
            let url = c"rediss://127.0.0.1:1/0";
            let mut opts = std::mem::MaybeUninit::<lock_client_options_t>::uninit();
            // SAFETY: valid pointers to a local struct and strings that outlive the calls.
            unsafe {
                assert_eq!(
                    lock_client_options_init(
                        opts.as_mut_ptr(),
                        std::mem::size_of::<lock_client_options_t>()
                    ),
                    LOCK_OK
                );
                let mut opts = opts.assume_init();
                opts.tls_ca_cert_file = path.as_ptr();
                let mut client = 0;
                lock_client_open_opts(url.as_ptr(), &opts, &mut client)
            }
        });
        assert_eq!(status, LOCK_ERR_ARGUMENT);
    }
}

/// Item 13: ttls too short to be held are refused with the minimum in the message; a pool
/// wait of zero is valid; once a lock is lost, extend never succeeds again.
#[test]
fn short_ttls_zero_pool_wait_and_extend_after_a_loss() {
    let server = RedisServer::start();
    let client = Client::with_options(
        &server.url(),
        ClientOptions::default().pool_wait(Duration::ZERO),
    )
    .unwrap();
    for ms in [1, 2, 9] {
        let err = client
            .lock("tiny")
            .ttl(Duration::from_millis(ms))
            .try_acquire()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("10ms"), "{err}");
    }
    let shortest = client
        .lock("tiny")
        .ttl(redlease::MIN_TTL)
        .renew(false)
        .try_acquire()
        .unwrap();
    drop(shortest);
    // Lost by expiry (a fixed lease), then by a foreign delete (renewal on).
    let fixed = client
        .lock("lost-fixed")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .try_acquire()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(!fixed.is_held());
    assert_eq!(
        fixed.extend(Duration::from_secs(10)).unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let renewed = client
        .lock("lost-renewed")
        .ttl(Duration::from_millis(300))
        .try_acquire()
        .unwrap();
    let lost = renewed.lost();
    server.cmd::<()>(&["DEL", "lost-renewed"]);
    assert!(lost.recv_timeout(Duration::from_secs(2)).is_ok());
    server.cmd::<()>(&["SET", "lost-renewed", renewed.token()]);
    for _ in 0..20 {
        assert_eq!(
            renewed.extend(Duration::from_secs(10)).unwrap_err().kind(),
            ErrorKind::NotHeld,
            "extend succeeded after the loss"
        );
        assert!(!renewed.is_held());
    }
}

/// A release reports `Ok` only for a lock held without a break. Renewals that ran on the
/// server but whose replies were lost leave the key alive past the local deadline: the lock
/// is lost (the holder was told), so a release then deletes the key but reports `NotHeld`.
#[test]
fn a_release_after_a_loss_reports_not_held_and_still_frees_the_key() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = Client::with_options(&proxy.url(), options_ms(1000, 1000)).unwrap();
    let name = "lost-then-released";
    // The ttl in milliseconds marks the renewals (EXTEND name token 1733).
    let guard = client
        .lock(name)
        .ttl(Duration::from_millis(1733))
        .acquire()
        .unwrap();
    let lost = guard.lost();
    let rule = proxy.on_request(b"1733", 1000, Action::DropReply);
    // The key outlives the local deadline, as when the server ran renewals whose replies
    // were lost. (Whether these did depends on timing and on the script cache: a NOSCRIPT
    // answer dropped with the rest leaves the key as it was, 19 ms past the deadline.)
    assert!(server.cmd::<bool>(&["PEXPIRE", name, "60000"]));
    lost.recv_timeout(Duration::from_secs(5))
        .expect("the lock is lost when no renewal reply arrives");
    assert!(proxy.matched(rule) >= 1, "renewals ran");
    proxy.clear_rules();
    assert!(
        server.cmd::<i64>(&["PTTL", name]) > 0,
        "the key outlives the local deadline"
    );
    let err = guard.release().unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(err.to_string().contains("was lost"), "{err}");
    assert!(
        !server.cmd::<bool>(&["EXISTS", name]),
        "the key was deleted"
    );
    // A lock held without a break is released with Ok.
    let guard = client.lock(name).try_acquire().unwrap();
    guard.release().unwrap();
}
