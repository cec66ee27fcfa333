//! Issue 17's acceptance for losses the copier can only learn from the test server's answers:
//! a test server that rejects some commands. Its summary and `--metrics` must count exactly the
//! commands that failed there, by kind and error code, and nothing else; the lab's comparison
//! of executed work (tests/src/work.rs) sees the same errors on the test server.
//!
//! * At execution: a trigger on the test server alone makes every update of an sbtest1 row whose
//!   id is a multiple of 10 fail (it sets a NOT NULL column to NULL: error 1048), under
//!   `oltp_read_write`.
//! * At prepare: the test server's account may not read sbtest2, so its prepares fail (1142)
//!   and their executes cannot run there (counted with the same code), under `oltp_read_only`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{OwnStatements, Window};
use tcpshadow_tests::{wait_settled, Host, Lab, Load};

const METRICS: &str = "127.0.0.1:9561";

/// The copier's `losses:` lines (`N  what`), what by count.
fn losses(summary: &str) -> BTreeMap<String, u64> {
    summary
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("losses:"))
        .skip(1)
        .filter_map(|l| {
            let (n, what) = l.trim().split_once("  ")?;
            Some((what.trim().to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// `tcpshadow_copier_commands_lost_total` samples: "command kind reason code" -> value.
fn lost_metrics(lab: &Lab) -> Result<BTreeMap<String, u64>> {
    Ok(lab
        .scrape(Host::Prod, METRICS)?
        .iter()
        .filter(|s| s.name == "tcpshadow_copier_commands_lost_total")
        .map(|s| {
            let label = |k: &str| {
                s.labels
                    .iter()
                    .find(|(n, _)| n == k)
                    .map_or("", |(_, v)| v.as_str())
                    .to_string()
            };
            (
                format!(
                    "{} {} {} {}",
                    label("command"),
                    label("kind"),
                    label("reason"),
                    label("code")
                ),
                s.value as u64,
            )
        })
        .collect())
}

/// One mirrored load with `--metrics`: the window, the copier's summary and its lost-command
/// metrics scraped just before it stopped.
fn run(lab: &Lab, load: &Load) -> Result<(Window, String, BTreeMap<String, u64>)> {
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            lab.credentials_file()?,
            "--metrics".into(),
            METRICS.into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(lab, &opts)?;
    let (window, _) = lab.mirrored_load(load)?;
    // The copier republishes its metrics every second: read until two scrapes a publish
    // apart agree, so the last count of the run is in.
    let metrics = wait_settled(
        "the copier's loss metrics to hold still for a publish",
        Duration::from_millis(1200),
        Duration::from_secs(30),
        || lost_metrics(lab),
    )?;
    let (copier, _) = mirror.stop()?;
    Ok((window, copier.stderr, metrics))
}

#[test]
fn commands_the_test_server_rejects_are_counted_exactly() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("loss")?;
    let secs = 10;
    let db = lab.var("LAB_DB");

    // --- At execution.
    lab.sql(
        Host::Test,
        &format!(
            "CREATE TRIGGER {db}.tsd_reject BEFORE UPDATE ON {db}.sbtest1 FOR EACH ROW \
             SET NEW.c = IF(NEW.id % 10 = 0, NULL, NEW.c)"
        ),
    )?;
    let (window, summary, metrics) = run(
        &lab,
        &Load {
            test: "oltp_read_write".into(),
            // Few connections: writes racing differently on the test server (a deadlock there
            // only) would add errors this test does not expect.
            threads: 4,
            time_secs: secs,
            ..Load::default()
        },
    )?;
    lab.sql(Host::Test, &format!("DROP TRIGGER {db}.tsd_reject"))?;
    // Every login is seen: the copier runs no statement of its own.
    let whole = window.whole(&OwnStatements::default())?;
    println!("{summary}\nrejected at execution (trigger on test):\n{whole}\nmetrics: {metrics:?}");
    let lost = losses(&summary);
    let rejected = lost
        .get("commands: stmt_execute update: error 1048 on the test server only")
        .copied()
        .unwrap_or(0);
    ensure!(rejected > 0, "no rejected update counted:\n{summary}");
    ensure!(
        lost.len() == 1,
        "the summary lists losses other than the rejected updates: {lost:?}"
    );
    ensure!(
        metrics == BTreeMap::from([("stmt_execute update test_error 1048".to_string(), rejected)]),
        "metrics {metrics:?}, summary {rejected}"
    );
    // The test server ran (and failed) the very commands the copier counted, and nothing else
    // failed there.
    let new = whole.new_errors();
    ensure!(
        new.get("statement/com/Execute").copied() == Some(rejected),
        "the test server's own count of failed updates {new:?}, the copier's {rejected}"
    );
    ensure!(
        new.len() == 1,
        "other errors on test than the rejected updates: {new:?}\n{whole}"
    );
    whole
        .check_errors(0.999, 1.001, &new)
        .context("the rejected updates still ran there")?;

    // --- At prepare.
    lab.deny_select_on_test("sbtest2")?;
    let (window, summary, metrics) = run(
        &lab,
        &Load {
            threads: 8,
            time_secs: secs,
            ..Load::default()
        },
    )?;
    let whole = window.whole(&OwnStatements::default())?;
    println!("{summary}\nrejected at prepare (no SELECT on sbtest2 on test):\n{whole}\nmetrics: {metrics:?}");
    let lost = losses(&summary);
    let get = |what: &str| lost.get(what).copied().unwrap_or(0);
    let prepares = get("commands: stmt_prepare select: error 1142 on the test server only");
    let executes = get("commands: stmt_execute select: error 1142 on the test server only");
    // sysbench prepares five statements per table on each of its 8 connections.
    ensure!(
        prepares == 8 * 5 && executes > 0 && lost.len() == 2,
        "losses {lost:?}\n{summary}"
    );
    ensure!(
        metrics
            == BTreeMap::from([
                ("stmt_prepare select test_error 1142".to_string(), prepares),
                ("stmt_execute select test_error 1142".to_string(), executes),
            ]),
        "metrics {metrics:?}"
    );
    // The executes were never sent (their statement does not exist there): production ran
    // exactly that many more, and the test server failed only the prepares.
    let (p, t) = (
        whole.prod.get("Com_stmt_execute"),
        whole.test.get("Com_stmt_execute"),
    );
    ensure!(
        t + executes == p,
        "executes: prod {p}, test {t}, counted as not run there {executes}\n{whole}"
    );
    ensure!(
        whole.new_errors() == BTreeMap::from([("statement/com/Prepare".to_string(), prepares)]),
        "the test server's errors:\n{whole}"
    );
    Ok(())
}
