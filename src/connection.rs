//! One connection to one Redis server, owned end to end.
//!
//! The redis crate's sync connection cannot keep this library's promises: it waits the full
//! timeout for each of its handshake replies (`CLIENT SETINFO` ×2, `AUTH`, `SELECT`), it
//! surfaces an interrupted read (`EINTR`, which a socket with a timeout gets even under
//! `SA_RESTART`) as a failure and then discards the next reply, and its reads cannot be
//! woken to cancel a wait. So connections are ours: sockets by socket2, TLS by rustls, and
//! every wait bounded by a deadline and resumed with the time left when a signal interrupts
//! it. A wait that something may cancel, or a TLS connection's, is a `poll(2)`; a plain
//! socket's wait for a reply that nothing but its deadline ends is the read itself, blocking
//! under a short receive timeout (`SO_RCVTIMEO`) while the deadline is far, then a `poll`
//! for the rest: one system call per reply, not two, when the reply comes in time. Every
//! other read and write of a socket does not block (`MSG_DONTWAIT`), and no write raises
//! `SIGPIPE` (`MSG_NOSIGNAL`: a C program linking the library need not ignore it). The
//! redis crate still packs the commands and parses the replies.
//!
//! Bounds: a connection is made (DNS, TCP, TLS, `AUTH`, `SELECT`) within one deadline; a
//! request is written within its deadline; each reply is awaited until its deadline. Any
//! failure after a request was written marks the connection broken (its stream is in an
//! unknown state) and the error [`crate::Error::outcome_unknown`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use socket2::{SockAddr, Socket, Type};

use crate::cancel::{self, Watch};
use crate::error::{Error, ErrorKind, Result};
use crate::process;
use crate::resp::{NotResp, ReplyBuffer};
use crate::tls::{self, TlsSetup};
use crate::url::{Addr, Login, Tls};

/// While fewer bytes than this are unread, a reader waiting on a connection made
/// [quiet](Connection::quiet_until) is not woken: one more than the reply of an attempt
/// that leads a block and found the lock held (`*2\r\n:0\r\n$11\r\n<pttl>\r\n`, the
/// pttl zero-padded to 11 characters: 26 bytes, see [`crate::scripts::ACQUIRE`]), and no
/// more than that reply with the shortest reply of a pop (`*-1\r\n`, nothing popped). The
/// other replies of an attempt are longer (it took the lock: three integers, the first
/// fencing token of 16 digits), and so are the server's errors, or they come with the
/// pop's own (`-MOVED`). Should one not, the reply's deadline still ends the wait.
pub(crate) const QUIET_BYTES: libc::c_int = 27;

/// The receive timeout (`SO_RCVTIMEO`) of a read that blocks: the read returns when it
/// ends, and blocks again while the deadline is far. The kernel keeps that timeout on its
/// tick-based timer wheel, which fires a timeout of 64 ticks or more up to an eighth of it
/// late (hundreds of milliseconds for seconds); 50 ms is under 64 ticks at every tick rate
/// from 100 to 1,000 per second, where it fires at most about two ticks late. One wake-up
/// per 50 ms, and only while a reply is late.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);

/// How much time before its deadline a read stops blocking under [`RECV_TIMEOUT`] (which
/// may end two ticks late, 20 ms at 100 ticks per second): the rest is waited for with
/// `poll`, whose timer is precise.
const RECV_TIMEOUT_MARGIN: Duration = Duration::from_millis(25);

/// Sets the socket's low-water mark (`SO_RCVLOWAT`): `poll` reports it readable once this
/// many bytes are unread (or at its end of stream, or on an error).
fn set_low_water(fd: RawFd, bytes: libc::c_int) {
    // SAFETY: setsockopt reads one c_int from a local that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        log::debug!("SO_RCVLOWAT refused: {}", io::Error::last_os_error());
    }
}

