//! The mirror driver: everything between a source of captured packets and the wire, so a live
//! capture (`run`) and a capture file (`replay`) drive sessions the same way.
//!
//! # What this room is for
//!
//! [`Driver`] owns the session engines (a [`Fleet`]: one per `--map` route and `--multiply`
//! copy), the raw sender, the control channel to intercept (one per `--intercept` when
//! several `--target` each have theirs; sessions are claimed at their target's intercept), and
//! the eventfd their threads wake us with; the optional `--prod-dsn` state lookup, the
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
//!     d.wait(&[source_fd], d.next_wake(clock.now()), true); // or sleep until the next packet
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
//!   when `extra_fds` (e.g. the capture) become readable, or intercept relays something (unless
//!   the caller, whose capture is busy, takes relays at its next block instead).
//! * `fail(now, capture_stats, error)`: the source broke (e.g. the interface went away): reset
//!   every session so the test server frees it, print the summary, return the error.

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use common::clock::Instant;
use common::control::{
    Hello, MysqlEvent, FEATURE_PAYLOAD_HASHES, FEATURE_PROMPT_ON_DEMAND, FEATURE_PROMPT_REPLIES,
    FEATURE_QUIET_IDLE, FEATURE_ROW_RUNS,
};
use common::wire::TcpPacket;

use crate::builders::build_fleet_for;
use crate::capture::CaptureStats;
use crate::control_client::{ClientConfig, ControlClient, ControlHandle, Relayed, RelayedReceiver};
use crate::engine::{CloseReason, EngineEvent, Fleet, TestEvent};
use crate::mysql::NotRecovered;
use crate::outputs::Outputs;
use crate::prod_state::{OwnAddress, ProdDsn, StateLookup};
use crate::report::reporting::ReportFeed;
use crate::report::sink::ObservationSink;
use crate::send::RawSender;
use crate::settings::{MirrorSettings, Plan};
use crate::signals;
use crate::status::Snapshot;
use crate::waker::{wait_readable, Waker};

/// Longest sleep with nothing due. Nothing needs it: stop signals and SIGUSR1 wake the loop
/// through eventfds (`signals`), intercept's messages through the waker, every timer is a
/// deadline. Issue 20: an idle copier wakes for its status line and nothing else (this was
/// 5 s, for SIGUSR1, and woke an idle copier 12 times a minute).
const MAX_SLEEP: Duration = Duration::from_secs(3600);
/// Longest sleep when a signal could not wake the loop through an eventfd.
const NO_SIGNAL_FD_SLEEP: Duration = Duration::from_millis(500);
/// Sleep while draining: queued data is acknowledged within a test-server round trip.
const DRAIN_SLEEP: Duration = Duration::from_millis(10);

/// One capture worker of `--workers N` (see `run`): its driver mirrors the connections the
/// kernel's fan-out hands this worker, with its own engines (its own share of
/// `--client-ip-pool`) and its own control connection; the status line, `--metrics` and the
/// report belong to the coordinator, which sums the workers' snapshots.
#[derive(Clone, Debug)]
pub struct Worker {
    pub index: u32,
    pub count: u32,
    /// The coordinator's report feed: every worker's observations go into one report.
    pub report: Option<ReportFeed>,
}

/// What [`Driver::pump`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pump {
    /// Keep going.
    Running,
    /// The drain is over and every session was reset: leave the loop and call `finish`.
    Done,
}

/// How long no session must have waited on the test server before intercept is told it may
/// gather relays again (see [`Driver::tell_prompt`]).
const PROMPT_CALM: Duration = Duration::from_secs(1);

/// See the module documentation.
pub struct Driver {
    fleet: Fleet,
    sample_percent: Option<f64>,
    sender: RawSender,
    /// One control connection per `--intercept` (several only with several `--target`), and
    /// what each has relayed.
    links: Vec<(ControlHandle, RelayedReceiver)>,
    /// Per link: the floor of its frames' transit.
    transit: Vec<crate::transit::TransitFloor>,
    /// A relayed frame's MySQL events by session (client, then place): reused, so sorting
    /// them allocates nothing per frame.
    relay_order: Vec<u64>,
    /// Which link claims the sessions of each target (`--target` paired with `--intercept`).
    link_of_target: Vec<(SocketAddrV4, usize)>,
    waker: Waker,
    /// The test server's replies are timed (`--report`, `--metrics`): what intercept relays
    /// is taken as it comes (see [`Driver::wait`]).
    prompt_relays: bool,
    /// What intercept was last told of the sessions (Prompt): some wait on the test server.
    prompting: bool,
    /// Since when no session has waited, while `prompting`: off is said after
    /// [`PROMPT_CALM`] of it.
    calm_since: Option<Instant>,
    lookup: Option<StateLookup>,
    own: Option<OwnAddress>,
    /// The status line, `--metrics` and the report (none for a worker of several).
    outputs: Outputs,
    buf: Vec<u8>,
    drain_secs: u64,
    stopping_since: Option<Instant>,
    not_mirrorable: OncePerClient,
    /// Packets of this host to itself or of `--prod-dsn`'s own connection, never mirrored.
    own_skipped: u64,
    mysql_events: u64,
    /// Where the engines' observations go after every batch: this driver's report's queue,
    /// or the coordinator's.
    observations: Option<Arc<ObservationSink>>,
    /// The latest time `pump` was given (the final report's time).
    last_now: Instant,
    /// A moment on both the standard clock and the engine's (the callers drive the engine with
    /// a `MonotonicClock`): maps when intercept's frames were read onto the engine's clock.
    anchor: (std::time::Instant, Instant),
    /// The TLS plaintext probe (`--tls-sessions`), when attached, and when.
    tls: Option<crate::tls::TlsProbe>,
    tls_since: Instant,
    /// Plaintext bytes of IPv6 connections: the engine mirrors IPv4 only.
    tls_ipv6_bytes: u64,
}

