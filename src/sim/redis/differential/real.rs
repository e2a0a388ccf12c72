//! A real `redis-server` for the differential test: started by the test on a free port
//! (never 6379) in a temporary directory without persistence, killed by its own pid when
//! dropped (its log printed if the test is failing), and raw RESP2 connections to it that
//! read replies into the same [`redis::Value`]s the model gives.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Value;

/// A `redis-server` child process of the test's own.
pub(crate) struct RealServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RealServer {
    /// Starts `REDIS_SERVER_BIN` (or `redis-server` from `PATH`) on a free port with
    /// `--save "" --appendonly no`, and waits until it answers `PING`.
    pub(crate) fn start() -> RealServer {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
            let port = free_port();
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {bin}: {e} (install redis-server)"));
            let mut server = RealServer { child, port, dir };
            if server.wait_ready() {
                return server;
            }
            last_log = server.log();
        }
        panic!("redis-server did not start; log:\n{last_log}");
    }

    fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut conn) = RealConn::open(self.port) {
                if conn.query(&[b"PING".to_vec()]).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// A new connection.
    pub(crate) fn connect(&self) -> RealConn {
        RealConn::open(self.port).expect("connect to the test's redis-server")
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- redis-server log ---\n{}", self.log());
        }
        self.kill();
    }
}

/// A TCP port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// A raw RESP2 connection.
pub(crate) struct RealConn {
    reader: BufReader<TcpStream>,
}

impl RealConn {
    fn open(port: u16) -> io::Result<RealConn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(RealConn {
            reader: BufReader::new(stream),
        })
    }

    /// Sends a pipeline of commands.
    pub(crate) fn send(&mut self, commands: &[Vec<Vec<u8>>]) -> io::Result<()> {
        let mut out = Vec::new();
        for command in commands {
            out.extend_from_slice(format!("*{}\r\n", command.len()).as_bytes());
            for arg in command {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.reader.get_mut().write_all(&out)
    }

    /// Reads one reply, waiting up to 5 s.
    pub(crate) fn recv(&mut self) -> io::Result<Value> {
        let line = self.line()?;
        let (kind, rest) = line.split_first().ok_or_else(|| bad("empty line"))?;
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("bad number"))
        };
        Ok(match kind {
            b'+' if rest == b"OK" => Value::Okay,
            b'+' => Value::SimpleString(String::from_utf8_lossy(rest).into_owned()),
            b'-' => {
                let mut raw = line.clone();
                raw.extend_from_slice(b"\r\n");
                redis::parse_redis_value(&raw).map_err(|e| bad(&e.to_string()))?
            }
            b':' => Value::Int(number()?),
            b'$' => match number()? {
                n if n < 0 => Value::Nil,
                n => {
                    let mut data = vec![0; n as usize + 2];
                    self.reader.read_exact(&mut data)?;
                    data.truncate(n as usize);
                    Value::BulkString(data)
                }
            },
            b'*' => match number()? {
                n if n < 0 => Value::Nil,
                n => Value::Array((0..n).map(|_| self.recv()).collect::<io::Result<_>>()?),
            },
            _ => return Err(bad("unknown reply type")),
        })
    }

    /// Whether a reply (or part of one) has arrived and not been read.
    pub(crate) fn has_data(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let stream = self.reader.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let arrived = matches!(stream.peek(&mut byte), Ok(n) if n > 0);
        let _ = stream.set_nonblocking(false);
        arrived
    }

    /// Sends one command and reads its reply.
    pub(crate) fn query(&mut self, command: &[Vec<u8>]) -> io::Result<Value> {
        self.send(&[command.to_vec()])?;
        self.recv()
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\r\n") {
            return Err(bad("truncated reply"));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}
