//! What the probe shows: a progress line per step, the summary (probe.txt) and a small HTML
//! page with an inline SVG chart of QPS against the top digests' p99, step by step.
//!
//! Pure: strings from a [`ProbeResult`]. Everything that came from the recording (digest
//! fingerprints, paths) is untrusted: one-lined for the terminal, escaped for HTML.

use std::fmt::Write as _;

use super::{ProbeResult, StepResult};
use crate::report::html::esc;
use crate::report::{fmt_us, one_line};

/// `12,431`.
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let n = v.round().abs() as u64;
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if v.round() < 0.0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn factor_text(f: f64) -> String {
    if (f - f.round()).abs() < 0.005 {
        format!("{f:.0}x")
    } else {
        format!("{f:.2}x")
    }
}

fn us_text(us: f64) -> String {
    if us.is_finite() && us >= 0.0 {
        fmt_us(us.round() as u64)
    } else {
        "-".into()
    }
}

/// `step 3/≤9: speed 4x multiply 1 -> 2,431 QPS sent, 2,430 answered, p99 top digests 1.80ms
/// (1.20x step 1), new errors 0.00 %, lateness 12 ms: ok` (or the limits crossed).
pub fn progress_line(s: &StepResult, max_steps: usize) -> String {
    let m = &s.measure;
    let ratio = if s.number == 1 {
        "step 1".to_string()
    } else {
        format!("{:.2}x step 1", s.p99_ratio)
    };
    let verdict = if s.passed() {
        "ok".to_string()
    } else {
        format!(
            "LIMIT {}",
            s.crossed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    format!(
        "step {}/≤{max_steps}{}: speed {} multiply {} -> {} QPS sent, {} answered, p99 top \
         digests {} ({ratio}), new errors {:.2} %, lateness {:.0} ms{}: {verdict}",
        s.number,
        if s.phase == super::plan::Phase::Confirm {
            " (again)"
        } else {
            ""
        },
        factor_text(s.speed),
        s.multiply,
        thousands(m.sent_qps),
        thousands(m.answered_qps),
        us_text(m.top_p99_us),
        m.new_errors_pct(),
        m.lateness_ms,
        m.host_cpu_busy_pct
            .map_or_else(String::new, |c| format!(", host CPU {c:.0} %")),
    )
}

/// A step's verdict in the table: `ok`, the limits crossed, marked when the step repeated
/// the previous one (`again: `) or its failure was not confirmed (`not confirmed: `).
fn verdict_text(s: &StepResult) -> String {
    let again = if s.phase == super::plan::Phase::Confirm {
        "again: "
    } else {
        ""
    };
    if s.passed() {
        return format!("{again}ok");
    }
    let limits = s
        .crossed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let noise = if s.overruled { "not confirmed: " } else { "" };
    format!("{again}{noise}{limits}")
}

/// probe.txt: the steps, the knee, the limit, the digests that degraded first, the files.
pub fn text(r: &ProbeResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "copier probe: {} ({:.1} s of recording) onto {}, {} s per step after {} s of warm-up",
        r.recording
            .iter()
            .map(|p| one_line(&p.display().to_string(), 200))
            .collect::<Vec<_>>()
            .join(" "),
        r.recording_secs,
        r.target,
        r.step_secs,
        r.warmup_secs
    );
    let _ = writeln!(
        out,
        "limits: p99 of the top digests > {}x step 1 (p99s under {} count as that), new errors \
         > {} %, answered < {} % of sent, replay off its schedule, host CPU > {} %",
        r.thresholds.p99_ratio,
        fmt_us(r.thresholds.p99_floor_us),
        r.thresholds.new_errors_pct,
        r.thresholds.answered_pct,
        r.thresholds.cpu_pct
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>4}  {:>7}  {:>7}  {:>4}  {:>9}  {:>9}  {:>9}  {:>9}  {:>7}  {:>8}  verdict",
        "step",
        "factor",
        "speed",
        "mult",
        "QPS sent",
        "answered",
        "p50 top",
        "p99 top",
        "errors",
        "late"
    );
    for s in &r.steps {
        let m = &s.measure;
        let _ = writeln!(
            out,
            "{:>4}  {:>7}  {:>7}  {:>4}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6.2}%  {:>5.0} ms  {}",
            s.number,
            factor_text(s.factor),
            factor_text(s.speed),
            s.multiply,
            thousands(m.sent_qps),
            thousands(m.answered_qps),
            us_text(m.top_p50_us),
            us_text(m.top_p99_us),
            m.new_errors_pct(),
            m.lateness_ms,
            verdict_text(s),
        );
    }
    let _ = writeln!(out);
    match r.knee_step() {
        Some(k) => {
            let _ = writeln!(
                out,
                "knee: load factor {} (speed {} x multiply {}): {} QPS sustained ({} sent), top \
                 digests p50 {} p99 {}",
                factor_text(k.factor),
                factor_text(k.speed),
                k.multiply,
                thousands(k.measure.answered_qps),
                thousands(k.measure.sent_qps),
                us_text(k.measure.top_p50_us),
                us_text(k.measure.top_p99_us),
            );
        }
        None => {
            let _ = writeln!(
                out,
                "knee: none: the first step already crossed a limit (probe from a lower --start)"
            );
        }
    }
    match r.fail_step() {
        Some(f) => {
            let _ = writeln!(
                out,
                "limit: at load factor {} ({} QPS sent): {}",
                factor_text(f.factor),
                thousands(f.measure.sent_qps),
                f.crossed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        None if r.stopped => {
            let _ = writeln!(out, "limit: none found before the probe was stopped");
        }
        None => {
            let _ = writeln!(
                out,
                "limit: none up to the highest load factor (--max-speed {} x --max-multiply {})",
                r.max_speed, r.max_multiply
            );
        }
    }
    if !r.degraded.is_empty() {
        let _ = writeln!(
            out,
            "degraded first (p99 at the first failing step vs step 1):"
        );
        for (d, ratio) in r.degraded.iter().take(5) {
            let _ = writeln!(
                out,
                "  {:>6.2}x  p99 {:>9}  {:<12}  {}",
                ratio,
                fmt_us(d.p99_us),
                one_line(&d.command, 12),
                one_line(&d.fingerprint, 100)
            );
        }
    }
    if !r.host_cpu_measured {
        let _ = writeln!(out, "host CPU: not measured (no --target-metrics)");
    }
    if r.stopped {
        let _ = writeln!(
            out,
            "stopped before the search ended: the figures cover the steps run"
        );
    }
    out
}

#[derive(Clone, Copy)]
enum Verdict {
    Passed,
    /// Failed, not confirmed at the same factor.
    Noise,
    Failed,
}

/// The chart's data: (answered QPS, top digests' p99 in ms, verdict, step) per step, by QPS.
fn points(r: &ProbeResult) -> Vec<(f64, f64, Verdict, usize)> {
    let mut v: Vec<_> = r
        .steps
        .iter()
        .map(|s| {
            (
                s.measure.answered_qps,
                s.measure.top_p99_us / 1000.0,
                if s.passed() {
                    Verdict::Passed
                } else if s.overruled {
                    Verdict::Noise
                } else {
                    Verdict::Failed
                },
                s.number,
            )
        })
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// An SVG chart of answered QPS (x) against the top digests' p99 (y), one dot per step.
pub fn svg(r: &ProbeResult) -> String {
    const W: f64 = 640.0;
    const H: f64 = 320.0;
    const L: f64 = 60.0;
    const B: f64 = 40.0;
    let pts = points(r);
    let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max).max(1.0) * 1.05;
    let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(0.001) * 1.1;
    let x = |v: f64| L + (v / xmax) * (W - L - 20.0);
    let y = |v: f64| H - B - (v / ymax) * (H - B - 20.0);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"answered QPS against p99 of the top \
         digests\">"
    );
    let _ = write!(
        s,
        "<line x1=\"{L}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/>\
         <line x1=\"{L}\" y1=\"20\" x2=\"{L}\" y2=\"{}\" stroke=\"#444\"/>",
        H - B,
        W - 20.0,
        H - B,
        H - B
    );
    for i in 0..=4 {
        let fx = xmax * f64::from(i) / 4.0;
        let fy = ymax * f64::from(i) / 4.0;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{:.2}</text>",
            x(fx),
            H - B + 16.0,
            esc(&thousands(fx)),
            L - 6.0,
            y(fy) + 4.0,
            fy
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">answered QPS</text>\
         <text x=\"14\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" \
         transform=\"rotate(-90 14 {:.1})\">p99 top digests, ms</text>",
        (L + W) / 2.0,
        H - 6.0,
        H / 2.0,
        H / 2.0
    );
    if pts.len() > 1 {
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"#88a\" points=\"{}\"/>",
            path.join(" ")
        );
    }
    for p in &pts {
        let color = match p.2 {
            Verdict::Passed => "#2a7",
            Verdict::Noise => "#e90",
            Verdict::Failed => "#c33",
        };
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"><title>step {}: {} QPS, \
             p99 {:.2} ms</title></circle>",
            x(p.0),
            y(p.1),
            p.3,
            esc(&thousands(p.0)),
            p.1
        );
    }
    s.push_str("</svg>");
    s
}

