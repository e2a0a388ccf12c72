//! How the model's replies are compared with the real server's: exactly, or, for values
//! that embed a clock, within [`TOLERANCE_MS`](super::TOLERANCE_MS).

use redis::Value;

use super::TOLERANCE_MS;

/// How two replies are compared.
#[derive(Clone, Copy, Debug)]
pub(super) enum Rule {
    /// Equal.
    Exact,
    /// An integer that is a duration (`PTTL`): within the tolerance (-1 and -2 exact).
    Duration,
    /// `TIME`: within the tolerance.
    Time,
    /// A lock script's reply: an array's first element exact, its other integers within
    /// the tolerance, its strings as [`Rule::Text`]; anything else exact.
    Script,
    /// Strings equal, or both a timestamp (ms or µs, possibly followed by ` rest`) within
    /// the tolerance and the rest equal; arrays element by element.
    Text,
    /// Field/value or member/score pairs in any order (large hashes and timestamp ties
    /// order differently), values as [`Rule::Text`].
    Pairs,
    /// Members in any order (timestamp ties order differently).
    Members,
}

/// The number a string starts with (digits), if it is followed by nothing or a space.
pub(super) fn leading_number(s: &[u8]) -> Option<i64> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (digits < s.len() && s[digits] != b' ') {
        return None;
    }
    std::str::from_utf8(&s[..digits]).ok()?.parse().ok()
}

/// Whether two clock-derived integers agree: equal, or both non-negative and within the
/// tolerance (in µs for µs timestamps).
fn close(a: i64, b: i64) -> bool {
    let tolerance = if a.max(b) > 100_000_000_000_000 {
        TOLERANCE_MS * 1000
    } else {
        TOLERANCE_MS
    };
    a == b || (a >= 0 && b >= 0 && (a - b).abs() <= tolerance)
}

/// A lock handed over on a waiter's own wake list: `g<fencing token>:<lease ms>`, both
/// read from the clock.
fn grant(s: &[u8]) -> Option<(i64, i64)> {
    let (fence, lease) = std::str::from_utf8(s.strip_prefix(b"g")?)
        .ok()?
        .split_once(':')?;
    Some((fence.parse().ok()?, lease.parse().ok()?))
}

/// Strings equal, or timestamps (ms or µs, with an optional ` rest`) within tolerance, or
/// grants whose fencing token and lease are.
fn same_text(model: &Value, real: &Value) -> bool {
    match (model, real) {
        (Value::BulkString(m), Value::BulkString(r)) => {
            if m == r {
                return true;
            }
            if let (Some((f1, l1)), Some((f2, l2))) = (grant(m), grant(r)) {
                return close(f1, f2) && close(l1, l2);
            }
            // A duration zero-padded to 11 characters (a busy reply to an attempt that leads
            // a block).
            let padded = |s: &[u8]| -> Option<i64> {
                (s.len() == 11).then_some(())?;
                std::str::from_utf8(s).ok()?.parse().ok()
            };
            if let (Some(a), Some(b)) = (padded(m), padded(r)) {
                return close(a, b);
            }
            match (leading_number(m), leading_number(r)) {
                (Some(a), Some(b)) if a > 100_000_000_000 && b > 100_000_000_000 => {
                    let rest = |s: &[u8]| {
                        s.iter()
                            .skip_while(|b| b.is_ascii_digit())
                            .copied()
                            .collect::<Vec<u8>>()
                    };
                    close(a, b) && rest(m) == rest(r)
                }
                _ => false,
            }
        }
        (Value::Array(m), Value::Array(r)) => {
            m.len() == r.len() && m.iter().zip(r).all(|(m, r)| same_text(m, r))
        }
        _ => model == real,
    }
}

pub(super) fn same(rule: Rule, model: &Value, real: &Value) -> bool {
    match rule {
        Rule::Exact => model == real,
        Rule::Duration => match (model, real) {
            (Value::Int(a), Value::Int(b)) => close(*a, *b),
            _ => model == real,
        },
        Rule::Time => {
            let micros = |v: &Value| -> Option<i64> {
                let Value::Array(parts) = v else { return None };
                let [Value::BulkString(s), Value::BulkString(us)] = parts.as_slice() else {
                    return None;
                };
                let s: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
                let us: i64 = std::str::from_utf8(us).ok()?.parse().ok()?;
                Some(s * 1_000_000 + us)
            };
            match (micros(model), micros(real)) {
                (Some(a), Some(b)) => close(a, b),
                _ => model == real,
            }
        }
        Rule::Script => match (model, real) {
            (Value::Array(m), Value::Array(r)) if m.len() == r.len() && !m.is_empty() => {
                m[0] == r[0]
                    && m[1..].iter().zip(&r[1..]).all(|pair| match pair {
                        (Value::Int(a), Value::Int(b)) => close(*a, *b),
                        (m, r) => same_text(m, r),
                    })
            }
            _ => model == real,
        },
        Rule::Text => same_text(model, real),
        Rule::Members => match (model, real) {
            (Value::Array(m), Value::Array(r)) => {
                let sorted = |items: &[Value]| {
                    let mut items: Vec<String> = items.iter().map(|v| format!("{v:?}")).collect();
                    items.sort();
                    items
                };
                sorted(m) == sorted(r)
            }
            _ => model == real,
        },
        Rule::Pairs => match (model, real) {
            (Value::Array(m), Value::Array(r)) if m.len() == r.len() => {
                let sorted = |items: &[Value]| {
                    let mut pairs: Vec<Vec<Value>> =
                        items.chunks(2).map(<[Value]>::to_vec).collect();
                    pairs.sort_by_key(|p| format!("{:?}", p[0]));
                    pairs
                };
                let (m, r) = (sorted(m), sorted(r));
                m.iter().zip(&r).all(|(m, r)| {
                    m[0] == r[0] && m.iter().zip(r).skip(1).all(|(m, r)| same_text(m, r))
                })
            }
            _ => model == real,
        },
    }
}
