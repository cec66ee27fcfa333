//! Judging one probe step: what it measured, and which limit (if any) it crossed compared with
//! the first step.
//!
//! # What this room is for
//!
//! [`StepMeasure::from_report`] reads one step's comparison report and replay figures into the
//! few numbers the probe judges by; [`judge`] compares them with the baseline (step 1) and the
//! [`Thresholds`]:
//!
//! * **latency**: the p99 of the top digests (the busiest at step 1, weighted by their step-1
//!   counts) above `p99_ratio` x step 1's, both taken as at least `p99_floor_us`. One
//!   weighted figure rather than any single digest's p99, which on a few hundred samples
//!   jumps by a histogram bucket with no load at all; the per-digest ratios are kept to name
//!   the digests that degraded first. The floor (1 ms by default) because a capacity knee is
//!   the server queueing, not 300 µs becoming 600 µs: on a shared host sub-millisecond p99s
//!   double from scheduling alone (seen in the lab: 0.5 ms to 2.4 ms between two passing
//!   steps with other builds running).
//! * **errors**: test-server errors production did not have, above `new_errors_pct` of the
//!   commands.
//! * **falling behind**: commands the test server answered per second below `answered_pct`
//!   of those sent, over the seconds commands were sent.
//! * **replay pace**: the replay itself took more than 10 % (+ 0.2 s) over its schedule:
//!   the copier's host, not the test server, set the pace, so the step measured the wrong
//!   thing; reported as its own limit so nobody reads it as the test server's knee.
//! * **host CPU**: the test host's CPU busy above `cpu_pct`, when a figure is given
//!   (`host_cpu_busy_pct`: from `--target-metrics`, the first target's node_exporter).
//!
//! # What it must never do
//!
//! I/O, or trust the report's numbers to be sane: every ratio is guarded (empty steps,
//! zero latencies, NaN) so that a damaged recording yields a verdict, never a panic.

use std::collections::HashMap;

use serde::Serialize;

use crate::report::model::{Report, SCORE_FLOOR_US};

/// The smallest floor accepted: below it scheduling jitter decides the ratio even on an idle
/// host (the report's own noise floor).
pub const MIN_P99_FLOOR_US: u64 = SCORE_FLOOR_US;

/// The limits (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    pub p99_ratio: f64,
    /// Latencies below this are compared as this, µs.
    pub p99_floor_us: u64,
    pub new_errors_pct: f64,
    pub answered_pct: f64,
    pub cpu_pct: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            p99_ratio: 2.0,
            p99_floor_us: 1000,
            new_errors_pct: 0.1,
            answered_pct: 90.0,
            cpu_pct: 90.0,
        }
    }
}

/// One of the top digests at one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DigestStep {
    pub id: String,
    pub command: String,
    /// Untrusted text (from the recording): renderers escape it.
    pub fingerprint: String,
    /// Commands of this digest in the step.
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// What one step measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepMeasure {
    /// Commands mirrored in the step.
    pub commands: u64,
    /// Commands sent per second, over the seconds commands were sent.
    pub sent_qps: f64,
    /// Commands the test server answered per second, over the same seconds.
    pub answered_qps: f64,
    /// Test errors production did not have.
    pub new_errors: u64,
    /// The top digests' weighted test p50 and p99 (µs; see the module documentation).
    pub top_p50_us: f64,
    pub top_p99_us: f64,
    /// The top digests, in the baseline's order.
    pub top: Vec<DigestStep>,
    /// Worst lateness of a packet fed by the replay, ms.
    pub lateness_ms: f64,
    /// Replay time from the first packet to the last over its schedule (1.0: on time).
    pub pace: f64,
    /// The test host's CPU busy, percent, when measured.
    pub host_cpu_busy_pct: Option<f64>,
}

