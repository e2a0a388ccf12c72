//! Arguments read the way Redis 7.0 reads them: strict integers (`string2ll`), doubles
//! (`strtod` with Redis's checks), score range bounds, blocking timeouts, and option names
//! compared without case.

use super::reply::Reply;

/// Whether `arg` is the option `name`, ignoring ASCII case.
pub(crate) fn is(arg: &[u8], name: &str) -> bool {
    arg.eq_ignore_ascii_case(name.as_bytes())
}

/// A 64-bit integer as `string2ll` accepts it: an optional `-`, no `+`, no leading zeros,
/// no spaces, at most 20 characters, in range.
pub(crate) fn parse_int(arg: &[u8]) -> Option<i64> {
    if arg.is_empty() || arg.len() >= 21 {
        return None;
    }
    if arg == b"0" {
        return Some(0);
    }
    let (negative, digits) = match arg.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, arg),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut value: i128 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value * 10 + i128::from(d - b'0');
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// An integer argument, or Redis's "not an integer" error.
pub(crate) fn int(arg: &[u8]) -> Result<i64, Reply> {
    parse_int(arg).ok_or_else(|| Reply::error(super::reply::NOT_INTEGER))
}

/// What `strtod` makes of the start of a string.
struct Strtod {
    value: f64,
    /// Bytes consumed (0 when no number was found, even after leading spaces).
    len: usize,
    /// The literal was finite but its value is too large for a double (`ERANGE`).
    overflow: bool,
    /// The literal had a nonzero digit but its value rounds to zero (`ERANGE`).
    underflow: bool,
}

/// C's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

