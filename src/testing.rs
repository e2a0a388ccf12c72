//! Test fixtures shared with the integration tests: real `redis-server` processes of the
//! test's own and a fault-injecting proxy (`tests/support`, compiled here too so that unit
//! tests can run the crate's internals against real servers).

#[path = "../tests/support/mod.rs"]
pub(crate) mod support;
