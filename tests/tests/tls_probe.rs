//! Issue 21's TLS plaintext probe (`copier::tls`) against a real production server that offers
//! TLS (`LAB_TLS=1`): attached from inside the production host (its network namespace) by the
//! test tool `tls-probe-dump`, while sysbench runs `oltp_read_only --mysql-ssl=on`.
//!
//! What must hold: every connection sysbench opened is a stream that starts at its
//! HandshakeResponse (sequence id 2: the first packet the client sends inside TLS) and carries
//! its prepared-statement executes, resolved to the connection's own 4-tuple (the client's
//! address in the lab's client namespace, production's address and port), with no byte lost,
//! truncated or unresolved; a TLS session opened before the probe is joined midway, from its
//! next call on. Short sessions (over TCP, and over the server's Unix socket) are told in the
//! kernel, never unresolved. Without CAP_BPF / CAP_PERFMON attaching fails with a reason that
//! names them; an unprivileged user with exactly the copier unit's four probe capabilities
//! attaches.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tcpshadow_tests::{Host, Lab, Load};

const DUMP: &str = env!("CARGO_BIN_EXE_tls-probe-dump");

/// One `stream ...` line of tls-probe-dump.
#[derive(Debug)]
struct Stream {
    fields: std::collections::BTreeMap<String, String>,
}

impl Stream {
    fn parse(line: &str) -> Option<Stream> {
        let rest = line.strip_prefix("stream ")?;
        let fields = rest
            .split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(Stream { fields })
    }
    fn get(&self, k: &str) -> &str {
        self.fields.get(k).map_or("", String::as_str)
    }
    fn command_count(&self, cmd: &str) -> u64 {
        self.get("commands")
            .split(',')
            .filter_map(|c| c.split_once(':'))
            .filter(|(c, _)| *c == cmd)
            .filter_map(|(_, n)| n.parse::<u64>().ok())
            .sum()
    }
}

fn stat(stats: &str, key: &str) -> Result<u64> {
    stats
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("no {key} in {stats:?}"))
}

