//! Requests of many callers pipelined on one connection: renewals of all the locks due at
//! about the same moment go out in one write, and their replies come back in one burst.
//!
//! Each node has at most one batching thread, started when the first request arrives and
//! gone after [`IDLE`] without any. A request is handed over with a completion that the
//! thread runs with the request's reply (or the error that stopped the batch) and the
//! moment the batch was written. Completions must be quick: they run on the thread that
//! serves every other request of the node.

use std::time::{Duration, Instant};

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::error::{Error, ErrorKind, Result};
use crate::lane::Lane;
use crate::sync::{self, Arc, Condvar, Mutex, MutexGuard, Weak, thread};

/// How long a batching thread waits for work before it exits.
const IDLE: Duration = Duration::from_secs(30);
/// Most requests in one write.
const MAX_BATCH: usize = 1024;
/// After the first request of a batch arrives, how long the thread waits for others: the
/// renewals of locks taken at slightly different moments then share a write (a few
/// milliseconds of lateness against a third of a lease).
const GATHER: Duration = Duration::from_millis(3);

/// Where a batch goes: a node's renewal connections.
pub(crate) trait Conduit: Send + Sync {
    /// Runs `calls` in one request on a renewal connection, within `how`'s bounds.
    fn run(&self, calls: &[Call], how: &Exec<'_>) -> Result<Replies>;
}

/// What runs when a request's reply (or failure) is known: the reply, and when the batch
/// that carried it was written (before the server could run it).
pub(crate) type Done = Box<dyn FnOnce(Result<Value>, Instant) + Send>;

/// One request waiting for a batch.
pub(crate) struct Item {
    pub call: Call,
    /// Nothing of this request may run past this instant.
    pub cutoff: Instant,
    pub done: Done,
}

/// The batching state of a node.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    work: Condvar,
}

#[derive(Default)]
struct Queue {
    /// Queued items and their ids.
    items: Vec<(u64, Item)>,
    next_id: u64,
    /// When the batch being written or read was taken from the queue, if any.
    in_flight_since: Option<Instant>,
    running: bool,
    /// The node is gone: the thread exits.
    closed: bool,
    /// The thread sleeps waiting for work and nobody has woken it yet (a wake-up is a
    /// system call: made only then, by the first submitter).
    sleeping: bool,
}

impl Batcher {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        sync::lock(&self.queue)
    }

    /// Hands `item` to this batcher's thread (starting it if needed, to serve `conduit`,
    /// which it holds only while it runs a batch); returns its id,
    /// with which the submitter may [`withdraw`](Self::withdraw) it while it is still
    /// queued (behind a slow batch). Never blocks for I/O. An item whose cutoff passes
    /// while it is queued is completed with a timeout, unsent.
    ///
    /// Errors (the item's completion is then not run; the caller sends it on its own):
    /// the batch in flight has already taken more than a quarter of the time the item has
    /// left (a slow reply holds it up); the OS refuses a thread (the items others queued
    /// meanwhile are then completed with that error).
    pub fn submit(
        batcher: &Arc<Batcher>,
        conduit: Weak<dyn Conduit>,
        item: Item,
        io: Duration,
    ) -> Result<u64> {
        if crate::process::orphaned() {
            // A thread started here would not be marked: the item is its parent's.
            return Err(crate::process::orphaned_error());
        }
        let mut queue = batcher.queue();
        let now = sync::now();
        if let Some(since) = queue.in_flight_since {
            if now.saturating_duration_since(since) > item.cutoff.saturating_duration_since(now) / 4
            {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "the batch in flight is slow; this request goes on its own",
                ));
            }
        }
        // Queued first: a thread started for it finds it (one started before could idle
        // out, unseen, before the item arrived, and leave it with nobody to serve it).
        queue.next_id += 1;
        let id = queue.next_id;
        queue.items.push((id, item));
        if !queue.running {
            queue.running = true;
            drop(queue);
            let thread_batcher = batcher.clone();
            let started = crate::process::spawn_without_signals(|| {
                thread::Builder::new()
                    .name("redlease-batch".into())
                    .stack_size(128 * 1024)
                    .spawn(move || serve(&thread_batcher, conduit, io))
            });
            if let Err(e) = started {
                let failed = Error::new(
                    ErrorKind::Internal,
                    format!("cannot start a renewal batching thread: {e}"),
                );
                // Nobody serves the queue: ours goes back unsent (its caller sends it on its
                // own), the others' fail.
                let stranded = {
                    let mut queue = batcher.queue();
                    queue.running = false;
                    std::mem::take(&mut queue.items)
                };
                for (other_id, other) in stranded {
                    if other_id != id {
                        (other.done)(Err(failed.clone()), sync::now());
                    }
                }
                return Err(failed);
            }
            return Ok(id);
        }
        // One wake-up per sleep: the submitters that come before the thread has the queue
        // again (thousands, when many renewals fall due together) need not make one each.
        let wake = std::mem::replace(&mut queue.sleeping, false);
        drop(queue);
        if wake {
            batcher.work.notify_one();
        }
        Ok(id)
    }

    /// Takes back item `id` if no batch has taken it yet (the caller then completes it);
    /// `None` once it is in a batch (which ends by the item's cutoff) or completed.
    pub fn withdraw(&self, id: u64) -> Option<Item> {
        let mut queue = self.queue();
        let at = queue.items.iter().position(|(queued, _)| *queued == id)?;
        Some(queue.items.remove(at).1)
    }

    /// The node is being dropped: the thread exits (without holding the node meanwhile).
    pub fn close(&self) {
        self.queue().closed = true;
        self.work.notify_all();
    }
}

