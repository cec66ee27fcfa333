//! Command-line interface of the copier daemon.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

// Declared with the settings (the ring's block size, the pool's parser); named here too, beside
// the flags they serve.
pub use crate::settings::{parse_cidr, CAPTURE_BLOCK_BYTES};

use crate::builders::engine_config;
use crate::engine::{Fleet, FleetError};
use crate::settings::{
    capture_filter, CaptureSettings, LiveSettings, MirrorSettings, Plan, Protocol, Route,
};

/// Mirrors the client connections of a production port onto a test server, packet by packet.
///
/// Runs on the production host. Captures client traffic of --port, plays the client side of each
/// connection toward --target, and learns the test server's replies from the intercept daemon
/// (which runs on the host the test server routes the client addresses to).
///
/// Several ports or servers: `--map PORT=HOST:PORT` (repeatable) mirrors each production PORT
/// to HOST:PORT, in addition to --port/--target if --target is given.
#[derive(Parser, Debug, Clone)]
#[command(name = "copier", version, about, long_about)]
pub struct Args {
    /// Production port whose client connections are mirrored to --target [default: 3306].
    #[arg(long, env = "TCPSHADOW_PORT")]
    pub port: Option<u16>,

    #[command(flatten)]
    pub mirror: MirrorArgs,

    /// Also mirror production port PORT to the test server HOST:PORT (an IPv4 address);
    /// repeatable, or comma-separated. Adds to --port/--target when --target is given, else
    /// replaces them. Several routes need --client-ip-pool (each gets its own slice), and the
    /// intercept daemon must capture every target port (`intercept --port A,B`).
    #[arg(long = "map", value_name = "PORT=HOST:PORT", env = "TCPSHADOW_MAP", value_delimiter = ',', value_parser = parse_map)]
    pub map: Vec<Route>,

    /// Capture interface ("any" captures on all interfaces of this host).
    #[arg(long, env = "TCPSHADOW_INTERFACE", default_value = "any")]
    pub interface: String,

    /// MySQL: a read-only account on production, `mysql://user:password@host[:port]`
    /// (percent-encode special characters). For connections picked up mid-stream, the copier
    /// reads their user, schema, prepared statements, user variables and (MySQL) the session
    /// variables they changed (needs `GRANT PROCESS, SELECT ON *.*` and
    /// performance_schema=ON). Prefer the environment variable: a command line is
    /// visible to other users of the host.
    #[arg(long, env = "TCPSHADOW_PROD_DSN", value_parser = crate::prod_state::DsnArg::parse_arg)]
    pub prod_dsn: Option<crate::prod_state::DsnArg>,

    /// MySQL: how long a picked-up connection waits for --prod-dsn's answer before logging in
    /// with --mysql-default-user (its commands are held meanwhile).
    #[arg(long, env = "TCPSHADOW_PROD_DSN_WAIT_MS", default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub prod_dsn_wait_ms: u64,

    /// Do not pick up connections that were already open when the copier started.
    #[arg(long, env = "TCPSHADOW_NO_PICKUP")]
    pub no_pickup: bool,

    /// Kernel capture buffer (libpcap's ring, resident once used), in MiB [default: a quarter
    /// of --max-memory, 64 at its default]. It counts toward --max-memory: a larger value is
    /// refused (raise --max-memory for a larger ring).
    #[arg(long, env = "TCPSHADOW_CAPTURE_BUFFER_MB", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub capture_buffer_mb: Option<u32>,

    /// Longest wait, in ms, before the kernel hands captured packets over (a TPACKET_V3
    /// block timeout): one wakeup per block instead of one per packet. While packets flow,
    /// the copier's own timers and what intercept relays (unless it times replies: --report,
    /// --metrics) wait for the next block too (for a timeout above 10, at most 30 ms), except
    /// while a session waits on the test server (a login, a PREPARE_OK). A block's commands
    /// reach the test server together, so its threads wait for commands less often than
    /// production's (a tenth as often at 10 ms in the lab; see docs/operations.md, Sizing).
    /// Shorter: less delay, a load shaped more like production's, more wakeups of both
    /// daemons (at 1, 2.3-3.2x the copier's CPU per query at moderate rates); the
    /// capture ring holds its blocks x this of traffic while the copier waits for a CPU (1.9 s
    /// for the default ring of 192 blocks; the copier logs it). 0: immediate mode (a wakeup
    /// per packet, no added delay; more CPU) [default: 10].
    #[arg(long, env = "TCPSHADOW_CAPTURE_BLOCK_MS", value_parser = clap::value_parser!(u16).range(0..=100))]
    pub capture_block_ms: Option<u16>,

