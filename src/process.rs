//! Which process we are in, cheaply: a counter of `fork()`s seen in this address space.
//!
//! Locks, pooled connections and renewal threads belong to the process that made them; a
//! forked child must not use them. Comparing `getpid()` on every call would cost a system
//! call each time, so a `pthread_atfork` child handler bumps a counter instead.

use std::any::Any;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

static FORKS: AtomicU64 = AtomicU64::new(0);

/// Whether the fork handlers are registered: [`UNREGISTERED`], [`REGISTERING`] (by one
/// thread, which others do not wait for: a child forked meanwhile would wait for ever, as
/// it would for a `Once` left running) or [`REGISTERED`].
static HANDLERS: AtomicU8 = AtomicU8::new(UNREGISTERED);
const UNREGISTERED: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

/// The library's global locks, held by the forking thread from just before `fork()` to
/// just after it, in the parent and in the child (see [`before_fork`]). Not a
/// thread-local: a thread may fork from a thread-local destructor, after the library's
/// thread-locals are gone.
static HELD_FOR_FORK: std::sync::Mutex<Vec<HeldForFork>> = std::sync::Mutex::new(Vec::new());

/// A guard of one of the library's global locks, between the fork handlers.
struct HeldForFork(#[allow(dead_code)] Box<dyn Any>);

// SAFETY: a guard is taken and given back by the same thread, the forking one: the
// prepare handler takes it, the parent or child handler of the same fork (on the same
// thread) drops it. The registry's lock is held from the first to the last, so a second
// thread's fork waits for it in its prepare handler, holding nothing: it never finds (or
// drops) the first one's guards.
unsafe impl Send for HeldForFork {}

/// Takes the library's global locks (the registry of them first, then the C ABI's handle
/// tables, the parked renewal threads, the log route) before `fork()`, so that the child
/// never starts with one of them locked by a thread it does not have: its calls (on its
/// parent's handles, which report `LOCK_NOT_HELD`, or on a new client), its own forks and
/// registrations would wait for ever. Another thread that forks meanwhile waits for the
/// registry, holding none of them. None of the locks is held while the caller's code runs,
/// and none is taken while another is held, so this cannot deadlock with a thread of the
/// library.
extern "C" fn before_fork() {
    let holds = HOLDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut held: Vec<HeldForFork> = holds
        .iter()
        .flat_map(|hold| hold())
        .map(HeldForFork)
        .collect();
    // The registry's guard goes first: given back last.
    held.insert(0, HeldForFork(Box::new(holds)));
    held_for_fork().extend(held);
}

fn held_for_fork() -> std::sync::MutexGuard<'static, Vec<HeldForFork>> {
    HELD_FOR_FORK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What takes a global lock across `fork()`: returns its guards.
pub(crate) type Hold = fn() -> Vec<Box<dyn Any>>;

/// The global locks held across `fork()` (see [`before_fork`]), each registered once by
/// the module that owns it (a registry, so that this module imports none of them).
static HOLDS: std::sync::Mutex<Vec<Hold>> = std::sync::Mutex::new(Vec::new());

/// [`hold_across_fork`] unless `done` says it was registered already: cheap on every
/// call after the first, and never waits for another thread's registration (a `Once`
/// would, for ever in a child forked during it).
pub(crate) fn hold_across_fork_once(done: &AtomicBool, hold: Hold) {
    if !done.load(Ordering::Acquire) {
        hold_across_fork(hold);
        done.store(true, Ordering::Release);
    }
}

/// Registers `hold` to run before every `fork()` (once per function).
pub(crate) fn hold_across_fork(hold: Hold) {
    generation();
    let mut holds = HOLDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !holds.iter().any(|h| std::ptr::fn_addr_eq(*h, hold)) {
        holds.push(hold);
    }
}

/// Gives the locks of [`before_fork`] back, last taken first.
fn release_after_fork() {
    let held = std::mem::take(&mut *held_for_fork());
    for guard in held.into_iter().rev() {
        drop(guard);
    }
}

extern "C" fn in_parent_after_fork() {
    release_after_fork();
}

extern "C" fn in_child_after_fork() {
    FORKS.fetch_add(1, Ordering::SeqCst);
    release_after_fork();
}

/// Identifies the current process among this one and its forked children: equal values
/// mean the same process. A child made without the fork handlers (`_Fork()`, a raw
/// `clone`) is not told apart here: [`Process::is_current`] tells it.
pub(crate) fn generation() -> u64 {
    if HANDLERS.load(Ordering::Acquire) == UNREGISTERED
        && HANDLERS
            .compare_exchange(
                UNREGISTERED,
                REGISTERING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    {
        // SAFETY: the handlers lock and unlock the library's own mutexes (none held while
        // the caller's code runs) and touch an atomic.
        let rc = unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(in_parent_after_fork),
                Some(in_child_after_fork),
            )
        };
        if rc != 0 {
            log::error!("pthread_atfork failed ({rc}): forked children are not detected");
        }
        HANDLERS.store(REGISTERED, Ordering::Release);
    }
    FORKS.load(Ordering::SeqCst)
}

