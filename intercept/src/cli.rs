//! intercept's command line: the daemon's flags (clap, also read from the config file), the
//! doctor's, and [`Args::validate`], which refuses set-ups that cannot work before anything
//! is opened; the figures derived from the flags (ports, memory shares, session limits).
//!
//! Must never open anything (capture, socket, file) but `--secret-file`, read when asked
//! ([`Args::secret`]): the wiring that opens things is `daemon`'s.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use common::control::{MAX_FEEDBACK_PER_FRAME, MAX_MYSQL_HEAD, MAX_PAYLOAD_PREFIX};

use crate::onhost::OnHostArgs;
use crate::sessions::SessionConfig;

/// Capture the test server's replies on the assist host and relay them to the copiers.
///
/// The test server routes its replies for mirrored clients to this host, which must have
/// ip_forward=0 so the kernel drops them after we have seen them. Copiers connect to --listen
/// and claim the client addresses of the sessions they replay; each reply goes to the copier
/// that claimed its destination, or to every copier when nobody has claimed it yet.
#[derive(Parser, Debug)]
#[command(name = "intercept", version)]
pub struct Args {
    /// The test server's port: replies are captured by this source port. Several (one per
    /// copier `--map` target port): repeat the flag or separate them with commas.
    #[arg(long, env = "TCPSHADOW_PORT", required_unless_present = "cleanup", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Vec<u16>,

