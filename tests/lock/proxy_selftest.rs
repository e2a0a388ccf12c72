//! Self-tests of the fault-injecting proxy in `support::proxy`, against a real
//! redis-server: the fault tests of the other modules rely on what these check.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::proxy::{Action, Proxy};
use crate::support::{self, RedisServer};

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(url: &str, read_timeout: Duration) -> redis::Connection {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(TIMEOUT)
        .unwrap();
    conn.set_read_timeout(Some(read_timeout)).unwrap();
    conn
}

fn set(conn: &mut redis::Connection, key: &str, value: &str) -> redis::RedisResult<()> {
    redis::cmd("SET").arg(key).arg(value).query(conn)
}

/// A raw TCP connection to the proxy, for exact control over bytes on the wire.
fn raw(proxy: &Proxy) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads exactly `n` bytes (or fails on timeout).
fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).unwrap();
    buf
}

fn args(list: &[&str]) -> Vec<Vec<u8>> {
    list.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn passes_traffic_through_and_records_requests() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    set(&mut conn, "pass-key", "v1").unwrap();
    let got: String = redis::cmd("GET").arg("pass-key").query(&mut conn).unwrap();
    assert_eq!(got, "v1");
    assert_eq!(server.get("pass-key").as_deref(), Some("v1"));
    let big = "x".repeat(300_000);
    set(&mut conn, "big-key", &big).unwrap();
    let got: String = redis::cmd("GET").arg("big-key").query(&mut conn).unwrap();
    assert_eq!(got, big);

    let requests = proxy.requests();
    assert!(
        requests.contains(&args(&["SET", "pass-key", "v1"])),
        "{requests:?}"
    );
    assert!(requests.contains(&args(&["GET", "pass-key"])));
    assert_eq!(proxy.count_requests(b"pass-key"), 2);
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open_connections(), 1);
    drop(conn);
    assert!(support::eventually(TIMEOUT, || proxy.open_connections() == 0));
}

#[test]
fn reply_and_request_delays_are_applied() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    let d = Duration::from_millis(150);

    proxy.set_reply_delay(d);
    let start = Instant::now();
    set(&mut conn, "delayed", "1").unwrap();
    assert!(start.elapsed() >= d, "{:?}", start.elapsed());
    // The server ran it at once; only the reply was late.
    proxy.set_reply_delay(Duration::ZERO);

    let d = Duration::from_millis(600);
    proxy.set_request_delay(d);
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        tx.send(start).unwrap();
        set(&mut conn, "delayed-req", "1").unwrap();
        tx.send(Instant::now()).unwrap();
    });
    let start = rx.recv_timeout(TIMEOUT).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let early = server.get("delayed-req");
    // Only a look taken less than `d` after the request was sent proves anything (a
    // loaded host may get here later).
    if start.elapsed() < d {
        assert_eq!(early, None, "request forwarded early");
    }
    let elapsed = rx.recv_timeout(TIMEOUT).unwrap() - start;
    assert!(elapsed >= d, "{elapsed:?}");
    t.join().unwrap();
    assert_eq!(server.get("delayed-req").as_deref(), Some("1"));
    proxy.set_request_delay(Duration::ZERO);

    // Not serialised: replies to two requests sent 50 ms apart go out 50 ms apart, each
    // `d` after it was read (done at ~d + 50 ms; serialised would be 2 × d).
    let d = Duration::from_millis(1000);
    proxy.set_reply_delay(d);
    let mut s = raw(&proxy);
    let start = Instant::now();
    s.write_all(b"PING\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut s, 7), b"+PONG\r\n");
    let first = start.elapsed();
    assert_eq!(read_n(&mut s, 7), b"+PONG\r\n");
    let second = start.elapsed();
    assert!(first >= d, "{first:?}");
    assert!(second >= d + Duration::from_millis(50), "{second:?}");
    assert!(
        second < 2 * d - Duration::from_millis(300),
        "serialised: {second:?}"
    );
}

#[test]
fn delay_reply_rule_delays_only_the_matching_reply() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    let delay = Duration::from_millis(1000);
    let rule = proxy.on_request(b"slow-reply", 1, Action::DelayReply(delay));
    let start = Instant::now();
    set(&mut conn, "slow-reply", "1").unwrap();
    assert!(start.elapsed() >= delay);
    let start = Instant::now();
    set(&mut conn, "slow-reply", "2").unwrap();
    assert!(start.elapsed() < delay * 7 / 10, "rule used once only");
    assert_eq!(proxy.matched(rule), 1);
}

#[test]
fn drop_reply_runs_the_command_but_the_client_never_hears() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), Duration::from_millis(300));
    let rule = proxy.on_request(b"drop-me", 1, Action::DropReply);
    let err = set(&mut conn, "drop-me", "v").unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(server.get("drop-me").as_deref(), Some("v"));
    assert_eq!(proxy.matched(rule), 1);
}

