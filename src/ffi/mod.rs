//! The C ABI (`include/redlease.h`, generated from this module by cbindgen).
//!
//! Only argument conversion, handles and status codes live here; every lock behaviour is
//! the Rust API's.
#![allow(non_camel_case_types)]
// Every pointer argument is checked for NULL before use, and the safety contract of each
// export is written in its documentation (which is the header's).
#![allow(clippy::missing_safety_doc)]

mod args;
pub(crate) mod handles;
mod inspect;
mod logging;
mod multi;
mod status;

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use self::args::{Out, check_struct_size, copy_out, opt_str_arg, prefix_size, read_sized, str_arg};
use self::handles::{ChildError, HandleTable, Kind};
pub use self::inspect::{
    LOCK_HELD_MUTEX, LOCK_HELD_NONE, LOCK_HELD_RWLOCK, LOCK_HELD_SEMAPHORE, LOCK_NO_EXPIRY,
    lock_break, lock_check, lock_info_free, lock_info_t, lock_inspect, lock_list,
    lock_renewal_stats, lock_renewal_stats_t, lock_server_check_free, lock_server_check_t,
};
pub use self::logging::{
    LOCK_LOG_DEBUG, LOCK_LOG_ERROR, LOCK_LOG_INFO, LOCK_LOG_TRACE, LOCK_LOG_WARN, lock_log_cb,
};
pub use self::multi::lock_acquire_all;
use self::status::{Failure, boundary};
pub use self::status::{
    LOCK_BUSY, LOCK_CANCELLED, LOCK_CAUSE_CONNECTION, LOCK_CAUSE_NONE, LOCK_CAUSE_TIMEOUT,
    LOCK_ERR_ARGUMENT, LOCK_ERR_CONNECTION, LOCK_ERR_HANDLE, LOCK_ERR_INTERNAL, LOCK_ERR_REDIS,
    LOCK_ERR_REPLICATION, LOCK_NOT_HELD, LOCK_OK, lock_error_info_t,
};
use crate::{CancelToken, Client, ClientOptions, LockBuilder, LockGuard, LostReason};

/// A client handle: one Redis server (URL) and its connections. 0 is never valid.
/// Thread-safe: one client may be used by many threads at once.
pub type lock_client_t = u64;

/// A lock handle: one hold of a lock, of any kind: a mutex (`lock_acquire`), a permit of a
/// counting semaphore (`lock_semaphore_acquire`) or a read or write hold of a read-write
/// lock (`lock_rwlock_acquire`). All come from the same generation-checked table, so every
/// function that takes a `lock_t` (`lock_release`, `lock_extend`, `lock_is_held`,
/// `lock_fencing_token`, `lock_token`, `lock_remaining_ms`, and the `lock_lost_cb`
/// callback's argument) takes each kind alike, with the same meaning. 0 is never valid.
/// May be used from any thread, also by several at once; after `lock_release` every call
/// on it gives `LOCK_ERR_HANDLE`.
pub type lock_t = u64;

/// A cancel handle: cancels the blocked acquires it was given to (see `lock_cancel_new`).
/// 0 means "none" in `lock_acquire_options_t`. Thread-safe.
pub type lock_cancel_t = u64;

/// `reason` of a lost-lock callback: the key no longer held the token (expired, deleted
/// or taken by another owner).
pub const LOCK_LOST_NOT_HELD: i32 = 1;
/// `reason` of a lost-lock callback: Redis could not be reached before the lease ran out.
pub const LOCK_LOST_UNREACHABLE: i32 = 2;

/// Called once when a held lock is lost. Runs on that lock's renewal thread (or on the
/// thread whose `lock_extend` found the lock gone): keep it short and do not block. It may
/// call any function of this library, including `lock_release` on `lock` (except for a
/// reentrant lock's hold owned by the thread that acquired it, which only that thread may
/// release: from the callback on any other thread `lock_release` gives `LOCK_NOT_HELD`,
/// and the handle stays valid; from the callback that the owning thread's own
/// `lock_extend` runs, it releases).
pub type lock_lost_cb =
    Option<unsafe extern "C" fn(lock: lock_t, reason: i32, user_data: *mut c_void)>;

/// Gives back the `user_data` of an `on_lost` callback: called once, on whichever thread
/// the library is on at that moment, when it will never pass `user_data` to `on_lost`
/// again. It may free it; it should not call this library.
pub type lock_user_data_free_cb = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// Called on the acquiring thread while an acquire given it (`lock_acquire_opts`,
/// `lock_semaphore_acquire`, `lock_rwlock_acquire`) blocks: when a signal
/// interrupts the wait, and also every 200 ms (a signal that arrives between two waits is
/// seen at the next check), with no argument saying which. So it should look at a flag of
/// its own (set by your signal handler) and return nonzero to cancel the acquire
/// (`LOCK_CANCELLED`), 0 to go on waiting. It may call `lock_cancel` and `lock_cancel_all`,
/// no other function of this library, and must not block.
pub type lock_interrupt_cb = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

/// Client options. Fill with `lock_client_options_init(&opts, sizeof opts)` (which sets
/// `size`), then change what you need. The struct may gain fields at its end in later
/// versions: a program built against an older header passes its smaller size, and the
/// new fields keep their defaults.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lock_client_options_t {
    /// `sizeof(lock_client_options_t)` as the caller was compiled; set by the init function.
    pub size: usize,
    /// Longest time to connect (name lookup, TCP, TLS, AUTH, SELECT), in ms. 1 to 86400000.
    /// Default 2000.
    pub connect_timeout_ms: u64,
    /// Longest wait for any one reply, in ms. 1 to 86400000. Default 2000.
    pub io_timeout_ms: u64,
    /// Connections the calling threads may use at once, and waiters that may block on the
    /// server at once; releases, extends and renewals never wait for one. Default 32.
    pub pool_size: u32,
    /// Longest wait for a free pooled connection, in ms; 0 does not wait. Default 2000.
    pub pool_wait_ms: u64,
    /// Prefix put before every key (NUL-terminated UTF-8), or NULL for none. Copied.
    pub key_prefix: *const c_char,
    /// Label appended to tokens after `:`, or NULL for `host/pid`. Copied.
    pub owner_label: *const c_char,
    /// Path of a PEM CA certificate to trust for `rediss://`, or NULL for the system roots.
    pub tls_ca_cert_file: *const c_char,
}

