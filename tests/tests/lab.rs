//! Acceptance of the lab (issue 2, "Foundation"): the lab builds the network the mirror needs,
//! runs two real MariaDB servers with the same data, runs side by side with another lab, is always
//! torn down, and says clearly what is wrong when it cannot run.
//!
//! These tests need root (network namespaces); each uses its own lab name prefix because cargo runs
//! them in parallel threads.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::{
    is_root, lab_command, lab_script, netns_list, parse_env, require_root, Host, Lab, Load,
};

fn mariadb_select_1(lab: &Lab, from: Host, to: Host) -> Result<String> {
    lab.client_sql(from, to, "select 1")
}

/// Processes ids of the lab's servers, to check later that they are gone.
fn server_pids(lab: &Lab) -> Result<Vec<u32>> {
    ["LAB_PROD_PIDFILE", "LAB_TEST_PIDFILE"]
        .iter()
        .map(|key| {
            let text = fs::read_to_string(lab.var(key))
                .with_context(|| format!("reading {}", lab.var(key)))?;
            Ok(text.trim().parse()?)
        })
        .collect()
}

fn assert_gone(name: &str, pids: &[u32], dir: &str) -> Result<()> {
    let left: Vec<String> = netns_list()?
        .into_iter()
        .filter(|ns| ns.starts_with(&format!("{name}-")))
        .collect();
    ensure!(
        left.is_empty(),
        "namespaces of lab {name} left behind: {left:?}"
    );
    for pid in pids {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "mariadbd {pid} of lab {name} still runs"
        );
    }
    ensure!(!Path::new(dir).exists(), "lab dir {dir} left behind");
    Ok(())
}

