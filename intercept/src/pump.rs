//! The capture thread's loop: read replies from a source, apply routing changes, turn each
//! reply into feedback (and, in MySQL mode, packet summaries), route, flush.
//!
//! Latency matters more than batching here (the copier ACKs the test server's data when this
//! feedback arrives), so batches only form while the source has packets ready: the moment it
//! runs dry every pending batch is sent. The loop must never block on a copier.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use common::clock::{Instant, MonotonicClock};
use common::control::{MysqlEvent, TestFeedback, MAX_PAYLOAD_PREFIX};
use common::wire::{parse_frame_headers, LinkType, TcpPacket};

use crate::relay::{Relay, RelayEvent, RelayStats};
use crate::server::ServerStatsSnapshot;
use crate::sessions::{MysqlSessions, MysqlStats, SessionConfig};

/// Where replies come from: the pcap capture in production, a channel in tests.
pub trait SegmentSource {
    /// Hands the next captured reply to `f` if one is ready now, without blocking; whether
    /// there was one. The packet borrows the capture's buffer, so `f` must not keep it. With
    /// it goes when it was captured, on the [`common::clock::realtime_us`] scale: a capture
    /// that hands packets over in blocks delivers them up to a block's timeout late.
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool>;
    /// Sleeps until a reply may be ready or `timeout` passes (a signal may end it early).
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()>;
    /// Counters for the status line.
    fn stats(&mut self) -> SourceStats;
}

/// The way of every captured reply: its feedback, the MySQL packets it completes, the relay.
pub struct ReplyPath {
    pub relay: Relay,
    /// `None` in `--protocol tcp` mode.
    pub mysql: Option<MysqlSessions>,
    prefix: usize,
    /// Reused for each segment's events (the relay drains it).
    events: Vec<MysqlEvent>,
}

impl ReplyPath {
    /// Feedback keeps `payload_prefix` payload bytes; MySQL packets are framed when `mysql`
    /// is set.
    pub fn new(relay: Relay, payload_prefix: usize, mysql: Option<SessionConfig>) -> Self {
        ReplyPath {
            relay,
            mysql: mysql.map(MysqlSessions::new),
            prefix: payload_prefix.min(MAX_PAYLOAD_PREFIX),
            events: Vec::new(),
        }
    }

    /// One captured reply, received by the capture at `captured_us` (see
    /// [`SegmentSource::poll_segment`]).
    pub fn on_segment(&mut self, now: Instant, captured_us: u32, pkt: &TcpPacket<'_>) {
        let fb = TestFeedback::from_packet(pkt, self.prefix);
        // With no copier connected (intercept just restarted) the events would be dropped, and
        // a session first seen mid-stream says `FramingLost` only once: frame nothing until a
        // copier is there to be told, so the copier of a surviving session learns it.
        if let (Some(m), true) = (&mut self.mysql, self.relay.copiers() > 0) {
            m.set_hashing(self.relay.wants_payload_hashes());
            m.set_folding(self.relay.wants_row_runs());
            m.on_captured(now, captured_us, pkt, &mut self.events);
        }
        // One call for both, so the events go to exactly the copiers the feedback goes to.
        self.relay.route_segment(fb, &mut self.events);
    }

    fn sweep(&mut self, now: Instant) {
        if let Some(m) = &mut self.mysql {
            m.sweep(now);
        }
    }

    /// Counters of MySQL framing and the number of sessions tracked, in MySQL mode.
    pub fn mysql_stats(&self) -> Option<(MysqlStats, usize)> {
        self.mysql.as_ref().map(|m| (m.stats(), m.len()))
    }
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
    /// MySQL framing counters and sessions tracked now, in MySQL mode.
    pub mysql: Option<(MysqlStats, usize)>,
    pub server: ServerStatsSnapshot,
}

