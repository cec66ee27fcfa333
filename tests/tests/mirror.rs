//! Acceptance of the core mirror (issue 3): every new TCP session on the production port is
//! replayed onto the test server, whole, in order and without the clients noticing.
//!
//! The test server runs with `--skip-grant-tables` here: the login rewrite is the next issue's.
//! `TCPSHADOW_LOAD_SECS` sets each sysbench run's length (default 10 s; the acceptance figures
//! in docs/BENCHMARKS.md come from 30 s runs).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::OwnStatements;
use tcpshadow_tests::{Host, Lab, Load};

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

#[test]
fn sysbench_sessions_are_mirrored_whole_and_in_step() -> Result<()> {
    let lab = Lab::up_with("mirr", &[("LAB_TEST_MYSQLD_ARGS", "--skip-grant-tables")])?;
    // The default lab keeps the kernel's offloads, as real NICs: captures see super-frames.
    let k = lab.exec_ok(Host::Prod, &["ethtool", "-k", lab.var("LAB_IFACE")])?;
    ensure!(
        k.lines()
            .any(|l| l.trim() == "tcp-segmentation-offload: on"),
        "the default lab turned TSO off:\n{k}"
    );
    let test_ip = lab.ip(Host::Test).to_string();
    // Anything the test server sends must die at assist: a capture on the client sees none of it.
    let filter = format!("ip and src host {test_ip}");
    let mut client_capture = lab.spawn(
        Host::Client,
        &["tcpdump", "-i", lab.var("LAB_IFACE"), "-n", "-l", &filter],
    )?;
    client_capture.wait_for_output("listening on", Duration::from_secs(30))?;
    let mirror = Mirror::start(&lab, &MirrorOptions::default())?;
    let baseline_threads = lab.counters(Host::Test)?.get("Threads_connected");

    let secs = load_secs();
    for threads in [2u32, 8, 32] {
        let before = lab.work_both()?;
        let report = lab.load(&Load {
            threads,
            time_secs: secs,
            ..Load::default()
        })?;
        let ended = Instant::now();
        // At most 10 s for the test server to finish what was mirrored. Logins are not
        // rewritten here (skip-grant-tables): the copier runs no statement of its own.
        let window = lab.work_window(before, Duration::from_secs(10))?;
        let figures = window.check(&OwnStatements::default());
        let figures = tcpshadow_tests::work::shown(
            format!(
                "oltp_read_only {threads} threads {secs} s, sysbench errors {}",
                report.errors
            ),
            figures,
        );
        ensure!(
            report.errors == 0,
            "sysbench reported errors:\n{}",
            report.output
        );
        figures.with_context(|| format!("{threads} threads"))?;

        // Every mirrored sysbench connection is gone from the test server within 10 s of the
        // load's end.
        let deadline = ended + Duration::from_secs(10);
        let mut left = lab.counters(Host::Test)?.get("Threads_connected");
        while left > baseline_threads && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
            left = lab.counters(Host::Test)?.get("Threads_connected");
        }
        println!(
            "{threads} threads: {} mirrored connections left on test {:.1} s after the load ended",
            left.saturating_sub(baseline_threads),
            ended.elapsed().as_secs_f64()
        );
        ensure!(
            left <= baseline_threads,
            "{threads} threads: {} mirrored connections still open on test 10 s after the load",
            left - baseline_threads
        );
    }

    let (copier, intercept) = mirror.stop()?;
    println!("{}", copier.stderr);
    ensure!(copier.success(), "copier failed: {copier:?}");
    ensure!(
        copier.stderr.contains("losses: none"),
        "copier counted losses:\n{}\nintercept's log (a loss of framing starts there):\n{}",
        copier.stderr,
        intercept.stderr
    );
    ensure!(intercept.success(), "intercept failed: {intercept:?}");
    let capture = client_capture.stop()?;
    let seen = capture
        .stderr
        .lines()
        .find(|l| l.contains("packets captured"))
        .unwrap_or("")
        .to_string();
    ensure!(
        seen.starts_with("0 packets captured") && !capture.stdout.contains(&test_ip),
        "the client saw packets from the test server: {seen}\n{}",
        capture.stdout
    );
    Ok(())
}

/// Reads every `<ip>_<port>.bin` of a sink directory, keyed by port.
fn streams_by_port(dir: &Path) -> Result<BTreeMap<u16, (String, Vec<u8>)>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((ip, port)) = name.strip_suffix(".bin").and_then(|s| s.rsplit_once('_')) else {
            continue;
        };
        out.insert(
            port.parse()?,
            (ip.to_string(), std::fs::read(entry.path())?),
        );
    }
    Ok(out)
}

