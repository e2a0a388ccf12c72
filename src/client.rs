//! The client: where the locks live (a deployment named by a URL), and its options.

use std::fmt;
use std::sync::Arc;

use crate::backend::Backend;
use crate::backend::node::NodeFactory;
use crate::core::acquire::Bounds;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::{LockBuilder, LockGuard};
use crate::multi::MultiLockBuilder;
use crate::options::ClientOptions;
use crate::protocol::LockServer;
use crate::protocol::quorum::Quorum;
use crate::protocol::routed::Routed;
use crate::shared::Shared;
use crate::tls::TlsSetup;
use crate::url::{self, Topology};

/// A handle to one Redis deployment that hands out locks.
///
/// Cheap to clone (an `Arc`); `Send + Sync`, so one client serves every thread. Calling
/// threads share a pool of connections; releases, extends and renewals never wait for a
/// pooled connection, so callers can never starve the end or the renewal of a lease.
/// Connections close when the last clone (and the last lock taken from it) is dropped.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Shared>,
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
        let backend = backend_for(&target, &options, false)?;
        Ok(Client::from_server(Arc::new(Routed::new(backend)), options))
    }

    /// Opens a client whose locks are Redlock locks: each is taken on a majority of the
    /// independent primaries `urls` (1 to 15; each a single-server or Sentinel URL, no two
    /// naming the same server, whatever their databases). No connection is made yet. See
    /// the crate's README for what Redlock promises and what it cannot; its locks have no
    /// fencing token ([`crate::LockGuard::fencing_token`] is 0).
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] for no URL, more than 15, a malformed or
    /// Cluster URL, or a duplicate. Two URLs that name one server differently (`localhost`
    /// and `127.0.0.1`, a second address of the host) are told apart once connected, by the
    /// `run_id` each connection asks with its first request: the member found second is
    /// sent nothing more, and an acquire fails with [`crate::ErrorKind::InvalidArgument`]
    /// naming both (after giving back what the other members granted).
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
            // The server, whatever the database: keys of two databases of one server
            // would be two votes of one server. Two names of one server are told apart by
            // its run_id once connected (see backend::members).
            if !seen.insert(format!("{:?}", target.topology)) {
                return Err(Error::invalid(format!(
                    "{} names the same server as another Redlock member",
                    target.describe
                )));
            }
            members.push(backend_for(&target, &options, true)?);
        }
        let bounds = Bounds {
            pool_wait: options.pool_wait,
            connect: options.connect_timeout,
            io: options.io_timeout,
        };
        Ok(Client::from_server(
            Arc::new(Quorum::new(members, bounds)),
            options,
        ))
    }

    fn from_server(server: Arc<dyn LockServer>, options: ClientOptions) -> Client {
        let owner_label = options
            .owner_label
            .clone()
            .unwrap_or_else(default_owner_label);
        Client {
            inner: Arc::new(Shared {
                server,
                options,
                owner_label,
                registry: Arc::default(),
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
        LockBuilder::new(&self.inner, name)
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
        LockBuilder::new(&self.inner, name).of_kind(crate::kinds::Kind::Permit(permits))
    }

    /// The read-write lock `name`: many readers or one writer. [`RwLock::read`] and
    /// [`RwLock::write`] start describing a hold, acquired with the same verbs as a lock.
    pub fn rwlock<'a>(&'a self, name: &'a str) -> RwLock<'a> {
        RwLock { client: self, name }
    }

    /// Starts describing one lock over several names: all of them or none, without
    /// deadlock (they are taken in one global order, by Cluster slot, then by key; those one
    /// script can reach in one step; and a failure gives back what was taken), with the verbs and options of [`lock`](Self::lock), renewal, one lost signal
    /// (any name lost is the whole lock lost) and a fencing token per name. See
    /// [`MultiLockBuilder`].
    ///
    /// ```no_run
    /// # fn main() -> redlease::Result<()> {
    /// # let client = redlease::Client::open("redis://127.0.0.1/")?;
    /// let both = client.lock_all(&["account:17", "account:42"]).acquire_timeout(std::time::Duration::from_secs(5))?;
    /// // move the money, passing each account its fencing token
    /// both.release()?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<'a>(&'a self, names: &[&str]) -> MultiLockBuilder<'a> {
        MultiLockBuilder::new(&self.inner, names)
    }

    /// Takes over the lock `name` held under `token` (handed over by another process):
    /// `self.lock(name).adopt(token)`, renewed with the default ttl. See
    /// [`LockBuilder::adopt`].
    pub fn adopt(&self, name: &str, token: &str) -> Result<LockGuard> {
        self.lock(name).adopt(token)
    }

    /// Whether anyone holds the lock `name` right now (one `EXISTS`). Blocking: bounded by
    /// the pool wait, the connect timeout and the I/O timeout. To know whether *you* hold
    /// a lock, use [`crate::LockGuard::is_held`].
    ///
    /// On a Redlock client: whether a majority of the primaries hold the key.
    pub fn is_locked(&self, name: &str) -> Result<bool> {
        crate::process::api_call(|| {
            let keys = LockKeys::new(&self.inner.options.key_prefix, name)?;
            self.inner.server.is_locked(&keys)
        })
    }

    /// Sends `PING`: a cheap way to check the URL, credentials and reachability up front.
    /// On a Redlock client, a majority of the primaries must answer.
    pub fn ping(&self) -> Result<()> {
        crate::process::api_call(|| self.inner.server.ping())
    }

    /// The URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        self.inner.server.describe()
    }

    /// Closes the idle connections now (in-use ones close when their requests end, and
    /// all of them when the last clone and lock are dropped).
    pub(crate) fn close_idle(&self) {
        self.inner.server.close_idle();
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
/// The backend for `target`; with `identify`, its connections ask the server's `run_id`.
fn backend_for(target: &url::Target, options: &ClientOptions, identify: bool) -> Result<Backend> {
    let tls = Arc::new(TlsSetup::new(target.tls, options.tls_ca_cert.clone())?);
    let factory = NodeFactory {
        tls,
        login: target.login.clone(),
        connect_timeout: options.connect_timeout,
        pool_size: options.pool_size,
        identify,
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
        LockBuilder::new(&self.client.inner, self.name).of_kind(crate::kinds::Kind::Read)
    }

    /// Starts describing the write hold (exclusive).
    pub fn write(self) -> LockBuilder<'a> {
        LockBuilder::new(&self.client.inner, self.name).of_kind(crate::kinds::Kind::Write)
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