/// Acquire options. Fill with `lock_acquire_options_init(&opts, sizeof opts)` (which sets
/// `size`), then change what you need. May gain fields at its end, as
/// `lock_client_options_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lock_acquire_options_t {
    /// `sizeof(lock_acquire_options_t)` as the caller was compiled; set by the init function.
    pub size: usize,
    /// Renew the lease every ttl/3 from a renewal thread while held. Default true.
    pub renew: bool,
    /// Called once if the lock is lost (only renewal and extend detect a loss), or NULL.
    pub on_lost: lock_lost_cb,
    /// Passed to `on_lost` as is; must stay valid until the lock is released, and until
    /// an `on_lost` call running on another thread at that moment has returned (see
    /// `lock_release`): `user_data_free` says when that is.
    pub user_data: *mut c_void,
    /// A cancel handle whose `lock_cancel` ends this acquire's wait, or 0.
    pub cancel: lock_cancel_t,
    /// Called when a signal interrupts the wait; see `lock_interrupt_cb`. NULL: an
    /// interrupted wait simply resumes.
    pub on_interrupt: lock_interrupt_cb,
    /// Passed to `on_interrupt` as is.
    pub interrupt_user_data: *mut c_void,
    /// Replicas that must acknowledge the acquire and every extend and renewal (`WAIT`);
    /// too few roll the acquire back (`LOCK_ERR_REPLICATION`). 0 (the default): none.
    pub min_replicas: u32,
    /// How long to wait for those acknowledgements, in ms. Default 1000.
    pub min_replicas_timeout_ms: u64,
    /// Take a mutex reentrantly: while its owner holds it, an acquire by the same owner
    /// succeeds at once with one more hold (a handle of its own, to release like any
    /// other); the lock is released with the last hold. All holds share one lease, one
    /// renewal and the first hold's fencing token. Default false. Not for semaphores or
    /// read-write locks (`LOCK_ERR_ARGUMENT`).
    pub reentrant: bool,
    /// The reentrant owner. NULL (the default): the calling thread, and only that thread
    /// may release the holds (`lock_release` from another thread is `LOCK_NOT_HELD` and
    /// leaves the handle valid). Otherwise a NUL-terminated UTF-8 string of 1 to 256 bytes,
    /// copied, shared by every thread, process and host that acquires with it: it must be
    /// unique to its holder everywhere (include a UUID drawn once per owner).
    pub owner: *const c_char,
    /// Called exactly once with `user_data` when the library will not use it any more:
    /// before an acquire that fails returns (whatever the error, unless these options were
    /// refused: a `size` no version of the struct has); once `on_lost` has returned from
    /// its one call; or, for a hold released with no loss report under way, during
    /// `lock_release` (or the `lock_client_close` that released it). Only with `on_lost`
    /// (NULL `on_lost`: never called). Default NULL.
    pub user_data_free: lock_user_data_free_cb,
}

struct LockEntry {
    client: lock_client_t,
    guard: LockGuard,
    /// The thread that owns this hold of a reentrant lock taken for the calling thread.
    owner_thread: Option<std::thread::ThreadId>,
}

static CLIENTS: HandleTable<Client> = HandleTable::new(Kind::Client);
static LOCKS: HandleTable<LockEntry> = HandleTable::new(Kind::Lock);
static CANCELS: HandleTable<CancelToken> = HandleTable::new(Kind::Cancel);

/// The cancel token of `lock_acquire_options_t.cancel` (0: none).
fn cancel_of(handle: lock_cancel_t) -> Result<Option<Arc<CancelToken>>, Failure> {
    match handle {
        0 => Ok(None),
        handle => CANCELS
            .get(handle)
            .map(Some)
            .ok_or_else(|| Failure::handle("cancel")),
    }
}

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
    // A forked child's copy of its parent's lock is not held, and is not looked into: a
    // thread of the parent may have held its state's lock at the fork.
    entry.guard.check_process()?;
    f(&entry.guard)
}

/// Registers the handle tables' locks to be held across `fork()`, once (every call of
/// the C ABI comes through here, through `status::boundary`).
pub(crate) fn hold_tables_across_fork() {
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    crate::process::hold_across_fork_once(&REGISTERED, hold_for_fork);
}

