//! Acquiring a lock ([`LockBuilder`]) and holding it ([`LockGuard`]).

use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::acquire::Acquire;
use crate::backend::call::Replicas;
use crate::backend::exec::Exec;
use crate::cancel::{CancelToken, InterruptHook, Watch};
use crate::core::acquire::{Acquired, Granted};
use crate::core::backoff::Wait;
use crate::core::lease::{self as lease_clock, LeaseClock, LostReason, NotReleased, ttl_millis};
use crate::core::reply::Adopted;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lane::Lane;
use crate::lease::loss::LostCallback;
use crate::lease::{Extended, Lease};
use crate::reentrant::{Held, Registry};
use crate::renewal::Renewal;
use crate::shared::Shared;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, MutexGuard};
use crate::{stats, token};

/// The ttl used when none is given.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Describes a lock to acquire; made by [`crate::Client::lock`].
///
/// Defaults: ttl [`DEFAULT_TTL`], renewal on, no lost-lock callback, not cancellable but by
/// [`crate::cancel_all`].
#[must_use = "a LockBuilder does nothing until one of its acquire methods is called"]
pub struct LockBuilder<'a> {
    shared: &'a Shared,
    name: &'a str,
    ttl: Duration,
    renew: bool,
    on_lost: Option<LostCallback>,
    cancel: Option<CancelToken>,
    on_interrupt: Option<InterruptHook>,
    replicas: Option<(u32, Duration)>,
    kind: Kind,
    /// A builder method that does not apply to this kind (reported by the acquire).
    misuse: Option<String>,
}

impl<'a> LockBuilder<'a> {
    pub(crate) fn new(shared: &'a Shared, name: &'a str) -> Self {
        LockBuilder {
            shared,
            name,
            ttl: DEFAULT_TTL,
            renew: true,
            on_lost: None,
            cancel: None,
            on_interrupt: None,
            replicas: None,
            kind: Kind::Mutex,
            misuse: None,
        }
    }

    /// The builder of another kind of hold on the same name (a semaphore's permit, a side
    /// of a read-write lock).
    pub(crate) fn of_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// The lease: how long the lock outlives a holder that stops renewing (crashes, pauses,
    /// loses the network). Whole milliseconds, at least [`crate::MIN_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether a renewal thread extends the lease every ttl/3 while the lock is held
    /// (default `true`). With `false` the lease is fixed: it ends after the ttl unless
    /// [`LockGuard::extend`] is called.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// A function called once if the lock is lost, on the renewal thread.
    pub fn on_lost(mut self, callback: impl Fn(LostReason) + Send + Sync + 'static) -> Self {
        let callback = crate::process::CallerCode::new(callback);
        self.on_lost = Some(Arc::new(move |reason| (*callback)(reason)));
        self
    }

    /// Lets `token` cancel the wait: [`CancelToken::cancel`] makes the acquire fail promptly
    /// with [`ErrorKind::Cancelled`], holding nothing.
    pub fn cancel_token(mut self, token: &CancelToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    /// A function run on the acquiring thread when a signal interrupts the wait (and at
    /// least every 200 ms while it blocks); returning `true` cancels the acquire
    /// ([`ErrorKind::Cancelled`]). Without it, an interrupted wait simply resumes.
    pub fn on_interrupt(mut self, hook: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        let hook = crate::process::CallerCode::new(hook);
        self.on_interrupt = Some(Arc::new(move || (*hook)()));
        self
    }

    /// Replica acknowledgement: after the acquire and after every extend and renewal, wait
    /// up to `timeout` for `count` replicas of the lock key's primary to acknowledge the
    /// write (`WAIT count timeout`, on the same connection). An acquire too few replicas
    /// acknowledged is rolled back and fails with [`ErrorKind::Replication`]; an extend
    /// that too few acknowledged fails with it too and keeps the previous deadline; a
    /// renewal that too few acknowledged counts as failed (retried until the deadline).
    /// This narrows the window in which a failover to a replica that lacks the key lets a
    /// second holder in; it does not close it (`WAIT` does not make Redis strongly
    /// consistent). `count` 0 turns it off.
    pub fn min_replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.replicas = Some((count, timeout));
        self
    }

