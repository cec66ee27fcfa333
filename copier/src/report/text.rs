//! `report.txt`: the report as a terminal table, worst regression first (the order of
//! [`cmp_regression`](super::cmp_regression)), then the errors and mismatches behind it.
//!
//! Plain text, one digest per line, nothing wider than needed: it is read in a terminal and
//! pasted into tickets. Untrusted text goes through [`one_line`] (no control characters).

use std::fmt::Write as _;

use super::ab::AbComparison;
use super::{fmt_errors, fmt_ratio, fmt_unix_ms, fmt_us, one_line, DigestReport, Report};

/// Characters of the example shown per digest line.
const EXAMPLE_CHARS: usize = 72;
/// Mismatch examples listed per digest.
const MISMATCHES_PER_DIGEST: usize = 3;

/// The whole `report.txt`; `top` limits the digests listed (all when `None`).
pub fn render_text(r: &Report, top: Option<usize>) -> String {
    let mut out = String::new();
    header(&mut out, r);
    super::resources::render_text(&mut out, &r.resources);
    let ranked = r.ranked();
    let shown = top.unwrap_or(usize::MAX).min(ranked.len());
    let _ = writeln!(
        out,
        "\nDigests, worst regression first (new test errors, then mismatches, then slowdown \
         weighted by count){}:",
        if shown < ranked.len() {
            format!("; top {shown} of {}", ranked.len())
        } else {
            String::new()
        }
    );
    if ranked.is_empty() {
        let _ = writeln!(out, "  (no commands observed)");
        return out;
    }
    let _ = writeln!(
        out,
        "{:>4} {:<16} {:<12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}  {:<19} {:<13} example",
        "#",
        "digest",
        "command",
        "count",
        "prod p50",
        "prod p99",
        "test p50",
        "test p99",
        "p50 x",
        "p99 x",
        "errors prod/test",
        "mism rows/res",
    );
    for (i, d) in ranked.iter().take(shown).enumerate() {
        let (pe, te) = d.error_totals();
        let errors = format!("{pe}/{te}");
        let mism = format!("{}/{}", d.row_mismatches, d.result_mismatches);
        let mut example = one_line(example_of(d), EXAMPLE_CHARS);
        if d.nondeterministic {
            example = format!("[nondeterministic] {example}");
        }
        let _ = writeln!(
            out,
            "{:>4} {:<16} {:<12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}  {:<19} {:<13} {}",
            i + 1,
            one_line(&d.id, 16),
            one_line(&d.command, 12),
            d.count,
            lat(d.prod.count, d.prod.p50_us),
            lat(d.prod.count, d.prod.p99_us),
            lat(d.test.count, d.test.p50_us),
            lat(d.test.count, d.test.p99_us),
            fmt_ratio(d.ratio_p50()),
            fmt_ratio(d.ratio_p99()),
            errors,
            mism,
            example
        );
    }
    errors_section(&mut out, &ranked[..shown]);
    mismatches_section(&mut out, &ranked[..shown]);
    if let Some(ab) = &r.ab {
        ab_section(&mut out, ab, top);
    }
    out
}

/// `--tee`: test A against test B, flagged digests first (see [`super::ab`]).
pub fn ab_section(out: &mut String, ab: &AbComparison, top: Option<usize>) {
    let noise = match &ab.calibration {
        Some(c) => format!("noise from the A/A calibration {}", one_line(c, 80)),
        None => format!(
            "no A/A calibration: noise band +-{:.0} %",
            super::ab::DEFAULT_NOISE * 100.0
        ),
    };
    let _ = writeln!(
        out,
        "\nA/B: test A {} vs test B {} ({noise}); {} of {} digests flagged",
        one_line(&ab.a, 64),
        one_line(&ab.b, 64),
        ab.flagged,
        ab.digests.len()
    );
    if ab.digests.is_empty() {
        let _ = writeln!(out, "  (no commands observed)");
        return;
    }
    let _ = writeln!(
        out,
        "{:>4} {:<8} {:<16} {:<12} {:>8} {:>8} {:>9} {:>9} {:>7} {:>15} {:>13} {:>9} {:>9} {:>10} {:>9} {:>9}  example",
        "#",
        "verdict",
        "digest",
        "command",
        "n A",
        "n B",
        "A p50",
        "B p50",
        "B/A",
        "99% interval",
        "noise band",
        "A p99",
        "B p99",
        "impact",
        "new err",
        "mism",
    );
    for (i, d) in ab
        .digests
        .iter()
        .take(top.unwrap_or(usize::MAX))
        .enumerate()
    {
        let _ = writeln!(
            out,
            "{:>4} {:<8} {:<16} {:<12} {:>8} {:>8} {:>9} {:>9} {:>7} {:>15} {:>13} {:>9} {:>9} {:>10} {:>9} {:>9}  {}",
            i + 1,
            one_line(&d.verdict, 8),
            one_line(&d.id, 16),
            one_line(&d.command, 12),
            d.n_a,
            d.n_b,
            lat(d.n_a, d.p50_a_us),
            lat(d.n_b, d.p50_b_us),
            fmt_ratio((d.ratio_p50 > 0.0).then_some(d.ratio_p50)),
            format!("{:.2}-{:.2}", d.ratio_low, d.ratio_high),
            format!(
                "{:.2}-{:.2}{}",
                d.noise_low,
                d.noise_high,
                if d.calibrated { "" } else { "*" }
            ),
            lat(d.n_a, d.p99_a_us),
            lat(d.n_b, d.p99_b_us),
            fmt_impact(d.impact_us),
            format!("{}/{}", d.new_errors_a, d.new_errors_b),
            format!("{}/{}", d.mismatches_a, d.mismatches_b),
            one_line(&d.fingerprint, EXAMPLE_CHARS)
        );
    }
    let _ = writeln!(
        out,
        "  impact: n B x (B p50 - A p50), the time B spent more on the digest; * default band \
         (the digest was not in the calibration)"
    );
}

