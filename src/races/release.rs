//! A release racing a batched renewal (`Lease::close_gate` against
//! `Lease::try_gate_owned` and `Lease::submit_renewal`, through the node's batcher), with
//! another lock's batch stalled on the same node.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use redis::Value;

use super::{QueueOnly, explore, lease, wait_until};
use crate::backend::batch::{Batcher, Conduit, Item};
use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::error::Result;
use crate::lease::Lease;
use crate::sync::{self, Arc, Condvar, Mutex, thread};

/// Our lease's token: a batch that carries it is one of our renewals.
const TOKEN: &str = "race-token-ours";

/// A node whose batches of other locks' requests stall until our lock's release is done
/// (a slow reply); a batch that carries our renewal answers (in reality a stalled batch
/// gives up halfway to the earliest cutoff among its renewals, so ours would not wait for
/// ever either).
#[derive(Default)]
struct Node {
    /// Our release has closed the gate (`close_gate` returned).
    released: AtomicBool,
    /// Our renewals sent.
    ours_sent: AtomicUsize,
    unstalled: Mutex<bool>,
    unstall: Condvar,
}

impl Node {
    fn release_done(&self) {
        self.released.store(true, SeqCst);
        *sync::lock(&self.unstalled) = true;
        self.unstall.notify_all();
    }
}

fn carries_ours(calls: &[Call]) -> bool {
    let token = TOKEN.as_bytes();
    calls
        .iter()
        .any(|c| c.packed().windows(token.len()).any(|w| w == token))
}

impl Conduit for Node {
    fn run(&self, calls: &[Call], _: &Exec<'_>) -> Result<Replies> {
        if carries_ours(calls) {
            assert!(
                !self.released.load(SeqCst),
                "a renewal was sent after its release closed the gate"
            );
            self.ours_sent.fetch_add(1, SeqCst);
            thread::yield_now();
        } else {
            let mut unstalled = sync::lock(&self.unstalled);
            while !*unstalled {
                unstalled = sync::wait(&self.unstall, unstalled);
            }
        }
        Ok(Replies {
            values: calls.iter().map(|_| Value::Int(1)).collect(),
            sent_at: sync::now(),
        })
    }
}

/// Another lock's renewal on the same node: completed once.
fn other_lock(batcher: &Arc<Batcher>, conduit: Arc<dyn Conduit>, completed: Arc<AtomicUsize>) {
    let item = Item {
        call: Call::cmd(redis::cmd("PING").arg("other")),
        cutoff: sync::now() + Duration::from_secs(3600),
        done: Box::new(move |_, _| {
            completed.fetch_add(1, SeqCst);
        }),
    };
    let queued = Batcher::submit(
        batcher,
        Arc::downgrade(&conduit),
        item,
        Duration::from_secs(1),
    );
    assert!(queued.is_ok(), "the other lock's renewal was not queued");
}

/// One renewal of `lease` as the renewal thread makes it when batching: the gate taken
/// without waiting, the extend handed to the batcher holding the ticket.
fn batched_renewal(lease: &Arc<Lease>) {
    if let Ok(Some(ticket)) = lease.try_gate_owned() {
        let submitted = lease.submit_renewal(ticket, || {});
        assert!(
            submitted.is_ok(),
            "the renewal was not handed to the batcher"
        );
    }
}

/// Another lock's renewal is sent first and stalls; our renewal is handed to the batcher
/// (queued behind the stalled batch, or in a batch of its own, or with the other one);
/// then, when `after_submit`, only once that hand-over has returned, our lock is released.
/// The release must return (a release waiting for the stalled batch deadlocks here), and
/// no renewal of ours may be sent once it closed the gate.
fn release_races_a_batched_renewal(after_submit: bool) {
    let node = Arc::new(Node::default());
    let conduit: Arc<dyn Conduit> = node.clone();
    let batcher = Arc::new(Batcher::default());
    let server = Arc::new(QueueOnly {
        batcher: batcher.clone(),
        conduit: conduit.clone(),
    });
    let lease = lease(server, TOKEN, None);
    let other_done = Arc::new(AtomicUsize::new(0));
    let submitted = Arc::new(AtomicBool::new(false));
    let other = {
        let (batcher, conduit, done) = (batcher.clone(), conduit.clone(), other_done.clone());
        thread::spawn(move || other_lock(&batcher, conduit, done))
    };
    let renewal = {
        let (lease, submitted) = (lease.clone(), submitted.clone());
        thread::spawn(move || {
            thread::yield_now();
            batched_renewal(&lease);
            submitted.store(true, SeqCst);
        })
    };
    let release = {
        let (lease, node, submitted) = (lease.clone(), node.clone(), submitted.clone());
        thread::spawn(move || {
            if after_submit {
                wait_until("the renewal handed over", || submitted.load(SeqCst));
            }
            lease.close_gate();
            node.release_done();
        })
    };
    for t in [other, renewal, release] {
        t.join().expect("a thread of the release race");
    }
    assert!(lease.gate_closed());
    wait_until("the other lock's renewal completed", || {
        other_done.load(SeqCst) > 0
    });
    assert_eq!(other_done.load(SeqCst), 1);
    assert!(node.ours_sent.load(SeqCst) <= 1);
    // The node goes: its idle batching thread exits.
    batcher.close();
}

/// A release that begins once the renewal has been handed over takes it back if it is
/// still queued (behind the stalled batch), waits for it if it is on the wire, and sends
/// none after: it never waits for the other lock's stalled batch.
#[test]
fn a_release_takes_back_a_queued_renewal_instead_of_waiting_for_a_stalled_batch() {
    explore(super::SCHEDULES, || release_races_a_batched_renewal(true));
}

/// The same, with the release at any moment of the renewal's hand-over. (Found here: a
/// release that closed the gate after the renewal thread took its ticket but before the
/// hand-over recorded the queued renewal found nothing to take back, then waited for the
/// ticket, which the renewal, queued behind the stalled batch, held until that batch ended:
/// in reality halfway to the other lock's deadline.)
#[test]
fn a_release_during_the_hand_over_does_not_wait_for_a_stalled_batch() {
    explore(super::SCHEDULES, || release_races_a_batched_renewal(false));
}
