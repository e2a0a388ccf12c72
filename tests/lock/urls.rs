//! Connecting: URLs (`redis://` with a database or an ACL user, `redis+unix://` and
//! `unix://`, `rediss://` with a CA of the caller's), credentials never shown in errors or
//! `Debug` output however they are written or pasted, and the README's least-privilege ACL
//! user, which can do everything locks need (the test reads the line from README.md).

use std::time::Duration;

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::{self, RedisServer, eventually, options_ms, readme_acl_line};

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

/// Issue 9, item 10: passwords as people paste them (with `/`, `#`, `?`, `@` unencoded)
/// never appear in errors or in `Debug` output.
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

fn shown(url: &str) -> String {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200));
    match Client::with_options(url, options) {
        Ok(client) => {
            let err = client.ping().unwrap_err();
            format!("{err} | {err:?} | {client:?} | {}", client.url())
        }
        Err(err) => format!("{err} | {err:?}"),
    }
}

/// Unix-socket URLs with the credentials in the user-info part, as go-redis documents them
/// (`unix://user:password@/path/to/redis.sock`) and people paste them: no error may show
/// the password (the parser once quoted everything before `?` as the socket path).
#[test]
fn unix_urls_with_user_info_never_leak_the_password() {
    let secret = "Sup3rS3cretZZ9";
    let mut leaks = Vec::new();
    for url in [
        format!("redis+unix://:{secret}@/tmp/redis.sock"),
        format!("unix://alice:{secret}@/tmp/redis.sock?db=1"),
        format!("redis+unix://alice:{secret}@/tmp/redis.sock"),
    ] {
        let text = shown(&url);
        if text.contains(secret) {
            leaks.push(text);
        }
    }
    assert!(
        leaks.is_empty(),
        "the password is shown:\n{}",
        leaks.join("\n")
    );
}