    /// Scheduling priority of the capture: auto (the default: as started while the capture
    /// keeps up; nice -20, and its session's CPU group too, while it is over 100 ms behind the
    /// wire or its ring has held packets 60 ms without it running (a watchdog thread looks 50
    /// times a second), until it keeps up for 30 s; SCHED_RR 1 instead when it shares its
    /// session with other processes), normal (as started, always), high (nice -20 from the
    /// start) or realtime (SCHED_RR 1). The capture's work is fixed by the traffic, and what it
    /// cannot do in time the kernel drops for good: on a saturated host a fair share of the
    /// CPU is not enough (measured: 0.03-0.25 of the work at 8 threads with 2 cores and
    /// pinning off, 1.00000 raised). Raised, the copier runs before production's threads and
    /// sends in larger bursts, which the report's test latencies show: auto raises only while
    /// that is the lesser harm. Needs root or CAP_SYS_NICE at start (or systemd's
    /// LimitNICE=-20 / Nice=); without it the copier says so and runs as started.
    #[arg(long, env = "TCPSHADOW_CAPTURE_PRIORITY", value_enum, default_value_t = ops::sched::Priority::Auto)]
    pub capture_priority: ops::sched::Priority,

    /// Capture threads (1 to 64). N > 1: N captures share the traffic by flow hash (kernel
    /// PACKET_FANOUT, both directions of a connection on one thread), each with its own
    /// engines, its own share of --client-ip-pool and its own control connection to intercept
    /// (it counts N copiers). The status line, summary, metrics and report add them up. Each
    /// capture gets its own --capture-buffer-mb.
    #[arg(long, env = "TCPSHADOW_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,

    /// MySQL: mirror TLS sessions from the plaintext production's own TLS library reads and
    /// writes (eBPF uprobes on SSL_read/SSL_write of the process listening on the production
    /// port; no keys, no proxy). `on`: when the probe cannot be attached (no BTF, no
    /// CAP_BPF/CAP_PERFMON, a library it does not know), one line says why and TLS sessions
    /// are counted and left alone, as with `off`. With --workers N > 1 not yet available.
    #[arg(long, env = "TCPSHADOW_TLS_SESSIONS", value_enum, default_value_t = TlsSessions::On)]
    pub tls_sessions: TlsSessions,

    /// --config, --print-config, --log.
    #[command(flatten)]
    pub config: ops::config::ConfigArgs,
}

/// How sessions are mirrored, wherever the packets come from (a live capture or a file): the
/// flags are parsed straight into the [`MirrorSettings`] they give (their documentation is
/// there), which [`MirrorArgs::validate`] checks; only the removed `--token-file` is apart.
#[derive(clap::Args, Debug, Clone)]
pub struct MirrorArgs {
    #[command(flatten)]
    pub settings: MirrorSettings,

    /// Removed: the cleartext token of control protocol 3. Refused with a pointer to
    /// --secret-file.
    #[arg(long, env = "TCPSHADOW_TOKEN_FILE", hide = true)]
    pub token_file: Option<PathBuf>,
}

/// The flags read as the settings they are (`args.mirror.mss`), so one list of fields serves
/// both: clap's and the mirror's.
impl std::ops::Deref for MirrorArgs {
    type Target = MirrorSettings;

    fn deref(&self) -> &MirrorSettings {
        &self.settings
    }
}

impl MirrorArgs {
    /// The settings these flags give (a copy), unchecked: [`MirrorArgs::validate`] checks
    /// them.
    pub fn settings(&self) -> MirrorSettings {
        self.settings.clone()
    }

    /// The first (or only) intercept: `--map` routes and the first `--target` use it.
    pub fn first_intercept(&self) -> SocketAddr {
        self.settings().first_intercept()
    }

    /// The control channel's secret from --secret-file, if given (the removed --token-file
    /// is refused with the way to fix it).
    pub fn secret(&self) -> Result<Option<common::auth::Secret>> {
        if self.token_file.is_some() {
            bail!("{}", ops::secret::TOKEN_FILE_GONE);
        }
        self.settings().secret()
    }

    /// The routes for production port `port`, one per `--target`: `--target` is required
    /// here (a live copier with `--map` builds its routes in [`Args::routes`]).
    pub fn route(&self, port: u16) -> Result<Vec<Route>> {
        if self.target.is_empty() {
            bail!("--target HOST:PORT is required (the test server to mirror to)");
        }
        Ok(self.settings().route(port))
    }

