//! The simulated world: virtual time, the event queue, the network between clients and
//! servers, and the faults. What the clients' threads do is [`crate::sim::threads`]; the
//! servers are [`crate::sim::redis`]'s models.
//!
//! Every request goes on a connection of its own, as a pooled connection would carry it:
//! its commands reach the server after a delay (or never), run there, and their replies
//! come back after another delay (or never). A caller waits for a reply until its deadline
//! (the I/O timeout from the write, plus a block's time, cut at the call's cutoff); a
//! request it gave up on may still reach the server and run later, as a delayed packet
//! can. Nothing here reads the real clock: the instants handed to the protocol core are a
//! base instant plus each client's own view of the virtual time, whose rate may drift.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use redis::Value;

use crate::core::acquire::BLOCK_LATENESS;
use crate::core::backoff;
use crate::error::{Error, ErrorKind};
use crate::kinds::Kind;
use crate::sim::check::{Belief, Checker};
use crate::sim::client::{Client, LeaseId, ReqId, TaskId};
use crate::sim::config::{Config, Deployment, Micros, micros};
use crate::sim::redis::ReplicaLink;
use crate::sim::servers::{ConnId, SimServer};
use crate::sim::trace::{Trace, short};

/// What a request is for, so that its answer reaches the right part of its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// For the operation a thread has in progress.
    Task(TaskId),
    /// A renewal of a held lease.
    Renewal(LeaseId),
    /// A batch of renewals (the client's batcher).
    Batch,
    /// A background give-back: nobody waits for it.
    Background,
}

/// How a request fares on the network (drawn when it is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Delivered after the first delay; its replies back after the second.
    Normal { there: Micros, back: Micros },
    /// Lost on its way: it never runs.
    LostRequest,
    /// It runs after the delay; its replies are lost.
    LostReply { there: Micros },
    /// The connection resets `after` the write; the request ran before, when `ran`.
    Reset { after: Micros, ran: bool },
    /// The connection was refused: nothing was sent.
    Refused,
}

/// A request on the network, and what became of it.
pub(crate) struct Sent {
    pub client: usize,
    pub purpose: Purpose,
    pub server: usize,
    conn: ConnId,
    pub commands: Vec<Vec<Vec<u8>>>,
    /// When the caller wrote it, by its own clock (the `sent_at` the core gets).
    pub sent_local: Instant,
    fate: Fate,
    /// The caller still waits for it.
    pub awaited: bool,
    /// When it reached the server (last), if it did.
    pub ran_at: Option<Micros>,
    /// Its replies so far, each with when the server produced it (when its command ran).
    got: Vec<(Value, Micros)>,
    /// Its replies, once they all came.
    pub replies: Option<Vec<Value>>,
    /// When each reply was produced (its command ran), once they all came.
    pub reply_times: Vec<Micros>,
    /// Sent again from this call on, as `EVAL`, after `NOSCRIPT`.
    resent: Option<usize>,
}

/// Something that happens at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// A request reaches its server.
    Deliver(ReqId),
    /// A request's replies reach its client.
    Reply(ReqId),
    /// A connection resets under a request (or was refused).
    Reset(ReqId),
    /// A client stops waiting for a request.
    Deadline(ReqId),
    /// A server has something due of its own (an expiry, the timeout of a block).
    ServerTimer(usize),
    /// A server resumes after a pause, or comes back after a restart.
    ServerBack(usize),
    /// A thread wakes (to start its next operation, end its critical section, or end a
    /// pause of its acquire).
    Wake { client: usize, task: TaskId },
    /// A lease is due for renewal.
    Renew { client: usize, lease: LeaseId },
    /// The caller of a waiting acquire cancels it.
    Cancel { client: usize, task: TaskId },
    /// A client's batcher writes the batch it gathered.
    Gather(usize),
    /// A client resumes after a pause.
    ClientBack(usize),
    /// The world's own faults (server pauses and restarts).
    Tick,
}

impl Event {
    /// The client whose code this event runs, if any (a paused client runs nothing).
    fn client(&self, requests: &BTreeMap<ReqId, Sent>) -> Option<usize> {
        match self {
            Event::Reply(id) | Event::Reset(id) | Event::Deadline(id) => {
                requests.get(id).map(|r| r.client)
            }
            Event::Wake { client, .. }
            | Event::Renew { client, .. }
            | Event::Cancel { client, .. } => Some(*client),
            _ => None,
        }
    }
}

