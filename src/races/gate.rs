//! The lease gate ([`crate::lease::gate`]): extends (`enter`), renewals (`enter`, and
//! `try_enter_owned` for a batched one whose ticket travels to the batching thread) and
//! releases (`begin_close`, `close`) from several threads at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use super::explore;
use crate::lease::gate::Gate;
use crate::sync::{Arc, thread};

/// What the threads saw. Plain std atomics: the checks add no scheduling points of their
/// own.
#[derive(Default)]
struct Seen {
    /// Extends and renewals inside the gate right now.
    inside: AtomicUsize,
    /// A `close()` has returned.
    closed: AtomicBool,
    /// Extends and renewals that got in.
    entered: AtomicUsize,
}

impl Seen {
    /// One extend or renewal, with the gate taken: nobody else inside, no close returned.
    fn inside_the_gate(&self) {
        assert!(
            !self.closed.load(SeqCst),
            "an extend or renewal got through the gate after close() returned"
        );
        assert_eq!(
            self.inside.fetch_add(1, SeqCst),
            0,
            "two extends or renewals inside the gate at once"
        );
        self.entered.fetch_add(1, SeqCst);
        // The request in flight: the others run meanwhile.
        thread::yield_now();
        self.inside.fetch_sub(1, SeqCst);
    }

    /// A release: closes the gate, then nothing may be inside and nothing may get in.
    fn close(&self, gate: &Arc<Gate>, begin_first: bool) {
        if begin_first {
            gate.begin_close();
            thread::yield_now();
        }
        gate.close();
        assert_eq!(
            self.inside.load(SeqCst),
            0,
            "close() returned while an extend or renewal was in flight"
        );
        self.closed.store(true, SeqCst);
        assert!(gate.closed() && gate.closing());
        assert!(gate.enter().is_none(), "enter() after close()");
        assert!(
            matches!(gate.try_enter_owned(), Ok(None)),
            "try_enter_owned() after close()"
        );
    }
}

/// Two extenders, a batched renewal whose ticket is dropped on another thread (as the
/// batching thread drops it after applying the reply), and two releases (one that begins
/// closing first, as `Lease::close_gate` does, and one that closes straight away, as a
/// second release through another handle would): one at a time, none after a close
/// returned, every close waits for the one in flight, and nobody deadlocks.
#[test]
fn gate_lets_one_in_at_a_time_and_none_after_close_returned() {
    explore(super::SCHEDULES, || {
        let gate = Arc::new(Gate::new());
        let seen = Arc::new(Seen::default());
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (gate, seen) = (gate.clone(), seen.clone());
            threads.push(thread::spawn(move || {
                for _ in 0..2 {
                    match gate.enter() {
                        Some(_ticket) => seen.inside_the_gate(),
                        None => break,
                    }
                }
            }));
        }
        {
            let (gate, seen) = (gate.clone(), seen.clone());
            threads.push(thread::spawn(move || {
                for _ in 0..3 {
                    match gate.try_enter_owned() {
                        Ok(Some(ticket)) => {
                            let seen = seen.clone();
                            let batch = thread::spawn(move || {
                                seen.inside_the_gate();
                                drop(ticket);
                            });
                            batch.join().expect("the batching thread");
                        }
                        Ok(None) => break,
                        // Busy: an extend is in flight; look again later.
                        Err(()) => thread::yield_now(),
                    }
                }
            }));
        }
        for begin_first in [true, false] {
            let (gate, seen) = (gate.clone(), seen.clone());
            threads.push(thread::spawn(move || seen.close(&gate, begin_first)));
        }
        for t in threads {
            t.join().expect("a gate thread");
        }
        assert!(gate.closed());
        assert_eq!(seen.inside.load(SeqCst), 0);
    });
}

/// A ticket taken with `try_enter_owned` and held on another thread keeps a release
/// waiting until it is dropped there, however the threads interleave: the release never
/// returns while the ticket is alive.
#[test]
fn a_release_waits_for_a_ticket_held_on_another_thread() {
    explore(super::SCHEDULES, || {
        let gate = Arc::new(Gate::new());
        let Ok(Some(ticket)) = gate.try_enter_owned() else {
            panic!("a fresh gate is free");
        };
        let held = Arc::new(AtomicBool::new(true));
        let holder = {
            let held = held.clone();
            thread::spawn(move || {
                thread::yield_now();
                held.store(false, SeqCst);
                drop(ticket);
            })
        };
        let releaser = {
            let (gate, held) = (gate.clone(), held.clone());
            thread::spawn(move || {
                gate.close();
                assert!(
                    !held.load(SeqCst),
                    "close() returned while a batched renewal's ticket was alive"
                );
            })
        };
        holder.join().expect("the ticket's holder");
        releaser.join().expect("the release");
        assert!(gate.closed());
    });
}