    /// Makes the lock reentrant for the calling thread: while this thread holds it, an
    /// acquire by the same thread (through this client) succeeds at once with one more
    /// hold instead of waiting for itself. Each hold is a guard of its own; the lock is
    /// released with the last. All holds share one lease, one renewal thread and the
    /// fencing token of the first. The key still holds the token only (`GET key` and
    /// canonical clients keep working); the owner and the holds live in a companion hash
    /// of the same slot. Not for Redlock clients, semaphores or read-write locks.
    pub fn reentrant(self) -> Self {
        let owner = token::thread_owner();
        self.reentrant_as(&owner)
    }

    /// As [`reentrant`](Self::reentrant), for the caller-supplied `owner` instead of the
    /// calling thread: any thread (or process, or host) acquiring with the same owner takes
    /// one more hold. The owner must be unique to its holder across every host that uses
    /// the lock: include a UUID drawn once per owner (a job's id, for example), never a
    /// bare thread id or PID, which repeat across hosts. At most 256 bytes, not empty.
    pub fn reentrant_as(mut self, owner: &str) -> Self {
        match self.kind {
            Kind::Mutex | Kind::Reentrant(_) => self.kind = Kind::Reentrant(Arc::from(owner)),
            _ => self.misuse = Some(format!("a {} cannot be reentrant", self.kind.noun())),
        }
        self
    }

    /// Tries once, without waiting.
    ///
    /// Errors: [`ErrorKind::Busy`] when another owner holds the lock; connection, timeout,
    /// server and invalid-argument errors as their kinds say. Bounded by the pool wait, the
    /// connect timeout and the I/O timeout.
    pub fn try_acquire(self) -> Result<LockGuard> {
        self.acquire_with(Wait::No)
    }

    /// Waits up to `wait` for the lock. Blocks the calling thread; a zero `wait` tries once.
    /// Returns within `wait` plus one request's bounds (connect and I/O timeouts, and
    /// 0.25 s for Redis to end a block).
    ///
    /// Errors: [`ErrorKind::Busy`] when the wait ended while another owner held the lock;
    /// [`ErrorKind::Cancelled`]; [`ErrorKind::InvalidArgument`] when `wait` overflows the
    /// clock. Failures to reach Redis end the wait once they last longer than the I/O
    /// timeout plus 0.5 s; a refusal that passes (a Cluster slot migrating, `CLUSTERDOWN`,
    /// `LOADING`, `MASTERDOWN`) is tried again until the wait ends.
    pub fn acquire_timeout(self, wait: Duration) -> Result<LockGuard> {
        let wait = Wait::up_to(wait, Instant::now())?;
        self.acquire_with(wait)
    }

    /// Waits as long as it takes. Blocks the calling thread; returns early only on an error
    /// (for example when requests to Redis keep failing for longer than the I/O timeout
    /// plus 0.5 s after the first failure: a server that stops answering is seen at the
    /// end of the waiter's block plus one I/O timeout; see the README's bounds table) or a
    /// cancellation. Refusals that pass (a Cluster slot migrating,
    /// `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`) are waited out.
    pub fn acquire(self) -> Result<LockGuard> {
        self.acquire_with(Wait::Forever)
    }

