//! The intercept binary: CLI, wiring and the status line. Everything else is in the library.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{CommandFactory, Parser, ValueEnum};
use common::control::{MAX_FEEDBACK_PER_FRAME, MAX_MYSQL_HEAD, MAX_PAYLOAD_PREFIX};
use intercept::capture::{CaptureOptions, CaptureSource, CapturedPayload};
use intercept::metrics::render_intercept_metrics;
use intercept::onhost::{self, OnHostArgs, OnHostCapture, ReplyCapture};
use intercept::pump::{self, PumpConfig, ReplyPath};
use intercept::relay::Relay;
use intercept::server::{ControlServer, ServerConfig};
use intercept::sessions::SessionConfig;
use intercept::signals;
use tcpshadow_metrics::Published;

/// How often `--metrics` is refreshed.
const METRICS_INTERVAL: Duration = Duration::from_secs(1);
/// A report a few milliseconds early still prints its status line (reports come every
/// second, so without slack a 5 s line could slip to 6 s).
const LINE_SLACK: Duration = Duration::from_millis(100);

/// Capture the test server's replies on the assist host and relay them to the copiers.
///
/// The test server routes its replies for mirrored clients to this host, which must have
/// ip_forward=0 so the kernel drops them after we have seen them. Copiers connect to --listen
/// and claim the client addresses of the sessions they replay; each reply goes to the copier
/// that claimed its destination, or to every copier when nobody has claimed it yet.
#[derive(Parser, Debug)]
#[command(name = "intercept", version)]
struct Cli {
    /// The test server's port: replies are captured by this source port. Several (one per
    /// copier `--map` target port): repeat the flag or separate them with commas.
    #[arg(long, env = "TCPSHADOW_PORT", required_unless_present = "cleanup", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    port: Vec<u16>,

