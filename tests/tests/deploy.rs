//! Acceptance of the deployment pieces (issue 7): the systemd units verify; both daemons start
//! from the example config files the way their units start them (ExecStartPre, then ExecStart,
//! as an unprivileged user holding only the unit's ambient capabilities), mirror traffic, take
//! SIGHUP, and exit cleanly on SIGTERM; the route helpers are idempotent and say what they did.
//!
//! There is no systemd running here (no PID 1 systemd in the container), so "supervision" is
//! this harness: it reads the unit files and does what systemd would do with them.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, CONTROL_PORT};
use tcpshadow_tests::{Background, Host, Lab};

fn repo() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    p.canonicalize().unwrap_or(p)
}

/// One unit file's `[Service]` settings (repeated keys keep every value).
fn unit(name: &str) -> Result<BTreeMap<String, Vec<String>>> {
    let path = repo().join("deploy/systemd").join(name);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_owned();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(format!("{section}{k}"))
                .or_default()
                .push(v.to_owned());
        }
    }
    Ok(out)
}

fn one<'a>(u: &'a BTreeMap<String, Vec<String>>, key: &str) -> Result<&'a str> {
    match u.get(&format!("[Service]{key}")).map(Vec::as_slice) {
        Some([v]) => Ok(v),
        other => bail!("unit: {key} should be set once, is {other:?}"),
    }
}

const DAEMONS: [&str; 2] = ["copier", "intercept"];

#[test]
fn units_are_sound_and_verify() -> Result<()> {
    for d in DAEMONS {
        let u = unit(&format!("tcpshadow-{d}.service"))?;
        let conf = format!("--config /etc/tcpshadow/{d}.toml");
        ensure!(
            one(&u, "ExecStart")? == format!("/usr/local/bin/{d} {conf}"),
            "{d}: ExecStart"
        );
        ensure!(one(&u, "ExecStartPre")?.ends_with(&format!("{conf} --print-config")));
        ensure!(one(&u, "ExecReload")? == "/bin/kill -HUP $MAINPID");
        ensure!(one(&u, "Restart")? == "on-failure");
        ensure!(one(&u, "RestartPreventExitStatus")? == "2");
        // A copier not running loses production's traffic for good: it restarts at once
        // (the fault tests restart it at once too), a crash loop bounded by the start limit.
        let restart_sec = one(&u, "RestartSec")?;
        ensure!(
            restart_sec.ends_with("ms") || restart_sec == "1s",
            "{d}: RestartSec={restart_sec}: at most 1 s"
        );
        ensure!(
            u.get("[Unit]StartLimitBurst").map(Vec::as_slice) == Some(&["5".to_owned()][..]),
            "{d}: [Unit] StartLimitBurst=5 bounds a crash loop"
        );
        ensure!(one(&u, "NoNewPrivileges")? == "yes");
        ensure!(one(&u, "DynamicUser")? == "yes");
        // The copier also attaches the TLS plaintext probe (issue 21: the unit's comment says
        // which capability is for what).
        let caps = match d {
            "copier" => {
                "CAP_NET_RAW CAP_NET_ADMIN CAP_BPF CAP_PERFMON CAP_SYS_PTRACE \
                 CAP_DAC_READ_SEARCH"
            }
            _ => "CAP_NET_RAW CAP_NET_ADMIN",
        };
        for key in ["AmbientCapabilities", "CapabilityBoundingSet"] {
            ensure!(one(&u, key)? == caps, "{d}: {key} must be exactly {caps}");
        }
        ensure!(one(&u, "StandardError")? == "journal");
        // Raw sockets and capture need the host's network and AF_PACKET.
        ensure!(
            !u.contains_key("[Service]PrivateNetwork"),
            "{d}: PrivateNetwork breaks capture"
        );
        ensure!(
            !u.contains_key("[Service]IPAddressDeny"),
            "{d}: IP filtering breaks mirroring"
        );
        ensure!(one(&u, "RestrictAddressFamilies")?.contains("AF_PACKET"));
    }

    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: structural checks only (scripts/install-deps.sh installs systemd)");
        return Ok(());
    };
    ensure!(out.status.success());
    // verify wants ExecStart's binary to exist: point the units at the built ones.
    let dir = std::env::temp_dir().join(format!("tcpshadow-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut files = Vec::new();
    for d in DAEMONS {
        let name = format!("tcpshadow-{d}.service");
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(&name))?;
        let bin = release_bin(d)?;
        let text = text.replace(
            &format!("/usr/local/bin/{d}"),
            bin.to_str().context("path")?,
        );
        let path = dir.join(&name);
        std::fs::write(&path, text)?;
        files.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&files)
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {}\n{err}",
        out.status
    );
    Ok(())
}

