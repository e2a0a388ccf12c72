//! The read-write lock's write side under W2's contention: `--threads` threads (8) taking
//! the write lock of one name, blocking acquire, critical sections as W2's, against W2's
//! floor (threads polling `SET NX PX` every 1 ms) in alternating reps. The write side is
//! the one that contends; readers share and are measured by the semaphore workload's kind
//! of contention.

use std::time::Duration;

use redlease::Client;

use crate::w2::{contend, floor, run_against_floor};
use crate::{Bench, TAG};

fn ours(bench: &Bench, client: &Client, cs: Duration) -> crate::w2::Contended {
    let name = format!("{TAG}:rw");
    contend(bench, bench.cfg.threads, cs, |_| {
        let client = client.clone();
        let name = name.clone();
        move |acquired: &mut dyn FnMut()| {
            let guard = client.rwlock(&name).write().acquire().expect("acquire");
            acquired();
            guard.release().expect("release");
        }
    })
}

pub(crate) fn run(bench: &Bench) {
    let client = Client::open(&bench.url).expect("client");
    let workload = format!("read-write lock, write side, {} threads", bench.cfg.threads);
    run_against_floor(
        bench,
        &workload,
        |cs| floor(bench, cs),
        |cs| ours(bench, &client, cs),
    );
}
