//! The lock's behaviour against a real redis-server: acquire, release, waiting, mutual
//! exclusion, fencing, scripts, keys, and bad input.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};
use support::{RedisServer, client, eventually, grant_to_a_vanished_waiter, readme_acl_line};

#[test]
fn acquire_stores_the_token_with_the_ttl_and_release_deletes_it() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let guard = client
        .lock("order:1001")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .unwrap();
    let stored: String = server.cmd(&["GET", "order:1001"]);
    assert_eq!(stored, guard.token());
    assert!(
        guard.token().len() > 36,
        "uuid plus owner label: {}",
        guard.token()
    );
    let pttl: i64 = server.cmd(&["PTTL", "order:1001"]);
    assert!(pttl > 0 && pttl <= 10_000, "pttl {pttl}");
    assert!(guard.is_held());
    assert!(client.is_locked("order:1001").unwrap());
    guard.release().unwrap();
    let exists: bool = server.cmd(&["EXISTS", "order:1001"]);
    assert!(!exists);
    assert!(!client.is_locked("order:1001").unwrap());
}

#[test]
fn every_acquisition_gets_a_fresh_token() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mut tokens = BTreeSet::new();
    for _ in 0..20 {
        let guard = client.lock("fresh").try_acquire().unwrap();
        assert!(tokens.insert(guard.token().to_owned()));
        guard.release().unwrap();
    }
}

#[test]
fn a_held_lock_is_busy_for_others_until_released() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let guard = client.lock("busy").try_acquire().unwrap();
    let err = client.lock("busy").try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let started = Instant::now();
    let err = client
        .lock("busy")
        .acquire_timeout(Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up before its deadline"
    );
    guard.release().unwrap();
    client
        .lock("busy")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn release_after_expiry_does_not_delete_next_holder() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let a = client
        .lock("timeline")
        .ttl(Duration::from_millis(200))
        .renew(false)
        .try_acquire()
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        !server.cmd::<bool>(&["EXISTS", "timeline"])
    }));
    assert!(!a.is_held(), "the local view must see the lease ended");
    let b = client
        .lock("timeline")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .unwrap();
    let pttl_before: i64 = server.cmd(&["PTTL", "timeline"]);

    let err = a.extend(Duration::from_millis(100)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let err = a.release().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");

    let stored: String = server.cmd(&["GET", "timeline"]);
    assert_eq!(stored, b.token());
    let pttl_after: i64 = server.cmd(&["PTTL", "timeline"]);
    assert!(
        pttl_after > 50_000 && pttl_after <= pttl_before,
        "B's ttl was changed: {pttl_before} -> {pttl_after}"
    );
    assert!(b.fencing_token() > 0);
    b.release().unwrap();
}

#[test]
fn dropping_the_guard_releases_the_lock() {
    let server = RedisServer::start();
    let client = client(&server.url());
    {
        let _guard = client.lock("dropped").try_acquire().unwrap();
        assert!(server.cmd::<bool>(&["EXISTS", "dropped"]));
    }
    assert!(!server.cmd::<bool>(&["EXISTS", "dropped"]));
}

#[test]
fn a_waiter_is_woken_by_the_release() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let holder = client.lock("wake").try_acquire().unwrap();
    let first = holder.fencing_token();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let g = client
                .lock("wake")
                .acquire_timeout(Duration::from_secs(20))
                .unwrap();
            g.fencing_token()
        })
    };
    // Let the waiter block on the server, then release.
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") > 0));
    holder.release().unwrap();
    let second = waiter.join().unwrap();
    assert!(second > first);
}

#[test]
fn a_waiter_gets_the_lock_when_a_crashed_holder_expires() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let crashed = client
        .lock("crash")
        .ttl(Duration::from_millis(300))
        .renew(false)
        .try_acquire()
        .unwrap();
    std::mem::forget(crashed); // a holder that dies without releasing
    let guard = client
        .lock("crash")
        .acquire_timeout(Duration::from_secs(10))
        .unwrap();
    assert!(guard.is_held());
}

