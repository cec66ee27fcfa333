//! Acceptance of the memory bound (issue 8, "Bounded"): with `--max-memory 64` and 2,000
//! concurrent mirrored MySQL connections the copier's peak RSS stays under 64 MiB, and with a
//! budget too small for all of them (8,000 connections, `--max-memory 32`) the sessions it
//! sheds or refuses are counted, RSS still stays under the bound, and production's clients
//! notice nothing.
//!
//! The connections come from `mysql-crowd` (tests/src/bin): one process on the client host,
//! 2,000 real logins with the lab's account, `SELECT 1` on each, held open, queried again.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::{wait_settled, Background, Host, Lab};

const CONNS: usize = 2000;

/// `VmHWM` (peak RSS) and `VmRSS` of a process, in KiB.
fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// The `key=value` figure of the copier's last status line that has it.
fn last_status_value(output: &str, key: &str) -> Option<String> {
    output.lines().rev().find_map(|l| {
        let at = l.find(&format!(" {key}="))?;
        let rest = &l[at + key.len() + 2..];
        Some(
            rest.split(|c: char| c.is_whitespace() || c == '|')
                .next()?
                .to_string(),
        )
    })
}

struct Figures {
    opened: String,
    held: String,
    peak_rss_kib: u64,
    rss_idle_kib: u64,
    rss_loaded_kib: u64,
    test_threads: u64,
    summary_memory: String,
    shed: u64,
    refused: u64,
}

/// Starts the mirror with `--max-memory mib`, runs the crowd through it, and measures.
fn crowd_through_mirror(lab: &Lab, mib: u32, conns: usize) -> Result<Figures> {
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            creds,
            "--max-memory".into(),
            mib.to_string(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(lab, &opts)?;
    let pid = mirror.copier.pid().context("copier pid")?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    ensure!(comm.trim() == "copier", "pid {pid} is {comm:?}, not copier");
    let (_, rss_idle_kib) = rss_kib(pid)?;
    let threads0 = lab.counters(Host::Test)?.get("Threads_connected");

    let crowd_bin = env!("CARGO_BIN_EXE_mysql-crowd");
    let addr = format!("{}:3306", lab.ip(Host::Prod));
    let script = format!(
        "ulimit -n {} && exec {crowd_bin} {addr} {} {} {} {conns} 3 6",
        conns + 1000,
        lab.var("LAB_USER"),
        lab.var("LAB_PASSWORD"),
        lab.var("LAB_DB")
    );
    let mut crowd: Background = lab.spawn(Host::Client, &["sh", "-c", &script])?;
    crowd.wait_for_output("ready", Duration::from_secs(180))?;
    // Everything is open and has run its queries on production; the mirrored sessions are
    // established once the test server's connection count holds still (two reads a second
    // apart), however long this machine takes to log them all in.
    let test_threads = wait_settled(
        "the test server's connection count to settle",
        Duration::from_secs(1),
        Duration::from_secs(120),
        || Ok(lab.counters(Host::Test)?.get("Threads_connected")),
    )?
    .saturating_sub(threads0);
    let (_, rss_loaded_kib) = rss_kib(pid)?;
    let run = crowd.finish(Duration::from_secs(60))?;
    let (peak_rss_kib, _) = rss_kib(pid)?;
    let line = |prefix: &str| {
        run.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or("")
            .to_string()
    };
    let (opened, held) = (line("opened"), line("held"));
    ensure!(run.success(), "mysql-crowd failed: {run:?}");
    // A status line after the crowd left (they come every 5 s).
    let mut mirror = mirror;
    let lines = mirror.copier.count(" mem=");
    mirror
        .copier
        .wait_for_count(" mem=", lines + 1, Duration::from_secs(30))?;
    let (copier, _intercept) = mirror.stop()?;
    let out = copier.stderr;
    let summary_memory = out
        .lines()
        .find(|l| l.contains("session memory (--max-memory)"))
        .unwrap_or("")
        .trim()
        .to_string();
    let status_mem = last_status_value(&out, "mem").unwrap_or_default();
    println!(
        "--max-memory {mib}: crowd: {opened} / {held}; copier RSS idle {} KiB, with the crowd {} \
         KiB, peak {} KiB; test server +{test_threads} connections; last status mem={status_mem}; \
         {summary_memory}",
        rss_idle_kib, rss_loaded_kib, peak_rss_kib
    );
    let number_before = |needle: &str| -> u64 {
        summary_memory
            .split(',')
            .find(|p| p.contains(needle))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let shed = number_before("sessions shed");
    let refused = number_before("connections refused");
    ensure!(
        !summary_memory.is_empty(),
        "no memory line in the copier's summary:\n{out}"
    );
    Ok(Figures {
        opened,
        held,
        peak_rss_kib,
        rss_idle_kib,
        rss_loaded_kib,
        test_threads,
        summary_memory,
        shed,
        refused,
    })
}

#[test]
fn two_thousand_connections_stay_under_max_memory() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up_with("bd", &[("LAB_MAX_CONNECTIONS", "8500")])?;

    // 64 MiB: everything fits; the peak RSS stays under the bound.
    let f = crowd_through_mirror(&lab, 64, CONNS)?;
    let all = format!("opened {CONNS} of {CONNS}");
    ensure!(
        f.opened.starts_with(&all) && f.held.starts_with(&format!("held {CONNS} open, 0 failed")),
        "production's clients noticed: {} / {}",
        f.opened,
        f.held
    );
    ensure!(
        f.peak_rss_kib < 64 * 1024,
        "copier peak RSS {} KiB with --max-memory 64",
        f.peak_rss_kib
    );
    let mirrored = f.test_threads + f.shed + f.refused;
    ensure!(
        mirrored as usize >= CONNS * 99 / 100,
        "only {} of {CONNS} connections reached the test server ({})",
        f.test_threads,
        f.summary_memory
    );
    let per_session =
        (f.rss_loaded_kib.saturating_sub(f.rss_idle_kib) * 1024) / f.test_threads.max(1);
    println!(
        "copier RSS growth per open mirrored session: {per_session} bytes ({} sessions)",
        f.test_threads
    );

    // The smallest budget (32 MiB: 12 MiB for sessions) cannot hold 8,000 idle MySQL sessions
    // (charged about 1.9 KiB each, docs/BENCHMARKS.md): the ones that do not fit are counted,
    // production's clients notice nothing, the test server holds only what was mirrored, and
    // RSS stays under the bound.
    const MANY: usize = 8000;
    let g = crowd_through_mirror(&lab, 32, MANY)?;
    ensure!(
        g.opened.starts_with(&format!("opened {MANY} of {MANY}"))
            && g.held.starts_with(&format!("held {MANY} open, 0 failed")),
        "production's clients noticed: {} / {}",
        g.opened,
        g.held
    );
    ensure!(
        g.shed + g.refused > 0,
        "nothing shed with --max-memory 32: {}",
        g.summary_memory
    );
    ensure!(
        g.peak_rss_kib < 32 * 1024,
        "copier peak RSS {} KiB with --max-memory 32",
        g.peak_rss_kib
    );
    ensure!(
        (g.test_threads + g.refused + g.shed) as usize >= MANY * 99 / 100,
        "mirrored {} + refused {} + shed {} do not account for {MANY}",
        g.test_threads,
        g.refused,
        g.shed
    );
    lab.down()?;
    Ok(())
}
