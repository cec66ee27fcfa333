//! Lab helpers for integration tests.
//!
//! [`Lab`] drives `deploy/lab/lab.sh`: [`Lab::up`] builds a lab under a unique name (network
//! namespaces `<name>-client|prod|test|assist|br`, two MariaDB servers with identical data; prod2
//! and test2 too with `LAB_PROD2=1`, `LAB_TEST2=1` given to [`Lab::up_with`]), the
//! methods run commands in its hosts, and dropping the `Lab` tears it down, also when the test
//! panics. Labs need root; without it [`Lab::up`] fails with a message saying so.
//!
//! ```no_run
//! use tcpshadow_tests::{Host, Lab};
//! let lab = Lab::up("demo").unwrap();
//! let one = lab
//!     .exec_ok(Host::Client, &["mariadb", "-h", lab.ip(Host::Prod), "-usbtest", "-psbtest", "-N", "-e", "select 1"])
//!     .unwrap();
//! assert_eq!(one.trim(), "1");
//! ```

pub mod mirror;
pub mod work;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The lab script, `deploy/lab/lab.sh` of this repository.
pub fn lab_script() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/lab/lab.sh");
    path.canonicalize().unwrap_or(path)
}

/// The A/B experiments' sysbench script, `deploy/lab/ab.lua` (a [`Load::test`] of its own).
pub fn ab_load_script() -> String {
    lab_script()
        .with_file_name("ab.lua")
        .to_string_lossy()
        .into_owned()
}

/// Effective user id of this process, from `/proc/self/status`.
pub fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

pub fn is_root() -> bool {
    euid() == Some(0)
}

/// Fails with a clear message unless running as root.
pub fn require_root() -> Result<()> {
    if is_root() {
        return Ok(());
    }
    bail!(
        "the lab integration tests need root (they create network namespaces and run MariaDB \
         servers): run them as root, e.g. `sudo ./scripts/test.sh` or \
         `sudo -E cargo test -p tcpshadow-tests`"
    )
}

/// A host of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    Client,
    Prod,
    Test,
    Assist,
    /// The namespace holding the bridge.
    Bridge,
    /// The optional second production host (`LAB_PROD2=1` at `up`).
    Prod2,
    /// The optional second test host (`LAB_TEST2=1` at `up`), routed as [`Host::Test`] is:
    /// A/B experiments with two test servers (`LAB_TEST2_MYSQLD_ARGS`, `LAB_TEST2_PRELOAD`).
    Test2,
}

impl Host {
    pub fn as_str(self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Prod => "prod",
            Host::Test => "test",
            Host::Assist => "assist",
            Host::Bridge => "br",
            Host::Prod2 => "prod2",
            Host::Test2 => "test2",
        }
    }

    fn env_prefix(self) -> &'static str {
        match self {
            Host::Client => "LAB_CLIENT",
            Host::Prod => "LAB_PROD",
            Host::Test => "LAB_TEST",
            Host::Assist => "LAB_ASSIST",
            Host::Bridge => "LAB_BR",
            Host::Prod2 => "LAB_PROD2",
            Host::Test2 => "LAB_TEST2",
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// `Ok(self)` if the command succeeded, else an error with its output.
    pub fn check(self) -> Result<Run> {
        if self.success() {
            Ok(self)
        } else {
            Err(anyhow!(
                "{} failed ({}):\n--- stdout:\n{}\n--- stderr:\n{}",
                self.what,
                self.status,
                self.stdout,
                self.stderr
            ))
        }
    }
}

fn run(cmd: &mut Command, what: String) -> Result<Run> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    Ok(Run {
        what,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `lab.sh --name NAME ARGS...` as a command, for anything the helpers below do not cover.
pub fn lab_command(name: &str) -> Command {
    let mut cmd = Command::new(lab_script());
    cmd.arg("--name").arg(name);
    cmd
}

/// Where `scripts/install-deps.sh` put the lab's registry connectors (`py`: PyPI packages
/// for `PYTHONPATH`, `node`: npm's `node_modules` parent).
pub fn lab_clients_dir(what: &str) -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/lab-clients")
        .join(what);
    if !dir.is_dir() {
        bail!(
            "{} is missing: run scripts/install-deps.sh (it installs the lab's Python and \
             Node.js connectors)",
            dir.display()
        );
    }
    Ok(dir.canonicalize()?)
}

/// A process running in a lab host (see [`Lab::spawn`]). Its output is collected in the
/// background; dropping it kills the process.
pub struct Background {
    what: String,
    child: Option<Child>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

fn collect<R: Read + Send + 'static>(mut from: R, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    into.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&text);
                }
            }
        }
    })
}