/// probe.html: the summary as preformatted text and the chart.
pub fn html(r: &ProbeResult) -> String {
    let mut s = String::new();
    s.push_str(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>copier probe</title>\
         <style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em;\
         overflow-x:auto}</style></head><body><h1>copier probe</h1>",
    );
    let _ = write!(
        s,
        "<p>Green: step passed; red: a limit crossed; orange: crossed once, not again at the same load (noise). One dot per step.</p>{}<pre>{}</pre>",
        svg(r),
        esc(&text(r))
    );
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::super::limits::{Crossed, DigestStep, StepMeasure, Thresholds};
    use super::super::plan::Phase;
    use super::super::{ProbeResult, StepResult, SCHEMA};
    use super::*;

    fn step(n: usize, factor: f64, qps: f64, p99: f64, crossed: Vec<Crossed>) -> StepResult {
        StepResult {
            number: n,
            phase: Phase::Ramp,
            factor,
            speed: factor,
            multiply: 1,
            measure: StepMeasure {
                commands: (qps * 10.0) as u64,
                sent_qps: qps,
                answered_qps: qps * 0.99,
                top_p50_us: p99 / 2.0,
                top_p99_us: p99,
                top: vec![DigestStep {
                    id: "1".into(),
                    command: "query".into(),
                    fingerprint: "SELECT '<script>' \u{1b}[2J".into(),
                    count: 10,
                    p50_us: 100,
                    p99_us: p99 as u64,
                }],
                lateness_ms: 3.0,
                pace: 1.0,
                ..StepMeasure::default()
            },
            // Step 1's p99 is 1 ms in these fixtures.
            p99_ratio: p99 / 1000.0,
            crossed,
            report_dir: "probe/steps/01".into(),
            overruled: false,
        }
    }

    fn result() -> ProbeResult {
        let mut r = ProbeResult {
            schema: SCHEMA,
            recording: vec!["<cap>.pcapng".into()],
            recording_secs: 8.0,
            target: "198.18.0.3:3306".into(),
            step_secs: 5,
            warmup_secs: 5,
            max_speed: 8.0,
            max_multiply: 4,
            thresholds: Thresholds::default(),
            steps: vec![
                step(1, 1.0, 640.0, 1000.0, vec![]),
                step(2, 2.0, 1280.0, 1100.0, vec![]),
                step(
                    3,
                    4.0,
                    2431.0,
                    3000.0,
                    vec![Crossed::Latency {
                        ratio: 3.0,
                        max: 2.0,
                    }],
                ),
                step(4, 2.83, 1800.0, 1500.0, vec![]),
            ],
            knee: None,
            first_fail: None,
            degraded: vec![],
            stopped: false,
            host_cpu_measured: false,
        };
        r.conclude();
        r
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(2431.4), "2,431");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(f64::NAN), "-");
        assert_eq!(factor_text(4.0), "4x");
        assert_eq!(factor_text(2.828), "2.83x");
    }

    #[test]
    fn the_progress_line_says_load_answers_latency_errors_and_verdict() {
        let r = result();
        let line = progress_line(&r.steps[2], 9);
        assert!(
            line.starts_with("step 3/≤9: speed 4x multiply 1 -> 2,431 QPS sent, 2,407 answered, p99 top digests 3.00ms (3.00x step 1), new errors 0.00 %, lateness 3 ms: LIMIT p99"),
            "{line}"
        );
        assert!(progress_line(&r.steps[0], 9).ends_with(": ok"));
    }

    #[test]
    fn the_summary_names_the_knee_the_limit_and_what_degraded() {
        let r = result();
        assert_eq!(r.knee_step().unwrap().number, 4);
        assert_eq!(r.fail_step().unwrap().number, 3);
        let t = text(&r);
        assert!(t.contains("knee: load factor 2.83x"), "{t}");
        assert!(t.contains("1,782 QPS sustained"), "{t}");
        assert!(t.contains("limit: at load factor 4x"), "{t}");
        assert!(t.contains("degraded first"), "{t}");
        assert!(
            t.contains("host CPU: not measured (no --target-metrics)"),
            "{t}"
        );
        // The recording's text cannot repaint a terminal.
        assert!(!t.contains('\u{1b}'), "{t}");
    }

    #[test]
    fn the_page_escapes_the_recordings_text_and_draws_a_dot_per_step() {
        let h = html(&result());
        assert!(!h.contains("<script>") && !h.contains("<cap>"), "{h}");
        assert!(h.contains("&lt;script&gt;"));
        assert_eq!(h.matches("<circle").count(), 4);
        assert!(h.contains("<svg") && h.contains("</svg>"));
        // An empty probe still renders.
        let mut empty = result();
        empty.steps.clear();
        empty.conclude();
        assert!(html(&empty).contains("</svg>"));
        assert!(text(&empty).contains("knee: none"));
    }

    #[test]
    fn a_failure_its_confirmation_overruled_is_no_limit() {
        let mut r = result();
        r.steps[2].overruled = true;
        r.conclude();
        assert_eq!(r.knee_step().unwrap().number, 4);
        assert!(r.fail_step().is_none());
        let t = text(&r);
        assert!(t.contains("not confirmed: p99"), "{t}");
        assert!(svg(&r).contains("#e90"));
    }
}
