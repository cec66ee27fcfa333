//! Acceptance of MySQL awareness (issue 4): the test server keeps its normal accounts, and every
//! mirrored session logs in there with the test server's own scramble, keeps its prepared
//! statements valid, and executes what production executed.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::work::{OwnStatements, Window};
use tcpshadow_tests::{sample, wait_for, Host, Lab, Load};

fn load_secs() -> u32 {
    std::env::var("TCPSHADOW_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// [`Lab::mirrored_load`], saying when production had deadlocks (oltp_read_write at 32
/// threads has one now and then; the rollback and the retry are mirrored like every other
/// statement).
fn mirrored_load(lab: &Lab, load: &Load) -> Result<Window> {
    let (window, report) = lab.mirrored_load(load)?;
    if report.errors > 0 {
        println!(
            "{}: production had {} deadlocks/lock waits, retried by sysbench",
            load.test, report.errors
        );
    }
    Ok(window)
}

#[test]
fn sysbench_logs_in_on_a_test_server_with_normal_grants() -> Result<()> {
    let lab = Lab::up("mysql")?;
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec!["--mysql-credentials".into(), creds],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let test0 = lab.counters(Host::Test)?;

    // The mariadb CLI: text protocol, a schema changed with USE (COM_INIT_DB), several queries.
    let before = lab.work_both()?;
    let out = lab.exec_ok(
        Host::Client,
        &[
            "mariadb",
            "--no-defaults",
            "-h",
            lab.ip(Host::Prod),
            "-u",
            lab.var("LAB_USER"),
            &format!("-p{}", lab.var("LAB_PASSWORD")),
            "-N",
            "-e",
            "USE sbtest; SELECT COUNT(*) FROM sbtest1; SELECT SUM(k) FROM sbtest2 WHERE id < 100; \
             USE information_schema; SELECT 42",
        ],
    )?;
    ensure!(out.contains("42"), "mariadb CLI output: {out}");
    std::thread::sleep(Duration::from_millis(500));
    // A handful of commands: each kind exactly, and no error on test.
    let cli = lab
        .work_window(before, Duration::from_secs(5))?
        .whole(&OwnStatements::default())?;
    for c in tcpshadow_tests::work::KINDS {
        ensure!(
            cli.test.get(c) == cli.prod.get(c),
            "mariadb CLI session: {c} on test {} vs prod {}\n{cli}",
            cli.test.get(c),
            cli.prod.get(c)
        );
    }
    ensure!(cli.new_errors().is_empty(), "mariadb CLI session:\n{cli}");

    let secs = load_secs();
    // Writes of concurrent connections may race differently on the test server (a deadlock
    // elsewhere): those are held to what the copier counted, once its summary is there.
    let mut writing = Vec::new();
    for test in ["oltp_read_only", "oltp_read_write"] {
        for threads in [8u32, 32] {
            let load = Load {
                test: test.into(),
                threads,
                time_secs: secs,
                ..Load::default()
            };
            let window = mirrored_load(&lab, &load)?;
            if test == "oltp_read_write" {
                writing.push((format!("{test} {threads} threads {secs} s"), window));
                continue;
            }
            // Every login is seen: the copier runs no statement of its own.
            let figures = window.check(&OwnStatements::default());
            let figures =
                tcpshadow_tests::work::shown(format!("{test} {threads} threads {secs} s"), figures);
            figures.with_context(|| format!("{test} {threads} threads"))?;
        }
    }
    let test1 = lab.counters(Host::Test)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    for (what, window) in writing {
        let figures = window.check_write_races(&OwnStatements::default(), &copier.stderr);
        let figures = tcpshadow_tests::work::shown(&what, figures);
        figures.context(what)?;
    }
    ensure!(
        test1.delta(&test0, "Aborted_connects") == 0,
        "the test server counted {} aborted connects",
        test1.delta(&test0, "Aborted_connects")
    );
    let errlog = std::fs::read_to_string(lab.var("LAB_TEST_ERRLOG")).unwrap_or_default();
    ensure!(
        !errlog.contains("Access denied"),
        "the test server denied logins:\n{errlog}"
    );
    Ok(())
}

/// Issue 4's pooled-connection acceptance: sysbench's connections (prepared statements, the
/// default) are open and working before the copier starts; with `--prod-dsn` the copier recovers each
/// connection's user, schema and prepared statements from production, and the test server
/// executes what production executed from then on. `TCPSHADOW_POOLED_TEST` (oltp_read_only)
/// and `TCPSHADOW_POOLED_THREADS` (8) choose the load, `TCPSHADOW_POOLED_SECS` (30) its length
/// (the copier starts a few seconds in: a pickup's fixed cost, the writes of the transactions
/// the connections were inside then, weighs less in a longer window).
#[test]
fn pooled_connections_are_recovered_with_prod_dsn() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("pooled")?;
    let test = std::env::var("TCPSHADOW_POOLED_TEST").unwrap_or_else(|_| "oltp_read_only".into());
    let threads: u32 = std::env::var("TCPSHADOW_POOLED_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let secs: u32 = std::env::var("TCPSHADOW_POOLED_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // A pooled connection with session state of its own: user variables set before the copier
    // started, used after. The row it inserts must read the same on both servers. It stays open
    // a little after its insert: the lookup runs while the insert is held, and a connection
    // already gone from PROCESSLIST is "not found".
    for host in [Host::Prod, Host::Test] {
        lab.sql(host, "CREATE TABLE sbtest.tsd_uv (tag VARCHAR(32), n INT)")?;
    }
    let go = std::env::temp_dir().join(format!("{}-uv-go", lab.name()));
    let _ = std::fs::remove_file(&go);
    let script = format!(
        "( echo \"SET @tsd_tag := 'set-before-start', @tsd_n := 42;\"; \
           while [ ! -e {go} ]; do sleep 0.1; done; \
           echo \"INSERT INTO sbtest.tsd_uv VALUES (@tsd_tag, @tsd_n);\"; sleep 3 ) \
         | mariadb --no-defaults -h {} -u {} -p{}",
        lab.ip(Host::Prod),
        lab.var("LAB_USER"),
        lab.var("LAB_PASSWORD"),
        go = go.display(),
    );
    let prod0 = lab.work(Host::Prod)?;
    let stateful = lab.spawn(Host::Client, &["bash", "-c", &script])?;
    lab.wait_work(
        Host::Prod,
        &prod0,
        "Com_set_option",
        1,
        Duration::from_secs(30),
    )?;
    let load = lab.spawn_load(&Load {
        test: test.clone(),
        threads,
        time_secs: secs,
        ..Load::default()
    })?;
    // The pool is open and working before the copier starts: every connection has prepared
    // its statements and run transactions (about ten each) on production.
    lab.wait_work(
        Host::Prod,
        &prod0,
        "Com_stmt_execute",
        u64::from(threads) * 140,
        Duration::from_secs(30),
    )?;
    let mut copier_args = lab.pickup_args()?;
    copier_args.extend(["--prod-dsn".into(), lab.prod_dsn()]);
    let opts = MirrorOptions {
        copier_args,
        ..Default::default()
    };
    // The window opens with the clients paused and both servers quiet, the copier already
    // capturing: everything production runs from then on is due on the test server, the
    // copier's pickups and recoveries included (its own statements are taken out by count).
    let paused = lab.pause(&load);
    let mirror = Mirror::start(&lab, &opts)?;
    let before = lab.work_both_quiet(Duration::from_secs(30))?;
    let t0 = lab.counters(Host::Test)?;
    paused.resume();
    std::fs::write(&go, b"")?;
    let stateful = stateful.finish(Duration::from_secs(20))?;
    let _ = std::fs::remove_file(&go);
    ensure!(
        stateful.success(),
        "the stateful connection failed: {stateful:?}"
    );
    let out = load.wait_with_output()?;
    let sysbench = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "sysbench failed:\n{sysbench}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let window = lab.work_window(before, Duration::from_secs(10))?;
    let t1 = lab.counters(Host::Test)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    let own = OwnStatements::from_summary(&copier.stderr)?;
    let figures = if test == "oltp_read_write" {
        window.check_write_races(&own, &copier.stderr)
    } else {
        window.check(&own)
    };
    let figures = tcpshadow_tests::work::shown(
        format!(
            "pooled connections, {test} {threads} threads {secs} s, copier started once each \
             had run about ten transactions, with --prod-dsn"
        ),
        figures,
    );
    figures?;
    ensure!(
        t1.delta(&t0, "Aborted_connects") == 0,
        "the test server counted {} aborted connects",
        t1.delta(&t0, "Aborted_connects")
    );
    let errlog = std::fs::read_to_string(lab.var("LAB_TEST_ERRLOG")).unwrap_or_default();
    ensure!(
        !errlog.contains("Access denied"),
        "the test server denied logins:\n{errlog}"
    );
    let pooled = threads + 1;
    ensure!(
        copier.stderr.contains(&format!("{pooled} answered"))
            && copier.stderr.contains(" 0 abandoned"),
        "the copier did not recover the {pooled} pooled connections ({threads} sysbench, 1 \
         mariadb), or abandoned some:\n{}",
        copier.stderr
    );
    let sql = "SELECT tag, n FROM sbtest.tsd_uv";
    let (on_prod, on_test) = (lab.sql(Host::Prod, sql)?, lab.sql(Host::Test, sql)?);
    println!("user variables set before the copier started: prod {on_prod:?}, test {on_test:?}");
    ensure!(
        on_prod == "set-before-start\t42" && on_test == on_prod,
        "the pooled connection's user variables: prod {on_prod:?}, test {on_test:?}"
    );
    Ok(())
}

/// A protocol-layer counter from the copier's summary (`name=N` on its "protocol layer:" line).
fn summary_counter(summary: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    summary
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key.as_str()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Issue 4's pooled-connection acceptance without `--prod-dsn`: sysbench's connections log in
/// as `--mysql-default-user`, but their statements were prepared before the copier started, so
/// their executes cannot be sent. Every one of them must be counted, under a name that says why,
/// and the summary must name the flag that recovers them.
#[test]
fn pooled_connections_without_prod_dsn_count_what_they_cannot_replay() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("nodsn")?;
    let prod0 = lab.work(Host::Prod)?;
    let load = lab.spawn_load(&Load {
        time_secs: 20,
        ..Load::default()
    })?;
    // Statements prepared and executing on every connection before the copier starts.
    lab.wait_work(
        Host::Prod,
        &prod0,
        "Com_stmt_execute",
        8 * 140,
        Duration::from_secs(15),
    )?;
    let opts = MirrorOptions {
        copier_args: lab.pickup_args()?,
        ..Default::default()
    };
    let paused = lab.pause(&load);
    let mirror = Mirror::start(&lab, &opts)?;
    let before = lab.work_both_quiet(Duration::from_secs(30))?;
    paused.resume();
    let out = load.wait_with_output()?;
    ensure!(
        out.status.success(),
        "sysbench failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let window = lab.work_window(before, Duration::from_secs(10))?;
    let (copier, _) = mirror.stop()?;
    let summary = copier.stderr;
    let whole = window.whole(&OwnStatements::from_summary(&summary)?)?;
    let executes = summary_counter(&summary, "executes_dropped_prepared_before_pickup");
    let others = summary_counter(&summary, "stmt_commands_dropped");
    let (prod, test) = (
        whole.prod.get("Com_stmt_execute"),
        whole.test.get("Com_stmt_execute"),
    );
    println!(
        "pooled connections, oltp_read_only 8 threads 20 s, copier started after 5 s without \
         --prod-dsn: executes dropped (prepared before pickup) {executes}, other statement \
         commands dropped {others}\n{whole}"
    );
    println!("{summary}");
    ensure!(
        summary_counter(&summary, "pickup_logins") == 8,
        "the 8 sysbench connections were not picked up and logged in:\n{summary}"
    );
    // Every execute production ran in the window either ran on the test server or was counted
    // as dropped, exactly: the copier ran from the window's start.
    ensure!(
        executes > 0 && test + executes == prod,
        "what the test server did not execute is not all counted: prod {prod} executes, test \
         {test}, counted {executes}"
    );
    ensure!(
        whole.new_errors().is_empty(),
        "the test server failed statements production ran:\n{whole}"
    );
    ensure!(
        summary.contains(
            "protocol layer: executes dropped prepared before pickup (statements prepared before \
             the copier saw the connection: --prod-dsn recovers them)"
        ),
        "the summary does not explain the loss:\n{summary}"
    );
    Ok(())
}

/// A test server that falls far behind production (here: its mariadbd stopped under 8 sysbench
/// threads until the copier holds commands back on every connection, each owing it more than
/// the copier keeps in flight) is waited for, not given up: once it runs again it executes
/// everything production did. The copier has no `--mysql-default-user`, so a session it gave
/// up could not be picked up again.
#[test]
fn a_test_server_far_behind_production_catches_up() -> Result<()> {
    const METRICS: &str = "127.0.0.1:9562";
    const THREADS: u64 = 8;
    let lab = Lab::up("behind")?;
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec![
            "--mysql-credentials".into(),
            creds,
            "--metrics".into(),
            METRICS.into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let pidfile = lab.var("LAB_TEST_PIDFILE").to_string();
    let pid = std::fs::read_to_string(&pidfile)?.trim().to_string();
    let signal = |sig: &str| -> Result<()> {
        let st = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()?;
        ensure!(
            st.success(),
            "kill {sig} {pid} (the test server's mariadbd) failed"
        );
        Ok(())
    };
    // By count, not by time: 800 transactions of 14 executes per connection, so that every
    // connection gets more than 4,096 commands ahead of a stopped test server however fast or
    // slow this machine runs them.
    let load = Load {
        threads: THREADS as u32,
        time_secs: 0,
        extra: vec![format!("--events={}", THREADS * 800)],
        ..Load::default()
    };
    let holds = || -> Result<u64> {
        let samples = lab.scrape(Host::Prod, METRICS)?;
        let name = [("name", "test_behind_holds")];
        Ok(sample(&samples, "tcpshadow_copier_protocol_events_total", &name).unwrap_or(0.0) as u64)
    };
    let test0 = lab.work(Host::Test)?;
    let (window, stopped, held) = std::thread::scope(|s| -> Result<(Window, Duration, u64)> {
        let run = s.spawn(|| mirrored_load(&lab, &load));
        // Every session logged in and prepared on the test server before it stops (a login
        // held by a stopped server is another case): about ten transactions per connection.
        lab.wait_work(
            Host::Test,
            &test0,
            "Com_stmt_execute",
            THREADS * 140,
            Duration::from_secs(60),
        )?;
        signal("-STOP")?;
        let at = std::time::Instant::now();
        let held = wait_for(
            "every connection to owe the stopped test server more than the copier keeps in \
             flight (its metric test_behind_holds at 8)",
            Duration::from_millis(200),
            Duration::from_secs(120),
            || {
                let h = holds()?;
                Ok(if h >= THREADS { Ok(h) } else { Err(h) })
            },
        );
        let stopped = at.elapsed();
        signal("-CONT")?;
        let held = held?;
        Ok((run.join().expect("load thread")?, stopped, held))
    })?;
    let (copier, _) = mirror.stop()?;
    let summary = copier.stderr;
    // Behind by design when the load ends: only the whole window is held to the bars.
    let own = OwnStatements::default();
    let (in_step, whole) = (window.in_step(&own)?, window.whole(&own)?);
    println!(
        "test server stopped {:.1} s, holds {held}; when the load ended:\n{in_step}\nonce it \
         caught up:\n{whole}",
        stopped.as_secs_f64()
    );
    let figures = whole.check(0.999, 1.001);
    println!("{summary}");
    figures.context("after falling behind")?;
    ensure!(
        !summary.contains("protocol_errors="),
        "the copier gave sessions up:\n{summary}"
    );
    Ok(())
}