#[test]
fn eight_threads_keep_a_non_atomic_counter_exact() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 500;
    let server = RedisServer::start();
    let client = client(&server.url());
    let fences = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let fences = fences.clone();
            let mut conn = server.conn();
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let guard = client
                        .lock("counter-lock")
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(60))
                        .unwrap();
                    // Read, pause, write: loses updates unless the lock excludes.
                    let n: i64 = redis::cmd("GET")
                        .arg("counter")
                        .query::<Option<i64>>(&mut conn)
                        .unwrap()
                        .unwrap_or(0);
                    std::thread::yield_now();
                    redis::cmd("SET")
                        .arg("counter")
                        .arg(n + 1)
                        .query::<()>(&mut conn)
                        .unwrap();
                    fences.lock().unwrap().push(guard.fencing_token());
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let count: i64 = server.cmd(&["GET", "counter"]);
    assert_eq!(count, (THREADS * ROUNDS) as i64);
    let waiting: Option<i64> = server.cmd(&["GET", "redlease:waiters:{counter-lock}"]);
    assert_eq!(waiting.unwrap_or(0), 0, "every waiter was uncounted");
    // Nothing piles up: besides the counter and the fencing counter, every key expires.
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.len() <= 4, "{keys:?}");
    for key in keys.iter().filter(|k| *k != "counter") {
        let pttl: i64 = server.cmd(&["PTTL", key]);
        assert!(pttl > 0, "{key} does not expire");
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), THREADS * ROUNDS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in the order of critical sections"
    );
}

#[test]
fn script_flush_between_calls_changes_nothing() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let guard = client.lock("flush").renew(false).try_acquire().unwrap();
    server.cmd::<()>(&["SCRIPT", "FLUSH"]);
    guard.extend(Duration::from_secs(5)).unwrap();
    server.cmd::<()>(&["SCRIPT", "FLUSH"]);
    guard.release().unwrap();
    server.cmd::<()>(&["SCRIPT", "FLUSH"]);
    client
        .lock("flush")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    assert!(
        server.calls("eval") >= 3,
        "the NOSCRIPT fallback (EVAL) was not exercised"
    );
}

#[test]
fn fencing_tokens_strictly_increase_per_name() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let mut last = 0;
    for _ in 0..50 {
        let guard = client.lock("fenced").try_acquire().unwrap();
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().unwrap();
    }
}

/// Lock names whose companion keys are hard to keep in the lock key's slot.
const ADVERSARIAL_NAMES: &[&str] = &[
    "plain",
    "{user:42}:job",
    "{}",
    "{}x",
    "x{}y",
    "a}b",
    "}{",
    "a{b",
    "{{nested}}",
    "{a{b}c}",
    "{}{real}",
    "}",
    "{",
    "\u{0}\u{1}\u{7f}binary\u{ff}",
    "é{ü}",
];

#[test]
fn companion_keys_hash_to_the_lock_key_slot_on_a_real_cluster() {
    let server = RedisServer::start();
    let cluster_dir = tempfile::tempdir().unwrap();
    let conf = cluster_dir.path().join("nodes.conf");
    let cluster = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        conf.to_str().unwrap(),
    ]);
    let client = client(&server.url());
    let mut cluster_conn = cluster.conn();
    for name in ADVERSARIAL_NAMES {
        server.cmd::<()>(&["FLUSHALL"]);
        grant_to_a_vanished_waiter(&server, &client, name);
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            keys.len(),
            5,
            "lock, fence, wakeup, queue, grant for {name:?}: {keys:?}"
        );
        let lock_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name.as_bytes())
            .query(&mut cluster_conn)
            .unwrap();
        for key in keys {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut cluster_conn)
                .unwrap();
            assert_eq!(
                slot,
                lock_slot,
                "{name:?}: {}",
                String::from_utf8_lossy(&key)
            );
            assert_eq!(slot, i64::from(redlease::key_slot(&key)));
        }
    }
}