/// The handle tables' locks, held across `fork()` (see [`crate::process`]).
fn hold_for_fork() -> Vec<Box<dyn std::any::Any>> {
    #[cfg(not(feature = "shuttle"))]
    {
        vec![
            Box::new(CLIENTS.hold()),
            Box::new(LOCKS.hold()),
            Box::new(CANCELS.hold()),
        ]
    }
    #[cfg(feature = "shuttle")]
    {
        Vec::new()
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Fills `opts` with the defaults: pass `sizeof *opts` as `size`, so that a library newer
/// than your header (whose struct has more fields) writes only the fields you have, and
/// sets `opts->size`. Errors: `LOCK_ERR_ARGUMENT` for NULL or a size that is not the size
/// of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_options_init(
    opts: *mut lock_client_options_t,
    size: usize,
) -> i32 {
    // SAFETY: `opts` is NULL or writable for `size` bytes (this function's contract, as
    // documented: `size` is `sizeof *opts`); init_sized checks both.
    boundary(|| unsafe {
        init_sized(
            opts,
            size,
            default_client_options(),
            &client_options_sizes(),
            "opts",
        )
    })
}

/// Writes the first `size` bytes of `defaults`, with its size field set to `size`.
///
/// # Safety
/// `opts` is NULL or valid for writing `size` bytes.
unsafe fn init_sized<T: Copy>(
    opts: *mut T,
    size: usize,
    mut defaults: T,
    sizes: &[usize],
    what: &str,
) -> Result<(), Failure> {
    if opts.is_null() {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    check_struct_size::<T>(
        size,
        sizes,
        &format!("size {size}"),
        &format!("pass sizeof *{what}"),
    )?;
    // SAFETY: every options struct begins with its size_t size (repr(C)).
    unsafe { (&raw mut defaults).cast::<usize>().write(size) };
    // SAFETY: `opts` is valid for `size` bytes (caller's contract), `size` is at most the
    // size of `T` (it is one of `sizes`), and the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const defaults).cast::<u8>(), opts.cast::<u8>(), size)
    };
    Ok(())
}

/// The sizes of every version of `lock_client_options_t`: each prefix ending after a field.
fn client_options_sizes() -> Vec<usize> {
    use std::mem::{align_of, offset_of, size_of};
    type T = lock_client_options_t;
    let end = |offset: usize, size: usize| prefix_size(offset + size, align_of::<T>());
    vec![
        end(offset_of!(T, connect_timeout_ms), size_of::<u64>()),
        end(offset_of!(T, io_timeout_ms), size_of::<u64>()),
        end(offset_of!(T, pool_size), size_of::<u32>()),
        end(offset_of!(T, pool_wait_ms), size_of::<u64>()),
        end(offset_of!(T, key_prefix), size_of::<usize>()),
        end(offset_of!(T, owner_label), size_of::<usize>()),
        end(offset_of!(T, tls_ca_cert_file), size_of::<usize>()),
    ]
}

/// The sizes of every version of `lock_acquire_options_t`.
fn acquire_options_sizes() -> Vec<usize> {
    use std::mem::{align_of, offset_of, size_of};
    type T = lock_acquire_options_t;
    let end = |offset: usize, size: usize| prefix_size(offset + size, align_of::<T>());
    vec![
        end(offset_of!(T, renew), size_of::<bool>()),
        end(offset_of!(T, on_lost), size_of::<usize>()),
        end(offset_of!(T, user_data), size_of::<usize>()),
        end(offset_of!(T, cancel), size_of::<u64>()),
        end(offset_of!(T, on_interrupt), size_of::<usize>()),
        end(offset_of!(T, interrupt_user_data), size_of::<usize>()),
        end(offset_of!(T, min_replicas), size_of::<u32>()),
        end(offset_of!(T, min_replicas_timeout_ms), size_of::<u64>()),
        end(offset_of!(T, reentrant), size_of::<bool>()),
        end(offset_of!(T, owner), size_of::<usize>()),
        end(offset_of!(T, user_data_free), size_of::<usize>()),
    ]
}

fn default_client_options() -> lock_client_options_t {
    let d = ClientOptions::default();
    lock_client_options_t {
        size: std::mem::size_of::<lock_client_options_t>(),
        connect_timeout_ms: d.connect_timeout.as_millis() as u64,
        io_timeout_ms: d.io_timeout.as_millis() as u64,
        pool_size: d.pool_size as u32,
        pool_wait_ms: d.pool_wait.as_millis() as u64,
        key_prefix: std::ptr::null(),
        owner_label: std::ptr::null(),
        tls_ca_cert_file: std::ptr::null(),
    }
}

fn default_acquire_options() -> lock_acquire_options_t {
    lock_acquire_options_t {
        size: std::mem::size_of::<lock_acquire_options_t>(),
        renew: true,
        on_lost: None,
        user_data: std::ptr::null_mut(),
        cancel: 0,
        on_interrupt: None,
        interrupt_user_data: std::ptr::null_mut(),
        min_replicas: 0,
        min_replicas_timeout_ms: 1000,
        reentrant: false,
        owner: std::ptr::null(),
        user_data_free: None,
    }
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
    // SAFETY: `url` and `out_client` are NULL or valid (the caller's contract); open_client
    // checks for NULL.
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
    // SAFETY: `url` is NULL or NUL-terminated (the caller's contract); it outlives this call.
    let url = unsafe { str_arg(url, "url") }?;
    // SAFETY: `out_client` is NULL or writable (the caller's contract).
    let out = unsafe { Out::new(out_client, "out_client") }?;
    let client = Client::with_options(url, options)?;
    out.write(CLIENTS.insert(client));
    Ok(())
}

/// Opens a client with `opts` (see `lock_client_options_t`); otherwise as
/// `lock_client_open`. Timeouts under 1 ms, a pool size of 0, a `size` that is not the size
/// of any version of the struct (fill it with `lock_client_options_init`), or a CA file
/// that is not a readable regular file of at most 4 MiB give `LOCK_ERR_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_open_opts(
    url: *const c_char,
    opts: *const lock_client_options_t,
    out_client: *mut lock_client_t,
) -> i32 {
    boundary(|| {
        // SAFETY: `opts` is NULL or a struct filled by lock_client_options_init, at least
        // `opts->size` bytes (the caller's contract); read_sized checks NULL and the size.
        let opts = unsafe {
            read_sized(
                opts,
                default_client_options(),
                &client_options_sizes(),
                "opts",
            )
        }?;
        // SAFETY: the strings in `opts` are NULL or NUL-terminated (the caller's contract).
        let options = unsafe { client_options(&opts) }?;
        // SAFETY: `url` and `out_client` as in lock_client_open.
        unsafe { open_client(url, options, out_client) }
    })
}

/// Converts C client options.
///
/// # Safety
/// The strings in `opts` are NULL or NUL-terminated.
unsafe fn client_options(opts: &lock_client_options_t) -> Result<ClientOptions, Failure> {
    let mut options = ClientOptions::default()
        .connect_timeout(millis(opts.connect_timeout_ms))
        .io_timeout(millis(opts.io_timeout_ms))
        .pool_size(opts.pool_size as usize)
        .pool_wait(millis(opts.pool_wait_ms));
    // SAFETY: NULL or NUL-terminated, by this function's contract (the three strings).
    if let Some(prefix) = unsafe { opt_str_arg(opts.key_prefix, "key_prefix") }? {
        options = options.key_prefix(prefix);
    }
    // SAFETY: as above.
    if let Some(label) = unsafe { opt_str_arg(opts.owner_label, "owner_label") }? {
        options = options.owner_label(label);
    }
    // SAFETY: as above.
    if let Some(path) = unsafe { opt_str_arg(opts.tls_ca_cert_file, "tls_ca_cert_file") }? {
        options = options.tls_ca_cert(args::read_small_file(path, "the CA certificate")?);
    }
    Ok(options)
}

