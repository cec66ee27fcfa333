//! Fidelity as what the servers executed: the one comparison every lab test, `bench/mirror.sh`
//! and `demo.sh` use (the scripts through `bin/work-compare`).
//!
//! `Questions` counts the commands a server *received*, rejected ones included: a test server
//! that answers every execute with an error scores 1.0 on it. So fidelity here is per kind of
//! executed work (`Com_select`, `Com_stmt_execute`, ...: MariaDB bumps these only for commands
//! it ran), and the statement errors of each server (`performance_schema`'s
//! `events_statements_summary_global_by_event_name.SUM_ERRORS`) are compared beside it.
//!
//! What this must never do: hide a difference in slack. The lab's own reads (`lab.sh work`
//! adds exactly one `Com_select` per read, and says how many it made) and the copier's own
//! statements (its summary's `own statements` line) are taken out explicitly, and a test
//! asserts both bounds: a duplicate is as wrong as a loss.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The kinds of executed work compared, as MariaDB names their counters.
pub const KINDS: &[&str] = &[
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_replace",
    "Com_stmt_execute",
    "Com_begin",
    "Com_commit",
    "Com_rollback",
    "Com_change_db",
    "Com_set_option",
];

/// A kind counts toward work fidelity once production ran it this often in the window: below,
/// one command more or less moves the ratio by more than the bounds tests assert.
pub const MIN_COUNT: u64 = 200;

/// One read of a server (`lab.sh work HOST`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkSnapshot {
    pub counters: BTreeMap<String, u64>,
    /// Statement errors by performance_schema event name (`statement/sql/select`, ...).
    pub errors: BTreeMap<String, u64>,
    /// The lab's `work` reads of this server so far, this one included.
    pub reads: u64,
}

impl WorkSnapshot {
    /// What a server that has just started reads as (every counter at zero), for counting a
    /// restarted server's second life from its start: `reads` is the lab's count of reads so
    /// far, since the read counter lives in the lab, not in the server.
    pub fn started(like: &WorkSnapshot) -> Self {
        WorkSnapshot {
            counters: like.counters.keys().map(|k| (k.clone(), 0)).collect(),
            errors: BTreeMap::new(),
            reads: like.reads,
        }
    }

    /// Parses `lab.sh work` output: `counter NAME N`, `errors EVENT N` and `reads N` lines.
    pub fn parse(text: &str) -> Result<Self> {
        let mut s = WorkSnapshot::default();
        let mut saw_reads = false;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let mut w = line.split_whitespace();
            let number = |v: Option<&str>| -> Result<u64> {
                v.with_context(|| format!("no value in {line:?}"))?
                    .parse()
                    .with_context(|| format!("not a number in {line:?}"))
            };
            match w.next() {
                Some("counter") => {
                    let name = w.next().with_context(|| format!("no name in {line:?}"))?;
                    s.counters.insert(name.to_string(), number(w.next())?);
                }
                Some("errors") => {
                    let event = w.next().with_context(|| format!("no event in {line:?}"))?;
                    s.errors.insert(event.to_string(), number(w.next())?);
                }
                Some("reads") => {
                    s.reads = number(w.next())?;
                    saw_reads = true;
                }
                _ => bail!("not a `lab.sh work` line: {line:?}"),
            }
        }
        if !saw_reads || !s.counters.contains_key("Com_select") {
            bail!("not a `lab.sh work` snapshot (no reads or Com_select line):\n{text}");
        }
        Ok(s)
    }
}

/// What one server executed between two reads, the lab's own reads taken out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// [`KINDS`] and `Questions` (shown, never compared).
    pub kinds: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
}

