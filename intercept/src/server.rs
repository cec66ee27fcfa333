//! The control server: accepts copiers, authenticates them, turns their Claims and Releases into
//! [`RelayEvent`]s and writes their feedback.
//!
//! A connection from outside [`ServerConfig::allow`] is closed before any of its bytes is read.
//! Then the handshake (`docs/protocol.md`): Hello, Challenge (a fresh nonce), Auth (the copier's
//! proof that it holds `--secret-file`'s secret, checked in constant time), Welcome (our proof
//! back). Each refusal is one log line naming the peer and the reason, and is counted.
//!
//! Each copier gets a reader thread (handshake, claims, pings) and a [`crate::feed`]: what the
//! relay hands over is written to the socket at once by the thread that has it, and only what
//! the socket cannot take now goes to the copier's writer thread, with what follows it queued
//! behind (bounded). Nothing here may ever block the capture thread, and
//! a misbehaving copier (garbage, wrong version, bad secret, silence) costs only its own
//! connection. Connections are capped ([`ServerConfig::max_copiers`]): each costs threads and
//! buffers, and the cap is reached before the handshake. Connections over the cap are refused,
//! with a Reject saying why, by one shared thread. The secret itself is never logged nor sent.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::auth::{Nonce, Secret};
use common::control::{
    encode_challenge, encode_reject, encode_welcome, Challenge, CopierMessage, DecodeError,
    DoctorQuery, DoctorReport, FrameDecoder, Reject, Welcome, FEATURE_PAYLOAD_HASHES,
    FEATURE_PROMPT_ON_DEMAND, FEATURE_PROMPT_REPLIES, FEATURE_QUIET_IDLE, FEATURE_ROW_RUNS,
    IDLE_KEEPALIVE, PROTOCOL_VERSION,
};

use crate::feed::{spawn_writer, CloseOnDrop, Feed, FeedCounters};
use crate::relay::{CopierId, CopierTx, Outgoing, RelayEvent, MAX_CLAIMS_PER_COPIER};

/// Settings of the control server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Who this intercept is, told to copiers in the Welcome.
    pub name: String,
    /// When set, a copier must prove it holds this secret (and intercept proves it back).
    pub secret: Option<Secret>,
    /// Copier addresses (network, prefix length) allowed to connect; empty allows all.
    pub allow: Vec<(Ipv4Addr, u8)>,
    /// Payload bytes kept per feedback, told to copiers in the Welcome.
    pub payload_prefix: u16,
    /// `Some(--mysql-head)` when MySQL packets are framed, told to copiers in the Welcome.
    pub mysql_head: Option<u16>,
    /// Feedback batches queued per copier before its feedback is dropped.
    pub queue_batches: usize,
    /// ... and bytes they may take (see `Batch::memory_len`): per copier, and all copiers'
    /// queues together (`--max-memory`'s part).
    pub queue_bytes: usize,
    pub queue_bytes_total: usize,
    /// How long a new connection may take to send its Hello.
    pub handshake_timeout: Duration,
    /// A copier that sends nothing (not even a Ping) for this long is considered dead.
    pub idle_timeout: Duration,
    /// A copier that does not read its feedback for this long is disconnected.
    pub write_timeout: Duration,
    /// Control connections served at once (counted from accept, before the Hello); more are
    /// refused with a Reject.
    pub max_copiers: usize,
    /// Answers `copier doctor`'s Doctor queries (see `crate::doctor::answer`).
    pub doctor: Option<DoctorHook>,
}

/// What answers a Doctor query: it runs on the asking connection's reader thread (it may take a
/// second, for the ARP check), never on the capture thread.
#[derive(Clone)]
pub struct DoctorHook(pub Arc<dyn Fn(&DoctorQuery) -> DoctorReport + Send + Sync>);

impl std::fmt::Debug for DoctorHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoctorHook")
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            name: "intercept".into(),
            secret: None,
            allow: Vec::new(),
            payload_prefix: 64,
            mysql_head: None,
            queue_batches: 1024,
            queue_bytes: 16 << 20,
            queue_bytes_total: 64 << 20,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(5),
            max_copiers: 64,
            doctor: None,
        }
    }
}

