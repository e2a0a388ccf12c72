//! What the locks of one client share: the deployment's lock server, the client's options
//! and owner label, and the registry of its reentrant locks.

use std::sync::Arc;

use crate::options::ClientOptions;
use crate::protocol::LockServer;
use crate::reentrant::Registry;

/// What the locks of one client share (a [`crate::Client`] is an `Arc` of it).
pub(crate) struct Shared {
    pub server: Arc<dyn LockServer>,
    pub options: ClientOptions,
    /// The label tokens end with (`host/pid` unless the options say otherwise).
    pub owner_label: String,
    /// The reentrant locks this client holds, by token: more holds of one share its lease.
    pub registry: Arc<Registry>,
}
