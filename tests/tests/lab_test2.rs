//! The lab's A/B set-up (issue 22, "A/B experiments: two test servers, their hosts' CPU"): a
//! second test host test2 (`LAB_TEST2=1`) with the same data as test, routed as test is, each
//! server with options and a preload of its own, and a node_exporter per host.
//!
//! Needs root (network namespaces), Debian's prometheus-node-exporter and libjemalloc2
//! (scripts/install-deps.sh).

use std::fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::{netns_list, Host, Lab};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

fn pid_in(file: &str) -> Result<u32> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    Ok(text.trim().parse()?)
}

/// `select count(*)` of the first sysbench table, over TCP from `from` to `to`'s server.
fn count_rows(lab: &Lab, from: Host, to: Host) -> Result<String> {
    let sql = "select count(*) from sbtest.sbtest1";
    Ok(lab.client_sql(from, to, sql)?.trim().to_string())
}

/// The session a process leads or belongs to (field 6 of /proc/PID/stat).
fn session_of(pid: u32) -> Result<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = &stat[stat.rfind(')').context("no ')' in /proc/PID/stat")? + 1..];
    Ok(after
        .split_whitespace()
        .nth(3)
        .context("short /proc/PID/stat")?
        .parse()?)
}

#[test]
fn test2_is_a_second_test_server_with_its_own_options_and_node_exporters() -> Result<()> {
    ensure!(
        Path::new(JEMALLOC).exists(),
        "{JEMALLOC} is missing: apt-get install libjemalloc2 (or scripts/install-deps.sh)"
    );
    let lab = Lab::up_with(
        "abtwo",
        &[
            ("LAB_TEST2", "1"),
            ("LAB_TEST_MYSQLD_ARGS", "--default-time-zone=SYSTEM"),
            ("LAB_TEST2_MYSQLD_ARGS", "--default-time-zone=+00:00"),
            ("LAB_TEST2_PRELOAD", JEMALLOC),
        ],
    )?;
    let name = lab.name().to_string();
    let index = lab.var("LAB_INDEX").to_string();
    assert_eq!(lab.ip(Host::Test2), format!("198.18.{index}.6"));
    assert_eq!(lab.netns(Host::Test2), format!("{name}-test2"));

    // Same data as test, over TCP, from prod (the mirror's side of the network). Not from the
    // client: test2, like test, sends its answers to the client's addresses to assist.
    let rows = count_rows(&lab, Host::Prod, Host::Test)?;
    assert_eq!(rows, lab.var("LAB_TABLE_SIZE"));
    assert_eq!(count_rows(&lab, Host::Prod, Host::Test2)?, rows);
    let direct = lab.exec(
        Host::Client,
        &[
            "mariadb",
            "--no-defaults",
            "--connect-timeout=3",
            "-h",
            lab.ip(Host::Test2),
            "-u",
            "sbtest",
            "-psbtest",
            "-e",
            "select 1",
        ],
    )?;
    assert!(
        !direct.success(),
        "the client reached test2 directly: its SYN-ACK should have gone to assist"
    );

    // Each server has its own options.
    assert_eq!(lab.sql(Host::Test, "select @@time_zone")?, "SYSTEM");
    assert_eq!(lab.sql(Host::Test2, "select @@time_zone")?, "+00:00");

    // The preload is in test2's server, and in no other; both servers lead their own session.
    let prod_pid = pid_in(lab.var("LAB_PROD_PIDFILE"))?;
    let test_pid = pid_in(lab.var("LAB_TEST_PIDFILE"))?;
    let test2_pid = pid_in(lab.var("LAB_TEST2_PIDFILE"))?;
    let maps = |pid: u32| fs::read_to_string(format!("/proc/{pid}/maps"));
    assert!(
        maps(test2_pid)?.contains("libjemalloc"),
        "test2's mariadbd ({test2_pid}) has no libjemalloc mapped"
    );
    assert!(
        !maps(test_pid)?.contains("libjemalloc"),
        "test's mariadbd ({test_pid}) has libjemalloc mapped, but only test2 was to preload it"
    );
    assert_eq!(session_of(test2_pid)?, test2_pid, "test2's own session");
    assert_eq!(session_of(test_pid)?, test_pid, "test's own session");

    // test2 routes the client pool (and the clients) via assist, as test does.
    let assist = lab.ip(Host::Assist).to_string();
    let pool_addr = format!("198.19.{index}.7");
    for host in [Host::Test, Host::Test2] {
        for to in [pool_addr.as_str(), lab.ip(Host::Client)] {
            let route = lab.exec_ok(host, &["ip", "route", "get", to])?;
            assert!(
                route.contains(&format!("via {assist} ")),
                "{host}: route to {to} is not via assist {assist}: {route}"
            );
        }
    }

    // A node_exporter on each test host, with the CPU figures an experiment reads.
    let mut exporter_pids = Vec::new();
    for host in [Host::Test, Host::Test2] {
        let addr = lab.node_exporter(host)?;
        assert_eq!(addr, format!("{}:9100", lab.ip(host)));
        // Started again, it says so and keeps the one running.
        assert_eq!(lab.node_exporter(host)?, addr);
        let metrics = lab.node_metrics(host)?;
        for metric in ["node_cpu_seconds_total{", "node_context_switches_total "] {
            assert!(
                metrics.lines().any(|l| l.starts_with(metric)),
                "{host}'s node_exporter has no {metric}"
            );
        }
        let dir = Path::new(lab.var("LAB_DIR")).join(host.as_str());
        let pid = pid_in(&dir.join("node-exporter.pid").to_string_lossy())?;
        assert_eq!(session_of(pid)?, pid, "{host}'s node_exporter: own session");
        exporter_pids.push(pid);
    }
    let status = lab.status()?.check()?.stdout;
    assert!(status.contains("test2 server preload: "), "{status}");

    // One server restarted with other options and no preload (the next variant of an
    // experiment), the other left alone.
    let restart = lab
        .command(&["restart", "test2"])
        .env("LAB_TEST2_MYSQLD_ARGS", "--default-time-zone=+01:00")
        .env("LAB_TEST2_PRELOAD", "")
        .output()?;
    ensure!(
        restart.status.success(),
        "lab.sh restart test2: {}",
        String::from_utf8_lossy(&restart.stderr)
    );
    assert_eq!(lab.sql(Host::Test2, "select @@time_zone")?, "+01:00");
    assert_eq!(lab.sql(Host::Test, "select @@time_zone")?, "SYSTEM");
    let test2_pid = pid_in(lab.var("LAB_TEST2_PIDFILE"))?;
    assert!(
        !maps(test2_pid)?.contains("libjemalloc"),
        "test2's mariadbd ({test2_pid}) restarted without a preload still has libjemalloc"
    );
    assert_eq!(
        session_of(test2_pid)?,
        test2_pid,
        "restarted test2's own session"
    );
    assert_eq!(pid_in(lab.var("LAB_TEST_PIDFILE"))?, test_pid);

    // `down` leaves nothing behind: namespaces, servers, exporters, the lab dir.
    let dir = lab.var("LAB_DIR").to_string();
    lab.down()?;
    let left: Vec<String> = netns_list()?
        .into_iter()
        .filter(|ns| ns.starts_with(&format!("{name}-")))
        .collect();
    ensure!(left.is_empty(), "namespaces left behind: {left:?}");
    for pid in [prod_pid, test_pid, test2_pid].iter().chain(&exporter_pids) {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} of lab {name} still runs"
        );
    }
    ensure!(!Path::new(&dir).exists(), "lab dir {dir} left behind");
    Ok(())
}
