//! The operators' views of the C ABI: who holds a lock (`lock_inspect`), every lock held
//! (`lock_list`), breaking one (`lock_break`), the server's settings (`lock_check`) and the
//! process's figures (`lock_stats`, `lock_stats_since`, `lock_renewal_stats`). Each is a call of the Rust API; this
//! module only converts its result to C structures, which the library allocates and the
//! caller frees with the matching `_free` function.

use std::ffi::{CString, c_char};
use std::ptr;
use std::time::Duration;

use super::args::{Out, str_arg};
use super::init_sized;
use super::status::{Failure, boundary};
use super::{client, lock_client_t};
use crate::{HeldAs, LockInfo, ServerCheck};

/// `remaining_ms` of a lock without expiry, or of a free one.
pub const LOCK_NO_EXPIRY: u64 = u64::MAX;

/// What a lock looks like on the server right now. Made by `lock_inspect` (one) and
/// `lock_list` (a list linked by `next`); free it with `lock_info_free`. Read-only; a later
/// version may add fields at the end.
#[repr(C)]
pub struct lock_info_t {
    /// The lock key, the client's key prefix included.
    pub key: *mut c_char,
    /// The value under the key: the holder's token (`uuid:host/pid` for redlease holders),
    /// or NULL when nobody holds it. A NUL byte in a value written by another program is
    /// shown as `\0`.
    pub holder: *mut c_char,
    /// How long the key lives unless renewed, in ms; `LOCK_NO_EXPIRY` when free or without
    /// expiry.
    pub remaining_ms: u64,
    /// The last fencing token handed out for this name; 0 when none.
    pub fencing_token: u64,
    /// Waiters registered now.
    pub waiters: u64,
    /// For a reentrant lock, its owner (NULL otherwise) ...
    pub owner: *mut c_char,
    /// ... and how many holds the owner has (0 otherwise).
    pub holds: u64,
    /// The next lock of a `lock_list` result; NULL at the end.
    pub next: *mut lock_info_t,
    /// What holds the name now: `LOCK_HELD_NONE` (free), `LOCK_HELD_MUTEX`,
    /// `LOCK_HELD_SEMAPHORE` or `LOCK_HELD_RWLOCK` (`holder` is then the writer's token, or
    /// NULL when readers hold it).
    pub held_as: i32,
    /// A semaphore's permits held, or a read-write lock's readers; 0 otherwise.
    pub count: u64,
}

/// `lock_info_t.held_as`: nobody holds the name.
pub const LOCK_HELD_NONE: i32 = 0;
/// `lock_info_t.held_as`: a mutex (reentrant or not).
pub const LOCK_HELD_MUTEX: i32 = 1;
/// `lock_info_t.held_as`: a counting semaphore (`count` permits held).
pub const LOCK_HELD_SEMAPHORE: i32 = 2;
/// `lock_info_t.held_as`: a read-write lock (its writer, or `count` readers).
pub const LOCK_HELD_RWLOCK: i32 = 3;

/// The server's version, eviction policy and persistence, and the latency of a few round
/// trips (`lock_check`); for a Cluster, one of its primaries. Free it with
/// `lock_server_check_free`. Read-only; a later version may add fields at the end.
#[repr(C)]
pub struct lock_server_check_t {
    /// `redis_version` of `INFO server`.
    pub version: *mut c_char,
    /// `maxmemory-policy`; NULL when `CONFIG` is not permitted (as are the next three).
    pub maxmemory_policy: *mut c_char,
    /// `save` (RDB snapshots; empty: none).
    pub save: *mut c_char,
    /// `appendonly`.
    pub appendonly: *mut c_char,
    /// `appendfsync`.
    pub appendfsync: *mut c_char,
    /// Whether the eviction policy can delete lock keys (anything but `noeviction`).
    pub may_evict_locks: bool,
    /// Whether a restart loses data (no RDB snapshots and no AOF): 1 yes, 0 no, -1 unknown
    /// (`CONFIG` not permitted).
    pub loses_data_on_restart: i32,
    /// Round trips of a few `PING`s, in µs: `round_trip_count` of them.
    pub round_trips_us: *mut u64,
    /// How many round trips `round_trips_us` holds.
    pub round_trip_count: usize,
}

