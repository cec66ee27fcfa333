//! Scale-out and multi-core (issue 9): several copiers sharing one intercept, and one copier
//! (and intercept) with `--workers 2`, in a lab with a second production host (`LAB_PROD2=1`).
//!
//! One lab, two phases, each a 10 s sysbench `oltp_read_only` load (`TCPSHADOW_LOAD_SECS`),
//! rate-limited (`TCPSHADOW_SCALE_RATE` transactions/s per production host, default 100) so
//! that the one test server, sharing two cores with both production servers, keeps pace with
//! their sum:
//!
//! 1. A copier on prod and one on prod2, each with its own half of the lab's client pool,
//!    share one intercept and one test server; sysbench 8 threads on both prod hosts at once.
//!    The test server executes prod's + prod2's queries (fidelity >= 0.999), and no copier
//!    got feedback for the other's sessions beyond what intercept broadcast because nobody
//!    had claimed it yet.
//! 2. One copier with `--workers 2` on prod (capturing on `any`), intercept with `--workers 2`,
//!    sysbench 16 threads
//!    (twice the rate): fidelity >= 0.999,
//!    both workers mirrored sessions, no connection was seen by both workers.
//! 3. One copier on prod with two targets, test and prod2 (which routes the client pool via
//!    assist, so it can stand in for a second test server), both relayed by the one intercept;
//!    sysbench 16 threads: test + prod2 execute prod's queries (fidelity >= 0.999), each target
//!    got some of the connections.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, start_intercept, CONTROL_PORT};
use tcpshadow_tests::work::{Comparison, Work, WorkSnapshot};
use tcpshadow_tests::{Background, Host, Lab, Load, LoadReport};

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The number right after `key=` in `text` (last occurrence).
fn number_after(text: &str, key: &str) -> Option<u64> {
    let at = text.rfind(key)? + key.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A copier on `host` capturing on `iface` (the lab's interface if `None`).
fn start_copier(
    lab: &Lab,
    host: Host,
    pool: &str,
    iface: Option<&str>,
    extra: &[&str],
) -> Result<Background> {
    let bin = release_bin("copier")?;
    let creds = lab.credentials_file()?;
    let target = format!("{}:3306", lab.ip(Host::Test));
    let intercept = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    let mut args = vec![
        bin.to_str().context("path")?,
        "--port",
        "3306",
        "--interface",
        iface.unwrap_or(lab.var("LAB_IFACE")),
        "--target",
        &target,
        "--intercept",
        &intercept,
        "--client-ip-pool",
        pool,
        "--mysql-credentials",
        &creds,
        "--status-interval",
        "5",
    ];
    args.extend(extra);
    let mut copier = lab.spawn(host, &args)?;
    copier.wait_for_output(
        "control channel to intercept is up",
        Duration::from_secs(30),
    )?;
    Ok(copier)
}

fn load(lab: &Lab, target: Host, threads: u32, secs: u32, rate: u32) -> Result<LoadReport> {
    let report = lab.load(&Load {
        threads,
        time_secs: secs,
        target,
        extra: vec![format!("--rate={rate}")],
        ..Load::default()
    })?;
    ensure!(
        report.errors == 0,
        "sysbench on {target} reported errors:\n{}",
        report.output
    );
    Ok(report)
}

/// The summed work of `hosts` since their snapshots, once it has caught up with `due` (at most
/// 30 s).
fn drained(lab: &Lab, hosts: &[(Host, &WorkSnapshot)], due: &Work) -> Result<Work> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut sum = Work::default();
        for (h, before) in hosts {
            sum = sum.plus(&Work::between(before, &lab.work(*h)?)?);
        }
        if sum.caught_up(due, 1.0) || Instant::now() >= deadline {
            return Ok(sum);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The lab's client pool (a /24) cut in two /25 halves, one per copier.
fn pool_halves(lab: &Lab) -> (String, String) {
    let pool = lab.var("LAB_POOL");
    let base = pool.trim_end_matches(".0/24");
    (format!("{base}.0/25"), format!("{base}.128/25"))
}

#[test]
fn copiers_share_an_intercept_workers_split_flows_targets_split_connections() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up_with("sc", &[("LAB_PROD2", "1")])?;
    let secs = env_u32("TCPSHADOW_LOAD_SECS", 10);
    let rate = env_u32("TCPSHADOW_SCALE_RATE", 100);
    let (pool_a, pool_b) = pool_halves(&lab);

    // --- Phase 1: two copiers (prod, prod2), one intercept, one test server.
    let intercept = start_intercept(&lab, &[])?;
    let copier_a = start_copier(&lab, Host::Prod, &pool_a, None, &[])?;
    let copier_b = start_copier(&lab, Host::Prod2, &pool_b, None, &[])?;
    let (p0, q0, t0) = (
        lab.work(Host::Prod)?,
        lab.work(Host::Prod2)?,
        lab.work(Host::Test)?,
    );
    let (ra, rb) = std::thread::scope(|s| {
        let a = s.spawn(|| load(&lab, Host::Prod, 8, secs, rate));
        let b = s.spawn(|| load(&lab, Host::Prod2, 8, secs, rate));
        (a.join(), b.join())
    });
    ra.map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    rb.map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    let prods = Work::between(&p0, &lab.work(Host::Prod)?)?
        .plus(&Work::between(&q0, &lab.work(Host::Prod2)?)?);
    let test = drained(&lab, &[(Host::Test, &t0)], &prods)?;
    let phase1 = Comparison::new(prods, test);
    let a = copier_a.finish(Duration::ZERO)?;
    let b = copier_b.finish(Duration::ZERO)?;
    let i = intercept.finish(Duration::ZERO)?;
    let foreign_a = number_after(&a.stderr, "feedback_foreign=").unwrap_or(0);
    let foreign_b = number_after(&b.stderr, "feedback_foreign=").unwrap_or(0);
    let last = i
        .stderr
        .lines()
        .rfind(|l| l.contains("final: "))
        .context("no final status line from intercept")?;
    let unclaimed = number_after(last, "unclaimed_broadcast=").unwrap_or(0);
    let copiers = number_after(last, "control: accepted=").unwrap_or(0);
    println!(
        "two copiers, one intercept, oltp_read_only 8 threads x2 {secs} s at {rate} tx/s each, \
         prod and prod2 against test: feedback for the other copier's sessions: {foreign_a} at \
         prod, {foreign_b} at prod2; intercept broadcast {unclaimed} unclaimed replies, \
         accepted {copiers} copiers\n{phase1}"
    );
    phase1.check(0.999, 1.001).with_context(|| {
        format!(
            "--- copier prod:\n{}\n--- copier prod2:\n{}\n--- intercept:\n{}",
            a.stderr, b.stderr, i.stderr
        )
    })?;
    // Each unclaimed reply is broadcast to both copiers: one of them is its owner, the other
    // counts it as foreign. Anything more was delivered to the wrong copier.
    let cross_delivered = (foreign_a + foreign_b).saturating_sub(unclaimed);
    ensure!(
        cross_delivered == 0,
        "{cross_delivered} feedback items reached the wrong copier (foreign {foreign_a} + \
         {foreign_b}, broadcast {unclaimed})"
    );

    // --- Phase 2: one copier and one intercept with two capture workers each.
    let intercept = start_intercept(&lab, &["--workers", "2"])?;
    let pool = lab.var("LAB_POOL").to_string();
    // On `any`: libpcap's all-interfaces socket must join the fan-out group too.
    let copier = start_copier(&lab, Host::Prod, &pool, Some("any"), &["--workers", "2"])?;
    let (p0, t0) = (lab.work(Host::Prod)?, lab.work(Host::Test)?);
    // 16 connections: the chance that the flow hash puts them all on one worker is 2^-15.
    load(&lab, Host::Prod, 16, secs, rate * 2)?;
    let prod = Work::between(&p0, &lab.work(Host::Prod)?)?;
    let test = drained(&lab, &[(Host::Test, &t0)], &prod)?;
    let phase2 = Comparison::new(prod, test);
    let c = copier.finish(Duration::ZERO)?;
    let i = intercept.finish(Duration::ZERO)?;
    let opened = |w: usize| {
        c.stderr
            .lines()
            .find(|l| l.contains(&format!("worker {w}: sessions opened=")))
            .and_then(|l| number_after(l, "sessions opened="))
            .unwrap_or(0)
    };
    let (w0, w1) = (opened(0), opened(1));
    let shared = c
        .stderr
        .lines()
        .find(|l| l.contains("connections seen by two workers"))
        .and_then(|l| {
            let at = l.find("workers: ")? + "workers: ".len();
            l[at..].split_whitespace().next()?.parse::<u64>().ok()
        });
    let framed = |w: usize| {
        i.stderr
            .lines()
            .find(|l| l.contains(&format!("worker {w}: captured=")))
            .and_then(|l| number_after(l, "mysql_sessions_framed="))
            .unwrap_or(0)
    };
    let (i0, i1) = (framed(0), framed(1));
    println!(
        "--workers 2 on copier and intercept, oltp_read_only 16 threads {secs} s at {} tx/s: \
         copier sessions per worker {w0} / {w1}, connections seen by both workers {shared:?}; \
         intercept sessions framed per worker {i0} / {i1}\n{phase2}",
        rate * 2
    );
    phase2
        .check(0.999, 1.001)
        .with_context(|| format!("--- copier:\n{}\n--- intercept:\n{}", c.stderr, i.stderr))?;
    ensure!(
        w0 > 0 && w1 > 0,
        "sessions were not split over both copier workers: {w0} / {w1}\n{}",
        c.stderr
    );
    ensure!(
        shared == Some(0),
        "connections seen by two workers: {shared:?}\n{}",
        c.stderr
    );
    ensure!(
        i0 + i1 >= w0 + w1 && i0 > 0 && i1 > 0,
        "intercept's workers framed {i0} / {i1} sessions for {} mirrored\n{}",
        w0 + w1,
        i.stderr
    );

    // --- Phase 3: one copier, two targets (test and prod2), placed by client hash.
    let intercept = start_intercept(&lab, &[])?;
    let second = format!("{}:3306", lab.ip(Host::Prod2));
    let copier = start_copier(&lab, Host::Prod, &pool, None, &["--target", &second])?;
    let (p0, q0, t0) = (
        lab.work(Host::Prod)?,
        lab.work(Host::Prod2)?,
        lab.work(Host::Test)?,
    );
    load(&lab, Host::Prod, 16, secs, rate * 2)?;
    let prod = Work::between(&p0, &lab.work(Host::Prod)?)?;
    let targets = drained(&lab, &[(Host::Test, &t0), (Host::Prod2, &q0)], &prod)?;
    let (on_test, on_prod2) = (
        Work::between(&t0, &lab.work(Host::Test)?)?,
        Work::between(&q0, &lab.work(Host::Prod2)?)?,
    );
    let phase3 = Comparison::new(prod, targets);
    let c = copier.finish(Duration::ZERO)?;
    let i = intercept.finish(Duration::ZERO)?;
    println!(
        "--target twice (test, prod2), one intercept, oltp_read_only 16 threads {secs} s at {} \
         tx/s: executes on test {}, on prod2 {}; prod against both:\n{phase3}",
        rate * 2,
        on_test.get("Com_stmt_execute"),
        on_prod2.get("Com_stmt_execute"),
    );
    phase3
        .check(0.999, 1.001)
        .with_context(|| format!("--- copier:\n{}\n--- intercept:\n{}", c.stderr, i.stderr))?;
    ensure!(
        on_test.get("Com_stmt_execute") > 0 && on_prod2.get("Com_stmt_execute") > 0,
        "the connections were not spread: test {:?}, prod2 {:?}",
        on_test.kinds,
        on_prod2.kinds
    );
    lab.down()
}
