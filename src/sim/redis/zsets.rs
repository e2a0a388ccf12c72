//! Sorted sets: the type, and `ZADD` (with `NX`, `XX`, `GT`, `LT`, `CH`, `INCR`), `ZREM`,
//! `ZRANGE` (by rank or `BYSCORE`, `REV`, `LIMIT`, `WITHSCORES`), `ZREMRANGEBYSCORE`,
//! `ZCOUNT`, `ZSCORE` and `ZCARD`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::args::{ScoreBound, int, is, parse_double, parse_score_bound};
use super::keyspace::{Data, Entry, Keyspace, typed, typed_mut};
use super::reply::{NOT_FLOAT, Reply, SYNTAX};

/// A score: never NaN, and 0 for -0 (Redis replies `0` for a member added with `-0`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A sorted set: members ordered by score, then by their bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ZSet {
    scores: BTreeMap<Vec<u8>, f64>,
    order: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    /// How many members.
    pub(crate) fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether it has no member.
    pub(crate) fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// The score of `member`.
    pub(crate) fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Adds `member` or moves it to `score` (never NaN).
    pub(crate) fn insert(&mut self, member: &[u8], score: f64) {
        let score = if score == 0.0 { 0.0 } else { score };
        self.remove(member);
        self.scores.insert(member.to_vec(), score);
        self.order.insert((Score(score), member.to_vec()));
    }

    /// Removes `member`; returns whether it was there.
    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.order.remove(&(Score(score), member.to_vec()));
                true
            }
            None => false,
        }
    }

    /// Members and scores in order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], f64)> {
        self.order.iter().map(|(s, m)| (m.as_slice(), s.0))
    }
}

/// A score range `[min, max]`, either end possibly exclusive.
#[derive(Clone, Copy, Debug)]
struct Range {
    min: ScoreBound,
    max: ScoreBound,
}

impl Range {
    /// Both ends, or Redis's error for a bound that is not a float.
    fn parse(min: &[u8], max: &[u8]) -> Result<Range, Reply> {
        match (parse_score_bound(min), parse_score_bound(max)) {
            (Some(min), Some(max)) => Ok(Range { min, max }),
            _ => Err(Reply::error("ERR min or max is not a float")),
        }
    }

    fn contains(&self, score: f64) -> bool {
        let above = if self.min.exclusive {
            score > self.min.value
        } else {
            score >= self.min.value
        };
        let below = if self.max.exclusive {
            score < self.max.value
        } else {
            score <= self.max.value
        };
        above && below
    }
}

fn zset<'a>(ks: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a ZSet>, Reply> {
    typed(ks, key, |d| match d {
        Data::ZSet(z) => Some(z),
        _ => None,
    })
}