#[test]
fn reset_before_reply_runs_the_command_and_kills_the_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    let rule = proxy.on_request(b"reset-reply", 1, Action::ResetBeforeReply);
    let start = Instant::now();
    let err = set(&mut conn, "reset-reply", "v").unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "reset, not a timeout"
    );
    assert!(err.is_io_error() || err.is_connection_dropped(), "{err:?}");
    assert_eq!(server.get("reset-reply").as_deref(), Some("v"));
    assert_eq!(proxy.matched(rule), 1);
    assert!(support::eventually(TIMEOUT, || proxy.open_connections() == 0));

    // The client side really sees a RST.
    proxy.on_request(b"reset-raw", 1, Action::ResetBeforeReply);
    let mut s = raw(&proxy);
    s.write_all(b"*2\r\n$4\r\nECHO\r\n$9\r\nreset-raw\r\n")
        .unwrap();
    let err = s.read(&mut [0; 16]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err:?}");
}

#[test]
fn reset_before_request_never_runs_the_command() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    let rule = proxy.on_request(b"never-run", 1, Action::ResetBeforeRequest);
    let start = Instant::now();
    let err = set(&mut conn, "never-run", "v").unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "reset, not a timeout"
    );
    assert!(err.is_io_error() || err.is_connection_dropped(), "{err:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(server.get("never-run"), None);
    assert_eq!(proxy.matched(rule), 1);
    // It was seen, though.
    assert!(proxy.requests().contains(&args(&["SET", "never-run", "v"])));
    // A new connection works.
    let mut conn = connect(&proxy.url(), TIMEOUT);
    set(&mut conn, "never-run", "w").unwrap();
    assert_eq!(server.get("never-run").as_deref(), Some("w"));
}

#[test]
fn delay_request_holds_the_request_and_those_behind_it() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let delay = Duration::from_millis(1000);
    let rule = proxy.on_request(b"held-req", 1, Action::DelayRequest(delay));
    let mut s = raw(&proxy);
    let start = Instant::now();
    s.write_all(b"*3\r\n$3\r\nSET\r\n$8\r\nheld-req\r\n$1\r\n1\r\n")
        .unwrap();
    s.write_all(b"*3\r\n$3\r\nSET\r\n$6\r\nbehind\r\n$1\r\n2\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (held, behind) = (server.get("held-req"), server.get("behind"));
    // Only a look taken less than `delay` after the requests were sent proves anything (a
    // loaded host may get here later).
    if start.elapsed() < delay {
        assert_eq!(held, None);
        assert_eq!(behind, None, "a later request overtook the held one");
    }
    assert_eq!(read_n(&mut s, 10), b"+OK\r\n+OK\r\n");
    assert!(start.elapsed() >= delay);
    assert_eq!(server.get("held-req").as_deref(), Some("1"));
    assert_eq!(server.get("behind").as_deref(), Some("2"));
    assert_eq!(proxy.matched(rule), 1);
}

#[test]
fn blackhole_holds_everything_until_released() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    proxy.blackhole(true);
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        tx.send(set(&mut conn, "in-the-hole", "v")).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "answered in a blackhole"
    );
    assert_eq!(server.get("in-the-hole"), None);
    // New connections are accepted, but nothing flows.
    let mut s = raw(&proxy);
    s.write_all(b"PING\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(s.read(&mut [0; 8]).is_err());
    assert!(
        support::eventually(TIMEOUT, || proxy.open_connections() == 2),
        "{} connections",
        proxy.open_connections()
    );

    proxy.blackhole(false);
    rx.recv_timeout(TIMEOUT).unwrap().unwrap();
    t.join().unwrap();
    assert_eq!(server.get("in-the-hole").as_deref(), Some("v"));
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(read_n(&mut s, 7), b"+PONG\r\n");
}

#[test]
fn reset_all_and_refuse_new() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut a = connect(&proxy.url(), TIMEOUT);
    let mut b = connect(&proxy.url(), TIMEOUT);
    set(&mut a, "k", "1").unwrap();
    set(&mut b, "k", "2").unwrap();
    assert_eq!(proxy.open_connections(), 2);
    proxy.reset_all();
    assert_eq!(proxy.open_connections(), 0);
    assert!(set(&mut a, "k", "3").is_err());
    assert!(set(&mut b, "k", "3").is_err());
    assert_eq!(server.get("k").as_deref(), Some("2"));

    proxy.refuse_new(true);
    let refused = redis::Client::open(proxy.url())
        .unwrap()
        .get_connection_with_timeout(TIMEOUT);
    assert!(refused.is_err());
    assert!(proxy.refused() >= 1);
    proxy.refuse_new(false);
    let mut c = connect(&proxy.url(), TIMEOUT);
    set(&mut c, "k", "4").unwrap();
    assert_eq!(proxy.accepted(), 4);
    assert_eq!(proxy.open_connections(), 1);
}

