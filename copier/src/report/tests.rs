use std::collections::BTreeMap;

use super::diff::{diff, render_diff};
use super::fixtures::sample_report;
use super::html::render_html;
use super::text::render_text;
use super::*;

fn d(id: &str, count: u64, prod_p50: u64, test_p50: u64) -> DigestReport {
    let lat = |p50: u64| Latency {
        count,
        p50_us: p50,
        p90_us: p50.saturating_mul(2),
        p99_us: p50.saturating_mul(3),
        max_us: p50.saturating_mul(4),
        mean_us: p50 as f64,
        buckets: vec![(bucket_bound_125(p50), count)],
    };
    DigestReport {
        id: id.into(),
        fingerprint: format!("SELECT {id}"),
        command: "query".into(),
        count,
        prod: lat(prod_p50),
        test: lat(test_p50),
        ..DigestReport::default()
    }
}

#[test]
fn json_round_trips_and_checks_the_schema() {
    let r = sample_report();
    let text = to_json(&r);
    assert!(
        from_json(&text).unwrap() == r,
        "report.json does not read back equal"
    );
    // Error codes are object keys in JSON: strings, read back as numbers.
    assert!(text.contains("\"1142\": "), "{}", &text[..200]);
    let other = text.replace(SCHEMA, "tcpshadow.report/2");
    assert!(matches!(
        from_json(&other),
        Err(ReportError::Schema { found }) if found == "tcpshadow.report/2"
    ));
    for bad in [
        "",
        "[1,2]",
        "{\"digests\": []}",
        "{\"schema\": 3}",
        "not json",
    ] {
        assert!(
            matches!(from_json(bad), Err(ReportError::NotAReport(_))),
            "{bad:?}"
        );
    }
    // A report of our schema missing fields (written by an older copier) reads with defaults.
    let minimal = format!("{{\"schema\": \"{SCHEMA}\", \"totals\": {{\"commands\": 7}}}}");
    assert_eq!(from_json(&minimal).unwrap().totals.commands, 7);
    // Wrong types are refused, not panicked on.
    let wrong = format!("{{\"schema\": \"{SCHEMA}\", \"digests\": 5}}");
    assert!(matches!(from_json(&wrong), Err(ReportError::NotAReport(_))));
}

#[test]
fn default_report_names_its_schema() {
    assert_eq!(Report::default().schema, SCHEMA);
    assert_eq!(
        from_json(&to_json(&Report::default())).unwrap(),
        Report::default()
    );
}

#[test]
fn ranking_puts_new_errors_then_mismatches_then_slowdowns_first() {
    let mut errors = d("e", 10, 100, 100);
    errors.test_errors = BTreeMap::from([(1142, 3)]);
    let mut shared_errors = d("s", 10, 100, 100);
    shared_errors.test_errors = BTreeMap::from([(1146, 3)]);
    shared_errors.prod_errors = BTreeMap::from([(1146, 3)]);
    let mut mism = d("m", 10, 100, 100);
    mism.row_mismatches = 1;
    let hot_2x = d("h", 10_000, 100, 200);
    let cold_3x = d("c", 2, 100, 300);
    let faster = d("f", 10_000, 200, 100);
    let r = Report {
        digests: vec![faster, cold_3x, hot_2x, shared_errors, mism, errors],
        ..Report::default()
    };
    let order: Vec<&str> = r.ranked().iter().map(|d| d.id.as_str()).collect();
    assert_eq!(order, ["e", "m", "h", "c", "s", "f"]);
    assert!(r.digests[0].slowdown_score() < 0.0);
}

#[test]
fn ratios_survive_zero_and_missing_samples() {
    let mut x = d("z", 5, 0, 7);
    assert_eq!(x.ratio_p50(), Some(7.0));
    x.test.count = 0;
    assert_eq!(x.ratio_p50(), None);
    assert_eq!(x.slowdown_score(), 0.0);
}

#[test]
fn from_samples_quantiles_and_buckets() {
    let l = Latency::from_samples(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 100]);
    assert_eq!(
        (l.count, l.p50_us, l.p90_us, l.p99_us, l.max_us),
        (10, 5, 9, 100, 100)
    );
    assert_eq!(l.buckets, vec![(1, 1), (2, 1), (5, 3), (10, 4), (100, 1)]);
    assert_eq!(Latency::from_samples(&[]), Latency::default());
    assert_eq!(bucket_bound_125(u64::MAX), u64::MAX);
    assert_eq!(bucket_bound_125(0), 1);
    assert_eq!(bucket_bound_125(201), 500);
}