/// The digests judged at every step: the `n` busiest at step 1 (test-side latency measured).
pub fn top_digests(baseline: &Report, n: usize) -> Vec<String> {
    let mut v: Vec<_> = baseline
        .digests
        .iter()
        .filter(|d| d.test.count > 0)
        .collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.id.cmp(&b.id)));
    v.into_iter().take(n).map(|d| d.id.clone()).collect()
}

impl StepMeasure {
    /// Reads a step's comparison report. `multiply`: copies of each recorded connection (the
    /// report counts production's side once, the test server's once per copy); `top`: the
    /// judged digests' ids with their weights (step-1 counts); `lateness_ms` and `pace` from
    /// the replay.
    pub fn from_report(
        report: &Report,
        multiply: u32,
        top: &[(String, u64)],
        lateness_ms: f64,
        pace: f64,
        host_cpu_busy_pct: Option<f64>,
    ) -> Self {
        let (recorded_qps, answered_qps) = rates(report);
        let sent_qps = recorded_qps * f64::from(multiply.max(1));
        let by_id: HashMap<&str, _> = report.digests.iter().map(|d| (d.id.as_str(), d)).collect();
        let mut rows = Vec::with_capacity(top.len());
        let (mut w50, mut w99, mut wsum) = (0.0, 0.0, 0.0);
        for (id, weight) in top {
            let Some(d) = by_id.get(id.as_str()) else {
                continue;
            };
            rows.push(DigestStep {
                id: d.id.clone(),
                command: d.command.clone(),
                fingerprint: d.fingerprint.clone(),
                count: d.count,
                p50_us: d.test.p50_us,
                p99_us: d.test.p99_us,
            });
            if d.test.count > 0 {
                let w = *weight as f64;
                w50 += w * d.test.p50_us as f64;
                w99 += w * d.test.p99_us as f64;
                wsum += w;
            }
        }
        let avg = |x: f64| if wsum > 0.0 { x / wsum } else { 0.0 };
        Self {
            commands: report.totals.commands,
            sent_qps,
            answered_qps,
            new_errors: report
                .digests
                .iter()
                .map(|d| d.new_test_errors())
                .fold(0u64, u64::saturating_add),
            top_p50_us: avg(w50),
            top_p99_us: avg(w99),
            top: rows,
            lateness_ms: finite_or_zero(lateness_ms),
            pace: finite_or_zero(pace),
            host_cpu_busy_pct: host_cpu_busy_pct.filter(|v| v.is_finite()),
        }
    }

    /// New errors, percent of the commands.
    pub fn new_errors_pct(&self) -> f64 {
        if self.commands == 0 {
            return 0.0;
        }
        self.new_errors as f64 * 100.0 / self.commands as f64
    }

    /// Answered over sent, percent (100 when nothing was sent).
    pub fn answered_pct(&self) -> f64 {
        if self.sent_qps <= 0.0 {
            return 100.0;
        }
        self.answered_qps * 100.0 / self.sent_qps
    }

    /// The top digests' p99 over the baseline's, each taken as at least `floor_us`.
    pub fn p99_ratio(&self, baseline: &StepMeasure, floor_us: u64) -> f64 {
        floored_ratio(self.top_p99_us, baseline.top_p99_us, floor_us)
    }
}

