//! Output helpers: JSON strings written by hand (a few flat objects do not need serde), and
//! text safe to print on a terminal.

use std::fmt::Write as _;
use std::io::Write as _;

/// `s` as a JSON string literal (RFC 8259: quotes, backslashes and control characters
/// escaped; everything else as UTF-8).
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `Some(s)` as a JSON string, `None` as `null`.
pub fn json_opt_str(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_owned(), json_str)
}

/// `Some(n)` as a JSON number, `None` as `null`.
pub fn json_opt_num(n: Option<impl std::fmt::Display>) -> String {
    n.map_or_else(|| "null".to_owned(), |n| n.to_string())
}

/// `s` with control characters shown as escapes, so a key or a server message cannot move
/// the cursor, ring the bell or break a line of the output.
pub fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Writes `text` to stdout. A closed pipe (`redlease list | head -1`) ends the program
/// quietly with EX_IOERR rather than a panic.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(crate::exit::IOERR);
    }
}

/// One line on stderr, `redlease: ` first; never fails (a closed stderr is ignored).
pub fn warn(line: &str) {
    let line = format!("redlease: {}\n", printable(line));
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(json_str("x\ny\u{1}"), r#""x\ny\u0001""#);
        assert_eq!(json_str("héllo/π"), "\"héllo/π\"");
        assert_eq!(json_opt_str(None), "null");
        assert_eq!(json_opt_num(Some(7u64)), "7");
    }

    #[test]
    fn printable_escapes_control_characters() {
        assert_eq!(printable("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
        assert_eq!(printable("job:π"), "job:π");
    }
}
