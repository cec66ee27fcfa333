//! Acceptance of `copier record` and `copier replay` (issue 5): record sysbench on production,
//! replay the file onto the test server (real grants) at twice the speed and looped, and replay
//! a damaged copy of it.
//!
//! `TCPSHADOW_LOAD_SECS` (default 10) is the recorded load's length, `TCPSHADOW_REPLAY_RATE`
//! (default 60) its sysbench `--rate` in transactions per second: the test server shares the
//! machine's two cores with the assistant host (and the copier), so the recording is paced to a
//! rate it can execute twice as fast.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{build, release_bin, start_intercept, start_recorder, CONTROL_PORT};
use tcpshadow_tests::work::{Comparison, Work, WorkSnapshot, KINDS, MIN_COUNT};
use tcpshadow_tests::{Host, Lab, Load, Run};

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The number after `label` in `text` (e.g. "took 15.02 s" -> 15.02).
fn number_after(text: &str, label: &str) -> Option<f64> {
    let rest = &text[text.find(label)? + label.len()..];
    let token: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    token.parse().ok()
}

/// Runs `copier replay FILE ARGS...` on prod and waits for it; returns it and its wall time.
fn replay(lab: &Lab, file: &str, creds: &str, args: &[&str]) -> Result<(Run, Duration)> {
    let copier = release_bin("copier")?;
    let target = format!("{}:3306", lab.ip(Host::Test));
    let intercept = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    let mut argv = vec![
        copier.to_str().context("path")?,
        "replay",
        file,
        "--target",
        &target,
        "--intercept",
        &intercept,
        "--mysql-credentials",
        creds,
        "--mysql-default-user",
        lab.var("LAB_USER"),
        "--status-interval",
        "5",
    ];
    argv.extend(args);
    let started = Instant::now();
    let run = lab.exec(Host::Prod, &argv)?;
    Ok((run, started.elapsed()))
}

