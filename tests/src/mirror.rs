//! Starts the real mirror (intercept on `assist`, or on `test` in on-test-host mode; copier on
//! `prod`) inside a lab.
//!
//! The binaries are built in release mode on first use (`cargo build --release`), so lab
//! figures reflect the code a user runs, not a debug build.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::{Background, Host, Lab, Run};

/// The workspace's release binary `name` (copier, intercept), built once per test process.
///
/// With `TCPSHADOW_RELEASE_BUILT=1` (set by `scripts/test.sh`, which has just built them) the
/// build is skipped: `cargo build` would wait for the target directory's lock while the doc
/// tests, run beside the lab tests, hold it.
pub fn release_bin(name: &str) -> Result<PathBuf> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let prebuilt = std::env::var_os("TCPSHADOW_RELEASE_BUILT").is_some_and(|v| v == "1");
    let built = BUILT.get_or_init(|| {
        if prebuilt {
            return Ok(());
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "build",
                "--release",
                "-p",
                "copier",
                "-p",
                "intercept",
                "--bins",
            ])
            .current_dir(&root)
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = built {
        bail!("cargo build --release of copier and intercept failed:\n{e}");
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let bin = target.join("release").join(name);
    if prebuilt && !bin.is_file() {
        bail!(
            "TCPSHADOW_RELEASE_BUILT=1 but {} is missing: run `cargo build --release -p copier \
             -p intercept --bins` first, or unset it",
            bin.display()
        );
    }
    Ok(bin)
}

/// Builds copier and intercept (release) now, so that a test's timing does not include the
/// build: a test that opens connections and then starts the mirror needs it up at once.
pub fn build() -> Result<()> {
    release_bin("copier").map(|_| ())
}

/// What to mirror.
#[derive(Clone, Debug)]
pub struct MirrorOptions {
    /// Production port (and the test server's port).
    pub port: u16,
    /// `--protocol tcp` for both daemons when set (a plain TCP service).
    pub plain_tcp: bool,
    /// `--client-ip-pool`, e.g. the lab's LAB_POOL.
    pub client_ip_pool: Option<String>,
    /// More copier arguments.
    pub copier_args: Vec<String>,
    /// More intercept arguments.
    pub intercept_args: Vec<String>,
    /// A command the copier runs under (e.g. `setpriv` with fewer capabilities).
    pub copier_wrapper: Vec<String>,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        Self {
            port: 3306,
            plain_tcp: false,
            client_ip_pool: None,
            copier_args: Vec::new(),
            intercept_args: Vec::new(),
            copier_wrapper: Vec::new(),
        }
    }
}

/// intercept on the assistant host, relaying port 3306's replies, listening on the lab's
/// control port; `extra` arguments appended. Returns once it waits for copiers.
pub fn start_intercept(lab: &Lab, extra: &[&str]) -> Result<Background> {
    start_intercept_on(lab, Host::Assist, 3306, extra)
}

/// intercept on `host`, relaying `port`'s replies, listening on `host`'s control port.
fn start_intercept_on(lab: &Lab, host: Host, port: u16, extra: &[&str]) -> Result<Background> {
    let bin = release_bin("intercept")?;
    let port = port.to_string();
    let listen = format!("{}:{CONTROL_PORT}", lab.ip(host));
    let mut args = vec![
        bin.to_str().context("path")?,
        "--port",
        &port,
        "--interface",
        lab.var("LAB_IFACE"),
        "--listen",
        &listen,
        "--status-interval",
        "5",
    ];
    args.extend(extra);
    let mut intercept = lab.spawn(host, &args)?;
    intercept.wait_for_output("waiting for copiers", Duration::from_secs(30))?;
    Ok(intercept)
}

/// `copier record` of port 3306 on the production host into `file`; returns once it records.
pub fn start_recorder(lab: &Lab, file: &str) -> Result<Background> {
    let copier = release_bin("copier")?;
    let mut recorder = lab.spawn(
        Host::Prod,
        &[
            copier.to_str().context("path")?,
            "record",
            "--port",
            "3306",
            "--output",
            file,
            "--status-interval",
            "5",
        ],
    )?;
    recorder.wait_for_output("recording port 3306", Duration::from_secs(30))?;
    Ok(recorder)
}

/// A running copier + intercept pair. Dropping it kills both; [`Mirror::stop`] stops them
/// gracefully and returns what they printed (the copier's summary).
pub struct Mirror {
    pub intercept: Background,
    pub copier: Background,
}

/// Control port intercept listens on in the lab.
pub const CONTROL_PORT: u16 = 36524;

impl Mirror {
    pub fn start(lab: &Lab, opts: &MirrorOptions) -> Result<Mirror> {
        Self::start_with_intercept_on(lab, opts, Host::Assist)
    }

    /// Like [`Mirror::start`] with intercept on `intercept_host`, where it also listens: `Test`
    /// for on-test-host mode (pass `--on-test-host` and its pool in `opts.intercept_args`).
    /// A parameter rather than a `MirrorOptions` field, so existing struct literals stay valid.
    pub fn start_with_intercept_on(
        lab: &Lab,
        opts: &MirrorOptions,
        intercept_host: Host,
    ) -> Result<Mirror> {
        let copier_bin = release_bin("copier")?;
        let port = opts.port.to_string();
        let listen = format!("{}:{CONTROL_PORT}", lab.ip(intercept_host));
        let mut intercept_args: Vec<&str> = Vec::new();
        if opts.plain_tcp {
            intercept_args.extend(["--protocol", "tcp"]);
        }
        intercept_args.extend(opts.intercept_args.iter().map(String::as_str));
        let intercept = start_intercept_on(lab, intercept_host, opts.port, &intercept_args)?;
        let target = format!("{}:{}", lab.ip(Host::Test), opts.port);
        let mut args: Vec<String> = opts.copier_wrapper.clone();
        args.extend([
            copier_bin.to_str().context("path")?.into(),
            "--port".into(),
            port.clone(),
            "--interface".into(),
            lab.var("LAB_IFACE").into(),
            "--target".into(),
            target,
            "--intercept".into(),
            listen,
            "--status-interval".into(),
            "5".into(),
        ]);
        if let Some(pool) = &opts.client_ip_pool {
            args.push("--client-ip-pool".into());
            args.push(pool.clone());
        }
        if opts.plain_tcp {
            args.extend(["--protocol".into(), "tcp".into()]);
        }
        args.extend(opts.copier_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut copier = lab.spawn(Host::Prod, &args)?;
        copier.wait_for_output(
            "control channel to intercept is up",
            Duration::from_secs(30),
        )?;
        Ok(Mirror { intercept, copier })
    }

    /// SIGTERM to the copier (it drains and prints its summary), then to intercept.
    pub fn stop(self) -> Result<(Run, Run)> {
        let copier = self.copier.finish(Duration::ZERO)?;
        let intercept = self.intercept.finish(Duration::ZERO)?;
        Ok((copier, intercept))
    }
}
