//! `extend` and `release --token`: acting on a lock held under a token handed over (by
//! `redlease run` in REDLEASE_TOKEN, or by any redlease holder), through the library's
//! adopt.

use std::time::Duration;

use redlease::{Client, ErrorKind, LockGuard};

use crate::text::warn;
use crate::{Fail, Outcome, exit};

/// The lock `name` held under `token`, not renewed by this process; `Err` with the exit
/// status when it is not held under it (1) or Redis failed.
fn adopt(client: &Client, name: &str, token: &str) -> Result<LockGuard, Outcome> {
    client
        .lock(name)
        .renew(false)
        .adopt(token)
        .map_err(|e| match e.kind() {
            ErrorKind::NotHeld => {
                warn(&format!("lock {name:?} is not held under that token"));
                Ok(exit::NOTHING_DONE)
            }
            _ => Err(Fail::from_error(
                &e,
                client,
                &format!("adopting lock {name:?}"),
            )),
        })
}

pub fn extend(client: &Client, name: &str, token: &str, ttl: Duration) -> Outcome {
    let guard = match adopt(client, name, token) {
        Ok(guard) => guard,
        Err(outcome) => return outcome,
    };
    let extended = guard.extend(ttl);
    // The holder goes on holding: this process lets go without releasing.
    guard.abandon();
    outcome(client, name, "extending", extended)
}

pub fn release(client: &Client, name: &str, token: &str) -> Outcome {
    let guard = match adopt(client, name, token) {
        Ok(guard) => guard,
        Err(outcome) => return outcome,
    };
    outcome(client, name, "releasing", guard.release())
}

/// The exit status of an extend or a release under a token.
fn outcome(client: &Client, name: &str, doing: &str, result: redlease::Result<()>) -> Outcome {
    match result {
        Ok(()) => Ok(exit::OK),
        Err(e) if e.kind() == ErrorKind::NotHeld => {
            warn(&format!("lock {name:?} is not held under that token"));
            Ok(exit::NOTHING_DONE)
        }
        Err(e) => Err(Fail::from_error(
            &e,
            client,
            &format!("{doing} lock {name:?}"),
        )),
    }
}
