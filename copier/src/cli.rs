//! Command-line interface of the copier daemon.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

/// Mirrors the client connections of a production port onto a test server, packet by packet.
///
/// Runs on the production host. Captures client traffic of --port, plays the client side of each
/// connection toward --target, and learns the test server's replies from the intercept daemon
/// (which runs on the host the test server routes the client addresses to).
#[derive(Parser, Debug, Clone)]
#[command(name = "copier", version, about, long_about)]
pub struct Args {
    /// Production port whose client connections are mirrored (to --target).
    #[arg(long, env = "TCPSHADOW_PORT", default_value_t = 3306)]
    pub port: u16,

    /// Capture interface ("any" captures on all interfaces of this host).
    #[arg(long, env = "TCPSHADOW_INTERFACE", default_value = "any")]
    pub interface: String,

    /// MySQL: a read-only account on production, `mysql://user:password@host[:port]`
    /// (percent-encode special characters). For connections picked up mid-stream, the copier
    /// reads their user, schema and prepared statements there (needs `GRANT PROCESS, SELECT ON
    /// *.*` and performance_schema=ON). Prefer the environment variable: a command line is
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

    /// Kernel capture buffer, in MiB.
    #[arg(long, env = "TCPSHADOW_CAPTURE_BUFFER_MB", default_value_t = 64)]
    pub capture_buffer_mb: u32,

    #[command(flatten)]
    pub mirror: MirrorArgs,
}

/// How sessions are mirrored, wherever the packets come from (a live capture or a file).
#[derive(clap::Args, Debug, Clone)]
pub struct MirrorArgs {
    /// Test server to mirror to, IP:PORT. Must not be this host's own production server.
    #[arg(long, env = "TCPSHADOW_TARGET")]
    pub target: Option<SocketAddrV4>,

    /// Intercept daemon's control address, HOST:PORT (it relays the test server's replies).
    #[arg(long, env = "TCPSHADOW_INTERCEPT")]
    pub intercept: SocketAddr,

    /// Rewrite mirrored client addresses into this range (CIDR), e.g. 198.19.0.0/16, so the test
    /// server's routes need not cover the real clients. The client port is kept.
    #[arg(long, env = "TCPSHADOW_CLIENT_IP_POOL", value_parser = parse_cidr)]
    pub client_ip_pool: Option<(Ipv4Addr, u8)>,

    /// Largest TCP payload sent to the target (path MTU minus 40).
    #[arg(long, env = "TCPSHADOW_MSS", default_value_t = 1460, value_parser = clap::value_parser!(u16).range(88..=65495))]
    pub mss: u16,

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

    /// Shared token sent in the hello to intercept (first line of the file).
    #[arg(long, env = "TCPSHADOW_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// Seconds between status lines (0: none).
    #[arg(long, env = "TCPSHADOW_STATUS_INTERVAL", default_value_t = 5)]
    pub status_interval: u64,

    /// Most sessions mirrored at once; further connections are not mirrored (counted).
    #[arg(long, env = "TCPSHADOW_MAX_SESSIONS", default_value_t = 100_000)]
    pub max_sessions: usize,

    /// On SIGINT/SIGTERM, wait up to this many seconds for queued data to reach the target
    /// before resetting what is left.
    #[arg(long, env = "TCPSHADOW_DRAIN_SECS", default_value_t = 2)]
    pub drain_secs: u64,
}

/// One production port mirrored to one test server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub prod_port: u16,
    pub target: SocketAddrV4,
}

impl MirrorArgs {
    pub fn status_interval(&self) -> Option<Duration> {
        (self.status_interval > 0).then(|| Duration::from_secs(self.status_interval))
    }

    /// The routes for production port `port`: `--target` is required here (a live copier with
    /// `--map` builds its routes in [`Args::routes`]).
    pub fn route(&self, port: u16) -> Result<Route> {
        match self.target {
            Some(target) => Ok(Route {
                prod_port: port,
                target,
            }),
            None => bail!("--target HOST:PORT is required (the test server to mirror to)"),
        }
    }

