//! Issue 18 part 2: a copier started at any moment of a running load keeps every session it
//! picks up. The load never pauses; the copier is started, run a few seconds and stopped
//! again, several times, so that its start falls wherever the clients happen to be:
//!
//! * sysbench `oltp_read_write` (8 threads): inside transactions, between a statement and its
//!   reply;
//! * one connection that reads a 20,000-row table over and over (about 4 MB a result): inside
//!   a large result set, where the client sends nothing for a long time;
//! * one connection that prepares a statement over the binary protocol, waits, executes it,
//!   waits and closes it (mysql-connector-python's low-level API): between a prepare and its
//!   execute.
//!
//! The first copier starts before any client connects (its sessions begin at their SYN); the
//! others pick the connections up mid-stream with `--prod-dsn`.
//!
//! For each copier run: no session abandoned, no capture gap suspected (the kernel dropped
//! nothing: a gap then is the copier's own mistake), every lookup answered, and no loss in the
//! summary but the ones a mid-stream start explains (its "losses:" lines are printed): the
//! writes of the transaction each connection was in when the copier started (at most its 4
//! writes per sysbench connection, `txn_gate.rs`), and the commands in flight when it stopped. Over
//! the whole test, the test server has no statement error production did not have, but the
//! duplicate keys a copier stopped inside a sysbench transaction leaves behind (the write races
//! of `check_write_races`, counted by the copier).
//!
//! Tunable: `TCPSHADOW_PICKUP_ROUNDS` (copier runs, 6), `TCPSHADOW_PICKUP_SECS` (each run, 4).

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, CONTROL_PORT};
use tcpshadow_tests::work::{test_only_errors, OwnStatements, WRITE_RACE_CODES};
use tcpshadow_tests::{lab_clients_dir, wait_for, Background, Host, Lab, Load};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The losses a copier started mid-stream may report: what a connection sent before the
/// copier could know its state. Anything else under "losses:" fails the round.
const PICKUP_LOSSES: &[&str] = &[
    "commands dropped before state read",
    "commands dropped before transaction boundary",
    // The copier stops with commands in flight: their replies come after its summary.
    "sent, never answered by the test server",
    // Each run ends with a SIGTERM while the clients are connected.
    "sessions reset at copier exit",
    // Write races: concurrent transactions interleave differently on the two servers.
    "error 1062 on the test server only",
    "error 1205 on the test server only",
    "error 1213 on the test server only",
    "error 1205 on production only",
    "error 1213 on production only",
];

/// Error numbers of a statement whose client connection went away under it: ER_NET_READ_ERROR,
/// ER_NET_READ_INTERRUPTED, ER_NET_ERROR_ON_WRITE, ER_NET_WRITE_INTERRUPTED,
/// ER_QUERY_INTERRUPTED, ER_CONNECTION_KILLED.
const CUT_BY_RESET: &[u32] = &[1158, 1159, 1160, 1161, 1317, 1927];

/// The test server's recent statements that failed (events_statements_history_long), by
/// (thread, event): "ERRNO EVENT_NAME MESSAGE".
fn statement_errors(lab: &Lab) -> Result<BTreeMap<(u64, u64), String>> {
    let rows = lab.sql(
        Host::Test,
        "SELECT THREAD_ID, EVENT_ID, MYSQL_ERRNO, EVENT_NAME, IFNULL(MESSAGE_TEXT, '') \
         FROM performance_schema.events_statements_history_long WHERE MYSQL_ERRNO <> 0",
    )?;
    let mut out = BTreeMap::new();
    for row in rows.lines() {
        let f: Vec<&str> = row.split('\t').collect();
        if let [thread, event, errno, name, msg] = f[..] {
            if let (Ok(t), Ok(e)) = (thread.parse(), event.parse()) {
                out.insert((t, e), format!("{errno} {name} {msg}"));
            }
        }
    }
    Ok(out)
}