/// The world of one run.
pub(crate) struct World {
    pub cfg: Config,
    pub now: Micros,
    pub rng: fastrand::Rng,
    queue: BinaryHeap<Reverse<(Micros, u64, Event)>>,
    seq: u64,
    pub servers: Vec<SimServer>,
    pub clients: Vec<Client>,
    pub sent: BTreeMap<ReqId, Sent>,
    next_request: ReqId,
    /// (client, server, SHA1): scripts a client saw a server answer without `NOSCRIPT`, as
    /// the runtime's connections remember them (forgotten when the server restarts).
    known_scripts: BTreeSet<(usize, usize, Vec<u8>)>,
    /// Evictions of lock keys holding a grant not taken yet happen in this run (a
    /// quarter of the runs with faults, Redlock's aside); drawn from a stream of their
    /// own, so that runs without them go exactly as before they existed.
    evictions: bool,
    evict_rng: fastrand::Rng,
    /// For evictions of keys a release handed to a waiter that has not popped its grant
    /// yet: a stream of its own, drawn from only when there is one.
    evict_handed_rng: fastrand::Rng,
    /// Threads adopt the mutexes other threads hold (`LockBuilder::adopt`) in this run (a
    /// third of the runs, Redlock's aside); drawn from a stream of their own, as the
    /// evictions are, so that runs without adopts go exactly as before they existed.
    pub(crate) adopts: bool,
    pub(crate) adopt_rng: fastrand::Rng,
    /// Threads take several mutexes at once in this run (see [`World::new`]).
    pub(crate) groups: bool,
    pub(crate) group_rng: fastrand::Rng,
    /// How often Redlock waiters joined their client's line behind others, were woken by
    /// a release, and had a wake-up passed on to them.
    pub(crate) line_paths: LinePaths,
    /// Events of paused clients, in the order they happened.
    deferred: Vec<Vec<Event>>,
    /// The instant virtual time 0 stands for.
    pub base: Instant,
    pub check: Checker,
    pub trace: Trace,
    /// When a server lost its data (a restart without persistence): the exclusion promise
    /// does not hold for leases granted before, as documented.
    pub data_lost_at: Vec<Micros>,
    /// Per name: since when it has been free on the server while a waiter waited for it
    /// (runs without faults).
    free_since: Vec<Option<Micros>>,
    /// The server requests go to (a failover moves it to the replica).
    pub primary: usize,
    /// The replication link from the primary (server 0) to the replica (server 1).
    link: Option<ReplicaLink>,
    /// Per server: the instant its one pending timer event is due (later ones are not
    /// queued, earlier ones replace it).
    timers: Vec<Option<Micros>>,
}

/// Whether the run of `seed` (of `cfg`) has threads take several mutexes at once
/// (`Client::lock_all`), and the stream they draw from. A third of the runs on one server
/// do, with three more mutexes to take; drawn from a stream of their own, salted so that
/// none of the seeds that found defects (FOUND) runs with them.
pub(crate) fn groups_of(seed: u64, cfg: &Config) -> (bool, fastrand::Rng) {
    let mut group_rng = fastrand::Rng::with_seed(seed ^ 0x5eed_9a17);
    let groups = !matches!(cfg.deployment, Deployment::Redlock(_)) && group_rng.u32(0..3) == 0;
    (groups, group_rng)
}

/// How often the world considers faults of its own.
const TICK: Micros = 10_000;

/// See [`World::line_paths`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LinePaths {
    pub behind: u64,
    pub woken: u64,
    pub passed: u64,
}

impl World {
    /// The world of `seed`, its trace kept when `traced`.
    pub fn new(seed: u64, traced: bool) -> World {
        let mut cfg = Config::from_seed(seed);
        let (groups, group_rng) = groups_of(seed, &cfg);
        if groups {
            for name in ["ga", "gb", "gc"] {
                cfg.names.push(crate::sim::config::Name {
                    name: name.into(),
                    kind: crate::kinds::Kind::Mutex,
                });
            }
        }
        let mut rng = fastrand::Rng::with_seed(seed);
        let replicated = matches!(cfg.deployment, Deployment::Replicated { .. });
        let first_offset = rng.i64(-5_000..=5_000);
        let mut servers: Vec<SimServer> = (0..cfg.servers())
            .map(|i| {
                // A replica's clock is not behind its primary's (the documented limit for
                // fencing tokens across a failover).
                let offset = if replicated && i > 0 {
                    first_offset + rng.i64(0..=10)
                } else if i == 0 {
                    first_offset
                } else {
                    rng.i64(-5_000..=5_000)
                };
                SimServer::new(i, offset)
            })
            .collect();
        let link = match cfg.deployment {
            Deployment::Replicated { lag_ms } => {
                let (primary, replica) = servers.split_at_mut(1);
                Some(ReplicaLink::attach(
                    primary[0].model_mut(),
                    replica[0].model_mut(),
                    lag_ms,
                ))
            }
            _ => None,
        };
        let clients: Vec<Client> = (0..cfg.clients)
            .map(|i| {
                let rate = 1.0 + cfg.faults.drift * (2.0 * rng.f64() - 1.0);
                Client::new(i, rate, &cfg)
            })
            .collect();
        let deferred = vec![Vec::new(); clients.len()];
        let cfg_servers = cfg.servers();
        let free_since = vec![None; cfg.names.len()];
        let mut evict_rng = fastrand::Rng::with_seed(seed ^ 0x5eed_e71c);
        let evictions = cfg.faults.any()
            && !matches!(cfg.deployment, Deployment::Redlock(_))
            && evict_rng.u32(0..4) == 0;
        // The salt is one under which none of the seeds that found defects (the tests'
        // FOUND) runs with adopts: they replay exactly as when they found them.
        let mut adopt_rng = fastrand::Rng::with_seed(seed ^ 0x5eed_ad3b);
        let adopts = !matches!(cfg.deployment, Deployment::Redlock(_)) && adopt_rng.u32(0..3) == 0;
        let mut trace = Trace::new(traced);
        trace.line(0, || {
            format!("seed {seed}: {cfg:?}, evictions {evictions}, adopts {adopts}, groups {groups}")
        });
        World {
            check: Checker::new(&cfg),
            cfg,
            now: 0,
            rng,
            queue: BinaryHeap::new(),
            seq: 0,
            servers,
            clients,
            sent: BTreeMap::new(),
            next_request: 1,
            known_scripts: BTreeSet::new(),
            evictions,
            evict_rng,
            evict_handed_rng: fastrand::Rng::with_seed(seed ^ 0x5eed_4a4d),
            adopts,
            adopt_rng,
            groups,
            group_rng,
            line_paths: LinePaths::default(),
            deferred,
            base: Instant::now(),
            trace,
            data_lost_at: Vec::new(),
            free_since,
            primary: 0,
            link,
            timers: vec![None; cfg_servers],
        }
    }

