//! Issue 8's closed control channel, in the lab: a mirrored MySQL load with every secret the
//! copier can be given (test-server passwords, a `--prod-dsn` password, the control channel's
//! `--secret-file`) leaves none of them in any log line, metrics scrape, report file or doctor
//! output; copiers without the secret, with a wrong one, or from outside `--allow` are refused
//! with one clear line on intercept (and a clear error of their own); and both daemons run with
//! no capability left once their sockets are open, in every thread.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, Mirror, MirrorOptions, CONTROL_PORT};
use tcpshadow_tests::work::Work;
use tcpshadow_tests::{Background, Host, Lab};

const COPIER_METRICS: &str = "127.0.0.1:9631";
const INTERCEPT_METRICS: &str = "127.0.0.1:9632";

/// Distinct, greppable secrets (the lab's own passwords equal its user and schema names).
const PROD_PASSWORD: &str = "GdProdPw-31c7a0e5";
const TEST_PASSWORD: &str = "GdTestPw-9e2b5a44";
const DSN_PASSWORD: &str = "GdDsnPw-6d04f8b2";
const SECRET: &str = "gd-secret-0f5e9a7c2b41d8e3";
const WRONG_SECRET: &str = "gd-wrong-secret-77aa1c3d";

fn write_private(path: &Path, text: &str) -> Result<String> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path.to_string_lossy().into_owned())
}

/// `curl` inside the host's namespace (the endpoints listen on its loopback).
fn scrape(lab: &Lab, host: Host, addr: &str) -> Result<String> {
    let url = format!("http://{addr}/metrics");
    let run = lab.exec(host, &["curl", "-sS", "--fail", "--max-time", "5", &url])?;
    ensure!(run.success(), "curl {url} in {host}: {}", run.stderr);
    Ok(run.stdout)
}

/// The value of one sample line `name{labels} value` of a scrape.
fn sample(scrape: &str, series: &str) -> Option<u64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// (thread, CapEff, CapPrm, CapBnd) of every thread of `pid`.
fn thread_caps(pid: u32) -> Result<Vec<(String, u64, u64, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let e = e?;
        let text = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        };
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        if let (Some(eff), Some(prm), Some(bnd)) = (get("CapEff:"), get("CapPrm:"), get("CapBnd:"))
        {
            out.push((name, eff, prm, bnd));
        }
    }
    ensure!(!out.is_empty(), "no threads readable for pid {pid}");
    Ok(out)
}

/// CAP_SYS_NICE: what a copier at `--capture-priority auto` keeps when it cannot allow
/// itself RLIMIT_NICE instead (no CAP_SYS_RESOURCE, as in some containers), to raise its
/// capture when it falls behind. It must say so.
const CAP_SYS_NICE: u64 = 1 << 23;

/// Every thread of `b` has dropped every capability but `allowed`, bounding set included.
fn check_caps(what: &str, b: &Background, allowed: u64) -> Result<()> {
    let pid = b.pid().context("no pid")?;
    let caps = thread_caps(pid)?;
    for (name, eff, prm, bnd) in &caps {
        println!(
            "{what} pid {pid} thread {name}: CapEff={eff:016x} CapPrm={prm:016x} CapBnd={bnd:016x}"
        );
    }
    for (name, eff, prm, bnd) in &caps {
        ensure!(
            (eff | prm | bnd) & !allowed == 0,
            "{what} thread {name} still holds capabilities: CapEff={eff:x} CapPrm={prm:x} CapBnd={bnd:x}"
        );
    }
    Ok(())
}

const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_SYS_PTRACE: u64 = 1 << 19;

/// What the copier may keep: nothing, or what its log says it kept and why: CAP_SYS_NICE to
/// raise the capture, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH to tell TLS streams' sockets
/// from the server's /proc (issue 21's probe, when attached).
fn copier_allowed_caps(copier: &Background) -> u64 {
    let log = copier.output().1;
    let kept = log
        .lines()
        .find_map(|l| l.split("capabilities dropped: kept ").nth(1))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or("");
    let mut allowed = 0;
    if kept.contains("cap_sys_nice") && log.contains("raised to nice -20 while the capture is over")
    {
        allowed |= CAP_SYS_NICE;
    }
    if log.contains("are mirrored from their plaintext") {
        if kept.contains("cap_sys_ptrace") {
            allowed |= CAP_SYS_PTRACE;
        }
        if kept.contains("cap_dac_read_search") {
            allowed |= CAP_DAC_READ_SEARCH;
        }
    }
    allowed
}

