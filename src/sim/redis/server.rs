//! The simulated server: connections, the order in which their commands run, virtual time,
//! the wall clock, and the switches a simulation flips (out of memory, restart, promotion).
//!
//! How a simulation drives one server:
//!
//! - [`Server::advance`] moves virtual time forward (it never goes back); keys expire and
//!   blocked commands time out on the server's wall clock, which is virtual time plus an
//!   offset of its own ([`Server::set_clock_offset`]). [`Server::next_timer`] says when
//!   something will next happen on its own.
//! - As in Redis 7.0, a blocked command's timeout is only noticed when the server's event
//!   loop turns: at its own wake-ups (every 100 ms, `hz 10`, at multiples of the interval in
//!   virtual time; [`Server::set_wakeup_interval`]) or after it ran the commands of a
//!   [`Server::submit`]. So a `BLPOP` past its deadline can still be served by a push that
//!   arrives before the next wake-up, as on a real server.
//! - [`Server::connect`] opens a connection, [`Server::submit`] delivers a pipeline of
//!   commands to it: they run at once, in order, until one blocks (`BLPOP`, `WAIT`); the
//!   rest wait behind it. A blocked `BLPOP` is served when a command leaves elements in its
//!   list (connections blocked on one key in the order they blocked), right after that
//!   command; what waited behind it runs once the submitted pipeline has run, as Redis runs
//!   unblocked clients before its event loop sleeps again. `WAIT` returns when a
//!   replication link acknowledges enough (see [`super::ReplicaLink`]) or at its timeout.
//! - [`Server::take_replies`] collects the replies a connection has, in order; any call
//!   here (and [`super::ReplicaLink::pump`]) may have produced replies on any connection
//!   ([`Server::connections_with_replies`]).
//! - [`Server::disconnect`] drops a connection with its blocked and waiting commands;
//!   [`Server::restart`] loses everything (no persistence): keys, scripts, connections.
//!   [`Server::promote`] makes a replica a primary (a failover); [`Server::set_oom`]
//!   makes commands that add data fail as under `maxmemory`.
//!
//! Nothing here reads the real clock, spawns threads or draws random numbers.

use std::collections::{BTreeMap, VecDeque};

use super::args;
use super::blocking::{self, Block, Blocked, Outcome};
use super::commands::{Gates, Kind, check_client, check_script};
use super::connection::{Command, ConnId, Connection};
use super::keyspace::{Change, Data, Entry, Keyspace};
use super::replication::Stream;
use super::reply::{NOT_INTEGER, Reply};
use super::scripting::Scripting;

/// A server's name in a simulation (replication links use it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ServerId(pub u32);

/// The wall clock a new server starts with at virtual time 0 (14 November 2023), so that
/// `TIME`, fencing tokens and registration scores look like real ones.
pub(crate) const DEFAULT_CLOCK_MS: i64 = 1_700_000_000_000;

/// The error of a connection the server no longer has (disconnected, or lost in a
/// restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnectionClosed;

/// How often Redis's event loop wakes on its own (`hz 10`), ms.
pub(crate) const DEFAULT_WAKEUP_INTERVAL_MS: u64 = 100;

/// The reply a blocked client gets when its server turns replica.
const UNBLOCKED: &str =
    "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)";

/// The reply of `WAIT` on a replica.
const WAIT_ON_REPLICA: &str = "ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 if a replica is configured to be writable (which is not the default) writes to replicas are just local and are not propagated.";

/// One simulated Redis server.
pub(crate) struct Server {
    id: ServerId,
    /// Virtual time, ms.
    now: u64,
    /// The wall clock is virtual time plus this.
    clock_offset: i64,
    oom: bool,
    replica: bool,
    /// The event loop's own wake-ups: at multiples of this, in virtual ms.
    wakeup_interval: u64,
    /// Bumped by a restart, a promotion or a turn to replica: a replication link that
    /// sees it change resynchronises.
    epoch: u64,
    keyspace: Keyspace,
    scripting: Scripting,
    conns: BTreeMap<ConnId, Connection>,
    next_conn: u64,
    next_block: u64,
    /// What this server has written, for its replicas.
    stream: Stream,
    /// Each replica's acknowledged offset of `stream`.
    acks: BTreeMap<ServerId, u64>,
    /// Connections freed from a block whose waiting commands have not run yet.
    unblocked: VecDeque<ConnId>,
}

