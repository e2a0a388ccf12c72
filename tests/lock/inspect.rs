//! The operators' view: inspecting a lock (holder, fencing token, time left, waiters),
//! listing locks by pattern, and breaking a lock, which checks the holder it was shown.

use std::time::Duration;

use redlease::{Client, ErrorKind};

use crate::support::{self, RedisServer, client, eventually};

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

/// A waiter counts once, also while registered in both forms (woken, and handed the lock:
/// one that once slept for want of a blocking connection); lapsed registrations not at all.
#[test]
fn a_waiter_registered_in_both_forms_counts_once() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let _guard = client.lock("two-forms").try_acquire().unwrap();
    let now: Vec<String> = server.cmd(&["TIME"]);
    let now_ms = now[0].parse::<u64>().unwrap() * 1000 + now[1].parse::<u64>().unwrap() / 1000;
    let queue = "redlease:queue:{two-forms}";
    let (live, lapsed) = ((now_ms + 60_000).to_string(), (now_ms - 1).to_string());
    for (score, member) in [
        (&live, "w1"),
        (&live, "!30000|w1"),
        (&live, "!30000|w2"),
        (&lapsed, "w3"),
    ] {
        server.cmd::<i64>(&["ZADD", queue, score, member]);
    }
    assert_eq!(client.inspect("two-forms").unwrap().waiters, 2);
}

/// A name whose key is not a lock (a list, a stream, a hash of other fields, a huge hash)
/// is reported clearly, without blocking the server on a huge key.
#[test]
fn keys_that_are_not_locks_are_named_as_such() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    server.cmd::<i64>(&["RPUSH", "a-list", "x"]);
    server.cmd::<String>(&["XADD", "a-stream", "*", "f", "v"]);
    for name in ["a-list", "a-stream"] {
        let err = client.inspect(name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Server, "{name}: {err}");
        assert!(err.to_string().contains("not a lock"), "{err}");
    }
    // A hash with a `w` field of another shape: no writer, no reader.
    server.cmd::<i64>(&["HSET", "odd-hash", "w", "99999999999999"]);
    let info = client.inspect("odd-hash").unwrap();
    assert_eq!(info.held_as, None, "{info:?}");
    // A huge hash is refused, not read.
    let mut cmd = redis::cmd("HSET");
    cmd.arg("huge");
    for i in 0..100_001 {
        cmd.arg(i).arg(1);
    }
    let _: i64 = cmd.query(&mut server.conn()).unwrap();
    let err = client.inspect("huge").unwrap_err();
    assert!(err.to_string().contains("100001 fields"), "{err}");
}

/// A read-write lock's writer is broken as a mutex is (its hold deleted, checked against
/// the token shown), and a reader waiting for it counts as a waiter; a reader-held lock
/// has no holder to break, and a semaphore's permits are refused by name: nothing of
/// either is deleted.
#[test]
fn a_writer_can_be_broken_but_not_readers_nor_a_semaphore() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let writer = client.rwlock("rw").write().try_acquire().unwrap();
    let shown = client.inspect("rw").unwrap();
    assert_eq!(shown.holder.as_deref(), Some(writer.token()));
    // A reader waiting for the writer counts as a waiter.
    let reading = {
        let client = client.clone();
        std::thread::spawn(move || {
            client
                .rwlock("rw")
                .read()
                .acquire_timeout(Duration::from_secs(20))
                .map(drop)
        })
    };
    assert!(eventually(Duration::from_secs(5), || {
        client.inspect("rw").unwrap().waiters == 1
    }));
    let err = client.break_lock("rw", "someone-else").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    client.break_lock("rw", writer.token()).unwrap();
    // The waiting reader takes the broken lock.
    reading.join().unwrap().unwrap();
    assert_eq!(client.inspect("rw").unwrap().held_as, None);
    let next = client.rwlock("rw").write().try_acquire().unwrap();
    assert_eq!(writer.release().unwrap_err().kind(), ErrorKind::NotHeld);
    next.release().unwrap();

    let reader = client.rwlock("rw").read().try_acquire().unwrap();
    let err = client.break_lock("rw", reader.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(reader.is_held());
    reader.release().unwrap();

    let permit = client.semaphore("sem", 2).try_acquire().unwrap();
    let err = client.break_lock("sem", permit.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("semaphore"), "{err}");
    permit.release().unwrap();
}