/// The test server's work since `before` once it has run `ratio` x `recorded` of every kind,
/// or stopped growing (at most 10 s): the last commands may still be executing when replay
/// exits.
fn settled_work(lab: &Lab, before: &WorkSnapshot, recorded: &Work, ratio: f64) -> Result<Work> {
    let started = Instant::now();
    let mut last: Option<Work> = None;
    loop {
        let now = Work::between(before, &lab.work(Host::Test)?)?;
        let done = KINDS.iter().all(|k| {
            now.get(k) as f64 >= recorded.get(k) as f64 * ratio || recorded.get(k) < MIN_COUNT
        });
        let stable = last.as_ref() == Some(&now) && started.elapsed() >= Duration::from_secs(1);
        if done || stable || started.elapsed() >= Duration::from_secs(10) {
            return Ok(now);
        }
        last = Some(now);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The replay's own time, first packet to the end of the drain, from its summary line
/// "took A s from the first packet to the last (...), B s with the drain; ...".
fn replay_secs(stderr: &str) -> Option<f64> {
    let line = stderr.lines().find(|l| l.contains("s with the drain"))?;
    let (_, tail) = line.split_once("), ")?;
    number_after(tail, "")
}

/// Frames `tcpdump -r` reads from `file`, and what it said on stderr.
fn tcpdump_count(file: &str) -> Result<(u64, String)> {
    let out = Command::new("tcpdump")
        .args(["-r", file, "-nn", "-q"])
        .output()
        .context("cannot run tcpdump (scripts/install-deps.sh installs it)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok((
        stdout.lines().count() as u64,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn record_then_replay_at_double_speed_looped_and_damaged() -> Result<()> {
    build()?;
    let lab = Lab::up("rp")?;
    let creds = lab.credentials_file()?;
    let secs = env_u32("TCPSHADOW_LOAD_SECS", 10);
    let rate = env_u32("TCPSHADOW_REPLAY_RATE", 60);
    let file = format!("{}/peak.pcapng", lab.var("LAB_DIR"));

    // --- record: sysbench's logins, queries and logouts all inside the file.
    let recorder = start_recorder(&lab, &file)?;
    let p0 = lab.work(Host::Prod)?;
    let load = lab.load(&Load {
        threads: 8,
        time_secs: secs,
        extra: vec![format!("--rate={rate}")],
        ..Load::default()
    })?;
    ensure!(load.errors == 0, "sysbench errors:\n{}", load.output);
    let p1 = lab.work(Host::Prod)?;
    // The last FIN/ACKs reach the capture within a moment.
    std::thread::sleep(Duration::from_millis(500));
    let recorded_run = recorder.stop()?;
    ensure!(
        recorded_run.success(),
        "copier record failed:\n{}",
        recorded_run.stderr
    );
    let recorded_work = Work::between(&p0, &p1)?;
    let recorded = recorded_work.get("Com_stmt_execute");
    // "captured: N frames, W written (...)": W frames are in the file.
    let frames = number_after(&recorded_run.stderr, "frames,").unwrap_or(0.0) as u64;
    println!(
        "recorded: {secs} s of sysbench oltp_read_only, 8 threads, --rate={rate}: {recorded} executes on prod, {frames} frames\n{}",
        recorded_run.stderr
    );
    ensure!(recorded > 0, "nothing recorded");

    // tcpdump reads every frame of the file.
    let (dumped, dump_err) = tcpdump_count(&file)?;
    ensure!(
        dumped == frames && !dump_err.contains("truncated"),
        "tcpdump read {dumped} of {frames} frames: {dump_err}"
    );

    let _intercept = start_intercept(&lab, &[])?;

    // --- speed 2: half the recorded time, every query executed.
    let t0 = lab.work(Host::Test)?;
    let (run, wall) = replay(&lab, &file, &creds, &["--speed", "2"])?;
    println!(
        "replay --speed 2 (wall {:.2} s):\n{}",
        wall.as_secs_f64(),
        run.stderr
    );
    ensure!(run.success(), "replay --speed 2 failed:\n{}", run.stderr);
    // Every login is in the file: replay runs no statement of its own.
    let executed = Comparison::new(
        recorded_work.clone(),
        settled_work(&lab, &t0, &recorded_work, 1.0)?,
    );
    let took = replay_secs(&run.stderr).context("no replay time in the summary")?;
    let file_time = number_after(&run.stderr, "file time").context("no file time")?;
    let goal = f64::from(secs) / 2.0;
    println!(
        "FIGURE speed 2: recorded {recorded} queries over {secs} s (file time {file_time:.2} s); replay took {took:.2} s \
         (goal {goal:.1} s, {:+.1}%), wall {:.2} s\n{executed}",
        (took / goal - 1.0) * 100.0,
        wall.as_secs_f64()
    );
    ensure!(
        (took - goal).abs() <= goal * 0.10,
        "replay --speed 2 took {took:.2} s, not {goal:.1} s +- 10%"
    );
    executed.check(0.999, 1.001).context("replay --speed 2")?;

    // --- speed 1, two loops: every query twice, as distinct connections.
    let t0 = lab.work(Host::Test)?;
    let c0 = lab.counters(Host::Test)?.get("Connections");
    let (run, wall) = replay(
        &lab,
        &file,
        &creds,
        &["--loop", "2", "--client-ip-pool", lab.var("LAB_POOL")],
    )?;
    println!(
        "replay --loop 2 (wall {:.2} s):\n{}",
        wall.as_secs_f64(),
        run.stderr
    );
    ensure!(run.success(), "replay --loop 2 failed:\n{}", run.stderr);
    let executed = Comparison::new(
        recorded_work.clone(),
        settled_work(&lab, &t0, &recorded_work, 2.0)?,
    )
    .expecting(2.0);
    let connections = lab.counters(Host::Test)?.get("Connections") - c0;
    println!(
        "FIGURE loop 2: {connections} connections (counters calls included), wall {:.2} s\n{executed}",
        wall.as_secs_f64()
    );
    executed.check(0.999, 1.001).context("replay --loop 2")?;
    ensure!(
        run.stderr.contains("16 opened from SYN"),
        "8 sysbench connections x 2 loops: {}",
        run.stderr
    );

    // --- a damaged copy: cut in the middle of a packet block near the middle of the file.
    let bytes = std::fs::read(&file)?;
    let cut = mid_packet_block_cut(&bytes).context("no enhanced packet block past the middle")?;
    let cut_file = format!("{}/cut.pcapng", lab.var("LAB_DIR"));
    std::fs::write(&cut_file, &bytes[..cut])?;
    let (readable, _) = tcpdump_count(&cut_file)?;
    let t0 = lab.work(Host::Test)?;
    let (run, _) = replay(&lab, &cut_file, &creds, &["--speed", "2"])?;
    println!("replay of a damaged copy:\n{}", run.stderr);
    ensure!(
        !run.success() && run.status.code() == Some(1),
        "a damaged file must give exit status 1: {}",
        run.status
    );
    let error = run
        .stderr
        .lines()
        .find(|l| l.starts_with("copier replay: "))
        .context("no error line")?;
    ensure!(
        error.contains(&cut_file) && error.contains("truncated enhanced packet block at offset "),
        "{error}"
    );
    let offset = number_after(error, "at offset").context("no offset")? as usize;
    ensure!(
        offset <= cut && cut - offset < 300_000,
        "offset {offset} is not the block cut at {cut}"
    );
    let replayed = number_after(&run.stderr, "\nreplay:").context("no packet count")? as u64;
    ensure!(
        replayed == readable,
        "replayed {replayed} packets, tcpdump reads {readable} before the damage"
    );
    let half = settled_work(&lab, &t0, &recorded_work, 1.0)?;
    let executed = half.get("Com_stmt_execute");
    ensure!(
        half.error_total() == 0,
        "the damaged copy's commands failed on test: {:?}",
        half.errors
    );
    println!("FIGURE damaged copy: {replayed} packets replayed (tcpdump reads {readable}), test executed {executed} of {recorded}; {error}");
    ensure!(
        executed > recorded / 4 && executed < recorded,
        "the first half of the file was replayed: test executed {executed} of {recorded}"
    );
    Ok(())
}

/// Where to cut `pcapng` so that the file ends inside an enhanced packet block's body: the
/// first such block that reaches past the middle, cut halfway through it. A cut at a fixed
/// offset lands in a block's 8-byte header now and then (the recording's layout depends on the
/// load's timing), which is another damage with another message. Little-endian, as
/// `copier record` writes it; `None` if the walk finds no such block.
fn mid_packet_block_cut(pcapng: &[u8]) -> Option<usize> {
    const ENHANCED_PACKET_BLOCK: u32 = 6;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(pcapng.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0;
    while at + 8 <= pcapng.len() {
        let len = word(at + 4)? as usize;
        if len < 12 {
            return None;
        }
        if word(at)? == ENHANCED_PACKET_BLOCK && at + len > pcapng.len() / 2 {
            return Some(at + len / 2);
        }
        at += len;
    }
    None
}
