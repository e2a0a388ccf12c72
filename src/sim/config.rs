//! What one simulated run is made of, drawn from its seed: the deployment, the clients and
//! their threads, the lock names and kinds, the timeouts, and how hostile the network,
//! the clocks and the servers are.

use std::time::Duration;

use crate::kinds::Kind;

/// Virtual time, in microseconds since the start of the run.
pub(crate) type Micros = u64;

/// Microseconds in `d`.
pub(crate) fn micros(d: Duration) -> Micros {
    d.as_micros().min(u128::from(u64::MAX)) as Micros
}

/// Where the locks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server, which may be paused and restarted (without persistence).
    Single,
    /// Redlock over this many independent primaries.
    Redlock(usize),
    /// A primary and a replica that receives its writes this many ms late; the replica may
    /// be promoted in its place (a failover, which may lose the writes it had not received),
    /// and acquires may ask for its acknowledgement (`min_replicas`).
    Replicated { lag_ms: u64 },
}

/// How often each fault happens (probabilities per message or per step), and how large.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    /// A message (request or reply) delayed by up to [`Faults::long_delay`] instead of a
    /// few hundred microseconds.
    pub long_delay: f64,
    /// The largest long delay: past the I/O timeout, so that replies come after their
    /// caller gave up and requests land after a later one.
    pub max_long_delay: Duration,
    /// A request lost on its way (the caller times out, the server never sees it).
    pub drop_request: f64,
    /// A reply lost on its way (the server ran the request).
    pub drop_reply: f64,
    /// The connection reset under a request: the caller sees the connection lost; the
    /// request may or may not have reached the server.
    pub reset: f64,
    /// A connection refused before anything was sent.
    pub refuse: f64,
    /// Per client step: the whole client process stops (SIGSTOP) for up to
    /// [`Faults::max_pause`]; its clock goes on.
    pub client_pause: f64,
    /// Per run step: a server stops answering for up to [`Faults::max_pause`].
    pub server_pause: f64,
    pub max_pause: Duration,
    /// Per run step: a server restarts without persistence (every key and cached script
    /// lost), which the design documents as a way to let two holders in.
    pub restart: f64,
    /// Per run step: the replica is promoted in place of the primary (once).
    pub failover: f64,
    /// Each client's clock runs at a rate within `1 ± drift` of real time (the documented
    /// allowance is 1 %).
    pub drift: f64,
}

impl Faults {
    /// No faults at all: for the liveness checks.
    pub fn calm() -> Faults {
        Faults {
            long_delay: 0.0,
            max_long_delay: Duration::ZERO,
            drop_request: 0.0,
            drop_reply: 0.0,
            reset: 0.0,
            refuse: 0.0,
            client_pause: 0.0,
            server_pause: 0.0,
            max_pause: Duration::ZERO,
            restart: 0.0,
            failover: 0.0,
            drift: 0.0,
        }
    }

    /// Whether anything can go wrong.
    pub fn any(&self) -> bool {
        self.long_delay > 0.0
            || self.drop_request > 0.0
            || self.drop_reply > 0.0
            || self.reset > 0.0
            || self.refuse > 0.0
            || self.client_pause > 0.0
            || self.server_pause > 0.0
            || self.restart > 0.0
            || self.failover > 0.0
    }
}

/// A lock name and the kind every caller uses it as.
#[derive(Debug, Clone)]
pub(crate) struct Name {
    pub name: String,
    pub kind: Kind,
}

/// One run.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub deployment: Deployment,
    pub clients: usize,
    /// Threads per client, each doing its own operations.
    pub tasks: usize,
    /// Operations each thread does (acquire, hold, release; some extends and cancels).
    pub ops: usize,
    pub names: Vec<Name>,
    pub io_timeout: Duration,
    pub connect_timeout: Duration,
    pub pool_wait: Duration,
    /// Waiters of one client that may block on a server at once (the blocking lane).
    pub blocking_lane: usize,
    pub faults: Faults,
}

impl Config {
    /// The run a seed stands for.
    pub fn from_seed(seed: u64) -> Config {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_c0f1_9000_0001);
        let deployment = match rng.u32(0..12) {
            0..=6 => Deployment::Single,
            7 | 8 => Deployment::Redlock(3),
            9 => Deployment::Redlock(5),
            _ => Deployment::Replicated {
                lag_ms: rng.u64(0..=50),
            },
        };
        let names = match deployment {
            // Redlock takes mutexes only.
            Deployment::Redlock(_) => vec![Name {
                name: "m".into(),
                kind: Kind::Mutex,
            }],
            Deployment::Single | Deployment::Replicated { .. } => {
                let all = [
                    Name {
                        name: "m".into(),
                        kind: Kind::Mutex,
                    },
                    Name {
                        name: "r".into(),
                        kind: Kind::Reentrant("shared".into()),
                    },
                    Name {
                        name: "s".into(),
                        kind: Kind::Permit(2),
                    },
                    Name {
                        name: "w".into(),
                        kind: Kind::Write,
                    },
                ];
                // One name, two, or all of them.
                match rng.u32(0..4) {
                    0 => vec![all[rng.usize(0..all.len())].clone()],
                    1 => {
                        let a = rng.usize(0..all.len());
                        let b = (a + 1 + rng.usize(0..all.len() - 1)) % all.len();
                        vec![all[a].clone(), all[b].clone()]
                    }
                    _ => all.to_vec(),
                }
            }
        };
        let calm = rng.u32(0..5) == 0;
        let faults = if calm {
            Faults::calm()
        } else {
            let level = rng.f64();
            let p = |max: f64, rng: &mut fastrand::Rng| {
                if rng.bool() {
                    0.0
                } else {
                    max * level * rng.f64()
                }
            };
            Faults {
                long_delay: p(0.2, &mut rng),
                max_long_delay: Duration::from_millis(rng.u64(50..=3000)),
                drop_request: p(0.05, &mut rng),
                drop_reply: p(0.05, &mut rng),
                reset: p(0.03, &mut rng),
                refuse: p(0.03, &mut rng),
                client_pause: p(0.02, &mut rng),
                server_pause: p(0.01, &mut rng),
                max_pause: Duration::from_millis(rng.u64(10..=3000)),
                restart: if rng.u32(0..4) == 0 {
                    p(0.003, &mut rng)
                } else {
                    0.0
                },
                failover: p(0.005, &mut rng),
                drift: if rng.bool() { 0.01 * rng.f64() } else { 0.0 },
            }
        };
        let io_timeout =
            Duration::from_millis(*rng.choice(&[50u64, 200, 500, 1000]).unwrap_or(&200));
        Config {
            deployment,
            clients: rng.usize(2..=4),
            tasks: rng.usize(1..=3),
            ops: rng.usize(3..=8),
            names,
            io_timeout,
            connect_timeout: io_timeout,
            pool_wait: Duration::from_millis(100),
            blocking_lane: rng.usize(1..=3),
            faults,
        }
    }

    /// How many servers the run starts.
    pub fn servers(&self) -> usize {
        match self.deployment {
            Deployment::Single => 1,
            Deployment::Redlock(n) => n,
            Deployment::Replicated { .. } => 2,
        }
    }
}