/// A signed amount of time: `+1.25s`, `-850µs`.
fn fmt_impact(us: f64) -> String {
    let sign = if us < 0.0 { "-" } else { "+" };
    let abs = us.abs();
    let abs = if abs.is_finite() && abs < u64::MAX as f64 {
        abs as u64
    } else {
        u64::MAX
    };
    format!("{sign}{}", fmt_us(abs))
}

fn lat(count: u64, us: u64) -> String {
    if count == 0 {
        "-".to_string()
    } else {
        fmt_us(us)
    }
}

fn example_of(d: &DigestReport) -> &str {
    if d.example.is_empty() {
        &d.fingerprint
    } else {
        &d.example
    }
}

fn header(out: &mut String, r: &Report) {
    let t = &r.totals;
    let _ = writeln!(
        out,
        "tcpshadow comparison report ({})",
        one_line(&r.schema, 40)
    );
    let _ = writeln!(
        out,
        "prod {} -> test {} | started {} | {} | copier {}",
        one_line(&r.prod, 64),
        one_line(&r.target, 64),
        fmt_unix_ms(r.started_unix_ms),
        super::fmt_secs(r.duration_s),
        one_line(&r.copier_version, 40)
    );
    let _ = writeln!(
        out,
        "commands {} (compared {}, not compared {}, nondeterministic {}) | QPS prod {:.1} test {:.1}",
        t.commands,
        t.compared,
        t.not_compared,
        t.nondeterministic,
        r.mean_qps_prod(),
        r.mean_qps_test()
    );
    let _ = writeln!(
        out,
        "errors prod {} test {} | mismatches rows {} result {} | results compared: {} | literals: {}",
        t.prod_errors,
        t.test_errors,
        t.row_mismatches,
        t.result_mismatches,
        if r.compare_results {
            "checksums"
        } else {
            "row counts only"
        },
        if r.literals { "shown" } else { "hidden" }
    );
}

fn errors_section(out: &mut String, ranked: &[&DigestReport]) {
    let with_errors: Vec<_> = ranked
        .iter()
        .filter(|d| !d.prod_errors.is_empty() || !d.test_errors.is_empty())
        .collect();
    if with_errors.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nErrors (code x count):");
    for d in with_errors {
        let _ = writeln!(
            out,
            "  {:<16} prod {:<24} test {:<24} {}",
            one_line(&d.id, 16),
            fmt_errors(&d.prod_errors),
            fmt_errors(&d.test_errors),
            one_line(&d.fingerprint, EXAMPLE_CHARS)
        );
    }
}

fn mismatches_section(out: &mut String, ranked: &[&DigestReport]) {
    let with: Vec<_> = ranked
        .iter()
        .filter(|d| !d.mismatch_examples.is_empty())
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nMismatch examples:");
    for d in with {
        for m in d.mismatch_examples.iter().take(MISMATCHES_PER_DIGEST) {
            let _ = writeln!(
                out,
                "  {:<16} {:<6} prod {:<16} test {:<16} {}",
                one_line(&d.id, 16),
                one_line(&m.kind, 6),
                one_line(&m.prod, 16),
                one_line(&m.test, 16),
                one_line(&m.example, EXAMPLE_CHARS)
            );
        }
    }
}
