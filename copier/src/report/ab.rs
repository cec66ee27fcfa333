//! Test A against test B (`--tee`): which digests one test server ran differently from the
//! other on the same traffic, told apart from noise.
//!
//! # What this room is for
//!
//! Pure arithmetic over a [`Report`] whose digests carry each target's side
//! ([`DigestReport::per_target`]). For every digest it takes the p50 latency of A and B with a
//! distribution-free confidence interval (order statistics: the ranks `nq +- z sqrt(nq(1-q))`
//! read from the histogram), and the interval of the ratio B/A that follows from both
//! (`[lo_B / hi_A, hi_B / lo_A]`, conservative). The p50s themselves are read at their
//! buckets' upper bounds (the same quantisation on both, so equal distributions give equal
//! figures), but an interval's low end is the *lower* edge of the bucket its rank falls in:
//! a bucket is up to 12.5 % wide, and an interval read at upper bounds alone can shrink to
//! one point (`1.10-1.10`) that claims a precision the histogram never had.
//!
//! Without a calibration a difference is *flagged* only when that whole interval lies outside
//! `1 +- DEFAULT_NOISE`. With an **A/A calibration** (the report of a `--tee` run onto two
//! identical servers) the A/B ratio is judged against the ratio the A/A run measured for the
//! digest: flagged when the interval clears `1 +- MIN_EFFECT` *and* the two ratios differ by
//! more than both runs' uncertainty combined (in logarithms, the two intervals' half-widths
//! on the facing sides added in quadrature: each run's sampling noise is independent of the
//! other's). So a digest that is 15 % slower on B in every A/A run (one server shares its core
//! with something) is not flagged for being 15 % slower in the A/B run; and an A/A run that saw
//! a digest a few hundred times does not blind the comparison to it, as requiring the A/B
//! interval to clear the A/A *interval* did (the sampling noise counted twice: a 1.67x
//! slowdown, interval 1.13-3.34, went unflagged against an A/A interval of 0.72-1.23). The
//! band shown is the A/A interval, widened to at least `1 +- MIN_EFFECT`. A digest under
//! `MIN_COUNT` commands on either side is never flagged (its interval says little).
//!
//! Ranked by impact: the time B spent more than A on the digest (`n_B x (p50_B - p50_A)`),
//! flagged digests first, so a 2x slowdown of a statement run 13,000 times outranks one run
//! eight times.
//!
//! # What it must never do
//!
//! * I/O or clocks; panic on a report it did not write (empty buckets, zero latencies,
//!   counts that overflow).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::model::{DigestReport, Latency, Report, TargetSide};
use super::ReportError;

/// Commands on each side below which a digest is never flagged.
pub const MIN_COUNT: u64 = 30;
/// The least relative p50 difference ever flagged, calibrated or not: histogram buckets are
/// up to 12.5 % wide, so a smaller difference may be one bucket's.
pub const MIN_EFFECT: f64 = 0.15;
/// The noise band without a calibration of the digest: `[1 / 1.25, 1.25]`.
pub const DEFAULT_NOISE: f64 = 0.25;
/// z of the two-sided 99 % interval: with a few dozen digests a 95 % one would flag one of
/// them by chance in most runs.
pub const Z: f64 = 2.576;

/// The comparison of two `--tee` targets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct AbComparison {
    /// Test A (`--target` position `a_index`) and B, `"ip:port"`.
    pub a: String,
    pub b: String,
    /// Where the noise bands came from: an A/A report's path, or `None` (default band).
    pub calibration: Option<String>,
    /// Digests flagged (their `verdict` is `slower`, `faster` or `errors`).
    pub flagged: u64,
    /// Every digest with commands on either side, flagged first, then by |impact|.
    pub digests: Vec<AbDigest>,
}