/// Opens a Redlock client: its locks are taken on a majority of the `count` independent
/// primaries `urls` (1 to 15; each a single-server or Sentinel URL, no two naming the same
/// server, whatever their databases), in parallel. `options` may be NULL for the defaults.
/// No connection is made yet.
/// Its locks have no fencing token (`lock_fencing_token` gives 0): see the README.
/// Errors: `LOCK_ERR_ARGUMENT` for NULL pointers, a count of 0 or over 15, a malformed,
/// Cluster or duplicate URL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_client_open_redlock(
    urls: *const *const c_char,
    count: usize,
    options: *const lock_client_options_t,
    out_client: *mut lock_client_t,
) -> i32 {
    boundary(|| {
        // SAFETY: `out_client` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_client, "out_client") }?;
        if urls.is_null() {
            return Err(Failure::argument("urls is NULL"));
        }
        if count == 0 || count > 15 {
            return Err(Failure::argument(format!(
                "Redlock takes 1 to 15 primaries, got {count}"
            )));
        }
        // SAFETY: non-NULL, and the caller promised `count` readable pointers.
        let pointers = unsafe { std::slice::from_raw_parts(urls, count) };
        let mut list = Vec::with_capacity(count);
        for (i, &url) in pointers.iter().enumerate() {
            // SAFETY: each of the `count` pointers is NULL or NUL-terminated (the caller's
            // contract); str_arg checks for NULL.
            list.push(unsafe { str_arg(url, &format!("urls[{i}]")) }?);
        }
        let options = if options.is_null() {
            ClientOptions::default()
        } else {
            // SAFETY: non-NULL, filled by lock_client_options_init (the caller's contract);
            // read_sized checks the size.
            let opts = unsafe {
                read_sized(
                    options,
                    default_client_options(),
                    &client_options_sizes(),
                    "options",
                )
            }?;
            // SAFETY: the strings in `opts` are NULL or NUL-terminated (the caller's contract).
            unsafe { client_options(&opts) }?
        };
        let client = Client::redlock(&list, options)?;
        out.write(CLIENTS.insert(client));
        Ok(())
    })
}

/// Closes a client. Every lock still held from it is released first (renewal stopped,
/// release sent; errors ignored) and its handle becomes invalid. Blocks for those releases.
/// An acquire (of any kind) still waiting on another thread when the client closes waits
/// on (`lock_cancel_all` ends it); if it is granted, it gives the lock back and returns
/// `LOCK_ERR_HANDLE`: nothing stays held from a closed client.
/// Errors: `LOCK_ERR_HANDLE` for an unknown or already closed client.
#[unsafe(no_mangle)]
pub extern "C" fn lock_client_close(client: lock_client_t) -> i32 {
    boundary(|| {
        let (closed, locks) = handles::close_parent(&CLIENTS, &LOCKS, client, |e| e.client)
            .ok_or_else(|| Failure::handle("client"))?;
        for entry in locks {
            if let Err(e) = entry.guard.release_shared() {
                log::warn!("releasing a lock while closing its client: {e}");
            }
        }
        closed.close_idle();
        Ok(())
    })
}

/// Fills `opts` with the defaults (renewal on, no callback, no cancel handle): pass
/// `sizeof *opts` as `size` (see `lock_client_options_init`). Errors: `LOCK_ERR_ARGUMENT`
/// for NULL or a size that is not the size of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire_options_init(
    opts: *mut lock_acquire_options_t,
    size: usize,
) -> i32 {
    // SAFETY: as in lock_client_options_init.
    boundary(|| unsafe {
        init_sized(
            opts,
            size,
            default_acquire_options(),
            &acquire_options_sizes(),
            "opts",
        )
    })
}

/// Acquires the lock `key` for `ttl_ms`, renewed while held. Blocking.
///
/// `wait_ms`: 0 tries once; `UINT64_MAX` waits as long as it takes; otherwise waits up to
/// that long. On `LOCK_OK`, `*out_lock` is a new handle to give back with `lock_release`.
/// Other results: `LOCK_BUSY` (still held by another owner when the wait ended, or the
/// last grant's lease ran out before it could be confirmed: see `lock_last_error`),
/// `LOCK_ERR_REPLICATION` (too few replicas acknowledged: rolled back; see
/// `lock_acquire_options_t.min_replicas`),
/// `LOCK_CANCELLED` (see `lock_cancel_all`), `LOCK_ERR_ARGUMENT` (NULL, empty, over-long,
/// reserved (`redlease:...`) or non-UTF-8 key, ttl under 10 ms or over 2^40 ms, a wait
/// over 2^40 ms other than `UINT64_MAX`), `LOCK_ERR_HANDLE`,
/// `LOCK_ERR_CONNECTION` (also when a request's reply was lost: the lock is then not held
/// by this caller, who tried to withdraw; at worst it lapses after its lease),
/// `LOCK_ERR_REDIS`. Returns within `wait_ms` plus one request's bounds (connect and I/O
/// timeouts, and 0.25 s for Redis to end a block).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire(
    client: lock_client_t,
    key: *const c_char,
    ttl_ms: u64,
    wait_ms: u64,
    out_lock: *mut lock_t,
) -> i32 {
    // SAFETY: `key` and `out_lock` are passed on under this function's contract, which is
    // lock_acquire_opts's; NULL options are allowed.
    unsafe { lock_acquire_opts(client, key, ttl_ms, wait_ms, std::ptr::null(), out_lock) }
}

/// As `lock_acquire`, with `opts` (NULL for the defaults): renewal on or off, a lost-lock
/// callback, a cancel handle, an interrupt callback. `LOCK_ERR_HANDLE` for an unknown
/// cancel handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire_opts(
    client: lock_client_t,
    key: *const c_char,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
) -> i32 {
    let hold = AcquireArgs {
        client,
        name: key,
        ttl_ms,
        wait_ms,
        opts,
        out_lock,
        adopt: None,
    };
    // SAFETY: the pointers are NULL or valid as this function's contract says, which is
    // the one `AcquireArgs::run` needs.
    boundary(|| unsafe { hold.run("key", |client, key| Ok(client.lock(key))) })
}