    /// Refuses set-ups that would hurt production or cannot work.
    pub fn validate(&self) -> Result<()> {
        if let Some(target) = self.target {
            validate_target("--target", target)?;
        }
        Ok(())
    }

    pub fn token(&self) -> Result<Option<Vec<u8>>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --token-file {}", path.display()))?;
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            bail!("--token-file {} is empty", path.display());
        }
        Ok(Some(line.as_bytes().to_vec()))
    }
}

/// A test server must be a unicast address that is not this host's: the copier runs on the
/// production host, and mirroring onto itself would double production's load.
pub fn validate_target(flag: &str, target: SocketAddrV4) -> Result<()> {
    let ip = *target.ip();
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
        bail!("{flag} {target} is not a unicast address");
    }
    if ip.is_loopback() || is_local_address(ip) {
        bail!(
            "{flag} {target} is an address of this host: the copier runs on the production host and \
             must never mirror onto the production server itself; point {flag} at the test server"
        );
    }
    Ok(())
}

impl Args {
    /// Where each production port goes.
    pub fn routes(&self) -> Result<Vec<Route>> {
        Ok(vec![self.mirror.route(self.port)?])
    }

    /// The capture filter: the production ports' traffic in both directions, excluding what we
    /// send ourselves (it leaves this host toward the targets with the same port numbers).
    pub fn capture_filter(&self) -> Result<String> {
        Ok(capture_filter(&self.routes()?))
    }

    /// Refuses set-ups that would hurt production.
    pub fn validate(&self) -> Result<()> {
        self.mirror.validate()?;
        self.routes()?;
        if let Some(dsn) = &self.prod_dsn {
            if let Err(e) = dsn.get() {
                bail!("--prod-dsn: {e}");
            }
            if self.mirror.protocol != Protocol::Mysql {
                bail!("--prod-dsn recovers MySQL session state: it needs --protocol mysql");
            }
        }
        Ok(())
    }
}

/// Both directions of every route's production port, minus packets to or from a target host
/// (our own output, should a target port equal a production port).
pub fn capture_filter(routes: &[Route]) -> String {
    let mut ports: Vec<u16> = routes.iter().map(|r| r.prod_port).collect();
    ports.sort_unstable();
    ports.dedup();
    let mut hosts: Vec<Ipv4Addr> = routes.iter().map(|r| *r.target.ip()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let any = |dir: &str, items: Vec<String>| {
        items
            .iter()
            .map(|i| format!("{dir} {i}"))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let hosts: Vec<String> = hosts.iter().map(Ipv4Addr::to_string).collect();
    if ports.len() == 1 && hosts.len() == 1 {
        let (p, t) = (&ports[0], &hosts[0]);
        return format!(
            "tcp and ((dst port {p} and not dst host {t}) or (src port {p} and not src host {t}))"
        );
    }
    format!(
        // libpcap gives `and` and `or` the same precedence: every group is bracketed.
        "tcp and ((({}) and not ({})) or (({}) and not ({})))",
        any("dst port", ports.clone()),
        any("dst host", hosts.clone()),
        any("src port", ports),
        any("src host", hosts),
    )
}

/// The application protocol of the mirrored port.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Mysql,
    Tcp,
}

/// Whether `ip` is assigned to an interface of this host: binding to it succeeds only then.
fn is_local_address(ip: Ipv4Addr) -> bool {
    UdpSocket::bind(SocketAddrV4::new(ip, 0)).is_ok()
}

pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not CIDR (expected e.g. 198.19.0.0/16)"))?;
    let addr: Ipv4Addr = addr.parse().map_err(|e| format!("{addr:?}: {e}"))?;
    let len: u8 = len
        .parse()
        .map_err(|e| format!("prefix length {len:?}: {e}"))?;
    if !(8..=30).contains(&len) {
        return Err(format!("prefix length /{len} must be between /8 and /30"));
    }
    let mask = u32::MAX << (32 - len);
    Ok((Ipv4Addr::from(u32::from(addr) & mask), len))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