/// How long the TLS probe watches the host's syscalls for the sockets of TLS connections open
/// before it (`TlsProbe::learning_fds`): that costs every process of the host the syscall slow
/// path (about 9% of production's QPS in the lab), so it ends after this. A pooled connection
/// that made no TLS call by then is not mirrored (its plaintext counted as unresolved).
const TLS_JOIN_WINDOW: Duration = Duration::from_secs(60);

impl Driver {
    /// Opens the raw sender, starts the control client and waits up to 5 s for intercept, then
    /// logs in on production if `plan.prod_dsn` is set. `now` starts the status interval.
    pub fn start(args: &MirrorSettings, plan: Plan, now: Instant) -> Result<Self> {
        Self::start_with(args, plan, now, None)
    }

    /// [`Driver::start`] for capture worker `worker` of several: no status line, metrics or
    /// report of its own (see [`Worker`]), its share of the pool, `#INDEX` in its Hello name.
    pub fn start_worker(
        args: &MirrorSettings,
        plan: Plan,
        now: Instant,
        worker: Worker,
    ) -> Result<Self> {
        Self::start_with(args, plan, now, Some(worker))
    }

    fn start_with(
        args: &MirrorSettings,
        plan: Plan,
        now: Instant,
        worker: Option<Worker>,
    ) -> Result<Self> {
        let anchor = (std::time::Instant::now(), now);
        let recovery_wait = plan.prod_dsn.is_some().then_some(plan.prod_dsn_wait);
        // Bound before anything else starts: a taken port is a start-up mistake to fix now.
        let mut outputs = match worker {
            Some(_) => Outputs::none(now),
            None => Outputs::start(args, &plan.routes, now)?,
        };
        let feed = match &worker {
            Some(w) => w.report.clone(),
            None => outputs.feed(),
        };
        let slot = worker.as_ref().map_or((0, 1), |w| (w.index, w.count));
        let hooks = feed.as_ref().map(|f| f.hooks);
        let fleet = build_fleet_for(args, &plan, recovery_wait, hooks, slot)?;
        let observations = feed.map(|f| f.sink);
        let sender = RawSender::open()?;
        let waker = Waker::new().context("cannot create an eventfd")?;
        let name = match &worker {
            // intercept tells copiers apart by connection; the suffix is for its log.
            Some(w) => format!("copier@{}#{}", ops::host::hostname(), w.index),
            None => format!("copier@{}", ops::host::hostname()),
        };
        let secret = args.secret()?;
        let mut links = Vec::with_capacity(args.intercept.len());
        for &addr in &args.intercept {
            let wake = waker.clone();
            // Rows folded into runs: the copier reads nothing of a row but its first byte.
            // While nothing is claimed, no heartbeat: TCP keepalive instead (no wakeups).
            // Relays gathered by intercept, but for 1 ms only while a session waits (Prompt).
            let mut hello = Hello::new(&name)
                .with_features(FEATURE_ROW_RUNS | FEATURE_QUIET_IDLE | FEATURE_PROMPT_ON_DEMAND);
            if args.compare_results {
                // intercept hashes the test server's payloads only for copiers that ask.
                hello = hello.with_features(FEATURE_PAYLOAD_HASHES);
            }
            if args.times_replies() {
                // The report times the test server's replies: each is wanted as it comes,
                // not gathered with others for a cheaper write.
                hello = hello.with_features(FEATURE_PROMPT_REPLIES);
            }
            let config = ClientConfig::new(addr, hello, secret.clone());
            let link = ControlClient::spawn_with(config, move || wake.wake())
                .with_context(|| format!("cannot start the control channel to intercept {addr}"))?;
            links.push(link);
        }
        for ((control, _), &addr) in links.iter().zip(&args.intercept) {
            wait_for_intercept(control, addr)?;
            if let (true, Some(w)) = (args.compare_results, control.welcome()) {
                if w.features & FEATURE_PAYLOAD_HASHES == 0 {
                    tracing::warn!(
                        "--compare-results: intercept {addr} does not hash the test server's \
                         replies (is it in --protocol mysql mode?): only row counts and errors \
                         are compared"
                    );
                    outputs.compare_results_off();
                }
            }
        }
        let link_of_target = plan
            .routes
            .iter()
            .map(|r| (r.target, args.intercept_index(r.target)))
            .collect();
        let lookup = start_lookup(plan.prod_dsn, &waker)?;
        let own = lookup.as_ref().map(|l| l.own_address().clone());
        let buf = vec![0u8; fleet.transmit_buffer_len()];
        let mut driver = Self {
            fleet,
            sample_percent: args.sample.map(|s| s.percent()),
            sender,
            transit: vec![Default::default(); links.len()],
            relay_order: Vec::new(),
            links,
            link_of_target,
            waker,
            prompt_relays: args.times_replies(),
            prompting: false,
            calm_since: None,
            lookup,
            own,
            outputs,
            buf,
            drain_secs: args.drain_secs,
            stopping_since: None,
            not_mirrorable: OncePerClient::default(),
            own_skipped: 0,
            mysql_events: 0,
            observations,
            last_now: now,
            anchor,
            tls: None,
            tls_since: now,
            tls_ipv6_bytes: 0,
        };
        // A scrape before the first packet sees zeros, not an empty page.
        let snap = driver.snapshot(&CaptureStats::default());
        driver.outputs.publish_metrics(now, &snap);
        Ok(driver)
    }

