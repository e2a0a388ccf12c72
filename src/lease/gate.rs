//! The gate of a lease: one extend or renewal at a time, and none after a release.
//!
//! Extends and renewals take the gate; a release closes it (waiting for the one in flight),
//! so nothing extends a lock after its release was sent. Unlike a mutex guard, an
//! [`OwnedGateTicket`] can travel to another thread: a batched renewal holds it until its
//! reply has been applied.

use crate::sync::{self, Arc, Condvar, Mutex, MutexGuard};

/// One extend or renewal at a time, and none after a release.
pub(crate) struct Gate {
    state: Mutex<GateState>,
    freed: Condvar,
}

#[derive(Default)]
struct GateState {
    busy: bool,
    closed: bool,
    /// A release waits to close the gate: nothing new may enter before it.
    closing: bool,
    /// Threads waiting for the gate (a wake-up is a system call: made only for them).
    waiting: usize,
}

impl Gate {
    pub fn new() -> Self {
        Gate {
            state: Mutex::new(GateState::default()),
            freed: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, GateState> {
        sync::lock(&self.state)
    }

    /// Waits while an extend or renewal is in flight, then takes the gate; `None` once a
    /// release closed it (or is closing it).
    pub fn enter(&self) -> Option<GateTicket<'_>> {
        let mut s = self.state();
        while s.busy && !s.closing {
            s.waiting += 1;
            s = sync::wait(&self.freed, s);
            s.waiting -= 1;
        }
        if s.closed || s.closing {
            return None;
        }
        s.busy = true;
        Some(GateTicket(self))
    }

    /// Takes the gate only if nothing is in flight: `Err(())` when busy, `Ok(None)` when
    /// closed.
    pub fn try_enter_owned(self: &Arc<Self>) -> std::result::Result<Option<OwnedGateTicket>, ()> {
        let mut s = self.state();
        if s.closed || s.closing {
            return Ok(None);
        }
        if s.busy {
            return Err(());
        }
        s.busy = true;
        Ok(Some(OwnedGateTicket(self.clone())))
    }

    fn leave(&self) {
        let mut s = self.state();
        s.busy = false;
        let wake = s.waiting > 0;
        drop(s);
        if wake {
            self.freed.notify_all();
        }
    }

    /// Lets nothing enter any more: a release is about to close the gate.
    pub fn begin_close(&self) {
        self.state().closing = true;
    }

    /// Waits while an extend or renewal is in flight, then closes the gate for good.
    pub fn close(&self) {
        let mut s = self.state();
        // From now on nothing enters: the release waits for the one in flight only.
        s.closing = true;
        while s.busy {
            s.waiting += 1;
            s = sync::wait(&self.freed, s);
            s.waiting -= 1;
        }
        s.closed = true;
    }

    /// Whether a release closed the gate.
    pub fn closed(&self) -> bool {
        self.state().closed
    }

    /// Whether a release closed the gate or is waiting to close it.
    pub fn closing(&self) -> bool {
        let s = self.state();
        s.closed || s.closing
    }
}

/// The gate, taken; given back when dropped.
pub(crate) struct GateTicket<'a>(&'a Gate);

impl Drop for GateTicket<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// As [`GateTicket`], owning the gate, so that it can travel with a batched renewal.
pub(crate) struct OwnedGateTicket(Arc<Gate>);

impl Drop for OwnedGateTicket {
    fn drop(&mut self) {
        self.0.leave();
    }
}
