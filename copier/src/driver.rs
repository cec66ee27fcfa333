//! The mirror driver: everything between a source of captured packets and the wire, so a live
//! capture (`run`) and a capture file (`replay`) drive sessions the same way.
//!
//! # What this room is for
//!
//! [`Driver`] owns the session engines (a [`Fleet`]: one per `--map` route and `--multiply`
//! copy), the raw sender, the control channel to intercept
//! (and the eventfd its thread wakes us with), the optional `--prod-dsn` state lookup, the
//! status line and the counters of the edges. It feeds the engine, sends what the engine
//! transmits, tells intercept which addresses to relay (claims/releases), asks production for
//! the state of picked-up connections, prints status, drains on stop, and sums everything up.
//!
//! # What it must never do
//!
//! * Read packets itself: the caller owns the source (live capture, file) and its pacing.
//! * Hold TCP or protocol logic: that is the engine's (and its transforms').
//! * Block for long: [`Driver::wait`] is the only sleep, bounded by the engine's next timer.
//! * Send anywhere but the configured targets.
//!
//! # API
//!
//! ```text
//! let mut d = Driver::start(&mirror_args, plan, clock.now())?;
//!                          // builds the fleet, opens the raw socket, spawns the control client,
//!                          // waits up to 5 s for intercept, logs in for --prod-dsn
//! loop {
//!     let now = clock.now();
//!     if d.poll_stop(now) { /* stop reading the source; keep pumping */ }
//!     for each packet due (not while draining):  d.feed(now, &pkt);
//!     if d.pump(now) == Pump::Done { break }     // relayed input, lookups, timers,
//!                                                // transmit, events, drain progress
//!     if d.status_due(now) { d.print_status(now, &capture_stats) }
//!     d.wait(&[source_fd], d.next_wake(clock.now()));   // or sleep until the next packet
//! }
//! let snapshot = d.finish(clock.now(), &capture_stats);
//! ```
//!
//! * `feed` drops packets of a connection from this host to itself and the `--prod-dsn`
//!   connection's own packets (counted), then hands the packet to the engine. Call `pump` after
//!   every batch: nothing is sent from `feed`.
//! * `pump` returns [`Pump::Done`] once a drain (from SIGINT/SIGTERM via `poll_stop`, or the
//!   caller's [`Driver::begin_drain`], e.g. at the end of a file) has finished: all queued data
//!   acknowledged, or `--drain-secs` passed. Every session was then reset and forgotten.
//! * `next_wake(now)`: how long the caller may sleep before the driver has work (engine timers,
//!   status line; at most 200 ms so a stop request is seen; 10 ms while draining). A replay
//!   sleeps `min(next_wake, time until its next packet)`; [`Driver::wait`] also returns early
//!   when intercept relays something or `extra_fds` (e.g. the capture) become readable.
//! * `fail(now, capture_stats, error)`: the source broke (e.g. the interface went away): reset
//!   every session so the test server frees it, print the summary, return the error.

use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use common::clock::Instant;
use common::control::Hello;
use common::wire::TcpPacket;

use crate::capture::CaptureStats;
use crate::cli::{MirrorArgs, Protocol, Route};
use crate::control_client::{ControlClient, ControlHandle, Relayed};
use crate::credentials::Credentials;
use crate::engine::{CloseReason, Engine, EngineConfig, EngineEvent, Fleet, TestEvent};
use crate::metrics::MetricsPublisher;
use crate::mysql::{MysqlConfig, MysqlFactory, NotRecovered, RandomBytes};
use crate::prod_state::{OwnAddress, ProdDsn, StateLookup};
use crate::send::RawSender;
use crate::signals;
use crate::status::{Snapshot, StatusLine};
use crate::waker::{wait_readable, Waker};

/// Longest sleep: also bounds how late a stop request is noticed if a signal is missed.
const MAX_SLEEP: Duration = Duration::from_millis(200);
/// Sleep while draining: queued data is acknowledged within a test-server round trip.
const DRAIN_SLEEP: Duration = Duration::from_millis(10);

/// What to mirror, beyond [`MirrorArgs`]: the parts a live capture and a replay decide
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

/// What [`Driver::pump`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pump {
    /// Keep going.
    Running,
    /// The drain is over and every session was reset: leave the loop and call `finish`.
    Done,
}

