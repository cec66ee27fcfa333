//! The capture thread's loop: read feedback from a source, apply routing changes, route, flush.
//!
//! Latency matters more than batching here (the copier ACKs the test server's data when this
//! feedback arrives), so batches only form while the source has packets ready: the moment it
//! runs dry every pending batch is sent. The loop must never block on a copier.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use common::control::TestFeedback;

use crate::relay::{Relay, RelayEvent, RelayStats};
use crate::server::ServerStatsSnapshot;

/// Where feedback comes from: the pcap capture in production, a channel in tests.
pub trait FeedbackSource {
    /// The next feedback if one is ready now, without blocking.
    fn poll_feedback(&mut self) -> anyhow::Result<Option<TestFeedback>>;
    /// Sleeps until feedback may be ready or `timeout` passes (a signal may end it early).
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()>;
    /// Counters for the status line.
    fn stats(&mut self) -> SourceStats;
}

/// Counters of a feedback source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Frames read from the capture.
    pub captured: u64,
    /// Frames skipped because they did not parse, by reason.
    pub parse_errors: ParseErrors,
    /// What the kernel reports, where the source has a kernel.
    pub kernel: Option<KernelStats>,
}

/// Skipped frames, one counter per `common::wire::WireError` kind that can occur on capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParseErrors {
    pub truncated: u64,
    pub not_ipv4: u64,
    pub not_tcp: u64,
    pub bad_ip_header: u64,
    pub bad_tcp_header: u64,
    pub fragment: u64,
    pub other: u64,
}

impl ParseErrors {
    pub fn total(&self) -> u64 {
        self.truncated
            + self.not_ipv4
            + self.not_tcp
            + self.bad_ip_header
            + self.bad_tcp_header
            + self.fragment
            + self.other
    }

    pub fn count(&mut self, e: common::wire::WireError) {
        use common::wire::WireError as W;
        let c = match e {
            W::Truncated => &mut self.truncated,
            W::NotIpv4 => &mut self.not_ipv4,
            W::NotTcp => &mut self.not_tcp,
            W::BadIpHeader => &mut self.bad_ip_header,
            W::BadTcpHeader => &mut self.bad_tcp_header,
            W::Fragment => &mut self.fragment,
            W::BufferTooSmall => &mut self.other,
        };
        *c += 1;
    }
}

/// pcap's own counters (32-bit in libpcap: they wrap on long runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub received: u32,
    pub dropped: u32,
    pub if_dropped: u32,
}

/// Everything the status line shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub copiers: usize,
    pub claimed: usize,
    pub source: SourceStats,
    pub relay: RelayStats,
    pub server: ServerStatsSnapshot,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.relay;
        let p = &self.source.parse_errors;
        write!(
            f,
            "copiers={} claimed={} captured={} relayed={} routed={} unclaimed_broadcast={} \
             no_copier={} dropped_queue_full={} parse_errors={}",
            self.copiers,
            self.claimed,
            self.source.captured,
            r.relayed,
            r.routed,
            r.unclaimed,
            r.no_copier,
            r.dropped_queue_full,
            p.total(),
        )?;
        if p.total() > 0 {
            write!(
                f,
                " (truncated={} not_ipv4={} not_tcp={} bad_ip={} bad_tcp={} fragment={})",
                p.truncated, p.not_ipv4, p.not_tcp, p.bad_ip_header, p.bad_tcp_header, p.fragment
            )?;
        }
        match self.source.kernel {
            Some(k) => write!(
                f,
                " kernel_received={} kernel_dropped={} if_dropped={}",
                k.received, k.dropped, k.if_dropped
            )?,
            None => write!(f, " kernel=n/a")?,
        }
        let s = &self.server;
        write!(
            f,
            " control: accepted={} rejected={} bad_frames={} timeouts={}",
            s.accepted,
            s.rejected,
            s.garbage,
            s.timeouts + s.write_failures
        )
    }
}

/// How the loop paces itself.
#[derive(Clone, Copy, Debug)]
pub struct PumpConfig {
    /// Longest sleep while idle; bounds how late a stop request or a status line can be.
    pub idle_wait: Duration,
    /// Time between status reports; `None` for none.
    pub status_interval: Option<Duration>,
}

impl Default for PumpConfig {
    fn default() -> Self {
        PumpConfig {
            idle_wait: Duration::from_millis(100),
            status_interval: Some(Duration::from_secs(5)),
        }
    }
}

/// Runs until `stop` is set or the source fails. `report` gets the relay and source whenever a
/// status line is due; the caller builds and logs it (see [`status`]).
pub fn run<S: FeedbackSource>(
    source: &mut S,
    relay: &mut Relay,
    events: &Receiver<RelayEvent>,
    stop: &AtomicBool,
    config: PumpConfig,
    mut report: impl FnMut(&Relay, &mut S),
) -> anyhow::Result<()> {
    let mut next_status = config.status_interval.map(|i| Instant::now() + i);
    let mut burst = 0u32;
    while !stop.load(Ordering::Relaxed) {
        // Before every packet, so a Claim that arrived before the reply it is for is applied.
        drain_events(relay, events);
        match source.poll_feedback()? {
            Some(fb) => {
                relay.route(fb);
                burst = burst.wrapping_add(1);
                // A capture that never runs dry must still report.
                if !burst.is_multiple_of(4096) {
                    continue;
                }
            }
            None => {
                relay.flush();
                source.wait(config.idle_wait)?;
            }
        }
        if let (Some(due), Some(interval)) = (next_status, config.status_interval) {
            let now = Instant::now();
            if now >= due {
                report(relay, source);
                next_status = Some(now + interval);
            }
        }
    }
    drain_events(relay, events);
    relay.flush();
    Ok(())
}

fn drain_events(relay: &mut Relay, events: &Receiver<RelayEvent>) {
    loop {
        match events.try_recv() {
            Ok(ev) => relay.apply(ev),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
        }
    }
}

/// The status of a running intercept.
pub fn status<S: FeedbackSource>(
    relay: &Relay,
    source: &mut S,
    server: ServerStatsSnapshot,
) -> Status {
    Status {
        copiers: relay.copiers(),
        claimed: relay.claimed(),
        source: source.stats(),
        relay: relay.stats(),
        server,
    }
}

/// Feedback handed in through a channel: for tests and tools that produce feedback without a
/// capture. Ends (with an error) when every sender is gone.
pub struct ChannelSource {
    rx: Receiver<TestFeedback>,
    ready: Option<TestFeedback>,
    received: u64,
}

impl ChannelSource {
    pub fn new(rx: Receiver<TestFeedback>) -> Self {
        ChannelSource {
            rx,
            ready: None,
            received: 0,
        }
    }
}

impl FeedbackSource for ChannelSource {
    fn poll_feedback(&mut self) -> anyhow::Result<Option<TestFeedback>> {
        if let Some(fb) = self.ready.take() {
            return Ok(Some(fb));
        }
        match self.rx.try_recv() {
            Ok(fb) => {
                self.received += 1;
                Ok(Some(fb))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => anyhow::bail!("feedback channel closed"),
        }
    }

    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        if self.ready.is_some() {
            return Ok(());
        }
        match self.rx.recv_timeout(timeout) {
            Ok(fb) => {
                self.received += 1;
                self.ready = Some(fb);
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("feedback channel closed"),
        }
    }

    fn stats(&mut self) -> SourceStats {
        SourceStats {
            captured: self.received,
            ..SourceStats::default()
        }
    }
}
