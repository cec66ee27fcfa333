//! `report.html`: one self-contained page, no external assets and no JavaScript: inline CSS
//! and SVG charts generated here, so it opens from a file, a mail attachment or a CI artifact.
//!
//! Every piece of text from the report is untrusted (clients' queries, error texts) and goes
//! through [`esc`]; numbers are formatted by us. Element ids and classes are part of the
//! interface (tests and users' scrapers): `qps-chart`, `latency-chart`, `regressions`,
//! `errors`, `mismatches`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{fmt_errors, fmt_ratio, fmt_secs, fmt_unix_ms, fmt_us, DigestReport, Latency, Report};

/// Digests listed in the regressions table.
const TABLE_ROWS: usize = 100;
/// Digests given a latency chart (the worst ones with samples on both sides).
const LATENCY_CHARTS: usize = 8;
/// Points drawn per QPS line; longer runs are averaged down (a day is 86 400 seconds).
const QPS_POINTS: usize = 1200;
/// Characters of a statement shown in a cell (the full text is in report.json).
const CELL_CHARS: usize = 160;
/// Mismatch examples listed per digest.
const MISMATCHES_PER_DIGEST: usize = 5;

const PROD_COLOR: &str = "#1f77b4";
const TEST_COLOR: &str = "#e8590c";

