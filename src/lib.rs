//! redlease: a distributed lock over Redis, for programs made of plain threads.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! fn main() -> redlease::Result<()> {
//!     let client = redlease::Client::open("redis://127.0.0.1:6379/0")?;
//!     let guard = client
//!         .lock("order:1001")
//!         .ttl(Duration::from_secs(30))
//!         .acquire_timeout(Duration::from_secs(5))?;
//!     println!("holding with fencing token {}", guard.fencing_token());
//!     // ... the critical section ...
//!     guard.release()?; // Err(NotHeld) if the lease had ended meanwhile
//!     Ok(())
//! }
//! ```
//!
//! - **Acquire** is one atomic `SET key token NX PX ttl` (in a script that also draws the
//!   next fencing token), with a fresh random token per acquisition.
//! - **Release** and **extend** act only while the key still holds that token, so a holder
//!   whose lease ended can never delete or extend the next holder's lock.
//! - **Renewal**: each held lock has its own thread that renews every ttl/3 and reports a
//!   loss through [`LockGuard::lost`] and an optional callback.
//! - **Waiting** blocks on the server; a release hands the lock straight to the waiter that
//!   blocked first (FIFO, one waiter woken per release). Exponential backoff with jitter
//!   covers releases no waiter saw; never past the caller's deadline.
//! - **Fencing tokens** increase strictly per lock name, also across a Redis restart that
//!   lost the data. A lease cannot protect a resource from a paused holder; a resource that
//!   rejects stale fencing tokens can.
//!
//! Every call that talks to Redis blocks the calling thread for at most its timeouts
//! ([`ClientOptions`]); nothing here needs an async runtime.
//!
//! Diagnostics (renewal retries, a lost lock nobody listens for, a server that may evict
//! locks) go through the [`log`](https://docs.rs/log) facade: any logger the program
//! installs shows them. C and Python programs get them through `lock_set_log_callback`
//! ([`ffi`]). The same crate is the C library (`libredlease.so`, `libredlease.a`, header
//! `include/redlease.h`); `scripts/install.sh` installs it with a SONAME and a pkg-config
//! file.

mod acquire;
mod backend;
mod cancel;
mod client;
mod connection;
mod core;
mod error;
pub mod ffi;
mod inspect;
mod keys;
mod kinds;
mod lane;
mod lease;
mod line;
mod lock;
mod multi;
mod options;
mod pool;
mod process;
mod protocol;
// The runtime's own races under the shuttle scheduler (`cargo test --features shuttle`).
#[cfg(all(test, feature = "shuttle"))]
mod races;
mod reentrant;
mod renewal;
mod resp;
mod scripts;
mod shared;
#[cfg(test)]
mod sim;
mod stats;
mod sync;
#[cfg(test)]
mod testing;
// The shared test fixtures name the crate as the integration tests do.
#[cfg(test)]
extern crate self as redlease;
mod tls;
mod token;
mod url;

pub use acquire::wait_for_background_withdrawals;
pub use cancel::{CancelToken, cancel_all, reset_cancel_all};
pub use client::{Client, RwLock};
pub use core::lease::{LostReason, MAX_TTL, MIN_TTL};
pub use error::{Error, ErrorKind, Result};
pub use inspect::{HeldAs, LockInfo, ServerCheck};
pub use keys::{MAX_KEY_LEN, RESERVED_PREFIX, key_slot};
pub use lease::loss::LostCallback;
pub use lock::{DEFAULT_TTL, LockBuilder, LockGuard, MAX_TOKEN_LEN};
pub use multi::{MAX_NAMES, MultiGuard, MultiLockBuilder};
pub use options::ClientOptions;
pub use stats::{RenewalStats, Stats, renewal_stats, stats};

#[cfg(test)]
mod tests {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn clients_and_guards_can_be_shared_between_threads() {
        assert_send_sync::<crate::Client>();
        assert_send_sync::<crate::LockGuard>();
        assert_send_sync::<crate::Error>();
    }
}
