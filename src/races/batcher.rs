//! The renewal batcher ([`crate::backend::batch`]): items submitted from several threads,
//! some withdrawn, the batcher closed, its thread exiting when idle and started again by
//! the next submit, all through a stand-in [`Conduit`] that answers every call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use super::{Answers, explore, wait_until};
use crate::backend::batch::{Batcher, Conduit, Item};
use crate::backend::call::Call;
use crate::sync::{self, Arc, Weak, thread, virtual_clock};

/// What became of one item.
#[derive(Default)]
struct Fate {
    completed: AtomicUsize,
    /// Its completion was dropped (run or not).
    dropped: AtomicUsize,
    withdrawn: AtomicBool,
    /// `submit` refused it (the caller then sends it on its own).
    refused: AtomicBool,
}

/// Held by an item's completion: counts its drop.
struct DropCount(Arc<Fate>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

fn item(fate: &Arc<Fate>) -> Item {
    let count = DropCount(fate.clone());
    Item {
        call: Call::cmd(&redis::cmd("PING")),
        cutoff: sync::now() + Duration::from_secs(3600),
        done: Box::new(move |_reply, _sent_at| {
            count.0.completed.fetch_add(1, SeqCst);
        }),
    }
}

/// Submits one item of `fates[i]`; withdraws it again when `withdraw`.
fn submit(batcher: &Arc<Batcher>, conduit: &Weak<dyn Conduit>, fate: &Arc<Fate>, withdraw: bool) {
    match Batcher::submit(batcher, conduit.clone(), item(fate), Duration::from_secs(1)) {
        Ok(id) => {
            if withdraw {
                thread::yield_now();
                if let Some(item) = batcher.withdraw(id) {
                    fate.withdrawn.store(true, SeqCst);
                    // Dropped unrun, as `Batching::take_back` drops it.
                    drop(item);
                }
            }
        }
        Err(_) => fate.refused.store(true, SeqCst),
    }
}

/// Whether every item is settled: completed, or dropped unrun after a withdrawal or a
/// refusal.
fn settled(fates: &[Arc<Fate>]) -> bool {
    fates.iter().all(|f| f.dropped.load(SeqCst) > 0)
}

/// Checks each item's fate once all are settled: completed exactly once unless withdrawn
/// or refused (then never), its completion dropped exactly once.
fn check(fates: &[Arc<Fate>]) {
    wait_until(
        "every item completed, or dropped unrun after a withdrawal",
        || settled(fates),
    );
    for (i, fate) in fates.iter().enumerate() {
        let completed = fate.completed.load(SeqCst);
        if fate.withdrawn.load(SeqCst) || fate.refused.load(SeqCst) {
            assert_eq!(
                completed, 0,
                "item {i} was withdrawn or refused, yet completed"
            );
        } else {
            assert_eq!(completed, 1, "item {i} completed {completed} times");
        }
        assert_eq!(
            fate.dropped.load(SeqCst),
            1,
            "item {i}'s completion dropped twice"
        );
    }
}

/// Two submitters, each withdrawing one of its two items right after submitting it,
/// racing the batching thread (started by whichever submits first, gathering, sending,
/// sleeping when idle and woken by the next submit): every item is completed exactly once,
/// unless it was withdrawn (then never), and every completion is dropped exactly once.
/// Then the node goes (its batcher closed): the idle thread is woken and exits.
#[test]
fn every_item_completes_exactly_once_unless_withdrawn() {
    explore(super::SCHEDULES, || {
        let batcher = Arc::new(Batcher::default());
        let conduit: Arc<dyn Conduit> = Arc::new(Answers);
        let weak = Arc::downgrade(&conduit);
        let fates: Arc<Vec<Arc<Fate>>> = Arc::new((0..4).map(|_| Arc::default()).collect());
        let mut threads = Vec::new();
        for first in [0, 2] {
            let (batcher, weak, fates) = (batcher.clone(), weak.clone(), fates.clone());
            threads.push(thread::spawn(move || {
                submit(&batcher, &weak, &fates[first], false);
                submit(&batcher, &weak, &fates[first + 1], true);
            }));
        }
        for t in threads {
            t.join().expect("a submitter");
        }
        check(&fates);
        batcher.close();
        drop(conduit);
    });
}

/// The node goes (`Node::drop` closes its batcher, and the batcher's thread loses the
/// node) right after its last renewals were submitted, one of them withdrawn, while the
/// batching thread gathers or sends them: each is still completed exactly once (with an
/// error once the node is gone) unless withdrawn, the thread exits, and it never keeps the
/// node alive.
#[test]
fn renewals_queued_as_their_node_goes_are_completed_once() {
    explore(super::SCHEDULES, || {
        let batcher = Arc::new(Batcher::default());
        let conduit: Arc<dyn Conduit> = Arc::new(Answers);
        let weak = Arc::downgrade(&conduit);
        let fates: Arc<Vec<Arc<Fate>>> = Arc::new((0..3).map(|_| Arc::default()).collect());
        let owner = {
            let (batcher, weak, fates) = (batcher.clone(), weak.clone(), fates.clone());
            thread::spawn(move || {
                for (i, fate) in fates.iter().enumerate() {
                    submit(&batcher, &weak, fate, i == 1);
                }
                batcher.close();
                drop(conduit);
            })
        };
        owner.join().expect("the node's owner");
        check(&fates);
        assert!(weak.upgrade().is_none(), "the batcher kept the node alive");
    });
}

/// A batching thread that idles out (every timed wait times out here, the idle one's too)
/// never leaves an item queued with no thread to serve it. (Found here: `submit` once
/// started its thread before it queued its item, and a thread that found the queue still
/// empty and idled out left the item stranded until the next submit.)
#[test]
fn a_batching_thread_that_idles_out_never_strands_an_item() {
    explore(super::SCHEDULES, || {
        virtual_clock::set_horizon(Duration::MAX);
        let batcher = Arc::new(Batcher::default());
        let conduit: Arc<dyn Conduit> = Arc::new(Answers);
        let weak = Arc::downgrade(&conduit);
        let fates: Arc<Vec<Arc<Fate>>> = Arc::new((0..2).map(|_| Arc::default()).collect());
        let submitter = {
            let (batcher, weak, fates) = (batcher.clone(), weak.clone(), fates.clone());
            thread::spawn(move || {
                for fate in fates.iter() {
                    submit(&batcher, &weak, fate, false);
                    thread::yield_now();
                }
            })
        };
        submitter.join().expect("the submitter");
        check(&fates);
        batcher.close();
        drop(conduit);
    });
}
