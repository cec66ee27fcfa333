//! The copier's validated settings: what the mirror runs with, once the command line (or
//! config file) has been parsed and checked by `cli`.
//!
//! # What this room is for
//!
//! Plain data and the pure answers derived from it: the routes (`--port`/`--target`, `--map`),
//! the protocol, the [`MirrorSettings`] every mirror (live, replay, each capture worker) runs
//! with, the [`Plan`] a live capture and a replay decide differently, the live copier's
//! [`LiveSettings`] and [`CaptureSettings`], and the capture filter the routes give.
//! `builders` turns these into engines; `driver` runs them.
//!
//! [`MirrorSettings`] is also where its flags are declared (clap's derive, flattened into
//! `cli::MirrorArgs`), with the parsers of their single values ([`parse_cidr`],
//! `parse_sample`): one list of fields instead of a flag struct copied field by field.
//!
//! # What it must never do
//!
//! * Depend on the command-line module (`cli`) or on anything that owns I/O (`driver`,
//!   `run`, `replay`): the arrow goes cli -> settings -> builders -> driver.
//! * Refuse a set-up: the checks across flags, and their messages, are `cli`'s
//!   (`MirrorArgs::validate`); a value parser here only says a value is not one.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::engine::{MemoryBudget, Sample};
use crate::prod_state::ProdDsn;

/// One production port mirrored to one test server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub prod_port: u16,
    pub target: SocketAddrV4,
}

/// The application protocol of the mirrored port.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Mysql,
    Tcp,
}

/// What every mirror runs with (live, replay, each capture worker). Also the flags that give
/// it: `cli::MirrorArgs` flattens this struct, so each field is documented once, as its flag,
/// and `cli` checks the values (`MirrorArgs::validate`) before anything runs with them.
#[derive(clap::Args, Clone, Debug)]
pub struct MirrorSettings {
    /// Test server to mirror to, IP:PORT. Must not be this host's own production server.
    /// Repeatable (or comma-separated): the connections are spread over the test servers, each
    /// connection to one, chosen by a fixed hash of the client's address and port (a restarted
    /// copier places a connection where it was); needs --client-ip-pool. With --tee, each
    /// connection goes to every one of them.
    #[arg(long, env = "TCPSHADOW_TARGET", value_delimiter = ',')]
    pub target: Vec<SocketAddrV4>,

    /// Mirror every connection to every --target (A/B experiments: test servers that differ in
    /// one setting get the same traffic), instead of spreading the connections over them. Each
    /// target's copy sends from its own slice of --client-ip-pool; the report compares each
    /// test server with production and the targets with each other (docs/ab.md).
    #[arg(long, env = "TCPSHADOW_TEE")]
    pub tee: bool,

