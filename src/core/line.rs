//! The waiters of one process for one name, in the order they came, where the deployment
//! cannot queue them itself (Redlock: no member hands a lock over to a waiter of the
//! majority).
//!
//! Without it the waiters of a quorum lock only poll with backoff, so a thread that
//! releases and asks again at once takes the lock back before the others wake (fairness
//! near 0 among a process's threads). With it:
//!
//! - a waiter that comes while others of its process wait for the name does not try first:
//!   it sleeps for a backoff's delay, or until it is woken;
//! - a release by the process wakes the first waiter in the line at once, which then tries
//!   without finishing its backoff;
//! - a woken waiter that leaves without the lock (its wait ended, it was cancelled) passes
//!   the wake-up to the next.
//!
//! Every waiter still polls with its own backoff, so a lost or late wake-up costs time,
//! never the lock: the line decides only who tries first, never what is sent or what a
//! reply means. Waiters of other processes are not in it.
//!
//! [`Line`] is the bookkeeping, without I/O: the runtime ([`crate::acquire`]) and the
//! simulation keep one per name and carry out the wake-ups it returns.

use std::collections::VecDeque;

/// One name's waiters of this process, first come first; `W` names a waiter.
#[derive(Debug)]
pub(crate) struct Line<W> {
    waiting: VecDeque<Place<W>>,
}

#[derive(Debug)]
struct Place<W> {
    who: W,
    /// Woken by a release, and not yet gone with the lock.
    woken: bool,
}

impl<W> Default for Line<W> {
    fn default() -> Self {
        Line {
            waiting: VecDeque::new(),
        }
    }
}

impl<W: Copy + PartialEq> Line<W> {
    /// `who` joins the line; `true` when others wait ahead of it (its first attempt then
    /// waits for a wake-up or a backoff's delay).
    pub fn join(&mut self, who: W) -> bool {
        let behind = !self.waiting.is_empty();
        self.waiting.push_back(Place { who, woken: false });
        behind
    }

    /// The process released the lock: the first waiter to wake, if any.
    pub fn released(&mut self) -> Option<W> {
        let first = self.waiting.front_mut()?;
        first.woken = true;
        Some(first.who)
    }

    /// `who` leaves the line, with the lock when `took`. A woken waiter that leaves
    /// without it passes its wake-up on: the next waiter to wake, if any.
    pub fn leave(&mut self, who: W, took: bool) -> Option<W> {
        let at = self.waiting.iter().position(|p| p.who == who)?;
        let place = self.waiting.remove(at)?;
        if place.woken && !took {
            return self.released();
        }
        None
    }

    /// No waiter is left (the line may be dropped).
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_wakes_the_waiters_in_the_order_they_came() {
        let mut line = Line::default();
        assert!(!line.join(1));
        assert!(line.join(2));
        assert!(line.join(3));
        assert_eq!(line.released(), Some(1));
        assert_eq!(line.leave(1, true), None);
        assert_eq!(line.released(), Some(2));
        assert_eq!(line.leave(2, true), None);
        // The holder that asks again goes behind the one still waiting.
        assert!(line.join(1));
        assert_eq!(line.released(), Some(3));
        assert_eq!(line.leave(3, true), None);
        assert_eq!(line.released(), Some(1));
        assert_eq!(line.leave(1, true), None);
        assert!(line.is_empty());
        assert_eq!(line.released(), None);
    }

    #[test]
    fn a_woken_waiter_that_leaves_without_the_lock_passes_the_wake_up_on() {
        let mut line = Line::default();
        line.join(1);
        line.join(2);
        line.join(3);
        assert_eq!(line.released(), Some(1));
        // Its wait ended before it could try: the next is woken instead.
        assert_eq!(line.leave(1, false), Some(2));
        // A waiter that was not woken leaves without waking anyone.
        assert_eq!(line.leave(3, false), None);
        assert_eq!(line.leave(2, false), None);
        assert!(line.is_empty());
    }

    #[test]
    fn a_waiter_not_in_the_line_leaves_nothing_changed() {
        let mut line = Line::default();
        line.join(1);
        assert_eq!(line.leave(9, false), None);
        assert!(!line.is_empty());
        assert!(line.join(2));
    }
}