    /// Refuses set-ups that would hurt production or cannot work; what is left is the
    /// settings the mirror runs with.
    pub fn validate(&self) -> Result<MirrorSettings> {
        if self.token_file.is_some() {
            bail!("{}", ops::secret::TOKEN_FILE_GONE);
        }
        let settings = self.settings();
        for &target in &self.target {
            validate_target("--target", &format!("--target {target}"), target)?;
        }
        let mut seen = self.target.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() < self.target.len() {
            bail!(
                "a --target is given twice; to mirror each connection several times use --multiply"
            );
        }
        if self.tee && self.target.len() < 2 {
            bail!(
                "--tee mirrors every connection to each of several test servers: give at least two \
                 --target (e.g. --target A:3306 --target B:3306)"
            );
        }
        if self.intercept.len() > 1 && self.intercept.len() != self.target.len() {
            bail!(
                "{} --intercept for {} --target: give one --intercept for all targets, or one \
                 per --target in the same order (the first --target's first)",
                self.intercept.len(),
                self.target.len()
            );
        }
        if self.read_only && self.protocol != Protocol::Mysql {
            bail!(
                "--read-only tells writes from reads in MySQL commands: it needs --protocol mysql"
            );
        }
        if self.read_only_allow_calls && !self.read_only {
            bail!("--read-only-allow-calls only applies with --read-only");
        }
        if settings.collects() && self.protocol != Protocol::Mysql {
            bail!("--report compares MySQL answers: it needs --protocol mysql");
        }
        if (self.compare_results || self.report_literals) && !settings.collects() {
            bail!(
                "--compare-results and --report-literals only apply with --report (or --metrics)"
            );
        }
        if self.ab_calibration.is_some() && !(self.tee && settings.collects()) {
            bail!("--ab-calibration only applies with --tee and --report (or --metrics)");
        }
        if self.report_interval > 0 && self.report.is_none() {
            bail!("--report-interval only applies with --report");
        }
        crate::sampling::validate(&settings)?;
        Ok(settings)
    }

    /// Refuses `routes` x `--multiply` that the pool cannot give distinct addresses.
    pub fn validate_routes(&self, routes: &[Route]) -> Result<()> {
        let Some(first) = routes.first() else {
            bail!("nothing to mirror: give --target (or --map)");
        };
        let template = engine_config(&self.settings(), *first, false);
        let routes: Vec<_> = routes.iter().map(|r| (r.prod_port, r.target)).collect();
        if let Err(e) = Fleet::check(&template, &routes, self.multiply) {
            let e = match e {
                FleetError::NeedPool { .. } if routes.len() == 1 => format!(
                    "--multiply {} mirrors each connection {} times, from distinct client \
                     addresses: add --client-ip-pool CIDR, a range the test server routes to the \
                     intercept host (e.g. 198.19.0.0/16)",
                    self.multiply, self.multiply
                ),
                e => e.to_string(),
            };
            bail!("{e}");
        }
        Ok(())
    }
}

/// A test server must be a unicast address that is not this host's: the copier runs on the
/// production host, and mirroring onto itself would double production's load.
/// `shown` is the argument as the user wrote it (e.g. `--map 3307=10.0.0.1:3307`).
pub fn validate_target(flag: &str, shown: &str, target: SocketAddrV4) -> Result<()> {
    let ip = *target.ip();
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
        bail!("{shown}: {ip} is not a unicast address");
    }
    if ip.is_loopback() || is_local_address(ip) {
        bail!(
            "{shown}: {ip} is an address of this host: the copier runs on the production host and \
             must never mirror onto the production server itself; point {flag} at the test server"
        );
    }
    Ok(())
}