#[test]
fn html_escapes_untrusted_text() {
    let r = sample_report();
    let html = render_html(&r);
    assert!(
        !html.contains("<script"),
        "a statement's <script> reached the page"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("&lt;/td&gt;"));
    assert!(
        html.contains("&amp;amp;"),
        "a literal &amp; must be shown as typed"
    );
    assert!(!html.contains('\u{1b}'), "control characters are replaced");
    for needle in [
        "id=\"qps-chart\"",
        "class=\"latency-chart\"",
        "id=\"regressions\"",
        "id=\"errors\"",
        "id=\"mismatches\"",
        "class=\"qps-prod\" d=\"M",
        "class=\"bar-test\"",
    ] {
        assert!(html.contains(needle), "missing {needle}");
    }
    // The worst regression (new errors on sbtest2) is ranked first in the table.
    let table = &html[html.find("id=\"regressions\"").unwrap()..];
    let first_row = &table[table.find("<tbody>").unwrap()..];
    let first_row = &first_row[..first_row.find("</tr>").unwrap()];
    assert!(first_row.contains("sbtest2"), "{first_row}");
    // No external assets, no script at all.
    assert!(!html.contains("src=") && !html.contains("href="));
}

#[test]
fn escaping_covers_attributes_and_quotes() {
    assert_eq!(
        html::esc("a<b>&\"c\"'d'\u{0}\n"),
        "a&lt;b&gt;&amp;&quot;c&quot;&#39;d&#39;\u{FFFD}\n"
    );
}

#[test]
fn empty_report_renders_everywhere() {
    let r = Report::default();
    let html = render_html(&r);
    assert!(html.contains("no commands observed"));
    assert!(html.contains("id=\"qps-chart\"") && html.contains("id=\"mismatches\""));
    assert!(!html.contains("NaN") && !html.contains("inf"));
    let text = render_text(&r, None);
    assert!(text.contains("(no commands observed)"), "{text}");
    let diff = render_diff("a", &r, "b", &r, None);
    assert!(
        diff.contains("digests in both: 0, only in A: 0, only in B: 0"),
        "{diff}"
    );
}

#[test]
fn huge_counts_do_not_overflow() {
    let mut x = d("big", u64::MAX, u64::MAX, u64::MAX);
    x.test_errors = BTreeMap::from([(1, u64::MAX), (2, u64::MAX)]);
    x.row_mismatches = u64::MAX;
    x.result_mismatches = u64::MAX;
    x.prod.buckets = vec![(u64::MAX, u64::MAX), (1, u64::MAX)];
    let r = Report {
        totals: Totals {
            commands: u64::MAX,
            ..Totals::default()
        },
        qps: vec![
            QpsPoint {
                t_s: u64::MAX,
                prod: u64::MAX,
                test: 0,
            };
            3
        ],
        duration_s: f64::NAN,
        digests: vec![x.clone(), x],
        ..Report::default()
    };
    let html = render_html(&r);
    assert!(!html.contains("NaN"), "NaN in the page");
    let text = render_text(&r, Some(1));
    assert!(text.contains("18446744073709551615"), "{text}");
    let _ = render_diff("a", &r, "b", &r, Some(1));
    assert_eq!(
        from_json(&to_json(&r)).map(|x| x.digests.len()).ok(),
        Some(2)
    );
}

#[test]
fn text_is_ranked_and_free_of_control_characters() {
    let r = sample_report();
    let text = render_text(&r, None);
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "control characters"
    );
    let lines: Vec<&str> = text.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.trim_start().starts_with("1 "))
        .unwrap();
    assert!(lines[first].contains("sbtest2"), "{}", lines[first]);
    // New errors (sbtest2), then mismatches (sbtest4), then slowdowns (sbtest3).
    assert!(lines[first + 4].contains("sbtest4"), "{text}");
    assert!(lines[first + 8].contains("sbtest3"), "{text}");
    assert!(text.contains("1142x120000"), "{text}");
    assert!(text.contains("[nondeterministic]"));
    let top = render_text(&r, Some(3));
    assert!(top.contains("top 3 of"), "{top}");
}

#[test]
fn one_line_cuts_on_characters() {
    assert_eq!(one_line("a\n\tb  c", 10), "a b c");
    assert_eq!(one_line("ééééé", 3), "éé…");
    assert_eq!(one_line("\u{1b}[2J", 10), " [2J");
    assert_eq!(one_line("abc", 0), "");
}