/// Sets the socket's receive timeout (`SO_RCVTIMEO`), which ends a blocking read with
/// `EAGAIN`; `false` when refused.
fn set_recv_timeout(fd: RawFd, timeout: Duration) -> bool {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt reads one timeval from a local that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// `recv(2)` on a plain socket with `flags`.
fn recv(socket: &Socket, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which outlives the call.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes to a socket without blocking and without `SIGPIPE` (rustls writes TLS records
/// through it too).
struct NoSignal<'a>(&'a Socket);

impl Write for NoSignal<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .send_with_flags(buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How to open connections to one server: its address, TLS and login.
pub(crate) struct Connector {
    pub addr: Addr,
    tls: Arc<TlsSetup>,
    login: Login,
    pub connect_timeout: Duration,
    /// Connections are to ask the server's `run_id` (see [`Connection::asks_identity`]).
    identify: bool,
}

impl Connector {
    pub fn new(addr: Addr, tls: Arc<TlsSetup>, login: Login, connect_timeout: Duration) -> Self {
        Connector {
            addr,
            tls,
            login,
            connect_timeout,
            identify: false,
        }
    }

    /// With `identify`, each connection is to ask the server's `run_id` (`INFO server`,
    /// with its first request: see [`Connection::asks_identity`]): what tells one server
    /// reached under two names.
    pub fn identifying(mut self, identify: bool) -> Self {
        self.identify = identify;
        self
    }

    /// Connects, sets up TLS, logs in and selects the database, all before `deadline` (cut
    /// to the connect timeout from now).
    ///
    /// Errors: [`ErrorKind::Timeout`] or [`ErrorKind::Connection`] when the server cannot
    /// be reached in time, [`ErrorKind::Server`] when it refuses the login (WRONGPASS),
    /// [`ErrorKind::InvalidArgument`] for an unusable TLS setup.
    pub fn connect(&self, deadline: Instant) -> Result<Connection> {
        let deadline = deadline.min(Instant::now() + self.connect_timeout);
        self.open(deadline)
            .map_err(|e| e.context(&format!("connecting to {}", self.addr)))
    }

    fn open(&self, deadline: Instant) -> Result<Connection> {
        let socket = match &self.addr {
            Addr::Tcp { host, port } => {
                let mut last = None;
                let mut socket = None;
                for addr in resolve(host, *port, deadline)? {
                    match connect_socket(&SockAddr::from(addr), deadline) {
                        Ok(s) => {
                            let _ = s.set_tcp_nodelay(true);
                            socket = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                match (socket, last) {
                    (Some(s), _) => s,
                    (None, Some(e)) => return Err(e),
                    (None, None) => {
                        return Err(Error::new(
                            ErrorKind::Connection,
                            format!("{host} resolves to no address"),
                        ));
                    }
                }
            }
            Addr::Unix(path) => {
                let addr = SockAddr::unix(path).map_err(|e| {
                    Error::invalid(format!("bad socket path {}: {e}", path.display()))
                })?;
                connect_socket(&addr, deadline)?
            }
        };
        let io = match (self.tls.mode(), &self.addr) {
            (Tls::None, _) | (_, Addr::Unix(_)) => {
                // Blocking, for the reads that wait under a receive timeout; every other
                // call says MSG_DONTWAIT.
                socket.set_nonblocking(false).map_err(io_error("socket"))?;
                Io::Plain(socket)
            }
            (_, Addr::Tcp { host, .. }) => {
                let tls =
                    rustls::ClientConnection::new(self.tls.config()?, tls::server_name(host)?)
                        .map_err(|e| Error::new(ErrorKind::Connection, format!("TLS: {e}")))?;
                let mut io = Io::Tls(Box::new(TlsIo { socket, tls }));
                io.handshake(deadline)?;
                io
            }
        };
        let mut conn = Connection {
            io,
            replies: ReplyBuffer::new(),
            broken: false,
            pending: 0,
            process: process::Process::current(),
            addr: self.addr.clone(),
            scripts: Vec::new(),
            quiet: None,
            recv_timeout: false,
            server_id: None,
            unidentified: self.identify,
        };
        self.log_in(&mut conn, deadline)?;
        Ok(conn)
    }

    /// `AUTH` and `SELECT` in one pipeline; nothing else is sent on connect.
    fn log_in(&self, conn: &mut Connection, deadline: Instant) -> Result<()> {
        let mut packed = Vec::new();
        let mut replies = 0;
        if let Some(password) = &self.login.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.login.username {
                auth.arg(user);
            }
            auth.arg(password).write_packed_command(&mut packed);
            replies += 1;
        } else if let Some(user) = &self.login.username {
            // An ACL user without a password (`nopass`).
            redis::cmd("AUTH")
                .arg(user)
                .arg("")
                .write_packed_command(&mut packed);
            replies += 1;
        }
        if self.login.db != 0 {
            redis::cmd("SELECT")
                .arg(self.login.db)
                .write_packed_command(&mut packed);
            replies += 1;
        }
        if replies == 0 {
            return Ok(());
        }
        conn.send(&packed, replies, deadline)?;
        for _ in 0..replies {
            if let Value::ServerError(e) = conn.recv(deadline, &Watch::none())? {
                return Err(Error::server(&e));
            }
        }
        Ok(())
    }
}

/// The `run_id` field of an `INFO server` reply: a random id the server draws when it
/// starts, the same under every name and address it is reached by.
fn run_id(info: &Value) -> Option<Arc<str>> {
    let text: &[u8] = match info {
        Value::BulkString(bytes) => bytes,
        Value::VerbatimString { text, .. } => text.as_bytes(),
        _ => return None,
    };
    let id = text
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"run_id:"))?
        .trim_ascii();
    (!id.is_empty()).then(|| String::from_utf8_lossy(id).into())
}

/// Resolves `host` within `deadline`. An IP address needs no lookup; a name is looked up on
/// a helper thread, because `getaddrinfo(3)` has no timeout of its own.
fn resolve(host: &str, port: u16, deadline: Instant) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let name = host.to_owned();
    crate::process::spawn_without_signals(|| {
        std::thread::Builder::new()
            .name("redlease-dns".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ = tx.send((name.as_str(), port).to_socket_addrs().map(Vec::from_iter));
            })
    })
    .map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot start a DNS thread: {e}"),
        )
    })?;
    match rx.recv_deadline(deadline) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err(
            Error::new(ErrorKind::Connection, format!("cannot resolve {host}: {e}")).with_source(e),
        ),
        // A name that cannot be resolved is one kind of failure, however long the resolver
        // took to say so (a resolver that hangs on an unknown name is common).
        Err(_) => Err(Error::new(
            ErrorKind::Connection,
            format!("cannot resolve {host}: no answer within the connect timeout"),
        )),
    }
}