impl Args {
    /// The production port of --target.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(3306)
    }

    /// Where each production port goes: --port to --target (if --target is given), then
    /// every --map.
    pub fn routes(&self) -> Result<Vec<Route>> {
        let mut routes = Vec::with_capacity(self.mirror.target.len() + self.map.len());
        match (self.mirror.target.is_empty(), self.port) {
            (false, _) => routes.extend(self.mirror.route(self.port())?),
            (true, _) if self.map.is_empty() => {
                bail!("--target HOST:PORT is required (the test server to mirror to), or --map PORT=HOST:PORT")
            }
            (true, Some(p)) => bail!(
                "--port {p} has no --target: add --target HOST:PORT, or write it as --map {p}=HOST:PORT"
            ),
            (true, None) => {}
        }
        for m in &self.map {
            let shown = format!("--map {}={}", m.prod_port, m.target);
            validate_target("--map", &shown, m.target)?;
            if routes.contains(m) {
                bail!(
                    "port {} to {} is given twice; to mirror each connection several times use \
                     --multiply",
                    m.prod_port,
                    m.target
                );
            }
            routes.push(*m);
        }
        Ok(routes)
    }

    /// The capture ring size in bytes: --capture-buffer-mb, or the capture's part of
    /// --max-memory. Refused when larger than that part: the ring becomes resident as the
    /// kernel fills it, and the bound would not hold.
    pub fn capture_buffer_bytes(&self) -> Result<i32> {
        let budget = self.mirror.settings().memory_budget();
        // Each capture worker has a ring of its own: they share the capture's part.
        let workers = self.workers.max(1) as usize;
        let bytes = match self.capture_buffer_mb {
            // The TLS probe's ring comes out of the same part (it is resident twice over).
            None => (budget.capture() - 2 * self.tls_ring_bytes() as usize) / workers,
            Some(mb) => {
                let bytes = (mb as usize) << 20;
                let tls = 2 * self.tls_ring_bytes() as usize;
                if bytes * workers + tls > budget.capture() {
                    bail!(
                        "--capture-buffer-mb {mb} x {workers} workers{} is more than --max-memory \
                         {} allows for the capture rings ({} MiB, a quarter of it): raise \
                         --max-memory or lower the buffer",
                        if tls > 0 {
                            format!(" and the TLS probe's ring ({} MiB resident)", tls >> 20)
                        } else {
                            String::new()
                        },
                        self.mirror.max_memory,
                        budget.capture() >> 20
                    );
                }
                bytes
            }
        };
        Ok(i32::try_from(bytes).unwrap_or(i32::MAX))
    }

    /// The TLS plaintext probe's ring (`--tls-sessions`), 0 when it will not be attached: an
    /// eighth of the capture's part of `--max-memory`, a power of two (the kernel's rule), at
    /// least 256 KiB. The kernel maps a BPF ring's data twice in a row, so it is resident
    /// twice: a 16 MiB ring took 33 MiB of the copier's RSS, idle.
    pub fn tls_ring_bytes(&self) -> u32 {
        if !self.tls_wanted() {
            return 0;
        }
        let share = self.mirror.settings().memory_budget().capture() / 8;
        let pow2 = if share.is_power_of_two() {
            share
        } else {
            share.next_power_of_two() / 2
        };
        u32::try_from(pow2.clamp(256 << 10, 16 << 20)).unwrap_or(16 << 20)
    }

    /// `--tls-sessions on` where the probe may be attached: MySQL, one worker.
    fn tls_wanted(&self) -> bool {
        self.tls_sessions == TlsSessions::On
            && self.mirror.protocol == crate::settings::Protocol::Mysql
            && self.workers <= 1
    }

    /// The capture's block timeout: `--capture-block-ms`, or [`DEFAULT_BLOCK_MS`]. libpcap cuts a
    /// TPACKET_V3 ring into blocks of [`CAPTURE_BLOCK_BYTES`] (its largest snap length) and the
    /// kernel retires a block after the timeout even if it holds a few packets: below about a
    /// thousand packets a block (most traffic) a ring holds blocks x timeout of it, whatever
    /// its size in bytes (the copier logs the figure at start). While the copier waits for a
    /// CPU (a saturated host, a CFS-throttled container) that is all the kernel can keep
    /// before it drops.
    pub fn capture_block_ms(&self) -> u16 {
        self.capture_block_ms.unwrap_or(DEFAULT_BLOCK_MS)
    }

    /// The capture filter: the production ports' traffic in both directions, excluding what we
    /// send ourselves (it leaves this host toward the targets with the same port numbers).
    pub fn capture_filter(&self) -> Result<String> {
        Ok(capture_filter(&self.routes()?))
    }

    /// What the live command line asks the driver for (checked by [`Args::validate`]).
    pub fn plan(&self) -> Result<Plan> {
        let prod_dsn = match &self.prod_dsn {
            Some(arg) => Some(
                arg.get()
                    .map_err(|e| anyhow::anyhow!("--prod-dsn: {e}"))?
                    .clone(),
            ),
            None => None,
        };
        Ok(Plan {
            routes: self.routes()?,
            pickup_midstream: !self.no_pickup,
            prod_dsn,
            prod_dsn_wait: Duration::from_millis(self.prod_dsn_wait_ms),
        })
    }

    /// How the live copier captures. Apart from [`Args::validate`]: a ring larger than
    /// `--max-memory` allows has always been refused when the capture is about to open (exit
    /// status 1, as a capture that cannot open; `copier doctor` does not look at it), and
    /// still is (`main` asks for these settings there).
    pub fn capture_settings(&self) -> Result<CaptureSettings> {
        let buffer_bytes = self.capture_buffer_bytes()?;
        Ok(CaptureSettings {
            interface: self.interface.clone(),
            filter: self.capture_filter()?,
            buffer_bytes,
            block_ms: self.capture_block_ms(),
            priority: self.capture_priority,
            workers: self.workers,
            tls_sessions: self.tls_sessions == TlsSessions::On
                && self.mirror.protocol == crate::settings::Protocol::Mysql,
            tls_ring_bytes: self.tls_ring_bytes(),
        })
    }

    /// Refuses set-ups that would hurt production; what is left is the settings every
    /// mirror of this copier (one capture worker or several) runs with.
    pub fn validate(&self) -> Result<LiveSettings> {
        let settings = self.mirror.validate()?;
        self.mirror.validate_routes(&self.routes()?)?;
        self.validate_workers()?;
        if let Some(dsn) = &self.prod_dsn {
            if let Err(e) = dsn.get() {
                bail!("--prod-dsn: {e}");
            }
            if self.mirror.protocol != Protocol::Mysql {
                bail!("--prod-dsn recovers MySQL session state: it needs --protocol mysql");
            }
        }
        Ok(LiveSettings {
            mirror: settings,
            plan: self.plan()?,
        })
    }
}