/// Takes over the lock `key` held under `token` (a token handed over by the process that
/// acquired it, as `lock_token` gives it): `*out_lock` becomes an ordinary handle, checked
/// on the server, with the lock's fencing token and the lease its key has left, renewed to
/// `ttl_ms` unless `opts->renew` is false. `opts` as in `lock_acquire_opts` (NULL for the
/// defaults; `reentrant` and `min_replicas` are refused). Blocking: one round trip. The
/// hand-over contract: once it has handed the token over, the first holder no longer relies
/// on the lock and does not release it while the adopter works (`lock_abandon`, or a
/// release once the work is done); a release by either ends the lock for both, and the
/// other learns it only at its next renewal or extend.
///
/// Results: `LOCK_OK`; `LOCK_NOT_HELD` when the key does not hold `token`;
/// `LOCK_ERR_ARGUMENT` (NULL, bad key, empty or over-long token, ttl under 10 ms, a
/// reentrant lock, a Redlock client); `LOCK_ERR_HANDLE`; `LOCK_ERR_CONNECTION`;
/// `LOCK_ERR_REDIS`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_adopt(
    client: lock_client_t,
    key: *const c_char,
    token: *const c_char,
    ttl_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
) -> i32 {
    let hold = AcquireArgs {
        client,
        name: key,
        ttl_ms,
        wait_ms: 0,
        opts,
        out_lock,
        adopt: Some(token),
    };
    // SAFETY: the pointers are NULL or valid as this function's contract says, which is
    // the one `AcquireArgs::run` needs.
    boundary(|| unsafe { hold.run("key", |client, key| Ok(client.lock(key))) })
}

/// `side` of `lock_rwlock_acquire`: a read hold, shared with other readers.
pub const LOCK_RW_READ: i32 = 1;
/// `side` of `lock_rwlock_acquire`: the write hold, exclusive.
pub const LOCK_RW_WRITE: i32 = 2;

/// Acquires one permit of the counting semaphore `name`, which lets at most `permits`
/// holders in at once, for `ttl_ms`, renewed while held (unless `opts` says otherwise).
/// Blocking.
///
/// The permit is an ordinary `lock_t`: give it back with `lock_release`, and use it with
/// every function that takes a `lock_t` (`lock_extend`, `lock_is_held`,
/// `lock_fencing_token`, `lock_token`, `lock_remaining_ms`); it has its own lease, lost
/// signal (`opts->on_lost`) and fencing token (increasing per name, over all its permits).
/// A crashed holder's permit frees itself after its ttl, by the server's clock. Every
/// caller of one name should pass the same `permits`: a caller passing more may take
/// permits beyond a smaller count. A release wakes one waiter, which then tries again (no
/// order among a semaphore's waiters).
///
/// `wait_ms`, `opts` (NULL for the defaults) and `*out_lock` as in `lock_acquire_opts`.
/// Results as there, and: `LOCK_BUSY` when no permit was free when the wait ended;
/// `LOCK_ERR_ARGUMENT` for `permits` 0 or a Redlock client (it takes mutexes only), nothing
/// sent; `LOCK_ERR_REDIS` when `name` is in use by another kind of lock (a mutex or a
/// read-write lock; `lock_last_error` says so) or for another server error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_semaphore_acquire(
    client: lock_client_t,
    name: *const c_char,
    permits: u32,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
) -> i32 {
    let hold = AcquireArgs {
        client,
        name,
        ttl_ms,
        wait_ms,
        opts,
        out_lock,
        adopt: None,
    };
    // SAFETY: as in lock_acquire_opts: this function's contract is that one.
    boundary(|| unsafe { hold.run("name", |client, name| Ok(client.semaphore(name, permits))) })
}

/// Acquires a hold of the read-write lock `name`: `side` `LOCK_RW_READ` for a read hold
/// (shared with other readers) or `LOCK_RW_WRITE` for the write hold (exclusive: no reader
/// and no other writer), for `ttl_ms`, renewed while held (unless `opts` says otherwise).
/// Blocking. A waiting writer keeps new readers out, so a stream of readers cannot starve
/// it.
///
/// The hold is an ordinary `lock_t`: give it back with `lock_release`, and use it with every
/// function that takes a `lock_t`; each reader's lease, like the writer's, is its own,
/// token-checked and renewed, with its own fencing token.
///
/// `wait_ms`, `opts` (NULL for the defaults) and `*out_lock` as in `lock_acquire_opts`.
/// Results as there, and: `LOCK_BUSY` when that side was still unavailable when the wait
/// ended (a writer holds or waits, for a reader; anyone holds, for a writer);
/// `LOCK_ERR_ARGUMENT` for a `side` other than `LOCK_RW_READ` and `LOCK_RW_WRITE` or a
/// Redlock client (it takes mutexes only), nothing sent; `LOCK_ERR_REDIS` when `name` is in
/// use by another kind of lock (a mutex or a semaphore; `lock_last_error` says so) or for
/// another server error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_rwlock_acquire(
    client: lock_client_t,
    name: *const c_char,
    side: i32,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
) -> i32 {
    let hold = AcquireArgs {
        client,
        name,
        ttl_ms,
        wait_ms,
        opts,
        out_lock,
        adopt: None,
    };
    // SAFETY: as in lock_acquire_opts: this function's contract is that one.
    boundary(|| unsafe {
        hold.run("name", |client, name| match side {
            LOCK_RW_READ => Ok(client.rwlock(name).read()),
            LOCK_RW_WRITE => Ok(client.rwlock(name).write()),
            other => Err(Failure::argument(format!(
                "side {other} is neither LOCK_RW_READ (1) nor LOCK_RW_WRITE (2)"
            ))),
        })
    })
}

