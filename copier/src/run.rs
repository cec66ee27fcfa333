//! The live copier: reads the production interface and drives the mirror with what it
//! captures, sleeping in poll(2) between events.
//!
//! This room owns the live capture and its pacing; everything else (engine, sender, control
//! channel, lookups, status, drain) is the [`Driver`]'s. It must never hold TCP logic, nor
//! read the command line: it runs on validated settings ([`LiveSettings`],
//! [`CaptureSettings`]), whatever `cli` they came from.
//!
//! With `--workers N` (N > 1) it runs N capture threads, each with its own capture joined to
//! one kernel fan-out group (PACKET_FANOUT by symmetric flow hash: a connection's packets, both
//! directions, all reach one thread) and its own [`Driver`] (engines on its share of the pool,
//! its own raw socket and control connection), run by the same capture loop as a single
//! capture (`capture_loop`; a worker's differences are its slot at the coordinator). This
//! thread then only coordinates: it sums the workers' snapshots for the status line,
//! `--metrics` and the summary, and owns the one comparison report every worker's sessions
//! observe into. Workers never share a session, so
//! nothing on the packet path is locked; a worker publishes its snapshot a few times a second.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use anyhow::Result;
use common::clock::{Instant, MonotonicClock};

use crate::capture::LiveCapture;
use crate::driver::{Driver, Pump};
use crate::settings::{CaptureSettings, LiveSettings, Plan, CAPTURE_BLOCK_BYTES};
use crate::status::Snapshot;

/// Packets read from the capture before the loop looks at the control channel again.
const CAPTURE_BUDGET: usize = 512;

/// Says at start how much a starved copier's ring holds (see `cli::Args::capture_block_ms`).
fn log_ring(buffer: i32, block_ms: u16) {
    let blocks = usize::try_from(buffer).unwrap_or(0) / CAPTURE_BLOCK_BYTES;
    if block_ms == 0 {
        tracing::info!(
            buffer_mib = buffer >> 20,
            "capture ring: immediate mode (a wakeup per packet)"
        );
        return;
    }
    tracing::info!(
        blocks,
        block_kib = CAPTURE_BLOCK_BYTES >> 10,
        block_ms,
        holds_ms = blocks as u64 * u64::from(block_ms),
        "capture ring: {blocks} blocks retired after {block_ms} ms: while the copier waits for a \
         CPU it holds {} ms of traffic (more at rates that fill a block sooner)",
        blocks as u64 * u64::from(block_ms)
    );
}

/// The live copier with `live` (`cli::Args::validate`), capturing as `settings` say
/// (`cli::Args::capture_settings`).
pub fn run(live: &LiveSettings, settings: &CaptureSettings) -> Result<Snapshot> {
    if settings.workers > 1 {
        return workers::run(live, settings);
    }
    let (mirror, plan) = (&live.mirror, live.plan.clone());
    let clock = MonotonicClock::new();
    let (filter, buffer, block_ms) = (&settings.filter, settings.buffer_bytes, settings.block_ms);
    let mut capture =
        LiveCapture::open_live_bridged(&settings.interface, filter, buffer, block_ms)?;
    log_ring(buffer, block_ms);
    // Before the driver starts its control threads (they inherit it) and before the
    // capabilities go (raising needs CAP_SYS_NICE).
    raise_priority(settings);
    let on_demand = on_demand(settings, capture.as_raw_fd());
    let routes = plan
        .routes
        .iter()
        .map(|r| format!("port {} to {}", r.prod_port, r.target))
        .collect::<Vec<_>>()
        .join(", ");
    // Before the capabilities go (attaching needs CAP_BPF and CAP_PERFMON).
    let probe = attach_tls(settings, &plan);
    let mut mirror = mirror.clone();
    mirror.tls_plaintext = probe.is_some();
    let mut driver = Driver::start(&mirror, plan, clock.now())?;
    // The probe tells its streams' sockets in the kernel: /proc (and the capabilities to
    // read another user's) is wanted after the start only by a probe that cannot.
    let tls_needs_proc = probe.as_ref().is_some_and(|p| p.needs_proc());
    if let Some(p) = probe {
        driver.attach_tls(p, clock.now());
    }
    drop_privileges(settings, tls_needs_proc)?;
    tracing::info!(
        "mirroring {routes} on {} (intercept {}), filter: {filter}",
        settings.interface,
        mirror.first_intercept()
    );

    let driver = capture_loop(driver, &mut capture, &clock, on_demand, None)?;
    capture.refresh_kernel_stats();
    Ok(driver.finish(&capture.stats))
}

