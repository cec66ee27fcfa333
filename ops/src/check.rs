//! A doctor's findings: one line per check, `ok`, `warn` or `FAIL`, each saying what was seen
//! and, when it is not ok, the likely cause and the fix.

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