/// The arguments every acquire function shares, whatever the kind of lock.
struct AcquireArgs {
    client: lock_client_t,
    name: *const c_char,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_lock: *mut lock_t,
    /// Adopt the lock held under this token (`lock_adopt`; the pointer may be NULL, which
    /// is refused) instead of acquiring.
    adopt: Option<*const c_char>,
}

impl AcquireArgs {
    /// The one body of the acquire functions: converts the arguments, lets `describe`
    /// start the builder of the hold's kind on the client and name (`what` names the name
    /// argument in messages), applies the options and the wait convention (0: try once;
    /// `UINT64_MAX`: wait as long as it takes), and writes the new handle.
    ///
    /// # Safety
    /// `name` is NULL or NUL-terminated and outlives this call; `opts` is NULL or filled by
    /// `lock_acquire_options_init` (at least `opts->size` readable bytes); `out_lock` is
    /// NULL or writable.
    unsafe fn run(
        self,
        what: &str,
        describe: impl for<'a> FnOnce(&'a Client, &'a str) -> Result<LockBuilder<'a>, Failure>,
    ) -> Result<(), Failure> {
        // The options first: from here on, every way out gives `user_data` back (its
        // `user_data_free`), a failed argument check included.
        let opts = if self.opts.is_null() {
            default_acquire_options()
        } else {
            // SAFETY: non-NULL and filled by lock_acquire_options_init (this function's
            // contract); read_sized checks the size.
            unsafe {
                read_sized(
                    self.opts,
                    default_acquire_options(),
                    &acquire_options_sizes(),
                    "opts",
                )
            }?
        };
        let on_lost = opts.on_lost.map(|callback| {
            (
                callback,
                UserData::owned(opts.user_data, opts.user_data_free),
            )
        });
        // SAFETY: `name` is NULL or NUL-terminated and outlives this call (this function's
        // contract).
        let name = unsafe { str_arg(self.name, what) }?;
        // SAFETY: `out_lock` is NULL or writable (this function's contract).
        let out = unsafe { Out::new(self.out_lock, "out_lock") }?;
        let adopt = match self.adopt {
            None => None,
            // SAFETY: NULL or NUL-terminated and outliving this call (lock_adopt's
            // contract).
            Some(token) => Some(unsafe { str_arg(token, "token") }?),
        };
        let cancel = cancel_of(opts.cancel)?;
        // SAFETY: `opts->owner` is NULL or NUL-terminated and outlives this call (the
        // caller's contract, as documented on the field).
        let owner = unsafe { opt_str_arg(opts.owner, "owner") }?;
        let owner_thread = (opts.reentrant && owner.is_none()).then(|| std::thread::current().id());
        let client_handle = self.client;
        let (ttl_ms, wait_ms) = (self.ttl_ms, self.wait_ms);
        let make = |client: Arc<Client>, handle: lock_t| -> Result<LockEntry, Failure> {
            let mut builder = describe(&client, name)?
                .ttl(millis(ttl_ms))
                .renew(opts.renew);
            if let Some((callback, user_data)) = on_lost {
                builder = builder.on_lost(move |reason| {
                    let reason = match reason {
                        LostReason::Unreachable => LOCK_LOST_UNREACHABLE,
                        _ => LOCK_LOST_NOT_HELD,
                    };
                    // SAFETY: the caller promised a callable function and user_data that
                    // stays valid while the lock is held.
                    unsafe { callback(handle, reason, user_data.get()) }
                });
            }
            if let Some(cancel) = &cancel {
                builder = builder.cancel_token(cancel);
            }
            if opts.min_replicas > 0 {
                builder =
                    builder.min_replicas(opts.min_replicas, millis(opts.min_replicas_timeout_ms));
            }
            if opts.reentrant {
                builder = match owner {
                    Some(owner) => builder.reentrant_as(owner),
                    None => builder.reentrant(),
                };
            }
            if let Some(hook) = opts.on_interrupt {
                let user_data = UserData::owned(opts.interrupt_user_data, None);
                // SAFETY: the caller promised a callable function; it runs on this thread,
                // during this call.
                builder = builder.on_interrupt(move || unsafe { hook(user_data.get()) } != 0);
            }
            let guard = match (adopt, wait_ms) {
                (Some(token), _) => builder.adopt(token),
                (None, 0) => builder.try_acquire(),
                (None, u64::MAX) => builder.acquire(),
                (None, ms) => builder.acquire_timeout(millis(ms)),
            }?;
            Ok(LockEntry {
                client: client_handle,
                guard,
                owner_thread,
            })
        };
        let made = handles::insert_child(&CLIENTS, &LOCKS, client_handle, make);
        let handle = match made {
            Ok(handle) => handle,
            Err(ChildError::NoParent) => return Err(Failure::handle("client")),
            Err(ChildError::Make(failure)) => return Err(failure),
            // A close of the client that ran during the wait could not release this lock:
            // it did not exist yet. Given back by whichever of the two took the entry out.
            Err(ChildError::Orphaned(entry)) => {
                if let Some(entry) = entry {
                    if let Err(e) = entry.guard.release_shared() {
                        log::warn!("releasing a lock acquired as its client was closed: {e}");
                    }
                }
                return Err(Failure::new(
                    LOCK_ERR_HANDLE,
                    "the client was closed during the acquire; the lock it got was given back",
                ));
            }
        };
        out.write(handle);
        Ok(())
    }
}

/// The caller's `user_data`, handed to a callback (on the renewal thread for `on_lost`),
/// and given back through `free` when the last callback that holds it is dropped: a
/// released hold's callback is dropped once no loss report is running it.
struct UserData {
    ptr: *mut c_void,
    free: lock_user_data_free_cb,
}
// SAFETY: the pointer is only passed back to the caller's callbacks; the header tells the
// caller on which threads they run.
unsafe impl Send for UserData {}
// SAFETY: as for Send: the pointer is never dereferenced here, only passed back.
unsafe impl Sync for UserData {}

impl UserData {
    fn owned(ptr: *mut c_void, free: lock_user_data_free_cb) -> Self {
        UserData { ptr, free }
    }

    fn get(&self) -> *mut c_void {
        self.ptr
    }
}