impl Args {
    /// `--workers N` with what the other flags need: a pool big enough for N shares, and no
    /// `--prod-dsn` (its own connection must be skipped by every worker; not done yet).
    fn validate_workers(&self) -> Result<()> {
        if self.workers <= 1 {
            return Ok(());
        }
        if self.prod_dsn.is_some() {
            bail!(
                "--prod-dsn is not supported with --workers {} yet: use --workers 1",
                self.workers
            );
        }
        let routes = self.routes()?;
        let Some(first) = routes.first() else {
            return Ok(());
        };
        let template = engine_config(&self.mirror.settings(), *first, false);
        let pairs: Vec<_> = routes.iter().map(|r| (r.prod_port, r.target)).collect();
        if let Err(e) = Fleet::check_workers(&template, &pairs, self.mirror.multiply, self.workers)
        {
            bail!("--workers {}: {e}", self.workers);
        }
        Ok(())
    }
}

/// The block timeout without `--capture-block-ms`: every captured packet may wait that long
/// before the copier sees it. Each shorter block is a wakeup of both daemons: the copier's
/// loop and what it relays pace by it. Unpinned, at a moderate 500 transactions a second, 10
/// ms cost both daemons less CPU per query than 6 ms (until then the default ring's, the
/// shortest that held 1 s) and a fifth less than 4 ms, at 1,000 connections too, with the test
/// server no further behind even on results of hundreds of KiB (docs/BENCHMARKS.md, issue 20,
/// eleventh session). The default ring (48 MiB beside the TLS probe's) then holds 1.9 s of
/// traffic, a 16 MiB one 640 ms.
pub const DEFAULT_BLOCK_MS: u16 = 10;

/// `PORT=HOST:PORT`.
pub fn parse_map(s: &str) -> Result<Route, String> {
    let (port, target) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not PORT=HOST:PORT (e.g. 3307=198.18.0.3:3307)"))?;
    let prod_port: u16 = port
        .trim()
        .parse()
        .map_err(|_| format!("{port:?} in {s:?} is not a port number"))?;
    let target: SocketAddrV4 = target.trim().parse().map_err(|_| {
        format!("{target:?} in {s:?} is not IPv4-ADDRESS:PORT (e.g. 198.18.0.3:3307)")
    })?;
    if prod_port == 0 || target.port() == 0 {
        return Err(format!("{s:?}: port 0 is not a port"));
    }
    Ok(Route { prod_port, target })
}

