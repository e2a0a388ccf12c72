//! The library's behaviour against real `redis-server` processes that the tests start
//! (`tests/support`: servers on free ports, Sentinels, a local Cluster, a fault-injecting
//! proxy), one module per behaviour: look for what proves X in the module named for X. One
//! test binary, linked once; run one behaviour with `cargo test --test lock -- waiting::`.
//!
//! - `acquire`: taking a lock; what an attempt reports is true. `adopt`: taking over a
//!   lock held under a token handed over; abandoning one.
//! - `waiting`: blocking waits, wake-ups, the handoff to waiters in order, grants nobody
//!   takes.
//! - `release`: releasing only one's own lock; what a release reports is true.
//! - `extend`: extends whose replies are lost or late.
//! - `renewal`: the watchdog, its threads, and the ttl it follows.
//! - `batching`: renewals of many locks sharing batches, one of them slow.
//! - `loss`: a lost lock is reported once, on time, and a loss is final.
//! - `bounds`: every call returns within its documented bound on a silent server.
//! - `cancel`: cancelling a waiting acquire; `signals`: signals never fail a call.
//! - `faults`: stopped, killed and restarted servers, reset connections, fencing across
//!   restarts.
//! - `memory`: a server under `maxmemory`.
//! - `keys`: lock names, their keys and companion keys; `urls`: URLs, credentials, TLS, ACL
//!   users; `input`: bad arguments refused before anything is sent; `inspect`: the
//!   operators' view.
//! - `kinds`: reentrant locks, semaphores, read-write locks; `multi`: one lock over several
//!   names.
//! - `deployments`: Cluster, Sentinel, replica acknowledgement, Redlock.
//! - `errors`: what a failure says, and that it says the same for the same cause.
//! - `stats`: the process-wide figures.
//! - `upgrade`: clients of 0.1 and of this version on the same names.
//! - `chaos`: randomised runs under every fault at once (ignored: run by hand).
//! - `proxy_selftest`: the fault proxy itself does what the tests above rely on.

#[path = "../support/mod.rs"]
mod support;

mod acquire;
mod adopt;
mod batching;
mod bounds;
mod cancel;
mod chaos;
mod deployments;
mod errors;
mod extend;
mod faults;
mod fork_in_a_drop;
mod input;
mod inspect;
mod keys;
mod kinds;
mod loss;
mod memory;
mod multi;
mod proxy_selftest;
mod release;
mod renewal;
mod signals;
mod stats;
mod upgrade;
mod urls;
mod waiting;
