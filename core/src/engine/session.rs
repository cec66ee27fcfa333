//! One mirrored connection: the client side of a TCP connection toward the test server.
//!
//! Four sequence spaces meet here, and each number belongs to exactly one:
//! * the **client stream** (client seq numbers, as captured) — owned by `reasm`; capture-gap
//!   detection (production's ACKs against what we captured) and client RSTs live here;
//! * **production's stream** (its replies) — `prod_reasm`, kept only for a transform that
//!   wants it; the client's ACKs show gaps in its capture;
//! * **our stream toward the test server** (`iss`, `snd_*`, `send_buf`, our FIN) — what we
//!   send and retransmit. Our ISN is the client's (a capture on the test host looks like the
//!   client), but no later number is derived from a client number;
//! * the **test server's stream** (`irs`, `rcv_nxt`) — known only from relayed headers.
//!
//! The only bridge from the first to the third is the `deliver` callback that
//! [`Session::on_client`] hands to the reassembly: every in-order client byte passes there
//! exactly once, and either goes straight into `send_buf` (no transform: the two streams are
//! byte-for-byte the same) or to the session's [`StreamTransform`], whose pushes are appended
//! to `send_buf` whatever their length. Nothing downstream ever maps a byte back.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use common::clock::Instant;
use common::control::TestFeedback;
use common::seq::SeqNumber;
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpFlags, TcpOptions, TcpPacket};

use super::ranges::Ranges;
use super::reassembly::{Insert, Reassembly};
use super::recovery::Revival;
use super::rtt::RttEstimator;
use super::serial;
use super::transform::{
    self, StreamTransform, TestEvent, TestSegment, TransformOutput, TransformResult,
};
use super::{CloseReason, EngineConfig, EngineStats};
use crate::observation::Observation;

/// The window scale we offer: 65535 << 7 (8 MiB) is plenty for a receiver that consumes
/// instantly, and it is what Linux offers with default buffers.
const OUR_WSCALE: u8 = 7;
/// The window field we always advertise. We drop the test server's bytes the moment they
/// arrive (they die at the assist host), so our receive buffer never fills.
const OUR_WINDOW: u16 = u16::MAX;
/// RFC 7323: largest shift a peer may use.
const MAX_WSCALE: u8 = 14;
/// RFC 879 default when a SYN carries no MSS option.
const DEFAULT_MSS: u16 = 536;
/// Smallest MSS we accept from a peer (Linux's floor is similar); guards against a bogus MSS
/// turning every byte into its own packet.
const MIN_MSS: u16 = 64;
/// Bytes the timestamps option takes in every segment (10, padded to 12).
const TS_OPTION_LEN: u16 = 12;
/// An emptied send buffer keeping more capacity than this gives some back.
const SHRINK_ABOVE: usize = 256 << 10;
/// Out-of-order ranges of the test server's stream we remember.
const TEST_HOLES: usize = 4;
/// How long a capture gap that production's stream proves is waited for all the same before it
/// is gone past: a capture that queues the two directions apart (a file merged from two, the
/// simulations) may show production's ACK a little before the client segment it acknowledges.
/// A live capture cannot: the kernel taps a segment on its way in, before the stack answers it.
const PROVEN_GAP_GRACE: Duration = Duration::from_millis(50);
/// Holes gone past in one go, at most (the reassembly holds at most 8 beyond the first).
const GAP_ROUNDS: usize = 10;
/// Production bytes a session holds behind a hole in production's stream before the hole is
/// taken as the capture's without the client's ACK (`prod_held_too_long`): 1 MiB is a
/// fraction of a second of the busiest session's replies, and eight such sessions stay well
/// within the sessions' part of the default --max-memory (96 MiB).
const PROD_HOLD_LIMIT: usize = 1 << 20;
/// How soon a transform's timer runs again when it left its deadline in the past.
const TRANSFORM_RETRY: Duration = Duration::from_millis(1);

mod captured;
mod plaintext;
pub(crate) use plaintext::PlainAt;
mod feedback;
mod gaps;
mod recovery;
mod replay;
use replay::{Kept, ReplayLog};
mod sending;
mod timers;

#[cfg(test)]
pub(crate) use recovery::{STALE_MAX, STALE_QUIET};

pub(crate) use recovery::Held;