#[test]
fn a_release_hands_the_lock_to_the_waiters_in_the_order_they_blocked() {
    let server = RedisServer::start();
    let client = client(&server.url());
    // A waiter whose wait times out re-blocks at the back of the line, which would change
    // the order legitimately; on a loaded machine that can happen, so such a round is run
    // again (at most three rounds, and at least one must be clean).
    for round in 0..3 {
        let name = format!("fifo-{round}");
        match fifo_round(&server, &client, &name) {
            Some(order) => {
                assert_eq!(order, vec![0, 1, 2, 3]);
                assert!(!server.cmd::<bool>(&["EXISTS", &name]));
                return;
            }
            None => eprintln!("round {round}: a wait timed out; running it again"),
        }
    }
    panic!("every round had a wait time out before the release");
}

/// Four waiters block one after the other on a held lock, which is then released; returns
/// the order in which they got it, or `None` if any of them had to block twice.
fn fifo_round(server: &RedisServer, client: &Client, name: &str) -> Option<Vec<usize>> {
    let holder = client.lock(name).try_acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let start = server.calls("blpop");
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (client, order, name) = (client.clone(), order.clone(), name.to_owned());
        waiters.push(std::thread::spawn(move || {
            let guard = client
                .lock(&name)
                .acquire_timeout(Duration::from_secs(30))
                .unwrap();
            order.lock().unwrap().push(i);
            std::thread::sleep(Duration::from_millis(20));
            guard.release().unwrap();
        }));
        // Waiter i is blocked on the server before waiter i + 1 starts.
        assert!(eventually(Duration::from_secs(5), || {
            server.calls("blpop") > start + i as u64
        }));
    }
    let blocked = server.calls("blpop");
    holder.release().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    // Each waiter was handed the lock by its single blocking wait, or the round is void.
    let order = order.lock().unwrap().clone();
    (blocked == start + 4 && server.calls("blpop") == blocked).then_some(order)
}

/// Safety item 6: a grant nobody takes (its waiter vanished) holds the lock only for a
/// short claim lease, for redlease and plain `SET NX` clients alike; a registered waiter
/// takes it at once, a newcomer does not jump the queue.
#[test]
fn a_grant_nobody_takes_lapses_quickly_and_only_a_waiter_may_take_it() {
    let server = RedisServer::start();
    let client = client(&server.url());
    grant_to_a_vanished_waiter(&server, &client, "pending");
    let value: String = server.cmd(&["GET", "pending"]);
    assert!(value.ends_with(":handoff"), "{value}");
    let claim: i64 = server.cmd(&["PTTL", "pending"]);
    assert!(
        claim > 0 && claim <= 2_500,
        "a grant lives at most the waiter's grace (I/O timeout + 0.5 s), not the ttl: {claim} ms"
    );
    let before: u64 = server.cmd(&["GET", "redlease:fence:{pending}"]);
    let err = client.lock("pending").try_acquire().unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Busy,
        "a newcomer took a waiter's grant"
    );
    // A waiter blocks, pops the grant's wake-up and takes the grant.
    let started = Instant::now();
    let guard = client
        .lock("pending")
        .acquire_timeout(Duration::from_secs(10))
        .unwrap();
    // (Not popping the wake-up, it would wait for the grant to lapse: ~2.5 s.)
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        guard.fencing_token() > before,
        "a grant draws a fresh fencing token"
    );
    let stored: String = server.cmd(&["GET", "pending"]);
    assert_eq!(stored, guard.token());
    assert!(!server.cmd::<bool>(&["EXISTS", "redlease:grant:{pending}"]));
    guard.release().unwrap();

    // With no waiter at all, the grant lapses on its own and a plain SET NX gets in.
    grant_to_a_vanished_waiter(&server, &client, "orphan");
    server.cmd::<()>(&["DEL", "redlease:queue:{orphan}"]);
    let lapsed = Instant::now();
    assert!(eventually(Duration::from_secs(5), || {
        server
            .cmd::<Option<String>>(&["SET", "orphan", "foreign", "NX", "PX", "10000"])
            .is_some()
    }));
    // At most the grace (2.5 s here), not the ttl (30 s).
    assert!(
        lapsed.elapsed() <= Duration::from_secs(4),
        "{:?}",
        lapsed.elapsed()
    );
}

