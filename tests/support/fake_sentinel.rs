//! A fake Sentinel owned by a test: a tiny RESP server on a free loopback port that names
//! whichever primary the test tells it to. Real Sentinels cannot easily be made to lag
//! behind a failover, to disagree, or to go silent on cue; this one can, at any moment.
//!
//! Promises:
//! - `SENTINEL GET-MASTER-ADDR-BY-NAME <master>` is answered as the test set it last
//!   ([`FakeSentinel::answer`]), as of when the request arrives: the primary's address
//!   (host, port), or null (it does not know the master). Another master's name is answered
//!   null, as a real Sentinel does.
//! - [`Answer::Silent`]: every request is read and never answered, and a connection that
//!   was silent once stays silent. [`Answer::HangUp`]: the connection is closed when a
//!   request arrives. Both apply to every command, as for a stopped or a dead Sentinel.
//! - Whatever else a connector sends on connect is answered the way a Sentinel would:
//!   `PING` with `+PONG`; `AUTH`, `SELECT` and `CLIENT ...` with `+OK` (the library sends
//!   `AUTH` and `SELECT` only when its URL asks for them); any other command with an error.
//! - [`FakeSentinel::asked`] counts the `GET-MASTER-ADDR-BY-NAME` requests received,
//!   answered or not; [`FakeSentinel::connections`] the connections accepted.
//! - Drop stops accepting, closes the listener and every connection, and joins every thread.
//!
//! Limitations: requests must be RESP arrays (what clients send, not inline commands); a
//! stream that is not one closes its connection.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the accepting thread sleeps between looks at its listener and stop flag.
const POLL: Duration = Duration::from_millis(5);

/// How a fake Sentinel answers (see [`FakeSentinel::answer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The master's primary is at `host:port`.
    Primary { host: String, port: u16 },
    /// Null: the Sentinel does not know the master.
    Unknown,
    /// Reads every request and answers none.
    Silent,
    /// Closes the connection when a request arrives.
    HangUp,
}

pub struct FakeSentinel {
    shared: Arc<Shared>,
    port: u16,
    acceptor: Option<JoinHandle<()>>,
}

/// State shared by the handle and the threads.
struct Shared {
    master: String,
    answer: Mutex<Answer>,
    asked: AtomicU64,
    accepted: AtomicU64,
    stop: AtomicBool,
    /// Every connection not known to be finished: a handle on its socket (to close it on
    /// drop) and its thread.
    conns: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeSentinel {
    /// Listens on 127.0.0.1:<free port> as a Sentinel of `master`, naming 127.0.0.1:
    /// `primary_port` as its primary.
    pub fn start(master: &str, primary_port: u16) -> FakeSentinel {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake sentinel: bind");
        let port = listener.local_addr().expect("fake sentinel: addr").port();
        listener
            .set_nonblocking(true)
            .expect("fake sentinel: nonblocking listener");
        let shared = Arc::new(Shared {
            master: master.to_owned(),
            answer: Mutex::new(primary(primary_port)),
            asked: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("fs{port}-accept"))
                .spawn(move || accept_loop(&shared, listener))
                .expect("fake sentinel: spawn acceptor")
        };
        FakeSentinel {
            shared,
            port,
            acceptor: Some(acceptor),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// "127.0.0.1:<port>", for a `redis+sentinel://` URL.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// From now on names 127.0.0.1:`port` as the primary.
    pub fn name(&self, port: u16) {
        self.answer(primary(port));
    }

    /// From now on answers requests (and the connections that are not silent) so.
    pub fn answer(&self, answer: Answer) {
        *lock(&self.shared.answer) = answer;
    }

    /// How many `SENTINEL GET-MASTER-ADDR-BY-NAME` requests it received.
    pub fn asked(&self) -> u64 {
        self.shared.asked.load(SeqCst)
    }

    /// How many connections it accepted.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(SeqCst)
    }
}

fn primary(port: u16) -> Answer {
    Answer::Primary {
        host: "127.0.0.1".into(),
        port,
    }
}

impl Drop for FakeSentinel {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // The acceptor owns the listener: once joined, nothing more is accepted.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (socket, thread) in std::mem::take(&mut *lock(&self.shared.conns)) {
            // Ends the thread's blocking read.
            let _ = socket.shutdown(Shutdown::Both);
            let _ = thread.join();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    while !shared.stop.load(SeqCst) {
        let Ok((stream, _)) = listener.accept() else {
            std::thread::sleep(POLL);
            continue;
        };
        shared.accepted.fetch_add(1, SeqCst);
        let Ok(socket) = stream.try_clone() else {
            continue;
        };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || serve(&shared, stream))
        };
        let mut conns = lock(&shared.conns);
        // A finished thread's handle is dropped (nothing to join), and its socket closed.
        conns.retain(|(_, thread)| !thread.is_finished());
        conns.push((socket, thread));
    }
}

/// Answers the requests of one connection, in order, until it closes, hangs up, or the
/// fake stops.
fn serve(shared: &Shared, stream: TcpStream) {
    let mut reader = BufReader::new(&stream);
    let mut silent = false;
    while let Some(args) = read_request(&mut reader) {
        let command = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
        let asks = command(0).as_deref() == Some("SENTINEL")
            && command(1).as_deref() == Some("GET-MASTER-ADDR-BY-NAME");
        if asks {
            shared.asked.fetch_add(1, SeqCst);
        }
        let answer = lock(&shared.answer).clone();
        let reply = match answer {
            _ if silent => continue,
            Answer::Silent => {
                silent = true;
                continue;
            }
            Answer::HangUp => break,
            _ if asks && args.get(2) != Some(&shared.master) => "*-1\r\n".to_owned(),
            Answer::Unknown if asks => "*-1\r\n".to_owned(),
            Answer::Primary { host, port } if asks => {
                let port = port.to_string();
                format!(
                    "*2\r\n${}\r\n{host}\r\n${}\r\n{port}\r\n",
                    host.len(),
                    port.len()
                )
            }
            _ => match command(0).as_deref() {
                Some("PING") => "+PONG\r\n".to_owned(),
                Some("AUTH" | "SELECT" | "CLIENT") => "+OK\r\n".to_owned(),
                _ => format!(
                    "-ERR unknown command {:?}\r\n",
                    command(0).unwrap_or_default()
                ),
            },
        };
        if (&stream).write_all(reply.as_bytes()).is_err() {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// One request (a RESP array of bulk strings), read blocking; `None` at the end of the
/// stream, on an error, or on anything else.
fn read_request(reader: &mut impl BufRead) -> Option<Vec<String>> {
    let count = header(reader, '*')?;
    (0..count)
        .map(|_| {
            let len = header(reader, '$')?;
            let mut arg = vec![0; len + 2];
            reader.read_exact(&mut arg).ok()?;
            arg.truncate(len);
            String::from_utf8(arg).ok()
        })
        .collect()
}

/// The number after `kind` on the next line (`*3`, `$12`).
fn header(reader: &mut impl BufRead, kind: char) -> Option<usize> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    line.strip_prefix(kind)?.trim_end().parse().ok()
}
