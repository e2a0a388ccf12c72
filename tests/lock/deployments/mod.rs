//! Deployments of several servers, all started by the tests (`tests/support/deploy.rs`):
//! a local Redis Cluster, a primary with replicas watched by Sentinels, a replica whose
//! acknowledgement an acquire waits for, and Redlock's independent primaries.

mod cluster;
mod redlock;
mod replicas;
mod sentinel;

use std::time::Duration;

use redlease::{Client, ClientOptions};

/// Connect and I/O timeouts of 0.5 s: a refused call may be tried again for 1 s.
fn quick(url: &str) -> Client {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500));
    Client::with_options(url, options).unwrap()
}
