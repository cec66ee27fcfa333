//! The collector: observations in, a [`Report`] out. Pure: no I/O, no clock (every time is
//! given), nothing shared; the driver owns one and feeds it what the transforms observed.
//!
//! # What is counted, and how
//!
//! * Commands are grouped by (digest id, command type): the [`Statement`] id already covers
//!   both. At most [`CollectorConfig::max_digests`] groups are kept; commands of further
//!   digests go to one "other" group (id `ffffffffffffffff`), so memory stays bounded however
//!   many shapes the clients invent.
//! * `--multiply N`: every copy observes production's answer to the same client command, but
//!   production ran it once. Production's side (`count`, its latency, errors, rows, bytes, QPS)
//!   is taken from copy 0 only, so per-digest counts match production's own counters; the test
//!   side counts every copy's answer (the test server did run it N times), and each copy's
//!   answer is compared with production's (`compared` can then exceed `commands`).
//! * Compared = both answers known. A command kept off by `--read-only`, or whose answer on
//!   either side was not seen, is *not compared* (never an error or a mismatch).
//! * Mismatches (deterministic statements only; a non-deterministic one is counted under
//!   `nondeterministic` instead): different row counts -> `row_mismatches`; same counts but
//!   different checksums (`--compare-results`; in order with ORDER BY, as a multiset without)
//!   or different reply kinds (OK vs result set) -> `result_mismatches`. ERR on one side only,
//!   or different codes, shows under the errors by code and as an `error` mismatch example,
//!   not as a result mismatch.
//! * Latencies go into log-linear histograms (8 buckets per power of two, so a percentile is
//!   at most 12.5 % above the true value; count, max and mean are exact).
//! * The per-second series keeps one point per second for 24 hours; past that, neighbouring
//!   points are merged pairwise (a point then covers 2, 4, ... seconds and holds the commands
//!   completed in its window), so it never exceeds [`CollectorConfig::max_points`] points.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use common::clock::Instant;
use common::mysql::digest::digest_hex;

use super::divergence::Divergence;
use super::model::{DigestReport, Latency, Mismatch, QpsPoint, Report, TargetSide, Totals, SCHEMA};
use super::observe::{Answer, AnswerKind, Observation, Statement, TestOutcome};

/// Bounds of a collector.
#[derive(Clone, Copy, Debug)]
pub struct CollectorConfig {
    /// Digest groups kept; beyond, commands go to the "other" group.
    pub max_digests: usize,
    /// Mismatch examples kept per digest.
    pub max_mismatch_examples: usize,
    /// Points of the per-second series kept before neighbours are merged.
    pub max_points: usize,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            max_digests: 10_000,
            max_mismatch_examples: 5,
            max_points: 24 * 3600,
        }
    }
}

/// What a report says about the run that the observations do not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportMeta {
    pub generated_unix_ms: u64,
    pub started_unix_ms: u64,
    pub copier_version: String,
    pub prod: String,
    pub target: String,
    pub compare_results: bool,
    pub literals: bool,
    /// `--tee`: every target, in `--target` order.
    pub tee_targets: Vec<String>,
}

/// The most `--tee` targets kept apart (the command line allows no more targets anyway).
const MAX_TEE: usize = 16;

/// Sub-buckets per power of two.
const SUB: u32 = 8;
const SUB_BITS: u32 = 3;
/// Latencies above 2^40 µs (12 days) share the last bucket.
const MAX_EXP: u32 = 40;

/// A log-linear latency histogram in microseconds, grown to the largest bucket used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    max: u64,
}

impl Histogram {
    fn index(us: u64) -> usize {
        if us < u64::from(SUB) {
            return us as usize;
        }
        let exp = (63 - us.leading_zeros()).min(MAX_EXP);
        let us = us.min((1u64 << (MAX_EXP + 1)) - 1);
        let sub = (us >> (exp - SUB_BITS)) & u64::from(SUB - 1);
        (SUB + (exp - SUB_BITS) * SUB) as usize + sub as usize
    }