impl Status {
    /// Adds another capture worker's counters (`--workers`). Copiers and claims are the same
    /// at every worker (each hears every Claim), so the larger is kept, not the sum.
    pub fn add(&mut self, o: &Status) {
        self.copiers = self.copiers.max(o.copiers);
        self.claimed = self.claimed.max(o.claimed);
        let (s, t) = (&mut self.source, &o.source);
        s.captured += t.captured;
        let (p, q) = (&mut s.parse_errors, &t.parse_errors);
        p.truncated += q.truncated;
        p.not_ipv4 += q.not_ipv4;
        p.not_tcp += q.not_tcp;
        p.bad_ip_header += q.bad_ip_header;
        p.bad_tcp_header += q.bad_tcp_header;
        p.fragment += q.fragment;
        p.other += q.other;
        s.kernel = match (s.kernel, t.kernel) {
            (Some(a), Some(b)) => Some(KernelStats {
                received: a.received.wrapping_add(b.received),
                dropped: a.dropped.wrapping_add(b.dropped),
                if_dropped: a.if_dropped.wrapping_add(b.if_dropped),
            }),
            (a, b) => a.or(b),
        };
        let (r, q) = (&mut self.relay, &o.relay);
        r.routed += q.routed;
        r.unclaimed += q.unclaimed;
        r.no_copier += q.no_copier;
        r.relayed += q.relayed;
        r.dropped_queue_full += q.dropped_queue_full;
        r.mysql_relayed += q.mysql_relayed;
        r.mysql_dropped += q.mysql_dropped;
        r.mysql_no_copier += q.mysql_no_copier;
        // Every worker applies every Claim and Release: counted once.
        r.claims = r.claims.max(q.claims);
        r.releases = r.releases.max(q.releases);
        r.claims_moved = r.claims_moved.max(q.claims_moved);
        r.claims_refused = r.claims_refused.max(q.claims_refused);
        self.mysql = match (self.mysql, o.mysql) {
            (Some((mut a, n)), Some((b, m))) => {
                a.sessions_framed += b.sessions_framed;
                a.packets += b.packets;
                a.framing_lost += b.framing_lost;
                a.lost_midstream += b.lost_midstream;
                a.framing_resumed += b.framing_resumed;
                a.lost_gap += b.lost_gap;
                a.lost_snapped += b.lost_snapped;
                a.sessions_shed += b.sessions_shed;
                a.sessions_expired += b.sessions_expired;
                let (x, y) = (&mut a.reassembly, &b.reassembly);
                x.duplicates += y.duplicates;
                x.holes += y.holes;
                x.ooo_held += y.ooo_held;
                x.ooo_dropped += y.ooo_dropped;
                Some((a, n + m))
            }
            (a, b) => a.or(b),
        };
    }
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
        if let Some((m, live)) = &self.mysql {
            let a = &m.reassembly;
            write!(
                f,
                " mysql: sessions={live} sessions_framed={} packets_framed={} folded={} runs={} \
                 framing_lost={}",
                m.sessions_framed, m.packets, m.folded, m.runs, m.framing_lost
            )?;
            if m.framing_lost > 0 || m.sessions_shed > 0 {
                write!(
                    f,
                    " (midstream={} gap={} snapped={} memory={} shed={} resumed={})",
                    m.lost_midstream,
                    m.lost_gap,
                    m.lost_snapped,
                    m.lost_memory,
                    m.sessions_shed,
                    m.framing_resumed
                )?;
            }
            write!(
                f,
                " holes={} ooo_held={} ooo_dropped={} retransmits={} events_relayed={} \
                 events_dropped={}",
                a.holes,
                a.ooo_held,
                a.ooo_dropped,
                a.duplicates,
                r.mysql_relayed,
                r.mysql_dropped + r.mysql_no_copier
            )?;
        }
        let s = &self.server;
        write!(
            f,
            " control: accepted={} rejected={} refused(allow/secret)={}/{} bad_frames={} \
             timeouts={}",
            s.accepted,
            s.rejected,
            s.refused_allow,
            s.refused_no_secret + s.refused_bad_secret,
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
    /// After a wakeup, how long to let replies gather in the capture ring before reading them
    /// (`--relay-flush-us`), while no connected copier asked for prompt replies or said that a
    /// session of its waits on the test server (Prompt): under load, one wakeup per period
    /// instead of one per reply. Replies keep their kernel timestamps.
    pub gather: Duration,
}

impl Default for PumpConfig {
    fn default() -> Self {
        PumpConfig {
            idle_wait: Duration::from_millis(100),
            status_interval: Some(Duration::from_secs(5)),
            gather: Duration::ZERO,
        }
    }
}

/// How often ended and idle MySQL sessions are forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `stop` is set or the source fails. `report` gets the reply path and source
/// whenever a status line is due; the caller builds and logs it (see [`status`]).
pub fn run<S: SegmentSource>(
    source: &mut S,
    path: &mut ReplyPath,
    events: &Receiver<RelayEvent>,
    stop: &AtomicBool,
    config: PumpConfig,
    mut report: impl FnMut(&ReplyPath, &mut S),
) -> anyhow::Result<()> {
    let clock = MonotonicClock::new();
    let mut next_status = config.status_interval.map(|i| clock.now() + i);
    let mut next_sweep = clock.now() + SWEEP_INTERVAL;
    let mut burst = 0u32;
    // Whether the capture had replies since the last gathering.
    let mut busy = false;
    while !stop.load(Ordering::Relaxed) {
        // Before every packet, so a Claim that arrived before the reply it is for is applied.
        drain_events(&mut path.relay, events);
        let now = clock.now();
        if source.poll_segment(|pkt, at| path.on_segment(now, at, pkt))? {
            busy = true;
            burst = burst.wrapping_add(1);
            // A capture that never runs dry must still report and sweep.
            if !burst.is_multiple_of(4096) {
                continue;
            }
        } else {
            path.relay.flush();
            // Under load the next reply is due within the period: gather straight away, one
            // wakeup per period instead of one for the reply and one for the period's end. A
            // reply waits no longer than it would after a wakeup of its own.
            if !busy || path.relay.gather_for(config.gather).is_zero() {
                source.wait(config.idle_wait)?;
            }
            busy = false;
            gather(&mut path.relay, events, config.gather);
        }
        let now = clock.now();
        if now >= next_sweep {
            path.sweep(now);
            next_sweep = now + SWEEP_INTERVAL;
        }
        if let (Some(due), Some(interval)) = (next_status, config.status_interval) {
            if now >= due {
                report(path, source);
                next_status = Some(now + interval);
            }
        }
    }
    drain_events(&mut path.relay, events);
    path.relay.flush();
    Ok(())
}

/// Lets replies gather in the capture for `period` after a wakeup, or less while a copier wants
/// them sooner ([`Relay::gather_for`]: one that times replies, one whose sessions wait on the
/// test server). The wait is on the copiers' events, so a Prompt that turns on while replies
/// gather shortens it, and the reply a held command waits for is not kept back the rest of
/// the period.
fn gather(relay: &mut Relay, events: &Receiver<RelayEvent>, period: Duration) {
    let start = std::time::Instant::now();
    loop {
        let until = start + relay.gather_for(period);
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        match events.recv_timeout(left) {
            Ok(ev) => relay.apply(ev),
            Err(RecvTimeoutError::Timeout) => return,
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(left);
                return;
            }
        }
    }
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
pub fn status<S: SegmentSource>(
    path: &ReplyPath,
    source: &mut S,
    server: ServerStatsSnapshot,
) -> Status {
    Status {
        copiers: path.relay.copiers(),
        claimed: path.relay.claimed(),
        source: source.stats(),
        relay: path.relay.stats(),
        mysql: path.mysql_stats(),
        server,
    }
}

/// Replies handed in through a channel as raw IPv4 packets: for tests and tools that produce
/// replies without a capture. Ends (with an error) when every sender is gone.
pub struct ChannelSource {
    rx: Receiver<Vec<u8>>,
    ready: Option<Vec<u8>>,
    received: u64,
    parse_errors: ParseErrors,
}

impl ChannelSource {
    pub fn new(rx: Receiver<Vec<u8>>) -> Self {
        ChannelSource {
            rx,
            ready: None,
            received: 0,
            parse_errors: ParseErrors::default(),
        }
    }
}

impl SegmentSource for ChannelSource {
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool> {
        let ip = match self.ready.take() {
            Some(ip) => ip,
            None => match self.rx.try_recv() {
                Ok(ip) => {
                    self.received += 1;
                    ip
                }
                Err(TryRecvError::Empty) => return Ok(false),
                Err(TryRecvError::Disconnected) => anyhow::bail!("reply channel closed"),
            },
        };
        match parse_frame_headers(LinkType::RawIp, &ip) {
            Ok(pkt) => f(&pkt, common::clock::realtime_us()),
            Err(e) => self.parse_errors.count(e),
        }
        Ok(true)
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
            Err(RecvTimeoutError::Disconnected) => anyhow::bail!("reply channel closed"),
        }
    }

