//! Issue 21's acceptance: on a production server that offers TLS (the lab's `LAB_TLS=1`: a
//! certificate on both servers), TLS sessions are mirrored from the plaintext production's
//! own TLS library read and wrote (the copier's eBPF probe), and the test server executes what
//! production executed: the mariadb CLI (TLS by default when offered) and sysbench with
//! `--mysql-ssl=on` at 8 and 32 threads, with no error production did not have and no TLS
//! session left unmirrored. Without the capabilities the probe needs, the copier says why and
//! counts the TLS sessions as before.

use std::time::Duration;

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

/// The summary's value of a `name=N` or `N name` figure, if it says it.
fn summary_count(summary: &str, needle: &str) -> Option<u64> {
    let at = summary.find(needle)?;
    let before = summary[..at].trim_end();
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

#[test]
fn tls_sessions_are_mirrored_from_their_plaintext() -> Result<()> {
    let lab = Lab::up_with("tls", &[("LAB_TLS", "1")])?;
    let have = lab.sql(Host::Prod, "SELECT @@have_ssl")?;
    ensure!(
        have.trim() == "YES",
        "production offers no TLS: have_ssl={have}"
    );
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec!["--mysql-credentials".into(), creds],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;

    // The mariadb CLI over TLS: the cipher it shows proves the session is encrypted.
    let before = lab.work_both()?;
    let out = lab.exec_ok(
        Host::Client,
        &[
            "mariadb",
            "--no-defaults",
            "--ssl",
            "-h",
            lab.ip(Host::Prod),
            "-u",
            lab.var("LAB_USER"),
            &format!("-p{}", lab.var("LAB_PASSWORD")),
            "-N",
            "-e",
            "SHOW SESSION STATUS LIKE 'Ssl_cipher'; USE sbtest; SELECT COUNT(*) FROM sbtest1; \
             SELECT SUM(k) FROM sbtest2 WHERE id < 100; SELECT 42",
        ],
    )?;
    ensure!(out.contains("42"), "mariadb CLI output: {out}");
    ensure!(
        out.lines()
            .any(|l| l.starts_with("Ssl_cipher") && l.trim().len() > "Ssl_cipher".len()),
        "the CLI session is not TLS: {out}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let cli = lab
        .work_window(before, Duration::from_secs(5))?
        .whole(&OwnStatements::default())?;
    for c in tcpshadow_tests::work::KINDS {
        ensure!(
            cli.test.get(c) == cli.prod.get(c),
            "mariadb CLI session over TLS: {c} on test {} vs prod {}\n{cli}",
            cli.test.get(c),
            cli.prod.get(c)
        );
    }
    ensure!(cli.new_errors().is_empty(), "mariadb CLI session:\n{cli}");

    let secs = load_secs();
    for threads in [8u32, 32] {
        let load = Load {
            test: "oltp_read_only".into(),
            threads,
            time_secs: secs,
            extra: vec!["--mysql-ssl=on".into()],
            ..Load::default()
        };
        let (window, _) = lab.mirrored_load(&load)?;
        let what = format!("oltp_read_only over TLS, {threads} threads {secs} s");
        let figures = window.check(&OwnStatements::default());
        tcpshadow_tests::work::shown(&what, figures).context(what)?;
    }
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    let summary = &copier.stderr;
    ensure!(
        summary.contains("are mirrored from their plaintext"),
        "the probe did not attach:\n{summary}"
    );
    let mirrored = summary_count(summary, "sessions mirrored from their plaintext").unwrap_or(0);
    // The CLI's session and sysbench's 8 + 32 (each opens its connections once).
    ensure!(
        mirrored >= 41,
        "{mirrored} TLS sessions mirrored:\n{summary}"
    );
    ensure!(
        !summary.contains("not_mirrorable_tls"),
        "a TLS session was left alone:\n{summary}"
    );
    ensure!(summary.contains("losses: none"), "losses:\n{summary}");
    Ok(())
}

/// Without the capabilities the probe needs, the copier starts, says why TLS sessions are not
/// mirrored, counts them, and mirrors plain sessions as before.
#[test]
fn without_the_probes_capabilities_tls_sessions_are_counted_and_plain_ones_mirrored() -> Result<()>
{
    let lab = Lab::up_with("tlsno", &[("LAB_TLS", "1")])?;
    let creds = lab.credentials_file()?;
    let opts = MirrorOptions {
        copier_args: vec!["--mysql-credentials".into(), creds],
        copier_wrapper: vec![
            "setpriv".into(),
            "--bounding-set=-bpf,-perfmon,-sys_admin".into(),
            "--inh-caps=-bpf,-perfmon,-sys_admin".into(),
            "--".into(),
        ],
        ..Default::default()
    };
    let mirror = Mirror::start(&lab, &opts)?;
    // A plain session (TLS refused by the client) beside TLS ones.
    let before = lab.work_both()?;
    let out = lab.exec_ok(
        Host::Client,
        &[
            "mariadb",
            "--no-defaults",
            "--skip-ssl",
            "-h",
            lab.ip(Host::Prod),
            "-u",
            lab.var("LAB_USER"),
            &format!("-p{}", lab.var("LAB_PASSWORD")),
            "-N",
            "-e",
            "USE sbtest; SELECT COUNT(*) FROM sbtest1; SELECT 42",
        ],
    )?;
    ensure!(out.contains("42"), "mariadb CLI output: {out}");
    std::thread::sleep(Duration::from_millis(500));
    let plain = lab
        .work_window(before, Duration::from_secs(5))?
        .whole(&OwnStatements::default())?;
    for c in tcpshadow_tests::work::KINDS {
        ensure!(
            plain.test.get(c) == plain.prod.get(c),
            "plain session: {c} on test {} vs prod {}\n{plain}",
            plain.test.get(c),
            plain.prod.get(c)
        );
    }
    let load = Load {
        test: "oltp_read_only".into(),
        threads: 4,
        time_secs: 3,
        extra: vec!["--mysql-ssl=on".into()],
        ..Load::default()
    };
    lab.load(&load)?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);
    let summary = &copier.stderr;
    ensure!(
        summary.contains("are not mirrored (counted as not_mirrorable_tls)"),
        "no line saying why TLS sessions are not mirrored:\n{summary}"
    );
    ensure!(
        summary.contains("not_mirrorable_tls=4"),
        "the 4 TLS sessions not counted:\n{summary}"
    );
    Ok(())
}
