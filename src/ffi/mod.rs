//! The C ABI (`include/redlease.h`, generated from this module by cbindgen).
//!
//! Only argument conversion, handles and status codes live here; every lock behaviour is
//! the Rust API's.
#![allow(non_camel_case_types)]
// Every pointer argument is checked for NULL before use, and the safety contract of each
// export is written in its documentation (which is the header's).
#![allow(clippy::missing_safety_doc)]

mod args;
mod handles;
mod status;

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use self::args::{Out, copy_out, opt_str_arg, str_arg};
use self::handles::{HandleTable, Kind};
use self::status::{Failure, boundary};
pub use self::status::{
    LOCK_BUSY, LOCK_ERR_ARGUMENT, LOCK_ERR_CONNECTION, LOCK_ERR_HANDLE, LOCK_ERR_INTERNAL,
    LOCK_ERR_REDIS, LOCK_NOT_HELD, LOCK_OK,
};
use crate::{Client, ClientOptions, LockGuard, LostReason};

/// A client handle: one Redis server (URL) and its connections. 0 is never valid.
/// Thread-safe: one client may be used by many threads at once.
pub type lock_client_t = u64;

/// A lock handle: one held lock. 0 is never valid. May be used from any thread, also by
/// several at once; after `lock_release` every call on it gives `LOCK_ERR_HANDLE`.
pub type lock_t = u64;

/// `reason` of a lost-lock callback: the key no longer held the token (expired, deleted
/// or taken by another owner).
pub const LOCK_LOST_NOT_HELD: i32 = 1;
/// `reason` of a lost-lock callback: Redis could not be reached before the lease ran out.
pub const LOCK_LOST_UNREACHABLE: i32 = 2;

/// Called once when a held lock is lost. Runs on that lock's renewal thread (or on the
/// thread whose `lock_extend` found the lock gone): keep it short and do not block. It may
/// call any function of this library, including `lock_release` on `lock`.
pub type lock_lost_cb =
    Option<unsafe extern "C" fn(lock: lock_t, reason: i32, user_data: *mut c_void)>;

/// Client options. Fill with `lock_client_options_init`, then change what you need.
#[repr(C)]
pub struct lock_client_options_t {
    /// Longest time to connect (TCP, TLS, AUTH, SELECT), in ms. Default 2000.
    pub connect_timeout_ms: u64,
    /// Longest wait for any one reply, in ms. Default 2000.
    pub io_timeout_ms: u64,
    /// Connections shared by the calling threads (renewal has its own). Default 32.
    pub pool_size: u32,
    /// Longest wait for a free pooled connection, in ms. Default 2000.
    pub pool_wait_ms: u64,
    /// Prefix put before every key (NUL-terminated UTF-8), or NULL for none. Copied.
    pub key_prefix: *const c_char,
    /// Label appended to tokens after `:`, or NULL for `host/pid`. Copied.
    pub owner_label: *const c_char,
    /// Path of a PEM CA certificate to trust for `rediss://`, or NULL for the system roots.
    pub tls_ca_cert_file: *const c_char,
}

/// Acquire options. Fill with `lock_acquire_options_init`, then change what you need.
#[repr(C)]
pub struct lock_acquire_options_t {
    /// Renew the lease every ttl/3 from a renewal thread while held. Default true.
    pub renew: bool,
    /// Called once if the lock is lost (only renewal and extend detect a loss), or NULL.
    pub on_lost: lock_lost_cb,
    /// Passed to `on_lost` as is; must stay valid until the lock is released.
    pub user_data: *mut c_void,
}

struct LockEntry {
    client: lock_client_t,
    guard: LockGuard,
}

static CLIENTS: HandleTable<Client> = HandleTable::new(Kind::Client);
static LOCKS: HandleTable<LockEntry> = HandleTable::new(Kind::Lock);

fn client(handle: lock_client_t) -> Result<Arc<Client>, Failure> {
    CLIENTS.get(handle).ok_or_else(|| Failure::handle("client"))
}