impl Work {
    pub fn between(before: &WorkSnapshot, after: &WorkSnapshot) -> Result<Work> {
        if after.reads < before.reads {
            bail!(
                "the later snapshot was read before the earlier one (or the server's lab changed)"
            );
        }
        let mut w = Work::default();
        for &k in KINDS.iter().chain(&["Questions"]) {
            let (Some(a), Some(b)) = (after.counters.get(k), before.counters.get(k)) else {
                bail!("counter {k} missing from a snapshot");
            };
            let mut d = a.checked_sub(*b).with_context(|| {
                format!("{k} went down ({b} -> {a}): was the server restarted in the window?")
            })?;
            if k == "Com_select" {
                // Each read's SELECT of performance_schema, counted in its own snapshot.
                d = d.saturating_sub(after.reads - before.reads);
            }
            w.kinds.insert(k.to_string(), d);
        }
        for (event, &n) in &after.errors {
            let d = n.saturating_sub(before.errors.get(event).copied().unwrap_or(0));
            if d > 0 {
                w.errors.insert(event.clone(), d);
            }
        }
        Ok(w)
    }

    pub fn get(&self, kind: &str) -> u64 {
        self.kinds.get(kind).copied().unwrap_or(0)
    }

    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Two servers' work as one (several production hosts into one test server, one copier
    /// spreading over two targets).
    pub fn plus(mut self, other: &Work) -> Work {
        for (k, v) in &other.kinds {
            *self.kinds.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self
    }

    /// Whether this has run at least `ratio` x `due` of every kind `due` ran [`MIN_COUNT`]
    /// times or more.
    pub fn caught_up(&self, due: &Work, ratio: f64) -> bool {
        KINDS
            .iter()
            .all(|k| due.get(k) < MIN_COUNT || self.get(k) as f64 >= due.get(k) as f64 * ratio)
    }
}

/// Statements the copier ran on its own, by [`KINDS`] name: its `--prod-dsn` lookups on
/// production, the schema selections and `SET`s of recovered sessions on the test server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnStatements {
    pub prod: BTreeMap<String, u64>,
    pub test: BTreeMap<String, u64>,
}

impl OwnStatements {
    /// Reads the copier summary's `own statements: production select=N ...; test change_db=N
    /// ...` line (absent: none). A summary with several such lines (several copiers' logs
    /// concatenated) adds them up.
    pub fn from_summary(summary: &str) -> Result<Self> {
        let mut own = OwnStatements::default();
        for line in summary.lines() {
            let Some(rest) = line.trim().strip_prefix("own statements:") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace();
                let side = match words.next() {
                    Some("production") => &mut own.prod,
                    Some("test") => &mut own.test,
                    Some(other) => bail!("own statements: unknown server {other:?} in {line:?}"),
                    None => continue,
                };
                for kv in words {
                    let (k, v) = kv
                        .split_once('=')
                        .with_context(|| format!("own statements: {kv:?} in {line:?}"))?;
                    let v: u64 = v
                        .parse()
                        .with_context(|| format!("own statements: {kv:?} in {line:?}"))?;
                    *side.entry(format!("Com_{k}")).or_default() += v;
                }
            }
        }
        Ok(own)
    }
}

/// Production's work against the test server's, over the same window.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub prod: Work,
    pub test: Work,
    pub own: OwnStatements,
    /// What the test server should run per command production ran: 1, or N under
    /// `--multiply N`.
    pub ratio: f64,
}

/// One row of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub kind: String,
    /// The clients' commands, the copier's own taken out.
    pub prod: u64,
    pub test: u64,
    /// test / (prod x ratio), when production ran it at least [`MIN_COUNT`] times.
    pub ratio: Option<f64>,
}

impl Comparison {
    pub fn new(prod: Work, test: Work) -> Self {
        Self {
            prod,
            test,
            own: OwnStatements::default(),
            ratio: 1.0,
        }
    }

    /// Takes the copier's own statements out of both sides.
    pub fn less_own(mut self, own: OwnStatements) -> Self {
        self.own = own;
        self
    }