#[test]
fn a_handed_over_lock_gets_the_ttl_its_waiter_asked_for() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let holder = client
        .lock("ttls")
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .lock("ttls")
                .ttl(Duration::from_secs(60))
                .renew(false)
                .acquire_timeout(Duration::from_secs(30))
                .unwrap()
        })
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") > 0));
    holder.release().unwrap();
    let guard = waiter.join().unwrap();
    let pttl: i64 = server.cmd(&["PTTL", "ttls"]);
    assert!(pttl > 30_000, "pttl {pttl}");
    assert!(guard.remaining() > Duration::from_secs(30));
    let stored: String = server.cmd(&["GET", "ttls"]);
    assert_eq!(stored, guard.token());
}

#[test]
fn invalid_input_is_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let long = "k".repeat(redlease::MAX_KEY_LEN + 1);
    let cases: Vec<(&str, redlease::Result<redlease::LockGuard>)> = vec![
        ("empty name", client.lock("").try_acquire()),
        ("long name", client.lock(&long).try_acquire()),
        ("ttl 0", client.lock("k").ttl(Duration::ZERO).try_acquire()),
        (
            "ttl under 1 ms",
            client
                .lock("k")
                .ttl(Duration::from_micros(999))
                .try_acquire(),
        ),
        (
            "ttl too long",
            client.lock("k").ttl(Duration::MAX).try_acquire(),
        ),
        (
            "wait overflow",
            client.lock("k").acquire_timeout(Duration::MAX),
        ),
    ];
    for (what, result) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
    }
    let scripts_sent = server.calls("evalsha") + server.calls("eval") + server.calls("script|load");
    assert_eq!(scripts_sent, 0, "a rejected call sent a script");
    assert!(!server.cmd::<bool>(&["EXISTS", "k"]));

    let guard = client.lock("held").renew(false).try_acquire().unwrap();
    let sent = server.calls("evalsha");
    let err = guard.extend(Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        server.calls("evalsha"),
        sent,
        "a rejected extend sent a script"
    );
    assert!(guard.is_held(), "a rejected extend must not touch the lock");
    guard.release().unwrap();

    for url in [
        "",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:6379/notadb",
        "redis://",
        "redis://:pw@[::1",
    ] {
        let err = Client::open(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url:?}: {err}");
    }
    for options in [
        ClientOptions::default().io_timeout(Duration::ZERO),
        ClientOptions::default().connect_timeout(Duration::ZERO),
        ClientOptions::default().pool_size(0),
        ClientOptions::default().owner_label("has space"),
        ClientOptions::default().io_timeout(Duration::MAX),
    ] {
        let err = Client::with_options(&server.url(), options).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

#[test]
fn passwords_never_appear_in_errors_or_debug_output() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]);
    let good = format!("redis://:s3cret-pw@127.0.0.1:{}/0", server.port);
    let client = Client::open(&good).unwrap();
    client
        .lock("auth")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    assert!(!format!("{client:?}").contains("s3cret-pw"));
    assert!(client.url().contains("***"));

    let wrong = format!("redis://:wrong-pw-123@127.0.0.1:{}/0", server.port);
    let err = Client::open(&wrong)
        .unwrap()
        .lock("auth")
        .try_acquire()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(!err.to_string().contains("wrong-pw-123"), "{err}");

    let err = Client::open(&format!(
        "redis://u:s3cret-pw@127.0.0.1:{}/bad",
        server.port
    ))
    .unwrap_err();
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");

    let unreachable = format!("redis://:s3cret-pw@127.0.0.1:{}/0", support::free_port());
    let err = Client::open(&unreachable).unwrap().ping().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");

    let unauthenticated = Client::open(&server.url()).unwrap();
    let err = unauthenticated.lock("auth").try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "NOAUTH: {err}");
}

