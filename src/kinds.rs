//! The kinds of lock, and what a hold of each is on the server: the scripts that take it,
//! extend it and give it back. Everything else (waiting, leases, renewal, fencing tokens,
//! the lost signal) is shared by all kinds.
//!
//! - **Mutex**: the key holds the token (the canonical `SET NX PX` protocol); a release
//!   hands the lock to the waiter that blocked first.
//! - **Reentrant** mutex: the same, and its owner may take it again while it holds it; the
//!   key still holds the token only, the owner and the count of holds live in a companion
//!   hash of the same slot.
//! - **Permit** of a counting semaphore: the key is a sorted set of holders' tokens, scored
//!   by when each permit expires by the server's clock.
//! - **Read** and **Write** sides of a read-write lock: the key is a hash with the writer
//!   (field `w`) or the readers (fields `r:<token>`), each with its expiry by the server's
//!   clock; a waiting writer keeps new readers out.
//!
//! A name in use by one kind and asked for as another gets a clear error: the key's Redis
//! type differs (string, sorted set, hash), so the other kind's script fails with
//! `WRONGTYPE` before it writes anything, which [`wrong_kind`] turns into a message.

use crate::backend::call::{Call, ScriptArg};
use crate::core::reply::Mode;
use crate::error::{Error, ErrorKind};
use crate::keys::LockKeys;
use crate::scripts;

/// How a waiter's attempt registers it (ARGV `direct` of the acquire scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registration {
    /// To be woken through the wake list, and try again (`0`).
    Woken,
    /// To be handed the hold by a release (`!<ttl>|<token>`, `1`), through the waiter's
    /// own wake list, which the attempt empties first.
    Handed,
    /// As [`Registration::Handed`], by the first attempt under its token to lead a block:
    /// nothing can have been pushed to its own wake list yet, which is left alone (`2`).
    HandedFirst,
}

impl Registration {
    fn arg(self) -> u8 {
        match self {
            Registration::Woken => 0,
            Registration::Handed => 1,
            Registration::HandedFirst => 2,
        }
    }
}

/// A kind of lock (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Mutex,
    /// A mutex its owner (this identity) may take again while it holds it. The `holds`
    /// companion hash records the key's token (`t`), the owner (`o`), the fencing token
    /// (`f`) and one field `h:<token>` per hold, named by the token of the acquire that
    /// made it (so a repeated or withdrawn attempt adds or removes its own hold only); the
    /// key is released with the last hold.
    Reentrant(std::sync::Arc<str>),
    /// A permit of a semaphore of this many permits.
    Permit(u32),
    Read,
    Write,
}