impl Server {
    /// An empty primary at virtual time 0, its wall clock at [`DEFAULT_CLOCK_MS`].
    pub(crate) fn new(id: ServerId) -> Server {
        Server {
            id,
            now: 0,
            clock_offset: DEFAULT_CLOCK_MS,
            oom: false,
            replica: false,
            wakeup_interval: DEFAULT_WAKEUP_INTERVAL_MS,
            epoch: 0,
            keyspace: Keyspace::default(),
            scripting: Scripting::new(),
            conns: BTreeMap::new(),
            next_conn: 1,
            next_block: 0,
            stream: Stream::default(),
            acks: BTreeMap::new(),
            unblocked: VecDeque::new(),
        }
    }

    /// This server's id.
    pub(crate) fn id(&self) -> ServerId {
        self.id
    }

    /// Its virtual time, ms.
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Its wall clock, ms (what `TIME` and expiries read).
    pub(crate) fn wall_clock_ms(&self) -> i64 {
        (self.now as i64).saturating_add(self.clock_offset)
    }

    /// Sets the wall clock to virtual time plus `offset_ms` (a step of the clock: keys and
    /// timeouts fall due by the new clock at the next [`Server::advance`]).
    pub(crate) fn set_clock_offset(&mut self, offset_ms: i64) {
        self.clock_offset = offset_ms;
    }

    /// The wall clock's offset from virtual time, ms.
    pub(crate) fn clock_offset(&self) -> i64 {
        self.clock_offset
    }

    /// Turns the memory limit on or off. While on, commands that add data (`SET`, `RPUSH`,
    /// `ZADD`, `HSET`) are refused with Redis's `OOM` error, and so are they in a script
    /// until its first write (as Redis 7.0 does for scripts without flags); deletions and
    /// reads run.
    pub(crate) fn set_oom(&mut self, on: bool) {
        self.oom = on;
    }

    /// Whether this server is a replica.
    pub(crate) fn is_replica(&self) -> bool {
        self.replica
    }

    /// Sets how often the event loop wakes on its own (at least 1 ms).
    pub(crate) fn set_wakeup_interval(&mut self, ms: u64) {
        self.wakeup_interval = ms.max(1);
    }

    /// Moves virtual time to `now_ms` (never back): the event loop's wake-ups on the way
    /// time out the blocked commands past their deadline (by the wall clock then), then
    /// expired keys are deleted (on a primary).
    pub(crate) fn advance(&mut self, now_ms: u64) {
        let target = self.now.max(now_ms);
        while let Some(wakeup) = self.next_wakeup().filter(|&w| w <= target) {
            self.now = wakeup;
            self.expire_keys();
            self.time_out_blocked();
        }
        self.now = target;
        self.expire_keys();
    }

    /// The next virtual instant at which something happens on its own: a key expires (on a
    /// primary) or the event loop wakes to time out a blocked command. Never before now.
    pub(crate) fn next_timer(&self) -> Option<u64> {
        let expiry = if self.replica {
            None
        } else {
            // Due once the clock is past it.
            self.keyspace
                .next_expiry()
                .map(|at| self.to_virtual(at.saturating_add(1)))
        };
        [expiry, self.next_wakeup()].into_iter().flatten().min()
    }

    /// The first wake-up of the event loop (now or later) at which a blocked command has
    /// timed out.
    fn next_wakeup(&self) -> Option<u64> {
        let due = self.to_virtual(blocking::next_deadline(&self.conns)?.saturating_add(1));
        Some(
            due.div_ceil(self.wakeup_interval)
                .saturating_mul(self.wakeup_interval),
        )
    }