/// A copier that must be refused at start: it exits with an error naming `expect`.
fn refused_copier(lab: &Lab, host: Host, extra: &[&str], expect: &str) -> Result<String> {
    let copier = release_bin("copier")?;
    let target = format!("{}:3306", lab.ip(Host::Test));
    let intercept = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    let mut args = vec![
        copier.to_str().context("path")?,
        "--port",
        "3306",
        "--interface",
        lab.var("LAB_IFACE"),
        "--target",
        &target,
        "--intercept",
        &intercept,
    ];
    args.extend(extra);
    let started = Instant::now();
    let run = lab.exec(host, &args)?;
    ensure!(
        !run.success(),
        "a refused copier ran on:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    ensure!(
        started.elapsed() < Duration::from_secs(4),
        "the refused copier took {:?} to give up",
        started.elapsed()
    );
    ensure!(
        run.stderr.contains(expect),
        "the refused copier does not say {expect:?}:\n{}",
        run.stderr
    );
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(expect))
        .unwrap_or_default()
        .to_string();
    println!("copier on {host}: {line}");
    Ok(run.stderr)
}

#[test]
fn no_secret_leaks_and_strangers_are_refused() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("gd")?;
    let dir = Path::new(lab.var("LAB_DIR")).to_path_buf();

    // An application account with its own password on each server, and a read-only account
    // for --prod-dsn.
    let create = |pw: &str| {
        format!(
            "CREATE USER 'gd_app'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('{pw}'); \
             GRANT ALL PRIVILEGES ON sbtest.* TO 'gd_app'@'%'; \
             CREATE USER 'gd_ro'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('{DSN_PASSWORD}'); \
             GRANT PROCESS, SELECT ON *.* TO 'gd_ro'@'%'"
        )
    };
    lab.sql(Host::Prod, &create(PROD_PASSWORD))?;
    lab.sql(Host::Test, &create(TEST_PASSWORD))?;
    let creds = write_private(
        &dir.join("gd-credentials"),
        &format!("gd_app:{TEST_PASSWORD}\n"),
    )?;
    let secret = write_private(&dir.join("gd-secret"), &format!("{SECRET}\n"))?;
    let wrong = write_private(&dir.join("gd-wrong-secret"), &format!("{WRONG_SECRET}\n"))?;
    let report = dir.join("gd-report");
    let prod = lab.ip(Host::Prod).to_string();
    let dsn = format!("mysql://gd_ro:{DSN_PASSWORD}@{prod}:3306");
    let client = |sql: &str| -> Vec<String> {
        [
            "mysql",
            "-h",
            &prod,
            "-u",
            "gd_app",
            &format!("-p{PROD_PASSWORD}"),
            "sbtest",
            "-e",
            sql,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // A connection open before the copier starts: picked up mid-stream, its state read with
    // --prod-dsn.
    let early_args = client("SELECT SLEEP(6); SELECT c FROM sbtest1 WHERE id = 3");
    let early_args: Vec<&str> = early_args.iter().map(String::as_str).collect();
    let prod0 = lab.work(Host::Prod)?;
    let early = lab.spawn(Host::Client, &early_args)?;
    // Open and inside its SLEEP on production before the copier starts.
    lab.wait_work(Host::Prod, &prod0, "Com_select", 1, Duration::from_secs(30))?;

    let opts = MirrorOptions {
        copier_args: vec![
            "--secret-file".into(),
            secret.clone(),
            "--mysql-credentials".into(),
            creds.clone(),
            "--mysql-default-user".into(),
            "gd_app".into(),
            "--mysql-default-db".into(),
            "sbtest".into(),
            "--prod-dsn".into(),
            dsn.clone(),
            "--report".into(),
            report.to_string_lossy().into_owned(),
            "--metrics".into(),
            COPIER_METRICS.into(),
        ],
        intercept_args: vec![
            "--secret-file".into(),
            secret.clone(),
            "--allow".into(),
            format!("{prod}/32"),
            "--metrics".into(),
            INTERCEPT_METRICS.into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    let Mirror {
        mut intercept,
        mut copier,
    } = mirror;
    copier.wait_for_output("capabilities dropped", Duration::from_secs(30))?;
    intercept.wait_for_output("capabilities dropped", Duration::from_secs(30))?;
    check_caps("copier", &copier, copier_allowed_caps(&copier))?;
    check_caps("intercept", &intercept, 0)?;

    // The mirrored load: fresh logins, each with a few statements.
    let (p0, t0) = (lab.work(Host::Prod)?, lab.work(Host::Test)?);
    for i in 0..30 {
        let args = client(&format!(
            "SELECT c FROM sbtest1 WHERE id = {}; SELECT COUNT(*) FROM sbtest2 WHERE id < {}",
            i + 1,
            100 + i
        ));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.exec_ok(Host::Client, &args)?;
    }
    let early = early.finish(Duration::from_secs(10))?;
    ensure!(early.success(), "the early client failed: {}", early.stderr);
    let deadline = Instant::now() + Duration::from_secs(10);
    let due = Work::between(&p0, &lab.work(Host::Prod)?)?.get("Com_select");
    let mut ran = Work::default();
    while Instant::now() < deadline {
        ran = Work::between(&t0, &lab.work(Host::Test)?)?;
        if ran.get("Com_select") >= 60 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let selects = ran.get("Com_select");
    println!("test server ran {selects} SELECTs of the {due} production ran (60 sent)");
    // Both bounds: a duplicate is as wrong as a loss; and none of them failed there.
    // Production's count may hold a few more than the test server's: the early connection's
    // --prod-dsn lookup runs SELECTs there.
    ensure!(
        (60..=due).contains(&selects) && ran.error_total() == 0,
        "the test server ran {selects} of {due} SELECTs, errors {:?}",
        ran.errors
    );

    // `copier doctor` with the same secrets, against the running intercept.
    let copier_bin = release_bin("copier")?;
    let target = format!("{}:3306", lab.ip(Host::Test));
    let listen = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    let doctor = lab.exec(
        Host::Prod,
        &[
            copier_bin.to_str().context("path")?,
            "doctor",
            "--target",
            &target,
            "--intercept",
            &listen,
            "--client-ip-pool",
            lab.var("LAB_POOL"),
            "--interface",
            lab.var("LAB_IFACE"),
            "--secret-file",
            &secret,
            "--mysql-credentials",
            &creds,
            "--prod-dsn",
            &dsn,
            "--probe-wait-ms",
            "1000",
        ],
    )?;
    let doctor_out = format!("{}\n{}", doctor.stdout, doctor.stderr);
    ensure!(
        doctor_out.contains("both hold the same secret"),
        "copier doctor did not complete the handshake:\n{doctor_out}"
    );
    // intercept probes ARP on the socket it opened before dropping CAP_NET_RAW.
    ensure!(
        !doctor_out.contains("cannot send ARP requests"),
        "the running intercept could not ARP-check after dropping its capabilities:\n{doctor_out}"
    );

    // Strangers.
    let mut refusals = String::new();
    refusals += &refused_copier(&lab, Host::Prod, &[], "--secret-file")?;
    refusals += &refused_copier(&lab, Host::Prod, &["--secret-file", &wrong], "bad secret")?;
    refusals += &refused_copier(
        &lab,
        Host::Client,
        &["--secret-file", &secret],
        "outside intercept's --allow",
    )?;

    let copier_scrape = scrape(&lab, Host::Prod, COPIER_METRICS)?;
    let series =
        |reason: &str| format!("tcpshadow_intercept_control_refused_total{{reason=\"{reason}\"}}");
    let reasons = ["no_secret", "bad_secret", "not_allowed"];
    // The endpoint is refreshed every second.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut intercept_scrape = scrape(&lab, Host::Assist, INTERCEPT_METRICS)?;
    while reasons
        .iter()
        .any(|r| sample(&intercept_scrape, &series(r)) != Some(1))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(250));
        intercept_scrape = scrape(&lab, Host::Assist, INTERCEPT_METRICS)?;
    }
    for reason in reasons {
        let got = sample(&intercept_scrape, &series(reason));
        println!("{} {got:?}", series(reason));
        ensure!(got == Some(1), "{} is {got:?}, expected 1", series(reason));
    }

    let copier_run = copier.finish(Duration::ZERO)?;
    let intercept_run = intercept.finish(Duration::ZERO)?;
    let ilog = &intercept_run.stderr;
    let client_ip = lab.ip(Host::Client);
    for (needle, from) in [
        ("refused: no secret", prod.as_str()),
        (
            "refused: bad secret (check --secret-file on both hosts)",
            prod.as_str(),
        ),
        ("refused: address not in --allow", client_ip),
    ] {
        let lines: Vec<&str> = ilog.lines().filter(|l| l.contains(needle)).collect();
        ensure!(
            lines.len() == 1,
            "intercept logged {} lines with {needle:?} (expected one):\n{ilog}",
            lines.len()
        );
        ensure!(
            lines[0].contains(&format!("copier {from}:")),
            "{needle:?} does not name the peer {from}: {}",
            lines[0]
        );
        println!("intercept: {}", lines[0]);
    }

    // Nothing anywhere holds a password or the secret.
    let mut haystacks: Vec<(String, String)> = vec![
        (
            "copier log".into(),
            format!("{}\n{}", copier_run.stdout, copier_run.stderr),
        ),
        (
            "intercept log".into(),
            format!("{}\n{}", intercept_run.stdout, intercept_run.stderr),
        ),
        ("copier metrics".into(), copier_scrape),
        ("intercept metrics".into(), intercept_scrape),
        ("copier doctor".into(), doctor_out),
        ("refused copiers".into(), refusals),
    ];
    let mut files = 0;
    for e in std::fs::read_dir(&report).context("the report directory")? {
        let path = e?.path();
        let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
        haystacks.push((path.display().to_string(), text));
        files += 1;
    }
    ensure!(files >= 3, "the report wrote {files} files");
    let mut bytes = 0;
    for (what, text) in &haystacks {
        bytes += text.len();
        for needle in [
            PROD_PASSWORD,
            TEST_PASSWORD,
            DSN_PASSWORD,
            SECRET,
            WRONG_SECRET,
        ] {
            ensure!(!text.contains(needle), "{what} contains {needle:?}");
        }
    }
    println!(
        "no password nor secret in {} outputs ({bytes} bytes): logs, metrics, {files} report \
         files, doctor",
        haystacks.len()
    );
    Ok(())
}
