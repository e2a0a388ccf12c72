//! Lock tokens: UUIDv4 values drawn from the operating system's CSPRNG.
//!
//! Bytes are fetched from the OS (`getrandom(2)`) a page at a time and used once each, so a
//! token costs no system call but `getpid`. A forked child discards the buffer it inherited
//! (also one made by `_Fork()` or a raw `clone`, which run no fork handlers: the pid tells),
//! so parent and child never hand out the same token.

use std::cell::RefCell;

use crate::process;

const BATCH: usize = 4096;

struct Pool {
    bytes: [u8; BATCH],
    used: usize,
    /// The process the bytes were drawn in (none yet: `None`).
    process: Option<process::Process>,
}

thread_local! {
    static RANDOM: RefCell<Pool> = const {
        RefCell::new(Pool { bytes: [0; BATCH], used: BATCH, process: None })
    };
}

/// 16 fresh random bytes from the OS CSPRNG.
fn random_16() -> [u8; 16] {
    RANDOM
        .try_with(|pool| {
            let mut pool = pool.borrow_mut();
            let current = process::Process::current();
            if pool.used + 16 > BATCH || pool.process != Some(current) {
                fill(&mut pool.bytes);
                pool.used = 0;
                pool.process = Some(current);
            }
            let mut out = [0u8; 16];
            out.copy_from_slice(&pool.bytes[pool.used..pool.used + 16]);
            pool.used += 16;
            out
        })
        .unwrap_or_else(|_| *uuid::Uuid::new_v4().as_bytes())
}

fn fill(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the remaining length into our own buffer.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No getrandom(2) (very old kernels): the uuid crate's own source.
            for chunk in buf[filled..].chunks_mut(16) {
                let bytes = *uuid::Uuid::new_v4().as_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            return;
        }
    }
}

/// A fresh token: a UUIDv4 (122 random bits, hyphenated), then `:` and `label`.
pub(crate) fn new_token(label: &str) -> String {
    let uuid = uuid::Builder::from_random_bytes(random_16()).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let uuid = uuid.hyphenated().encode_lower(&mut text);
    let mut token = String::with_capacity(uuid.len() + 1 + label.len());
    token.push_str(uuid);
    token.push(':');
    token.push_str(label);
    token
}

/// The token a release of `token` hands the lock over under, when a waiter is registered:
/// unique because a token is released (or given back) at most once.
pub(crate) fn handoff_token(token: &str) -> String {
    let mut handoff = String::with_capacity(token.len() + 8);
    handoff.push_str(token);
    handoff.push_str(":handoff");
    handoff
}

/// The reentrant owner that stands for the calling thread: unique to this thread of this
/// process (a random UUID per thread, drawn again in a forked child, also one made by
/// `_Fork()`), on every host.
pub(crate) fn thread_owner() -> String {
    thread_local! {
        static OWNER: RefCell<Option<(process::Process, String)>> = const { RefCell::new(None) };
    }
    let current = process::Process::current();
    OWNER
        .try_with(|owner| {
            let mut owner = owner.borrow_mut();
            match &*owner {
                Some((process, id)) if *process == current => id.clone(),
                _ => {
                    let id = new_token("thread");
                    *owner = Some((current, id.clone()));
                    id
                }
            }
        })
        .unwrap_or_else(|_| new_token("thread"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_version_4_uuids_and_distinct() {
        let tokens: std::collections::HashSet<String> =
            (0..1000).map(|_| new_token("me")).collect();
        assert_eq!(tokens.len(), 1000);
        for t in tokens.iter().take(10) {
            let (uuid, label) = t.split_once(':').unwrap();
            assert_eq!(label, "me");
            assert_eq!(uuid::Uuid::parse_str(uuid).unwrap().get_version_num(), 4);
        }
    }
}