const STYLE: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:12px}
.card.bad b{color:#c92a2a}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f6f6;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.worse{color:#c92a2a;font-weight:600}td.better{color:#2b8a3e}
code{font:12px ui-monospace,'DejaVu Sans Mono',monospace;word-break:break-all}
code.id{word-break:normal;white-space:nowrap}
.tag{font-size:11px;border:1px solid #999;border-radius:3px;padding:0 3px;color:#555}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure{margin:0;border:1px solid #eee;border-radius:6px;padding:8px}
figcaption{font-size:12px;color:#444;margin-bottom:4px}
svg text{font:11px system-ui,'DejaVu Sans',sans-serif;fill:#444}
.legend{font-size:12px}.sw{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}
.none{color:#888;font-style:italic}
";

/// The whole page.
pub fn render_html(r: &Report) -> String {
    let mut o = String::with_capacity(64 * 1024);
    let ranked = r.ranked();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>tcpshadow report: {} vs {}</title><style>{STYLE}</style></head><body>\n",
        esc(&r.prod),
        esc(&r.target)
    );
    let _ = writeln!(
        o,
        "<h1>tcpshadow comparison report</h1><p class=\"meta\">production <b>{}</b> vs test \
         <b>{}</b> · started {} · {} · copier {} · schema {} · results compared by {} · \
         literals {}</p>",
        esc(&r.prod),
        esc(&r.target),
        fmt_unix_ms(r.started_unix_ms),
        fmt_secs(r.duration_s),
        esc(&r.copier_version),
        esc(&r.schema),
        if r.compare_results {
            "checksum"
        } else {
            "row count only"
        },
        if r.literals { "shown" } else { "hidden" }
    );
    totals(&mut o, r);
    if let Some(ab) = &r.ab {
        ab_table(&mut o, ab);
    }
    o.push_str("<h2>Queries per second</h2>\n");
    qps_chart(&mut o, r);
    super::resources::render_html(&mut o, &r.resources);
    o.push_str("<h2>Latency distributions of the largest slowdowns</h2>\n");
    latency_charts(&mut o, &ranked);
    regressions_table(&mut o, &ranked);
    errors_table(&mut o, &ranked);
    mismatches_table(&mut o, &ranked);
    o.push_str("</body></html>\n");
    o
}

/// Untrusted text for HTML content or a quoted attribute value, cut to `CELL_CHARS`.
/// Control characters (other than tab and newline) become U+FFFD: HTML forbids most of them
/// and they have no business on a page.
pub fn esc(s: &str) -> String {
    esc_max(s, usize::MAX)
}

fn esc_max(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(4096) + 16);
    for (i, c) in s.chars().enumerate() {
        if i >= max {
            out.push('…');
            break;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn totals(o: &mut String, r: &Report) {
    let t = &r.totals;
    let card = |o: &mut String, value: String, label: &str, bad: bool| {
        let _ = write!(
            o,
            "<div class=\"card{}\"><b>{value}</b><span>{label}</span></div>",
            if bad { " bad" } else { "" }
        );
    };
    o.push_str("<div class=\"cards\" id=\"totals\">");
    card(o, t.commands.to_string(), "commands", false);
    card(o, t.compared.to_string(), "compared", false);
    card(
        o,
        format!("{:.1} / {:.1}", r.mean_qps_prod(), r.mean_qps_test()),
        "mean QPS prod / test",
        false,
    );
    card(o, t.prod_errors.to_string(), "prod errors", false);
    card(
        o,
        t.test_errors.to_string(),
        "test errors",
        t.test_errors > t.prod_errors,
    );
    card(
        o,
        t.row_mismatches.to_string(),
        "row mismatches",
        t.row_mismatches > 0,
    );
    card(
        o,
        t.result_mismatches.to_string(),
        "result mismatches",
        t.result_mismatches > 0,
    );
    card(
        o,
        t.nondeterministic.to_string(),
        "nondeterministic (not compared)",
        false,
    );
    card(o, t.not_compared.to_string(), "not compared", false);
    card(o, r.digests.len().to_string(), "digests", false);
    o.push_str("</div>\n");
}

fn legend(o: &mut String) {
    let _ = write!(
        o,
        "<div class=\"legend\"><span class=\"sw\" style=\"background:{PROD_COLOR}\"></span>production\
         <span class=\"sw\" style=\"background:{TEST_COLOR}\"></span>test</div>"
    );
}

/// A "nice" number at or above `v`: 1, 2 or 5 times a power of ten.
pub(super) fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

/// An axis from 0 to at least `max` in about four nice steps: (step, top).
fn axis(max: f64) -> (f64, f64) {
    let step = nice_max(max / 4.0);
    let top = (max / step).ceil().max(1.0) * step;
    (step, top)
}

/// Averages consecutive points so at most `QPS_POINTS` remain: (t_s, prod, test).
fn qps_series(r: &Report) -> Vec<(f64, f64, f64)> {
    let n = r.qps.len();
    let group = n.div_ceil(QPS_POINTS).max(1);
    r.qps
        .chunks(group)
        .map(|c| {
            let k = c.len() as f64;
            (
                c[0].t_s as f64,
                c.iter().map(|p| p.prod as f64).sum::<f64>() / k,
                c.iter().map(|p| p.test as f64).sum::<f64>() / k,
            )
        })
        .collect()
}

fn qps_chart(o: &mut String, r: &Report) {
    const W: f64 = 1100.0;
    const H: f64 = 280.0;
    const L: f64 = 64.0;
    const R: f64 = 16.0;
    const T: f64 = 12.0;
    const B: f64 = 36.0;
    let pts = qps_series(r);
    let _ = write!(
        o,
        "<svg id=\"qps-chart\" role=\"img\" aria-label=\"queries per second, production vs test\" \
         viewBox=\"0 0 {W} {H}\" width=\"100%\" style=\"max-width:{W}px\" \
         xmlns=\"http://www.w3.org/2000/svg\">"
    );
    let (pw, ph) = (W - L - R, H - T - B);
    let t_max = pts.last().map_or(1.0, |p| p.0).max(1.0);
    let (y_step, y_max) = axis(pts.iter().map(|p| p.1.max(p.2)).fold(0.0, f64::max));
    let x = |t: f64| L + t / t_max * pw;
    let y = |v: f64| T + ph - v / y_max * ph;
    // Grid and y labels.
    let ticks = (y_max / y_step).round() as u32;
    for i in 0..=ticks.min(10) {
        let v = y_step * f64::from(i);
        let yy = y(v);
        let _ = write!(
            o,
            "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            L + pw,
            L - 6.0,
            yy + 4.0,
            fmt_axis(v)
        );
    }
    // X labels: about ten, at whole seconds.
    let step = nice_max(t_max / 10.0).max(1.0);
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}s</text>",
            x(t),
            T + ph + 16.0,
            fmt_axis(t)
        );
        t += step;
    }
    let _ = write!(
        o,
        "<line x1=\"{L}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds since start</text>",
        T + ph,
        L + pw,
        T + ph,
        L + pw / 2.0,
        H - 4.0
    );
    if pts.is_empty() {
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"none\">no commands \
             observed</text>",
            L + pw / 2.0,
            T + ph / 2.0
        );
    } else {
        for (color, side) in [(PROD_COLOR, 0usize), (TEST_COLOR, 1)] {
            let mut d = String::with_capacity(pts.len() * 14);
            for (i, p) in pts.iter().enumerate() {
                let v = if side == 0 { p.1 } else { p.2 };
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if i == 0 { "M" } else { "L" },
                    x(p.0),
                    y(v)
                );
            }
            if pts.len() == 1 {
                // A single second is a dot, not a line.
                let _ = write!(d, "h2");
            }
            let _ = write!(
                o,
                "<path class=\"qps-{}\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" \
                 stroke-width=\"1.6\" stroke-linejoin=\"round\"/>",
                if side == 0 { "prod" } else { "test" }
            );
        }
    }
    o.push_str("</svg>");
    legend(o);
    o.push('\n');
}

fn fmt_axis(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The charts go to the largest slowdowns (not the report's ranking, which puts errors first:
/// the latency of a statement the test server refuses says little).
fn latency_charts(o: &mut String, ranked: &[&DigestReport]) {
    let mut chosen: Vec<&&DigestReport> = ranked
        .iter()
        .filter(|d| d.prod.count > 0 && d.test.count > 0)
        .collect();
    chosen.sort_by(|a, b| {
        b.slowdown_score()
            .total_cmp(&a.slowdown_score())
            .then_with(|| b.count.cmp(&a.count))
    });
    chosen.truncate(LATENCY_CHARTS);
    if chosen.is_empty() {
        o.push_str("<p class=\"none\">no digest has latency samples on both sides</p>\n");
        return;
    }
    legend(o);
    o.push_str("<div class=\"charts\">\n");
    for d in chosen {
        let _ = write!(
            o,
            "<figure><figcaption><code>{}</code> {} · n={} · p50 {} → {} ({}) · p99 {} → {} ({})\
             <br><code>{}</code></figcaption>",
            esc(&d.id),
            esc(&d.command),
            d.count,
            fmt_us(d.prod.p50_us),
            fmt_us(d.test.p50_us),
            fmt_ratio(d.ratio_p50()),
            fmt_us(d.prod.p99_us),
            fmt_us(d.test.p99_us),
            fmt_ratio(d.ratio_p99()),
            esc_max(&d.fingerprint, CELL_CHARS)
        );
        latency_chart(o, &d.prod, &d.test);
        o.push_str("</figure>\n");
    }
    o.push_str("</div>\n");
}

/// Paired bars per latency bucket: the share of each side's samples in that bucket (shares,
/// not counts, so a side with fewer samples still compares by shape).
fn latency_chart(o: &mut String, prod: &Latency, test: &Latency) {
    const W: f64 = 560.0;
    const H: f64 = 206.0;
    const L: f64 = 44.0;
    const R: f64 = 8.0;
    const T: f64 = 8.0;
    const B: f64 = 30.0;
    let bounds: Vec<u64> = prod
        .buckets
        .iter()
        .chain(&test.buckets)
        .map(|b| b.0)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let share = |l: &Latency, ub: u64| -> f64 {
        // In f64: shares only, and counts from a file may add up beyond u64.
        let total: f64 = l.buckets.iter().map(|b| b.1 as f64).sum();
        let n: f64 = l
            .buckets
            .iter()
            .filter(|b| b.0 == ub)
            .map(|b| b.1 as f64)
            .sum();
        if total > 0.0 {
            n / total
        } else {
            0.0
        }
    };
    let shares: Vec<(u64, f64, f64)> = bounds
        .iter()
        .map(|&ub| (ub, share(prod, ub), share(test, ub)))
        .collect();
    let (y_step, y_max) = axis(shares.iter().map(|s| s.1.max(s.2)).fold(0.0, f64::max));
    let (pw, ph) = (W - L - R, H - T - B);
    let _ = write!(
        o,
        "<svg class=\"latency-chart\" role=\"img\" aria-label=\"latency distribution\" \
         viewBox=\"0 0 {W} {H}\" width=\"100%\" xmlns=\"http://www.w3.org/2000/svg\">"
    );
    let ticks = (y_max / y_step).round() as u32;
    for i in 0..=ticks.min(10) {
        let v = y_step * f64::from(i);
        let yy = T + ph - v / y_max * ph;
        let _ = write!(
            o,
            "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#eee\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}%</text>",
            L + pw,
            L - 4.0,
            yy + 4.0,
            fmt_axis(v * 100.0)
        );
    }
    let n = shares.len().max(1) as f64;
    let slot = pw / n;
    let bar = (slot * 0.4).max(0.5);
    // About seven labels fit under the chart without overlapping.
    let label_every = shares.len().div_ceil(7).max(1);
    for (i, (ub, p, t)) in shares.iter().enumerate() {
        let x0 = L + slot * i as f64 + slot * 0.1;
        for (k, (v, color, class)) in [(p, PROD_COLOR, "prod"), (t, TEST_COLOR, "test")]
            .into_iter()
            .enumerate()
        {
            if *v <= 0.0 {
                continue;
            }
            let h = v / y_max * ph;
            let _ = write!(
                o,
                "<path class=\"bar-{class}\" d=\"M{:.2},{:.2}h{bar:.2}v{h:.2}h-{bar:.2}z\" \
                 fill=\"{color}\"><title>≤{} {class}: {:.1}%</title></path>",
                x0 + bar * k as f64,
                T + ph - h,
                fmt_us(*ub),
                v * 100.0
            );
        }
        if i % label_every == 0 {
            let _ = write!(
                o,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">≤{}</text>",
                x0 + bar,
                T + ph + 14.0,
                fmt_us(*ub)
            );
        }
    }
    let _ = write!(
        o,
        "<line x1=\"{L}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">latency bucket (upper bound)</text></svg>",
        T + ph,
        L + pw,
        T + ph,
        L + pw / 2.0,
        H - 5.0
    );
}

fn ratio_class(r: Option<f64>) -> &'static str {
    match r {
        Some(r) if r >= 1.5 => "n worse",
        Some(r) if r <= 1.0 / 1.5 => "n better",
        _ => "n",
    }
}

fn regressions_table(o: &mut String, ranked: &[&DigestReport]) {
    let _ = write!(
        o,
        "<h2>Regressions</h2><p class=\"meta\">Worst first: new test-side errors, then \
         mismatches, then slowdown (log p50 and p99 ratios) weighted by count.{}</p>\
         <table id=\"regressions\"><thead><tr><th>#</th><th>digest</th><th>command</th>\
         <th>count</th><th>prod p50</th><th>prod p99</th><th>test p50</th><th>test p99</th>\
         <th>p50 ×</th><th>p99 ×</th><th>errors prod / test</th><th>mismatches rows / result</th>\
         <th>statement</th></tr></thead><tbody>",
        if ranked.len() > TABLE_ROWS {
            format!(
                " Top {TABLE_ROWS} of {}; all are in report.json.",
                ranked.len()
            )
        } else {
            String::new()
        }
    );
    o.push('\n');
    if ranked.is_empty() {
        o.push_str("<tr><td colspan=\"13\" class=\"none\">no commands observed</td></tr>\n");
    }
    for (i, d) in ranked.iter().take(TABLE_ROWS).enumerate() {
        let lat = |l: &Latency, v: u64| {
            if l.count == 0 {
                "-".to_string()
            } else {
                fmt_us(v)
            }
        };
        let (pe, te) = d.error_totals();
        let example = if d.example.is_empty() {
            &d.fingerprint
        } else {
            &d.example
        };
        let _ = writeln!(
            o,
            "<tr><td class=\"n\">{}</td><td><code class=\"id\">{}</code></td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"{}\">{}</td><td class=\"{}\">{}</td>\
             <td class=\"{}\">{pe} / {te}</td><td class=\"{}\">{} / {}</td><td>{}<code>{}</code></td></tr>",
            i + 1,
            esc(&d.id),
            esc(&d.command),
            d.count,
            lat(&d.prod, d.prod.p50_us),
            lat(&d.prod, d.prod.p99_us),
            lat(&d.test, d.test.p50_us),
            lat(&d.test, d.test.p99_us),
            ratio_class(d.ratio_p50()),
            fmt_ratio(d.ratio_p50()),
            ratio_class(d.ratio_p99()),
            fmt_ratio(d.ratio_p99()),
            if d.new_test_errors() > 0 { "n worse" } else { "n" },
            if d.mismatches() > 0 { "n worse" } else { "n" },
            d.row_mismatches,
            d.result_mismatches,
            if d.nondeterministic {
                "<span class=\"tag\">nondeterministic</span> "
            } else {
                ""
            },
            esc_max(example, CELL_CHARS)
        );
    }
    o.push_str("</tbody></table>\n");
}

fn errors_table(o: &mut String, ranked: &[&DigestReport]) {
    o.push_str(
        "<h2>Errors</h2><table id=\"errors\"><thead><tr><th>digest</th><th>command</th>\
         <th>prod (code × count)</th><th>test (code × count)</th><th>new on test</th>\
         <th>statement</th></tr></thead><tbody>\n",
    );
    let mut any = false;
    for d in ranked
        .iter()
        .filter(|d| !d.prod_errors.is_empty() || !d.test_errors.is_empty())
    {
        any = true;
        let new = d.new_test_errors();
        let _ = writeln!(
            o,
            "<tr><td><code class=\"id\">{}</code></td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{new}</td>\
             <td><code>{}</code></td></tr>",
            esc(&d.id),
            esc(&d.command),
            fmt_errors(&d.prod_errors),
            fmt_errors(&d.test_errors),
            if new > 0 { "n worse" } else { "n" },
            esc_max(&d.fingerprint, CELL_CHARS)
        );
    }
    if !any {
        o.push_str("<tr><td colspan=\"6\" class=\"none\">no errors on either side</td></tr>\n");
    }
    o.push_str("</tbody></table>\n");
}

fn mismatches_table(o: &mut String, ranked: &[&DigestReport]) {
    o.push_str(
        "<h2>Mismatches</h2><table id=\"mismatches\"><thead><tr><th>digest</th><th>kind</th>\
         <th>production</th><th>test</th><th>statement</th></tr></thead><tbody>\n",
    );
    let mut any = false;
    for d in ranked {
        for m in d.mismatch_examples.iter().take(MISMATCHES_PER_DIGEST) {
            any = true;
            let _ = writeln!(
                o,
                "<tr><td><code class=\"id\">{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&d.id),
                esc_max(&m.kind, 32),
                esc_max(&m.prod, 64),
                esc_max(&m.test, 64),
                esc_max(&m.example, CELL_CHARS)
            );
        }
        if d.mismatch_examples.is_empty() && d.mismatches() > 0 {
            any = true;
            let _ =
                writeln!(
                o,
                "<tr><td><code class=\"id\">{}</code></td><td>{}</td><td colspan=\"2\" class=\"n\">{} rows, {} \
                 result (no example kept)</td><td><code>{}</code></td></tr>",
                esc(&d.id),
                if d.row_mismatches > 0 { "rows" } else { "result" },
                d.row_mismatches,
                d.result_mismatches,
                esc_max(&d.fingerprint, CELL_CHARS)
            );
        }
    }
    if !any {
        o.push_str("<tr><td colspan=\"5\" class=\"none\">no mismatches</td></tr>\n");
    }
    o.push_str("</tbody></table>\n");
}

/// `--tee`: test A against test B, flagged digests first (see [`super::ab`]).
fn ab_table(o: &mut String, ab: &super::ab::AbComparison) {
    let noise = match &ab.calibration {
        Some(c) => format!(
            "noise bands from the A/A calibration <code>{}</code>",
            esc(c)
        ),
        None => format!(
            "no A/A calibration: noise band ±{:.0} %",
            super::ab::DEFAULT_NOISE * 100.0
        ),
    };
    let _ = writeln!(
        o,
        "<h2>Test A vs test B</h2><p class=\"meta\">A <b>{}</b> vs B <b>{}</b> · {noise} · \
         <b>{}</b> of {} digests flagged (the 99 % interval of B/A p50 outside the band; at \
         least {} commands a side) · impact = n B × (B p50 − A p50)</p>\
         <table id=\"ab\"><thead><tr><th>verdict</th><th>digest</th><th>command</th>\
         <th>n A</th><th>n B</th><th>A p50</th><th>B p50</th><th>B/A p50</th>\
         <th>99 % interval</th><th>noise band</th><th>A p99</th><th>B p99</th>\
         <th>B/A p99 (interval)</th><th>impact</th><th>rows A/B</th>\
         <th>new errors A/B</th><th>mismatches A/B</th><th>statement</th></tr></thead><tbody>",
        esc(&ab.a),
        esc(&ab.b),
        ab.flagged,
        ab.digests.len(),
        super::ab::MIN_COUNT
    );
    for d in &ab.digests {
        let ms = |n: u64, us: u64| if n == 0 { "-".to_string() } else { fmt_us(us) };
        let impact = if d.impact_us < 0.0 {
            format!("−{}", fmt_us(d.impact_us.abs() as u64))
        } else {
            format!("+{}", fmt_us(d.impact_us as u64))
        };
        let _ = writeln!(
            o,
            "<tr><td class=\"{}\">{}</td><td><code class=\"id\">{}</code></td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.2}–{:.2}</td><td class=\"n\">{:.2}–{:.2}{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{:.2} ({:.2}–{:.2})</td><td class=\"n\">{}</td><td class=\"n\">{}/{}</td>\
             <td class=\"n\">{}/{}</td><td class=\"n\">{}/{}</td><td><code>{}</code></td></tr>",
            if d.flagged() { "worse" } else { "n" },
            esc_max(&d.verdict, 16),
            esc(&d.id),
            esc(&d.command),
            d.n_a,
            d.n_b,
            ms(d.n_a, d.p50_a_us),
            ms(d.n_b, d.p50_b_us),
            d.ratio_p50,
            d.ratio_low,
            d.ratio_high,
            d.noise_low,
            d.noise_high,
            if d.calibrated { "" } else { " (default)" },
            ms(d.n_a, d.p99_a_us),
            ms(d.n_b, d.p99_b_us),
            d.ratio_p99,
            d.ratio_p99_low,
            d.ratio_p99_high,
            impact,
            d.rows_a,
            d.rows_b,
            d.new_errors_a,
            d.new_errors_b,
            d.mismatches_a,
            d.mismatches_b,
            esc_max(&d.fingerprint, CELL_CHARS)
        );
    }
    if ab.digests.is_empty() {
        o.push_str("<tr><td colspan=\"18\" class=\"none\">no commands observed</td></tr>\n");
    }
    o.push_str("</tbody></table>\n");
}