/// Runs `f` on the guard of a live lock handle. No lock of the table is held while `f`
/// runs, so a lost-lock callback inside it may call back into the library.
fn with_guard<T>(
    handle: lock_t,
    f: impl FnOnce(&LockGuard) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let entry = LOCKS.get(handle).ok_or_else(|| Failure::handle("lock"))?;
    f(&entry.guard)
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Fills `opts` with the defaults. Returns `LOCK_ERR_ARGUMENT` for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_options_init(opts: *mut lock_client_options_t) -> i32 {
    boundary(|| {
        let out = unsafe { Out::new(opts, "opts") }?;
        let d = ClientOptions::default();
        out.write(lock_client_options_t {
            connect_timeout_ms: d.connect_timeout.as_millis() as u64,
            io_timeout_ms: d.io_timeout.as_millis() as u64,
            pool_size: d.pool_size as u32,
            pool_wait_ms: d.pool_wait.as_millis() as u64,
            key_prefix: std::ptr::null(),
            owner_label: std::ptr::null(),
            tls_ca_cert_file: std::ptr::null(),
        });
        Ok(())
    })
}

/// Opens a client with default options; no connection is made yet.
///
/// `url`: `redis://[user:pass@]host[:port][/db]`, `rediss://...` (TLS) or
/// `redis+unix:///path?db=N&user=U&pass=P`. On `LOCK_OK`, `*out_client` is a new handle to
/// close with `lock_client_close`; on any other status it is not written.
/// Errors: `LOCK_ERR_ARGUMENT` for NULL, bad UTF-8 or a malformed URL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_open(
    url: *const c_char,
    out_client: *mut lock_client_t,
) -> i32 {
    boundary(|| unsafe { open_client(url, ClientOptions::default(), out_client) })
}

/// Opens a client with `options` and writes its handle.
///
/// # Safety
/// `url` and `out_client` as in `lock_client_open`.
unsafe fn open_client(
    url: *const c_char,
    options: ClientOptions,
    out_client: *mut lock_client_t,
) -> Result<(), Failure> {
    let url = unsafe { str_arg(url, "url") }?;
    let out = unsafe { Out::new(out_client, "out_client") }?;
    let client = Client::with_options(url, options)?;
    out.write(CLIENTS.insert(client));
    Ok(())
}

/// Opens a client with `opts` (see `lock_client_options_t`); otherwise as
/// `lock_client_open`. Zero timeouts or pool size give `LOCK_ERR_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_open_opts(
    url: *const c_char,
    opts: *const lock_client_options_t,
    out_client: *mut lock_client_t,
) -> i32 {
    boundary(|| {
        let opts = unsafe { opts.as_ref() }.ok_or_else(|| Failure::argument("opts is NULL"))?;
        let mut options = ClientOptions::default()
            .connect_timeout(millis(opts.connect_timeout_ms))
            .io_timeout(millis(opts.io_timeout_ms))
            .pool_size(opts.pool_size as usize)
            .pool_wait(millis(opts.pool_wait_ms));
        if let Some(prefix) = unsafe { opt_str_arg(opts.key_prefix, "key_prefix") }? {
            options = options.key_prefix(prefix);
        }
        if let Some(label) = unsafe { opt_str_arg(opts.owner_label, "owner_label") }? {
            options = options.owner_label(label);
        }
        if let Some(path) = unsafe { opt_str_arg(opts.tls_ca_cert_file, "tls_ca_cert_file") }? {
            options = options.tls_ca_cert(args::read_small_file(path, "the CA certificate")?);
        }
        unsafe { open_client(url, options, out_client) }
    })
}

/// Closes a client. Every lock still held from it is released first (renewal stopped,
/// release sent; errors ignored) and its handle becomes invalid. Blocks for those releases.
/// A `lock_acquire` still running on another thread when the client closes may yet
/// succeed; release that lock with `lock_release`.
/// Errors: `LOCK_ERR_HANDLE` for an unknown or already closed client.
#[unsafe(no_mangle)]
pub extern "C" fn lock_client_close(client: lock_client_t) -> i32 {
    boundary(|| {
        let closed = CLIENTS
            .remove(client)
            .ok_or_else(|| Failure::handle("client"))?;
        for entry in LOCKS.remove_where(|e| e.client == client) {
            if let Err(e) = entry.guard.release_shared() {
                log::warn!("releasing a lock while closing its client: {e}");
            }
        }
        closed.close_idle();
        Ok(())
    })
}

