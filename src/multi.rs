//! All or none: one lock over several names ([`crate::Client::lock_all`]).
//!
//! Every name becomes an ordinary lock of its own (its own token, lease, renewal and
//! fencing token). The names are taken in one global order: by group, then by key. A group
//! is what one script can take at once: every name on a single server (or Sentinel's
//! primary), the names of one slot on a Cluster. A group's names are taken together, all
//! or none, by one script ([`crate::scripts::ACQUIRE_ALL`]; the decisions are
//! [`crate::core::group`]'s); names of different groups, and a Redlock client's names, one
//! group after the other. A caller waits for a name only while it holds no name after it
//! in the order, so two callers wanting overlapping sets never wait for each other in a
//! circle. When a name cannot be taken (busy after the wait, cancelled, an error), every
//! name already taken is given back, so a failure holds nothing. A loss of any name is a
//! loss of the whole lock.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::backend::exec::Exec;
use crate::cancel::{CancelToken, Watch};
use crate::core::backoff::Wait;
use crate::core::group::{self, GroupAction, GroupEvent, GroupMachine, GroupSpec};
use crate::core::lease::{LostReason, ttl_millis};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::lane::Lane;
use crate::lease::loss::LostCallback;
use crate::lock::{LockBuilder, LockGuard};
use crate::protocol::GroupRequest;
use crate::shared::Shared;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, Mutex};
use crate::{stats, token};

/// The most names one [`crate::Client::lock_all`] takes.
pub const MAX_NAMES: usize = 1024;

/// Called with the name first lost and why.
type MultiLostCallback = Arc<dyn Fn(&str, LostReason) + Send + Sync>;

/// Describes a lock over several names; made by [`crate::Client::lock_all`].
#[must_use = "a MultiLockBuilder does nothing until one of its acquire methods is called"]
pub struct MultiLockBuilder<'a> {
    shared: &'a Shared,
    names: Vec<String>,
    ttl: Option<Duration>,
    renew: bool,
    cancel: Option<CancelToken>,
    on_lost: Option<MultiLostCallback>,
}

impl<'a> MultiLockBuilder<'a> {
    pub(crate) fn new(shared: &'a Shared, names: &[&str]) -> Self {
        MultiLockBuilder {
            shared,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            ttl: None,
            renew: true,
            cancel: None,
            on_lost: None,
        }
    }

