//! The runtime half of [`crate::core::line`]: each client's lines of waiters per name, and
//! the wake-ups they decide.
//!
//! A waiter in a line sleeps its pauses in `poll(2)` on an eventfd of its own beside the
//! cancellation eventfd; a release of the client writes to the eventfd of the waiter the
//! line names. The eventfds are lent to waiters while they are in a line and kept for the
//! next ones (at most [`IDLE_WAKERS`] unused), so that descriptors follow the waiters of
//! the moment, not every thread that ever waited. Without an eventfd (the OS refused one)
//! a waiter is never woken early and only polls, as it would without the line.
//!
//! The lines of every client live in one process-wide table whose lock is held across
//! `fork()` (see [`crate::process`]): a child never finds it locked by a thread it does
//! not have, and starts with no line and no eventfd of its parent's.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::cancel::Watch;
use crate::connection;
use crate::core::line::Line;
use crate::error::Result;
use crate::process;
use crate::sync::{self, Arc, Mutex, MutexGuard};

/// Unused eventfds kept for later waiters; more are closed when their waiter leaves.
const IDLE_WAKERS: usize = 64;

/// The lines of one client (an id in the process-wide table); dropping it drops them.
pub(crate) struct Lines {
    client: u64,
}

impl Default for Lines {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Lines {
            client: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        table()
            .lines
            .retain(|(client, _), _| *client != self.client);
    }
}

/// Every client's lines, by client and lock key, and the eventfds lent to their waiters.
struct Table {
    lines: BTreeMap<(u64, String), Line<u64>>,
    /// The eventfd of each waiter in a line.
    wakers: BTreeMap<u64, Arc<Waker>>,
    /// Eventfds no waiter holds.
    idle: Vec<Arc<Waker>>,
    next_id: u64,
    /// The process the waiters belong to; a forked child starts with none.
    process: u64,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    lines: BTreeMap::new(),
    wakers: BTreeMap::new(),
    idle: Vec::new(),
    next_id: 0,
    process: 0,
});

/// The table, locked; held across `fork()`, and emptied in a forked child (its waiters
/// are its parent's threads, its eventfds its parent's too).
fn table() -> MutexGuard<'static, Table> {
    static HELD_ACROSS_FORK: AtomicBool = AtomicBool::new(false);
    process::hold_across_fork_once(&HELD_ACROSS_FORK, hold_for_fork);
    let mut table = sync::lock(&TABLE);
    let current = process::generation();
    if table.process != current {
        table.lines.clear();
        table.wakers.clear();
        table.idle.clear();
        table.process = current;
    }
    table
}

fn hold_for_fork() -> Vec<Box<dyn std::any::Any>> {
    #[cfg(not(feature = "shuttle"))]
    {
        vec![Box::new(sync::lock(&TABLE))]
    }
    #[cfg(feature = "shuttle")]
    {
        Vec::new()
    }
}

impl Lines {
    /// The calling thread joins this client's line for `key`, until the returned place
    /// is dropped.
    pub fn join(&self, key: &str) -> Place<'_> {
        let mut table = table();
        let waker = table.idle.pop().or_else(|| Waker::new().map(Arc::new));
        if let Some(w) = &waker {
            // A wake-up meant for an earlier waiter must not cut this wait short.
            w.drain();
        }
        table.next_id += 1;
        let id = table.next_id;
        let behind = table
            .lines
            .entry((self.client, key.to_owned()))
            .or_default()
            .join(id);
        if let Some(w) = &waker {
            table.wakers.insert(id, w.clone());
        }
        Place {
            lines: self,
            key: key.to_owned(),
            id,
            process: process::generation(),
            behind,
            waker,
            took: false,
        }
    }

    /// This client released the lock `key`: the first waiter of its line, if any, tries
    /// now.
    pub fn released(&self, key: &str) {
        let waker = {
            let mut table = table();
            let woken = table
                .lines
                .get_mut(&(self.client, key.to_owned()))
                .and_then(Line::released);
            woken.and_then(|id| table.wakers.get(&id).cloned())
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn leave(&self, place: &mut Place<'_>) {
        let waker = {
            let mut table = table();
            if table.process != place.process {
                // A forked child (its table is empty): the place was its parent's.
                return;
            }
            table.wakers.remove(&place.id);
            if let Some(w) = place.waker.take() {
                if table.idle.len() < IDLE_WAKERS {
                    table.idle.push(w);
                }
            }
            let line_key = (self.client, std::mem::take(&mut place.key));
            let Some(line) = table.lines.get_mut(&line_key) else {
                return;
            };
            let next = line.leave(place.id, place.took);
            if line.is_empty() {
                table.lines.remove(&line_key);
            }
            next.and_then(|id| table.wakers.get(&id).cloned())
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
    /// The process generation it joined in.
    process: u64,
    /// Others of this client were waiting for the name when it joined.
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
        let lines = self.lines;
        lines.leave(self);
    }
}

/// An eventfd that wakes the waiter it is lent to.
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Eventfds follow the waiters of the moment: a thousand waits one after another use
    /// one (a few, when other tests wait at the same time), and waiters that left give
    /// theirs back, at most [`IDLE_WAKERS`] kept; a line left empty is gone.
    #[test]
    fn eventfds_are_lent_to_waiters_and_kept_for_the_next() {
        let lines = Lines::default();
        let mut seen = BTreeSet::new();
        for _ in 0..1000 {
            let place = lines.join("k");
            seen.extend(place.waker.as_ref().map(|w| w.fd.as_raw_fd()));
        }
        assert!(!seen.is_empty() && seen.len() <= 10, "{seen:?}");
        let many: Vec<Place<'_>> = (0..100).map(|_| lines.join("k")).collect();
        assert!(!many[0].behind && many[1].behind);
        drop(many);
        assert!(table().idle.len() <= IDLE_WAKERS);
        assert!(!table().lines.contains_key(&(lines.client, "k".to_owned())));
    }

    /// The table is locked across `fork()`: a child forked while another thread holds it
    /// finds it free (the fork waits for it), not locked for ever by a thread the child
    /// does not have; and the child starts with no line of its parent's.
    #[test]
    fn a_child_forked_while_another_thread_holds_the_table_can_wait_in_a_line() {
        let lines = Lines::default();
        let parents = lines.join("k");
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _table = table();
            let _ = held_tx.send(());
            std::thread::sleep(Duration::from_millis(200));
        });
        held_rx.recv().unwrap();
        // SAFETY: the child only takes the table, joins a line and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let place = lines.join("k");
            let code = if place.behind { 2 } else { 0 };
            drop(place);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork failed");
        holder.join().unwrap();
        drop(parents);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child without blocking.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                break;
            }
            if std::time::Instant::now() >= until {
                // SAFETY: kills our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the child hung on the lines' table");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "2: the child found its parent's waiter ahead"
        );
    }
}
