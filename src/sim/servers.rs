//! A simulated server as the world sees it: the model of [`crate::sim::redis`], whether it
//! is up, paused or restarting, and which request each of its connections carries.

use std::collections::BTreeMap;

use redis::Value;

use crate::sim::client::ReqId;
use crate::sim::config::Micros;
use crate::sim::redis::{ConnId as ModelConn, Data, Server, ServerId, command};

/// A connection of the world to a server (one per request).
pub(crate) type ConnId = ModelConn;

pub(crate) struct SimServer {
    model: Server,
    /// Down while it restarts: connections are refused.
    down: bool,
    /// Paused (SIGSTOP): requests wait, nothing runs.
    paused: bool,
    /// Requests delivered while paused, in order.
    held: Vec<ReqId>,
    /// The request each connection carries.
    carries: BTreeMap<ConnId, ReqId>,
    /// Out of service for good.
    dead: bool,
}

impl SimServer {
    /// Server `id`, its wall clock `offset_ms` away from the others'.
    pub fn new(id: usize, offset_ms: i64) -> SimServer {
        let mut model = Server::new(ServerId(id as u32));
        model.set_clock_offset(model.clock_offset() + offset_ms);
        SimServer {
            model,
            down: false,
            paused: false,
            held: Vec::new(),
            carries: BTreeMap::new(),
            dead: false,
        }
    }

    /// Accepts connections (even while paused: the kernel does).
    pub fn up(&self) -> bool {
        !self.down
    }

    /// Runs commands now.
    pub fn serving(&self) -> bool {
        !self.down && !self.paused
    }

    pub fn connect(&mut self) -> ConnId {
        self.model.connect()
    }

    /// Runs `commands` of request `id` on `conn` at `now`.
    pub fn submit(&mut self, conn: ConnId, id: ReqId, commands: Vec<Vec<Vec<u8>>>, now: Micros) {
        self.model.advance(now / 1000);
        self.carries.insert(conn, id);
        // A connection lost in a restart took nothing.
        let _ = self.model.submit(conn, commands);
    }

    /// The model, for a replication link.
    pub fn model_mut(&mut self) -> &mut Server {
        &mut self.model
    }

    /// The model, for a replication link's timer.
    pub fn model(&self) -> &Server {
        &self.model
    }

    /// Takes the server out of service for good (a primary replaced in a failover).
    pub fn kill(&mut self) {
        self.model.restart();
        self.carries.clear();
        self.held.clear();
        self.down = true;
        self.dead = true;
    }

    /// Refuses connections until [`resume`](Self::resume), keeping its data (a replica
    /// being promoted).
    pub fn take_down(&mut self) {
        self.down = true;
    }

    /// Moves the server's time to `now`.
    pub fn advance(&mut self, now: Micros) {
        if self.serving() {
            self.model.advance(now / 1000);
        }
    }

    /// The replies ready now, by request (the rest of a request's come later, behind a
    /// block).
    pub fn take_replies(&mut self) -> Vec<(ReqId, Vec<Value>)> {
        let mut out = Vec::new();
        for conn in self.model.connections_with_replies() {
            let replies = self.model.take_replies(conn);
            if let Some(id) = self.carries.get(&conn) {
                out.push((*id, replies));
            }
        }
        out
    }

    /// When the server next has something to do (virtual µs), if it is serving.
    pub fn next_timer(&self, now: Micros) -> Option<Micros> {
        if !self.serving() {
            return None;
        }
        self.model.next_timer().map(|ms| (ms * 1000).max(now))
    }

    /// Closes a connection (its blocked command never runs).
    pub fn disconnect(&mut self, conn: ConnId) {
        self.model.disconnect(conn);
        self.carries.remove(&conn);
    }

    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Keeps request `id` until the server resumes.
    pub fn hold(&mut self, id: ReqId) {
        self.held.push(id);
    }

    /// Resumes after a pause or a restart; returns the requests held meanwhile.
    pub fn resume(&mut self) -> Vec<ReqId> {
        self.paused = false;
        self.down = self.dead;
        std::mem::take(&mut self.held)
    }

    /// A restart without persistence: every key, script and connection lost; down until
    /// [`resume`](Self::resume).
    pub fn restart(&mut self) {
        self.model.restart();
        self.carries.clear();
        self.held.clear();
        self.down = true;
    }

    /// The live string value of `key`, if it holds one.
    pub fn string(&self, key: &str) -> Option<&[u8]> {
        match self.model.value(key.as_bytes()) {
            Some(Data::Str(v)) => Some(v),
            _ => None,
        }
    }

    /// The first element of the list under `key`, if it holds one.
    pub fn list_head(&self, key: &str) -> Option<&[u8]> {
        match self.model.value(key.as_bytes()) {
            Some(Data::List(items)) => items.front().map(Vec::as_slice),
            _ => None,
        }
    }

    /// Runs a command of a client outside the simulation (an operator, an eviction) at
    /// `now`, on a connection of its own.
    pub fn foreign(&mut self, args: &[&str], now: Micros) {
        self.advance(now);
        let conn = self.model.connect();
        let _ = self.model.submit(conn, [command(args)]);
        self.model.disconnect(conn);
    }

    /// Whether `key` is live on the server now.
    pub fn has_key(&self, key: &str) -> bool {
        self.model.value(key.as_bytes()).is_some()
    }

    /// The live keys, for the end-of-run check.
    pub fn keys(&self) -> Vec<String> {
        if self.dead {
            return Vec::new();
        }
        self.model
            .entries()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect()
    }
}