    pub fn redlock(&self) -> bool {
        matches!(self.cfg.deployment, Deployment::Redlock(_))
    }

    /// Schedules `event` at `at` (never in the past).
    pub fn at(&mut self, at: Micros, event: Event) {
        self.seq += 1;
        self.queue
            .push(Reverse((at.max(self.now), self.seq, event)));
    }

    /// Client `client`'s clock at the virtual instant `at`.
    pub fn local_at(&self, client: usize, at: Micros) -> Instant {
        let rate = self.clients[client].rate;
        self.base + Duration::from_nanos((at as f64 * 1000.0 * rate) as u64)
    }

    /// Client `client`'s clock now.
    pub fn local(&self, client: usize) -> Instant {
        self.local_at(client, self.now)
    }

    /// The virtual instant at which client `client`'s clock shows `instant` (rounded up).
    pub fn virtual_at(&self, client: usize, instant: Instant) -> Micros {
        let rate = self.clients[client].rate;
        let nanos = instant.saturating_duration_since(self.base).as_nanos() as f64;
        (nanos / 1000.0 / rate).ceil() as Micros
    }

    /// Runs until every thread is done, then lets every lease lapse and checks what is
    /// left. Checks after every event; fails past `limit` of virtual time.
    pub fn run(&mut self, limit: Micros) -> Result<(), String> {
        for client in 0..self.clients.len() {
            for task in 0..self.clients[client].tasks.len() {
                let start = self.rng.u64(0..20_000);
                self.at(start, Event::Wake { client, task });
            }
        }
        self.at(TICK, Event::Tick);
        let (mut last, mut same) = (0, 0u64);
        while let Some(Reverse((at, _, event))) = self.queue.pop() {
            if at == last {
                same += 1;
                if same > 100_000 {
                    return Err(format!(
                        "the run is stuck at {:.3} ms: 100000 events at the same instant \
                         (the last: {event:?})",
                        at as f64 / 1000.0
                    ));
                }
            } else {
                (last, same) = (at, 0);
            }
            if at > limit {
                let stuck: Vec<String> = self
                    .clients
                    .iter()
                    .flat_map(|c| {
                        c.tasks
                            .iter()
                            .enumerate()
                            .filter(|(_, t)| !matches!(t.op, crate::sim::client::Op::Done))
                            .map(move |(i, t)| format!("c{}/t{i}: {}", c.id, t.op.describe()))
                    })
                    .collect();
                return Err(format!(
                    "the run did not end within {} s of virtual time: {}",
                    limit / 1_000_000,
                    stuck.join("; ")
                ));
            }
            self.now = at;
            self.handle(event);
            self.check_now()?;
            if self.clients.iter().all(Client::done) {
                break;
            }
        }
        self.settle_down()?;
        self.check.finish(&self.cfg.names, self.redlock())
    }

    fn handle(&mut self, event: Event) {
        if let Some(client) = event.client(&self.sent) {
            if self.clients[client].paused_until.is_some() {
                self.deferred[client].push(event);
                return;
            }
        }
        match event {
            Event::Deliver(id) => self.deliver(id),
            Event::Reply(id) => self.reply_arrives(id),
            Event::Reset(id) => self.reset(id),
            Event::Deadline(id) => self.deadline(id),
            Event::ServerTimer(server) => {
                // Only the one pending timer counts (others were replaced by earlier ones).
                if self.timers[server] == Some(self.now) {
                    self.timers[server] = None;
                    if self.servers[server].serving() {
                        self.pump(server);
                    }
                }
            }
            Event::ServerBack(server) => self.server_back(server),
            Event::Wake { client, task } => self.task_wakes(client, task),
            Event::Renew { client, lease } => self.renewal_due(client, lease),
            Event::Cancel { client, task } => self.cancel(client, task),
            Event::Gather(client) => self.gather(client),
            Event::ClientBack(client) => self.client_back(client),
            Event::Tick => self.tick(),
        }
    }