impl Background {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the process ended, if it has (without waiting).
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    /// Output so far: (stdout, stderr).
    pub fn output(&self) -> (String, String) {
        let get = |s: &Arc<Mutex<String>>| s.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (get(&self.stdout), get(&self.stderr))
    }

    /// Waits until `needle` shows up in stdout or stderr (e.g. tcpdump's "listening on").
    pub fn wait_for_output(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        self.wait_for_count(needle, 1, timeout)
    }

    /// How often `needle` is in the output so far (stdout and stderr).
    pub fn count(&self, needle: &str) -> usize {
        let (out, err) = self.output();
        out.matches(needle).count() + err.matches(needle).count()
    }

    /// Waits until `needle` is in the output at least `n` times: one more status line than
    /// [`Background::count`] saw, one more "control channel ... is up" after a restart.
    pub fn wait_for_count(&mut self, needle: &str, n: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (out, err) = self.output();
            if out.matches(needle).count() + err.matches(needle).count() >= n {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "{} exited ({status}) before printing {needle:?}:\n{out}\n{err}",
                        self.what
                    );
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not print {needle:?} ({n} times) within {timeout:?}:\n{out}\n{err}",
                    self.what
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; stops it (SIGTERM, then SIGKILL)
    /// if it does not. Returns what it printed.
    pub fn finish(mut self, timeout: Duration) -> Result<Run> {
        let deadline = Instant::now() + timeout;
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("{} already finished", self.what))?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                break terminate(&mut child)?;
            }
            thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        let (stdout, stderr) = self.output();
        Ok(Run {
            what: self.what.clone(),
            status,
            stdout,
            stderr,
        })
    }

    /// Stops the process now (SIGTERM, then SIGKILL) and returns what it printed.
    pub fn stop(self) -> Result<Run> {
        self.finish(Duration::ZERO)
    }
}