    /// The test server is due `ratio` times production's work (`--multiply`).
    pub fn expecting(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    pub fn rows(&self) -> Vec<Row> {
        KINDS
            .iter()
            .chain(&["Questions"])
            .map(|&k| {
                let own = |m: &BTreeMap<String, u64>| m.get(k).copied().unwrap_or(0);
                let prod = self.prod.get(k).saturating_sub(own(&self.own.prod));
                let test = self.test.get(k).saturating_sub(own(&self.own.test));
                let ratio = (k != "Questions" && prod >= MIN_COUNT)
                    .then(|| test as f64 / (prod as f64 * self.ratio));
                Row {
                    kind: k.to_string(),
                    prod,
                    test,
                    ratio,
                }
            })
            .collect()
    }

    /// The smallest test/prod ratio over the kinds production ran at least [`MIN_COUNT`]
    /// times; `None` when it ran none that often.
    pub fn fidelity(&self) -> Option<f64> {
        self.rows()
            .iter()
            .filter_map(|r| r.ratio)
            .min_by(|a, b| a.total_cmp(b))
    }

    /// The largest ratio: above 1, the test server ran more than it was sent (duplicates).
    pub fn highest(&self) -> Option<f64> {
        self.rows()
            .iter()
            .filter_map(|r| r.ratio)
            .max_by(|a, b| a.total_cmp(b))
    }

    /// Statement errors on test that production did not have, by event name.
    pub fn new_errors(&self) -> BTreeMap<String, u64> {
        self.test
            .errors
            .iter()
            .filter_map(|(event, &t)| {
                let p = self.prod.errors.get(event).copied().unwrap_or(0) as f64 * self.ratio;
                let extra = (t as f64 - p).round();
                (extra >= 1.0).then(|| (event.clone(), extra as u64))
            })
            .collect()
    }

    /// Work fidelity within `[lo, hi]` and no statement error on test that production did
    /// not have. The error names every figure.
    pub fn check(&self, lo: f64, hi: f64) -> Result<()> {
        self.check_errors(lo, hi, &BTreeMap::new())
    }

    /// Like [`Comparison::check`], for a test server made to differ on purpose: exactly
    /// `expected` new errors (by event name), no others.
    pub fn check_errors(&self, lo: f64, hi: f64, expected: &BTreeMap<String, u64>) -> Result<()> {
        let Some(low) = self.fidelity() else {
            bail!("production ran no kind of work {MIN_COUNT} times: nothing was measured\n{self}");
        };
        let high = self.highest().unwrap_or(low);
        if low < lo {
            bail!("work fidelity {low:.5} is below {lo}\n{self}");
        }
        if high > hi {
            bail!("the test server ran more than it was sent: {high:.5} > {hi}\n{self}");
        }
        let new = self.new_errors();
        if &new != expected {
            bail!("statement errors on test that production did not have: {new:?}, expected {expected:?}\n{self}");
        }
        Ok(())
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  {:<18} {:>12} {:>12} {:>9}",
            "executed work", "production", "test", "test/prod"
        )?;
        for r in self.rows() {
            if r.prod == 0 && r.test == 0 {
                continue;
            }
            let ratio = match r.ratio {
                Some(x) => format!("{x:.5}"),
                None if r.kind == "Questions" => "(recv'd)".into(),
                None => "-".into(),
            };
            writeln!(
                f,
                "  {:<18} {:>12} {:>12} {:>9}",
                r.kind, r.prod, r.test, ratio
            )?;
        }
        let own: Vec<String> = [("production", &self.own.prod), ("test", &self.own.test)]
            .iter()
            .filter(|(_, m)| m.values().any(|&n| n > 0))
            .map(|(side, m)| {
                let each: Vec<String> = m.iter().map(|(k, n)| format!("{k}={n}")).collect();
                format!("{side} {}", each.join(" "))
            })
            .collect();
        if !own.is_empty() {
            writeln!(
                f,
                "  the copier's own statements, taken out: {}",
                own.join("; ")
            )?;
        }
        if self.ratio != 1.0 {
            writeln!(
                f,
                "  the test server is due {}x production's work",
                self.ratio
            )?;
        }
        let errors = |w: &Work| -> String {
            if w.errors.is_empty() {
                "none".into()
            } else {
                let each: Vec<String> = w.errors.iter().map(|(k, n)| format!("{k}={n}")).collect();
                each.join(" ")
            }
        };
        writeln!(f, "  statement errors: production {}", errors(&self.prod))?;
        writeln!(f, "  statement errors: test       {}", errors(&self.test))?;
        let new = self.new_errors();
        if new.is_empty() {
            writeln!(f, "  new errors on test: none")?;
        } else {
            let each: Vec<String> = new.iter().map(|(k, n)| format!("{k}={n}")).collect();
            writeln!(f, "  new errors on test: {}", each.join(" "))?;
        }
        match self.fidelity() {
            Some(x) => write!(f, "  work fidelity: {x:.5} (the smallest test/prod ratio over kinds run {MIN_COUNT}+ times)"),
            None => write!(f, "  work fidelity: not measured (no kind run {MIN_COUNT} times)"),
        }
    }
}