pub(crate) enum Outcome {
    Open,
    Finished(CloseReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Our SYN is (to be) sent; the test server's SYN-ACK not seen yet.
    SynSent,
    /// Synchronized, including both half-closed directions.
    Established,
    /// Closed; kept until `until` to answer late packets like a kernel would (re-ACK a
    /// retransmitted FIN after a clean close, RST anything after an abort).
    Lingering { clean: bool, until: Instant },
}

/// Our direction's close, toward the test server. The states only move forward, in this
/// order: the client's FIN is reached in order (its whole stream is in our hands), then our
/// FIN is queued once the transform withholds nothing more (a login waiting for the greeting
/// keeps it back). The test server's direction closes on its own (`test_fin_at`); the session
/// is complete when both are closed and acknowledged.
///
/// The values are chosen so that the FIN's place in our sequence space is the low bit
/// (`fin_len`): `stream_end` is asked several times per packet sent, and a comparison there
/// cost the engine 2% of its instructions per packet (callgrind, tcp:1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Closing {
    /// The client's stream goes on.
    Open = 0,
    /// The client's FIN (or a reset taken as one) was reached; our FIN waits for the transform.
    ClientFinished = 2,
    /// Our FIN follows the last byte of our stream.
    FinQueued = 3,
}

impl Closing {
    /// Sequence numbers our FIN takes: 1 once queued, else 0.
    fn fin_len(self) -> u32 {
        u32::from(self as u8 & 1)
    }
}

/// See [`Session::ack_marks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AckMarks {
    client_next: SeqNumber,
    prod_next: Option<SeqNumber>,
    client_established: bool,
    closing: Closing,
    stopped: bool,
}

/// A captured client segment as the reassembly takes it: where it starts in the client's
/// sequence space (after the SYN), its bytes, and whether it ends the stream (a FIN, or a RST
/// taken as one).
#[derive(Clone, Copy)]
struct Segment<'a> {
    start: SeqNumber,
    payload: &'a [u8],
    fin: bool,
}

