//! Ending a blocked acquire on purpose.
//!
//! A signal never ends a call by itself (an interrupted system call is resumed with the
//! time left). Three things do end a blocked wait, each making the acquire fail with
//! [`crate::ErrorKind::Cancelled`] and leaving nothing held:
//!
//! - a [`CancelToken`] given to the acquire, cancelled from another thread;
//! - [`cancel_all`], which is async-signal-safe: a C daemon may call it from its SIGTERM
//!   handler to make every waiting thread return;
//! - an interrupt hook ([`crate::LockBuilder::on_interrupt`]), run on the waiting thread
//!   when a signal interrupts the wait and at least every [`SLICE`] while it blocks; it
//!   returns `true` to cancel. The Python package uses it so that Ctrl-C interrupts a
//!   blocked acquire.
//!
//! A waiter blocks in `poll(2)` on its socket and on one process-wide eventfd. Cancelling
//! sets a flag, then writes to the eventfd, which wakes every blocked waiter; each checks
//! its own flags and goes back to sleep if it was not the one cancelled.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Longest a cancellable wait sleeps before it checks its flags again (the fallback for a
/// wake-up lost to a race with another waiter draining the eventfd).
pub(crate) const SLICE: Duration = Duration::from_millis(200);

/// Set by [`cancel_all`], cleared by [`reset_cancel_all`].
static CANCEL_ALL: AtomicBool = AtomicBool::new(false);

/// The process-wide eventfd that wakes blocked waiters; created by the first waiter.
static WAKE_FD: OnceLock<Option<RawFd>> = OnceLock::new();

/// Cancels one acquire (or several: clone it, or give the same token to each).
///
/// Cheap to clone; `Send + Sync`. Once cancelled it stays cancelled: an acquire that may
/// wait (`acquire`, `acquire_timeout` with a wait above zero) given a cancelled token fails
/// at once with [`crate::ErrorKind::Cancelled`] without trying; `try_acquire` ignores it.
#[derive(Clone, Default)]
pub struct CancelToken {
    cancelled: Arc<AtomicBool>,
}

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// Makes every acquire waiting with this token return [`crate::ErrorKind::Cancelled`]
    /// promptly. Does not block; may be called from any thread (not from a signal
    /// handler: use [`cancel_all`] there).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        wake_all();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// Makes every acquire of this process that waits, now or later, fail with
/// [`crate::ErrorKind::Cancelled`] until [`reset_cancel_all`]; a single attempt
/// (`try_acquire`) is not affected. For shutting down: call it, then join your threads.
///
/// Async-signal-safe: it stores to an atomic and writes to an eventfd, nothing else, so a
/// signal handler may call it.
pub fn cancel_all() {
    CANCEL_ALL.store(true, Ordering::SeqCst);
    wake_all();
}

/// Undoes [`cancel_all`]: waits started from now on are not cancelled by it.
pub fn reset_cancel_all() {
    CANCEL_ALL.store(false, Ordering::SeqCst);
}

/// Wakes every blocked waiter. Async-signal-safe: `OnceLock::get` is an atomic load and
/// `write(2)` is on the async-signal-safe list.
fn wake_all() {
    if let Some(Some(fd)) = WAKE_FD.get() {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to our own eventfd; a failure (the counter
        // is saturated) means waiters are already being woken.
        let _ = unsafe { libc::write(*fd, (&one as *const u64).cast(), 8) };
    }
}

/// The eventfd blocked waiters poll on, created on first use; `None` if the OS refused one
/// (waiters then rely on [`SLICE`]).
pub(crate) fn wake_fd() -> Option<RawFd> {
    *WAKE_FD.get_or_init(|| {
        // SAFETY: eventfd(2) with valid flags; the descriptor lives for the whole process.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        (fd >= 0).then_some(fd)
    })
}

/// Empties the eventfd after a wake-up that was for another waiter, so that the next poll
/// blocks again.
pub(crate) fn drain_wake_fd() {
    if let Some(Some(fd)) = WAKE_FD.get() {
        let mut buf = 0u64;
        // SAFETY: reads at most 8 bytes into a local u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(*fd, (&mut buf as *mut u64).cast(), 8) };
    }
}

/// A function run on the waiting thread when a signal interrupts its wait; `true` cancels.
pub type InterruptHook = Arc<dyn Fn() -> bool + Send + Sync>;

/// What may end one blocking wait early.
#[derive(Clone, Default)]
pub(crate) struct Watch {
    token: Option<CancelToken>,
    hook: Option<InterruptHook>,
    /// Honours [`cancel_all`] (acquires that wait do; releases and renewals do not).
    cancel_all: bool,
}

impl Watch {
    /// A wait nothing but its deadline ends.
    pub fn none() -> Self {
        Watch::default()
    }

    /// The watch of an acquire that waits.
    pub fn waiting(token: Option<CancelToken>, hook: Option<InterruptHook>) -> Self {
        Watch {
            token,
            hook,
            cancel_all: true,
        }
    }

    /// The watch of a single attempt: only its own token or hook, if any, may end its
    /// round trip (not [`cancel_all`]).
    pub fn attempt(token: Option<CancelToken>, hook: Option<InterruptHook>) -> Self {
        Watch {
            token,
            hook,
            cancel_all: false,
        }
    }

    /// Whether anything can cancel this wait (then it polls the eventfd and wakes every
    /// [`SLICE`]).
    pub fn is_active(&self) -> bool {
        self.cancel_all || self.token.is_some() || self.hook.is_some()
    }

    /// Whether the wait was cancelled by a token or [`cancel_all`].
    pub fn cancelled(&self) -> bool {
        (self.cancel_all && CANCEL_ALL.load(Ordering::SeqCst))
            || self.token.as_ref().is_some_and(CancelToken::is_cancelled)
    }

    /// Runs the interrupt hook (after `EINTR`, or at a slice's end); `true` cancels. A
    /// panicking hook is taken as "do not cancel"; one that returns in a child forked
    /// inside it cancels there, before the wait touches its parent's socket again.
    pub fn interrupted(&self) -> bool {
        match &self.hook {
            Some(hook) => {
                let call = std::panic::AssertUnwindSafe(|| crate::process::call_out(|| hook()));
                std::panic::catch_unwind(call).unwrap_or(false) || crate::process::orphaned()
            }
            None => false,
        }
    }
}
