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

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use copier::report::{read_report, Report};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::{Counters, Host, Lab, Load};

/// The tests of this file take turns: two labs under load at once would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// Writes the test server's credentials (the lab's normal account) to a 0600 file.
fn credentials_file(lab: &Lab) -> Result<String> {
    let path = Path::new(lab.var("LAB_DIR")).join("test-credentials");
    std::fs::write(
        &path,
        format!("{}:{}\n", lab.var("LAB_USER"), lab.var("LAB_PASSWORD")),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path.to_string_lossy().into_owned())
}

/// One mirrored sysbench run and what came of it.
struct Run {
    report: Report,
    /// Counter deltas over the run: production, test.
    prod: Counters,
    test: Counters,
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
    )
}

/// Mirrors `oltp_read_only` (8 threads, `secs`) with `--report DIR --compare-results`.
fn mirrored_run(lab: &Lab, name: &str, secs: u32) -> Result<Run> {
    let dir = PathBuf::from(lab.var("LAB_DIR")).join(format!("report-{name}"));
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            credentials_file(lab)?,
            "--report".into(),
            dir.to_string_lossy().into_owned(),
            "--compare-results".into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(lab, &opts)?;
    let (p0, t0) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    let load = lab.load(&Load {
        test: "oltp_read_only".into(),
        threads: 8,
        time_secs: secs,
        ..Load::default()
    })?;
    let p1 = lab.counters(Host::Prod)?;
    // The test server may still be working through what was mirrored.
    let executes = p1.delta(&p0, "Com_stmt_execute");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut t1 = lab.counters(Host::Test)?;
    while t1.delta(&t0, "Com_stmt_execute") < executes && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        t1 = lab.counters(Host::Test)?;
    }
    let (copier, _) = mirror.stop()?;
    let report = read_report(&dir.join("report.json"))
        .with_context(|| format!("copier output:\n{}", copier.stderr))?;
    println!(
        "{name}: sysbench {} transactions, {} queries, {} errors",
        load.transactions, load.queries, load.errors
    );
    Ok(Run {
        report,
        prod: deltas(&p1, &p0),
        test: deltas(&t1, &t0),
        copier: copier.stderr,
    })
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

#[test]
fn an_unchanged_test_server_shows_no_regression() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("cosame")?;
    let secs = load_secs();
    let run = mirrored_run(&lab, "same", secs)?;
    let r = &run.report;
    print_digests(r);
    println!("prod deltas: {:?}", run.prod.0);
    println!("test deltas: {:?}", run.test.0);
    println!("{}", run.copier);
    Ok(())
}

#[test]
fn changes_on_the_test_server_show_up_digest_by_digest() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("codiff")?;
    let secs = load_secs();
    let (db, user) = (lab.var("LAB_DB"), lab.var("LAB_USER"));

    // A: sbtest3 loses its primary key on the test server (id is AUTO_INCREMENT, which must be
    // a key: dropped first). The k index stays. Every lookup by id scans the table there.
    lab.sql(
        Host::Test,
        &format!("ALTER TABLE {db}.sbtest3 MODIFY id INT NOT NULL, DROP PRIMARY KEY"),
    )?;
    println!(
        "{}",
        lab.sql(Host::Test, &format!("SHOW CREATE TABLE {db}.sbtest3"))?
    );
    let a = mirrored_run(&lab, "nopk", secs)?;
    print_digests(&a.report);
    println!("{}", a.copier);
    lab.sql(
        Host::Test,
        &format!(
            "ALTER TABLE {db}.sbtest3 ADD PRIMARY KEY (id), MODIFY id INT NOT NULL AUTO_INCREMENT"
        ),
    )?;

    // B: 100 rows of sbtest4 gone (every 200th id, so ranges of 100 often miss one), and the
    // account may no longer read sbtest2 (its schema-wide grant becomes per-table grants).
    lab.sql(
        Host::Test,
        &format!("DELETE FROM {db}.sbtest4 WHERE id % 200 = 0"),
    )?;
    lab.sql(
        Host::Test,
        &format!(
            "REVOKE ALL PRIVILEGES ON {db}.* FROM '{user}'@'%'; \
             GRANT ALL PRIVILEGES ON {db}.sbtest1 TO '{user}'@'%'; \
             GRANT ALL PRIVILEGES ON {db}.sbtest3 TO '{user}'@'%'; \
             GRANT ALL PRIVILEGES ON {db}.sbtest4 TO '{user}'@'%'; \
             GRANT INSERT, UPDATE, DELETE ON {db}.sbtest2 TO '{user}'@'%'"
        ),
    )?;
    println!(
        "{}",
        lab.sql(Host::Test, &format!("SHOW GRANTS FOR '{user}'@'%'"))?
    );
    let b = mirrored_run(&lab, "rows-grants", secs)?;
    print_digests(&b.report);
    println!("{}", b.copier);
    Ok(())
}