impl Drop for UserData {
    fn drop(&mut self) {
        if let Some(free) = self.free {
            let ptr = self.ptr;
            // SAFETY: the caller promised a callable function; this is its one call.
            crate::process::call_out(|| unsafe { free(ptr) })
        }
    }
}

/// Stops renewal, then releases the lock if the key still holds its token. Blocking (one
/// round trip). The handle is spent whatever the result, except in one case: a hold of a
/// reentrant lock taken for the calling thread (`opts->reentrant` without an owner) may
/// only be released by that thread; from another, `LOCK_NOT_HELD` and nothing changes.
/// Once it has begun, this hold's `on_lost` is not called any more (for a reentrant lock,
/// the other holds are still told of a loss); a call already running on another thread,
/// for a loss found just before, runs to its end.
/// A reentrant lock is released with its last hold (the others give back one hold each).
///
/// Results: `LOCK_OK` when the lock was held without a break up to the release;
/// `LOCK_NOT_HELD` when the lease had already ended or the lock had been lost (part of the
/// critical section may have run unprotected; the key is deleted all the same if it still
/// holds the token); `LOCK_ERR_CONNECTION` / `LOCK_ERR_REDIS` when Redis
/// could not be told (the lock then expires after its ttl); `LOCK_ERR_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_release(lock: lock_t) -> i32 {
    boundary(|| {
        take_own(lock, "release")?.guard.release_shared()?;
        Ok(())
    })
}

/// Lets go of a lock without releasing it: stops its renewal and spends the handle, sending
/// nothing, so that the key keeps the token until its lease ends, as if the process had
/// crashed (a lease that must outlive its holder, as redis-py's locks do when forgotten).
/// The lost-lock callback is not called any more. The same thread rule as `lock_release`
/// holds for a reentrant lock's thread-owned hold. In a forked child it only spends the
/// handle (the lock and its renewal are the parent's). Results: `LOCK_OK`,
/// `LOCK_NOT_HELD` (another thread's hold; nothing changes), `LOCK_ERR_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_abandon(lock: lock_t) -> i32 {
    boundary(|| {
        take_own(lock, "abandon")?.guard.abandon_shared();
        Ok(())
    })
}

/// Takes `lock` out of the handle table for the calling thread to `doing` it: refused
/// (`LOCK_NOT_HELD`, the handle kept) for a reentrant lock's hold owned by another thread.
fn take_own(lock: lock_t, doing: &str) -> Result<Arc<LockEntry>, Failure> {
    let entry = LOCKS.get(lock).ok_or_else(|| Failure::handle("lock"))?;
    if entry
        .owner_thread
        .is_some_and(|owner| owner != std::thread::current().id())
    {
        return Err(Failure::new(
            LOCK_NOT_HELD,
            format!(
                "lock {:?}: this hold belongs to the thread that acquired it; another thread \
                 may not {doing} it",
                entry.guard.key()
            ),
        ));
    }
    LOCKS.remove(lock).ok_or_else(|| Failure::handle("lock"))
}

/// Sets the lease to `ttl_ms` from now if the key still holds the token. Blocking: waits
/// for a renewal in flight, then one round trip, cut off at the lease's local deadline.
/// Results: `LOCK_OK`, `LOCK_NOT_HELD` (the lock was lost, now or before, also when the
/// extend was not confirmed before the lease ended: a loss is final), `LOCK_ERR_ARGUMENT`
/// (ttl under 10 ms), `LOCK_ERR_HANDLE`, `LOCK_ERR_CONNECTION` (the extend may or may not
/// have happened; the lock then never assumes more than the shorter of the two ttls
/// again), `LOCK_ERR_REDIS`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_extend(lock: lock_t, ttl_ms: u64) -> i32 {
    boundary(|| with_guard(lock, |g| Ok(g.extend(millis(ttl_ms))?)))
}

/// Writes whether the lock is held, by the local view: not released, not lost, lease not
/// ended by the local clock. Sends nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_is_held(lock: lock_t, out_held: *mut bool) -> i32 {
    boundary(|| {
        // SAFETY: `out_held` is NULL or writable (the caller's contract).
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
        // SAFETY: `out_token` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_token, "out_token") }?;
        out.write(with_guard(lock, |g| Ok(g.fencing_token()))?);
        Ok(())
    })
}

/// Room for any token with its terminating NUL.
pub const LOCK_TOKEN_MAX: usize = 128;
const _: () = assert!(crate::MAX_TOKEN_LEN + 1 == LOCK_TOKEN_MAX);

/// Copies the lock's token (the value stored under the key), NUL-terminated, into `buf` of
/// `buf_len` bytes. `LOCK_ERR_ARGUMENT` when `buf` is NULL or too small
/// (`LOCK_TOKEN_MAX` is always enough); `buf` is written only on `LOCK_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_token(lock: lock_t, buf: *mut c_char, buf_len: usize) -> i32 {
    boundary(|| {
        let token = with_guard(lock, |g| Ok(g.token().to_owned()))?;
        // SAFETY: `buf` is NULL or writable for `buf_len` bytes (the caller's contract).
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
        // SAFETY: `buf` is NULL or writable for `buf_len` bytes (the caller's contract).
        unsafe { copy_out(client.url(), buf, buf_len) }
    })
}

/// Writes the lease left by the local clock (minus a drift allowance), in ms; 0 once lost.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_remaining_ms(lock: lock_t, out_ms: *mut u64) -> i32 {
    boundary(|| {
        // SAFETY: `out_ms` is NULL or writable (the caller's contract).
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
        // SAFETY: `key` is NULL or NUL-terminated (the caller's contract).
        let key = unsafe { str_arg(key, "key") }?;
        // SAFETY: `out_locked` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_locked, "out_locked") }?;
        out.write(self::client(client)?.is_locked(key)?);
        Ok(())
    })
}

/// Makes a cancel handle for `lock_acquire_options_t.cancel`. Free it with
/// `lock_cancel_free`. Errors: `LOCK_ERR_ARGUMENT` for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_cancel_new(out_cancel: *mut lock_cancel_t) -> i32 {
    boundary(|| {
        // SAFETY: `out_cancel` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_cancel, "out_cancel") }?;
        out.write(CANCELS.insert(CancelToken::new()));
        Ok(())
    })
}

