//! A pool of connections to one server, with lanes that cannot starve each other.
//!
//! A hand-written pool rather than r2d2: r2d2 opens connections on worker threads of its own
//! and reports a failed connect as text, while here a connect runs on the caller's thread,
//! under the caller's deadline, and keeps its typed error (refused, timeout, WRONGPASS, ...).
//!
//! Lanes:
//!
//! - [`Lane::Caller`]: acquire attempts and other short requests. At most `pool_size` of
//!   them hold a connection at once; further callers queue, first come first served, up to
//!   their own deadline.
//! - [`Lane::Blocking`]: waiters blocked on the server. At most `pool_size` at once; a
//!   waiter that finds them all taken is told so and sleeps instead.
//! - [`Lane::Urgent`] and [`Lane::Renewal`]: releases, extends and renewals. Never waits:
//!   it takes an idle connection or opens one, so neither blocked waiters nor busy callers
//!   can hold up the end of a lease. (Renewals use a pool of their own, see
//!   [`crate::backend::node`].)
//!
//! Every lane shares the idle connections; an idle connection is checked (without
//! blocking) before reuse, so one closed by a restarted server is replaced, not used.

use std::collections::VecDeque;
use std::time::Instant;

use crate::connection::{Connection, Connector};
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::process;
use crate::sync::{self, Condvar, Mutex, MutexGuard};

pub(crate) struct Pool {
    pub connector: Connector,
    /// Most connections held at once by the caller lane, and by the blocking lane.
    cap: usize,
    max_idle: usize,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    idle: Vec<Connection>,
    callers: usize,
    blocking: usize,
    /// Tickets of callers waiting for a slot, in arrival order.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// The process the connections belong to; after `fork()` the child starts afresh.
    process: u64,
}

impl Pool {
    pub fn new(connector: Connector, cap: usize, max_idle: usize) -> Self {
        Pool {
            connector,
            cap,
            max_idle,
            state: Mutex::new(State {
                idle: Vec::new(),
                callers: 0,
                blocking: 0,
                queue: VecDeque::new(),
                next_ticket: 0,
                process: process::generation(),
            }),
            freed: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        let mut state = sync::lock(&self.state);
        let current = process::generation();
        if state.process != current {
            // A forked child: the connections are the parent's. Forget them (dropping a
            // connection in the child closes only the child's descriptor).
            state.idle.clear();
            state.callers = 0;
            state.blocking = 0;
            state.queue.clear();
            state.process = current;
        }
        state
    }

    /// Checks out a connection on `lane`, connecting (before `connect_by`, and within the
    /// connect timeout) when no idle one is usable. `Ok(None)` only on the blocking lane,
    /// when all its slots are taken.
    ///
    /// Errors: [`ErrorKind::Timeout`] when the caller lane has no free slot in time; the
    /// connect error otherwise. Nothing has been sent when this fails.
    pub fn checkout(&self, lane: Lane, connect_by: Instant) -> Result<Option<Pooled<'_>>> {
        self.checkout_or_connect(lane, Some(connect_by))
    }

