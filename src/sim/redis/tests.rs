//! Unit tests of the simulated server as a simulation drives it: Lua conversions and
//! errors, blocking order, expiry on virtual time and clock offsets, replication lag and
//! `WAIT`, failover, restart, out of memory, and the real scripts' handoff.

use redis::Value;

use super::{
    Command, ConnId, ConnectionClosed, DEFAULT_CLOCK_MS, ReplicaLink, Server, ServerId, command,
    from_cmd,
};
use crate::scripts::{ACQUIRE, Lua, RELEASE};

fn server() -> Server {
    Server::new(ServerId(1))
}

/// Sends one command and returns its one reply (it must not block).
fn query(server: &mut Server, conn: ConnId, args: &[&str]) -> Value {
    server.submit(conn, [command(args)]).expect("connected");
    let mut replies = server.take_replies(conn);
    assert_eq!(replies.len(), 1, "{args:?} gave {replies:?}");
    replies.remove(0)
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn ints(items: &[i64]) -> Value {
    Value::Array(items.iter().map(|n| Value::Int(*n)).collect())
}

/// The text of an error reply, `CODE message`.
fn error_text(value: &Value) -> String {
    match value {
        Value::ServerError(e) => match e.details() {
            Some(details) => format!("{} {details}", e.code()),
            None => e.code().to_owned(),
        },
        other => panic!("not an error: {other:?}"),
    }
}

fn eval(server: &mut Server, conn: ConnId, body: &str, keys: &[&str], args: &[&str]) -> Value {
    let numkeys = keys.len().to_string();
    let mut all = vec!["EVAL", body, &numkeys];
    all.extend_from_slice(keys);
    all.extend_from_slice(args);
    query(server, conn, &all)
}

/// `EVAL` of a real script (its text, so no cache is needed).
fn script(script: &Lua, keys: &[&str], args: &[&str]) -> Command {
    let mut all = vec![
        "EVAL".to_owned(),
        script.code.clone(),
        keys.len().to_string(),
    ];
    all.extend(keys.iter().map(|k| k.to_string()));
    all.extend(args.iter().map(|a| a.to_string()));
    all.into_iter().map(String::into_bytes).collect()
}

// --- Lua conversions and errors ---

#[test]
fn lua_values_become_replies_as_in_redis() {
    let mut s = server();
    let c = s.connect();
    let reply = eval(
        &mut s,
        c,
        "return {1, 2.9, -2.9, 'x', true, false, nil, 4}",
        &[],
        &[],
    );
    assert_eq!(
        reply,
        Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(-2),
            bulk("x"),
            Value::Int(1),
            Value::Nil
        ])
    );
    assert_eq!(
        eval(&mut s, c, "return {ok='FINE'}", &[], &[]),
        Value::SimpleString("FINE".into())
    );
    assert_eq!(
        eval(&mut s, c, "return redis.status_reply('OK')", &[], &[]),
        Value::Okay
    );
    assert_eq!(
        error_text(&eval(&mut s, c, "return {err='boom'}", &[], &[])),
        "boom"
    );
    assert_eq!(
        error_text(&eval(
            &mut s,
            c,
            "return redis.error_reply('boom')",
            &[],
            &[]
        )),
        "ERR boom"
    );
    assert_eq!(
        error_text(&eval(
            &mut s,
            c,
            "return redis.error_reply('MY boom')",
            &[],
            &[]
        )),
        "MY boom"
    );
    assert_eq!(
        eval(&mut s, c, "return {double=0.1}", &[], &[]),
        bulk("0.10000000000000001")
    );
    assert_eq!(
        eval(&mut s, c, "return 1e300", &[], &[]),
        Value::Int(i64::MIN)
    );
    assert_eq!(
        eval(&mut s, c, "return {err=1}", &[], &[]),
        Value::Array(vec![])
    );
    assert_eq!(
        eval(&mut s, c, "return {1, {2, {3}}, {ok='x'}}", &[], &[]),
        Value::Array(vec![
            Value::Int(1),
            Value::Array(vec![Value::Int(2), ints(&[3])]),
            Value::SimpleString("x".into())
        ])
    );
    assert_eq!(
        eval(&mut s, c, "return KEYS[2] .. ARGV[1]", &["a", "b"], &["c"]),
        bulk("bc")
    );
}