    /// Takes over the lock `name` held under `token` (another process's, handed over: a
    /// scheduler that took the lock and started the worker that does the job): an
    /// ordinary guard, checked on the server, with the lock's fencing token and the lease
    /// the key has left, renewed to this builder's ttl unless `renew(false)`. One round
    /// trip.
    ///
    /// The hand-over contract: once it has handed the token over, the first holder no
    /// longer relies on the lock and does not release it while this guard's holder works
    /// (it lets it go with [`LockGuard::abandon`], or releases only once the work is
    /// done). A release by either ends the lock for both, and the other learns it only at
    /// its next renewal or extend: two holders relying on one token are not protected from
    /// each other's successors.
    ///
    /// Errors: [`ErrorKind::NotHeld`] when the key does not hold `token`;
    /// [`ErrorKind::InvalidArgument`] for an empty or over-long token, a kind other than a
    /// plain mutex (a reentrant lock's holds belong to their owner), or a Redlock client;
    /// connection, timeout and server errors.
    pub fn adopt(self, token: &str) -> Result<LockGuard> {
        crate::process::api_call(move || {
            let shared = self.shared;
            let ttl = Duration::from_millis(ttl_millis(self.ttl)?);
            let keys = LockKeys::new(&shared.options.key_prefix, self.name)?;
            if token.is_empty() || token.len() > MAX_TOKEN_LEN || token.contains('\0') {
                return Err(Error::invalid(format!(
                    "a token to adopt is 1 to {MAX_TOKEN_LEN} bytes without NUL, got {} bytes",
                    token.len()
                )));
            }
            if self.kind != Kind::Mutex || self.misuse.is_some() || self.replicas.is_some() {
                return Err(Error::invalid(
                    "only a plain mutex can be adopted (not a reentrant lock, a semaphore, a \
                     read-write lock, nor with min_replicas)",
                ));
            }
            if !shared.server.capabilities().inspection {
                return Err(Error::invalid(
                    "adopting a lock is not available on a Redlock client",
                ));
            }
            let bounds = shared.server.bounds();
            let call = crate::protocol::calls::adopt(&keys, token);
            let sent_at = Instant::now();
            let exec = Exec::new(Lane::Caller(sent_at + bounds.pool_wait), bounds.io);
            let replies = shared.server.run(&keys.lock, &[call], &exec)?;
            let value = replies
                .values
                .into_iter()
                .next()
                .unwrap_or(redis::Value::Nil);
            let (lease, fencing_token) = match crate::protocol::calls::read_adopt(value)? {
                Adopted::Held {
                    pttl,
                    fencing_token,
                } => (pttl.unwrap_or(ttl), fencing_token),
                Adopted::NotHeld => {
                    return Err(Error::new(
                        ErrorKind::NotHeld,
                        format!("lock {:?} is not held under that token", keys.lock),
                    ));
                }
                Adopted::Reentrant => {
                    return Err(Error::invalid(format!(
                        "lock {:?} is a reentrant lock: its holds belong to their owner",
                        keys.lock
                    )));
                }
                Adopted::OtherKind => {
                    return Err(Error::invalid(format!(
                        "{:?} is a semaphore or a read-write lock: only a mutex can be adopted",
                        keys.lock
                    )));
                }
            };
            let granted = Granted {
                fencing_token,
                lease,
                sent_at,
            };
            LockGuard::taken(
                shared,
                keys,
                token.to_owned(),
                granted,
                ttl,
                self.renew,
                self.on_lost,
            )
        })
    }

