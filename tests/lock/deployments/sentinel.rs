//! Sentinel: a failover moves clients to the new primary (a lock held across it is still
//! held or reported lost, never held by two; fencing tokens keep increasing), silent
//! Sentinels listed first do not hide the one that answers, and a client moves to another
//! primary only when a majority of the Sentinels name it (fake Sentinels, which can be
//! made to lag behind or go silent, in front of two real primaries).

use std::cell::Cell;
use std::time::{Duration, Instant};

use redlease::{Client, ClientOptions, ErrorKind};

use super::quick;
use crate::support::deploy::SentinelDeployment;
use crate::support::fake_sentinel::{Answer, FakeSentinel};
use crate::support::proxy::Proxy;
use crate::support::{RedisServer, eventually};

/// Sentinel: the primary is stopped until the Sentinels fail over; clients continue on the
/// new primary; a lock held across the failover is still held or reported lost, never held
/// by two; fencing tokens after the failover are above those before.
#[test]
fn a_sentinel_failover_moves_clients_to_the_new_primary() {
    let deployment = SentinelDeployment::start(2, 3, 1000);
    let client = quick(&deployment.url());
    let mut last_fence = 0;
    for _ in 0..20 {
        let guard = client.lock("before").try_acquire().unwrap();
        last_fence = last_fence.max(guard.fencing_token());
        guard.release().unwrap();
    }
    let held = client
        .lock("across")
        .ttl(Duration::from_secs(2))
        .acquire()
        .unwrap();
    let old_port = deployment.primary_port();
    deployment.primary().pause();
    let stopped = Instant::now();
    let new_port = deployment.wait_for_failover(old_port, Duration::from_secs(30));
    let failover_took = stopped.elapsed();
    // Clients continue on the new primary within the failover time and their bounds.
    let resumed = eventually(Duration::from_secs(10), || {
        client.lock("after").try_acquire().is_ok()
    });
    assert!(
        resumed,
        "no acquire succeeded on the new primary {new_port}"
    );
    let after = client.lock("before").try_acquire().unwrap();
    assert!(
        after.fencing_token() > last_fence,
        "fencing token {} after the failover, {last_fence} before",
        after.fencing_token()
    );
    after.release().unwrap();
    // The lock held across: still held with its key on the new primary, or lost. (Default
    // timeouts: this one must answer Busy, not time out on a loaded host.)
    let other = Client::open(&deployment.url()).unwrap();
    match other.lock("across").try_acquire() {
        Ok(second) => {
            assert!(
                !held.is_held(),
                "two holders: the first still believes it holds the lock"
            );
            second.release().unwrap();
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Busy, "{e}"),
    }
    eprintln!("failover took {failover_took:?}; old primary {old_port}, new {new_port}");
    deployment
        .servers
        .iter()
        .find(|s| s.port == old_port)
        .unwrap()
        .resume();
}