    /// Address the copiers connect to.
    #[arg(
        long,
        default_value = "0.0.0.0:36524",
        env = "TCPSHADOW_INTERCEPT_LISTEN"
    )]
    pub listen: SocketAddr,

    /// Interface to capture on; `any` sees every interface.
    #[arg(long, default_value = "any", env = "TCPSHADOW_INTERFACE")]
    pub interface: String,

    /// Only replies from this test server address (useful when several servers route here).
    #[arg(long, env = "TCPSHADOW_SERVER")]
    pub server: Option<Ipv4Addr>,

    /// What the test server speaks. `mysql`: replies are reassembled and cut into MySQL
    /// packets, whose summaries (greeting, auth exchange, prepare-OK, response heads) go to the
    /// copiers; captures whole segments. `tcp`: per-segment feedback only.
    #[arg(long, value_enum, default_value_t = ProtocolArg::Mysql, env = "TCPSHADOW_PROTOCOL")]
    pub protocol: ProtocolArg,

    /// Payload bytes of each reply's per-segment feedback. At most 4096. Default: 0 with
    /// `--protocol mysql` (the packet summaries carry what the copier needs), 64 with `tcp`.
    #[arg(long, env = "TCPSHADOW_PAYLOAD_PREFIX", value_parser = clap::value_parser!(u16).range(0..=MAX_PAYLOAD_PREFIX as i64))]
    pub payload_prefix: Option<u16>,

    /// Payload bytes summarised per MySQL packet after the first 8 of a connection (which are
    /// sent whole, up to 1024 bytes). 16 covers OK/ERR codes, PREPARE_OK, column counts and
    /// EOF status flags. At most 1024.
    #[arg(long, env = "TCPSHADOW_MYSQL_HEAD", default_value_t = 16, value_parser = clap::value_parser!(u16).range(0..=MAX_MYSQL_HEAD as i64))]
    pub mysql_head: u16,

    /// Most connections framed at once; further ones are not framed (counted, and their copier
    /// is told).
    #[arg(long, env = "TCPSHADOW_MYSQL_MAX_SESSIONS", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..))]
    pub mysql_max_sessions: u32,

    /// Seconds after which a connection without any reply is forgotten (only matters when its
    /// FIN was not captured). Keep it above the test server's wait_timeout (default 28800), or
    /// idle pooled connections lose their framing.
    #[arg(long, env = "TCPSHADOW_MYSQL_IDLE_SECS", default_value_t = 32_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub mysql_idle_secs: u64,

    /// File holding the control channel's shared secret (the copiers get a copy; at least 16
    /// bytes, e.g. `head -c 32 /dev/urandom | base64`; chmod 600, or it is refused). A copier
    /// must prove it holds it, and intercept proves it back; it never crosses the wire.
    /// Without it the control channel is open to anyone allowed by --allow (warned at start).
    #[arg(long, env = "TCPSHADOW_SECRET_FILE", value_name = "PATH")]
    pub secret_file: Option<PathBuf>,

    /// Removed: the cleartext token of control protocol 3. Refused with a pointer to
    /// --secret-file.
    #[arg(long, env = "TCPSHADOW_TOKEN_FILE", hide = true)]
    pub token_file: Option<PathBuf>,

    /// Copier addresses allowed to connect, as CIDR (or one address); repeatable or
    /// comma-separated. Connections from elsewhere are closed before anything is read
    /// (logged and counted). Not given: every address may connect (warned at start).
    #[arg(long, env = "TCPSHADOW_ALLOW", value_name = "CIDR", value_delimiter = ',', value_parser = parse_arp_check)]
    pub allow: Vec<(Ipv4Addr, u8)>,

    /// Most copier connections served at once; further ones are refused with a reason
    /// (counted in the status line's `rejected`). Each costs two threads and their buffers.
    #[arg(long, env = "TCPSHADOW_MAX_COPIERS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_copiers: u32,

    /// Seconds between status lines; 0 for none (the final summary is always printed).
    #[arg(long, env = "TCPSHADOW_STATUS_INTERVAL", default_value_t = 5)]
    pub status_interval: u64,

    /// Which packets of the interface to capture: `in` on an assist host (replies arrive),
    /// `out` when intercept runs on the test host itself (replies leave). On `lo` libpcap shows
    /// each packet once, as incoming: use `in` there.
    #[arg(long, env = "TCPSHADOW_DIRECTION", value_enum, default_value_t = DirectionArg::In)]
    pub direction: DirectionArg,

    /// Kernel capture buffer, in MiB: absorbs bursts while intercept is busy. At most a quarter
    /// of --max-memory (larger is refused).
    #[arg(long, env = "TCPSHADOW_BUFFER_MIB", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub buffer_mib: u32,

    /// Scheduling priority of the capture and its threads: normal (as started, the default),
    /// high (nice -20) or realtime (SCHED_RR 1). Raise it only if the status line shows
    /// kernel drops while the CPU is not saturated. Sharing a core with the test server (the
    /// lab, --on-test-host), a raised intercept preempts it at every reply: measured in the
    /// lab, the test server fell behind and intercept spent 3x the CPU per reply, woken per
    /// reply instead of per handful. Raising needs CAP_SYS_NICE at start (or systemd's
    /// Nice=); without it intercept says so and runs as started.
    #[arg(long, env = "TCPSHADOW_CAPTURE_PRIORITY", value_enum, default_value_t = ops::sched::Priority::Normal)]
    pub capture_priority: ops::sched::Priority,

    /// Longest wait, in ms, before the kernel hands captured replies over (a TPACKET_V3
    /// block timeout): one wakeup and one control write per block instead of one per reply,
    /// about a third of the CPU here and less in the copier. But the copier then wakes once
    /// per block and sends the client commands it captured meanwhile in one burst, which the
    /// test server answers queued: the report's test latencies rise for the first command of
    /// each burst (docs/BENCHMARKS.md). 0 (default): a packet socket woken per reply, whose
    /// queue (--buffer-mib) is counted in what each reply really takes. 1-3 suits mirroring
    /// for load when the latency report does not matter.
    #[arg(long, env = "TCPSHADOW_CAPTURE_BLOCK_MS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=100))]
    pub capture_block_ms: u16,

    /// Microseconds replies gather before they are handled: the capture sleeps this long after
    /// each wakeup, then relays what gathered in one write per copier. Under load that is one
    /// wakeup per period instead of one per reply, in intercept and in the copier: together
    /// about half of both daemons' CPU. Replies keep their kernel timestamps. While a copier
    /// that times replies (`--report`) is connected the capture does not gather; while a
    /// copier says one of its sessions waits on the test server (a login, a PREPARE_OK: its
    /// Prompt), it gathers 1 ms at most. 0: handle every reply as it comes.
    #[arg(long, env = "TCPSHADOW_RELAY_FLUSH_US", default_value_t = 4000, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub relay_flush_us: u32,

    /// Memory intercept may use, in MiB (32 to 65536): a quarter at most for the capture ring
    /// (--buffer-mib), a quarter for the copiers' feedback queues together (one copier's at most
    /// a quarter of that; beyond, its feedback is dropped and counted), 3/8
    /// for the MySQL sessions table (--mysql-max-sessions is lowered to what fits), 1/16 for
    /// the out-of-order reply bytes all sessions hold (beyond, the session whose hold grows
    /// loses its framing, counted). See docs/RELIABILITY.md.
    #[arg(long, env = "TCPSHADOW_MAX_MEMORY", value_name = "MB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(32..=65536))]
    pub max_memory: u32,

    /// Capture threads (1 to 64). N > 1: N captures share the replies by flow hash (kernel
    /// PACKET_FANOUT; each connection on one thread, its MySQL framing whole), each relaying
    /// to the copier that claimed the session. Each capture gets its own --buffer-mib. Not
    /// with --on-test-host.
    #[arg(long, env = "TCPSHADOW_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,

    /// Feedback batches queued per copier before its feedback is dropped (counted).
    #[arg(long, env = "TCPSHADOW_QUEUE_BATCHES", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_batches: u32,

    /// Most replies per feedback batch.
    #[arg(long, env = "TCPSHADOW_BATCH", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=MAX_FEEDBACK_PER_FRAME as i64))]
    pub batch: u32,

    #[command(flatten)]
    pub on_host: OnHostArgs,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (names in docs/metrics.md),
    /// refreshed every second.
    #[arg(long, env = "TCPSHADOW_METRICS", value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,

    #[command(flatten)]
    pub config: ops::config::ConfigArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    Mysql,
    Tcp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DirectionArg {
    In,
    Out,
    Both,
}