/// A daemon started as its unit would start it.
struct Service {
    name: &'static str,
    process: Background,
}

/// `setpriv` arguments for the unit's user and capabilities: DynamicUser means some unused
/// uid; `nobody` stands in for it.
fn privileges(u: &BTreeMap<String, Vec<String>>) -> Result<Vec<String>> {
    let caps: Vec<String> = one(u, "AmbientCapabilities")?
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect();
    let caps = caps.join(",");
    Ok(vec![
        "setpriv".into(),
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps=-all,{caps}"),
        format!("--ambient-caps=-all,{caps}"),
        format!("--bounding-set=-all,{caps}"),
        "--no-new-privs".into(),
    ])
}

/// The unit's command line `key`, with the installed paths mapped to this checkout's.
fn exec_line(
    d: &str,
    u: &BTreeMap<String, Vec<String>>,
    key: &str,
    config: &Path,
) -> Result<Vec<String>> {
    let bin = release_bin(d)?;
    Ok(one(u, key)?
        .split_whitespace()
        .map(|w| match w {
            w if w == format!("/usr/local/bin/{d}") => bin.display().to_string(),
            w if w == format!("/etc/tcpshadow/{d}.toml") => config.display().to_string(),
            w => w.to_owned(),
        })
        .collect())
}

fn start(
    lab: &Lab,
    host: Host,
    d: &'static str,
    config: &Path,
    env: &[(&str, String)],
    ready: &str,
) -> Result<Service> {
    let u = unit(&format!("tcpshadow-{d}.service"))?;
    let mut base: Vec<String> = vec!["env".into()];
    base.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    base.extend(privileges(&u)?);
    // ExecStartPre: the config must load (and is printed, as it would be to the journal).
    let mut pre = base.clone();
    pre.extend(exec_line(d, &u, "ExecStartPre", config)?);
    let pre: Vec<&str> = pre.iter().map(String::as_str).collect();
    let printed = lab.exec_ok(host, &pre)?;
    eprintln!("--- {d} ExecStartPre (effective configuration):\n{printed}");
    ensure!(printed.contains("# config file:"), "{printed}");
    // Each value's origin: the file, or the environment where the site overrides it.
    ensure!(
        printed.contains("status-interval = 5  # config file"),
        "{printed}"
    );
    for (k, _) in env {
        ensure!(
            printed.contains(&format!("# env {k}")),
            "{k} not shown:\n{printed}"
        );
    }
    let mut argv = base;
    argv.extend(exec_line(d, &u, "ExecStart", config)?);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut process = lab.spawn(host, &argv)?;
    process.wait_for_output(ready, Duration::from_secs(30))?;
    Ok(Service { name: d, process })
}