/// One digest, A against B.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct AbDigest {
    pub id: String,
    pub command: String,
    /// Untrusted text (clients' SQL shape): renderers escape it.
    pub fingerprint: String,
    /// Timed answers on A and on B.
    pub n_a: u64,
    pub n_b: u64,
    pub p50_a_us: u64,
    pub p50_b_us: u64,
    pub p99_a_us: u64,
    pub p99_b_us: u64,
    /// p50 B / p50 A and its confidence interval (0 when a side has no samples).
    pub ratio_p50: f64,
    pub ratio_low: f64,
    pub ratio_high: f64,
    /// The band inside which a ratio is noise for this digest: the default band, or the A/A
    /// run's interval widened to at least `1 +- MIN_EFFECT`.
    pub noise_low: f64,
    pub noise_high: f64,
    /// The A/A run's p50 ratio for this digest (0 without a calibration of it).
    pub aa_ratio: f64,
    /// Whether the band came from the calibration (else the default band).
    pub calibrated: bool,
    /// `slower` / `faster` (B against A, beyond the band), `errors` (B returned errors A did
    /// not, or the reverse), `same`, or `too_few` (under [`MIN_COUNT`] on a side).
    pub verdict: String,
    /// `n_B x (p50_B - p50_A)`, µs: the time B spent more (negative: less) on this digest.
    pub impact_us: f64,
    /// Errors each side returned that production did not.
    pub new_errors_a: u64,
    pub new_errors_b: u64,
    /// Answers that differed from production's (rows or results) on each side.
    pub mismatches_a: u64,
    pub mismatches_b: u64,
    /// p99 B / p99 A and its 99 % interval, as for p50 (shown, not judged: a p99 needs a
    /// hundred times the samples of a p50 to be as sure).
    pub ratio_p99: f64,
    pub ratio_p99_low: f64,
    pub ratio_p99_high: f64,
    /// Rows each side returned, summed.
    pub rows_a: u64,
    pub rows_b: u64,
}

impl AbDigest {
    pub fn flagged(&self) -> bool {
        matches!(self.verdict.as_str(), "slower" | "faster" | "errors")
    }
}

/// Noise bands per digest id, learnt from an A/A run.
#[derive(Clone, Debug, Default)]
pub struct Calibration {
    /// Where it was read from, for the report.
    pub source: String,
    /// Per digest id, the A/A run's `(ratio, low, high)`.
    bands: HashMap<String, (f64, f64, f64)>,
}

impl Calibration {
    /// The bands of `aa`, a `--tee` report onto two servers meant to be identical (its first
    /// two targets). `None` when it has no per-target sides to learn from.
    pub fn from_report(aa: &Report, source: String) -> Option<Self> {
        if aa.tee_targets.len() < 2 {
            return None;
        }
        let mut bands = HashMap::new();
        for d in &aa.digests {
            let (Some(a), Some(b)) = (d.per_target.first(), d.per_target.get(1)) else {
                continue;
            };
            if a.latency.count < MIN_COUNT || b.latency.count < MIN_COUNT {
                continue;
            }
            if let Some(aa) = ratio_interval(&a.latency, &b.latency) {
                bands.insert(d.id.clone(), aa);
            }
        }
        Some(Self { source, bands })
    }

    /// The calibration in the report.json at `path`; the error says how to make one when the
    /// file is not the report of a `--tee` run.
    pub fn read(path: &std::path::Path) -> Result<Self, ReportError> {
        let aa = super::read_report(path)?;
        let shown = path.display().to_string();
        Self::from_report(&aa, shown.clone()).ok_or_else(|| {
            ReportError::Cannot(format!(
                "{shown} is not the report of a --tee run (it compares no two targets): run the \
                 copier with --tee onto two identical test servers and --report DIR, then give \
                 DIR/report.json"
            ))
        })
    }

    /// Digests with a band.
    pub fn len(&self) -> usize {
        self.bands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bands.is_empty()
    }

    fn get(&self, id: &str) -> Option<(f64, f64, f64)> {
        self.bands.get(id).copied()
    }
}

/// The band shown for an A/A `(ratio, low, high)`: its interval, at least `1 +- MIN_EFFECT`.
fn shown_band((_, lo, hi): (f64, f64, f64)) -> (f64, f64) {
    (lo.min(1.0 / (1.0 + MIN_EFFECT)), hi.max(1.0 + MIN_EFFECT))
}

/// The calibrated verdict: `Some("slower")`/`Some("faster")` when the A/B `(ratio, low,
/// high)` clears `1 +- MIN_EFFECT` and differs from the A/A one by more than both intervals'
/// facing half-widths in quadrature (logarithms: ratios compose by multiplication).
fn beyond_calibration(ab: (f64, f64, f64), aa: (f64, f64, f64)) -> Option<&'static str> {
    let ln = |x: f64| x.max(f64::MIN_POSITIVE).ln();
    let ((r, lo, hi), (r0, lo0, hi0)) = (ab, aa);
    let d = ln(r) - ln(r0);
    if lo > 1.0 + MIN_EFFECT && d > 0.0 {
        let h = (ln(r) - ln(lo)).hypot(ln(hi0) - ln(r0));
        return (d > h).then_some("slower");
    }
    if hi < 1.0 / (1.0 + MIN_EFFECT) && d < 0.0 {
        let h = (ln(hi) - ln(r)).hypot(ln(r0) - ln(lo0));
        return (-d > h).then_some("faster");
    }
    None
}