    /// As [`checkout`](Self::checkout), but never connects: `Ok(None)` when no idle
    /// connection is at hand (or, on the blocking lane, no slot). The connection is handed
    /// out without the look at its socket ([`Pooled::unchecked`]), which the caller then
    /// makes for several connections at once ([`crate::connection::usable_together`]),
    /// discarding those that fail it ([`Pooled::discard`]).
    pub fn checkout_idle(&self, lane: Lane) -> Result<Option<Pooled<'_>>> {
        self.checkout_or_connect(lane, None)
    }

    /// A checkout that connects by `connect_by` when needed, or (with `None`) hands out an
    /// idle connection unchecked.
    fn checkout_or_connect(
        &self,
        lane: Lane,
        connect_by: Option<Instant>,
    ) -> Result<Option<Pooled<'_>>> {
        if process::orphaned() {
            // Another of the parent's threads may have held the pool's lock at the fork.
            return Err(process::orphaned_error());
        }
        let mut state = self.state();
        match lane {
            Lane::Caller(until) => {
                if !state.queue.is_empty() || state.callers >= self.cap {
                    let ticket = state.next_ticket;
                    state.next_ticket += 1;
                    state.queue.push_back(ticket);
                    loop {
                        let first = state.queue.front() == Some(&ticket);
                        if first && state.callers < self.cap {
                            state.queue.pop_front();
                            break;
                        }
                        let now = Instant::now();
                        if now >= until {
                            state.queue.retain(|t| *t != ticket);
                            drop(state);
                            self.freed.notify_all();
                            return Err(Error::new(
                                ErrorKind::Timeout,
                                format!(
                                    "no pooled connection to {} became free in time (pool size {})",
                                    self.connector.addr, self.cap
                                ),
                            ));
                        }
                        state = sync::wait_timeout(&self.freed, state, until - now);
                    }
                }
                state.callers += 1;
                if !state.queue.is_empty() {
                    // The next in line may be able to go too.
                    self.freed.notify_all();
                }
            }
            Lane::Blocking => {
                if state.blocking >= self.cap {
                    return Ok(None);
                }
                state.blocking += 1;
            }
            Lane::Urgent | Lane::Renewal => {}
        }
        let process = state.process;
        drop(state);
        let mut pooled = Pooled {
            pool: self,
            conn: None,
            lane,
            process,
            unchecked: false,
        };
        let Some(connect_by) = connect_by else {
            let Some(conn) = self.state().idle.pop() else {
                // Dropped without a connection: the slot goes back.
                return Ok(None);
            };
            pooled.conn = Some(conn);
            pooled.unchecked = true;
            return Ok(Some(pooled));
        };
        pooled.conn = Some(self.usable_or_new(connect_by)?);
        Ok(Some(pooled))
    }

    /// An idle connection that is still usable, or a new one.
    fn usable_or_new(&self, connect_by: Instant) -> Result<Connection> {
        loop {
            let idle = self.state().idle.pop();
            match idle {
                Some(mut conn) => {
                    if conn.is_usable() {
                        return Ok(conn);
                    }
                    // Closed while idle (a restarted server): its siblings probably are too;
                    // they are each checked as they come.
                    log::debug!("dropping a dead idle connection to {}", self.connector.addr);
                }
                None => return self.connector.connect(connect_by),
            }
        }
    }

    fn give_back(&self, conn: Option<Connection>, lane: Lane, process: u64) {
        if process::orphaned() {
            // As in `checkout`: the pool is the parent's; its lock may never come back.
            return;
        }
        let conn = conn.filter(|_| process == process::generation());
        // In step with its replies; whether the server closed it is looked at when it is
        // next taken (a system call saved per request).
        let conn = conn.filter(Connection::is_in_step);
        let mut state = self.state();
        if state.process != process {
            return;
        }
        match lane {
            Lane::Caller(_) => state.callers = state.callers.saturating_sub(1),
            Lane::Blocking => state.blocking = state.blocking.saturating_sub(1),
            Lane::Urgent | Lane::Renewal => {}
        }
        if let Some(conn) = conn {
            if state.idle.len() < self.max_idle {
                state.idle.push(conn);
            }
        }
        let wake = !state.queue.is_empty();
        drop(state);
        if wake {
            self.freed.notify_all();
        }
    }

    /// Closes every idle connection (the client is closing).
    pub fn close_idle(&self) {
        let idle = std::mem::take(&mut self.state().idle);
        drop(idle);
    }
}

/// A checked-out connection; goes back to the pool on drop unless it broke.
pub(crate) struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Connection>,
    lane: Lane,
    process: u64,
    /// An idle connection handed out by [`Pool::checkout_idle`], not looked at yet.
    unchecked: bool,
}

impl Pooled<'_> {
    pub fn conn(&mut self) -> &mut Connection {
        // Set right after construction in `checkout`, taken only in `drop`.
        self.conn
            .as_mut()
            .unwrap_or_else(|| unreachable!("a checked-out connection is present until dropped"))
    }

    /// Whether the connection is an idle one handed out by [`Pool::checkout_idle`]: the caller
    /// must look at it before writing.
    pub fn unchecked(&self) -> bool {
        self.unchecked
    }

    /// The connection was looked at and found usable.
    pub fn checked(&mut self) {
        self.unchecked = false;
    }

    /// The connection was found closed or out of step: it is dropped, and so is the slot.
    pub fn discard(mut self) {
        self.conn = None;
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        self.pool
            .give_back(self.conn.take(), self.lane, self.process);
    }
}