/// `--tls-sessions on`: the TLS plaintext probe on the process listening on the production
/// port, or one line saying why TLS sessions will not be mirrored.
fn attach_tls(settings: &CaptureSettings, plan: &Plan) -> Option<crate::tls::TlsProbe> {
    if !settings.tls_sessions {
        return None;
    }
    let mut ports: Vec<u16> = plan.routes.iter().map(|r| r.prod_port).collect();
    ports.dedup();
    let [port] = ports[..] else {
        tracing::warn!(
            "TLS sessions are not mirrored: --tls-sessions covers one production port, not {}",
            ports.len()
        );
        return None;
    };
    match crate::tls::TlsProbe::attach_with_ring(port, settings.tls_ring_bytes) {
        Ok(p) => {
            let t = p.target();
            tracing::info!(
                "TLS sessions on port {port} are mirrored from their plaintext: probe on pid {} \
                 ({}), ring {} KiB",
                t.pid,
                t.library.display(),
                settings.tls_ring_bytes >> 10
            );
            Some(p)
        }
        Err(e) => {
            tracing::warn!(
                "TLS sessions on port {port} are not mirrored (counted as not_mirrorable_tls): {e}"
            );
            None
        }
    }
}

/// The capture loop, the same for a copier of one capture and for each worker of
/// `--workers N`: read up to [`CAPTURE_BUDGET`] packets into `driver` (none once it is
/// stopping), let it pump, report, and sleep until the capture or the driver has work.
/// Returns the driver once its drain is done, for the caller to finish; a capture that fails
/// is the driver's `fail` (every session reset, the summary printed).
///
/// `slot`: a worker's place at the coordinator, which stops it with the others and sums its
/// figures (and has the status line, metrics and report). `None`: a copier of one capture,
/// whose driver has those outputs itself.
fn capture_loop(
    mut driver: Driver,
    capture: &mut LiveCapture,
    clock: &MonotonicClock,
    mut on_demand: Option<ops::sched::OnDemand>,
    mut slot: Option<&mut workers::Slot<'_>>,
) -> Result<Driver> {
    // When a drain last read packets: while they keep coming the ring wakes the loop within its
    // block timeout of the last block it handed over (a timer's wakeup in between finds the
    // ring empty, and says nothing of the flow).
    let mut packets_at: Option<Instant> = None;
    loop {
        let now = clock.now();
        // Capture timestamps are wall-clock, the engine's clock monotonic: mapped through
        // their offset now.
        let wall = common::clock::realtime_ns();
        if slot.as_ref().is_some_and(|s| s.aborted()) {
            driver.begin_drain(now);
        }
        // Once stopping, nothing new is captured; what is queued still goes out.
        if !driver.poll_stop(now) {
            // The probe first: see `Driver::drain_tls`.
            driver.drain_tls(now);
            let mut lag = Duration::ZERO;
            let mut seen = slot.as_deref_mut();
            let drained = capture.drain(CAPTURE_BUDGET, |at, pkt| {
                if let Some(s) = &mut seen {
                    s.note(pkt);
                }
                let t = capture_time(now, wall, at);
                lag = lag.max(now.saturating_since(t));
                driver.feed_at(now, t, pkt)
            });
            match drained {
                Ok(0) => {}
                Ok(_) => packets_at = Some(now),
                Err(e) => {
                    if let Some(s) = &slot {
                        s.publish(&driver, capture);
                    }
                    return Err(driver.fail(now, &capture.stats, e));
                }
            }
            if let Some(p) = &mut on_demand {
                p.observe(lag, std::time::Instant::now());
            }
        }
        guard_snapshot(&mut driver, capture);
        if driver.pump(now) == Pump::Done {
            break;
        }
        let mut wake_cap = None;
        match &mut slot {
            None => {
                if driver.status_due(now) {
                    capture.refresh_kernel_stats();
                    driver.print_status(now, &capture.stats);
                }
            }
            Some(s) => wake_cap = Some(s.publish_when_due(now, &driver, capture)),
        }
        let mut wake = driver.next_wake(clock.now());
        // While packets flow the loop runs at the ring's pace: what intercept relays and the
        // engine's timers wait for the next block instead of waking the loop themselves, no
        // later than the clients' own packets already wait in the ring (a block timeout, three
        // at most when the flow has just stopped). Every engine timer is coarse next to a block
        // (the shortest, the delayed ACK, is far below the test server's RTO, and now goes out
        // on the client's next command more often). Woken for every relay (a batch a
        // millisecond under load) and every delayed ACK, the copier spent a fifth of its CPU
        // switching in and out (docs/BENCHMARKS.md, issue 20). Once the capture runs dry, while
        // draining, and while a session waits on the test server (a greeting, a PREPARE_OK: see
        // `Driver::takes_feedback_at_once`), relays and timers wake the loop at once again;
        // relays always do for a copier that times the test server's replies (the report, the
        // metrics' latencies: `Driver::wait`).
        let paced = paced_sleep(
            capture.paced_by(),
            packets_at,
            clock.now(),
            driver.takes_feedback_at_once(),
        );
        if let Some(longest) = paced {
            wake = longest;
        }
        if let Some(cap) = wake_cap {
            wake = wake.min(cap);
        }
        // Not the TLS probe's ring: it is read at every turn (`drain_tls`), and every piece of
        // plaintext has captured packets that wake the loop within a block timeout. Waiting on
        // it (level-triggered) turned the loop once per record: 1.7 wakeups per mirrored query
        // against 0.04 without TLS, a third of the copier's CPU in the scheduler.
        match capture.bridge_fd() {
            Some(bridge) => driver.wait(&[capture.as_raw_fd(), bridge], wake, paced.is_none()),
            None => driver.wait(&[capture.as_raw_fd()], wake, paced.is_none()),
        }
    }
    Ok(driver)
}