fn finite_or_zero(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

fn floored_ratio(now: f64, base: f64, floor_us: u64) -> f64 {
    let floor = floor_us.max(MIN_P99_FLOOR_US) as f64;
    let r = finite_or_zero(now).max(floor) / finite_or_zero(base).max(floor);
    finite_or_zero(r)
}

/// (sent, answered) per second over the seconds in which production's side of commands
/// completed (the replay feeds them on schedule: that is the load sent). Commands answered
/// after that window (a backlog worked off during the drain) do not count: the test server
/// did not keep up with them.
fn rates(report: &Report) -> (f64, f64) {
    let sending: Vec<_> = report.qps.iter().filter(|p| p.prod > 0).collect();
    let (Some(first), Some(last)) = (sending.first(), sending.last()) else {
        return (0.0, 0.0);
    };
    let (lo, hi) = (first.t_s, last.t_s);
    let secs = (hi - lo + 1) as f64;
    let (mut sent, mut answered) = (0u64, 0u64);
    for p in report.qps.iter().filter(|p| p.t_s >= lo && p.t_s <= hi) {
        sent = sent.saturating_add(p.prod);
        answered = answered.saturating_add(p.test);
    }
    (sent as f64 / secs, answered as f64 / secs)
}

/// A limit crossed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "limit", rename_all = "snake_case")]
pub enum Crossed {
    Latency {
        ratio: f64,
        max: f64,
    },
    Errors {
        pct: f64,
        max: f64,
    },
    FallingBehind {
        answered_pct: f64,
        min: f64,
    },
    ReplayPace {
        pace: f64,
    },
    HostCpu {
        busy_pct: f64,
        max: f64,
    },
    /// Nothing was sent: the step measured nothing (an empty recording, intercept gone).
    NoCommands,
}

impl std::fmt::Display for Crossed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Crossed::Latency { ratio, max } => {
                write!(
                    f,
                    "p99 of the top digests {ratio:.2}x step 1 (limit {max}x)"
                )
            }
            Crossed::Errors { pct, max } => {
                write!(f, "new test errors {pct:.2} % of commands (limit {max} %)")
            }
            Crossed::FallingBehind { answered_pct, min } => write!(
                f,
                "test server falling behind: answered {answered_pct:.1} % of the commands sent \
                 (limit {min} %)"
            ),
            Crossed::ReplayPace { pace } => write!(
                f,
                "replay could not keep its schedule ({:+.0} %): the copier's host, not the test \
                 server, set the pace",
                (pace - 1.0) * 100.0
            ),
            Crossed::HostCpu { busy_pct, max } => {
                write!(f, "test host CPU {busy_pct:.0} % busy (limit {max} %)")
            }
            Crossed::NoCommands => write!(f, "no command was mirrored in this step"),
        }
    }
}

/// The replay's time from first to last packet may exceed its schedule by this share...
const PACE_SLACK: f64 = 0.10;
/// ...plus this much of the schedule's ratio on short steps (start-up of sessions, a pump).
pub const PACE_SLACK_SECS: f64 = 0.2;

/// The limits `step` crossed compared with `baseline` (the first step, judged against
/// itself); empty: passed. `schedule_secs`: the step's scheduled feeding time.
pub fn judge(
    baseline: &StepMeasure,
    step: &StepMeasure,
    schedule_secs: f64,
    t: &Thresholds,
) -> Vec<Crossed> {
    let mut out = Vec::new();
    if step.commands == 0 || step.sent_qps <= 0.0 {
        out.push(Crossed::NoCommands);
        return out;
    }
    let ratio = step.p99_ratio(baseline, t.p99_floor_us);
    if ratio > t.p99_ratio {
        out.push(Crossed::Latency {
            ratio,
            max: t.p99_ratio,
        });
    }
    let pct = step.new_errors_pct();
    if pct > t.new_errors_pct {
        out.push(Crossed::Errors {
            pct,
            max: t.new_errors_pct,
        });
    }
    let answered = step.answered_pct();
    if answered < t.answered_pct {
        out.push(Crossed::FallingBehind {
            answered_pct: answered,
            min: t.answered_pct,
        });
    }
    let slack = if schedule_secs > 0.0 && schedule_secs.is_finite() {
        PACE_SLACK + PACE_SLACK_SECS / schedule_secs
    } else {
        PACE_SLACK
    };
    if step.pace > 1.0 + slack {
        out.push(Crossed::ReplayPace { pace: step.pace });
    }
    if let Some(busy) = step.host_cpu_busy_pct {
        if busy > t.cpu_pct {
            out.push(Crossed::HostCpu {
                busy_pct: busy,
                max: t.cpu_pct,
            });
        }
    }
    out
}