/// Compares targets `a` and `b` (positions in `report.tee_targets`) digest by digest.
/// `None` when the report has no such targets.
pub fn compare(
    report: &Report,
    a: usize,
    b: usize,
    calibration: Option<&Calibration>,
) -> Option<AbComparison> {
    let name_a = report.tee_targets.get(a)?.clone();
    let name_b = report.tee_targets.get(b)?.clone();
    let mut digests: Vec<AbDigest> = report
        .digests
        .iter()
        .filter_map(|d| {
            let (sa, sb) = (d.per_target.get(a)?, d.per_target.get(b)?);
            (sa.answered > 0 || sb.answered > 0).then(|| digest(d, sa, sb, calibration))
        })
        .collect();
    digests.sort_by(|x, y| {
        y.flagged()
            .cmp(&x.flagged())
            .then_with(|| y.impact_us.abs().total_cmp(&x.impact_us.abs()))
            .then_with(|| x.id.cmp(&y.id))
    });
    Some(AbComparison {
        a: name_a,
        b: name_b,
        calibration: calibration.map(|c| c.source.clone()),
        flagged: digests.iter().filter(|d| d.flagged()).count() as u64,
        digests,
    })
}

fn digest(
    d: &DigestReport,
    a: &TargetSide,
    b: &TargetSide,
    calibration: Option<&Calibration>,
) -> AbDigest {
    let (la, lb) = (&a.latency, &b.latency);
    let aa = calibration.and_then(|c| c.get(&d.id));
    let (noise_low, noise_high) = aa
        .map(shown_band)
        .unwrap_or((1.0 / (1.0 + DEFAULT_NOISE), 1.0 + DEFAULT_NOISE));
    let interval = ratio_interval(la, lb);
    let (ratio_p50, ratio_low, ratio_high) = interval.unwrap_or((0.0, 0.0, 0.0));
    let (ratio_p99, ratio_p99_low, ratio_p99_high) =
        quantile_ratio_interval(la, lb, 0.99, |l| l.p99_us).unwrap_or((0.0, 0.0, 0.0));
    let (new_errors_a, new_errors_b) = (a.new_errors(&d.prod_errors), b.new_errors(&d.prod_errors));
    // Errors are rarer than slowdowns and each one matters: a difference of more than one in
    // a thousand commands (at least one) is flagged.
    let error_bar = 1 + a.answered.max(b.answered) / 1000;
    let verdict = if new_errors_a.abs_diff(new_errors_b) > error_bar {
        "errors"
    } else if la.count < MIN_COUNT || lb.count < MIN_COUNT || interval.is_none() {
        "too_few"
    } else if let (Some(aa), Some(ab)) = (aa, interval) {
        beyond_calibration(ab, aa).unwrap_or("same")
    } else if ratio_low > noise_high {
        "slower"
    } else if ratio_high < noise_low {
        "faster"
    } else {
        "same"
    };
    let impact_us = lb.count as f64 * (lb.p50_us as f64 - la.p50_us as f64);
    AbDigest {
        id: d.id.clone(),
        command: d.command.clone(),
        fingerprint: d.fingerprint.clone(),
        n_a: la.count,
        n_b: lb.count,
        p50_a_us: la.p50_us,
        p50_b_us: lb.p50_us,
        p99_a_us: la.p99_us,
        p99_b_us: lb.p99_us,
        ratio_p50,
        ratio_low,
        ratio_high,
        noise_low,
        noise_high,
        aa_ratio: aa.map_or(0.0, |a| a.0),
        calibrated: aa.is_some(),
        verdict: verdict.to_string(),
        impact_us: if impact_us.is_finite() {
            impact_us
        } else {
            0.0
        },
        new_errors_a,
        new_errors_b,
        mismatches_a: a.row_mismatches.saturating_add(a.result_mismatches),
        mismatches_b: b.row_mismatches.saturating_add(b.result_mismatches),
        ratio_p99,
        ratio_p99_low,
        ratio_p99_high,
        rows_a: a.rows,
        rows_b: b.rows,
    }
}

/// p50 B / p50 A with its interval `(ratio, low, high)`; `None` without samples on a side.
pub fn ratio_interval(a: &Latency, b: &Latency) -> Option<(f64, f64, f64)> {
    quantile_ratio_interval(a, b, 0.5, |l| l.p50_us)
}

