//! The client: where the locks live (a deployment named by a URL), and its options.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::node::NodeFactory;
use crate::backend::{self, Backend, Call};
use crate::connection;
use crate::error::{Error, Result};
use crate::keys::{LockKeys, MAX_KEY_LEN, RESERVED_PREFIX};
use crate::lock::LockBuilder;
use crate::tls::TlsSetup;
use crate::url::{self, Topology};

/// How a [`Client`] connects. Build it with [`ClientOptions::default`] and the setters.
#[derive(Clone)]
pub struct ClientOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) pool_size: usize,
    pub(crate) pool_wait: Duration,
    pub(crate) key_prefix: String,
    pub(crate) owner_label: Option<String>,
    pub(crate) tls_ca_cert: Option<Vec<u8>>,
}

impl Default for ClientOptions {
    /// Connect timeout 2 s, I/O timeout 2 s, 32 pooled connections, wait up to 2 s for a free
    /// one, no key prefix, owner label `host/pid`, system TLS roots.
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(2),
            pool_size: 32,
            pool_wait: Duration::from_secs(2),
            key_prefix: String::new(),
            owner_label: None,
            tls_ca_cert: None,
        }
    }
}

impl ClientOptions {
    /// Longest time to make a connection: name lookup, TCP, TLS, `AUTH` and `SELECT`
    /// together. At least 1 ms, at most a day.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest wait for any one reply from Redis. A blocked wait (`BLPOP`) gets its blocking
    /// time on top of this one. At least 1 ms, at most a day. Also sets the *grace* of a
    /// waiter's registration and of a lock granted to it: this timeout plus 0.5 s.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// Connections the calling threads may use at once for requests, and, separately, how
    /// many waiters may block on the server at once (further waiters sleep between
    /// attempts). Releases, extends and renewals never wait for one. 1 to 10 000.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Longest wait for a pooled connection when all are in use (zero: do not wait).
    pub fn pool_wait(mut self, wait: Duration) -> Self {
        self.pool_wait = wait;
        self
    }