fn wait_output(s: &Background, needle: &str, timeout: Duration) -> Result<()> {
    let until = Instant::now() + timeout;
    loop {
        let (out, err) = s.output();
        if out.contains(needle) || err.contains(needle) {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("no {needle:?} within {timeout:?}:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(s: &Background, sig: &str) -> Result<()> {
    let pid = s.pid().context("process already gone")?;
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    ensure!(st.success(), "kill {sig} {pid}");
    Ok(())
}

#[test]
fn daemons_run_from_the_example_configs_as_their_units_start_them() -> Result<()> {
    // The test server checks no passwords, so mirrored logins work without credentials.
    let lab = Lab::up_with("dps", &[("LAB_TEST_MYSQLD_ARGS", "--skip-grant-tables")])?;
    // The example files, copied so that the SIGHUP step can edit one; readable by the
    // unprivileged user the daemons run as.
    let dir = PathBuf::from(lab.var("LAB_DIR")).join("etc-tcpshadow");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(lab.var("LAB_DIR"), std::fs::Permissions::from_mode(0o755))?;
    let mut configs = BTreeMap::new();
    for d in DAEMONS {
        let path = dir.join(format!("{d}.toml"));
        std::fs::copy(repo().join(format!("deploy/{d}.toml")), &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        configs.insert(d, path);
    }
    let listen = format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist));
    // The lab's addresses, as a site would set them: environment overrides of the file.
    let intercept = start(
        &lab,
        Host::Assist,
        "intercept",
        &configs["intercept"],
        &[("TCPSHADOW_INTERCEPT_LISTEN", listen.clone())],
        "waiting for copiers",
    )?;
    let copier = start(
        &lab,
        Host::Prod,
        "copier",
        &configs["copier"],
        &[
            ("TCPSHADOW_TARGET", format!("{}:3306", lab.ip(Host::Test))),
            ("TCPSHADOW_INTERCEPT", listen.clone()),
            ("TCPSHADOW_CLIENT_IP_POOL", lab.var("LAB_POOL").to_owned()),
            ("TCPSHADOW_INTERFACE", lab.var("LAB_IFACE").to_owned()),
        ],
        "control channel to intercept is up",
    )?;

    // A little traffic, mirrored.
    let before = lab.counters(Host::Test)?;
    for i in 0..5 {
        lab.exec_ok(
            Host::Client,
            &[
                "mariadb",
                "--no-defaults",
                "-h",
                lab.ip(Host::Prod),
                "-usbtest",
                "-psbtest",
                "-N",
                "-e",
                &format!("select {i} from sbtest1 limit 1"),
                "sbtest",
            ],
        )?;
    }
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = lab.counters(Host::Test)?;
        if now.delta(&before, "Com_select") >= 5 {
            break;
        }
        ensure!(
            Instant::now() < until,
            "the test server ran {} of the 5 mirrored selects:\n{:?}",
            now.delta(&before, "Com_select"),
            copier.process.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // SIGHUP: the log filter is applied at once, other changes are named for a restart.
    let text = std::fs::read_to_string(&configs["intercept"])?
        .replace("log = \"info\"", "log = \"debug\"")
        .replace("status-interval = 5", "status-interval = 7");
    std::fs::write(&configs["intercept"], text)?;
    signal(&intercept.process, "-HUP")?;
    wait_output(
        &intercept.process,
        "log filter is now \"debug\"",
        Duration::from_secs(5),
    )?;
    wait_output(
        &intercept.process,
        "`status-interval` changed",
        Duration::from_secs(5),
    )?;
    signal(&copier.process, "-HUP")?;
    wait_output(&copier.process, "unchanged", Duration::from_secs(5))?;

    // SIGTERM (systemctl stop): both exit 0, the copier after its summary.
    for s in [copier, intercept] {
        let run = s.process.stop()?;
        eprintln!("--- {} stopped: {}\n{}", s.name, run.status, run.stderr);
        ensure!(
            run.success(),
            "{} did not exit cleanly: {}\n{}",
            s.name,
            run.status,
            run.stderr
        );
        if s.name == "copier" {
            ensure!(
                run.stderr.contains("copier summary after"),
                "no summary:\n{}",
                run.stderr
            );
        } else {
            ensure!(run.stderr.contains("stopped by signal"), "{}", run.stderr);
        }
    }
    Ok(())
}

#[test]
fn route_helpers_are_idempotent_and_say_what_they_did() -> Result<()> {
    let lab = Lab::up("dpr")?;
    let script = repo().join("deploy/routes.sh");
    let script = script.to_str().context("path")?;
    let state = format!("ROUTES_STATE_DIR={}/routes-state", lab.var("LAB_DIR"));
    let sysctl_dir = format!("ROUTES_SYSCTL_DIR={}/sysctl.d", lab.var("LAB_DIR"));
    let routes = |host: Host, args: &[&str]| {
        let mut argv = vec!["env", &state, &sysctl_dir, script];
        argv.extend(args);
        let run = lab.exec(host, &argv)?;
        eprintln!(
            "--- [{host}] routes.sh {} -> {}\n{}{}",
            args.join(" "),
            run.status,
            run.stdout,
            run.stderr
        );
        Ok::<_, anyhow::Error>(run)
    };
    let pool = lab.var("LAB_POOL").to_owned();
    let assist = lab.ip(Host::Assist).to_owned();
    let test_args = |op: &'static str| vec!["test-host", op, "--pool", &pool, "--via", &assist];

    // The lab set the route itself: status is happy.
    let st = routes(Host::Test, &test_args("status"))?;
    ensure!(st.success() && st.stdout.contains(&format!("ok: {pool} via {assist}")));
    // Removed: status says so and fails.
    let del = routes(Host::Test, &test_args("del"))?;
    ensure!(del.success() && del.stdout.contains("removed"));
    let del = routes(Host::Test, &test_args("del"))?;
    ensure!(del.success() && del.stdout.contains("not present"));
    let st = routes(Host::Test, &test_args("status"))?;
    ensure!(!st.success() && st.stdout.contains("MISSING route"));
    // Added back, then again: the second run changes nothing.
    let mut add = test_args("add");
    add.push("--persist");
    let first = routes(Host::Test, &add)?;
    ensure!(
        first.success()
            && first.stdout.contains("added")
            && first.stdout.contains("rp_filter: 0 -> 2")
    );
    let again = routes(Host::Test, &add)?;
    ensure!(
        again.success()
            && !again.stdout.contains("->")
            && again.stdout.contains("(already)")
            && again.stdout.contains("unchanged"),
        "{}",
        again.stdout
    );
    let table = lab.exec_ok(Host::Test, &["ip", "route", "show", &pool])?;
    ensure!(table.contains(&format!("via {assist}")), "{table}");
    let persisted = std::fs::read_to_string(format!(
        "{}/sysctl.d/60-tcpshadow-test-host.conf",
        lab.var("LAB_DIR")
    ))?;
    ensure!(
        persisted.contains("net.ipv4.conf.eth0.rp_filter = 2"),
        "{persisted}"
    );
    ensure!(routes(Host::Test, &test_args("status"))?.success());

    // The assistant: forwarding and proxy ARP turned on, then set up, twice, then undone.
    lab.exec_ok(
        Host::Assist,
        &[
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.eth0.proxy_arp=1",
        ],
    )?;
    let st = routes(Host::Assist, &["assist-host", "status"])?;
    ensure!(!st.success() && st.stdout.contains("WRONG net.ipv4.ip_forward = 1"));
    let setup = routes(Host::Assist, &["assist-host", "setup"])?;
    ensure!(
        setup.success()
            && setup.stdout.contains("net.ipv4.ip_forward: 1 -> 0")
            && setup
                .stdout
                .contains("net.ipv4.conf.eth0.proxy_arp: 1 -> 0")
    );
    let again = routes(Host::Assist, &["assist-host", "setup"])?;
    ensure!(
        again.success() && !again.stdout.contains("->"),
        "{}",
        again.stdout
    );
    ensure!(routes(Host::Assist, &["assist-host", "status"])?.success());
    ensure!(
        lab.exec_ok(Host::Assist, &["sysctl", "-n", "net.ipv4.ip_forward"])?
            .trim()
            == "0"
    );
    let undo = routes(Host::Assist, &["assist-host", "undo"])?;
    ensure!(undo.success() && undo.stdout.contains("net.ipv4.ip_forward: 0 -> 1"));
    let undo = routes(Host::Assist, &["assist-host", "undo"])?;
    ensure!(undo.success() && undo.stdout.contains("nothing to restore"));
    ensure!(routes(Host::Assist, &["assist-host", "setup"])?.success());
    Ok(())
}