/// Fills `opts` with the defaults (renewal on, no callback). Returns `LOCK_ERR_ARGUMENT`
/// for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire_options_init(opts: *mut lock_acquire_options_t) -> i32 {
    boundary(|| {
        let out = unsafe { Out::new(opts, "opts") }?;
        out.write(lock_acquire_options_t {
            renew: true,
            on_lost: None,
            user_data: std::ptr::null_mut(),
        });
        Ok(())
    })
}

/// Acquires the lock `key` for `ttl_ms`, renewed while held. Blocking.
///
/// `wait_ms`: 0 tries once; `UINT64_MAX` waits as long as it takes; otherwise waits up to
/// that long. On `LOCK_OK`, `*out_lock` is a new handle to give back with `lock_release`.
/// Other results: `LOCK_BUSY` (still held by another owner when the wait ended),
/// `LOCK_ERR_ARGUMENT` (NULL, empty, over-long or non-UTF-8 key, ttl 0), `LOCK_ERR_HANDLE`,
/// `LOCK_ERR_CONNECTION`, `LOCK_ERR_REDIS`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire(
    client: lock_client_t,
    key: *const c_char,
    ttl_ms: u64,
    wait_ms: u64,
    out_lock: *mut lock_t,
) -> i32 {
    unsafe { lock_acquire_opts(client, key, ttl_ms, wait_ms, std::ptr::null(), out_lock) }
}

/// As `lock_acquire`, with `opts` (NULL for the defaults).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire_opts(
    client: lock_client_t,
    key: *const c_char,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
) -> i32 {
    boundary(|| {
        let key = unsafe { str_arg(key, "key") }?;
        let out = unsafe { Out::new(out_lock, "out_lock") }?;
        let opts = unsafe { opts.as_ref() };
        let client_handle = client;
        let client = self::client(client)?;
        let handle = LOCKS.insert_with(|handle| -> Result<LockEntry, Failure> {
            let mut builder = client.lock(key).ttl(millis(ttl_ms));
            if let Some(opts) = opts {
                builder = builder.renew(opts.renew);
                if let Some(callback) = opts.on_lost {
                    let user_data = UserData(opts.user_data);
                    builder = builder.on_lost(move |reason| {
                        let reason = match reason {
                            LostReason::Unreachable => LOCK_LOST_UNREACHABLE,
                            _ => LOCK_LOST_NOT_HELD,
                        };
                        // SAFETY: the caller promised a callable function and user_data
                        // that stays valid while the lock is held.
                        unsafe { callback(handle, reason, user_data.get()) }
                    });
                }
            }
            let guard = match wait_ms {
                0 => builder.try_acquire(),
                u64::MAX => builder.acquire(),
                ms => builder.acquire_timeout(millis(ms)),
            }?;
            Ok(LockEntry {
                client: client_handle,
                guard,
            })
        })?;
        out.write(handle);
        Ok(())
    })
}

/// The caller's `user_data`, handed to the callback on the renewal thread.
struct UserData(*mut c_void);
// SAFETY: the pointer is only passed back to the caller's callback; the header tells the
// caller that the callback runs on another thread.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

impl UserData {
    fn get(&self) -> *mut c_void {
        self.0
    }
}

/// Stops renewal, then releases the lock if the key still holds its token. Blocking (one
/// round trip). The handle is spent whatever the result.
///
/// Results: `LOCK_OK`; `LOCK_NOT_HELD` when the lease had already ended (part of the
/// critical section ran unprotected); `LOCK_ERR_CONNECTION` / `LOCK_ERR_REDIS` when Redis
/// could not be told (the lock then expires after its ttl); `LOCK_ERR_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_release(lock: lock_t) -> i32 {
    boundary(|| {
        let entry = LOCKS.remove(lock).ok_or_else(|| Failure::handle("lock"))?;
        entry.guard.release_shared()?;
        Ok(())
    })
}