impl Kind {
    /// An attempt to take a hold under `token` for `ttl_ms`, in `mode`; a waiter's
    /// registration lives `grace_ms` unrefreshed; `clock_us` is the client's estimate of
    /// the server's clock (0: unknown; see [`crate::core::server_time`]). `lead`: the
    /// attempt goes ahead of a block, and wakes it when it takes the lock.
    /// `registration`: whether a waiter of a kind that [hands over](Self::hands_over)
    /// registers so that a release hands it the hold itself (see [`scripts::RELEASE`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attempt(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
        mode: Mode,
        grace_ms: u64,
        clock_us: u64,
        lead: bool,
        registration: Registration,
    ) -> Call {
        // A leading attempt's own wake list goes last.
        let own = (lead && mode != Mode::Once).then(|| keys.own_wake(token));
        let arg = mode.arg();
        let mut k: Vec<&str> = Vec::with_capacity(9);
        k.extend([keys.lock.as_str(), keys.fence.as_str()]);
        match self {
            // A single attempt on a mutex touches the key and the fencing counter only.
            Kind::Mutex if mode == Mode::Once => {}
            Kind::Mutex => {
                k.extend([&keys.wake, &keys.queue, &keys.grant, &keys.waiting].map(String::as_str))
            }
            Kind::Reentrant(_) => k.extend(
                [
                    &keys.wake,
                    &keys.queue,
                    &keys.grant,
                    &keys.waiting,
                    &keys.holds,
                ]
                .map(String::as_str),
            ),
            Kind::Permit(_) => k.extend([&keys.wake, &keys.queue].map(String::as_str)),
            Kind::Read | Kind::Write => k.extend(
                [&keys.wake, &keys.queue, &keys.readers, &keys.reader_wake].map(String::as_str),
            ),
        }
        if let Some(own) = &own {
            k.push(own);
        }
        let script = match self {
            Kind::Mutex | Kind::Reentrant(_) => &scripts::ACQUIRE,
            Kind::Permit(_) => &scripts::ACQUIRE_PERMIT,
            Kind::Read | Kind::Write => &scripts::ACQUIRE_RW,
        };
        let direct = registration.arg();
        let permits = match self {
            Kind::Permit(permits) => u64::from(*permits),
            _ => 0,
        };
        let side = self.side();
        let owner: &str = match self {
            Kind::Reentrant(owner) => owner,
            _ => "",
        };
        // ARGV[1..5] are common; then what the kind's script takes (see `scripts`).
        let mut args: Vec<&dyn ScriptArg> = vec![&token, &ttl_ms, &clock_us, &arg, &grace_ms];
        match self {
            Kind::Mutex => args.push(&direct),
            Kind::Reentrant(_) => args.extend([&0u8 as &dyn ScriptArg, &owner]),
            Kind::Permit(_) => args.extend([&permits as &dyn ScriptArg, &direct]),
            Kind::Read | Kind::Write => args.extend([&side as &dyn ScriptArg, &direct]),
        }
        Call::script(script, &k, &args)
    }

    /// A token-checked extend of a hold.
    pub fn extend(&self, keys: &LockKeys, token: &str, ttl_ms: u64) -> Call {
        match self {
            Kind::Mutex => Call::script(&scripts::EXTEND, &[&keys.lock], &[&token, &ttl_ms]),
            Kind::Reentrant(_) => Call::script(
                &scripts::EXTEND,
                &[&keys.lock, &keys.holds],
                &[&token, &ttl_ms],
            ),
            Kind::Permit(_) => {
                Call::script(&scripts::EXTEND_PERMIT, &[&keys.lock], &[&token, &ttl_ms])
            }
            Kind::Read | Kind::Write => Call::script(
                &scripts::EXTEND_RW,
                &[&keys.lock],
                &[&token, &ttl_ms, &self.side()],
            ),
        }
    }

    /// A token-checked release of a hold (or, with `withdraw`, the withdrawal of a waiter
    /// whose ttl is `ttl_ms`, that also gives back a hold it may have been handed unawares).
    /// A mutex handed to a waiter through the wake list goes under `handoff` (a fresh
    /// token) until the waiter takes it; `grace_ms` bounds the handoff and a wake-up.
    pub fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        handoff: &str,
        grace_ms: u64,
        withdraw: bool,
        ttl_ms: u64,
    ) -> Call {
        let withdraw = u8::from(withdraw);
        let min_claim_ms = scripts::MIN_CLAIM_MS.min(grace_ms);
        match self {
            Kind::Mutex | Kind::Reentrant(_) => {
                let mut k = vec![
                    keys.lock.as_str(),
                    &keys.wake,
                    &keys.queue,
                    &keys.grant,
                    &keys.waiting,
                    &keys.fence,
                ];
                let owner: &str = match self {
                    Kind::Reentrant(owner) => owner,
                    _ => "",
                };
                let mut a: Vec<&dyn ScriptArg> = vec![
                    &token,
                    &handoff,
                    &min_claim_ms,
                    &grace_ms,
                    &withdraw,
                    &ttl_ms,
                ];
                // A reentrant lock's holds, and its owner.
                if let Kind::Reentrant(_) = self {
                    k.push(&keys.holds);
                    a.push(&owner);
                }
                Call::script(&scripts::RELEASE, &k, &a)
            }
            Kind::Permit(_) => Call::script(
                &scripts::RELEASE_PERMIT,
                &[&keys.lock, &keys.wake, &keys.queue, &keys.fence],
                &[&token, &grace_ms, &withdraw, &ttl_ms, &min_claim_ms],
            ),
            Kind::Read | Kind::Write => Call::script(
                &scripts::RELEASE_RW,
                &[
                    &keys.lock,
                    &keys.wake,
                    &keys.queue,
                    &keys.readers,
                    &keys.reader_wake,
                    &keys.fence,
                ],
                &[
                    &token,
                    &grace_ms,
                    &withdraw,
                    &self.side(),
                    &ttl_ms,
                    &min_claim_ms,
                ],
            ),
        }
    }

    /// Whether a release hands a hold of this kind to a waiter itself (see
    /// [`scripts::RELEASE`]): a mutex, a semaphore's permit, a read-write lock's write
    /// side. A reentrant lock's holds, and readers, are woken to try again.
    pub fn hands_over(&self) -> bool {
        matches!(self, Kind::Mutex | Kind::Permit(_) | Kind::Write)
    }

    /// The list a waiter of this kind blocks on.
    pub fn wake_list<'k>(&self, keys: &'k LockKeys) -> &'k str {
        match self {
            Kind::Read => &keys.reader_wake,
            _ => &keys.wake,
        }
    }

    /// What a hold of this kind is called, for messages.
    pub fn noun(&self) -> &'static str {
        match self {
            Kind::Mutex => "lock",
            Kind::Reentrant(_) => "reentrant lock",
            Kind::Permit(_) => "semaphore",
            Kind::Read | Kind::Write => "read-write lock",
        }
    }

    fn side(&self) -> String {
        match self {
            Kind::Write => "w".to_owned(),
            _ => "r".to_owned(),
        }
    }
}

/// Turns a `WRONGTYPE` server error into a clear one: the name is in use by another kind.
pub(crate) fn wrong_kind(error: Error, kind: &Kind, key: &str) -> Error {
    if error.kind() == ErrorKind::Server && error.message().contains("WRONGTYPE") {
        Error::new(
            ErrorKind::Server,
            format!(
                "{key:?} is in use by another kind of lock than a {} (a name may be a mutex, \
                 a semaphore or a read-write lock, not several at once)",
                kind.noun()
            ),
        )
    } else {
        error
    }
}
