//! Signals to `redlease run`, received on a thread of their own.
//!
//! The signals `run` cares about are blocked in every thread (they are blocked on the main
//! thread before any other thread exists, and threads inherit the mask), and one thread
//! takes them with `sigwaitinfo`. No handler runs asynchronously, so nothing here has to be
//! async-signal-safe: the thread may cancel the acquire's token and send on a channel. The
//! child gets the mask `redlease` started with back between fork and exec ([`Signals::original_mask`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

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
pub fn stops(signo: i32) -> bool {
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
    /// Taken before the command was known to run ([`Signals::command_started`]): sent
    /// before it existed, or while it was being started.
    pub before_command: bool,
}

/// Whether `caught`, taken from the queue once the command runs, goes on to the command
/// (`same_group`: the command is in `redlease`'s process group).
///
/// - One of the wait (or of the moment the command started) that stops `redlease` does:
///   the command must not run on after it (if it came as the command started and the
///   terminal sent it to the group, the command may get it twice, in its first instant,
///   which its default action ends anyway). USR1 and USR2 of then do not: they were not
///   for a command that did not exist.
/// - One that came while the command ran does, except one the terminal sent to the whole
///   group, which the command got already.
pub fn to_forward(caught: &Caught, same_group: bool) -> bool {
    if caught.before_command {
        stops(caught.signo)
    } else {
        !(caught.from_kernel && same_group)
    }
}

pub struct Signals {
    pub received: Receiver<Caught>,
    /// Cancelled by the first signal that stops `redlease`.
    pub cancel: CancelToken,
    /// That signal's number, 0 while none came.
    stop: Arc<AtomicI32>,
    /// The command runs (set once its process has started).
    started: Arc<AtomicBool>,
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
        let started = Arc::new(AtomicBool::new(false));
        let (thread_cancel, thread_stop, thread_started) =
            (cancel.clone(), stop.clone(), started.clone());
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
                        before_command: !thread_started.load(Ordering::SeqCst),
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
            started,
            original_mask,
        })
    }

    /// The command's process has started: signals taken from now on came while it ran
    /// (see [`to_forward`]).
    pub fn command_started(&self) {
        self.started.store(true, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn caught(signo: i32, from_kernel: bool, before_command: bool) -> Caught {
        Caught {
            signo,
            from_kernel,
            before_command,
        }
    }

    #[test]
    fn a_stop_signal_of_the_start_reaches_the_command_even_from_the_terminal() {
        for signo in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
            assert!(to_forward(&caught(signo, true, true), true));
            assert!(to_forward(&caught(signo, false, true), false));
        }
    }

    #[test]
    fn usr1_and_usr2_of_before_the_command_are_dropped() {
        for signo in [libc::SIGUSR1, libc::SIGUSR2] {
            assert!(!to_forward(&caught(signo, false, true), true));
            assert!(!to_forward(&caught(signo, false, true), false));
        }
    }

    #[test]
    fn once_the_command_runs_only_the_terminals_group_signals_are_not_sent_twice() {
        assert!(!to_forward(&caught(libc::SIGINT, true, false), true));
        assert!(to_forward(&caught(libc::SIGINT, true, false), false));
        assert!(to_forward(&caught(libc::SIGUSR1, false, false), true));
        assert!(to_forward(&caught(libc::SIGTERM, false, false), true));
    }
}
