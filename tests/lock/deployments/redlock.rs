//! Redlock (issue 11): one lock over N independent primaries, against 5 local primaries the
//! tests start: a majority decides for every subset of unavailable members, a restarted
//! member does not lose a lock the majority keeps, a member that never answers costs one
//! per-member time, and two processes of eight threads never overlap.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use crate::support::proxy::Proxy;
use crate::support::{RedisServer, now_ns, within};

fn primaries(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn redlock(urls: &[String]) -> Client {
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    Client::redlock(&urls, ClientOptions::default()).unwrap()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(|s| s.url()).collect()
}

#[test]
fn bad_member_lists_are_refused() {
    let servers = primaries(1);
    let url = servers[0].url();
    // One server under two database numbers would cast two votes.
    let other_db = format!("redis://127.0.0.1:{}/1", servers[0].port);
    for urls in [
        vec![],
        vec![url.as_str(), url.as_str()],
        vec![url.as_str(), other_db.as_str()],
        vec!["redis+cluster://127.0.0.1:1"],
        vec!["nonsense"],
    ] {
        let err = Client::redlock(&urls, ClientOptions::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{urls:?}: {err}");
    }
    let many: Vec<String> = (1..=16)
        .map(|p| format!("redis://127.0.0.1:{p}/0"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(Client::redlock(&many, ClientOptions::default()).is_err());
    assert!(Client::redlock(&many[..15], ClientOptions::default()).is_ok());
}

/// Two URLs of one server (its own address, and a proxy's in front of it) pass the URL
/// check: the server is told by the `run_id` each connection asks, and the first call
/// fails with `InvalidArgument` naming both, its attempt given back. Without the check the two
/// would pass for two members of three, and the lock would be granted by two servers where
/// the list promises three (losing the one listed twice would lose two members).
#[test]
fn one_server_under_two_addresses_is_refused_once_connected() {
    let servers = primaries(2);
    let proxy = Proxy::start(servers[0].port);
    let urls = [servers[0].url(), servers[1].url(), proxy.url()];
    let client = redlock(&urls);
    let err = client.lock("twice").try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let message = err.to_string();
    assert!(message.contains("one server"), "{message}");
    assert!(
        message.contains(&urls[0]) || message.contains(&format!("{}", servers[0].port)),
        "{message}"
    );
    // The attempt went to the other members (the members connect in parallel, and the
    // one found second is left out): it was given back there before the call returned (a
    // program that exits on the error leaves no lock behind).
    for server in &servers {
        assert_eq!(
            server.cmd::<i64>(&["EXISTS", "twice"]),
            0,
            "the attempt was not given back"
        );
    }
    // A deployment whose members are distinct servers, one of them behind the proxy, works.
    let third = RedisServer::start();
    let client = redlock(&[proxy.url(), servers[1].url(), third.url()]);
    let guard = client.lock("twice").try_acquire().unwrap();
    assert_eq!(servers[0].cmd::<i64>(&["EXISTS", "twice"]), 1);
    guard.release().unwrap();
}

/// For all 32 subsets of unavailable primaries among 5 (some stopped with SIGSTOP, some
/// held by another token), acquire succeeds exactly when at least 3 are free, returns
/// within its bound (the requests are parallel: one per-member timeout, not five), and
/// leaves no key of a failed attempt on any member that answered.
#[test]
fn acquire_succeeds_exactly_with_a_free_majority_for_every_subset() {
    let servers = primaries(5);
    let client = redlock(&urls(&servers));
    // Members that answer must do so within the per-member time even on a loaded host.
    let ttl = Duration::from_secs(5);
    // ttl/10, the per-member time of a round; an attempt is at most two rounds (acquire,
    // then give back). Rounds that asked the members in turn would take 2 s with two
    // members stopped.
    let bound = Duration::from_millis(2 * 500 + 700);
    for mask in 0u32..32 {
        let name = format!("subset-{mask}");
        let mut stopped = Vec::new();
        for (i, server) in servers.iter().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            if (mask as usize + i) % 2 == 0 {
                server.pause();
                stopped.push(i);
            } else {
                server.cmd::<()>(&["SET", &name, "someone-else", "PX", "60000"]);
            }
        }
        let free = 5 - mask.count_ones();
        let started = Instant::now();
        let result = client.lock(&name).ttl(ttl).renew(false).try_acquire();
        let took = started.elapsed();
        for &i in &stopped {
            servers[i].resume();
        }
        assert!(took < bound, "subset {mask:05b}: {took:?}");
        match result {
            Ok(guard) => {
                assert!(free >= 3, "subset {mask:05b}: granted with {free} free");
                assert_eq!(guard.fencing_token(), 0, "no fencing token in Redlock mode");
                guard.release().unwrap_or_else(|e| {
                    assert!(e.is_not_held() || e.is_unreachable(), "{e}");
                });
            }
            Err(e) => {
                assert!(free < 3, "subset {mask:05b}: refused with {free} free: {e}");
                for (i, server) in servers.iter().enumerate() {
                    if stopped.contains(&i) {
                        continue;
                    }
                    let value: Option<String> = server.cmd(&["GET", &name]);
                    assert!(
                        value.is_none() || value.as_deref() == Some("someone-else"),
                        "subset {mask:05b}: member {i} kept {value:?}"
                    );
                }
            }
        }
    }
}

/// A member killed and restarted without persistence while a lock is held: the lock stays
/// held while a majority keeps the key (the classic unsafety, a restart *before* the ttl
/// on a majority, is in the README with its mitigation). Checked past the ttl, so that only
/// renewals after the restart can have kept it.
#[test]
fn a_restarted_member_does_not_lose_a_lock_a_majority_keeps() {
    let mut servers = primaries(5);
    let client = redlock(&urls(&servers));
    let lost = Arc::new(AtomicBool::new(false));
    let guard = {
        let lost = lost.clone();
        client
            .lock("restart")
            .ttl(Duration::from_secs(3))
            .on_lost(move |_| lost.store(true, Ordering::SeqCst))
            .acquire()
            .unwrap()
    };
    servers[0].restart();
    std::thread::sleep(Duration::from_secs(4));
    assert!(guard.is_held() && !lost.load(Ordering::SeqCst));
    let held_on = servers
        .iter()
        .filter(|s| s.cmd::<Option<String>>(&["GET", "restart"]).as_deref() == Some(guard.token()))
        .count();
    assert!(held_on >= 4, "held on {held_on} members");
    guard.release().unwrap();
}

/// A member restarted between two acquires closed the idle connections the client keeps
/// to it: the next round finds them closed before it writes (the members' idle
/// connections are looked at together) and connects afresh, so the lock is taken on every
/// member, not only on a majority, and nothing fails.
#[test]
fn a_restarted_members_closed_connections_are_replaced_before_a_round() {
    let mut servers = primaries(3);
    let client = redlock(&urls(&servers));
    for round in 0..3 {
        client
            .lock("replaced")
            .try_acquire()
            .unwrap()
            .release()
            .unwrap();
        servers[round % 3].restart();
        let guard = client
            .lock("replaced")
            .renew(false)
            .try_acquire()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        for (i, server) in servers.iter().enumerate() {
            assert_eq!(
                server
                    .cmd::<Option<String>>(&["GET", "replaced"])
                    .as_deref(),
                Some(guard.token()),
                "round {round}: member {i}"
            );
        }
        guard.release().unwrap();
    }
}

/// With one member behind a proxy that never answers, acquire, extend and release each
/// return within one per-member time (ttl/10) plus a margin, far from the 10 s I/O timeout.
#[test]
fn every_call_is_bounded_with_a_member_blackholed() {
    let servers = primaries(3);
    let proxy = Proxy::start(servers[2].port);
    let mut list = urls(&servers[..2]);
    list.push(proxy.url());
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    let options = ClientOptions::default().io_timeout(Duration::from_secs(10));
    let client = Client::redlock(&list, options).unwrap();
    client.ping().unwrap();
    proxy.blackhole(true);
    let ttl = Duration::from_secs(5);
    let margin = Duration::from_secs(1);
    let started = Instant::now();
    let guard = client
        .lock("bounded")
        .ttl(ttl)
        .renew(false)
        .try_acquire()
        .unwrap();
    assert!(
        started.elapsed() < ttl / 10 + margin,
        "acquire {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    guard.extend(ttl).unwrap();
    assert!(
        started.elapsed() < ttl / 10 + margin,
        "extend {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    guard.release().unwrap();
    assert!(
        started.elapsed() < ttl / 10 + margin,
        "release {:?}",
        started.elapsed()
    );
    proxy.blackhole(false);
}

/// A member whose replies take more than half its time in a round still answers the
/// round that connects to it: its server id is asked in the same write as the first
/// request, not in a round trip of its own on connect (which made every first request
/// miss the round, and the connection, out of step, was dropped: the member never
/// answered again).
#[test]
fn a_distant_member_answers_the_round_that_connects_to_it() {
    let servers = primaries(3);
    let proxy = Proxy::start(servers[2].port);
    // 400 ms per member and round; 250 ms per reply.
    proxy.set_reply_delay(Duration::from_millis(250));
    let mut list = urls(&servers[..2]);
    list.push(proxy.url());
    let client = redlock(&list);
    for _ in 0..2 {
        let guard = client
            .lock("distant")
            .ttl(Duration::from_secs(4))
            .renew(false)
            .try_acquire()
            .unwrap();
        assert_eq!(
            servers[2].cmd::<i64>(&["EXISTS", "distant"]),
            1,
            "the distant member did not grant it"
        );
        guard.release().unwrap();
    }
}

/// A TCP port on which connects are never answered, as on a host cut off from the network
/// or powered off: a listener with a backlog of 0 whose queue is full and never accepted,
/// so that the kernel drops further SYNs.
struct Unanswering {
    port: u16,
    _listener: socket2::Socket,
    _queued: Vec<std::net::TcpStream>,
}

impl Unanswering {
    fn start() -> Unanswering {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        listener.bind(&any.into()).unwrap();
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        let mut queued = Vec::new();
        loop {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(stream) => queued.push(stream),
                Err(_) => break,
            }
            assert!(queued.len() < 16, "the accept queue never filled");
        }
        Unanswering {
            port: addr.port(),
            _listener: listener,
            _queued: queued,
        }
    }
}

/// A member whose connects go unanswered (its host cut off) must cost the others nothing:
/// they are written to at once while it connects on a thread of its own, and the lock is
/// acquired, extended (on the renewal connections, made afresh) and released on the
/// majority, round after round. The same for a Sentinel member whose Sentinels are cut
/// off (it asks them on that thread). (A round that waited for every member's connect, or
/// a Sentinel member's discovery, before writing to any spent its whole time on that one
/// and failed on all.)
#[test]
fn a_member_whose_connects_go_unanswered_leaves_the_majority_working() {
    let servers = primaries(2);
    let cut_off = Unanswering::start();
    for third in [
        format!("redis://127.0.0.1:{}/0", cut_off.port),
        format!("redis+sentinel://127.0.0.1:{}/mymaster", cut_off.port),
    ] {
        let mut list = urls(&servers);
        list.push(third);
        let client = redlock(&list);
        a_majority_acquires_extends_and_releases(&client, &servers);
    }
}

fn a_majority_acquires_extends_and_releases(client: &Client, servers: &[RedisServer]) {
    // 300 ms per member and round: ample for the two that answer.
    let ttl = Duration::from_secs(3);
    for _ in 0..2 {
        let guard = client
            .lock("cut-off")
            .ttl(ttl)
            .renew(false)
            .try_acquire()
            .unwrap();
        for server in servers {
            assert_eq!(server.cmd::<i64>(&["EXISTS", "cut-off"]), 1);
        }
        guard.extend(ttl).unwrap();
        guard.release().unwrap();
        for server in servers {
            assert_eq!(server.cmd::<i64>(&["EXISTS", "cut-off"]), 0);
        }
    }
}

/// 8 threads in each of 2 processes contend for one Redlock lock: no two critical sections
/// overlap (an interval log, checked offline), and every thread makes progress.
#[test]
fn two_processes_of_eight_threads_never_overlap() {
    let servers = primaries(5);
    let dir = tempfile::tempdir().unwrap();
    let secs: u64 = std::env::var("REDLEASE_REDLOCK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let joined = urls(&servers).join(" ");
    let mut children = Vec::new();
    for p in 0..2 {
        let log = dir.path().join(format!("intervals-{p}.log"));
        children.push(
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "deployments::redlock::contention_worker",
                    "--ignored",
                    "--nocapture",
                ])
                .env("REDLOCK_WORKER_URLS", &joined)
                .env("REDLOCK_WORKER_LOG", &log)
                .env("REDLOCK_WORKER_SECS", secs.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    for mut child in children {
        let status = within(Duration::from_secs(secs + 60), move || {
            child.wait().unwrap()
        });
        assert!(status.success());
    }
    let mut intervals: Vec<(u64, u64, String)> = Vec::new();
    for p in 0..2 {
        let text = std::fs::read_to_string(dir.path().join(format!("intervals-{p}.log"))).unwrap();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(start), Some(end), Some(who)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            intervals.push((start.parse().unwrap(), end.parse().unwrap(), who.to_owned()));
        }
    }
    intervals.sort();
    assert!(
        intervals.len() > 50,
        "only {} critical sections",
        intervals.len()
    );
    for pair in intervals.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    let mut per_thread = std::collections::HashMap::new();
    for (_, _, who) in &intervals {
        *per_thread.entry(who.clone()).or_insert(0u64) += 1;
    }
    let (min, max) = (
        per_thread.values().min().copied().unwrap_or(0),
        per_thread.values().max().copied().unwrap_or(0),
    );
    eprintln!(
        "{} critical sections by {} threads; fairness min/max {min}/{max} = {:.2}",
        intervals.len(),
        per_thread.len(),
        min as f64 / max.max(1) as f64
    );
    assert_eq!(per_thread.len(), 16, "some thread never got the lock");
}

/// The worker process of the test above (run only when its environment is set).
#[test]
#[ignore]
fn contention_worker() {
    let Ok(urls) = std::env::var("REDLOCK_WORKER_URLS") else {
        return;
    };
    let log = std::env::var("REDLOCK_WORKER_LOG").unwrap();
    let secs: u64 = std::env::var("REDLOCK_WORKER_SECS")
        .unwrap()
        .parse()
        .unwrap();
    let urls: Vec<&str> = urls.split(' ').collect();
    let client = Client::redlock(&urls, ClientOptions::default()).unwrap();
    let file = Arc::new(Mutex::new(std::fs::File::create(log).unwrap()));
    let stop = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (client, file) = (client.clone(), file.clone());
            std::thread::spawn(move || {
                let who = format!("{}-{t}", std::process::id());
                while Instant::now() < stop {
                    let Ok(guard) = client
                        .lock("contended")
                        .ttl(Duration::from_secs(2))
                        .acquire_timeout(Duration::from_secs(5))
                    else {
                        continue;
                    };
                    let start = now_ns();
                    std::thread::sleep(Duration::from_millis(2));
                    let end = now_ns();
                    if guard.is_held() {
                        writeln!(file.lock().unwrap(), "{start} {end} {who}").unwrap();
                    }
                    let _ = guard.release();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Redlock: an attempt that is not granted on a majority is given back on every member;
/// the give-back to one member is held in the network past its round. The retry must not
/// count that member's key as its vote: once the late give-back lands, the lock would be
/// held on a minority only while the waiter believes it holds it.
#[test]
fn a_redlock_retry_never_counts_a_member_whose_give_back_is_late() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxy = Proxy::start(servers[0].port);
    let urls = [proxy.url(), servers[1].url(), servers[2].url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let options = ClientOptions::default().io_timeout(Duration::from_secs(1));
    let client = Client::redlock(&urls, options.clone()).unwrap();
    crate::support::warm(&client);
    let name = "quorum";
    // Another owner holds the lock on the two members without a proxy.
    for server in &servers[1..] {
        server.cmd::<()>(&["SET", name, "someone-else", "PX", "60000"]);
    }
    // The first give-back to the proxied member is held 3 s (its round gives up after
    // ttl/10 = 1 s).
    let late = proxy.on_request(
        b"handoff",
        1,
        crate::support::proxy::Action::DelayRequest(Duration::from_secs(3)),
    );
    let waiter = std::thread::spawn(move || {
        client
            .lock(name)
            .ttl(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(20))
            .map(|g| (Instant::now(), g))
    });
    assert!(crate::support::eventually(
        Duration::from_secs(10),
        || proxy.matched(late) == 1
    ));
    let held_back = Instant::now();
    // The other owner leaves one member: a majority there is the proxied member (whose
    // key still holds the first attempt's token until the give-back lands) and this one.
    servers[1].cmd::<()>(&["DEL", name]);
    let (_, holder) = within(Duration::from_secs(30), move || waiter.join().unwrap())
        .expect("the waiter gets the lock");
    // Past the late give-back, the other owner leaves the last member too.
    std::thread::sleep(
        (held_back + Duration::from_millis(3500)).saturating_duration_since(Instant::now()),
    );
    servers[2].cmd::<()>(&["DEL", name]);
    let rival = Client::redlock(&urls, options).unwrap();
    crate::support::no_second_holder(&rival, name, &holder, Duration::from_secs(2));
}

/// A member that hands the lock to a waiter of its own (a single-server client waiting on
/// that member) gave the Redlock hold back all the same: with two of three members doing
/// so, the release is still a release (it once reported `NotHeld`: only replies of 1 were
/// counted).
#[test]
fn a_release_handed_to_waiters_on_members_counts_as_released() {
    let servers = primaries(3);
    let urls = urls(&servers);
    let client = redlock(&urls);
    let name = "handed-on";
    let guard = client
        .lock(name)
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .unwrap();
    // Single-server clients of members 0 and 1 wait for the same name there.
    let waiters: Vec<_> = servers[..2]
        .iter()
        .map(|s| {
            let single = Client::open(&s.url()).unwrap();
            std::thread::spawn(move || {
                single
                    .lock(name)
                    .ttl(Duration::from_secs(10))
                    .acquire_timeout(Duration::from_secs(20))
                    .map(|g| g.token().to_owned())
            })
        })
        .collect();
    for server in &servers[..2] {
        assert!(crate::support::eventually(Duration::from_secs(10), || {
            let clients: String = server.cmd(&["CLIENT", "LIST"]);
            clients.lines().any(|c| c.contains("cmd=blpop"))
        }));
    }
    guard
        .release()
        .expect("released on every member (two of them by handing it on)");
    for waiter in waiters {
        waiter
            .join()
            .unwrap()
            .expect("each member's waiter got the lock handed on");
    }
}

/// A waiter with no deadline (`acquire()`) on a lock another client holds: once two of
/// the three primaries stop answering, its attempts keep failing to reach a majority, and
/// the wait ends with a connection or timeout error within a grace (the I/O timeout +
/// 0.5 s) of its first failed attempt, not when the holder's lease ends.
#[test]
fn an_unbounded_wait_ends_once_a_majority_stops_answering() {
    let servers = primaries(3);
    let list = urls(&servers);
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    let io = Duration::from_millis(400);
    let options = || ClientOptions::default().io_timeout(io);
    let holder = Client::redlock(&list, options()).unwrap();
    let guard = holder
        .lock("majority-gone")
        .ttl(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .unwrap();
    let waiter = Client::redlock(&list, options()).unwrap();
    let waiting = std::thread::spawn(move || {
        let wait = waiter
            .lock("majority-gone")
            .ttl(Duration::from_secs(60))
            .acquire();
        (wait.map(|g| g.token().to_owned()), Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "the waiter did not wait");
    let stopped = Instant::now();
    servers[1].pause();
    servers[2].pause();
    let (outcome, ended) = within(Duration::from_secs(30), move || waiting.join().unwrap());
    servers[1].resume();
    servers[2].resume();
    let error = outcome.expect_err("the waiter took a lock a majority held for another");
    assert!(
        matches!(error.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{error}"
    );
    // First failure within an attempt's bound (the I/O timeout), the grace, then the last
    // attempt (another I/O timeout) and its give-back; 5 s more for a loaded host.
    let bound = io + (io + Duration::from_millis(500)) + io * 2 + Duration::from_secs(5);
    let took = ended.duration_since(stopped);
    assert!(took < bound, "the wait ended {took:?} after the stop");
    drop(guard);
}

/// Every member answers, two of three refusing the attempt (`OOM`: maxmemory with
/// noeviction) and one holding the lock for another owner: an error reply is an answer, so
/// the attempt is `Busy` (not a connection error), and a wait lasts until its deadline,
/// ending `Busy`, as a wait beside a held lock does.
#[test]
fn members_that_refuse_beside_one_that_holds_make_the_lock_busy() {
    let servers = primaries(3);
    let list = urls(&servers);
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    let options = || ClientOptions::default().io_timeout(Duration::from_millis(300));
    let holder = Client::redlock(&list, options()).unwrap();
    let guard = holder
        .lock("refused")
        .ttl(Duration::from_secs(60))
        .renew(false)
        .try_acquire()
        .unwrap();
    for server in &servers[1..] {
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory", "1"]);
    }
    let waiter = Client::redlock(&list, options()).unwrap();
    let lock = || {
        waiter
            .lock("refused")
            .ttl(Duration::from_secs(10))
            .renew(false)
    };
    let once = lock().try_acquire().map(drop).unwrap_err();
    let started = Instant::now();
    let waited = lock().acquire_timeout(Duration::from_secs(2)).map(drop);
    let took = started.elapsed();
    for server in &servers[1..] {
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory", "0"]);
    }
    assert_eq!(once.kind(), ErrorKind::Busy, "{once}");
    assert!(once.message().contains("refused"), "{once}");
    let waited = waited.unwrap_err();
    assert_eq!(waited.kind(), ErrorKind::Busy, "{waited}");
    assert!(
        took >= Duration::from_secs(2),
        "the wait ended after {took:?}"
    );
    for server in &servers {
        assert_eq!(server.get("refused").as_deref(), Some(guard.token()));
    }
}

/// Every member refusing (out of memory) is the servers' answer: a `Server` error, at once
/// also for a waiter, and nothing left behind on any member.
#[test]
fn members_that_all_refuse_make_a_server_error() {
    let servers = primaries(3);
    let list = urls(&servers);
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    let client = Client::redlock(
        &list,
        ClientOptions::default().io_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    for server in &servers {
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory", "1"]);
    }
    let lock = || client.lock("all-refuse").ttl(Duration::from_secs(10));
    let once = lock().try_acquire().map(drop).unwrap_err();
    let started = Instant::now();
    let waited = lock().acquire_timeout(Duration::from_secs(5)).map(drop);
    let took = started.elapsed();
    for server in &servers {
        server.cmd::<()>(&["CONFIG", "SET", "maxmemory", "0"]);
    }
    assert_eq!(once.kind(), ErrorKind::Server, "{once}");
    assert!(once.message().contains("refused"), "{once}");
    let waited = waited.unwrap_err();
    assert_eq!(waited.kind(), ErrorKind::Server, "{waited}");
    assert!(
        took < Duration::from_secs(5),
        "the wait went on for {took:?} against members that all refuse"
    );
    for server in &servers {
        assert_eq!(server.get("all-refuse"), None);
    }
    lock().try_acquire().unwrap().release().unwrap();
}

/// A thread that releases a Redlock lock and asks for it again at once goes behind the
/// thread of its process that was waiting: the release wakes that waiter, which takes the
/// lock, where it used to sleep out its backoff (hundreds of milliseconds by then) while
/// the releaser took the lock straight back.
#[test]
fn a_release_gives_the_turn_to_the_thread_of_the_process_that_waited_first() {
    let servers = primaries(3);
    let client = redlock(&urls(&servers));
    let rounds = 10;
    let mut waiter_first = 0;
    for round in 0..rounds {
        let name = format!("turns:{round}");
        let held = client
            .lock(&name)
            .ttl(Duration::from_secs(10))
            .try_acquire()
            .unwrap();
        let first = Arc::new(Mutex::new(None::<&'static str>));
        let waiter = {
            let (client, name, first) = (client.clone(), name.clone(), first.clone());
            std::thread::spawn(move || {
                let guard = client
                    .lock(&name)
                    .ttl(Duration::from_secs(10))
                    .acquire_timeout(Duration::from_secs(10))
                    .unwrap();
                first.lock().unwrap().get_or_insert("waiter");
                std::thread::sleep(Duration::from_millis(20));
                guard.release().unwrap();
            })
        };
        // The waiter's backoff grows past 150 ms meanwhile.
        std::thread::sleep(Duration::from_millis(400));
        held.release().unwrap();
        let again = client
            .lock(&name)
            .ttl(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(10))
            .unwrap();
        first.lock().unwrap().get_or_insert("releaser");
        again.release().unwrap();
        waiter.join().unwrap();
        if *first.lock().unwrap() == Some("waiter") {
            waiter_first += 1;
        }
    }
    // Without the line the releaser comes first every time; a wake-up that comes late on
    // a loaded machine may lose a round.
    assert!(
        waiter_first >= rounds * 7 / 10,
        "the waiter came first in {waiter_first} of {rounds} rounds"
    );
}

/// A waiter sleeping in its process's line still ends at once when it is cancelled, and
/// the waiter that was behind it is first in the line then: a release wakes it, and it
/// comes before the releaser that asks again at once.
#[test]
fn a_cancelled_waiter_leaves_the_line_to_the_one_behind_it() {
    let servers = primaries(3);
    let client = redlock(&urls(&servers));
    let name = "line:cancel";
    let held = client
        .lock(name)
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .unwrap();
    let token = redlease::CancelToken::new();
    let cancelled = {
        let (client, token) = (client.clone(), token.clone());
        std::thread::spawn(move || {
            client
                .lock(name)
                .cancel_token(&token)
                .acquire()
                .map(|_| ())
                .unwrap_err()
                .kind()
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let first = Arc::new(Mutex::new(None::<&'static str>));
    let behind = {
        let (client, first) = (client.clone(), first.clone());
        std::thread::spawn(move || {
            let guard = client
                .lock(name)
                .ttl(Duration::from_secs(10))
                .acquire_timeout(Duration::from_secs(10))
                .unwrap();
            first.lock().unwrap().get_or_insert("behind");
            std::thread::sleep(Duration::from_millis(20));
            guard.release().unwrap();
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    token.cancel();
    assert_eq!(
        within(Duration::from_secs(2), move || cancelled.join().unwrap()),
        ErrorKind::Cancelled
    );
    held.release().unwrap();
    let again = client
        .lock(name)
        .ttl(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(10))
        .unwrap();
    first.lock().unwrap().get_or_insert("releaser");
    again.release().unwrap();
    behind.join().unwrap();
    assert_eq!(*first.lock().unwrap(), Some("behind"));
}
