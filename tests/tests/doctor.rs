//! Acceptance of the doctor (issue 7): each fault, injected into the lab, makes `copier doctor`
//! (and, where it is the assistant's, `intercept doctor`) fail with a line naming the cause and
//! the fix; the doctor passes again once it is fixed, with `deploy/routes.sh` where that is the
//! fix. The faults: missing route on test; ip_forward=1 on assist; strict rp_filter on test;
//! intercept not running; another host answering ARP for the client addresses; target set to
//! prod's own address.
//!
//! Issue 23: without `--client-ip-pool`, the doctor probes the reply path from the live clients
//! it sees querying production, and a client the test server does not route via the assistant
//! is a FAIL naming it, what the test server does with it and the route that fixes it.
//!
//! Each doctor run's output is printed (run with `--nocapture` to see the transcript).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use tcpshadow_tests::mirror::{release_bin, CONTROL_PORT};
use tcpshadow_tests::{Background, Host, Lab, Run};

fn routes_script() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/routes.sh");
    p.canonicalize().unwrap_or(p)
}

struct Doctor<'a> {
    lab: &'a Lab,
    copier: String,
    intercept: String,
    listen: String,
    target: String,
}

impl<'a> Doctor<'a> {
    fn new(lab: &'a Lab) -> Result<Self> {
        Ok(Doctor {
            lab,
            copier: release_bin("copier")?.to_str().context("path")?.to_owned(),
            intercept: release_bin("intercept")?
                .to_str()
                .context("path")?
                .to_owned(),
            listen: format!("{}:{CONTROL_PORT}", lab.ip(Host::Assist)),
            target: format!("{}:3306", lab.ip(Host::Test)),
        })
    }

    fn start_intercept(&self) -> Result<Background> {
        let mut b = self.lab.spawn(
            Host::Assist,
            &[
                &self.intercept,
                "--port",
                "3306",
                "--listen",
                &self.listen,
                "--interface",
                "any",
                "--status-interval",
                "0",
            ],
        )?;
        b.wait_for_output("waiting for copiers", Duration::from_secs(30))?;
        Ok(b)
    }

    /// `copier doctor` on prod with the lab's settings, `target` overridden if given.
    fn copier(&self, what: &str, target: Option<&str>) -> Result<Run> {
        let target = target.unwrap_or(&self.target);
        self.copier_with(
            what,
            &[
                "--target",
                target,
                "--client-ip-pool",
                self.lab.var("LAB_POOL"),
            ],
        )
    }

    /// `copier doctor` on prod with `args` (no pool unless they give one).
    fn copier_with(&self, what: &str, args: &[&str]) -> Result<Run> {
        let mut argv = vec![
            self.copier.as_str(),
            "doctor",
            "--intercept",
            &self.listen,
            "--interface",
            self.lab.var("LAB_IFACE"),
            "--probe-wait-ms",
            "2000",
        ];
        argv.extend(args);
        let run = self.lab.exec(Host::Prod, &argv)?;
        show(what, "copier doctor", &run);
        Ok(run)
    }

    fn intercept(&self, what: &str) -> Result<Run> {
        let run = self.lab.exec(
            Host::Assist,
            &[
                &self.intercept,
                "doctor",
                "--port",
                "3306",
                "--listen",
                &self.listen,
                "--interface",
                "any",
                "--server",
                self.lab.ip(Host::Test),
                "--arp-check",
                self.lab.var("LAB_POOL"),
            ],
        )?;
        show(what, "intercept doctor", &run);
        Ok(run)
    }

    fn routes(&self, host: Host, args: &[&str]) -> Result<String> {
        let script = routes_script();
        let state = format!("ROUTES_STATE_DIR={}/routes-state", self.lab.var("LAB_DIR"));
        let mut argv = vec!["env", &state, script.to_str().context("path")?];
        argv.extend(args);
        let out = self.lab.exec_ok(host, &argv)?;
        eprintln!("--- [{host}] deploy/routes.sh {}\n{out}", args.join(" "));
        Ok(out)
    }
}

fn show(what: &str, cmd: &str, run: &Run) {
    eprintln!(
        "--- {what}: {cmd} -> {}\n{}{}",
        run.status, run.stdout, run.stderr
    );
}

fn fail_lines(run: &Run) -> Vec<&str> {
    run.stdout
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .collect()
}

