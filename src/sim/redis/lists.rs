//! List commands: `RPUSH`, `LLEN`, and the pops behind `BLPOP` (whose blocking lives in
//! [`super::blocking`]).

use std::collections::VecDeque;

use super::keyspace::{Data, Entry, Keyspace, typed, typed_mut};
use super::reply::Reply;

fn list<'a>(ks: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a VecDeque<Vec<u8>>>, Reply> {
    typed(ks, key, |d| match d {
        Data::List(l) => Some(l),
        _ => None,
    })
}

/// `RPUSH key element [element ...]`: the list's length after the push.
pub(crate) fn rpush(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let existing = typed_mut(ks, key, |d| match d {
        Data::List(l) => Some(l),
        _ => None,
    });
    match existing {
        Err(e) => e,
        Ok(Some(list)) => {
            list.extend(args[2..].iter().cloned());
            Reply::Int(list.len() as i64)
        }
        Ok(None) => {
            let list: VecDeque<Vec<u8>> = args[2..].iter().cloned().collect();
            let len = list.len();
            ks.insert(key, Entry::new(Data::List(list)));
            Reply::Int(len as i64)
        }
    }
}

/// `LLEN key`: 0 without key.
pub(crate) fn llen(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match list(ks, &args[1]) {
        Ok(l) => Reply::Int(l.map_or(0, VecDeque::len) as i64),
        Err(e) => e,
    }
}

/// What `BLPOP`'s first, non-blocking look at its keys finds: the first key (in the
/// order given) that holds a non-empty list, popped as `[key, element]`; `WRONGTYPE` if a
/// key met before it holds another type; `Ok(None)` when all are empty.
pub(crate) fn pop_first(ks: &mut Keyspace, keys: &[Vec<u8>]) -> Result<Option<Reply>, Reply> {
    for key in keys {
        if list(ks, key)?.is_some_and(|l| !l.is_empty()) {
            return Ok(pop(ks, key));
        }
    }
    Ok(None)
}

/// Pops the head of the list at `key` as a `BLPOP` reply `[key, element]`, deleting the key
/// when it is left empty; `None` if `key` holds no non-empty list.
pub(crate) fn pop(ks: &mut Keyspace, key: &[u8]) -> Option<Reply> {
    if !matches!(ks.get(key), Some(Entry { data: Data::List(l), .. }) if !l.is_empty()) {
        return None;
    }
    let element = match ks.get_mut(key) {
        Some(Entry {
            data: Data::List(l),
            ..
        }) => l.pop_front(),
        _ => None,
    }?;
    ks.remove_if_empty(key);
    Some(Reply::Array(vec![Reply::bulk(key), Reply::Bulk(element)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::redis::commands::tests::run;

    #[test]
    fn rpush_appends_and_a_pop_empties_the_key_away() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, &["RPUSH", "l", "a", "b"]), Reply::Int(2));
        assert_eq!(run(&mut ks, &["RPUSH", "l", "c"]), Reply::Int(3));
        assert_eq!(run(&mut ks, &["LLEN", "l"]), Reply::Int(3));
        for element in ["a", "b", "c"] {
            assert_eq!(
                pop(&mut ks, b"l"),
                Some(Reply::Array(vec![Reply::bulk("l"), Reply::bulk(element)]))
            );
        }
        assert_eq!(pop(&mut ks, b"l"), None);
        assert_eq!(run(&mut ks, &["EXISTS", "l"]), Reply::Int(0));
    }

    #[test]
    fn the_first_look_of_blpop_stops_at_a_key_of_another_type() {
        let mut ks = Keyspace::default();
        run(&mut ks, &["SET", "s", "v"]);
        run(&mut ks, &["RPUSH", "l", "x"]);
        let keys = |k: &[&str]| k.iter().map(|k| k.as_bytes().to_vec()).collect::<Vec<_>>();
        assert!(pop_first(&mut ks, &keys(&["s", "l"])).is_err());
        assert!(matches!(
            pop_first(&mut ks, &keys(&["l", "s"])),
            Ok(Some(_))
        ));
        assert!(pop_first(&mut ks, &keys(&["none", "s"])).is_err());
        assert_eq!(pop_first(&mut ks, &keys(&["none"])), Ok(None));
        assert!(run(&mut ks, &["LLEN", "s"]).is_error());
    }
}