#[test]
fn lab_gives_the_mirror_its_network_and_identical_servers() -> Result<()> {
    let lab = Lab::up("topo")?;
    let (client, test) = (
        lab.ip(Host::Client).to_string(),
        lab.ip(Host::Test).to_string(),
    );

    // The client reaches production's MariaDB with the normal account.
    assert_eq!(
        mariadb_select_1(&lab, Host::Client, Host::Prod)?.trim(),
        "1"
    );

    // A direct connection from the client to test never completes: test routes the client via
    // assist, which sees the SYN-ACK and (ip_forward=0) drops it.
    assert_eq!(
        lab.exec_ok(Host::Assist, &["sysctl", "-n", "net.ipv4.ip_forward"])?
            .trim(),
        "0"
    );
    let filter = format!(
        "tcp and src host {test} and src port 3306 and dst host {client} \
         and tcp[tcpflags] & (tcp-syn|tcp-ack) == (tcp-syn|tcp-ack)"
    );
    let mut tcpdump = lab.spawn(
        Host::Assist,
        &["tcpdump", "-i", "eth0", "-n", "-l", "-c", "1", &filter],
    )?;
    tcpdump.wait_for_output("listening on", Duration::from_secs(30))?;
    let attempt = lab.exec(
        Host::Client,
        &[
            "timeout",
            "3",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{test}/3306"),
        ],
    )?;
    assert_eq!(
        attempt.status.code(),
        Some(124),
        "the direct connection client -> test must hang until the timeout: {attempt:?}"
    );
    let capture = tcpdump.finish(Duration::from_secs(5))?;
    assert!(
        capture.stdout.contains(&format!("{test}.3306 > {client}."))
            && capture.stdout.contains("Flags [S.]"),
        "tcpdump on assist did not see test's SYN-ACK to the client: {capture:?}"
    );

    // Rewritten client addresses (the pool) go via assist too, and test accepts packets from
    // addresses it routes elsewhere (rp_filter off).
    let pool = lab.var("LAB_POOL");
    let pool_addr = format!("{}.7", pool.rsplit_once('.').map_or(pool, |(net, _)| net));
    let route = lab.exec_ok(Host::Test, &["ip", "route", "get", &pool_addr])?;
    assert!(
        route.contains(&format!("via {}", lab.ip(Host::Assist))),
        "test's route to the pool address {pool_addr}: {route}"
    );
    for key in ["all", "default", lab.var("LAB_IFACE")] {
        let v = lab.exec_ok(
            Host::Test,
            &["sysctl", "-n", &format!("net.ipv4.conf.{key}.rp_filter")],
        )?;
        assert_eq!(v.trim(), "0", "rp_filter of {key} on test");
    }
    // Every address the lab uses is in 198.18.0.0/15.
    for host in [Host::Client, Host::Prod, Host::Test, Host::Assist] {
        let ip: std::net::Ipv4Addr = lab.ip(host).parse()?;
        assert_eq!(ip.octets()[..2], [198, 18], "{host:?}: {ip}");
    }
    assert!(pool.starts_with("198.19."), "pool {pool}");
    // The normal account logs in with mysql_native_password on both servers.
    for host in [Host::Prod, Host::Test] {
        assert_eq!(
            lab.sql(
                host,
                "SELECT plugin FROM mysql.user WHERE user = 'sbtest' AND host = '%'"
            )?,
            "mysql_native_password",
            "{host:?}"
        );
    }

    // Same data on both servers.
    let tables: u32 = lab.var("LAB_TABLES").parse()?;
    for t in 1..=tables {
        let sql = format!("CHECKSUM TABLE sbtest.sbtest{t}");
        let (p, q) = (lab.sql(Host::Prod, &sql)?, lab.sql(Host::Test, &sql)?);
        assert_eq!(p, q, "prod and test differ on sbtest{t}");
        assert!(!p.ends_with("NULL"), "sbtest{t} missing: {p}");
    }
    assert_eq!(
        lab.sql(Host::Test, "SELECT COUNT(*) FROM sbtest.sbtest1")?,
        lab.var("LAB_TABLE_SIZE")
    );
    assert_eq!(lab.sql(Host::Prod, "SELECT @@performance_schema")?, "1");

    // The load helper drives prod only, and the counters show it.
    let (prod0, test0) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    let report = lab.load(&Load {
        threads: 4,
        time_secs: 2,
        ..Load::default()
    })?;
    let (prod1, test1) = (lab.counters(Host::Prod)?, lab.counters(Host::Test)?);
    assert!(
        report.queries > 1000 && report.errors == 0,
        "{}",
        report.output
    );
    assert!(
        prod1.delta(&prod0, "Com_stmt_execute") >= report.queries,
        "prod executed {} statements, sysbench sent {}",
        prod1.delta(&prod0, "Com_stmt_execute"),
        report.queries
    );
    assert_eq!(
        test1.delta(&test0, "Com_stmt_execute"),
        0,
        "test must see nothing without a mirror"
    );

    // `up` again is a no-op on a healthy lab.
    let again = lab.command(&["up"]).output()?;
    assert!(
        again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already up")
    );
    assert!(lab.status()?.success());

    let (name, pids, dir) = (
        lab.name().to_string(),
        server_pids(&lab)?,
        lab.var("LAB_DIR").to_string(),
    );
    lab.down()?;
    assert_gone(&name, &pids, &dir)?;
    // `down` again is a no-op.
    let again = lab_command(&name).arg("down").output()?;
    ensure!(
        again.status.success(),
        "a second down failed: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    Ok(())
}

/// A test process killed while its lab is up (a CI timeout, say) leaves the lab behind; the next
/// test to bring a lab up tears it down, whoever started it.
#[test]
fn a_lab_left_by_a_killed_test_is_torn_down_by_the_next() -> Result<()> {
    require_root()?;
    // What a killed test leaves: the lab that `up` finished after the test was gone, and its
    // owner record (pid 2^22, beyond pid_max: never alive). The record is written once the lab
    // is up and its servers' pids are read: written before, another test thread's reaper could
    // take the not-yet-built lab for gone, drop the record, and leave the lab that `up` then
    // builds to nobody.
    let name = format!("orph-{}", std::process::id());
    let up = lab_command(&name).arg("up").output()?;
    ensure!(
        up.status.success(),
        "lab.sh up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let env = parse_env(&String::from_utf8_lossy(
        &lab_command(&name).arg("env").output()?.stdout,
    ));
    let dir = env.get("LAB_DIR").context("LAB_DIR of the orphan")?.clone();
    let pids: Vec<u32> = ["LAB_PROD_PIDFILE", "LAB_TEST_PIDFILE"]
        .iter()
        .filter_map(|k| fs::read_to_string(env.get(*k)?).ok()?.trim().parse().ok())
        .collect();
    ensure!(pids.len() == 2, "the orphan's servers are not running");
    fs::create_dir_all("/run/tcpshadow-lab/test-owners")?;
    fs::write(
        format!("/run/tcpshadow-lab/test-owners/{name}"),
        "4194304 1",
    )?;

    let next = Lab::up("reaper")?;
    // Another test thread's lab may have found the orphan first; its teardown can still be
    // finishing.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while assert_gone(&name, &pids, &dir).is_err() && std::time::Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    assert_gone(&name, &pids, &dir)?;
    ensure!(
        !Path::new(&format!("/run/tcpshadow-lab/test-owners/{name}")).exists(),
        "the orphan's owner record is left"
    );
    next.down()
}

