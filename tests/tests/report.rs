//! Acceptance of the comparison report's data (issue 6): sysbench `oltp_read_only`, 8 threads,
//! mirrored with real grants, `--report DIR --compare-results`; the figures come from the
//! report.json the copier writes when it stops.
//!
//! How counts are checked against the servers: sysbench runs server-side prepared statements
//! only (`--db-ps-mode=auto`), so every command it sends after its login is a COM_STMT_PREPARE
//! (counted by the server in `Com_stmt_prepare`), a COM_STMT_EXECUTE (`Com_stmt_execute`), a
//! COM_STMT_CLOSE (no reply, not a report command) or a COM_QUIT. The report's commands of type
//! `stmt_execute` and `stmt_prepare` are compared with those two counters' deltas on production
//! over the run (read over the root socket, which the copier does not capture); nothing else
//! talks to production's port meanwhile. The test side is checked the same way against the
//! test server's counters.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use copier::report::{read_report, DigestReport, Report};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{Comparison, Work};
use tcpshadow_tests::{Counters, Host, Lab, Load};

/// The tests of this file take turns: two labs under load at once would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// One mirrored sysbench run and what came of it.
struct Run {
    report: Report,
    /// Counter deltas over the run: production, test.
    prod: Counters,
    test: Counters,
    /// Both servers' executed work over the run (tests/src/work.rs).
    work: Comparison,
    copier: String,
}

fn deltas(after: &Counters, before: &Counters) -> Counters {
    Counters(
        after
            .0
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(before.0.get(k).copied().unwrap_or(0)),
                )
            })
            .collect(),
        after.1,
    )
}

/// Mirrors `oltp_read_only` (8 threads, `secs`, `extra` sysbench options) with
/// `--report DIR --compare-results`.
fn mirrored_run(lab: &Lab, name: &str, secs: u32, extra: &[&str]) -> Result<Run> {
    let dir = PathBuf::from(lab.var("LAB_DIR")).join(format!("report-{name}"));
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            lab.credentials_file()?,
            "--report".into(),
            dir.to_string_lossy().into_owned(),
            "--compare-results".into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(lab, &opts)?;
    let before = lab.work_both()?;
    let (p0, t0) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    let load = lab.load(&Load {
        test: "oltp_read_only".into(),
        threads: 8,
        time_secs: secs,
        extra: extra.iter().map(|s| s.to_string()).collect(),
        ..Load::default()
    })?;
    ensure!(load.errors == 0, "sysbench errors:\n{}", load.output);
    let p1 = lab.counters(Host::Prod)?;
    // The test server may still be working through what was mirrored: wait until it did as
    // many executes as production, or (some are refused there) until it stops moving.
    let executes = p1.delta(&p0, "Com_stmt_execute");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut t1 = lab.counters(Host::Test)?;
    let mut still = 0;
    while t1.delta(&t0, "Com_stmt_execute") < executes && Instant::now() < deadline && still < 4 {
        std::thread::sleep(Duration::from_millis(250));
        let t = lab.counters(Host::Test)?;
        let moved = t.delta(&t0, "Com_stmt_execute") != t1.delta(&t0, "Com_stmt_execute");
        still = if moved { 0 } else { still + 1 };
        t1 = t;
    }
    let after = lab.work_both()?;
    let (copier, _) = mirror.stop()?;
    // Every login is seen: the copier runs no statement of its own.
    let work = Comparison::new(
        Work::between(&before.0, &after.0)?,
        Work::between(&before.1, &after.1)?,
    );
    println!("{name}:\n{work}");
    let report = read_report(&dir.join("report.json"))
        .with_context(|| format!("copier output:\n{}", copier.stderr))?;
    println!(
        "{name}: sysbench oltp_read_only 8 threads {secs} s {}: {} transactions, {} queries",
        extra.join(" "),
        load.transactions,
        load.queries
    );
    Ok(Run {
        report,
        prod: deltas(&p1, &p0),
        test: deltas(&t1, &t0),
        work,
        copier: copier.stderr,
    })
}

/// Commands of type `command` in the report: production's count, the test server's answers.
fn counted(r: &Report, command: &str) -> (u64, u64) {
    r.digests
        .iter()
        .filter(|d| d.command == command)
        .fold((0, 0), |(p, t), d| (p + d.count, t + d.test.count))
}

fn within(a: u64, b: u64, share: f64) -> bool {
    (a as f64 - b as f64).abs() <= share * (b.max(1) as f64)
}

fn is_table(d: &DigestReport, table: &str) -> bool {
    d.fingerprint.contains(&format!("from {table} "))
}

fn print_digests(r: &Report) {
    println!(
        "{:<16} {:<13} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6} {:>5} {:>6} {:>6}  fingerprint",
        "id",
        "command",
        "count",
        "prod p50",
        "test p50",
        "prod p99",
        "test p99",
        "ratio",
        "rows",
        "errors",
        "mism"
    );
    for d in r.ranked() {
        println!(
            "{:<16} {:<13} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6.2} {:>5} {:>6} {:>6}  {}",
            d.id,
            d.command,
            d.count,
            d.prod.p50_us,
            d.test.p50_us,
            d.prod.p99_us,
            d.test.p99_us,
            d.ratio_p50().unwrap_or(0.0),
            format!("{}/{}", d.rows_prod, d.rows_test),
            format!("{}/{}", d.error_totals().0, d.error_totals().1),
            format!("{}/{}", d.row_mismatches, d.result_mismatches),
            d.fingerprint
        );
    }
    println!("totals: {:?}", r.totals);
}