/// Mirrors a plain TCP service (stream-sink on prod and test, port 9000) through a client
/// address pool while stream-source sends 6 connections' worth of mixed writes, and checks that
/// test received, connection by connection, exactly the bytes prod did. With `open_before`, the
/// connections are opened before the copier starts (sending starts 3 s later), so the copier
/// must pick them up mid-stream.
fn plain_tcp_mirror(prefix: &str, open_before: bool) -> Result<()> {
    const CONNS: usize = 6;
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up(prefix)?;
    let port = 9000u16;
    let dir = Path::new(lab.var("LAB_DIR")).to_path_buf();
    let sink = env!("CARGO_BIN_EXE_stream-sink");
    let source = env!("CARGO_BIN_EXE_stream-source");
    let prod_dir = dir.join("sink-prod");
    let test_dir = dir.join("sink-test");
    let listen = |h: Host| format!("{}:{port}", lab.ip(h));
    let mut prod_sink = lab.spawn(
        Host::Prod,
        &[sink, &listen(Host::Prod), prod_dir.to_str().unwrap()],
    )?;
    let mut test_sink = lab.spawn(
        Host::Test,
        &[sink, &listen(Host::Test), test_dir.to_str().unwrap()],
    )?;
    prod_sink.wait_for_output("listening on", Duration::from_secs(30))?;
    test_sink.wait_for_output("listening on", Duration::from_secs(30))?;

    let pool = lab.var("LAB_POOL").to_string();
    let opts = MirrorOptions {
        port,
        plain_tcp: true,
        client_ip_pool: Some(pool.clone()),
        ..Default::default()
    };
    let conns = CONNS.to_string();
    let (mirror, out) = if open_before {
        let clients = lab.spawn(
            Host::Client,
            &[source, &listen(Host::Prod), &conns, "7", "3000"],
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while clients.output().0.matches("connected from").count() < CONNS {
            ensure!(
                Instant::now() < deadline,
                "stream-source did not connect: {:?}",
                clients.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mirror = Mirror::start(&lab, &opts)?;
        let run = clients.finish(Duration::from_secs(60))?.check()?;
        (mirror, run.stdout)
    } else {
        let mirror = Mirror::start(&lab, &opts)?;
        (
            mirror,
            lab.exec_ok(Host::Client, &[source, &listen(Host::Prod), &conns, "7"])?,
        )
    };
    println!("{out}");

    // Wait until the test side has as many bytes as production (at most 60 s: a busy machine
    // delivers them later, not differently).
    let total = |d: &Path| -> u64 {
        streams_by_port(d)
            .map(|m| m.values().map(|(_, b)| b.len() as u64).sum())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while total(&test_dir) < total(&prod_dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    if open_before {
        ensure!(
            copier
                .stderr
                .contains(&format!("{CONNS} picked up mid-stream")),
            "the copier did not count {CONNS} sessions picked up mid-stream:\n{}",
            copier.stderr
        );
    }

    let prod = streams_by_port(&prod_dir)?;
    let test = streams_by_port(&test_dir)?;
    ensure!(
        prod.len() == CONNS,
        "prod saw {} connections, expected {CONNS}",
        prod.len()
    );
    ensure!(
        prod.keys().eq(test.keys()),
        "client ports differ: prod {:?}, test {:?}",
        prod.keys().collect::<Vec<_>>(),
        test.keys().collect::<Vec<_>>()
    );
    let pool_prefix = pool
        .rsplit_once('.')
        .map(|(a, _)| a)
        .unwrap_or(&pool)
        .to_string();
    for (port, (prod_ip, prod_bytes)) in &prod {
        let (test_ip, test_bytes) = &test[port];
        ensure!(prod_ip == lab.ip(Host::Client), "prod saw client {prod_ip}");
        ensure!(
            test_ip.starts_with(&pool_prefix),
            "test saw {test_ip}, not a pool address ({pool})"
        );
        ensure!(
            prod_bytes == test_bytes,
            "port {port}: test received {} bytes, prod {}; first difference at byte {:?}",
            test_bytes.len(),
            prod_bytes.len(),
            prod_bytes
                .iter()
                .zip(test_bytes.iter())
                .position(|(a, b)| a != b)
        );
    }
    Ok(())
}

#[test]
fn a_plain_tcp_service_receives_byte_identical_streams() -> Result<()> {
    plain_tcp_mirror("plain", false)
}

#[test]
fn connections_open_before_the_copier_started_are_picked_up() -> Result<()> {
    plain_tcp_mirror("pickup", true)
}

/// The friendlier lab (`LAB_OFFLOADS=off`: one segment per packet, full checksums, as the
/// project's first labs had it) mirrors as faithfully as the default one, whose offloads are
/// the kernel's (super-frames in the captures, as real hosts produce).
#[test]
fn offloads_off_variant_is_mirrored_too() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up_with("mioff", &[("LAB_OFFLOADS", "off")])?;
    let tso = lab.exec_ok(Host::Prod, &["ethtool", "-k", lab.var("LAB_IFACE")])?;
    ensure!(
        tso.lines()
            .any(|l| l.trim() == "tcp-segmentation-offload: off"),
        "LAB_OFFLOADS=off left TSO on:\n{tso}"
    );
    let opts = MirrorOptions {
        copier_args: vec!["--mysql-credentials".into(), lab.credentials_file()?],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let (window, _) = lab.mirrored_load(&Load {
        threads: 8,
        time_secs: load_secs(),
        ..Load::default()
    })?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    let figures = window.check(&OwnStatements::default());
    let figures = tcpshadow_tests::work::shown("offloads off, oltp_read_only 8 threads", figures);
    figures?;
    ensure!(
        copier.stderr.contains("losses: none"),
        "copier counted losses:\n{}",
        copier.stderr
    );
    Ok(())
}