/// Connection-level counters, shared by all connection threads (each event is rare).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub accepted: AtomicU64,
    pub welcomed: AtomicU64,
    /// Welcomed connections that have ended (their claims are being dropped).
    pub closed: AtomicU64,
    pub rejected: AtomicU64,
    /// Connections refused because `max_copiers` were already open (also in `rejected`).
    pub refused_full: AtomicU64,
    /// Connections from outside `allow`, closed unread (not in `accepted`).
    pub refused_allow: AtomicU64,
    /// Copiers refused for presenting no proof while intercept has a secret (also in `rejected`).
    pub refused_no_secret: AtomicU64,
    /// Copiers refused for a proof that does not match the secret (also in `rejected`).
    pub refused_bad_secret: AtomicU64,
    /// Copiers refused for speaking another protocol version (also in `rejected`).
    pub refused_version: AtomicU64,
    /// Control connections open right now.
    pub active: AtomicU64,
    /// Connections closed because they sent bytes that are not a valid frame.
    pub garbage: AtomicU64,
    /// Connections closed for silence (no Hello in time, or no frame for the idle timeout).
    pub timeouts: AtomicU64,
    /// The copiers' feeds': write failures (a copier that did not read its feedback) and
    /// messages that could not be encoded.
    pub feeds: Arc<FeedCounters>,
    /// Addresses received in Claim and Release frames.
    pub claimed_addrs: AtomicU64,
    pub released_addrs: AtomicU64,
    /// Prompt frames received (`FEATURE_PROMPT_ON_DEMAND`).
    pub prompts: AtomicU64,
    /// Pongs not sent because the copier's queue was full.
    pub pongs_dropped: AtomicU64,
    last_garbage_log: Mutex<Option<Instant>>,
    /// Refusal log lines, per reason: when the last was written and how many were not since.
    refusal_logs: Mutex<[(Option<Instant>, u64); 4]>,
}

/// A plain copy of [`ServerStats`], for status lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStatsSnapshot {
    pub accepted: u64,
    pub welcomed: u64,
    pub closed: u64,
    pub rejected: u64,
    pub refused_full: u64,
    pub refused_allow: u64,
    pub refused_no_secret: u64,
    pub refused_bad_secret: u64,
    pub refused_version: u64,
    pub active: u64,
    pub garbage: u64,
    pub timeouts: u64,
    pub write_failures: u64,
    pub claimed_addrs: u64,
    pub released_addrs: u64,
    pub prompts: u64,
    pub pongs_dropped: u64,
    pub encode_errors: u64,
}

impl ServerStats {
    pub fn snapshot(&self) -> ServerStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerStatsSnapshot {
            accepted: g(&self.accepted),
            welcomed: g(&self.welcomed),
            closed: g(&self.closed),
            rejected: g(&self.rejected),
            refused_full: g(&self.refused_full),
            refused_allow: g(&self.refused_allow),
            refused_no_secret: g(&self.refused_no_secret),
            refused_bad_secret: g(&self.refused_bad_secret),
            refused_version: g(&self.refused_version),
            active: g(&self.active),
            garbage: g(&self.garbage),
            timeouts: g(&self.timeouts),
            write_failures: g(&self.feeds.write_failures),
            claimed_addrs: g(&self.claimed_addrs),
            released_addrs: g(&self.released_addrs),
            prompts: g(&self.prompts),
            pongs_dropped: g(&self.pongs_dropped),
            encode_errors: g(&self.feeds.encode_errors),
        }
    }

    /// Whether a refusal for `why` is logged now: the first of each kind always, then at most
    /// every 10 s (a copier with the wrong secret retries every few seconds, forever). Returns
    /// how many were not logged since the last line.
    fn refusal_log_due(&self, why: Refusal) -> Option<u64> {
        let Ok(mut logs) = self.refusal_logs.lock() else {
            return Some(0);
        };
        let (last, quiet) = &mut logs[why as usize];
        match *last {
            Some(t) if t.elapsed() < Duration::from_secs(10) => {
                *quiet += 1;
                None
            }
            _ => {
                *last = Some(Instant::now());
                Some(std::mem::take(quiet))
            }
        }
    }

    /// A copier stuck in a reconnect loop with a bad peer must not flood the log.
    fn garbage_log_due(&self) -> bool {
        let Ok(mut last) = self.last_garbage_log.lock() else {
            return true;
        };
        let now = Instant::now();
        match *last {
            Some(t) if now.duration_since(t) < Duration::from_secs(10) => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Why a copier was refused, for the log line and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    NotAllowed = 0,
    NoSecret = 1,
    BadSecret = 2,
    Version = 3,
}

impl Refusal {
    /// The log line's reason, saying how to fix it.
    fn reason(self) -> &'static str {
        match self {
            Refusal::NotAllowed => {
                "address not in --allow (add its network to intercept's --allow)"
            }
            Refusal::NoSecret => {
                "no secret (intercept has --secret-file; give the copier the same --secret-file)"
            }
            Refusal::BadSecret => "bad secret (check --secret-file on both hosts)",
            Refusal::Version => {
                "other protocol version (run the same tcpshadow release on both hosts)"
            }
        }
    }

    /// What the copier is told.
    fn reject_reason(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "this copier's address is not in intercept's --allow",
            Refusal::NoSecret => {
                "intercept requires a shared secret: start the copier with --secret-file (a copy \
                 of intercept's --secret-file)"
            }
            Refusal::BadSecret => {
                "bad secret: the copier's --secret-file does not hold the same secret as \
                 intercept's (check --secret-file on both hosts)"
            }
            Refusal::Version => "",
        }
    }

    fn counter(self, s: &ServerStats) -> &AtomicU64 {
        match self {
            Refusal::NotAllowed => &s.refused_allow,
            Refusal::NoSecret => &s.refused_no_secret,
            Refusal::BadSecret => &s.refused_bad_secret,
            Refusal::Version => &s.refused_version,
        }
    }
}