    /// Intercept daemon's control address, HOST:PORT (it relays the test server's replies).
    /// With several --target: one --intercept for all, or one per --target in the same order.
    #[arg(
        long,
        env = "TCPSHADOW_INTERCEPT",
        value_delimiter = ',',
        required = true
    )]
    pub intercept: Vec<SocketAddr>,

    /// Rewrite mirrored client addresses into this range (CIDR), e.g. 198.19.0.0/16, so the test
    /// server's routes need not cover the real clients. The client port is kept.
    #[arg(long, env = "TCPSHADOW_CLIENT_IP_POOL", value_parser = parse_cidr)]
    pub client_ip_pool: Option<(Ipv4Addr, u8)>,

    /// Largest TCP payload sent to the target (path MTU minus 40).
    #[arg(long, env = "TCPSHADOW_MSS", default_value_t = 1460, value_parser = clap::value_parser!(u16).range(88..=65495))]
    pub mss: u16,

    /// Longest wait, in ms, of an ACK for the test server's data: the client's next command
    /// carries it, or it goes alone when this runs out; every second segment, a FIN or
    /// anything out of order is acknowledged at once. 0: a pure ACK for every segment.
    #[arg(long, env = "TCPSHADOW_DELAYED_ACK_MS", default_value_t = 5, value_parser = clap::value_parser!(u16).range(0..=100))]
    pub delayed_ack_ms: u16,

    /// What the port speaks: `mysql` rewrites each login with the test server's own scramble
    /// and maps prepared-statement ids; `tcp` mirrors bytes as they are.
    #[arg(long, env = "TCPSHADOW_PROTOCOL", value_enum, default_value_t = Protocol::Mysql)]
    pub protocol: Protocol,

    /// MySQL: the passwords valid on the test server, one `user:password` per line, in a file
    /// only its owner can read (chmod 600). Without it, logins are forwarded unchanged and fail
    /// on a test server that checks passwords.
    #[arg(long, env = "TCPSHADOW_MYSQL_CREDENTIALS")]
    pub mysql_credentials: Option<PathBuf>,

    /// MySQL: the user (listed in --mysql-credentials) that logs in on the test server for
    /// connections picked up mid-stream, whose own login the copier never saw.
    #[arg(long, env = "TCPSHADOW_MYSQL_DEFAULT_USER")]
    pub mysql_default_user: Option<String>,

    /// MySQL: the schema selected for connections picked up mid-stream.
    #[arg(long, env = "TCPSHADOW_MYSQL_DEFAULT_DB")]
    pub mysql_default_db: Option<String>,

    /// File holding the control channel's shared secret: a copy of intercept's --secret-file
    /// (at least 16 bytes, e.g. `head -c 32 /dev/urandom | base64`; chmod 600, or it is
    /// refused). The copier proves it holds it and checks that intercept does; it never crosses
    /// the wire.
    #[arg(long, env = "TCPSHADOW_SECRET_FILE", value_name = "PATH")]
    pub secret_file: Option<PathBuf>,

    /// Seconds between status lines (0: none).
    #[arg(long, env = "TCPSHADOW_STATUS_INTERVAL", default_value_t = 5)]
    pub status_interval: u64,

    /// Most sessions mirrored at once, per route and copy (see --map, --multiply); further
    /// connections are not mirrored (counted).
    #[arg(long, env = "TCPSHADOW_MAX_SESSIONS", default_value_t = 100_000)]
    pub max_sessions: usize,

    /// Memory the copier may use, in MiB (32 to 65536; the program itself takes about 10),
    /// shared out in fixed parts: 3/8 for
    /// sessions (send queues, reassembly, held commands, statement maps, and a fixed size per
    /// session), 1/4 for the capture ring, 1/8 for the comparison report,
    /// 1/16 for the control channel's queues, the rest for the program itself. When the
    /// sessions' part is full, whole sessions are shed, the one furthest behind first (reset
    /// on the test server), and new ones are refused; both counted (shed_memory). See
    /// docs/RELIABILITY.md.
    #[arg(long, env = "TCPSHADOW_MAX_MEMORY", value_name = "MB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(32..=65536))]
    pub max_memory: u32,

    /// Mirror each captured connection N times (1 to 16), as N distinct connections: each
    /// copy logs in and prepares its statements by itself, so the test server gets N times the
    /// load. N > 1 needs --client-ip-pool: the copies send from disjoint slices of it.
    #[arg(long, env = "TCPSHADOW_MULTIPLY", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub multiply: u32,

    /// Mirror only this share of the client connections, in percent (0 < PERCENT <= 100,
    /// decimals allowed); each connection is mirrored whole or not at all. A new connection is
    /// decided at its SYN, by a hash of the client's address and port against a bar that moves
    /// with the share taken so far (so 200 connections come within a point or two of the share,
    /// whatever their ports), and the decision is remembered until it closes. A connection
    /// picked up mid-stream (open before the copier started) is decided by a fixed hash of
    /// address and port alone: the same after a copier restart, within a few points overall.
    #[arg(long, env = "TCPSHADOW_SAMPLE", value_name = "PERCENT", value_parser = parse_sample)]
    pub sample: Option<Sample>,

    /// On SIGINT/SIGTERM, wait up to this many seconds for queued data to reach the target,
    /// and for the sessions whose client closed to close there, before resetting what is left.
    #[arg(long, env = "TCPSHADOW_DRAIN_SECS", default_value_t = 2)]
    pub drain_secs: u64,

    /// MySQL: do not mirror commands that write (INSERT, UPDATE, DELETE, REPLACE, DDL, LOAD
    /// DATA, SELECT ... FOR UPDATE, CALL, administration, and whatever is not recognised as a
    /// read), nor executes of statements prepared from them; the sessions' reads still run on the
    /// test server. Counted per kind in the summary.
    #[arg(long, env = "TCPSHADOW_READ_ONLY")]
    pub read_only: bool,

    /// With --read-only: mirror CALL of stored procedures (vouch that they only read).
    #[arg(long, env = "TCPSHADOW_READ_ONLY_ALLOW_CALLS")]
    pub read_only_allow_calls: bool,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (e.g. 127.0.0.1:9631; names in
    /// docs/metrics.md). Refreshed every second.
    #[arg(long, env = "TCPSHADOW_METRICS", value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,

    /// With --metrics: how many digests (the most frequent) get latency histograms.
    #[arg(long, env = "TCPSHADOW_METRICS_TOP_DIGESTS", default_value_t = 20)]
    pub metrics_top_digests: usize,

    /// MySQL: compare production's and the test server's answer to every mirrored command,
    /// digest by digest, and write report.txt, report.json and report.html into DIR at the
    /// end, on SIGUSR1 and every --report-interval.
    #[arg(long, env = "TCPSHADOW_REPORT", value_name = "DIR")]
    pub report: Option<PathBuf>,

    /// With --report: also write the report every SECS seconds (0: only at the end and on
    /// SIGUSR1).
    #[arg(
        long,
        env = "TCPSHADOW_REPORT_INTERVAL",
        value_name = "SECS",
        default_value_t = 0
    )]
    pub report_interval: u64,

    /// With --report (or --metrics): compare result checksums, not only row counts and error
    /// codes. Costs CPU on both hosts: every reply byte is hashed (intercept hashes the test
    /// server's when asked in the Hello).
    #[arg(long, env = "TCPSHADOW_COMPARE_RESULTS")]
    pub compare_results: bool,

    /// With --report: examples keep the statements' literal values (they may be personal
    /// data); by default values are shown as `?`. Statements that may carry a password or key
    /// (IDENTIFIED BY, PASSWORD(), SET PASSWORD, MASTER_PASSWORD, AES_ENCRYPT, ...) stay masked.
    #[arg(long, env = "TCPSHADOW_REPORT_LITERALS")]
    pub report_literals: bool,

    /// With --tee and --report: the report.json of an earlier --tee run onto two identical
    /// test servers (an A/A run). Each digest's A/B difference is then flagged only beyond the
    /// difference that run measured for it (docs/ab.md); without it, beyond a fixed 25 %.
    #[arg(long, env = "TCPSHADOW_AB_CALIBRATION", value_name = "REPORT.json")]
    pub ab_calibration: Option<PathBuf>,

    /// Report what each test server's host spent: its node_exporter, read every second
    /// (http://HOST:PORT/metrics, plain HTTP). Repeatable or comma-separated, in --target
    /// order: the first URL is the first --target's host; fewer URLs than targets is fine.
    /// See docs/report.md, "Resources".
    #[arg(long, env = "TCPSHADOW_TARGET_METRICS", value_name = "URL", value_delimiter = ',', value_parser = crate::resources::parse_metrics_url)]
    pub target_metrics: Vec<crate::resources::MetricsUrl>,

    /// Read each test server's SHOW GLOBAL STATUS every second for the report, logged in as
    /// --mysql-default-user (adds one statement per second to each test server's counters).
    /// Default: on when --target-metrics is given, else off.
    #[arg(long, env = "TCPSHADOW_TARGET_SQL_METRICS", value_enum)]
    pub target_sql_metrics: Option<crate::resources::SqlMetrics>,

    /// Not a flag: set by the live copier once its TLS plaintext probe is attached
    /// (`--tls-sessions`); TLS sessions are then mirrored from their plaintext.
    #[arg(skip)]
    pub tls_plaintext: bool,
}

