//! Replication: a primary's stream of writes and the link that applies it to a replica
//! after a delay the simulation controls.
//!
//! Redis 7 replicates a script by its effects, not by its text (wrapped in `MULTI`/`EXEC`,
//! so a replica applies them at once), and an expiry as an absolute time (`SET ... PXAT`,
//! `PEXPIREAT`), and a key that expires on the primary as a `DEL`. The model streams, for
//! each command (or expiry, or served `BLPOP`) that changed something, the resulting
//! entries of the keys it changed, expiry included as the primary's absolute wall-clock
//! time: applying them in order gives the replica the same keyspace as applying Redis's
//! effects. A replica reads those expiries on its own clock, so clock skew between the two
//! shows after a failover, as it does in Redis.
//!
//! Each unit carries the virtual instant it was written; the link delivers a unit once
//! that instant plus its delay has passed, in order, and the replica acknowledges at once
//! what it applied (what `WAIT` counts). A restart of either side (or a promotion) makes
//! the link resynchronise in full: the replica's keyspace becomes a copy of the primary's.

use super::keyspace::Change;
use super::server::{Server, ServerId};

/// The changes of one command, as the replica applies them (atomically).
#[derive(Clone, Debug)]
pub(crate) struct Unit {
    /// The stream's offset after this unit (units are numbered from 1).
    pub offset: u64,
    /// When the primary wrote it (virtual ms).
    pub written_at: u64,
    /// The keys it changed, each with its new entry (`None`: deleted).
    pub changes: Vec<Change>,
}

/// A primary's replication stream since its last restart or promotion.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stream {
    units: Vec<Unit>,
}

impl Stream {
    /// The offset after the last unit (0 for an empty stream).
    pub(crate) fn offset(&self) -> u64 {
        self.units.len() as u64
    }

    /// Appends the changes of one command; returns the new offset.
    pub(crate) fn push(&mut self, written_at: u64, changes: Vec<Change>) -> u64 {
        let offset = self.offset() + 1;
        self.units.push(Unit {
            offset,
            written_at,
            changes,
        });
        offset
    }

    /// The units after `offset`, in order.
    pub(crate) fn after(&self, offset: u64) -> &[Unit] {
        let start = usize::try_from(offset).map_or(self.units.len(), |o| o.min(self.units.len()));
        &self.units[start..]
    }

    /// Starts a new, empty stream.
    pub(crate) fn reset(&mut self) {
        self.units.clear();
    }
}

/// The link from a primary to one replica.
#[derive(Clone, Debug)]
pub(crate) struct ReplicaLink {
    primary: ServerId,
    replica: ServerId,
    delay_ms: u64,
    /// The epochs of both ends at the last full synchronisation.
    synced: (u64, u64),
    /// The primary's offset the replica has applied.
    applied: u64,
}

impl ReplicaLink {
    /// Makes `replica` a replica of `primary` with a full synchronisation (its keyspace
    /// becomes a copy of the primary's; connections blocked on it are unblocked with an
    /// error, as Redis does when a primary turns replica). Writes then reach it `delay_ms`
    /// after they were made, once [`ReplicaLink::pump`] runs.
    pub(crate) fn attach(primary: &mut Server, replica: &mut Server, delay_ms: u64) -> ReplicaLink {
        let mut link = ReplicaLink {
            primary: primary.id(),
            replica: replica.id(),
            delay_ms,
            synced: (0, 0),
            applied: 0,
        };
        link.full_sync(primary, replica);
        link
    }

    /// The replica's id.
    pub(crate) fn replica(&self) -> ServerId {
        self.replica
    }

    /// Changes how long writes take to reach the replica (they stay in order).
    pub(crate) fn set_delay(&mut self, delay_ms: u64) {
        self.delay_ms = delay_ms;
    }

    fn full_sync(&mut self, primary: &mut Server, replica: &mut Server) {
        let (snapshot, offset) = primary.replication_snapshot();
        replica.become_replica(snapshot);
        self.synced = (primary.epoch(), replica.epoch());
        self.applied = offset;
        primary.acknowledge(self.replica, offset);
    }

    /// Delivers to the replica every write due by the primary's current time (written at
    /// least the delay ago), in order, and acknowledges them to the primary (which may
    /// unblock `WAIT`s there: take the primary's replies afterwards). Resynchronises in
    /// full first if either end restarted or changed role since.
    pub(crate) fn pump(&mut self, primary: &mut Server, replica: &mut Server) {
        assert_eq!(
            (primary.id(), replica.id()),
            (self.primary, self.replica),
            "a link pumps between its own servers"
        );
        if (primary.epoch(), replica.epoch()) != self.synced {
            self.full_sync(primary, replica);
            return;
        }
        let now = primary.now();
        let mut applied = self.applied;
        for unit in primary.stream().after(self.applied) {
            if unit.written_at.saturating_add(self.delay_ms) > now {
                break;
            }
            replica.apply_replicated(&unit.changes);
            applied = unit.offset;
        }
        if applied != self.applied {
            self.applied = applied;
            primary.acknowledge(self.replica, applied);
        }
    }

    /// The next virtual instant [`ReplicaLink::pump`] has something to do: the due time of
    /// the first write not delivered, or now when a resynchronisation is pending.
    pub(crate) fn next_timer(&self, primary: &Server, replica: &Server) -> Option<u64> {
        if (primary.epoch(), replica.epoch()) != self.synced {
            return Some(primary.now());
        }
        primary
            .stream()
            .after(self.applied)
            .first()
            .map(|u| u.written_at.saturating_add(self.delay_ms))
    }

    /// Ends the link: the primary stops counting the replica for `WAIT` (after a failover,
    /// or when the simulation cuts the replica off for good).
    pub(crate) fn detach(self, primary: &mut Server) {
        primary.forget_replica(self.replica);
    }
}