/// Quantile `q` of B over A (`at` reads it from a side) with its interval.
fn quantile_ratio_interval(
    a: &Latency,
    b: &Latency,
    q: f64,
    at: fn(&Latency) -> u64,
) -> Option<(f64, f64, f64)> {
    let (a_lo, a_hi) = quantile_interval(a, q)?;
    let (b_lo, b_hi) = quantile_interval(b, q)?;
    // A 0 µs bucket edge would make the ratio infinite: 1 µs is the clock's resolution.
    let f = |v: u64| v.max(1) as f64;
    Some((f(at(b)) / f(at(a)), f(b_lo) / f(a_hi), f(b_hi) / f(a_lo)))
}

/// The `[low, high]` interval (µs) of quantile `q` of `l` at confidence [`Z`], from its
/// histogram: the ranks `nq -+ z sqrt(nq(1-q))`, the low one read at its bucket's lower edge,
/// the high one at its bucket's upper bound. `None` without samples.
pub fn quantile_interval(l: &Latency, q: f64) -> Option<(u64, u64)> {
    let n: u64 = l.buckets.iter().map(|b| b.1).fold(0, u64::saturating_add);
    if n == 0 {
        return None;
    }
    let nf = n as f64;
    let spread = Z * (nf * q * (1.0 - q)).sqrt();
    let low_rank = ((nf * q - spread).floor() as u64).clamp(1, n);
    let high_rank = ((nf * q + spread).ceil() as u64 + 1).clamp(1, n);
    // The entry holding `rank` (the last one if the counts fall short of it).
    let at = |rank: u64| {
        let mut seen = 0u64;
        for (i, &(_, count)) in l.buckets.iter().enumerate() {
            seen = seen.saturating_add(count);
            if seen >= rank {
                return i;
            }
        }
        l.buckets.len() - 1
    };
    let (low, high) = (at(low_rank), at(high_rank));
    Some((lower_edge(&l.buckets, low), l.buckets[high].0))
}

