//! The copier's validated settings: what the mirror runs with, once the command line (or
//! config file) has been parsed and checked by `cli`.
//!
//! # What this room is for
//!
//! Plain data and the pure answers derived from it: the routes (`--port`/`--target`, `--map`),
//! the protocol, the [`MirrorSettings`] every mirror (live, replay, each capture worker) runs
//! with, the [`Plan`] a live capture and a replay decide differently, the live copier's
//! [`LiveSettings`] and [`CaptureSettings`], and the capture filter the routes give. `builders` turns these into engines; `driver` runs them.
//!
//! # What it must never do
//!
//! * Depend on the command-line parser (`cli`) or on anything that owns I/O (`driver`,
//!   `run`, `replay`): the arrow goes cli -> settings -> builders -> driver.
//! * Refuse anything: the checks, and their messages, are `cli`'s (`MirrorArgs::validate`).

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

/// What every mirror runs with (live, replay, each capture worker): `cli::MirrorArgs` once
/// validated, field for field (the flags' documentation is there).
#[derive(Clone, Debug)]
pub struct MirrorSettings {
    pub target: Vec<SocketAddrV4>,
    pub intercept: Vec<SocketAddr>,
    pub client_ip_pool: Option<(Ipv4Addr, u8)>,
    pub mss: u16,
    pub delayed_ack_ms: u16,
    pub protocol: Protocol,
    pub mysql_credentials: Option<PathBuf>,
    pub mysql_default_user: Option<String>,
    pub mysql_default_db: Option<String>,
    pub secret_file: Option<PathBuf>,
    pub status_interval: u64,
    pub max_sessions: usize,
    pub max_memory: u32,
    pub multiply: u32,
    pub sample: Option<Sample>,
    pub drain_secs: u64,
    pub read_only: bool,
    pub read_only_allow_calls: bool,
    pub metrics: Option<SocketAddr>,
    pub metrics_top_digests: usize,
    pub report: Option<PathBuf>,
    pub report_interval: u64,
    pub compare_results: bool,
    pub report_literals: bool,
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
/// (our own output, should a target port equal a production port).
pub fn capture_filter(routes: &[Route]) -> String {
    let (ports, hosts) = filter_terms(routes);
    let any = filter_any;
    if ports.len() == 1 && hosts.len() == 1 {
        let (p, t) = (&ports[0], &hosts[0]);
        return format!(
            "tcp and ((dst port {p} and not dst host {t}) or (src port {p} and not src host {t}))"
        );
    }
    format!(
        // libpcap gives `and` and `or` the same precedence: every group is bracketed.
        "tcp and ((({}) and not ({})) or (({}) and not ({})))",
        any("dst port", &ports),
        any("dst host", &hosts),
        any("src port", &ports),
        any("src host", &hosts),
    )
}

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
