//! The intercept binary: CLI, wiring and the status line. Everything else is in the library.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use common::control::{MAX_FEEDBACK_PER_FRAME, MAX_PAYLOAD_PREFIX};
use intercept::capture::{CaptureOptions, PcapSource};
use intercept::pump::{self, PumpConfig};
use intercept::relay::Relay;
use intercept::server::{ControlServer, ServerConfig};
use intercept::signals;

/// Capture the test server's replies on the assist host and relay them to the copiers.
///
/// The test server routes its replies for mirrored clients to this host, which must have
/// ip_forward=0 so the kernel drops them after we have seen them. Copiers connect to --listen
/// and claim the client addresses of the sessions they replay; each reply goes to the copier
/// that claimed its destination, or to every copier when nobody has claimed it yet.
#[derive(Parser, Debug)]
#[command(name = "intercept", version)]
struct Cli {
    /// The test server's MySQL port: replies are captured by this source port.
    #[arg(long, env = "TCPSHADOW_PORT")]
    port: u16,

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
    #[arg(long)]
    server: Option<Ipv4Addr>,

    /// Payload bytes of each reply relayed to the copier (it parses MySQL greetings and
    /// prepare-OKs from them). At most 4096.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(0..=MAX_PAYLOAD_PREFIX as i64))]
    payload_prefix: u16,

    /// File holding a shared secret that copiers must present (same file on both hosts).
    #[arg(long, env = "TCPSHADOW_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// Seconds between status lines; 0 for none (the final summary is always printed).
    #[arg(long, default_value_t = 5)]
    status_interval: u64,

    /// Which packets of the interface to capture: `in` on an assist host (replies arrive),
    /// `out` when intercept runs on the test host itself (replies leave).
    #[arg(long, value_enum, default_value_t = DirectionArg::In)]
    direction: DirectionArg,

    /// Kernel capture buffer, in MiB: absorbs bursts while intercept is busy.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    buffer_mib: u32,

    /// Feedback batches queued per copier before its feedback is dropped (counted).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    queue_batches: u32,

    /// Most replies per feedback batch.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=MAX_FEEDBACK_PER_FRAME as i64))]
    batch: u32,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TCPSHADOW_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        tracing::error!("{e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let token = cli.token_file.as_deref().map(read_token).transpose()?;
    // Capture first: a missing privilege is the most likely mistake, and nothing should be
    // listening for copiers when it happens.
    let mut source = PcapSource::open(&CaptureOptions {
        interface: cli.interface.clone(),
        port: cli.port,
        server: cli.server,
        payload_prefix: usize::from(cli.payload_prefix),
        direction: cli.direction.into(),
        buffer_bytes: cli.buffer_mib as usize * 1024 * 1024,
    })?;

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
            name: format!("intercept@{} port {}", hostname(), cli.port),
            token,
            payload_prefix: cli.payload_prefix,
            queue_batches: cli.queue_batches as usize,
            ..ServerConfig::default()
        },
        events_tx,
    )
    .context("cannot start the control server")?;
    tracing::info!(listen = %server.local_addr(), "waiting for copiers");

    signals::install();
    let mut relay = Relay::new(cli.batch as usize);
    let config = PumpConfig {
        status_interval: (cli.status_interval > 0)
            .then(|| Duration::from_secs(cli.status_interval)),
        ..PumpConfig::default()
    };
    let result = pump::run(
        &mut source,
        &mut relay,
        &events_rx,
        &signals::STOP,
        config,
        |relay, source| {
            let status = pump::status(relay, source, server.stats());
            tracing::info!("status: {status}");
        },
    );
    let summary = pump::status(&relay, &mut source, server.stats());
    tracing::info!("final: {summary}");
    if signals::STOP.load(Ordering::Relaxed) {
        tracing::info!("stopped by signal");
    }
    result
}

fn read_token(path: &Path) -> anyhow::Result<Vec<u8>> {
    let raw = std::fs::read(path)
        .with_context(|| format!("cannot read --token-file {}", path.display()))?;
    let token = raw.trim_ascii_end().to_vec();
    if token.is_empty() {
        bail!(
            "--token-file {} is empty: put a secret in it (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
            path.display()
        );
    }
    if token.len() > common::control::MAX_TOKEN_LEN {
        bail!(
            "--token-file {} holds {} bytes; the protocol allows at most {}",
            path.display(),
            token.len(),
            common::control::MAX_TOKEN_LEN
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    "--token-file {} is readable by other users; `chmod 600` it",
                    path.display()
                );
            }
        }
    }
    Ok(token)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn payload_prefix_is_bounded() {
        assert!(
            Cli::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4097"])
                .is_err()
        );
        let cli = Cli::try_parse_from(["intercept", "--port", "3306", "--payload-prefix", "4096"])
            .unwrap();
        assert_eq!(cli.payload_prefix, 4096);
    }
}