    /// The largest value (µs) bucket `i` holds.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < u64::from(SUB) {
            return i;
        }
        let k = i - u64::from(SUB);
        let exp = k / u64::from(SUB) + u64::from(SUB_BITS);
        let sub = k % u64::from(SUB);
        let width = 1u64 << (exp - u64::from(SUB_BITS));
        (u64::from(SUB) + sub) * width + width - 1
    }

    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = Self::index(us);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.count += 1;
        self.sum += u128::from(us);
        self.max = self.max.max(us);
    }

    pub fn merge(&mut self, o: &Histogram) {
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.count += o.count;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `p` quantile (0..=1), µs: the upper bound of the bucket holding it, at most the
    /// largest sample. 0 without samples.
    pub fn quantile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::upper(i).min(self.max);
            }
        }
        self.max
    }

    pub fn latency(&self) -> Latency {
        Latency {
            count: self.count,
            p50_us: self.quantile(0.50),
            p90_us: self.quantile(0.90),
            p99_us: self.quantile(0.99),
            max_us: self.max,
            mean_us: if self.count == 0 {
                0.0
            } else {
                self.sum as f64 / self.count as f64
            },
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (Self::upper(i), *n))
                .collect(),
        }
    }
}

/// One digest's aggregates.
#[derive(Clone, Debug)]
struct Digest {
    statement: Arc<Statement>,
    count: u64,
    prod: Histogram,
    test: Histogram,
    prod_errors: BTreeMap<u16, u64>,
    test_errors: BTreeMap<u16, u64>,
    rows_prod: u64,
    rows_test: u64,
    bytes_prod: u64,
    bytes_test: u64,
    row_mismatches: u64,
    result_mismatches: u64,
    nondeterministic: bool,
    mismatch_examples: Vec<Mismatch>,
    /// `--tee`: each target's side (index = `Observation::target`); empty without.
    targets: Vec<Side>,
}

/// One `--tee` target's side of a digest.
#[derive(Clone, Debug, Default)]
struct Side {
    latency: Histogram,
    answered: u64,
    errors: BTreeMap<u16, u64>,
    rows: u64,
    bytes: u64,
    row_mismatches: u64,
    result_mismatches: u64,
}

impl Side {
    fn report(&self) -> TargetSide {
        TargetSide {
            answered: self.answered,
            latency: self.latency.latency(),
            errors: self.errors.clone(),
            rows: self.rows,
            bytes: self.bytes,
            row_mismatches: self.row_mismatches,
            result_mismatches: self.result_mismatches,
        }
    }
}

impl Digest {
    fn new(statement: Arc<Statement>) -> Self {
        Self {
            statement,
            count: 0,
            prod: Histogram::default(),
            test: Histogram::default(),
            prod_errors: BTreeMap::new(),
            test_errors: BTreeMap::new(),
            rows_prod: 0,
            rows_test: 0,
            bytes_prod: 0,
            bytes_test: 0,
            row_mismatches: 0,
            result_mismatches: 0,
            nondeterministic: false,
            mismatch_examples: Vec::new(),
            targets: Vec::new(),
        }
    }

    fn report(&self) -> DigestReport {
        let s = &self.statement;
        DigestReport {
            id: digest_hex(s.id),
            fingerprint: s.fingerprint.to_string(),
            command: s.command.to_string(),
            count: self.count,
            prod: self.prod.latency(),
            test: self.test.latency(),
            prod_errors: self.prod_errors.clone(),
            test_errors: self.test_errors.clone(),
            rows_prod: self.rows_prod,
            rows_test: self.rows_test,
            bytes_prod: self.bytes_prod,
            bytes_test: self.bytes_test,
            row_mismatches: self.row_mismatches,
            result_mismatches: self.result_mismatches,
            nondeterministic: self.nondeterministic,
            example: s.example.to_string(),
            mismatch_examples: self.mismatch_examples.clone(),
            per_target: self.targets.iter().map(Side::report).collect(),
        }
    }
}