/// The longest block timeout the loop paces itself by: three of them (30 ms) stay far below
/// the test server's shortest retransmission timeout (200 ms), which a delayed ACK must beat.
/// `--capture-block-ms` goes up to 100; its default is at most 10.
const PACE_BLOCK_MAX: Duration = Duration::from_millis(10);

/// Whether the loop's next sleep may leave what intercept relays and the engine's timers for
/// later, and then its longest. While packets flow the kernel hands a block over about every
/// block timeout (its retire timer is periodic), so the sleep ends by then anyway: the flow
/// counts as going on for two timeouts after a drain last read packets (a block can come a
/// little late, and a wakeup in between finds the ring empty), and the sleep is cut at three.
/// `None` (relays and timers wake the loop at once): immediate mode, a capture that read
/// nothing lately, and `at_once` (a drain, a session waiting on the test server: see
/// `Driver::takes_feedback_at_once`). A block timeout above [`PACE_BLOCK_MAX`] paces as that:
/// a timer may then be at most three of those late.
fn paced_sleep(
    block: Option<Duration>,
    packets_at: Option<Instant>,
    now: Instant,
    at_once: bool,
) -> Option<Duration> {
    let (block, at) = (block?.min(PACE_BLOCK_MAX), packets_at?);
    if at_once || now >= at + 2 * block {
        return None;
    }
    Some(at + 3 * block - now)
}

/// `--prod-dsn`'s start snapshot answers only while the capture has lost nothing (see
/// `prod_state::Snapshot`): the drops are read after each drain, before the driver asks about
/// the sessions it picked up. One `getsockopt` a loop, and only while the snapshot may answer.
fn guard_snapshot(driver: &mut Driver, capture: &mut LiveCapture) {
    if driver.guards_snapshot() {
        capture.refresh_kernel_stats();
        driver.capture_drops(capture.stats.kernel_dropped + capture.stats.if_dropped);
    }
}

/// `--capture-priority`: this thread runs the capture loop, and the threads started after it
/// (control connections, `--workers`) inherit its priority. Not raised: said once, and the
/// copier runs as started (a busy host may then starve the capture: kernel drops).
fn raise_priority(capture: &CaptureSettings) {
    ops::sched::raise_logged(capture.priority);
}

/// `--capture-priority auto`: the calling capture thread's priority, raised while it lags
/// or, by its watchdog, while it gets no CPU with packets waiting in `capture_fd`'s ring.
/// Drop it before the capture.
fn on_demand(capture: &CaptureSettings, capture_fd: RawFd) -> Option<ops::sched::OnDemand> {
    (capture.priority == ops::sched::Priority::Auto).then(|| {
        let mut p = ops::sched::OnDemand::new();
        if let Err(e) = p.watch(capture_fd) {
            tracing::warn!(
                "cannot start the capture's watchdog ({e}): a capture that gets no CPU is \
                 raised only once it runs again, up to a ring's worth late"
            );
        }
        p
    })
}