    /// The lease of every name (default [`crate::DEFAULT_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Whether every name is renewed while held (default true).
    ///
    /// Without renewal, a name's lease runs down while later names are taken; before the
    /// lock is returned, every name with less than the ttl left, less twice its drift
    /// allowance (1 % + 2 ms), is extended to the ttl, one after the other. So each name
    /// is returned with at least the ttl less twice the allowance and the time those
    /// extends took (one request's each). If one ran out meanwhile (another client may
    /// have taken it), every name is given back and the acquire starts again after a
    /// pause (10 ms, doubling up to the ttl) while its wait lasts, then ends
    /// [`ErrorKind::Busy`]; an extend that fails
    /// otherwise (a timeout, a connection error) ends it with that error, nothing held. A
    /// ttl shorter than taking every name takes can so never succeed: a warning is logged.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Lets `token` end a waiting acquire ([`ErrorKind::Cancelled`], nothing held).
    pub fn cancel_token(mut self, token: &CancelToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    /// Called once, when the first of the names is lost (with that name): the whole lock is
    /// lost then. Called on a renewal thread; for a name lost while the lock was being taken
    /// and still part of it (its lease ran out, the key still holding the token), on the
    /// caller's thread before the acquire returns. A name lost and taken again while the
    /// caller waited is no loss of the lock.
    pub fn on_lost(mut self, callback: impl Fn(&str, LostReason) + Send + Sync + 'static) -> Self {
        let callback = crate::process::CallerCode::new(callback);
        self.on_lost = Some(Arc::new(move |name: &str, reason| {
            (*callback)(name, reason)
        }));
        self
    }

    /// Tries each name once. Errors as [`crate::LockBuilder::try_acquire`], for the first
    /// name that could not be taken (the others given back); [`ErrorKind::InvalidArgument`]
    /// for no names, more than [`MAX_NAMES`], a name given twice or a bad name, before
    /// anything is sent.
    pub fn try_acquire(self) -> Result<MultiGuard> {
        self.acquire_until(Some(Instant::now()), false)
    }

    /// Waits up to `wait` in all (a zero `wait` tries once). Returns within `wait` plus one
    /// request's bounds per name still to take. [`ErrorKind::InvalidArgument`] for a wait
    /// over 2^40 ms (about 34 years), as for one name, before anything is sent.
    pub fn acquire_timeout(self, wait: Duration) -> Result<MultiGuard> {
        // The same limit as a single lock's wait (at most MAX_WAIT).
        match Wait::up_to(wait, Instant::now())? {
            Wait::Until(deadline) => self.acquire_until(Some(deadline), true),
            _ => self.acquire_until(Some(Instant::now()), true),
        }
    }

    /// Waits as long as it takes.
    pub fn acquire(self) -> Result<MultiGuard> {
        self.acquire_until(None, true)
    }

    fn acquire_until(self, deadline: Option<Instant>, waits: bool) -> Result<MultiGuard> {
        crate::process::api_call(move || {
            let order = self.order()?;
            let ttl = self.ttl.unwrap_or(crate::DEFAULT_TTL);
            ttl_millis(ttl)?;
            let wait = match (waits, deadline) {
                (false, _) => Wait::No,
                (true, None) => Wait::Forever,
                (true, Some(deadline)) => Wait::Until(deadline),
            };
            let hub = Arc::new(LossHub::default());
            // Between two starts: a ttl too short for the steps would otherwise have the
            // acquire take and give back its names as fast as the servers answer.
            let mut pause = group::RESTART_PAUSE;
            let mut warned = false;
            let (guards, lives) = loop {
                let pass = Instant::now();
                let (guards, lives) = self.take_in_order(&order, ttl, wait, &hub)?;
                // Without renewal, leases ran down while later names were taken (or counted
                // from a request that waited): each such name gets its ttl again from now.
                // One whose lease ran out (another client may have it now) makes the whole
                // set go back and start again, within the wait.
                let lapsed = if self.renew {
                    None
                } else {
                    let left: Vec<Duration> = guards.iter().map(|(_, g)| g.remaining()).collect();
                    group::run_down(&left, ttl).into_iter().find_map(|i| {
                        let (name, guard) = &guards[i];
                        let failed = guard.extend(ttl).err();
                        failed.map(|e| (name.clone(), e, guard.lost_reason()))
                    })
                };
                let Some((name, e, lost)) = lapsed else {
                    break (guards, lives);
                };
                let took = pass.elapsed();
                give_back(guards);
                if e.kind() != ErrorKind::NotHeld {
                    return Err(e);
                }
                let now = Instant::now();
                if took >= ttl && !warned {
                    warned = true;
                    log::warn!(
                        "lock_all without renewal: taking {} names took {took:?}, longer than \
                         their ttl of {ttl:?}; it starts again while its wait lasts (give a \
                         longer ttl, or keep renewal on)",
                        order.len()
                    );
                }
                let Some((this, next)) = group::start_again(wait, now, pause, ttl) else {
                    let why = match lost {
                        Some(LostReason::NotHeld) => format!(
                            "its key no longer held this lock's token (another owner took it, \
                             or it expired on the server) while the later names were taken \
                             (in {took:?})"
                        ),
                        _ => format!(
                            "its lease of {ttl:?}, without renewal, ended while the later names \
                             were taken (in {took:?})"
                        ),
                    };
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!("{name:?} was not kept: {why}: {e}"),
                    ));
                };
                log::debug!("lock_all starts again in {this:?}: {name:?} was not kept ({e})");
                let watch = Watch::waiting(self.cancel.clone(), None);
                crate::connection::pause(this, &watch)?;
                pause = next;
            };
            // From here on a loss of any of these guards is the whole lock's. Losses before,
            // and any of a guard given back on the way (a name taken alone while a later one
            // was waited for), were the acquire's own business; a guard that was lost and is
            // still part of the lock makes it lost at once.
            for ((name, guard), live) in guards.iter().zip(&lives) {
                live.store(true, Ordering::SeqCst);
                if let Some(reason) = guard.lost_reason() {
                    if hub.lost(reason) {
                        if let Some(callback) = &self.on_lost {
                            crate::process::call_out(|| callback(name, reason));
                        }
                    }
                }
            }
            Ok(MultiGuard { guards, hub })
        })
    }

    /// Takes the names of `order` group after group (see the module documentation): the
    /// guards and their liveness flags. On an error every name taken is given back first.
    fn take_in_order(
        &self,
        order: &[Named],
        ttl: Duration,
        wait: Wait,
        hub: &Arc<LossHub>,
    ) -> Result<InOrder> {
        let mut guards: Vec<(String, LockGuard)> = Vec::with_capacity(order.len());
        // Per guard: whether its loss is the lock's (set once the lock is taken).
        let mut lives: Vec<Live> = Vec::with_capacity(order.len());
        let mut rest = order;
        while let Some(first) = rest.first() {
            // The run of names of the first one's group (a name of no group goes alone).
            let len = match first.group {
                None => 1,
                Some(g) => rest.iter().take_while(|n| n.group == Some(g)).count(),
            };
            let (group, after) = rest.split_at(len);
            rest = after;
            let taken = if let [one] = group {
                let (builder, live) = self.single(one, hub);
                take_one(builder, wait).map(|g| vec![(one.name.clone(), g, live)])
            } else {
                self.take_group(group, ttl, wait, hub)
            };
            match taken {
                Ok(taken) => {
                    for (name, guard, live) in taken {
                        guards.push((name, guard));
                        lives.push(live);
                    }
                }
                Err(e) => {
                    give_back(guards);
                    return Err(e);
                }
            }
        }
        Ok((guards, lives))
    }

    /// The ordinary lock of one of the names, its loss told to `hub` once it is live.
    fn single<'b>(&'b self, name: &'b Named, hub: &Arc<LossHub>) -> (LockBuilder<'b>, Live) {
        let mut builder = LockBuilder::new(self.shared, &name.name).renew(self.renew);
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(cancel) = &self.cancel {
            builder = builder.cancel_token(cancel);
        }
        let (on_lost, live) = self.telling(&name.name, hub);
        (builder.on_lost(move |reason| on_lost(reason)), live)
    }

    /// The callback that tells `hub`, and the caller's callback with `name` when first,
    /// once its flag is set (the guard is part of the lock taken).
    fn telling(&self, name: &str, hub: &Arc<LossHub>) -> (LostCallback, Live) {
        let (name, hub, callback) = (name.to_owned(), hub.clone(), self.on_lost.clone());
        let live = Live::default();
        let flag = live.clone();
        let telling: LostCallback = Arc::new(move |reason| {
            if flag.load(Ordering::SeqCst) && hub.lost(reason) {
                if let Some(callback) = &callback {
                    callback(&name, reason);
                }
            }
        });
        (telling, live)
    }

    /// Takes the names of one group (one server, or one Cluster slot) all at once, in one
    /// script per attempt, as [`GroupMachine`] decides.
    fn take_group(
        &self,
        group: &[Named],
        ttl: Duration,
        wait: Wait,
        hub: &Arc<LossHub>,
    ) -> Result<Vec<(String, LockGuard, Live)>> {
        let shared = self.shared;
        let server = &shared.server;
        let bounds = server.bounds();
        let watch = Watch::waiting(self.cancel.clone(), None);
        let keys: Vec<LockKeys> = group.iter().map(|n| n.keys.clone()).collect();
        let spec = GroupSpec {
            keys: keys.iter().map(|k| k.lock.clone()).collect(),
            wait,
            io: bounds.io,
            grace: crate::core::backoff::grace(bounds.io),
        };
        let label = shared.owner_label.clone();
        let mut machine = GroupMachine::new(spec, Box::new(move || token::new_token(&label)));
        let mut alone: Vec<Option<(LockGuard, Live)>> = group.iter().map(|_| None).collect();
        let started = Instant::now();
        // A failure the ordinary acquire of a wait alone ended with is counted (stats) there.
        let mut counted = false;
        let mut event = GroupEvent::Start;
        loop {
            let cancelled = wait != Wait::No && watch.cancelled();
            event = match machine.step(event, Instant::now(), cancelled) {
                GroupAction::Attempt { tokens, held } => {
                    let now = Instant::now();
                    let exec = Exec::new(Lane::Caller(now + bounds.pool_wait), bounds.io);
                    // As a waiter's attempts: refused for now, tried again until the wait ends.
                    let exec = match wait {
                        Wait::No => exec,
                        Wait::Until(_) | Wait::Forever => {
                            exec.retry_until(wait.deadline(now)).watch(&watch)
                        }
                    };
                    let request = GroupRequest {
                        keys: &keys,
                        tokens: &tokens,
                        held: &held,
                        ttl,
                        exec,
                    };
                    GroupEvent::Attempted(server.attempt_all(&request))
                }
                GroupAction::GiveBack { tokens, cutoff } => {
                    for (i, token) in tokens {
                        crate::acquire::give_back_in_background(
                            server.clone(),
                            keys[i].clone(),
                            Kind::Mutex,
                            ttl,
                            token,
                            cutoff,
                        );
                    }
                    GroupEvent::GaveBack
                }
                GroupAction::Release(names) => {
                    for i in names {
                        if let Some((guard, _)) = alone[i].take() {
                            if let Err(e) = guard.release() {
                                log::debug!("giving back {:?} taken alone: {e}", group[i].name);
                            }
                        }
                    }
                    GroupEvent::Released
                }
                GroupAction::Pause { until } => {
                    let left = until.saturating_duration_since(Instant::now());
                    GroupEvent::Paused(crate::connection::pause(left, &watch))
                }
                GroupAction::WaitFor(i) => {
                    let (builder, live) = self.single(&group[i], hub);
                    let waited = take_one(builder, wait);
                    counted = waited.is_err();
                    GroupEvent::Waited(
                        i,
                        waited.map(|guard| {
                            let token = guard.token().to_owned();
                            alone[i] = Some((guard, live));
                            token
                        }),
                    )
                }
                GroupAction::Done(Err(e)) => {
                    if !counted {
                        stats::acquire_ended::<()>(&Err(e.clone()), started.elapsed(), false);
                    }
                    return Err(e);
                }
                GroupAction::Done(Ok(grants)) => {
                    let taken_here = grants.len();
                    let mut grants = grants.into_iter();
                    while let Some(grant) = grants.next() {
                        let named = &group[grant.index];
                        let (on_lost, live) = self.telling(&named.name, hub);
                        let guard = LockGuard::taken(
                            shared,
                            named.keys.clone(),
                            grant.token,
                            grant.granted,
                            ttl,
                            self.renew,
                            Some(on_lost),
                        );
                        match guard {
                            Ok(guard) => alone[grant.index] = Some((guard, live)),
                            Err(e) => {
                                // The guards made drop and release their names; the names
                                // without a guard yet are withdrawn.
                                for rest in grants {
                                    crate::acquire::give_back_in_background(
                                        server.clone(),
                                        group[rest.index].keys.clone(),
                                        Kind::Mutex,
                                        ttl,
                                        rest.token,
                                        Instant::now() + bounds.io,
                                    );
                                }
                                return Err(e);
                            }
                        }
                    }
                    // One acquisition per name the script took (those taken alone were
                    // counted by their own acquires).
                    for _ in 0..taken_here {
                        stats::acquire_ended::<()>(&Ok(()), started.elapsed(), false);
                    }
                    let mut taken = Vec::with_capacity(group.len());
                    for (named, held) in group.iter().zip(alone) {
                        match held {
                            Some((guard, live)) => taken.push((named.name.clone(), guard, live)),
                            None => {
                                return Err(Error::new(
                                    ErrorKind::Server,
                                    format!("no grant for {:?} in a group taken whole", named.name),
                                ));
                            }
                        }
                    }
                    return Ok(taken);
                }
            };
        }
    }

    /// The names in the order they are taken, checked: by group (see
    /// [`crate::protocol::LockServer::group_of`]), then by key.
    fn order(&self) -> Result<Vec<Named>> {
        if self.names.is_empty() || self.names.len() > MAX_NAMES {
            return Err(Error::invalid(format!(
                "a lock over several names takes 1 to {MAX_NAMES} names, got {}",
                self.names.len()
            )));
        }
        let prefix = &self.shared.options.key_prefix;
        let mut named = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let keys = LockKeys::new(prefix, name)?;
            let group = self.shared.server.group_of(&keys.lock);
            named.push(Named {
                name: name.clone(),
                keys,
                group,
            });
        }
        named.sort_by(|a, b| (a.group, &a.keys.lock).cmp(&(b.group, &b.keys.lock)));
        if let Some(pair) = named.windows(2).find(|w| w[0].keys.lock == w[1].keys.lock) {
            return Err(Error::invalid(format!(
                "the name {:?} is given twice",
                pair[0].name
            )));
        }
        Ok(named)
    }
}