/// Live figures for the status line: what completed since the previous call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LiveFigures {
    pub prod_qps: f64,
    pub test_qps: f64,
    pub prod_p99_us: u64,
    pub test_p99_us: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Collector {
    config: CollectorConfig,
    start: Instant,
    digests: HashMap<u64, Digest>,
    /// Commands of digests beyond `max_digests`.
    other: Option<Digest>,
    totals: Totals,
    /// Commands the test server did not run as production did (errors on one side only,
    /// unanswered): the losses the summary lists, kept whether or not a report is written.
    divergence: Divergence,
    /// Commands completed per window of `width_s` seconds: (production, test).
    points: Vec<(u64, u64)>,
    width_s: u64,
    window: (Histogram, Histogram, Instant),
    /// `--tee` targets whose sides are kept apart (0: none).
    tee: usize,
    /// The digest groups and the per-second series are kept: false when neither a report file
    /// nor a metrics page will read them (see [`Collector::totals_only`]).
    detailed: bool,
}

impl Collector {
    /// `start`: when mirroring started (the series' second 0), on the clock of the observations.
    pub fn new(config: CollectorConfig, start: Instant) -> Self {
        Self {
            config,
            start,
            digests: HashMap::new(),
            other: None,
            totals: Totals::default(),
            divergence: Divergence::default(),
            points: Vec::new(),
            width_s: 1,
            window: (Histogram::default(), Histogram::default(), start),
            tee: 0,
            detailed: true,
        }
    }

    /// Keeps only what the status line and the summary show (totals, the divergence, the live
    /// window): no digest group and no per-second series, which only a report file or the
    /// metrics page reads. Issue 20's profile of a copier without either put the digests'
    /// tally at 4 % of its user time.
    pub fn totals_only(&mut self) {
        self.detailed = false;
    }

    /// Keeps each of `targets` `--tee` targets' sides apart in every digest, besides their sum.
    /// Each side is one more histogram per digest: the digest bound shrinks to keep the
    /// collector within the memory it was sized for.
    pub fn set_tee(&mut self, targets: usize) {
        let targets = targets.min(MAX_TEE);
        self.tee = targets;
        if targets > 0 {
            self.config.max_digests = (self.config.max_digests * 2 / (2 + targets)).max(64);
        }
    }