/// The renewal figures of this process so far (every client): fill with
/// `lock_renewal_stats(&stats, sizeof stats)`. Subtract two snapshots for an interval's
/// counts. A later version may add fields at the end.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lock_renewal_stats_t {
    /// `sizeof` the struct, as the caller passed it.
    pub size: usize,
    /// Renewals that succeeded.
    pub renewals: u64,
    /// Renewal attempts that failed (a lock is lost only when none succeeds in time).
    pub failures: u64,
    /// The latest renewal ever sent, past its due time, in µs.
    pub max_lateness_us: u64,
    /// The median lateness of the renewals (to within 19 %), in µs.
    pub lateness_p50_us: u64,
    /// The 90th percentile of the lateness, in µs.
    pub lateness_p90_us: u64,
    /// The 99th percentile of the lateness, in µs.
    pub lateness_p99_us: u64,
    /// The 99.9th percentile of the lateness, in µs.
    pub lateness_p999_us: u64,
}

/// A C copy of `text` for the caller to free with `free_text`; a NUL byte becomes `\0`.
fn text(text: &str) -> *mut c_char {
    CString::new(text.replace('\0', "\\0"))
        .unwrap_or_default()
        .into_raw()
}

fn opt_text(value: Option<&str>) -> *mut c_char {
    value.map_or(ptr::null_mut(), text)
}

/// Frees a string made by `text` (NULL is fine).
///
/// # Safety
/// `p` is NULL or came from `text` and was not freed.
unsafe fn free_text(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: made by CString::into_raw in `text` (the caller's contract).
        drop(unsafe { CString::from_raw(p) });
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn info_node(info: &LockInfo, next: *mut lock_info_t) -> *mut lock_info_t {
    let (owner, holds) = match &info.reentrant {
        Some((owner, holds)) => (text(owner), *holds),
        None => (ptr::null_mut(), 0),
    };
    Box::into_raw(Box::new(lock_info_t {
        key: text(&info.key),
        holder: opt_text(info.holder.as_deref()),
        remaining_ms: info.remaining.map_or(LOCK_NO_EXPIRY, |d| {
            u64::try_from(d.as_millis()).unwrap_or(LOCK_NO_EXPIRY)
        }),
        fencing_token: info.fencing_token.unwrap_or(0),
        waiters: info.waiters,
        owner,
        holds,
        next,
        held_as: match info.held_as {
            None => LOCK_HELD_NONE,
            Some(HeldAs::Mutex) => LOCK_HELD_MUTEX,
            Some(HeldAs::Semaphore { .. }) => LOCK_HELD_SEMAPHORE,
            Some(HeldAs::ReadWrite { .. }) => LOCK_HELD_RWLOCK,
        },
        count: match info.held_as {
            Some(HeldAs::Semaphore { permits }) => permits,
            Some(HeldAs::ReadWrite { readers }) => readers,
            _ => 0,
        },
    }))
}

/// Writes who holds the lock `name` now, for how long, its last fencing token and its
/// waiters, as a new `lock_info_t` to free with `lock_info_free`. One round trip; blocking,
/// bounded like `lock_is_locked`. Errors: `LOCK_ERR_ARGUMENT` (NULL or bad name, or a
/// Redlock client), `LOCK_ERR_HANDLE`, `LOCK_ERR_CONNECTION`, `LOCK_ERR_REDIS`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_inspect(
    client: lock_client_t,
    name: *const c_char,
    out_info: *mut *mut lock_info_t,
) -> i32 {
    boundary(|| {
        // SAFETY: `name` is NULL or NUL-terminated (the caller's contract).
        let name = unsafe { str_arg(name, "name") }?;
        // SAFETY: `out_info` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_info, "out_info") }?;
        let info = self::client(client)?.inspect(name)?;
        out.write(info_node(&info, ptr::null_mut()));
        Ok(())
    })
}

/// Writes the locks whose names match the glob `pattern` (`*`, `?`) that are held now, at
/// most `limit` of them, as a list linked by `next` (NULL when there is none) to free with
/// `lock_info_free`, and their number. Scans the keyspace (`SCAN`, in steps); blocking.
/// Errors as `lock_inspect`; `LOCK_ERR_ARGUMENT` also for a `limit` of 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_list(
    client: lock_client_t,
    pattern: *const c_char,
    limit: usize,
    out_list: *mut *mut lock_info_t,
    out_count: *mut usize,
) -> i32 {
    boundary(|| {
        // SAFETY: `pattern` is NULL or NUL-terminated (the caller's contract).
        let pattern = unsafe { str_arg(pattern, "pattern") }?;
        // SAFETY: both are NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_list, "out_list") }?;
        // SAFETY: as above.
        let count = unsafe { Out::new(out_count, "out_count") }?;
        if limit == 0 {
            return Err(Failure::argument("limit is 0: ask for at least one lock"));
        }
        let infos = self::client(client)?.locks(pattern, limit)?;
        let mut head = ptr::null_mut();
        for info in infos.iter().rev() {
            head = info_node(info, head);
        }
        out.write(head);
        count.write(infos.len());
        Ok(())
    })
}

