//! `status`, `list`, `release --force` and `check`: looking at locks and at the server.

use std::fmt::Write as _;
use std::time::Duration;

use redlease::{Client, ErrorKind, HeldAs, LockInfo, ServerCheck};

use crate::duration::show;
use crate::text::{json_opt_num, json_opt_str, json_str, print, printable, warn};
use crate::{Fail, Outcome, exit, owner};

pub fn status(client: &Client, names: &[String], json: bool) -> Outcome {
    let mut infos = Vec::with_capacity(names.len());
    for name in names {
        let info = client
            .inspect(name)
            .map_err(|e| Fail::from_error(&e, client, &format!("inspecting lock {name:?}")))?;
        infos.push(info);
    }
    print(&if json {
        json_table(&infos)
    } else {
        text_table(&infos)
    });
    Ok(exit::OK)
}

pub fn list(client: &Client, pattern: &str, limit: usize, json: bool) -> Outcome {
    let infos = client
        .locks(pattern, limit)
        .map_err(|e| Fail::from_error(&e, client, "listing locks"))?;
    if json {
        print(&json_table(&infos));
    } else if infos.is_empty() {
        print(&format!("no held lock matches {:?}\n", printable(pattern)));
    } else {
        print(&text_table(&infos));
    }
    Ok(exit::OK)
}

