//! Acceptance of `--tee` and the A/B comparison (issue 22), in a lab with a second test server
//! (`LAB_TEST2=1`) and a node_exporter on each test host:
//!
//! 1. `--tee` to test and test2, sysbench `oltp_read_only` 8 threads, real auth: each test
//!    server executes what production did (work fidelity >= 0.999 on each, no new statement
//!    errors), and the report has each target's side and both hosts' resources.
//! 2. A/A: the A/B load (`deploy/lab/ab.lua`, five prepared statements over a table of
//!    TIMESTAMP columns, rate-limited so neither server is saturated) onto the two identical
//!    servers: no digest is flagged. Its report.json is the calibration of the next run.
//! 3. A/B: the same load after `idx_customer` is dropped on test2, with `--ab-calibration`:
//!    exactly the digest that uses the index is flagged (slower on B), no other.
//!
//! Load seconds: `TCPSHADOW_LOAD_SECS` (default 10 for phase 1, four times that for 2 and 3:
//! the customer lookup is 5 % of the load, and 400 of it (20 s) left its A/A interval, the
//! calibration's band, too wide to tell a 1.7x slowdown from noise in one CI run of many).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use copier::report::{read_report, Report};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{Comparison, Work, WorkSnapshot};
use tcpshadow_tests::{ab_load_script, Host, Lab, Load};

/// sysbench events per second of the A/B load: the scans of a missing index stay a few per
/// cent of the machine, so the other statements on test2 are not slowed with it.
const AB_RATE: &str = "--rate=400";

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// A copier with `--tee` to test and test2 (pool, credentials, both hosts' node_exporters),
/// writing its report to `dir`.
fn tee_mirror(lab: &Lab, dir: &Path, metrics: &[String], extra: &[&str]) -> Result<Mirror> {
    let mut copier_args: Vec<String> = vec![
        "--tee".into(),
        "--target".into(),
        format!("{}:3306", lab.ip(Host::Test2)),
        "--mysql-credentials".into(),
        lab.credentials_file()?,
        "--mysql-default-user".into(),
        lab.var("LAB_USER").into(),
        "--report".into(),
        dir.to_string_lossy().into_owned(),
    ];
    for m in metrics {
        copier_args.extend(["--target-metrics".into(), format!("http://{m}/metrics")]);
    }
    copier_args.extend(extra.iter().map(|s| s.to_string()));
    let opts = MirrorOptions {
        client_ip_pool: Some(lab.var("LAB_POOL").into()),
        copier_args,
        ..Default::default()
    };
    Mirror::start(lab, &opts)
}

