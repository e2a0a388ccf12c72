//! How a client connects: timeouts, pool, key prefix, owner label, TLS roots.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys::{MAX_KEY_LEN, RESERVED_PREFIX};

/// How a [`crate::Client`] connects. Build it with [`ClientOptions::default`] and the setters.
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

    /// Checks every option.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] naming the first unusable one.
    pub(crate) fn validate(&self) -> Result<()> {
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