#[test]
fn replies_become_lua_values_as_in_redis() {
    let mut s = server();
    let c = s.connect();
    query(&mut s, c, &["SET", "s", "v"]);
    let probe = r"
        local t = {}
        t[1] = type(redis.call('GET', 'nokey'))          -- nil bulk: false
        t[2] = type(redis.call('EXISTS', 's'))           -- integer: number
        t[3] = redis.call('SET', 's', 'w').ok            -- status: {ok=}
        t[4] = redis.pcall('LLEN', 's').err              -- error: {err=} from pcall
        t[5] = #redis.call('HMGET', 'nokey', 'a', 'b')   -- array with nils: falses
        t[6] = redis.call('GET', 's')                    -- bulk: string
        return t";
    assert_eq!(
        eval(&mut s, c, probe, &[], &[]),
        Value::Array(vec![
            bulk("boolean"),
            bulk("number"),
            bulk("OK"),
            bulk("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Value::Int(2),
            bulk("w"),
        ])
    );
    // Numbers go to commands as %.17g.
    eval(
        &mut s,
        c,
        "redis.call('SET', 'n', 0.1); redis.call('SET', 'm', 1700000000123)",
        &[],
        &[],
    );
    assert_eq!(query(&mut s, c, &["GET", "n"]), bulk("0.10000000000000001"));
    assert_eq!(query(&mut s, c, &["GET", "m"]), bulk("1700000000123"));
    assert_eq!(
        error_text(&eval(
            &mut s,
            c,
            "return redis.pcall('SET', 'a', {})",
            &[],
            &[]
        )),
        "ERR Lua redis lib command arguments must be strings or integers"
    );
}

#[test]
fn script_errors_read_as_redis_writes_them_and_keep_earlier_writes() {
    let mut s = server();
    let c = s.connect();
    query(&mut s, c, &["SET", "s", "v"]);
    let body = "redis.call('SET', 'before', '1')\nreturn redis.call('LLEN', 's')";
    let sha = super::lua::sha1_hex(body.as_bytes());
    assert_eq!(
        error_text(&eval(&mut s, c, body, &[], &[])),
        format!(
            "WRONGTYPE Operation against a key holding the wrong kind of value script: {sha}, on @user_script:2."
        )
    );
    assert_eq!(query(&mut s, c, &["GET", "before"]), bulk("1"));
    let sha = super::lua::sha1_hex(b"return y");
    assert_eq!(
        error_text(&eval(&mut s, c, "return y", &[], &[])),
        format!(
            "ERR user_script:1: Script attempted to access nonexistent global variable 'y' script: {sha}, on @user_script:1."
        )
    );
    let sha = super::lua::sha1_hex(b"x = 1");
    assert_eq!(
        error_text(&eval(&mut s, c, "x = 1", &[], &[])),
        format!(
            "ERR user_script:1: Attempt to modify a readonly table script: {sha}, on @user_script:1."
        )
    );
    let sha = super::lua::sha1_hex(b"return nil + 1");
    assert_eq!(
        error_text(&eval(&mut s, c, "return nil + 1", &[], &[])),
        format!(
            "ERR user_script:1: attempt to perform arithmetic on a nil value script: {sha}, on @user_script:1."
        )
    );
    let sha = super::lua::sha1_hex(b"error({err='TBL x'})");
    assert_eq!(
        error_text(&eval(&mut s, c, "error({err='TBL x'})", &[], &[])),
        format!("TBL x script: {sha}, on @user_script:1.")
    );
    assert_eq!(
        error_text(&eval(&mut s, c, "return 1 +", &[], &[])),
        "ERR Error compiling script (new function): user_script:1: unexpected symbol near '<eof>'"
    );
    let sha = super::lua::sha1_hex(b"return redis.call('BLPOP', 'l', 0)");
    assert_eq!(
        error_text(&eval(
            &mut s,
            c,
            "return redis.call('BLPOP', 'l', 0)",
            &[],
            &[]
        )),
        format!(
            "ERR This Redis command is not allowed from script script: {sha}, on @user_script:1."
        )
    );
}

#[test]
fn eval_caches_its_script_and_script_flush_forgets_it() {
    let mut s = server();
    let c = s.connect();
    let sha = super::lua::sha1_hex(b"return 1");
    assert_eq!(
        error_text(&query(&mut s, c, &["EVALSHA", &sha, "0"])),
        "NOSCRIPT No matching script. Please use EVAL."
    );
    assert_eq!(eval(&mut s, c, "return 1", &[], &[]), Value::Int(1));
    assert_eq!(
        query(&mut s, c, &["EVALSHA", &sha.to_uppercase(), "0"]),
        Value::Int(1)
    );
    assert_eq!(
        query(&mut s, c, &["SCRIPT", "EXISTS", &sha, "nope"]),
        ints(&[1, 0])
    );
    assert_eq!(query(&mut s, c, &["SCRIPT", "FLUSH"]), Value::Okay);
    assert!(error_text(&query(&mut s, c, &["EVALSHA", &sha, "0"])).starts_with("NOSCRIPT"));
    assert_eq!(
        query(&mut s, c, &["SCRIPT", "LOAD", "return 1"]),
        bulk(&sha)
    );
    assert_eq!(query(&mut s, c, &["EVALSHA", &sha, "0"]), Value::Int(1));
    assert_eq!(
        error_text(&query(&mut s, c, &["EVAL", "return 1", "2", "a"])),
        "ERR Number of keys can't be greater than number of args"
    );
}

// --- Blocking ---

#[test]
fn blpop_serves_blocked_connections_first_come_first_served_and_holds_their_pipelines() {
    let mut s = server();
    let (a, b, pusher) = (s.connect(), s.connect(), s.connect());
    s.submit(
        a,
        [command(&["BLPOP", "q", "0"]), command(&["GET", "after-a"])],
    )
    .expect("a");
    s.submit(
        b,
        [command(&["BLPOP", "q", "0"]), command(&["GET", "after-b"])],
    )
    .expect("b");
    assert!(s.is_blocked(a) && s.is_blocked(b));
    assert!(s.take_replies(a).is_empty());
    // One element: the first to block gets it, and its pipelined GET runs right after.
    query(&mut s, pusher, &["SET", "after-a", "1"]);
    assert_eq!(query(&mut s, pusher, &["RPUSH", "q", "x"]), Value::Int(1));
    assert_eq!(
        s.take_replies(a),
        vec![Value::Array(vec![bulk("q"), bulk("x")]), bulk("1")]
    );
    assert!(s.take_replies(b).is_empty());
    assert_eq!(s.connections_with_replies(), Vec::<ConnId>::new());
    assert_eq!(
        query(&mut s, pusher, &["RPUSH", "q", "y", "z"]),
        Value::Int(2)
    );
    assert_eq!(
        s.take_replies(b),
        vec![Value::Array(vec![bulk("q"), bulk("y")]), Value::Nil]
    );
    assert_eq!(query(&mut s, pusher, &["LLEN", "q"]), Value::Int(1));
}

#[test]
fn a_list_pushed_and_deleted_by_one_script_serves_nobody() {
    let mut s = server();
    let (a, other) = (s.connect(), s.connect());
    s.submit(a, [command(&["BLPOP", "q", "0"])]).expect("a");
    eval(
        &mut s,
        other,
        "redis.call('RPUSH', 'q', 'x'); redis.call('DEL', 'q')",
        &[],
        &[],
    );
    assert!(s.is_blocked(a));
    eval(
        &mut s,
        other,
        "redis.call('RPUSH', 'q', 'x'); redis.call('RPUSH', 'q', 'y')",
        &[],
        &[],
    );
    assert_eq!(
        s.take_replies(a),
        vec![Value::Array(vec![bulk("q"), bulk("x")])]
    );
}

#[test]
fn blpop_times_out_at_the_event_loops_next_wakeup_and_a_disconnect_drops_it() {
    let mut s = server();
    let (a, b, pusher) = (s.connect(), s.connect(), s.connect());
    s.advance(1000);
    s.submit(a, [command(&["BLPOP", "q", "0.25"]), command(&["PING"])])
        .expect("a");
    s.submit(b, [command(&["BLPOP", "q", "0"])]).expect("b");
    // Past its deadline (1250) at 1251, but Redis notices at its next wake-up (1300).
    assert_eq!(s.block_deadline(a), Some(DEFAULT_CLOCK_MS + 1250));
    assert_eq!(s.next_timer(), Some(1300));
    s.advance(1299);
    assert!(s.take_replies(a).is_empty());
    s.advance(1300);
    assert_eq!(
        s.take_replies(a),
        vec![Value::Nil, Value::SimpleString("PONG".into())]
    );
    assert_eq!(s.next_timer(), None);
    // With a wake-up every ms, a timeout is noticed as soon as it has passed.
    s.set_wakeup_interval(1);
    s.submit(a, [command(&["BLPOP", "q", "0.01"])]).expect("a");
    assert_eq!(s.next_timer(), Some(1311));
    s.advance(1311);
    assert_eq!(s.take_replies(a), vec![Value::Nil]);
    s.disconnect(b);
    assert_eq!(s.submit(b, [command(&["PING"])]), Err(ConnectionClosed));
    query(&mut s, pusher, &["RPUSH", "q", "x"]);
    assert_eq!(query(&mut s, pusher, &["LLEN", "q"]), Value::Int(1));
}

#[test]
fn a_blpop_past_its_deadline_is_still_served_by_a_push_before_the_wakeup() {
    let mut s = server();
    let (waiter, pusher, late) = (s.connect(), s.connect(), s.connect());
    s.advance(1000);
    s.submit(waiter, [command(&["BLPOP", "q", "0.01"])])
        .expect("waiter");
    s.advance(1050);
    assert!(s.is_blocked(waiter));
    query(&mut s, pusher, &["RPUSH", "q", "x"]);
    assert_eq!(
        s.take_replies(waiter),
        vec![Value::Array(vec![bulk("q"), bulk("x")])]
    );
    // Any command the server reads lets it notice a timeout right after that command.
    s.submit(waiter, [command(&["BLPOP", "q", "0.01"])])
        .expect("waiter");
    s.advance(1070);
    assert_eq!(
        query(&mut s, late, &["PING"]),
        Value::SimpleString("PONG".into())
    );
    assert_eq!(s.take_replies(waiter), vec![Value::Nil]);
}

/// As Redis 7.0 after a stop (SIGSTOP, then SIGCONT: its `epoll_wait` returns `EINTR`, and
/// `beforeSleep` times blocks out before any socket is read) or a long command: a block
/// whose timeout passed meanwhile is answered nil, and a push that arrived meanwhile stays
/// in the list (measured against redis-server 7.0.15: 28 of 28 trials).
#[test]
fn after_a_stop_blocks_that_timed_out_are_answered_before_what_arrived() {
    let mut s = server();
    let (waiter, pusher) = (s.connect(), s.connect());
    s.advance(1000);
    s.submit(waiter, [command(&["BLPOP", "q", "0.05"])])
        .expect("waiter");
    // The world advances a stopped server to the moment it resumes, then delivers.
    s.advance(2000);
    assert_eq!(query(&mut s, pusher, &["RPUSH", "q", "x"]), Value::Int(1));
    assert_eq!(s.take_replies(waiter), vec![Value::Nil]);
    assert_eq!(query(&mut s, pusher, &["LLEN", "q"]), Value::Int(1));
}

// --- Expiry and clocks ---

#[test]
fn keys_expire_on_virtual_time_and_on_steps_of_the_wall_clock() {
    let mut s = server();
    let c = s.connect();
    query(&mut s, c, &["SET", "k", "v", "PX", "100"]);
    assert_eq!(s.next_timer(), Some(101));
    s.advance(60);
    assert_eq!(query(&mut s, c, &["PTTL", "k"]), Value::Int(40));
    s.advance(100);
    assert_eq!(query(&mut s, c, &["PTTL", "k"]), Value::Int(0));
    s.advance(101);
    assert_eq!(query(&mut s, c, &["GET", "k"]), Value::Nil);
    // A clock stepped forward expires keys early, as on a real server.
    query(&mut s, c, &["SET", "k", "v", "PX", "10000"]);
    s.set_clock_offset(s.clock_offset() + 20_000);
    s.advance(101);
    assert_eq!(query(&mut s, c, &["EXISTS", "k"]), Value::Int(0));
}

#[test]
fn time_reads_the_servers_own_wall_clock_and_is_frozen_within_a_script() {
    let mut a = server();
    let mut b = Server::new(ServerId(2));
    b.set_clock_offset(DEFAULT_CLOCK_MS - 5_000);
    let (ca, cb) = (a.connect(), b.connect());
    a.advance(1_234);
    b.advance(1_234);
    let secs = |ms: i64| bulk(&(ms / 1000).to_string());
    let micros = |ms: i64| bulk(&((ms % 1000) * 1000).to_string());
    let wall = DEFAULT_CLOCK_MS + 1_234;
    assert_eq!(
        query(&mut a, ca, &["TIME"]),
        Value::Array(vec![secs(wall), micros(wall)])
    );
    let wall = wall - 5_000;
    assert_eq!(
        query(&mut b, cb, &["TIME"]),
        Value::Array(vec![secs(wall), micros(wall)])
    );
    let same = "local a = redis.call('TIME'); local b = redis.call('TIME'); return a[1] == b[1] and a[2] == b[2]";
    assert_eq!(eval(&mut a, ca, same, &[], &[]), Value::Int(1));
}

// --- Replication, WAIT, failover, restart ---

#[test]
fn a_lagging_replica_applies_writes_after_its_delay_and_wait_counts_it() {
    let (mut p, mut r) = (server(), Server::new(ServerId(2)));
    let c = p.connect();
    query(&mut p, c, &["SET", "before", "1"]);
    let mut link = ReplicaLink::attach(&mut p, &mut r, 50);
    assert!(r.is_replica());
    assert_eq!(r.value(b"before"), p.value(b"before"));
    assert_eq!(query(&mut p, c, &["WAIT", "1", "0"]), Value::Int(1));

    p.advance(10);
    query(&mut p, c, &["SET", "k", "v", "PX", "1000"]);
    let expiry = p
        .entries()
        .find(|(k, _)| *k == b"k")
        .map(|(_, e)| e.expires_at);
    assert!(matches!(expiry, Some(Some(at)) if at == p.wall_clock_ms() + 1000));
    p.submit(c, [command(&["WAIT", "1", "100"]), command(&["GET", "k"])])
        .expect("wait");
    assert!(p.is_blocked(c));
    assert_eq!(link.next_timer(&p, &r), Some(60));
    link.pump(&mut p, &mut r);
    assert_eq!(r.value(b"k"), None);
    p.advance(60);
    r.advance(60);
    link.pump(&mut p, &mut r);
    assert_eq!(p.take_replies(c), vec![Value::Int(1), bulk("v")]);
    // The expiry travels as an absolute time of the primary's clock.
    let rc = r.connect();
    assert_eq!(query(&mut r, rc, &["PTTL", "k"]), Value::Int(950));
    let readonly = "READONLY You can't write against a read only replica.";
    assert_eq!(error_text(&query(&mut r, rc, &["SET", "x", "1"])), readonly);
    assert_eq!(
        error_text(&query(&mut r, rc, &["BLPOP", "q", "1"])),
        readonly
    );
    assert_eq!(
        eval(&mut r, rc, "return redis.call('GET', 'k')", &[], &[]),
        bulk("v")
    );
    let sha = super::lua::sha1_hex(b"return redis.call('DEL', 'k')");
    assert_eq!(
        error_text(&eval(&mut r, rc, "return redis.call('DEL', 'k')", &[], &[])),
        format!("{readonly} script: {sha}, on @user_script:1.")
    );
    assert!(
        error_text(&query(&mut r, rc, &["WAIT", "0", "0"])).starts_with("ERR WAIT cannot be used")
    );

    // WAIT times out with what it has.
    link.set_delay(1_000);
    query(&mut p, c, &["SET", "late", "1"]);
    p.submit(c, [command(&["WAIT", "1", "100"])]).expect("wait");
    assert_eq!(p.next_timer(), Some(200));
    p.advance(199);
    assert!(p.take_replies(c).is_empty());
    p.advance(200);
    assert_eq!(p.take_replies(c), vec![Value::Int(0)]);
}

#[test]
fn a_failover_promotes_the_replica_with_what_it_had_applied() {
    let (mut p, mut r) = (server(), Server::new(ServerId(2)));
    let c = p.connect();
    let link = ReplicaLink::attach(&mut p, &mut r, 100);
    query(&mut p, c, &["SET", "applied", "1"]);
    p.advance(200);
    let mut link = link;
    link.pump(&mut p, &mut r);
    query(&mut p, c, &["SET", "lost", "1"]);
    assert_eq!(link.replica(), r.id());
    link.detach(&mut p);
    r.promote();
    let rc = r.connect();
    assert_eq!(query(&mut r, rc, &["GET", "applied"]), bulk("1"));
    assert_eq!(query(&mut r, rc, &["GET", "lost"]), Value::Nil);
    assert_eq!(query(&mut r, rc, &["SET", "new", "1"]), Value::Okay);
    // The old primary rejoins as a replica of the new one and loses its own write.
    let blocked = p.connect();
    p.submit(blocked, [command(&["BLPOP", "q", "0"])])
        .expect("blpop");
    let _back = ReplicaLink::attach(&mut r, &mut p, 0);
    assert!(error_text(&p.take_replies(blocked)[0]).starts_with("UNBLOCKED"));
    assert_eq!(query(&mut p, c, &["GET", "lost"]), Value::Nil);
    assert_eq!(query(&mut p, c, &["GET", "new"]), bulk("1"));
}

#[test]
fn a_restart_loses_keys_scripts_and_connections_and_resyncs_replicas() {
    let (mut p, mut r) = (server(), Server::new(ServerId(2)));
    let mut link = ReplicaLink::attach(&mut p, &mut r, 0);
    let c = p.connect();
    query(&mut p, c, &["SET", "k", "v"]);
    eval(&mut p, c, "return 1", &[], &[]);
    link.pump(&mut p, &mut r);
    assert!(r.value(b"k").is_some());
    p.restart();
    assert!(!p.is_connected(c));
    assert_eq!(p.submit(c, [command(&["PING"])]), Err(ConnectionClosed));
    let c = p.connect();
    assert_eq!(query(&mut p, c, &["GET", "k"]), Value::Nil);
    let sha = super::lua::sha1_hex(b"return 1");
    assert!(error_text(&query(&mut p, c, &["EVALSHA", &sha, "0"])).starts_with("NOSCRIPT"));
    assert_eq!(link.next_timer(&p, &r), Some(0));
    link.pump(&mut p, &mut r);
    assert_eq!(r.value(b"k"), None);
}

// --- Out of memory ---

#[test]
fn out_of_memory_refuses_additions_but_not_deletions_nor_a_dirty_scripts_writes() {
    let mut s = server();
    let c = s.connect();
    query(&mut s, c, &["SET", "k", "v"]);
    s.set_oom(true);
    let oom = "OOM command not allowed when used memory > 'maxmemory'.";
    assert_eq!(error_text(&query(&mut s, c, &["SET", "a", "1"])), oom);
    assert_eq!(error_text(&query(&mut s, c, &["RPUSH", "l", "1"])), oom);
    assert_eq!(query(&mut s, c, &["GET", "k"]), bulk("v"));
    assert_eq!(
        error_text(&eval(
            &mut s,
            c,
            "return redis.pcall('SET', 'a', 1)",
            &[],
            &[]
        )),
        oom
    );
    assert_eq!(
        eval(
            &mut s,
            c,
            "redis.call('DEL', 'nothing'); return redis.call('SET', 'a', 1)",
            &[],
            &[]
        ),
        Value::Okay
    );
    assert_eq!(query(&mut s, c, &["DEL", "k", "a"]), Value::Int(2));
    s.set_oom(false);
    assert_eq!(query(&mut s, c, &["SET", "a", "1"]), Value::Okay);
}

// --- The real scripts ---

#[test]
fn a_release_hands_the_lock_to_the_waiter_blocked_in_its_pipeline() {
    let mut s = server();
    let (holder, waiter) = (s.connect(), s.connect());
    let keys = [
        "{l}",
        "{l}:fence",
        "{l}:wake",
        "{l}:queue",
        "{l}:grant",
        "{l}:waiting",
    ];
    // No estimate of the server's clock (0): the script reads it and says what it read.
    let acquire =
        |token: &str, mode: &str| script(&ACQUIRE, &keys, &[token, "30000", "0", mode, "5000"]);
    s.submit(holder, [acquire("h", "0")]).expect("holder");
    let Value::Array(got) = &s.take_replies(holder)[0] else {
        panic!("not an array");
    };
    assert_eq!(got[0], Value::Int(1));
    let Value::Int(first_fence) = got[1] else {
        panic!("no fencing token");
    };
    assert!(first_fence >= DEFAULT_CLOCK_MS * 1000);
    assert_eq!(
        got.get(3),
        Some(&Value::Int(first_fence)),
        "the clock it read"
    );
    // The waiter registers, then blocks with its next attempt pipelined behind the BLPOP.
    s.submit(waiter, [acquire("w", "1")]).expect("register");
    assert_eq!(s.take_replies(waiter), vec![ints(&[0, 30000])]);
    s.submit(
        waiter,
        [
            from_cmd(redis::cmd("BLPOP").arg("{l}:wake").arg(5)),
            acquire("w", "2"),
        ],
    )
    .expect("block");
    assert!(s.is_blocked(waiter));
    s.advance(10);
    let release_keys = ["{l}", "{l}:wake", "{l}:queue", "{l}:grant", "{l}:waiting"];
    let release = script(
        &RELEASE,
        &release_keys,
        &["h", "handoff", "200", "5000", "0"],
    );
    s.submit(holder, [release]).expect("release");
    assert_eq!(s.take_replies(holder), vec![Value::Int(2)]);
    let replies = s.take_replies(waiter);
    assert_eq!(
        replies[0],
        Value::Array(vec![bulk("{l}:wake"), bulk("handoff")])
    );
    let Value::Array(taken) = &replies[1] else {
        panic!("not an array: {replies:?}");
    };
    assert_eq!(taken[0], Value::Int(1));
    assert!(matches!(taken[1], Value::Int(fence) if fence > first_fence));
    assert_eq!(taken[2], Value::Int(5000));
    assert_eq!(s.value(b"{l}"), Some(&super::Data::Str(b"w".to_vec())));
}
