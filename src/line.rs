//! The runtime half of [`crate::core::line`]: one client's lines of waiters per name, and
//! the wake-ups they decide.
//!
//! A waiter in a line sleeps its pauses in `poll(2)` on an eventfd of its thread (made
//! once per thread and process, kept for the thread's life), beside the cancellation
//! eventfd; a release of the
//! client writes to the eventfd of the waiter the line names. Without an eventfd (the OS
//! refused one) the waiter is never woken early and only polls, as it would without the
//! line.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::cancel::Watch;
use crate::connection;
use crate::core::line::Line;
use crate::error::Result;
use crate::process;
use crate::sync::{self, Arc, Mutex, MutexGuard};

/// The lines of one client, by lock key.
#[derive(Default)]
pub(crate) struct Lines {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lines: HashMap<String, Line<u64>>,
    /// Each waiter's way to be woken, while it is in a line.
    wakers: HashMap<u64, Arc<Waker>>,
    next_id: u64,
    /// The process the waiters belong to; a forked child starts with no line.
    process: u64,
}

impl Lines {
    fn state(&self) -> MutexGuard<'_, State> {
        let mut state = sync::lock(&self.state);
        let current = process::generation();
        if state.process != current {
            // A forked child: the waiters are its parent's threads.
            state.lines.clear();
            state.wakers.clear();
            state.process = current;
        }
        state
    }

    /// The calling thread joins the line of `key`, until the returned place is dropped.
    pub fn join(&self, key: &str) -> Place<'_> {
        let waker = thread_waker();
        if let Some(w) = &waker {
            // A wake-up meant for an earlier wait of this thread must not cut this one short.
            w.drain();
        }
        let mut state = self.state();
        state.next_id += 1;
        let id = state.next_id;
        let behind = state.lines.entry(key.to_owned()).or_default().join(id);
        if let Some(w) = &waker {
            state.wakers.insert(id, w.clone());
        }
        Place {
            lines: self,
            key: key.to_owned(),
            id,
            behind,
            waker,
            took: false,
        }
    }

    /// This client released the lock `key`: the first waiter of its line, if any, tries
    /// now.
    pub fn released(&self, key: &str) {
        let waker = {
            let mut state = self.state();
            let woken = state.lines.get_mut(key).and_then(Line::released);
            woken.and_then(|id| state.wakers.get(&id).cloned())
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn leave(&self, key: &str, id: u64, took: bool) {
        let waker = {
            let mut state = self.state();
            state.wakers.remove(&id);
            let Some(line) = state.lines.get_mut(key) else {
                return;
            };
            let next = line.leave(id, took);
            if line.is_empty() {
                state.lines.remove(key);
            }
            next.and_then(|id| state.wakers.get(&id).cloned())
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A waiter's place in a line; leaving it (dropping it) passes on a wake-up it did not
/// use.
pub(crate) struct Place<'a> {
    lines: &'a Lines,
    key: String,
    id: u64,
    /// Others of this process were waiting for the name when it joined.
    pub behind: bool,
    waker: Option<Arc<Waker>>,
    took: bool,
}

impl Place<'_> {
    /// Sleeps for `duration`, ending early when the line wakes this waiter (`Ok`) or when
    /// `watch` cancels ([`crate::ErrorKind::Cancelled`]).
    pub fn pause(&self, duration: Duration, watch: &Watch) -> Result<()> {
        match &self.waker {
            Some(w) => {
                connection::pause_or_ready(duration, w.fd.as_raw_fd(), watch)?;
                w.drain();
                Ok(())
            }
            None => connection::pause(duration, watch),
        }
    }

    /// The waiter leaves with the lock.
    pub fn took(&mut self) {
        self.took = true;
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.lines.leave(&self.key, self.id, self.took);
    }
}

/// An eventfd that wakes one thread.
struct Waker {
    fd: OwnedFd,
}

impl Waker {
    fn new() -> Option<Waker> {
        // SAFETY: eventfd(2) with valid flags; the descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a descriptor eventfd just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Some(Waker { fd })
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to an eventfd this value owns (kept open
        // by the `Arc` the caller holds); a full counter means a wake-up is pending anyway.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut buf = 0u64;
        // SAFETY: reads at most 8 bytes into a local u64 from a non-blocking eventfd this
        // value owns.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
    }
}

thread_local! {
    /// This thread's waker, made on its first wait in a line, and the process generation
    /// it was made in (a forked child shares its parent's eventfd: it makes its own).
    static WAKER: std::cell::RefCell<Option<(u64, Arc<Waker>)>> =
        const { std::cell::RefCell::new(None) };
}

fn thread_waker() -> Option<Arc<Waker>> {
    let generation = process::generation();
    WAKER
        .try_with(|cell| {
            let mut cell = cell.borrow_mut();
            match cell.as_ref() {
                Some((of, waker)) if *of == generation => Some(waker.clone()),
                _ => {
                    let waker = Arc::new(Waker::new()?);
                    *cell = Some((generation, waker.clone()));
                    Some(waker)
                }
            }
        })
        .ok()
        .flatten()
}