    pub(crate) fn acquire_with(mut self, wait: Wait) -> Result<LockGuard> {
        let call = crate::process::ApiCall::enter();
        let shared = self.shared;
        let ttl = Duration::from_millis(ttl_millis(self.ttl)?);
        let keys = LockKeys::new(&shared.options.key_prefix, self.name)?;
        let replicas = match self.replicas {
            None | Some((0, _)) => None,
            Some((count, timeout)) => {
                if timeout < Duration::from_millis(1) || timeout > crate::MAX_TTL {
                    return Err(Error::invalid(format!(
                        "the replica acknowledgement timeout must be 1 ms to {:?}, got {timeout:?}",
                        crate::MAX_TTL
                    )));
                }
                Some(Replicas { count, timeout })
            }
        };
        let (cancel, on_interrupt) = (self.cancel.take(), self.on_interrupt.take());
        let watch = if wait == Wait::No {
            // A single attempt: `cancel_all` ends waits only.
            Watch::attempt(cancel, on_interrupt)
        } else {
            Watch::waiting(cancel, on_interrupt)
        };
        if wait != Wait::No && watch.cancelled() {
            return Err(Error::new(ErrorKind::Cancelled, "the wait was cancelled"));
        }
        if let Some(misuse) = self.misuse {
            return Err(Error::invalid(misuse));
        }
        if let Kind::Permit(0) = self.kind {
            return Err(Error::invalid("a semaphore needs at least one permit"));
        }
        if let Kind::Reentrant(owner) = &self.kind {
            if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
                return Err(Error::invalid(format!(
                    "a reentrant lock's owner must be 1 to {MAX_OWNER_LEN} bytes, got {}",
                    owner.len()
                )));
            }
        }
        let can = shared.server.capabilities();
        if !can.every_kind && self.kind != Kind::Mutex {
            return Err(Error::invalid(format!(
                "a Redlock client takes mutexes only, not a {}",
                self.kind.noun()
            )));
        }
        if !can.replicas && replicas.is_some() {
            return Err(Error::invalid(
                "min_replicas is for a single primary; a Redlock lock already waits for a majority of primaries",
            ));
        }
        let (acquired, ending) = Acquire {
            server: &shared.server,
            keys: &keys,
            kind: &self.kind,
            owner_label: &shared.owner_label,
            ttl,
            wait,
            renew: self.renew,
            watch,
            replicas,
        }
        .run();
        let mut result =
            acquired.and_then(|acquired| self.guard_for(keys, ttl, replicas, wait, acquired));
        if crate::process::orphaned() {
            // A callback forked and this is the child: what was granted is the parent's.
            // Dropping the guard sends nothing (see `process::call_out`).
            drop(result);
            result = Err(crate::process::orphaned_error());
        }
        drop(call);
        ending.record(&result);
        result
    }

    /// The guard of what an acquire took: a hold joined to the lease this process holds
    /// for its acquisition (a re-entry), or a lease of its own with its renewal.
    ///
    /// Errors: [`ErrorKind::Busy`] for a single attempt's re-entry answered after the lease
    /// it set ran out that joins nothing held here (its hold is given back, in the
    /// background; the acquire machine gives a waiter's back itself and waits on);
    /// [`ErrorKind::Internal`] when no renewal thread can be had (the hold is released).
    fn guard_for(
        self,
        keys: LockKeys,
        ttl: Duration,
        replicas: Option<Replicas>,
        wait: Wait,
        acquired: Acquired,
    ) -> Result<LockGuard> {
        let shared = self.shared;
        let Acquired {
            granted,
            token: hold,
            reentered,
        } = acquired;
        let registry = matches!(self.kind, Kind::Reentrant(_)).then(|| shared.registry.clone());
        // `hold` names this guard's hold: the token of this acquire (the first hold's is
        // the lock's).
        let token = match reentered {
            Some(lock_token) => {
                if let Some(held) = registry
                    .as_ref()
                    .and_then(|r| r.join(&lock_token, granted.fencing_token))
                {
                    // One more hold of a lease this process holds: it takes this
                    // acquire's lease, callback and renewal wish.
                    held.lease.reentered(ttl, granted.lease, granted.sent_at);
                    if let Some(callback) = self.on_lost {
                        held.lease.add_on_lost(&hold, callback);
                    }
                    let guard = LockGuard::with(held.clone(), hold);
                    let mut renewal = held.renewal();
                    if self.renew && renewal.is_none() {
                        // On failure the guard drops and gives its hold back.
                        *renewal = Some(Renewal::start(held.lease.clone())?);
                    }
                    drop(renewal);
                    return Ok(guard);
                }
                if wait == Wait::No
                    && lease_clock::local_deadline(granted.sent_at, granted.lease) <= Instant::now()
                {
                    // Answered after the lease it set ran out: nothing this client can rely
                    // on. Its own hold is given back (the hold's token names it alone), in
                    // the background (the call's bounds are spent), and the acquire fails
                    // as a grant confirmed too late does.
                    let cutoff = Instant::now() + shared.server.bounds().io;
                    crate::acquire::give_back_in_background(
                        shared.server.clone(),
                        keys,
                        self.kind,
                        ttl,
                        hold,
                        cutoff,
                    );
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!(
                            "lock {:?} was re-entered, but the reply came after the lease it \
                             set ran out; the hold is given back, nothing is held",
                            self.name
                        ),
                    ));
                }
                lock_token
            }
            None => hold.clone(),
        };
        let lease = Lease::new(
            shared.server.clone(),
            keys,
            token,
            granted.fencing_token,
            self.kind,
            replicas,
            LeaseClock::new(ttl, granted.lease, granted.sent_at),
            self.on_lost.map(|callback| (hold.clone(), callback)),
        );
        LockGuard::start(lease, self.renew, hold, registry)
    }
}