/// Columns KEY, HOLDER (host/pid), TTL, FENCE, WAITERS, aligned.
fn text_table(infos: &[LockInfo]) -> String {
    let mut rows = vec![[
        "KEY".to_owned(),
        "HOLDER".to_owned(),
        "TTL".to_owned(),
        "FENCE".to_owned(),
        "WAITERS".to_owned(),
    ]];
    for info in infos {
        rows.push([
            printable(&info.key),
            holder_cell(info),
            match (&info.held_as, info.remaining) {
                (None, _) => "-".to_owned(),
                (Some(_), Some(d)) => show(d),
                (Some(_), None) => "no expiry".to_owned(),
            },
            info.fencing_token
                .map_or_else(|| "-".to_owned(), |f| f.to_string()),
            info.waiters.to_string(),
        ]);
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The HOLDER column: host/pid of a mutex's holder (with a reentrant lock's owner and
/// holds), a semaphore's permits held, a read-write lock's writer or readers.
pub(crate) fn holder_cell(info: &LockInfo) -> String {
    let who = |h: &str| printable(owner(h));
    match (&info.held_as, info.holder.as_deref()) {
        (None, _) => "-".to_owned(),
        (Some(HeldAs::Semaphore { permits }), _) => plural(*permits, "permit"),
        (Some(HeldAs::ReadWrite { .. }), Some(writer)) => format!("{} (writing)", who(writer)),
        (Some(HeldAs::ReadWrite { readers }), None) => plural(*readers, "reader"),
        (Some(_), Some(h)) => match &info.reentrant {
            Some((o, holds)) => format!(
                "{} (owner {}, {})",
                who(h),
                printable(o),
                plural(*holds, "hold")
            ),
            None => who(h),
        },
        (Some(_), None) => "-".to_owned(),
    }
}

fn plural(n: u64, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn json_info(info: &LockInfo) -> String {
    let holder = info.holder.as_deref();
    let (kind, permits, readers) = match &info.held_as {
        None => (None, None, None),
        Some(HeldAs::Semaphore { permits }) => (Some("semaphore"), Some(*permits), None),
        Some(HeldAs::ReadWrite { readers }) => (Some("rwlock"), None, Some(*readers)),
        Some(_) => (Some("mutex"), None, None),
    };
    let (reentrant_owner, holds) = match &info.reentrant {
        Some((o, n)) => (Some(o.as_str()), Some(*n)),
        None => (None, None),
    };
    format!(
        r#"{{"key":{},"held":{},"kind":{},"holder":{},"owner":{},"ttl_ms":{},"fencing_token":{},"waiters":{},"reentrant_owner":{},"holds":{},"permits":{},"readers":{}}}"#,
        json_str(&info.key),
        info.held_as.is_some(),
        json_opt_str(kind),
        json_opt_str(holder),
        json_opt_str(holder.map(owner)),
        json_opt_num(
            info.held_as
                .as_ref()
                .and(info.remaining.map(|d| d.as_millis()))
        ),
        json_opt_num(info.fencing_token),
        info.waiters,
        json_opt_str(reentrant_owner),
        json_opt_num(holds),
        json_opt_num(permits),
        json_opt_num(readers),
    )
}

/// A JSON array, one lock per line.
fn json_table(infos: &[LockInfo]) -> String {
    if infos.is_empty() {
        return "[]\n".to_owned();
    }
    let lines: Vec<String> = infos
        .iter()
        .map(|i| format!("  {}", json_info(i)))
        .collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

/// `release` without `--force`: a usage error that says what `--force` would do; nothing is
/// sent to Redis.
pub fn release_refused(name: &str) -> Outcome {
    Err(Fail::usage(format!(
        "refusing to release lock {name:?} without --force: --force prints who holds it, then deletes the lock key if it still holds that owner's token, while that owner's command may still be running"
    )))
}

pub fn release(client: &Client, name: &str, json: bool) -> Outcome {
    let info = client
        .inspect(name)
        .map_err(|e| Fail::from_error(&e, client, &format!("inspecting lock {name:?}")))?;
    let Some(holder) = info.holder.clone() else {
        if json {
            print(&format!(
                "{{\"key\":{},\"released\":false,\"holder\":null}}\n",
                json_str(&info.key)
            ));
        }
        let why = match &info.held_as {
            Some(HeldAs::Semaphore { permits }) => format!(
                "lock {name:?} is a counting semaphore with {} held: --force \
                 breaks a mutex or a read-write lock's writer; each permit ends with its own \
                 lease; nothing released",
                plural(*permits, "permit")
            ),
            Some(HeldAs::ReadWrite { readers }) => format!(
                "lock {name:?} is held by {}: --force breaks a mutex or a read-write lock's \
                 writer; each read hold ends with its own lease; nothing released",
                plural(*readers, "reader")
            ),
            _ => format!("lock {name:?} is not held; nothing to release"),
        };
        warn(&why);
        return Ok(exit::NOTHING_DONE);
    };
    let remaining = info.remaining.map_or_else(|| "no expiry".to_owned(), show);
    let fence = json_opt_num(info.fencing_token);
    if !json {
        print(&format!(
            "lock {:?} held by {} (token {}, fencing token {fence}, ttl {remaining} left)\n",
            printable(&info.key),
            printable(owner(&holder)),
            printable(&holder),
        ));
    }
    match client.break_lock(name, &holder) {
        Ok(()) => {
            if json {
                print(&format!(
                    "{{\"key\":{},\"released\":true,\"holder\":{},\"owner\":{},\"fencing_token\":{fence}}}\n",
                    json_str(&info.key),
                    json_str(&holder),
                    json_str(owner(&holder)),
                ));
            } else {
                print(&format!(
                    "released lock {:?}; its holder finds it lost at its next renewal (its work may still be running: rely on fencing tokens)\n",
                    printable(&info.key)
                ));
            }
            Ok(exit::OK)
        }
        Err(e) if e.kind() == ErrorKind::NotHeld => {
            if json {
                print(&format!(
                    "{{\"key\":{},\"released\":false,\"holder\":{},\"owner\":{},\"fencing_token\":{fence}}}\n",
                    json_str(&info.key),
                    json_str(&holder),
                    json_str(owner(&holder)),
                ));
            }
            warn(&format!(
                "lock {name:?} changed hands (or expired) before it could be released; nothing deleted"
            ));
            Ok(exit::NOTHING_DONE)
        }
        Err(e) => Err(Fail::from_error(
            &e,
            client,
            &format!("releasing lock {name:?}"),
        )),
    }
}

/// One finding of `check`.
struct Finding {
    level: &'static str,
    topic: &'static str,
    text: String,
}

pub fn check(client: &Client, json: bool) -> Outcome {
    let found = client
        .check()
        .map_err(|e| Fail::from_error(&e, client, "checking the server"))?;
    let findings = findings(&found);
    let fails = findings.iter().any(|f| f.level == "FAIL");
    if json {
        let items: Vec<String> = findings
            .iter()
            .map(|f| {
                format!(
                    r#"{{"level":{},"topic":{},"text":{}}}"#,
                    json_str(&f.level.to_lowercase()),
                    json_str(f.topic),
                    json_str(&f.text)
                )
            })
            .collect();
        let trips: Vec<String> = found
            .round_trips
            .iter()
            .map(|d| format!("{:.3}", d.as_secs_f64() * 1000.0))
            .collect();
        print(&format!(
            "{{\"url\":{},\"version\":{},\"maxmemory_policy\":{},\"save\":{},\"appendonly\":{},\"appendfsync\":{},\"round_trips_ms\":[{}],\"ok\":{},\"findings\":[{}]}}\n",
            json_str(client.url()),
            json_str(&found.version),
            json_opt_str(found.maxmemory_policy.as_deref()),
            json_opt_str(found.save.as_deref()),
            json_opt_str(found.appendonly.as_ref().map(|(a, _)| a.as_str())),
            json_opt_str(found.appendonly.as_ref().map(|(_, f)| f.as_str())),
            trips.join(","),
            !fails,
            items.join(",")
        ));
    } else {
        let mut out = format!(
            "{}: Redis {}\n",
            printable(client.url()),
            printable(&found.version)
        );
        for f in &findings {
            let _ = writeln!(out, "{:<8} {:<12} {}", f.level, f.topic, printable(&f.text));
        }
        print(&out);
    }
    Ok(if fails { exit::UNAVAILABLE } else { exit::OK })
}

fn findings(found: &ServerCheck) -> Vec<Finding> {
    let mut out = Vec::new();
    let eviction = match found.maxmemory_policy.as_deref() {
        None => Finding {
            level: "warning",
            topic: "eviction",
            text: "maxmemory-policy unknown (CONFIG GET refused): cannot tell whether Redis may delete held locks to make room".into(),
        },
        Some(policy) if !found.may_evict_locks() => Finding {
            level: "ok",
            topic: "eviction",
            text: format!("maxmemory-policy {policy}: Redis never deletes a held lock to make room (a full server refuses new acquires instead)"),
        },
        Some(policy) => Finding {
            level: "FAIL",
            topic: "eviction",
            text: format!("maxmemory-policy {policy}: when memory runs short Redis may delete a held lock's key and let a second holder in; set maxmemory-policy noeviction"),
        },
    };
    out.push(eviction);
    let aof = found.appendonly.as_ref();
    let persistence = match (found.loses_data_on_restart(), found.save.as_deref(), aof) {
        (None, _, _) => Finding {
            level: "warning",
            topic: "persistence",
            text: "unknown (CONFIG GET refused): a restart may forget every held lock".into(),
        },
        (Some(true), _, _) => Finding {
            level: "warning",
            topic: "persistence",
            text: "no RDB snapshots and no AOF: a restart forgets every held lock, so a second holder can get in at once (fencing tokens still increase)".into(),
        },
        (Some(false), _, Some((on, fsync))) if on == "yes" => Finding {
            level: "ok",
            topic: "persistence",
            text: format!("AOF on (appendfsync {fsync}): a restart keeps held locks, except those taken in the last moments before a crash{}",
                if fsync == "always" { "" } else { " (up to about a second with everysec)" }),
        },
        (Some(false), save, _) => Finding {
            level: "note",
            topic: "persistence",
            text: format!("RDB snapshots only (save {:?}): a restart forgets locks taken since the last snapshot, so a second holder can get in", save.unwrap_or("")),
        },
    };
    out.push(persistence);
    let mut trips = found.round_trips.clone();
    trips.sort();
    if let (Some(min), Some(max)) = (trips.first(), trips.last()) {
        let median = trips[trips.len() / 2];
        let ms = |d: Duration| format!("{:.2}ms", d.as_secs_f64() * 1000.0);
        let slow = *max > Duration::from_millis(200);
        out.push(Finding {
            level: if slow { "warning" } else { "ok" },
            topic: "latency",
            text: format!(
                "min {} / median {} / max {} over {} round trips: an acquire, a renewal or a release costs about one{}",
                ms(*min),
                ms(median),
                ms(*max),
                trips.len(),
                if slow { "; keep ttls far above this, or renewals may not land in time" } else { "" }
            ),
        });
    }
    out
}