#[test]
fn pipelined_requests_and_replies_are_split_per_request() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    let delay = Duration::from_millis(200);
    let rule = proxy.on_request(b"second", 1, Action::DelayReply(delay));
    let start = Instant::now();
    let (a, b, c): (String, String, String) = redis::pipe()
        .cmd("SET")
        .arg("first")
        .arg("1")
        .ignore()
        .cmd("SET")
        .arg("second")
        .arg("2")
        .ignore()
        .cmd("SET")
        .arg("third")
        .arg("3")
        .ignore()
        .cmd("GET")
        .arg("first")
        .cmd("GET")
        .arg("third")
        .cmd("ECHO")
        .arg("last")
        .query(&mut conn)
        .unwrap();
    assert_eq!((a.as_str(), b.as_str(), c.as_str()), ("1", "3", "last"));
    assert!(start.elapsed() >= delay);
    assert_eq!(proxy.matched(rule), 1);

    // The second reply of three, delivered in one read, is dropped: the client sees the
    // third in its place.
    let rule = proxy.on_request(b"drop-2nd", 1, Action::DropReply);
    let mut s = raw(&proxy);
    s.write_all(b"PING\r\n*2\r\n$4\r\nECHO\r\n$8\r\ndrop-2nd\r\n*2\r\n$4\r\nECHO\r\n$2\r\nok\r\n")
        .unwrap();
    assert_eq!(read_n(&mut s, 15), b"+PONG\r\n$2\r\nok\r\n");
    assert_eq!(proxy.matched(rule), 1);

    // A request split over several writes, then replies of nested and null types.
    let rule = proxy.on_request(
        b"split-arg",
        1,
        Action::DelayReply(Duration::from_millis(100)),
    );
    let start = Instant::now();
    for part in [&b"*2\r\n$4\r\nEC"[..], b"HO\r\n$9\r\nspl", b"it-arg\r\n"] {
        s.write_all(part).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    s.write_all(b"*2\r\n$3\r\nGET\r\n$7\r\nmissing\r\n*3\r\n$4\r\nEVAL\r\n$21\r\nreturn {1,{2,'x'},-1}\r\n$1\r\n0\r\n")
        .unwrap();
    let expected = b"$9\r\nsplit-arg\r\n$-1\r\n*3\r\n:1\r\n*2\r\n:2\r\n$1\r\nx\r\n:-1\r\n";
    assert_eq!(read_n(&mut s, expected.len()), expected);
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(proxy.matched(rule), 1);
    assert!(proxy.requests().contains(&args(&["ECHO", "split-arg"])));
    assert!(proxy.requests().contains(&args(&["PING"])));
}

#[test]
fn rules_are_used_in_order_and_cleared() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut s = raw(&proxy);
    let first = proxy.on_request(b"shared-needle", 1, Action::DropReply);
    let second = proxy.on_request(b"shared-needle", 5, Action::DelayReply(Duration::ZERO));
    s.write_all(b"ECHO shared-needle\r\nECHO shared-needle\r\nECHO done\r\n")
        .unwrap();
    assert_eq!(
        read_n(&mut s, 20 + 10),
        b"$13\r\nshared-needle\r\n$4\r\ndone\r\n"
    );
    assert_eq!((proxy.matched(first), proxy.matched(second)), (1, 1));
    proxy.clear_rules();
    s.write_all(b"ECHO shared-needle\r\n").unwrap();
    assert_eq!(read_n(&mut s, 20), b"$13\r\nshared-needle\r\n");
    assert_eq!(proxy.matched(second), 1);
}

#[test]
fn drop_is_prompt_with_connections_open() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let mut conn = connect(&proxy.url(), TIMEOUT);
    set(&mut conn, "k", "v").unwrap();
    proxy.blackhole(true);
    proxy.set_reply_delay(Duration::from_secs(30));
    let mut s = raw(&proxy);
    s.write_all(b"PING\r\n").unwrap();
    let port = proxy.port();
    assert!(
        support::eventually(TIMEOUT, || proxy_threads(port) == 9),
        "1 + 4 per connection"
    );
    let start = Instant::now();
    drop(proxy);
    let took = start.elapsed();
    // Its threads notice the stop within 50 ms; the bound leaves a loaded host the rest.
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(proxy_threads(port), 0, "a proxy thread outlived the proxy");
    assert!(set(&mut conn, "k", "w").is_err());
}

/// Threads of this process belonging to the proxy on `port` (named `px<port>-...`).
fn proxy_threads(port: u16) -> usize {
    let prefix = format!("px{port}-");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(&prefix))
        .count()
}
