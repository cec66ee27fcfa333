//! Acceptance of on-test-host mode (issue 7): intercept runs on the test server itself, takes
//! the replies to mirrored clients with its own nftables rule and NFQUEUE, and the mirror is as
//! faithful as with an assist host; the rule survives SIGKILL (replies keep being dropped),
//! is replaced by the next start, and is gone after a normal stop or `intercept --cleanup`.
//!
//! No assist: its interface is down, and the test host routes the client pool via the
//! *client* host instead, so any reply that escaped the rule would land on the client, where
//! tcpdump watches for it. The test server keeps its normal grants (the copier logs in with
//! the lab account). `TCPSHADOW_LOAD_SECS` sets the sysbench run (default 10 s; the figures in
//! docs come from 30 s).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, Mirror, MirrorOptions, CONTROL_PORT};
use tcpshadow_tests::work::OwnStatements;
use tcpshadow_tests::{Background, Host, Lab, Load};

const TABLE: &str = "tcpshadow_intercept";

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// `nft list ruleset` of the test host.
fn ruleset(lab: &Lab) -> Result<String> {
    lab.exec_ok(Host::Test, &["nft", "list", "ruleset"])
}

/// How many of our queue rules the test host has (0 when our table is absent).
fn our_rules(lab: &Lab) -> Result<usize> {
    let text = ruleset(lab)?;
    ensure!(
        text.matches(&format!("table ip {TABLE} ")).count() <= 1,
        "{text}"
    );
    Ok(text
        .lines()
        .filter(|l| l.contains("queue num") && l.contains("tcpshadow"))
        .count())
}

fn intercept_args(lab: &Lab) -> Vec<String> {
    vec![
        "--port".into(),
        lab.var("LAB_MYSQL_PORT").into(),
        "--listen".into(),
        format!("{}:{CONTROL_PORT}", lab.ip(Host::Test)),
        "--on-test-host".into(),
        "--client-ip-pool".into(),
        lab.var("LAB_POOL").into(),
        "--status-interval".into(),
        "1".into(),
    ]
}

fn spawn_intercept(lab: &Lab) -> Result<Background> {
    let bin = release_bin("intercept")?;
    let mut args = vec![bin.to_str().context("path")?.to_string()];
    args.extend(intercept_args(lab));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut intercept = lab.spawn(Host::Test, &args)?;
    intercept.wait_for_output("waiting for copiers", Duration::from_secs(30))?;
    Ok(intercept)
}

/// SIGKILL, as a crash or the OOM killer would; the pid is intercept's own (`lab.sh exec`
/// and `ip netns exec` exec it).
fn sigkill(lab: &Lab, process: Background) -> Result<()> {
    let pid = process.pid().context("no pid")?.to_string();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    ensure!(
        comm.trim() == "intercept",
        "pid {pid} is {comm:?}, not intercept"
    );
    lab.exec_ok(Host::Test, &["kill", "-KILL", &pid])?;
    let run = process.finish(Duration::from_secs(10))?;
    ensure!(!run.success(), "intercept survived SIGKILL: {run:?}");
    Ok(())
}