/// See the module documentation.
pub struct Driver {
    fleet: Fleet,
    sample_percent: Option<f64>,
    sender: RawSender,
    control: ControlHandle,
    relayed: Receiver<Relayed>,
    waker: Waker,
    lookup: Option<StateLookup>,
    own: Option<OwnAddress>,
    status: StatusLine,
    buf: Vec<u8>,
    drain_secs: u64,
    stopping_since: Option<Instant>,
    not_mirrorable: OncePerClient,
    /// Packets of this host to itself or of `--prod-dsn`'s own connection, never mirrored.
    own_skipped: u64,
    mysql_events: u64,
    /// `--metrics`: re-rendered from the status snapshot when due (see `status_due`).
    metrics: Option<MetricsPublisher>,
}

impl Driver {
    /// Opens the raw sender, starts the control client and waits up to 5 s for intercept, then
    /// logs in on production if `plan.prod_dsn` is set. `now` starts the status interval.
    pub fn start(args: &MirrorArgs, plan: Plan, now: Instant) -> Result<Self> {
        let recovery_wait = plan.prod_dsn.is_some().then_some(plan.prod_dsn_wait);
        let fleet = build_fleet(args, &plan, recovery_wait)?;
        // Bound before anything else starts: a taken port is a start-up mistake to fix now.
        let metrics = args
            .metrics
            .map(|addr| MetricsPublisher::start(addr, args.metrics_top_digests, now))
            .transpose()?;
        let sender = RawSender::open()?;
        let waker = Waker::new().context("cannot create an eventfd")?;
        let name = format!("copier@{}", hostname());
        let wake = waker.clone();
        let (control, relayed) = ControlClient::spawn(
            args.intercept,
            Hello::new(&name, args.token()?),
            move || wake.wake(),
        )
        .with_context(|| {
            format!(
                "cannot start the control channel to intercept {}",
                args.intercept
            )
        })?;
        wait_for_intercept(&control, args.intercept);
        let lookup = start_lookup(plan.prod_dsn, &waker)?;
        let own = lookup.as_ref().map(|l| l.own_address().clone());
        let buf = vec![0u8; fleet.transmit_buffer_len()];
        let mut driver = Self {
            fleet,
            sample_percent: args.sample.map(|s| s.percent()),
            sender,
            control,
            relayed,
            waker,
            lookup,
            own,
            status: StatusLine::new(now, args.status_interval()),
            buf,
            drain_secs: args.drain_secs,
            stopping_since: None,
            not_mirrorable: OncePerClient::default(),
            own_skipped: 0,
            mysql_events: 0,
            metrics,
        };
        // A scrape before the first packet sees zeros, not an empty page.
        let snap = driver.snapshot(&CaptureStats::default());
        driver.publish_metrics(now, &snap);
        Ok(driver)
    }

    /// One captured packet (either direction). Nothing is sent until [`Driver::pump`].
    pub fn feed(&mut self, now: Instant, pkt: &TcpPacket<'_>) {
        // Never mirror ourselves: a connection from this host to itself (with `--interface
        // any`, our --prod-dsn connection is on `lo`, source and destination the same
        // address), nor --prod-dsn's connection at all.
        let (src, dst) = (
            SocketAddrV4::new(pkt.src, pkt.src_port),
            SocketAddrV4::new(pkt.dst, pkt.dst_port),
        );
        if pkt.src == pkt.dst || self.own.as_ref().is_some_and(|o| o.matches(src, dst)) {
            self.own_skipped += 1;
            return;
        }
        self.fleet.on_captured(now, pkt);
    }

    /// Checks for SIGINT/SIGTERM and starts draining on the first; true while draining. A
    /// draining caller stops feeding packets (nothing new is mirrored; what is queued still
    /// goes out) and keeps pumping until [`Pump::Done`].
    pub fn poll_stop(&mut self, now: Instant) -> bool {
        if self.stopping_since.is_none() && signals::stop_requested() {
            tracing::info!(
                "stop requested: draining queued data for up to {} s",
                self.drain_secs
            );
            self.stopping_since = Some(now);
        }
        self.stopping_since.is_some()
    }

    /// Starts draining without a signal (e.g. a replay reached the end of its file).
    pub fn begin_drain(&mut self, now: Instant) {
        self.stopping_since.get_or_insert(now);
    }

