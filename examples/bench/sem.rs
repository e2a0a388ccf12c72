//! The semaphore workload: `--sem-threads` threads (16) share `--sem-permits` permits (4),
//! blocking acquire, critical sections as W2's. The floor: threads polling a minimal
//! semaphore script (expired holders dropped, a permit taken if fewer than N are held,
//! timed by the server's clock) every 1 ms, releasing with `ZREM`.

use std::time::Duration;

use redlease::Client;

use crate::w2::{contend, run_against_floor};
use crate::{Bench, TAG};

const ACQUIRE_LUA: &str = "local t = redis.call('TIME') \
    local now = t[1] * 1000 + math.floor(t[2] / 1000) \
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) \
    if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
      redis.call('ZADD', KEYS[1], now + 30000, ARGV[1]) return 1 end return 0";

fn floor(bench: &Bench, cs: Duration) -> crate::w2::Contended {
    let script = redis::Script::new(ACQUIRE_LUA);
    let sha = script.get_hash().to_owned();
    let _: String = script
        .prepare_invoke()
        .load(&mut bench.conn())
        .expect("load");
    let key = format!("{TAG}:semfloor");
    let permits = bench.cfg.sem_permits;
    contend(bench, bench.cfg.sem_threads, cs, |i| {
        let mut conn = bench.conn();
        let token = format!("tok-{i}");
        let (sha, key) = (sha.clone(), key.clone());
        move |acquired: &mut dyn FnMut()| loop {
            let ok: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(&key)
                .arg(&token)
                .arg(permits)
                .query(&mut conn)
                .expect("EVALSHA");
            if ok == 1 {
                acquired();
                let _: i64 = redis::cmd("ZREM")
                    .arg(&key)
                    .arg(&token)
                    .query(&mut conn)
                    .expect("ZREM");
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

fn ours(bench: &Bench, client: &Client, cs: Duration) -> crate::w2::Contended {
    let name = format!("{TAG}:sem");
    let permits = bench.cfg.sem_permits;
    contend(bench, bench.cfg.sem_threads, cs, |_| {
        let client = client.clone();
        let name = name.clone();
        move |acquired: &mut dyn FnMut()| {
            let permit = client.semaphore(&name, permits).acquire().expect("acquire");
            acquired();
            permit.release().expect("release");
        }
    })
}

pub(crate) fn run(bench: &Bench) {
    let client = Client::open(&bench.url).expect("client");
    let workload = format!(
        "semaphore, {} permits, {} threads",
        bench.cfg.sem_permits, bench.cfg.sem_threads
    );
    run_against_floor(
        bench,
        &workload,
        |cs| floor(bench, cs),
        |cs| ours(bench, &client, cs),
    );
}
