//! intercept's wiring: validated flags -> the capture (or the test host's queue) -> the
//! control server -> the pump loop(s), with the status line and `--metrics` (`outputs`, the
//! same for both); one capture thread, or `--workers N` summed by a coordinator. Also
//! `intercept doctor`'s run.
//!
//! Must never decide what a flag means (that is `cli`'s) nor hold protocol logic (the
//! rooms it wires: `capture`, `pump`, `relay`, `server`, `sessions`).
//!
//! Its log lines keep the binary's target (`intercept`), as when this wiring was in main.rs.

use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::capture::{CaptureOptions, CaptureSource, CapturedPayload};
use crate::cli::{open_channel_warnings, Args, DirectionArg, DoctorArgs};
use crate::onhost::{self, OnHostCapture, ReplyCapture};
use crate::outputs::{Metrics, Outputs, Pacing};
use crate::pump::{self, PumpConfig, ReplyPath};
use crate::relay::Relay;
use crate::server::{ControlServer, ServerConfig};
use crate::signals;

/// The daemon with `cli`'s flags, until a stop signal or a capture failure.
pub fn run(cli: Args) -> anyhow::Result<()> {
    if cli.on_host.cleanup {
        return onhost::cleanup();
    }
    cli.validate()?;
    let secret = cli.secret()?;
    for warning in open_channel_warnings(cli.listen, secret.is_some(), &cli.allow) {
        tracing::warn!(target: "intercept", "{warning}");
    }
    if cli.interface == "lo" && matches!(cli.direction, DirectionArg::Out) {
        // libpcap drops the outgoing copy of loopback packets so they are not seen twice.
        tracing::warn!(target: "intercept",
            "--direction out captures nothing on lo (libpcap shows loopback packets as incoming \
             only); use --direction in"
        );
    }
    let payload_prefix = cli.payload_prefix();
    if !cli.on_host.on_test_host {
        // A forwarding assistant hands the test server's replies on to the real clients, which
        // reset their own connections with production's peers: said at start, not only by
        // `intercept doctor`, since this is the one set-up mistake that reaches production.
        for c in crate::doctor::forwarding_checks(&cli.doctor_setup()) {
            if c.level != ops::check::Level::Ok {
                tracing::warn!(target: "intercept", "{}: {}", c.name, c.detail);
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
                    crate::nfqueue::MAX_COPY_RANGE
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
            tracing::info!(target: "intercept", "--capture-priority auto is the copier's; intercept runs as started");
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
    let metrics = Metrics::bind(cli.metrics)?;

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
            doctor: Some({
                let setup = cli.doctor_setup();
                // Opened now, while CAP_NET_RAW is still held: a copier's doctor asks for ARP
                // checks later. Without it the check says it cannot send.
                let arp = ops::arp::ArpSocket::open().ok().map(std::sync::Mutex::new);
                crate::server::DoctorHook(std::sync::Arc::new(move |q| {
                    crate::doctor::answer(&setup, q, arp.as_ref())
                }))
            }),
            ..ServerConfig::default()
        },
        events_tx,
    )
    .context("cannot start the control server")?;
    tracing::info!(target: "intercept", listen = %server.local_addr(), protocol = ?cli.protocol, "waiting for copiers");
    drop_privileges(cli.on_host.on_test_host)?;

    signals::install();
    if !more.is_empty() {
        let ReplyCapture::Wire(first) = source else {
            bail!("--workers needs the pcap capture");
        };
        let mut sources = vec![first];
        sources.extend(more);
        return workers::run(&cli, sources, &server, events_rx, metrics);
    }
    let mut path = ReplyPath::new(
        Relay::new(cli.batch as usize),
        usize::from(payload_prefix),
        cli.sessions(),
    );
    let mut outputs = Outputs::new(metrics, cli.status_interval, Pacing::Pump);
    let config = PumpConfig {
        status_interval: outputs.report_interval(),
        gather: Duration::from_micros(u64::from(cli.relay_flush_us)),
        ..PumpConfig::default()
    };
    if outputs.serves_metrics() {
        // A scrape before the first report sees zeros, not an empty page.
        outputs.publish_metrics(&pump::status(&path, &mut source, server.stats()));
    }
    let result = pump::run(
        &mut source,
        &mut path,
        &events_rx,
        &signals::STOP,
        config,
        |path, source| outputs.observe(&pump::status(path, source, server.stats())),
    );
    outputs.finish(&pump::status(&path, &mut source, server.stats()));
    result
}

/// `--workers N`: opens N-1 more captures like `first`, joins all N to one fan-out group and
/// drops what they captured before the group was whole (every member saw it).
fn open_workers(
    cli: &Args,
    first: &mut CaptureSource,
    payload_prefix: u16,
) -> anyhow::Result<Vec<CaptureSource>> {
    let group = crate::capture::fanout_group();
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
    tracing::info!(target: "intercept",
        "{} capture workers in fan-out group {group} ({discarded} replies captured before the \
         group formed dropped)",
        cli.workers
    );
    Ok(more)
}

fn capture_options(cli: &Args, payload_prefix: u16) -> CaptureOptions {
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

    use crate::capture::CaptureSource;
    use crate::outputs::{Metrics, Outputs, Pacing};
    use crate::pump::{self, PumpConfig, ReplyPath, Status};
    use crate::relay::{Relay, RelayEvent};
    use crate::server::ControlServer;
    use crate::signals;

    use super::Args;

    /// How often a worker hands its counters over.
    const PUBLISH: Duration = Duration::from_millis(500);

    pub(super) fn run(
        cli: &Args,
        sources: Vec<CaptureSource>,
        server: &ControlServer,
        events: Receiver<RelayEvent>,
        metrics: Option<Metrics>,
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
        let (results, outputs) = std::thread::scope(|scope| {
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
            // The status line's clock starts with the coordination, as a single pump's does.
            let mut outputs = Outputs::new(metrics, cli.status_interval, Pacing::Tick);
            loop {
                if signals::STOP.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::SeqCst);
                }
                let (sum, done) = total(&latest, server);
                if done == n {
                    break;
                }
                outputs.observe(&sum);
                std::thread::sleep(Duration::from_millis(100));
            }
            let results = handles
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
                .collect::<Vec<_>>();
            (results, outputs)
        });
        let (summary, _) = total(&latest, server);
        for (i, l) in latest.iter().enumerate() {
            if let Ok(l) = l.lock() {
                let r = &l.0.relay;
                tracing::info!(target: "intercept",
                    "worker {i}: captured={} routed={} unclaimed_broadcast={} mysql_sessions_framed={}",
                    l.0.source.captured,
                    r.routed,
                    r.unclaimed,
                    l.0.mysql.map_or(0, |(m, _)| m.sessions_framed)
                );
            }
        }
        outputs.finish(&summary);
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
    tracing::info!(target: "intercept", "capabilities dropped: {}", dropped.describe());
    Ok(())
}

/// `intercept doctor` with `args`: prints each check and the summary; the exit status (1 if
/// any check FAILed).
pub fn doctor(args: &DoctorArgs) -> i32 {
    // Only problems reach the log: the checks are the output.
    ops::reload::init_logging("warn", false);
    let cli = &args.daemon;
    let setup = cli.doctor_setup();
    let mut arp = Vec::new();
    for (base, prefix) in &args.arp_check {
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
    for c in crate::doctor::standalone_checks(&setup, &arp) {
        report.add(c);
    }
    println!("{}", report.summary());
    i32::from(report.failed())
}
