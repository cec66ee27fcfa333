//! A doctor's findings: one line per check, `ok`, `warn` or `FAIL`, each saying what was seen
//! and, when it is not ok, the likely cause and the fix.
//!
//! A check's fix is the tail of its detail from the first `fix: ` that opens it or follows a
//! `; ` ([`Check::message_and_fix`]): one text for people, which machines (`copier doctor
//! --json`) can still split, also for the checks intercept sends over the control channel as
//! plain text.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }

    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The level for machines (`--json`): `ok`, `warn` or `fail`.
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }

    /// Levels from the wire; anything unknown counts as a failure rather than passing silently.
    pub fn from_u8(v: u8) -> Level {
        match v {
            0 => Level::Ok,
            1 => Level::Warn,
            _ => Level::Fail,
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub level: Level,
    /// Short name of what was checked, e.g. `ip_forward`, `probe SYN`.
    pub name: String,
    /// What was seen; for warn/FAIL also the likely cause and the fix.
    pub detail: String,
}

impl Check {
    pub fn new(level: Level, name: impl Into<String>, detail: impl Into<String>) -> Self {
        Check {
            level,
            name: name.into(),
            detail: detail.into(),
        }
    }
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Level::Ok, name, detail)
    }
    pub fn warn(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Level::Warn, name, detail)
    }
    pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Level::Fail, name, detail)
    }
}

impl Check {
    /// The detail split into what was seen (and why) and the fix, if it names one.
    pub fn message_and_fix(&self) -> (&str, Option<&str>) {
        const MARK: &str = "fix: ";
        if let Some(fix) = self.detail.strip_prefix(MARK) {
            return ("", Some(fix));
        }
        match self.detail.find("; fix: ") {
            Some(i) => (&self.detail[..i], Some(&self.detail[i + 2 + MARK.len()..])),
            None => (&self.detail, None),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4}  {}: {}",
            self.level.label(),
            self.name,
            self.detail
        )
    }
}

/// The checks of one doctor run, printed as they come.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
    /// Print each check as it is added (the doctor's own output); off in tests.
    pub echo: bool,
}

impl Report {
    pub fn printing() -> Self {
        Report {
            checks: Vec::new(),
            echo: true,
        }
    }

    pub fn add(&mut self, c: Check) {
        if self.echo {
            println!("{c}");
        }
        self.checks.push(c);
    }

    pub fn count(&self, level: Level) -> usize {
        self.checks.iter().filter(|c| c.level == level).count()
    }

    pub fn failed(&self) -> bool {
        self.count(Level::Fail) > 0
    }

    /// The closing line.
    pub fn summary(&self) -> String {
        format!(
            "{} checks: {} ok, {} warn, {} FAIL",
            self.checks.len(),
            self.count(Level::Ok),
            self.count(Level::Warn),
            self.count(Level::Fail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_is_the_tail_after_the_first_fix_mark() {
        let c = Check::fail(
            "mtu",
            "MTU 1400 is too small; fix: --mss 1360; fix: never this",
        );
        assert_eq!(
            c.message_and_fix(),
            ("MTU 1400 is too small", Some("--mss 1360; fix: never this"))
        );
        assert_eq!(
            Check::ok("clock", "synchronised").message_and_fix(),
            ("synchronised", None)
        );
        // "prefix: " inside a word or without "; " before it is not a fix.
        let c = Check::warn("x", "the suffix: a, then fix the kernel's clocksource");
        assert_eq!(c.message_and_fix().1, None);
        assert_eq!(
            Check::warn("x", "fix: do it").message_and_fix(),
            ("", Some("do it"))
        );
        assert_eq!(Level::Fail.word(), "fail");
    }
}