/// Whether a guard's loss is its lock's: set once the lock is taken, never for a guard
/// given back while it was being taken.
type Live = Arc<AtomicBool>;

/// What [`MultiLockBuilder::take_in_order`] took: the guards by name, and their liveness
/// flags.
type InOrder = (Vec<(String, LockGuard)>, Vec<Live>);

/// One of the names, with its keys and group.
struct Named {
    name: String,
    keys: LockKeys,
    group: Option<u16>,
}

/// Takes one name with the ordinary acquire, waiting as `wait` says.
fn take_one(builder: LockBuilder<'_>, wait: Wait) -> Result<LockGuard> {
    match wait {
        Wait::No => builder.try_acquire(),
        Wait::Forever => builder.acquire(),
        Wait::Until(deadline) => {
            builder.acquire_timeout(deadline.saturating_duration_since(Instant::now()))
        }
    }
}

/// Releases what a failed acquire took, last first.
fn give_back(guards: Vec<(String, LockGuard)>) {
    for (name, guard) in guards.into_iter().rev() {
        if let Err(e) = guard.release() {
            log::warn!("giving back {name:?} after a failed lock_all: {e}");
        }
    }
}

/// The loss of a lock over several names: the first name's loss, told once.
#[derive(Default)]
struct LossHub {
    state: Mutex<(Option<LostReason>, Vec<Sender<LostReason>>)>,
}