/// Sentinel: after a failover the old primary takes writes until the Sentinels demote it
/// (here never: it cannot run `REPLICAOF`). A client that used it moves to the primary the
/// Sentinels name within a recheck, so it never holds a lock on the old primary that a
/// client of the new one is granted too. (Clients kept the old primary until it answered
/// `READONLY`: an auditor saw two holders of one lock for 20 s after a failover that lost
/// no write.)
#[test]
fn a_client_moves_to_the_primary_the_sentinels_name_while_the_old_one_takes_writes() {
    let deployment = SentinelDeployment::start_with(
        1,
        3,
        1000,
        &[
            "--rename-command",
            "REPLICAOF",
            "",
            "--rename-command",
            "SLAVEOF",
            "",
        ],
    );
    let client = quick(&deployment.url());
    client
        .lock("warm")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
    let old_port = deployment.primary_port();
    // A Sentinel that has not yet looked at the replica refuses (NOGOODSLAVE) for a while.
    let failover = eventually(Duration::from_secs(30), || {
        let mut conn = deployment.sentinels[0].conn();
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&deployment.master)
            .query::<String>(&mut conn)
            .is_ok()
    });
    assert!(failover, "no Sentinel failover started");
    let new_port = deployment.wait_for_failover(old_port, Duration::from_secs(30));
    let server = |port| deployment.servers.iter().find(|s| s.port == port).unwrap();
    let (old, new) = (server(old_port), server(new_port));
    let role = |s: &crate::support::RedisServer| {
        let role: Vec<redis::Value> = s.cmd(&["ROLE"]);
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
    };
    // The client moves once a majority of the Sentinels name the new primary: the others
    // learn it from the leader's hello messages (every 2 s); a loaded host adds to that.
    // Without the recheck it would never move (the old primary is never demoted).
    let moved_by = Instant::now() + redlease_recheck() + Duration::from_secs(8);
    let mut on_old = 0;
    loop {
        // The window this test is about: both say they are the primary.
        assert!(role(old) && role(new));
        let guard = client.lock("after").try_acquire().unwrap();
        let on_new = new.cmd::<bool>(&["EXISTS", "after"]);
        guard.release().unwrap();
        if on_new {
            break;
        }
        on_old += 1;
        assert!(
            Instant::now() < moved_by,
            "{on_old} locks taken on the old primary {old_port}; the Sentinels name {new_port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // From now on one lock, one holder: a fresh client (on the new primary) is refused.
    let held = client.lock("y").try_acquire().unwrap();
    let other = quick(&deployment.url());
    assert_eq!(
        other.lock("y").try_acquire().unwrap_err().kind(),
        ErrorKind::Busy
    );
    assert!(!old.cmd::<bool>(&["EXISTS", "y"]));
    held.release().unwrap();
    eprintln!("{on_old} acquires went to the old primary before the client moved");
}

/// How long a Sentinel client trusts its primary without asking again (the library's
/// `RECHECK`).
fn redlease_recheck() -> Duration {
    Duration::from_secs(1)
}

/// Sentinel: Sentinels that do not answer, listed first, cost their timeouts, and the one
/// that answers is still asked within the call's bounds. (The Sentinel client once shared
/// the Cluster's retry window of one connect and one I/O timeout, which two silent
/// Sentinels used up: every call failed though a Sentinel and the primary were healthy.)
#[test]
fn silent_sentinels_listed_first_do_not_hide_the_one_that_answers() {
    let deployment = SentinelDeployment::start(0, 1, 5000);
    let sentinel = &deployment.sentinels[0];
    let silent: Vec<Proxy> = (0..2).map(|_| Proxy::start(sentinel.port)).collect();
    for proxy in &silent {
        proxy.blackhole(true);
    }
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/{}",
        silent[0].port(),
        silent[1].port(),
        sentinel.port,
        deployment.master
    );
    let options = ClientOptions::default()
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1));
    let client = Client::with_options(&url, options).unwrap();
    let guard = client.lock("found").try_acquire().unwrap();
    guard.release().unwrap();
}

/// Which of two independent primaries a lock's key is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum On {
    A,
    B,
}

/// Two independent primaries A and B (no replication: both say they are primaries, as an
/// old primary does until the Sentinels demote it), three fake Sentinels naming A at first,
/// and a client that finds its primary through them (listed in this order). Where the
/// client's acquires go is seen only from which server holds their keys.
///
/// The client trusts its primary for 1 s, then asks the Sentinels again, starting at the
/// next one in the list each time: so whether a recheck started at a given fake can be
/// told from that fake's count of questions, where the fakes listed after it answer
/// nothing that makes the client ask on (see each test).
struct MajorityRig {
    a: RedisServer,
    b: RedisServer,
    fakes: Vec<FakeSentinel>,
    client: Client,
    /// Locks taken so far: each acquire takes a new name.
    taken: Cell<u32>,
}

const MASTER: &str = "fakemaster";