/// `name=N` of the summary's "protocol layer:" line (0 when the counter is not there).
fn protocol_counter(summary: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    summary
        .lines()
        .filter(|l| l.trim_start().starts_with("protocol layer:"))
        .flat_map(str::split_whitespace)
        .find_map(|w| w.strip_prefix(key.as_str()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The lines under the summary's "losses:" (empty for "losses: none").
fn losses(summary: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in summary.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("losses:") {
            inside = rest.trim().is_empty();
            if !inside && rest.trim() != "none" {
                out.push(rest.trim().to_string());
            }
            continue;
        }
        if inside {
            if line.starts_with("    ") && !t.is_empty() {
                out.push(t.to_string());
            } else {
                inside = false;
            }
        }
    }
    out
}

#[test]
fn a_copier_started_at_any_moment_keeps_every_session() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let rounds = env_u64("TCPSHADOW_PICKUP_ROUNDS", 6);
    let run_secs = env_u64("TCPSHADOW_PICKUP_SECS", 4);
    // Gaps between copier runs, in ms: uneven, so each start falls somewhere else in the
    // clients' cycles.
    let gaps_ms = [700u64, 1300, 450, 2100, 900, 1650, 300, 1100];
    let lab = Lab::up("pickup")?;
    // The test server keeps its last statements with their error numbers: an error on it that
    // no copier saw is looked up there after each copier run.
    lab.keep_statement_history(Host::Test)?;
    let mut test_errors = BTreeMap::new();
    let listen = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    let intercept_bin = release_bin("intercept")?.to_string_lossy().into_owned();
    let copier_bin = release_bin("copier")?.to_string_lossy().into_owned();
    let iface = lab.var("LAB_IFACE").to_string();
    let mut intercept = lab.spawn(
        Host::Assist,
        &[
            &intercept_bin,
            "--port",
            "3306",
            "--interface",
            &iface,
            "--listen",
            &listen,
            "--status-interval",
            "2",
        ],
    )?;
    intercept.wait_for_output("waiting for copiers", Duration::from_secs(30))?;
    let target = format!("{}:3306", lab.ip(Host::Test));
    let mut copier_args: Vec<String> = [
        copier_bin.as_str(),
        "--port",
        "3306",
        "--interface",
        &iface,
        "--target",
        &target,
        "--intercept",
        &listen,
        "--status-interval",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    copier_args.extend(lab.pickup_args()?);
    copier_args.extend(["--prod-dsn".into(), lab.prod_dsn()]);
    let start_copier = || -> Result<Background> {
        let args: Vec<&str> = copier_args.iter().map(String::as_str).collect();
        let mut c = lab.spawn(Host::Prod, &args)?;
        c.wait_for_output(
            "control channel to intercept is up",
            Duration::from_secs(30),
        )?;
        Ok(c)
    };

    let total = rounds * (run_secs + 3) + 10;
    let before = lab.work_both_quiet(Duration::from_secs(30))?;
    let threads0 = lab.counters(Host::Test)?.get("Threads_connected");
    // The first copier sees every connection from its SYN.
    let mut copier = Some(start_copier()?);
    let load = lab.spawn_load(&Load {
        test: "oltp_read_write".into(),
        threads: 8,
        time_secs: u32::try_from(total)?,
        ..Load::default()
    })?;
    let (user, password, prod) = (
        lab.var("LAB_USER").to_string(),
        lab.var("LAB_PASSWORD").to_string(),
        lab.ip(Host::Prod).to_string(),
    );
    let big = format!(
        "for i in $(seq 1 {n}); do echo 'SELECT * FROM sbtest.sbtest1;'; done \
         | mariadb --no-defaults -h {prod} -u {user} -p{password} > /dev/null",
        n = total * 20
    );
    let mut big_results = lab.spawn(Host::Client, &["bash", "-c", &big])?;
    let script = format!(
        "import time, mysql.connector\n\
         c = mysql.connector.connect(host='{prod}', user='{user}', password='{password}', \
           database='sbtest', use_pure=True)\n\
         end = time.time() + {total}\n\
         i = 0\n\
         while time.time() < end:\n\
         \x20   i += 1\n\
         \x20   s = c.cmd_stmt_prepare(b'SELECT c FROM sbtest2 WHERE id = ?')\n\
         \x20   time.sleep(0.23)\n\
         \x20   r = c.cmd_stmt_execute(s['statement_id'], data=(i % 1000 + 1,), parameters=s['parameters'])\n\
         \x20   if isinstance(r, tuple):\n\
         \x20       c.unread_result = True\n\
         \x20       c.get_rows(binary=True, columns=r[1])\n\
         \x20   time.sleep(0.11)\n\
         \x20   c.cmd_stmt_close(s['statement_id'])\n\
         print('prepared', i)\n"
    );
    let mut prepares = lab.spawn(
        Host::Client,
        &[
            "env",
            &format!("PYTHONPATH={}", lab_clients_dir("py")?.display()),
            "python3",
            "-c",
            &script,
        ],
    )?;
    let mut bad = Vec::new();
    let mut summaries = String::new();
    for round in 0..rounds {
        if round > 0 {
            sleep(Duration::from_millis(
                gaps_ms[round as usize % gaps_ms.len()],
            ));
            copier = Some(start_copier()?);
        }
        sleep(Duration::from_secs(run_secs));
        let run = copier.take().context("copier")?.stop()?;
        // The sessions the copier reset at its exit end on the test server only once it has
        // run what it had received of them (it lags production): their statements' errors are
        // in the history from then on, and the next run's statements would push them out.
        wait_for(
            "the test server to end the sessions the copier reset",
            Duration::from_millis(100),
            Duration::from_secs(60),
            || {
                let n = lab.counters(Host::Test)?.get("Threads_connected");
                Ok(if n <= threads0 { Ok(()) } else { Err(n) })
            },
        )?;
        test_errors.extend(statement_errors(&lab)?);
        let summary = run.stderr;
        let at = summary.find("copier summary after").unwrap_or(0);
        let tail = &summary[at..];
        println!("--- copier run {round}:\n{tail}");
        summaries.push_str(tail);
        summaries.push('\n');
        let line = |key: &str| tail.lines().find(|l| l.trim_start().starts_with(key));
        let sessions = line("sessions:").unwrap_or("");
        if !sessions.contains(" 0 abandoned") {
            bad.push(format!("run {round}: sessions abandoned: {sessions}"));
        }
        let captured = line("captured:").unwrap_or("");
        if !captured.contains(" 0 kernel drops") {
            bad.push(format!(
                "run {round}: the kernel dropped (the test wants none): {captured}"
            ));
        }
        // The line is there only when a gap was suspected.
        if let Some(gaps) = line("capture gaps:") {
            bad.push(format!("run {round}: capture gaps with no drop: {gaps}"));
        }
        if let Some(l) = line("--prod-dsn lookups:") {
            if !(l.contains(" 0 not found") && l.contains(" 0 failed") && l.contains(" 0 dropped"))
            {
                bad.push(format!("run {round}: lookups not answered: {l}"));
            }
        }
        // The prepare client's statement lives 0.34 s (prepare, execute, close). Picked up at
        // its execute, it is recovered only if production's lookup lists it before the client
        // closes it; on a busy machine the lookup can take longer, and the copier counts that
        // execute as prepared before the pickup and the close as a recovered statement closed
        // unused. As many of the first as of the second are explained; one more is not.
        let closed_unused = protocol_counter(tail, "recovered_closed_unused");
        for loss in losses(tail) {
            let n: u64 = loss
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX);
            if loss.contains("executes dropped prepared before pickup") && n <= closed_unused {
                println!(
                    "run {round}: {n} execute(s) of a statement closed before production's \
                     lookup listed it (the lookup was slower than the client's 0.34 s)"
                );
                continue;
            }
            if !PICKUP_LOSSES.iter().any(|p| loss.contains(p)) {
                bad.push(format!(
                    "run {round}: a loss a pickup does not explain: {loss}"
                ));
            }
            // Only the tail of the transaction each connection was in: sysbench's has 4
            // writes, the other clients none.
            if loss.contains("before transaction boundary") && n > 8 * 4 {
                bad.push(format!(
                    "run {round}: more than the tails of 8 transactions: {loss}"
                ));
            }
        }
        ensure!(
            big_results.exited()?.is_none() && prepares.exited()?.is_none(),
            "a client of the test ended early:\nbig results: {:?}\nprepares: {:?}",
            big_results.output(),
            prepares.output()
        );
    }
    let out = load.wait_with_output()?;
    ensure!(
        out.status.success(),
        "sysbench failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = big_results.stop();
    let prepared = prepares.finish(Duration::from_secs(5))?;
    println!("prepare client: {}", prepared.stdout.trim());
    // No comparison of amounts: the copier was off between its runs. Errors only: every
    // statement error the test server had that production did not must be a write race a
    // copier counted.
    let whole = lab
        .work_window(before, Duration::from_secs(10))?
        .whole(&OwnStatements::default())?;
    println!("the whole test, the copier's pauses included:\n{whole}");
    let _ = intercept.stop();
    let counted = test_only_errors(&summaries);
    let others: Vec<_> = counted
        .iter()
        .filter(|(c, _)| !WRITE_RACE_CODES.contains(c))
        .collect();
    if !others.is_empty() {
        bad.push(format!(
            "the copiers counted test-only errors that are no write race: {others:?}"
        ));
    }
    // Each copier run ends with its sessions reset (counted: "sessions reset at copier exit").
    // A statement the test server was running or answering then fails there with a network
    // error (a 4 MB result it cannot finish writing, an execute whose reply has nowhere to
    // go), and no copier is left to see it: those are the commands in flight at the stop.
    for e in test_errors.values() {
        println!("on test: {e}");
    }
    let cut = test_errors
        .values()
        .filter(|e| CUT_BY_RESET.iter().any(|c| e.starts_with(&format!("{c} "))))
        .count() as u64;
    let new: u64 = whole.new_errors().values().sum::<u64>().saturating_sub(cut);
    let races: u64 = counted.values().sum();
    if new > races {
        bad.push(format!(
            "{new} new statement errors on test (besides {cut} cut by a copier's exit), {races} \
             of them explained by the copiers as write races ({counted:?}); the test server's \
             errors: {:?}",
            test_errors.values().collect::<Vec<_>>()
        ));
    }
    ensure!(bad.is_empty(), "copier runs failed:\n{}", bad.join("\n"));
    Ok(())
}