    /// A prefix put before every lock name to form its key (e.g. `"myapp:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// A label appended to every token after `:`, so `redis-cli GET key` shows who holds a
    /// lock. Default: `host/pid`. At most 64 bytes, printable ASCII without spaces.
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.owner_label = Some(label.into());
        self
    }

    /// A PEM CA certificate to trust for `rediss://` instead of the system roots.
    pub fn tls_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_cert = Some(pem.into());
        self
    }

    fn validate(&self) -> Result<()> {
        for (what, d) in [
            ("connect timeout", self.connect_timeout),
            ("I/O timeout", self.io_timeout),
        ] {
            if d < Duration::from_millis(1) {
                return Err(Error::invalid(format!(
                    "the {what} must be at least 1 ms, got {d:?}"
                )));
            }
            if d > MAX_TIMEOUT {
                return Err(Error::invalid(format!(
                    "the {what} of {d:?} is over the maximum of {MAX_TIMEOUT:?}"
                )));
            }
        }
        if self.pool_wait > MAX_TIMEOUT {
            return Err(Error::invalid("the pool wait is over the maximum of 1 day"));
        }
        if self.pool_size == 0 || self.pool_size > 10_000 {
            return Err(Error::invalid("the pool size must be between 1 and 10000"));
        }
        if self.key_prefix.len() >= MAX_KEY_LEN {
            return Err(Error::invalid("the key prefix is too long"));
        }
        if self.key_prefix.starts_with(RESERVED_PREFIX) {
            return Err(Error::invalid(format!(
                "the key prefix may not begin with {RESERVED_PREFIX:?} (reserved for companion keys)"
            )));
        }
        if let Some(label) = &self.owner_label {
            if label.len() > 64 || !label.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::invalid(
                    "the owner label must be at most 64 bytes of printable ASCII without spaces",
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("pool_size", &self.pool_size)
            .field("pool_wait", &self.pool_wait)
            .field("key_prefix", &self.key_prefix)
            .field("owner_label", &self.owner_label)
            .field("tls_ca_cert", &self.tls_ca_cert.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

/// Longest accepted timeout.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A handle to one Redis deployment that hands out locks.
///
/// Cheap to clone (an `Arc`); `Send + Sync`, so one client serves every thread. Calling
/// threads share a pool of connections; releases, extends and renewals never wait for a
/// pooled connection, so callers can never starve the end or the renewal of a lease.
/// Connections close when the last clone (and the last lock taken from it) is dropped.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub backend: Arc<Backend>,
    pub options: ClientOptions,
    pub owner_label: String,
    /// The reentrant locks this client holds, by token: more holds of one share its lease.
    pub reentrant: Arc<crate::lock::Reentered>,
}

impl Client {
    /// Opens a client with default options. No connection is made yet.
    ///
    /// URLs: `redis://[user[:password]@]host[:port][/db]`, `rediss://...` (TLS; add
    /// `#insecure` to skip certificate checks), `redis+unix:///path/to/socket[?db=N&user=U&pass=P]`.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] for a malformed URL.
    pub fn open(url: &str) -> Result<Client> {
        Client::with_options(url, ClientOptions::default())
    }

    /// Opens a client with `options`. No connection is made yet.
    pub fn with_options(url: &str, options: ClientOptions) -> Result<Client> {
        options.validate()?;
        let target = url::parse(url)?;
        let backend = backend_for(&target, &options)?;
        Ok(Client::from_backend(backend, options))
    }

    /// Opens a client whose locks are Redlock locks: each is taken on a majority of the
    /// independent primaries `urls` (1 to 15; each a single-server or Sentinel URL, no two
    /// naming the same server). No connection is made yet. See the crate's README for what
    /// Redlock promises and what it cannot; its locks have no fencing token
    /// ([`crate::LockGuard::fencing_token`] is 0).
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] for no URL, more than 15, a malformed or
    /// Cluster URL, or a duplicate.
    pub fn redlock(urls: &[&str], options: ClientOptions) -> Result<Client> {
        options.validate()?;
        if urls.is_empty() || urls.len() > 15 {
            return Err(Error::invalid(format!(
                "Redlock takes 1 to 15 primaries, got {}",
                urls.len()
            )));
        }
        let mut members = Vec::with_capacity(urls.len());
        let mut seen = std::collections::HashSet::new();
        for url in urls {
            let target = url::parse(url)?;
            if matches!(target.topology, Topology::Cluster(_)) {
                return Err(Error::invalid(format!(
                    "{}: a Redlock member is a single server or a Sentinel deployment, not a Cluster",
                    target.describe
                )));
            }
            if !seen.insert(format!("{:?}/{}", target.topology, target.login.db)) {
                return Err(Error::invalid(format!(
                    "{} names the same server as another Redlock member",
                    target.describe
                )));
            }
            members.push(backend_for(&target, &options)?);
        }
        let backend = Backend::redlock(
            members,
            options.io_timeout,
            options.pool_wait,
            options.connect_timeout,
        );
        Ok(Client::from_backend(backend, options))
    }

    fn from_backend(backend: Backend, options: ClientOptions) -> Client {
        let owner_label = options
            .owner_label
            .clone()
            .unwrap_or_else(default_owner_label);
        Client {
            inner: Arc::new(ClientInner {
                backend: Arc::new(backend),
                options,
                owner_label,
                reentrant: Arc::default(),
            }),
        }
    }

    /// Starts describing a lock on `name` (the key is the client's prefix plus `name`).
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// use std::time::Duration;
    /// let client = redlease::Client::open("redis://127.0.0.1:6379/0")?;
    /// let guard = client
    ///     .lock("order:1001")
    ///     .ttl(Duration::from_secs(30))
    ///     .acquire_timeout(Duration::from_secs(5))?;
    /// // ... the critical section, passing guard.fencing_token() to the storage ...
    /// guard.release()?;
    /// # Ok(()) }
    /// ```
    pub fn lock<'a>(&'a self, name: &'a str) -> LockBuilder<'a> {
        LockBuilder::new(self, name)
    }

    /// Starts describing a permit of the counting semaphore `name`, which lets at most
    /// `permits` holders in at once: the same verbs (`try_acquire`, `acquire_timeout`,
    /// `acquire`) and options as [`lock`](Self::lock) give a guard that holds one permit,
    /// with its own lease (renewed), lost signal and fencing token. A crashed holder's
    /// permit frees itself after its ttl (by the server's clock). The limit is the one
    /// the caller passes: every caller of one name should pass the same (a caller with a
    /// larger count may take permits beyond a smaller one's limit). A release wakes one
    /// blocked waiter, which then tries again (a newcomer may take the permit first: no
    /// order among semaphore waiters). Not available on Redlock clients.
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1:6379/0")?;
    /// let permit = client.semaphore("api:partner", 5).acquire()?; // at most 5 at once
    /// // ... call the API ...
    /// permit.release()?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore<'a>(&'a self, name: &'a str, permits: u32) -> LockBuilder<'a> {
        LockBuilder::new(self, name).of_kind(crate::kinds::Kind::Permit(permits))
    }

    /// The read-write lock `name`: many readers or one writer. [`RwLock::read`] and
    /// [`RwLock::write`] start describing a hold, acquired with the same verbs as a lock.
    pub fn rwlock<'a>(&'a self, name: &'a str) -> RwLock<'a> {
        RwLock { client: self, name }
    }

    /// Whether anyone holds the lock `name` right now (one `EXISTS`). Blocking: bounded by
    /// the pool wait, the connect timeout and the I/O timeout. To know whether *you* hold
    /// a lock, use [`crate::LockGuard::is_held`].
    ///
    /// On a Redlock client: whether a majority of the primaries hold the key.
    pub fn is_locked(&self, name: &str) -> Result<bool> {
        let keys = LockKeys::new(&self.inner.options.key_prefix, name)?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        if let Some(members) = self.inner.backend.redlock_members() {
            let answers = self.on_members(members, &keys.lock, &cmd)?;
            let held = answers
                .iter()
                .filter(|v| **v == redis::Value::Int(1))
                .count();
            return Ok(held >= members.quorum());
        }
        self.query(&keys.lock, &cmd)
    }

    /// Sends `PING`: a cheap way to check the URL, credentials and reachability up front.
    /// On a Redlock client, a majority of the primaries must answer.
    pub fn ping(&self) -> Result<()> {
        if let Some(members) = self.inner.backend.redlock_members() {
            return self.on_members(members, "", &redis::cmd("PING")).map(drop);
        }
        self.query::<String>("", &redis::cmd("PING")).map(drop)
    }

    /// One command on every Redlock member (one round); the answers of those that answered,
    /// or an error when fewer than a majority did.
    fn on_members(
        &self,
        members: &crate::backend::redlock::Redlock,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<Vec<redis::Value>> {
        let backend = &self.inner.backend;
        let deadline = std::time::Instant::now() + backend.io_timeout;
        let round = members.round(
            key,
            &[Call::cmd(cmd)],
            crate::backend::Lane::Urgent,
            deadline,
        );
        let mut answers = Vec::new();
        let mut failures = Vec::new();
        for (i, outcome) in round.outcomes.into_iter().enumerate() {
            match outcome.map(|v| v.into_iter().next()) {
                Ok(Some(redis::Value::ServerError(e))) => failures.push(format!(
                    "{}: {}",
                    members.name(i),
                    connection::server_error(&e)
                )),
                Ok(Some(value)) => answers.push(value),
                Ok(None) => failures.push(format!("{}: no reply", members.name(i))),
                Err(e) => failures.push(format!("{}: {e}", members.name(i))),
            }
        }
        if answers.len() >= members.quorum() {
            Ok(answers)
        } else {
            Err(Error::new(
                crate::ErrorKind::Connection,
                format!(
                    "{} of {} primaries answered, {} needed: {}",
                    answers.len(),
                    members.members.len(),
                    members.quorum(),
                    failures.join("; ")
                ),
            ))
        }
    }

    /// One command on the caller lane, on the server that owns `key`.
    fn query<T: redis::FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> Result<T> {
        let backend = &self.inner.backend;
        let how = backend.exec_on(backend.caller_lane(None));
        let replies = backend.run(key, &[Call::cmd(cmd)], &how)?;
        let value = replies
            .values
            .into_iter()
            .next()
            .unwrap_or(redis::Value::Nil);
        backend::reply(value)
    }

    /// The URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        self.inner.backend.describe()
    }

    /// Closes the idle connections now (in-use ones close when their requests end, and
    /// all of them when the last clone and lock are dropped).
    pub(crate) fn close_idle(&self) {
        self.inner.backend.close_idle();
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url())
            .field("options", &self.inner.options)
            .finish()
    }
}