#[test]
fn two_labs_run_side_by_side() -> Result<()> {
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(|| Lab::up("pair"));
        let b = s.spawn(|| Lab::up("pair"));
        (
            a.join().expect("lab a thread"),
            b.join().expect("lab b thread"),
        )
    });
    let (a, b) = (a?, b?);
    assert_ne!(a.var("LAB_SUBNET"), b.var("LAB_SUBNET"));
    assert_ne!(a.var("LAB_POOL"), b.var("LAB_POOL"));
    for lab in [&a, &b] {
        assert_eq!(
            mariadb_select_1(lab, Host::Client, Host::Prod)?.trim(),
            "1",
            "lab {}",
            lab.name()
        );
        assert!(lab.status()?.success());
    }
    // Separate networks: a's client has no route to b's prod.
    let cross = a.exec(
        Host::Client,
        &[
            "timeout",
            "3",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{}/3306", b.ip(Host::Prod)),
        ],
    )?;
    assert!(
        !cross.success(),
        "lab {} reached lab {}: {cross:?}",
        a.name(),
        b.name()
    );

    let gone = [&a, &b].map(|lab| {
        (
            lab.name().to_string(),
            server_pids(lab),
            lab.var("LAB_DIR").to_string(),
        )
    });
    drop(a); // the Drop path, as after a failed test
    b.down()?;
    for (name, pids, dir) in gone {
        assert_gone(&name, &pids?, &dir)?;
    }
    Ok(())
}

#[test]
fn test_server_restarts_with_new_options_and_a_taken_port_is_reported() -> Result<()> {
    let lab = Lab::up("opts")?;
    let restart = lab
        .command(&["restart", "test"])
        .env("LAB_TEST_MYSQLD_ARGS", "--skip-grant-tables")
        .output()?;
    assert!(
        restart.status.success(),
        "{}",
        String::from_utf8_lossy(&restart.stderr)
    );
    assert_eq!(lab.sql(Host::Test, "SELECT @@skip_grant_tables")?, "1");
    // TCP still works with --skip-grant-tables, for any user.
    let anyone = lab.exec_ok(
        Host::Test,
        &[
            "mariadb",
            "--no-defaults",
            "-h",
            lab.ip(Host::Test),
            "-u",
            "whoever",
            "-N",
            "-e",
            "select 7",
        ],
    )?;
    assert_eq!(anyone.trim(), "7");

    let stop = lab.command(&["stop", "test"]).output()?;
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let mut squatter = lab.spawn(
        Host::Test,
        &[
            "perl",
            "-MIO::Socket::INET",
            "-e",
            "$|=1; my $s = IO::Socket::INET->new(LocalAddr => '0.0.0.0:3306', Listen => 5, ReuseAddr => 1) \
             or die $!; print qq(listening\\n); sleep 60",
        ],
    )?;
    squatter.wait_for_output("listening", Duration::from_secs(30))?;
    let start = lab.command(&["start", "test"]).output()?;
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(
        !start.status.success() && stderr.contains("port 3306 is already taken"),
        "{stderr}"
    );
    squatter.stop()?;
    let start = lab.command(&["start", "test"]).output()?;
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );
    assert_eq!(lab.sql(Host::Test, "SELECT 1")?, "1");
    Ok(())
}

#[test]
fn lab_refuses_to_run_without_root_and_says_so() -> Result<()> {
    let output = if is_root() {
        // The script may sit below a directory "nobody" cannot enter (/root/...): run a copy.
        let dir =
            std::env::temp_dir().join(format!("tcpshadow-tests-nonroot-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        let copy = dir.join("lab.sh");
        fs::copy(lab_script(), &copy)?;
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755))?;
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&copy)
            .args(["--name", "nonroot", "up"])
            .output()
            .context("running setpriv (util-linux)")?;
        fs::remove_dir_all(&dir)?;
        out
    } else {
        lab_command("nonroot").arg("up").output()?
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "lab.sh up succeeded without root");
    assert!(
        stderr.contains("run as root: sudo"),
        "unclear message: {stderr}"
    );
    Ok(())
}

#[test]
fn missing_tools_are_named_with_their_package() -> Result<()> {
    require_root()?;
    for (var, package) in [
        ("LAB_MARIADBD", "mariadb-server"),
        ("LAB_MARIADB", "mariadb-client"),
        ("LAB_SYSBENCH", "sysbench"),
        ("LAB_TCPDUMP", "tcpdump"),
    ] {
        let output = lab_command("missing")
            .arg("up")
            .env(var, "/nonexistent/tool")
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{var}=/nonexistent: up succeeded");
        assert!(
            stderr.contains(package),
            "{var}=/nonexistent: package {package} not named: {stderr}"
        );
    }
    let left: Vec<String> = netns_list()?
        .into_iter()
        .filter(|ns| ns.starts_with("missing-"))
        .collect();
    assert!(left.is_empty(), "a failed up left namespaces: {left:?}");
    Ok(())
}
