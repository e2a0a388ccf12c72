//! A forked child of a process whose threads use the library: its calls on its parent's
//! handles report `LOCK_NOT_HELD` and never wait for a lock a parent's thread held at the
//! fork, a new client of its own works, and a child made without the fork handlers
//! (`_Fork()`, a raw `fork` system call) cannot release its parent's lock either.

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlease::ffi::*;

use crate::support::RedisServer;

fn open(url: &str) -> lock_client_t {
    let url = CString::new(url).unwrap();
    let mut client: lock_client_t = 0;
    // SAFETY: a NUL-terminated URL and a valid out-pointer.
    let rc = unsafe { lock_client_open(url.as_ptr(), &mut client) };
    assert_eq!(rc, LOCK_OK);
    client
}

fn acquire(client: lock_client_t, name: &str) -> lock_t {
    let name = CString::new(name).unwrap();
    let mut lock: lock_t = 0;
    // SAFETY: a NUL-terminated name and a valid out-pointer.
    let rc = unsafe { lock_acquire(client, name.as_ptr(), 30_000, 0, &mut lock) };
    assert_eq!(rc, LOCK_OK);
    lock
}

/// Waits up to 10 s for `pid` to exit; its exit status, or `None` (then killed) if it hung.
fn exit_status(pid: libc::pid_t) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    while Instant::now() < deadline {
        // SAFETY: waitpid on our own child, writing into a local.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill and reap our own hung child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    None
}

/// Forks while two threads keep calling into the library on a held lock; each child
/// releases the parent's handle (must be `LOCK_NOT_HELD`), then takes and releases a lock
/// of a new client of its own. No child may hang.
#[test]
fn a_child_forked_while_threads_use_the_library_neither_hangs_nor_holds() {
    let server = RedisServer::start();
    let url = server.url();
    let client = open(&url);
    let lock = acquire(client, "fork:held");
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (mut held, mut fence) = (false, 0u64);
                    // SAFETY: valid out-pointers.
                    unsafe {
                        lock_is_held(lock, &mut held);
                        lock_fencing_token(lock, &mut fence);
                    }
                }
            })
        })
        .collect();
    let child_url = CString::new(url.clone()).unwrap();
    let child_name = CString::new("fork:child").unwrap();
    for _ in 0..100 {
        // SAFETY: the child calls only the library and _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above; pointers are to memory copied from the parent.
            unsafe {
                let code = if lock_release(lock) != LOCK_NOT_HELD {
                    1
                } else {
                    let (mut own, mut taken) = (0, 0);
                    if lock_client_open(child_url.as_ptr(), &mut own) != LOCK_OK
                        || lock_acquire(own, child_name.as_ptr(), 30_000, 0, &mut taken) != LOCK_OK
                        || lock_release(taken) != LOCK_OK
                    {
                        2
                    } else {
                        0
                    }
                };
                libc::_exit(code);
            }
        }
        assert!(pid > 0, "fork failed");
        assert_eq!(exit_status(pid), Some(0), "the child hung or failed");
    }
    stop.store(true, Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert_eq!(server.cmd::<i64>(&["EXISTS", "fork:held"]), 1);
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(lock_client_close(client), LOCK_OK);
}

/// A child made by the `fork` system call itself, which runs no fork handlers (as glibc's
/// `_Fork()`), still cannot release its parent's lock: the pid tells it apart.
#[test]
fn a_child_forked_without_the_fork_handlers_cannot_release_its_parents_lock() {
    let server = RedisServer::start();
    let client = open(&server.url());
    let lock = acquire(client, "fork:raw");
    // SAFETY: a raw fork; the child calls only the library and _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::_exit(if lock_release(lock) == LOCK_NOT_HELD {
                0
            } else {
                1
            })
        }
    }
    assert!(pid > 0, "fork failed");
    assert_eq!(exit_status(pid), Some(0), "the child released or hung");
    assert_eq!(server.cmd::<i64>(&["EXISTS", "fork:raw"]), 1);
    assert_eq!(lock_release(lock), LOCK_OK);
    assert_eq!(lock_client_close(client), LOCK_OK);
}
