//! A run's trace: who sent what when, what each server ran, what each caller believed.
//! Kept in memory and printed when a checker fails, so that a failing seed reads as a
//! story; the same seed replays it exactly.

use std::fmt::Write;

use crate::sim::config::Micros;

/// The lines of a run, each stamped with its virtual time.
#[derive(Default)]
pub(crate) struct Trace {
    lines: Vec<(Micros, String)>,
    /// Whether lines are kept at all (a soak keeps none until a seed fails, then replays).
    pub enabled: bool,
}

impl Trace {
    pub fn new(enabled: bool) -> Trace {
        Trace {
            lines: Vec::new(),
            enabled,
        }
    }

    /// Adds a line at `now` (built only when the trace is kept).
    pub fn line(&mut self, now: Micros, text: impl FnOnce() -> String) {
        if self.enabled {
            self.lines.push((now, text()));
        }
    }

    /// The whole trace, one line per event, times in milliseconds.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (at, text) in &self.lines {
            let _ = writeln!(out, "{:>10.3} ms  {text}", *at as f64 / 1000.0);
        }
        out
    }
}

/// A short form of a token for the trace (`c1-7` stays, a UUID is cut).
pub(crate) fn short(token: &str) -> &str {
    token.split(':').next().unwrap_or(token)
}