    fn tick(&mut self) {
        let f = self.cfg.faults.clone();
        for server in 0..self.servers.len() {
            if !self.servers[server].serving() {
                continue;
            }
            if self.rng.f64() < f.server_pause {
                let pause = self.rng.u64(1..=micros(f.max_pause).max(1));
                self.trace.line(self.now, || {
                    format!("s{server} pauses for {:.3} ms", pause as f64 / 1000.0)
                });
                self.servers[server].pause();
                self.at(self.now + pause, Event::ServerBack(server));
            } else if self.rng.f64() < f.restart {
                self.restart(server);
            } else if server == self.primary && self.link.is_some() && self.rng.f64() < f.failover {
                self.failover();
            }
        }
        if !self.clients.iter().all(Client::done) {
            self.at(self.now + TICK, Event::Tick);
        }
    }

    /// Server `server` restarts without persistence: every key, cached script and
    /// connection lost. It is back a few milliseconds later.
    fn restart(&mut self, server: usize) {
        self.trace
            .line(self.now, || format!("s{server} restarts (no persistence)"));
        self.data_lost_at.push(self.now);
        let open: Vec<ReqId> = self
            .sent
            .iter()
            .filter(|(_, s)| s.server == server && s.ran_at.is_some() && s.replies.is_none())
            .map(|(id, _)| *id)
            .collect();
        self.servers[server].restart();
        self.known_scripts.retain(|(_, s, _)| *s != server);
        // Requests it was running (blocked) lose their connection.
        for id in open {
            let after = self.rng.u64(0..1_000);
            self.at(self.now + after, Event::Reset(id));
        }
        let down = self.rng.u64(1_000..50_000);
        self.at(self.now + down, Event::ServerBack(server));
    }

    /// The primary dies (its connections reset) and the replica takes its place with what
    /// it received, after the time a failover takes to notice and agree (Sentinel's
    /// `down-after-milliseconds` and election: 100 ms to 1 s here, seconds in practice),
    /// refusing connections meanwhile. Writes it had not received are lost, which the
    /// design documents as a way to let two holders in.
    fn failover(&mut self) {
        let Some(link) = self.link.take() else {
            return;
        };
        let (old, new) = (self.primary, 1 - self.primary);
        self.trace
            .line(self.now, || format!("failover: s{new} replaces s{old}"));
        self.data_lost_at.push(self.now);
        link.detach(self.servers[old].model_mut());
        self.servers[new].model_mut().promote();
        let open: Vec<ReqId> = self
            .sent
            .iter()
            .filter(|(_, s)| s.server == old && s.awaited)
            .map(|(id, _)| *id)
            .collect();
        self.servers[old].kill();
        for id in open {
            let after = self.rng.u64(0..1_000);
            self.at(self.now + after, Event::Reset(id));
        }
        self.primary = new;
        self.servers[new].take_down();
        let promoted_after = self.rng.u64(100_000..1_000_000);
        self.at(self.now + promoted_after, Event::ServerBack(new));
    }

    fn server_back(&mut self, server: usize) {
        self.trace.line(self.now, || format!("s{server} is back"));
        for id in self.servers[server].resume() {
            self.deliver(id);
        }
        self.pump(server);
    }

    /// Client `client` stops (SIGSTOP) for up to the configured pause; its clock goes on.
    pub fn pause_client(&mut self, client: usize) {
        let pause = self.rng.u64(1..=micros(self.cfg.faults.max_pause).max(1));
        self.trace.line(self.now, || {
            format!("c{client} pauses for {:.3} ms", pause as f64 / 1000.0)
        });
        let c = &mut self.clients[client];
        c.paused_until = Some(self.now + pause);
        c.pauses += 1;
        self.at(self.now + pause, Event::ClientBack(client));
    }

    fn client_back(&mut self, client: usize) {
        self.trace.line(self.now, || format!("c{client} resumes"));
        self.clients[client].paused_until = None;
        // What happened meanwhile is seen now, in the order it happened.
        for event in std::mem::take(&mut self.deferred[client]) {
            self.at(self.now, event);
        }
    }

