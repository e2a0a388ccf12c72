//! `redlease run`: hold a lock while a command runs.
//!
//! The main thread acquires, spawns the child (it must be the main thread: the child's
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked it ends, and the main thread
//! lives as long as the process), then waits on three things at once: the child's end
//! (seen by a thread with `waitid(WNOWAIT)`, which leaves the child unreaped so that its
//! pid cannot be reused while we may still signal it), the lock's lost channel, and the
//! signals received by [`Signals`]. When the child ends it is reaped and the lock
//! released.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, never, select};
use redlease::{Client, ErrorKind, LockGuard, LostReason};

use crate::duration::{self, Wait};
use crate::signals::{self, Signals};
use crate::text::{printable, warn};
use crate::{Fail, Outcome, RunArgs, exit};

/// What to do to the child when the lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLost {
    /// Send SIGTERM (then SIGKILL after --kill-after, if given).
    Term,
    /// Send SIGKILL.
    Kill,
    /// Let the command go on; `redlease` still exits with the lost status.
    Ignore,
}

pub fn run(args: RunArgs, connect: impl FnOnce() -> Result<Client, Fail>) -> Outcome {
    if args.fence_env.is_empty() || args.fence_env.contains(['=', '\0']) {
        return Err(Fail::usage(format!(
            "--fence-env {:?} is not a usable environment variable name",
            args.fence_env
        )));
    }
    // Children must be waitable: a SIGCHLD ignored by whoever started us would have them
    // reaped by the kernel, and their exit status lost.
    // SAFETY: restoring the default disposition of SIGCHLD; no handler is involved.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    // Before any thread exists (the library starts its threads on first use).
    let signals = Signals::start()
        .map_err(|e| Fail::new(exit::OSERR, format!("cannot set up signal handling: {e}")))?;
    let client = connect()?;
    let name = args.name.as_str();

    let builder = if let Some(permits) = args.permits {
        client.semaphore(name, permits)
    } else if args.shared {
        client.rwlock(name).read()
    } else if args.exclusive {
        client.rwlock(name).write()
    } else {
        client.lock(name)
    };
    let builder = builder
        .ttl(args.ttl)
        .renew(true)
        .cancel_token(&signals.cancel);
    let progress = args.wait != Wait::No && !args.quiet && stderr_is_a_terminal();
    let acquired = std::thread::scope(|scope| {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        if progress {
            let client = &client;
            scope.spawn(move || show_progress(client, name, &stopped));
        }
        let acquired = match args.wait {
            Wait::No => builder.try_acquire(),
            Wait::UpTo(d) => builder.acquire_timeout(d),
            Wait::Forever => builder.acquire(),
        };
        drop(stop);
        acquired
    });
    let guard = match acquired {
        Ok(guard) => guard,
        // A signal during a single attempt (which only its own timeouts end) counts once
        // the attempt has: the run stops as if it had come during a wait.
        Err(e) if e.kind() != ErrorKind::Cancelled && signals.stopped_by().is_some() => {
            let signo = signals.stopped_by().unwrap_or(libc::SIGTERM);
            warn(&format!(
                "interrupted by SIG{} while acquiring lock {name:?} ({e}); not running the \
                 command",
                signals::name(signo)
            ));
            return Ok(128 + signo);
        }
        Err(e) if e.kind() == ErrorKind::Busy => {
            if !args.quiet {
                let held_by = client
                    .inspect(name)
                    .ok()
                    .map(|info| crate::inspect::holder_cell(&info))
                    .filter(|h| h != "-")
                    .map(|h| format!(" (held by {h})"))
                    .unwrap_or_default();
                let waited = match args.wait {
                    Wait::UpTo(d) => format!(" after waiting {}", duration::show(d)),
                    _ => String::new(),
                };
                warn(&format!(
                    "lock {name:?} is busy{held_by}{waited}; not running the command"
                ));
            }
            return Ok(i32::from(args.busy_exit));
        }
        Err(e) if e.kind() == ErrorKind::Cancelled => {
            let signo = signals.stopped_by().unwrap_or(libc::SIGTERM);
            warn(&format!(
                "interrupted by SIG{} while waiting for lock {name:?}; not running the command",
                signals::name(signo)
            ));
            return Ok(128 + signo);
        }
        Err(e) => {
            return Err(Fail::from_error(
                &e,
                &client,
                &format!("acquiring lock {name:?}"),
            ));
        }
    };
    if args.verbose {
        warn(&format!(
            "acquired lock {:?} (fencing token {}, ttl {}, renewed every {})",
            guard.key(),
            guard.fencing_token(),
            duration::show(args.ttl),
            duration::show(args.ttl / 3)
        ));
    }
    if let Some(signo) = signals.stopped_by() {
        release(guard, name, args.verbose);
        warn(&format!(
            "interrupted by SIG{} before the command started; lock {name:?} released",
            signals::name(signo)
        ));
        return Ok(128 + signo);
    }

    let mutex = args.permits.is_none() && !args.shared && !args.exclusive;
    let mut child = match spawn(&args.command, &args.fence_env, &guard, mutex, &signals) {
        Ok(child) => child,
        Err(e) => {
            release(guard, name, args.verbose);
            let program = printable(&args.command[0].to_string_lossy());
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            return Err(Fail::new(code, format!("cannot run {program:?}: {e}")));
        }
    };
    signals.command_started();
    let pid = child.id() as libc::pid_t;
    let ended = watch_exit(pid);
    let mut lost = supervise(&args, name, pid, &ended, &guard, &signals);
    let status = reap(&mut child)?;
    if lost.is_none() {
        // Lost as the command ended, or unnoticed until the release found the key changed.
        let late = guard.lost_reason();
        let released = release(guard, name, args.verbose);
        if let Some(reason) = late.or((!released).then_some(LostReason::NotHeld)) {
            lost = Some(reason);
            warn(&format!(
                "lock {name:?} was lost before the command ended ({reason}): part of the command ran unprotected"
            ));
        }
    } else {
        release(guard, name, false);
    }
    let code = status_code(status);
    match lost {
        Some(_) => {
            warn(&format!(
                "the command {} after lock {name:?} was lost; exiting {}",
                describe(status),
                args.lost_exit
            ));
            Ok(i32::from(args.lost_exit))
        }
        None => Ok(code),
    }
}

