//! The copier's engine loop: one thread that owns the session engine and the two inputs that
//! feed it (the capture and the control channel), sleeping in poll(2) between events.
//!
//! This room wires the edges to the engine and reports; it holds no TCP logic.

use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use common::clock::MonotonicClock;
use common::control::Hello;

use crate::capture::LiveCapture;
use crate::cli::Args;
use crate::cli::Protocol;
use crate::control_client::{ControlClient, Relayed};
use crate::credentials::Credentials;
use crate::engine::{CloseReason, Engine, EngineConfig, EngineEvent, TestEvent};
use crate::mysql::{MysqlConfig, MysqlFactory, NotRecovered, RandomBytes};
use crate::prod_state::StateLookup;
use crate::send::RawSender;
use crate::signals;
use crate::status::{Snapshot, StatusLine};
use crate::waker::{wait_readable, Waker};

/// Packets read from the capture before the loop looks at the control channel again.
const CAPTURE_BUDGET: usize = 512;
/// Longest sleep: also bounds how late a stop request is noticed if a signal is missed.
const MAX_SLEEP: Duration = Duration::from_millis(200);

pub fn engine_config(args: &Args) -> EngineConfig {
    let mut cfg = EngineConfig::new(args.port, args.target);
    cfg.client_ip_pool = args.client_ip_pool;
    cfg.mss = args.mss;
    cfg.pickup_midstream = !args.no_pickup;
    cfg.max_sessions = args.max_sessions;
    cfg
}

/// The engine for `--protocol`: plain TCP, or with the MySQL layer rewriting logins and
/// statement ids.
pub fn build_engine(args: &Args) -> Result<Engine> {
    let cfg = engine_config(args);
    if args.protocol == Protocol::Tcp {
        return Ok(Engine::new(cfg));
    }
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
        // With --prod-dsn a picked-up connection waits (its commands held) for its state.
        recovery_wait: args
            .prod_dsn
            .is_some()
            .then(|| Duration::from_millis(args.prod_dsn_wait_ms)),
        read_only: args.read_only,
        allow_calls: args.read_only_allow_calls,
        ..MysqlConfig::default()
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
    let factory = MysqlFactory::new(config, Arc::new(credentials), urandom()?);
    Ok(Engine::with_transform(cfg, Box::new(factory)))
}

/// Random bytes for caching_sha2 full authentication (RSA-OAEP padding), from the kernel.
fn urandom() -> Result<RandomBytes> {
    let file = std::fs::File::open("/dev/urandom").context("cannot open /dev/urandom")?;
    Ok(Arc::new(move |buf: &mut [u8]| {
        use std::io::Read;
        (&file).read_exact(buf).is_ok()
    }))
}