    /// Digest groups kept (the "other" group not included).
    pub fn digests(&self) -> usize {
        self.digests.len()
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    pub fn divergence(&self) -> &Divergence {
        &self.divergence
    }

    fn digest(&mut self, s: &Arc<Statement>) -> &mut Digest {
        let full = self.digests.len() >= self.config.max_digests;
        if full && !self.digests.contains_key(&s.id) {
            return self.other.get_or_insert_with(|| {
                Digest::new(Arc::new(Statement {
                    id: u64::MAX,
                    command: "other",
                    fingerprint: "(digests beyond the limit)".into(),
                    example: String::new().into(),
                    traits: Default::default(),
                }))
            });
        }
        self.digests
            .entry(s.id)
            .or_insert_with(|| Digest::new(Arc::clone(s)))
    }

    fn point(&mut self, at: Instant) -> Option<&mut (u64, u64)> {
        if !self.detailed || at < self.start {
            return None;
        }
        let mut i = at.saturating_since(self.start).as_secs() / self.width_s;
        while i as usize >= self.config.max_points.max(2) {
            // Merge neighbours: half as many points, each twice as wide.
            let merged: Vec<(u64, u64)> = self
                .points
                .chunks(2)
                .map(|c| c.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)))
                .collect();
            self.points = merged;
            self.width_s *= 2;
            i /= 2;
        }
        let i = i as usize;
        if self.points.len() <= i {
            self.points.resize(i + 1, (0, 0));
        }
        self.points.get_mut(i)
    }

    pub fn observe(&mut self, o: &Observation) {
        self.divergence.observe(o);
        if matches!(o.test, TestOutcome::Resent) {
            // Counted once, by the session that sent it again (where production's answer is
            // not known: not compared).
            return;
        }
        // Production ran the command once, whatever the copies and targets it went to.
        let counts_prod = o.copy == 0 && o.target == 0;
        let (test, timed) = match o.test {
            TestOutcome::Answered(a) => (Some(a), true),
            // The test server refused the statement: its answer is that error, untimed.
            TestOutcome::Refused(code) => (
                Some(Answer {
                    kind: AnswerKind::Err(code),
                    rows: 0,
                    bytes: 0,
                    latency: Duration::ZERO,
                    done: Instant::ZERO,
                    waited: Duration::ZERO,
                    checksum: None,
                }),
                false,
            ),
            TestOutcome::Skipped
            | TestOutcome::Dropped
            | TestOutcome::Lost
            | TestOutcome::Resent
            | TestOutcome::Unseen => (None, false),
        };
        if counts_prod {
            self.totals.commands += 1;
            if let Some(p) = o.prod {
                if let AnswerKind::Err(_) = p.kind {
                    self.totals.prod_errors += 1;
                }
                if let Some(pt) = self.point(p.done) {
                    pt.0 += 1;
                }
                self.window.0.record(p.latency);
            }
        }
        if let Some(t) = test {
            if let AnswerKind::Err(_) = t.kind {
                self.totals.test_errors += 1;
            }
            if timed {
                if let Some(pt) = self.point(t.done) {
                    pt.1 += 1;
                }
                self.window.1.record(t.latency);
            }
        }
        let (Some(p), Some(t)) = (o.prod, test) else {
            if counts_prod || test.is_some() {
                self.totals.not_compared += 1;
            }
            self.tally(o, counts_prod, test, timed, None);
            return;
        };
        self.totals.compared += 1;
        let nondet = o.statement.traits.nondeterministic;
        let verdict = compare(&p, &t, o.statement.traits.ordered);
        if nondet {
            self.totals.nondeterministic += 1;
        } else {
            match verdict {
                Verdict::Rows => self.totals.row_mismatches += 1,
                Verdict::Result => self.totals.result_mismatches += 1,
                Verdict::Same | Verdict::Error => {}
            }
        }
        self.tally(o, counts_prod, test, timed, Some((p, t, verdict, nondet)));
    }

    /// The digest's share of an observation.
    fn tally(
        &mut self,
        o: &Observation,
        counts_prod: bool,
        test: Option<Answer>,
        timed: bool,
        compared: Option<(Answer, Answer, Verdict, bool)>,
    ) {
        if !self.detailed {
            return;
        }
        let max_examples = self.config.max_mismatch_examples;
        let tee = self.tee;
        let d = self.digest(&o.statement);
        let target = o.target as usize;
        if target < tee {
            if d.targets.len() < tee {
                d.targets.resize_with(tee, Side::default);
            }
            let side = &mut d.targets[target];
            if let Some(t) = test {
                side.answered += 1;
                if timed {
                    // Response time: A and B are compared as their clients would see them.
                    side.latency.record(t.latency.saturating_add(t.waited));
                }
                side.rows += t.rows;
                side.bytes += t.bytes;
                if let AnswerKind::Err(code) = t.kind {
                    *side.errors.entry(code).or_default() += 1;
                }
            }
            if let Some((_, _, verdict, false)) = compared {
                match verdict {
                    Verdict::Rows => side.row_mismatches += 1,
                    Verdict::Result => side.result_mismatches += 1,
                    Verdict::Same | Verdict::Error => {}
                }
            }
        }
        if counts_prod {
            d.count += 1;
            if let Some(p) = o.prod {
                d.prod.record(p.latency);
                d.rows_prod += p.rows;
                d.bytes_prod += p.bytes;
                if let AnswerKind::Err(code) = p.kind {
                    *d.prod_errors.entry(code).or_default() += 1;
                }
            }
        }
        if let Some(t) = test {
            if timed {
                d.test.record(t.latency);
            }
            d.rows_test += t.rows;
            d.bytes_test += t.bytes;
            if let AnswerKind::Err(code) = t.kind {
                *d.test_errors.entry(code).or_default() += 1;
            }
        }
        let Some((p, t, verdict, nondet)) = compared else {
            return;
        };
        if nondet {
            d.nondeterministic = true;
            return;
        }
        let kind = match verdict {
            Verdict::Same => return,
            Verdict::Rows => {
                d.row_mismatches += 1;
                "rows"
            }
            Verdict::Result => {
                d.result_mismatches += 1;
                "result"
            }
            Verdict::Error => "error",
        };
        if d.mismatch_examples.len() < max_examples {
            d.mismatch_examples.push(Mismatch {
                kind: kind.to_string(),
                prod: shown(&p),
                test: shown(&t),
                example: o.statement.example.to_string(),
            });
        }
    }

    /// What completed since the previous call (or the start), for the status line.
    pub fn take_live(&mut self, now: Instant) -> LiveFigures {
        let (prod, test, since) = std::mem::replace(
            &mut self.window,
            (Histogram::default(), Histogram::default(), now),
        );
        let secs = now.saturating_since(since).as_secs_f64();
        let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        LiveFigures {
            prod_qps: rate(prod.count()),
            test_qps: rate(test.count()),
            prod_p99_us: prod.quantile(0.99),
            test_p99_us: test.quantile(0.99),
        }
    }

    /// The report as of `now`.
    pub fn report(&self, now: Instant, meta: &ReportMeta) -> Report {
        let mut digests: Vec<DigestReport> = self.digests.values().map(Digest::report).collect();
        if let Some(o) = &self.other {
            digests.push(o.report());
        }
        // A stable order in the file (renderers rank for themselves).
        digests.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.id.cmp(&b.id)));
        let elapsed = now.saturating_since(self.start);
        // Every window up to now, empty ones included, so a chart's time axis is continuous.
        let last = (elapsed.as_secs() / self.width_s) as usize;
        let qps = (0..=last.max(self.points.len().saturating_sub(1)))
            .take(self.config.max_points.max(2))
            .map(|i| {
                let (prod, test) = self.points.get(i).copied().unwrap_or((0, 0));
                QpsPoint {
                    t_s: i as u64 * self.width_s,
                    prod,
                    test,
                }
            })
            .collect();
        Report {
            schema: SCHEMA.to_string(),
            generated_unix_ms: meta.generated_unix_ms,
            started_unix_ms: meta.started_unix_ms,
            duration_s: elapsed.as_secs_f64(),
            copier_version: meta.copier_version.clone(),
            prod: meta.prod.clone(),
            target: meta.target.clone(),
            compare_results: meta.compare_results,
            literals: meta.literals,
            totals: self.totals.clone(),
            qps,
            digests,
            tee_targets: meta.tee_targets.clone(),
            ab: None,
            // Filled by `reporting` from the resource sampler, not collected here.
            resources: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Same,
    /// Row counts differ.
    Rows,
    /// Checksums or reply kinds differ.
    Result,
    /// ERR on one side only, or different codes.
    Error,
}