#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client: SocketAddrV4,
    pub(crate) prod_ip: Ipv4Addr,
    pub(crate) mirrored: SocketAddrV4,
    target: SocketAddrV4,
    pub(crate) phase: Phase,
    pub(crate) client_isn: SeqNumber,
    /// The instant of this session's entry in the engine's timer heap, if any.
    pub(crate) heap_at: Option<Instant>,
    /// Whether the session is in the engine's ready queue.
    pub(crate) in_ready: bool,
    /// Lingering after losing only its test-side connection: re-established on the client's
    /// next data (see `engine/recovery.rs`).
    pub(crate) revival: Option<Revival>,
    /// For a session that re-establishes another: that one's quick resets in a row.
    pub(crate) revived_after: Option<u32>,
    /// Client bytes kept for a replay (`session/replay.rs`): while the session waits to be
    /// re-established (or re-establishes another and has not reached the test server yet),
    /// the run the next one replays, so a test server's restart costs nothing it can be given
    /// later (`session/recovery.rs`); while it runs, the log of the commands the test server
    /// has not answered, that run's start if the connection is lost. One field for both: a
    /// session needs one at a time, and every session carries it (issue 9's 2 KiB).
    kept: Option<Box<Kept>>,

    // --- client stream (client seq space) ---
    reasm: Reassembly,
    /// Picked up from a pure ACK and nothing forwarded yet: the real next client byte may
    /// still turn out to be later (a keepalive probe carries seq = next - 1).
    floating_start: bool,
    /// We saw the client complete its own handshake with production (any ACK after the SYN).
    client_established: bool,
    /// Highest ACK production sent the client: bytes production holds.
    prod_ack: Option<SeqNumber>,
    /// After a capture gap: client bytes are given up until a segment starts a command
    /// (`StreamTransform::starts_command`); see [`Session::settle_gaps`].
    resync_client: bool,

    // --- the transform between the client stream and ours ---
    /// `None`: our stream is the client stream, byte for byte.
    transform: Option<transform::Slot>,
    /// Production's replies in order, for a transform that wants them; `None` until the
    /// stream's start is known (SYN-ACK or first data captured) or when nobody wants it.
    prod_reasm: Option<Reassembly>,
    wants_prod: bool,
    /// Highest ACK the client sent production (only tracked when `wants_prod`): bytes of
    /// production's stream the client holds, so the capture must have them too.
    client_ack: Option<SeqNumber>,
    /// The transform gave the session up, and why.
    pub(crate) abandoned: Option<&'static str>,
    /// The transform pushed more than the buffer holds.
    overflowed: bool,
    /// When the transform's timer last ran.
    transform_timer_ran: Option<Instant>,

    // --- our stream toward the test server ---
    // Every number of ours lies within the send buffer (plus SYN and FIN) of `buf_seq`, so
    // two of them are never 2^31 apart (that would take a 2 GiB buffer): `SeqNumber`'s
    // comparisons between them are the old `seq::*` ones.
    iss: SeqNumber,
    snd_una: SeqNumber,
    snd_nxt: SeqNumber,
    snd_max: SeqNumber,
    /// Unacknowledged and unsent bytes; `send_buf[0]` has seq `buf_seq`.
    send_buf: VecDeque<u8>,
    buf_seq: SeqNumber,
    /// How far our direction has closed: the client's FIN reached in order (and the transform
    /// told), then our FIN queued. One value, so "our FIN without the client's" cannot be.
    closing: Closing,
    syn_pending: bool,
    /// An older connection on our 4-tuple that the test server still holds, drained before
    /// our SYN can get through (see `recovery.rs`). Rare: boxed, to keep every session small.
    stale: Option<Box<recovery::Stale>>,
    snd_wnd: u32,
    /// Test server's seq and ACK (of ours) of the segment that last updated the window.
    snd_wl1: SeqNumber,
    snd_wl2: SeqNumber,
    snd_wscale: u8,
    /// Payload bytes per segment (peer MSS, our MSS, minus options we always carry).
    send_mss: u32,
    dupacks: u32,
    /// NewReno: `snd_max` when fast recovery started; partial ACKs below it retransmit again.
    recover: Option<SeqNumber>,
    fast_retx_pending: bool,
    /// A retransmission timeout fired: the segment at `snd_una` goes out even if the window
    /// now looks shut (as Linux does). The window may have been shrunk by reordered feedback,
    /// and this retransmission is then what elicits an ACK with the true window; without it a
    /// stale zero window with data in flight would leave no timer running and stall forever.
    rto_retx_pending: bool,
    /// Only limits sending right after a retransmission timeout (then slow start back up to
    /// `ssthresh`); otherwise `u32::MAX`: on a LAN the test server's window is the real limit,
    /// and a small request must never wait for a round trip.
    cwnd: u32,
    ssthresh: u32,
    rtt: RttEstimator,
    /// (seq that acknowledges the timed segment, when it was sent). Cleared on any
    /// retransmission (Karn).
    rtt_probe: Option<(SeqNumber, Instant)>,
    backoff: u32,
    retries: u32,
    rto_at: Option<Instant>,
    persist_at: Option<Instant>,
    probe_pending: bool,
    /// The pending probe is a resync (see [`Session::resync`]), not a zero-window probe.
    resync_probe: bool,
    probes: u32,

    // --- the test server's stream ---
    irs: SeqNumber,
    rcv_nxt: SeqNumber,
    test_ooo: Ranges<TEST_HOLES>,
    test_fin_at: Option<SeqNumber>,
    /// An ACK must go out now (a pure one unless data leaves first).
    ack_pending: bool,
    /// A delayed ACK is owed by then (see `EngineConfig::delayed_ack`); any segment we send
    /// pays it.
    ack_at: Option<Instant>,
    /// In-order test-server segments received since our last segment (0 or 1: the second
    /// is acknowledged at once).
    unacked_segs: u8,
    offer_wscale: bool,
    rcv_wscale: u8,
    ts_offer: bool,
    ts_on: bool,
    /// Latest TSval the client sent: every segment we send carries it, so the test server
    /// sees the client's clock, and PAWS never rejects us (client TSvals only go forward).
    ts_client: u32,
    /// Latest TSval of the test server: echoed as TSecr.
    ts_recent: u32,
    adv_mss: u16,

    created: Instant,
    last_activity: Instant,
    close_started: Option<Instant>,
    gap_since: Option<Instant>,
    /// A TLS session mirrored from its plaintext (`plaintext.rs`).
    tls: Option<Box<plaintext::TlsPlain>>,
}

/// How a session starts.
pub(crate) enum Start {
    /// From the client's SYN: its ISN and options.
    Syn,
    /// Mid-stream: the first byte we will forward is at `pkt.seq`.
    Pickup,
}