/// The `key=value` counter of the last status line that has it.
fn last_status_value(output: &str, key: &str) -> Option<u64> {
    output.lines().rev().find_map(|l| {
        let at = l.find(&format!(" {key}="))?;
        l[at + key.len() + 2..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn on_test_host_mode_mirrors_faithfully_and_leaves_no_rule_behind() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("oh")?;
    let iface = lab.var("LAB_IFACE").to_string();
    let pool = lab.var("LAB_POOL").to_string();
    let client_ip = lab.ip(Host::Client).to_string();
    let test_ip = lab.ip(Host::Test).to_string();
    let intercept_bin = release_bin("intercept")?;
    let intercept_bin = intercept_bin.to_str().context("path")?;

    // Without a pool the mode refuses: real clients' replies must never be taken.
    let refused = lab.exec(
        Host::Test,
        &[intercept_bin, "--port", "3306", "--on-test-host"],
    )?;
    ensure!(
        !refused.success() && refused.stderr.contains("--client-ip-pool"),
        "intercept --on-test-host without a pool: {refused:?}"
    );
    ensure!(our_rules(&lab)? == 0, "a refused start left a rule");

    // No assist host: down, and the pool routed toward the client instead.
    lab.exec_ok(Host::Assist, &["ip", "link", "set", &iface, "down"])?;
    lab.exec_ok(
        Host::Test,
        &[
            "ip", "route", "replace", &pool, "via", &client_ip, "dev", &iface,
        ],
    )?;
    // A firewall as on many cloud hosts (firewalld, ufw): conntrack on, INVALID dropped. The
    // copier's packets are only valid for conntrack if it also sees the server's replies, so
    // our rule must sit after conntrack.
    lab.exec_ok(
        Host::Test,
        &[
            "nft",
            "add table inet fw; add chain inet fw input { type filter hook input priority 0; } ; \
             add rule inet fw input ct state invalid counter drop",
        ],
    )?;
    let routes_before = lab.exec_ok(Host::Test, &["ip", "-o", "route", "show"])?;
    let links_before = lab.exec_ok(Host::Test, &["ip", "-o", "link", "show"])?;
    let filter = format!("ip and src host {test_ip}");
    let mut client_capture = lab.spawn(
        Host::Client,
        &["tcpdump", "-i", &iface, "-n", "-l", &filter],
    )?;
    client_capture.wait_for_output("listening on", Duration::from_secs(30))?;

    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        client_ip_pool: Some(pool.clone()),
        copier_args: vec!["--mysql-credentials".into(), creds],
        intercept_args: vec![
            "--on-test-host".into(),
            "--client-ip-pool".into(),
            pool.clone(),
        ],
        ..MirrorOptions::default()
    };
    let mut mirror = Mirror::start_with_intercept_on(&lab, &opts, Host::Test)?;
    ensure!(
        our_rules(&lab)? == 1,
        "expected one queue rule:\n{}",
        ruleset(&lab)?
    );

    let secs = load_secs();
    let load = Load {
        threads: 8,
        time_secs: secs,
        ..Load::default()
    };
    // The copier logs every session in itself: no statement of its own.
    let (window, _) = lab.mirrored_load(&load)?;
    let prod = window
        .whole(&OwnStatements::default())?
        .prod
        .get("Questions");
    let figures = window.check(&OwnStatements::default());
    let figures = tcpshadow_tests::work::shown(
        format!("on-test-host: oltp_read_only 8 threads {secs} s"),
        figures,
    );
    figures?;
    // One more status line: intercept read the replies from its queue, and the kernel
    // dropped none of them for lack of room.
    let lines = mirror.intercept.count("captured=");
    mirror
        .intercept
        .wait_for_count("captured=", lines + 1, Duration::from_secs(30))?;
    let (_, status) = mirror.intercept.output();
    let captured = last_status_value(&status, "captured").unwrap_or(0);
    let kernel_dropped = last_status_value(&status, "kernel_dropped");
    println!("intercept: captured={captured} kernel_dropped={kernel_dropped:?}");
    ensure!(captured > prod, "intercept read only {captured} replies");
    ensure!(
        kernel_dropped == Some(0),
        "the queue dropped replies: {status}"
    );

    // SIGKILL: the rule stays (expected: without a reader the kernel drops the replies).
    let Mirror {
        intercept,
        mut copier,
    } = mirror;
    // Counted before the restart: the copier may be back before the checks below are done.
    let ups = copier.count("control channel to intercept is up");
    sigkill(&lab, intercept)?;
    ensure!(
        our_rules(&lab)? == 1,
        "after SIGKILL the rule should stay (fail closed):\n{}",
        ruleset(&lab)?
    );

    // Restart: the stale table is replaced, not doubled, and the copier (which reconnects)
    // is served again.
    let restarted = spawn_intercept(&lab)?;
    let (_, log) = restarted.output();
    ensure!(
        log.contains("removed a stale nftables table"),
        "restart did not report the stale table:\n{log}"
    );
    ensure!(
        our_rules(&lab)? == 1,
        "after restart: expected exactly one rule:\n{}",
        ruleset(&lab)?
    );
    // The copier reconnects (once a second at most); then a short load.
    copier.wait_for_count(
        "control channel to intercept is up",
        ups + 1,
        Duration::from_secs(30),
    )?;
    let figures = lab
        .mirrored_load(&Load {
            threads: 8,
            time_secs: 5,
            ..Load::default()
        })?
        .0
        .check(&OwnStatements::default());
    let figures = tcpshadow_tests::work::shown("after restart", figures);
    figures.context("after restart")?;

    // SIGTERM: everything of ours is gone; routes and links are as before.
    let copier = copier.stop()?;
    println!("{}", copier.stderr);
    let intercept = restarted.stop()?;
    ensure!(intercept.success(), "intercept failed: {intercept:?}");
    ensure!(
        intercept
            .stderr
            .contains(&format!("removed nftables table ip {TABLE}")),
        "{}",
        intercept.stderr
    );
    let after = ruleset(&lab)?;
    ensure!(
        !after.contains("tcpshadow") && !after.contains("queue"),
        "rules left after SIGTERM:\n{after}"
    );
    ensure!(
        lab.exec_ok(Host::Test, &["ip", "-o", "route", "show"])? == routes_before,
        "routes changed"
    );
    ensure!(
        lab.exec_ok(Host::Test, &["ip", "-o", "link", "show"])? == links_before,
        "links changed"
    );

    // `intercept --cleanup` removes what a killed one left, and is a no-op otherwise.
    let killed = spawn_intercept(&lab)?;
    sigkill(&lab, killed)?;
    ensure!(our_rules(&lab)? == 1, "{}", ruleset(&lab)?);
    let cleanup = lab.exec(Host::Test, &[intercept_bin, "--cleanup"])?;
    ensure!(
        cleanup.success() && cleanup.stderr.contains("removed nftables table"),
        "{cleanup:?}"
    );
    let again = lab.exec(Host::Test, &[intercept_bin, "--cleanup"])?;
    ensure!(
        again.success() && again.stderr.contains("nothing to remove"),
        "{again:?}"
    );
    let after = ruleset(&lab)?;
    ensure!(
        !after.contains("tcpshadow"),
        "left after --cleanup:\n{after}"
    );
    // The host's own firewall is untouched, and it never saw an invalid packet.
    ensure!(
        after.contains("table inet fw") && after.contains("ct state invalid counter packets 0 "),
        "the test host's firewall changed or dropped invalid packets:\n{after}"
    );

    // Not one packet from the test server reached the client host.
    let capture = client_capture.stop()?;
    let seen = capture
        .stderr
        .lines()
        .find(|l| l.contains("packets captured"))
        .unwrap_or("")
        .to_string();
    ensure!(
        seen.starts_with("0 packets captured") && !capture.stdout.contains(&test_ip),
        "the client host saw packets from the test server: {seen}\n{}",
        capture.stdout
    );
    Ok(())
}
