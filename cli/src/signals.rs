//! Signals to `redlease run`, received on a thread of their own.
//!
//! The signals `run` cares about are blocked in every thread (they are blocked on the main
//! thread before any other thread exists, and threads inherit the mask), and one thread
//! takes them with `sigwaitinfo`. No handler runs asynchronously, so nothing here has to be
//! async-signal-safe: the thread may cancel the acquire's token and send on a channel. The
//! child gets the mask `redlease` started with back between fork and exec ([`Signals::original_mask`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use crossbeam_channel::{Receiver, unbounded};
use redlease::CancelToken;

/// Signals forwarded to the child while it runs.
pub const FORWARDED: [i32; 6] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Signals that, before the child runs, stop `redlease` (cancel the wait, or do not start
/// the command). The others (USR1, USR2) are dropped until the command runs.
fn stops(signo: i32) -> bool {
    matches!(
        signo,
        libc::SIGHUP | libc::SIGINT | libc::SIGQUIT | libc::SIGTERM
    )
}

/// One signal received.
#[derive(Debug, Clone, Copy)]
pub struct Caught {
    pub signo: i32,
    /// Sent by the kernel to a whole process group (the terminal's Ctrl-C, Ctrl-\, hangup)
    /// rather than by `kill` from a process.
    pub from_kernel: bool,
}

pub struct Signals {
    pub received: Receiver<Caught>,
    /// Cancelled by the first signal that stops `redlease`.
    pub cancel: CancelToken,
    /// That signal's number, 0 while none came.
    stop: Arc<AtomicI32>,
    /// The signal mask `redlease` was started with.
    pub original_mask: libc::sigset_t,
}

/// Whether `signo` was ignored by whoever started `redlease` (`nohup`, a shell's
/// background job): such a signal is left ignored, for `redlease` and for the command
/// alike, as it would be without `redlease`.
fn inherited_ignored(signo: i32) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signo, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

impl Signals {
    /// Blocks [`FORWARDED`] in the calling thread (call it before any thread is started) and
    /// starts the thread that receives them. A signal ignored when `redlease` started is
    /// left out: it stays ignored, and the command inherits it ignored.
    pub fn start() -> std::io::Result<Signals> {
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it, and
        // pthread_sigmask writes the previous mask into a valid sigset_t.
        let (set, original_mask) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signo in FORWARDED {
                if !inherited_ignored(signo) {
                    libc::sigaddset(&mut set, signo);
                }
            }
            let mut original: libc::sigset_t = std::mem::zeroed();
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut original);
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            (set, original)
        };
        let (tx, received) = unbounded();
        let cancel = CancelToken::new();
        let stop = Arc::new(AtomicI32::new(0));
        let (thread_cancel, thread_stop) = (cancel.clone(), stop.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                loop {
                    // SAFETY: `set` is an initialised sigset_t; `info` is written by the call.
                    let (signo, info) = unsafe {
                        let mut info: libc::siginfo_t = std::mem::zeroed();
                        (libc::sigwaitinfo(&set, &mut info), info)
                    };
                    if signo < 0 {
                        continue; // EINTR (a signal outside the set): wait again
                    }
                    if stops(signo) {
                        let _ = thread_stop.compare_exchange(
                            0,
                            signo,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                        thread_cancel.cancel();
                    }
                    let caught = Caught {
                        signo,
                        from_kernel: info.si_code == libc::SI_KERNEL,
                    };
                    if tx.send(caught).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Signals {
            received,
            cancel,
            stop,
            original_mask,
        })
    }

    /// Drops the signals received so far that did not stop `redlease` (USR1, USR2): they
    /// came before the command existed, and are not for it. Returns how many.
    pub fn discard_pending(&self) -> usize {
        self.received.try_iter().count()
    }

    /// The first signal that asked `redlease` to stop, if any.
    pub fn stopped_by(&self) -> Option<i32> {
        match self.stop.load(Ordering::SeqCst) {
            0 => None,
            signo => Some(signo),
        }
    }
}

/// The signal's name without `SIG` (`TERM`), for messages.
pub fn name(signo: i32) -> String {
    let known = [
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGKILL, "KILL"),
        (libc::SIGTERM, "TERM"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGPIPE, "PIPE"),
        (libc::SIGABRT, "ABRT"),
        (libc::SIGSEGV, "SEGV"),
        (libc::SIGALRM, "ALRM"),
    ];
    known
        .iter()
        .find(|(n, _)| *n == signo)
        .map_or_else(|| signo.to_string(), |(_, name)| (*name).to_owned())
}