    pub fn is_draining(&self) -> bool {
        self.stopping_since.is_some()
    }

    /// Everything but reading packets: what intercept relayed, `--prod-dsn` answers, timers,
    /// transmission, session events (claims, releases, lookups) and drain progress.
    pub fn pump(&mut self, now: Instant) -> Pump {
        self.waker.reset();
        while let Ok(relayed) = self.relayed.try_recv() {
            match relayed {
                Relayed::Feedback(batch) => {
                    for fb in &batch {
                        self.fleet.on_feedback(now, fb);
                    }
                }
                Relayed::Mysql(events) => {
                    self.mysql_events += events.len() as u64;
                    for ev in &events {
                        self.fleet
                            .on_test_event(now, ev.client(), &TestEvent::Mysql(ev));
                    }
                }
            }
        }
        if let Some(lookup) = &self.lookup {
            while let Some(answer) = lookup.try_answer() {
                let ev = match &answer.state {
                    Some(state) => TestEvent::App(state),
                    None => TestEvent::App(&NotRecovered),
                };
                self.fleet.on_test_event(now, answer.mirrored, &ev);
            }
        }
        if self.fleet.next_deadline().is_some_and(|d| d <= now) {
            self.fleet.on_timeout(now);
        }
        self.transmit(now);
        self.handle_events();
        if let Some(since) = self.stopping_since {
            let drained = self.fleet.queued_bytes() == 0;
            if drained || now.saturating_since(since) >= Duration::from_secs(self.drain_secs) {
                self.reset_all(now);
                return Pump::Done;
            }
        }
        Pump::Running
    }

    /// How long the caller may sleep before the driver has work.
    pub fn next_wake(&self, now: Instant) -> Duration {
        let mut sleep = MAX_SLEEP;
        if let Some(d) = self.fleet.next_deadline() {
            sleep = sleep.min(d.saturating_since(now));
        }
        if let Some(d) = self.status.next_due() {
            sleep = sleep.min(d.saturating_since(now));
        }
        if let Some(m) = &self.metrics {
            sleep = sleep.min(m.next_due().saturating_since(now));
        }
        if self.stopping_since.is_some() {
            sleep = sleep.min(DRAIN_SLEEP);
        }
        sleep
    }

    /// Sleeps until intercept relays something, one of `extra_fds` (at most 3) is readable,
    /// a signal arrives, or `timeout` passes.
    pub fn wait(&self, extra_fds: &[RawFd], timeout: Duration) {
        let mut fds = [self.waker.as_raw_fd(); 4];
        let n = extra_fds.len().min(3);
        fds[1..=n].copy_from_slice(&extra_fds[..n]);
        wait_readable(&fds[..=n], timeout);
    }

    /// Whether the status line or the `--metrics` exposition is due: the callers refresh
    /// the capture's kernel counters and call [`Driver::print_status`], which does whichever
    /// is due.
    pub fn status_due(&self, now: Instant) -> bool {
        self.status.due(now) || self.metrics.as_ref().is_some_and(|m| m.due(now))
    }

    /// Prints the status line and publishes the metrics, each if due (call when
    /// [`Driver::status_due`]).
    pub fn print_status(&mut self, now: Instant, capture: &CaptureStats) {
        let snap = self.snapshot(capture);
        if self.status.due(now) {
            self.status.print(now, &snap);
        }
        self.publish_metrics(now, &snap);
    }

    fn publish_metrics(&mut self, now: Instant, snap: &Snapshot) {
        if let Some(m) = &mut self.metrics {
            if m.due(now) {
                // The comparison report joins here once it is collected (issue 6).
                m.publish(now, snap, None);
            }
        }
    }