    /// Sends `commands` from `client` to `server` for `purpose`, written now; the caller
    /// waits for the replies until `deadline` (virtual). Returns the request's id.
    pub fn send(
        &mut self,
        client: usize,
        purpose: Purpose,
        server: usize,
        commands: Vec<Vec<Vec<u8>>>,
        deadline: Micros,
    ) -> ReqId {
        let id = self.next_request;
        self.next_request += 1;
        // As the runtime's wire does: a script ahead of a block goes as EVAL unless the
        // server was seen to have it cached.
        let last_block = commands
            .iter()
            .rposition(|c| c.first().is_some_and(|c| c == b"BLPOP"));
        let commands: Vec<Vec<Vec<u8>>> = commands
            .into_iter()
            .enumerate()
            .map(|(i, c)| match c.get(1) {
                Some(sha)
                    if c[0] == b"EVALSHA"
                        && last_block.is_some_and(|b| i < b)
                        && !self.known_scripts.contains(&(client, server, sha.clone())) =>
                {
                    evaluated(&c)
                }
                _ => c,
            })
            .collect();
        let fate = self.fate(server);
        let conn = self.servers[server].connect();
        let sent_local = self.local(client);
        self.trace.line(self.now, || {
            format!(
                "c{client} -> s{server} #{id} {purpose:?}: {} [{fate:?}]",
                describe(&commands)
            )
        });
        self.sent.insert(
            id,
            Sent {
                client,
                purpose,
                server,
                conn,
                commands,
                sent_local,
                fate,
                awaited: purpose != Purpose::Background,
                ran_at: None,
                got: Vec::new(),
                replies: None,
                reply_times: Vec::new(),
                resent: None,
            },
        );
        match fate {
            Fate::Normal { there, .. } | Fate::LostReply { there } => {
                self.at(self.now + there, Event::Deliver(id));
            }
            Fate::Reset { after, ran } => {
                if ran {
                    self.at(self.now + after / 2, Event::Deliver(id));
                }
                self.at(self.now + after, Event::Reset(id));
            }
            Fate::LostRequest => {}
            Fate::Refused => {
                self.at(self.now, Event::Reset(id));
                return id;
            }
        }
        if purpose != Purpose::Background {
            self.at(deadline, Event::Deadline(id));
        }
        id
    }

    /// How the next request to `server` fares.
    fn fate(&mut self, server: usize) -> Fate {
        let f = &self.cfg.faults;
        if !self.servers[server].up() || self.rng.f64() < f.refuse {
            return Fate::Refused;
        }
        let long = micros(f.max_long_delay).max(1);
        let long_delay = f.long_delay;
        let delay = |rng: &mut fastrand::Rng| {
            if rng.f64() < long_delay {
                rng.u64(1..=long)
            } else {
                rng.u64(50..=500)
            }
        };
        let there = delay(&mut self.rng);
        let back = delay(&mut self.rng);
        let (drop_request, drop_reply, reset) = (f.drop_request, f.drop_reply, f.reset);
        let draw = self.rng.f64();
        if draw < drop_request {
            Fate::LostRequest
        } else if draw < drop_request + drop_reply {
            Fate::LostReply { there }
        } else if draw < drop_request + drop_reply + reset {
            Fate::Reset {
                after: there + back,
                ran: self.rng.bool(),
            }
        } else {
            Fate::Normal { there, back }
        }
    }

    /// A request reaches its server: it runs there (or waits while the server is paused;
    /// a server restarting has lost the connection).
    fn deliver(&mut self, id: ReqId) {
        let Some(sent) = self.sent.get(&id) else {
            return;
        };
        let server = sent.server;
        if !self.servers[server].serving() {
            if self.servers[server].up() {
                self.servers[server].hold(id);
            }
            return;
        }
        let (conn, awaited) = (sent.conn, sent.awaited);
        let commands = match sent.resent {
            Some(first) => sent.commands[first..].to_vec(),
            None => sent.commands.clone(),
        };
        if let Some(sent) = self.sent.get_mut(&id) {
            // (A script sent again as `EVAL` runs at its second delivery.)
            sent.ran_at = Some(self.now);
        }
        self.trace
            .line(self.now, || format!("s{server} runs #{id}"));
        let now = self.now;
        self.servers[server].submit(conn, id, commands, now);
        self.pump(server);
        self.maybe_evict(server);
        if !awaited && self.sent.get(&id).is_some_and(|s| s.replies.is_none()) {
            // Its caller gave up and closed the connection: what did not run at once (a
            // block, and what was pipelined behind it) never runs.
            self.servers[server].disconnect(conn);
        }
    }

