//! `copier report diff A.json B.json`: two runs compared digest by digest (matched by id),
//! e.g. the test server on glibc malloc (A) and on tcmalloc (B). Sorted by largest
//! slowdown of the test server from A to B; digests found in one run only are listed apart.
//!
//! The comparison is of the *test* side: that is what the user changed between the runs.
//! Production's own p50 ratio is shown beside it, because a run taken at a busier hour makes
//! everything slower without the change being at fault.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use super::{fmt_us, one_line, read_report, DigestReport, Report, ReportError};

/// Reads and compares comparison reports written by `copier --report DIR`.
#[derive(Parser, Debug, Clone)]
#[command(name = "copier report")]
pub struct ReportArgs {
    #[command(subcommand)]
    pub command: ReportCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum ReportCommand {
    /// Compare two runs' report.json digest by digest (by digest id): test-server latency
    /// A vs B, errors and mismatches, digests found in one run only.
    Diff(DiffArgs),
    /// A --tee run's test A vs test B, digest by digest, flagged beyond the noise of an A/A
    /// calibration run when one is given (else beyond a fixed band).
    Ab(AbArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct AbArgs {
    /// The --tee run's report.json.
    pub report: PathBuf,
    /// The report.json of a --tee run onto two identical test servers: each digest's noise.
    #[arg(long, value_name = "AA-REPORT.json")]
    pub calibration: Option<PathBuf>,
    /// Which two --target to compare, by position (0 is the first): A and B.
    #[arg(long, num_args = 2, value_names = ["A", "B"], default_values_t = [0, 1])]
    pub targets: Vec<usize>,
    /// Show only the first N digests.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct DiffArgs {
    /// The baseline run's report.json.
    pub a: PathBuf,
    /// The run compared with it.
    pub b: PathBuf,
    /// Show only the N largest slowdowns (and N digests of each one-sided list).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

/// Runs `copier report ...`; the text to print.
pub fn run(args: &ReportArgs) -> Result<String, ReportError> {
    match &args.command {
        ReportCommand::Diff(d) => diff_files(&d.a, &d.b, d.top),
        ReportCommand::Ab(a) => ab_file(a),
    }
}

/// `copier report ab`: the comparison recomputed from the file (with this calibration).
pub fn ab_file(args: &AbArgs) -> Result<String, ReportError> {
    let report = read_report(&args.report)?;
    let calibration = args
        .calibration
        .as_deref()
        .map(super::ab::Calibration::read)
        .transpose()?;
    let (a, b) = (args.targets[0], args.targets[1]);
    let Some(ab) = super::ab::compare(&report, a, b, calibration.as_ref()) else {
        return Err(ReportError::Cannot(format!(
            "{} has no --tee targets {a} and {b} to compare (its targets: {})",
            args.report.display(),
            if report.tee_targets.is_empty() {
                "none: it is not a --tee run".to_string()
            } else {
                report.tee_targets.join(", ")
            }
        )));
    };
    let mut out = String::new();
    super::text::ab_section(&mut out, &ab, args.top);
    Ok(out)
}

/// Reads both files (refusing anything but a report of our schema) and renders the diff.
pub fn diff_files(a: &Path, b: &Path, top: Option<usize>) -> Result<String, ReportError> {
    let ra = read_report(a)?;
    let rb = read_report(b)?;
    Ok(render_diff(
        &a.display().to_string(),
        &ra,
        &b.display().to_string(),
        &rb,
        top,
    ))
}

/// One digest present in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct DigestChange<'a> {
    pub a: &'a DigestReport,
    pub b: &'a DigestReport,
    /// Test p50 in B / test p50 in A (`None` without test samples in either).
    pub test_p50_ratio: Option<f64>,
    /// Test p99 in B / test p99 in A.
    pub test_p99_ratio: Option<f64>,
    /// Production p50 in B / in A: how much the load itself changed.
    pub prod_p50_ratio: Option<f64>,
    /// Test-side errors B minus A (per command: rates would hide a new error class, counts
    /// are what a user greps for).
    pub test_errors_delta: i128,
    /// Row + result mismatches B minus A.
    pub mismatches_delta: i128,
    /// `(log2(p50 ratio) + 0.5 * log2(p99 ratio)) * log10(10 + min(count A, count B))`: the
    /// report's slowdown score applied to B vs A (see `DigestReport::slowdown_score`).
    pub slowdown: f64,
}

/// Two runs compared.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff<'a> {
    /// Digests in both, largest slowdown first.
    pub changed: Vec<DigestChange<'a>>,
    /// Digests only in A, most frequent first.
    pub only_a: Vec<&'a DigestReport>,
    /// Digests only in B, most frequent first.
    pub only_b: Vec<&'a DigestReport>,
}

fn ratio(a: u64, b: u64, samples: bool) -> Option<f64> {
    samples.then(|| b.max(1) as f64 / a.max(1) as f64)
}

/// By id; should a file list an id twice (not written by us), the most frequent entry wins.
fn by_id(r: &Report) -> BTreeMap<&str, &DigestReport> {
    let mut m: BTreeMap<&str, &DigestReport> = BTreeMap::new();
    for d in &r.digests {
        let e = m.entry(d.id.as_str()).or_insert(d);
        if d.count > e.count {
            *e = d;
        }
    }
    m
}

/// Compares `a` (baseline) with `b`.
pub fn diff<'a>(a: &'a Report, b: &'a Report) -> Diff<'a> {
    let (ma, mb) = (by_id(a), by_id(b));
    let mut out = Diff::default();
    for (id, da) in &ma {
        let Some(db) = mb.get(id) else {
            out.only_a.push(da);
            continue;
        };
        let test = da.test.count > 0 && db.test.count > 0;
        let prod = da.prod.count > 0 && db.prod.count > 0;
        let r50 = ratio(da.test.p50_us, db.test.p50_us, test);
        let r99 = ratio(da.test.p99_us, db.test.p99_us, test);
        let slowdown = match (r50, r99) {
            (Some(r50), Some(r99)) => {
                (r50.log2() + 0.5 * r99.log2()) * (10.0 + da.count.min(db.count) as f64).log10()
            }
            _ => 0.0,
        };
        let (_, ea) = da.error_totals();
        let (_, eb) = db.error_totals();
        out.changed.push(DigestChange {
            a: da,
            b: db,
            test_p50_ratio: r50,
            test_p99_ratio: r99,
            prod_p50_ratio: ratio(da.prod.p50_us, db.prod.p50_us, prod),
            test_errors_delta: i128::from(eb) - i128::from(ea),
            mismatches_delta: i128::from(db.mismatches()) - i128::from(da.mismatches()),
            slowdown,
        });
    }
    out.only_b = mb
        .iter()
        .filter(|(id, _)| !ma.contains_key(*id))
        .map(|(_, d)| *d)
        .collect();
    out.changed.sort_by(|x, y| {
        y.slowdown
            .total_cmp(&x.slowdown)
            .then_with(|| y.b.count.cmp(&x.b.count))
            .then_with(|| x.a.id.cmp(&y.a.id))
    });
    let by_count =
        |x: &&DigestReport, y: &&DigestReport| y.count.cmp(&x.count).then(x.id.cmp(&y.id));
    out.only_a.sort_by(by_count);
    out.only_b.sort_by(by_count);
    out
}

fn run_line(name: &str, r: &Report) -> String {
    format!(
        "{} (test {}, prod {}, {}, {} commands, {} digests, test errors {}, mismatches {})",
        one_line(name, 120),
        one_line(&r.target, 64),
        one_line(&r.prod, 64),
        super::fmt_secs(r.duration_s),
        r.totals.commands,
        r.digests.len(),
        r.totals.test_errors,
        r.totals
            .row_mismatches
            .saturating_add(r.totals.result_mismatches)
    )
}

fn fmt_x(r: Option<f64>) -> String {
    super::fmt_ratio(r)
}

fn signed(v: i128) -> String {
    if v > 0 {
        format!("+{v}")
    } else {
        v.to_string()
    }
}

/// The diff as text for a terminal.
pub fn render_diff(
    name_a: &str,
    a: &Report,
    name_b: &str,
    b: &Report,
    top: Option<usize>,
) -> String {
    let d = diff(a, b);
    let top = top.unwrap_or(usize::MAX);
    let mut o = String::new();
    let _ = writeln!(o, "A: {}", run_line(name_a, a));
    let _ = writeln!(o, "B: {}", run_line(name_b, b));
    let _ = writeln!(
        o,
        "digests in both: {}, only in A: {}, only in B: {}",
        d.changed.len(),
        d.only_a.len(),
        d.only_b.len()
    );
    if !d.changed.is_empty() {
        let _ = writeln!(
            o,
            "\nTest server, B vs A, largest slowdown first{}:",
            if d.changed.len() > top {
                format!(" (top {top} of {})", d.changed.len())
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            o,
            "{:>4} {:<16} {:<12} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7} {:>7} {:>11} {:>11}  statement",
            "#", "digest", "command", "count A", "count B", "p50 A", "p50 B", "p50 x", "p99 A", "p99 B",
            "p99 x", "prod x", "test err Δ", "mismatch Δ"
        );
        for (i, c) in d.changed.iter().take(top).enumerate() {
            let lat = |l: &super::Latency, v: u64| {
                if l.count == 0 {
                    "-".to_string()
                } else {
                    fmt_us(v)
                }
            };
            let _ = writeln!(
                o,
                "{:>4} {:<16} {:<12} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7} {:>7} {:>11} {:>11}  {}",
                i + 1,
                one_line(&c.a.id, 16),
                one_line(&c.a.command, 12),
                c.a.count,
                c.b.count,
                lat(&c.a.test, c.a.test.p50_us),
                lat(&c.b.test, c.b.test.p50_us),
                fmt_x(c.test_p50_ratio),
                lat(&c.a.test, c.a.test.p99_us),
                lat(&c.b.test, c.b.test.p99_us),
                fmt_x(c.test_p99_ratio),
                fmt_x(c.prod_p50_ratio),
                signed(c.test_errors_delta),
                signed(c.mismatches_delta),
                one_line(&c.b.fingerprint, 72)
            );
        }
    }
    let changed_outcomes: Vec<_> = d
        .changed
        .iter()
        .filter(|c| {
            c.test_errors_delta != 0
                || c.mismatches_delta != 0
                || c.a.test_errors != c.b.test_errors
        })
        .collect();
    if !changed_outcomes.is_empty() {
        let _ = writeln!(o, "\nErrors or mismatches changed:");
        for c in changed_outcomes.iter().take(top) {
            let _ = writeln!(
                o,
                "  {:<16} test errors {} -> {}; mismatches {} -> {}  {}",
                one_line(&c.a.id, 16),
                super::fmt_errors(&c.a.test_errors),
                super::fmt_errors(&c.b.test_errors),
                c.a.mismatches(),
                c.b.mismatches(),
                one_line(&c.b.fingerprint, 72)
            );
        }
    }
    for (title, list) in [("Only in A", &d.only_a), ("Only in B", &d.only_b)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(o, "\n{title} (most frequent first):");
        for x in list.iter().take(top) {
            let _ = writeln!(
                o,
                "  {:<16} {:<12} {:>9}  {}",
                one_line(&x.id, 16),
                one_line(&x.command, 12),
                x.count,
                one_line(&x.fingerprint, 72)
            );
        }
        if list.len() > top {
            let _ = writeln!(o, "  ... {} more", list.len() - top);
        }
    }
    o
}