/// What to mirror, beyond [`MirrorSettings`]: the parts a live capture and a replay decide
/// differently.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Production ports and their test servers (`--port`/`--target`, `--map`), each mirrored
    /// `--multiply` times.
    pub routes: Vec<Route>,
    /// Mirror connections whose SYN was not seen (open before the capture started).
    pub pickup_midstream: bool,
    /// `--prod-dsn`: production account to recover picked-up connections' state.
    pub prod_dsn: Option<ProdDsn>,
    /// How long a picked-up connection waits for `prod_dsn`'s answer.
    pub prod_dsn_wait: Duration,
}

/// A live copier's settings (`cli::Args::validate`): how it mirrors, and what.
#[derive(Clone, Debug)]
pub struct LiveSettings {
    pub mirror: MirrorSettings,
    pub plan: Plan,
}

/// How a live copier captures (`cli::Args::capture_settings`): the flags only the live
/// daemon has (a replay reads a file), with what they come to.
#[derive(Clone, Debug)]
pub struct CaptureSettings {
    /// `--interface` ("any": every interface of the host).
    pub interface: String,
    /// The routes' traffic, both directions, minus our own ([`capture_filter`]).
    pub filter: String,
    /// Each capture's ring, in bytes: `--capture-buffer-mb`, or its share of the capture's
    /// part of `--max-memory`.
    pub buffer_bytes: i32,
    /// The ring's block timeout in ms (`--capture-block-ms`, or the shortest with which the
    /// ring holds a second of traffic; 0: immediate mode).
    pub block_ms: u16,
    /// `--capture-priority`.
    pub priority: ops::sched::Priority,
    /// `--workers`: capture threads sharing the traffic by flow hash (1: no fan-out).
    pub workers: u32,
    /// `--tls-sessions on` in MySQL mode: attach the TLS plaintext probe.
    pub tls_sessions: bool,
    /// Its ring, out of the capture's part of `--max-memory` (`cli::Args::tls_ring_bytes`).
    pub tls_ring_bytes: u32,
}