    /// In runs with evictions: a lock key holding a grant its waiter has not taken yet is
    /// now and then deleted on its own (as an evicting `maxmemory` policy may; the README
    /// asks for `noeviction`). Such a grant is a pending one (the old path), or a key a
    /// release handed to a direct waiter whose grant still lies unpopped on its own wake
    /// list (its block had ended), and whose fencing token is still the last one drawn
    /// (no acquire took the key since: the waiter's own attempt may take it again, and
    /// leave the grant where it is). Nobody believes it holds such a key, so every promise
    /// must survive it, and a waiter must never take the grant left behind once the key is
    /// someone else's.
    fn maybe_evict(&mut self, server: usize) {
        if !self.evictions || server != self.primary {
            return;
        }
        for n in 0..self.cfg.names.len() {
            let name = self.cfg.names[n].name.clone();
            let Ok(keys) = crate::keys::LockKeys::new("", &name) else {
                continue;
            };
            let holder = self.servers[server].string(&keys.lock);
            let pending = holder.is_some() && holder == self.servers[server].string(&keys.grant);
            let last_fence = self.servers[server].string(&keys.fence);
            let handed = !pending
                && holder.is_some_and(|token| {
                    let own = keys.own_wake(&String::from_utf8_lossy(token));
                    let head = self.servers[server].list_head(&own);
                    // `g<fencing token>:<lease ms>`
                    let fence =
                        head.and_then(|g| g.strip_prefix(b"g")?.split(|b| *b == b':').next());
                    fence.is_some() && fence == last_fence
                });
            let evict = if pending {
                self.evict_rng.f64() < 0.5
            } else {
                handed && self.evict_handed_rng.f64() < 0.5
            };
            if evict {
                self.trace.line(self.now, || {
                    format!("s{server} evicts {name:?} (a grant not taken yet)")
                });
                self.servers[server].foreign(&["DEL", &name], self.now);
                self.pump(server);
            }
        }
    }

    /// Collects the replies `server` has (and its replica's acknowledgements), schedules
    /// their way back, and its timer.
    pub fn pump(&mut self, server: usize) {
        let now = self.now;
        self.servers[server].advance(now);
        let mut link_due = None;
        if let Some(link) = &mut self.link {
            let (primary, replica) = self.servers.split_at_mut(1);
            let (primary, replica) = (&mut primary[0], &mut replica[0]);
            if primary.serving() && replica.serving() {
                replica.advance(now);
                link.pump(primary.model_mut(), replica.model_mut());
                link_due = link.next_timer(primary.model(), replica.model());
                primary.advance(now);
            }
        }
        if let Some(at) = link_due {
            self.queue_link_timer(at * 1000);
        }
        for (id, replies) in self.servers[server].take_replies() {
            let Some(sent) = self.sent.get_mut(&id) else {
                continue;
            };
            sent.got.extend(replies.into_iter().map(|v| (v, now)));
            if sent.got.len() < sent.commands.len() || sent.replies.is_some() {
                // The rest waits behind a block.
                continue;
            }
            sent.replies = Some(sent.got.iter().map(|(v, _)| v.clone()).collect());
            sent.reply_times = sent.got.iter().map(|(_, at)| *at).collect();
            let fate = sent.fate;
            let (commands, got) = (sent.commands.clone(), sent.got.clone());
            self.check.server_replied(&self.cfg.names, &commands, &got);
            if let Fate::Normal { back, .. } = fate {
                self.at(now + back, Event::Reply(id));
            }
        }
        if let Some(at) = self.servers[server].next_timer(now) {
            self.timer(server, at);
        }
    }

    /// The replication link has something due at `at` (µs).
    fn queue_link_timer(&mut self, at: Micros) {
        let primary = self.primary;
        self.timer(primary, at);
    }

    /// Makes sure `server` is pumped at `at`: queues a timer unless one is pending earlier.
    fn timer(&mut self, server: usize, at: Micros) {
        let at = at.max(self.now);
        if self.timers[server].is_some_and(|t| t >= self.now && t <= at) {
            return;
        }
        self.timers[server] = Some(at);
        self.at(at, Event::ServerTimer(server));
    }

    /// A request's replies reach its client.
    fn reply_arrives(&mut self, id: ReqId) {
        let Some(sent) = self.sent.get(&id) else {
            return;
        };
        // A request in the background has no caller waiting for its answer, but the
        // runtime's wire still sends a script answered `NOSCRIPT` again as `EVAL` (a
        // background give-back runs `run_calls` on a thread of its own): only its answer
        // goes nowhere.
        if !sent.awaited && sent.purpose != Purpose::Background {
            return;
        }
        let replies = sent.replies.clone().unwrap_or_default();
        let sent_local = sent.sent_local;
        let (client, server) = (sent.client, sent.server);
        let seen: Vec<(Vec<u8>, bool)> = sent
            .commands
            .iter()
            .zip(&replies)
            .filter(|(c, _)| c.first().is_some_and(|c| c == b"EVALSHA"))
            .filter_map(|(c, r)| Some((c.get(1)?.clone(), !is_noscript(r))))
            .collect();
        for (sha, cached) in seen {
            if cached {
                self.known_scripts.insert((client, server, sha));
            } else {
                self.known_scripts.remove(&(client, server, sha));
            }
        }
        if let Some(first) = replies.iter().position(is_noscript) {
            // As the runtime's wire does: the calls from the first answered NOSCRIPT are
            // sent again as EVAL, on the same connection; their replies replace those.
            return self.resend_evaluated(id, first);
        }
        self.close(id);
        self.answered(id, Ok((replies, sent_local)));
    }