/// Frees what `lock_inspect` or `lock_list` wrote (the whole list). NULL is fine.
///
/// The pointer must come from one of those calls and not have been freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_info_free(list: *mut lock_info_t) -> i32 {
    boundary(|| {
        let mut node = list;
        while !node.is_null() {
            // SAFETY: made by Box::into_raw in `info_node`, not freed yet (the caller's
            // contract); its strings were made by `text`.
            let info = unsafe { Box::from_raw(node) };
            // SAFETY: as above.
            unsafe {
                free_text(info.key);
                free_text(info.holder);
                free_text(info.owner);
            }
            node = info.next;
        }
        Ok(())
    })
}

/// Deletes the lock `name` held by someone else, but only while its key still holds
/// `holder` (the value `lock_inspect` showed), so a lock that changed hands is left alone.
/// The old holder finds its lock lost at its next renewal; its critical section may still
/// run: use it only for a holder known to be gone, and rely on fencing tokens. Blocking.
/// Breaks a mutex or a read-write lock's writer. Errors: `LOCK_NOT_HELD` when the key no
/// longer holds `holder` (nothing deleted); `LOCK_ERR_ARGUMENT` for a counting semaphore
/// (its permits end with their own leases; nothing deleted); and as `lock_inspect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_break(
    client: lock_client_t,
    name: *const c_char,
    holder: *const c_char,
) -> i32 {
    boundary(|| {
        // SAFETY: both are NULL or NUL-terminated (the caller's contract).
        let name = unsafe { str_arg(name, "name") }?;
        // SAFETY: as above.
        let holder = unsafe { str_arg(holder, "holder") }?;
        self::client(client)?.break_lock(name, holder)?;
        Ok(())
    })
}

/// Connects and writes the server's version, eviction policy and persistence, and the
/// latency of a few round trips, as a new `lock_server_check_t` to free with
/// `lock_server_check_free`. Blocking (a few round trips, each bounded like
/// `lock_is_locked`). Errors as `lock_inspect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_check(
    client: lock_client_t,
    out_check: *mut *mut lock_server_check_t,
) -> i32 {
    boundary(|| {
        // SAFETY: `out_check` is NULL or writable (the caller's contract).
        let out = unsafe { Out::new(out_check, "out_check") }?;
        let check: ServerCheck = self::client(client)?.check()?;
        let trips: Box<[u64]> = check.round_trips.iter().copied().map(micros).collect();
        let round_trip_count = trips.len();
        let (appendonly, appendfsync) = match &check.appendonly {
            Some((aof, fsync)) => (text(aof), text(fsync)),
            None => (ptr::null_mut(), ptr::null_mut()),
        };
        out.write(Box::into_raw(Box::new(lock_server_check_t {
            version: text(&check.version),
            maxmemory_policy: opt_text(check.maxmemory_policy.as_deref()),
            save: opt_text(check.save.as_deref()),
            appendonly,
            appendfsync,
            may_evict_locks: check.may_evict_locks(),
            loses_data_on_restart: check.loses_data_on_restart().map_or(-1, i32::from),
            round_trips_us: Box::into_raw(trips).cast::<u64>(),
            round_trip_count,
        })));
        Ok(())
    })
}

