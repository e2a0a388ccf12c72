//! A fault-injecting TCP proxy owned by a test, between the library under test and the
//! test's own `redis-server`.
//!
//! Promises:
//! - Bytes are never reordered within a direction, and nothing is lost or altered unless a
//!   fault asks for it.
//! - Whole-proxy modes (delays, blackhole, refusing, resetting) apply to every connection.
//! - Per-request rules: each connection's traffic is parsed as RESP in both directions, so
//!   each reply is paired with the request it answers (Redis answers in order on a
//!   connection) and a rule matched by a request acts on exactly that request or its reply.
//! - Every thread stops within ~50 ms of its connection closing or of the proxy being
//!   dropped; `Drop` joins them all.
//!
//! Threads per connection: a reader and a writer per direction. A reader reads, splits the
//! stream into whole RESP messages, decides what happens to each and queues it with the
//! instant it is due; the writer sends the queue in order, never before an item is due.
//! Partial messages are held until complete. If a stream cannot be parsed as RESP, that
//! direction of that connection falls back to forwarding raw bytes without rules.
//!
//! Limitations: replies are paired with requests one to one, so pub/sub and MONITOR
//! connections (several replies per request) get rule actions on the wrong replies. RESP3
//! push messages (`>`) are forwarded without consuming a request.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long any blocking call may wait before its loop looks at the stop flags again.
const POLL: Duration = Duration::from_millis(50);
/// A header or inline line longer than this is taken as a stream that is not RESP.
const MAX_LINE: usize = 64 * 1024;

/// What happens to a request matching a rule (see [`Proxy::on_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forward the request at once; forward its reply `d` late (later replies on the same
    /// connection wait behind it).
    DelayReply(Duration),
    /// Forward the request (the server executes it) and discard its reply; later replies
    /// on that connection still flow, so the client sees them shifted.
    DropReply,
    /// Forward the request; when its reply arrives, reset the client connection (RST)
    /// instead of delivering it: the command ran, the reply was lost, the connection died.
    ResetBeforeReply,
    /// Never forward the request; reset the client connection at once (requests before it
    /// on the connection are still forwarded first): the command never ran.
    ResetBeforeRequest,
    /// Hold the request for `d`, then forward it; later requests on the connection wait
    /// behind it.
    DelayRequest(Duration),
}

pub struct Proxy {
    shared: Arc<Shared>,
    port: u16,
    acceptor: Option<JoinHandle<()>>,
}

