//! The lock protocol on a deployment that routes each lock to one server: a single server,
//! a Sentinel deployment's primary, or a Cluster slot's primary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::Backend;
use crate::backend::batch::{Batcher, Conduit, Item};
use crate::backend::call::{Call, Replicas};
use crate::backend::exec::{Exec, Replies};
use crate::backend::wire::reply;
use crate::core::acquire::Bounds;
use crate::core::backoff;
use crate::core::reply::{
    self as replies, Answer, AttemptReply, ExtendReply, GroupReply, ReleaseReply,
};
use crate::core::server_time::ServerTime;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::protocol::{
    AttemptRequest, Capabilities, GroupRequest, Hold, LockServer, Queued, calls,
};
use crate::sync::{self, Mutex};
use crate::token;

/// A deployment whose locks each live on one server.
pub(crate) struct Routed {
    backend: Backend,
    /// The servers' clock as the last acquire that read it saw it (one estimate for the
    /// deployment: its servers' clocks agree to within what NTP keeps them).
    server_time: Mutex<ServerTime>,
}

impl Routed {
    pub fn new(backend: Backend) -> Self {
        Routed {
            backend,
            server_time: Mutex::new(ServerTime::default()),
        }
    }
}

impl LockServer for Routed {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            every_kind: true,
            blocking: true,
            fencing: true,
            replicas: true,
            batching: true,
            inspection: true,
        }
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            pool_wait: self.backend.pool_wait,
            connect: self.backend.connect_timeout,
            io: self.backend.io_timeout,
        }
    }

    fn describe(&self) -> &str {
        self.backend.describe()
    }

    fn attempt(&self, request: &AttemptRequest<'_>) -> Result<Option<Answer<AttemptReply>>> {
        let clock = sync::lock(&self.server_time).estimate(Instant::now());
        let calls = calls::attempt(
            request.hold,
            request.ttl,
            request.mode,
            request.grace,
            request.block,
            request.lead,
            request.direct,
            request.first_lead,
            request.replicas,
            clock,
        );
        let key = &request.hold.keys.lock;
        let Some(replies) = self.backend.exec(key, &calls, &request.exec)? else {
            return Ok(None);
        };
        let arrived = Instant::now();
        let sent = replies.sent_at;
        let own_wake = request.hold.keys.own_wake(request.hold.token);
        let direct = (request.direct && request.block.is_some()).then_some(calls::Direct {
            own_wake: &own_wake,
            ttl: request.ttl,
        });
        let answer = calls::read_attempt(
            replies.values,
            request.block.is_some(),
            request.lead,
            direct,
            request.replicas,
            sent,
        )?;
        if let AttemptReply::Granted {
            server_clock: Some(clock),
            ..
        } = answer.reply
        {
            // (A blocked attempt's round trip includes its block: too long to be kept.)
            sync::lock(&self.server_time).observed(clock, sent, arrived);
        }
        Ok(Some(answer))
    }

    fn group_of(&self, key: &str) -> Option<u16> {
        // One server (or Sentinel's primary) runs a script over any keys; a Cluster only
        // over keys of one slot.
        Some(if self.backend.is_cluster() {
            crate::keys::key_slot(key.as_bytes())
        } else {
            0
        })
    }

    fn attempt_all(&self, request: &GroupRequest<'_>) -> Result<Answer<GroupReply>> {
        let Some(first) = request.keys.first() else {
            return Err(crate::error::Error::invalid("no names to take"));
        };
        let clock = sync::lock(&self.server_time).estimate(Instant::now());
        let call = calls::attempt_all(
            request.keys,
            request.tokens,
            request.held,
            request.ttl,
            clock,
        );
        let replies = self.backend.run(&first.lock, &[call], &request.exec)?;
        let arrived = Instant::now();
        let reply = replies::attempt_all(replies.values.into_iter().next(), request.held)?;
        if let GroupReply::Taken {
            server_clock: Some(clock),
            ..
        } = reply
        {
            sync::lock(&self.server_time).observed(clock, replies.sent_at, arrived);
        }
        Ok(Answer {
            reply,
            sent_at: replies.sent_at,
            unacknowledged: None,
        })
    }

    fn extend(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        replicas: Option<Replicas>,
        exec: &Exec<'_>,
    ) -> Result<Answer<ExtendReply>> {
        let calls = calls::extend(hold, ttl, replicas);
        let replies = self.backend.run(&hold.keys.lock, &calls, exec)?;
        calls::read_extend(replies.values, replicas, replies.sent_at)
    }

    fn release(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        withdraw: bool,
        exec: &Exec<'_>,
    ) -> Result<ReleaseReply> {
        let handoff = token::handoff_token(hold.token);
        let grace = backoff::grace(self.backend.io_timeout);
        let call = calls::release(hold, &handoff, grace, withdraw, ttl);
        let replies = self.backend.run(&hold.keys.lock, &[call], exec)?;
        calls::read_release(replies.values)
    }

    fn queue_renewal(&self, key: &str, item: Item, deadline: Instant) -> Result<Queued> {
        let node = self.backend.node_for(key, deadline)?;
        let conduit: Arc<dyn Conduit> = node.clone();
        let id = Batcher::submit(
            &node.batcher,
            Arc::downgrade(&conduit),
            item,
            self.backend.io_timeout,
        )?;
        Ok(Queued {
            batcher: Arc::downgrade(&node.batcher),
            id,
        })
    }

    fn is_locked(&self, keys: &LockKeys) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        self.query(&keys.lock, &cmd)
    }

    fn ping(&self) -> Result<()> {
        self.query::<String>("", &redis::cmd("PING")).map(drop)
    }

    fn run(&self, key: &str, calls: &[Call], exec: &Exec<'_>) -> Result<Replies> {
        self.backend.run(key, calls, exec)
    }

    fn scan(&self, pattern: &str, limit: usize) -> Result<Vec<String>> {
        self.backend.scan(pattern, limit)
    }

    fn close_idle(&self) {
        self.backend.close_idle();
    }
}