/// Whether `ip` is assigned to an interface of this host: listed by getifaddrs(3), or
/// bindable (which also catches local routes such as all of 127.0.0.0/8).
fn is_local_address(ip: Ipv4Addr) -> bool {
    ops::host::ipv4_addrs().iter().any(|a| a.addr == ip)
        || UdpSocket::bind(SocketAddrV4::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{parse_sample, NOT_PURE_ACK};

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            parse_cidr("198.19.3.7/16").unwrap(),
            (Ipv4Addr::new(198, 19, 0, 0), 16)
        );
        assert!(parse_cidr("198.19.0.0").is_err());
        assert!(parse_cidr("198.19.0.0/40").is_err());
        assert!(parse_cidr("x/16").is_err());
    }

    #[test]
    fn loopback_target_is_refused() {
        let a = Args::parse_from([
            "copier",
            "--target",
            "127.0.0.1:3306",
            "--intercept",
            "198.18.0.4:36524",
        ]);
        let err = a.validate().unwrap_err().to_string();
        assert!(err.contains("production server itself"), "{err}");
        // Any address of this host's interfaces, whatever the port (the loop guard).
        for own in ops::host::ipv4_addrs() {
            let t = SocketAddrV4::new(own.addr, 3307);
            let err = validate_target("--target", "--target", t).unwrap_err();
            assert!(
                err.to_string().contains("production server itself"),
                "{own:?}"
            );
        }
    }

    #[test]
    fn read_only_needs_mysql() {
        let base = [
            "copier",
            "--target",
            "198.18.0.3:3306",
            "--intercept",
            "198.18.0.4:36524",
        ];
        let parse = |more: &[&str]| Args::parse_from(base.iter().chain(more));
        let a = parse(&["--read-only", "--read-only-allow-calls"]);
        assert!(a.mirror.read_only && a.mirror.read_only_allow_calls);
        a.validate().unwrap();
        let err = parse(&["--read-only", "--protocol", "tcp"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--protocol mysql"), "{err}");
        let err = parse(&["--read-only-allow-calls"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("with --read-only"), "{err}");
    }

    #[test]
    fn prod_dsn_needs_mysql_and_hides_its_password() {
        let a = Args::parse_from([
            "copier",
            "--target",
            "198.18.0.3:3306",
            "--intercept",
            "198.18.0.4:36524",
            "--protocol",
            "tcp",
            "--prod-dsn",
            "mysql://tsd_ro:hunter2@198.18.0.2:3306",
        ]);
        assert!(!format!("{a:?}").contains("hunter2"));
        let err = a.validate().unwrap_err().to_string();
        assert!(err.contains("--protocol mysql"), "{err}");
        let bad = Args::parse_from([
            "copier",
            "--target",
            "198.18.0.3:3306",
            "--intercept",
            "198.18.0.4:36524",
            "--prod-dsn",
            "tsd_ro:hunter2@198.18.0.2",
        ])
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("mysql://") && !bad.contains("hunter2"),
            "{bad}"
        );
    }

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["copier", "--intercept", "198.18.0.4:36524"];
        v.extend(extra);
        Args::try_parse_from(v).unwrap()
    }

    #[test]
    fn the_block_timeout_is_10_ms_unless_told() {
        assert_eq!(args(&[]).capture_block_ms(), 10);
        assert_eq!(args(&["--capture-block-ms", "1"]).capture_block_ms(), 1);
        assert_eq!(args(&["--capture-block-ms", "0"]).capture_block_ms(), 0);
        // The default ring (its part of --max-memory's default) holds over a second at it.
        let a = args(&[]);
        let blocks = a.capture_buffer_bytes().unwrap() as usize / CAPTURE_BLOCK_BYTES;
        assert!(blocks as u64 * u64::from(a.capture_block_ms()) >= 1000);
    }

    fn route(port: u16, target: &str) -> Route {
        Route {
            prod_port: port,
            target: target.parse().unwrap(),
        }
    }

    #[test]
    fn the_capture_is_raised_only_while_it_falls_behind_unless_told_otherwise() {
        use ops::sched::Priority;
        // Raised from the start, it ran before production and burst its sends
        // (docs/BENCHMARKS.md); never raised, a saturated host starved it into kernel drops.
        assert_eq!(args(&[]).capture_priority, Priority::Auto);
        assert_eq!(
            args(&["--capture-priority", "realtime"]).capture_priority,
            Priority::Realtime
        );
        assert_eq!(
            args(&["--capture-priority", "high"]).capture_priority,
            Priority::High
        );
    }

    #[test]
    fn map_adds_to_or_replaces_port_and_target() {
        let a = args(&["--port", "3306", "--target", "198.18.0.3:3306"]);
        assert_eq!(a.routes().unwrap(), vec![route(3306, "198.18.0.3:3306")]);
        let a = args(&[
            "--port",
            "5001",
            "--target",
            "198.18.0.3:5001",
            "--map",
            "5002=198.18.0.3:5002,5003=198.18.0.5:6000",
        ]);
        assert_eq!(
            a.routes().unwrap(),
            vec![
                route(5001, "198.18.0.3:5001"),
                route(5002, "198.18.0.3:5002"),
                route(5003, "198.18.0.5:6000")
            ]
        );
        let a = args(&[
            "--map",
            "3307=198.18.0.3:3307",
            "--map",
            "3308=198.18.0.3:3308",
        ]);
        assert_eq!(a.routes().unwrap().len(), 2);
        let f = capture_filter(&a.routes().unwrap());
        assert_eq!(
            f,
            format!(
                "tcp and (((dst port 3307 or dst port 3308) and not (dst host 198.18.0.3) and \
                 {NOT_PURE_ACK}) or ((src port 3307 or src port 3308) and not (src host \
                 198.18.0.3)))"
            )
        );
        let err = args(&["--port", "3307", "--map", "3308=198.18.0.3:3308"])
            .routes()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--map 3307=HOST:PORT"), "{err}");
        let err = args(&[]).routes().unwrap_err().to_string();
        assert!(err.contains("--target"), "{err}");
        let err = args(&[
            "--target",
            "198.18.0.3:3306",
            "--map",
            "3306=198.18.0.3:3306",
        ])
        .routes()
        .unwrap_err()
        .to_string();
        assert!(err.contains("--multiply"), "{err}");
        let err = args(&["--map", "3306=127.0.0.1:3306"])
            .routes()
            .unwrap_err()
            .to_string();
        assert!(err.contains("production server itself"), "{err}");
    }

    #[test]
    fn tee_needs_two_targets_and_calibration_needs_tee_and_a_report() {
        let err = args(&["--target", "198.18.0.3:3306", "--tee"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least two --target"), "{err}");
        let two = ["--target", "198.18.0.3:3306,198.18.0.5:3306"];
        let pool = ["--client-ip-pool", "198.19.0.0/24"];
        let tee = [&two[..], &pool[..], &["--tee"]].concat();
        args(&tee).validate().unwrap();
        let cal = ["--ab-calibration", "/tmp/aa.json"];
        let err = args(&[&two[..], &pool[..], &cal[..], &["--report", "/tmp/r"]].concat())
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("only applies with --tee and --report"),
            "{err}"
        );
        args(&[&tee[..], &cal[..], &["--report", "/tmp/r"]].concat())
            .validate()
            .unwrap();
    }

    #[test]
    fn several_targets_pair_with_their_intercepts() {
        let a = args(&[
            "--target",
            "198.18.0.3:3306",
            "--target",
            "198.18.0.5:3306",
            "--intercept",
            "198.18.0.6:36524",
            "--client-ip-pool",
            "198.19.0.0/24",
        ]);
        assert_eq!(
            a.routes().unwrap(),
            vec![
                route(3306, "198.18.0.3:3306"),
                route(3306, "198.18.0.5:3306")
            ]
        );
        assert_eq!(a.mirror.intercept.len(), 2);
        assert_eq!(
            a.mirror
                .settings()
                .intercept_index("198.18.0.3:3306".parse().unwrap()),
            0
        );
        assert_eq!(
            a.mirror
                .settings()
                .intercept_index("198.18.0.5:3306".parse().unwrap()),
            1
        );
        a.validate().unwrap();
        // One intercept for both is fine too.
        let one = Args::try_parse_from([
            "copier",
            "--intercept",
            "198.18.0.4:36524",
            "--target",
            "198.18.0.3:3306,198.18.0.5:3306",
            "--client-ip-pool",
            "198.19.0.0/24",
        ])
        .unwrap();
        one.validate().unwrap();
        assert_eq!(
            one.mirror
                .settings()
                .intercept_index("198.18.0.5:3306".parse().unwrap()),
            0
        );
        // Three intercepts for two targets: which goes with which?
        let err = args(&[
            "--target",
            "198.18.0.3:3306,198.18.0.5:3306",
            "--intercept",
            "198.18.0.6:1,198.18.0.7:1",
            "--client-ip-pool",
            "198.19.0.0/24",
        ])
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("3 --intercept for 2 --target"), "{err}");
        let err = args(&["--target", "198.18.0.3:3306,198.18.0.5:3306"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--client-ip-pool"), "{err}");
        let err = args(&["--target", "198.18.0.3:3306,198.18.0.3:3306"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn bad_maps_say_what_is_expected() {
        for bad in [
            "3306",
            "x=198.18.0.3:1",
            "3306=host:1",
            "3306=198.18.0.3",
            "0=1.2.3.4:5",
        ] {
            let e = parse_map(bad).unwrap_err();
            assert!(e.contains(bad) || e.contains("port 0"), "{bad}: {e}");
        }
    }

    #[test]
    fn single_capture_filter_is_unchanged() {
        let a = args(&["--target", "198.18.0.3:3306"]);
        assert_eq!(
            a.capture_filter().unwrap(),
            format!(
                "tcp and ((dst port 3306 and not dst host 198.18.0.3 and {NOT_PURE_ACK}) or \
                 (src port 3306 and not src host 198.18.0.3))"
            )
        );
    }

    /// A segment as the capture sees it (raw IPv4, no link header).
    fn segment(src: SocketAddrV4, dst: SocketAddrV4, flags: u8, payload: &[u8]) -> Vec<u8> {
        use common::seq::SeqNumber;
        use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions};
        let repr = SegmentRepr {
            src: *src.ip(),
            dst: *dst.ip(),
            src_port: src.port(),
            dst_port: dst.port(),
            seq: SeqNumber(1000),
            ack: SeqNumber(2000),
            flags: TcpFlags(flags),
            window: 500,
            options: TcpOptions {
                timestamps: Some((1, 2)),
                ..TcpOptions::default()
            },
            ip_id: 1,
            ttl: 64,
        };
        let mut buf = vec![0u8; 200];
        let n = emit_ipv4_tcp(&repr, payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// The filter as the kernel runs it (compiled by libpcap for raw IPv4, as the bridge
    /// socket's): the clients' segments pass but their pure ACKs; production's all pass; our
    /// own sends to the target never. With one route and with several.
    #[test]
    fn the_capture_filter_keeps_all_but_the_clients_pure_acks() {
        use common::wire::TcpFlags;
        const A: u8 = TcpFlags::ACK;
        const PA: u8 = TcpFlags::ACK | TcpFlags::PSH;
        // 12: DLT_RAW, raw IPv4, as the bridge socket compiles it.
        let dead = pcap::Capture::dead(pcap::Linktype(12)).unwrap();
        let compiled = |a: Args| dead.compile(&capture_filter(&a.routes().unwrap()), true);
        let one = compiled(args(&["--target", "198.18.0.3:3306"])).unwrap();
        let client = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000);
        let prod = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 3306);
        let test = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306);
        // From, to, flags, payload, kept, what.
        type Case = (
            SocketAddrV4,
            SocketAddrV4,
            u8,
            &'static [u8],
            bool,
            &'static str,
        );
        let cases: &[Case] = &[
            (client, prod, A, b"", false, "a client's pure ACK"),
            (client, prod, PA, b"", false, "a client's pure ACK with PSH"),
            (
                client,
                prod,
                PA,
                b"\x01\0\0\0\x0e",
                true,
                "a client's command",
            ),
            (client, prod, A, b"x", true, "a client's one byte"),
            (client, prod, TcpFlags::SYN, b"", true, "a client's SYN"),
            (client, prod, TcpFlags::FIN | A, b"", true, "a client's FIN"),
            (client, prod, TcpFlags::RST, b"", true, "a client's RST"),
            (prod, client, A, b"", true, "production's pure ACK"),
            (prod, client, PA, b"reply", true, "production's reply"),
            (
                prod,
                client,
                TcpFlags::SYN | A,
                b"",
                true,
                "production's SYN-ACK",
            ),
            (
                client,
                test,
                PA,
                b"command",
                false,
                "our own send to the target",
            ),
        ];
        for &(src, dst, flags, payload, kept, what) in cases {
            assert_eq!(
                one.filter(&segment(src, dst, flags, payload)),
                kept,
                "{what}"
            );
        }
        let two = compiled(args(&[
            "--map",
            "3306=198.18.0.3:3306",
            "--map",
            "3307=198.18.0.5:3307",
        ]))
        .unwrap();
        let prod2 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 3307);
        assert!(
            !two.filter(&segment(client, prod2, A, b"")),
            "pure ACK, port 2"
        );
        assert!(
            two.filter(&segment(client, prod2, PA, b"x")),
            "command, port 2"
        );
        assert!(
            two.filter(&segment(prod2, client, A, b"")),
            "prod's ACK, port 2"
        );
    }

    #[test]
    fn multiply_and_several_routes_need_a_pool() {
        let err = args(&["--target", "198.18.0.3:3306", "--multiply", "3"])
            .mirror
            .validate_routes(&[route(3306, "198.18.0.3:3306")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--multiply 3") && err.contains("--client-ip-pool"),
            "{err}"
        );
        let a = args(&[
            "--target",
            "198.18.0.3:3306",
            "--multiply",
            "3",
            "--client-ip-pool",
            "198.19.0.0/24",
        ]);
        a.mirror.validate_routes(&a.routes().unwrap()).unwrap();
        let a = args(&[
            "--target",
            "198.18.0.3:3306",
            "--map",
            "3307=198.18.0.3:3307",
        ]);
        let err = a
            .mirror
            .validate_routes(&a.routes().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--client-ip-pool"), "{err}");
        assert!(
            Args::try_parse_from(["copier", "--intercept", "1.2.3.4:5", "--multiply", "17"])
                .is_err()
        );
        assert!(
            Args::try_parse_from(["copier", "--intercept", "1.2.3.4:5", "--multiply", "0"])
                .is_err()
        );
    }

    #[test]
    fn sample_takes_a_share_in_percent() {
        let a = args(&["--target", "198.18.0.3:3306", "--sample", "12.5"]);
        assert!((a.mirror.sample.unwrap().percent() - 12.5).abs() < 1e-6);
        assert!(parse_sample("60%").is_ok());
        for bad in ["0", "100.5", "-3", "abc", "NaN"] {
            assert!(parse_sample(bad).is_err(), "{bad}");
        }
        assert!(parse_sample("0").unwrap_err().contains("above 0"));
    }
}

/// `--tls-sessions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsSessions {
    On,
    Off,
}