/// A non-blocking connect, waited for until `deadline`.
fn connect_socket(addr: &SockAddr, deadline: Instant) -> Result<Socket> {
    let domain = addr.domain();
    let socket = Socket::new(domain, Type::STREAM, None).map_err(io_error("socket"))?;
    socket.set_nonblocking(true).map_err(io_error("socket"))?;
    match socket.connect(addr) {
        Ok(()) => return Ok(socket),
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock
                || e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => return Err(io_error("connect")(e)),
    }
    wait_ready(socket.as_raw_fd(), libc::POLLOUT, deadline, &Watch::none())
        .map_err(|e| io_error("connect")(e))?;
    match socket.take_error() {
        Ok(None) => Ok(socket),
        Ok(Some(e)) | Err(e) => Err(io_error("connect")(e)),
    }
}

/// Turns an I/O error into ours: timeouts and cancellations keep their kind.
fn io_error(doing: &'static str) -> impl Fn(io::Error) -> Error {
    move |e| {
        let kind = match e.kind() {
            io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ if is_cancelled(&e) => ErrorKind::Cancelled,
            _ => ErrorKind::Connection,
        };
        let message = match kind {
            ErrorKind::Timeout => format!("{doing}: no answer in time"),
            ErrorKind::Cancelled => "the wait was cancelled".to_owned(),
            _ => format!("{doing}: {e}"),
        };
        Error::new(kind, message).with_source(e)
    }
}

/// The marker of an I/O wait ended by cancellation.
#[derive(Debug)]
struct CancelledWait;

impl std::fmt::Display for CancelledWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cancelled")
    }
}

impl std::error::Error for CancelledWait {}

fn is_cancelled(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<CancelledWait>())
}

/// Waits until `fd` is ready for `events` or `deadline` passes, resuming after signals.
///
/// With an active `watch` it also wakes on the cancel eventfd and at least every
/// [`cancel::SLICE`], and fails with a cancellation when the watch says so.
fn wait_ready(fd: RawFd, events: i16, deadline: Instant, watch: &Watch) -> io::Result<()> {
    let wake_fd = if watch.is_active() {
        cancel::wake_fd()
    } else {
        None
    };
    loop {
        if watch.cancelled() {
            return Err(io::Error::other(CancelledWait));
        }
        // Past the deadline, one look without waiting: what has arrived still counts (a
        // reply read after another member's slow one, in a Redlock round).
        let now = Instant::now();
        let late = now >= deadline;
        let mut left = deadline.saturating_duration_since(now);
        if watch.is_active() {
            left = left.min(cancel::SLICE);
        }
        // Round up: a wait of 0 ms would spin until the deadline.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut fds = [
            libc::pollfd {
                fd,
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let nfds = if wake_fd.is_some() { 2 } else { 1 };
        // SAFETY: `fds` is a valid array of `nfds` pollfd structures that outlives the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), nfds, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                if watch.interrupted() {
                    return Err(io::Error::other(CancelledWait));
                }
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            // Ready, or an error or hang-up that the next read or write reports.
            return Ok(());
        }
        if late {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        if fds[1].revents != 0 && !watch.cancelled() {
            cancel::drain_wake_fd();
        }
        if rc == 0 && watch.interrupted() {
            return Err(io::Error::other(CancelledWait));
        }
    }
}

