//! The lock protocol as a deployment serves it: the one seam the lock code talks to.
//!
//! A [`LockServer`] takes an attempt, an extend or a release of one hold and answers with
//! what the scripts said. Two implementations: [`routed::Routed`] sends each to the server
//! that owns the lock key (a single server, a Sentinel deployment's primary, a Cluster
//! slot's primary, through [`crate::backend`]); [`quorum::Quorum`] sends it to every
//! Redlock member in one round and counts the answers ([`crate::core::quorum`]). Both
//! build their calls in one place ([`crate::kinds`]: each script's KEYS and ARGV), and
//! declare what they can do ([`Capabilities`]), which the lock builder checks before
//! anything is sent.

pub(crate) mod calls;
pub(crate) mod quorum;
pub(crate) mod routed;

use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::backend::batch::{Batcher, Item};
use crate::backend::call::{Call, Replicas};
use crate::backend::exec::{Exec, Replies};
use crate::core::acquire::Bounds;
use crate::core::reply::{Answer, AttemptReply, ExtendReply, GroupReply, Mode, ReleaseReply};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::kinds::Kind;
use crate::line::Lines;

/// What a deployment can do beyond a mutex taken, extended and released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Reentrant locks, semaphores and read-write locks (otherwise mutexes only).
    pub every_kind: bool,
    /// Waiters block on the server and releases hand the lock to them; otherwise waiters
    /// sleep between attempts.
    pub blocking: bool,
    /// Fencing tokens that increase per name (otherwise every fencing token is 0).
    pub fencing: bool,
    /// Replica acknowledgement (`min_replicas`).
    pub replicas: bool,
    /// Renewals pipelined with other locks' ([`crate::backend::batch`]).
    pub batching: bool,
    /// Operators' views and actions: inspect, list, break, check.
    pub inspection: bool,
}

/// One hold on the server: its kind, its keys and the token it is (or would be) under.
#[derive(Clone, Copy)]
pub(crate) struct Hold<'a> {
    pub kind: &'a Kind,
    pub keys: &'a LockKeys,
    pub token: &'a str,
}

/// One acquire attempt.
pub(crate) struct AttemptRequest<'a> {
    pub hold: Hold<'a>,
    pub ttl: Duration,
    pub mode: Mode,
    /// How long the waiter's registration lives unrefreshed.
    pub grace: Duration,
    /// Block on the wake list this long first, the attempt pipelined behind the block.
    pub block: Option<Duration>,
    /// A waiter's first attempt goes ahead of the block (see [`calls::attempt`]).
    pub lead: bool,
    /// A direct waiter's: nothing follows the block (see [`calls::attempt`]).
    pub direct: bool,
    /// No attempt under the token led a block before (see [`calls::attempt`]).
    pub first_lead: bool,
    pub exec: Exec<'a>,
    pub replicas: Option<Replicas>,
}

/// One attempt at several mutexes of one group (see [`LockServer::group_of`]).
pub(crate) struct GroupRequest<'a> {
    /// The names' keys, in the order they are taken.
    pub keys: &'a [LockKeys],
    /// Per name, the token it is taken under (or held under).
    pub tokens: &'a [String],
    /// Per name, whether the caller holds it already (checked only).
    pub held: &'a [bool],
    pub ttl: Duration,
    pub exec: Exec<'a>,
}

/// A renewal queued in a batch, to take back while it is unsent.
pub(crate) struct Queued {
    pub batcher: Weak<Batcher>,
    pub id: u64,
}

/// The lock protocol over one deployment (see the module documentation). Every method
/// blocks for at most the bounds in its request (or the client's timeouts) and never
/// repeats a request that may have run.
pub(crate) trait LockServer: Send + Sync {
    /// What this deployment can do.
    fn capabilities(&self) -> Capabilities;

    /// The bounds of one request.
    fn bounds(&self) -> Bounds;

    /// The deployment, for messages (passwords hidden).
    fn describe(&self) -> &str;

    /// Sends an attempt. `Ok(None)`: a block found every blocking connection taken, and
    /// nothing was sent.
    fn attempt(&self, request: &AttemptRequest<'_>) -> Result<Option<Answer<AttemptReply>>>;

    /// The group of the lock `key`: names of one group are taken in one script by
    /// [`Self::attempt_all`], and groups are taken in the order of their numbers. `None`:
    /// this deployment has no such script (a quorum), and names are taken one by one.
    fn group_of(&self, _key: &str) -> Option<u16> {
        None
    }

    /// Sends the acquire-all script ([`crate::scripts::ACQUIRE_ALL`]) for names of one
    /// group. Only where [`Self::group_of`] gives groups.
    fn attempt_all(&self, _request: &GroupRequest<'_>) -> Result<Answer<GroupReply>> {
        Err(Error::invalid(
            "this deployment cannot take several names in one script",
        ))
    }

    /// Extends `hold` to `ttl`.
    fn extend(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        replicas: Option<Replicas>,
        exec: &Exec<'_>,
    ) -> Result<Answer<ExtendReply>>;

    /// Releases `hold` (a lease of `ttl`), or, `withdraw`, withdraws a waiter: also its
    /// registration, and a hold it may have taken unawares.
    fn release(
        &self,
        hold: Hold<'_>,
        ttl: Duration,
        withdraw: bool,
        exec: &Exec<'_>,
    ) -> Result<ReleaseReply>;

    /// This client's waiters in line per name, where the deployment cannot queue them
    /// itself (a quorum: see [`crate::core::line`]); `None` where it can.
    fn lines(&self) -> Option<&Lines> {
        None
    }

    /// Queues `item` (a renewal of the lock `key`) in the batch of the node that owns the
    /// key, found by `deadline`. Only when [`Capabilities::batching`]; nothing is sent when
    /// this fails.
    fn queue_renewal(&self, key: &str, item: Item, deadline: Instant) -> Result<Queued>;

    /// Whether the lock key is held (on a majority, for a quorum).
    fn is_locked(&self, keys: &LockKeys) -> Result<bool>;

    /// Checks that the deployment answers (a majority, for a quorum).
    fn ping(&self) -> Result<()>;

    /// Runs `calls` on the server that owns `key`. Only when
    /// [`Capabilities::inspection`].
    fn run(&self, key: &str, calls: &[Call], exec: &Exec<'_>) -> Result<Replies>;

    /// Every key matching `pattern`, at most `limit`. Only when
    /// [`Capabilities::inspection`].
    fn scan(&self, pattern: &str, limit: usize) -> Result<Vec<String>>;

    /// Closes the idle connections.
    fn close_idle(&self);
}
