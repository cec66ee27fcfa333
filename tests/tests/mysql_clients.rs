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

/// Compiles tests/clients/NAME.c against Connector/C (libmariadb-dev) into `dir`.
fn build_client(dir: &Path, name: &str) -> Result<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("clients/{name}.c"));
    let out = dir.join(name);
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
    let client = build_client(&dir, "change_user")?;
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
            // intercept's defaults (--mysql-head 16), as a user runs it: the AuthSwitchRequest
            // after COM_CHANGE_USER must get through anyway.
            ..Default::default()
        },
    )?;
    let before = lab.work_both()?;
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
    lab.wait_test_caught_up(before, Duration::from_secs(2))?;
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

/// `n` bytes of `[a-z0-9]`, varied enough that nothing along the way could shortcut them.
fn filler(n: usize) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ALPHABET[(x >> 33) as usize % ALPHABET.len()]
        })
        .collect()
}

/// Issue 4: a command of 16 MiB and more (two MySQL packets, thousands of TCP segments) reaches
/// the test server intact; a session using the compressed protocol is left alone, counted, and
/// named once in the log with the client's address. Issue 21: a TLS session is mirrored from
/// production's plaintext (the copier's probe).
#[test]
fn big_commands_pass_intact_compressed_sessions_are_left_alone_and_tls_ones_mirrored() -> Result<()>
{
    tcpshadow_tests::mirror::build()?;
    // Production offers TLS (a self-signed certificate made for this test); both servers take
    // packets of up to 64 MiB.
    let certs = std::env::temp_dir().join(format!("tcpshadow-tls-{}", std::process::id()));
    std::fs::create_dir_all(&certs)?;
    let (cert, key) = (certs.join("cert.pem"), certs.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=tcpshadow-lab-prod", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("running openssl")?;
    ensure!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let prod_args = format!(
        "--max-allowed-packet=64M --ssl-cert={} --ssl-key={}",
        cert.display(),
        key.display()
    );
    let lab = Lab::up_with(
        "bigcmd",
        &[
            ("LAB_PROD_MYSQLD_ARGS", prod_args.as_str()),
            ("LAB_TEST_MYSQLD_ARGS", "--max-allowed-packet=64M"),
        ],
    );
    let _ = std::fs::remove_dir_all(&certs);
    let lab = lab?;
    for h in [Host::Prod, Host::Test] {
        lab.sql(
            h,
            "CREATE TABLE sbtest.tsd_big (id INT PRIMARY KEY, b LONGBLOB)",
        )?;
    }
    let creds = lab.credentials_file()?;
    let mirror = Mirror::start(
        &lab,
        &MirrorOptions {
            copier_args: vec!["--mysql-credentials".into(), creds],
            ..Default::default()
        },
    )?;

    // 17 MiB of value: a COM_QUERY of two MySQL packets (the first one 16 MiB - 1 bytes long).
    let dir = PathBuf::from(lab.var("LAB_DIR"));
    let file = dir.join("big.sql");
    let mut sql = b"INSERT INTO sbtest.tsd_big VALUES (1, '".to_vec();
    sql.extend_from_slice(&filler(17 << 20));
    sql.extend_from_slice(b"');\n");
    std::fs::write(&file, &sql)?;
    let client = |extra: &str, stdin_or_e: &str| -> Result<String> {
        lab.exec_ok(
            Host::Client,
            &[
                "bash",
                "-c",
                &format!(
                    "mariadb --no-defaults --max-allowed-packet=64M {extra} -h {} -u {} -p{} -N {stdin_or_e}",
                    lab.ip(Host::Prod),
                    lab.var("LAB_USER"),
                    lab.var("LAB_PASSWORD"),
                ),
            ],
        )
    };
    // MariaDB's client uses TLS whenever the server offers it: the two plain sessions say no.
    let before = lab.work_both()?;
    client("--skip-ssl", &format!("< {}", file.display()))?;
    client(
        "--skip-ssl --compress",
        "-e \"INSERT INTO sbtest.tsd_big VALUES (2, 'compressed')\"",
    )?;
    let cipher = client(
        "--ssl",
        "-e \"INSERT INTO sbtest.tsd_big VALUES (3, 'tls'); SHOW STATUS LIKE 'Ssl_cipher'\"",
    )?;
    ensure!(
        cipher
            .split_whitespace()
            .nth(1)
            .is_some_and(|c| !c.is_empty()),
        "the --ssl session did not use TLS: {cipher:?}"
    );
    // The compressed session's insert never reaches the test server: that kind waits out the
    // standstill.
    lab.wait_test_caught_up(before, Duration::from_secs(2))?;
    let (copier, _) = mirror.stop()?;
    println!("{}", copier.stderr);

    let rows = "SELECT id, LENGTH(b), MD5(b) FROM sbtest.tsd_big ORDER BY id";
    let (prod, test) = (lab.sql(Host::Prod, rows)?, lab.sql(Host::Test, rows)?);
    println!("prod:\n{prod}\ntest:\n{test}");
    let big = prod.lines().next().unwrap_or("");
    ensure!(
        big.starts_with(&format!("1\t{}\t", 17 << 20)),
        "prod's big row: {big:?}"
    );
    ensure!(
        prod.lines().count() == 3,
        "prod's rows (big, compressed, tls): {prod}"
    );
    let tls_row = prod.lines().nth(2).unwrap_or("");
    ensure!(
        test == format!("{big}\n{tls_row}"),
        "the test server must hold the big row exactly, the TLS session's row and nothing of \
         the compressed session: {test:?} vs prod's {prod:?}"
    );
    ensure!(
        !copier.stderr.contains("reply_structure_lost")
            && !copier.stderr.contains("reply_seq_mismatches"),
        "the replies to the big command (ids from 2 on) were not followed:\n{}",
        copier.stderr
    );
    ensure!(
        copier.stderr.contains("tls_sessions_from_plaintext=1")
            && !copier.stderr.contains("not_mirrorable_tls"),
        "the TLS session was not mirrored from its plaintext:\n{}",
        copier.stderr
    );
    let client_ip = lab.ip(Host::Client);
    ensure!(
        copier.stderr.contains("not_mirrorable_compression=1"),
        "the copier did not count not_mirrorable_compression=1:\n{}",
        copier.stderr
    );
    let said = format!("sessions from {client_ip} cannot be mirrored (compression)");
    ensure!(
        copier.stderr.matches(&said).count() == 1,
        "the log does not say once \"{said}\":\n{}",
        copier.stderr
    );
    Ok(())
}

/// A pooled Connector/C connection (prepared before the copier started) that then batches an
/// insert: Connector/C sends it as MariaDB's COM_STMT_BULK_EXECUTE, which the test server only
/// takes from a session that asked for bulk operations at login. The copier's own login for the
/// picked-up connection asks for it; `--prod-dsn` recovers the statement, and the bulk execute's
/// id is mapped like an execute's.
#[test]
fn a_pooled_connections_bulk_insert_is_mirrored() -> Result<()> {
    tcpshadow_tests::mirror::build()?;
    let lab = Lab::up("bulk")?;
    let dir = PathBuf::from(lab.var("LAB_DIR"));
    let client = build_client(&dir, "pooled_bulk")?;
    for h in [Host::Prod, Host::Test] {
        lab.sql(h, "CREATE TABLE sbtest.tsd_bulk (id INT PRIMARY KEY)")?;
    }
    let go = dir.join("bulk-go");
    let mut pooled = lab.spawn(
        Host::Client,
        &[
            client.to_str().context("path")?,
            lab.ip(Host::Prod),
            "3306",
            lab.var("LAB_USER"),
            lab.var("LAB_PASSWORD"),
            lab.var("LAB_DB"),
            go.to_str().context("path")?,
        ],
    )?;
    pooled.wait_for_output("prepared", Duration::from_secs(30))?;
    // MariaDB counts a COM_STMT_BULK_EXECUTE as one Com_stmt_execute, however many rows it
    // carries: one execute and three rows means the bulk command.
    let bulk = |h| -> Result<u64> { Ok(lab.counters(h)?.get("Com_stmt_execute")) };
    let (prod0, test0) = (bulk(Host::Prod)?, bulk(Host::Test)?);
    let before = lab.work_both()?;
    let mut copier_args = lab.pickup_args()?;
    copier_args.extend(["--prod-dsn".into(), lab.prod_dsn()]);
    let mirror = Mirror::start(
        &lab,
        &MirrorOptions {
            copier_args,
            ..Default::default()
        },
    )?;
    std::fs::write(&go, b"")?;
    let pooled = pooled.finish(Duration::from_secs(20))?;
    ensure!(pooled.success(), "the pooled client failed: {pooled:?}");
    lab.wait_test_caught_up(before, Duration::from_secs(2))?;
    let (copier, _) = mirror.stop()?;
    println!("{}\n{}", pooled.stdout, copier.stderr);
    let (prod_bulk, test_bulk) = (bulk(Host::Prod)? - prod0, bulk(Host::Test)? - test0);
    ensure!(
        prod_bulk == 1,
        "Connector/C sent {prod_bulk} executes to production, not one bulk execute: the test \
         proves nothing"
    );
    ensure!(
        test_bulk == 1,
        "the test server ran {test_bulk} executes, not one bulk execute"
    );
    let rows = "SELECT GROUP_CONCAT(id ORDER BY id) FROM sbtest.tsd_bulk";
    let (on_prod, on_test) = (lab.sql(Host::Prod, rows)?, lab.sql(Host::Test, rows)?);
    ensure!(
        on_prod == "1,2,3" && on_test == on_prod,
        "rows: prod {on_prod:?}, test {on_test:?}"
    );
    ensure!(
        copier.stderr.contains("recovered_statements=1") && copier.stderr.contains("losses: none"),
        "the copier did not recover the statement, or counted a loss:\n{}",
        copier.stderr
    );
    Ok(())
}