/// The least value bucket entry `i` can hold. Entries list non-empty buckets only, so the
/// previous entry's bound is not always the edge; the collector's log-linear buckets hold no
/// value under 8/9 of (their bound + 1), which bounds it from the other side.
fn lower_edge(buckets: &[(u64, u64)], i: usize) -> u64 {
    let bound = buckets[i].0;
    let after_previous = match i.checked_sub(1) {
        Some(p) => buckets[p].0.saturating_add(1).min(bound),
        None => 0,
    };
    let within_ninth = (u128::from(bound) + 1) * 8 / 9;
    after_previous.max(u64::try_from(within_ninth).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side whose latencies went through the collector's own histogram.
    fn side(samples: &[u64]) -> TargetSide {
        let mut h = crate::report::collect::Histogram::default();
        for &us in samples {
            h.record(std::time::Duration::from_micros(us));
        }
        TargetSide {
            answered: samples.len() as u64,
            latency: h.latency(),
            ..Default::default()
        }
    }

    /// `n` samples around `center` µs, spread +-20 % deterministically.
    fn around(center: u64, n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| center * (80 + (i * 37 % 41) as u64) / 100)
            .collect()
    }

    fn report(digests: Vec<(&str, TargetSide, TargetSide)>) -> Report {
        Report {
            tee_targets: vec!["198.18.0.3:3306".into(), "198.18.0.6:3306".into()],
            digests: digests
                .into_iter()
                .map(|(id, a, b)| DigestReport {
                    id: id.to_string(),
                    command: "stmt_execute".into(),
                    fingerprint: format!("SELECT {id}"),
                    count: a.answered,
                    per_target: vec![a, b],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn equal_sides_are_the_same_and_a_slow_one_is_flagged_first() {
        let r = report(vec![
            ("same", side(&around(200, 5000)), side(&around(200, 5000))),
            ("slow", side(&around(200, 500)), side(&around(2000, 500))),
            ("fast", side(&around(900, 500)), side(&around(300, 500))),
            ("few", side(&around(200, 8)), side(&around(9000, 8))),
        ]);
        let ab = compare(&r, 0, 1, None).unwrap();
        let v: Vec<(&str, &str)> = ab
            .digests
            .iter()
            .map(|d| (d.id.as_str(), d.verdict.as_str()))
            .collect();
        assert_eq!(
            v,
            [
                ("slow", "slower"),
                ("fast", "faster"),
                ("few", "too_few"),
                ("same", "same")
            ]
        );
        assert_eq!(ab.flagged, 2);
        let slow = &ab.digests[0];
        assert!(slow.ratio_low > 5.0 && slow.ratio_high < 15.0, "{slow:?}");
        assert!(slow.impact_us > 0.0);
    }

    #[test]
    fn a_calibrated_band_absorbs_a_steady_difference() {
        // B is twice as slow in the A/A run too: its host, not the change.
        let aa = report(vec![(
            "d",
            side(&around(1000, 3000)),
            side(&around(2000, 3000)),
        )]);
        let ab = report(vec![(
            "d",
            side(&around(1000, 3000)),
            side(&around(2000, 3000)),
        )]);
        assert_eq!(
            compare(&ab, 0, 1, None).unwrap().digests[0].verdict,
            "slower"
        );
        let cal = Calibration::from_report(&aa, "aa.json".into()).unwrap();
        assert_eq!(cal.len(), 1);
        let c = compare(&ab, 0, 1, Some(&cal)).unwrap();
        assert_eq!(c.digests[0].verdict, "same");
        assert!(c.digests[0].calibrated);
        assert_eq!(c.calibration.as_deref(), Some("aa.json"));
    }

    #[test]
    fn a_wide_a_a_interval_does_not_hide_a_clear_slowdown() {
        // The CI run that motivated the rule: against A/A 0.95 (0.72-1.23) from a few hundred
        // samples, an A/B interval has to clear 1.15, not 1.23.
        let aa = (0.95, 0.72, 1.23);
        assert_eq!(beyond_calibration((1.67, 1.13, 3.34), aa), None);
        assert_eq!(beyond_calibration((1.67, 1.25, 2.6), aa), Some("slower"));
        // Inside the steady A/A difference, or too close to it: not flagged.
        assert_eq!(beyond_calibration((1.3, 1.2, 1.4), (1.25, 1.1, 1.4)), None);
        assert_eq!(
            beyond_calibration((1.3, 1.2, 1.4), (1.0, 0.95, 1.05)),
            Some("slower")
        );
        assert_eq!(
            beyond_calibration((0.5, 0.4, 0.6), (1.0, 0.9, 1.1)),
            Some("faster")
        );
        assert_eq!(beyond_calibration((0.9, 0.8, 0.95), (1.0, 0.9, 1.1)), None);
        // Degenerate figures from a damaged report: no panic, no verdict out of nothing.
        assert_eq!(beyond_calibration((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)), None);
        assert!(beyond_calibration((f64::NAN, f64::NAN, f64::NAN), aa).is_none());
    }

    #[test]
    fn new_errors_on_one_side_are_flagged() {
        let mut b = side(&around(100, 400));
        b.errors.insert(1146, 50);
        let r = report(vec![("e", side(&around(100, 400)), b)]);
        let d = &compare(&r, 0, 1, None).unwrap().digests[0];
        assert_eq!((d.verdict.as_str(), d.new_errors_b), ("errors", 50));
    }

    #[test]
    fn quantile_intervals_hold_the_estimate_and_never_panic() {
        let l = side(&around(500, 1000)).latency;
        let (lo, hi) = quantile_interval(&l, 0.5).unwrap();
        assert!(lo <= l.p50_us && l.p50_us <= hi, "{lo} {} {hi}", l.p50_us);
        assert_eq!(quantile_interval(&Latency::default(), 0.5), None);
        let odd = Latency {
            count: 3,
            p50_us: 0,
            buckets: vec![(0, u64::MAX), (u64::MAX, u64::MAX)],
            ..Default::default()
        };
        assert!(quantile_interval(&odd, 0.5).is_some());
        // One bucket holds every sample: the interval is that bucket, not its bound alone.
        let one = side(&[1000; 200]).latency;
        let (lo, hi) = quantile_interval(&one, 0.5).unwrap();
        assert!(lo < 1000 && hi >= 1000 && lo * 9 >= hi * 8 - 9, "{lo} {hi}");
        assert_eq!(lower_edge(&[(5, 1)], 0), 5);
        assert_eq!(lower_edge(&[(3, 1), (4, 1)], 1), 4);
        assert!(ratio_interval(&odd, &odd).is_some());
        // A report that is not a --tee one compares nothing.
        assert_eq!(compare(&Report::default(), 0, 1, None), None);
        assert!(Calibration::from_report(&Report::default(), String::new()).is_none());
    }
}
