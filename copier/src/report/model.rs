//! The comparison report's data model: what production and the test server did, digest by
//! digest, over one run. It is the versioned machine interface behind `report.json` (schema
//! [`SCHEMA`]) and the single input of every renderer (text, HTML, Prometheus, `report diff`).
//!
//! This room holds plain data and pure arithmetic over it (ratios, the regression ordering).
//! It must never do I/O, keep histograms or know how observations are collected: the
//! collector fills a `Report`, the renderers only read one.
//!
//! Compatibility: within `tcpshadow.report/1` fields are only ever added, never renamed or
//! re-typed; every struct deserialises with `#[serde(default)]` so a reader of a newer file
//! keeps working and an older file yields defaults for fields it did not have.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The schema name and major version written in [`Report::schema`]. A change that is not
/// purely additive bumps the number.
pub const SCHEMA: &str = "tcpshadow.report/1";

/// One run's comparison of production and the test server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default)]
pub struct Report {
    /// Always [`SCHEMA`] when written by this version; readers refuse another value.
    pub schema: String,
    /// When this report was produced, milliseconds since the Unix epoch (copier's clock).
    pub generated_unix_ms: u64,
    /// When mirroring started, milliseconds since the Unix epoch (copier's clock).
    pub started_unix_ms: u64,
    /// Seconds of mirroring covered by this report (start to `generated_unix_ms`).
    #[serde(deserialize_with = "f64_or_null")]
    pub duration_s: f64,
    /// The copier's version (`CARGO_PKG_VERSION`, possibly with a git suffix).
    pub copier_version: String,
    /// The production server mirrored, `"ip:port"`.
    pub prod: String,
    /// The test server mirrored to, `"ip:port"`.
    pub target: String,
    /// Whether result checksums were compared (`--compare-results`); without it only row
    /// counts and error codes are compared and `result_mismatches` stay 0.
    pub compare_results: bool,
    /// Whether examples keep their literal values (`true`) or show the fingerprint with
    /// placeholders (`false`, the default: literals may be personal data).
    pub literals: bool,
    /// Run-wide counts over all commands.
    pub totals: Totals,
    /// Commands completed per second, one point per second since start, ascending `t_s`.
    pub qps: Vec<QpsPoint>,
    /// One entry per (digest, command type). Order is not significant in the file;
    /// renderers sort with [`cmp_regression`].
    pub digests: Vec<DigestReport>,
    /// `--tee`: every test server mirrored to, in `--target` order (`target` is the first);
    /// empty without `--tee`. `DigestReport::per_target` follows this order.
    pub tee_targets: Vec<String>,
    /// `--tee`: the first two targets compared with each other (test A vs test B), digest by
    /// digest, against an A/A calibration's noise when one was given (see `super::ab`).
    pub ab: Option<super::ab::AbComparison>,
    /// Per test server, what its host and server spent, sampled every second
    /// (`--target-metrics`, `--target-sql-metrics`); empty when not sampled.
    pub resources: Vec<super::resources::TargetResources>,
}

impl Default for Report {
    // Not derived: an empty report still names its schema, so a report written before any
    // command arrived is readable by `report diff`.
    fn default() -> Self {
        Report {
            schema: SCHEMA.to_string(),
            generated_unix_ms: 0,
            started_unix_ms: 0,
            duration_s: 0.0,
            copier_version: String::new(),
            prod: String::new(),
            target: String::new(),
            compare_results: false,
            literals: false,
            totals: Totals::default(),
            qps: Vec::new(),
            digests: Vec::new(),
            tee_targets: Vec::new(),
            ab: None,
            resources: Vec::new(),
        }
    }
}

impl Report {
    /// The digests, worst regression first (see [`cmp_regression`]).
    pub fn ranked(&self) -> Vec<&DigestReport> {
        let mut v: Vec<&DigestReport> = self.digests.iter().collect();
        v.sort_by(|a, b| cmp_regression(a, b));
        v
    }

    /// Mean commands per second over the run, production side (0 for an empty run).
    pub fn mean_qps_prod(&self) -> f64 {
        per_second(
            self.qps.iter().map(|p| p.prod as f64).sum(),
            self.duration_s,
        )
    }