/// Acquires still checked after the recheck a loop waited for: its answer may have been
/// used by the release after the acquire that saw it.
const FOLLOW_UP: u32 = 3;

impl MajorityRig {
    fn start() -> Self {
        let (a, b) = (RedisServer::start(), RedisServer::start());
        let fakes: Vec<FakeSentinel> = (0..3)
            .map(|_| FakeSentinel::start(MASTER, a.port))
            .collect();
        let hosts: Vec<String> = fakes.iter().map(FakeSentinel::host_port).collect();
        let url = format!("redis+sentinel://{}/{MASTER}", hosts.join(","));
        // Timeouts of 1 s: a recheck has its full time (250 ms) on a loaded host.
        let options = ClientOptions::default()
            .io_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(1));
        let client = Client::with_options(&url, options).unwrap();
        MajorityRig {
            a,
            b,
            fakes,
            client,
            taken: Cell::new(0),
        }
    }

    /// Takes a lock under a new name and says which primary holds its key (exactly one
    /// does).
    fn acquire(&self) -> On {
        let n = self.taken.get() + 1;
        self.taken.set(n);
        let name = format!("majority-{n}");
        let guard = self.client.lock(&name).try_acquire().unwrap();
        let exists = |server: &RedisServer| server.cmd::<bool>(&["EXISTS", &name]);
        let on = match (exists(&self.a), exists(&self.b)) {
            (true, false) => On::A,
            (false, true) => On::B,
            (on_a, on_b) => panic!("lock {name}: key on A {on_a}, on B {on_b}"),
        };
        // The release goes to the other primary if the client moved in between, and finds
        // nothing there: no matter, a name is never taken twice.
        let _ = guard.release();
        on
    }

    /// Acquires every 20 ms, each of which must go to `expected`, for at least `least` and
    /// until `done` holds (then [`FOLLOW_UP`] more), which it must within 15 s.
    fn stays_on(&self, expected: On, least: Duration, why: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        let (mut acquires, mut after) = (0, 0);
        while after < FOLLOW_UP {
            let on = self.acquire();
            acquires += 1;
            assert_eq!(
                on,
                expected,
                "acquire {acquires}, {:?} in, went to {on:?}: {why}",
                start.elapsed()
            );
            if after > 0 || (start.elapsed() >= least && done()) {
                after += 1;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the recheck waited for did not come within 15 s ({why})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Acquires every 20 ms until one goes to `to`, which must within 15 s (a few
    /// rechecks).
    fn moves_to(&self, to: On, why: &str) {
        let start = Instant::now();
        while self.acquire() != to {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no acquire went to {to:?} within 15 s: {why}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sentinel: one Sentinel of three naming another primary does not move a client (it may
/// be the one cut off with a stale view); a second one naming it does, within a few
/// rechecks, and the one still naming the old primary does not move the client back.
#[test]
fn a_client_moves_only_when_a_majority_of_the_sentinels_name_another_primary() {
    let rig = MajorityRig::start();
    assert_eq!(rig.acquire(), On::A, "all the Sentinels name A");
    // The third names B. It is asked only in the rechecks that start at it (those that
    // start at another hear A, the primary in use, first, and stop there): it must have
    // been asked first at least once, and a few seconds must have passed.
    rig.fakes[2].name(rig.b.port);
    let asked = rig.fakes[2].asked();
    rig.stays_on(
        On::A,
        Duration::from_millis(3500),
        "one Sentinel of three named B",
        || rig.fakes[2].asked() > asked,
    );
    // The second names B too: a majority.
    rig.fakes[1].name(rig.b.port);
    rig.moves_to(On::B, "two Sentinels of three name B");
    // The first still names A; it is asked only in the rechecks that start at it.
    let asked = rig.fakes[0].asked();
    rig.stays_on(
        On::B,
        Duration::ZERO,
        "two Sentinels of three name B, one A",
        || rig.fakes[0].asked() > asked,
    );
}

/// Sentinel (the flip-back attack): a client that moved to the new primary B stays there
/// when one Sentinel goes silent and the next one still names the old primary A, which
/// still says it is a primary: one stale answer, first or not, is not a majority.
#[test]
fn a_client_on_the_new_primary_does_not_move_back_when_a_stale_sentinel_answers_first() {
    let rig = MajorityRig::start();
    assert_eq!(rig.acquire(), On::A, "all the Sentinels name A");
    rig.fakes[1].name(rig.b.port);
    rig.fakes[2].name(rig.b.port);
    rig.moves_to(On::B, "two Sentinels of three name B");
    // The first goes silent (a recheck that starts there hears nothing in time and ends),
    // the second names A again, the third still B. The second is asked only in the
    // rechecks that start at it: it is heard first there, A before B.
    rig.fakes[0].answer(Answer::Silent);
    rig.fakes[1].name(rig.a.port);
    let asked = rig.fakes[1].asked();
    rig.stays_on(
        On::B,
        Duration::from_millis(3500),
        "one Sentinel silent, one naming A (asked first), one naming B",
        || rig.fakes[1].asked() > asked,
    );
}

/// Sentinel: a Sentinel listed first that keeps naming the old primary A does not keep a
/// client there when the two others name B: each recheck starts at the next Sentinel, so
/// the client hears the majority within a few rechecks, and then stays on B.
#[test]
fn a_stale_sentinel_listed_first_does_not_keep_the_client_on_the_old_primary() {
    let rig = MajorityRig::start();
    rig.fakes[1].name(rig.b.port);
    rig.fakes[2].name(rig.b.port);
    assert_eq!(
        rig.acquire(),
        On::A,
        "the client was to find A through the stale Sentinel, listed first: the case this \
         test is about"
    );
    rig.moves_to(On::B, "two Sentinels of three name B, the first A");
    let asked = rig.fakes[0].asked();
    rig.stays_on(
        On::B,
        Duration::ZERO,
        "two Sentinels of three name B, the first A",
        || rig.fakes[0].asked() > asked,
    );
}

/// Sentinel: the client asks its Sentinels again every second while it takes locks, on one
/// connection to each that it keeps, not on a new connection (a connect and a login) per
/// question; one a Sentinel closed is replaced.
#[test]
fn rechecks_ask_each_sentinel_on_a_connection_kept_for_it() {
    let rig = MajorityRig::start();
    let asked = |rig: &MajorityRig| rig.fakes.iter().map(FakeSentinel::asked).sum::<u64>();
    let connections =
        |rig: &MajorityRig| rig.fakes.iter().map(FakeSentinel::connections).sum::<u64>();
    let start = Instant::now();
    while asked(&rig) < 4 {
        assert_eq!(rig.acquire(), On::A);
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "only {} questions in 15 s",
            asked(&rig)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        connections(&rig) <= 3,
        "{} questions on {} connections",
        asked(&rig),
        connections(&rig)
    );
    // Every Sentinel hangs up on its next question, then answers again: the client opens
    // a new connection to each, once.
    for fake in &rig.fakes {
        fake.answer(Answer::HangUp);
    }
    let hung_up = asked(&rig);
    while asked(&rig) < hung_up + 3 {
        assert_eq!(rig.acquire(), On::A);
        assert!(start.elapsed() < Duration::from_secs(30), "no recheck");
        std::thread::sleep(Duration::from_millis(20));
    }
    for fake in &rig.fakes {
        fake.name(rig.a.port);
    }
    let before = (asked(&rig), connections(&rig));
    while asked(&rig) < before.0 + 4 {
        assert_eq!(rig.acquire(), On::A);
        assert!(start.elapsed() < Duration::from_secs(45), "no recheck");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        connections(&rig) <= before.1 + 3,
        "{} questions on {} new connections after the hang-ups",
        asked(&rig) - before.0,
        connections(&rig) - before.1
    );
}