    /// Address the copiers connect to.
    #[arg(
        long,
        default_value = "0.0.0.0:36524",
        env = "TCPSHADOW_INTERCEPT_LISTEN"
    )]
    listen: SocketAddr,

    /// Interface to capture on; `any` sees every interface.
    #[arg(long, default_value = "any", env = "TCPSHADOW_INTERFACE")]
    interface: String,

    /// Only replies from this test server address (useful when several servers route here).
    #[arg(long, env = "TCPSHADOW_SERVER")]
    server: Option<Ipv4Addr>,

    /// What the test server speaks. `mysql`: replies are reassembled and cut into MySQL
    /// packets, whose summaries (greeting, auth exchange, prepare-OK, response heads) go to the
    /// copiers; captures whole segments. `tcp`: per-segment feedback only.
    #[arg(long, value_enum, default_value_t = ProtocolArg::Mysql, env = "TCPSHADOW_PROTOCOL")]
    protocol: ProtocolArg,

    /// Payload bytes of each reply's per-segment feedback. At most 4096. Default: 0 with
    /// `--protocol mysql` (the packet summaries carry what the copier needs), 64 with `tcp`.
    #[arg(long, env = "TCPSHADOW_PAYLOAD_PREFIX", value_parser = clap::value_parser!(u16).range(0..=MAX_PAYLOAD_PREFIX as i64))]
    payload_prefix: Option<u16>,

    /// Payload bytes summarised per MySQL packet after the first 8 of a connection (which are
    /// sent whole, up to 1024 bytes). 16 covers OK/ERR codes, PREPARE_OK, column counts and
    /// EOF status flags. At most 1024.
    #[arg(long, env = "TCPSHADOW_MYSQL_HEAD", default_value_t = 16, value_parser = clap::value_parser!(u16).range(0..=MAX_MYSQL_HEAD as i64))]
    mysql_head: u16,

    /// Most connections framed at once; further ones are not framed (counted, and their copier
    /// is told).
    #[arg(long, env = "TCPSHADOW_MYSQL_MAX_SESSIONS", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..))]
    mysql_max_sessions: u32,

    /// Seconds after which a connection without any reply is forgotten (only matters when its
    /// FIN was not captured). Keep it above the test server's wait_timeout (default 28800), or
    /// idle pooled connections lose their framing.
    #[arg(long, env = "TCPSHADOW_MYSQL_IDLE_SECS", default_value_t = 32_400, value_parser = clap::value_parser!(u64).range(1..))]
    mysql_idle_secs: u64,

    /// File holding the control channel's shared secret (the copiers get a copy; at least 16
    /// bytes, e.g. `head -c 32 /dev/urandom | base64`; chmod 600, or it is refused). A copier
    /// must prove it holds it, and intercept proves it back; it never crosses the wire.
    /// Without it the control channel is open to anyone allowed by --allow (warned at start).
    #[arg(long, env = "TCPSHADOW_SECRET_FILE", value_name = "PATH")]
    secret_file: Option<PathBuf>,

    /// Removed: the cleartext token of control protocol 3. Refused with a pointer to
    /// --secret-file.
    #[arg(long, env = "TCPSHADOW_TOKEN_FILE", hide = true)]
    token_file: Option<PathBuf>,

    /// Copier addresses allowed to connect, as CIDR (or one address); repeatable or
    /// comma-separated. Connections from elsewhere are closed before anything is read
    /// (logged and counted). Not given: every address may connect (warned at start).
    #[arg(long, env = "TCPSHADOW_ALLOW", value_name = "CIDR", value_delimiter = ',', value_parser = parse_arp_check)]
    allow: Vec<(Ipv4Addr, u8)>,

    /// Most copier connections served at once; further ones are refused with a reason
    /// (counted in the status line's `rejected`). Each costs two threads and their buffers.
    #[arg(long, env = "TCPSHADOW_MAX_COPIERS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_copiers: u32,

    /// Seconds between status lines; 0 for none (the final summary is always printed).
    #[arg(long, env = "TCPSHADOW_STATUS_INTERVAL", default_value_t = 5)]
    status_interval: u64,

    /// Which packets of the interface to capture: `in` on an assist host (replies arrive),
    /// `out` when intercept runs on the test host itself (replies leave). On `lo` libpcap shows
    /// each packet once, as incoming: use `in` there.
    #[arg(long, env = "TCPSHADOW_DIRECTION", value_enum, default_value_t = DirectionArg::In)]
    direction: DirectionArg,

    /// Kernel capture buffer, in MiB: absorbs bursts while intercept is busy. At most a quarter
    /// of --max-memory (larger is refused).
    #[arg(long, env = "TCPSHADOW_BUFFER_MIB", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    buffer_mib: u32,

    /// Scheduling priority of the capture and its threads: normal (as started, the default),
    /// high (nice -20) or realtime (SCHED_RR 1). Raise it only if the status line shows
    /// kernel drops while the CPU is not saturated. Sharing a core with the test server (the
    /// lab, --on-test-host), a raised intercept preempts it at every reply: measured in the
    /// lab, the test server fell behind and intercept spent 3x the CPU per reply, woken per
    /// reply instead of per handful. Raising needs CAP_SYS_NICE at start (or systemd's
    /// Nice=); without it intercept says so and runs as started.
    #[arg(long, env = "TCPSHADOW_CAPTURE_PRIORITY", value_enum, default_value_t = ops::sched::Priority::Normal)]
    capture_priority: ops::sched::Priority,

    /// Longest wait, in ms, before the kernel hands captured replies over (a TPACKET_V3
    /// block timeout): one wakeup and one control write per block instead of one per reply,
    /// about a third of the CPU here and less in the copier. But the copier then wakes once
    /// per block and sends the client commands it captured meanwhile in one burst, which the
    /// test server answers queued: the report's test latencies rise for the first command of
    /// each burst (docs/BENCHMARKS.md). 0 (default): a packet socket woken per reply, whose
    /// queue (--buffer-mib) is counted in what each reply really takes. 1-3 suits mirroring
    /// for load when the latency report does not matter.
    #[arg(long, env = "TCPSHADOW_CAPTURE_BLOCK_MS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=100))]
    capture_block_ms: u16,

    /// Microseconds replies gather before they are handled: the capture sleeps this long after
    /// each wakeup, and each copier's writer after its first batch. Under load that is one
    /// wakeup per period instead of one per reply, in intercept and in the copier: together
    /// about half of both daemons' CPU. Replies keep their kernel timestamps. While a copier
    /// that times replies (`--report`) is connected the capture does not gather, and that
    /// copier's writer never does. 0: handle every reply as it comes.
    #[arg(long, env = "TCPSHADOW_RELAY_FLUSH_US", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    relay_flush_us: u32,

    /// Memory intercept may use, in MiB (32 to 65536): a quarter at most for the capture ring
    /// (--buffer-mib), a quarter for the copiers' feedback queues together (one copier's at most
    /// a quarter of that; beyond, its feedback is dropped and counted), 3/8
    /// for the MySQL sessions table (--mysql-max-sessions is lowered to what fits), 1/16 for
    /// the out-of-order reply bytes all sessions hold (beyond, the session whose hold grows
    /// loses its framing, counted). See docs/RELIABILITY.md.
    #[arg(long, env = "TCPSHADOW_MAX_MEMORY", value_name = "MB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(32..=65536))]
    max_memory: u32,

    /// Capture threads (1 to 64). N > 1: N captures share the replies by flow hash (kernel
    /// PACKET_FANOUT; each connection on one thread, its MySQL framing whole), each relaying
    /// to the copier that claimed the session. Each capture gets its own --buffer-mib. Not
    /// with --on-test-host.
    #[arg(long, env = "TCPSHADOW_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,

    /// Feedback batches queued per copier before its feedback is dropped (counted).
    #[arg(long, env = "TCPSHADOW_QUEUE_BATCHES", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    queue_batches: u32,

    /// Most replies per feedback batch.
    #[arg(long, env = "TCPSHADOW_BATCH", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=MAX_FEEDBACK_PER_FRAME as i64))]
    batch: u32,

    #[command(flatten)]
    on_host: OnHostArgs,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (names in docs/metrics.md),
    /// refreshed every second.
    #[arg(long, env = "TCPSHADOW_METRICS", value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,

    #[command(flatten)]
    config: ops::config::ConfigArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProtocolArg {
    Mysql,
    Tcp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DirectionArg {
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

fn main() {
    // Before any thread exists, so that only the reload thread ever takes SIGHUP.
    ops::reload::block_sighup();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).and_then(|a| a.to_str()) == Some("doctor") {
        std::process::exit(doctor_main(argv));
    }
    let parsed = match ops::config::parse::<Cli>(Cli::command(), &Cli::command(), argv) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("intercept: {e}");
            std::process::exit(2);
        }
    };
    if parsed.args.config.print_config {
        print!(
            "{}",
            ops::config::effective_toml(&parsed.command, &parsed.matches, parsed.config.as_ref())
        );
        return;
    }
    let log = ops::reload::init_logging(&parsed.args.config.log, true);
    let mut reloader = ops::reload::Reloader::new(
        parsed.config.as_ref(),
        Cli::command(),
        &parsed.matches,
        log,
        "systemctl restart tcpshadow-intercept",
    );
    if let Err(e) = ops::reload::on_sighup(move || {
        reloader.reload();
    }) {
        tracing::warn!("cannot watch for SIGHUP ({e}); the config file is read at start only");
    }
    if let Err(e) = run(parsed.args) {
        tracing::error!("{e:#}");
        std::process::exit(1);
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
struct DoctorCli {
    #[command(flatten)]
    daemon: Cli,

    /// Also ask who answers ARP for these addresses (CIDR, e.g. the copiers'
    /// --client-ip-pool; repeatable or comma-separated): only this host may. Needs --server
    /// (the test server) or a capture --interface other than `any` to know the segment.
    #[arg(long, value_name = "CIDR", value_delimiter = ',', value_parser = parse_arp_check)]
    arp_check: Vec<(Ipv4Addr, u8)>,
}

fn parse_arp_check(s: &str) -> Result<(Ipv4Addr, u8), String> {
    if let Ok(ip) = s.parse::<Ipv4Addr>() {
        return Ok((ip, 32));
    }
    ops::host::parse_cidr(s)
}

fn doctor_main(argv: Vec<std::ffi::OsString>) -> i32 {
    let argv: Vec<std::ffi::OsString> = std::iter::once("intercept doctor".into())
        .chain(argv.into_iter().skip(2))
        .collect();
    let parsed = match ops::config::parse::<DoctorCli>(DoctorCli::command(), &Cli::command(), argv)
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("intercept doctor: {e}");
            return 2;
        }
    };
    if parsed.args.daemon.config.print_config {
        let config = parsed.config.as_ref();
        print!(
            "{}",
            ops::config::effective_toml(&parsed.command, &parsed.matches, config)
        );
        return 0;
    }
    // Only problems reach the log: the checks are the output.
    ops::reload::init_logging("warn", false);
    let cli = &parsed.args.daemon;
    let setup = doctor_setup(cli);
    let mut arp = Vec::new();
    for (base, prefix) in &parsed.args.arp_check {
        let all = ops::arp::sample_pool(*base, *prefix, ops::arp::MAX_TARGETS, &[]);
        arp.extend(all.into_iter().map(|a| (a, true)));
    }
    println!(
        "intercept doctor on {} (port {}, interface {}, listen {})",
        ops::host::hostname(),
        cli.ports_label(),
        cli.interface,
        cli.listen
    );
    let mut report = ops::check::Report::printing();
    for c in intercept::doctor::standalone_checks(&setup, &arp) {
        report.add(c);
    }
    println!("{}", report.summary());
    i32::from(report.failed())
}

