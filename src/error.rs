//! The one error type of the crate, with a kind callers can match on.

use std::fmt;
use std::sync::Arc;

/// What went wrong, in terms a caller can act on.
///
/// The kinds map one-to-one onto the C status codes (see `ffi`) and the Python exception
/// classes, so Rust, C and Python agree on what a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Acquire: the wait ended while another owner held the lock, or with a grant whose
    /// lease ran out before it could be confirmed (the message says which). Nothing is held.
    Busy,
    /// Release or extend: the key no longer holds this lock's token (it expired, or another
    /// owner took it), or the lock was already lost (a renewal found the token gone, or
    /// could not reach Redis before the lease's local deadline: the key may then still hold
    /// the token for a moment, but the lock is not held any more and never will be again),
    /// or the call came from a forked child, which does not hold its parent's locks. Any
    /// work done since the lease ended ran unprotected.
    NotHeld,
    /// Acquire: the wait was cancelled on purpose ([`crate::CancelToken`],
    /// [`crate::cancel_all`], or an interrupt hook that asked for it). Nothing is held.
    Cancelled,
    /// Redis could not be reached, or the connection dropped.
    Connection,
    /// Redis did not answer within the I/O timeout, or no connection became free in time.
    Timeout,
    /// The server answered with an error (NOAUTH, WRONGPASS, READONLY, OOM, ...).
    Server,
    /// Too few replicas acknowledged the write (`min_replicas`); an acquire was rolled back.
    Replication,
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
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Connection => "connection error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Server => "server error",
            ErrorKind::Replication => "replication error",
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

/// An error from redlease: a [`ErrorKind`], a message for people, and the underlying cause
/// when there is one ([`std::error::Error::source`]).
///
/// Messages never contain the password of the client URL.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    outcome_unknown: bool,
    /// The server refused the request for now, without running it (see
    /// [`Error::refused_for_now`]).
    refused_for_now: bool,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Creates an error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            outcome_unknown: false,
            refused_for_now: false,
            source: None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Attaches the underlying cause.
    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Marks the request as sent without a reply: it may or may not have taken effect.
    pub(crate) fn sent(mut self) -> Self {
        self.outcome_unknown = true;
        self
    }

    /// Marks a refusal that a later try may not get: a Cluster slot moving or unsettled,
    /// a cluster or primary down, a server loading its data.
    pub(crate) fn refused(mut self) -> Self {
        self.refused_for_now = true;
        self
    }

    /// True when the server refused the request without running it, for a reason that
    /// passes (a Cluster slot moving, the cluster down, data loading, a replica without
    /// its primary): a waiter tries again while it may wait.
    pub(crate) fn refused_for_now(&self) -> bool {
        self.refused_for_now
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

    /// True for [`ErrorKind::Cancelled`].
    pub fn is_cancelled(&self) -> bool {
        self.kind == ErrorKind::Cancelled
    }

    /// True when Redis could not be reached or did not answer in time.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind, ErrorKind::Connection | ErrorKind::Timeout)
    }

    /// True when the request reached the network but its reply did not come back: it may
    /// or may not have taken effect on the server. (False means it surely did not.)
    pub fn outcome_unknown(&self) -> bool {
        self.outcome_unknown
    }

    /// A server's error reply as an [`ErrorKind::Server`] error (marked
    /// [`Error::refused_for_now`] for a refusal that passes), keeping the reply as its cause.
    pub(crate) fn server(e: &redis::ServerError) -> Error {
        let text = match e.details() {
            Some(details) => format!("{} {details}", e.code()),
            None => e.code().to_owned(),
        };
        let error = Error::new(ErrorKind::Server, text.clone()).with_source(ServerReply(text));
        match e.code() {
            // (`READONLY` is not among them: the Sentinel and Cluster backends find the new
            // primary themselves, and a single server that is a replica stays one.)
            "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN" => {
                error.refused()
            }
            _ => error,
        }
    }

    /// Prefixes the message with what was being done, keeping the kind.
    pub(crate) fn context(mut self, doing: &str) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl fmt::Debug for Error {
    /// As [`Display`](fmt::Display), plus whether the outcome is unknown: what a
    /// `main() -> Result<(), Box<dyn Error>>` prints when it returns this error. The
    /// alternate form (`{:#?}`) shows every field.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("Error")
                .field("kind", &self.kind)
                .field("message", &self.message)
                .field("outcome_unknown", &self.outcome_unknown)
                .field("source", &self.source)
                .finish();
        }
        write!(f, "{self}")?;
        if self.outcome_unknown {
            f.write_str(" (the request was sent and its reply never came: it may have run)")?;
        }
        Ok(())
    }
}

impl PartialEq for Error {
    /// Errors are equal when their kind, message and outcome are.
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.message == other.message
            && self.outcome_unknown == other.outcome_unknown
    }
}

impl Eq for Error {}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An error reply of the server (`-ERR ...`, `-WRONGPASS ...`), kept as the cause of a
/// [`ErrorKind::Server`] error.
#[derive(Debug, Clone)]
struct ServerReply(String);

impl fmt::Display for ServerReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServerReply {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_reads_like_the_message_for_a_main_that_returns_the_error() {
        let e = Error::new(ErrorKind::Busy, "lock \"x\" is held by another owner");
        assert_eq!(
            format!("{e:?}"),
            "busy: lock \"x\" is held by another owner"
        );
        let sent = Error::new(ErrorKind::Timeout, "no reply in time").sent();
        let shown = format!("{sent:?}");
        assert!(shown.starts_with("timeout: no reply in time"), "{shown}");
        assert!(shown.contains("may have run"), "{shown}");
        assert!(format!("{sent:#?}").contains("outcome_unknown: true"));
    }
}
