//! Durations on the command line (`500ms`, `30s`, `2m`, `1h`) and in output.

use std::time::Duration;

/// Parses a whole number followed by a unit: `ms`, `s`, `m` or `h`; a bare number is
/// seconds, as with `flock -w 10`. Fractions are refused (write `1500ms`, not `1.5s`): an
/// exact, unsurprising syntax.
pub fn parse(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "a whole number of seconds, or with a unit: 500ms, 30s, 2m or 1h";
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!("expected {FORMS}"));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{number} is too large"))?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => 1_000,
        _ => return Err(format!("unknown unit {unit:?}: expected {FORMS}")),
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text} is too large"))
}

/// A lease: a duration as [`parse`] reads it, within the library's
/// [`redlease::MIN_TTL`]..=[`redlease::MAX_TTL`], so that a bad ttl is a usage error before
/// anything is sent, whatever the server holds.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse(text)?;
    if ttl < redlease::MIN_TTL {
        return Err(format!(
            "a ttl must be at least {} (a shorter lease ends before it can be used)",
            show(redlease::MIN_TTL)
        ));
    }
    if ttl > redlease::MAX_TTL {
        return Err(format!(
            "{text} is over the longest ttl, {}",
            show(redlease::MAX_TTL)
        ));
    }
    Ok(ttl)
}

/// How long `run` waits for a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Try once (`--wait 0`, the default).
    No,
    /// Up to this long.
    UpTo(Duration),
    /// Until the lock is free (`--wait forever`).
    Forever,
}

/// `0`, a duration, or `forever`.
pub fn parse_wait(text: &str) -> Result<Wait, String> {
    if text == "forever" {
        return Ok(Wait::Forever);
    }
    let d = parse(text).map_err(|e| format!("{e}, or forever"))?;
    Ok(if d.is_zero() { Wait::No } else { Wait::UpTo(d) })
}

/// Short and readable: `850ms`, `12.3s`, `4m05s`, `2h10m`.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_ttl_is_within_the_librarys_bounds() {
        assert_eq!(parse_ttl("10ms"), Ok(redlease::MIN_TTL));
        assert!(parse_ttl("9ms").unwrap_err().contains("at least 10ms"));
        assert!(parse_ttl("0").is_err());
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        let longest = redlease::MAX_TTL.as_millis();
        assert_eq!(parse_ttl(&format!("{longest}ms")), Ok(redlease::MAX_TTL));
        assert!(
            parse_ttl(&format!("{}ms", longest + 1))
                .unwrap_err()
                .contains("longest")
        );
    }

    #[test]
    fn a_bare_number_is_seconds_as_with_flock() {
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_wait("10"), Ok(Wait::UpTo(Duration::from_secs(10))));
        assert!(parse("99999999999999999").is_err(), "too large in ms");
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "s",
            "1.5",
            "1.5s",
            "-1s",
            "30 s",
            " 30s",
            "30sec",
            "abc",
            "99999999999999999999s",
            "18446744073709551615h",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn waits() {
        assert_eq!(parse_wait("0"), Ok(Wait::No));
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert_eq!(parse_wait("10s"), Ok(Wait::UpTo(Duration::from_secs(10))));
        assert!(parse_wait("always").is_err());
    }

    #[test]
    fn shows_durations_briefly() {
        assert_eq!(show(Duration::from_millis(850)), "850ms");
        assert_eq!(show(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(show(Duration::from_secs(245)), "4m05s");
        assert_eq!(show(Duration::from_secs(7800)), "2h10m");
    }
}