/// What `host` ran since `before`, once it has caught up with `due` (at most 30 s).
fn drained(lab: &Lab, host: Host, before: &WorkSnapshot, due: &Work) -> Result<Work> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let work = Work::between(before, &lab.work(host)?)?;
        if work.caught_up(due, 1.0) || Instant::now() >= deadline {
            return Ok(work);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Runs `load` under a `--tee` mirror; the report it wrote and the copier's output.
fn mirrored(
    lab: &Lab,
    dir: &Path,
    metrics: &[String],
    extra: &[&str],
    load: &Load,
) -> Result<(Report, String)> {
    let mirror = tee_mirror(lab, dir, metrics, extra)?;
    let (p0, t0, u0) = (
        lab.work(Host::Prod)?,
        lab.work(Host::Test)?,
        lab.work(Host::Test2)?,
    );
    let out = lab.load(load)?;
    ensure!(out.errors == 0, "sysbench errors:\n{}", out.output);
    let prod = Work::between(&p0, &lab.work(Host::Prod)?)?;
    drained(lab, Host::Test, &t0, &prod)?;
    drained(lab, Host::Test2, &u0, &prod)?;
    let (copier, _intercept) = mirror.stop()?;
    let report = read_report(&dir.join("report.json")).context("the copier's report.json")?;
    Ok((report, copier.stderr))
}

fn flagged(r: &Report) -> Result<Vec<(String, String)>> {
    let ab = r.ab.as_ref().context("the report has no A/B comparison")?;
    Ok(ab
        .digests
        .iter()
        .filter(|d| d.flagged())
        .map(|d| (d.verdict.clone(), d.fingerprint.clone()))
        .collect())
}

fn ab_text(r: &Report) -> String {
    let mut out = String::new();
    if let Some(ab) = &r.ab {
        copier::report::text::ab_section(&mut out, ab, None);
    }
    out
}

#[test]
fn tee_mirrors_to_both_test_servers_and_the_ab_report_flags_only_what_differs() -> Result<()> {
    let lab = Lab::up_with("abtee", &[("LAB_TEST2", "1")])?;
    lab.ab_schema(&[Host::Prod, Host::Test, Host::Test2])?;
    let metrics = vec![
        lab.node_exporter(Host::Test)?,
        lab.node_exporter(Host::Test2)?,
    ];
    let tmp = std::env::temp_dir().join(format!("tcpshadow-ab-{}", lab.name()));
    let _ = std::fs::remove_dir_all(&tmp);
    let secs = load_secs();

    // --- 1: fidelity on each target.
    let mirror = tee_mirror(&lab, &tmp.join("tee"), &metrics, &[])?;
    let (p0, t0, u0) = (
        lab.work(Host::Prod)?,
        lab.work(Host::Test)?,
        lab.work(Host::Test2)?,
    );
    let load = Load {
        test: "oltp_read_only".into(),
        threads: 8,
        time_secs: secs,
        target: Host::Prod,
        extra: vec![],
    };
    let out = lab.load(&load)?;
    ensure!(out.errors == 0, "sysbench errors:\n{}", out.output);
    let prod = Work::between(&p0, &lab.work(Host::Prod)?)?;
    let on_test = drained(&lab, Host::Test, &t0, &prod)?;
    let on_test2 = drained(&lab, Host::Test2, &u0, &prod)?;
    let (copier, intercept) = mirror.stop()?;
    let (a, b) = (
        Comparison::new(prod.clone(), on_test),
        Comparison::new(prod, on_test2),
    );
    println!("--tee, oltp_read_only 8 threads {secs} s\ntest:\n{a}\ntest2:\n{b}");
    for (name, c) in [("test", &a), ("test2", &b)] {
        c.check(0.999, 1.001).with_context(|| {
            format!(
                "{name}\n--- copier:\n{}\n--- intercept:\n{}",
                copier.stderr, intercept.stderr
            )
        })?;
    }
    ensure!(
        copier.stderr.contains("losses: none"),
        "the copier counted losses:\n{}",
        copier.stderr
    );
    let tee = read_report(&tmp.join("tee/report.json"))?;
    ensure!(
        tee.tee_targets.len() == 2 && tee.digests.iter().all(|d| d.per_target.len() == 2),
        "each digest should have both targets' sides: {:?}",
        tee.tee_targets
    );
    ensure!(
        tee.resources.len() == 2 && tee.resources.iter().all(|r| !r.points.is_empty()),
        "both test hosts' resources should be in the report"
    );

    // --- 2: A/A, two identical servers.
    let ab_load = Load {
        test: ab_load_script(),
        threads: 8,
        time_secs: 4 * secs,
        target: Host::Prod,
        extra: vec![AB_RATE.into()],
    };
    let (aa, _) = mirrored(&lab, &tmp.join("aa"), &metrics, &[], &ab_load)?;
    println!("A/A:\n{}", ab_text(&aa));
    ensure!(
        flagged(&aa)?.is_empty(),
        "A/A flagged digests on identical servers: {:?}\n{}",
        flagged(&aa)?,
        ab_text(&aa)
    );

    // --- 3: A/B, test2 without idx_customer, judged against the A/A noise.
    lab.sql(
        Host::Test2,
        "ALTER TABLE sbtest.tsd_orders DROP INDEX idx_customer",
    )?;
    let calibration = tmp.join("aa/report.json");
    let calibration = calibration.to_string_lossy();
    let (ab, _) = mirrored(
        &lab,
        &tmp.join("ab"),
        &metrics,
        &["--ab-calibration", &calibration],
        &ab_load,
    )?;
    println!("A/B, idx_customer dropped on test2:\n{}", ab_text(&ab));
    let got = flagged(&ab)?;
    ensure!(
        got.len() == 1 && got[0].0 == "slower" && got[0].1.contains("where customer_id = ?"),
        "expected exactly the customer_id lookup flagged slower, got {got:?}\n{}",
        ab_text(&ab)
    );
    let _ = std::fs::remove_dir_all(&tmp);
    lab.down()
}