    /// Sends the calls of request `id` from `first` on again, scripts as `EVAL`, on its
    /// connection; the request's replies from `first` on will be theirs.
    fn resend_evaluated(&mut self, id: ReqId, first: usize) {
        let Some(sent) = self.sent.get_mut(&id) else {
            return;
        };
        let again: Vec<Vec<Vec<u8>>> = sent.commands[first..]
            .iter()
            .map(|c| evaluated(c))
            .collect();
        sent.replies = None;
        sent.got.truncate(first);
        sent.commands.truncate(first);
        sent.commands.extend(again);
        sent.resent = Some(first);
        self.trace
            .line(self.now, || format!("#{id} NOSCRIPT: sent again as EVAL"));
        let there = self.rng.u64(50..=500);
        self.at(self.now + there, Event::Deliver(id));
    }

    /// The connection under a request resets: the caller learns it lost it (of unknown
    /// outcome once the request was written), or that it was refused (nothing sent).
    fn reset(&mut self, id: ReqId) {
        let Some(sent) = self.sent.get(&id) else {
            return;
        };
        if !sent.awaited {
            return;
        }
        let error = match sent.fate {
            Fate::Refused => Error::new(ErrorKind::Connection, "connection refused"),
            _ => Error::new(ErrorKind::Connection, "the connection was lost").sent(),
        };
        self.close(id);
        self.answered(id, Err(error));
    }

    /// A client stops waiting for a request: no reply in time.
    fn deadline(&mut self, id: ReqId) {
        if !self.sent.get(&id).is_some_and(|s| s.awaited) {
            return;
        }
        self.abandon(id);
        let error = Error::new(ErrorKind::Timeout, "no reply in time").sent();
        self.answered(id, Err(error));
    }

    /// The caller no longer waits for request `id` (it timed out, or was cancelled): its
    /// connection closes, which also ends a block of it on the server.
    pub fn abandon(&mut self, id: ReqId) {
        self.trace.line(self.now, || format!("#{id} abandoned"));
        self.close(id);
    }

    fn close(&mut self, id: ReqId) {
        let Some(sent) = self.sent.get_mut(&id) else {
            return;
        };
        sent.awaited = false;
        let (server, conn, ran) = (sent.server, sent.conn, sent.ran_at.is_some());
        if ran {
            self.servers[server].disconnect(conn);
        }
    }

    /// Until when (virtual) a client waits for the replies of a request written now: the
    /// I/O timeout, plus the time of a block among its calls, cut at `cutoff`.
    pub fn reply_deadline(
        &self,
        client: usize,
        block: Option<Duration>,
        cutoff: Option<Instant>,
    ) -> Micros {
        let mut wait = self.cfg.io_timeout;
        if let Some(block) = block.filter(|b| !b.is_zero()) {
            wait += block + BLOCK_LATENESS;
        }
        let local = self.local(client) + wait;
        let local = cutoff.map_or(local, |c| local.min(c));
        self.virtual_at(client, local).max(self.now)
    }

    /// What every client believes it holds now.
    pub fn beliefs(&self) -> Vec<Belief> {
        let mut out = Vec::new();
        for client in &self.clients {
            let now = self.local(client.id);
            for lease in client
                .leases
                .iter()
                .filter(|l| l.believed(now) && !l.handed_over)
            {
                out.push(Belief {
                    name: lease.name,
                    owner: match &lease.kind {
                        Kind::Reentrant(owner) => owner.to_string(),
                        _ => lease.token.clone(),
                    },
                    token: lease.token.clone(),
                    writer: !matches!(lease.kind, Kind::Read),
                    granted_at: lease.granted_at,
                });
            }
        }
        out
    }

    fn check_now(&mut self) -> Result<(), String> {
        let beliefs = self.beliefs();
        self.check
            .exclusion(self.now, &self.cfg.names, &beliefs, &self.data_lost_at)?;
        self.check_held_never_returns()?;
        if !self.cfg.faults.any() && !self.redlock() {
            self.check_liveness();
        }
        Ok(())
    }

    /// A lease whose clock once said it is no longer held never says it is held again (the
    /// guard's `is_held()` never turns true after it turned false).
    fn check_held_never_returns(&mut self) -> Result<(), String> {
        for c in 0..self.clients.len() {
            let now = self.local(c);
            for lease in &mut self.clients[c].leases {
                let held = lease.clock.is_held(now);
                if held && lease.seen_ended {
                    return Err(format!(
                        "at {:.3} ms, {} is held again by its clock after it had ended",
                        self.now as f64 / 1000.0,
                        short(&lease.token)
                    ));
                }
                lease.seen_ended |= !held;
            }
        }
        Ok(())
    }