    /// One captured packet and when the kernel captured it (on the same clock as `now`, at or
    /// before it): production's latencies in the report are measured between capture times,
    /// not between the times packets were processed (which bunch up when a batch is drained).
    pub fn feed_at(&mut self, now: Instant, captured: Instant, pkt: &TcpPacket<'_>) {
        if self.skip_own(pkt) {
            return;
        }
        self.fleet.on_captured_at(now, captured, pkt);
    }

    /// One captured packet (either direction). Nothing is sent until [`Driver::pump`].
    pub fn feed(&mut self, now: Instant, pkt: &TcpPacket<'_>) {
        if self.skip_own(pkt) {
            return;
        }
        self.fleet.on_captured(now, pkt);
    }

    fn skip_own(&mut self, pkt: &TcpPacket<'_>) -> bool {
        // Never mirror ourselves: a connection from this host to itself (with `--interface
        // any`, our --prod-dsn connection is on `lo`, source and destination the same
        // address), nor --prod-dsn's connection at all.
        let (src, dst) = (
            SocketAddrV4::new(pkt.src, pkt.src_port),
            SocketAddrV4::new(pkt.dst, pkt.dst_port),
        );
        if pkt.src == pkt.dst || self.own.as_ref().is_some_and(|o| o.matches(src, dst)) {
            self.own_skipped += 1;
            return true;
        }
        false
    }