fn doctor_setup(cli: &Cli) -> intercept::doctor::Setup {
    intercept::doctor::Setup {
        interface: cli.interface.clone(),
        listen: cli.listen,
        ports: cli.ports(),
        server: cli.server,
        direction: cli.direction.into(),
    }
}

impl Cli {
    /// The ports, each once, in order.
    fn ports(&self) -> Vec<u16> {
        let mut ports = self.port.clone();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    fn ports_label(&self) -> String {
        let ports: Vec<String> = self.ports().iter().map(u16::to_string).collect();
        ports.join(",")
    }

    fn mysql(&self) -> bool {
        self.protocol == ProtocolArg::Mysql
    }

    fn payload_prefix(&self) -> u16 {
        self.payload_prefix
            .unwrap_or(if self.mysql() { 0 } else { 64 })
    }

    fn memory_bytes(&self) -> usize {
        (self.max_memory as usize) << 20
    }

    /// Each copier's feedback queue, bytes: a quarter of the copiers' part (a quarter of
    /// --max-memory, which bounds all queues together), so that a burst toward one copier has
    /// room while a single slow copier cannot starve the others.
    fn queue_bytes(&self) -> usize {
        self.memory_bytes() / 16
    }

    /// --mysql-max-sessions, lowered so that 3/8 of --max-memory holds that many sessions at
    /// their fixed size (`sessions::SESSION_BYTES`).
    fn max_sessions(&self) -> usize {
        let fit = self.memory_bytes() / 8 * 3 / intercept::sessions::SESSION_BYTES;
        (self.mysql_max_sessions as usize).min(fit.max(1))
    }

    fn sessions(&self) -> Option<SessionConfig> {
        self.mysql().then(|| SessionConfig {
            head: usize::from(self.mysql_head),
            max_sessions: self.max_sessions(),
            // A sixteenth for all sessions' held out-of-order reply bytes.
            max_held_total: self.memory_bytes() / 16,
            idle_timeout: Duration::from_secs(self.mysql_idle_secs),
            ..SessionConfig::default()
        })
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.on_host.cleanup {
        return onhost::cleanup();
    }
    let secret = read_secret(&cli)?;
    for warning in open_channel_warnings(cli.listen, secret.is_some(), &cli.allow) {
        tracing::warn!("{warning}");
    }
    if cli.interface == "lo" && matches!(cli.direction, DirectionArg::Out) {
        // libpcap drops the outgoing copy of loopback packets so they are not seen twice.
        tracing::warn!(
            "--direction out captures nothing on lo (libpcap shows loopback packets as incoming \
             only); use --direction in"
        );
    }
    if u64::from(cli.buffer_mib) * u64::from(cli.workers) > u64::from(cli.max_memory / 4) {
        anyhow::bail!(
            "--buffer-mib {} x {} workers is more than --max-memory {} allows for the capture \
             rings (a quarter, {} MiB): raise --max-memory or lower --buffer-mib",
            cli.buffer_mib,
            cli.workers,
            cli.max_memory,
            cli.max_memory / 4
        );
    }
    let payload_prefix = cli.payload_prefix();
    if cli.workers > 1 && cli.on_host.on_test_host {
        bail!(
            "--workers {} fans out the pcap capture; --on-test-host reads one queue: use \
             --workers 1 there",
            cli.workers
        );
    }
    if !cli.on_host.on_test_host {
        // A forwarding assistant hands the test server's replies on to the real clients, which
        // reset their own connections with production's peers: said at start, not only by
        // `intercept doctor`, since this is the one set-up mistake that reaches production.
        for c in intercept::doctor::forwarding_checks(&doctor_setup(&cli)) {
            if c.level != ops::check::Level::Ok {
                tracing::warn!("{}: {}", c.name, c.detail);
            }
        }
    }
    // Capture first: a missing privilege is the most likely mistake, and nothing should be
    // listening for copiers when it happens.
    let mut source = if cli.on_host.on_test_host {
        ReplyCapture::Queue(onhost::start(
            &cli.on_host,
            &OnHostCapture {
                ports: cli.ports(),
                server: cli.server,
                copy_range: if cli.mysql() {
                    intercept::nfqueue::MAX_COPY_RANGE
                } else {
                    OnHostCapture::prefix_range(usize::from(payload_prefix))
                },
                recv_buffer: cli.buffer_mib as usize * 1024 * 1024,
            },
        )?)
    } else {
        ReplyCapture::Wire(CaptureSource::open(&capture_options(&cli, payload_prefix))?)
    };

    // Before the workers and the control server's threads start (they inherit it) and before
    // the capabilities go (raising needs CAP_SYS_NICE).
    let priority = match cli.capture_priority {
        ops::sched::Priority::Auto => {
            // Raising on demand needs the capture's lag measured, which only the copier does.
            tracing::info!("--capture-priority auto is the copier's; intercept runs as started");
            ops::sched::Priority::Normal
        }
        p => p,
    };
    ops::sched::raise_logged(priority);

    let mut more = Vec::new();
    if let ReplyCapture::Wire(first) = &mut source {
        if cli.workers > 1 {
            more = open_workers(&cli, first, payload_prefix)?;
        }
    }

    // Before the control server: a taken metrics port is a start-up mistake to fix now.
    let metrics = match cli.metrics {
        Some(addr) => {
            let published = Published::new();
            let server = tcpshadow_metrics::serve(addr, published.clone(), "intercept-metrics")
                .with_context(|| format!("--metrics {addr}: cannot listen"))?;
            tracing::info!("metrics on http://{}/metrics", server.local_addr());
            Some((published, server))
        }
        None => None,
    };

    let listener = TcpListener::bind(cli.listen).with_context(|| {
        format!(
            "cannot listen for copiers on {}: is another intercept running? choose another --listen",
            cli.listen
        )
    })?;
    let (events_tx, events_rx) = mpsc::channel();
    let server = ControlServer::start(
        listener,
        ServerConfig {
            name: format!(
                "intercept@{} port {}",
                ops::host::hostname(),
                cli.ports_label()
            ),
            secret,
            allow: cli.allow.clone(),
            payload_prefix,
            mysql_head: cli.mysql().then_some(cli.mysql_head),
            queue_batches: cli.queue_batches as usize,
            queue_bytes: cli.queue_bytes(),
            queue_bytes_total: cli.memory_bytes() / 4,
            max_copiers: cli.max_copiers as usize,
            relay_flush: Duration::from_micros(u64::from(cli.relay_flush_us)),
            doctor: Some({
                let setup = doctor_setup(&cli);
                // Opened now, while CAP_NET_RAW is still held: a copier's doctor asks for ARP
                // checks later. Without it the check says it cannot send.
                let arp = ops::arp::ArpSocket::open().ok().map(std::sync::Mutex::new);
                intercept::server::DoctorHook(std::sync::Arc::new(move |q| {
                    intercept::doctor::answer(&setup, q, arp.as_ref())
                }))
            }),
            ..ServerConfig::default()
        },
        events_tx,
    )
    .context("cannot start the control server")?;
    tracing::info!(listen = %server.local_addr(), protocol = ?cli.protocol, "waiting for copiers");
    drop_privileges(cli.on_host.on_test_host)?;

    signals::install();
    if !more.is_empty() {
        let ReplyCapture::Wire(first) = source else {
            bail!("--workers needs the pcap capture");
        };
        let mut sources = vec![first];
        sources.extend(more);
        return workers::run(
            &cli,
            sources,
            &server,
            events_rx,
            metrics.as_ref().map(|m| &m.0),
        );
    }
    let mut path = ReplyPath::new(
        Relay::new(cli.batch as usize),
        usize::from(payload_prefix),
        cli.sessions(),
    );
    let status_interval =
        (cli.status_interval > 0).then(|| Duration::from_secs(cli.status_interval));
    // With --metrics the loop reports every second: each report publishes the metrics and
    // logs the status line only when its own interval has passed.
    let config = PumpConfig {
        status_interval: match (&metrics, status_interval) {
            (Some(_), Some(i)) => Some(i.min(METRICS_INTERVAL)),
            (Some(_), None) => Some(METRICS_INTERVAL),
            (None, i) => i,
        },
        gather: Duration::from_micros(u64::from(cli.relay_flush_us)),
        ..PumpConfig::default()
    };
    if let Some((published, _)) = &metrics {
        // A scrape before the first report sees zeros, not an empty page.
        published.set(render_intercept_metrics(&pump::status(
            &path,
            &mut source,
            server.stats(),
        )));
    }
    let mut last_line = std::time::Instant::now();
    let result = pump::run(
        &mut source,
        &mut path,
        &events_rx,
        &signals::STOP,
        config,
        |path, source| {
            let status = pump::status(path, source, server.stats());
            if let Some((published, _)) = &metrics {
                published.set(render_intercept_metrics(&status));
            }
            if status_interval.is_some_and(|i| last_line.elapsed() + LINE_SLACK >= i) {
                tracing::info!("status: {status}");
                last_line = std::time::Instant::now();
            }
        },
    );
    let summary = pump::status(&path, &mut source, server.stats());
    if let Some((published, _)) = &metrics {
        published.set(render_intercept_metrics(&summary));
    }
    tracing::info!("final: {summary}");
    if signals::STOP.load(Ordering::Relaxed) {
        tracing::info!("stopped by signal");
    }
    result
}

/// Said once at start for each way the control channel is open.
fn open_channel_warnings(
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

/// `--workers N`: opens N-1 more captures like `first`, joins all N to one fan-out group and
/// drops what they captured before the group was whole (every member saw it).
fn open_workers(
    cli: &Cli,
    first: &mut CaptureSource,
    payload_prefix: u16,
) -> anyhow::Result<Vec<CaptureSource>> {
    let group = intercept::capture::fanout_group();
    first.join_fanout(group)?;
    let mut more = Vec::new();
    for _ in 1..cli.workers {
        let s = CaptureSource::open(&capture_options(cli, payload_prefix))?;
        s.join_fanout(group)?;
        more.push(s);
    }
    let mut discarded = first.discard_backlog(1 << 20)?;
    for s in &mut more {
        discarded += s.discard_backlog(1 << 20)?;
    }
    tracing::info!(
        "{} capture workers in fan-out group {group} ({discarded} replies captured before the \
         group formed dropped)",
        cli.workers
    );
    Ok(more)
}

fn capture_options(cli: &Cli, payload_prefix: u16) -> CaptureOptions {
    CaptureOptions {
        interface: cli.interface.clone(),
        ports: cli.ports(),
        server: cli.server,
        payload: if cli.mysql() {
            CapturedPayload::Whole
        } else {
            CapturedPayload::Prefix(usize::from(payload_prefix))
        },
        direction: cli.direction.into(),
        buffer_bytes: cli.buffer_mib as usize * 1024 * 1024,
        block_ms: cli.capture_block_ms,
    }
}

/// `--workers N`: one capture thread per fan-out member, each with its own reply path (relay
/// and MySQL framing) fed every routing change; this thread only sums their counters.
mod workers {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{self, Receiver};
    use std::sync::Mutex;
    use std::time::Duration;

    use intercept::capture::CaptureSource;
    use intercept::metrics::render_intercept_metrics;
    use intercept::pump::{self, PumpConfig, ReplyPath, Status};
    use intercept::relay::{Relay, RelayEvent};
    use intercept::server::ControlServer;
    use intercept::signals;
    use tcpshadow_metrics::Published;

    use super::{Cli, LINE_SLACK, METRICS_INTERVAL};

    /// How often a worker hands its counters over.
    const PUBLISH: Duration = Duration::from_millis(500);

    pub(super) fn run(
        cli: &Cli,
        sources: Vec<CaptureSource>,
        server: &ControlServer,
        events: Receiver<RelayEvent>,
        metrics: Option<&Published>,
    ) -> anyhow::Result<()> {
        let n = sources.len();
        // Every worker's relay must know every copier and claim: the server's events are
        // copied to each, in order, by one thread (a claim reaches all relays before the
        // copier's next claim does).
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel()).unzip();
        std::thread::Builder::new()
            .name("relay-events".into())
            .spawn(move || {
                while let Ok(ev) = events.recv() {
                    for tx in &txs {
                        let _ = tx.send(RelayEvent::clone(&ev));
                    }
                }
            })?;
        let stop = AtomicBool::new(false);
        let latest: Vec<Mutex<(Status, bool)>> = (0..n)
            .map(|_| Mutex::new((Status::default(), false)))
            .collect();
        let status_interval =
            (cli.status_interval > 0).then(|| Duration::from_secs(cli.status_interval));
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .into_iter()
                .zip(rxs)
                .enumerate()
                .map(|(i, (mut source, rx))| {
                    let (latest, stop) = (&latest[i], &stop);
                    let mut path = ReplyPath::new(
                        Relay::new(cli.batch as usize),
                        usize::from(cli.payload_prefix()),
                        cli.sessions(),
                    );
                    std::thread::Builder::new()
                        .name(format!("capture-{i}"))
                        .spawn_scoped(scope, move || {
                            let config = PumpConfig {
                                status_interval: Some(PUBLISH),
                                gather: Duration::from_micros(u64::from(cli.relay_flush_us)),
                                ..PumpConfig::default()
                            };
                            let r = pump::run(&mut source, &mut path, &rx, stop, config, |p, s| {
                                let st = pump::status(p, s, Default::default());
                                if let Ok(mut l) = latest.lock() {
                                    l.0 = st;
                                }
                            });
                            let st = pump::status(&path, &mut source, Default::default());
                            if let Ok(mut l) = latest.lock() {
                                *l = (st, true);
                            }
                            if r.is_err() {
                                // One capture failed: stop the others, exit with its error.
                                stop.store(true, Ordering::SeqCst);
                            }
                            r
                        })
                })
                .collect();
            let mut last_line = std::time::Instant::now();
            let mut last_metrics = std::time::Instant::now();
            loop {
                if signals::STOP.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::SeqCst);
                }
                let (sum, done) = total(&latest, server);
                if done == n {
                    break;
                }
                if let Some(m) = metrics {
                    if last_metrics.elapsed() >= METRICS_INTERVAL {
                        m.set(render_intercept_metrics(&sum));
                        last_metrics = std::time::Instant::now();
                    }
                }
                if status_interval.is_some_and(|i| last_line.elapsed() + LINE_SLACK >= i) {
                    tracing::info!("status: {sum}");
                    last_line = std::time::Instant::now();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a capture worker panicked"))),
                    Err(e) => {
                        stop.store(true, Ordering::SeqCst);
                        Err(anyhow::anyhow!("cannot start a capture thread: {e}"))
                    }
                })
                .collect::<Vec<_>>()
        });
        let (summary, _) = total(&latest, server);
        if let Some(m) = metrics {
            m.set(render_intercept_metrics(&summary));
        }
        for (i, l) in latest.iter().enumerate() {
            if let Ok(l) = l.lock() {
                let r = &l.0.relay;
                tracing::info!(
                    "worker {i}: captured={} routed={} unclaimed_broadcast={} mysql_sessions_framed={}",
                    l.0.source.captured,
                    r.routed,
                    r.unclaimed,
                    l.0.mysql.map_or(0, |(m, _)| m.sessions_framed)
                );
            }
        }
        tracing::info!("final: {summary}");
        if signals::STOP.load(Ordering::Relaxed) {
            tracing::info!("stopped by signal");
        }
        results
            .into_iter()
            .collect::<anyhow::Result<Vec<()>>>()
            .map(|_| ())
    }

    /// The workers' latest counters summed, and how many workers have finished.
    fn total(latest: &[Mutex<(Status, bool)>], server: &ControlServer) -> (Status, usize) {
        let mut sum: Option<Status> = None;
        let mut done = 0;
        for l in latest {
            let Ok(l) = l.lock() else { continue };
            done += usize::from(l.1);
            match &mut sum {
                Some(s) => s.add(&l.0),
                None => sum = Some(l.0),
            }
        }
        let mut sum = sum.unwrap_or_default();
        sum.server = server.stats();
        (sum, done)
    }
}

