//! The comparison report: what the test server did differently from production.
//!
//! # What this room is for
//!
//! `model` is the data (and the `report.json` schema). The renderers turn one [`Report`] into
//! `report.txt` ([`text`]), `report.json` ([`json`]), `report.html` ([`html`]) or compare two
//! runs ([`diff`]); [`write_report`] puts the three files in a directory atomically.
//!
//! The data comes from [`collect`]: the MySQL transforms push one [`observe::Observation`]
//! per client command, the driver drains them into a [`collect::Collector`], which makes the
//! `Report`.
//!
//! # What it must never do
//!
//! * Collect or aggregate observations outside [`collect`]: the collector fills a `Report`,
//!   the renderers only read one.
//! * Trust text in the report: fingerprints, examples and answers come from clients' traffic;
//!   every renderer escapes them for its medium (terminal control characters, HTML).
//! * Panic on a report it did not write: counts may be huge, latencies zero, vectors empty.

pub mod ab;
pub mod collect;
pub mod diff;
pub mod divergence;
pub mod fixtures;
pub mod html;
pub mod json;
pub mod model;
pub use tcpshadow_core::observation as observe;
pub mod reporting;
pub mod resources;
pub mod sink;
pub mod text;
pub mod write;

pub use json::{from_json, read_report, to_json};
pub use model::*;
pub use write::write_report;

use std::path::PathBuf;

/// What can go wrong reading or writing report files.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a tcpshadow report: {0}")]
    NotAReport(String),
    #[error("report schema {found:?} is not supported (this copier reads {SCHEMA:?})")]
    Schema { found: String },
    /// A report that cannot answer the question asked of it (what it lacks, and the fix).
    #[error("{0}")]
    Cannot(String),
}

/// A latency for a person: `850µs`, `12.3ms`, `1.25s`.
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 10_000 {
        format!("{:.2}ms", us as f64 / 1e3)
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// A run's duration for a person: `30.0 s`, `-` when the file holds no finite number.
pub fn fmt_secs(s: f64) -> String {
    if s.is_finite() {
        format!("{s:.1} s")
    } else {
        "-".to_string()
    }
}

/// A ratio for a person: `1.03x`, `12x`, `-` when unknown.
pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() && r >= 10.0 => format!("{r:.0}x"),
        Some(r) if r.is_finite() => format!("{r:.2}x"),
        _ => "-".to_string(),
    }
}

/// Error codes and counts, `1142x120 1146x3`, or `0` when none.
pub fn fmt_errors(errors: &std::collections::BTreeMap<u16, u64>) -> String {
    if errors.is_empty() {
        return "0".to_string();
    }
    errors
        .iter()
        .map(|(code, n)| format!("{code}x{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Untrusted text made safe for one line of a terminal: control characters (escape
/// sequences could repaint the operator's terminal, newlines would break the table) become
/// spaces, runs of whitespace collapse, and the result is cut to `max` characters with `…`.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut chars = 0usize;
    let mut last_space = false;
    for c in text.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' && last_space {
            continue;
        }
        last_space = c == ' ';
        if chars + 1 > max {
            // Leave room for the ellipsis.
            if max > 0 {
                out.pop();
                out.push('…');
            }
            return out;
        }
        out.push(c);
        chars += 1;
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` of milliseconds since the Unix epoch (no time-zone database:
/// UTC is what both hosts agree on).
pub fn fmt_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