    /// Checks for SIGINT/SIGTERM and starts draining on the first; true while draining. A
    /// draining caller stops feeding packets (nothing new is mirrored; what is queued still
    /// goes out) and keeps pumping until [`Pump::Done`].
    pub fn poll_stop(&mut self, now: Instant) -> bool {
        if self.stopping_since.is_none() && signals::stop_requested() {
            tracing::info!(
                "stop requested: draining queued data and closing sessions whose client \
                 closed, for up to {} s",
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

    /// Whether the loop must take what intercept relays, and run the engine's timers, as soon
    /// as they come, rather than at its capture's next block: while draining (it waits on
    /// acknowledgements, not on the clients), and while some session cannot go on until the
    /// test server says something ([`Fleet::waits_on_test`]: a SYN-ACK, the greeting or
    /// PREPARE_OK its held commands wait for). A pool that prepares every
    /// statement waits so once per execute: taking its PREPARE_OK a block later made the test
    /// server fall a second behind the load (issue 20's first pacing, docs/BENCHMARKS.md).
    pub fn takes_feedback_at_once(&self) -> bool {
        self.is_draining() || self.fleet.waits_on_test()
    }

    /// Tells intercept (Prompt) when some session starts waiting on the test server, so it
    /// relays within a millisecond, and when none has for [`PROMPT_CALM`], so it gathers again: a pool
    /// that prepares every statement waits once per execute, and saying off and on around each
    /// would cost more than the gathering saves. Every link is told: a session's is not known
    /// here, and a wait is short.
    fn tell_prompt(&mut self, now: Instant) {
        if self.fleet.waits_on_test() {
            self.calm_since = None;
            if !self.prompting {
                self.prompting = true;
                self.links.iter().for_each(|(c, _)| c.prompt(true));
            }
        } else if self.prompting {
            let since = *self.calm_since.get_or_insert(now);
            if now.saturating_since(since) >= PROMPT_CALM {
                self.prompting = false;
                self.calm_since = None;
                self.links.iter().for_each(|(c, _)| c.prompt(false));
            }
        }
    }

    /// Everything but reading packets: what intercept relayed, `--prod-dsn` answers, timers,
    /// transmission, session events (claims, releases, lookups) and drain progress.
    pub fn pump(&mut self, now: Instant) -> Pump {
        self.waker.reset();
        self.last_now = now;
        // What the capture just decided goes out before the relayed batch is worked through:
        // a large batch would hold the commands back, and the report would count that wait as
        // the test server's latency.
        self.transmit(now);
        for k in 0..self.links.len() {
            self.take_relayed(now, k);
        }
        if let Some(lookup) = &self.lookup {
            while let Some(mut answer) = lookup.try_answer() {
                if let Some(state) = &mut answer.state {
                    let on_engine = |(a, b)| (self.engine_time(a), self.engine_time(b));
                    state.variables_at = answer.variables_read.first.map(on_engine);
                    let again = answer.variables_read.again.map(on_engine);
                    if let Some(g) = &mut state.variables_again {
                        g.1 = again;
                    }
                }
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
        self.tell_prompt(now);
        self.outputs.tick(now);
        if let Some(since) = self.stopping_since {
            // Delivered, and every session whose client closed closed on test too: resetting
            // one that is still closing would cut the test server's backlog short (a RST
            // while it writes a result: 1160 there only), or count a finished session a loss.
            let drained = self.fleet.queued_bytes() == 0 && self.fleet.sessions_closing() == 0;
            if drained || now.saturating_since(since) >= Duration::from_secs(self.drain_secs) {
                self.reset_all(now);
                return Pump::Done;
            }
        }
        Pump::Running
    }

    /// What link `k`'s intercept relayed since the last call: read off its socket now.
    fn take_relayed(&mut self, now: Instant, k: usize) {
        self.links[k].1.begin_turn();
        while let Some(relayed) = self.links[k].1.next_relayed() {
            match relayed {
                Relayed::Feedback(batch) => {
                    for fb in &batch {
                        self.fleet.on_feedback(now, fb);
                    }
                }
                Relayed::Mysql(events, received, sent_at_us, recv_us) => {
                    self.mysql_events += events.len() as u64;
                    // Read during this turn, after `now`: no event is dated after the turn
                    // that takes it (a command sent in it is dated `now`).
                    let received = self.engine_time(received).min(now);
                    // Each packet is dated back from the frame's arrival by how long it
                    // waited at intercept: from its capture (the kernel's timestamp, up to a
                    // capture block before intercept saw it) to the frame's encoding, both
                    // on intercept's clock; and by how much longer than the quickest recent
                    // frame this one took to reach us. Only the transit's floor is left in.
                    let queued = self.transit[k].excess(received, recv_us, sent_at_us);
                    let dated = |ev: &MysqlEvent| {
                        let back = queued
                            + framed_at_us(ev)
                                .map_or(Duration::ZERO, |t| intercept_wait(sent_at_us, t));
                        Instant::from_nanos(
                            received
                                .as_nanos()
                                .saturating_sub(u64::try_from(back.as_nanos()).unwrap_or(0)),
                        )
                    };
                    // Each session's events of the frame go to the engine as one run, in
                    // their order, to be settled once: sessions are independent, and a
                    // frame holds the replies of a gathering period, several per session.
                    // Sorted as one word each, client above and place below (sorting pairs
                    // took 1.6-3.7 % of the copier's user time in issue 20's profiles), a
                    // chunk of 2^16 events at a time so the place fits: a frame of 1 MiB
                    // holds more only if its events are nearly all framing losses.
                    for (c, chunk) in events.chunks(1 << PLACE_BITS).enumerate() {
                        let base = c << PLACE_BITS;
                        let order = &mut self.relay_order;
                        order.clear();
                        order.extend(
                            chunk
                                .iter()
                                .enumerate()
                                .map(|(i, ev)| addr_key(ev.client()) << PLACE_BITS | i as u64),
                        );
                        order.sort_unstable();
                        let mut rest = &order[..];
                        while let Some(&first) = rest.first() {
                            let key = first >> PLACE_BITS;
                            let n = rest.iter().take_while(|&&k| k >> PLACE_BITS == key).count();
                            let (run, tail) = rest.split_at(n);
                            rest = tail;
                            let place = |k: u64| base + (k & PLACE_MASK) as usize;
                            let Some(client) = events.get(place(first)).map(MysqlEvent::client)
                            else {
                                continue;
                            };
                            let run = run.iter().filter_map(|&k| events.get(place(k)));
                            let run = run.map(|ev| (dated(ev), TestEvent::Mysql(ev)));
                            self.fleet.on_test_events_at(now, client, run);
                        }
                    }
                }
            }
        }
    }

    /// A standard-clock instant on the engine's clock.
    fn engine_time(&self, t: std::time::Instant) -> Instant {
        let (std0, eng0) = self.anchor;
        let since = t.saturating_duration_since(std0);
        eng0 + since
    }

    /// How long the caller may sleep before the driver has work.
    pub fn next_wake(&self, now: Instant) -> Duration {
        let mut sleep = MAX_SLEEP;
        if signals::stop_fd().is_none()
            || (self.outputs.reports() && signals::report_fd().is_none())
        {
            // No eventfd to wake on (or signals not installed: tests, replay): look for the
            // signals' flags on a timer.
            sleep = NO_SIGNAL_FD_SLEEP;
        }
        if let Some(d) = self.fleet.next_deadline() {
            sleep = sleep.min(d.saturating_since(now));
        }
        if let Some(d) = self.outputs.next_due() {
            sleep = sleep.min(d.saturating_since(now));
        }
        // A silent control connection is found dead by reading it.
        for d in self.links.iter().filter_map(|(_, rx)| rx.deadline()) {
            sleep = sleep.min(self.engine_time(d).saturating_since(now));
        }
        if self.stopping_since.is_some() {
            sleep = sleep.min(DRAIN_SLEEP);
        }
        sleep
    }

    /// Sleeps until intercept relays something (or a `--prod-dsn` lookup answers), one of
    /// `extra_fds` is readable, a signal arrives, or `timeout` passes. Without
    /// `on_relayed` what intercept relays does not end the sleep: the caller knows another
    /// wakeup is near (a busy capture's next block) and takes it then. A copier that times
    /// the test server's replies takes them as they come all the same: the ACKs they call
    /// for pace a reply longer than the test server's congestion window, whose time the
    /// report shows, as intercept relays them at once for it (`FEATURE_PROMPT_REPLIES`).
    pub fn wait(&self, extra_fds: &[RawFd], timeout: Duration, on_relayed: bool) {
        let mut fds = Vec::with_capacity(extra_fds.len() + self.links.len() + 3);
        fds.extend_from_slice(extra_fds);
        if on_relayed || self.prompt_relays {
            // The waker: a connection handed over, a lookup answered.
            fds.push(self.waker.as_raw_fd());
            fds.extend(self.links.iter().filter_map(|(_, rx)| rx.fd()));
        }
        // Until the stop is seen: it stays readable after.
        if let (None, Some(fd)) = (self.stopping_since, signals::stop_fd()) {
            fds.push(fd);
        }
        // Only the driver that writes the report empties it (`pump`).
        if let (true, Some(fd)) = (self.outputs.reports(), signals::report_fd()) {
            fds.push(fd);
        }
        wait_readable(&fds, timeout);
    }

    /// Whether the status line or the `--metrics` exposition is due: the callers refresh
    /// the capture's kernel counters and call [`Driver::print_status`], which does whichever
    /// is due.
    /// Whether `--prod-dsn`'s start snapshot may still answer: the capture's drops must then be
    /// given ([`Driver::capture_drops`]) before each [`Driver::pump`].
    pub fn guards_snapshot(&self) -> bool {
        self.lookup
            .as_ref()
            .is_some_and(StateLookup::snapshot_may_answer)
    }

    /// The capture's drops so far (kernel and interface). Any ends the start snapshot: a
    /// dropped packet may have been a command of a connection not seen yet.
    pub fn capture_drops(&mut self, drops: u64) {
        if let (true, Some(lookup)) = (drops > 0, &self.lookup) {
            if lookup.snapshot_may_answer() {
                lookup.forget_snapshot();
                tracing::info!(
                    "--prod-dsn: the capture dropped {drops} packets; connections picked up from \
                     now on are looked up on production when seen, not taken from the start \
                     snapshot"
                );
            }
        }
    }

    pub fn status_due(&self, now: Instant) -> bool {
        self.outputs.due(now)
    }

    /// Prints the status line and publishes the metrics, each if due (call when
    /// [`Driver::status_due`]).
    pub fn print_status(&mut self, now: Instant, capture: &CaptureStats) {
        let snap = self.snapshot(capture);
        self.outputs.publish(now, snap);
    }

    /// The `--metrics` responder's address, when serving.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.outputs.metrics_addr()
    }

    /// All counters now.
    pub fn snapshot(&self, capture: &CaptureStats) -> Snapshot {
        Snapshot {
            engine: self.fleet.stats(),
            capture: *capture,
            send: self.sender.stats,
            control: self.control_stats(),
            transform_names: self.fleet.transform_counter_names(),
            lookup: self.lookup.as_ref().map(StateLookup::stats),
            copies: self.fleet.copies(),
            sample_percent: self.sample_percent,
            report: None,
            tls_probe: self.tls.as_ref().map(|t| crate::status::TlsProbeFigures {
                ipv6_bytes: self.tls_ipv6_bytes,
                ..tls_figures(&t.stats())
            }),
        }
    }

    /// From now on TLS sessions' plaintext comes from `probe` (read by [`Driver::drain_tls`]).
    pub fn attach_tls(&mut self, probe: crate::tls::TlsProbe, now: Instant) {
        self.tls = Some(probe);
        self.tls_since = now;
    }

    /// Hands the plaintext waiting in the probe's ring to the sessions. Called before each
    /// capture batch: plaintext production read before a packet was captured is then in the
    /// sessions before that packet (production's FIN ends a TLS session's client stream).
    pub fn drain_tls(&mut self, now: Instant) {
        let Some(probe) = self.tls.as_mut() else {
            return;
        };
        if probe.learning_fds() && now.saturating_since(self.tls_since) >= TLS_JOIN_WINDOW {
            probe.stop_learning_fds();
            tracing::info!(
                "TLS: stopped watching for connections open before the copier ({} s after \
                 start); one that makes its first TLS call from now on is not mirrored",
                TLS_JOIN_WINDOW.as_secs()
            );
        }
        let fleet = &mut self.fleet;
        let ipv6 = &mut self.tls_ipv6_bytes;
        probe.drain(&mut |c: crate::tls::TlsChunk<'_>| {
            let (SocketAddr::V4(client), SocketAddr::V4(server)) = (c.client, c.server) else {
                // The engine mirrors IPv4 only: counted, as IPv6 frames are by the capture.
                *ipv6 += c.data.len() as u64;
                return;
            };
            let p = crate::engine::Plaintext {
                client,
                server,
                from_client: matches!(c.dir, crate::tls::PlainDir::FromClient),
                offset: c.offset,
                data: c.data,
            };
            fleet.on_plaintext(now, &p);
        });
    }

    /// Relayed feedback for another worker's addresses (`--workers`; intercept broadcasts
    /// what nobody has claimed yet, so a few are expected at connection starts).
    pub fn feedback_foreign(&self) -> u64 {
        self.fleet.feedback_foreign()
    }

    /// The comparison report as of `now` (`--report` or `--metrics` in MySQL mode).
    pub fn report(&mut self, now: Instant) -> Option<crate::report::Report> {
        self.outputs.report(now)
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
        let mut snap = self.snapshot(capture);
        // Sessions were just reset: what they still awaited is in the report's queue now.
        self.outputs.fail(now, &mut snap);
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
        let now = self.last_now;
        let mut snap = self.snapshot(capture);
        self.outputs.finish(now, &mut snap);
        tracing::debug!(
            mysql_events = self.mysql_events,
            own_skipped = self.own_skipped,
            "MySQL packet summaries received; own packets skipped"
        );
        if self.fleet.feedback_foreign() > 0 {
            // Expected in small numbers: intercept broadcasts replies nobody has claimed yet
            // (a SYN-ACK racing its Claim) to every copier connection.
            tracing::info!(
                "feedback_foreign={}: relayed feedback for addresses outside this copier's \
                 --client-ip-pool share (another copier's or worker's), dropped",
                self.fleet.feedback_foreign()
            );
        }
        self.close();
        snap
    }

    fn close(self) {
        drop(self.lookup);
        for (control, _) in self.links {
            control.shutdown();
        }
    }

    fn reset_all(&mut self, now: Instant) {
        self.fleet.shutdown(now);
        self.transmit(now);
        // What the reset sessions still awaited leaves as they end: the final report has it.
        self.collect_observations();
    }

    fn transmit(&mut self, now: Instant) {
        while let Some((n, target)) = self.fleet.poll_transmit(now, &mut self.buf) {
            self.sender.queue(&self.buf[..n], target);
        }
        // One sendmmsg per cycle (per 64 packets): nothing waits for a later cycle.
        self.sender.flush();
    }

    /// The control connection that claims `mirrored`: the intercept of its engine's target.
    fn link(&self, mirrored: SocketAddrV4) -> &ControlHandle {
        let k = self
            .fleet
            .target_of(mirrored)
            .and_then(|t| self.link_of_target.iter().find(|(x, _)| *x == t))
            .map_or(0, |(_, k)| *k);
        &self.links[k.min(self.links.len() - 1)].0
    }

    /// The control connections' counters, summed (`connected` only while all are up).
    fn control_stats(&self) -> crate::control_client::ClientStats {
        let mut total = self.links[0].0.stats();
        for (c, _) in &self.links[1..] {
            add_client_stats(&mut total, &c.stats());
        }
        total
    }

    /// Moves what the engines observed into the report's queue.
    fn collect_observations(&mut self) {
        if let Some(sink) = &self.observations {
            let fleet = &mut self.fleet;
            sink.extend(std::iter::from_fn(|| fleet.poll_observation()));
        }
    }

    fn handle_events(&mut self) {
        self.collect_observations();
        while let Some(ev) = self.fleet.poll_event() {
            match ev {
                EngineEvent::SessionOpened {
                    client,
                    mirrored,
                    picked_up,
                } => {
                    self.link(mirrored).claim(mirrored);
                    match (picked_up, &self.lookup) {
                        (true, Some(lookup)) => {
                            lookup.request(client, mirrored);
                        }
                        (false, Some(lookup)) => lookup.seen(client),
                        (_, None) => {}
                    }
                }
                EngineEvent::SessionReleased { mirrored } => self.link(mirrored).release(mirrored),
                EngineEvent::SessionClosed {
                    client,
                    reason: CloseReason::NotMirrorable,
                    why,
                    ..
                } => {
                    let why = why.unwrap_or("unknown");
                    // Re-established on the client's next data (engine/recovery.rs), not left
                    // alone: counted as such, no warning.
                    let recovers = crate::engine::lost_test_answers(why)
                        && self
                            .fleet
                            .engines()
                            .iter()
                            .any(|e| e.config().pickup_midstream);
                    if !recovers {
                        self.not_mirrorable.note(client, why);
                    }
                }
                EngineEvent::SessionClosed { .. } => {}
            }
        }
    }
}

/// Adds `o` to `t`: several control connections (several `--intercept`, `--workers`) shown as
/// one. `connected` only while all are.
pub(crate) fn add_client_stats(
    t: &mut crate::control_client::ClientStats,
    o: &crate::control_client::ClientStats,
) {
    t.connected &= o.connected;
    t.connects += o.connects;
    t.reconnects += o.reconnects;
    t.connect_failures += o.connect_failures;
    t.rejects += o.rejects;
    t.frames_in += o.frames_in;
    t.frames_out += o.frames_out;
    t.feedback_received += o.feedback_received;
    t.mysql_received += o.mysql_received;
    t.claimed += o.claimed;
}

/// How long a packet framed at `framed_us` waited at intercept before its frame was encoded at
/// `sent_us` (intercept's clock, wrapping µs). A wait over a minute, or a negative one, is a
/// step of intercept's clock between the two (a stalled intercept waits seconds, not that
/// long): it dates nothing back.
fn intercept_wait(sent_us: u32, framed_us: u32) -> Duration {
    match sent_us.wrapping_sub(framed_us) {
        d if d <= 60_000_000 => Duration::from_micros(u64::from(d)),
        _ => Duration::ZERO,
    }
}

/// Bits of a relayed event's place in its chunk, below its client in [`Driver`]'s sort.
const PLACE_BITS: usize = 16;
const PLACE_MASK: u64 = (1 << PLACE_BITS) - 1;

/// A client address as one sortable number (48 bits).
fn addr_key(a: SocketAddrV4) -> u64 {
    u64::from(a.ip().to_bits()) << 16 | u64::from(a.port())
}

fn framed_at_us(ev: &MysqlEvent) -> Option<u32> {
    match ev {
        MysqlEvent::Packet { packet, .. } => Some(packet.framed_at_us),
        MysqlEvent::Rows { rows, .. } => Some(rows.framed_at_us),
        MysqlEvent::FramingLost { .. } | MysqlEvent::FramingResumed { .. } => None,
    }
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
            let mut what = vec!["user", "schema"];
            if !ready.performance_schema_off {
                what.push("prepared statements");
            }
            if ready.user_variables {
                what.push("user variables");
            }
            if ready.session_variables {
                what.push("session variables");
            }
            tracing::info!(
                "--prod-dsn {shown}: logged in; pooled connections recover their {}",
                what.join(", ")
            );
            if !ready.performance_schema_off && !ready.session_variables {
                tracing::info!(
                    "--prod-dsn {shown}: this server has no performance_schema.variables_by_thread \
                     (MariaDB), so pooled connections get the test server's session variables, \
                     not the ones they set on production"
                );
            }
            Ok(Some(lookup))
        }
        Err(e) => match e.fix(&user) {
            Some(fix) => bail!("--prod-dsn {shown}: {e}; fix: {fix}"),
            None => bail!("--prod-dsn {shown}: {e}"),
        },
    }
}

/// Says once per client address and reason (bounded) that its sessions cannot be mirrored,
/// and why: the user should know, but one line per connection would flood the log. Per reason
/// too, so a client first left alone for one reason (say, no credentials) still gets its line
/// when it turns up with TLS.
/// The first line for a reason that has a remedy also names it (once per reason).
#[derive(Default)]
struct OncePerClient {
    seen: std::collections::HashSet<(std::net::Ipv4Addr, &'static str)>,
    remedied: std::collections::HashSet<&'static str>,
}

impl OncePerClient {
    const MAX: usize = 10_000;

