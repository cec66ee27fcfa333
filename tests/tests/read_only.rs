//! Acceptance of `--read-only` (issue 5): commands that write never reach the test server,
//! while the mirrored sessions' reads still run there.
//!
//! How reads are counted: `Com_select`. sysbench uses server-side prepared statements, and
//! MariaDB counts a prepared SELECT in `Com_select` once per COM_STMT_EXECUTE (not at its
//! COM_STMT_PREPARE), as it counts a text-protocol SELECT once per COM_QUERY; likewise a
//! prepared INSERT/UPDATE/DELETE only bumps `Com_insert`/`Com_update`/`Com_delete` when executed
//! (checked on the lab's MariaDB 10.11). The counters are read over the root socket with SHOW
//! STATUS, which does not touch `Com_select`. So the share of reads executed on test is
//! `Δ Com_select(test) / Δ Com_select(prod)` over the same window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{Comparison, Work};
use tcpshadow_tests::{Counters, Host, Lab, Load};

/// The tests of this file take turns: two labs under load at once on a small machine would
/// measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

fn start_read_only_mirror(lab: &Lab) -> Result<Mirror> {
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            lab.credentials_file()?,
            "--read-only".into(),
        ],
        ..Default::default()
    };
    Mirror::start(lab, &opts)
}

/// Waits (at most 10 s) until the test server executed as many SELECTs as prod since the
/// snapshots; returns test's latest counters.
fn wait_for_reads(lab: &Lab, prod: u64, t0: &Counters) -> Result<Counters> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut t1 = lab.counters(Host::Test)?;
    while t1.delta(t0, "Com_select") < prod && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        t1 = lab.counters(Host::Test)?;
    }
    Ok(t1)
}

/// The copier summary's `read-only:` line, as `kind -> count`.
fn skipped_counts(summary: &str) -> Result<Vec<(String, u64)>> {
    let line = summary
        .lines()
        .find(|l| l.trim_start().starts_with("read-only:"))
        .context("no read-only line in the copier summary")?;
    let (_, each) = line
        .rsplit_once("by design):")
        .context("read-only line without counts")?;
    each.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').context("count without =")?;
            Ok((k.to_string(), v.parse()?))
        })
        .collect()
}

fn count_of(counts: &[(String, u64)], kind: &str) -> u64 {
    counts
        .iter()
        .find(|(k, _)| k == kind)
        .map_or(0, |(_, n)| *n)
}

fn no_login_trouble_on_test(lab: &Lab, t0: &Counters, t1: &Counters) -> Result<()> {
    ensure!(
        t1.delta(t0, "Aborted_connects") == 0,
        "the test server counted {} aborted connects",
        t1.delta(t0, "Aborted_connects")
    );
    let errlog = std::fs::read_to_string(lab.var("LAB_TEST_ERRLOG")).unwrap_or_default();
    ensure!(
        !errlog.contains("Access denied"),
        "the test server denied logins:\n{errlog}"
    );
    Ok(())
}

/// Issue 5's acceptance: sysbench `oltp_read_write`, 8 threads, through a `--read-only` mirror.
#[test]
fn oltp_read_write_runs_only_its_reads_on_the_test_server() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("rosb")?;
    let mirror = start_read_only_mirror(&lab)?;
    let secs = load_secs();
    let before = lab.work_both()?;
    let (p0, t0) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    let report = lab.load(&Load {
        test: "oltp_read_write".into(),
        threads: 8,
        time_secs: secs,
        ..Load::default()
    })?;
    let p1 = lab.counters(Host::Prod)?;
    let reads_prod = p1.delta(&p0, "Com_select");
    let t1 = wait_for_reads(&lab, reads_prod, &t0)?;
    let after = lab.work_both()?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    // Reads by the shared comparison: both bounds, and no error on test that production did
    // not have (writes are kept off by design, so only Com_select is held to 1).
    let work = Comparison::new(
        Work::between(&before.0, &after.0)?,
        Work::between(&before.1, &after.1)?,
    );
    println!("{work}");
    let select = work
        .rows()
        .into_iter()
        .find(|r| r.kind == "Com_select")
        .and_then(|r| r.ratio)
        .unwrap_or(0.0);
    ensure!(
        (0.999..=1.001).contains(&select) && work.new_errors().is_empty(),
        "--read-only: reads {select:.5} of production's, or new errors on test:\n{work}"
    );

    let d = |c: &Counters, e: &Counters, name: &str| c.delta(e, name);
    let reads_test = d(&t1, &t0, "Com_select");
    let writes_prod: u64 = ["Com_insert", "Com_update", "Com_delete"]
        .iter()
        .map(|c| d(&p1, &p0, c))
        .sum();
    let share = reads_test as f64 / reads_prod.max(1) as f64;
    let counts = skipped_counts(&copier.stderr)?;
    let skipped_executes = count_of(&counts, "stmt_execute");
    println!(
        "--read-only, oltp_read_write 8 threads {secs} s ({} transactions, {} queries, {} ignored \
         errors on prod):\n  prod: Com_select {reads_prod} Com_insert {} Com_update {} \
         Com_delete {} Com_stmt_execute {}\n  test: Com_select {reads_test} Com_insert {} \
         Com_update {} Com_delete {} Com_replace {} Com_stmt_execute {}\n  reads executed on \
         test: {share:.5}; executes not mirrored {skipped_executes} of prod's {writes_prod} writes",
        report.transactions,
        report.queries,
        report.errors,
        d(&p1, &p0, "Com_insert"),
        d(&p1, &p0, "Com_update"),
        d(&p1, &p0, "Com_delete"),
        d(&p1, &p0, "Com_stmt_execute"),
        d(&t1, &t0, "Com_insert"),
        d(&t1, &t0, "Com_update"),
        d(&t1, &t0, "Com_delete"),
        d(&t1, &t0, "Com_replace"),
        d(&t1, &t0, "Com_stmt_execute"),
    );

    for c in ["Com_insert", "Com_update", "Com_delete"] {
        ensure!(
            d(&p1, &p0, c) > 0,
            "prod ran no {c}: the load did not write"
        );
    }
    for c in ["Com_insert", "Com_update", "Com_delete", "Com_replace"] {
        ensure!(d(&t1, &t0, c) == 0, "{c} on test: {}", d(&t1, &t0, c));
    }
    ensure!(
        share >= 0.999 && reads_test <= reads_prod,
        "test executed {reads_test} of prod's {reads_prod} SELECTs ({share:.5})"
    );
    // Every write sysbench ran is an execute of a statement whose prepare was kept off.
    ensure!(
        skipped_executes as f64 >= 0.999 * writes_prod as f64 && skipped_executes <= writes_prod,
        "the copier kept {skipped_executes} executes off, prod ran {writes_prod} writes"
    );
    for kind in ["insert", "update", "delete"] {
        ensure!(
            count_of(&counts, kind) > 0,
            "no {kind} prepare counted as not mirrored: {counts:?}"
        );
    }
    ensure!(
        !copier.stderr.contains("read only skipped"),
        "--read-only skips listed as losses:\n{}",
        copier.stderr
    );
    no_login_trouble_on_test(&lab, &t0, &t1)
}

