//! Loss reporting ([`crate::lease::loss`], and `Lease::mark_lost`, `notify_lost`,
//! `add_on_lost`, `forget_on_lost`, `subscribe`): a loss found while holds of a reentrant
//! lock are released and added, and while others subscribe.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use super::{Answers, QueueOnly, explore, lease};
use crate::backend::batch::Batcher;
use crate::core::lease::LostReason;
use crate::lease::loss::LostCallback;
use crate::sync::{Arc, thread};

/// What happened, in order. A std mutex: held for a push, never across a scheduling point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// `forget_on_lost(hold)` returned: the hold's release has taken its callback out.
    Forgot(usize),
    /// A loss is about to be declared.
    Declaring,
    /// The hold's callback began.
    Called(usize),
}

#[derive(Default)]
struct Log {
    events: StdMutex<Vec<Event>>,
    calls: [AtomicUsize; HOLDS],
    /// Drops of each hold's callback: where the C ABI calls `user_data_free`.
    drops: [AtomicUsize; HOLDS],
}

impl Log {
    fn push(&self, event: Event) {
        self.events.lock().expect("the event log").push(event);
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().expect("the event log").clone()
    }

    fn position(&self, event: Event) -> Option<usize> {
        self.events().iter().position(|e| *e == event)
    }
}

/// The holds: 0 the acquire's (its callback given to the lease when it was made), 1 and 2
/// later holds of a reentrant lock that share the lease.
const HOLDS: usize = 3;

fn token(hold: usize) -> String {
    format!("hold-{hold}")
}

/// Dropped with a hold's callback: counts the drop.
struct DropCount(Arc<Log>, usize);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.drops[self.1].fetch_add(1, SeqCst);
    }
}

fn callback(log: &Arc<Log>, hold: usize) -> LostCallback {
    let count = DropCount(log.clone(), hold);
    Arc::new(move |_reason| {
        let log = &count.0;
        log.push(Event::Called(hold));
        log.calls[hold].fetch_add(1, SeqCst);
        // The callback runs a while: the others go on meanwhile.
        thread::yield_now();
    })
}

/// The scenario: a loss is found (under the gate, then told), while hold 0
/// is released, hold 1 is added and then released, hold 2 is added and kept, a
/// subscriber subscribes, and a second reporter (the renewal thread, finding the loss a
/// batched renewal declared) tells the holder too. Returns the log once every thread is
/// done and the lease is dropped, with the subscriber's count of messages.
fn loss_races_releases() -> (Arc<Log>, usize) {
    let log = Arc::new(Log::default());
    let server = Arc::new(QueueOnly {
        batcher: Arc::new(Batcher::default()),
        conduit: Arc::new(Answers),
    });
    let lease = lease(server, &token(0), Some((token(0), callback(&log, 0))));
    let mut threads = Vec::new();
    {
        let (lease, log) = (lease.clone(), log.clone());
        threads.push(thread::spawn(move || {
            log.push(Event::Declaring);
            lease.mark_lost(LostReason::NotHeld);
        }));
    }
    {
        let lease = lease.clone();
        threads.push(thread::spawn(move || lease.notify_lost()));
    }
    {
        let (lease, log) = (lease.clone(), log.clone());
        threads.push(thread::spawn(move || {
            lease.forget_on_lost(&token(0));
            log.push(Event::Forgot(0));
        }));
    }
    {
        let (lease, log) = (lease.clone(), log.clone());
        threads.push(thread::spawn(move || {
            lease.add_on_lost(&token(1), callback(&log, 1));
            thread::yield_now();
            lease.forget_on_lost(&token(1));
            log.push(Event::Forgot(1));
        }));
    }
    {
        let (lease, log) = (lease.clone(), log.clone());
        threads.push(thread::spawn(move || {
            lease.add_on_lost(&token(2), callback(&log, 2))
        }));
    }
    let subscriber = {
        let lease = lease.clone();
        thread::spawn(move || lease.subscribe())
    };
    for t in threads {
        t.join().expect("a loss thread");
    }
    let lost = subscriber.join().expect("the subscriber");
    // Every thread is done: what is not in the lease any more has been dropped.
    for hold in 0..HOLDS {
        let forgotten = log.position(Event::Forgot(hold)).is_some();
        let called = log.calls[hold].load(SeqCst) > 0;
        if forgotten || called {
            assert_eq!(
                log.drops[hold].load(SeqCst),
                1,
                "hold {hold}'s callback (forgotten: {forgotten}, called: {called}) was not \
                 dropped exactly once by the time the threads were done"
            );
        }
    }
    drop(lease);
    (log, lost.try_iter().count())
}

/// A hold whose release took its callback out before the loss was found is never told of
/// it; every callback runs at most once, and the kept hold (2) exactly once; each is
/// dropped exactly once (the C ABI's `user_data_free`); the subscriber is told exactly
/// once.
#[test]
fn a_hold_released_before_a_loss_is_never_told_and_each_is_told_once() {
    explore(super::SCHEDULES, || {
        let (log, told) = loss_races_releases();
        let events = log.events();
        let declaring = log
            .position(Event::Declaring)
            .expect("the loss was declared");
        for hold in 0..HOLDS {
            let calls = log.calls[hold].load(SeqCst);
            assert!(calls <= 1, "hold {hold}'s callback ran {calls} times");
            if let Some(forgot) = log.position(Event::Forgot(hold)) {
                if forgot < declaring {
                    assert_eq!(
                        calls, 0,
                        "hold {hold} was released before the loss was found, yet told: {events:?}"
                    );
                }
            }
            assert_eq!(
                log.drops[hold].load(SeqCst),
                1,
                "hold {hold}'s callback dropped {} times",
                log.drops[hold].load(SeqCst)
            );
        }
        assert_eq!(log.calls[2].load(SeqCst), 1, "the kept hold was not told");
        assert_eq!(told, 1, "the subscriber was told {told} times");
    });
}