    /// Whether `(client, why)` is new (and then remembered).
    fn first(&mut self, client: SocketAddrV4, why: &'static str) -> bool {
        self.seen.len() < Self::MAX && self.seen.insert((*client.ip(), why))
    }

    fn note(&mut self, client: SocketAddrV4, why: &'static str) {
        if self.first(client, why) {
            let fix = match remedy(why) {
                Some(r) if self.remedied.insert(why) => format!(" {r}"),
                _ => String::new(),
            };
            tracing::warn!(
                "sessions from {} cannot be mirrored ({why}); they are left alone and counted \
                 (said once per client address and reason).{fix}",
                client.ip()
            );
        }
    }
}

/// What the user can do about sessions left alone for `why`, when there is something.
fn remedy(why: &str) -> Option<&'static str> {
    match why {
        // The copier saw no login for these (open before it started, or their SYN was lost,
        // e.g. to kernel capture drops): it must log in with an account of its own.
        "pickup_no_default_user" => Some(
            "Connections whose login the copier did not capture (open before it started, or \
             their start lost to kernel drops) are picked up with a login of its own: pass \
             --mysql-default-user USER (an account in --mysql-credentials), or --prod-dsn so \
             each gets its own user and schema from production.",
        ),
        _ => None,
    }
}

/// Waits a little for the control channel before the first packet is read. Sessions started
/// earlier lose the test server's SYN-ACK (nobody is there to relay it) and stall for a
/// retransmission timeout; the capture meanwhile keeps what arrives in its kernel buffer.
/// Never waits forever: an intercept that is down must not keep production unobserved, and
/// the engine retransmits until the channel is up.
fn wait_for_intercept(control: &ControlHandle, addr: std::net::SocketAddr) -> Result<()> {
    const PATIENCE: Duration = Duration::from_secs(5);
    let started = std::time::Instant::now();
    while !control.stats().connected && started.elapsed() < PATIENCE {
        if signals::stop_requested() {
            return Ok(());
        }
        // A refused handshake (secret, version, --allow) is a set-up mistake: say it and stop
        // rather than mirror without feedback.
        if let Some(why) = control.refused_before_welcome() {
            bail!("control channel to intercept {addr}: {why}");
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
    Ok(())
}

fn tls_figures(t: &crate::tls::TlsProbeStats) -> crate::status::TlsProbeFigures {
    crate::status::TlsProbeFigures {
        chunks: t.chunks,
        bytes: t.bytes,
        ring_full_bytes: t.lost_bytes,
        truncated_bytes: t.truncated_bytes,
        unresolved_chunks: t.unresolved_chunks,
        unresolved_bytes: t.unresolved_bytes,
        not_tcp_bytes: t.not_tcp_bytes,
        ipv6_bytes: 0,
        streams_started: t.streams_started,
        streams_joined_midway: t.streams_joined_midway,
    }
}

#[cfg(test)]
mod tests {
    use super::{intercept_wait, remedy, OncePerClient};
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::time::Duration;

    #[test]
    fn a_client_is_named_once_per_reason() {
        let mut once = OncePerClient::default();
        let a = |port| SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), port);
        assert!(once.first(a(40000), "no credentials"));
        assert!(
            !once.first(a(40001), "no credentials"),
            "same address, other port"
        );
        assert!(once.first(a(40002), "tls"), "same address, new reason");
        assert!(!once.first(a(40003), "tls"));
        assert!(once.first(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 1), "tls"));
    }

    #[test]
    fn a_reply_is_dated_back_by_its_wait_at_intercept_and_a_clock_step_dates_nothing() {
        let us = Duration::from_micros;
        assert_eq!(intercept_wait(1_700, 1_000), us(700));
        // Wrapping: captured just before the µs counter wrapped, sent just after.
        assert_eq!(intercept_wait(300, u32::MAX - 199), us(500));
        assert_eq!(
            intercept_wait(5_000_000, 0),
            us(5_000_000),
            "a stalled intercept"
        );
        assert_eq!(
            intercept_wait(1_000, 1_001),
            Duration::ZERO,
            "clock stepped back"
        );
        assert_eq!(
            intercept_wait(3_600_000_000, 0),
            Duration::ZERO,
            "clock stepped forward"
        );
    }

    #[test]
    fn a_pickup_without_credentials_names_both_ways_to_fix_it() {
        let r = remedy("pickup_no_default_user").unwrap();
        assert!(
            r.contains("--mysql-default-user") && r.contains("--prod-dsn"),
            "{r}"
        );
        assert_eq!(remedy("not_mirrorable_tls"), None);
    }
}