fn passes(run: &Run) -> Result<()> {
    ensure!(
        run.success() && fail_lines(run).is_empty(),
        "expected the doctor to pass:\n{}{}",
        run.stdout,
        run.stderr
    );
    Ok(())
}

/// Fails with exit status 1 and a FAIL line on `check` holding every one of `words`.
fn fails(run: &Run, check: &str, words: &[&str]) -> Result<()> {
    ensure!(
        run.status.code() == Some(1),
        "expected exit status 1, got {}:\n{}",
        run.status,
        run.stdout
    );
    let lines = fail_lines(run);
    let hit = lines
        .iter()
        .any(|l| l.starts_with(&format!("FAIL  {check}:")) && words.iter().all(|w| l.contains(w)));
    ensure!(
        hit,
        "no FAIL line on `{check}` with {words:?}; FAIL lines:\n{}",
        lines.join("\n")
    );
    Ok(())
}

#[test]
fn doctor_names_each_fault_and_passes_once_fixed() -> Result<()> {
    let lab = Lab::up("dpd")?;
    let d = Doctor::new(&lab)?;
    let pool = lab.var("LAB_POOL").to_string();
    let assist = lab.ip(Host::Assist).to_string();
    let prod = lab.ip(Host::Prod).to_string();
    let mut intercept = d.start_intercept()?;

    // Healthy: every check passes, on both sides.
    passes(&d.copier("healthy", None)?)?;
    passes(&d.intercept("healthy")?)?;

    // 1. The target is production's own address.
    let own = format!("{prod}:3306");
    let run = d.copier("target = prod", Some(&own))?;
    fails(
        &run,
        "target",
        &[
            &prod,
            "production server itself",
            "point --target at the test server",
        ],
    )?;
    passes(&d.copier("target fixed", None)?)?;

    // 2. The test server has no route for the pool via the assistant.
    lab.exec_ok(Host::Test, &["ip", "route", "del", &pool])?;
    let run = d.copier("route missing on test", None)?;
    fails(
        &run,
        "probe SYN",
        &[
            "did not reach intercept",
            &format!("no route for {pool} via the assistant"),
            &format!("routes.sh test-host add --pool {pool} --via {assist}"),
        ],
    )?;
    let status = d.lab.exec(
        Host::Test,
        &[
            routes_script().to_str().context("path")?,
            "test-host",
            "status",
            "--pool",
            &pool,
            "--via",
            &assist,
        ],
    )?;
    ensure!(
        !status.success() && status.stdout.contains("MISSING route"),
        "{}",
        status.stdout
    );
    d.routes(
        Host::Test,
        &["test-host", "add", "--pool", &pool, "--via", &assist],
    )?;
    passes(&d.copier("route restored by routes.sh", None)?)?;

    // 3. The assistant forwards.
    lab.exec_ok(Host::Assist, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    let run = d.copier("ip_forward=1 on assist", None)?;
    fails(
        &run,
        "assistant ip_forward",
        &["forwards IPv4", "reset", "sysctl -w net.ipv4.ip_forward=0"],
    )?;
    let run = d.intercept("ip_forward=1 on assist")?;
    fails(&run, "ip_forward", &["forwards IPv4", "assist-host setup"])?;
    // The daemon itself says so when it starts, without being asked.
    let listen = format!("{}:{}", lab.ip(Host::Assist), CONTROL_PORT + 1);
    let mut second = lab.spawn(
        Host::Assist,
        &[&d.intercept, "--port", "3306", "--listen", &listen],
    )?;
    second.wait_for_output("waiting for copiers", Duration::from_secs(30))?;
    let second = second.stop()?;
    ensure!(
        second
            .stderr
            .contains("ip_forward: this host forwards IPv4 (net.ipv4.ip_forward=1"),
        "intercept started on a forwarding host without a warning:\n{}",
        second.stderr
    );
    d.routes(Host::Assist, &["assist-host", "setup"])?;
    passes(&d.copier("assist fixed by routes.sh", None)?)?;
    passes(&d.intercept("assist fixed by routes.sh")?)?;

    // 4. Strict rp_filter on test. With one interface it is harmless (the route to the pool
    // leaves by the interface the mirrored packets arrive on, which strict mode accepts), so
    // the test host gets a second link to the assistant, as a two-NIC test server would, and
    // its route to the pool takes it.
    let (test_ns, assist_ns) = (lab.netns(Host::Test), lab.netns(Host::Assist));
    let sh = |cmd: &str| -> Result<()> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .output()?;
        ensure!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    sh(&format!(
        "ip -n {test_ns} link add eth1 type veth peer name eth1 netns {assist_ns} && \
         ip -n {test_ns} link set eth1 up && ip -n {assist_ns} link set eth1 up && \
         ip -n {test_ns} route replace {pool} via {assist} dev eth1 onlink"
    ))?;
    passes(&d.copier("two-NIC test host, rp_filter off", None)?)?;
    // Strict on `all` and on the interface the mirrored packets arrive on (routes.sh set it
    // loose when it restored the route above).
    lab.exec_ok(
        Host::Test,
        &[
            "sysctl",
            "-qw",
            "net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.eth0.rp_filter=1",
        ],
    )?;
    let run = d.copier("strict rp_filter on test", None)?;
    fails(
        &run,
        "probe SYN",
        &["strict rp_filter on the test server", "rp_filter=2"],
    )?;
    let status = d.lab.exec(
        Host::Test,
        &[
            routes_script().to_str().context("path")?,
            "test-host",
            "status",
            "--pool",
            &pool,
            "--via",
            &assist,
            "--dev",
            "eth1",
            "--in-dev",
            "eth0",
        ],
    )?;
    ensure!(
        !status.success() && status.stdout.contains("STRICT rp_filter on eth0"),
        "{}",
        status.stdout
    );
    d.routes(
        Host::Test,
        &[
            "test-host",
            "add",
            "--pool",
            &pool,
            "--via",
            &assist,
            "--dev",
            "eth1",
            "--in-dev",
            "eth0",
        ],
    )?;
    passes(&d.copier("rp_filter loosened by routes.sh", None)?)?;
    sh(&format!("ip -n {test_ns} link del eth1"))?;
    d.routes(
        Host::Test,
        &["test-host", "add", "--pool", &pool, "--via", &assist],
    )?;
    passes(&d.copier("back to one NIC", None)?)?;

    // 5. intercept is not running.
    let stopped = intercept.stop()?;
    ensure!(
        stopped.success(),
        "intercept did not exit cleanly: {stopped:?}"
    );
    let run = d.copier("intercept not running", None)?;
    fails(
        &run,
        "intercept",
        &[
            "connection refused",
            "intercept is not running",
            "systemctl start",
        ],
    )?;
    intercept = d.start_intercept()?;
    passes(&d.copier("intercept restarted", None)?)?;

    // 6. Another host answers ARP for a client address of the pool.
    let octets: Vec<&str> = pool.split('/').next().unwrap_or("").split('.').collect();
    let stolen = format!("{}.{}.{}.77", octets[0], octets[1], octets[2]);
    lab.exec_ok(
        Host::Client,
        &["ip", "addr", "add", &format!("{stolen}/32"), "dev", "eth0"],
    )?;
    let run = d.copier("client host answers ARP for a pool address", None)?;
    fails(
        &run,
        "assistant arp",
        &[
            lab.var("LAB_CLIENT_MAC"),
            &stolen,
            "resets",
            "remove the address from that host",
        ],
    )?;
    let run = d.intercept("client host answers ARP for a pool address")?;
    fails(&run, "arp", &[lab.var("LAB_CLIENT_MAC"), &stolen])?;
    lab.exec_ok(
        Host::Client,
        &["ip", "addr", "del", &format!("{stolen}/32"), "dev", "eth0"],
    )?;
    passes(&d.copier("address removed", None)?)?;
    passes(&d.intercept("address removed")?)?;

    let stopped = intercept.stop()?;
    ensure!(
        stopped.success(),
        "intercept did not exit cleanly: {stopped:?}"
    );
    Ok(())
}

/// The lines of `run` on `check` at `level` (`ok`, `warn`, `FAIL`).
fn lines_of<'a>(run: &'a Run, level: &str, check: &str) -> Vec<&'a str> {
    let head = format!("{level:<4}  {check}:");
    run.stdout
        .lines()
        .filter(|l| l.starts_with(&head))
        .collect()
}