/// A libpcap TPACKET_V3 block (libpcap 1.10 sizes them by its largest snap length, 256 KiB).
pub const CAPTURE_BLOCK_BYTES: usize = 256 << 10;

impl MirrorSettings {
    /// `--max-memory`, shared out (see `engine::MemoryBudget`).
    pub fn memory_budget(&self) -> MemoryBudget {
        MemoryBudget::from_mib(self.max_memory as usize)
    }

    pub fn status_interval(&self) -> Option<Duration> {
        (self.status_interval > 0).then(|| Duration::from_secs(self.status_interval))
    }

    /// The routes for production port `port`, one per `--target` (none without `--target`:
    /// `cli` refuses that).
    pub fn route(&self, port: u16) -> Vec<Route> {
        self.target
            .iter()
            .map(|&target| Route {
                prod_port: port,
                target,
            })
            .collect()
    }

    /// The first (or only) intercept: `--map` routes and the first `--target` use it.
    pub fn first_intercept(&self) -> SocketAddr {
        // `required = true` keeps the list non-empty; the fallback only serves a caller that
        // built the settings by hand.
        self.intercept
            .first()
            .copied()
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 36524)))
    }

    /// Which of `--intercept` relays target `target`'s replies: the one paired with it by
    /// order when there is one per `--target`, else the first.
    pub fn intercept_index(&self, target: SocketAddrV4) -> usize {
        if self.intercept.len() <= 1 {
            return 0;
        }
        self.target
            .iter()
            .position(|t| *t == target)
            .filter(|i| *i < self.intercept.len())
            .unwrap_or(0)
    }

    /// Whether the test server's replies are timed (`--report`, or `--metrics` in MySQL
    /// mode): intercept then relays each as it comes instead of gathering them for
    /// `--relay-flush-us`, which costs both daemons a wakeup and a write per reply. Counting
    /// losses needs the answers, not their timing.
    pub fn times_replies(&self) -> bool {
        self.report.is_some() || (self.metrics.is_some() && self.protocol == Protocol::Mysql)
    }

    /// Whether every command's answers are collected.
    pub fn collects(&self) -> bool {
        // In MySQL mode always: both answers of every command are what tells a command the
        // test server rejected or never answered, and those are losses the summary must list
        // whether or not a report is written.
        self.report.is_some() || self.protocol == Protocol::Mysql
    }

    pub fn report_interval(&self) -> Option<Duration> {
        (self.report_interval > 0).then(|| Duration::from_secs(self.report_interval))
    }

    /// The control channel's secret from --secret-file, if given.
    pub fn secret(&self) -> Result<Option<common::auth::Secret>> {
        ops::secret::control_secret(self.secret_file.as_deref())
    }
}