/// Counts a refusal and logs it (rate-limited per reason) as one line naming the peer.
fn log_refusal(ctx: &Ctx, peer: SocketAddr, name: Option<&str>, why: Refusal, detail: &str) {
    bump(why.counter(&ctx.stats));
    if let Some(quiet) = ctx.stats.refusal_log_due(why) {
        let who = match name {
            Some(n) => format!("copier {peer} ({n})"),
            None => format!("copier {peer}"),
        };
        let more = if quiet > 0 {
            format!("; {quiet} more such refusals since the last line")
        } else {
            String::new()
        };
        tracing::warn!("{who} refused: {}{detail}{more}", why.reason());
    }
}

/// Whether `peer` may connect: in one of the `allow` networks, or `allow` is empty. IPv6 peers
/// are allowed only as IPv4-mapped addresses of an allowed network.
pub fn allowed(allow: &[(Ipv4Addr, u8)], peer: IpAddr) -> bool {
    if allow.is_empty() {
        return true;
    }
    let ip = match peer {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(ip) => ip,
            None => return false,
        },
    };
    allow.iter().any(|&(net, len)| {
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len.min(32)))
        };
        u32::from(ip) & mask == u32::from(net) & mask
    })
}

/// A running control server. Its threads live as long as the process.
pub struct ControlServer {
    local_addr: SocketAddr,
    stats: Arc<ServerStats>,
}