impl From<DirectionArg> for pcap::Direction {
    fn from(d: DirectionArg) -> Self {
        match d {
            DirectionArg::In => pcap::Direction::In,
            DirectionArg::Out => pcap::Direction::Out,
            DirectionArg::Both => pcap::Direction::InOut,
        }
    }
}

/// `intercept doctor`: the daemon's flags and config file, plus what only the doctor takes.
#[derive(Parser, Debug)]
#[command(
    name = "intercept doctor",
    about = "Check this assistant host for intercept: forwarding off, capture permission, the \
             listen address, replies arriving, and (with --arp-check) who answers ARP for the \
             mirrored client addresses. Exit status 1 if any check FAILs."
)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub daemon: Args,

    /// Also ask who answers ARP for these addresses (CIDR, e.g. the copiers'
    /// --client-ip-pool; repeatable or comma-separated): only this host may. Needs --server
    /// (the test server) or a capture --interface other than `any` to know the segment.
    #[arg(long, value_name = "CIDR", value_delimiter = ',', value_parser = parse_arp_check)]
    pub arp_check: Vec<(Ipv4Addr, u8)>,
}

fn parse_arp_check(s: &str) -> Result<(Ipv4Addr, u8), String> {
    if let Ok(ip) = s.parse::<Ipv4Addr>() {
        return Ok((ip, 32));
    }
    ops::host::parse_cidr(s)
}

impl Args {
    /// The ports, each once, in order.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = self.port.clone();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    pub fn ports_label(&self) -> String {
        let ports: Vec<String> = self.ports().iter().map(u16::to_string).collect();
        ports.join(",")
    }

    pub fn mysql(&self) -> bool {
        self.protocol == ProtocolArg::Mysql
    }

    pub fn payload_prefix(&self) -> u16 {
        self.payload_prefix
            .unwrap_or(if self.mysql() { 0 } else { 64 })
    }

    pub fn memory_bytes(&self) -> usize {
        (self.max_memory as usize) << 20
    }

    /// Each copier's feedback queue, bytes: a quarter of the copiers' part (a quarter of
    /// --max-memory, which bounds all queues together), so that a burst toward one copier has
    /// room while a single slow copier cannot starve the others.
    pub fn queue_bytes(&self) -> usize {
        self.memory_bytes() / 16
    }

    /// --mysql-max-sessions, lowered so that 3/8 of --max-memory holds that many sessions at
    /// their fixed size (`sessions::SESSION_BYTES`).
    pub fn max_sessions(&self) -> usize {
        let fit = self.memory_bytes() / 8 * 3 / crate::sessions::SESSION_BYTES;
        (self.mysql_max_sessions as usize).min(fit.max(1))
    }

    pub fn sessions(&self) -> Option<SessionConfig> {
        self.mysql().then(|| SessionConfig {
            head: usize::from(self.mysql_head),
            max_sessions: self.max_sessions(),
            // A sixteenth for all sessions' held out-of-order reply bytes.
            max_held_total: self.memory_bytes() / 16,
            idle_timeout: Duration::from_secs(self.mysql_idle_secs),
            ..SessionConfig::default()
        })
    }

    /// Refuses set-ups that cannot work, before anything is opened (`run` calls it; not
    /// for `--cleanup`, which takes no other flag).
    pub fn validate(&self) -> Result<()> {
        if self.token_file.is_some() {
            bail!("{}", ops::secret::TOKEN_FILE_GONE);
        }
        if u64::from(self.buffer_mib) * u64::from(self.workers) > u64::from(self.max_memory / 4) {
            bail!(
                "--buffer-mib {} x {} workers is more than --max-memory {} allows for the capture \
                 rings (a quarter, {} MiB): raise --max-memory or lower --buffer-mib",
                self.buffer_mib,
                self.workers,
                self.max_memory,
                self.max_memory / 4
            );
        }
        if self.workers > 1 && self.on_host.on_test_host {
            bail!(
                "--workers {} fans out the pcap capture; --on-test-host reads one queue: use \
                 --workers 1 there",
                self.workers
            );
        }
        Ok(())
    }

    /// The control channel's secret from --secret-file, if given (the removed --token-file is
    /// refused with the way to fix it).
    pub fn secret(&self) -> Result<Option<common::auth::Secret>> {
        if self.token_file.is_some() {
            bail!("{}", ops::secret::TOKEN_FILE_GONE);
        }
        ops::secret::control_secret(self.secret_file.as_deref())
    }

    /// What `intercept doctor` (and the start-up forwarding check) look at.
    pub fn doctor_setup(&self) -> crate::doctor::Setup {
        crate::doctor::Setup {
            interface: self.interface.clone(),
            listen: self.listen,
            ports: self.ports(),
            server: self.server,
            direction: self.direction.into(),
        }
    }
}