pub fn run(args: &Args) -> Result<Snapshot> {
    let clock = MonotonicClock::new();
    let filter = args.capture_filter();
    let buffer = i32::try_from(u64::from(args.capture_buffer_mb) << 20).unwrap_or(i32::MAX);
    let mut capture = LiveCapture::open(&args.interface, &filter, buffer)?;
    let mut sender = RawSender::open()?;
    let waker = Waker::new().context("cannot create an eventfd")?;
    let name = format!("copier@{}", hostname());
    let wake = waker.clone();
    let (control, feedback) = ControlClient::spawn(
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

    let mut engine = build_engine(args)?;
    wait_for_intercept(&control, args.intercept);
    let lookup = start_lookup(args, &waker)?;
    let own = lookup.as_ref().map(|l| l.own_address().clone());
    let mut own_skipped = 0u64;
    let mut buf = vec![0u8; engine.transmit_buffer_len()];
    let target_ip = *args.target.ip();
    let mut status = StatusLine::new(clock.now(), args.status_interval());
    tracing::info!(
        "mirroring port {} on {} to {} (intercept {}), filter: {filter}",
        args.port,
        args.interface,
        args.target,
        args.intercept
    );

    let mut stopping_since = None;
    let mut mysql_events = 0u64;
    let mut not_mirrorable = OncePerClient::default();
    loop {
        let now = clock.now();
        if stopping_since.is_none() && signals::stop_requested() {
            tracing::info!(
                "stop requested: draining queued data for up to {} s",
                args.drain_secs
            );
            stopping_since = Some(now);
        }
        // Once stopping, nothing new is captured; what is queued still goes out.
        if stopping_since.is_none() {
            let drained = capture.drain(CAPTURE_BUDGET, |pkt| {
                // Never mirror ourselves: a connection from this host to itself (with
                // `--interface any`, our --prod-dsn connection is on `lo`, source and
                // destination the same address), nor --prod-dsn's connection at all.
                let (src, dst) = (
                    SocketAddrV4::new(pkt.src, pkt.src_port),
                    SocketAddrV4::new(pkt.dst, pkt.dst_port),
                );
                if pkt.src == pkt.dst || own.as_ref().is_some_and(|o| o.matches(src, dst)) {
                    own_skipped += 1;
                    return;
                }
                engine.on_captured(now, pkt)
            });
            if let Err(e) = drained {
                // Reset what is mirrored so the test server frees it, say what we did, stop.
                engine.shutdown(now);
                while let Some(n) = engine.poll_transmit(now, &mut buf) {
                    sender.send(&buf[..n], target_ip);
                }
                let snap = Snapshot::take(&engine, &capture, &sender, &control.stats());
                eprint!(
                    "{}",
                    crate::status::summary(&snap, now.saturating_since(Default::default()))
                );
                return Err(e);
            }
        }
        waker.reset();
        while let Ok(relayed) = feedback.try_recv() {
            match relayed {
                Relayed::Feedback(batch) => {
                    for fb in &batch {
                        engine.on_feedback(now, fb);
                    }
                }
                Relayed::Mysql(events) => {
                    mysql_events += events.len() as u64;
                    for ev in &events {
                        engine.on_test_event(now, ev.client(), &TestEvent::Mysql(ev));
                    }
                }
            }
        }
        if let Some(lookup) = &lookup {
            while let Some(answer) = lookup.try_answer() {
                match &answer.state {
                    Some(state) => {
                        engine.on_test_event(now, answer.mirrored, &TestEvent::App(state))
                    }
                    None => {
                        engine.on_test_event(now, answer.mirrored, &TestEvent::App(&NotRecovered))
                    }
                }
            }
        }
        if engine.next_deadline().is_some_and(|d| d <= now) {
            engine.on_timeout(now);
        }
        while let Some(n) = engine.poll_transmit(now, &mut buf) {
            sender.send(&buf[..n], target_ip);
        }
        while let Some(ev) = engine.poll_event() {
            match ev {
                EngineEvent::SessionOpened {
                    client,
                    mirrored,
                    picked_up,
                } => {
                    control.claim(mirrored);
                    if let (true, Some(lookup)) = (picked_up, &lookup) {
                        lookup.request(client, mirrored);
                    }
                }
                EngineEvent::SessionReleased { mirrored } => control.release(mirrored),
                EngineEvent::SessionClosed {
                    client,
                    reason: CloseReason::NotMirrorable,
                    why,
                    ..
                } => not_mirrorable.note(client, why.unwrap_or("unknown")),
                EngineEvent::SessionClosed { .. } => {}
            }
        }
        if let Some(since) = stopping_since {
            let drained = engine.queued_bytes() == 0;
            if drained || now.saturating_since(since) >= Duration::from_secs(args.drain_secs) {
                engine.shutdown(now);
                while let Some(n) = engine.poll_transmit(now, &mut buf) {
                    sender.send(&buf[..n], target_ip);
                }
                break;
            }
        }
        if status.due(now) {
            capture.refresh_kernel_stats();
            let mut snap = Snapshot::take(&engine, &capture, &sender, &control.stats());
            snap.lookup = lookup.as_ref().map(StateLookup::stats);
            status.print(now, &snap);
        }

        let mut sleep = MAX_SLEEP;
        if let Some(d) = engine.next_deadline() {
            sleep = sleep.min(d.saturating_since(clock.now()));
        }
        if let Some(d) = status.next_due() {
            sleep = sleep.min(d.saturating_since(clock.now()));
        }
        if stopping_since.is_some() {
            sleep = sleep.min(Duration::from_millis(10));
        }
        wait_readable(&[capture.as_raw_fd(), waker.as_raw_fd()], sleep);
    }
    capture.refresh_kernel_stats();
    let mut snap = Snapshot::take(&engine, &capture, &sender, &control.stats());
    snap.lookup = lookup.as_ref().map(StateLookup::stats);
    tracing::debug!(
        mysql_events,
        own_skipped,
        "MySQL packet summaries received; own packets skipped"
    );
    drop(lookup);
    control.shutdown();
    Ok(snap)
}

/// `--prod-dsn`: logs in on production once now, so a wrong password or a missing grant stops
/// the copier with the fix instead of silently recovering nothing.
fn start_lookup(args: &Args, waker: &Waker) -> Result<Option<StateLookup>> {
    let Some(arg) = &args.prod_dsn else {
        return Ok(None);
    };
    let dsn = arg
        .get()
        .map_err(|e| anyhow::anyhow!("--prod-dsn: {e}"))?
        .clone();
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

    fn note(&mut self, client: std::net::SocketAddrV4, why: &str) {
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
fn wait_for_intercept(control: &crate::control_client::ControlHandle, addr: std::net::SocketAddr) {
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