    fn stats(&mut self) -> SourceStats {
        SourceStats {
            captured: self.received,
            parse_errors: self.parse_errors,
            kernel: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, sync_channel};

    use super::*;

    #[test]
    fn a_copier_whose_session_waits_ends_the_gathering() {
        let mut relay = Relay::new(16);
        let (tx, _rx) = sync_channel(4);
        relay.apply(RelayEvent::Connected {
            id: 1,
            name: "c1".into(),
            tx: tx.into(),
            features: common::control::FEATURE_PROMPT_ON_DEMAND,
        });
        let (events, rx) = channel();
        events.send(RelayEvent::Prompt { id: 1, on: true }).unwrap();
        // Were the Prompt not taken, this would gather for ten minutes, not a millisecond.
        gather(&mut relay, &rx, Duration::from_secs(600));
        assert_eq!(
            relay.gather_for(Duration::from_secs(600)),
            crate::relay::PROMPT_GATHER
        );
        gather(&mut relay, &rx, Duration::from_secs(600));
        // Off again (taken before the next packet, as every event): gathering resumes, for
        // the period (a short one here), and an event that comes meanwhile is applied.
        events
            .send(RelayEvent::Prompt { id: 1, on: false })
            .unwrap();
        drain_events(&mut relay, &rx);
        assert_eq!(
            relay.gather_for(Duration::from_secs(600)),
            Duration::from_secs(600)
        );
        events.send(RelayEvent::Disconnected { id: 1 }).unwrap();
        gather(&mut relay, &rx, Duration::from_millis(50));
        events.send(RelayEvent::Prompt { id: 1, on: true }).unwrap();
        drain_events(&mut relay, &rx);
        assert_eq!(
            relay.gather_for(Duration::from_secs(600)),
            Duration::from_secs(600),
            "its disconnection was applied"
        );
    }
}