/// Said once at start for each way the control channel is open.
pub fn open_channel_warnings(
    listen: SocketAddr,
    has_secret: bool,
    allow: &[(Ipv4Addr, u8)],
) -> Vec<String> {
    let mut out = Vec::new();
    if !has_secret {
        out.push(format!(
            "the control channel is open: no --secret-file, so anything that can reach --listen \
             {listen} can connect as a copier, claim sessions and read the test server's replies; \
             set --secret-file on intercept and every copier"
        ));
    }
    if allow.is_empty() && !listen.ip().is_loopback() {
        out.push(format!(
            "no --allow: copiers may connect to {listen} from any address; list the copiers' \
             networks with --allow CIDR"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn validate_refuses_what_cannot_work_and_says_the_fix() {
        let ok = Args::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        ok.validate().unwrap();
        let token =
            Args::try_parse_from(["intercept", "--port", "1", "--token-file", "/etc/t"]).unwrap();
        let e = token.validate().unwrap_err().to_string();
        assert!(
            e.starts_with(
                "--token-file (token-file, TCPSHADOW_TOKEN_FILE) was replaced by \
                 --secret-file"
            ) && e.contains("chmod 600"),
            "{e}"
        );
        let rings = Args::try_parse_from([
            "intercept",
            "--port",
            "3306",
            "--buffer-mib",
            "40",
            "--workers",
            "2",
        ])
        .unwrap();
        assert_eq!(
            rings.validate().unwrap_err().to_string(),
            "--buffer-mib 40 x 2 workers is more than --max-memory 256 allows for the capture \
             rings (a quarter, 64 MiB): raise --max-memory or lower --buffer-mib"
        );
        let queue = Args::try_parse_from([
            "intercept",
            "--port",
            "3306",
            "--workers",
            "2",
            "--on-test-host",
            "--client-ip-pool",
            "198.19.0.0/16",
        ])
        .unwrap();
        assert_eq!(
            queue.validate().unwrap_err().to_string(),
            "--workers 2 fans out the pcap capture; --on-test-host reads one queue: use \
             --workers 1 there"
        );
    }

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
        DoctorArgs::command().debug_assert();
    }

    #[test]
    fn every_flag_is_a_config_key_with_its_environment_variable() {
        let bad = ops::config::env_inconsistencies(
            &Args::command(),
            &[("listen", "TCPSHADOW_INTERCEPT_LISTEN")],
        );
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn the_example_config_file_loads() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/intercept.toml");
        let cfg = ops::config::ConfigFile::load(&path, &Args::command()).unwrap();
        let m = cfg
            .apply(Args::command())
            .try_get_matches_from(["intercept"])
            .unwrap();
        let cli = <Args as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        assert_eq!(cli.ports(), vec![3306]);
        assert_eq!(cli.listen, "0.0.0.0:36524".parse().unwrap());
        // Every key of the daemon is documented in the example (set or commented out).
        let text = std::fs::read_to_string(&path).unwrap();
        for arg in ops::config::config_keys(&Args::command()) {
            let key = arg.get_long().unwrap();
            assert!(
                text.lines().any(|l| l
                    .trim_start_matches(['#', ' '])
                    .starts_with(&format!("{key} ="))),
                "deploy/intercept.toml does not document `{key}`"
            );
        }
    }

    #[test]
    fn an_open_control_channel_is_warned_about() {
        let open: SocketAddr = "0.0.0.0:36524".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:36524".parse().unwrap();
        let allow = [(Ipv4Addr::new(198, 18, 0, 2), 32)];
        let w = open_channel_warnings(open, false, &[]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("--secret-file") && w[0].contains("0.0.0.0:36524"),
            "{w:?}"
        );
        assert!(w[1].contains("--allow"), "{w:?}");
        assert!(open_channel_warnings(open, true, &allow).is_empty());
        assert_eq!(open_channel_warnings(lo, false, &[]).len(), 1);
        assert!(open_channel_warnings(lo, true, &[]).is_empty());
        let cli = Args::try_parse_from([
            "intercept",
            "--port",
            "3306",
            "--allow",
            "198.18.0.2,198.19.0.0/16",
            "--allow",
            "10.0.0.0/8",
        ])
        .unwrap();
        assert_eq!(cli.allow.len(), 3);
        assert_eq!(cli.allow[0], (Ipv4Addr::new(198, 18, 0, 2), 32));
        assert!(Args::try_parse_from(["intercept", "--port", "1", "--allow", "x/8"]).is_err());
        let cli =
            Args::try_parse_from(["intercept", "--port", "1", "--token-file", "/etc/t"]).unwrap();
        let e = cli.secret().unwrap_err().to_string();
        assert!(e.contains("--secret-file"), "{e}");
        let cli = Args::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        assert_eq!(cli.max_copiers, 64);
        assert!(
            Args::try_parse_from(["intercept", "--port", "3306", "--max-copiers", "0"]).is_err()
        );
    }

    #[test]
    fn max_memory_bounds_the_queues_and_the_session_table() {
        let cli = Args::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        // 256 MiB: 64 MiB for all copiers' queues, 16 MiB at most for one; 3/8 holds 65,536
        // sessions.
        assert_eq!(cli.queue_bytes(), 16 << 20);
        assert_eq!(cli.max_sessions(), 65_536);
        let small =
            Args::try_parse_from(["intercept", "--port", "3306", "--max-memory", "32"]).unwrap();
        assert_eq!(small.queue_bytes(), 2 << 20);
        assert_eq!(
            small.max_sessions(),
            (12 << 20) / crate::sessions::SESSION_BYTES
        );
        assert!(small.max_sessions() < 65_536);
        assert!(
            Args::try_parse_from(["intercept", "--port", "3306", "--max-memory", "16"]).is_err()
        );
    }

    #[test]
    fn several_ports_repeated_or_comma_separated() {
        let cli =
            Args::try_parse_from(["intercept", "--port", "3307,3306", "--port", "3307"]).unwrap();
        assert_eq!(cli.ports(), vec![3306, 3307]);
        assert_eq!(cli.ports_label(), "3306,3307");
        assert!(Args::try_parse_from(["intercept"]).is_err());
        assert!(Args::try_parse_from(["intercept", "--port", "0"]).is_err());
    }

    #[test]
    fn on_test_host_flags_and_cleanup_without_a_port() {
        let cli = Args::try_parse_from(["intercept", "--cleanup"]).unwrap();
        assert!(cli.on_host.cleanup);
        let cli = Args::try_parse_from([
            "intercept",
            "--port",
            "3306",
            "--on-test-host",
            "--client-ip-pool",
            "198.19.7.9/24",
        ])
        .unwrap();
        assert!(cli.on_host.on_test_host);
        assert_eq!(
            cli.on_host.client_ip_pool,
            Some((Ipv4Addr::new(198, 19, 7, 0), 24))
        );
        assert_eq!(cli.on_host.queue_num, crate::onhost::DEFAULT_QUEUE);
        assert!(Args::try_parse_from(["intercept", "--on-test-host"]).is_err());
    }

    #[test]
    fn payload_prefix_is_bounded() {
        assert!(
            Args::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4097"])
                .is_err()
        );
        let cli = Args::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4096"])
            .unwrap();
        assert_eq!(cli.payload_prefix(), 4096);
    }

    #[test]
    fn mysql_is_the_default_and_tcp_behaves_as_before() {
        let cli = Args::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        assert!(cli.mysql());
        assert_eq!(cli.payload_prefix(), 0);
        assert_eq!(cli.sessions().map(|s| s.head), Some(16));
        let cli =
            Args::try_parse_from(["intercept", "--port", "3306", "--protocol", "tcp"]).unwrap();
        assert_eq!(cli.payload_prefix(), 64);
        assert!(cli.sessions().is_none());
        assert!(
            Args::try_parse_from(["intercept", "--port", "3306", "--mysql-head", "1025"]).is_err()
        );
    }
}