/// The backend for one parsed URL, with the client's options.
fn backend_for(target: &url::Target, options: &ClientOptions) -> Result<Backend> {
    let tls = Arc::new(TlsSetup::new(target.tls, options.tls_ca_cert.clone())?);
    let factory = NodeFactory {
        tls,
        login: target.login.clone(),
        connect_timeout: options.connect_timeout,
        pool_size: options.pool_size,
    };
    Ok(Backend::open(
        target,
        factory,
        options.io_timeout,
        options.pool_wait,
    ))
}

/// A read-write lock: many readers at once, or one writer. A waiting writer keeps new
/// readers out, so a steady stream of readers cannot starve it; when the lock frees, a
/// waiting writer goes first, then every waiting reader is woken. Each reader's lease and
/// the writer's are token-checked, renewed, and expire on their own (by the server's
/// clock). Not available on Redlock clients.
///
/// ```no_run
/// # fn main() -> redlease::Result<()> {
/// # let client = redlease::Client::open("redis://127.0.0.1:6379/0")?;
/// let reading = client.rwlock("catalog").read().acquire()?;
/// reading.release()?;
/// let writing = client.rwlock("catalog").write().acquire()?;
/// writing.release()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RwLock<'a> {
    client: &'a Client,
    name: &'a str,
}

impl<'a> RwLock<'a> {
    /// Starts describing a read hold (shared with other readers).
    pub fn read(self) -> LockBuilder<'a> {
        LockBuilder::new(self.client, self.name).of_kind(crate::kinds::Kind::Read)
    }

    /// Starts describing the write hold (exclusive).
    pub fn write(self) -> LockBuilder<'a> {
        LockBuilder::new(self.client, self.name).of_kind(crate::kinds::Kind::Write)
    }
}

/// `host/pid`, for the owner label of tokens.
fn default_owner_label() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL or the buffer end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let host: String = if rc == 0 {
        buf.iter()
            .take_while(|&&b| b != 0)
            .filter(|b| b.is_ascii_graphic() && **b != b'/')
            .take(48)
            .map(|&b| char::from(b))
            .collect()
    } else {
        String::new()
    };
    let host = if host.is_empty() {
        "unknown".to_owned()
    } else {
        host
    };
    format!("{host}/{}", std::process::id())
}
