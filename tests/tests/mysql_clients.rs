//! Real MariaDB clients through the mirror, beyond sysbench: a Connector/C program that
//! switches user (COM_CHANGE_USER) and resets its connection (COM_RESET_CONNECTION). The test
//! server keeps its accounts, so each switch must be re-authenticated with its own scramble.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use tcpshadow_tests::mirror::{Mirror, MirrorOptions};
use tcpshadow_tests::{Host, Lab};

/// Compiles tests/clients/change_user.c against Connector/C (libmariadb-dev).
fn build_change_user(dir: &Path) -> Result<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/change_user.c");
    let out = dir.join("change_user");
    let flags = Command::new("mariadb_config")
        .args(["--cflags", "--libs"])
        .output()
        .context(
            "mariadb_config not found: install libmariadb-dev (scripts/install-deps.sh does)",
        )?;
    ensure!(flags.status.success(), "mariadb_config failed");
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let status = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(flags.split_whitespace())
        .status()
        .context("cannot run cc")?;
    if !status.success() {
        bail!("compiling {} failed", src.display());
    }
    Ok(out)
}

/// `command_type` and `argument` rows of the test server's general log of this kind.
fn general_log(lab: &Lab, host: Host, kind: &str) -> Result<Vec<String>> {
    let rows = lab.sql(
        host,
        &format!(
            "SELECT argument FROM mysql.general_log WHERE command_type = '{kind}' \
             ORDER BY event_time"
        ),
    )?;
    Ok(rows
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect())
}

#[test]
fn change_user_and_reset_connection_are_mirrored_with_real_logins() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("chuser")?;
    let dir = PathBuf::from(lab.var("LAB_DIR"));
    let client = build_change_user(&dir)?;
    let creds = dir.join("test-credentials");
    std::fs::write(
        &creds,
        format!(
            "{}:{}\n{}:{}\n",
            lab.var("LAB_USER"),
            lab.var("LAB_PASSWORD"),
            lab.var("LAB_RO_USER"),
            lab.var("LAB_RO_PASSWORD")
        ),
    )?;
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600))?;
    for h in [Host::Prod, Host::Test] {
        lab.sql(
            h,
            "SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = 1",
        )?;
    }
    let aborted0 = lab.counters(Host::Test)?.get("Aborted_connects");
    let mirror = Mirror::start(
        &lab,
        &MirrorOptions {
            copier_args: vec![
                "--mysql-credentials".into(),
                creds.to_string_lossy().into_owned(),
            ],
            // The AuthSwitchRequest after COM_CHANGE_USER should reach the copier whole.
            intercept_args: vec!["--mysql-head".into(), "64".into()],
            ..Default::default()
        },
    )?;
    let out = lab.exec_ok(
        Host::Client,
        &[
            client.to_str().unwrap(),
            lab.ip(Host::Prod),
            "3306",
            lab.var("LAB_USER"),
            lab.var("LAB_PASSWORD"),
            lab.var("LAB_DB"),
            lab.var("LAB_RO_USER"),
            lab.var("LAB_RO_PASSWORD"),
        ],
    )?;
    println!("{out}");
    std::thread::sleep(Duration::from_secs(1));
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);

    for h in [Host::Prod, Host::Test] {
        lab.sql(h, "SET GLOBAL general_log = 0")?;
    }
    let queries = |h| general_log(&lab, h, "Query");
    let mirrored: Vec<String> = queries(Host::Test)?
        .into_iter()
        .filter(|q| q.contains("CURRENT_USER"))
        .collect();
    let original: Vec<String> = queries(Host::Prod)?
        .into_iter()
        .filter(|q| q.contains("CURRENT_USER"))
        .collect();
    ensure!(original.len() == 3, "prod's general log: {original:?}");
    ensure!(
        mirrored == original,
        "test executed {mirrored:?}, prod {original:?}"
    );
    let changes = general_log(&lab, Host::Test, "Change user")?;
    ensure!(
        changes.iter().any(|c| c.contains(lab.var("LAB_RO_USER"))),
        "no COM_CHANGE_USER to {} in the test server's general log: {changes:?}",
        lab.var("LAB_RO_USER")
    );
    let aborted = lab.counters(Host::Test)?.get("Aborted_connects") - aborted0;
    ensure!(aborted == 0, "{aborted} aborted connects on test");
    let errlog = std::fs::read_to_string(lab.var("LAB_TEST_ERRLOG")).unwrap_or_default();
    ensure!(
        !errlog.contains("Access denied"),
        "the test server denied a login:\n{errlog}"
    );
    ensure!(
        copier.stderr.contains("change_user=1") && copier.stderr.contains("reset_connection=1"),
        "the copier did not count the change of user and the reset:\n{}",
        copier.stderr
    );
    Ok(())
}
