//! Hashes: the type, and `HSET`, `HGET`, `HMGET`, `HGETALL`, `HDEL`, `HLEN` and `HEXISTS`.

use super::keyspace::{Data, Entry, Keyspace, typed, typed_mut};
use super::reply::Reply;

/// A hash, its fields in insertion order (the order of a small Redis hash, a listpack; a
/// large one's order follows its hash table and is not modelled).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Hash {
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Hash {
    /// Whether it has no field.
    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// How many fields.
    pub(crate) fn len(&self) -> usize {
        self.fields.len()
    }

    /// The value of `field`.
    pub(crate) fn get(&self, field: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(f, _)| f == field)
            .map(|(_, v)| v.as_slice())
    }

    /// Sets `field` (in place when it exists); returns whether it is new.
    pub(crate) fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        match self.fields.iter_mut().find(|(f, _)| f == field) {
            Some((_, v)) => {
                *v = value.to_vec();
                false
            }
            None => {
                self.fields.push((field.to_vec(), value.to_vec()));
                true
            }
        }
    }

    /// Removes `field`; returns whether it was there.
    pub(crate) fn remove(&mut self, field: &[u8]) -> bool {
        let before = self.fields.len();
        self.fields.retain(|(f, _)| f != field);
        self.fields.len() < before
    }

    /// Fields and values in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|(f, v)| (f.as_slice(), v.as_slice()))
    }
}

fn hash<'a>(ks: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a Hash>, Reply> {
    typed(ks, key, |d| match d {
        Data::Hash(h) => Some(h),
        _ => None,
    })
}

/// `HSET key field value [field value ...]`: how many fields are new.
pub(crate) fn hset(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    if args.len() % 2 == 1 {
        return Reply::arity("hset");
    }
    let key = &args[1];
    let existing = typed_mut(ks, key, |d| match d {
        Data::Hash(h) => Some(h),
        _ => None,
    });
    let set = |h: &mut Hash| args[2..].chunks(2).filter(|p| h.set(&p[0], &p[1])).count();
    match existing {
        Err(e) => e,
        Ok(Some(h)) => Reply::Int(set(h) as i64),
        Ok(None) => {
            let mut h = Hash::default();
            let created = set(&mut h);
            ks.insert(key, Entry::new(Data::Hash(h)));
            Reply::Int(created as i64)
        }
    }
}

/// `HGET key field`: the value, nil when absent.
pub(crate) fn hget(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match hash(ks, &args[1]) {
        Ok(h) => h
            .and_then(|h| h.get(&args[2]))
            .map_or(Reply::Nil, Reply::bulk),
        Err(e) => e,
    }
}

/// `HMGET key field [field ...]`: one value or nil per field.
pub(crate) fn hmget(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match hash(ks, &args[1]) {
        Ok(h) => Reply::Array(
            args[2..]
                .iter()
                .map(|f| h.and_then(|h| h.get(f)).map_or(Reply::Nil, Reply::bulk))
                .collect(),
        ),
        Err(e) => e,
    }
}

/// `HGETALL key`: fields and values, flat.
pub(crate) fn hgetall(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match hash(ks, &args[1]) {
        Ok(h) => Reply::Array(
            h.into_iter()
                .flat_map(Hash::iter)
                .flat_map(|(f, v)| [Reply::bulk(f), Reply::bulk(v)])
                .collect(),
        ),
        Err(e) => e,
    }
}

/// `HDEL key field [field ...]`: how many were removed (the key goes with its last field).
pub(crate) fn hdel(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let removed = match typed_mut(ks, key, |d| match d {
        Data::Hash(h) => Some(h),
        _ => None,
    }) {
        Err(e) => return e,
        Ok(None) => 0,
        Ok(Some(h)) => args[2..].iter().filter(|f| h.remove(f)).count(),
    };
    ks.remove_if_empty(key);
    Reply::Int(removed as i64)
}

/// `HLEN key`.
pub(crate) fn hlen(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match hash(ks, &args[1]) {
        Ok(h) => Reply::Int(h.map_or(0, Hash::len) as i64),
        Err(e) => e,
    }
}

/// `HEXISTS key field`: 1 or 0.
pub(crate) fn hexists(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match hash(ks, &args[1]) {
        Ok(h) => Reply::Int(i64::from(h.and_then(|h| h.get(&args[2])).is_some())),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::redis::commands::tests::run;

    #[test]
    fn hash_fields_keep_their_insertion_order() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, &["HSET", "h", "a", "1", "b", "2"]),
            Reply::Int(2)
        );
        assert_eq!(
            run(&mut ks, &["HSET", "h", "a", "3", "c", "4"]),
            Reply::Int(1)
        );
        assert_eq!(
            run(&mut ks, &["HGETALL", "h"]),
            Reply::Array(["a", "3", "b", "2", "c", "4"].map(Reply::bulk).to_vec())
        );
        assert_eq!(
            run(&mut ks, &["HMGET", "h", "a", "x"]),
            Reply::Array(vec![Reply::bulk("3"), Reply::Nil])
        );
        assert_eq!(run(&mut ks, &["HEXISTS", "h", "b"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["HDEL", "h", "a", "x"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["HLEN", "h"]), Reply::Int(2));
        assert_eq!(run(&mut ks, &["HDEL", "h", "b", "c"]), Reply::Int(2));
        assert_eq!(run(&mut ks, &["EXISTS", "h"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["HGET", "h", "a"]), Reply::Nil);
        assert_eq!(run(&mut ks, &["HGETALL", "h"]), Reply::Array(vec![]));
        assert_eq!(run(&mut ks, &["HSET", "h", "a"]), Reply::arity("hset"));
        run(&mut ks, &["SET", "s", "v"]);
        assert!(run(&mut ks, &["HGET", "s", "a"]).is_error());
    }
}