fn starts_with_ignore_case(s: &[u8], prefix: &str) -> bool {
    s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// C's `strtod` (glibc): leading spaces, a sign, then `inf`/`infinity`/`nan`, a hex float
/// (`0x1.8p3`) or a decimal one; the longest prefix that forms a number.
fn strtod(s: &[u8]) -> Strtod {
    let none = Strtod {
        value: 0.0,
        len: 0,
        overflow: false,
        underflow: false,
    };
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let negative = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = if negative { -1.0 } else { 1.0 };
    let rest = &s[i..];
    let special = |value: f64, len: usize| Strtod {
        value,
        len: i + len,
        overflow: false,
        underflow: false,
    };
    if starts_with_ignore_case(rest, "infinity") {
        return special(sign * f64::INFINITY, 8);
    }
    if starts_with_ignore_case(rest, "inf") {
        return special(sign * f64::INFINITY, 3);
    }
    if starts_with_ignore_case(rest, "nan") {
        let mut len = 3;
        if rest.get(3) == Some(&b'(') {
            if let Some(close) = rest[4..].iter().position(|&b| b == b')') {
                if rest[4..4 + close]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
                {
                    len = 4 + close + 1;
                }
            }
        }
        return special(f64::NAN, len);
    }
    if starts_with_ignore_case(rest, "0x") && hex_digits_follow(&rest[2..]) {
        let (value, len) = hex_float(&rest[2..]);
        let value = sign * value;
        return Strtod {
            value,
            len: i + 2 + len,
            overflow: value.is_infinite(),
            underflow: false,
        };
    }
    // Decimal: digits, an optional fraction, at least one digit, an optional exponent.
    let mut j = 0;
    let mut digits = 0;
    let mut nonzero = false;
    while j < rest.len() && rest[j].is_ascii_digit() {
        nonzero |= rest[j] != b'0';
        digits += 1;
        j += 1;
    }
    if rest.get(j) == Some(&b'.') {
        let mut k = j + 1;
        let mut fraction = 0;
        while k < rest.len() && rest[k].is_ascii_digit() {
            nonzero |= rest[k] != b'0';
            fraction += 1;
            k += 1;
        }
        if digits + fraction > 0 {
            digits += fraction;
            j = k;
        }
    }
    if digits == 0 {
        return none;
    }
    if matches!(rest.get(j), Some(b'e' | b'E')) {
        let mut k = j + 1;
        if matches!(rest.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        let start = k;
        while k < rest.len() && rest[k].is_ascii_digit() {
            k += 1;
        }
        if k > start {
            j = k;
        }
    }
    let text = std::str::from_utf8(&rest[..j]).expect("digits, dots, signs and e are ASCII");
    // Rust rounds decimal literals exactly as glibc does (correctly rounded), and reads
    // "5." and ".5" too; a digit-only text without a digit before the dot is handled too.
    let magnitude: f64 = text.parse().unwrap_or(0.0);
    Strtod {
        value: sign * magnitude,
        len: i + j,
        overflow: magnitude.is_infinite(),
        underflow: magnitude == 0.0 && nonzero,
    }
}

/// Whether a hex mantissa starts here (`1`, `.8`).
fn hex_digits_follow(s: &[u8]) -> bool {
    match s.first() {
        Some(b) if b.is_ascii_hexdigit() => true,
        Some(b'.') => s.get(1).is_some_and(u8::is_ascii_hexdigit),
        _ => false,
    }
}

/// A hex float after its `0x`: hex digits, an optional fraction, an optional binary
/// exponent `p[+-]n`. Returns the value and the bytes consumed.
fn hex_float(s: &[u8]) -> (f64, usize) {
    let mut mantissa = 0.0f64;
    let mut exponent: i32 = 0;
    let mut j = 0;
    while j < s.len() && s[j].is_ascii_hexdigit() {
        mantissa = mantissa * 16.0 + f64::from(hex_value(s[j]));
        j += 1;
    }
    if s.get(j) == Some(&b'.') {
        j += 1;
        while j < s.len() && s[j].is_ascii_hexdigit() {
            mantissa = mantissa * 16.0 + f64::from(hex_value(s[j]));
            exponent -= 4;
            j += 1;
        }
    }
    if matches!(s.get(j), Some(b'p' | b'P')) {
        let mut k = j + 1;
        let negative = match s.get(k) {
            Some(b'-') => {
                k += 1;
                true
            }
            Some(b'+') => {
                k += 1;
                false
            }
            _ => false,
        };
        let start = k;
        let mut value: i32 = 0;
        while k < s.len() && s[k].is_ascii_digit() {
            value = value
                .saturating_mul(10)
                .saturating_add(i32::from(s[k] - b'0'));
            k += 1;
        }
        if k > start {
            exponent = exponent.saturating_add(if negative { -value } else { value });
            j = k;
        }
    }
    (mantissa * 2f64.powi(exponent), j)
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// A double as `getDoubleFromObject` accepts it (scores): the whole string is one number
/// without leading spaces, neither out of range nor NaN (`inf` is fine).
pub(crate) fn parse_double(arg: &[u8]) -> Option<f64> {
    let parsed = strtod(arg);
    let valid = !arg.is_empty()
        && !is_c_space(arg[0])
        && parsed.len == arg.len()
        && !parsed.overflow
        && !parsed.underflow
        && !parsed.value.is_nan();
    valid.then_some(parsed.value)
}

/// One end of a score range (`ZCOUNT`, `ZREMRANGEBYSCORE`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScoreBound {
    /// The score.
    pub value: f64,
    /// `(score`: the score itself is outside the range.
    pub exclusive: bool,
}

/// A range bound as `zslParseRange` reads it: an optional `(`, then whatever `strtod` reads
/// if it reaches the end of the string (so `""` is 0, `" 1"` is 1 and `1e400` is `inf`);
/// NaN is refused.
pub(crate) fn parse_score_bound(arg: &[u8]) -> Option<ScoreBound> {
    let (exclusive, text) = match arg.split_first() {
        Some((b'(', rest)) => (true, rest),
        _ => (false, arg),
    };
    let parsed = strtod(text);
    let rest_empty = parsed.len == text.len() || text[parsed.len] == 0;
    (rest_empty && !parsed.value.is_nan()).then_some(ScoreBound {
        value: parsed.value,
        exclusive,
    })
}

/// A blocking timeout in seconds (`BLPOP`), as milliseconds: 0 means forever.
///
/// Redis reads it as a long double, multiplies by 1000 and rounds up; a value beyond the
/// 64-bit range wraps to a negative one ("timeout is negative"), as on x86.
pub(crate) fn timeout_secs(arg: &[u8]) -> Result<i64, Reply> {
    let not_float = || Reply::error("ERR timeout is not a float or out of range");
    let parsed = strtod(arg);
    if arg.is_empty()
        || arg.len() >= 5 * 1024
        || is_c_space(arg[0])
        || parsed.len != arg.len()
        || parsed.value.is_nan()
    {
        return Err(not_float());
    }
    // A long double holds what overflows or underflows a double: an overflow is a huge
    // timeout, an underflow a tiny one.
    let ms = if parsed.overflow {
        f64::INFINITY
    } else if parsed.underflow {
        if parsed.value.is_sign_negative() {
            -0.0
        } else {
            f64::MIN_POSITIVE
        }
    } else {
        (parsed.value * 1000.0).ceil()
    };
    let ms = if ms.is_finite() && ms > -9.223_372_036_854_776e18 && ms < 9.223_372_036_854_776e18 {
        ms as i64
    } else {
        i64::MIN
    };
    check_timeout(ms)
}

/// A timeout in milliseconds (`WAIT`): 0 means forever.
pub(crate) fn timeout_ms(arg: &[u8]) -> Result<i64, Reply> {
    let ms = parse_int(arg)
        .ok_or_else(|| Reply::error("ERR timeout is not an integer or out of range"))?;
    check_timeout(ms)
}

fn check_timeout(ms: i64) -> Result<i64, Reply> {
    if ms < 0 {
        return Err(Reply::error("ERR timeout is negative"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_read_strictly() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_int(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn scores_are_read_like_strtod_with_redis_checks() {
        assert_eq!(parse_double(b"1.5"), Some(1.5));
        assert_eq!(parse_double(b".5"), Some(0.5));
        assert_eq!(parse_double(b"5."), Some(5.0));
        assert_eq!(parse_double(b"+5"), Some(5.0));
        assert_eq!(parse_double(b"1E+5"), Some(100000.0));
        assert_eq!(parse_double(b"0x1p3"), Some(8.0));
        assert_eq!(parse_double(b"0x10"), Some(16.0));
        assert_eq!(parse_double(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_double(b"Infinity"), Some(f64::INFINITY));
        assert!(parse_double(b"1e-310").is_some_and(|v| v > 0.0));
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"nan",
            b"1e400",
            b"1e-400",
            b"x",
            b"1e",
        ] {
            assert_eq!(
                parse_double(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn range_bounds_are_read_like_zsl_parse_range() {
        let bound = |s: &[u8]| parse_score_bound(s).map(|b| (b.value, b.exclusive));
        assert_eq!(bound(b""), Some((0.0, false)));
        assert_eq!(bound(b"("), Some((0.0, true)));
        assert_eq!(bound(b" 1"), Some((1.0, false)));
        assert_eq!(bound(b"(2"), Some((2.0, true)));
        assert_eq!(bound(b"1e400"), Some((f64::INFINITY, false)));
        assert_eq!(bound(b"1 "), None);
        assert_eq!(bound(b"nan"), None);
        assert_eq!(bound(b"x"), None);
    }

    #[test]
    fn timeouts_are_read_like_redis() {
        assert_eq!(timeout_secs(b"0"), Ok(0));
        assert_eq!(timeout_secs(b"-0"), Ok(0));
        assert_eq!(timeout_secs(b"0.0005"), Ok(1));
        assert_eq!(timeout_secs(b"1.5"), Ok(1500));
        assert_eq!(timeout_secs(b"0x1"), Ok(1000));
        assert_eq!(timeout_secs(b"1e-10"), Ok(1));
        let err = |r: Result<i64, Reply>| match r {
            Err(Reply::Error(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(err(timeout_secs(b"-1")), "ERR timeout is negative");
        assert_eq!(err(timeout_secs(b"inf")), "ERR timeout is negative");
        assert_eq!(err(timeout_secs(b"1e400")), "ERR timeout is negative");
        assert_eq!(
            err(timeout_secs(b" 1")),
            "ERR timeout is not a float or out of range"
        );
        assert_eq!(
            err(timeout_secs(b"")),
            "ERR timeout is not a float or out of range"
        );
        assert_eq!(
            err(timeout_secs(b"nan")),
            "ERR timeout is not a float or out of range"
        );
        assert_eq!(timeout_ms(b"10"), Ok(10));
        assert_eq!(
            err(timeout_ms(b"1e3")),
            "ERR timeout is not an integer or out of range"
        );
        assert_eq!(err(timeout_ms(b"-1")), "ERR timeout is negative");
    }
}
