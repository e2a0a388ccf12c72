//! The client: where the locks live (one Redis server), its options, and its connections.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::connections::{Connector, Pool};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::LockBuilder;

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
    /// Longest time to establish a connection (TCP, TLS, AUTH, SELECT).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest wait for any one reply from Redis. A blocked wait (`BLPOP`) gets its own
    /// timeout on top of this one.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// Connections shared by the calling threads (renewal has its own; see
    /// [`Client`]).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Longest wait for a pooled connection when all are in use.
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
            if d.is_zero() {
                return Err(Error::invalid(format!("the {what} must not be zero")));
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
        if self.key_prefix.len() >= crate::keys::MAX_KEY_LEN {
            return Err(Error::invalid("the key prefix is too long"));
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

/// Idle connections the renewal pool keeps. Renewals of locks taken together come in
/// bursts; with too few idle connections each burst opens (and closes) new ones, which cost
/// a third of the renewal CPU with 1000 locks in the W3 benchmark when this was 8.
const RENEWAL_IDLE: usize = 64;

/// A handle to one Redis server (or, later, deployment) that hands out locks.
///
/// Cheap to clone (an `Arc`); `Send + Sync`, so one client serves every thread. Calling
/// threads share a pool of blocking connections; renewal threads use a separate pool that
/// opens a new connection rather than wait, so callers can never starve a renewal.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub pool: Pool,
    pub renewal_pool: Pool,
    pub options: ClientOptions,
    pub owner_label: String,
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
        let describe = redact_url(url);
        let bad_url = |e: redis::RedisError| {
            Error::invalid(format!(
                "bad Redis URL {describe}: {}",
                e.detail().unwrap_or(e.category())
            ))
        };
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(Error::invalid(format!(
                "bad Redis URL {describe}: expected redis://, rediss:// or redis+unix://"
            )));
        }
        let redis_client = match &options.tls_ca_cert {
            Some(pem) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            None => redis::Client::open(url),
        }
        .map_err(bad_url)?;
        let connector = |client: redis::Client| {
            Connector::new(
                client,
                options.connect_timeout,
                options.io_timeout,
                describe.clone(),
            )
        };
        let pool = Pool::new(
            connector(redis_client.clone()),
            Some(options.pool_size),
            options.pool_size,
        );
        let renewal_pool = Pool::new(connector(redis_client), None, RENEWAL_IDLE);
        let owner_label = options
            .owner_label
            .clone()
            .unwrap_or_else(default_owner_label);
        Ok(Client {
            inner: Arc::new(ClientInner {
                pool,
                renewal_pool,
                options,
                owner_label,
            }),
        })
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

    /// Whether anyone holds the lock `name` right now (one `EXISTS`; blocking, I/O timeout).
    /// To know whether *you* hold a lock, use [`crate::LockGuard::is_held`].
    pub fn is_locked(&self, name: &str) -> Result<bool> {
        let keys = LockKeys::new(&self.inner.options.key_prefix, name)?;
        let pool = &self.inner.pool;
        pool.run(self.inner.options.pool_wait, None, |c| {
            redis::cmd("EXISTS").arg(&keys.lock).query::<bool>(c)
        })
    }

    /// Sends `PING`: a cheap way to check the URL, credentials and reachability up front.
    pub fn ping(&self) -> Result<()> {
        self.inner
            .pool
            .run(self.inner.options.pool_wait, None, |c| {
                redis::cmd("PING").query::<String>(c)
            })
            .map(drop)
    }

    /// The URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.inner.pool.connector.describe
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

/// The URL with the password of its user info (and any `pass=` query value) replaced.
pub(crate) fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?', '#'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i) {
            if let Some(colon) = out[start..at].find(':').map(|i| start + i) {
                out.replace_range(colon + 1..at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some(("pass" | "password", _)) => {
                    format!("{}=***", kv.split('=').next().unwrap_or("pass"))
                }
                _ => kv.to_owned(),
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords_in_urls() {
        assert_eq!(redact_url("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://:s3cret@h"), "redis://:***@h");
        assert_eq!(redact_url("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=1&pass=s3cret"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
    }
}