#[test]
fn doctor_probes_the_reply_path_from_the_live_clients() -> Result<()> {
    let lab = Lab::up("dlive")?;
    let d = Doctor::new(&lab)?;
    let client = lab.ip(Host::Client).to_string();
    let assist = lab.ip(Host::Assist).to_string();
    let host_route = format!("{client}/32");
    let target = d.target.clone();
    let no_pool = ["--target", target.as_str()];
    let _intercept = d.start_intercept()?;

    // No client queries production, and neither --client-ip-pool nor --probe-client: the
    // probe has no address to go from, and says which flag gives one.
    let run = d.copier_with("no live client", &no_pool)?;
    passes(&run)?;
    let skipped = lines_of(&run, "warn", "probe SYN");
    ensure!(
        skipped.len() == 1
            && skipped[0].contains("no live client seen")
            && skipped[0].contains("--probe-client IP"),
        "expected a warning naming --probe-client:\n{}",
        run.stdout
    );
    ensure!(
        !lines_of(&run, "warn", "live clients").is_empty(),
        "no warning that no client was seen:\n{}",
        run.stdout
    );

    // Real clients querying production, one connection after the other, as an application
    // with short-lived connections does.
    let query = format!(
        "while :; do mariadb --no-defaults -h {} -u{} -p{} -N -e \
         'SELECT COUNT(*) FROM sbtest1 WHERE id < 100' {} >/dev/null || exit 1; sleep 0.05; done",
        lab.ip(Host::Prod),
        lab.var("LAB_USER"),
        lab.var("LAB_PASSWORD"),
        lab.var("LAB_DB"),
    );
    let clients = lab.spawn(Host::Client, &["sh", "-c", &query])?;
    let before = lab.counters(Host::Prod)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lab.counters(Host::Prod)?.delta(&before, "Com_select") < 5 {
        if std::time::Instant::now() > deadline {
            bail!(
                "the clients' queries do not reach production: {:?}",
                clients.output()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Healthy: the probe SYN goes from the live client's own address and passes.
    let run = d.copier_with("live clients, routes in place", &no_pool)?;
    passes(&run)?;
    let seen = format!("1 client address, {client},");
    ensure!(
        lines_of(&run, "ok", "live clients")
            .iter()
            .any(|l| l.contains(&seen)),
        "the live client was not seen:\n{}",
        run.stdout
    );
    let from = format!("live client {client}:");
    ensure!(
        lines_of(&run, "ok", "probe SYN")
            .iter()
            .any(|l| l.contains(&from)),
        "the probe did not go from the live client:\n{}",
        run.stdout
    );

    // The test server loses its route for that client: it now delivers the replies on its
    // segment, straight to the client.
    lab.exec_ok(Host::Test, &["ip", "route", "del", &host_route])?;
    let run = d.copier_with("route for the live client removed on test", &no_pool)?;
    let routes_line = format!("deploy/routes.sh test-host add --pool {host_route} --via {assist}");
    let ip_route = format!("ip route replace {host_route} via {assist}");
    let not_routed = format!("does not route its replies for {client} to the assistant {assist}");
    let named = format!("live client {client} (seen sending to port 3306)");
    fails(
        &run,
        "probe SYN",
        &[
            &named,
            &not_routed,
            "reached intercept within",
            &format!("{} answers ARP for it", lab.var("LAB_CLIENT_MAC")),
            "hands its replies straight to that host",
            &routes_line,
            &ip_route,
        ],
    )?;

    // The same, for automation: one JSON document, the fix apart, the exit status alike.
    let mut json_args = no_pool.to_vec();
    json_args.push("--json");
    let run = d.copier_with("route removed, --json", &json_args)?;
    ensure!(
        run.status.code() == Some(1) && run.stdout.trim_start().starts_with('{'),
        "expected exit status 1 and a JSON document, got {}:\n{}",
        run.status,
        run.stdout
    );
    for field in [
        "\"schema\": \"tcpshadow.doctor/1\"",
        "\"status\": \"fail\"",
        "\"failed\": true",
        &format!("\"fix\": \"on the test server, `{routes_line}` (or `{ip_route}`)\""),
    ] {
        ensure!(run.stdout.contains(field), "no {field} in:\n{}", run.stdout);
    }

    // Restored with the line the doctor gave: it passes again.
    d.routes(
        Host::Test,
        &["test-host", "add", "--pool", &host_route, "--via", &assist],
    )?;
    let run = d.copier_with("route restored by routes.sh", &no_pool)?;
    passes(&run)?;
    ensure!(
        lines_of(&run, "ok", "probe SYN")
            .iter()
            .any(|l| l.contains(&from)),
        "the probe did not go from the live client:\n{}",
        run.stdout
    );
    let clients = clients.stop()?;
    ensure!(
        !clients.stderr.contains("ERROR"),
        "the clients' queries failed: {}",
        clients.stderr
    );
    Ok(())
}