fn read_secret(cli: &Cli) -> anyhow::Result<Option<common::auth::Secret>> {
    if cli.token_file.is_some() {
        bail!(
            "--token-file (token-file, TCPSHADOW_TOKEN_FILE) was replaced by --secret-file: the \
             secret no longer crosses the wire (control protocol 4). Rename the flag on both \
             hosts; the same file works if it holds at least 16 bytes and is chmod 600"
        );
    }
    let Some(path) = &cli.secret_file else {
        return Ok(None);
    };
    let raw = ops::secret::read_secret_file("--secret-file", path)?;
    let secret = common::auth::Secret::new(&raw)
        .with_context(|| format!("--secret-file {}", path.display()))?;
    Ok(Some(secret))
}

/// Once the capture, the listeners and the ARP socket are open, keeps only what is still
/// needed: nothing on an assist host; CAP_NET_ADMIN on the test host (`--on-test-host`), for
/// the queue's verdicts and removing the nftables table at exit.
fn drop_privileges(on_test_host: bool) -> anyhow::Result<()> {
    let keep: &[u32] = if on_test_host {
        &[ops::privs::CAP_NET_ADMIN]
    } else {
        &[]
    };
    let dropped = ops::privs::drop_all_but(keep).context(
        "cannot drop capabilities after opening the capture (refusing to run with more than \
         needed)",
    )?;
    tracing::info!("capabilities dropped: {}", dropped.describe());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
        DoctorCli::command().debug_assert();
    }

    #[test]
    fn every_flag_is_a_config_key_with_its_environment_variable() {
        let bad = ops::config::env_inconsistencies(
            &Cli::command(),
            &[("listen", "TCPSHADOW_INTERCEPT_LISTEN")],
        );
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn the_example_config_file_loads() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/intercept.toml");
        let cfg = ops::config::ConfigFile::load(&path, &Cli::command()).unwrap();
        let m = cfg
            .apply(Cli::command())
            .try_get_matches_from(["intercept"])
            .unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        assert_eq!(cli.ports(), vec![3306]);
        assert_eq!(cli.listen, "0.0.0.0:36524".parse().unwrap());
        // Every key of the daemon is documented in the example (set or commented out).
        let text = std::fs::read_to_string(&path).unwrap();
        for arg in ops::config::config_keys(&Cli::command()) {
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
        let cli = Cli::try_parse_from([
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
        assert!(Cli::try_parse_from(["intercept", "--port", "1", "--allow", "x/8"]).is_err());
        let cli =
            Cli::try_parse_from(["intercept", "--port", "1", "--token-file", "/etc/t"]).unwrap();
        let e = read_secret(&cli).unwrap_err().to_string();
        assert!(e.contains("--secret-file"), "{e}");
        let cli = Cli::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        assert_eq!(cli.max_copiers, 64);
        assert!(
            Cli::try_parse_from(["intercept", "--port", "3306", "--max-copiers", "0"]).is_err()
        );
    }

    #[test]
    fn max_memory_bounds_the_queues_and_the_session_table() {
        let cli = Cli::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        // 256 MiB: 64 MiB for all copiers' queues, 16 MiB at most for one; 3/8 holds 65,536
        // sessions.
        assert_eq!(cli.queue_bytes(), 16 << 20);
        assert_eq!(cli.max_sessions(), 65_536);
        let small =
            Cli::try_parse_from(["intercept", "--port", "3306", "--max-memory", "32"]).unwrap();
        assert_eq!(small.queue_bytes(), 2 << 20);
        assert_eq!(
            small.max_sessions(),
            (12 << 20) / intercept::sessions::SESSION_BYTES
        );
        assert!(small.max_sessions() < 65_536);
        assert!(
            Cli::try_parse_from(["intercept", "--port", "3306", "--max-memory", "16"]).is_err()
        );
    }

    #[test]
    fn several_ports_repeated_or_comma_separated() {
        let cli =
            Cli::try_parse_from(["intercept", "--port", "3307,3306", "--port", "3307"]).unwrap();
        assert_eq!(cli.ports(), vec![3306, 3307]);
        assert_eq!(cli.ports_label(), "3306,3307");
        assert!(Cli::try_parse_from(["intercept"]).is_err());
        assert!(Cli::try_parse_from(["intercept", "--port", "0"]).is_err());
    }

    #[test]
    fn on_test_host_flags_and_cleanup_without_a_port() {
        let cli = Cli::try_parse_from(["intercept", "--cleanup"]).unwrap();
        assert!(cli.on_host.cleanup);
        let cli = Cli::try_parse_from([
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
        assert_eq!(cli.on_host.queue_num, onhost::DEFAULT_QUEUE);
        assert!(Cli::try_parse_from(["intercept", "--on-test-host"]).is_err());
    }

    #[test]
    fn payload_prefix_is_bounded() {
        assert!(
            Cli::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4097"])
                .is_err()
        );
        let cli = Cli::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4096"])
            .unwrap();
        assert_eq!(cli.payload_prefix(), 4096);
    }

    #[test]
    fn mysql_is_the_default_and_tcp_behaves_as_before() {
        let cli = Cli::try_parse_from(["intercept", "--port", "3306"]).unwrap();
        assert!(cli.mysql());
        assert_eq!(cli.payload_prefix(), 0);
        assert_eq!(cli.sessions().map(|s| s.head), Some(16));
        let cli =
            Cli::try_parse_from(["intercept", "--port", "3306", "--protocol", "tcp"]).unwrap();
        assert_eq!(cli.payload_prefix(), 64);
        assert!(cli.sessions().is_none());
        assert!(
            Cli::try_parse_from(["intercept", "--port", "3306", "--mysql-head", "1025"]).is_err()
        );
    }
}