impl Routed {
    /// One command on the caller lane, on the server that owns `key`.
    fn query<T: redis::FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> Result<T> {
        let how = self.backend.exec_on(self.backend.caller_lane(None));
        let replies = self.backend.run(key, &[Call::cmd(cmd)], &how)?;
        reply(replies.values.into_iter().next().unwrap_or(Value::Nil))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::exec::Exec;
    use crate::core::reply::{AttemptReply, ExtendReply, Mode, ReleaseReply};
    use crate::keys::LockKeys;
    use crate::kinds::Kind;
    use crate::lane::Lane;
    use crate::protocol::{AttemptRequest, Hold};
    use crate::testing::support::RedisServer;

    /// A single attempt of `hold` for 10 s, as `try_acquire` sends it.
    fn once<'a>(hold: Hold<'a>, exec: Exec<'a>) -> AttemptRequest<'a> {
        AttemptRequest {
            hold,
            ttl: Duration::from_secs(10),
            mode: Mode::Once,
            grace: Duration::from_secs(1),
            block: None,
            lead: false,
            direct: false,
            first_lead: false,
            exec,
            replicas: None,
        }
    }

    /// A hold of a reentrant lock given back twice (a release sent again after its reply
    /// was lost) must release nothing the second time, even when it names the key's token:
    /// the owner's other holds still count on the lock.
    #[test]
    fn a_reentrant_hold_given_back_twice_releases_nothing_the_second_time() {
        let server = RedisServer::start();
        let client = crate::Client::open(&server.url()).unwrap();
        let lock_server = &client.inner.server;
        let keys = LockKeys::new("", "ledger").unwrap();
        let kind = Kind::Reentrant("owner-1".into());
        let exec = Exec::new(Lane::Urgent, Duration::from_secs(2));
        let hold = |token| Hold {
            kind: &kind,
            keys: &keys,
            token,
        };
        let attempt = |token| {
            let request = once(hold(token), exec);
            lock_server.attempt(&request).unwrap().unwrap().reply
        };
        let release = |token| {
            lock_server
                .release(hold(token), Duration::from_secs(10), false, &exec)
                .unwrap()
        };
        assert!(matches!(attempt("t1"), AttemptReply::Granted { .. }));
        assert!(matches!(attempt("t2"), AttemptReply::Reentered { .. }));
        assert_eq!(release("t1"), ReleaseReply::HoldReturned);
        assert_eq!(release("t1"), ReleaseReply::NotHeld);
        assert_eq!(
            server.get("ledger").as_deref(),
            Some("t1"),
            "the lock is still held"
        );
        assert_eq!(release("t2"), ReleaseReply::Released);
        assert_eq!(server.get("ledger"), None);
    }

    /// A late copy of an attempt (sent again after its reply was lost, delayed in the
    /// network past the hold it then made and the extend that lengthened it) finds its own
    /// token holding the lock: it must not shorten the hold back to its own, shorter ttl,
    /// below what the holder was told (found by the simulation, seed 3182022, as a writer
    /// of a read-write lock: another writer got in while the first still held).
    #[test]
    fn a_late_copy_of_an_attempt_never_shortens_a_hold_an_extend_lengthened() {
        let server = RedisServer::start();
        let client = crate::Client::open(&server.url()).unwrap();
        let lock_server = &client.inner.server;
        let exec = Exec::new(Lane::Urgent, Duration::from_secs(2));
        let kinds = [
            Kind::Mutex,
            Kind::Reentrant("owner-1".into()),
            Kind::Permit(2),
            Kind::Write,
            Kind::Read,
        ];
        for (i, kind) in kinds.iter().enumerate() {
            let name = format!("late-{i}");
            let keys = LockKeys::new("", &name).unwrap();
            let hold = Hold {
                kind,
                keys: &keys,
                token: "t1",
            };
            let request = once(hold, exec);
            let attempt = || lock_server.attempt(&request).unwrap().unwrap().reply;
            assert!(
                matches!(attempt(), AttemptReply::Granted { .. }),
                "{kind:?}"
            );
            let extended = lock_server
                .extend(hold, Duration::from_secs(600), None, &exec)
                .unwrap();
            assert_eq!(extended.reply, ExtendReply::Extended, "{kind:?}");
            // The late copy of the first attempt.
            assert!(
                matches!(
                    attempt(),
                    AttemptReply::Granted { .. } | AttemptReply::Reentered { .. }
                ),
                "{kind:?}"
            );
            let left = server.pttl(&name);
            assert!(left > 500_000, "{kind:?}: the hold was cut to {left} ms");
            let held: Vec<String> = match kind {
                Kind::Permit(_) => server.cmd(&["ZRANGE", &name, "0", "-1", "WITHSCORES"]),
                Kind::Read | Kind::Write => server.cmd(&["HVALS", &name]),
                _ => Vec::new(),
            };
            let now_ms: Vec<String> = server.cmd(&["TIME"]);
            let now_ms = now_ms[0].parse::<u64>().unwrap() * 1000;
            for value in held.iter().filter(|v| *v != "t1") {
                let expiry: u64 = value.split(' ').next().unwrap().parse().unwrap();
                assert!(
                    expiry > now_ms + 500_000,
                    "{kind:?}: the hold's own expiry was cut to {value}"
                );
            }
        }
    }

    /// A lock handed to a waiter and lost before the waiter's next round (its key deleted
    /// or evicted, and taken by another) leaves the grant on the waiter's own wake list:
    /// the attempt that leads the waiter's next block clears the list, so the block cannot
    /// pop it and the waiter is not told it holds the lock (found by an attacker: the
    /// grant's list could also outlive its key by a millisecond).
    #[test]
    fn a_stale_grant_on_a_waiters_own_list_is_never_believed() {
        let server = RedisServer::start();
        let client = crate::Client::open(&server.url()).unwrap();
        let lock_server = &client.inner.server;
        let exec = Exec::new(Lane::Urgent, Duration::from_secs(2));
        for kind in [Kind::Mutex, Kind::Permit(1), Kind::Write] {
            let name = format!("stale-{kind:?}").replace(['(', ')'], "");
            let keys = LockKeys::new("", &name).unwrap();
            let other = Hold {
                kind: &kind,
                keys: &keys,
                token: "other",
            };
            let taken = lock_server.attempt(&once(other, exec)).unwrap().unwrap();
            assert!(
                matches!(taken.reply, AttemptReply::Granted { .. }),
                "{kind:?}"
            );
            let own = keys.own_wake("w1");
            let _: i64 = server.cmd(&["RPUSH", &own, "g5:60000"]);
            let request = AttemptRequest {
                mode: Mode::Lead,
                block: Some(Duration::from_millis(50)),
                lead: true,
                direct: true,
                ..once(
                    Hold {
                        kind: &kind,
                        keys: &keys,
                        token: "w1",
                    },
                    exec,
                )
            };
            let answer = lock_server.attempt(&request).unwrap().unwrap();
            assert!(
                matches!(answer.reply, AttemptReply::Busy { .. }),
                "{kind:?}: {answer:?}"
            );
        }
    }

    /// A waiter's thread is not woken by the reply of its attempt alone (see
    /// `Connection::quiet_until`): that reply (the lock found held) stays under
    /// `QUIET_BYTES` whatever the holder's lease, and with the shortest reply of its block
    /// (nothing popped: a timeout, or an operator's `CLIENT UNBLOCK`) reaches it, for every
    /// kind whose waiters block.
    #[test]
    fn a_leading_attempts_busy_reply_is_under_the_low_water_mark_and_its_blocks_over_it() {
        use std::io::{Read, Write};
        let server = RedisServer::start();
        let holder_ms = ["-1", "500", "60000", "86400000"];
        let kinds = [
            Kind::Mutex,
            Kind::Reentrant("o".into()),
            Kind::Permit(1),
            Kind::Write,
            Kind::Read,
        ];
        for (n, kind) in kinds.iter().enumerate() {
            for (m, ms) in holder_ms.iter().enumerate() {
                let keys = LockKeys::new("", &format!("quiet-{n}-{m}")).unwrap();
                // Held by another, with `ms` left (-1: a mutex's key without expiry).
                match kind {
                    Kind::Permit(_) => {
                        let expiry =
                            (now_ms(&server) + ms.parse::<u64>().unwrap_or(60_000)).to_string();
                        server.cmd::<i64>(&["ZADD", &keys.lock, &expiry, "other"]);
                    }
                    Kind::Write | Kind::Read => {
                        let expiry = now_ms(&server) + ms.parse::<u64>().unwrap_or(60_000);
                        let w = format!("{expiry} other");
                        server.cmd::<i64>(&["HSET", &keys.lock, "w", &w]);
                    }
                    _ if *ms == "-1" => server.cmd::<()>(&["SET", &keys.lock, "other"]),
                    _ => server.cmd::<()>(&["SET", &keys.lock, "other", "PX", ms]),
                }
                let hold = Hold {
                    kind,
                    keys: &keys,
                    token: "w1",
                };
                let calls = crate::protocol::calls::attempt(
                    hold,
                    Duration::from_secs(30),
                    Mode::Lead,
                    Duration::from_secs(2),
                    Some(Duration::from_millis(10)),
                    true,
                    kind.hands_over(),
                    true,
                    None,
                    0,
                );
                let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                for call in &calls {
                    stream.write_all(&call.as_eval()).unwrap();
                }
                // Every reply (the attempt's, the block's, and the attempt after the block
                // of a waiter that is woken), and where each ends, fed byte by byte to the
                // connection's own parser.
                let mut bytes = Vec::new();
                let mut ends = Vec::new();
                let mut replies = Vec::new();
                let mut parser = crate::resp::ReplyBuffer::new();
                let mut buf = [0u8; 1];
                while replies.len() < calls.len() {
                    let read = stream.read(&mut buf).unwrap_or_else(|e| {
                        panic!("{kind:?} {ms}: {e}: {:?}", String::from_utf8_lossy(&bytes))
                    });
                    assert_eq!(read, 1, "{kind:?} {ms}: {bytes:?}");
                    bytes.push(buf[0]);
                    parser.room()[0] = buf[0];
                    parser.filled(1);
                    if let Some(reply) = parser.next_reply().unwrap() {
                        replies.push(reply);
                        ends.push(bytes.len());
                    }
                }
                let what = format!("{kind:?}, {ms} ms: {:?}", String::from_utf8_lossy(&bytes));
                let quiet = crate::connection::QUIET_BYTES as usize;
                assert!(ends[0] < quiet, "{what}");
                assert!(ends[1] >= quiet, "{what}");
                assert!(
                    matches!(
                        crate::core::reply::attempt(Some(replies[0].clone())).unwrap(),
                        AttemptReply::Busy { .. }
                    ),
                    "{what}"
                );
                assert_eq!(&bytes[ends[0]..ends[1]], b"*-1\r\n", "{what}");
            }
        }
    }

    /// The server's clock, in milliseconds.
    fn now_ms(server: &RedisServer) -> u64 {
        let now: Vec<String> = server.cmd(&["TIME"]);
        now[0].parse::<u64>().unwrap() * 1000 + now[1].parse::<u64>().unwrap() / 1000
    }

    /// A read-write lock whose last live reader releases goes to the waiting writer even
    /// when a crashed reader's hold (its lease over) is still in the hash; and a waiting
    /// writer registered in both forms that gives up wakes the readers it kept out (both
    /// found by an attacker: the writer waited out its block instead).
    #[test]
    fn a_read_write_lock_freed_or_given_up_on_goes_to_the_waiters_at_once() {
        let server = RedisServer::start();
        let client = crate::Client::open(&server.url()).unwrap();
        let lock_server = &client.inner.server;
        let exec = Exec::new(Lane::Urgent, Duration::from_secs(2));
        let keys = LockKeys::new("", "ledger").unwrap();
        let hold = |kind, token| Hold {
            kind,
            keys: &keys,
            token,
        };
        let taken = lock_server
            .attempt(&once(hold(&Kind::Read, "r2"), exec))
            .unwrap()
            .unwrap();
        assert!(matches!(taken.reply, AttemptReply::Granted { .. }));
        let now = now_ms(&server);
        let past = (now - 10).to_string();
        let _: i64 = server.cmd(&["HSET", "ledger", "r:r1", &past]);
        let lapse = (now + 5000).to_string();
        let _: i64 = server.cmd(&["ZADD", &keys.queue, &lapse, "!60000|w1"]);
        let reply = lock_server
            .release(
                hold(&Kind::Read, "r2"),
                Duration::from_secs(10),
                false,
                &exec,
            )
            .unwrap();
        assert_eq!(reply, ReleaseReply::Released);
        let writer: String = server.cmd(&["HGET", "ledger", "w"]);
        assert!(writer.ends_with(" w1"), "{writer}");
        assert_eq!(server.cmd::<i64>(&["HLEN", "ledger"]), 1);
        let own = keys.own_wake("w1");
        assert_eq!(server.cmd::<i64>(&["LLEN", &own]), 1);

        // A writer registered in both forms (it once slept for want of a blocking
        // connection) gives up while a reader waits and nobody holds the lock.
        let _: i64 = server.cmd(&["DEL", "ledger", &own]);
        let _: i64 = server.cmd(&["ZADD", &keys.queue, &lapse, "w2", &lapse, "!60000|w2"]);
        let _: i64 = server.cmd(&["ZADD", &keys.readers, &lapse, "r3"]);
        let reply = lock_server
            .release(
                hold(&Kind::Write, "w2"),
                Duration::from_secs(60),
                true,
                &exec,
            )
            .unwrap();
        assert_eq!(reply, ReleaseReply::NotHeld);
        assert_eq!(server.cmd::<i64>(&["ZCARD", &keys.queue]), 0);
        assert_eq!(server.cmd::<i64>(&["LLEN", &keys.reader_wake]), 1);
    }
}