/// State shared by the proxy handle and all its threads.
struct Shared {
    /// The proxy's own port; it names the threads (`px<port>-...`).
    port: u16,
    upstream: SocketAddr,
    stop: AtomicBool,
    reply_delay_ns: AtomicU64,
    request_delay_ns: AtomicU64,
    blackhole: AtomicBool,
    refuse_new: AtomicBool,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    next_conn: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Rules and the request log, under one lock so that both see requests in one order.
    book: Mutex<Book>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct Book {
    rules: Vec<Rule>,
    requests: Vec<Vec<Vec<u8>>>,
}

struct Rule {
    needle: Vec<u8>,
    remaining: usize,
    matched: usize,
    action: Action,
}

/// One proxied connection: the client side (accepted) and the upstream side (to the server).
struct Conn {
    client: TcpStream,
    upstream: TcpStream,
    closed: AtomicBool,
    /// Client -> server queue.
    to_server: Lane,
    /// Server -> client queue.
    to_client: Lane,
    /// For each forwarded request not answered yet, in order: the action for its reply.
    awaiting: Mutex<VecDeque<Option<Action>>>,
}

/// A queue of items for one direction's writer, in the order they must go out.
#[derive(Default)]
struct Lane {
    queue: Mutex<VecDeque<Item>>,
    wake: Condvar,
}

struct Item {
    due: Instant,
    what: What,
}

enum What {
    /// Bytes to write.
    Data(Vec<u8>),
    /// Reset the client side with RST and close the connection.
    Reset,
    /// The sending side closed: close the connection (FIN) once everything before is out.
    End,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

impl Proxy {
    /// Listens on 127.0.0.1:<free port>, forwarding every accepted connection to
    /// 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy: bind");
        let port = listener.local_addr().expect("proxy: local addr").port();
        listener
            .set_nonblocking(true)
            .expect("proxy: nonblocking listener");
        let shared = Arc::new(Shared {
            port,
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            stop: AtomicBool::new(false),
            reply_delay_ns: AtomicU64::new(0),
            request_delay_ns: AtomicU64::new(0),
            blackhole: AtomicBool::new(false),
            refuse_new: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            next_conn: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            book: Mutex::new(Book::default()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("px{port}-accept"))
                .spawn(move || accept_loop(&shared, listener))
                .expect("proxy: spawn acceptor")
        };
        Proxy {
            shared,
            port,
            acceptor: Some(acceptor),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// "redis://127.0.0.1:<port>/0"
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Delays every server->client message by `d` after it was read (order kept; messages
    /// read 1 ms apart go out 1 ms apart).
    pub fn set_reply_delay(&self, d: Duration) {
        self.shared
            .reply_delay_ns
            .store(d.as_nanos() as u64, SeqCst);
    }

    /// Delays every client->server message by `d` after it was read.
    pub fn set_request_delay(&self, d: Duration) {
        self.shared
            .request_delay_ns
            .store(d.as_nanos() as u64, SeqCst);
    }

    /// true: forward nothing in either direction (bytes read are held, connections stay
    /// open, new connections are accepted). false: release what is held, in order, and resume.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, SeqCst);
        if !on {
            self.shared.wake_all();
        }
    }

    /// While true, new connections are accepted and closed at once.
    pub fn refuse_new(&self, on: bool) {
        self.shared.refuse_new.store(on, SeqCst);
    }

    /// Closes every current connection: RST to the client, close of the upstream side.
    pub fn reset_all(&self) {
        for conn in self.shared.take_conns() {
            conn.close(true);
        }
    }

    /// Proxied connections currently open.
    pub fn open_connections(&self) -> usize {
        let mut conns = lock(&self.shared.conns);
        conns.retain(|_, c| !c.closed.load(SeqCst));
        conns.len()
    }

    /// Connections accepted so far, including refused ones.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }

    /// Connections refused so far (by `refuse_new` or because upstream was unreachable).
    pub fn refused(&self) -> usize {
        self.shared.refused.load(SeqCst)
    }

    /// Adds a rule: the next `times` requests (over all connections) with an argument
    /// containing `needle` get `action`. Rules are checked in order of addition; a request
    /// matches at most one rule. Returns the rule's id.
    pub fn on_request(&self, needle: &[u8], times: usize, action: Action) -> usize {
        let mut book = lock(&self.shared.book);
        book.rules.push(Rule {
            needle: needle.to_vec(),
            remaining: times,
            matched: 0,
            action,
        });
        book.rules.len() - 1
    }

    /// How many requests matched rule `rule` so far.
    pub fn matched(&self, rule: usize) -> usize {
        lock(&self.shared.book).rules[rule].matched
    }

    /// Disarms every rule (their ids and `matched` counts stay valid).
    pub fn clear_rules(&self) {
        for rule in &mut lock(&self.shared.book).rules {
            rule.remaining = 0;
        }
    }

    /// Every request seen so far, as its argument list, across all connections, in
    /// arrival order (including requests a rule kept from the server).
    pub fn requests(&self) -> Vec<Vec<Vec<u8>>> {
        lock(&self.shared.book).requests.clone()
    }

    /// How many requests seen so far have an argument containing `needle`.
    pub fn count_requests(&self, needle: &[u8]) -> usize {
        lock(&self.shared.book)
            .requests
            .iter()
            .filter(|args| args.iter().any(|a| contains(a, needle)))
            .count()
    }

    /// Forgets the requests seen so far.
    pub fn clear_requests(&self) {
        lock(&self.shared.book).requests.clear();
    }
}

impl Drop for Proxy {
    /// Stops accepting, closes every connection and joins every thread (each notices the
    /// stop flag within `POLL`).
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // The acceptor first, so that no connection appears after the others were closed.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for conn in self.shared.take_conns() {
            conn.close(false);
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(SeqCst)
    }

    fn take_conns(&self) -> Vec<Arc<Conn>> {
        lock(&self.conns).drain().map(|(_, c)| c).collect()
    }

    /// Wakes every writer, so that a released blackhole flows at once.
    fn wake_all(&self) {
        for conn in lock(&self.conns).values() {
            conn.to_server.wake.notify_all();
            conn.to_client.wake.notify_all();
        }
    }

    /// Logs a request and returns the action of the first armed rule it matches.
    fn record(&self, args: Vec<Vec<u8>>) -> Option<Action> {
        let mut book = lock(&self.book);
        let action = book
            .rules
            .iter_mut()
            .find(|r| r.remaining > 0 && args.iter().any(|a| contains(a, &r.needle)))
            .map(|r| {
                r.remaining -= 1;
                r.matched += 1;
                r.action
            });
        book.requests.push(args);
        action
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) {
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("proxy: spawn");
        let mut threads = lock(&self.threads);
        threads.retain(|t| !t.is_finished());
        threads.push(handle);
    }
}

/// The body of one of a connection's threads.
type Worker = fn(&Shared, &Conn);

/// Accepts until the proxy stops; each connection gets an upstream connection and four
/// threads, or is closed at once if refused or if the upstream cannot be reached.
fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    while !shared.stopping() {
        let client = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        shared.accepted.fetch_add(1, SeqCst);
        if shared.refuse_new.load(SeqCst) {
            shared.refused.fetch_add(1, SeqCst);
            drop(client);
            continue;
        }
        let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(1))
        else {
            shared.refused.fetch_add(1, SeqCst);
            continue;
        };
        let configured = [&client, &upstream].iter().all(|s| {
            s.set_nonblocking(false).is_ok()
                && s.set_nodelay(true).is_ok()
                && s.set_read_timeout(Some(POLL)).is_ok()
                && s.set_write_timeout(Some(POLL)).is_ok()
        });
        if !configured {
            shared.refused.fetch_add(1, SeqCst);
            continue;
        }
        let conn = Arc::new(Conn {
            client,
            upstream,
            closed: AtomicBool::new(false),
            to_server: Lane::default(),
            to_client: Lane::default(),
            awaiting: Mutex::new(VecDeque::new()),
        });
        let id = shared.next_conn.fetch_add(1, SeqCst);
        lock(&shared.conns).insert(id, conn.clone());
        let workers: [(&str, Worker); 4] = [
            ("req-read", read_requests),
            ("req-write", |s, c| {
                write_lane(s, c, &c.to_server, &c.upstream)
            }),
            ("rep-read", read_replies),
            ("rep-write", |s, c| {
                write_lane(s, c, &c.to_client, &c.client)
            }),
        ];
        for (name, work) in workers {
            let (s, c) = (shared.clone(), conn.clone());
            let thread = format!("px{}-{id}-{name}", shared.port);
            shared.spawn(thread, move || work(&s, &c));
        }
    }
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// Closes both sides once: the client side with RST if `rst`, else with FIN; the
    /// upstream side with FIN. Wakes the writers so that they exit.
    fn close(&self, rst: bool) {
        if self.closed.swap(true, SeqCst) {
            return;
        }
        if rst {
            abort(&self.client);
        } else {
            let _ = self.client.shutdown(Shutdown::Both);
        }
        let _ = self.upstream.shutdown(Shutdown::Both);
        self.to_server.wake.notify_all();
        self.to_client.wake.notify_all();
    }
}

/// Sends a TCP RST on `stream` now, although other threads still hold its descriptor:
/// SO_LINGER 0 (so the final close also resets), then connect(AF_UNSPEC), which on Linux
/// disconnects a connected TCP socket with a reset.
fn abort(stream: &TcpStream) {
    let fd = stream.as_raw_fd();
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt and connect on a descriptor we own, with valid, correctly sized
    // arguments.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        );
        let mut unspec: libc::sockaddr = std::mem::zeroed();
        unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(fd, &unspec, size_of::<libc::sockaddr>() as libc::socklen_t)
    };
    if rc != 0 {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

impl Lane {
    fn push(&self, due: Instant, what: What) {
        lock(&self.queue).push_back(Item { due, what });
        self.wake.notify_all();
    }

    /// Queues `bytes` (if any) and empties it.
    fn push_data(&self, due: Instant, bytes: &mut Vec<u8>) {
        if !bytes.is_empty() {
            self.push(due, What::Data(std::mem::take(bytes)));
        }
    }
}

/// Result of one read: bytes, or the end of the stream (EOF, error, closed or stopping).
enum Got {
    Bytes(usize),
    End,
}

/// Reads from `from`, retrying on timeouts until data comes or the connection/proxy stops.
fn read_some(shared: &Shared, conn: &Conn, mut from: &TcpStream, buf: &mut [u8]) -> Got {
    loop {
        if conn.is_closed() || shared.stopping() {
            return Got::End;
        }
        match from.read(buf) {
            Ok(0) => return Got::End,
            Ok(n) => return Got::Bytes(n),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return Got::End,
        }
    }
}

/// Client -> server: splits the stream into requests, logs them, applies rules, and
/// queues them for the upstream writer. Tells the reply side what to do with each reply.
fn read_requests(shared: &Shared, conn: &Conn) {
    let lane = &conn.to_server;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut raw = false;
    loop {
        let n = match read_some(shared, conn, &conn.client, &mut chunk) {
            Got::Bytes(n) => n,
            Got::End => return lane.push(Instant::now(), What::End),
        };
        let now = Instant::now();
        let due = now + Duration::from_nanos(shared.request_delay_ns.load(SeqCst));
        buf.extend_from_slice(&chunk[..n]);
        // Consecutive requests without a delay of their own go out together.
        let mut out = Vec::new();
        loop {
            if raw {
                out.append(&mut buf);
                break;
            }
            let (len, args) = match parse_request(&buf) {
                Ok(Some(found)) => found,
                Ok(None) => break,
                Err(()) => {
                    raw = true;
                    continue;
                }
            };
            let msg: Vec<u8> = buf.drain(..len).collect();
            if args.is_empty() {
                // An empty inline line or `*0`: Redis ignores it and sends no reply.
                out.extend_from_slice(&msg);
                continue;
            }
            // The reply side must know about a request before the server can answer it.
            match shared.record(args) {
                Some(Action::ResetBeforeRequest) => {
                    lane.push_data(due, &mut out);
                    return lane.push(now, What::Reset);
                }
                Some(Action::DelayRequest(d)) => {
                    lock(&conn.awaiting).push_back(None);
                    lane.push_data(due, &mut out);
                    lane.push(due + d, What::Data(msg));
                }
                action => {
                    lock(&conn.awaiting).push_back(action);
                    out.extend_from_slice(&msg);
                }
            }
        }
        lane.push_data(due, &mut out);
    }
}

/// Server -> client: splits the stream into replies, pairs each with its request's action
/// and queues them for the client writer.
fn read_replies(shared: &Shared, conn: &Conn) {
    let lane = &conn.to_client;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut raw = false;
    loop {
        let n = match read_some(shared, conn, &conn.upstream, &mut chunk) {
            Got::Bytes(n) => n,
            Got::End => return lane.push(Instant::now(), What::End),
        };
        let now = Instant::now();
        let due = now + Duration::from_nanos(shared.reply_delay_ns.load(SeqCst));
        buf.extend_from_slice(&chunk[..n]);
        // Consecutive replies without an action go out together.
        let mut out = Vec::new();
        loop {
            if raw {
                out.append(&mut buf);
                break;
            }
            let (len, push) = match parse_reply(&buf) {
                Ok(Some(found)) => found,
                Ok(None) => break,
                Err(()) => {
                    raw = true;
                    continue;
                }
            };
            let msg: Vec<u8> = buf.drain(..len).collect();
            // Push messages answer no request; a reply with no known request is forwarded.
            let action = if push {
                None
            } else {
                lock(&conn.awaiting).pop_front().flatten()
            };
            match action {
                Some(Action::DropReply) => {}
                Some(Action::ResetBeforeReply) => {
                    lane.push_data(due, &mut out);
                    return lane.push(now, What::Reset);
                }
                Some(Action::DelayReply(d)) => {
                    lane.push_data(due, &mut out);
                    lane.push(due + d, What::Data(msg));
                }
                _ => out.extend_from_slice(&msg),
            }
        }
        lane.push_data(due, &mut out);
    }
}

/// Sends the items of `lane` to `to`, in order, each when due and when the proxy is not
/// blackholed; performs resets and closes. Exits when the connection closes or the proxy stops.
fn write_lane(shared: &Shared, conn: &Conn, lane: &Lane, to: &TcpStream) {
    loop {
        let item = {
            let mut queue = lock(&lane.queue);
            loop {
                if conn.is_closed() || shared.stopping() {
                    return;
                }
                let now = Instant::now();
                let wait = match queue.front() {
                    Some(_) if shared.blackhole.load(SeqCst) => POLL,
                    Some(item) if item.due <= now => break queue.pop_front().expect("front"),
                    Some(item) => (item.due - now).min(POLL),
                    None => POLL,
                };
                queue = lane
                    .wake
                    .wait_timeout(queue, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        match item.what {
            What::Data(bytes) => {
                if !write_all(shared, conn, to, &bytes) {
                    return conn.close(false);
                }
            }
            What::Reset => return conn.close(true),
            What::End => return conn.close(false),
        }
    }
}

/// Writes all of `bytes`, retrying on timeouts; false on error, close or stop.
fn write_all(shared: &Shared, conn: &Conn, mut to: &TcpStream, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        if conn.is_closed() || shared.stopping() {
            return false;
        }
        match to.write(&bytes[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return false,
        }
    }
    true
}

// ---- RESP parsing -------------------------------------------------------------------
//
// Each parser looks at the start of a buffer and answers Ok(Some(length, ..)) for one
// complete message, Ok(None) if more bytes are needed, Err(()) if this is not RESP.

type Parsed<T> = Result<Option<T>, ()>;

/// The line starting at `pos` (without its CRLF) and the position after it.
fn line(buf: &[u8], pos: usize) -> Parsed<(&[u8], usize)> {
    let rest = &buf[pos.min(buf.len())..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&rest[..i], pos + i + 2))),
        None if rest.len() > MAX_LINE => Err(()),
        None => Ok(None),
    }
}

fn number(digits: &[u8]) -> Result<i64, ()> {
    std::str::from_utf8(digits)
        .map_err(drop)?
        .parse()
        .map_err(drop)
}

/// One client request: an array of bulk strings, or an inline command (split on
/// whitespace). Returns its length and arguments (empty for requests Redis ignores).
fn parse_request(buf: &[u8]) -> Parsed<(usize, Vec<Vec<u8>>)> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX_LINE {
                Err(())
            } else {
                Ok(None)
            };
        };
        let args = buf[..end]
            .split(|b| b.is_ascii_whitespace())
            .filter(|a| !a.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        return Ok(Some((end + 1, args)));
    }
    let Some((header, mut pos)) = line(buf, 1)? else {
        return Ok(None);
    };
    let count = number(header)?;
    let mut args = Vec::with_capacity(count.clamp(0, 1024) as usize);
    for _ in 0..count.max(0) {
        if pos >= buf.len() {
            return Ok(None);
        }
        if buf[pos] != b'$' {
            return Err(());
        }
        let Some((header, start)) = line(buf, pos + 1)? else {
            return Ok(None);
        };
        let len = usize::try_from(number(header)?).map_err(drop)?;
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(());
        }
        args.push(buf[start..end].to_vec());
        pos = end + 2;
    }
    Ok(Some((pos, args)))
}