/// This process, as a lock remembers the one that acquired it: its [`generation`] and its
/// pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Process {
    generation: u64,
    pid: u32,
}

impl Process {
    /// No process: never equal to [`Process::current`].
    pub(crate) const NONE: Process = Process {
        generation: u64::MAX,
        pid: 0,
    };

    /// The calling process (one system call, `getpid`).
    pub(crate) fn current() -> Process {
        Process {
            generation: generation(),
            pid: std::process::id(),
        }
    }

    /// Whether the caller runs in this process, not in a child forked from it (also one
    /// made by `_Fork()`, which runs no fork handlers: the pid tells; one system call).
    pub(crate) fn is_current(&self) -> bool {
        self.generation == generation() && self.pid == std::process::id()
    }

    /// Whether no fork with the fork handlers came between: [`is_current`](Self::is_current)
    /// without its system call, for checks on every request (a child made by `_Fork()` is
    /// told to open clients of its own; it must not use its parent's).
    pub(crate) fn same_generation(&self) -> bool {
        self.generation == generation()
    }
}

thread_local! {
    /// Set on a thread that came back from caller code (a callback) in a process forked
    /// meanwhile: what the thread was doing for its parent must not go on in the child.
    static ORPHANED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How many calls of the library's API this thread is inside (a callback may make
    /// calls of its own inside another): see [`ApiCall`].
    static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The fork [`generation`] at the start of the thread's outermost [`ApiCall`]
    /// ([`NO_CALL`] outside any): a fork with the fork handlers anywhere inside the call
    /// (in a callback, or in the `Drop` of a closure the caller gave) changes it.
    static CALL_GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(NO_CALL) };
    /// How many pieces of caller code (see [`call_out`]) this thread is inside, within its
    /// current call: only there can a child forked meanwhile make calls of its own.
    static IN_CALLER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// [`CALL_GENERATION`] outside any call.
const NO_CALL: u64 = u64::MAX;

/// Runs `callback` (caller code: a log callback, a lost-lock handler, an interrupt hook,
/// a `user_data_free`, the drop of a closure given to the library: see [`CallerCode`])
/// and notes, on this thread, when it returns in a child forked inside it: from then on
/// [`orphaned`] is true here until the outermost [`ApiCall`] of the thread ends, and that
/// call (its parent's) sends nothing more. Inside `callback`, a child's calls are its own
/// (see [`ApiCall::enter`]). Two system calls (`getpid` before and after).
pub(crate) fn call_out<R>(callback: impl FnOnce() -> R) -> R {
    /// Counts the caller code on the thread's stack and, when it ends (also by unwinding:
    /// a hook that panicked in a child made by `_Fork()`), marks the thread if the pid
    /// changed.
    struct Inside {
        pid: u32,
    }
    impl Drop for Inside {
        fn drop(&mut self) {
            let _ = IN_CALLER.try_with(|n| n.set(n.get().saturating_sub(1)));
            if std::process::id() != self.pid {
                let _ = ORPHANED.try_with(|o| o.set(true));
            }
        }
    }
    let _ = IN_CALLER.try_with(|n| n.set(n.get().saturating_add(1)));
    let _inside = Inside {
        pid: std::process::id(),
    };
    callback()
}