/// Errors a test server can have where production did not, from writes it ran in another order
/// or context: concurrent connections' writes interleave there differently (each connection's
/// order is kept, not the order between them), so a deadlock (1213) or lock wait timeout (1205)
/// can strike another transaction, and a statement that then runs outside the rolled-back
/// transaction can meet a duplicate key (1062); and a connection picked up in the middle of a
/// transaction had its first statements run before the copier started (sysbench's DELETE of an
/// id ran on production only, its INSERT of the same id then fails on test: seen twice in two
/// pooled `oltp_read_write` runs at 32 threads; starting a picked-up session at a transaction
/// boundary is issue 18's). The copier counts each by code.
pub const WRITE_RACE_CODES: &[u16] = &[1062, 1205, 1213];

/// The copier summary's test-only errors by code, from its `losses:` lines
/// (`N  commands: COMMAND KIND: error CODE on the test server only`); several summaries add up.
pub fn test_only_errors(summary: &str) -> BTreeMap<u16, u64> {
    let mut by_code = BTreeMap::new();
    for line in summary.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_suffix(" on the test server only") else {
            continue;
        };
        let (Some((n, _)), Some((_, code))) =
            (line.split_once("  commands: "), rest.rsplit_once("error "))
        else {
            continue;
        };
        if let (Ok(n), Ok(code)) = (n.trim().parse::<u64>(), code.trim().parse::<u16>()) {
            *by_code.entry(code).or_default() += n;
        }
    }
    by_code
}

impl Comparison {
    /// [`Comparison::check`] for loads with concurrent writes: the test server's new errors
    /// must all be write races ([`WRITE_RACE_CODES`]) the copier counted (its summary, which may
    /// cover more than this window), the copier may have counted no other test-only error, and
    /// they stay rare (at most 1 in 10,000 executes).
    pub fn check_write_races(&self, lo: f64, hi: f64, copier_summary: &str) -> Result<()> {
        let counted = test_only_errors(copier_summary);
        let others: BTreeMap<u16, u64> = counted
            .iter()
            .filter(|(c, _)| !WRITE_RACE_CODES.contains(c))
            .map(|(c, n)| (*c, *n))
            .collect();
        if !others.is_empty() {
            bail!("the copier counted test-only errors that are no write race: {others:?}\n{self}");
        }
        let races: u64 = counted.values().sum();
        let new: u64 = self.new_errors().values().sum();
        if new > races {
            bail!(
                "{new} new errors on test, of which the copier explained {races} as write races \
                 ({counted:?})\n{self}"
            );
        }
        let executes = self.prod.get("Com_stmt_execute") + self.prod.get("Questions");
        if new * 10_000 > executes.max(1) {
            bail!("{new} write races on test: too many for chance\n{self}");
        }
        let allowed = self.new_errors();
        self.check_errors(lo, hi, &allowed)
    }
}

/// Prints `label` and a check's figures (or why it failed), and hands the check on: a test
/// shows its comparison whether it passes or not.
pub fn shown(label: impl fmt::Display, figures: Result<String>) -> Result<()> {
    match &figures {
        Ok(text) => println!("{label}:\n{text}"),
        Err(e) => println!("{label}:\n{e:#}"),
    }
    figures.map(drop)
}