/// The batching thread of a node: takes whatever is queued, writes it in one request,
/// reads the replies, runs the completions. It holds the node only while it runs a batch,
/// so a client that is dropped closes its connections at once.
fn serve(batcher: &Batcher, node: Weak<dyn Conduit>, io: Duration) {
    let born = crate::process::generation();
    loop {
        let items = {
            let mut queue = batcher.queue();
            if crate::process::orphaned() || crate::process::generation() != born {
                // This thread forked (in a callback, or in the drop of one): the child's
                // next submit starts a batching thread of its own.
                queue.running = false;
                return;
            }
            let idle_since = sync::now();
            while queue.items.is_empty() {
                let left = IDLE.saturating_sub(sync::now().saturating_duration_since(idle_since));
                if left.is_zero() || queue.closed {
                    queue.running = false;
                    return;
                }
                queue.sleeping = true;
                queue = sync::wait_timeout(&batcher.work, queue, left);
                queue.sleeping = false;
            }
            if queue.items.len() < MAX_BATCH {
                let until = sync::now() + GATHER;
                loop {
                    let left = until.saturating_duration_since(sync::now());
                    if left.is_zero() || queue.items.len() >= MAX_BATCH || queue.closed {
                        break;
                    }
                    // Not `sleeping`: submitters need not wake this short wait.
                    queue = sync::wait_timeout(&batcher.work, queue, left);
                }
            }
            let take = queue.items.len().min(MAX_BATCH);
            let now = sync::now();
            queue.in_flight_since = Some(now);
            queue
                .items
                .drain(..take)
                .map(|(_, item)| item)
                .partition::<Vec<Item>, _>(|item| item.cutoff > now)
        };
        let (items, late) = items;
        for item in late {
            let late = Error::new(
                ErrorKind::Timeout,
                "the request's cutoff passed before its batch was written",
            );
            (item.done)(Err(late), sync::now());
        }
        if !items.is_empty() {
            match node.upgrade() {
                Some(strong) => run_batch(strong.as_ref(), items, io),
                None => {
                    let failed = Error::new(ErrorKind::Connection, "the client was closed");
                    for item in items {
                        (item.done)(Err(failed.clone()), sync::now());
                    }
                }
            }
        }
        batcher.queue().in_flight_since = None;
    }
}

/// Writes `items` as one request and completes each with its reply. The batch gives up
/// halfway to the earliest cutoff among them: replies come back in order, so one slow
/// reply holds up all the others, and each must keep time to be sent again on its own.
fn run_batch(node: &dyn Conduit, items: Vec<Item>, io: Duration) {
    let now = sync::now();
    let cutoff = items
        .iter()
        .map(|i| i.cutoff)
        .min()
        .map(|c| now + c.saturating_duration_since(now) / 2);
    let mut calls = Vec::with_capacity(items.len());
    let mut dones = Vec::with_capacity(items.len());
    for item in items {
        calls.push(item.call);
        dones.push(item.done);
    }
    let how = Exec::new(Lane::Renewal, io).cutoff(cutoff);
    let attempt_at = sync::now();
    let result = node.run(&calls, &how);
    match result {
        Ok(replies) => {
            let sent_at = replies.sent_at;
            let mut values = replies.values.into_iter();
            for done in dones {
                let value = values.next().ok_or_else(|| {
                    Error::new(ErrorKind::Connection, "a batch came back short").sent()
                });
                done(value, sent_at);
            }
        }
        Err(e) => {
            for done in dones {
                done(Err(e.clone()), attempt_at);
            }
        }
    }
}