impl Session {
    pub(crate) fn new(
        now: Instant,
        cfg: &EngineConfig,
        pkt: &TcpPacket<'_>,
        mirrored: SocketAddrV4,
        start: Start,
        transform: Option<Box<dyn StreamTransform>>,
    ) -> Self {
        let (client_isn, adv_mss, offer_wscale, picked_up) = match start {
            Start::Syn => (
                pkt.seq,
                pkt.options.mss.unwrap_or(DEFAULT_MSS).min(cfg.mss),
                pkt.options.window_scale.is_some(),
                false,
            ),
            // The client's handshake options went to production long ago; this is a fresh
            // connection of ours, so we choose: our full MSS and window scaling.
            Start::Pickup => (pkt.seq - 1u32, cfg.mss, true, true),
        };
        // The one number of ours taken from a client number (see the module doc).
        let iss = client_isn;
        let ts = pkt.options.timestamps;
        let wants_prod = transform.as_ref().is_some_and(|t| t.wants_prod_data());
        Self {
            revival: None,
            revived_after: None,
            kept: None,
            client: SocketAddrV4::new(pkt.src, pkt.src_port),
            prod_ip: pkt.dst,
            mirrored,
            target: cfg.target,
            phase: Phase::SynSent,
            client_isn,
            heap_at: None,
            in_ready: false,
            reasm: Reassembly::new(client_isn + 1u32, cfg.max_session_buffer),
            floating_start: picked_up && pkt.payload.is_empty(),
            client_established: picked_up,
            prod_ack: None,
            closing: Closing::Open,
            resync_client: false,
            transform: transform.map(transform::Slot),
            prod_reasm: None,
            wants_prod,
            client_ack: None,
            abandoned: None,
            overflowed: false,
            transform_timer_ran: None,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            send_buf: VecDeque::new(),
            buf_seq: iss + 1u32,
            syn_pending: true,
            stale: None,
            snd_wnd: 0,
            snd_wl1: SeqNumber(0),
            snd_wl2: SeqNumber(0),
            snd_wscale: 0,
            send_mss: u32::from(DEFAULT_MSS),
            dupacks: 0,
            recover: None,
            fast_retx_pending: false,
            rto_retx_pending: false,
            cwnd: u32::MAX,
            ssthresh: u32::MAX,
            rtt: RttEstimator::new(cfg.initial_rto),
            rtt_probe: None,
            backoff: 0,
            retries: 0,
            rto_at: None,
            persist_at: None,
            probe_pending: false,
            resync_probe: false,
            probes: 0,
            irs: SeqNumber(0),
            rcv_nxt: SeqNumber(0),
            test_ooo: Ranges::new(),
            test_fin_at: None,
            ack_pending: false,
            ack_at: None,
            unacked_segs: 0,
            offer_wscale,
            rcv_wscale: 0,
            ts_offer: ts.is_some(),
            ts_on: false,
            ts_client: ts.map_or(0, |t| t.0),
            ts_recent: 0,
            adv_mss,
            created: now,
            last_activity: now,
            close_started: None,
            gap_since: None,
            tls: None,
        }
    }

    pub(crate) fn is_lingering(&self) -> bool {
        matches!(self.phase, Phase::Lingering { .. })
    }

    /// Bytes queued toward the test server and not yet acknowledged by it (including what
    /// the transform withholds).
    pub(crate) fn queued_bytes(&self) -> usize {
        self.send_buf.len() + self.reasm.held_len() + self.transform_buffered()
    }