    /// A wall-clock instant in virtual time (never before now).
    fn to_virtual(&self, wall: i64) -> u64 {
        let virtual_ms = wall.saturating_sub(self.clock_offset);
        u64::try_from(virtual_ms).unwrap_or(0).max(self.now)
    }

    fn expire_keys(&mut self) {
        self.set_clock();
        self.keyspace.expire_due();
        self.after_command(None);
    }

    /// Answers the blocked commands past their deadline (`BLPOP` nil, `WAIT` the count so
    /// far) and runs what waited behind them.
    fn time_out_blocked(&mut self) {
        let now = self.wall_clock_ms();
        for id in blocking::timed_out(&self.conns, now) {
            let reply = match self.conns.get(&id).and_then(|c| c.block.as_ref()) {
                Some(Block {
                    on: Blocked::Wait { offset, .. },
                    ..
                }) => Reply::Int(self.count_acks(*offset)),
                _ => Reply::Nil,
            };
            self.unblock(id, reply);
        }
        self.run_unblocked();
    }

    /// Opens a connection.
    pub(crate) fn connect(&mut self) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(id, Connection::default());
        id
    }

    /// Whether the server still has this connection.
    pub(crate) fn is_connected(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Delivers a pipeline of commands to a connection. They run at once, in order, at
    /// the current time, until one blocks; the rest run when it returns. Then blocked
    /// commands past their deadline time out (the event loop's turn). Replies (on this and
    /// other connections) are then ready to take.
    pub(crate) fn submit(
        &mut self,
        conn: ConnId,
        commands: impl IntoIterator<Item = Command>,
    ) -> Result<(), ConnectionClosed> {
        let connection = self.conns.get_mut(&conn).ok_or(ConnectionClosed)?;
        connection.pending.extend(commands);
        self.run(conn);
        self.run_unblocked();
        // The event loop turns after the commands it read: timeouts it finds now.
        self.time_out_blocked();
        Ok(())
    }

    /// Takes a connection's replies so far, in order, as the redis crate parses them off
    /// the wire (nothing for a closed connection).
    pub(crate) fn take_replies(&mut self, conn: ConnId) -> Vec<redis::Value> {
        self.conns.get_mut(&conn).map_or_else(Vec::new, |c| {
            std::mem::take(&mut c.replies)
                .into_iter()
                .map(Reply::into_value)
                .collect()
        })
    }

    /// The connections that have replies to take.
    pub(crate) fn connections_with_replies(&self) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| !c.replies.is_empty())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether a connection has a blocked command.
    pub(crate) fn is_blocked(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.block.is_some())
    }

    /// The deadline of a connection's blocked command (wall clock, ms), if it has one.
    pub(crate) fn block_deadline(&self, conn: ConnId) -> Option<i64> {
        self.conns.get(&conn)?.block.as_ref()?.deadline
    }

    /// Drops a connection: its blocked command and those waiting behind it never run, its
    /// replies not taken are lost.
    pub(crate) fn disconnect(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
    }

    /// A restart without persistence: no keys, no scripts, no connections (every handle
    /// is closed), a new replication history (replicas resynchronise), the same role,
    /// clock and memory switch.
    pub(crate) fn restart(&mut self) {
        self.keyspace.clear();
        self.scripting.flush();
        self.conns.clear();
        self.unblocked.clear();
        self.stream.reset();
        self.acks.clear();
        self.epoch += 1;
    }

    /// Promotes a replica to primary with whatever it has applied (a failover); nothing
    /// for a primary. Its replication link should be dropped; other replicas attach to it
    /// anew.
    pub(crate) fn promote(&mut self) {
        if !self.replica {
            return;
        }
        self.replica = false;
        self.keyspace.set_replica(false);
        self.stream.reset();
        self.acks.clear();
        self.epoch += 1;
    }

    /// The live keys and their entries (expired ones by the clock of the last command or
    /// [`Server::advance`] left out), in key order, for checkers.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.keyspace.live()
    }

    /// The live value of `key`, for checkers.
    pub(crate) fn value(&self, key: &[u8]) -> Option<&Data> {
        self.entries()
            .find(|(k, _)| *k == key)
            .map(|(_, e)| &e.data)
    }

    // --- Running commands ---

    fn gates(&self) -> Gates {
        Gates {
            oom: self.oom,
            replica: self.replica,
        }
    }

    fn set_clock(&mut self) {
        let now = self.wall_clock_ms();
        self.keyspace.set_clock(now);
    }

    /// Runs a connection's waiting commands until one blocks or none is left.
    fn run(&mut self, conn: ConnId) {
        loop {
            let Some(connection) = self.conns.get_mut(&conn) else {
                return;
            };
            if connection.block.is_some() {
                return;
            }
            let Some(command) = connection.pending.pop_front() else {
                return;
            };
            let outcome = self.execute(conn, &command);
            if let Some(connection) = self.conns.get_mut(&conn) {
                match outcome {
                    Outcome::Reply(reply) => connection.replies.push(reply),
                    Outcome::Block(on, deadline) => {
                        connection.block = Some(Block {
                            on,
                            deadline,
                            since: self.next_block,
                        });
                        self.next_block += 1;
                    }
                    Outcome::Silent => {}
                }
            }
            self.after_command(Some(conn));
        }
    }

    /// Runs the waiting commands of connections freed from their block, in the order
    /// they were freed (each may free others).
    fn run_unblocked(&mut self) {
        while let Some(conn) = self.unblocked.pop_front() {
            self.run(conn);
        }
    }

    /// Answers a blocked connection and queues its waiting commands to run.
    fn unblock(&mut self, conn: ConnId, reply: Reply) {
        if let Some(connection) = self.conns.get_mut(&conn) {
            connection.block = None;
            connection.replies.push(reply);
            self.unblocked.push_back(conn);
        }
    }

    fn execute(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Outcome {
        if args.is_empty() {
            return Outcome::Silent;
        }
        self.set_clock();
        let spec = match check_client(args, self.gates()) {
            Ok(spec) => spec,
            Err(reply) => return Outcome::Reply(reply),
        };
        Outcome::Reply(match spec.kind {
            Kind::Data(handler) => handler(&mut self.keyspace, args),
            Kind::Eval => self.eval(args, false),
            Kind::EvalSha => self.eval(args, true),
            Kind::ScriptLoad => self.scripting.load(args),
            Kind::ScriptFlush => self.scripting.flush_command(args),
            Kind::ScriptExists => self.scripting.exists(args),
            Kind::Blpop => return blocking::blpop(&mut self.keyspace, args),
            Kind::Wait => return self.wait(conn, args),
            Kind::Container => Reply::arity(spec.name),
        })
    }

    /// Runs a script; the commands it calls see the same frozen clock.
    fn eval(&mut self, args: &[Vec<u8>], by_sha: bool) -> Reply {
        let gates = self.gates();
        let keyspace = &mut self.keyspace;
        let mut dirty = false;
        let mut call = |command: &[Vec<u8>]| match check_script(command, gates, &mut dirty) {
            Ok(handler) => handler(keyspace, command),
            Err(text) => Reply::Error(text),
        };
        self.scripting.eval(args, by_sha, &mut call)
    }

    /// `WAIT numreplicas timeout`: the number of replicas that acknowledged this
    /// connection's writes, at once if enough did, else when enough do or at the timeout.
    fn wait(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Outcome {
        if self.replica {
            return Outcome::Reply(Reply::error(WAIT_ON_REPLICA));
        }
        let Some(replicas) = args::parse_int(&args[1]) else {
            return Outcome::Reply(Reply::error(NOT_INTEGER));
        };
        let timeout = match args::timeout_ms(&args[2]) {
            Ok(ms) => ms,
            Err(e) => return Outcome::Reply(e),
        };
        let offset = self.conns.get(&conn).map_or(0, |c| c.woff);
        let acked = self.count_acks(offset);
        if acked >= replicas {
            return Outcome::Reply(Reply::Int(acked));
        }
        Outcome::Block(
            Blocked::Wait { offset, replicas },
            blocking::deadline(self.wall_clock_ms(), timeout),
        )
    }

    fn count_acks(&self, offset: u64) -> i64 {
        self.acks.values().filter(|&&acked| acked >= offset).count() as i64
    }

    /// After a command (of `conn`) or an expiry: streams what changed, remembers the
    /// connection's write offset, and serves `BLPOP`s blocked on lists that now have
    /// elements (their pops are streamed too).
    fn after_command(&mut self, conn: Option<ConnId>) {
        let changes = self.keyspace.take_changes();
        if changes.is_empty() {
            return;
        }
        let ready: Vec<Vec<u8>> = changes
            .iter()
            .filter(|(_, e)| matches!(e, Some(Entry { data: Data::List(l), .. }) if !l.is_empty()))
            .map(|(k, _)| k.clone())
            .collect();
        let offset = self.record(changes);
        if let Some(connection) = conn.and_then(|c| self.conns.get_mut(&c)) {
            connection.woff = offset;
        }
        if ready.is_empty() {
            return;
        }
        let served = blocking::serve_lists(&mut self.keyspace, &mut self.conns, &ready);
        let pops = self.keyspace.take_changes();
        let offset = self.record(pops);
        for id in served {
            if let Some(connection) = self.conns.get_mut(&id) {
                connection.woff = offset;
            }
            self.unblocked.push_back(id);
        }
    }

    /// Appends changes to the replication stream (a replica writes nothing of its own);
    /// returns the stream's offset.
    fn record(&mut self, changes: Vec<Change>) -> u64 {
        if !changes.is_empty() && !self.replica {
            self.stream.push(self.now, changes);
        }
        self.stream.offset()
    }

    // --- The replication link's side (see `replication.rs`) ---

    /// Bumped by a restart, a promotion and a turn to replica.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This server's replication stream.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Every key as stored, and the stream offset it reflects (a full synchronisation).
    pub(crate) fn replication_snapshot(&self) -> (Vec<Change>, u64) {
        (self.keyspace.snapshot(), self.stream.offset())
    }

    /// Becomes a replica holding exactly `snapshot`. Connections blocked here are
    /// unblocked with an `UNBLOCKED` error, as Redis does when a primary turns replica.
    pub(crate) fn become_replica(&mut self, snapshot: Vec<Change>) {
        if !self.replica {
            self.replica = true;
            self.epoch += 1;
            let blocked: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| c.block.is_some())
                .map(|(id, _)| *id)
                .collect();
            for id in blocked {
                self.unblock(id, Reply::error(UNBLOCKED));
            }
        }
        self.keyspace.set_replica(true);
        self.keyspace.clear();
        self.keyspace.apply(&snapshot);
        self.stream.reset();
        self.acks.clear();
        self.run_unblocked();
    }

    /// Applies one unit of the primary's stream.
    pub(crate) fn apply_replicated(&mut self, changes: &[Change]) {
        self.keyspace.apply(changes);
    }

    /// A replica acknowledged the stream up to `offset`: `WAIT`s that now have enough
    /// acknowledgements return, in the order they blocked.
    pub(crate) fn acknowledge(&mut self, replica: ServerId, offset: u64) {
        let acked = self.acks.entry(replica).or_insert(0);
        *acked = (*acked).max(offset);
        let mut waiting: Vec<(u64, ConnId, u64, i64)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| match c.block.as_ref()? {
                Block {
                    on: Blocked::Wait { offset, replicas },
                    since,
                    ..
                } => Some((*since, *id, *offset, *replicas)),
                _ => None,
            })
            .collect();
        waiting.sort();
        for (_, id, offset, replicas) in waiting {
            let count = self.count_acks(offset);
            if count >= replicas {
                self.unblock(id, Reply::Int(count));
            }
        }
        self.run_unblocked();
        // The acknowledgement is a command the event loop read: it turns.
        self.time_out_blocked();
    }

    /// Stops counting a replica for `WAIT`.
    pub(crate) fn forget_replica(&mut self, replica: ServerId) {
        self.acks.remove(&replica);
    }
}
