//! String commands: `GET`, `MGET` and `SET` (with `NX`, `XX`, `GET`, `KEEPTTL`, `EX`,
//! `PX`, `EXAT`, `PXAT`).

use super::args::{is, parse_int};
use super::keyspace::{Data, Entry, Keyspace, typed};
use super::reply::{NOT_INTEGER, Reply, SYNTAX};

/// The string at `key`: `Ok(None)` when there is no key, `WRONGTYPE` when it is not a
/// string.
fn string<'a>(ks: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a Vec<u8>>, Reply> {
    typed(ks, key, |d| match d {
        Data::Str(s) => Some(s),
        _ => None,
    })
}

/// `GET key`: the value, nil when absent.
pub(crate) fn get(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match string(ks, &args[1]) {
        Ok(Some(v)) => Reply::bulk(v.clone()),
        Ok(None) => Reply::Nil,
        Err(e) => e,
    }
}

/// `MGET key [key ...]`: each key's value; nil for a missing key and for a key of another
/// type (`MGET` never answers `WRONGTYPE`).
pub(crate) fn mget(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    Reply::Array(
        args[1..]
            .iter()
            .map(|key| match string(ks, key) {
                Ok(Some(v)) => Reply::bulk(v.clone()),
                _ => Reply::Nil,
            })
            .collect(),
    )
}

/// The expiry option of a `SET`.
#[derive(Clone, Copy, PartialEq)]
enum Expiry {
    Ex,
    Px,
    ExAt,
    PxAt,
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`, with Redis 7.0's
/// option rules (a repeated `PX` is taken, the last one wins), its checks in its order
/// (options, then the expiry, then `GET`'s type), `OK` or nil when `NX`/`XX` refused.
pub(crate) fn set(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let (key, value) = (&args[1], &args[2]);
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut expiry: Option<(Expiry, &[u8])> = None;
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let next = args.get(j + 1);
        let kind = expiry.map(|(k, _)| k);
        let other_expiry = |mine: Expiry| kind.is_some_and(|k| k != mine);
        if is(opt, "nx") && !xx {
            nx = true;
        } else if is(opt, "xx") && !nx {
            xx = true;
        } else if is(opt, "get") {
            get = true;
        } else if is(opt, "keepttl") && kind.is_none() {
            keepttl = true;
        } else if let Some((mine, next)) = [
            ("ex", Expiry::Ex),
            ("px", Expiry::Px),
            ("exat", Expiry::ExAt),
            ("pxat", Expiry::PxAt),
        ]
        .into_iter()
        .find(|(name, _)| is(opt, name))
        .map(|(_, mine)| mine)
        .zip(next)
        .filter(|(mine, _)| !keepttl && !other_expiry(*mine))
        {
            expiry = Some((mine, next));
            j += 1;
        } else {
            return Reply::error(SYNTAX);
        }
        j += 1;
    }
    let expires_at = match expiry {
        None => None,
        Some((kind, arg)) => match expire_at(ks.now(), kind, arg) {
            Ok(at) => Some(at),
            Err(e) => return e,
        },
    };
    let old = match string(ks, key) {
        Ok(v) => v.cloned(),
        Err(e) if get => return e,
        Err(_) => None,
    };
    let found = ks.get(key).is_some();
    let reply_old = || old.clone().map_or(Reply::Nil, Reply::bulk);
    if (nx && found) || (xx && !found) {
        return if get { reply_old() } else { Reply::Nil };
    }
    let kept = if keepttl {
        ks.get(key).and_then(|e| e.expires_at)
    } else {
        None
    };
    ks.insert(
        key,
        Entry {
            data: Data::Str(value.clone()),
            expires_at: expires_at.or(kept),
        },
    );
    if get { reply_old() } else { Reply::ok() }
}

/// The absolute expiry (server wall clock, ms) of a `SET` expiry option, or Redis's error:
/// not an integer, or not positive, or out of range.
fn expire_at(now: i64, kind: Expiry, arg: &[u8]) -> Result<i64, Reply> {
    let invalid = || Reply::error("ERR invalid expire time in 'set' command");
    let n = parse_int(arg).ok_or_else(|| Reply::error(NOT_INTEGER))?;
    let seconds = matches!(kind, Expiry::Ex | Expiry::ExAt);
    if n <= 0 || (seconds && n > i64::MAX / 1000) {
        return Err(invalid());
    }
    let ms = if seconds { n * 1000 } else { n };
    let at = if matches!(kind, Expiry::Ex | Expiry::Px) {
        ms.wrapping_add(now)
    } else {
        ms
    };
    if at <= 0 {
        return Err(invalid());
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::redis::commands::tests::run;

    #[test]
    fn set_honours_nx_xx_get_and_px() {
        let mut ks = Keyspace::default();
        ks.set_clock(1000);
        assert_eq!(run(&mut ks, &["SET", "k", "a", "XX"]), Reply::Nil);
        assert_eq!(
            run(&mut ks, &["SET", "k", "a", "NX", "PX", "100"]),
            Reply::ok()
        );
        assert_eq!(run(&mut ks, &["SET", "k", "b", "NX"]), Reply::Nil);
        assert_eq!(
            run(&mut ks, &["SET", "k", "b", "nx", "get"]),
            Reply::bulk("a")
        );
        assert_eq!(ks.get(b"k").and_then(|e| e.expires_at), Some(1100));
        assert_eq!(
            run(&mut ks, &["SET", "k", "c", "KEEPTTL", "GET"]),
            Reply::bulk("a")
        );
        assert_eq!(ks.get(b"k").and_then(|e| e.expires_at), Some(1100));
        assert_eq!(run(&mut ks, &["SET", "k", "d"]), Reply::ok());
        assert_eq!(ks.get(b"k").and_then(|e| e.expires_at), None);
        assert_eq!(run(&mut ks, &["GET", "k"]), Reply::bulk("d"));
    }

    #[test]
    fn set_refuses_bad_options_as_redis_does() {
        let mut ks = Keyspace::default();
        let err = |r: Reply| match r {
            Reply::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(err(run(&mut ks, &["SET", "k", "v", "NX", "XX"])), SYNTAX);
        assert_eq!(err(run(&mut ks, &["SET", "k", "v", "PX"])), SYNTAX);
        assert_eq!(
            err(run(&mut ks, &["SET", "k", "v", "EX", "1", "PX", "1"])),
            SYNTAX
        );
        assert_eq!(
            err(run(&mut ks, &["SET", "k", "v", "PX", "x"])),
            NOT_INTEGER
        );
        assert_eq!(
            err(run(&mut ks, &["SET", "k", "v", "PX", "0"])),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(
            run(&mut ks, &["SET", "k", "v", "PX", "100", "PX", "200"]),
            Reply::ok()
        );
        run(&mut ks, &["RPUSH", "l", "x"]);
        assert!(run(&mut ks, &["SET", "l", "v", "GET"]).is_error());
        assert_eq!(run(&mut ks, &["SET", "l", "v"]), Reply::ok());
    }
}