/// Test latency is measured on the copier's clock from sending a command (or, if the test
/// server was still answering the session's previous one, from that answer's end) to the
/// moment intercept's summary of the reply's end was read off the control socket, less how
/// long the reply waited at intercept (its capture block, its batch: intercept's own clock). Production's is measured between
/// kernel capture timestamps on the production host. Both are then a few tens of microseconds
/// for a point select on an idle lab, where scheduling jitter alone can double one side:
/// p50s are compared over this floor.
const P50_FLOOR_US: u64 = 100;

#[test]
fn an_unchanged_test_server_shows_no_regression() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("cosame")?;
    let secs = load_secs();
    let run = mirrored_run(&lab, "same", secs, &[])?;
    let r = &run.report;
    print_digests(r);
    println!("{}", run.copier);

    let t = &r.totals;
    ensure!(
        t.row_mismatches == 0 && t.result_mismatches == 0,
        "mismatches on an unchanged test server: {t:?}"
    );
    ensure!(t.prod_errors == 0 && t.test_errors == 0, "errors: {t:?}");
    run.work.check(0.999, 1.001)?;
    ensure!(r.compare_results, "checksums were not compared");
    ensure!(
        t.not_compared as f64 <= 0.001 * t.commands as f64,
        "{} of {} commands not compared",
        t.not_compared,
        t.commands
    );

    // Counts against the servers' own counters.
    let (exec_prod, exec_test) = counted(r, "stmt_execute");
    let (prep_prod, prep_test) = counted(r, "stmt_prepare");
    let c = |c: &Counters, n: &str| c.0.get(n).copied().unwrap_or(0);
    println!(
        "counts: executes report {exec_prod} (test answers {exec_test}), Com_stmt_execute prod {} \
         test {}; prepares report {prep_prod} (test {prep_test}), Com_stmt_prepare prod {} test {}; \
         report commands {} of which other types {}",
        c(&run.prod, "Com_stmt_execute"),
        c(&run.test, "Com_stmt_execute"),
        c(&run.prod, "Com_stmt_prepare"),
        c(&run.test, "Com_stmt_prepare"),
        t.commands,
        t.commands - exec_prod - prep_prod,
    );
    for (what, report, server) in [
        (
            "executes (prod)",
            exec_prod,
            c(&run.prod, "Com_stmt_execute"),
        ),
        (
            "executes (test)",
            exec_test,
            c(&run.test, "Com_stmt_execute"),
        ),
        (
            "prepares (prod)",
            prep_prod,
            c(&run.prod, "Com_stmt_prepare"),
        ),
        (
            "prepares (test)",
            prep_test,
            c(&run.test, "Com_stmt_prepare"),
        ),
    ] {
        ensure!(
            within(report, server, 0.001),
            "{what}: report {report}, server {server}"
        );
    }
    ensure!(
        exec_prod + prep_prod == t.commands,
        "commands of other types in the report"
    );

    // Latency: no digest slower by more than 2x at p50 (over the floor).
    let mut worst = (0.0f64, String::new());
    for d in r.digests.iter().filter(|d| d.count >= 100) {
        let ratio = d.test.p50_us.max(P50_FLOOR_US) as f64 / d.prod.p50_us.max(P50_FLOOR_US) as f64;
        if ratio > worst.0 {
            worst = (ratio, d.fingerprint.clone());
        }
        let allowed = 2 * d.prod.p50_us.max(P50_FLOOR_US);
        ensure!(
            d.test.p50_us <= allowed,
            "{} {}: test p50 {} us, prod p50 {} us (allowed {allowed})",
            d.command,
            d.fingerprint,
            d.test.p50_us,
            d.prod.p50_us
        );
    }
    println!(
        "worst p50 ratio (floor {P50_FLOOR_US} us): {:.2} ({})",
        worst.0, worst.1
    );
    Ok(())
}