    /// Mean commands per second over the run, test side (0 for an empty run).
    pub fn mean_qps_test(&self) -> f64 {
        per_second(
            self.qps.iter().map(|p| p.test as f64).sum(),
            self.duration_s,
        )
    }
}

// In f64: a report read from a file may hold counts whose sum overflows u64.
fn per_second(n: f64, secs: f64) -> f64 {
    if secs > 0.0 && secs.is_finite() {
        n / secs
    } else {
        0.0
    }
}

/// Run-wide counts. Every command counted in `commands` is in exactly one digest.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Totals {
    /// Commands seen from clients and mirrored (sum of the digests' `count`).
    pub commands: u64,
    /// Commands for which both answers were known and compared.
    pub compared: u64,
    /// Commands production answered with an ERR packet.
    pub prod_errors: u64,
    /// Commands the test server answered with an ERR packet.
    pub test_errors: u64,
    /// Result sets whose row counts differed (deterministic commands only).
    pub row_mismatches: u64,
    /// Result sets with equal row counts whose checksums differed (`--compare-results`),
    /// or whose kinds differed (OK vs result set; ERR vs non-ERR counts under errors).
    pub result_mismatches: u64,
    /// Compared commands whose results are non-deterministic (NOW(), RAND(), UUID(),
    /// unordered results...): their differences are not counted as mismatches.
    pub nondeterministic: u64,
    /// Commands for which one answer was missing (session lost, reply not summarised,
    /// run ended first): counted, never compared.
    pub not_compared: u64,
}

/// Commands completed during one second of the run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct QpsPoint {
    /// Seconds since the run started (`Report::started_unix_ms`); the point covers
    /// `[t_s, t_s + 1)`.
    pub t_s: u64,
    /// Commands production completed (its reply's last packet) in that second.
    pub prod: u64,
    /// Commands the test server completed (intercept's summary received) in that second.
    pub test: u64,
}

/// One digest: all commands of one normalised fingerprint and command type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct DigestReport {
    /// Stable digest id: 16 lower-case hex digits (64-bit hash of command type + fingerprint),
    /// the key `report diff` matches runs by.
    pub id: String,
    /// The normalised statement: literals, IN-lists and multi-row VALUES collapsed, comments
    /// and whitespace removed. Untrusted text: renderers escape it.
    pub fingerprint: String,
    /// MySQL command type: `"query"`, `"stmt_execute"`, `"stmt_prepare"`, `"init_db"`, ...
    pub command: String,
    /// Commands of this digest mirrored.
    pub count: u64,
    /// Production latency: command's last packet to reply's last packet, on the prod host.
    pub prod: Latency,
    /// Test latency: command sent to intercept's summary of the complete reply received,
    /// on the copier's clock (includes the control channel's delay).
    pub test: Latency,
    /// Production ERR replies by MySQL error code (e.g. 1146) -> count.
    pub prod_errors: BTreeMap<u16, u64>,
    /// Test-server ERR replies by MySQL error code -> count.
    pub test_errors: BTreeMap<u16, u64>,
    /// Rows returned by production, summed over the digest's commands.
    pub rows_prod: u64,
    /// Rows returned by the test server, summed.
    pub rows_test: u64,
    /// Reply bytes (MySQL payload) sent by production, summed.
    pub bytes_prod: u64,
    /// Reply bytes sent by the test server, summed.
    pub bytes_test: u64,
    /// Commands whose row counts differed (see [`Totals::row_mismatches`]).
    pub row_mismatches: u64,
    /// Commands whose results differed otherwise (see [`Totals::result_mismatches`]).
    pub result_mismatches: u64,
    /// The digest's results are non-deterministic: differences were not counted.
    pub nondeterministic: bool,
    /// One statement of this digest: with literals if `Report::literals`, else the
    /// fingerprint. Untrusted text.
    pub example: String,
    /// A few (bounded by the collector) concrete mismatches, first seen first.
    pub mismatch_examples: Vec<Mismatch>,
    /// `--tee`: each test server's side alone, in [`Report::tee_targets`] order; empty without
    /// `--tee` (the `test` fields above then hold every target's answers together).
    pub per_target: Vec<TargetSide>,
}

