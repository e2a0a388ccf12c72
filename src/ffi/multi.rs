//! `lock_acquire_all`: one lock over several names through the C ABI. The Rust API's
//! [`crate::MultiLockBuilder`] takes them; each name then gets an ordinary `lock_t`.

use std::ffi::c_char;
use std::sync::{Arc, Mutex, PoisonError};

use super::args::{read_sized, str_arg};
use super::handles::{self, ChildError};
use super::status::{Failure, boundary};
use super::{
    CLIENTS, LOCK_ERR_HANDLE, LOCK_LOST_NOT_HELD, LOCK_LOST_UNREACHABLE, LOCKS, LockEntry,
    UserData, acquire_options_sizes, cancel_of, client, default_acquire_options,
    lock_acquire_options_t, lock_client_t, lock_t, millis,
};
use crate::LostReason;

/// The handles of a lock over several names, by name, once they exist; a loss reported
/// before then waits for them.
#[derive(Default)]
struct Handles {
    by_name: Option<Vec<(String, lock_t)>>,
    early_loss: Option<(String, LostReason)>,
}

/// Acquires the locks `names[0..count]` all or none: taken in one global order (by Cluster
/// slot, then by key), the names one script can reach (one server, one slot) in one step,
/// so that callers wanting overlapping sets never deadlock, each for
/// `ttl_ms`, renewed while held unless `opts->renew` is false; when one cannot be taken
/// (busy when the wait ends, cancelled, an error) those already taken are given back and
/// nothing is held. `wait_ms` is for the whole: 0 tries each once, `UINT64_MAX` waits as
/// long as it takes. On `LOCK_OK`, `out_locks[i]` is an ordinary handle for `names[i]`
/// (release each, or all with `lock_release`; each has its own fencing token and lease).
/// `opts->on_lost` is called once, with the handle of the first name lost: the whole set
/// is lost then, and the program should give every handle back (each handle still
/// answers for its own name only: `lock_is_held` on another name's handle may say 1, and
/// its `lock_release` `LOCK_OK`, unlike the Rust `MultiGuard`, which reports the whole
/// set); its `user_data` is given back once every handle is done with it.
/// `opts->reentrant`, `owner` and `min_replicas` are refused.
///
/// Results as `lock_acquire_opts` (for the first name that could not be taken), and
/// `LOCK_ERR_ARGUMENT` for `count` 0 or over 1024, a NULL, bad or repeated name: nothing is
/// sent then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_acquire_all(
    client_handle: lock_client_t,
    names: *const *const c_char,
    count: usize,
    ttl_ms: u64,
    wait_ms: u64,
    opts: *const lock_acquire_options_t,
    out_locks: *mut lock_t,
) -> i32 {
    boundary(|| {
        let opts = if opts.is_null() {
            default_acquire_options()
        } else {
            // SAFETY: non-NULL and filled by lock_acquire_options_init (this function's
            // contract); read_sized checks the size.
            unsafe {
                read_sized(
                    opts,
                    default_acquire_options(),
                    &acquire_options_sizes(),
                    "opts",
                )
            }?
        };
        // From here on, every way out gives `user_data` back, once.
        let on_lost = opts.on_lost.map(|callback| {
            (
                callback,
                Arc::new(UserData::owned(opts.user_data, opts.user_data_free)),
            )
        });
        if names.is_null() || out_locks.is_null() {
            return Err(Failure::argument("names or out_locks is NULL"));
        }
        if count == 0 || count > crate::MAX_NAMES {
            return Err(Failure::argument(format!(
                "count must be 1 to {}, got {count}",
                crate::MAX_NAMES
            )));
        }
        if opts.reentrant || !opts.owner.is_null() || opts.min_replicas > 0 {
            return Err(Failure::argument(
                "a lock over several names is not reentrant and takes no min_replicas",
            ));
        }
        let mut list = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `names` points to `count` pointers, each NULL or NUL-terminated (this
            // function's contract).
            let name = unsafe { str_arg(*names.add(i), "a name") }?;
            list.push(name);
        }
        let cancel = cancel_of(opts.cancel)?;
        let client = client(client_handle)?;
        let handles = Arc::new(Mutex::new(Handles::default()));
        let mut builder = client.lock_all(&list).ttl(millis(ttl_ms)).renew(opts.renew);
        if let Some(cancel) = &cancel {
            builder = builder.cancel_token(cancel);
        }
        if let Some((callback, user_data)) = on_lost.clone() {
            let handles = handles.clone();
            builder = builder.on_lost(move |name, reason| {
                let handle = {
                    let mut h = handles.lock().unwrap_or_else(PoisonError::into_inner);
                    match &h.by_name {
                        Some(by_name) => by_name.iter().find(|(n, _)| n == name).map(|(_, l)| *l),
                        None => {
                            h.early_loss = Some((name.to_owned(), reason));
                            None
                        }
                    }
                };
                if let Some(handle) = handle {
                    // SAFETY: the caller promised a callable function and user_data valid
                    // while the locks are held.
                    unsafe { callback(handle, lost_code(reason), user_data.get()) }
                }
            });
        }
        let multi = match wait_ms {
            0 => builder.try_acquire(),
            u64::MAX => builder.acquire(),
            ms => builder.acquire_timeout(millis(ms)),
        }?;
        let mut made: Vec<(String, lock_t)> = Vec::with_capacity(count);
        let mut guards = multi.into_guards().into_iter();
        while let Some((name, guard)) = guards.next() {
            let inserted = handles::insert_child(&CLIENTS, &LOCKS, client_handle, |_, _| {
                Ok::<_, Failure>(LockEntry {
                    client: client_handle,
                    guard,
                    owner_thread: None,
                })
            });
            match inserted {
                Ok(handle) => made.push((name, handle)),
                Err(e) => {
                    // The client was closed meanwhile: give back every name.
                    if let ChildError::Orphaned(Some(entry)) = e {
                        let _ = entry.guard.release_shared();
                    }
                    for (_, rest) in guards {
                        let _ = rest.release();
                    }
                    for (_, handle) in made {
                        if let Some(entry) = LOCKS.remove(handle) {
                            let _ = entry.guard.release_shared();
                        }
                    }
                    return Err(Failure::new(
                        LOCK_ERR_HANDLE,
                        "the client was closed during the acquire; the locks it got were given back",
                    ));
                }
            }
        }
        for (i, name) in list.iter().enumerate() {
            let handle = made.iter().find(|(n, _)| n == name).map_or(0, |(_, h)| *h);
            // SAFETY: `out_locks` has room for `count` handles (this function's contract).
            unsafe { *out_locks.add(i) = handle };
        }
        let early = {
            let mut h = handles.lock().unwrap_or_else(PoisonError::into_inner);
            h.by_name = Some(made.clone());
            h.early_loss.take()
        };
        if let (Some((name, reason)), Some((callback, user_data))) = (early, on_lost) {
            if let Some((_, handle)) = made.iter().find(|(n, _)| *n == name) {
                // SAFETY: as above.
                crate::process::call_out(|| unsafe {
                    callback(*handle, lost_code(reason), user_data.get())
                });
            }
        }
        Ok(())
    })
}

fn lost_code(reason: LostReason) -> i32 {
    match reason {
        LostReason::Unreachable => LOCK_LOST_UNREACHABLE,
        _ => LOCK_LOST_NOT_HELD,
    }
}