#[test]
fn acl_users_databases_and_unix_sockets_work() {
    let server = RedisServer::start_unix();
    server.cmd::<()>(&["ACL", "SETUSER", "alice", "on", ">alice-pw", "~*", "+@all"]);
    let url = format!(
        "redis+unix://{}?db=3&user=alice&pass=alice-pw",
        server.socket_path().display()
    );
    let client = Client::open(&url).unwrap();
    assert!(!format!("{client:?}").contains("alice-pw"));
    let guard = client.lock("acl").try_acquire().unwrap();
    let mut conn = server.conn();
    redis::cmd("SELECT").arg(3).query::<()>(&mut conn).unwrap();
    let stored: String = redis::cmd("GET").arg("acl").query(&mut conn).unwrap();
    assert_eq!(stored, guard.token());
    guard.release().unwrap();
}

#[test]
fn key_prefix_and_owner_label_shape_key_and_token() {
    let server = RedisServer::start();
    let options = ClientOptions::default()
        .key_prefix("app:")
        .owner_label("worker-7");
    let client = Client::with_options(&server.url(), options).unwrap();
    let guard = client.lock("job").try_acquire().unwrap();
    assert_eq!(guard.key(), "app:job");
    assert!(guard.token().ends_with(":worker-7"));
    let stored: String = server.cmd(&["GET", "app:job"]);
    assert_eq!(stored, guard.token());
}

#[test]
fn rediss_urls_connect_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(
        path("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl must be installed for the TLS test");
        assert!(status.success(), "openssl {args:?}");
    };
    let (ca, ca_key, cert, key, csr) = (
        path("ca.pem"),
        path("ca.key"),
        path("cert.pem"),
        path("key.pem"),
        path("req.csr"),
    );
    openssl(
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ]
        .into_iter()
        .chain([
            "-subj",
            "/CN=redlease-test-ca",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
        ])
        .collect::<Vec<_>>(),
    );
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ]
        .into_iter()
        .chain(["-keyout", &key, "-out", &csr])
        .collect::<Vec<_>>(),
    );
    openssl(
        &[
            "x509", "-req", "-days", "1", "-in", &csr, "-CA", &ca, "-CAkey", &ca_key,
        ]
        .into_iter()
        .chain([
            "-CAcreateserial",
            "-out",
            &cert,
            "-extfile",
            &path("san.ext"),
        ])
        .collect::<Vec<_>>(),
    );
    let tls_port = support::free_port();
    let tls_port_text = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port_text,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-auth-clients",
        "no",
    ]);
    let pem = std::fs::read(&ca).unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}/0");
    let client = Client::with_options(&url, ClientOptions::default().tls_ca_cert(pem)).unwrap();
    let guard = client.lock("tls").try_acquire().unwrap();
    let stored: String = server.cmd(&["GET", "tls"]);
    assert_eq!(stored, guard.token());
    guard.release().unwrap();

    // Without the CA the certificate is refused.
    let err = Client::open(&url).unwrap().ping().unwrap_err();
    assert!(
        err.is_unreachable() || err.kind() == ErrorKind::Server,
        "{err}"
    );
}