/// Both directions of every route's production port, minus packets to or from a target host
/// (our own output, should a target port equal a production port), minus the clients' pure
/// ACKs ([`NOT_PURE_ACK`]).
pub fn capture_filter(routes: &[Route]) -> String {
    let (ports, hosts) = filter_terms(routes);
    let any = filter_any;
    if ports.len() == 1 && hosts.len() == 1 {
        let (p, t) = (&ports[0], &hosts[0]);
        return format!(
            "tcp and ((dst port {p} and not dst host {t} and {NOT_PURE_ACK}) or \
             (src port {p} and not src host {t}))"
        );
    }
    format!(
        // libpcap gives `and` and `or` the same precedence: every group is bracketed.
        "tcp and ((({}) and not ({}) and {NOT_PURE_ACK}) or (({}) and not ({})))",
        any("dst port", &ports),
        any("dst host", &hosts),
        any("src port", &ports),
        any("src host", &hosts),
    )
}

/// A client's segment that is not a pure ACK: it carries a byte, or SYN, FIN or RST. A pure ACK
/// tells the engine nothing it does not learn otherwise: production's first byte establishes a
/// connection whose handshake ACK went uncaptured, the ACK field of the client's next segment
/// proves a hole in production's stream as its pure ACK would (a command later), a pooled
/// connection is picked up from its first byte, and a close completes with the FINs. They were
/// a fifth of the clients' packets at 1,000 connections (each client's delayed ACK of a reply
/// it got alone), and the kernel drops them before they take a slot of the ring
/// (docs/BENCHMARKS.md, issue 20, seventeenth session). The payload length is the IP total
/// length less both headers, in BPF's 32-bit arithmetic: a GRO'd packet whose total length
/// reads 0 (BIG TCP) wraps to non-zero and is kept. IPv4 only, like the engine.
pub const NOT_PURE_ACK: &str = "(tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0 or \
     ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) != 0)";

/// The routes' production ports and target hosts, each once, in order, as BPF terms.
pub(crate) fn filter_terms(routes: &[Route]) -> (Vec<String>, Vec<String>) {
    let mut ports: Vec<u16> = routes.iter().map(|r| r.prod_port).collect();
    ports.sort_unstable();
    ports.dedup();
    let mut hosts: Vec<Ipv4Addr> = routes.iter().map(|r| *r.target.ip()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    (
        ports.iter().map(u16::to_string).collect(),
        hosts.iter().map(Ipv4Addr::to_string).collect(),
    )
}

/// `what a or what b or ...` (bracket it: libpcap gives `and` and `or` the same precedence).
pub(crate) fn filter_any(what: &str, items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("{what} {i}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `--sample`: a share of the connections, in percent.
pub(crate) fn parse_sample(s: &str) -> Result<Sample, String> {
    let p: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage (expected e.g. 60 or 12.5)"))?;
    Sample::from_percent(p).ok_or_else(|| {
        format!("{s}: the share must be above 0 and at most 100 (percent of connections)")
    })
}

/// A client-ip pool: CIDR (parsed by `ops::host::parse_cidr`), /8 to /30 (a pool needs room).
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = ops::host::parse_cidr(s)?;
    if !(8..=30).contains(&len) {
        return Err(format!("prefix length /{len} must be between /8 and /30"));
    }
    Ok((addr, len))
}