#[test]
fn changes_on_the_test_server_show_up_digest_by_digest() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("codiff")?;
    let secs = load_secs();
    let db = lab.var("LAB_DB");

    // A: sbtest3 loses its primary key on the test server (id is AUTO_INCREMENT, which must be
    // a key: that goes first). The k index stays. Every lookup by id then scans the table
    // there: ~3 ms instead of ~30 us. At sysbench's full speed (~700 transactions/s here, a
    // quarter of them on sbtest3, 14 statements each) the test server would need ~7 s of CPU
    // per second: every session falls behind until the copier gives it up, and the report
    // would measure the backlog, not the statements. So this run is paced at 40
    // transactions/s, which the test server keeps up with.
    lab.sql(
        Host::Test,
        &format!("ALTER TABLE {db}.sbtest3 MODIFY id INT NOT NULL, DROP PRIMARY KEY"),
    )?;
    let a = mirrored_run(&lab, "nopk", secs, &["--rate=40"])?;
    print_digests(&a.report);
    println!("{}", a.copier);
    lab.sql(
        Host::Test,
        &format!(
            "ALTER TABLE {db}.sbtest3 ADD PRIMARY KEY (id), MODIFY id INT NOT NULL AUTO_INCREMENT"
        ),
    )?;
    let r = &a.report;
    let t = &r.totals;
    ensure!(
        t.test_errors == 0 && t.row_mismatches == 0 && t.result_mismatches == 0,
        "a missing index changes no answer: {t:?}"
    );
    a.work.check(0.999, 1.001).context("a missing index")?;
    let slow: Vec<&DigestReport> = r
        .digests
        .iter()
        .filter(|d| d.command == "stmt_execute" && is_table(d, "sbtest3"))
        .collect();
    ensure!(slow.len() == 5, "sbtest3's five statements: {}", slow.len());
    // Among the statements that read a table: BEGIN and COMMIT wait for the CPU the scans take
    // on the test server too (their test p99 reaches 5 ms, p50 ~300 us against ~45), and
    // their score lands within a few percent of the least slowed sbtest3 statement's, on
    // either side (CI, 2026-11-30: 11.07 against 11.0; the same run before this session's
    // changes: 11.1 against 13.6). The report is right to list them; the check is about
    // which tables the missing index slows down.
    let ranked: Vec<&DigestReport> = r
        .ranked()
        .into_iter()
        .filter(|d| d.fingerprint.starts_with("select"))
        .collect();
    for (i, d) in ranked.iter().take(slow.len()).enumerate() {
        ensure!(
            d.command == "stmt_execute" && is_table(d, "sbtest3"),
            "rank {}: {} {} (ratio {:?}), not an sbtest3 statement",
            i + 1,
            d.command,
            d.fingerprint,
            d.ratio_p50()
        );
    }

    // B: 100 rows of sbtest4 gone (every 200th id, so ranges of 100 ids often miss one), and
    // the account may no longer read sbtest2 (its schema-wide grant becomes per-table grants,
    // sbtest2's without SELECT).
    lab.sql(
        Host::Test,
        &format!("DELETE FROM {db}.sbtest4 WHERE id % 200 = 0"),
    )?;
    lab.deny_select_on_test("sbtest2")?;
    let b = mirrored_run(&lab, "rows-grants", secs, &[])?;
    print_digests(&b.report);
    println!("{}", b.copier);
    let r = &b.report;
    // The test server fails the 8 connections' prepares of sbtest2's five statements, and
    // nothing else (their executes are not sent: the copier counts them).
    let expected = BTreeMap::from([("statement/com/Prepare".to_string(), 8 * 5)]);
    ensure!(
        b.work.new_errors() == expected,
        "the test server's errors, expected {expected:?}:\n{}",
        b.work
    );
    for d in &r.digests {
        let (prod_errors, test_errors) = d.error_totals();
        ensure!(prod_errors == 0, "{}: production errors", d.fingerprint);
        if is_table(d, "sbtest2") {
            // Prepares fail with 1142; executes of them cannot run there: the same error.
            ensure!(
                d.test_errors.get(&1142) == Some(&d.count) && test_errors == d.count,
                "{} {}: test errors {:?} of {}",
                d.command,
                d.fingerprint,
                d.test_errors,
                d.count
            );
        } else {
            ensure!(
                test_errors == 0,
                "{} {}: test errors {:?}",
                d.command,
                d.fingerprint,
                d.test_errors
            );
        }
        if !is_table(d, "sbtest4") {
            ensure!(
                d.mismatches() == 0,
                "{} {}: {} mismatches",
                d.command,
                d.fingerprint,
                d.mismatches()
            );
        }
    }
    let sbtest4: Vec<&DigestReport> = r
        .digests
        .iter()
        .filter(|d| d.command == "stmt_execute" && is_table(d, "sbtest4"))
        .collect();
    ensure!(sbtest4.len() == 5);
    for d in &sbtest4 {
        ensure!(
            d.mismatches() > 0 && !d.mismatch_examples.is_empty(),
            "{}: no mismatch",
            d.fingerprint
        );
        if d.fingerprint.starts_with("select sum(k)") {
            // One row either way: the checksum tells.
            ensure!(d.result_mismatches > 0, "{}", d.fingerprint);
        } else {
            ensure!(
                d.row_mismatches > 0 && d.rows_test < d.rows_prod,
                "{}",
                d.fingerprint
            );
        }
    }
    // Ranked: the digests that fail on the test server first, then those that answer
    // differently.
    let ranked = r.ranked();
    let errors = r.digests.iter().filter(|d| is_table(d, "sbtest2")).count();
    ensure!(ranked[..errors].iter().all(|d| is_table(d, "sbtest2")));
    ensure!(ranked[errors..errors + 5]
        .iter()
        .all(|d| is_table(d, "sbtest4")));
    Ok(())
}