/// One `--tee` target's answers to one digest's commands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TargetSide {
    /// Commands this target answered (errors included; refused ones untimed).
    pub answered: u64,
    /// Its response time: as [`DigestReport::test`], plus the time a command waited on that
    /// server behind the reply before it. `test` leaves the wait out (the server's time on the
    /// command alone); between two test servers the wait is part of the difference: a server
    /// that falls behind is slower for its clients, and leaving it out would make the commands
    /// queued behind a slow one look fast.
    pub latency: Latency,
    /// ERR replies by code.
    pub errors: BTreeMap<u16, u64>,
    /// Rows returned, summed.
    pub rows: u64,
    /// Reply bytes, summed.
    pub bytes: u64,
    /// Its answers whose row counts differed from production's.
    pub row_mismatches: u64,
    /// Its answers that differed from production's otherwise (checksums, reply kinds).
    pub result_mismatches: u64,
}

impl TargetSide {
    /// Errors this target returned that production did not, per code, summed.
    pub fn new_errors(&self, prod: &BTreeMap<u16, u64>) -> u64 {
        self.errors
            .iter()
            .map(|(code, n)| n.saturating_sub(prod.get(code).copied().unwrap_or(0)))
            .fold(0u64, u64::saturating_add)
    }
}

impl DigestReport {
    /// Test p50 / prod p50; `None` without samples on both sides. A prod p50 of 0 µs is taken
    /// as 1 µs so the ratio stays finite.
    pub fn ratio_p50(&self) -> Option<f64> {
        ratio(&self.prod, &self.test, |l| l.p50_us)
    }

    /// Test p99 / prod p99, as [`ratio_p50`](Self::ratio_p50).
    pub fn ratio_p99(&self) -> Option<f64> {
        ratio(&self.prod, &self.test, |l| l.p99_us)
    }

    /// Test-side errors production did not have: per code, test count minus prod count when
    /// positive, summed. An error both servers return (a client bug) is not a regression.
    pub fn new_test_errors(&self) -> u64 {
        self.test_errors
            .iter()
            .map(|(code, n)| n.saturating_sub(self.prod_errors.get(code).copied().unwrap_or(0)))
            .fold(0u64, u64::saturating_add)
    }

    /// Row plus result mismatches.
    pub fn mismatches(&self) -> u64 {
        self.row_mismatches.saturating_add(self.result_mismatches)
    }

    /// Total errors on each side, (prod, test).
    pub fn error_totals(&self) -> (u64, u64) {
        let sum = |m: &BTreeMap<u16, u64>| m.values().fold(0u64, |a, b| a.saturating_add(*b));
        (sum(&self.prod_errors), sum(&self.test_errors))
    }

    /// How much slower the test server is for this digest, weighted by how often it runs:
    /// `(log2(ratio_p50) + 0.5 * log2(ratio_p99)) * log10(10 + count)`.
    ///
    /// Logarithms make 2x slower and 2x faster symmetric (+1 / -1) and keep one pathological
    /// outlier from dwarfing everything; p99 counts half because it is noisier; the count
    /// weight (1 at count 0, 2 at 90, 4 at ~10^4) lets a 2x slowdown of a hot query outrank a
    /// 3x slowdown of a query run twice without letting volume alone rank a digest that is
    /// not slower. Negative means faster; 0 without latency samples.
    ///
    /// Two guards keep noise out of the top of the ranking (the demo's first report put
    /// eight-sample prepares answered in 1-100 us above every real statement): latencies
    /// below [`SCORE_FLOOR_US`] count as the floor (below it, scheduling and relay jitter
    /// on either host dominate the ratio), and a digest with fewer than [`SCORE_MIN_COUNT`]
    /// commands has its score scaled down in proportion. The ratios shown are not changed.
    pub fn slowdown_score(&self) -> f64 {
        if self.prod.count == 0 || self.test.count == 0 {
            return 0.0;
        }
        let floored = |t: &Latency, p: &Latency, f: fn(&Latency) -> u64| {
            f(t).max(SCORE_FLOOR_US) as f64 / f(p).max(SCORE_FLOOR_US) as f64
        };
        let r50 = floored(&self.test, &self.prod, |l| l.p50_us);
        let r99 = floored(&self.test, &self.prod, |l| l.p99_us);
        let confidence = (self.count as f64 / SCORE_MIN_COUNT as f64).min(1.0);
        (r50.log2() + 0.5 * r99.log2()) * (10.0 + self.count as f64).log10() * confidence
    }
}