/// Once the capture, the raw socket and the metrics listener are open, the live copier needs no
/// capability at all: reconnecting to intercept, --prod-dsn, reports and SIGHUP reloads are
/// plain sockets and files. Dropped in every thread, with no_new_privs. The one exception:
/// `--capture-priority auto` where RLIMIT_NICE could not be raised keeps CAP_SYS_NICE, to
/// raise the capture when it falls behind. And with a TLS plaintext probe that tells its
/// streams' sockets from the server's `/proc/PID/fd` (`tls_needs_proc`, see
/// `TlsProbe::needs_proc`), CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, which reading another
/// process's fds needs (mariadbd is not dumpable, and may run as another user). This build's
/// probe tells them in the kernel, so it keeps neither: they served discovery at attach.
fn drop_privileges(capture: &CaptureSettings, tls_needs_proc: bool) -> Result<()> {
    let mut keep = Vec::new();
    if capture.priority == ops::sched::Priority::Auto && ops::sched::raise_needs_capability() {
        keep.push(ops::privs::CAP_SYS_NICE);
    }
    if tls_needs_proc {
        keep.extend([ops::privs::CAP_SYS_PTRACE, ops::privs::CAP_DAC_READ_SEARCH]);
    }
    let dropped = ops::privs::drop_all_but(&keep).map_err(|e| {
        anyhow::anyhow!(
            "cannot drop capabilities after opening the capture (refusing to run with more than \
             needed): {e}"
        )
    })?;
    tracing::info!("capabilities dropped: {}", dropped.describe());
    Ok(())
}

/// Capture timestamp `at` (wall clock, ns) on the engine's clock, given that the wall clock
/// read `wall` at `now`. Kept within a second of `now`: a wall-clock step must not turn into a
/// latency.
fn capture_time(now: Instant, wall: u64, at: u64) -> Instant {
    const LIMIT: u64 = 1_000_000_000;
    let n = now.as_nanos();
    let t = if at >= wall {
        n.saturating_add((at - wall).min(LIMIT))
    } else {
        n.saturating_sub((wall - at).min(LIMIT))
    };
    Instant::from_nanos(t)
}

mod workers {
    use std::collections::HashSet;
    use std::net::SocketAddrV4;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use anyhow::{anyhow, Result};
    use common::clock::{Instant, MonotonicClock};
    use common::wire::TcpPacket;

    use crate::capture::{fanout, CaptureStats, LiveCapture};
    use crate::driver::{Driver, Worker};
    use crate::outputs::Outputs;
    use crate::settings::{CaptureSettings, LiveSettings, MirrorSettings, Plan};
    use crate::status::Snapshot;

    /// How often a worker hands its counters to the coordinator.
    const PUBLISH: Duration = Duration::from_millis(250);
    /// The coordinator's tick (status line, metrics, report writes, stop checks).
    const TICK: Duration = Duration::from_millis(100);
    /// Frames captured before every member had joined the fan-out group, dropped (see
    /// [`LiveCapture::discard_backlog`]); bounded so a flood cannot keep start-up busy.
    const BACKLOG_LIMIT: usize = 1 << 20;
    /// Connections remembered per worker for the cross-worker check at the end.
    const FLOWS_REMEMBERED: usize = 1 << 16;