    /// The `--metrics` responder's address, when serving.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsPublisher::local_addr)
    }

    /// All counters now.
    pub fn snapshot(&self, capture: &CaptureStats) -> Snapshot {
        Snapshot {
            engine: self.fleet.stats(),
            capture: *capture,
            send: self.sender.stats,
            control: self.control.stats(),
            transform_names: self.fleet.transform_counter_names(),
            lookup: self.lookup.as_ref().map(StateLookup::stats),
            copies: self.fleet.copies(),
            sample_percent: self.sample_percent,
        }
    }

    /// The packet source failed: reset every session so the test server frees it, print the
    /// summary, and hand back `error` for the caller to return.
    pub fn fail(
        mut self,
        now: Instant,
        capture: &CaptureStats,
        error: anyhow::Error,
    ) -> anyhow::Error {
        self.reset_all(now);
        let snap = self.snapshot(capture);
        eprint!(
            "{}",
            crate::status::summary(&snap, now.saturating_since(Instant::default()))
        );
        self.close();
        error
    }

    /// The final counters; stops the control client and the lookup. The last exposition
    /// published equals the summary's counters (a scrape racing the exit sees final values).
    pub fn finish(mut self, capture: &CaptureStats) -> Snapshot {
        let snap = self.snapshot(capture);
        if let Some(m) = &mut self.metrics {
            m.publish(Instant::default(), &snap, None);
        }
        tracing::debug!(
            mysql_events = self.mysql_events,
            own_skipped = self.own_skipped,
            "MySQL packet summaries received; own packets skipped"
        );
        self.close();
        snap
    }

    fn close(self) {
        drop(self.lookup);
        self.control.shutdown();
    }

    fn reset_all(&mut self, now: Instant) {
        self.fleet.shutdown(now);
        self.transmit(now);
    }

    fn transmit(&mut self, now: Instant) {
        while let Some((n, target)) = self.fleet.poll_transmit(now, &mut self.buf) {
            self.sender.send(&self.buf[..n], target);
        }
    }

    fn handle_events(&mut self) {
        while let Some(ev) = self.fleet.poll_event() {
            match ev {
                EngineEvent::SessionOpened {
                    client,
                    mirrored,
                    picked_up,
                } => {
                    self.control.claim(mirrored);
                    if let (true, Some(lookup)) = (picked_up, &self.lookup) {
                        lookup.request(client, mirrored);
                    }
                }
                EngineEvent::SessionReleased { mirrored } => self.control.release(mirrored),
                EngineEvent::SessionClosed {
                    client,
                    reason: CloseReason::NotMirrorable,
                    why,
                    ..
                } => self.not_mirrorable.note(client, why.unwrap_or("unknown")),
                EngineEvent::SessionClosed { .. } => {}
            }
        }
    }
}

/// Every engine of `plan`: one per route and `--multiply` copy, each with its own slice of
/// `--client-ip-pool`.
pub fn build_fleet(
    args: &MirrorArgs,
    plan: &Plan,
    recovery_wait: Option<Duration>,
) -> Result<Fleet> {
    let Some(first) = plan.routes.first() else {
        bail!("nothing to mirror: give --port and --target (or --map)");
    };
    let template = engine_config(args, *first, plan.pickup_midstream);
    let routes: Vec<_> = plan
        .routes
        .iter()
        .map(|r| (r.prod_port, r.target))
        .collect();
    let mysql = match args.protocol {
        Protocol::Tcp => None,
        Protocol::Mysql => Some(mysql_factory(args, recovery_wait)?),
    };
    if args.read_only {
        tracing::info!(
            "--read-only: commands that write are not mirrored (CALL {})",
            if args.read_only_allow_calls {
                "is"
            } else {
                "neither"
            }
        );
    }
    let fleet = Fleet::new(&template, &routes, args.multiply, |cfg| match &mysql {
        Some(f) => Engine::with_transform(cfg, Box::new(f.clone())),
        None => Engine::new(cfg),
    })?;
    Ok(fleet)
}

/// The engine configuration of one route.
pub fn engine_config(args: &MirrorArgs, route: Route, pickup_midstream: bool) -> EngineConfig {
    let mut cfg = EngineConfig::new(route.prod_port, route.target);
    cfg.client_ip_pool = args.client_ip_pool;
    cfg.sample = args.sample;
    cfg.mss = args.mss;
    cfg.pickup_midstream = pickup_midstream;
    cfg.max_sessions = args.max_sessions;
    cfg
}

/// The engine for `--protocol`: plain TCP, or with the MySQL layer rewriting logins and
/// statement ids. `recovery_wait`: with `--prod-dsn`, how long a picked-up connection waits
/// (its commands held) for its state.
pub fn build_engine(
    args: &MirrorArgs,
    cfg: EngineConfig,
    recovery_wait: Option<Duration>,
) -> Result<Engine> {
    if args.protocol == Protocol::Tcp {
        return Ok(Engine::new(cfg));
    }
    let factory = mysql_factory(args, recovery_wait)?;
    Ok(Engine::with_transform(cfg, Box::new(factory)))
}