impl LossHub {
    /// Records a loss; `true` for the first.
    fn lost(&self, reason: LostReason) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.is_some() {
            return false;
        }
        state.0 = Some(reason);
        for tx in state.1.drain(..) {
            let _ = tx.try_send(reason);
        }
        true
    }

    fn subscribe(&self) -> Receiver<LostReason> {
        let (tx, rx) = bounded(1);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.0 {
            Some(reason) => {
                let _ = tx.try_send(reason);
            }
            None => state.1.push(tx),
        }
        rx
    }

    fn reason(&self) -> Option<LostReason> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// A held lock over several names. Dropping it releases every name.
#[must_use = "if unused the lock is released at once"]
pub struct MultiGuard {
    /// The names and their guards, in the order they were taken.
    guards: Vec<(String, LockGuard)>,
    hub: Arc<LossHub>,
}

impl MultiGuard {
    /// The names, in the order they were taken (their keys').
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(|(n, _)| n.as_str())
    }

    /// The fencing token of each name, in the order of [`names`](Self::names): pass each to
    /// the resource of that name.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.guards
            .iter()
            .map(|(n, g)| (n.as_str(), g.fencing_token()))
            .collect()
    }

    /// The fencing token of `name`, if it is one of this lock's.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guard(name).map(LockGuard::fencing_token)
    }

    /// The guard of `name`, if it is one of this lock's (its token, lease, ...).
    pub fn guard(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// Whether every name is held (the local view; sends nothing).
    pub fn is_held(&self) -> bool {
        self.hub.reason().is_none() && self.guards.iter().all(|(_, g)| g.is_held())
    }

    /// The shortest lease left of the names.
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|(_, g)| g.remaining())
            .min()
            .unwrap_or_default()
    }

    /// Why the lock was lost (the first name's loss), if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.hub.reason()
    }

    /// A receiver that gets the reason once, when the first name is lost.
    pub fn lost(&self) -> Receiver<LostReason> {
        self.hub.subscribe()
    }

    /// Extends every name to `ttl` from now. Errors: the first name's error
    /// ([`ErrorKind::NotHeld`] when it was lost: the whole lock is).
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        crate::process::api_call(|| {
            let mut first = None;
            for (_, guard) in &self.guards {
                if let Err(e) = guard.extend(ttl) {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        })
    }

    /// Releases every name, last taken first. `Ok` only when each was held without a break
    /// up to its release; otherwise the first error (every name is released all the same).
    pub fn release(mut self) -> Result<()> {
        crate::process::api_call(move || {
            let mut first: Option<Error> = None;
            for (_, guard) in std::mem::take(&mut self.guards).into_iter().rev() {
                if let Err(e) = guard.release() {
                    first.get_or_insert(e);
                }
            }
            match (first, self.hub.reason()) {
                (Some(e), _) => Err(e),
                (None, Some(reason)) => Err(Error::new(
                    ErrorKind::NotHeld,
                    format!("the lock was lost before the release: {reason}"),
                )),
                (None, None) => Ok(()),
            }
        })
    }

    /// Takes the guards out, in the order taken (for the C ABI, which gives each its own
    /// handle).
    pub(crate) fn into_guards(mut self) -> Vec<(String, LockGuard)> {
        std::mem::take(&mut self.guards)
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("fencing_tokens", &self.fencing_tokens())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        let _call = crate::process::ApiCall::enter();
        give_back(std::mem::take(&mut self.guards));
    }
}