/// The mariadb CLI (text protocol, comments kept): writes inside a transaction, a locking read,
/// a CTE, DDL and an executable comment; the test server's tables do not change, its reads run.
#[test]
fn mariadb_client_session_changes_nothing_on_the_test_server() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("rocli")?;
    let checksum = "CHECKSUM TABLE sbtest.sbtest1, sbtest.sbtest2, sbtest.sbtest3";
    let before = lab.sql(Host::Test, checksum)?;
    ensure!(
        before == lab.sql(Host::Prod, checksum)?,
        "prod and test start with different data"
    );
    let mirror = start_read_only_mirror(&lab)?;
    let (p0, t0) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    let script = "\
        /* app=report */ SELECT COUNT(*) FROM sbtest1;\n\
        WITH low AS (SELECT id, k FROM sbtest1 WHERE id <= 10) SELECT SUM(k) FROM low;\n\
        BEGIN;\n\
        SELECT k FROM sbtest1 WHERE id = 1 FOR UPDATE;\n\
        UPDATE sbtest1 SET k = k + 1000 WHERE id = 1;\n\
        -- a comment line\n\
        INSERT INTO sbtest1 (id, k, c, pad) VALUES (900001, 1, 'read-only', 'check');\n\
        COMMIT;\n\
        DELETE FROM sbtest2 WHERE id = 5;\n\
        REPLACE INTO sbtest3 (id, k, c, pad) VALUES (5, 5, 'x', 'y');\n\
        CREATE TABLE ro_check (a INT);\n\
        /*!40101 SET NAMES utf8mb4 */;\n\
        SELECT 42;\n";
    let out = lab.exec_ok(
        Host::Client,
        &[
            "mariadb",
            "--no-defaults",
            "--comments",
            "-h",
            lab.ip(Host::Prod),
            "-u",
            lab.var("LAB_USER"),
            &format!("-p{}", lab.var("LAB_PASSWORD")),
            "-N",
            "sbtest",
            "-e",
            script,
        ],
    )?;
    ensure!(out.contains("42"), "mariadb CLI output: {out}");
    let p1 = lab.counters(Host::Prod)?;
    // Prod ran one SELECT more than test: the locking one.
    let reads_prod = p1.delta(&p0, "Com_select");
    let t1 = wait_for_reads(&lab, reads_prod.saturating_sub(1), &t0)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);

    for c in ["Com_insert", "Com_update", "Com_delete", "Com_replace"] {
        ensure!(p1.delta(&p0, c) == 1, "prod {c}: {}", p1.delta(&p0, c));
        ensure!(t1.delta(&t0, c) == 0, "test {c}: {}", t1.delta(&t0, c));
    }
    let reads_test = t1.delta(&t0, "Com_select");
    ensure!(
        reads_test + 1 == reads_prod,
        "SELECTs: prod {reads_prod} (one locking), test {reads_test}"
    );
    for c in ["Com_begin", "Com_commit"] {
        ensure!(
            t1.delta(&t0, c) == p1.delta(&p0, c),
            "{c}: test {} prod {}",
            t1.delta(&t0, c),
            p1.delta(&p0, c)
        );
    }
    ensure!(
        lab.sql(Host::Test, checksum)? == before,
        "the test server's data changed"
    );
    ensure!(
        lab.sql(Host::Prod, checksum)? != before,
        "prod's data did not change: the script did not write"
    );
    ensure!(
        lab.sql(Host::Test, "SHOW TABLES FROM sbtest LIKE 'ro_check'")?
            .is_empty(),
        "CREATE TABLE reached the test server"
    );
    let counts = skipped_counts(&copier.stderr)?;
    for kind in [
        "locking_read",
        "update",
        "insert",
        "delete",
        "replace",
        "ddl",
    ] {
        ensure!(
            count_of(&counts, kind) == 1,
            "{kind} not counted once: {counts:?}"
        );
    }
    no_login_trouble_on_test(&lab, &t0, &t1)
}