fn compare(p: &Answer, t: &Answer, ordered: bool) -> Verdict {
    match (p.kind, t.kind) {
        (AnswerKind::Err(a), AnswerKind::Err(b)) if a == b => Verdict::Same,
        (AnswerKind::Err(_), _) | (_, AnswerKind::Err(_)) => Verdict::Error,
        (a, b) if a != b => Verdict::Result,
        _ if p.rows != t.rows => Verdict::Rows,
        _ => match (p.checksum, t.checksum) {
            (Some(a), Some(b)) if !a.same(&b, ordered) => Verdict::Result,
            _ => Verdict::Same,
        },
    }
}

/// An answer in a few words, for a mismatch example.
fn shown(a: &Answer) -> String {
    match a.kind {
        AnswerKind::Ok => "OK".to_string(),
        AnswerKind::Err(code) => format!("ERR {code}"),
        AnswerKind::Other => "other".to_string(),
        AnswerKind::ResultSet => match a.checksum {
            Some(c) => format!("rows={} checksum={:016x}", a.rows, c.unordered),
            None => format!("rows={}", a.rows),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::mysql::digest::{RowChecksum, Traits};

    fn t(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn stmt(id: u64, nondeterministic: bool) -> Arc<Statement> {
        Arc::new(Statement {
            id,
            command: "stmt_execute",
            fingerprint: format!("select c from sbtest{id} where id=?").into(),
            example: format!("SELECT c FROM sbtest{id} WHERE id=?").into(),
            traits: Traits {
                nondeterministic,
                ordered: false,
            },
        })
    }

    fn rows(n: u64, latency_us: u64, done_ms: u64, sum: Option<u64>) -> Answer {
        Answer {
            kind: AnswerKind::ResultSet,
            rows: n,
            bytes: 10 * n,
            latency: Duration::from_micros(latency_us),
            done: t(done_ms),
            waited: Duration::ZERO,
            checksum: sum.map(|s| RowChecksum {
                rows: n,
                ordered: s,
                unordered: s,
            }),
        }
    }

    fn obs(s: &Arc<Statement>, copy: u32, prod: Option<Answer>, test: TestOutcome) -> Observation {
        Observation {
            statement: Arc::clone(s),
            copy,
            target: 0,
            prod,
            test,
        }
    }

    #[test]
    fn histogram_buckets_are_tight_and_quantiles_bounded() {
        for v in [0u64, 1, 7, 8, 9, 15, 16, 17, 100, 1000, 123_456, 1 << 39] {
            let i = Histogram::index(v);
            assert!(Histogram::upper(i) >= v, "{v}");
            assert!(i == 0 || Histogram::upper(i - 1) < v, "{v}");
            assert!(Histogram::upper(i) as f64 <= v as f64 * 1.125 + 1.0, "{v}");
        }
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let l = h.latency();
        assert_eq!((l.count, l.max_us), (1000, 1000));
        assert!((500..=563).contains(&l.p50_us), "{}", l.p50_us);
        assert!((990..=1000).contains(&l.p99_us), "{}", l.p99_us);
        assert!((l.mean_us - 500.5).abs() < 1e-9);
        assert_eq!(l.buckets.iter().map(|b| b.1).sum::<u64>(), 1000);
        assert!(l.buckets.windows(2).all(|w| w[0].0 < w[1].0));
        // Huge values share the last bucket, no panic.
        h.record(Duration::from_secs(u64::MAX / 2));
        assert_eq!(h.latency().count, 1001);
    }

    #[test]
    fn answers_are_compared_and_tallied() {
        let mut c = Collector::new(CollectorConfig::default(), t(0));
        let a = stmt(1, false);
        let b = stmt(2, true);
        // Same answers.
        c.observe(&obs(
            &a,
            0,
            Some(rows(1, 100, 10, Some(7))),
            TestOutcome::Answered(rows(1, 300, 20, Some(7))),
        ));
        // Row counts differ.
        c.observe(&obs(
            &a,
            0,
            Some(rows(2, 100, 1010, None)),
            TestOutcome::Answered(rows(1, 300, 1020, None)),
        ));
        // Same count, other rows.
        c.observe(&obs(
            &a,
            0,
            Some(rows(1, 100, 1500, Some(7))),
            TestOutcome::Answered(rows(1, 300, 1600, Some(8))),
        ));
        // An error on the test server only.
        let mut e = rows(0, 50, 2500, None);
        e.kind = AnswerKind::Err(1142);
        c.observe(&obs(
            &a,
            0,
            Some(rows(1, 100, 2400, None)),
            TestOutcome::Answered(e),
        ));
        // Refused on the test server (its prepare failed there): an error without a latency.
        c.observe(&obs(
            &a,
            0,
            Some(rows(1, 100, 2400, None)),
            TestOutcome::Refused(1142),
        ));
        // Kept off by --read-only; production's answer lost.
        c.observe(&obs(
            &a,
            0,
            Some(rows(1, 100, 2400, None)),
            TestOutcome::Skipped,
        ));
        c.observe(&obs(
            &a,
            0,
            None,
            TestOutcome::Answered(rows(1, 100, 2600, None)),
        ));
        // Non-deterministic: differences are not mismatches.
        c.observe(&obs(
            &b,
            0,
            Some(rows(1, 100, 10, Some(1))),
            TestOutcome::Answered(rows(3, 300, 20, Some(2))),
        ));

        let r = c.report(t(3000), &ReportMeta::default());
        assert_eq!(r.schema, SCHEMA);
        let tt = &r.totals;
        assert_eq!(
            (
                tt.commands,
                tt.compared,
                tt.not_compared,
                tt.row_mismatches,
                tt.result_mismatches,
                tt.test_errors,
                tt.nondeterministic
            ),
            (8, 6, 2, 1, 1, 2, 1)
        );
        let da = r.digests.iter().find(|d| d.id == digest_hex(1)).unwrap();
        assert_eq!(da.count, 7);
        assert_eq!(da.prod.count, 6);
        assert_eq!(da.test.count, 5);
        assert_eq!(da.test_errors.get(&1142), Some(&2));
        assert_eq!((da.row_mismatches, da.result_mismatches), (1, 1));
        let kinds: Vec<_> = da
            .mismatch_examples
            .iter()
            .map(|m| m.kind.as_str())
            .collect();
        assert_eq!(kinds, ["rows", "result", "error", "error"]);
        assert_eq!(da.mismatch_examples[2].test, "ERR 1142");
        assert_eq!(da.example, "SELECT c FROM sbtest1 WHERE id=?");
        let db = r.digests.iter().find(|d| d.id == digest_hex(2)).unwrap();
        assert!(db.nondeterministic);
        assert_eq!(db.mismatches(), 0);
        // The series: seconds 0, 1, 2 (3 s elapsed: a 4th, empty, point for second 3).
        let qps: Vec<_> = r.qps.iter().map(|p| (p.t_s, p.prod, p.test)).collect();
        assert_eq!(qps, [(0, 2, 2), (1, 2, 2), (2, 3, 2), (3, 0, 0)]);
        assert!((r.duration_s - 3.0).abs() < 1e-9);
    }

    #[test]
    fn copies_count_production_once_and_the_test_server_every_time() {
        let mut c = Collector::new(CollectorConfig::default(), t(0));
        let a = stmt(1, false);
        for copy in 0..3 {
            c.observe(&obs(
                &a,
                copy,
                Some(rows(1, 100, 10, None)),
                TestOutcome::Answered(rows(1, 200, 20, None)),
            ));
        }
        let r = c.report(t(1000), &ReportMeta::default());
        let d = &r.digests[0];
        assert_eq!((d.count, d.prod.count, d.test.count), (1, 1, 3));
        assert_eq!((d.rows_prod, d.rows_test), (1, 3));
        assert_eq!((r.totals.commands, r.totals.compared), (1, 3));
        assert_eq!(r.qps[0].prod, 1);
        assert_eq!(r.qps[0].test, 3);
    }

    #[test]
    fn tee_targets_are_kept_apart_and_production_counted_once() {
        let mut c = Collector::new(CollectorConfig::default(), t(0));
        c.set_tee(2);
        let a = stmt(1, false);
        for target in 0..2 {
            let mut o = obs(
                &a,
                0,
                Some(rows(2, 100, 10, None)),
                TestOutcome::Answered(rows(2 + target as u64, 200 * (1 + target as u64), 20, None)),
            );
            o.target = target;
            c.observe(&o);
        }
        let r = c.report(t(1000), &ReportMeta::default());
        let d = &r.digests[0];
        assert_eq!((d.count, d.prod.count, d.test.count), (1, 1, 2));
        assert_eq!(r.totals.commands, 1);
        let sides: Vec<_> = d
            .per_target
            .iter()
            .map(|s| (s.answered, s.rows, s.latency.count, s.row_mismatches))
            .collect();
        assert_eq!(sides, [(1, 2, 1, 0), (1, 3, 1, 1)]);
        assert!(d.per_target[1].latency.p50_us > d.per_target[0].latency.p50_us);
    }

    #[test]
    fn totals_only_keeps_what_the_summary_shows() {
        let feed = |c: &mut Collector| {
            for id in 0..4 {
                let s = stmt(id, false);
                c.observe(&obs(
                    &s,
                    0,
                    Some(rows(1, 100, 1000 + id, None)),
                    TestOutcome::Answered(rows(1 + id % 2, 150, 1000 + id, None)),
                ));
                c.observe(&obs(
                    &s,
                    0,
                    Some(rows(1, 100, 2000, None)),
                    TestOutcome::Lost,
                ));
                c.observe(&obs(
                    &s,
                    0,
                    Some(rows(1, 100, 2000, None)),
                    TestOutcome::Refused(1146),
                ));
            }
        };
        let mut full = Collector::new(CollectorConfig::default(), t(0));
        let mut lean = Collector::new(CollectorConfig::default(), t(0));
        lean.totals_only();
        feed(&mut full);
        feed(&mut lean);
        assert_eq!(lean.totals(), full.totals());
        assert_eq!(lean.divergence().rows(), full.divergence().rows());
        assert_eq!(lean.take_live(t(3000)), full.take_live(t(3000)));
        assert_eq!((full.digests(), lean.digests()), (4, 0));
        let r = lean.report(t(3000), &ReportMeta::default());
        assert!(r.digests.is_empty());
        assert!(
            r.qps.iter().all(|p| (p.prod, p.test) == (0, 0)),
            "{:?}",
            r.qps
        );
    }

    #[test]
    fn digests_and_the_series_stay_bounded() {
        let config = CollectorConfig {
            max_digests: 3,
            max_mismatch_examples: 1,
            max_points: 4,
        };
        let mut c = Collector::new(config, t(0));
        for id in 0..10 {
            let s = stmt(id, false);
            c.observe(&obs(
                &s,
                0,
                Some(rows(1, 1, id * 1000, None)),
                TestOutcome::Answered(rows(2, 1, id * 1000, None)),
            ));
        }
        assert_eq!(c.digests(), 3);
        let r = c.report(t(10_000), &ReportMeta::default());
        assert_eq!(r.digests.len(), 4);
        let other = r.digests.iter().find(|d| d.command == "other").unwrap();
        assert_eq!((other.id.as_str(), other.count), ("ffffffffffffffff", 7));
        assert_eq!(other.mismatch_examples.len(), 1);
        assert!(r.qps.len() <= 4, "{:?}", r.qps);
        assert_eq!(r.qps.iter().map(|p| p.prod).sum::<u64>(), 10);
        assert_eq!(r.qps[1].t_s, r.qps[0].t_s + 4);
    }

    #[test]
    fn live_figures_cover_the_last_interval() {
        let mut c = Collector::new(CollectorConfig::default(), t(0));
        let a = stmt(1, false);
        for i in 0..10 {
            c.observe(&obs(
                &a,
                0,
                Some(rows(1, 100 + i, 10, None)),
                TestOutcome::Answered(rows(1, 1000, 20, None)),
            ));
        }
        let l = c.take_live(t(2000));
        assert!((l.prod_qps - 5.0).abs() < 1e-9);
        assert!((l.test_qps - 5.0).abs() < 1e-9);
        assert!((100..=115).contains(&l.prod_p99_us));
        assert_eq!(l.test_p99_us, 1000);
        assert_eq!(c.take_live(t(3000)), LiveFigures::default());
    }
}
