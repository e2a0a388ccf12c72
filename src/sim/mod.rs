//! Deterministic simulation of the lock protocol (test-only).
//!
//! A simulation runs the client's protocol state machines, many clients at once, against
//! simulated servers over a simulated network, all driven by virtual time and one seed, and
//! holds every run to the promises of the design (§9). Nothing in here reads the real
//! clock, spawns a thread or draws randomness of its own: the driver owns all of that.
//!
//! - [`redis`]: the simulated Redis server. It executes the project's real Lua scripts in an
//!   embedded Lua 5.1, keeps its keyspace on a virtual clock, blocks `BLPOP` and `WAIT`,
//!   streams its writes to lagging replicas, and can fail over, restart and run out of
//!   memory. A differential test keeps its replies equal to a real `redis-server`'s.

pub(crate) mod redis;