/// The longest owner of a reentrant lock accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// The longest token [`LockBuilder::adopt`] takes, in bytes: what the C ABI's
/// `LOCK_TOKEN_MAX` buffer holds (redlease's own tokens are shorter).
pub const MAX_TOKEN_LEN: usize = 127;

/// A held lock. Dropping it releases the lock (best effort; errors are logged).
///
/// The guard may move between threads and be shared by reference. Pass
/// [`fencing_token`](Self::fencing_token) to the resource you protect: a lease alone cannot
/// stop a holder that paused past its ttl, a resource that rejects stale tokens can.
#[must_use = "if unused the lock is released at once"]
pub struct LockGuard {
    held: Arc<Held>,
    /// The token of this guard's hold: the lock's token, but for the later holds of a
    /// reentrant lock.
    hold: String,
    released: AtomicBool,
}

impl LockGuard {
    /// The first guard of a lock this process just took (`hold`: its token of this hold),
    /// with its renewal; a reentrant lock goes on the client's registry.
    fn start(
        lease: Lease,
        renew: bool,
        hold: String,
        registry: Option<Arc<Registry>>,
    ) -> Result<LockGuard> {
        if crate::process::orphaned() {
            // A callback forked after the grant and this is the child: the lock is the
            // parent's. The lease is dropped unused (that sends nothing).
            return Err(crate::process::orphaned_error());
        }
        let lease = Arc::new(lease);
        let held = Held::new(lease.clone(), registry);
        let guard = LockGuard::with(held.clone(), hold);
        if renew {
            // On failure the guard drops here and releases the hold it just took.
            *held.renewal() = Some(Renewal::start(lease)?);
        }
        if let Some(registry) = held.registry() {
            registry.insert(&held);
        }
        Ok(guard)
    }

    /// The guard of a plain mutex this process holds under `token` by other means than an
    /// acquire of its own (an adopt, a group's script), with `granted`'s lease counted for
    /// `ttl`, its renewal when `renew`, and `on_lost`.
    pub(crate) fn taken(
        shared: &Shared,
        keys: LockKeys,
        token: String,
        granted: Granted,
        ttl: Duration,
        renew: bool,
        on_lost: Option<LostCallback>,
    ) -> Result<LockGuard> {
        let lease = Lease::new(
            shared.server.clone(),
            keys,
            token.clone(),
            granted.fencing_token,
            Kind::Mutex,
            None,
            LeaseClock::new(ttl, granted.lease, granted.sent_at),
            on_lost.map(|callback| (token.clone(), callback)),
        );
        LockGuard::start(lease, renew, token, None)
    }

    fn with(held: Arc<Held>, hold: String) -> LockGuard {
        LockGuard {
            held,
            hold,
            released: AtomicBool::new(false),
        }
    }