/// Spawns the command with the fencing token in its environment, tied to our life.
fn spawn(
    command: &[OsString],
    fence_env: &str,
    guard: &LockGuard,
    mutex: bool,
    signals: &Signals,
) -> std::io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env(fence_env, guard.fencing_token().to_string());
    // Only a mutex can be adopted (extend/release --token): a permit's or a reader's token
    // would be of no use to the command.
    if mutex {
        cmd.env("REDLEASE_TOKEN", guard.token());
    } else {
        cmd.env_remove("REDLEASE_TOKEN");
    }
    let parent = std::process::id() as libc::pid_t;
    let mask = signals.original_mask;
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe system calls (prctl, getppid, kill, getpid, pthread_sigmask, which
    // is sigprocmask in a single-threaded child); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // SIGKILL when our (forking) thread ends, SIGKILL of redlease included: the
            // command must not run on after the lock can no longer be renewed.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // redlease died between fork and prctl: nobody will signal us, so stop here.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            // The child gets the signal mask redlease started with, not the one blocking
            // the signals redlease receives on its thread.
            let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A channel that fires once the child `pid` has ended, without reaping it.
fn watch_exit(pid: libc::pid_t) -> Receiver<()> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("child-exit".into())
        .spawn(move || {
            loop {
                // SAFETY: waitid writes a siginfo_t into `info`; WNOWAIT leaves the child
                // waitable, so the main thread reaps it with Child::wait.
                let rc = unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    libc::waitid(
                        libc::P_PID,
                        pid as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOWAIT,
                    )
                };
                if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break;
                }
            }
            let _ = tx.send(());
        })
        .map(drop)
        .unwrap_or_else(|e| {
            // Without the thread we cannot tell when the child ends: stop it rather than
            // run it unsupervised.
            warn(&format!("cannot start a thread ({e}); killing the command"));
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
    rx
}

/// Waits for the child to end, forwarding signals and acting on a loss of the lock.
/// Returns why the lock was lost, if it was.
fn supervise(
    args: &RunArgs,
    name: &str,
    pid: libc::pid_t,
    ended: &Receiver<()>,
    guard: &LockGuard,
    signals: &Signals,
) -> Option<LostReason> {
    let mut lost_rx = guard.lost();
    let mut lost = None;
    let mut kill_at: Option<Instant> = None;
    // SAFETY: getpgrp and getpgid only read process attributes.
    let same_group = unsafe { libc::getpgid(pid) == libc::getpgrp() };
    let send = |signo: i32| {
        // SAFETY: kill(2) on our own child, which is not reaped before this loop ends, so
        // the pid cannot have been reused.
        unsafe { libc::kill(pid, signo) };
    };
    loop {
        let timeout = kill_at.map_or(Duration::from_secs(3600), |at| {
            at.saturating_duration_since(Instant::now())
        });
        select! {
            recv(ended) -> _ => return lost,
            recv(lost_rx) -> reason => match reason {
                Ok(reason) => {
                    lost = Some(reason);
                    let action = match args.on_lost {
                        OnLost::Term => "sending SIGTERM to the command",
                        OnLost::Kill => "sending SIGKILL to the command",
                        OnLost::Ignore => "letting the command go on (--on-lost ignore)",
                    };
                    warn(&format!("lock {name:?} lost while the command ran ({reason}); {action} (pid {pid})"));
                    match args.on_lost {
                        OnLost::Term => {
                            send(libc::SIGTERM);
                            kill_at = args.kill_after.map(|d| Instant::now() + d);
                        }
                        OnLost::Kill => send(libc::SIGKILL),
                        OnLost::Ignore => {}
                    }
                    lost_rx = never();
                }
                Err(_) => lost_rx = never(),
            },
            recv(signals.received) -> caught => if let Ok(caught) = caught {
                if signals::to_forward(&caught, same_group) {
                    send(caught.signo);
                }
            },
            default(timeout) => {
                if kill_at.is_some_and(|at| Instant::now() >= at) {
                    warn(&format!("the command (pid {pid}) outlived --kill-after; sending SIGKILL"));
                    send(libc::SIGKILL);
                    kill_at = None;
                }
            }
        }
    }
}

fn reap(child: &mut Child) -> Result<ExitStatus, Fail> {
    child
        .wait()
        .map_err(|e| Fail::new(exit::OSERR, format!("waiting for the command: {e}")))
}

/// Releases the lock; false when the key no longer held our token (the lock had been
/// lost). Other failures are reported and count as released: the lock expires within its
/// ttl.
fn stderr_is_a_terminal() -> bool {
    // SAFETY: isatty only looks at the descriptor.
    unsafe { libc::isatty(libc::STDERR_FILENO) == 1 }
}

/// While the acquire waits (until `stopped` is disconnected), says on one line of the
/// terminal, rewritten every second, who holds the lock and how long the wait has lasted;
/// clears the line at the end.
fn show_progress(client: &Client, name: &str, stopped: &Receiver<()>) {
    use std::io::Write as _;
    let started = Instant::now();
    let mut shown = false;
    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
        stopped.recv_timeout(Duration::from_secs(1))
    {
        let holder = client
            .inspect(name)
            .ok()
            .map(|info| crate::inspect::holder_cell(&info))
            .filter(|h| h != "-")
            .map(|h| format!(" held by {h}"))
            .unwrap_or_default();
        let line = format!(
            "\r\x1b[Kredlease: waiting for lock {}{holder}: {}",
            printable(name),
            duration::show(started.elapsed())
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        shown = true;
    }
    if shown {
        let _ = std::io::stderr().lock().write_all(b"\r\x1b[K");
    }
}

fn release(guard: LockGuard, name: &str, verbose: bool) -> bool {
    match guard.release() {
        Ok(()) => {
            if verbose {
                warn(&format!("released lock {name:?}"));
            }
            true
        }
        Err(e) if e.kind() == ErrorKind::NotHeld => false,
        Err(e) => {
            warn(&format!(
                "could not release lock {name:?} (it expires within its ttl): {e}"
            ));
            true
        }
    }
}

/// The exit status a shell would give: the code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signo)) => 128 + signo,
        (None, None) => exit::SOFTWARE,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signo)) => format!("was killed by SIG{}", signals::name(signo)),
        (None, None) => "ended".to_owned(),
    }
}
