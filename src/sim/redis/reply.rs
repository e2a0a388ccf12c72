//! Replies as a Redis 7.0 server sends them over RESP2, the error texts it uses, and the
//! way it formats doubles.

use redis::Value;

/// One reply, before it becomes a [`redis::Value`] (Lua sees this form too).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reply {
    /// `+text`: a status (`OK`, `PONG`).
    Status(String),
    /// `-CODE message`: an error; the text holds the code and the message, without `-`.
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$n ...`: a bulk string.
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`: the null bulk string or null array (one value in the redis crate).
    Nil,
    /// `*n ...`.
    Array(Vec<Reply>),
}

/// The error of a command used against a key of another type.
pub(crate) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
/// A malformed option list.
pub(crate) const SYNTAX: &str = "ERR syntax error";
/// An argument that must be a 64-bit integer and is not.
pub(crate) const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
/// A score that is not a valid double.
pub(crate) const NOT_FLOAT: &str = "ERR value is not a valid float";
/// A command that adds data, refused under `maxmemory` with the `noeviction` policy.
pub(crate) const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
/// A write sent to a read-only replica.
pub(crate) const READONLY: &str = "READONLY You can't write against a read only replica.";
/// `EVALSHA` of a script the server does not have.
pub(crate) const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

impl Reply {
    /// `+OK`.
    pub(crate) fn ok() -> Reply {
        Reply::Status("OK".to_owned())
    }

    /// An error reply; `text` starts with the error code (`ERR`, `WRONGTYPE`, ...).
    pub(crate) fn error(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    /// `ERR wrong number of arguments for '<name>' command`, `name` as Redis spells it
    /// (lower case, `container|sub` for a subcommand).
    pub(crate) fn arity(name: &str) -> Reply {
        Reply::Error(format!(
            "ERR wrong number of arguments for '{name}' command"
        ))
    }

    /// A bulk string.
    pub(crate) fn bulk(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(bytes.into())
    }

    /// A double as a RESP2 bulk string, formatted as Redis formats it.
    pub(crate) fn double(value: f64) -> Reply {
        Reply::Bulk(format_double(value).into_bytes())
    }

    /// Whether this is an error reply.
    pub(crate) fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The reply as the redis crate's parser would have read it off the wire: `+OK` is
    /// [`Value::Okay`], other statuses [`Value::SimpleString`], both nulls [`Value::Nil`],
    /// errors [`Value::ServerError`].
    pub(crate) fn into_value(self) -> Value {
        match self {
            Reply::Status(s) if s == "OK" => Value::Okay,
            Reply::Status(s) => Value::SimpleString(s),
            Reply::Error(text) => error_value(&text),
            Reply::Int(n) => Value::Int(n),
            Reply::Bulk(b) => Value::BulkString(b),
            Reply::Nil => Value::Nil,
            Reply::Array(items) => Value::Array(items.into_iter().map(Reply::into_value).collect()),
        }
    }
}

/// A [`Value::ServerError`] for `text`, built by the redis crate's own parser (its error
/// type has no public constructor). Newlines become spaces, as Redis sends them.
fn error_value(text: &str) -> Value {
    let line: String = text
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
        .expect("an error line always parses")
}

/// A double as Redis 7.0 formats it in replies and in script arguments: C's `%.17g`, with
/// `inf`, `-inf` and `nan`.
pub(crate) fn format_double(value: f64) -> String {
    format_g(value, 17)
}

/// C's `printf("%.<precision>g", value)` (glibc's spelling of infinities and NaN).
pub(crate) fn format_g(value: f64, precision: usize) -> String {
    if value.is_nan() {
        return if value.is_sign_negative() {
            "-nan"
        } else {
            "nan"
        }
        .to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    let precision = precision.max(1);
    // The exponent %g decides on is the one of the %e form at this precision (after
    // rounding), so take it from there.
    let scientific = format!("{:.*e}", precision - 1, value);
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("Rust's {:e} always writes an exponent");
    let exponent: i32 = exponent.parse().expect("Rust's exponent is an integer");
    if exponent < -4 || exponent >= precision as i32 {
        let mantissa = strip_fraction_zeros(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        let decimals = (precision as i32 - 1 - exponent) as usize;
        strip_fraction_zeros(&format!("{value:.decimals$}")).to_owned()
    }
}

/// `1.500` → `1.5`, `2.000` → `2`; a number without a fraction is left alone.
fn strip_fraction_zeros(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_are_formatted_like_printf_17g() {
        assert_eq!(format_double(1.5), "1.5");
        assert_eq!(format_double(0.1), "0.10000000000000001");
        assert_eq!(format_double(1e20), "1e+20");
        assert_eq!(format_double(1700000000123.0), "1700000000123");
        assert_eq!(
            format_double(12345678901234567890.0),
            "1.2345678901234567e+19"
        );
        assert_eq!(format_double(100000.0), "100000");
        assert_eq!(format_double(f64::INFINITY), "inf");
        assert_eq!(format_double(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_double(-0.0), "-0");
        assert_eq!(format_double(1e-5), "1.0000000000000001e-05");
        assert_eq!(format_double(0.0001), "0.0001");
        assert_eq!(format_g(1700000000123.0, 14), "1700000000123");
        assert_eq!(format_g(123456789012345678.0, 14), "1.2345678901235e+17");
        assert_eq!(format_g(2.0f64.powi(53) + 1.0, 17), "9007199254740992");
    }

    #[test]
    fn replies_become_the_values_the_redis_crate_parses() {
        assert_eq!(Reply::ok().into_value(), Value::Okay);
        assert_eq!(
            Reply::Status("PONG".into()).into_value(),
            Value::SimpleString("PONG".into())
        );
        let Value::ServerError(e) = Reply::error(WRONGTYPE).into_value() else {
            panic!("not an error value");
        };
        assert_eq!(e.code(), "WRONGTYPE");
        assert_eq!(
            e.details(),
            Some("Operation against a key holding the wrong kind of value")
        );
        let Value::ServerError(e) = Reply::error("boom").into_value() else {
            panic!("not an error value");
        };
        assert_eq!((e.code(), e.details()), ("boom", None));
    }
}
