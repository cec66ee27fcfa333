//! Acceptance of traffic shaping (issue 5): `--multiply` (each connection mirrored N times),
//! `--sample` (a share of the connections, each whole or not at all) and `--map` (several
//! ports to several targets in one copier).
//!
//! `TCPSHADOW_LOAD_SECS` sets the sysbench run's length (default 10 s; the acceptance figures
//! come from 30 s). `TCPSHADOW_MULTIPLY_RATE` limits sysbench's transactions per second in the
//! multiply test (default 0: unlimited). The lab's test server shares two cores with
//! production, the assist host and the copier, and must execute three times production's load:
//! at full speed it falls behind during the run (about 70% of its share done when sysbench
//! stops) and catches up from the copier's queues afterwards, hence the long drain.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{Comparison, Work};
use tcpshadow_tests::{Counters, Host, Lab, Load};

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The number after `label` in the copier's summary (e.g. "opened from SYN" -> the count
/// before it).
fn summary_number(summary: &str, before: &str) -> Option<u64> {
    let at = summary.find(before)?;
    summary[..at].split_whitespace().last()?.parse().ok()
}

/// No login failed on the test server since `before`.
fn no_login_errors(lab: &Lab, before: &Counters) -> Result<()> {
    let now = lab.counters(Host::Test)?;
    ensure!(
        now.delta(before, "Aborted_connects") == 0,
        "the test server counted {} aborted connects",
        now.delta(before, "Aborted_connects")
    );
    let errlog = std::fs::read_to_string(lab.var("LAB_TEST_ERRLOG")).unwrap_or_default();
    ensure!(
        !errlog.contains("Access denied"),
        "the test server denied logins:\n{errlog}"
    );
    Ok(())
}

/// `--multiply 3`: sysbench's connections (opened after the copier started) are each mirrored
/// three times, each copy logging in with the test server's real grants and preparing its own
/// statements: the test server executes three times production's queries.
#[test]
fn multiply_3_executes_three_times_the_queries() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("flmul")?;
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        client_ip_pool: Some(lab.var("LAB_POOL").to_string()),
        copier_args: vec![
            "--mysql-credentials".into(),
            creds,
            "--multiply".into(),
            "3".into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let secs = env_u32("TCPSHADOW_LOAD_SECS", 10);
    let rate = env_u32("TCPSHADOW_MULTIPLY_RATE", 150);
    let mut extra = Vec::new();
    if rate > 0 {
        extra.push(format!("--rate={rate}"));
    }
    let t0 = lab.counters(Host::Test)?;
    let before = lab.work_both()?;
    let report = lab.load(&Load {
        test: "oltp_read_only".into(),
        threads: 8,
        time_secs: secs,
        extra,
        ..Load::default()
    })?;
    ensure!(
        report.errors == 0,
        "sysbench reported errors:\n{}",
        report.output
    );
    let at_end = lab.work_both()?;
    let prod = Work::between(&before.0, &at_end.0)?;
    // Drain: the test server may still be working through its threefold share.
    let deadline = Instant::now() + Duration::from_secs(u64::from(secs).max(30));
    let mut test = Work::between(&before.1, &at_end.1)?;
    while !test.caught_up(&prod, 3.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        test = Work::between(&before.1, &lab.work(Host::Test)?)?;
    }
    no_login_errors(&lab, &t0)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    // Every copy logs in itself: no statement of the copier's own.
    let c = Comparison::new(prod, test).expecting(3.0);
    println!("multiply 3, oltp_read_only 8 threads {secs} s, rate {rate}/s:\n{c}");
    c.check(0.999, 1.001).context("--multiply 3")?;
    ensure!(
        copier.stderr.contains("multiply=3"),
        "the summary does not show the copies:\n{}",
        copier.stderr
    );
    Ok(())
}

/// Queries of the test server's general log that carry a connection marker (`'c<N>'`), by
/// test-server thread.
fn marked_queries(lab: &Lab) -> Result<BTreeMap<u64, Vec<String>>> {
    let rows = lab.sql(
        Host::Test,
        "SELECT thread_id, argument FROM mysql.general_log \
         WHERE command_type = 'Query' AND argument LIKE 'select ''c%'",
    )?;
    let mut by_thread: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in rows.lines() {
        let Some((thread, query)) = line.split_once('\t') else {
            continue;
        };
        by_thread
            .entry(thread.trim().parse().context("thread id")?)
            .or_default()
            .push(query.to_string());
    }
    Ok(by_thread)
}