/// A closure (or other value) the caller gave the library, dropped as caller code: its
/// drop runs inside [`call_out`], so that a fork there (also `_Fork()`) is seen like one
/// in a callback. Derefs to the value.
pub(crate) struct CallerCode<F: ?Sized>(std::mem::ManuallyDrop<F>);

impl<F> CallerCode<F> {
    pub(crate) fn new(value: F) -> Self {
        CallerCode(std::mem::ManuallyDrop::new(value))
    }
}

impl<F: ?Sized> std::ops::Deref for CallerCode<F> {
    type Target = F;
    fn deref(&self) -> &F {
        &self.0
    }
}

impl<F: ?Sized> Drop for CallerCode<F> {
    fn drop(&mut self) {
        // SAFETY: the value is dropped once, here, and never used after.
        call_out(|| unsafe { std::mem::ManuallyDrop::drop(&mut self.0) });
    }
}

/// Whether this thread is in a child forked during the call it is in: a callback returned
/// in a child (see [`call_out`]), or the fork generation moved since the outermost
/// [`ApiCall`] began (a fork with the fork handlers anywhere in the call, also in the
/// `Drop` of a closure the caller gave). It must send and read nothing, start no thread
/// for its parent's locks, and a renewal or batching thread ends.
pub(crate) fn orphaned() -> bool {
    ORPHANED.try_with(std::cell::Cell::get).unwrap_or(false)
        || CALL_GENERATION
            .try_with(|g| g.get() != NO_CALL && g.get() != FORKS.load(Ordering::SeqCst))
            .unwrap_or(false)
}

/// One call of the library's API on this thread (a C function, or a Rust API call that
/// may run callbacks or other calls), from its start to its end. Calls made inside it (by
/// a callback, or one API call running others: a lock set takes its names with ordinary
/// acquires) are nested; the [`orphaned`] mark lasts until the outermost ends, and a new
/// outermost call starts unmarked: what a child's thread does after its parent's call
/// failed is its own.
pub(crate) struct ApiCall {
    outermost: bool,
    /// The thread's bookkeeping of its parent's call (depth, generation, mark), when this
    /// is a child's own call made from inside it (see [`ApiCall::enter`]): put back at the
    /// end, so that the parent's call stays failed in the child.
    saved: Option<(u32, u64, bool)>,
    /// The caller code the thread was inside when this call began (a callback that made
    /// it), put back at the end: inside the call, only its own callbacks count.
    in_caller: u32,
}

impl ApiCall {
    /// Enters a call (see [`ApiCall`]).
    ///
    /// A call entered in a child forked during its parent's call is the child's own only
    /// while the caller code the fork happened in still runs (see [`call_out`]): a worker
    /// started in a callback, before it returns there. Once that code has returned, what
    /// the thread enters is its parent's call going on (a lock set taking its next name):
    /// nested in it, and failed with it.
    pub(crate) fn enter() -> ApiCall {
        let started = CALL_GENERATION
            .try_with(std::cell::Cell::get)
            .unwrap_or(NO_CALL);
        // A callback that made this call is not one of its own: a fork in it, or in one
        // around it, is no reason for what this call does next to be the child's.
        let in_caller = IN_CALLER.try_with(|n| n.replace(0)).unwrap_or(0);
        if started != NO_CALL && started != generation() && in_caller > 0 {
            let saved = (
                DEPTH.try_with(|d| d.replace(1)).unwrap_or(1),
                started,
                ORPHANED.try_with(|o| o.replace(false)).unwrap_or(false),
            );
            let _ = CALL_GENERATION.try_with(|g| g.set(generation()));
            return ApiCall {
                outermost: true,
                saved: Some(saved),
                in_caller,
            };
        }
        let depth = DEPTH
            .try_with(|d| d.replace(d.get().saturating_add(1)))
            .unwrap_or(1);
        if depth == 0 {
            let _ = ORPHANED.try_with(|o| o.set(false));
            let _ = CALL_GENERATION.try_with(|g| g.set(generation()));
        }
        ApiCall {
            outermost: depth == 0,
            saved: None,
            in_caller,
        }
    }

    /// Whether this is the thread's outermost call, and a callback forked during it: the
    /// call fails in the child (the C ABI's boundary fails it with `LOCK_ERR_INTERNAL`).
    pub(crate) fn orphaned(&self) -> bool {
        self.outermost && orphaned()
    }
}

