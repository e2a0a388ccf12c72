//! The one error type of the crate, with a kind callers can match on.

use std::fmt;

/// What went wrong, in terms a caller can act on.
///
/// The kinds map one-to-one onto the C status codes (see `ffi`) and the Python exception
/// classes, so Rust, C and Python agree on what a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Acquire: the wait ended while another owner held the lock.
    Busy,
    /// Release or extend: the key no longer holds this lock's token (it expired, or another
    /// owner took it), or the call came from a forked child, which does not hold its
    /// parent's locks. Any work done since the lease ended ran unprotected.
    NotHeld,
    /// Redis could not be reached, or the connection dropped.
    Connection,
    /// Redis did not answer within the I/O timeout, or no connection became free in time.
    Timeout,
    /// The server answered with an error (NOAUTH, WRONGPASS, READONLY, OOM, ...).
    Server,
    /// The caller passed something unusable (empty key, ttl 0, bad URL, ...). Nothing was sent.
    InvalidArgument,
    /// An internal invariant failed, or the OS refused a resource (a thread). A bug or an
    /// exhausted machine.
    Internal,
}

impl ErrorKind {
    /// A short stable name, as used in messages and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Busy => "busy",
            ErrorKind::NotHeld => "not held",
            ErrorKind::Connection => "connection error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Server => "server error",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Internal => "internal error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from redlease: a [`ErrorKind`] plus a message for people.
///
/// Messages never contain the password of the client URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Creates an error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// The kind, to match on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message alone, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True for [`ErrorKind::Busy`].
    pub fn is_busy(&self) -> bool {
        self.kind == ErrorKind::Busy
    }

    /// True for [`ErrorKind::NotHeld`].
    pub fn is_not_held(&self) -> bool {
        self.kind == ErrorKind::NotHeld
    }

    /// True for [`ErrorKind::Timeout`].
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// True when Redis could not be reached or did not answer in time: the operation may or
    /// may not have taken effect on the server.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind, ErrorKind::Connection | ErrorKind::Timeout)
    }

    /// Prefixes the message with what was being done, keeping the kind.
    pub(crate) fn context(mut self, doing: &str) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    /// Converts a redis crate error, removing `secret` (the URL password) from its text.
    pub(crate) fn from_redis(err: &redis::RedisError, secret: Option<&str>) -> Self {
        let kind = if err.is_timeout() {
            ErrorKind::Timeout
        } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            ErrorKind::Connection
        } else {
            match err.kind() {
                redis::ErrorKind::InvalidClientConfig => ErrorKind::InvalidArgument,
                redis::ErrorKind::Server(_)
                | redis::ErrorKind::AuthenticationFailed
                | redis::ErrorKind::Extension => ErrorKind::Server,
                redis::ErrorKind::Parse => ErrorKind::Connection,
                _ => ErrorKind::Server,
            }
        };
        Error::new(kind, redact(&err.to_string(), secret))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Replaces every occurrence of `secret` in `text` with `***`.
pub(crate) fn redact(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => text.replace(s, "***"),
        _ => text.to_owned(),
    }
}