/// One reply of any RESP2 (and RESP3) type. Returns its length and whether it is a RESP3
/// push message (which answers no request).
fn parse_reply(buf: &[u8]) -> Parsed<(usize, bool)> {
    Ok(skip_value(buf, 0)?.map(|end| (end, buf[0] == b'>')))
}

/// The position after the value starting at `pos`.
fn skip_value(buf: &[u8], pos: usize) -> Parsed<usize> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    let Some((header, mut next)) = line(buf, pos + 1)? else {
        return Ok(None);
    };
    match kind {
        // Simple string, error, integer; RESP3 null, boolean, double, big number.
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Ok(Some(next)),
        // Bulk string (incl. $-1); RESP3 bulk error, verbatim string.
        b'$' | b'!' | b'=' => {
            let len = number(header)?;
            if len < 0 {
                return Ok(Some(next));
            }
            let end = next + len as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(());
            }
            Ok(Some(end + 2))
        }
        // Array (incl. *-1, nested); RESP3 set, push, map and attribute (pairs).
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let mut count = number(header)?.max(0);
            if kind == b'%' || kind == b'|' {
                count *= 2;
            }
            for _ in 0..count {
                match skip_value(buf, next)? {
                    Some(end) => next = end,
                    None => return Ok(None),
                }
            }
            if kind == b'|' {
                // An attribute is followed by the value it annotates: one message.
                return skip_value(buf, next);
            }
            Ok(Some(next))
        }
        _ => Err(()),
    }
}