/// SIGTERM (so tcpdump and friends flush and exit cleanly), SIGKILL after 5 s, to the child's
/// whole process group: `lab.sh service` starts each command as a session leader, and a shell
/// pipeline's members outlive a signal to the shell alone. They hold its output pipes open, so
/// the readers would wait for them: a `bash -c 'for ...; done | mariadb'` stopped this way ran
/// its remaining queries for 100 s before (issue 24). A child that leads no group of its own
/// gets the signal alone.
fn terminate(child: &mut Child) -> Result<ExitStatus> {
    let signal = |sig: &str, pid: u32| {
        let group = Command::new("kill")
            .args([sig, "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !group {
            let _ = Command::new("kill")
                .args([sig, &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    };
    signal("-TERM", child.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            signal("-KILL", child.id());
            let _ = child.kill();
            return Ok(child.wait()?);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = terminate(&mut child);
        }
    }
}

/// The processes under `root` (itself included), stopped with SIGSTOP until dropped or
/// resumed ([`Lab::pause`]).
pub struct Paused(Vec<u32>);

impl Paused {
    fn new(root: u32) -> Self {
        let all = descendants(root);
        for &pid in &all {
            let _ = Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        Paused(all)
    }

    pub fn resume(self) {}
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `root` and every process below it, from /proc's parent links.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may hold spaces and parentheses: the fields follow the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// `SHOW GLOBAL STATUS` counters of one server (`lab.sh counters`), and the ordinal of the read
/// that took them (the lab counts its reads of each server).
#[derive(Clone, Debug, Default)]
pub struct Counters(pub BTreeMap<String, u64>, pub u64);

impl Counters {
    /// The counter `name` (e.g. `Com_stmt_execute`); panics if the server did not report it.
    pub fn get(&self, name: &str) -> u64 {
        match self.0.get(name) {
            Some(v) => *v,
            None => panic!(
                "no counter {name:?} in {:?}",
                self.0.keys().collect::<Vec<_>>()
            ),
        }
    }

    /// `self[name] - earlier[name]`.
    pub fn delta(&self, earlier: &Counters, name: &str) -> u64 {
        self.get(name).saturating_sub(earlier.get(name))
    }
}

/// A sysbench run (`lab.sh load`).
#[derive(Clone, Debug)]
pub struct Load {
    /// sysbench test, e.g. `oltp_read_only`, `oltp_read_write`.
    pub test: String,
    pub threads: u32,
    pub time_secs: u32,
    /// `Host::Prod` (from the client) or `Host::Test` (from test itself).
    pub target: Host,
    /// More sysbench arguments, e.g. `--db-ps-mode=disable`.
    pub extra: Vec<String>,
}

impl Load {
    /// `lab.sh` arguments that run this load.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "load",
            "--test",
            &self.test,
            "--threads",
            &self.threads.to_string(),
            "--time",
            &self.time_secs.to_string(),
            "--target",
            self.target.as_str(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(self.extra.iter().cloned());
        args
    }
}

impl Default for Load {
    fn default() -> Self {
        Load {
            test: "oltp_read_only".into(),
            threads: 8,
            time_secs: 10,
            target: Host::Prod,
            extra: Vec::new(),
        }
    }
}

/// What sysbench reported.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub queries: u64,
    pub transactions: u64,
    pub errors: u64,
    pub output: String,
}

fn sysbench_number(output: &str, label: &str) -> Option<u64> {
    output
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The value of the sample `name` whose labels include `labels`, if the scrape has one.
pub fn sample(
    samples: &[tcpshadow_metrics::Sample],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
}

/// Calls `poll` every `every` until it returns `Some`, or fails after `bound` with `what`
/// (what was waited for) and the last value seen, for conditions a test must create before it
/// measures anything: on a slow or busy machine they take longer, never a different path.
pub fn wait_for<T, L: fmt::Debug>(
    what: &str,
    every: Duration,
    bound: Duration,
    mut poll: impl FnMut() -> Result<Result<T, L>>,
) -> Result<T> {
    let deadline = Instant::now() + bound;
    loop {
        match poll()? {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                bail!("waited {bound:?} for {what}; last seen: {last:?}")
            }
            Err(_) => thread::sleep(every),
        }
    }
}

/// [`wait_for`] a value that holds still: calls `read` every `every` until two reads in a row
/// agree (a count that has settled, metrics republished with nothing new), and returns it.
pub fn wait_settled<T: PartialEq + Clone + fmt::Debug>(
    what: &str,
    every: Duration,
    bound: Duration,
    mut read: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut last: Option<T> = None;
    wait_for(what, every, bound, || {
        let now = read()?;
        let still = last.as_ref() == Some(&now);
        last = Some(now.clone());
        Ok(if still { Ok(now) } else { Err(now) })
    })
}

/// Parses `lab.sh env` output: `KEY='value'` lines, `'` inside values written as `'\''`.
pub fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            let value = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(value);
            Some((key.to_string(), value.replace("'\\''", "'")))
        })
        .collect()
}

static LAB_COUNTER: AtomicU32 = AtomicU32::new(0);

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// `<prefix>-<pid><n>`: unique among the test processes running on this machine.
fn unique_name(prefix: &str) -> Result<String> {
    let valid = !prefix.is_empty()
        && prefix.len() <= 6
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !valid {
        bail!("lab name prefix {prefix:?}: use 1-6 characters a-z 0-9, starting with a letter");
    }
    let n = LAB_COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(format!(
        "{prefix}-{}{}",
        base36(u64::from(std::process::id())),
        base36(u64::from(n))
    ))
}

/// Identity of a process that survives pid reuse: "pid starttime".
fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime), counted after the ")" that ends the command name.
    let after = &stat[stat.rfind(')')? + 1..];
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

/// One file per lab a test process asked for, named after the lab and holding the process's
/// identity. Written before `lab.sh up` starts, so a test killed in the middle of `up` (lab.sh
/// carries on and finishes the lab) still leaves a record the next run can reap by.
const OWNERS_DIR: &str = "/run/tcpshadow-lab/test-owners";

fn owner_file(name: &str) -> PathBuf {
    Path::new(OWNERS_DIR).join(name)
}