#[test]
fn operators_can_inspect_list_and_break_locks() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let free = client.inspect("job:free").unwrap();
    assert_eq!(free.holder, None);
    let guard = client
        .lock("job:a")
        .ttl(Duration::from_secs(20))
        .try_acquire()
        .unwrap();
    let other = client.lock("{tag}b").try_acquire().unwrap();
    let info = client.inspect("job:a").unwrap();
    assert_eq!(info.holder.as_deref(), Some(guard.token()));
    assert_eq!(info.fencing_token, Some(guard.fencing_token()));
    assert!(info.remaining.unwrap() > Duration::from_secs(15));
    let waiter = support::waiters_giving_up(&client, "job:a", 1, Duration::from_secs(20));
    assert!(eventually(Duration::from_secs(5), || {
        client.inspect("job:a").unwrap().waiters == 1
    }));
    let listed = client.locks("*", 100).unwrap();
    let keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, vec!["job:a", "{tag}b"]);
    assert_eq!(client.locks("job:*", 100).unwrap().len(), 1);
    // Breaking checks the holder it was shown.
    let err = client.break_lock("job:a", "someone-else").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    client.break_lock("job:a", guard.token()).unwrap();
    for w in waiter {
        // The waiter gets the broken lock.
        w.join().unwrap().unwrap();
    }
    assert_eq!(guard.release().unwrap_err().kind(), ErrorKind::NotHeld);
    other.release().unwrap();
}

#[test]
fn a_least_privilege_acl_user_can_do_everything_locks_need() {
    let server = RedisServer::start();
    let line = readme_acl_line();
    let mut cmd = redis::cmd("ACL");
    for word in line.split_whitespace().skip(1) {
        cmd.arg(word);
    }
    cmd.query::<()>(&mut server.conn()).unwrap();
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}/0", server.port);
    let client = Client::with_options(&url, ClientOptions::default().key_prefix("app:")).unwrap();
    client.ping().unwrap();
    // Acquire, extend, renew (a third into the lease; a renewal the ACL refused would not
    // count as a call), wait with a handoff, release, inspect.
    let holder = client
        .lock("job")
        .ttl(Duration::from_millis(1500))
        .try_acquire()
        .unwrap();
    holder.extend(Duration::from_millis(1500)).unwrap();
    let extended = server.calls("evalsha");
    let renewed = || server.calls("evalsha") > extended;
    assert!(
        eventually(Duration::from_secs(5), renewed),
        "no renewal ran"
    );
    assert!(holder.is_held());
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || client.lock("job").acquire_timeout(Duration::from_secs(5)))
    };
    assert!(eventually(Duration::from_secs(5), || server.calls("blpop") >= 1));
    holder.release().unwrap();
    let guard = waiter.join().unwrap().unwrap();
    assert!(client.is_locked("job").unwrap());
    assert_eq!(
        client.inspect("job").unwrap().holder.as_deref(),
        Some(guard.token())
    );
    assert_eq!(client.locks("*", 10).unwrap().len(), 1);
    guard.release().unwrap();
    // The other kinds: a reentrant lock (inspected), a semaphore, both sides of a
    // read-write lock, each with a waiter woken by a release.
    let outer = client.lock("r").reentrant().try_acquire().unwrap();
    let inner = client.lock("r").reentrant().try_acquire().unwrap();
    inner.extend(Duration::from_millis(500)).unwrap();
    assert_eq!(
        client.inspect("r").unwrap().reentrant.map(|(_, n)| n),
        Some(2)
    );
    drop((inner, outer));
    let permit = client.semaphore("s", 1).try_acquire().unwrap();
    permit.extend(Duration::from_secs(5)).unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .semaphore("s", 1)
                .acquire_timeout(Duration::from_secs(5))
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    permit.release().unwrap();
    waiter.join().unwrap().unwrap().release().unwrap();
    let reader = client.rwlock("rw").read().try_acquire().unwrap();
    reader.extend(Duration::from_secs(5)).unwrap();
    let writer = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .rwlock("rw")
                .write()
                .acquire_timeout(Duration::from_secs(5))
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    reader.release().unwrap();
    writer.join().unwrap().unwrap().release().unwrap();
    // Keys outside the prefix are refused by the ACL, not by redlease.
    let other = Client::open(&url).unwrap();
    let err = other.lock("elsewhere").try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
}
