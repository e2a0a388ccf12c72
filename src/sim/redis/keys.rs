//! Commands on keys of any type: `DEL`, `EXISTS`, `PEXPIRE` (with `NX`, `XX`, `GT`, `LT`),
//! `PTTL` and `TYPE`.

use super::args::{is, parse_int};
use super::keyspace::{Data, Keyspace};
use super::reply::{NOT_INTEGER, Reply};

/// `DEL key [key ...]`: how many of the keys existed.
pub(crate) fn del(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let deleted = args[1..].iter().filter(|key| ks.remove(key)).count();
    Reply::Int(deleted as i64)
}

/// `EXISTS key [key ...]`: how many of the keys exist (a key named twice counts twice).
pub(crate) fn exists(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let found = args[1..].iter().filter(|key| ks.get(key).is_some()).count();
    Reply::Int(found as i64)
}

/// `PTTL key`: ms left, -1 without expiry, -2 without key.
pub(crate) fn pttl(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let now = ks.now();
    match ks.get(&args[1]) {
        None => Reply::Int(-2),
        Some(entry) => match entry.expires_at {
            None => Reply::Int(-1),
            Some(at) => Reply::Int((at - now).max(0)),
        },
    }
}

/// `TYPE key`: `string`, `list`, `zset`, `hash`, or `none`, as a status.
pub(crate) fn type_of(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let name = match ks.get(&args[1]).map(|entry| &entry.data) {
        None => "none",
        Some(Data::Str(_)) => "string",
        Some(Data::List(_)) => "list",
        Some(Data::ZSet(_)) => "zset",
        Some(Data::Hash(_)) => "hash",
    };
    Reply::Status(name.to_owned())
}

/// `PEXPIRE key ms [NX|XX|GT|LT]`: 1 when the expiry was set (an expiry at or before now
/// deletes the key), 0 when there is no key or a condition refused it. Options are checked
/// before the number, as Redis does.
pub(crate) fn pexpire(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &args[3..] {
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            return Reply::error(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(opt)
            ));
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::error("ERR GT and LT options at the same time are not compatible");
    }
    let Some(ms) = parse_int(&args[2]) else {
        return Reply::error(NOT_INTEGER);
    };
    let now = ks.now();
    let Some(at) = ms.checked_add(now) else {
        return Reply::error("ERR invalid expire time in 'pexpire' command");
    };
    let key = &args[1];
    let Some(current) = ks.get(key).map(|e| e.expires_at) else {
        return Reply::Int(0);
    };
    let refused = (nx && current.is_some())
        || (xx && current.is_none())
        || (gt && current.is_none_or(|c| at <= c))
        || (lt && current.is_some_and(|c| at >= c));
    if refused {
        return Reply::Int(0);
    }
    if at <= now {
        ks.remove(key);
    } else if let Some(entry) = ks.get_mut(key) {
        entry.expires_at = Some(at);
    }
    Reply::Int(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::redis::commands::tests::run;

    #[test]
    fn type_names_each_kind_of_value() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, &["TYPE", "k"]), Reply::Status("none".into()));
        run(&mut ks, &["SET", "k", "v"]);
        run(&mut ks, &["RPUSH", "l", "v"]);
        run(&mut ks, &["ZADD", "z", "1", "m"]);
        run(&mut ks, &["HSET", "h", "f", "v"]);
        for (key, kind) in [("k", "string"), ("l", "list"), ("z", "zset"), ("h", "hash")] {
            assert_eq!(run(&mut ks, &["TYPE", key]), Reply::Status(kind.into()));
        }
    }

    #[test]
    fn pexpire_sets_deletes_and_honours_its_conditions() {
        let mut ks = Keyspace::default();
        ks.set_clock(1000);
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "100"]), Reply::Int(0));
        run(&mut ks, &["SET", "k", "v"]);
        assert_eq!(run(&mut ks, &["PTTL", "k"]), Reply::Int(-1));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "100", "XX"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "100", "GT"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "100", "LT"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["PTTL", "k"]), Reply::Int(100));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "50", "GT"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "500", "NX"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["PEXPIRE", "k", "0"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["EXISTS", "k", "k"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["PTTL", "k"]), Reply::Int(-2));
        assert!(run(&mut ks, &["PEXPIRE", "k", "9223372036854775000"]).is_error());
    }

    #[test]
    fn del_and_exists_count_keys() {
        let mut ks = Keyspace::default();
        run(&mut ks, &["SET", "a", "1"]);
        run(&mut ks, &["RPUSH", "b", "1"]);
        assert_eq!(run(&mut ks, &["EXISTS", "a", "b", "a", "c"]), Reply::Int(3));
        assert_eq!(run(&mut ks, &["DEL", "a", "b", "c", "a"]), Reply::Int(2));
        assert_eq!(run(&mut ks, &["EXISTS", "a", "b"]), Reply::Int(0));
    }
}
