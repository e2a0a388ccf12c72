//! A simulated Redis 7.0 server that runs the project's real Lua scripts.
//!
//! The model serves the commands the lock's scripts and clients use, with Redis's replies
//! and error texts, over a keyspace that expires keys by a wall clock made of virtual time
//! plus an offset of the server's own. Scripts run in an embedded Lua 5.1 with Redis's
//! conversions and error handling ([`lua`]), with the clock frozen for the whole script.
//! Connections block in `BLPOP` and `WAIT`; a primary streams its writes to replicas that
//! apply them after a delay ([`ReplicaLink`]); a replica can be promoted; a server can
//! restart without persistence or run out of memory. [`Server`] says how a simulation drives
//! it, and `differential/` holds the test that keeps it equal to a real `redis-server`.
//!
//! Files, by concept: [`reply`] (replies and their texts), [`args`] (how Redis reads
//! numbers), [`keyspace`] (keys, types, expiry), [`strings`], [`keys`], [`lists`],
//! [`zsets`], [`hashes`] (commands by data type), [`commands`] (the command table and the
//! checks before a command runs), [`lua`] and [`scripting`] (the Lua bridge and the script
//! cache), [`blocking`] (`BLPOP`, `WAIT`'s block), [`connection`], [`replication`],
//! [`server`]; `tests.rs` drives the server as a simulation would.
//!
//! Not modelled: other commands and data types, databases other than 0, `MULTI`/`EXEC`,
//! scripts' shebang flags and `FUNCTION`s, `EVAL_RO`, RESP3 (`redis.setresp(3)`), the
//! `cjson`, `bit`, `struct` and `cmsgpack` Lua libraries and Redis's deterministic
//! `math.random`, read-only library tables (only the globals are protected), script time
//! limits (`BUSY`, `SCRIPT KILL`), eviction policies other than `noeviction`, the order of
//! large hashes, partial resynchronisation (a link always resynchronises in full), and
//! replicas that lag in acknowledging what they applied.

mod args;
mod blocking;
mod commands;
mod connection;
mod hashes;
mod keys;
mod keyspace;
mod lists;
mod lua;
mod replication;
mod reply;
mod scripting;
mod server;
mod strings;
mod zsets;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod tests;

pub(crate) use connection::{Command, ConnId, command, from_cmd};
pub(crate) use keyspace::Data;
pub(crate) use replication::ReplicaLink;
pub(crate) use server::{ConnectionClosed, DEFAULT_CLOCK_MS, Server, ServerId};