#[test]
fn tls_sessions_plaintext_with_their_four_tuples() -> Result<()> {
    let lab = Lab::up_with("tlsprb", &[("LAB_TLS", "1")])?;
    let stop = format!("{}/tls-probe-stop", lab.var("LAB_DIR"));
    // The counters are read outside the probe's window: each read is a short session on the
    // local socket (TLS too, when offered), over before a drain can resolve its fd.
    let before = lab.counters(Host::Prod)?;
    // A TLS session open before the probe attaches: it is joined midway, at the server's
    // answer to its first statement (the fd learnt from the write inside SSL_write). It stays
    // open a second after that, as a pooled connection would: a session whose fd is closed
    // before a drain has seen it with its fd cannot be resolved from /proc any more (its fd
    // number may be another connection's by then), and is counted as unresolved instead.
    let password = format!("-p{}", lab.var("LAB_PASSWORD"));
    let early = lab.spawn(
        Host::Client,
        &[
            "mariadb",
            "--ssl",
            "-h",
            lab.ip(Host::Prod),
            "-u",
            lab.var("LAB_USER"),
            &password,
            lab.var("LAB_DB"),
            "-e",
            "SELECT SLEEP(4); SELECT 'after the attach'; SELECT SLEEP(1)",
        ],
    )?;
    std::thread::sleep(Duration::from_millis(500));
    // Once attached it keeps only the capabilities resolving fds needs, as a daemon would.
    let mut dump = lab.spawn(Host::Prod, &[DUMP, "3306", &stop, "120", "--drop-caps"])?;
    dump.wait_for_output("attached: ", Duration::from_secs(30))?;
    let threads = 2;
    let report = lab.load(&Load {
        threads,
        time_secs: 4,
        extra: vec!["--mysql-ssl=on".into()],
        ..Load::default()
    })?;
    let early = early.finish(Duration::from_secs(20))?;
    ensure!(
        early.success() && early.stdout.contains("after the attach"),
        "the early session failed:\n{}\n{}",
        early.stdout,
        early.stderr
    );
    std::fs::write(&stop, b"")?;
    let run = dump.finish(Duration::from_secs(30))?;
    let after = lab.counters(Host::Prod)?;
    ensure!(
        run.success(),
        "tls-probe-dump failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    ensure!(!out.contains("target gone"), "{out}");
    // The early session was open at attach: the probe watches syscalls for its fd.
    ensure!(out.contains("(learning fds: yes)"), "{out}");
    ensure!(
        report.queries > 0 && report.errors == 0,
        "sysbench: {}",
        report.output
    );

    // Every connection to production during the load (the second counters read's own
    // connection, over the local socket, is counted in it too, not seen by the probe).
    // One of them is the early session, opened before the probe.
    let connections = after.delta(&before, "Connections").saturating_sub(1);
    ensure!(
        connections > u64::from(threads),
        "production saw {connections} connections for {threads} sysbench threads and one more"
    );
    let streams: Vec<Stream> = out.lines().filter_map(Stream::parse).collect();
    let logins: Vec<&Stream> = streams
        .iter()
        .filter(|s| s.get("first_seq") == "2")
        .collect();
    ensure!(
        logins.len() as u64 == connections - 1,
        "{} streams start with a HandshakeResponse, production had {} new connections:\n{out}",
        logins.len(),
        connections - 1
    );
    let joined: Vec<&Stream> = streams.iter().filter(|s| s.get("joined") == "1").collect();
    ensure!(
        joined.len() == 1 && streams.len() == logins.len() + 1,
        "one stream joined midway, every other one from its HandshakeResponse:\n{out}"
    );
    // The joined session: its next statements (COM_QUERY) and its COM_QUIT, on its 4-tuple.
    let j = joined[0];
    ensure!(
        j.command_count("03") == 2
            && j.command_count("01") == 1
            && j.get("gaps") == "0"
            && j.get("server") == format!("{}:3306", lab.ip(Host::Prod))
            && j.get("client")
                .starts_with(&format!("{}:", lab.ip(Host::Client))),
        "joined stream: {j:?}"
    );
    let client_ip = lab.ip(Host::Client);
    let server = format!("{}:3306", lab.ip(Host::Prod));
    let mut clients = std::collections::BTreeSet::new();
    for s in &logins {
        let client = s.get("client");
        ensure!(
            client
                .rsplit_once(':')
                .is_some_and(|(ip, _)| ip == client_ip),
            "stream's client {client} is not the lab's client {client_ip}:\n{out}"
        );
        ensure!(
            s.get("server") == server,
            "stream's server is not {server}:\n{out}"
        );
        ensure!(
            clients.insert(client.to_string()),
            "two streams of {client}:\n{out}"
        );
        ensure!(s.get("user") == "sbtest", "HandshakeResponse user: {s:?}");
        ensure!(
            s.get("joined") == "0" && s.get("gaps") == "0",
            "stream: {s:?}"
        );
        // COM_STMT_EXECUTE (0x17) or COM_QUERY (0x03): sysbench's statements.
        ensure!(
            s.command_count("17") + s.command_count("03") > 0,
            "a stream without queries: {s:?}"
        );
    }
    // The executes the probe saw are the ones production executed.
    let executes: u64 = logins.iter().map(|s| s.command_count("17")).sum();
    let executed = after.delta(&before, "Com_stmt_execute");
    ensure!(
        executes == executed,
        "the probe saw {executes} COM_STMT_EXECUTE, production executed {executed}:\n{out}"
    );

    let stats = out
        .lines()
        .find(|l| l.starts_with("stats "))
        .context("no stats line")?;
    for key in [
        "lost_records",
        "lost_bytes",
        "truncated_bytes",
        "unresolved_chunks",
        "bad_records",
        "foreign_calls",
    ] {
        ensure!(stat(stats, key)? == 0, "{key} is not 0: {stats}");
    }
    // Every session closed before the tool stopped: each close came through the server's
    // libc close() probe.
    ensure!(
        stat(stats, "fds_closed")? == connections,
        "fds_closed != {connections}: {stats}"
    );
    ensure!(
        stat(stats, "streams_started")? == connections - 1 && stat(stats, "streams_joined")? == 1,
        "streams_started != {} or streams_joined != 1: {stats}",
        connections - 1
    );
    Ok(())
}

#[test]
fn attach_fails_without_cap_bpf_and_works_with_the_units_capabilities() -> Result<()> {
    let lab = Lab::up_with("tlsnoc", &[("LAB_TLS", "1")])?;
    let stop = format!("{}/tls-probe-stop", lab.var("LAB_DIR"));
    let run = lab.exec(
        Host::Prod,
        &[
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-bpf,-perfmon,-sys_admin",
            DUMP,
            "3306",
            &stop,
            "1",
        ],
    )?;
    ensure!(!run.success(), "attached without CAP_BPF:\n{}", run.stdout);
    ensure!(
        run.stdout.contains("not attached: ")
            && run.stdout.contains("CAP_BPF")
            && run.stdout.contains("CAP_PERFMON")
            && run.stdout.contains("fix:"),
        "the reason does not name the capabilities and the fix:\n{}\n{}",
        run.stdout,
        run.stderr
    );

    // An unprivileged user (another one than the server's) with exactly CAP_BPF, CAP_PERFMON,
    // CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, as the copier's unit gives: it attaches. (The
    // tool is copied where that user can run it.)
    let dir = std::env::temp_dir().join(format!("tcpshadow-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let dump = dir.join("tls-probe-dump");
    std::fs::copy(DUMP, &dump)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let caps = "+bpf,+perfmon,+sys_ptrace,+dac_read_search";
    let run = lab.exec(
        Host::Prod,
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps=-all,{caps}"),
            &format!("--ambient-caps=-all,{caps}"),
            &format!("--bounding-set=-all,{caps}"),
            "--no-new-privs",
            dump.to_str().context("path")?,
            "3306",
            &stop,
            "1",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    let run = run?;
    ensure!(
        run.success() && run.stdout.contains("attached: "),
        "with the unit's capabilities: {}\n{}",
        run.stdout,
        run.stderr
    );
    Ok(())
}

/// A ring too small for the load: records are lost, counted by the probe, and each lost byte
/// that a later chunk follows shows as a jump of that stream's offsets, never as bytes moved
/// or run together. Then the server restarts: `target_alive` says the probe's target is gone.
#[test]
fn a_full_ring_loses_bytes_where_the_offsets_say() -> Result<()> {
    let lab = Lab::up_with("tlsrng", &[("LAB_TLS", "1")])?;
    let stop = format!("{}/tls-probe-stop", lab.var("LAB_DIR"));
    // One page: no 16 KiB record fits, and a few small ones fill it between two drains.
    let mut dump = lab.spawn(Host::Prod, &[DUMP, "3306", &stop, "120", "--ring=4096"])?;
    // No connection at attach: no stream can join midway, so no syscall tracepoint.
    dump.wait_for_output("(learning fds: no)", Duration::from_secs(30))?;
    let report = lab.load(&Load {
        threads: 2,
        time_secs: 2,
        extra: vec!["--mysql-ssl=on".into()],
        ..Load::default()
    })?;
    // A restarted server is another process: the probe says its target is gone.
    let restart = lab
        .command(&["restart", "prod"])
        .output()
        .context("lab.sh restart prod")?;
    ensure!(
        restart.status.success(),
        "lab.sh restart prod: {}",
        String::from_utf8_lossy(&restart.stderr)
    );
    std::fs::write(&stop, b"")?;
    let run = dump.finish(Duration::from_secs(30))?;
    ensure!(
        run.success(),
        "tls-probe-dump failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    ensure!(report.errors == 0, "sysbench: {}", report.output);
    ensure!(
        run.stdout.contains("target gone"),
        "the probe did not see its server restart:\n{}",
        run.stdout
    );
    let out = &run.stdout;
    let stats = out
        .lines()
        .find(|l| l.starts_with("stats "))
        .context("no stats line")?;
    let lost = stat(stats, "lost_bytes")? + stat(stats, "truncated_bytes")?;
    let gaps: u64 = out
        .lines()
        .filter_map(Stream::parse)
        .map(|s| s.get("gap_bytes").parse::<u64>().unwrap_or(0))
        .sum();
    ensure!(
        stat(stats, "lost_records")? > 0 && gaps > 0,
        "a one-page ring lost nothing:\n{out}"
    );
    // A loss at the very end of a stream has no later chunk to show it: gaps <= lost.
    ensure!(
        gaps <= lost,
        "offsets jump over {gaps} bytes, the probe lost {lost}:\n{out}"
    );
    ensure!(stat(stats, "bad_records")? == 0, "{stats}");
    Ok(())
}

/// Short TLS sessions, each over before the tool's next drain could read /proc: several
/// `mariadb --ssl -e ...` in a row from the client host, and the lab's own session over the
/// server's Unix socket (a counters read). The probe tells each one's socket in the kernel at
/// `SSL_set_fd`, so every TCP one is a stream on its own 4-tuple (the one the server gives it
/// in the processlist) and the Unix one is counted as not TCP; none is unresolved, and none
/// goes to /proc, which the tool cannot read any more: it dropped every capability once
/// attached, as the copier does.
#[test]
fn short_sessions_are_told_in_the_kernel() -> Result<()> {
    let lab = Lab::up_with("tlsshr", &[("LAB_TLS", "1")])?;
    let stop = format!("{}/tls-probe-stop", lab.var("LAB_DIR"));
    let mut dump = lab.spawn(Host::Prod, &[DUMP, "3306", &stop, "120", "--drop-caps"])?;
    dump.wait_for_output("attached: ", Duration::from_secs(30))?;
    let password = format!("-p{}", lab.var("LAB_PASSWORD"));
    let sessions = 6;
    let mut peers = std::collections::BTreeSet::new();
    for _ in 0..sessions {
        // The server's own view of the client's address and port: its processlist.
        let run = lab.exec(
            Host::Client,
            &[
                "mariadb",
                "--ssl",
                "--batch",
                "--skip-column-names",
                "-h",
                lab.ip(Host::Prod),
                "-u",
                lab.var("LAB_USER"),
                &password,
                lab.var("LAB_DB"),
                "-e",
                "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
            ],
        )?;
        ensure!(
            run.success(),
            "a short session failed:\n{}\n{}",
            run.stdout,
            run.stderr
        );
        peers.insert(run.stdout.trim().to_string());
    }
    // Over the server's Unix socket, as root: TLS too (the server offers it), no TCP at all.
    lab.counters(Host::Prod)?;
    std::fs::write(&stop, b"")?;
    let run = dump.finish(Duration::from_secs(30))?;
    ensure!(
        run.success(),
        "tls-probe-dump failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    ensure!(
        out.contains("(needs /proc: no)"),
        "the probe should tell sockets in the kernel:\n{out}"
    );
    let server = format!("{}:3306", lab.ip(Host::Prod));
    let streams: Vec<Stream> = out.lines().filter_map(Stream::parse).collect();
    let clients: std::collections::BTreeSet<String> = streams
        .iter()
        .map(|s| s.get("client").to_string())
        .collect();
    ensure!(
        streams.len() == sessions && clients == peers,
        "{sessions} short sessions from {peers:?}, the probe has streams of {clients:?}:\n{out}"
    );
    for s in &streams {
        ensure!(
            s.get("server") == server
                && s.get("first_seq") == "2"
                && s.get("joined") == "0"
                && s.get("gaps") == "0"
                && s.command_count("03") >= 1
                && s.command_count("01") == 1,
            "stream: {s:?}\n{out}"
        );
    }
    let stats = out
        .lines()
        .find(|l| l.starts_with("stats "))
        .context("no stats line")?;
    for key in [
        "unresolved_chunks",
        "unresolved_bytes",
        "from_proc",
        "lost_bytes",
        "bad_records",
    ] {
        ensure!(stat(stats, key)? == 0, "{key} is not 0: {stats}");
    }
    ensure!(
        stat(stats, "not_tcp_chunks")? > 0 && stat(stats, "told_by_kernel")? == sessions as u64 + 1,
        "the Unix-socket session is not counted as not TCP, or not every stream was told in \
         the kernel: {stats}"
    );
    // The figures, for a person reading the run (--nocapture).
    eprintln!("short sessions: {stats}");
    Ok(())
}