    /// What every worker runs with: how it captures, and how it mirrors.
    #[derive(Clone, Copy)]
    struct Flags<'a> {
        capture: &'a CaptureSettings,
        mirror: &'a MirrorSettings,
    }

    /// What one worker has counted so far.
    #[derive(Clone, Default)]
    struct Figures {
        snap: Snapshot,
        feedback_foreign: u64,
        done: bool,
    }

    /// Connections (both ends, ordered) whose SYN, FIN or RST a worker saw: with a symmetric
    /// fan-out no connection appears at two workers. Only control segments are looked at, so
    /// it costs nothing per data packet.
    #[derive(Default)]
    struct FlowsSeen(HashSet<(SocketAddrV4, SocketAddrV4)>);

    impl FlowsSeen {
        fn note(&mut self, pkt: &TcpPacket<'_>) {
            let f = pkt.flags;
            if !(f.syn() || f.fin() || f.rst()) || self.0.len() >= FLOWS_REMEMBERED {
                return;
            }
            let a = SocketAddrV4::new(pkt.src, pkt.src_port);
            let b = SocketAddrV4::new(pkt.dst, pkt.dst_port);
            self.0.insert(if a <= b { (a, b) } else { (b, a) });
        }
    }

    pub(super) fn run(live: &LiveSettings, settings: &CaptureSettings) -> Result<Snapshot> {
        let n = settings.workers;
        let (mirror, plan) = (&live.mirror, live.plan.clone());
        if settings.tls_sessions {
            tracing::warn!(
                "TLS sessions are not mirrored with --workers {n} yet (counted as \
                 not_mirrorable_tls): run one worker to mirror them"
            );
        }
        let clock = MonotonicClock::new();
        let filter = &settings.filter;
        let group = fanout::group_for_process(0);
        let mut captures = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let capture = LiveCapture::open_live(
                &settings.interface,
                filter,
                settings.buffer_bytes,
                settings.block_ms,
            )?;
            capture.join_fanout(group)?;
            captures.push(capture);
        }
        // Before the worker threads start: they inherit it.
        super::raise_priority(settings);
        let mut discarded = 0;
        for c in &mut captures {
            discarded += c.discard_backlog(BACKLOG_LIMIT)?;
        }
        let start = clock.now();
        // The outputs are the coordinator's: the workers' drivers have none (see `Worker`).
        let mut outputs = Outputs::start(mirror, &plan.routes, start)?;
        let feed = outputs.feed();
        // Each worker opens its raw socket in its own thread, after this point: the capability
        // drop of the single-worker path would have to wait for all of them (not done yet).
        tracing::warn!(
            "--workers {n}: capabilities are not dropped yet in multi-worker mode (they are with \
             --workers 1)"
        );
        tracing::info!(
            "{n} capture workers in fan-out group {group} on {} (intercept {}), filter: {filter} \
             ({discarded} frames captured before the group formed dropped)",
            settings.interface,
            mirror.first_intercept()
        );
        let figures: Vec<Mutex<Figures>> = (0..n).map(|_| Mutex::new(Figures::default())).collect();
        let abort = AtomicBool::new(false);
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = captures
                .into_iter()
                .enumerate()
                .map(|(i, capture)| {
                    let worker = Worker {
                        index: i as u32,
                        count: n,
                        report: feed.clone(),
                    };
                    let (plan, clock, figures, abort) = (plan.clone(), &clock, &figures[i], &abort);
                    std::thread::Builder::new()
                        .name(format!("capture-{i}"))
                        .spawn_scoped(scope, move || {
                            let r = run_worker(
                                Flags {
                                    capture: settings,
                                    mirror,
                                },
                                plan,
                                capture,
                                worker,
                                clock,
                                figures,
                                abort,
                            );
                            if r.is_err() {
                                // One worker down: stop the others (they drain as on SIGTERM).
                                abort.store(true, Ordering::SeqCst);
                            }
                            if let Ok(mut f) = figures.lock() {
                                f.done = true;
                            }
                            r
                        })
                        .inspect_err(|_| {
                            abort.store(true, Ordering::SeqCst);
                            if let Ok(mut f) = figures.lock() {
                                f.done = true;
                            }
                        })
                })
                .collect();
            // Coordinate until every worker is done.
            loop {
                let now = clock.now();
                let all = current(&figures);
                if all.iter().all(|f| f.done) {
                    break;
                }
                outputs.tick(now);
                if outputs.due(now) {
                    outputs.publish(now, sum(&all));
                }
                std::thread::sleep(TICK);
            }
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(anyhow!("a capture worker panicked"))),
                    Err(e) => Err(anyhow!("cannot start a capture thread: {e}")),
                })
                .collect::<Vec<_>>()
        });
        let now = clock.now();
        let mut finals = Vec::with_capacity(results.len());
        let mut flows: Vec<FlowsSeen> = Vec::with_capacity(results.len());
        let mut first_error = None;
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok((f, seen)) => {
                    finals.push(f);
                    flows.push(seen);
                }
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("capture worker {i}")));
                    if let Ok(f) = figures[i].lock() {
                        finals.push(f.clone());
                    }
                }
            }
        }
        let mut snap = sum(&finals);
        outputs.finish(now, &mut snap);
        for (i, f) in finals.iter().enumerate() {
            let e = &f.snap.engine;
            tracing::info!(
                "worker {i}: sessions opened={} picked_up={} captured={} (client {} prod {}) \
                 sent={} feedback={} feedback_foreign={} kernel_drops={}",
                e.sessions_opened,
                e.sessions_picked_up,
                f.snap.capture.frames,
                e.captured_client_to_prod,
                e.captured_prod_to_client,
                e.segments_sent,
                e.feedback_received,
                f.feedback_foreign,
                f.snap.capture.kernel_dropped + f.snap.capture.if_dropped,
            );
        }
        tracing::info!(
            "workers: {} connections seen by two workers (of {} seen)",
            shared_flows(&flows),
            flows.iter().map(|f| f.0.len()).sum::<usize>()
        );
        if let Some(e) = first_error {
            eprint!(
                "{}",
                crate::status::summary(&snap, now.saturating_since(start))
            );
            return Err(e);
        }
        Ok(snap)
    }

    /// Connections seen (SYN, FIN or RST) by more than one worker.
    fn shared_flows(flows: &[FlowsSeen]) -> usize {
        let mut count = 0;
        for (i, a) in flows.iter().enumerate() {
            count +=
                a.0.iter()
                    .filter(|k| flows[i + 1..].iter().any(|b| b.0.contains(k)))
                    .count();
        }
        count
    }

    fn current(figures: &[Mutex<Figures>]) -> Vec<Figures> {
        figures
            .iter()
            .map(|f| f.lock().map(|g| g.clone()).unwrap_or_default())
            .collect()
    }

    /// A worker's place at the coordinator, as its capture loop sees it (see
    /// [`super::capture_loop`]): the stop it shares with the other workers, the figures it
    /// hands over every [`PUBLISH`], and the connections it saw.
    pub(super) struct Slot<'a> {
        figures: &'a Mutex<Figures>,
        abort: &'a AtomicBool,
        seen: FlowsSeen,
        next_publish: Instant,
    }

    impl Slot<'_> {
        /// Whether another worker failed: this one then drains as on SIGTERM.
        pub(super) fn aborted(&self) -> bool {
            self.abort.load(Ordering::Relaxed)
        }

        /// A captured packet, for the cross-worker check at the end.
        pub(super) fn note(&mut self, pkt: &TcpPacket<'_>) {
            self.seen.note(pkt);
        }

        /// Hands the driver's counters to the coordinator now.
        pub(super) fn publish(&self, driver: &Driver, capture: &mut LiveCapture) {
            publish(self.figures, driver, capture);
        }

        /// Hands them over if [`PUBLISH`] has passed since the last time; the longest the
        /// loop may then sleep, so the next hand-over is on time.
        pub(super) fn publish_when_due(
            &mut self,
            now: Instant,
            driver: &Driver,
            capture: &mut LiveCapture,
        ) -> Duration {
            if now >= self.next_publish {
                self.publish(driver, capture);
                self.next_publish = now + PUBLISH;
            }
            PUBLISH
        }
    }

    /// One worker: its driver on its share of the pool, run by the capture loop with its
    /// [`Slot`], its stop also coming from `abort` and its counters handed to the coordinator
    /// every [`PUBLISH`].
    fn run_worker(
        flags: Flags<'_>,
        plan: Plan,
        mut capture: LiveCapture,
        worker: Worker,
        clock: &MonotonicClock,
        figures: &Mutex<Figures>,
        abort: &AtomicBool,
    ) -> Result<(Figures, FlowsSeen)> {
        let driver = Driver::start_worker(flags.mirror, plan, clock.now(), worker)?;
        let mut slot = Slot {
            figures,
            abort,
            seen: FlowsSeen::default(),
            next_publish: clock.now(),
        };
        // Each worker thread raises itself: its priority is its own.
        let on_demand = super::on_demand(flags.capture, capture.as_raw_fd());
        let driver = super::capture_loop(driver, &mut capture, clock, on_demand, Some(&mut slot))?;
        capture.refresh_kernel_stats();
        let foreign = driver.feedback_foreign();
        let snap = driver.finish(&capture.stats);
        let f = Figures {
            snap,
            feedback_foreign: foreign,
            done: true,
        };
        Ok((f, slot.seen))
    }

    fn publish(figures: &Mutex<Figures>, driver: &Driver, capture: &mut LiveCapture) {
        capture.refresh_kernel_stats();
        let snap = driver.snapshot(&capture.stats);
        if let Ok(mut f) = figures.lock() {
            f.snap = snap;
            f.feedback_foreign = driver.feedback_foreign();
        }
    }

    /// The workers' counters as one copier's.
    fn sum(all: &[Figures]) -> Snapshot {
        let mut total = match all.first() {
            Some(f) => f.snap.clone(),
            None => return Snapshot::default(),
        };
        for f in &all[1..] {
            let s = &f.snap;
            total.engine.merge(&s.engine);
            add_capture(&mut total.capture, &s.capture);
            let (t, o) = (&mut total.send, &s.send);
            t.packets += o.packets;
            t.bytes += o.bytes;
            t.would_block += o.would_block;
            t.errors += o.errors;
            crate::driver::add_client_stats(&mut total.control, &s.control);
            // Each worker looks up its own sessions: its production queries count too (the
            // summary's `own statements`).
            if let (Some(t), Some(o)) = (&mut total.lookup, &s.lookup) {
                t.merge(o);
            }
        }
        total
    }

    fn add_capture(t: &mut CaptureStats, o: &CaptureStats) {
        t.frames += o.frames;
        t.parsed += o.parsed;
        t.truncated += o.truncated;
        t.not_ipv4 += o.not_ipv4;
        t.not_tcp += o.not_tcp;
        t.bad_header += o.bad_header;
        t.fragments += o.fragments;
        t.snapped += o.snapped;
        t.kernel_dropped += o.kernel_dropped;
        t.if_dropped += o.if_dropped;
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use common::seq::SeqNumber;
        use common::wire::{TcpFlags, TcpOptions};

        fn pkt(src: &str, dst: &str, flags: u8) -> TcpPacket<'static> {
            let (src, dst): (SocketAddrV4, SocketAddrV4) =
                (src.parse().unwrap(), dst.parse().unwrap());
            TcpPacket {
                src: *src.ip(),
                dst: *dst.ip(),
                src_port: src.port(),
                dst_port: dst.port(),
                seq: SeqNumber(1),
                ack: SeqNumber(0),
                flags: TcpFlags(flags),
                window: 1000,
                options: TcpOptions::default(),
                ip_id: 0,
                ttl: 64,
                payload: &[],
                payload_len: 0,
            }
        }

        #[test]
        fn a_connection_seen_by_two_workers_is_counted_once() {
            let (c, p, o) = ("198.18.0.10:40000", "198.18.0.2:3306", "198.18.0.11:40001");
            let (mut a, mut b) = (FlowsSeen::default(), FlowsSeen::default());
            a.note(&pkt(c, p, TcpFlags::SYN));
            a.note(&pkt(o, p, TcpFlags::SYN));
            a.note(&pkt(o, p, TcpFlags::ACK)); // data segments are not looked at
            b.note(&pkt(p, c, TcpFlags::SYN | TcpFlags::ACK));
            b.note(&pkt(p, o, TcpFlags::ACK));
            assert_eq!(a.0.len(), 2);
            assert_eq!(b.0.len(), 1);
            assert_eq!(shared_flows(&[a, b]), 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: Duration = Duration::from_millis(6);

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn the_loop_runs_at_the_rings_pace_only_while_packets_flow() {
        // A block read 2 ms ago: the next comes within about 4 ms, a late one within 16.
        assert_eq!(
            paced_sleep(Some(BLOCK), Some(at(100)), at(102), false),
            Some(Duration::from_millis(16))
        );
        assert_eq!(
            paced_sleep(Some(BLOCK), Some(at(100)), at(111), false),
            Some(Duration::from_millis(7))
        );
        // Nothing read for two block timeouts: the flow has stopped.
        assert_eq!(
            paced_sleep(Some(BLOCK), Some(at(100)), at(112), false),
            None
        );
        // Nothing read yet, immediate mode (no block to wait for), a drain or a session
        // waiting on the test server.
        assert_eq!(paced_sleep(Some(BLOCK), None, at(102), false), None);
        assert_eq!(paced_sleep(None, Some(at(100)), at(102), false), None);
        assert_eq!(paced_sleep(Some(BLOCK), Some(at(100)), at(102), true), None);
        // A long block timeout paces as 10 ms: timers are never more than 30 ms late.
        let long = Some(Duration::from_millis(100));
        assert_eq!(
            paced_sleep(long, Some(at(100)), at(110), false),
            Some(Duration::from_millis(20))
        );
        assert_eq!(paced_sleep(long, Some(at(100)), at(120), false), None);
    }
}