#[test]
fn dates_are_utc() {
    assert_eq!(fmt_unix_ms(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(fmt_unix_ms(1_767_225_600_000), "2026-01-01 00:00:00 UTC");
    assert_eq!(fmt_unix_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
}

#[test]
fn diff_matches_by_id_and_sorts_by_slowdown() {
    let a = Report {
        digests: vec![
            d("same", 100, 100, 100),
            d("slower", 100, 100, 100),
            d("gone", 5, 1, 1),
        ],
        ..Report::default()
    };
    let mut errs = d("same", 100, 100, 90);
    errs.test_errors = BTreeMap::from([(1292, 4)]);
    let b = Report {
        digests: vec![errs, d("slower", 100, 100, 400), d("new", 9, 1, 1)],
        ..Report::default()
    };
    let x = diff(&a, &b);
    assert_eq!(x.changed[0].a.id, "slower");
    assert_eq!(x.changed[0].test_p50_ratio, Some(4.0));
    assert_eq!(x.changed[1].test_errors_delta, 4);
    assert_eq!(x.only_a[0].id, "gone");
    assert_eq!(x.only_b[0].id, "new");
    let text = render_diff("A.json", &a, "B.json", &b, Some(1));
    assert!(
        text.contains("digests in both: 2, only in A: 1, only in B: 1"),
        "{text}"
    );
    assert!(text.contains("4.00x"), "{text}");
    assert!(text.contains("test errors 0 -> 1292x4"), "{text}");
    assert!(!text.contains("\n   2 "), "--top 1 shows one row: {text}");
}

#[test]
fn diff_files_refuses_what_is_not_a_report() {
    let dir = std::env::temp_dir().join(format!("tcpshadow-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("a.json");
    std::fs::write(&good, to_json(&sample_report())).unwrap();
    let other = dir.join("b.json");
    std::fs::write(&other, "{\"schema\": \"pt-upgrade/9\"}").unwrap();
    let junk = dir.join("c.json");
    std::fs::write(&junk, "\u{0}\u{1}garbage").unwrap();
    let e = diff::diff_files(&good, &other, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("b.json") && e.contains("pt-upgrade/9"), "{e}");
    let e = diff::diff_files(&junk, &good, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("c.json") && e.contains("not valid JSON"), "{e}");
    let e = diff::diff_files(&dir.join("missing.json"), &good, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.json"), "{e}");
    let same = diff::diff_files(&good, &good, Some(5)).unwrap();
    assert!(same.contains("only in A: 0, only in B: 0"), "{same}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn write_report_is_atomic_and_creates_the_directory() {
    let dir = std::env::temp_dir()
        .join(format!("tcpshadow-write-{}", std::process::id()))
        .join("nested");
    let r = sample_report();
    write_report(&dir, &r).unwrap();
    write_report(&dir, &r).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["report.html", "report.json", "report.txt"]);
    assert!(read_report(&dir.join("report.json")).unwrap() == r);
    // A file where the directory should be: a clear error naming it.
    let blocked = dir.join("report.txt").join("sub");
    let e = write_report(&blocked, &r).unwrap_err().to_string();
    assert!(e.contains("report.txt"), "{e}");
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

/// `TCPSHADOW_REPORT_SAMPLE_DIR=/tmp/x cargo test -p copier --lib write_sample_report` writes
/// the fixture's three files there, to look at them by hand.
#[test]
fn write_sample_report() {
    if let Some(dir) = std::env::var_os("TCPSHADOW_REPORT_SAMPLE_DIR") {
        write_report(std::path::Path::new(&dir), &sample_report()).unwrap();
    }
}

#[test]
fn the_ab_section_is_rendered_and_escaped() {
    let mut r = sample_report();
    let ab = crate::report::ab::AbComparison {
        a: "198.18.0.3:3306".into(),
        b: "198.18.0.6:3306<b>".into(),
        calibration: Some("aa/<report>.json".into()),
        flagged: 1,
        digests: vec![crate::report::ab::AbDigest {
            id: "00000000000000ab".into(),
            command: "stmt_execute".into(),
            fingerprint: "select <script>alert(1)</script>".into(),
            n_a: 400,
            n_b: 400,
            p50_a_us: 1000,
            p50_b_us: 2250,
            ratio_p50: 2.25,
            ratio_low: 1.78,
            ratio_high: 4.0,
            noise_low: 0.87,
            noise_high: 1.3,
            calibrated: true,
            verdict: "slower".into(),
            impact_us: 500_000.0,
            ..Default::default()
        }],
    };
    r.ab = Some(ab);
    let html = render_html(&r);
    assert!(html.contains("id=\"ab\"") && html.contains("Test A vs test B"));
    assert!(!html.contains("<script") && !html.contains("6:3306<b>"));
    assert!(html.contains("1.78–4.00"));
    let text = crate::report::text::render_text(&r, None);
    let ab_text = &text[text.find("A/B: ").expect("an A/B section")..];
    assert!(ab_text.contains("1 of 1 digests flagged"), "{ab_text}");
    assert!(
        ab_text.contains("slower") && ab_text.contains("1.78-4.00"),
        "{ab_text}"
    );
    assert!(ab_text.contains("+500.0ms"), "{ab_text}");
}