/// Frees what `lock_check` wrote. NULL is fine. The pointer must come from `lock_check` and
/// not have been freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_server_check_free(check: *mut lock_server_check_t) -> i32 {
    boundary(|| {
        if check.is_null() {
            return Ok(());
        }
        // SAFETY: made by Box::into_raw in `lock_check`, not freed yet (the caller's
        // contract); its strings by `text`, its array from a boxed slice of that length.
        unsafe {
            let check = Box::from_raw(check);
            for p in [
                check.version,
                check.maxmemory_policy,
                check.save,
                check.appendonly,
                check.appendfsync,
            ] {
                free_text(p);
            }
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                check.round_trips_us,
                check.round_trip_count,
            )));
        }
        Ok(())
    })
}

/// Fills `stats` with this process's renewal figures (every client): pass `sizeof *stats`
/// as `size`. Never blocks (a few hundred atomic loads). Errors: `LOCK_ERR_ARGUMENT` for
/// NULL or a size that is not the size of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_renewal_stats(stats: *mut lock_renewal_stats_t, size: usize) -> i32 {
    boundary(|| {
        let s = crate::renewal_stats();
        let q = |q: f64| micros(s.lateness_quantile(q));
        let now = lock_renewal_stats_t {
            size,
            renewals: s.renewals,
            failures: s.failures,
            max_lateness_us: micros(s.max_lateness),
            lateness_p50_us: q(0.5),
            lateness_p90_us: q(0.9),
            lateness_p99_us: q(0.99),
            lateness_p999_us: q(0.999),
        };
        // SAFETY: `stats` is NULL or writable for `size` bytes (the caller's contract).
        unsafe {
            init_sized(
                stats,
                size,
                now,
                &[std::mem::size_of::<lock_renewal_stats_t>()],
                "stats",
            )
        }
    })
}

/// Buckets of the duration histograms in `lock_stats_t`.
pub const LOCK_STATS_BUCKETS: usize = 108;
const _: () = assert!(LOCK_STATS_BUCKETS == crate::stats::BUCKETS);

/// This process's figures (every client), for graphs: fill with `lock_stats(&stats, sizeof
/// stats)`; the figures of an interval are `lock_stats_since(&now, &earlier, &out, sizeof
/// out)`. Counters only grow; quantiles are to within 19 % and never above the maximum.
/// A later version may add fields at the end.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lock_stats_t {
    /// `sizeof` the struct, as the caller passed it.
    pub size: usize,
    /// Acquires that took the lock (every kind; a reentrant lock's extra holds included).
    pub acquisitions: u64,
    /// Acquires that ended `LOCK_BUSY`.
    pub busy: u64,
    /// Acquires that ended `LOCK_CANCELLED`.
    pub cancelled: u64,
    /// Acquires that failed otherwise (connection, server, replication errors).
    pub failed: u64,
    /// Acquires that had to wait (their first attempt found the lock held).
    pub waits: u64,
    /// The median wait, in µs.
    pub wait_p50_us: u64,
    /// The 90th percentile of the waits, in µs.
    pub wait_p90_us: u64,
    /// The 99th percentile of the waits, in µs.
    pub wait_p99_us: u64,
    /// The longest wait in the life of the process, in µs.
    pub max_wait_us: u64,
    /// Releases that handed the lock straight to a waiter.
    pub handoffs: u64,
    /// Locks lost because the key no longer held their token.
    pub lost_not_held: u64,
    /// Locks lost because Redis stayed unreachable until their lease ran out.
    pub lost_unreachable: u64,
    /// Calls that failed with their outcome unknown (a request out, no reply).
    pub unknown_outcomes: u64,
    /// Renewals that succeeded.
    pub renewals: u64,
    /// Renewal attempts that failed.
    pub renewal_failures: u64,
    /// The median lateness of the renewals, in µs.
    pub lateness_p50_us: u64,
    /// The 99th percentile of the lateness, in µs.
    pub lateness_p99_us: u64,
    /// The latest renewal in the life of the process, past its due time, in µs.
    pub max_lateness_us: u64,
    /// The histogram of the waits (for `lock_stats_since`).
    pub wait_buckets: [u64; LOCK_STATS_BUCKETS],
    /// The histogram of the renewals' lateness (for `lock_stats_since`).
    pub lateness_buckets: [u64; LOCK_STATS_BUCKETS],
}