/// Latencies below this count as this in [`DigestReport::slowdown_score`], in microseconds.
pub const SCORE_FLOOR_US: u64 = 100;
/// Digests with fewer commands get a proportionally smaller [`DigestReport::slowdown_score`].
pub const SCORE_MIN_COUNT: u64 = 30;

fn ratio(prod: &Latency, test: &Latency, f: impl Fn(&Latency) -> u64) -> Option<f64> {
    if prod.count == 0 || test.count == 0 {
        return None;
    }
    Some(f(test).max(1) as f64 / f(prod).max(1) as f64)
}

/// The report's ordering, worst regression first. Lexicographic, because the kinds are not
/// commensurable (no number of milliseconds is worth one wrong answer):
///
/// 1. more [new test-side errors](DigestReport::new_test_errors) (the test server fails
///    where production did not);
/// 2. more [mismatches](DigestReport::mismatches) (different answers);
/// 3. higher [`slowdown_score`](DigestReport::slowdown_score);
/// 4. higher count, then id, so the order is total and stable between runs.
pub fn cmp_regression(a: &DigestReport, b: &DigestReport) -> Ordering {
    b.new_test_errors()
        .cmp(&a.new_test_errors())
        .then_with(|| b.mismatches().cmp(&a.mismatches()))
        .then_with(|| b.slowdown_score().total_cmp(&a.slowdown_score()))
        .then_with(|| b.count.cmp(&a.count))
        .then_with(|| a.id.cmp(&b.id))
}

/// JSON has no NaN or infinity: serde_json writes them as `null`. Reading `null` back as 0
/// keeps a report with a non-finite float (a bug, but not worth losing the run over) readable.
fn f64_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(0.0))
}

/// A latency distribution, microseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Latency {
    /// Samples measured (may be below the digest's count: a missing reply has no latency).
    pub count: u64,
    /// Median, µs (from the histogram: an upper bound of the bucket holding it).
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Largest sample, µs (exact).
    pub max_us: u64,
    /// Arithmetic mean, µs (exact).
    #[serde(deserialize_with = "f64_or_null")]
    pub mean_us: f64,
    /// `(upper bound µs inclusive, samples)`, log-spaced bounds, ascending, non-empty
    /// buckets only; a bucket holds samples above the previous bucket's bound of the
    /// collector's full scale (not necessarily the previous entry here).
    pub buckets: Vec<(u64, u64)>,
}

impl Latency {
    /// A distribution from raw samples (µs) with 1-2-5 bucket bounds. For tests and small
    /// inputs: it sorts a copy; the live collector keeps histograms instead.
    pub fn from_samples(samples: &[u64]) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let q = |p: f64| {
            let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
            s[rank - 1]
        };
        let mut buckets: Vec<(u64, u64)> = Vec::new();
        for &v in &s {
            let ub = bucket_bound_125(v);
            match buckets.last_mut() {
                Some((b, n)) if *b == ub => *n += 1,
                _ => buckets.push((ub, 1)),
            }
        }
        let sum: u128 = s.iter().map(|&v| v as u128).sum();
        Latency {
            count: s.len() as u64,
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            max_us: s[s.len() - 1],
            mean_us: sum as f64 / s.len() as f64,
            buckets,
        }
    }
}

/// The smallest 1-2-5 series value (1, 2, 5, 10, 20, 50, ...) at or above `v`.
pub fn bucket_bound_125(v: u64) -> u64 {
    let mut decade: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            let b = decade.saturating_mul(m);
            if v <= b || b == u64::MAX {
                return b;
            }
        }
        decade = decade.saturating_mul(10);
    }
}

/// One concrete difference between the two answers to a command.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Mismatch {
    /// `"rows"` (row counts differ), `"result"` (checksums or reply kinds differ) or
    /// `"error"` (one side answered ERR, or both with different codes).
    pub kind: String,
    /// Production's answer, short human form, e.g. `"rows=10"`, `"ERR 1146"`, `"OK"`.
    pub prod: String,
    /// The test server's answer, same form.
    pub test: String,
    /// The statement (subject to `Report::literals`). Untrusted text.
    pub example: String,
}