/// Both servers read at a window's start, when the load ended, and once the test server had
/// caught up (`Lab::work_window`).
#[derive(Clone, Debug)]
pub struct Window {
    pub before: (WorkSnapshot, WorkSnapshot),
    pub at_end: (WorkSnapshot, WorkSnapshot),
    pub after: (WorkSnapshot, WorkSnapshot),
    /// How long after the load's end the test server had run all of production's work (of
    /// the kinds run [`MIN_COUNT`] times or more); `None` if it never did in the window.
    pub caught_up_in: Option<Duration>,
    /// How long after the load's end the test server last ran anything of those kinds: when
    /// it never caught up because the copier left some commands out by design and counted
    /// them (a picked-up connection's transaction tail), this is when its backlog was run.
    pub settled_in: Duration,
    /// What the test server's MySQL sockets held unread when the load ended
    /// ([`crate::Lab::test_unread_bytes`]).
    pub test_unread_at_end: u64,
}

/// How soon after the load's end a test server behind by more than 1% of the work must have
/// caught up to count as in step, unless it had a queue of commands delivered and unread
/// ([`BACKED_UP_UNREAD`]). The share alone measured this machine as much as the mirror: with
/// two labs on two cores, production's mariadbd gets more CPU than test's now and then, and
/// test ended 3% behind a 10 s load (0.3 s) with everything delivered, caught up a moment
/// later (fresh-clone run, 2026-12-04).
pub const IN_STEP_CATCH_UP: Duration = Duration::from_secs(2);

/// Bytes unread on the test server's sockets when the load ended that make a test server
/// behind a slower server, not a mirror holding commands back: a mirror that sends a command
/// only once the test server answered the last (the C tcpcopy's way) leaves at most one command
/// per connection unread, under 1 KiB each for these loads. A test server starved of CPU ends
/// with hundreds of KiB queued (fresh-clone run fc3 of 0646eaa: 32% of a 10 s load behind,
/// caught up 3.7 s after it; its mariadbd stopped for the last 3 s of a load: 274,576 bytes
/// unread).
pub const BACKED_UP_UNREAD: u64 = 64 * 1024;

impl Window {
    fn compare(
        &self,
        to: &(WorkSnapshot, WorkSnapshot),
        own: &OwnStatements,
    ) -> Result<Comparison> {
        Ok(Comparison::new(
            Work::between(&self.before.0, &to.0)?,
            Work::between(&self.before.1, &to.1)?,
        )
        .less_own(own.clone()))
    }

    /// When the load ended: how far behind production the test server was.
    pub fn in_step(&self, own: &OwnStatements) -> Result<Comparison> {
        self.compare(&self.at_end, own)
    }

    /// The whole window, the test server's backlog run.
    pub fn whole(&self, own: &OwnStatements) -> Result<Comparison> {
        self.compare(&self.after, own)
    }

    fn text(&self, in_step: &Comparison, whole: &Comparison) -> String {
        let caught_up = match self.caught_up_in {
            Some(t) => format!("{:.1} s after the load", t.as_secs_f64()),
            None => "never, in the window".to_owned(),
        };
        format!(
            "when the load ended ({} bytes unread on the test server's sockets):\n{in_step}\n\
             once the test server caught up ({caught_up}):\n{whole}",
            self.test_unread_at_end
        )
    }

    /// [`Window::check`] for loads with concurrent writes ([`Comparison::check_write_races`]).
    pub fn check_write_races(&self, own: &OwnStatements, copier_summary: &str) -> Result<String> {
        let (in_step, whole) = (self.in_step(own)?, self.whole(own)?);
        let text = self.text(&in_step, &whole);
        whole
            .check_write_races(0.999, 1.001, copier_summary)
            .with_context(|| format!("when the load ended:\n{in_step}"))?;
        self.check_in_step(&in_step, &text)?;
        Ok(text)
    }

    /// The mirror tests' bars: work fidelity within [0.999, 1.001] over the whole window, no
    /// statement error on test that production did not have, and at least 0.99 of the work
    /// already run when the load ended. Returns both comparisons, for the test to print.
    pub fn check(&self, own: &OwnStatements) -> Result<String> {
        self.check_from(own, 0.999)
    }