/// Sets the lease to `ttl_ms` from now if the key still holds the token. Blocking (one round
/// trip). Results: `LOCK_OK`, `LOCK_NOT_HELD` (the lock was lost), `LOCK_ERR_ARGUMENT`
/// (ttl 0), `LOCK_ERR_HANDLE`, `LOCK_ERR_CONNECTION`, `LOCK_ERR_REDIS`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_extend(lock: lock_t, ttl_ms: u64) -> i32 {
    boundary(|| with_guard(lock, |g| Ok(g.extend(millis(ttl_ms))?)))
}

/// Writes whether the lock is held, by the local view: not released, not lost, lease not
/// ended by the local clock. Sends nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_is_held(lock: lock_t, out_held: *mut bool) -> i32 {
    boundary(|| {
        let out = unsafe { Out::new(out_held, "out_held") }?;
        out.write(with_guard(lock, |g| Ok(g.is_held()))?);
        Ok(())
    })
}

/// Writes the lock's fencing token: larger than that of every earlier acquisition of the
/// same key. Pass it to the resource you protect, which should reject older tokens.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_fencing_token(lock: lock_t, out_token: *mut u64) -> i32 {
    boundary(|| {
        let out = unsafe { Out::new(out_token, "out_token") }?;
        out.write(with_guard(lock, |g| Ok(g.fencing_token()))?);
        Ok(())
    })
}

/// Room for any token with its terminating NUL.
pub const LOCK_TOKEN_MAX: usize = 128;

/// Copies the lock's token (the value stored under the key), NUL-terminated, into `buf` of
/// `buf_len` bytes. `LOCK_ERR_ARGUMENT` when `buf` is NULL or too small
/// (`LOCK_TOKEN_MAX` is always enough); `buf` is written only on `LOCK_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_token(lock: lock_t, buf: *mut c_char, buf_len: usize) -> i32 {
    boundary(|| {
        let token = with_guard(lock, |g| Ok(g.token().to_owned()))?;
        unsafe { copy_out(&token, buf, buf_len) }
    })
}

/// Copies the client's URL with any password replaced by `***`, NUL-terminated, into `buf`
/// of `buf_len` bytes (for logs). `LOCK_ERR_ARGUMENT` when `buf` is NULL or too small.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_url(
    client: lock_client_t,
    buf: *mut c_char,
    buf_len: usize,
) -> i32 {
    boundary(|| {
        let client = self::client(client)?;
        unsafe { copy_out(client.url(), buf, buf_len) }
    })
}

/// Writes the lease left by the local clock (minus a drift allowance), in ms; 0 once lost.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_remaining_ms(lock: lock_t, out_ms: *mut u64) -> i32 {
    boundary(|| {
        let out = unsafe { Out::new(out_ms, "out_ms") }?;
        out.write(with_guard(lock, |g| Ok(g.remaining().as_millis() as u64))?);
        Ok(())
    })
}

/// Writes whether anyone holds the lock `key` right now (one `EXISTS`). Blocking.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_is_locked(
    client: lock_client_t,
    key: *const c_char,
    out_locked: *mut bool,
) -> i32 {
    boundary(|| {
        let key = unsafe { str_arg(key, "key") }?;
        let out = unsafe { Out::new(out_locked, "out_locked") }?;
        out.write(self::client(client)?.is_locked(key)?);
        Ok(())
    })
}

/// This thread's message for its last call: empty after `LOCK_OK`. Never NULL; valid until
/// this thread's next call into the library. Never contains the URL's password.
#[unsafe(no_mangle)]
pub extern "C" fn lock_last_error() -> *const c_char {
    status::last_error()
}

/// The name of a status code (`"LOCK_BUSY"`, ...), a static string; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn lock_status_name(status: i32) -> *const c_char {
    status::status_name(status).as_ptr()
}

/// The library version (`"0.1.0"`), a static string.
#[unsafe(no_mangle)]
pub extern "C" fn lock_version() -> *const c_char {
    const VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
    ) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    VERSION.as_ptr()
}
