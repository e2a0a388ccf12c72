//! Requests on one connection: the calls written together, their replies read in order,
//! and a script answered `NOSCRIPT` sent again as `EVAL`.

use std::time::Instant;

use redis::Value;

use crate::backend::call::Call;
use crate::backend::exec::{Exec, Replies};
use crate::connection::Connection;
use crate::core::acquire::BLOCK_LATENESS;
use crate::error::{Error, ErrorKind, Result};

/// Writes `calls` in one request on `conn` and reads their replies; resends from the first
/// script answered `NOSCRIPT`, as `EVAL`.
pub(crate) fn run_calls(conn: &mut Connection, calls: &[Call], how: &Exec<'_>) -> Result<Replies> {
    let sent_at = send_calls(conn, calls, how)?;
    finish_calls(conn, calls, sent_at, how)
}

/// The first half of [`run_calls`]: writes the request; returns when it was written.
///
/// A script ahead of a blocking call goes as `EVAL` unless this connection's server was
/// seen to have it cached: the block runs whatever the script's reply, so a script
/// answered `NOSCRIPT` there (a fresh server, or one restarted: a new connection knows no
/// script) would leave a waiter blocked unregistered for its whole block. (A `SCRIPT
/// FLUSH` behind the back of a connection that knew the script still costs that one
/// block: see the README's bounds table.)
pub(crate) fn send_calls(conn: &mut Connection, calls: &[Call], how: &Exec<'_>) -> Result<Instant> {
    let mut packed = Vec::with_capacity(calls.iter().map(|c| c.packed().len()).sum());
    let last_block = calls.iter().rposition(|c| c.block().is_some());
    for (i, call) in calls.iter().enumerate() {
        let ahead_of_block = last_block.is_some_and(|b| i < b);
        match call.script_sha() {
            Some(sha) if ahead_of_block && !conn.knows_script(sha) => {
                packed.extend_from_slice(&call.as_eval())
            }
            _ => packed.extend_from_slice(call.packed()),
        }
    }
    let sent_at = Instant::now();
    let deadline = sent_at + how.io;
    conn.send(
        &packed,
        calls.len(),
        how.cutoff.map_or(deadline, |c| deadline.min(c)),
    )?;
    // The replies ahead of a pop come at once; the reader waits for the pop's all the same.
    let pop = calls
        .iter()
        .enumerate()
        .find_map(|(i, c)| Some((i, c.pop_block()?)));
    if let Some((i, block)) = pop
        && i > 0
    {
        conn.quiet_until(sent_at + block);
    }
    Ok(sent_at)
}

/// The second half of [`run_calls`]: reads the replies of a request written at `sent_at`.
pub(crate) fn finish_calls(
    conn: &mut Connection,
    calls: &[Call],
    sent_at: Instant,
    how: &Exec<'_>,
) -> Result<Replies> {
    let cut = |t: Instant| how.cutoff.map_or(t, |c| t.min(c));
    let mut values = read_replies(conn, calls, sent_at, how)?;
    for (call, value) in calls.iter().zip(&values) {
        if let Some(sha) = call.script_sha() {
            conn.script_seen(sha, !is_noscript(value));
        }
    }
    if let Some(first) = values.iter().position(is_noscript) {
        let again = &calls[first..];
        let mut packed = Vec::new();
        for call in again {
            packed.extend_from_slice(&call.as_eval());
        }
        let resent_at = Instant::now();
        conn.send(&packed, again.len(), cut(resent_at + how.io))?;
        let more = read_replies(conn, again, resent_at, how)?;
        values.truncate(first);
        values.extend(more);
    }
    Ok(Replies { values, sent_at })
}

fn read_replies(
    conn: &mut Connection,
    calls: &[Call],
    sent_at: Instant,
    how: &Exec<'_>,
) -> Result<Vec<Value>> {
    let mut values = Vec::with_capacity(calls.len());
    let mut since = sent_at;
    for call in calls {
        if call.pop_block().is_some() {
            // The replies ahead of a pop may be read only with its own (see
            // `Connection::quiet_until`): it is timed from the write, as they are.
            since = sent_at;
        }
        let mut deadline = since + how.io;
        if let Some(block) = call.block() {
            deadline += block + BLOCK_LATENESS;
        }
        if let Some(cutoff) = how.cutoff {
            deadline = deadline.min(cutoff);
        }
        values.push(conn.recv(deadline, how.watch)?);
        since = Instant::now();
    }
    Ok(values)
}

fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// The reply as `T`, or the server's error as [`ErrorKind::Server`].
pub(crate) fn reply<T: redis::FromRedisValue>(value: Value) -> Result<T> {
    if let Value::ServerError(e) = &value {
        return Err(Error::server(e));
    }
    redis::from_redis_value(value)
        .map_err(|e| Error::new(ErrorKind::Server, format!("unexpected reply: {e}")).with_source(e))
}