/// Tears down labs whose test process is gone (killed by a timeout, say) so they do not pile up.
/// `lab.sh down` waits for the lab's lock, so a `up` still running for a dead test finishes first.
fn reap_orphan_labs() {
    let Ok(entries) = std::fs::read_dir(OWNERS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = || {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(600))
        };
        if name.starts_with('.') {
            // A record being written (see `Lab::up_with`), or one whose writer died before
            // renaming it: no lab was brought up for it.
            if old() {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let owner = owner.trim();
        let Some(pid) = owner
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            // Not a whole record (written by a version that wrote in place: a file read while
            // it was being written is empty, and its lab was torn down under a running test).
            // Only an old one is a leftover.
            if old() {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        };
        let alive = process_identity(pid).is_some_and(|id| id == owner);
        if !alive {
            eprintln!("tcpshadow-tests: tearing down orphaned lab {name} (its test process {owner} is gone)");
            let down = run(
                lab_command(&name).arg("down"),
                format!("lab.sh --name {name} down"),
            )
            .and_then(Run::check);
            if down.is_ok() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The longest [`Lab::work_window`] waits for a test server that is still working off its
/// backlog when production's load ends.
pub const BACKLOG_BOUND: Duration = Duration::from_secs(180);

/// A running lab; torn down (`lab.sh down`) when dropped.
pub struct Lab {
    name: String,
    env: BTreeMap<String, String>,
    up: bool,
    /// `counters` reads so far, per server (each adds 2 to its Questions).
    reads: std::sync::Mutex<BTreeMap<&'static str, u64>>,
}

impl Lab {
    /// Brings up a lab named `<prefix>-<unique suffix>` (prefix: 1-6 characters a-z 0-9).
    /// Tests running at the same time must use different prefixes.
    pub fn up(prefix: &str) -> Result<Lab> {
        Self::up_with(prefix, &[])
    }

    /// Like [`Lab::up`], with extra environment for `lab.sh up`
    /// (e.g. `("LAB_TEST_MYSQLD_ARGS", "--skip-grant-tables")`).
    pub fn up_with(prefix: &str, env: &[(&str, &str)]) -> Result<Lab> {
        require_root()?;
        reap_orphan_labs();
        let name = unique_name(prefix)?;
        let identity = process_identity(std::process::id())
            .ok_or_else(|| anyhow!("cannot read this test process's /proc entry"))?;
        // Written aside and renamed into place: another test process reaping orphans reads
        // either no record or a whole one, never a half-written one.
        let aside = Path::new(OWNERS_DIR).join(format!(".{name}.{}", std::process::id()));
        std::fs::create_dir_all(OWNERS_DIR)
            .and_then(|()| std::fs::write(&aside, identity))
            .and_then(|()| std::fs::rename(&aside, owner_file(&name)))
            .with_context(|| format!("writing {}", owner_file(&name).display()))?;
        // From here on, Drop tears down whatever `up` left behind.
        let mut lab = Lab {
            name,
            env: BTreeMap::new(),
            up: true,
            reads: Default::default(),
        };
        let mut cmd = lab_command(&lab.name);
        cmd.arg("up").envs(env.iter().copied());
        run(&mut cmd, format!("lab.sh --name {} up", lab.name))?.check()?;
        lab.env = lab.env_from_script()?;
        Ok(lab)
    }

    fn env_from_script(&self) -> Result<BTreeMap<String, String>> {
        let out = run(
            &mut self.command(&["env"]),
            format!("lab.sh --name {} env", self.name),
        )?
        .check()?;
        Ok(parse_env(&out.stdout))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lab's description, as printed by `lab.sh env` (LAB_PROD_IP, LAB_TEST_SOCKET, ...).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// Writes the test server's credentials (the lab's normal account, `user:password`) to a
    /// 0600 file in the lab directory, for the copier's `--mysql-credentials`; returns its path.
    pub fn credentials_file(&self) -> Result<String> {
        use std::os::unix::fs::PermissionsExt;
        let path = Path::new(self.var("LAB_DIR")).join("test-credentials");
        std::fs::write(
            &path,
            format!("{}:{}\n", self.var("LAB_USER"), self.var("LAB_PASSWORD")),
        )?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(path.to_string_lossy().into_owned())
    }

    /// `--prod-dsn` of the lab's read-only account on production (PROCESS, SELECT).
    pub fn prod_dsn(&self) -> String {
        format!(
            "mysql://{}:{}@{}:3306",
            self.var("LAB_RO_USER"),
            self.var("LAB_RO_PASSWORD"),
            self.ip(Host::Prod)
        )
    }

    /// The copier's arguments for connections open before it started: the test server's
    /// credentials, and the lab's account and schema as the defaults of a picked-up session.
    pub fn pickup_args(&self) -> Result<Vec<String>> {
        Ok(vec![
            "--mysql-credentials".into(),
            self.credentials_file()?,
            "--mysql-default-user".into(),
            self.var("LAB_USER").into(),
            "--mysql-default-db".into(),
            "sbtest".into(),
        ])
    }

    /// One `lab.sh env` value; panics if there is no such variable.
    pub fn var(&self, key: &str) -> &str {
        match self.env.get(key) {
            Some(v) => v,
            None => panic!("lab {} has no variable {key}", self.name),
        }
    }

    /// The host's lab address (for the client: its first address).
    pub fn ip(&self, host: Host) -> &str {
        self.var(&format!("{}_IP", host.env_prefix()))
    }

    /// The host's network namespace.
    pub fn netns(&self, host: Host) -> &str {
        self.var(&format!("{}_NS", host.env_prefix()))
    }

    /// `lab.sh --name NAME ARGS...`, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = lab_command(&self.name);
        cmd.args(args);
        cmd
    }

    fn exec_command(&self, host: Host, args: &[&str]) -> Command {
        let mut cmd = self.command(&["exec", host.as_str()]);
        cmd.args(args);
        cmd
    }

    /// Runs `args` in `host` (with the lab's variables in its environment) and waits for it.
    pub fn exec(&self, host: Host, args: &[&str]) -> Result<Run> {
        run(
            &mut self.exec_command(host, args),
            format!("[{host}] {}", args.join(" ")),
        )
    }

    /// Like [`Lab::exec`], failing unless the command succeeds; returns its stdout.
    pub fn exec_ok(&self, host: Host, args: &[&str]) -> Result<String> {
        Ok(self.exec(host, args)?.check()?.stdout)
    }

    /// Starts `args` in `host` in the background, in a session of its own (`lab.sh service`):
    /// a daemon of its machine, which the kernel's per-session CPU groups then treat as one,
    /// not as another child of the test runner's session.
    pub fn spawn(&self, host: Host, args: &[&str]) -> Result<Background> {
        let what = format!("[{host}] {}", args.join(" "));
        let mut cmd = self.command(&["service", host.as_str()]);
        cmd.args(args);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(collect(out, stdout.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(collect(err, stderr.clone()));
        }
        Ok(Background {
            what,
            child: Some(child),
            stdout,
            stderr,
            readers,
        })
    }

    /// A scrape of a daemon's `--metrics` endpoint listening on `addr` in `host` (`curl` in
    /// the host's namespace), parsed with the daemons' own exposition parser.
    pub fn scrape(&self, host: Host, addr: &str) -> Result<Vec<tcpshadow_metrics::Sample>> {
        let url = format!("http://{addr}/metrics");
        let run = self.exec(host, &["curl", "-sS", "--fail", "--max-time", "5", &url])?;
        if !run.success() {
            bail!("curl {url} in {host}: {}", run.stderr.trim());
        }
        tcpshadow_metrics::parse(&run.stdout).map_err(|e| anyhow!("{url}: {e}"))
    }

    /// Starts Debian's node_exporter in `host` (`lab.sh node-exporter`: a session of its own,
    /// the lab's small collector set, stopped by `down`); returns its address, `ip:port`.
    /// Its figures are the whole machine's, as every host's are: the namespaces share a kernel.
    pub fn node_exporter(&self, host: Host) -> Result<String> {
        let run = run(
            &mut self.command(&["node-exporter", host.as_str()]),
            format!("lab.sh --name {} node-exporter {host}", self.name),
        )?
        .check()?;
        let url = run.stdout.trim();
        url.strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("lab.sh node-exporter {host} printed {url:?}, not its URL"))
    }

    /// The text of a scrape of `host`'s node_exporter (see [`Lab::node_exporter`]), by `curl`
    /// from the client host, as a monitoring machine would. test and test2 are scraped from
    /// prod instead: they route the client's addresses via assist, so their answers to the
    /// client would die there.
    pub fn node_metrics(&self, host: Host) -> Result<String> {
        let from = match host {
            Host::Test | Host::Test2 => Host::Prod,
            _ => Host::Client,
        };
        let port = std::env::var("LAB_NODE_EXPORTER_PORT").unwrap_or_else(|_| "9100".into());
        let url = format!("http://{}:{port}/metrics", self.ip(host));
        let run = self.exec(from, &["curl", "-sS", "--fail", "--max-time", "5", &url])?;
        if !run.success() {
            bail!("curl {url} in {from}: {}", run.stderr.trim());
        }
        Ok(run.stdout)
    }

    /// Loads the A/B experiments' table (`deploy/lab/ab-schema.sql`: the same 20,000 orders on
    /// every server) into each of `hosts`' servers.
    pub fn ab_schema(&self, hosts: &[Host]) -> Result<()> {
        let path = lab_script().with_file_name("ab-schema.sql");
        let sql = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for &h in hosts {
            self.sql(h, &sql)?;
        }
        Ok(())
    }

    /// Runs `sql` with the mariadb client on host `from` against `to`'s server over TCP, as the
    /// lab's account; returns the rows (tab-separated, no column names).
    pub fn client_sql(&self, from: Host, to: Host, sql: &str) -> Result<String> {
        let (user, password) = (self.var("LAB_USER"), self.var("LAB_PASSWORD"));
        let password = format!("-p{password}");
        self.exec_ok(
            from,
            &[
                "mariadb",
                "--no-defaults",
                "--connect-timeout=5",
                "-h",
                self.ip(to),
                "-u",
                user,
                &password,
                "-N",
                "-e",
                sql,
            ],
        )
    }

    /// Runs SQL as root over the server's local socket; returns the tab-separated rows.
    pub fn sql(&self, host: Host, sql: &str) -> Result<String> {
        let out = run(
            &mut self.command(&["sql", host.as_str(), sql]),
            format!("[{host}] sql {sql}"),
        )?
        .check()?;
        Ok(out.stdout.trim_end().to_string())
    }

    /// Makes `host` keep its recent statements with their error numbers
    /// (`performance_schema.events_statements_history_long`, which is filled only while
    /// `events_statements_current` is on as well).
    pub fn keep_statement_history(&self, host: Host) -> Result<()> {
        self.sql(
            host,
            "UPDATE performance_schema.setup_consumers SET ENABLED = 'YES' \
             WHERE NAME IN ('events_statements_current', 'events_statements_history_long')",
        )
        .map(drop)
    }

    /// `host`'s recent statements that failed, one a line: thread, event, error number,
    /// event name, message, schema and SQL text (see [`Lab::keep_statement_history`]).
    pub fn failed_statements(&self, host: Host) -> Result<String> {
        self.sql(
            host,
            "SELECT THREAD_ID, EVENT_ID, MYSQL_ERRNO, EVENT_NAME, IFNULL(MESSAGE_TEXT, ''), \
             IFNULL(CURRENT_SCHEMA, ''), LEFT(IFNULL(SQL_TEXT, ''), 200) \
             FROM performance_schema.events_statements_history_long WHERE MYSQL_ERRNO <> 0",
        )
    }

    /// On the test server only: the lab account's schema-wide grant becomes per-table grants,
    /// `table`'s without SELECT, so its reads there fail (1142) while production runs them.
    pub fn deny_select_on_test(&self, table: &str) -> Result<()> {
        let (db, user) = (self.var("LAB_DB"), self.var("LAB_USER"));
        let tables: u32 = self.var("LAB_TABLES").parse().unwrap_or(4);
        let mut sql = format!("REVOKE ALL PRIVILEGES ON {db}.* FROM '{user}'@'%'");
        for t in (1..=tables).map(|i| format!("sbtest{i}")) {
            let grant = if t == table {
                "INSERT, UPDATE, DELETE"
            } else {
                "ALL PRIVILEGES"
            };
            sql.push_str(&format!("; GRANT {grant} ON {db}.{t} TO '{user}'@'%'"));
        }
        self.sql(Host::Test, &sql).map(drop)
    }

    /// The server's `SHOW GLOBAL STATUS` counters (Questions, Com_*, Connections, ...).
    pub fn counters(&self, host: Host) -> Result<Counters> {
        let out = run(
            &mut self.command(&["counters", host.as_str()]),
            format!("[{host}] counters"),
        )?
        .check()?;
        let mut map = BTreeMap::new();
        for line in out.stdout.lines() {
            let Some((name, value)) = line.split_once(' ') else {
                continue;
            };
            let value = value
                .trim()
                .parse()
                .with_context(|| format!("counter line {line:?}"))?;
            map.insert(name.to_string(), value);
        }
        let ordinal = {
            let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
            let n = reads.entry(host.as_str()).or_insert(0);
            *n += 1;
            *n
        };
        Ok(Counters(map, ordinal))
    }

    /// What `host`'s server has executed so far (`lab.sh work`): two of these around a window
    /// give its [`work::Work`].
    pub fn work(&self, host: Host) -> Result<work::WorkSnapshot> {
        let out = run(
            &mut self.command(&["work", host.as_str()]),
            format!("[{host}] work"),
        )?
        .check()
        .map_err(|e| {
            // A server that stopped answering: what it logged says why (the lab's directory,
            // and the log with it, is gone once the test has torn the lab down).
            let log = self
                .command(&["logs", host.as_str(), "40"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            e.context(format!("{host}'s MariaDB error log, last lines:\n{log}"))
        })?;
        work::WorkSnapshot::parse(&out.stdout)
    }

    /// Bytes the test server's MySQL sockets hold that it has not read yet (their `Recv-Q`):
    /// commands the mirror has delivered and the server has yet to run.
    pub fn test_unread_bytes(&self) -> Result<u64> {
        let port = format!("sport = :{}", self.var("LAB_MYSQL_PORT"));
        let out = self.exec_ok(Host::Test, &["ss", "-Htn", &port])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum())
    }

    /// Both servers' [`Lab::work`], production first.
    pub fn work_both(&self) -> Result<(work::WorkSnapshot, work::WorkSnapshot)> {
        Ok((self.work(Host::Prod)?, self.work(Host::Test)?))
    }

    /// Waits until `host` has run at least `n` commands of `kind` (a `Com_*` counter of
    /// [`work::KINDS`]) since `from`, at most `bound`: the condition a test needs before it
    /// changes anything (a load's connections open, logged in and working), however long this
    /// machine takes to create it.
    pub fn wait_work(
        &self,
        host: Host,
        from: &work::WorkSnapshot,
        kind: &str,
        n: u64,
        bound: Duration,
    ) -> Result<()> {
        wait_for(
            &format!("{host} to run {n} {kind}"),
            Duration::from_millis(100),
            bound,
            || {
                let ran = work::Work::between(from, &self.work(host)?)?.get(kind);
                Ok(if ran >= n { Ok(()) } else { Err(ran) })
            },
        )
    }

    /// Closes a window opened by `before` (a [`Lab::work_both`] or [`Lab::work_both_quiet`]
    /// read) once production's load is over: both servers now, then the test server again
    /// until it has run at least as much of every kind as production did (its backlog), or
    /// it has run nothing new for `standstill`. Whether it caught up is for the comparison to
    /// say.
    ///
    /// A test server still working off its backlog is waited for however long that takes on
    /// this machine (a busy one runs the backlog slower, not differently), up to
    /// [`BACKLOG_BOUND`]; one that stopped moving is given `standstill` only, so a window with
    /// a real loss closes as soon as it would on a quiet machine.
    pub fn work_window(
        &self,
        before: (work::WorkSnapshot, work::WorkSnapshot),
        standstill: Duration,
    ) -> Result<work::Window> {
        self.window_until_caught_up(before, standstill, work::MIN_COUNT)
    }

    /// Waits, before a test reads what the test server did with a handful of commands, until it
    /// has run at least what production ran of every kind since `before` (every command, not
    /// only the kinds [`Lab::work_window`] holds to fidelity bars), or nothing new for
    /// `standstill`: a replacement for "sleep a second and hope it is done".
    pub fn wait_test_caught_up(
        &self,
        before: (work::WorkSnapshot, work::WorkSnapshot),
        standstill: Duration,
    ) -> Result<()> {
        self.window_until_caught_up(before, standstill, 1).map(drop)
    }

    fn window_until_caught_up(
        &self,
        before: (work::WorkSnapshot, work::WorkSnapshot),
        standstill: Duration,
        min_count: u64,
    ) -> Result<work::Window> {
        // First: the closer to the load's end, the less the test server has read since.
        let test_unread_at_end = self.test_unread_bytes()?;
        let at_end = self.work_both()?;
        let prod = at_end.0.clone();
        let due = work::Work::between(&before.0, &prod)?;
        let started = Instant::now();
        let mut moved = started;
        let mut test = at_end.1.clone();
        loop {
            let done = work::Work::between(&before.1, &test)?;
            let behind = work::KINDS
                .iter()
                .any(|k| done.get(k) < due.get(k) && due.get(k) >= min_count);
            let now = Instant::now();
            if !behind || now - moved >= standstill || now - started >= BACKLOG_BOUND {
                return Ok(work::Window {
                    before,
                    at_end,
                    after: (prod, test),
                    caught_up_in: (!behind).then(|| now - started),
                    settled_in: moved - started,
                    test_unread_at_end,
                });
            }
            thread::sleep(Duration::from_millis(250));
            let next = self.work(Host::Test)?;
            let step = work::Work::between(&test, &next)?;
            if work::KINDS.iter().any(|k| step.get(k) > 0) {
                moved = Instant::now();
            }
            test = next;
        }
    }

    /// Stops the clients of `load` (a [`Lab::spawn_load`] child and every process under it)
    /// with SIGSTOP until the returned guard is dropped or resumed.
    pub fn pause(&self, load: &Child) -> Paused {
        Paused::new(load.id())
    }

    /// [`Lab::pause`] of a process by pid (a [`Background`]'s), and every process below it.
    pub fn pause_pid(&self, pid: u32) -> Paused {
        Paused::new(pid)
    }

    /// Both servers' [`Lab::work`] once neither is running anything: read until two reads in a
    /// row show no new work (the test server has run all that was mirrored to it). With the
    /// load paused ([`Lab::pause`]) this opens a window exactly: two servers read one after the
    /// other under load are read at different moments, and the commands run in between
    /// (hundreds at sysbench's rate) would count as a loss or a duplicate.
    pub fn work_both_quiet(
        &self,
        timeout: Duration,
    ) -> Result<(work::WorkSnapshot, work::WorkSnapshot)> {
        let deadline = Instant::now() + timeout;
        let mut last = self.work_both()?;
        loop {
            thread::sleep(Duration::from_millis(200));
            let now = self.work_both()?;
            let still = |a: &work::WorkSnapshot, b: &work::WorkSnapshot| -> Result<bool> {
                let w = work::Work::between(a, b)?;
                Ok(work::KINDS.iter().all(|k| w.get(k) == 0))
            };
            if still(&last.0, &now.0)? && still(&last.1, &now.1)? {
                return Ok(now);
            }
            if Instant::now() >= deadline {
                bail!("the servers did not go quiet within {timeout:?} (is the load paused?)");
            }
            last = now;
        }
    }

    /// Runs `load` on prod with the mirror on and returns both servers' work over it (the
    /// test server given at most 10 s for its backlog) and sysbench's figures. sysbench's
    /// "ignored errors" are production's own deadlocks and lock wait timeouts, rolled back and
    /// retried: a read-only load has no reason for any, and fails here if it had one.
    pub fn mirrored_load(&self, load: &Load) -> Result<(work::Window, LoadReport)> {
        let before = self.work_both()?;
        let report = self.load(load)?;
        if report.errors > 0 && load.test == "oltp_read_only" {
            bail!("sysbench reported errors:\n{}", report.output);
        }
        Ok((self.work_window(before, Duration::from_secs(10))?, report))
    }

    /// Runs sysbench (`lab.sh load`) and returns its figures.
    pub fn load(&self, load: &Load) -> Result<LoadReport> {
        let args = load.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(
            &mut self.command(&args),
            format!("lab.sh {}", args.join(" ")),
        )?
        .check()?;
        let number = |label: &str| {
            sysbench_number(&out.stdout, label)
                .ok_or_else(|| anyhow!("no {label:?} in the sysbench output:\n{}", out.stdout))
        };
        Ok(LoadReport {
            queries: number("queries:")?,
            transactions: number("transactions:")?,
            errors: number("ignored errors:")?,
            output: out.stdout.clone(),
        })
    }

    /// Starts `load` in the background (its output piped), for tests that do something while
    /// it runs: start the mirror into it, inject a fault.
    pub fn spawn_load(&self, load: &Load) -> Result<Child> {
        let args = load.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting lab.sh {}", args.join(" ")))
    }

    /// `lab.sh status`.
    pub fn status(&self) -> Result<Run> {
        run(
            &mut self.command(&["status"]),
            format!("lab.sh --name {} status", self.name),
        )
    }

    /// Tears the lab down now (Drop does the same, ignoring errors).
    pub fn down(mut self) -> Result<()> {
        self.up = false;
        run(
            &mut self.command(&["down"]),
            format!("lab.sh --name {} down", self.name),
        )?
        .check()?;
        let _ = std::fs::remove_file(owner_file(&self.name));
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if !self.up {
            return;
        }
        match run(
            &mut self.command(&["down"]),
            format!("lab.sh --name {} down", self.name),
        )
        .and_then(Run::check)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(owner_file(&self.name));
            }
            Err(e) => eprintln!(
                "tcpshadow-tests: tearing down lab {} failed: {e:#}",
                self.name
            ),
        }
    }
}

/// Names of the network namespaces on this machine (`ip netns list`).
pub fn netns_list() -> Result<Vec<String>> {
    let out = run(
        Command::new("ip").args(["netns", "list"]),
        "ip netns list".into(),
    )?
    .check()?;
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_are_unquoted() {
        let env =
            parse_env("# comment\nLAB_A='1.2.3.4'\nLAB_B='a b'\nLAB_C='it'\\''s'\nLAB_D=''\n");
        assert_eq!(env["LAB_A"], "1.2.3.4");
        assert_eq!(env["LAB_B"], "a b");
        assert_eq!(env["LAB_C"], "it's");
        assert_eq!(env["LAB_D"], "");
        assert_eq!(env.len(), 4);
    }

    #[test]
    fn sysbench_figures_are_read() {
        let out = "SQL statistics:\n    queries performed:\n        read: 10\n    transactions:                        38529  (3851.62 per sec.)\n    queries:                             616464 (61625.87 per sec.)\n    ignored errors:                      0      (0.00 per sec.)\n";
        assert_eq!(sysbench_number(out, "queries:"), Some(616464));
        assert_eq!(sysbench_number(out, "transactions:"), Some(38529));
        assert_eq!(sysbench_number(out, "ignored errors:"), Some(0));
    }

    #[test]
    fn lab_names_are_unique_and_short() {
        let a = unique_name("abcdef").unwrap();
        let b = unique_name("abcdef").unwrap();
        assert_ne!(a, b);
        assert!(a.len() <= 15, "{a}");
        assert!(unique_name("Bad").is_err());
        assert!(unique_name("toolongx").is_err());
    }
}