impl ControlServer {
    /// Starts accepting copiers on `listener`; routing changes go to `events` (read by the
    /// capture thread's relay).
    pub fn start(
        listener: TcpListener,
        config: ServerConfig,
        events: Sender<RelayEvent>,
    ) -> io::Result<ControlServer> {
        let local_addr = listener.local_addr()?;
        let stats = Arc::new(ServerStats::default());
        let ctx = Arc::new(Ctx {
            config,
            stats: stats.clone(),
            next_id: AtomicU64::new(1),
            queued_total: Arc::default(),
        });
        thread::Builder::new()
            .name("control-accept".into())
            .spawn(move || accept_loop(listener, ctx, events))?;
        Ok(ControlServer { local_addr, stats })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> ServerStatsSnapshot {
        self.stats.snapshot()
    }
}

struct Ctx {
    config: ServerConfig,
    stats: Arc<ServerStats>,
    next_id: AtomicU64,
    /// Bytes queued toward all copiers (see `ServerConfig::queue_bytes_total`).
    queued_total: Arc<AtomicUsize>,
}

/// Connections over the cap waiting for the refusing thread; beyond, they are closed at once.
const REFUSE_QUEUE: usize = 16;
/// How long the refusing thread waits for an over-the-cap connection's Hello.
const REFUSE_HELLO_WAIT: Duration = Duration::from_millis(500);

/// One open control connection; dropping it frees its place under the cap.
struct Slot(Arc<Ctx>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}

fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, events: Sender<RelayEvent>) {
    let mut last_error_log: Option<Instant> = None;
    let mut last_full_log: Option<Instant> = None;
    let refuse_tx = {
        let (tx, rx) = sync_channel::<(TcpStream, SocketAddr)>(REFUSE_QUEUE);
        let ctx = ctx.clone();
        let spawned = thread::Builder::new()
            .name("control-refuse".into())
            .spawn(move || refuse_loop(rx, &ctx));
        spawned.ok().map(|_| tx)
    };
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                if !allowed(&ctx.config.allow, peer.ip()) {
                    // Closed before reading a byte: a stranger learns nothing but that the
                    // port is open.
                    log_refusal(&ctx, peer, None, Refusal::NotAllowed, "");
                    drop(stream);
                    continue;
                }
                bump(&ctx.stats.accepted);
                let max = ctx.config.max_copiers as u64;
                if ctx.stats.active.load(Ordering::Relaxed) >= max {
                    bump(&ctx.stats.refused_full);
                    if last_full_log.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%peer, "refused a copier connection: {max} are open already (--max-copiers; said at most every 10 s)");
                        last_full_log = Some(Instant::now());
                    }
                    // Told why by the refusing thread, or (a flood) just closed.
                    match &refuse_tx {
                        Some(tx) => {
                            if tx.try_send((stream, peer)).is_err() {
                                bump(&ctx.stats.rejected);
                            }
                        }
                        None => bump(&ctx.stats.rejected),
                    }
                    continue;
                }
                ctx.stats.active.fetch_add(1, Ordering::Relaxed);
                let slot = Slot(ctx.clone());
                let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
                let ctx = ctx.clone();
                let events = events.clone();
                let spawned =
                    thread::Builder::new()
                        .name(format!("copier-{id}"))
                        .spawn(move || {
                            let _slot = slot;
                            serve(stream, peer, id, &ctx, &events)
                        });
                if let Err(e) = spawned {
                    tracing::warn!(%peer, "cannot start a thread for a copier connection: {e}");
                }
            }
            Err(e) => {
                // EMFILE and friends: keep serving the copiers we have, retry shortly.
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!("accepting control connections failed: {e} (raise `ulimit -n` if this is EMFILE)");
                    last_error_log = Some(Instant::now());
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Refuses connections over the cap, one at a time: reads the Hello first (closing a socket
/// with unread bytes would reset it, and the copier could lose the Reject), then says why.
fn refuse_loop(rx: Receiver<(TcpStream, SocketAddr)>, ctx: &Ctx) {
    let reason = format!(
        "intercept already serves {} copier connections (its --max-copiers); retry later or \
         raise --max-copiers",
        ctx.config.max_copiers
    );
    while let Ok((stream, _peer)) = rx.recv() {
        let _ = stream.set_read_timeout(Some(REFUSE_HELLO_WAIT));
        let _ = stream.set_write_timeout(Some(REFUSE_HELLO_WAIT));
        let mut conn = Conn {
            stream,
            dec: FrameDecoder::new(),
            buf: vec![0; 4096],
        };
        let _ = conn.read_message();
        let _ = conn.reject(ctx, &reason);
    }
}

/// Why a connection ended, for one log line.
enum End {
    Eof,
    Io(io::Error),
    Garbage(DecodeError),
    Protocol(&'static str),
    Timeout,
}

fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    id: CopierId,
    ctx: &Ctx,
    events: &Sender<RelayEvent>,
) {
    let cfg = &ctx.config;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(cfg.write_timeout));
    let _ = stream.set_read_timeout(Some(cfg.handshake_timeout));
    let mut conn = Conn {
        stream,
        dec: FrameDecoder::new(),
        buf: vec![0; 64 * 1024],
    };

    let hello = match conn.read_message() {
        Ok(CopierMessage::Hello(h)) => h,
        Ok(_) => {
            let _ = conn.reject(ctx, "the first frame must be a Hello");
            return;
        }
        Err(End::Garbage(DecodeError::VersionMismatch { theirs, ours })) => {
            log_refusal(
                ctx,
                peer,
                None,
                Refusal::Version,
                &format!(": it speaks control protocol version {theirs}, this intercept {ours}"),
            );
            let _ = conn.reject(
                ctx,
                &format!(
                    "this copier speaks control protocol version {theirs}, intercept speaks \
                     version {ours}: run the same tcpshadow release on both hosts"
                ),
            );
            return;
        }
        Err(end) => {
            log_end(ctx, peer, None, end);
            let _ = conn.stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let proof = match authenticate(ctx, &mut conn, peer, &hello.name) {
        Ok(p) => p,
        Err(end) => {
            if let Some(end) = end {
                log_end(ctx, peer, Some(&hello.name), end);
            }
            let _ = conn.stream.shutdown(Shutdown::Both);
            return;
        }
    };

    let welcome = Welcome {
        version: PROTOCOL_VERSION,
        name: cfg.name.clone(),
        payload_prefix: cfg.payload_prefix,
        mysql_head: cfg.mysql_head,
        // Payload hashes and runs come from the MySQL framer: granted only when there is one.
        features: (hello.features
            & (FEATURE_PROMPT_REPLIES | FEATURE_QUIET_IDLE | FEATURE_PROMPT_ON_DEMAND))
            | if cfg.mysql_head.is_some() {
                hello.features & (FEATURE_PAYLOAD_HASHES | FEATURE_ROW_RUNS)
            } else {
                0
            },
        proof,
    };
    let mut out = Vec::new();
    if let Err(e) = encode_welcome(&welcome, &mut out) {
        tracing::error!("cannot encode Welcome: {e}");
        return;
    }
    if let Err(e) = conn.stream.write_all(&out) {
        log_end(ctx, peer, Some(&hello.name), End::Io(e));
        return;
    }
    let write_half = match conn.stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, "cannot clone the copier's socket: {e}");
            return;
        }
    };
    let (tx, rx) = sync_channel(cfg.queue_batches.max(1));
    let tx = CopierTx::new(
        tx,
        cfg.queue_bytes,
        Arc::clone(&ctx.queued_total),
        cfg.queue_bytes_total,
    );
    let feed = Feed::new(write_half, tx.gauge(), Arc::clone(&ctx.stats.feeds));
    let _closes = CloseOnDrop(Arc::clone(&feed));
    if let Err(e) = spawn_writer(&feed, rx, format!("copier-{id}-tx")) {
        tracing::warn!(%peer, "cannot start a writer thread for a copier: {e}");
        return;
    }
    let tx = tx.with_feed(feed);
    bump(&ctx.stats.welcomed);
    tracing::info!(%peer, copier = %hello.name, id, "copier connected");
    if events
        .send(RelayEvent::Connected {
            id,
            name: hello.name.clone(),
            tx: tx.clone(),
            features: welcome.features,
        })
        .is_err()
    {
        return; // The relay is gone: intercept is shutting down.
    }

    // A quiet idle connection (FEATURE_QUIET_IDLE) is not timed out for silence while it
    // claims nothing: the kernel's keepalive finds a vanished copier instead.
    let quiet = welcome.features & FEATURE_QUIET_IDLE != 0
        && match ops::sockopt::set_keepalive(&conn.stream, IDLE_KEEPALIVE) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%peer, "cannot set TCP keepalive on a copier's connection: {e}; it stays on the heartbeat");
                false
            }
        };
    let mut claimed: HashSet<SocketAddrV4> = HashSet::new();
    // The read timeout this loop set; `None` before its first pass, while the handshake's
    // is still in force.
    let mut timeout: Option<Option<Duration>> = None;
    let end = loop {
        let want = (!quiet || !claimed.is_empty()).then_some(cfg.idle_timeout);
        if Some(want) != timeout {
            if let Err(e) = conn.stream.set_read_timeout(want) {
                break End::Io(e);
            }
            timeout = Some(want);
        }
        let msg = match conn.read_message() {
            Ok(m) => m,
            Err(end) => break end,
        };
        let (ev, counter, n) = match msg {
            CopierMessage::Claim(addrs) => {
                let n = addrs.len() as u64;
                // As the relay does, at most MAX_CLAIMS_PER_COPIER: past it the set only has to
                // stay non-empty, and keepalive still finds a dead copier if it ever errs.
                if quiet {
                    let room = MAX_CLAIMS_PER_COPIER.saturating_sub(claimed.len());
                    claimed.extend(addrs.iter().copied().take(room));
                }
                (RelayEvent::Claim { id, addrs }, &ctx.stats.claimed_addrs, n)
            }
            CopierMessage::Release(addrs) => {
                let n = addrs.len() as u64;
                if quiet {
                    for a in &addrs {
                        claimed.remove(a);
                    }
                }
                (
                    RelayEvent::Release { id, addrs },
                    &ctx.stats.released_addrs,
                    n,
                )
            }
            CopierMessage::Ping(n) => {
                if tx.try_send(Outgoing::Pong(n)).is_err() {
                    bump(&ctx.stats.pongs_dropped);
                }
                continue;
            }
            CopierMessage::Prompt(on) => {
                if welcome.features & FEATURE_PROMPT_ON_DEMAND == 0 {
                    break End::Protocol("Prompt without FEATURE_PROMPT_ON_DEMAND");
                }
                (RelayEvent::Prompt { id, on }, &ctx.stats.prompts, 1)
            }
            CopierMessage::Hello(_) => break End::Protocol("second Hello on one connection"),
            CopierMessage::Auth(_) => break End::Protocol("second Auth on one connection"),
            CopierMessage::Doctor(q) => {
                tracing::info!(%peer, copier = %hello.name, target = %q.target, "doctor query");
                let report = match &cfg.doctor {
                    Some(DoctorHook(f)) => f(&q),
                    None => DoctorReport {
                        unix_ms: 0,
                        checks: vec![common::control::DoctorCheck::new(
                            1,
                            "doctor",
                            "this intercept was started without doctor checks",
                        )],
                    },
                };
                // The copier's doctor waits for it: queued like a Pong, never dropped silently.
                if tx.try_send(Outgoing::Doctor(report)).is_err() {
                    bump(&ctx.stats.pongs_dropped);
                }
                continue;
            }
        };
        if events.send(ev).is_err() {
            break End::Eof;
        }
        // Counted after the send: whoever sees the count knows the relay will apply the event
        // before any feedback handed to the capture loop afterwards.
        counter.fetch_add(n, Ordering::Relaxed);
    };
    let _ = events.send(RelayEvent::Disconnected { id });
    bump(&ctx.stats.closed);
    log_end(ctx, peer, Some(&hello.name), end);
    // Wakes the writer if it is blocked on a full socket; `_closes` then ends it.
    let _ = conn.stream.shutdown(Shutdown::Both);
}