fn zset_mut<'a>(ks: &'a mut Keyspace, key: &[u8]) -> Result<Option<&'a mut ZSet>, Reply> {
    typed_mut(ks, key, |d| match d {
        Data::ZSet(z) => Some(z),
        _ => None,
    })
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`: how many members
/// were added (with `CH`: added or changed); with `INCR`, the new score, or nil when a
/// condition refused it. All scores are checked before anything changes.
pub(crate) fn zadd(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let (mut nx, mut xx, mut ch, mut incr, mut gt, mut lt) =
        (false, false, false, false, false, false);
    let mut first = 2;
    while first < args.len() {
        let opt = &args[first];
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "ch") {
            ch = true;
        } else if is(opt, "incr") {
            incr = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            break;
        }
        first += 1;
    }
    let rest = &args[first..];
    if rest.is_empty() || rest.len() % 2 == 1 {
        return Reply::error(SYNTAX);
    }
    if xx && nx {
        return Reply::error("ERR XX and NX options at the same time are not compatible");
    }
    if (nx && (gt || lt)) || (gt && lt) {
        return Reply::error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if incr && rest.len() > 2 {
        return Reply::error("ERR INCR option supports a single increment-element pair");
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for pair in rest.chunks(2) {
        match parse_double(&pair[0]) {
            Some(score) => pairs.push((score, &pair[1])),
            None => return Reply::error(NOT_FLOAT),
        }
    }
    let set = match zset_mut(ks, key) {
        Err(e) => return e,
        Ok(Some(set)) => set,
        Ok(None) if xx => return if incr { Reply::Nil } else { Reply::Int(0) },
        Ok(None) => {
            ks.insert(key, Entry::new(Data::ZSet(ZSet::default())));
            match zset_mut(ks, key) {
                Ok(Some(set)) => set,
                _ => unreachable!("a sorted set was just stored"),
            }
        }
    };
    let (mut added, mut updated, mut processed) = (0, 0, 0);
    let mut last = 0.0;
    for (score, member) in pairs {
        match set.score(member) {
            Some(current) => {
                if nx {
                    continue;
                }
                let score = if incr { score + current } else { score };
                if score.is_nan() {
                    return Reply::error("ERR resulting score is not a number (NaN)");
                }
                if (lt && score >= current) || (gt && score <= current) {
                    continue;
                }
                processed += 1;
                last = score;
                if score != current {
                    set.insert(member, score);
                    updated += 1;
                }
            }
            None if xx => {}
            None => {
                set.insert(member, score);
                added += 1;
                processed += 1;
                last = score;
            }
        }
    }
    if incr {
        if processed > 0 {
            Reply::double(last)
        } else {
            Reply::Nil
        }
    } else {
        Reply::Int(if ch { added + updated } else { added })
    }
}

/// `ZREM key member [member ...]`: how many were removed.
pub(crate) fn zrem(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let key = &args[1];
    let removed = match zset_mut(ks, key) {
        Err(e) => return e,
        Ok(None) => 0,
        Ok(Some(set)) => args[2..].iter().filter(|m| set.remove(m)).count(),
    };
    ks.remove_if_empty(key);
    Reply::Int(removed as i64)
}

/// `ZCARD key`.
pub(crate) fn zcard(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match zset(ks, &args[1]) {
        Ok(set) => Reply::Int(set.map_or(0, ZSet::len) as i64),
        Err(e) => e,
    }
}

/// `ZSCORE key member`: the score, nil when absent.
pub(crate) fn zscore(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    match zset(ks, &args[1]) {
        Ok(set) => set
            .and_then(|s| s.score(&args[2]))
            .map_or(Reply::Nil, Reply::double),
        Err(e) => e,
    }
}

/// `ZCOUNT key min max`: members with a score in the range.
pub(crate) fn zcount(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let range = match Range::parse(&args[2], &args[3]) {
        Ok(r) => r,
        Err(e) => return e,
    };
    match zset(ks, &args[1]) {
        Ok(set) => {
            let n = set.map_or(0, |s| {
                s.iter().filter(|(_, score)| range.contains(*score)).count()
            });
            Reply::Int(n as i64)
        }
        Err(e) => e,
    }
}

/// `ZREMRANGEBYSCORE key min max`: removes the members in the range; how many.
pub(crate) fn zremrangebyscore(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let range = match Range::parse(&args[2], &args[3]) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let key = &args[1];
    let removed = match zset_mut(ks, key) {
        Err(e) => return e,
        Ok(None) => 0,
        Ok(Some(set)) => {
            let doomed: Vec<Vec<u8>> = set
                .iter()
                .filter(|(_, score)| range.contains(*score))
                .map(|(m, _)| m.to_vec())
                .collect();
            for member in &doomed {
                set.remove(member);
            }
            doomed.len()
        }
    };
    ks.remove_if_empty(key);
    Reply::Int(removed as i64)
}

/// `ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES]`: by rank
/// (negative ranks count from the end) or by score; `BYLEX` is not modelled (an `ERR sim`
/// error says so).
pub(crate) fn zrange(ks: &mut Keyspace, args: &[Vec<u8>]) -> Reply {
    let (mut withscores, mut rev, mut byscore, mut bylex) = (false, false, false, false);
    let mut limit: Option<(i64, i64)> = None;
    let mut j = 4;
    while j < args.len() {
        let opt = &args[j];
        let left = args.len() - j - 1;
        if is(opt, "withscores") {
            withscores = true;
        } else if is(opt, "limit") && left >= 2 {
            match (int(&args[j + 1]), int(&args[j + 2])) {
                (Ok(offset), Ok(count)) => limit = Some((offset, count)),
                (Err(e), _) | (_, Err(e)) => return e,
            }
            j += 2;
        } else if !rev && is(opt, "rev") {
            rev = true;
        } else if !byscore && !bylex && is(opt, "bylex") {
            bylex = true;
        } else if !byscore && !bylex && is(opt, "byscore") {
            byscore = true;
        } else {
            return Reply::error(SYNTAX);
        }
        j += 1;
    }
    let by_rank = !byscore && !bylex;
    if limit.is_some_and(|(_, count)| count != -1) && by_rank {
        return Reply::error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    if withscores && bylex {
        return Reply::error(
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
        );
    }
    if bylex {
        return Reply::error("ERR sim: ZRANGE BYLEX is not modelled");
    }
    let (lo, hi) = if rev && byscore {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    let members: Vec<(Vec<u8>, f64)> = if by_rank {
        let (Ok(start), Ok(stop)) = (int(lo), int(hi)) else {
            return Reply::error(super::reply::NOT_INTEGER);
        };
        let set = match zset(ks, &args[1]) {
            Ok(Some(set)) => set,
            Ok(None) => return Reply::Array(vec![]),
            Err(e) => return e,
        };
        let len = set.len() as i64;
        let start = if start < 0 {
            (len + start).max(0)
        } else {
            start
        };
        let stop = if stop < 0 {
            len + stop
        } else {
            stop.min(len - 1)
        };
        if start > stop || start >= len {
            return Reply::Array(vec![]);
        }
        let ordered: Box<dyn Iterator<Item = (&[u8], f64)>> = if rev {
            Box::new(set.iter().rev())
        } else {
            Box::new(set.iter())
        };
        ordered
            .skip(start as usize)
            .take((stop - start + 1) as usize)
            .map(|(m, s)| (m.to_vec(), s))
            .collect()
    } else {
        let range = match Range::parse(lo, hi) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let set = match zset(ks, &args[1]) {
            Ok(Some(set)) => set,
            Ok(None) => return Reply::Array(vec![]),
            Err(e) => return e,
        };
        let (offset, count) = limit.unwrap_or((0, -1));
        if offset < 0 {
            return Reply::Array(vec![]);
        }
        let ordered: Box<dyn Iterator<Item = (&[u8], f64)>> = if rev {
            Box::new(set.iter().rev())
        } else {
            Box::new(set.iter())
        };
        let matching = ordered
            .filter(|(_, s)| range.contains(*s))
            .skip(offset as usize);
        let matching: Box<dyn Iterator<Item = (&[u8], f64)>> = if count < 0 {
            Box::new(matching)
        } else {
            Box::new(matching.take(count as usize))
        };
        matching.map(|(m, s)| (m.to_vec(), s)).collect()
    };
    let mut reply = Vec::with_capacity(members.len() * 2);
    for (member, score) in members {
        reply.push(Reply::Bulk(member));
        if withscores {
            reply.push(Reply::double(score));
        }
    }
    Reply::Array(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::redis::commands::tests::run;

    fn bulks(items: &[&str]) -> Reply {
        Reply::Array(items.iter().map(|s| Reply::bulk(*s)).collect())
    }

    #[test]
    fn zadd_conditions_and_incr_behave_as_in_redis() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, &["ZADD", "z", "XX", "1", "a"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["EXISTS", "z"]), Reply::Int(0));
        assert_eq!(
            run(&mut ks, &["ZADD", "z", "1", "a", "2", "b"]),
            Reply::Int(2)
        );
        assert_eq!(
            run(&mut ks, &["ZADD", "z", "CH", "3", "a", "3", "c"]),
            Reply::Int(2)
        );
        assert_eq!(run(&mut ks, &["ZADD", "z", "NX", "9", "a"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["ZADD", "z", "GT", "1", "a"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["ZSCORE", "z", "a"]), Reply::bulk("3"));
        assert_eq!(
            run(&mut ks, &["ZADD", "z", "LT", "INCR", "-1", "a"]),
            Reply::bulk("2")
        );
        assert_eq!(
            run(&mut ks, &["ZADD", "z", "NX", "INCR", "1", "a"]),
            Reply::Nil
        );
        assert_eq!(run(&mut ks, &["ZADD", "z", "0.1", "d"]), Reply::Int(1));
        assert_eq!(
            run(&mut ks, &["ZSCORE", "z", "d"]),
            Reply::bulk("0.10000000000000001")
        );
        assert_eq!(
            run(&mut ks, &["ZADD", "z", "INCR", "inf", "a"]),
            Reply::bulk("inf")
        );
        assert!(run(&mut ks, &["ZADD", "z", "INCR", "-inf", "a"]).is_error());
        assert!(run(&mut ks, &["ZADD", "z", "1", "a", "2"]).is_error());
        assert!(run(&mut ks, &["ZADD", "z", "x", "a"]).is_error());
        assert!(run(&mut ks, &["ZADD", "z", "NX", "XX", "1", "a"]).is_error());
        assert!(run(&mut ks, &["ZADD", "z", "INCR", "1", "a", "1", "b"]).is_error());
        assert_eq!(run(&mut ks, &["ZADD", "z", "-0", "zero"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["ZSCORE", "z", "zero"]), Reply::bulk("0"));
    }

    #[test]
    fn zrange_by_rank_and_score() {
        let mut ks = Keyspace::default();
        run(
            &mut ks,
            &["ZADD", "z", "1", "a", "2", "b", "3", "c", "3", "bb"],
        );
        assert_eq!(
            run(&mut ks, &["ZRANGE", "z", "0", "-1"]),
            bulks(&["a", "b", "bb", "c"])
        );
        assert_eq!(
            run(&mut ks, &["ZRANGE", "z", "-1", "-1", "WITHSCORES"]),
            bulks(&["c", "3"])
        );
        assert_eq!(
            run(&mut ks, &["ZRANGE", "z", "0", "1", "REV"]),
            bulks(&["c", "bb"])
        );
        assert_eq!(run(&mut ks, &["ZRANGE", "z", "5", "1"]), bulks(&[]));
        assert_eq!(
            run(&mut ks, &["ZRANGE", "z", "-100", "100"]).clone(),
            run(&mut ks, &["ZRANGE", "z", "0", "-1"])
        );
        assert_eq!(
            run(
                &mut ks,
                &["ZRANGE", "z", "(1", "3", "BYSCORE", "LIMIT", "1", "1"]
            ),
            bulks(&["bb"])
        );
        assert_eq!(
            run(&mut ks, &["ZRANGE", "z", "3", "2", "BYSCORE", "REV"]),
            bulks(&["c", "bb", "b"])
        );
        assert!(run(&mut ks, &["ZRANGE", "z", "0", "1", "LIMIT", "0", "1"]).is_error());
        assert!(run(&mut ks, &["ZRANGE", "z", "0", "-1", "WITHSCORES", "x"]).is_error());
        assert_eq!(run(&mut ks, &["ZRANGE", "none", "0", "-1"]), bulks(&[]));
    }

    #[test]
    fn counts_and_removals_by_score_empty_the_key_away() {
        let mut ks = Keyspace::default();
        run(&mut ks, &["ZADD", "z", "1", "a", "2", "b", "3", "c"]);
        assert_eq!(
            run(&mut ks, &["ZCOUNT", "z", "-inf", "+inf"]),
            Reply::Int(3)
        );
        assert_eq!(run(&mut ks, &["ZCOUNT", "z", "(1", "3"]), Reply::Int(2));
        assert!(run(&mut ks, &["ZCOUNT", "z", "x", "3"]).is_error());
        assert_eq!(
            run(&mut ks, &["ZREMRANGEBYSCORE", "z", "-inf", "2"]),
            Reply::Int(2)
        );
        assert_eq!(run(&mut ks, &["ZCARD", "z"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["ZREM", "z", "c", "nope"]), Reply::Int(1));
        assert_eq!(run(&mut ks, &["EXISTS", "z"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["ZCARD", "z"]), Reply::Int(0));
        assert_eq!(run(&mut ks, &["ZSCORE", "z", "c"]), Reply::Nil);
    }
}