/// `--sample 60`: of 200 short connections (each a `mariadb` client running three queries),
/// between 57% and 63% are mirrored (the acceptance), and each either whole (all three queries on the test server, in
/// one session) or not at all; the copier's counters add up to 200.
#[test]
fn sample_60_mirrors_whole_connections() -> Result<()> {
    const CONNS: u32 = 200;
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("sqsam")?;
    let creds = lab.credentials_file()?;
    lab.sql(
        Host::Test,
        "SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = ON",
    )?;
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            creds,
            "--sample".into(),
            "60".into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let t0 = lab.counters(Host::Test)?;
    let script = format!(
        "for i in $(seq 1 {CONNS}); do mariadb --no-defaults -h {} -u {} -p{} -N \
         -e \"select 'c$i', 1; select 'c$i', 2; select 'c$i', 3\" >/dev/null || exit 1; done",
        lab.ip(Host::Prod),
        lab.var("LAB_USER"),
        lab.var("LAB_PASSWORD"),
    );
    lab.exec_ok(Host::Client, &["bash", "-c", &script])?;

    // Wait until the mirrored share stops growing (at most 10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = marked_queries(&lab)?;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let again = marked_queries(&lab)?;
        let settled = again == seen;
        seen = again;
        if settled || Instant::now() >= deadline {
            break;
        }
    }
    no_login_errors(&lab, &t0)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);

    // Each mirrored connection is one test-server session with all three of its queries.
    let mut markers = BTreeSet::new();
    for (thread, queries) in &seen {
        let marker = queries[0].split('\'').nth(1).unwrap_or("").to_string();
        let want: Vec<String> = (1..=3).map(|n| format!("select '{marker}', {n}")).collect();
        ensure!(
            *queries == want,
            "test-server thread {thread} ran {queries:?}, not {want:?}"
        );
        ensure!(
            markers.insert(marker.clone()),
            "connection {marker} was mirrored twice"
        );
    }
    let mirrored = markers.len() as u64;
    let opened = summary_number(&copier.stderr, "opened from SYN").unwrap_or(u64::MAX);
    let not_sampled = summary_number(&copier.stderr, "connections not sampled").unwrap_or(0);
    let share = mirrored as f64 / f64::from(CONNS);
    println!(
        "sample 60: {mirrored} of {CONNS} connections mirrored ({:.1}%), copier: {opened} \
         opened, {not_sampled} not sampled",
        share * 100.0
    );
    ensure!(
        opened == mirrored && opened + not_sampled == u64::from(CONNS),
        "copier counted {opened} opened + {not_sampled} not sampled, the test server saw \
         {mirrored} of {CONNS}"
    );
    // The acceptance. A rule by address and port alone cannot meet it reliably: Linux
    // since 5.18 moves every new ephemeral port a random 2..16 above the last, which makes
    // such a share of 200 connections nearly binomial (53.5% to 62.5% measured). The copier
    // decides each new connection against a bar that follows the share taken so far (see
    // core/src/engine/sample.rs), which keeps it within a connection or two.
    ensure!(
        (0.57..=0.63).contains(&share),
        "{:.1}% mirrored, outside 57..63%",
        share * 100.0
    );
    Ok(())
}

/// Reads every `<ip>_<port>.bin` of a sink directory, keyed by client port.
fn streams_by_port(dir: &Path) -> Result<BTreeMap<u16, (String, Vec<u8>)>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for entry in entries {
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

/// `--map`: one copier mirrors two plain-TCP ports (9001 with --port/--target, 9002 with
/// --map) to the same two ports of the test host, and one intercept watches both; every
/// connection of each port arrives byte-identical at its own test port.
#[test]
fn map_mirrors_two_ports_to_two_targets() -> Result<()> {
    const CONNS: usize = 3;
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("flmap")?;
    let dir = Path::new(lab.var("LAB_DIR")).to_path_buf();
    let sink = env!("CARGO_BIN_EXE_stream-sink");
    let source = env!("CARGO_BIN_EXE_stream-source");
    let ports = [9001u16, 9002];
    let sink_dir = |h: Host, port: u16| dir.join(format!("sink-{h}-{port}"));
    let mut sinks = Vec::new();
    for port in ports {
        for h in [Host::Prod, Host::Test] {
            let listen = format!("{}:{port}", lab.ip(h));
            let out = sink_dir(h, port);
            let mut s = lab.spawn(h, &[sink, &listen, out.to_str().context("path")?])?;
            s.wait_for_output("listening on", Duration::from_secs(30))?;
            sinks.push(s);
        }
    }
    let pool = lab.var("LAB_POOL").to_string();
    let opts = MirrorOptions {
        port: ports[0],
        plain_tcp: true,
        client_ip_pool: Some(pool),
        copier_args: vec![
            "--map".into(),
            format!("{}={}:{}", ports[1], lab.ip(Host::Test), ports[1]),
        ],
        intercept_args: vec!["--port".into(), ports[1].to_string()],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    for (i, port) in ports.iter().enumerate() {
        let to = format!("{}:{port}", lab.ip(Host::Prod));
        let seed = (7 + i).to_string();
        let out = lab.exec_ok(Host::Client, &[source, &to, &CONNS.to_string(), &seed])?;
        println!("port {port}: {out}");
    }
    let total = |d: &Path| -> u64 {
        streams_by_port(d)
            .map(|m| m.values().map(|(_, b)| b.len() as u64).sum())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while ports
        .iter()
        .any(|p| total(&sink_dir(Host::Test, *p)) < total(&sink_dir(Host::Prod, *p)))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let (copier, intercept) = mirror.stop()?;
    println!("{}", copier.stderr);
    ensure!(copier.success(), "copier failed: {copier:?}");
    ensure!(intercept.success(), "intercept failed: {intercept:?}");
    for port in ports {
        let prod = streams_by_port(&sink_dir(Host::Prod, port))?;
        let test = streams_by_port(&sink_dir(Host::Test, port))?;
        ensure!(
            prod.len() == CONNS,
            "port {port}: prod saw {} connections, expected {CONNS}",
            prod.len()
        );
        ensure!(
            prod.keys().eq(test.keys()),
            "port {port}: client ports differ: prod {:?}, test {:?}",
            prod.keys().collect::<Vec<_>>(),
            test.keys().collect::<Vec<_>>()
        );
        for (client_port, (_, prod_bytes)) in &prod {
            let (test_ip, test_bytes) = &test[client_port];
            ensure!(
                prod_bytes == test_bytes,
                "port {port}, client port {client_port} (mirrored from {test_ip}): test \
                 received {} bytes, prod {}",
                test_bytes.len(),
                prod_bytes.len()
            );
        }
        println!(
            "port {port}: {CONNS} connections, {} bytes, byte-identical on test",
            total(&sink_dir(Host::Prod, port))
        );
    }
    ensure!(
        copier.stderr.contains("losses: none"),
        "copier counted losses:\n{}",
        copier.stderr
    );
    Ok(())
}