    /// [`Window::check`] with the lower bound `lo`: for a window that opens with a loss the
    /// copier makes by design and counts, whose size the caller bounds (a picked-up
    /// connection's transaction tail: a fixed cost, which a short window shows larger).
    pub fn check_from(&self, own: &OwnStatements, lo: f64) -> Result<String> {
        let (in_step, whole) = (self.in_step(own)?, self.whole(own)?);
        let text = self.text(&in_step, &whole);
        whole
            .check(lo, 1.001)
            .with_context(|| format!("when the load ended:\n{in_step}"))?;
        self.check_in_step(&in_step, &text)?;
        Ok(text)
    }

    /// In step: 0.99 of the work run when the load ended, or all of it within
    /// [`IN_STEP_CATCH_UP`] after, or all of it in the window by a test server that had
    /// [`BACKED_UP_UNREAD`] bytes of commands waiting on its sockets when the load ended. A
    /// window whose whole-run bar allows a loss by design (`check_from`, checked before this)
    /// never sees the test server catch up on every kind: there, its backlog run out within
    /// [`IN_STEP_CATCH_UP`] counts instead (a Connector/J pool's fresh-clone run ended 1.5%
    /// behind with 49,989 bytes unread and was failed for never catching up, 2026-12-06).
    fn check_in_step(&self, in_step: &Comparison, text: &str) -> Result<()> {
        let share = in_step.fidelity().unwrap_or(0.0);
        let backed_up = self.test_unread_at_end >= BACKED_UP_UNREAD;
        let settled = self.caught_up_in.is_none() && self.settled_in <= IN_STEP_CATCH_UP;
        if share >= 0.99
            || settled
            || self
                .caught_up_in
                .is_some_and(|t| t <= IN_STEP_CATCH_UP || backed_up)
        {
            return Ok(());
        }
        let caught_up = match self.caught_up_in {
            Some(t) => format!("caught up {:.1} s after it", t.as_secs_f64()),
            None => format!(
                "never caught up in the window (its last progress {:.1} s after it)",
                self.settled_in.as_secs_f64()
            ),
        };
        bail!(
            "the test server was not in step with production: {share:.5} of the work run when \
             the load ended (below 0.99), {caught_up} (limit {} s, or any time in the window \
             with {BACKED_UP_UNREAD} bytes or more unread on its sockets at the end: {}):\n{text}",
            IN_STEP_CATCH_UP.as_secs(),
            self.test_unread_at_end
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(select: u64, execute: u64, reads: u64, errors: &[(&str, u64)]) -> WorkSnapshot {
        let mut text = String::new();
        for k in KINDS.iter().chain(&["Questions"]) {
            let v = match *k {
                "Com_select" => select,
                "Com_stmt_execute" | "Questions" => execute,
                _ => 0,
            };
            text.push_str(&format!("counter {k} {v}\n"));
        }
        for (e, n) in errors {
            text.push_str(&format!("errors {e} {n}\n"));
        }
        text.push_str(&format!("reads {reads}\n"));
        WorkSnapshot::parse(&text).unwrap()
    }

    #[test]
    fn own_reads_are_taken_out_of_com_select() {
        let w = Work::between(&snap(10, 0, 3, &[]), &snap(1015, 1000, 5, &[])).unwrap();
        assert_eq!(w.get("Com_select"), 1003);
    }

    #[test]
    fn a_test_server_behind_is_in_step_only_if_it_was_the_slower_one() {
        let zero = snap(0, 0, 1, &[]);
        let prod = snap(10_001, 10_000, 2, &[]);
        let window = |caught_up_in: Option<f64>, unread: u64| Window {
            before: (zero.clone(), zero.clone()),
            at_end: (prod.clone(), snap(6_801, 6_800, 2, &[])),
            after: (prod.clone(), prod.clone()),
            caught_up_in: caught_up_in.map(Duration::from_secs_f64),
            settled_in: Duration::from_secs(9),
            test_unread_at_end: unread,
        };
        let own = OwnStatements::default();
        window(Some(1.5), 0).check(&own).unwrap();
        // fc3's case: commands queued on the test server's sockets, the server behind them.
        window(Some(3.7), 274_576).check(&own).unwrap();
        // The same lag with nothing queued: the mirror held the commands back.
        let e = window(Some(3.7), 900).check(&own).unwrap_err().to_string();
        assert!(e.contains("not in step") && e.contains("900"), "{e}");
        let e = window(None, 274_576).check(&own).unwrap_err().to_string();
        assert!(e.contains("never caught up"), "{e}");
        // Never caught up on every kind (a loss by design), its backlog run out 1.2 s after
        // the end: in step; 9 s after: not.
        let mut w = window(None, 900);
        w.settled_in = Duration::from_millis(1200);
        w.check(&own).unwrap();
    }

    #[test]
    fn rejected_executes_are_not_work() {
        // The incident: every execute received (Questions), none run as a SELECT.
        let prod = Work::between(&snap(0, 0, 1, &[]), &snap(106_271, 121_448, 2, &[])).unwrap();
        let test = Work::between(
            &snap(0, 0, 1, &[]),
            &snap(1, 13_971, 2, &[("statement/com/Execute", 107_000)]),
        )
        .unwrap();
        let c = Comparison::new(prod, test);
        assert_eq!(c.fidelity(), Some(0.0));
        assert!(c.check(0.999, 1.001).is_err());
        assert_eq!(c.new_errors().get("statement/com/Execute"), Some(&107_000));
        let text = c.to_string();
        assert!(text.contains("work fidelity: 0.00000"), "{text}");
    }

    #[test]
    fn both_bounds_and_rare_kinds() {
        let prod = Work::between(&snap(0, 0, 1, &[]), &snap(1001, 1000, 2, &[])).unwrap();
        let dup = Work::between(&snap(0, 0, 1, &[]), &snap(1011, 1010, 2, &[])).unwrap();
        let c = Comparison::new(prod.clone(), dup);
        assert!(
            c.check(0.999, 1.001).is_err(),
            "a duplicate is as wrong as a loss"
        );
        let same = Comparison::new(prod.clone(), prod.clone());
        same.check(0.999, 1.001).unwrap();
        // Fewer than MIN_COUNT: not a ratio.
        let few = Work::between(&snap(0, 0, 1, &[]), &snap(51, 50, 2, &[])).unwrap();
        assert_eq!(Comparison::new(few.clone(), few).fidelity(), None);
    }

    #[test]
    fn write_races_the_copier_counted_are_allowed_and_nothing_else() {
        let summary = "  losses:\n             2  commands: stmt_execute insert: error 1062 on the test server only\n";
        assert_eq!(test_only_errors(summary), BTreeMap::from([(1062, 2)]));
        let prod = Work::between(&snap(0, 0, 1, &[]), &snap(100_001, 100_000, 2, &[])).unwrap();
        let racy = Work::between(
            &snap(0, 0, 1, &[]),
            &snap(100_001, 100_000, 2, &[("statement/com/Execute", 2)]),
        )
        .unwrap();
        let c = Comparison::new(prod, racy);
        assert!(c.check(0.999, 1.001).is_err());
        c.check_write_races(0.999, 1.001, summary).unwrap();
        let other =
            "             2  commands: stmt_execute insert: error 1210 on the test server only\n";
        assert!(c.check_write_races(0.999, 1.001, other).is_err());
        assert!(c.check_write_races(0.999, 1.001, "").is_err());
    }

    #[test]
    fn own_statements_and_multiply() {
        let own = OwnStatements::from_summary(
            "copier summary\n  own statements: production select=7; test change_db=3 set_option=2\n",
        )
        .unwrap();
        assert_eq!(own.prod.get("Com_select"), Some(&7));
        assert_eq!(own.test.get("Com_set_option"), Some(&2));
        let prod = Work::between(&snap(0, 0, 1, &[]), &snap(1008, 1000, 2, &[])).unwrap();
        let test = Work::between(&snap(0, 0, 1, &[]), &snap(3001, 3000, 2, &[])).unwrap();
        let c = Comparison::new(prod, test).less_own(own).expecting(3.0);
        let f = c.fidelity().unwrap();
        assert!((f - 1.0).abs() < 1e-9, "{f}\n{c}");
        assert!(WorkSnapshot::parse("counter Questions 1\n").is_err());
        assert!(OwnStatements::from_summary("own statements: elsewhere select=1").is_err());
    }
}