/// The top digests of `step` by p99 ratio to `baseline` (floored at `floor_us`), worst
/// first: which degraded first.
pub fn degraded(
    baseline: &StepMeasure,
    step: &StepMeasure,
    floor_us: u64,
) -> Vec<(DigestStep, f64)> {
    let base: HashMap<&str, &DigestStep> =
        baseline.top.iter().map(|d| (d.id.as_str(), d)).collect();
    let mut v: Vec<_> = step
        .top
        .iter()
        .filter_map(|d| {
            let b = base.get(d.id.as_str())?;
            Some((
                d.clone(),
                floored_ratio(d.p99_us as f64, b.p99_us as f64, floor_us),
            ))
        })
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id.cmp(&b.0.id)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::{DigestReport, Latency, QpsPoint};

    fn digest(id: &str, count: u64, p99: u64, errs: u64) -> DigestReport {
        let mut d = DigestReport {
            id: id.into(),
            command: "stmt_execute".into(),
            fingerprint: format!("SELECT {id}"),
            count,
            test: Latency {
                count,
                p50_us: p99 / 2,
                p99_us: p99,
                ..Latency::default()
            },
            ..DigestReport::default()
        };
        if errs > 0 {
            d.test_errors.insert(1210, errs);
        }
        d
    }

    fn report(digests: Vec<DigestReport>, qps: &[(u64, u64, u64)]) -> Report {
        Report {
            totals: crate::report::model::Totals {
                commands: digests.iter().map(|d| d.count).sum(),
                ..Default::default()
            },
            qps: qps
                .iter()
                .map(|&(t_s, prod, test)| QpsPoint { t_s, prod, test })
                .collect(),
            digests,
            ..Report::default()
        }
    }

    fn measure(r: &Report, top: &[(String, u64)]) -> StepMeasure {
        StepMeasure::from_report(r, 1, top, 3.0, 1.0, None)
    }

    #[test]
    fn rates_cover_the_seconds_commands_were_sent() {
        // Second 0: start-up; 1-3 sending; 4-5: a backlog answered during the drain.
        let r = report(
            vec![digest("a", 3000, 1000, 0)],
            &[
                (0, 0, 0),
                (1, 1000, 900),
                (2, 1000, 900),
                (3, 1000, 900),
                (4, 0, 300),
                (5, 0, 0),
            ],
        );
        let (s, a) = rates(&r);
        assert_eq!((s, a), (1000.0, 900.0));
        // Production's side is counted once, the test server's once per --multiply copy:
        // three copies answering everything are not "300 % answered".
        let tripled = report(
            vec![digest("a", 3000, 1000, 0)],
            &[(1, 1000, 3000), (2, 1000, 3000)],
        );
        let m = StepMeasure::from_report(&tripled, 3, &[], 0.0, 1.0, None);
        assert_eq!(
            (m.sent_qps, m.answered_qps, m.answered_pct()),
            (3000.0, 3000.0, 100.0)
        );
        assert_eq!(rates(&Report::default()), (0.0, 0.0));
    }

    #[test]
    fn the_top_digests_are_the_busiest_at_step_one_and_weighted_by_their_counts() {
        let base = report(
            vec![
                digest("a", 900, 1000, 0),
                digest("b", 100, 10_000, 0),
                digest("c", 5, 1_000_000, 0),
            ],
            &[(0, 1005, 1005)],
        );
        let ids = top_digests(&base, 2);
        assert_eq!(ids, vec!["a", "b"]);
        let top: Vec<_> = ids
            .iter()
            .map(|i| (i.clone(), if i == "a" { 900 } else { 100 }))
            .collect();
        let m = measure(&base, &top);
        assert_eq!(m.top_p99_us, (900.0 * 1000.0 + 100.0 * 10_000.0) / 1000.0);
        assert_eq!(m.top.len(), 2);
    }

    #[test]
    fn each_limit_is_judged_against_step_one() {
        let top = vec![("a".to_string(), 1000)];
        let t = Thresholds::default();
        let base = measure(
            &report(vec![digest("a", 1000, 1000, 0)], &[(0, 1000, 1000)]),
            &top,
        );
        assert!(judge(&base, &base, 10.0, &t).is_empty());

        let slow = measure(
            &report(vec![digest("a", 1000, 2500, 0)], &[(0, 1000, 1000)]),
            &top,
        );
        assert!(matches!(
            judge(&base, &slow, 10.0, &t)[..],
            [Crossed::Latency { .. }]
        ));

        let errors = measure(
            &report(vec![digest("a", 1000, 1000, 2)], &[(0, 1000, 1000)]),
            &top,
        );
        assert!(matches!(
            judge(&base, &errors, 10.0, &t)[..],
            [Crossed::Errors { .. }]
        ));

        let behind = measure(
            &report(vec![digest("a", 1000, 1000, 0)], &[(0, 1000, 800)]),
            &top,
        );
        assert!(matches!(
            judge(&base, &behind, 10.0, &t)[..],
            [Crossed::FallingBehind { .. }]
        ));

        let mut late = base.clone();
        late.pace = 1.5;
        assert!(matches!(
            judge(&base, &late, 10.0, &t)[..],
            [Crossed::ReplayPace { .. }]
        ));
        late.pace = 1.11;
        // 10 % + 0.2 s of a 1 s schedule: still on time.
        assert!(judge(&base, &late, 1.0, &t).is_empty());

        let mut hot = base.clone();
        hot.host_cpu_busy_pct = Some(95.0);
        assert!(matches!(
            judge(&base, &hot, 10.0, &t)[..],
            [Crossed::HostCpu { .. }]
        ));
        hot.host_cpu_busy_pct = None;
        assert!(judge(&base, &hot, 10.0, &t).is_empty());

        let empty = measure(&Report::default(), &top);
        assert_eq!(judge(&base, &empty, 10.0, &t), vec![Crossed::NoCommands]);
    }

    #[test]
    fn tiny_or_missing_latencies_do_not_make_ratios_explode() {
        let top = vec![("a".to_string(), 1000)];
        let base = measure(
            &report(vec![digest("a", 1000, 0, 0)], &[(0, 1000, 1000)]),
            &top,
        );
        let step = measure(
            &report(vec![digest("a", 1000, 150, 0)], &[(0, 1000, 1000)]),
            &top,
        );
        assert!((step.p99_ratio(&base, 100) - 1.5).abs() < 1e-9);
        // A floor of 1 ms: 0 to 150 µs is no change at all.
        assert_eq!(step.p99_ratio(&base, 1000), 1.0);
        let none = measure(&report(vec![], &[(0, 1000, 1000)]), &top);
        assert_eq!(none.top_p99_us, 0.0);
        assert_eq!(none.p99_ratio(&base, 100), 1.0);
        let nan = StepMeasure::from_report(
            &Report::default(),
            1,
            &top,
            f64::NAN,
            f64::INFINITY,
            Some(f64::NAN),
        );
        assert_eq!(
            (nan.lateness_ms, nan.pace, nan.host_cpu_busy_pct),
            (0.0, 0.0, None)
        );
    }

    #[test]
    fn degraded_lists_the_worst_p99_ratio_first() {
        let top = vec![("a".to_string(), 500), ("b".to_string(), 500)];
        let base = measure(
            &report(
                vec![digest("a", 500, 1000, 0), digest("b", 500, 1000, 0)],
                &[(0, 1, 1)],
            ),
            &top,
        );
        let step = measure(
            &report(
                vec![digest("a", 500, 1500, 0), digest("b", 500, 4000, 0)],
                &[(0, 1, 1)],
            ),
            &top,
        );
        let d = degraded(&base, &step, 1000);
        assert_eq!(d[0].0.id, "b");
        assert!((d[0].1 - 4.0).abs() < 1e-9 && (d[1].1 - 1.5).abs() < 1e-9);
    }
}