/// The byte stream under a connection.
enum Io {
    Plain(Socket),
    Tls(Box<TlsIo>),
}

struct TlsIo {
    socket: Socket,
    tls: rustls::ClientConnection,
}

impl Io {
    fn fd(&self) -> RawFd {
        match self {
            Io::Plain(s) => s.as_raw_fd(),
            Io::Tls(t) => t.socket.as_raw_fd(),
        }
    }

    /// Reads what is there without blocking (`WouldBlock` when nothing is).
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => recv(s, buf, libc::MSG_DONTWAIT),
            Io::Tls(t) => loop {
                match t.tls.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                match t.tls.read_tls(&mut &t.socket) {
                    Ok(0) => return Ok(0),
                    Ok(_) => {
                        t.tls.process_new_packets().map_err(io::Error::other)?;
                        if t.tls.wants_write() {
                            let _ = t.tls.write_tls(&mut NoSignal(&t.socket));
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
        }
    }

    /// Writes all of `data` before `deadline`.
    fn write_all(&mut self, data: &[u8], deadline: Instant) -> io::Result<()> {
        match self {
            Io::Plain(s) => {
                let mut written = 0;
                while written < data.len() {
                    match NoSignal(s).write(&data[written..]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => written += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            wait_ready(s.as_raw_fd(), libc::POLLOUT, deadline, &Watch::none())?
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Io::Tls(t) => {
                t.tls.writer().write_all(data)?;
                t.flush(deadline)
            }
        }
    }

    fn handshake(&mut self, deadline: Instant) -> Result<()> {
        let Io::Tls(t) = self else { return Ok(()) };
        while t.tls.is_handshaking() {
            if t.tls.wants_write() {
                t.flush(deadline).map_err(io_error("TLS handshake"))?;
            } else if t.tls.wants_read() {
                match t.tls.read_tls(&mut &t.socket) {
                    Ok(0) => {
                        return Err(Error::new(
                            ErrorKind::Connection,
                            "TLS handshake: the server closed the connection",
                        ));
                    }
                    Ok(_) => {
                        t.tls.process_new_packets().map_err(|e| {
                            Error::new(ErrorKind::Connection, format!("TLS handshake: {e}"))
                                .with_source(e)
                        })?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait_ready(t.socket.as_raw_fd(), libc::POLLIN, deadline, &Watch::none())
                            .map_err(io_error("TLS handshake"))?
                    }
                    Err(e) => return Err(io_error("TLS handshake")(e)),
                }
            } else {
                break;
            }
        }
        Ok(())
    }
}

impl TlsIo {
    fn flush(&mut self, deadline: Instant) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut NoSignal(&self.socket)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_ready(
                    self.socket.as_raw_fd(),
                    libc::POLLOUT,
                    deadline,
                    &Watch::none(),
                )?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// One connection: requests go out whole, replies come back in order.
pub(crate) struct Connection {
    io: Io,
    /// Bytes read and not yet taken as replies.
    replies: ReplyBuffer,
    /// An I/O error happened: the stream is in an unknown state and the connection must
    /// not be reused.
    broken: bool,
    /// Replies sent for and not read yet; a connection is reusable only at 0.
    pending: usize,
    process: process::Process,
    /// The server's address, for messages.
    addr: Addr,
    /// Scripts this connection's server was seen to have cached (by their SHA1).
    scripts: Vec<&'static str>,
    /// Until when a reader is not woken for fewer than [`QUIET_BYTES`] unread (see
    /// [`Connection::quiet_until`]).
    quiet: Option<Instant>,
    /// Whether the plain socket's receive timeout was set to [`RECV_TIMEOUT`].
    recv_timeout: bool,
    /// The server's `run_id`, when its connector identifies servers.
    server_id: Option<Arc<str>>,
    /// Its connector identifies servers, and the `run_id` was not asked yet.
    unidentified: bool,
}

/// Reads from the connection for the parser, waiting until `deadline` and resuming after
/// signals, so that the parser only ever sees data, end of stream, or a final error.
struct DeadlineReader<'a> {
    io: &'a mut Io,
    deadline: Instant,
    watch: &'a Watch,
    /// The connection's [`Connection::quiet_until`], ended by the first bytes read.
    quiet: &'a mut Option<Instant>,
    /// Whether the plain socket's receive timeout was set to [`RECV_TIMEOUT`].
    recv_timeout: &'a mut bool,
    /// Why the last read failed, when it was a timeout or a cancellation (the parser
    /// wraps the I/O error and loses its kind).
    ended: Option<ErrorKind>,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // A plain socket is polled first: the parser asks for bytes only when it has none
        // left, which right after a request means the reply is still on its way (a read
        // first would fail with EAGAIN and cost a system call). TLS may hold decrypted bytes
        // that poll cannot see, so it reads first.
        let mut ready = matches!(self.io, Io::Tls(_));
        if !self.watch.is_active() && self.quiet.is_none() {
            match self.blocking_read(buf) {
                Some(Ok(n)) => return Ok(n),
                Some(Err(e)) => return Err(e),
                // Not taken, or the receive timeout ended it: poll for what is left.
                None => {}
            }
        }
        loop {
            if process::orphaned() {
                // A callback forked in this read (a log record): the socket is the parent's.
                self.ended = Some(ErrorKind::Cancelled);
                return Err(io::Error::other(CancelledWait));
            }
            if ready {
                match self.io.read_now(buf) {
                    Ok(n) => {
                        self.end_quiet();
                        return Ok(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            let until = match *self.quiet {
                Some(quiet) if quiet < self.deadline => quiet,
                _ => self.deadline,
            };
            if let Err(e) = wait_ready(self.io.fd(), libc::POLLIN, until, self.watch) {
                if e.kind() == io::ErrorKind::TimedOut && self.quiet.is_some() {
                    // The pop's own reply is due, or this reply's deadline came: whatever
                    // arrived (under the low-water mark, perhaps) counts, and whatever
                    // arrives now wakes the reader.
                    self.end_quiet();
                    continue;
                }
                self.ended = Some(if is_cancelled(&e) {
                    ErrorKind::Cancelled
                } else if e.kind() == io::ErrorKind::TimedOut {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Connection
                });
                return Err(e);
            }
            ready = true;
        }
    }
}

impl DeadlineReader<'_> {
    /// Waits for bytes in the read itself, blocking under the socket's [`RECV_TIMEOUT`]
    /// (set once per connection) for as long as more than that and [`RECV_TIMEOUT_MARGIN`]
    /// are left before the deadline: a plain socket only. `None` when not taken, or when
    /// the time left is too short to block again (the caller polls for the rest), else the
    /// read's outcome; resumes after signals.
    fn blocking_read(&mut self, buf: &mut [u8]) -> Option<io::Result<usize>> {
        let Io::Plain(socket) = &*self.io else {
            return None;
        };
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left <= RECV_TIMEOUT + RECV_TIMEOUT_MARGIN {
                return None;
            }
            if !*self.recv_timeout {
                if !set_recv_timeout(socket.as_raw_fd(), RECV_TIMEOUT) {
                    return None;
                }
                *self.recv_timeout = true;
            }
            match recv(socket, buf, 0) {
                Ok(n) => return Some(Ok(n)),
                // A signal, or the receive timeout: block again while the deadline is far.
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn end_quiet(&mut self) {
        if self.quiet.take().is_some() {
            set_low_water(self.io.fd(), 1);
        }
    }
}

impl Connection {
    /// Lets a reader of the request just sent sleep until at least [`QUIET_BYTES`] are
    /// unread, until `until`, or until the deadline of the reply it waits for, whichever
    /// comes first; the first bytes it reads end this. For a request whose replies are all
    /// awaited together, and whose last comes from a pop that the server holds until
    /// `until` at most unless something is pushed (a waiter's attempt and its block): the
    /// attempt's reply (the lock was held) then wakes nobody on its own. A plain socket
    /// only (TLS records are longer than those replies anyway); the end of the stream, an
    /// error and a cancellation wake the reader as ever.
    pub fn quiet_until(&mut self, until: Instant) {
        if let Io::Plain(s) = &self.io {
            set_low_water(s.as_raw_fd(), QUIET_BYTES);
            self.quiet = Some(until);
        }
    }

    /// The `run_id` of the server this connection reached, when its connector identifies
    /// servers (see [`Connector::identifying`]) and the server told it.
    pub fn server_id(&self) -> Option<&Arc<str>> {
        self.server_id.as_ref()
    }

    /// Whether the caller is to ask the server's `run_id` (`INFO server`) with this
    /// request, ahead of it in the same write, and give the reply to
    /// [`identified`](Self::identified): true once, for a new connection of a connector
    /// that identifies servers. Asking with the first request rather than on connect
    /// costs no round trip.
    pub fn asks_identity(&mut self) -> bool {
        std::mem::take(&mut self.unidentified)
    }

    /// Records the server's reply to `INFO server` (see [`asks_identity`](Self::asks_identity));
    /// a refusal (an ACL, a renamed command) leaves the server unidentified.
    pub fn identified(&mut self, info: &Value) {
        self.server_id = run_id(info);
    }

    /// Whether this connection's server answered a script of this SHA1 without `NOSCRIPT`
    /// (and has not answered `NOSCRIPT` since).
    pub fn knows_script(&self, sha: &str) -> bool {
        self.scripts.contains(&sha)
    }

    /// Records whether the server had the script cached, from a reply to it.
    pub fn script_seen(&mut self, sha: &'static str, cached: bool) {
        let known = self.scripts.iter().position(|s| *s == sha);
        match (known, cached) {
            (None, true) => self.scripts.push(sha),
            (Some(i), false) => {
                self.scripts.swap_remove(i);
            }
            _ => {}
        }
    }

    /// Writes a packed request of `replies` commands before `deadline`. On failure the
    /// connection is broken and the error marked sent (some bytes may have gone out).
    pub fn send(&mut self, packed: &[u8], replies: usize, deadline: Instant) -> Result<()> {
        if process::orphaned() {
            return Err(process::orphaned_error());
        }
        if self.broken || self.pending != 0 {
            return Err(Error::new(
                ErrorKind::Connection,
                "the connection is out of step with its replies",
            ));
        }
        if self.quiet.take().is_some() {
            set_low_water(self.io.fd(), 1);
        }
        self.broken = true;
        self.io
            .write_all(packed, deadline)
            .map_err(|e| io_error("sending a request")(e).sent())?;
        self.broken = false;
        self.pending = replies;
        Ok(())
    }

    /// Reads the next reply, waiting until `deadline` (or until `watch` cancels). A server
    /// error reply is returned as `Value::ServerError`, not as an `Err`. Any failure breaks
    /// the connection and is marked sent (the request may have run).
    pub fn recv(&mut self, deadline: Instant, watch: &Watch) -> Result<Value> {
        self.broken = true;
        if process::orphaned() {
            return Err(process::orphaned_error());
        }
        loop {
            match self.replies.next_reply() {
                Ok(Some(value)) => {
                    self.broken = false;
                    self.pending = self.pending.saturating_sub(1);
                    return Ok(value);
                }
                Ok(None) => {}
                // Not RESP at all: another service on the port (an HTTP proxy, say).
                Err(NotResp) => {
                    let addr = &self.addr;
                    return Err(Error::new(
                        ErrorKind::Connection,
                        format!(
                            "the server at {addr} did not answer as a Redis server (is it one?)"
                        ),
                    )
                    .sent());
                }
            }
            let mut reader = DeadlineReader {
                io: &mut self.io,
                deadline,
                watch,
                quiet: &mut self.quiet,
                recv_timeout: &mut self.recv_timeout,
                ended: None,
            };
            match reader.read(self.replies.room()) {
                Ok(0) => {
                    return Err(Error::new(
                        ErrorKind::Connection,
                        "the connection was lost: the server closed it",
                    )
                    .sent());
                }
                Ok(n) => self.replies.filled(n),
                Err(e) => {
                    let kind = reader.ended.unwrap_or(ErrorKind::Connection);
                    let message = match kind {
                        ErrorKind::Timeout => "no reply in time".to_owned(),
                        ErrorKind::Cancelled => "the wait was cancelled".to_owned(),
                        _ => format!("the connection was lost: {e}"),
                    };
                    return Err(Error::new(kind, message).with_source(e).sent());
                }
            }
        }
    }

    /// Whether the connection is in step with its replies (not broken, none pending) and in
    /// the process that opened it. Looks at the socket not at all: see
    /// [`is_usable`](Self::is_usable).
    pub fn is_in_step(&self) -> bool {
        !self.broken && self.pending == 0 && self.process.same_generation()
    }

    /// How [`usable_together`] looks at this connection.
    fn look(&self) -> Look {
        if !self.is_in_step() || self.replies.has_unread() {
            return Look::Known(false);
        }
        match &self.io {
            Io::Plain(s) => Look::Poll(s.as_raw_fd()),
            Io::Tls(_) => Look::Alone,
        }
    }

    /// Whether the connection can carry another request: [in step](Self::is_in_step), and
    /// (checked without blocking) not closed by the server and holding no unread data.
    pub fn is_usable(&mut self) -> bool {
        if !self.is_in_step() || self.replies.has_unread() {
            return false;
        }
        let mut byte = [0u8; 1];
        match &mut self.io {
            Io::Plain(s) => {
                // SAFETY: peeks at most one byte into a local buffer of our own socket.
                let n = unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        byte.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
            }
            // TLS records may arrive unasked (session tickets): let rustls take them, then
            // look for application data or an end of stream.
            Io::Tls(_) => matches!(
                self.io.read_now(&mut byte),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock
            ),
        }
    }
}

/// [`Connection::is_usable`] of each of `conns`, with one system call for all the plain
/// ones (`poll` without waiting: a socket with anything to read, data or the server's
/// close, or an error, is not usable), so that a round to several servers looks at their
/// idle connections together. TLS connections are looked at one by one.
pub(crate) fn usable_together(conns: &mut [&mut Connection]) -> Vec<bool> {
    let looks: Vec<Look> = conns.iter().map(|c| c.look()).collect();
    let mut fds: Vec<libc::pollfd> = looks
        .iter()
        .filter_map(|look| match look {
            Look::Poll(fd) => Some(libc::pollfd {
                fd: *fd,
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            }),
            _ => None,
        })
        .collect();
    let polled = if fds.is_empty() {
        0
    } else {
        // SAFETY: `fds` is an array of `fds.len()` pollfd structures of our own; a zero
        // timeout never blocks.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }
    };
    let mut polled_fds = fds.iter();
    looks
        .into_iter()
        .zip(conns.iter_mut())
        .map(|(look, conn)| match look {
            Look::Known(usable) => usable,
            Look::Alone => conn.is_usable(),
            // Interrupted (or refused): each on its own, as a checkout would.
            Look::Poll(_) if polled < 0 => conn.is_usable(),
            Look::Poll(_) => polled_fds.next().is_some_and(|fd| fd.revents == 0),
        })
        .collect()
}

/// How a connection is looked at by [`usable_together`].
enum Look {
    /// Its socket, with the others'.
    Poll(RawFd),
    /// Not at all: this is known.
    Known(bool),
    /// On its own ([`Connection::is_usable`]): a TLS connection.
    Alone,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A forked child closes only its copy of the descriptor (done by Socket's drop);
        // it must not send a TLS close_notify on the parent's session, nor end it (nor may
        // a child made by `_Fork()`, which the generation does not tell: the pid does).
        if !self.process.is_current() {
            return;
        }
        let socket = match &mut self.io {
            Io::Tls(t) => {
                t.tls.send_close_notify();
                let _ = t.tls.write_tls(&mut NoSignal(&t.socket));
                &t.socket
            }
            Io::Plain(s) => s,
        };
        // The connection ends on the server now, even when a child forked since holds a
        // copy of the descriptor (close alone would then leave it open): a request
        // abandoned here (a cancelled block, and the attempt written behind it) must
        // never run later.
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
}

/// Sleeps for `duration`, resuming after signals; ends early with
/// [`ErrorKind::Cancelled`] when `watch` cancels.
pub(crate) fn pause(duration: Duration, watch: &Watch) -> Result<()> {
    match wait_ready(-1, 0, Instant::now() + duration, watch) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(()),
        Err(e) => Err(io_error("waiting")(e)),
    }
}

/// As [`pause`], but ends early too (with `Ok`) once `fd` is readable (an eventfd another
/// thread writes to wake this one).
pub(crate) fn pause_or_ready(duration: Duration, fd: RawFd, watch: &Watch) -> Result<()> {
    match wait_ready(fd, libc::POLLIN, Instant::now() + duration, watch) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(()),
        Err(e) => Err(io_error("waiting")(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A connection to a listener on loopback that accepts and never answers (the
    /// listener's side is returned, to keep it open).
    fn silent_peer() -> (Connection, std::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let tls = Arc::new(TlsSetup::new(Tls::None, None).unwrap());
        let addr = Addr::Tcp {
            host: "127.0.0.1".into(),
            port,
        };
        let connector = Connector::new(addr, tls, Login::default(), Duration::from_secs(5));
        let conn = connector
            .connect(Instant::now() + Duration::from_secs(5))
            .unwrap();
        let (peer, _) = listener.accept().unwrap();
        (conn, peer)
    }

    #[test]
    fn a_reply_awaited_with_nothing_to_cancel_ends_at_its_deadline_not_before() {
        let (mut conn, _peer) = silent_peer();
        // Long enough for the blocking read under a receive timeout, and short ones that
        // are only polled for.
        for wait in [
            Duration::from_millis(400),
            Duration::from_millis(120),
            Duration::from_millis(30),
            Duration::from_millis(400),
        ] {
            conn.broken = false;
            conn.pending = 0;
            let deadline = Instant::now() + wait;
            conn.send(b"*1\r\n$4\r\nPING\r\n", 1, deadline).unwrap();
            let err = conn.recv(deadline, &Watch::none()).unwrap_err();
            let now = Instant::now();
            assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
            assert!(now >= deadline, "ended {:?} early", deadline - now);
            // Not a timing test: only that the wait ends (the bound is the deadline).
            assert!(now < deadline + Duration::from_secs(5), "{wait:?}");
        }
    }

    /// The socket's receive timeout, as the kernel keeps it.
    fn recv_timeout_of(conn: &Connection) -> Duration {
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into a local timeval.
        let rc = unsafe {
            libc::getsockopt(
                conn.io.fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&mut tv as *mut libc::timeval).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000)
    }

    #[test]
    fn a_long_wait_never_hands_the_kernel_a_receive_timeout_it_would_fire_late() {
        // The kernel fires a receive timeout of 64 ticks or more up to an eighth of it
        // late (about 150 ms for a 3 s wait at 250 ticks per second): a wait of seconds
        // must block in short timeouts, whatever its deadline.
        let (mut conn, _peer) = silent_peer();
        let deadline = Instant::now() + Duration::from_millis(700);
        conn.send(b"*1\r\n$4\r\nPING\r\n", 1, deadline).unwrap();
        let err = conn.recv(deadline, &Watch::none()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        let timeout = recv_timeout_of(&conn);
        assert!(!timeout.is_zero(), "the wait did not block in the read");
        assert!(timeout <= Duration::from_millis(60), "{timeout:?}");
    }

    #[test]
    fn the_run_id_is_read_from_an_info_reply() {
        let info = b"# Server\r\nredis_version:7.0.15\r\nrun_id:0a1b2c\r\ntcp_port:6379\r\n";
        assert_eq!(
            run_id(&Value::BulkString(info.to_vec())).as_deref(),
            Some("0a1b2c")
        );
        let no_id = b"# Server\r\nredis_version:7.0.15\r\nrun_id:\r\n";
        assert_eq!(run_id(&Value::BulkString(no_id.to_vec())), None);
        // A refusal (NOPERM) is not a bulk string.
        assert_eq!(run_id(&Value::Int(0)), None);
    }

    #[test]
    fn a_write_to_a_closed_peer_fails_without_sigpipe() {
        let (ours, theirs) = Socket::pair(socket2::Domain::UNIX, Type::STREAM, None).unwrap();
        drop(theirs);
        let mut io = Io::Plain(ours);
        // SAFETY: the child only makes system calls (signal, send) and exits; it takes no
        // lock another thread may hold and allocates nothing.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: restores the default action (death), as in a C program that never
            // changed it; `_exit` ends the child without running the parent's destructors.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let failed = io
                    .write_all(b"PING\r\n", Instant::now() + Duration::from_secs(1))
                    .is_err();
                libc::_exit(if failed { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked; writes one int.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(rc, pid);
        assert!(
            !libc::WIFSIGNALED(status),
            "the write raised signal {}",
            libc::WTERMSIG(status)
        );
        assert_eq!(libc::WEXITSTATUS(status), 0, "the write did not fail");
    }
}