/// Cancels: every acquire given this handle (`lock_acquire_opts`,
/// `lock_semaphore_acquire`, `lock_rwlock_acquire`) that is waiting returns
/// `LOCK_CANCELLED` promptly, holding nothing; one given it later with `wait_ms` > 0 returns
/// `LOCK_CANCELLED` at once, without trying (a try-once acquire ignores it). Does not
/// block. Not async-signal-safe (it looks the handle up under a mutex): from a signal
/// handler use `lock_cancel_all`. Errors: `LOCK_ERR_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cancel(cancel: lock_cancel_t) -> i32 {
    boundary(|| {
        CANCELS
            .get(cancel)
            .ok_or_else(|| Failure::handle("cancel"))?
            .cancel();
        Ok(())
    })
}

/// Frees a cancel handle (acquires already using it keep working). Errors:
/// `LOCK_ERR_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cancel_free(cancel: lock_cancel_t) -> i32 {
    boundary(|| {
        CANCELS
            .remove(cancel)
            .ok_or_else(|| Failure::handle("cancel"))?;
        Ok(())
    })
}

/// For shutting down: makes every acquire of this process that waits (`wait_ms` > 0), in
/// progress or started later, return `LOCK_CANCELLED` promptly, until
/// `lock_cancel_reset`. Async-signal-safe: a SIGTERM handler may call it (it stores to an
/// atomic and writes to an eventfd, nothing else; `errno` is preserved). Always `LOCK_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cancel_all() -> i32 {
    // No boundary: it cannot panic, and the boundary touches thread-local state, which is
    // not async-signal-safe.
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread.
    let errno = unsafe { *libc::__errno_location() };
    crate::cancel_all();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    LOCK_OK
}

/// Undoes `lock_cancel_all` for acquires started from now on. Always `LOCK_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cancel_reset() -> i32 {
    crate::reset_cancel_all();
    LOCK_OK
}

/// For exiting: waits up to `limit_ms` for the give-backs this process sends in the
/// background, and writes whether none is left. An acquire whose reply never came (lost,
/// or late past the call's bound) gives back what it may have taken on a thread of its
/// own, bounded by one I/O timeout, so that the call keeps its own bound; a program that
/// exits right after such a failure (a cron job) calls this first, or the lock it may
/// have taken stays held until its ttl. Blocking; returns at once when nothing is in
/// flight. Thread-safe. Errors: `LOCK_ERR_ARGUMENT` (`out_done` NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_wait_for_background_withdrawals(
    limit_ms: u64,
    out_done: *mut bool,
) -> i32 {
    boundary(|| {
        // SAFETY: `out_done` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_done, "out_done") }?;
        out.write(crate::wait_for_background_withdrawals(
            Duration::from_millis(limit_ms),
        ));
        Ok(())
    })
}

/// This thread's message for its last call: empty after `LOCK_OK`. Never NULL; valid until
/// this thread's next call into the library. Never contains the URL's password.
#[unsafe(no_mangle)]
pub extern "C" fn lock_last_error() -> *const c_char {
    status::last_error()
}

/// Fills `info` with what this thread's last call (other than this one, `lock_last_error`,
/// `lock_status_name` and `lock_version`) ended with, beyond its status: whether a request
/// went out whose reply never came (`outcome_unknown`), and whether it failed for a timeout
/// or a connection failure (`cause`): a refused or unreachable server is
/// `LOCK_CAUSE_CONNECTION` without `outcome_unknown` (nothing was sent). Pass
/// `sizeof *info` as `size`. Does not change what it reports. Errors: `LOCK_ERR_ARGUMENT`
/// for NULL or a size that is not the size of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_last_error_info(info: *mut lock_error_info_t, size: usize) -> i32 {
    let (status, outcome_unknown, cause) = status::last_info();
    let now = lock_error_info_t {
        size,
        status,
        outcome_unknown,
        cause,
    };
    let sizes = [std::mem::size_of::<lock_error_info_t>()];
    // SAFETY: `info` is NULL or writable for `size` bytes (the caller's contract).
    match unsafe { init_sized(info, size, now, &sizes, "info") } {
        Ok(()) => LOCK_OK,
        Err(failure) => failure.status,
    }
}

/// The name of a status code (`"LOCK_BUSY"`, ...), a static string; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn lock_status_name(status: i32) -> *const c_char {
    status::status_name(status).as_ptr()
}

/// The library's version, `"MAJOR.MINOR.PATCH"` (a static string). Compare it with the
/// `REDLEASE_VERSION_*` macros of the header you compiled with: the library must be at
/// least as new, with the same SONAME (see the README's ABI policy).
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

/// Sends the library's log records (renewal retries, lost locks nobody was told about,
/// server warnings, ...) to `callback`: those at `min_level` or more severe
/// (`LOCK_LOG_WARN` gives warnings and errors). A NULL `callback` turns logging off (the
/// default; `min_level` is then ignored). Replaces any earlier callback; once this returns,
/// the earlier callback is never called again and its `user_data` may be freed (the call
/// waits for a callback in flight).
///
/// `callback` runs on whichever thread logs, renewal threads included: see `lock_log_cb`
/// for what it may do. `user_data` is passed to it as is.
///
/// The library installs its own logger for the Rust `log` facade on the first call, for
/// the life of the process. In a program that links redlease as a Rust crate and has
/// installed another logger (env_logger, ...), the records go to that logger and this
/// function fails with `LOCK_ERR_INTERNAL`; the C and Python libraries carry their own
/// copy of the facade, so there it cannot happen.
/// Errors: `LOCK_ERR_ARGUMENT` for a `min_level` out of 1..5 with a callback, or a call
/// from inside the callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_set_log_callback(
    min_level: i32,
    callback: lock_log_cb,
    user_data: *mut c_void,
) -> i32 {
    boundary(|| logging::set_callback(min_level, callback, user_data))
}