    fn renewal_slot(&self) -> MutexGuard<'_, Option<Renewal>> {
        self.held.renewal()
    }

    /// Fails with [`ErrorKind::NotHeld`] in a process other than the one that acquired the
    /// lock (a forked child); touches nothing of the lock's state.
    pub(crate) fn check_process(&self) -> Result<()> {
        self.lease().check_process()
    }

    fn lease(&self) -> &Arc<Lease> {
        &self.held.lease
    }

    /// The lock key (the client's prefix plus the name).
    pub fn key(&self) -> &str {
        &self.lease().keys.lock
    }

    /// The token stored under the key while this guard holds it (`redis-cli GET key`).
    pub fn token(&self) -> &str {
        &self.lease().token
    }

    /// The fencing token of this acquisition: larger than that of every earlier
    /// acquisition of the same name.
    pub fn fencing_token(&self) -> u64 {
        self.lease().fencing_token
    }

    /// The local view: not released, not lost, and the lease's local deadline not passed.
    /// Sends nothing to Redis.
    pub fn is_held(&self) -> bool {
        self.lease().is_held()
    }

    /// How much of the lease is left by the local clock (minus a drift allowance); zero once
    /// lost or released.
    pub fn remaining(&self) -> Duration {
        self.lease().remaining()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease().lost()
    }

    /// A channel that receives the reason once if the lock is lost; use it in
    /// `crossbeam_channel::select!`. It disconnects without a message when the lock is
    /// released. Only renewal and [`extend`](Self::extend) detect a loss.
    pub fn lost(&self) -> Receiver<LostReason> {
        self.lease().subscribe()
    }

    /// Sets the lease to `ttl` from now, if the key still holds this lock's token; on the
    /// server the key's lease is never shortened (another holder of the token, such as a
    /// process that adopted the lock, may count on the longer one), while this guard counts
    /// on `ttl` only.
    /// Blocking: waits for a renewal in flight, then one round trip (connect and I/O
    /// timeouts), cut off at the current lease's local deadline. The renewal thread, if
    /// any, renews with the new ttl from then on (the next renewal a third of the way into
    /// the new lease).
    ///
    /// Errors: [`ErrorKind::NotHeld`] when the lock was lost or released (a loss is also
    /// marked), including when the extend could not be confirmed before the current lease
    /// ended, or its reply came too late to be of use: the lock is then lost, for good;
    /// [`ErrorKind::InvalidArgument`] for a ttl under [`crate::MIN_TTL`].
    /// After a connection error or timeout the extend may or may not have happened: the
    /// lease then never assumes more than the shorter of the old and the new ttl again, for
    /// the rest of the lock's life (a late extend to the shorter ttl could still run).
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        crate::process::api_call(|| {
            let ttl = Duration::from_millis(ttl_millis(ttl)?);
            self.lease().check_process()?;
            if self.released.load(Ordering::SeqCst) {
                return Err(Error::new(ErrorKind::NotHeld, "the lock was released"));
            }
            let extended = {
                let Some(_gate) = self.lease().gate() else {
                    return Err(Error::new(ErrorKind::NotHeld, "the lock was released"));
                };
                // Read under the gate: a renewal that was in flight may have moved it on.
                let deadline = self.lease().deadline();
                self.lease().extend_gated(ttl, Lane::Urgent, Some(deadline))
            };
            if extended.is_err() && self.lease().lost().is_some() {
                // The extend ran into the deadline: the holder is told, after the gate (the
                // callback may release).
                self.lease().notify_lost();
            }
            let extended = extended.inspect_err(stats::unknown_if)?;
            match extended {
                Extended::Yes => {
                    if let Some(renewal) = self.renewal_slot().as_ref() {
                        renewal.reschedule();
                    }
                    Ok(())
                }
                Extended::Lost(reason) => {
                    self.lease().notify_lost();
                    Err(Error::new(
                        ErrorKind::NotHeld,
                        format!("lock {:?} was lost: {reason}", self.lease().keys.lock),
                    ))
                }
            }
        })
    }

    /// Stops renewal, then releases the lock if the key still holds this lock's token.
    /// Blocking: one round trip, bounded by the I/O timeout. This guard's `on_lost` is not
    /// called once the release has begun (a call already running on another thread runs
    /// to its end); the other holds of a reentrant lock are still told of a loss.
    ///
    /// `Ok` only when the lock was held without a break up to the release: the key still
    /// held the token, the lock was not lost, and its local deadline had not passed.
    ///
    /// Errors: [`ErrorKind::NotHeld`] when part of the critical section may have run
    /// unprotected: the key no longer held the token, or the lock had been lost or its
    /// lease had run out before the release (the key is deleted all the same if it still
    /// holds the token, so that the next owner need not wait for it to expire); connection
    /// and timeout errors when Redis could not be told (the lock then expires after its
    /// ttl).
    pub fn release(self) -> Result<()> {
        crate::process::api_call(move || self.release_shared())
    }

    /// Lets go of the lock without releasing it: stops renewing it (with its last hold, for
    /// a reentrant lock) and sends nothing, so that the key keeps the token until its lease
    /// ends, as if this process had crashed. For a holder that must leave the lock to
    /// expire on its own (a compatibility layer whose callers rely on a lease outliving
    /// the object). Never blocks beyond stopping a renewal in flight; this guard's
    /// `on_lost` is not called any more. In a forked child it does nothing: the lock and
    /// its renewal are the parent's.
    pub fn abandon(self) {
        self.abandon_shared();
    }

    /// [`abandon`](Self::abandon) through a shared reference.
    pub(crate) fn abandon_shared(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        // A forked child has neither the lock nor its renewal thread: stopping that
        // thread would wait for a renewal in flight that nobody in the child will end,
        // and the lease's own lock may have been held by a thread of the parent.
        if self.lease().check_process().is_err() {
            return;
        }
        self.lease().forget_on_lost(&self.hold);
        if self.held.leave() {
            if let Some(renewal) = self.renewal_slot().take() {
                renewal.stop();
            }
            self.lease().close_gate();
        }
    }

    /// [`release`](Self::release) through a shared reference, for owners that cannot
    /// consume the guard (the C ABI's handle table). Later calls do nothing and return
    /// `Ok`; other methods then report the lock as released.
    pub(crate) fn release_shared(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // The process first: in a forked child nothing of the parent's lock is touched.
        self.lease().check_process()?;
        self.lease().forget_on_lost(&self.hold);
        if self.held.leave() {
            if let Some(renewal) = self.renewal_slot().take() {
                renewal.stop();
            }
            // Closed even without renewal: no extend may run after the release either.
            self.lease().close_gate();
        }
        // Decided before the release is sent, and again when its answer comes.
        let when_sent = self.lease().broken();
        if self.lease().gate_closed() {
            self.lease().mark_released();
        }
        let released = self
            .lease()
            .release_on_server(&self.hold)
            .inspect_err(stats::unknown_if)?;
        match lease_clock::release_verdict(released, when_sent, self.lease().broken()) {
            Ok(()) => Ok(()),
            Err(NotReleased::NotFound) => Err(self.not_held(
                "no longer held this token (the lease had ended or another owner took it)",
            )),
            Err(NotReleased::Before(why)) => {
                Err(self.not_held(&format!("{why} before the release (its key was deleted)")))
            }
            Err(NotReleased::InFlight(why)) => Err(self.not_held(&format!(
                "{why} before the release was confirmed (it may have run after the key expired)"
            ))),
        }
    }

    fn not_held(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::NotHeld,
            format!("lock {:?} {what}", self.lease().keys.lock),
        )
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _call = crate::process::ApiCall::enter();
        if let Err(e) = self.release_shared() {
            log::warn!("releasing lock {:?} on drop: {e}", self.lease().keys.lock);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("fencing_token", &self.fencing_token())
            .field("held", &self.is_held())
            .finish()
    }
}