    /// Heap bytes this session holds beyond its fixed size (the engine adds that, see
    /// `budget.rs`): buffer capacities, not lengths, because capacity is what the allocator
    /// gave out; plus what its transform says it holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.send_buf.capacity()
            + self.kept.as_ref().map_or(0, |k| k.heap_bytes())
            + self.reasm.heap_bytes()
            + self.prod_reasm.as_ref().map_or(0, Reassembly::heap_bytes)
            + self.transform.as_ref().map_or(0, |t| t.0.memory_len())
            + self.tls_heap_bytes()
    }

    fn transform_buffered(&self) -> usize {
        self.transform.as_ref().map_or(0, |t| t.0.buffered_len())
    }

    /// Bytes a transform may still push: a hard cap on the send buffer's memory. Held and
    /// withheld bytes are left out because a call may be moving them into the send buffer
    /// (a hole filling, a login released); the total is checked after every call.
    fn push_room(&self, cfg: &EngineConfig) -> usize {
        cfg.max_session_buffer.saturating_sub(self.send_buf.len())
    }

    fn data_end(&self) -> SeqNumber {
        self.buf_seq + self.send_buf.len()
    }

    /// Sequence number just past everything we have to send, FIN included.
    fn stream_end(&self) -> SeqNumber {
        self.data_end() + self.closing.fin_len()
    }

    /// See [`TransformOutput::test_stream_seen`]: in-order bytes of the test server's stream
    /// seen so far (its FIN counts as one), modulo 2^32.
    fn test_stream_seen(&self) -> u32 {
        match self.phase {
            Phase::SynSent => 0,
            _ => self.rcv_nxt.bytes_since(self.irs + 1u32) as u32,
        }
    }

    /// Whether this session cannot go on until the test server says something: its SYN-ACK,
    /// or the reply its transform holds client bytes for (a login waiting for the greeting,
    /// an execute for its PREPARE_OK: [`StreamTransform::waits_on_test`]). The copier's loop
    /// takes what intercept relays at once while any session waits so, and at the capture's
    /// pace otherwise (`Engine::waits_on_test`). Bytes queued past the test server's window
    /// are no such wait: it holds a window of our bytes, work for longer than a block. Kept
    /// after every event by `Engine::recharge`, which is why it reads only fields, no scan.
    pub(crate) fn waits_on_test(&self) -> bool {
        match self.phase {
            Phase::Lingering { .. } => false,
            Phase::SynSent => true,
            Phase::Established => {
                self.stale.is_some() || self.transform.as_ref().is_some_and(|t| t.0.waits_on_test())
            }
        }
    }

    /// What a captured pure ACK can change that [`Engine::settle`](super::Engine) acts on, for
    /// an established session whose captured streams are plaintext and show no gap: where
    /// each goes on (a gap gone past moves it, and feeds the transform), the client's
    /// handshake (a timer), the close. `None` where a pure ACK is never taken as quiet: a
    /// suspected gap among them (an ACK can prove it, which brings its timer forward). Equal
    /// before and after the ACK: it left timers, sending, memory and observations as they
    /// were, and the settle after it can be skipped. Clients' ACKs of replies they were sent
    /// alone are a quarter of what a busy production port carries at 1,000 connections
    /// (issue 20).
    pub(crate) fn ack_marks(&self) -> Option<AckMarks> {
        if self.phase != Phase::Established
            || self.tls.is_some()
            || self.resync_client
            || self.gap_since.is_some()
        {
            return None;
        }
        Some(AckMarks {
            client_next: self.reasm.next(),
            prod_next: self.prod_reasm.as_ref().map(Reassembly::next),
            client_established: self.client_established,
            closing: self.closing,
            stopped: self.abandoned.is_some() || self.overflowed,
        })
    }

    fn test_fin_received(&self) -> bool {
        self.test_fin_at
            // `rcv_nxt` stays within a window of the FIN (`process_test_segment`).
            .is_some_and(|f| self.rcv_nxt > f && self.phase == Phase::Established)
    }

    fn our_fin_acked(&self) -> bool {
        self.fin_queued() && self.snd_una == self.stream_end()
    }

    /// The client's whole stream is in and ends here (its FIN, or a reset taken as one).
    pub(crate) fn client_closed(&self) -> bool {
        self.closing >= Closing::ClientFinished
    }

    /// Our FIN goes right after the last byte of `send_buf`.
    fn fin_queued(&self) -> bool {
        self.closing.fin_len() == 1
    }

    /// Both directions closed and acknowledged, and our last ACK is out.
    pub(crate) fn is_complete(&self) -> bool {
        self.phase == Phase::Established
            && self.our_fin_acked()
            && self.test_fin_received()
            && !self.ack_pending
            && self.ack_at.is_none()
    }

    fn rcv_window(&self) -> u32 {
        u32::from(OUR_WINDOW) << self.rcv_wscale
    }

    fn current_rto(&self, cfg: &EngineConfig) -> Duration {
        self.rtt.backed_off(self.backoff, cfg.max_rto)
    }

    /// Where the window (and, after a timeout, the congestion window) lets us send up to.
    fn send_limit(&self) -> SeqNumber {
        self.snd_una + self.snd_wnd.min(self.cwnd)
    }

    fn note_ts(&mut self, opts: &TcpOptions) {
        if let Some((val, _)) = opts.timestamps {
            if serial::ts_after(val, self.ts_client) || !self.ts_offer {
                self.ts_client = val;
            }
        }
    }

    // ------------------------------------------------------------------ closing

    /// The RST that tells the test server to drop this connection now; `None` if it never
    /// heard of it.
    pub(crate) fn reset_repr(&self, ttl: u8) -> Option<SegmentRepr> {
        if self.snd_max == self.iss && self.phase == Phase::SynSent {
            return None;
        }
        let mut r = self.repr(self.snd_max, TcpFlags::RST, 0, ttl);
        r.options = TcpOptions::default();
        if self.phase == Phase::SynSent {
            // No ACK known yet; seq = iss + 1 is what the test server expects in SYN-RECEIVED.
            r.flags = TcpFlags(TcpFlags::RST);
            r.ack = SeqNumber(0);
        }
        Some(r)
    }

    /// Drops the buffers and keeps only what is needed to answer late packets.
    /// The oldest observation the transform has for the report.
    pub(crate) fn poll_observation(&mut self) -> Option<Observation> {
        self.transform.as_mut()?.0.poll_observation()
    }

    /// Tells the transform the session is over (see `StreamTransform::end`).
    pub(crate) fn end_transform(&mut self) {
        if let Some(t) = &mut self.transform {
            t.0.end();
        }
    }

    pub(crate) fn enter_linger(&mut self, until: Instant, clean: bool) {
        self.phase = Phase::Lingering { clean, until };
        self.send_buf = VecDeque::new();
        self.reasm.release();
        self.drop_log();
        self.transform = None;
        self.prod_reasm = None;
        self.test_ooo.clear();
        self.rto_at = None;
        self.persist_at = None;
        self.ack_pending = false;
        self.ack_at = None;
        self.unacked_segs = 0;
        self.fast_retx_pending = false;
        self.rto_retx_pending = false;
        self.probe_pending = false;
        self.resync_probe = false;
        self.syn_pending = false;
    }

    /// A client packet for a closed session: an aborted session stays closed as long as the
    /// client keeps talking, so mid-stream pickup cannot resurrect it half-way.
    pub(crate) fn touch_lingering(&mut self, now: Instant, cfg: &EngineConfig) {
        if let Phase::Lingering {
            clean: false,
            until,
        } = &mut self.phase
        {
            *until = (*until).max(now + cfg.linger);
        }
    }

    /// What a kernel without the socket (or in TIME-WAIT) answers to late test feedback.
    pub(crate) fn linger_reply(&self, fb: &TestFeedback, ttl: u8) -> Option<SegmentRepr> {
        let Phase::Lingering { clean, .. } = self.phase else {
            return None;
        };
        let f = fb.flags;
        if f.rst() {
            return None;
        }
        let mut r = self.repr(self.snd_max, 0, 0, ttl);
        if clean {
            // TIME-WAIT: the test server repeats its FIN because our last ACK was lost.
            if !f.fin() {
                return None;
            }
            r.flags = TcpFlags(TcpFlags::ACK);
            r.ack = self.rcv_nxt;
            r.options.timestamps = self.ts_on.then_some((self.ts_client, self.ts_recent));
            return Some(r);
        }
        // RFC 793 reset generation: take the sequence number from the segment's ACK, so the
        // RST is exactly in window even if our earlier one was lost or off.
        r.options = TcpOptions::default();
        if f.ack() {
            r.seq = fb.ack_number();
            r.ack = SeqNumber(0);
            r.flags = TcpFlags(TcpFlags::RST);
        } else {
            r.seq = SeqNumber(0);
            r.ack = fb.seq_number() + fb.payload_len + (u32::from(f.syn()) + u32::from(f.fin()));
            r.flags = TcpFlags(TcpFlags::RST | TcpFlags::ACK);
        }
        Some(r)
    }
}

fn emit(
    repr: &SegmentRepr,
    payload: &[u8],
    buf: &mut [u8],
    stats: &mut EngineStats,
) -> Option<usize> {
    match emit_ipv4_tcp(repr, payload, buf) {
        Ok(n) => {
            stats.segments_sent += 1;
            Some(n)
        }
        Err(_) => {
            stats.transmit_buffer_too_small += 1;
            None
        }
    }
}