/// Runs `body` as one [`ApiCall`]: its result, or [`orphaned_error`] when it is the
/// thread's outermost call and a callback forked during it (this is the child: what the
/// call got is its parent's).
pub(crate) fn api_call<T>(
    body: impl FnOnce() -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    let call = ApiCall::enter();
    let result = body();
    if call.orphaned() {
        drop(result);
        return Err(orphaned_error());
    }
    result
}

impl Drop for ApiCall {
    fn drop(&mut self) {
        let _ = IN_CALLER.try_with(|n| n.set(self.in_caller));
        if let Some((depth, started, orphaned)) = self.saved {
            let _ = DEPTH.try_with(|d| d.set(depth));
            let _ = CALL_GENERATION.try_with(|g| g.set(started));
            let _ = ORPHANED.try_with(|o| o.set(orphaned));
            return;
        }
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        if self.outermost {
            let _ = ORPHANED.try_with(|o| o.set(false));
            let _ = CALL_GENERATION.try_with(|g| g.set(NO_CALL));
        }
    }
}

/// Runs `spawn` (which starts a thread of the library) with every asynchronous signal
/// blocked on the calling thread, so that the new thread starts, and stays, with them
/// blocked: the program's signal handlers never run on the library's threads (where a
/// handler that forked, or that longjmp'd, would go on with a renewal in a child), and a
/// signal for the process goes to a thread of the program (also one the program reads
/// with `sigwait` or a `signalfd` after blocking it everywhere). Callbacks the library
/// runs there run with that mask too. Signals raised by a fault (`SIGSEGV`, `SIGBUS`,
/// `SIGFPE`, `SIGILL`, `SIGTRAP`, `SIGSYS`) stay unblocked. The caller's mask is back
/// when this returns; a signal that came meanwhile is delivered then.
pub(crate) fn spawn_without_signals<R>(spawn: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain data that sigfillset/sigdelset initialise; pthread_sigmask
    // reads `all` and writes `old`, both valid for the call.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for fault in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut all, fault);
        }
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0;
        let result = spawn();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        result
    }
}

/// The error of a call [`orphaned`] by a fork during it (in a callback or a drop).
pub(crate) fn orphaned_error() -> crate::error::Error {
    crate::error::Error::new(
        crate::error::ErrorKind::Internal,
        "the process forked during this call (in a log callback, lost-lock handler or \
         interrupt hook, or in the drop of a closure given to the library): the child \
         cannot carry on its parent's call, and sent nothing for it; its own next call \
         works",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `call_out` does when the callback returned in a forked child.
    fn mark() {
        ORPHANED.with(|o| o.set(true));
    }

    #[test]
    fn a_closure_given_to_the_library_is_dropped_as_caller_code() {
        struct Probe(std::sync::Arc<std::sync::atomic::AtomicU32>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let inside = IN_CALLER.with(std::cell::Cell::get);
                self.0.store(inside + 1, Ordering::SeqCst);
            }
        }
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let probe = Probe(seen.clone());
        let code = CallerCode::new(move || {
            let _ = &probe;
        });
        (*code)();
        assert_eq!(seen.load(Ordering::SeqCst), 0, "dropped early");
        drop(code);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "the drop ran outside call_out (or not at all)"
        );
        assert_eq!(IN_CALLER.with(std::cell::Cell::get), 0);
    }

    #[test]
    fn the_orphaned_mark_lasts_to_the_end_of_the_outermost_call() {
        let outer = ApiCall::enter();
        assert!(!outer.orphaned());
        mark();
        {
            // A call from a later callback, inside the marked one: it neither reports
            // the mark (its own result stands) nor ends it.
            let nested = ApiCall::enter();
            assert!(!nested.orphaned());
        }
        assert!(orphaned());
        assert!(outer.orphaned());
        drop(outer);
        assert!(!orphaned(), "the outermost call's end takes the mark");
        // A stale mark (set outside any call) does not fail the next call.
        mark();
        let next = ApiCall::enter();
        assert!(!next.orphaned());
        assert!(!orphaned());
    }
}