/// Challenge and Auth: returns intercept's proof for the Welcome (`None` without a secret), or
/// why the connection ends (`None` when the refusal was already logged and the Reject sent).
fn authenticate(
    ctx: &Ctx,
    conn: &mut Conn,
    peer: SocketAddr,
    name: &str,
) -> Result<Option<common::auth::Proof>, Option<End>> {
    let server_nonce: Nonce = match ops::secret::random_bytes() {
        Ok(n) => n,
        Err(e) => {
            tracing::error!("cannot read random bytes for a challenge: {e}");
            return Err(Some(End::Io(e)));
        }
    };
    let secret = ctx.config.secret.as_ref();
    let mut out = Vec::new();
    let challenge = Challenge {
        nonce: server_nonce,
        secret_required: secret.is_some(),
    };
    if encode_challenge(&challenge, &mut out).is_err() {
        return Err(Some(End::Protocol("Challenge does not encode")));
    }
    conn.stream.write_all(&out).map_err(|e| Some(End::Io(e)))?;
    let auth = match conn.read_message() {
        Ok(CopierMessage::Auth(a)) => a,
        Ok(_) => return Err(Some(End::Protocol("the second frame must be an Auth"))),
        Err(end) => return Err(Some(end)),
    };
    let Some(secret) = secret else {
        // An open channel: nothing to check, nothing to prove.
        return Ok(None);
    };
    let refusal = match &auth.proof {
        None => Refusal::NoSecret,
        Some(p) if !secret.verify_copier(&server_nonce, &auth.nonce, p) => Refusal::BadSecret,
        Some(_) => return Ok(Some(secret.intercept_proof(&server_nonce, &auth.nonce))),
    };
    log_refusal(ctx, peer, Some(name), refusal, "");
    let _ = conn.reject(ctx, refusal.reject_reason());
    Err(None)
}