fn stats_struct(size: usize, s: &crate::Stats) -> lock_stats_t {
    let waited = s.waited();
    let lateness = s.renewals.lateness();
    let mut out = lock_stats_t {
        size,
        acquisitions: s.acquisitions,
        busy: s.busy,
        cancelled: s.cancelled,
        failed: s.failed,
        waits: s.waits,
        wait_p50_us: micros(waited.quantile(0.5)),
        wait_p90_us: micros(waited.quantile(0.9)),
        wait_p99_us: micros(waited.quantile(0.99)),
        max_wait_us: micros(s.max_wait),
        handoffs: s.handoffs,
        lost_not_held: s.lost_not_held,
        lost_unreachable: s.lost_unreachable,
        unknown_outcomes: s.unknown_outcomes,
        renewals: s.renewals.renewals,
        renewal_failures: s.renewals.failures,
        lateness_p50_us: micros(lateness.quantile(0.5)),
        lateness_p99_us: micros(lateness.quantile(0.99)),
        max_lateness_us: micros(s.renewals.max_lateness),
        wait_buckets: [0; LOCK_STATS_BUCKETS],
        lateness_buckets: [0; LOCK_STATS_BUCKETS],
    };
    out.wait_buckets.copy_from_slice(&waited.counts);
    out.lateness_buckets.copy_from_slice(&lateness.counts);
    out
}

/// The `crate::Stats` a `lock_stats_t` describes.
fn stats_of(c: &lock_stats_t) -> crate::Stats {
    crate::stats::from_parts(crate::stats::Parts {
        acquisitions: c.acquisitions,
        busy: c.busy,
        cancelled: c.cancelled,
        failed: c.failed,
        handoffs: c.handoffs,
        lost_not_held: c.lost_not_held,
        lost_unreachable: c.lost_unreachable,
        unknown_outcomes: c.unknown_outcomes,
        renewals: c.renewals,
        renewal_failures: c.renewal_failures,
        wait_counts: c.wait_buckets.to_vec(),
        max_wait: Duration::from_micros(c.max_wait_us),
        lateness_counts: c.lateness_buckets.to_vec(),
        max_lateness: Duration::from_micros(c.max_lateness_us),
    })
}

/// Fills `stats` with this process's figures so far: pass `sizeof *stats` as `size`.
/// Never blocks (a few hundred atomic loads). Errors: `LOCK_ERR_ARGUMENT` for NULL or a
/// size that is not the size of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_stats(stats: *mut lock_stats_t, size: usize) -> i32 {
    boundary(|| {
        let now = stats_struct(size, &crate::stats());
        // SAFETY: `stats` is NULL or writable for `size` bytes (the caller's contract).
        unsafe {
            init_sized(
                stats,
                size,
                now,
                &[std::mem::size_of::<lock_stats_t>()],
                "stats",
            )
        }
    })
}

/// Fills `out` with the figures of the interval from `earlier` to `now` (two snapshots of
/// `lock_stats`, `earlier` taken first): counts of the interval, quantiles of its waits and
/// renewals; the maxima stay those of the whole life of the process. Pass `sizeof *out` as
/// `size`. Errors: `LOCK_ERR_ARGUMENT` for NULL, or a size (also of `now` or `earlier`)
/// that is not the size of a version of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_stats_since(
    now: *const lock_stats_t,
    earlier: *const lock_stats_t,
    out: *mut lock_stats_t,
    size: usize,
) -> i32 {
    boundary(|| {
        let full = std::mem::size_of::<lock_stats_t>();
        let read = |p: *const lock_stats_t, what: &str| -> Result<lock_stats_t, Failure> {
            if p.is_null() {
                return Err(Failure::argument(format!("{what} is NULL")));
            }
            // SAFETY: not NULL, and points to a lock_stats_t (the caller's contract); its
            // size field is read first, the rest only when it is the whole struct.
            let size = unsafe { p.cast::<usize>().read_unaligned() };
            if size != full {
                return Err(Failure::argument(format!(
                    "{what}->size is {size}: fill it with lock_stats(&s, sizeof s)"
                )));
            }
            // SAFETY: as above; the whole struct is there.
            Ok(unsafe { p.read_unaligned() })
        };
        let (now, earlier) = (read(now, "now")?, read(earlier, "earlier")?);
        let interval = stats_of(&now).since(&stats_of(&earlier));
        let value = stats_struct(size, &interval);
        // SAFETY: `out` is NULL or writable for `size` bytes (the caller's contract).
        unsafe { init_sized(out, size, value, &[full], "out") }
    })
}