    /// A free mutex with a live waiter is taken within the waiter's grace.
    fn check_liveness(&mut self) {
        let grace = backoff::grace(self.cfg.io_timeout);
        for (n, name) in self.cfg.names.iter().enumerate() {
            if !matches!(name.kind, Kind::Mutex | Kind::Reentrant(_)) {
                continue;
            }
            let free = !self.servers[0].has_key(&name.name);
            let waited = self.clients.iter().any(|c| {
                let now = self.local(c.id);
                c.tasks.iter().any(|t| t.op.waits_for(n, now, grace))
            });
            match (free && waited, self.free_since[n]) {
                (true, None) => self.free_since[n] = Some(self.now),
                (true, Some(since)) => {
                    self.check
                        .free_while_waited(self.now, &name.name, since, grace);
                }
                (false, _) => self.free_since[n] = None,
            }
        }
    }

    /// Every thread is done: lets every lease and registration lapse (the longest ttl,
    /// the grace and the servers' own timers), then looks at what is left on the servers.
    fn settle_down(&mut self) -> Result<(), String> {
        let until = self.now + 10_000_000;
        while let Some(Reverse((at, _, event))) = self.queue.pop() {
            if at > until {
                break;
            }
            self.now = at;
            match event {
                // Requests in flight still land, servers still expire keys; nothing of
                // the clients runs any more.
                Event::Deliver(_) | Event::ServerTimer(_) | Event::ServerBack(_) => {
                    self.handle(event)
                }
                _ => {}
            }
        }
        self.now = until;
        for server in 0..self.servers.len() {
            self.servers[server].resume();
            self.servers[server].advance(until);
            let left: Vec<String> = self.servers[server]
                .keys()
                .into_iter()
                .filter(|k| !k.starts_with("redlease:fence:"))
                .collect();
            if !left.is_empty() {
                return Err(format!(
                    "after every hold was released or expired, s{server} still has {left:?}"
                ));
            }
        }
        Ok(())
    }
}

fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// `command` with a script as `EVAL` and its text (the others as they are).
fn evaluated(command: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let scripts = [
        &*crate::scripts::ACQUIRE,
        &*crate::scripts::RELEASE,
        &*crate::scripts::EXTEND,
        &*crate::scripts::ACQUIRE_PERMIT,
        &*crate::scripts::EXTEND_PERMIT,
        &*crate::scripts::RELEASE_PERMIT,
        &*crate::scripts::ACQUIRE_RW,
        &*crate::scripts::EXTEND_RW,
        &*crate::scripts::RELEASE_RW,
        &*crate::scripts::ADOPT,
        &*crate::scripts::ACQUIRE_ALL,
    ];
    match command
        .get(1)
        .and_then(|sha| scripts.iter().find(|s| s.sha.as_bytes() == sha.as_slice()))
    {
        Some(lua) if command[0] == b"EVALSHA" => {
            let mut eval = vec![b"EVAL".to_vec(), lua.code.clone().into_bytes()];
            eval.extend(command[2..].iter().cloned());
            eval
        }
        _ => command.to_vec(),
    }
}

/// The commands of a request, short, for the trace.
fn describe(commands: &[Vec<Vec<u8>>]) -> String {
    commands
        .iter()
        .map(|c| {
            let text = |a: &Vec<u8>| String::from_utf8_lossy(a).into_owned();
            match c.first().map(text).as_deref() {
                Some("EVALSHA") | Some("EVAL") => {
                    let args: Vec<String> = c
                        .iter()
                        .skip(3)
                        .map(|a| short(&text(a)).to_owned())
                        .collect();
                    format!("script({})", args.join(" "))
                }
                _ => c.iter().map(text).collect::<Vec<_>>().join(" "),
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mutex's release sent in the background to a server that has not cached the script
    /// (a fresh server here; a promoted replica or a restarted server in a run) is answered
    /// `NOSCRIPT`; as the runtime's wire does for a background give-back too, it is sent
    /// again as `EVAL`, and runs: the key it held (without expiry) is gone.
    #[test]
    fn a_background_release_answered_noscript_is_sent_again_and_runs() {
        let mut world = World::new(1, false);
        world.cfg.faults = crate::sim::config::Faults::calm();
        let keys = crate::keys::LockKeys::new("", "bg").expect("a lock name");
        world.servers[0].foreign(&["SET", &keys.lock, "tok"], 0);
        assert!(world.servers[0].has_key(&keys.lock));
        let command = world.release_args(
            0,
            &crate::kinds::Kind::Mutex,
            &keys,
            "tok",
            false,
            Duration::ZERO,
        );
        assert!(
            command[0].eq_ignore_ascii_case(b"EVALSHA"),
            "sent by its SHA1"
        );
        world.send(0, Purpose::Background, 0, vec![command], 0);
        while let Some(Reverse((at, _, event))) = world.queue.pop() {
            world.now = at;
            world.handle(event);
        }
        assert!(
            !world.servers[0].has_key(&keys.lock),
            "the background release ran (sent again as EVAL after NOSCRIPT)"
        );
    }
}