fn log_end(ctx: &Ctx, peer: SocketAddr, name: Option<&str>, end: End) {
    let name = name.unwrap_or("(before Hello)");
    match end {
        End::Eof => tracing::info!(%peer, copier = %name, "copier disconnected"),
        End::Io(e) => tracing::info!(%peer, copier = %name, "copier connection lost: {e}"),
        End::Timeout => {
            bump(&ctx.stats.timeouts);
            tracing::warn!(%peer, copier = %name, "closed a silent copier connection (no frame within the timeout)");
        }
        End::Garbage(e) => {
            bump(&ctx.stats.garbage);
            if ctx.stats.garbage_log_due() {
                tracing::warn!(%peer, copier = %name, "closed a copier connection that sent an invalid frame: {e}");
            }
        }
        End::Protocol(what) => {
            bump(&ctx.stats.garbage);
            tracing::warn!(%peer, copier = %name, "closed a copier connection: {what}");
        }
    }
}

struct Conn {
    stream: TcpStream,
    dec: FrameDecoder<CopierMessage>,
    buf: Vec<u8>,
}

impl Conn {
    fn read_message(&mut self) -> Result<CopierMessage, End> {
        loop {
            if let Some(m) = self.dec.next_message().map_err(End::Garbage)? {
                return Ok(m);
            }
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Err(End::Eof),
                Ok(n) => self.dec.feed(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(End::Timeout)
                }
                Err(e) => return Err(End::Io(e)),
            }
        }
    }

    /// Tells the peer why, then closes. Best effort: the peer may already be gone.
    fn reject(&mut self, ctx: &Ctx, reason: &str) -> io::Result<()> {
        bump(&ctx.stats.rejected);
        let mut out = Vec::new();
        if encode_reject(&Reject::new(reason), &mut out).is_ok() {
            self.stream.write_all(&out)?;
        }
        self.stream.shutdown(Shutdown::Both)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::auth::NONCE_LEN;
    use common::control::{encode_auth, encode_hello, Auth, Hello, InterceptMessage};
    use std::sync::mpsc;

    const WAIT: Duration = Duration::from_secs(10);

    fn secret(s: &str) -> Secret {
        Secret::new(s.as_bytes()).unwrap()
    }

    fn read_one(
        s: &mut TcpStream,
        dec: &mut FrameDecoder<InterceptMessage>,
    ) -> Option<InterceptMessage> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(m) = dec.next_message().unwrap() {
                return Some(m);
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => dec.feed(&buf[..n]),
            }
        }
    }

    /// Connects to 127.0.0.1, says Hello asking for `features`, answers a Challenge with
    /// `secret`'s proof (none without one) and returns the answer after that (or the first
    /// answer if it was not a Challenge), plus the nonces for checking intercept's proof.
    fn hello_asking(
        addr: SocketAddr,
        secret: Option<&Secret>,
        features: u32,
    ) -> (TcpStream, Option<InterceptMessage>, Option<(Nonce, Nonce)>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut out = Vec::new();
        encode_hello(&Hello::new("c").with_features(features), &mut out).unwrap();
        s.write_all(&out).unwrap();
        let mut dec = FrameDecoder::<InterceptMessage>::new();
        let ch = match read_one(&mut s, &mut dec) {
            Some(InterceptMessage::Challenge(c)) => c,
            other => return (s, other, None),
        };
        let client_nonce = [0x5a; NONCE_LEN];
        let auth = Auth {
            nonce: client_nonce,
            proof: secret.map(|k| k.copier_proof(&ch.nonce, &client_nonce)),
        };
        let mut out = Vec::new();
        encode_auth(&auth, &mut out).unwrap();
        s.write_all(&out).unwrap();
        let m = read_one(&mut s, &mut dec);
        (s, m, Some((ch.nonce, client_nonce)))
    }

    fn hello_with(
        addr: SocketAddr,
        secret: Option<&Secret>,
    ) -> (TcpStream, Option<InterceptMessage>, Option<(Nonce, Nonce)>) {
        hello_asking(addr, secret, 0)
    }

    /// A welcomed connection that asked for `features`, and the features granted.
    fn welcomed(addr: SocketAddr, features: u32) -> (TcpStream, u32) {
        match hello_asking(addr, None, features) {
            (s, Some(InterceptMessage::Welcome(w)), _) => (s, w.features),
            (_, other, _) => panic!("expected a Welcome, got {other:?}"),
        }
    }

    fn hello(addr: SocketAddr) -> (TcpStream, Option<InterceptMessage>) {
        let (s, m, _) = hello_with(addr, None);
        (s, m)
    }

    fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
        let until = Instant::now() + WAIT;
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn start(config: ServerConfig) -> ControlServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (events, events_rx) = mpsc::channel();
        // The relay end stays open for the test's lifetime.
        std::mem::forget(events_rx);
        ControlServer::start(listener, config, events).unwrap()
    }

    #[test]
    fn prompt_replies_are_granted_to_whoever_asks_and_hashes_only_with_framing() {
        let server = start(ServerConfig::default());
        let asks = FEATURE_PROMPT_REPLIES | FEATURE_PAYLOAD_HASHES;
        let (_s, granted) = welcomed(server.local_addr(), asks);
        assert_eq!(granted, FEATURE_PROMPT_REPLIES);
    }

    #[test]
    fn prompts_reach_the_relay_only_from_a_copier_granted_them() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (events, rx) = mpsc::channel();
        let server = ControlServer::start(listener, ServerConfig::default(), events).unwrap();
        let addr = server.local_addr();
        let (mut s, granted) = welcomed(addr, FEATURE_PROMPT_ON_DEMAND);
        assert_eq!(granted, FEATURE_PROMPT_ON_DEMAND);
        let mut out = Vec::new();
        common::control::encode_prompt(true, &mut out).unwrap();
        common::control::encode_prompt(false, &mut out).unwrap();
        s.write_all(&out).unwrap();
        let mut prompts = Vec::new();
        while prompts.len() < 2 {
            let ev = rx.recv_timeout(WAIT).expect("the Prompts as relay events");
            if let RelayEvent::Prompt { on, .. } = ev {
                prompts.push(on);
            }
        }
        assert_eq!(prompts, [true, false]);
        wait_for(|| server.stats().prompts == 2, "the Prompts counted");
        // A copier that did not ask for the feature has no business sending one.
        let (mut s, granted) = welcomed(addr, 0);
        assert_eq!(granted, 0);
        s.write_all(&out).unwrap();
        wait_for(|| server.stats().closed == 1, "the connection to close");
        assert_eq!(server.stats().prompts, 2);
    }

    #[test]
    fn a_quiet_connection_is_not_timed_out_while_it_claims_nothing() {
        let server = start(ServerConfig {
            idle_timeout: Duration::from_millis(100),
            // Shorter than the silence below: the handshake's timeout must not outlive it.
            handshake_timeout: Duration::from_millis(150),
            ..ServerConfig::default()
        });
        let addr = server.local_addr();
        let (mut loud, granted) = welcomed(addr, 0);
        assert_eq!(granted, 0);
        let (mut quiet, granted) = welcomed(addr, FEATURE_QUIET_IDLE);
        assert_eq!(granted, FEATURE_QUIET_IDLE);
        // Silent for well over the idle timeout: the heartbeat's connection is closed, the
        // quiet one stays up (its keepalive is the kernel's).
        wait_for(
            || server.stats().closed == 1,
            "the silent heartbeat connection to close",
        );
        let mut b = [0u8; 1];
        assert_eq!(loud.read(&mut b).unwrap_or(0), 0);
        thread::sleep(Duration::from_millis(300));
        assert_eq!(server.stats().closed, 1);
        // Claiming something puts it back on the heartbeat's clock: silent again, it is closed.
        let mut out = Vec::new();
        common::control::encode_claim(
            &[std::net::SocketAddrV4::new(
                Ipv4Addr::new(198, 18, 0, 9),
                4000,
            )],
            &mut out,
        )
        .unwrap();
        quiet.write_all(&out).unwrap();
        wait_for(
            || server.stats().closed == 2,
            "the claiming quiet connection to time out",
        );
    }

    #[test]
    fn connections_over_the_cap_are_refused_with_a_reason() {
        let server = start(ServerConfig {
            max_copiers: 2,
            ..ServerConfig::default()
        });
        let addr = server.local_addr();
        let (first, m) = hello(addr);
        assert!(matches!(m, Some(InterceptMessage::Welcome(_))), "{m:?}");
        let (_second, m) = hello(addr);
        assert!(matches!(m, Some(InterceptMessage::Welcome(_))), "{m:?}");

        let (_third, m) = hello(addr);
        match m {
            Some(InterceptMessage::Reject(r)) => {
                assert!(r.reason.contains("--max-copiers"), "{}", r.reason)
            }
            other => panic!("expected a Reject, got {other:?}"),
        }
        let st = server.stats();
        assert_eq!((st.refused_full, st.rejected, st.active), (1, 1, 2));

        // A place frees up when a copier leaves.
        drop(first);
        wait_for(|| server.stats().active == 1, "the first copier's place");
        let (_fourth, m) = hello(addr);
        assert!(matches!(m, Some(InterceptMessage::Welcome(_))), "{m:?}");
        assert_eq!(server.stats().refused_full, 1);
    }

    #[test]
    fn copiers_must_prove_the_secret_and_intercept_proves_it_back() {
        let key = secret("0123456789abcdef-the-secret");
        let server = start(ServerConfig {
            secret: Some(key.clone()),
            ..ServerConfig::default()
        });
        let addr = server.local_addr();

        let (_s, m, _) = hello_with(addr, None);
        match m {
            Some(InterceptMessage::Reject(r)) => {
                assert!(r.reason.contains("--secret-file"), "{}", r.reason)
            }
            other => panic!("expected a Reject, got {other:?}"),
        }
        let wrong = secret("0123456789abcdef-the-secreT");
        let (_s, m, _) = hello_with(addr, Some(&wrong));
        match m {
            Some(InterceptMessage::Reject(r)) => {
                assert!(r.reason.contains("bad secret"), "{}", r.reason);
                assert!(!r.reason.contains("the-secret"), "{}", r.reason);
            }
            other => panic!("expected a Reject, got {other:?}"),
        }
        let (_s, m, nonces) = hello_with(addr, Some(&key));
        let (sn, cn) = nonces.unwrap();
        match m {
            Some(InterceptMessage::Welcome(w)) => {
                assert!(key.verify_intercept(&sn, &cn, &w.proof.unwrap()));
                assert!(!wrong.verify_intercept(&sn, &cn, &w.proof.unwrap()));
            }
            other => panic!("expected a Welcome, got {other:?}"),
        }
        // Counted just after the Welcome is written.
        wait_for(|| server.stats().welcomed == 1, "the welcome count");
        let st = server.stats();
        assert_eq!(
            (
                st.refused_no_secret,
                st.refused_bad_secret,
                st.rejected,
                st.welcomed
            ),
            (1, 1, 2, 1)
        );
    }

    #[test]
    fn without_a_secret_anyone_allowed_gets_in_without_a_proof() {
        let server = start(ServerConfig::default());
        let (_s, m, _) = hello_with(server.local_addr(), None);
        match m {
            Some(InterceptMessage::Welcome(w)) => assert_eq!(w.proof, None),
            other => panic!("expected a Welcome, got {other:?}"),
        }
    }

    #[test]
    fn addresses_outside_allow_are_closed_unread() {
        let server = start(ServerConfig {
            allow: vec![(Ipv4Addr::new(198, 18, 0, 254), 32)],
            ..ServerConfig::default()
        });
        let (_s, m) = hello(server.local_addr());
        assert_eq!(m, None);
        wait_for(|| server.stats().refused_allow == 1, "the refusal count");
        let st = server.stats();
        assert_eq!((st.accepted, st.active), (0, 0));

        let open = start(ServerConfig {
            allow: vec![(Ipv4Addr::new(127, 0, 0, 0), 8)],
            ..ServerConfig::default()
        });
        let (_s, m) = hello(open.local_addr());
        assert!(matches!(m, Some(InterceptMessage::Welcome(_))), "{m:?}");
    }

    #[test]
    fn allow_matching() {
        let v4 = |s: &str| IpAddr::V4(s.parse().unwrap());
        assert!(allowed(&[], v4("203.0.113.9")));
        let allow = [
            (Ipv4Addr::new(198, 18, 0, 0), 24),
            (Ipv4Addr::new(10, 1, 2, 3), 32),
        ];
        assert!(allowed(&allow, v4("198.18.0.2")));
        assert!(allowed(&allow, v4("10.1.2.3")));
        assert!(!allowed(&allow, v4("10.1.2.4")));
        assert!(!allowed(&allow, v4("198.18.1.2")));
        assert!(allowed(&allow, "::ffff:198.18.0.7".parse().unwrap()));
        assert!(!allowed(&allow, "2001:db8::1".parse().unwrap()));
        assert!(allowed(&[(Ipv4Addr::UNSPECIFIED, 0)], v4("8.8.8.8")));
    }

    #[test]
    fn refusal_lines_are_rate_limited_per_reason() {
        let st = ServerStats::default();
        assert_eq!(st.refusal_log_due(Refusal::BadSecret), Some(0));
        assert_eq!(st.refusal_log_due(Refusal::BadSecret), None);
        assert_eq!(st.refusal_log_due(Refusal::BadSecret), None);
        // Another reason has its own line.
        assert_eq!(st.refusal_log_due(Refusal::NoSecret), Some(0));
    }
}