fn mysql_factory(args: &MirrorArgs, recovery_wait: Option<Duration>) -> Result<MysqlFactory> {
    let credentials = match &args.mysql_credentials {
        Some(path) => Credentials::load(path)?,
        None => {
            tracing::warn!(
                "no --mysql-credentials: logins are forwarded unchanged, so they only succeed on a \
                 test server that does not check passwords (--skip-grant-tables)"
            );
            Credentials::default()
        }
    };
    if let Some(user) = &args.mysql_default_user {
        if credentials.password(user).is_none() {
            bail!("--mysql-default-user {user:?} has no line in --mysql-credentials");
        }
    }
    let config = MysqlConfig {
        default_user: args.mysql_default_user.clone(),
        default_db: args.mysql_default_db.clone(),
        forward_without_credentials: args.mysql_credentials.is_none(),
        recovery_wait,
        read_only: args.read_only,
        allow_calls: args.read_only_allow_calls,
        ..MysqlConfig::default()
    };
    Ok(MysqlFactory::new(config, Arc::new(credentials), urandom()?))
}

/// Random bytes for caching_sha2 full authentication (RSA-OAEP padding), from the kernel.
fn urandom() -> Result<RandomBytes> {
    let file = std::fs::File::open("/dev/urandom").context("cannot open /dev/urandom")?;
    Ok(Arc::new(move |buf: &mut [u8]| {
        use std::io::Read;
        (&file).read_exact(buf).is_ok()
    }))
}

/// `--prod-dsn`: logs in on production once now, so a wrong password or a missing grant stops
/// the copier with the fix instead of silently recovering nothing.
fn start_lookup(dsn: Option<ProdDsn>, waker: &Waker) -> Result<Option<StateLookup>> {
    let Some(dsn) = dsn else {
        return Ok(None);
    };
    let wake = waker.clone();
    let shown = dsn.to_string();
    let user = dsn.user.clone();
    match StateLookup::start(dsn, move || wake.wake()) {
        Ok((lookup, ready)) => {
            if ready.performance_schema_off {
                tracing::warn!(
                    "--prod-dsn {shown}: production runs with performance_schema=OFF, so prepared \
                     statements of pooled connections cannot be recovered (their executes are \
                     dropped and counted); users and schemas are. Fix: performance_schema=ON in \
                     production's my.cnf (takes a restart)"
                );
            }
            tracing::info!(
                "--prod-dsn {shown}: logged in; pooled connections' state will be recovered"
            );
            Ok(Some(lookup))
        }
        Err(e) => match e.fix(&user) {
            Some(fix) => bail!("--prod-dsn {shown}: {e}; fix: {fix}"),
            None => bail!("--prod-dsn {shown}: {e}"),
        },
    }
}

/// Says once per client address (bounded) that its sessions cannot be mirrored, and why: the
/// user should know, but one line per connection would flood the log.
#[derive(Default)]
struct OncePerClient {
    seen: std::collections::HashSet<std::net::Ipv4Addr>,
}

impl OncePerClient {
    const MAX: usize = 10_000;

    fn note(&mut self, client: SocketAddrV4, why: &str) {
        if self.seen.len() < Self::MAX && self.seen.insert(*client.ip()) {
            tracing::warn!(
                "sessions from {} cannot be mirrored ({why}); they are left alone and counted \
                 (said once per client address)",
                client.ip()
            );
        }
    }
}

/// Waits a little for the control channel before the first packet is read. Sessions started
/// earlier lose the test server's SYN-ACK (nobody is there to relay it) and stall for a
/// retransmission timeout; the capture meanwhile keeps what arrives in its kernel buffer.
/// Never waits forever: an intercept that is down must not keep production unobserved, and
/// the engine retransmits until the channel is up.
fn wait_for_intercept(control: &ControlHandle, addr: std::net::SocketAddr) {
    const PATIENCE: Duration = Duration::from_secs(5);
    let started = std::time::Instant::now();
    while !control.stats().connected && started.elapsed() < PATIENCE {
        if signals::stop_requested() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !control.stats().connected {
        tracing::warn!(
            "intercept {addr} not reachable after {} s; mirroring anyway, sessions wait for it \
             (is intercept running, and is its --listen address reachable from here?)",
            PATIENCE.as_secs()
        );
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
