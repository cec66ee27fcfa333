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
use common::wire::{emit_ipv4_tcp, seq, SegmentRepr, TcpFlags, TcpOptions, TcpPacket};

use super::ranges::Ranges;
use super::reassembly::{Insert, Reassembly};
use super::recovery::Revival;
use super::rtt::RttEstimator;
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

mod recovery;

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

/// A captured client segment as the reassembly takes it: where it starts in the client's
/// sequence space (after the SYN), its bytes, and whether it ends the stream (a FIN, or a RST
/// taken as one).
#[derive(Clone, Copy)]
struct Segment<'a> {
    start: u32,
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
    pub(crate) client_isn: u32,
    /// The instant of this session's entry in the engine's timer heap, if any.
    pub(crate) heap_at: Option<Instant>,
    /// Whether the session is in the engine's ready queue.
    pub(crate) in_ready: bool,
    /// Lingering after losing only its test-side connection: re-established on the client's
    /// next data (see `engine/recovery.rs`).
    pub(crate) revival: Option<Revival>,
    /// For a session that re-establishes another: that one's quick resets in a row.
    pub(crate) revived_after: Option<u32>,
    /// The client bytes captured while the session waited to be re-established, and while
    /// the session re-establishing it has not reached the test server yet: replayed by the
    /// next one, so a test server's restart costs nothing it can be given later (see
    /// `session/recovery.rs`).
    pub(crate) held: Option<Box<Held>>,

    // --- client stream (client seq space) ---
    reasm: Reassembly,
    /// Picked up from a pure ACK and nothing forwarded yet: the real next client byte may
    /// still turn out to be later (a keepalive probe carries seq = next - 1).
    floating_start: bool,
    /// We saw the client complete its own handshake with production (any ACK after the SYN).
    client_established: bool,
    /// Highest ACK production sent the client: bytes production holds.
    prod_ack: Option<u32>,
    /// The client's FIN was reached in order (and the transform told).
    client_fin_reached: bool,
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
    client_ack: Option<u32>,
    /// The transform gave the session up, and why.
    pub(crate) abandoned: Option<&'static str>,
    /// The transform pushed more than the buffer holds.
    overflowed: bool,
    /// When the transform's timer last ran.
    transform_timer_ran: Option<Instant>,

    // --- our stream toward the test server ---
    iss: u32,
    snd_una: u32,
    snd_nxt: u32,
    snd_max: u32,
    /// Unacknowledged and unsent bytes; `send_buf[0]` has seq `buf_seq`.
    send_buf: VecDeque<u8>,
    buf_seq: u32,
    /// The client's FIN was reached: our FIN goes right after the last byte of `send_buf`.
    fin_queued: bool,
    syn_pending: bool,
    /// An older connection on our 4-tuple that the test server still holds, drained before
    /// our SYN can get through (see `recovery.rs`). Rare: boxed, to keep every session small.
    stale: Option<Box<recovery::Stale>>,
    snd_wnd: u32,
    snd_wl1: u32,
    snd_wl2: u32,
    snd_wscale: u8,
    /// Payload bytes per segment (peer MSS, our MSS, minus options we always carry).
    send_mss: u32,
    dupacks: u32,
    /// NewReno: `snd_max` when fast recovery started; partial ACKs below it retransmit again.
    recover: Option<u32>,
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
    rtt_probe: Option<(u32, Instant)>,
    backoff: u32,
    retries: u32,
    rto_at: Option<Instant>,
    persist_at: Option<Instant>,
    probe_pending: bool,
    /// The pending probe is a resync (see [`Session::resync`]), not a zero-window probe.
    resync_probe: bool,
    probes: u32,

    // --- the test server's stream ---
    irs: u32,
    rcv_nxt: u32,
    test_ooo: Ranges<TEST_HOLES>,
    test_fin_at: Option<u32>,
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
            Start::Pickup => (pkt.seq.wrapping_sub(1), cfg.mss, true, true),
        };
        let iss = client_isn;
        let ts = pkt.options.timestamps;
        let wants_prod = transform.as_ref().is_some_and(|t| t.wants_prod_data());
        Self {
            revival: None,
            revived_after: None,
            held: None,
            client: SocketAddrV4::new(pkt.src, pkt.src_port),
            prod_ip: pkt.dst,
            mirrored,
            target: cfg.target,
            phase: Phase::SynSent,
            client_isn,
            heap_at: None,
            in_ready: false,
            reasm: Reassembly::new(client_isn.wrapping_add(1), cfg.max_session_buffer),
            floating_start: picked_up && pkt.payload.is_empty(),
            client_established: picked_up,
            prod_ack: None,
            client_fin_reached: false,
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
            buf_seq: iss.wrapping_add(1),
            fin_queued: false,
            syn_pending: true,
            stale: None,
            snd_wnd: 0,
            snd_wl1: 0,
            snd_wl2: 0,
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
            irs: 0,
            rcv_nxt: 0,
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
            + self.held.as_ref().map_or(0, |h| h.heap_bytes())
            + self.reasm.heap_bytes()
            + self.prod_reasm.as_ref().map_or(0, Reassembly::heap_bytes)
            + self.transform.as_ref().map_or(0, |t| t.0.memory_len())
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

    fn data_end(&self) -> u32 {
        self.buf_seq.wrapping_add(self.send_buf.len() as u32)
    }

    /// Sequence number just past everything we have to send, FIN included.
    fn stream_end(&self) -> u32 {
        self.data_end().wrapping_add(u32::from(self.fin_queued))
    }

    fn test_fin_received(&self) -> bool {
        self.test_fin_at
            .is_some_and(|f| seq::gt(self.rcv_nxt, f) && self.phase == Phase::Established)
    }

    fn our_fin_acked(&self) -> bool {
        self.fin_queued && self.snd_una == self.stream_end()
    }

    /// The client's whole stream is in and ends here (its FIN, or a reset taken as one).
    pub(crate) fn client_closed(&self) -> bool {
        self.client_fin_reached
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
    fn send_limit(&self) -> u32 {
        self.snd_una.wrapping_add(self.snd_wnd.min(self.cwnd))
    }

    fn note_ts(&mut self, opts: &TcpOptions) {
        if let Some((val, _)) = opts.timestamps {
            if seq::gt(val, self.ts_client) || !self.ts_offer {
                self.ts_client = val;
            }
        }
    }

    // ------------------------------------------------------------------ captured packets

    /// A captured client->prod packet of this session (not a SYN with a new ISN: the engine
    /// handles 4-tuple reuse).
    pub(crate) fn on_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        self.last_activity = now;
        self.note_ts(&pkt.options);
        let f = pkt.flags;
        let mut fin = f.fin();
        if f.rst() {
            // Production would ignore a RST behind the stream; so do we.
            if pkt.seq.wrapping_sub(self.reasm.next()) < 1 << 30 {
                if self.client_fin_reached {
                    // Closing already, with our FIN after the client's whole stream: a reset
                    // after the FIN (a socket closed with unread data) changes nothing there.
                    stats.client_rsts_ignored += 1;
                    return Outcome::Open;
                }
                if pkt.seq == self.reasm.next()
                    && pkt.payload.is_empty()
                    && !self.reasm.has_held()
                    && !self.resync_client
                {
                    // The client reset with its whole stream in our hands: production had
                    // every command before the reset and answered those the client waited
                    // for. Resetting the test server's connection too would throw away what
                    // it has not run yet (a test server behind, issue 20's 1,000-connection
                    // run: "error writing communication packets" and a lost COMMIT); a FIN
                    // after the stream lets it run everything, then close.
                    stats.client_resets_closed_with_fin += 1;
                    fin = true;
                } else {
                    let lost = self.queued_bytes();
                    if lost > 0 {
                        stats.client_resets_with_queued_data += 1;
                        stats.client_reset_bytes_lost += lost as u64;
                    }
                    return Outcome::Finished(CloseReason::ClientReset);
                }
            } else {
                stats.client_rsts_ignored += 1;
                return Outcome::Open;
            }
        }
        if f.ack() && !f.syn() {
            self.client_established = true;
            if self.wants_prod {
                self.client_ack = Some(match self.client_ack {
                    Some(a) => seq::max(a, pkt.ack),
                    None => pkt.ack,
                });
            }
        }
        if pkt.payload.is_empty() && !fin {
            if self.wants_prod {
                if let Some(reason) = self.settle_gaps(now, captured, cfg, stats) {
                    return Outcome::Finished(reason);
                }
            }
            return Outcome::Open;
        }
        let start = if f.syn() {
            pkt.seq.wrapping_add(1)
        } else {
            pkt.seq
        };
        let next = self.reasm.next();
        if self.floating_start
            && self.reasm.pristine()
            && (start == next.wrapping_add(1)
                || (seq::gt(start, next)
                    && start.wrapping_sub(next) < 1 << 30
                    && self.prod_ack.is_some_and(|a| seq::ge(a, start))))
        {
            // Picked up from a keepalive probe (seq = next - 1), or from a pure ACK that the
            // command after it overtook on its way to the tap (each CPU's backlog feeds the
            // veth hops on its own, so a busy host reorders the two): production has every
            // byte before this segment, taken before the capture saw the flow, and none of
            // them can still come. The real stream starts here, not behind a hole.
            self.reasm.rebase(start);
            self.floating_start = false;
        }
        let delivered = if self.resync_client && !self.resync_at(stats, start, pkt.payload) {
            0
        } else {
            let seg = Segment {
                start,
                payload: pkt.payload,
                fin,
            };
            self.take_client_bytes(now, captured, cfg, stats, seg)
        };
        if delivered > 0 {
            self.floating_start = false;
        }
        if let Some(reason) = self.settle_gaps(now, captured, cfg, stats) {
            return Outcome::Finished(reason);
        }
        if self.reasm.fin_done() && !self.client_fin_reached {
            self.client_fin_reached = true;
            // Also bounds a transform that never stops withholding.
            self.close_started.get_or_insert(now);
            self.call_transform(captured, cfg, stats, |t, out| t.on_client_fin(now, out));
        }
        if let Some(reason) = self.settle_stream(cfg) {
            return Outcome::Finished(reason);
        }
        Outcome::Open
    }

    /// The seam (see module doc): reassembles one captured segment and moves the client bytes
    /// now in order into our stream, through the transform if there is one. Returns how many
    /// client bytes came out of the reassembly.
    fn take_client_bytes(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        seg: Segment<'_>,
    ) -> usize {
        let Segment {
            start,
            payload,
            fin,
        } = seg;
        let mut r = Insert::Duplicate;
        let delivered = self.feed_client(now, captured, cfg, stats, |reasm, deliver| {
            r = reasm.insert(start, payload, fin, deliver);
        });
        match r {
            Insert::Accepted { held, trimmed } => {
                stats.client_segments_held += u64::from(held);
                stats.client_bytes_duplicate += trimmed as u64;
            }
            Insert::Duplicate => stats.client_bytes_duplicate += payload.len() as u64,
            Insert::Dropped => stats.client_segments_dropped += 1,
        }
        delivered
    }

    /// Runs `op` on the client reassembly with a sink that moves the bytes it delivers into
    /// our stream (straight, or through the transform); returns how many it delivered.
    fn feed_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        op: impl FnOnce(&mut Reassembly, &mut dyn FnMut(&[u8])),
    ) -> usize {
        let room = self.push_room(cfg);
        let Session {
            reasm,
            send_buf,
            transform,
            fin_queued,
            ..
        } = self;
        let mut delivered = 0usize;
        let result = match transform {
            None => {
                op(reasm, &mut |bytes| {
                    send_buf.extend(bytes);
                    delivered += bytes.len();
                });
                TransformResult {
                    pushed: delivered,
                    ..TransformResult::default()
                }
            }
            Some(t) => {
                let mut out =
                    TransformOutput::bound(send_buf, &mut stats.transform, *fin_queued, room);
                out.set_captured(captured);
                op(reasm, &mut |bytes| {
                    delivered += bytes.len();
                    if !out.is_done() {
                        t.0.on_client_data(now, bytes, &mut out);
                    }
                });
                out.result()
            }
        };
        stats.client_bytes_reassembled += delivered as u64;
        self.apply(result, stats);
        delivered
    }

    /// Runs one transform callback with an output bound to our send buffer and applies what it
    /// asked for. Nothing happens without a transform, or once it gave the session up.
    fn call_transform(
        &mut self,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        call: impl FnOnce(&mut dyn StreamTransform, &mut TransformOutput<'_>),
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let room = self.push_room(cfg);
        let Session {
            transform,
            send_buf,
            fin_queued,
            ..
        } = self;
        let Some(t) = transform else {
            return;
        };
        let mut out = TransformOutput::bound(send_buf, &mut stats.transform, *fin_queued, room);
        out.set_captured(captured);
        call(t.0.as_mut(), &mut out);
        let result = out.result();
        self.apply(result, stats);
    }

    fn apply(&mut self, r: TransformResult, stats: &mut EngineStats) {
        stats.bytes_queued += r.pushed as u64;
        stats.transform_bytes_refused += r.refused as u64;
        self.overflowed |= r.overflowed;
        if let Some(why) = r.abandoned {
            self.abandoned.get_or_insert(why);
        }
    }

    /// After anything that may have changed our stream: whether the session must end, and
    /// our FIN placed once the client closed and the transform holds nothing back (it goes
    /// right after the last byte pushed; nothing may be pushed after it).
    fn settle_stream(&mut self, cfg: &EngineConfig) -> Option<CloseReason> {
        if self.abandoned.is_some() {
            return Some(CloseReason::NotMirrorable);
        }
        if self.overflowed || self.queued_bytes() > cfg.max_session_buffer {
            return Some(CloseReason::BufferOverflow);
        }
        if self.client_fin_reached
            && !self.fin_queued
            && !self.transform.as_ref().is_some_and(|t| t.0.pending())
        {
            self.fin_queued = true;
        }
        None
    }

    /// The session was just created: a picked-up one lets its transform speak first.
    pub(crate) fn on_open(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        picked_up: bool,
    ) -> Outcome {
        if picked_up {
            self.call_transform(captured, cfg, stats, |t, out| t.on_pickup(now, out));
        }
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// Knowledge about the test server that is not a segment (see [`TestEvent`]).
    pub(crate) fn on_test_event(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        ev: &TestEvent<'_>,
    ) -> Outcome {
        if self.draining_stale() && matches!(ev, TestEvent::Mysql(_)) {
            // The older connection's replies: ours cannot begin before it is reset.
            stats.stale_test_events += 1;
            return Outcome::Open;
        }
        self.call_transform(captured, cfg, stats, |t, out| t.on_test_event(now, ev, out));
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// A captured prod->client packet of this session.
    pub(crate) fn on_prod(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        self.last_activity = now;
        if pkt.flags.rst() {
            // The production connection is gone; the client will send nothing more.
            return Outcome::Finished(CloseReason::ProdReset);
        }
        if !pkt.payload.is_empty() {
            // Production only sends data on an established connection (even if the capture
            // missed the client's ACK of the handshake).
            self.client_established = true;
        }
        if pkt.flags.ack() {
            let ack = pkt.ack;
            self.prod_ack = Some(match self.prod_ack {
                Some(a) => seq::max(a, ack),
                None => ack,
            });
        }
        if self.wants_prod {
            self.take_prod_bytes(now, captured, cfg, stats, pkt);
            if let Some(reason) = self.settle_stream(cfg) {
                return Outcome::Finished(reason);
            }
        }
        match self.settle_gaps(now, captured, cfg, stats) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// Production's replies, in order, to the transform.
    fn take_prod_bytes(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let f = pkt.flags;
        let carries = !pkt.payload.is_empty() || f.fin();
        let start = if f.syn() {
            pkt.seq.wrapping_add(1)
        } else {
            pkt.seq
        };
        if self.prod_reasm.is_none() {
            // A pure ACK may be a keepalive probe (seq = next - 1): only a SYN-ACK or a
            // segment with data says where the stream is.
            if !f.syn() && !carries {
                return;
            }
            self.prod_reasm = Some(Reassembly::new(start, cfg.max_session_buffer));
        }
        if !carries {
            return;
        }
        let mut r = Insert::Duplicate;
        self.feed_prod(now, captured, cfg, stats, |reasm, deliver| {
            r = reasm.insert(start, pkt.payload, f.fin(), deliver);
        });
        if r == Insert::Dropped {
            stats.prod_segments_dropped += 1;
        }
    }

    /// Runs `op` on production's reassembly with a sink into the transform.
    fn feed_prod(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        op: impl FnOnce(&mut Reassembly, &mut dyn FnMut(&[u8])),
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let room = self.push_room(cfg);
        let Session {
            prod_reasm: Some(reasm),
            transform: Some(t),
            send_buf,
            fin_queued,
            ..
        } = self
        else {
            return;
        };
        let mut delivered = 0usize;
        let mut out = TransformOutput::bound(send_buf, &mut stats.transform, *fin_queued, room);
        out.set_captured(captured);
        op(reasm, &mut |bytes| {
            delivered += bytes.len();
            if !out.is_done() {
                t.0.on_prod_data(now, bytes, &mut out);
            }
        });
        let result = out.result();
        stats.prod_bytes_reassembled += delivered as u64;
        self.apply(result, stats);
    }

    // ------------------------------------------------------------------ capture gaps

    /// A capture gap costs the commands in it, not the session. Once production's own stream
    /// proves bytes were lost for good, the session goes on from the next client segment that
    /// starts a command (client side), or tells the transform its view of production's replies
    /// has a hole (production side). The proof, client side: production acknowledged the
    /// whole hole, so it has those bytes and the client will never send them again (the
    /// capture sees a client segment before production's ACK of it). Production side: the
    /// client acknowledged them. A hole without proof is only suspected (`update_gap`) and
    /// given `capture_gap_timeout` to heal. A session whose transform cannot go on (no
    /// framing; a login or a command cut in two) ends as `CaptureGap`.
    fn settle_gaps(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<CloseReason> {
        if self.gap_since.is_some_and(|t| now >= t + PROVEN_GAP_GRACE) || self.prod_held_too_long()
        {
            // Each skip goes past one hole, and bytes held beyond it may end at another that
            // production's ACKs prove too: a few rounds, each moving the stream on.
            for _ in 0..GAP_ROUNDS {
                let client = self.client_gap_proven();
                let prod = self.prod_gap_proven();
                if client.is_none() && prod.is_none() {
                    break;
                }
                if let Some(to) = client {
                    if let Some(r) = self.skip_client_gap(now, captured, cfg, stats, to) {
                        return Some(r);
                    }
                }
                if let Some(to) = prod {
                    if let Some(r) = self.skip_prod_gap(now, captured, cfg, stats, to) {
                        return Some(r);
                    }
                }
            }
        }
        self.update_gap(now, captured, stats);
        None
    }

    /// When a suspected gap that is proven will be gone past.
    fn proven_gap_deadline(&self) -> Option<Instant> {
        let since = self.gap_since?;
        (self.client_gap_proven().is_some() || self.prod_gap_proven().is_some())
            .then(|| since + PROVEN_GAP_GRACE)
    }

    /// Where the client stream goes on after a hole production proved lost, if it did.
    fn client_gap_proven(&self) -> Option<u32> {
        let ack = self.prod_ack?;
        if self.floating_start && self.reasm.pristine() {
            return None;
        }
        let end = self.reasm.end();
        if !(seq::gt(ack, end) && ack.wrapping_sub(end) < 1 << 30) {
            return None;
        }
        match self.reasm.first_held_run() {
            Some((held, _)) => seq::ge(ack, held).then_some(held),
            None => Some(ack),
        }
    }

    /// Production's bytes held behind a hole in its stream beyond [`PROD_HOLD_LIMIT`]: the
    /// capture saw production send what follows the hole, and a hole the network made would
    /// have been sent again by now (production retransmits within its RTO, far less than the
    /// time that many bytes take). The hole is the capture's: its replies are given up.
    fn prod_held_too_long(&self) -> bool {
        self.prod_reasm
            .as_ref()
            .is_some_and(|r| r.held_len() > PROD_HOLD_LIMIT)
    }

    fn prod_gap_proven(&self) -> Option<u32> {
        let r = self.prod_reasm.as_ref()?;
        if self.prod_held_too_long() {
            // The client's ACKs that would prove it may come far later in the capture (a
            // copier catching up on its ring meets production's bursts first).
            return r.first_held_run().map(|(held, _)| held);
        }
        let ack = self.client_ack?;
        let end = r.end();
        if !(seq::gt(ack, end) && ack.wrapping_sub(end) < 1 << 30) {
            return None;
        }
        match r.first_held_run() {
            Some((held, _)) => seq::ge(ack, held).then_some(held),
            None => Some(ack),
        }
    }

    /// Gives up the client bytes up to `to`, if the transform can go on after them.
    fn skip_client_gap(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        to: u32,
    ) -> Option<CloseReason> {
        if !self.resync_client {
            if !self.transform_goes_on(captured, cfg, stats, |t, out| t.on_client_gap(now, out)) {
                return Some(CloseReason::CaptureGap);
            }
            stats.capture_gaps_skipped += 1;
            self.resync_client = true;
        }
        stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(to));
        self.resume_client(now, captured, cfg, stats);
        self.settle_stream(cfg)
    }

    /// Asks the transform whether it can go on after a gap (`ask`); a session without one, or
    /// whose transform cannot, counts a fatal gap.
    fn transform_goes_on(
        &mut self,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        ask: impl FnOnce(&mut dyn StreamTransform, &mut TransformOutput<'_>) -> bool,
    ) -> bool {
        let mut can = false;
        self.call_transform(captured, cfg, stats, |t, out| can = ask(t, out));
        if !can {
            stats.capture_gaps_fatal += 1;
        }
        can
    }

    /// While resynchronising: the first held run that starts a command goes on; the runs
    /// before it are given up.
    fn resume_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) {
        while self.resync_client {
            let Some((at, len)) = self.reasm.first_held_run() else {
                return;
            };
            stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(at));
            let mut head = [0u8; 16];
            let n = self.reasm.first_held_prefix(&mut head);
            if self.starts_command(&head[..n]) {
                self.resync_client = false;
                self.feed_client(now, captured, cfg, stats, |reasm, deliver| {
                    reasm.flush(deliver)
                });
            } else {
                stats.capture_gap_segments_skipped += 1;
                stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(at.wrapping_add(len)));
            }
        }
    }

    fn starts_command(&self, head: &[u8]) -> bool {
        self.transform
            .as_ref()
            .is_some_and(|t| t.0.starts_command(head))
    }

    /// A segment captured while resynchronising with nothing held: whether it goes into the
    /// reassembly. One that starts a command does, and the stream goes on at its start; any
    /// other is given up whole (it starts inside a command, so nothing in it can be framed).
    fn resync_at(&mut self, stats: &mut EngineStats, start: u32, payload: &[u8]) -> bool {
        let next = self.reasm.next();
        let end = start.wrapping_add(payload.len() as u32);
        if !payload.is_empty() && !seq::gt(end, next) {
            return true; // all behind: a duplicate, counted as such
        }
        if seq::ge(start, next) && (payload.is_empty() || self.starts_command(payload)) {
            stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(start));
            self.resync_client = false;
            return true;
        }
        stats.capture_gap_segments_skipped += 1;
        stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(end));
        false
    }

    fn skip_prod_gap(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        to: u32,
    ) -> Option<CloseReason> {
        if !self.transform_goes_on(captured, cfg, stats, |t, out| t.on_prod_gap(now, out)) {
            return Some(CloseReason::CaptureGap);
        }
        stats.prod_gaps_skipped += 1;
        self.feed_prod(now, captured, cfg, stats, |reasm, deliver| {
            reasm.skip_to(to);
            reasm.flush(deliver);
        });
        self.settle_stream(cfg)
    }

    /// A suspected gap that did not heal within `capture_gap_timeout`: its bytes are taken as
    /// lost (the client would have retransmitted them by now) and skipped like a proven gap.
    fn gap_timed_out(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<CloseReason> {
        self.gap_since = None;
        if let Some((at, _)) = self.reasm.first_held_run() {
            if let Some(r) = self.skip_client_gap(now, None, cfg, stats, at) {
                return Some(r);
            }
        }
        let prod_to = self.prod_reasm.as_ref().and_then(|r| {
            r.first_held_run().map(|(at, _)| at).or(self
                .client_ack
                .filter(|&a| seq::gt(a, r.end()) && a.wrapping_sub(r.end()) < 1 << 30))
        });
        if let Some(to) = prod_to {
            if let Some(r) = self.skip_prod_gap(now, None, cfg, stats, to) {
                return Some(r);
            }
        }
        // Production acknowledged bytes never captured, and nothing came after them.
        if let Some(to) = self.client_gap_proven() {
            if let Some(r) = self.skip_client_gap(now, None, cfg, stats, to) {
                return Some(r);
            }
        }
        self.update_gap(now, None, stats);
        None
    }

    /// A gap exists while client bytes are held beyond a hole, or production acknowledged
    /// client bytes we never captured; and, when a transform reads production's replies, the
    /// same in that direction (the transform would silently miss a reply).
    fn update_gap(&mut self, now: Instant, captured: Option<Instant>, stats: &mut EngineStats) {
        let end = self.reasm.end();
        // While a pickup from a pure ACK has not seen its first byte, production being ahead
        // proves nothing: that ACK may have been a keepalive probe (seq = next - 1).
        let unsure_start = self.floating_start && self.reasm.pristine();
        let prod_ahead = !unsure_start
            && self
                .prod_ack
                .is_some_and(|a| seq::gt(a, end) && a.wrapping_sub(end) < 1 << 30);
        let prod_gap = self.prod_reasm.as_ref().is_some_and(|r| {
            let end = r.end();
            r.has_held()
                || self
                    .client_ack
                    .is_some_and(|a| seq::gt(a, end) && a.wrapping_sub(end) < 1 << 30)
        });
        if self.reasm.has_held() || prod_ahead || prod_gap {
            if self.gap_since.is_none() {
                // Dated by the capture when it says: a copier catching up on a backlog of
                // its ring handles a second of traffic in a fraction of one, and a gap must
                // not hold that second beyond its hole waiting out a grace measured in the
                // copier's own time (three sessions of eight were shed for memory so).
                self.gap_since = Some(captured.map_or(now, |c| c.min(now)));
                stats.capture_gaps_suspected += 1;
            }
        } else {
            self.gap_since = None;
        }
    }

    // ------------------------------------------------------------------ feedback

    pub(crate) fn on_feedback(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let was_established = self.phase == Phase::Established;
        let rcv_before = self.rcv_nxt;
        let out = match self.phase {
            Phase::SynSent => self.feedback_syn_sent(now, cfg, stats, fb),
            Phase::Established => self.feedback_established(now, cfg, stats, fb),
            Phase::Lingering { .. } => Outcome::Open,
        };
        if self.transform.is_none() || matches!(out, Outcome::Finished(_)) {
            return out;
        }
        // The TCP view above decides what is new: the transform must not take a duplicate
        // greeting for a second one.
        let in_order = was_established
            && fb.payload_len > 0
            && fb.seq == rcv_before
            && seq::gt(self.rcv_nxt, rcv_before);
        let ev = TestEvent::Segment(TestSegment::new(fb, in_order));
        self.call_transform(None, cfg, stats, |t, o| t.on_test_event(now, &ev, o));
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    fn feedback_syn_sent(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let f = fb.flags;
        let syn_acked = f.ack() && fb.ack == self.iss.wrapping_add(1) && self.snd_max != self.iss;
        if f.rst() {
            if syn_acked {
                return Outcome::Finished(CloseReason::TestRefused);
            }
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if !(f.syn() && syn_acked) {
            if f.ack() && seq::gt(fb.ack, self.snd_max) {
                stats.feedback_ack_beyond_sent += 1;
            } else {
                stats.feedback_stale += 1;
            }
            return Outcome::Open;
        }
        self.last_activity = now;
        self.phase = Phase::Established;
        self.irs = fb.seq;
        self.rcv_nxt = fb.seq.wrapping_add(1);
        self.snd_una = self.iss.wrapping_add(1);
        self.snd_nxt = self.snd_una;
        self.snd_max = seq::max(self.snd_max, self.snd_una);
        if let Some((sent_ack, at)) = self.rtt_probe.take() {
            if sent_ack == self.snd_una {
                self.rtt.sample(now - at, cfg.min_rto, cfg.max_rto);
            }
        }
        self.rto_at = None;
        self.retries = 0;
        self.backoff = 0;
        let peer_mss = fb.options.mss.unwrap_or(DEFAULT_MSS).max(MIN_MSS);
        let mut mss = peer_mss.min(cfg.mss);
        // Window scaling is on only if both SYNs carried the option.
        if let (true, Some(ws)) = (self.offer_wscale, fb.options.window_scale) {
            self.snd_wscale = ws.min(MAX_WSCALE);
            self.rcv_wscale = OUR_WSCALE;
        }
        if let (true, Some((val, _))) = (self.ts_offer, fb.options.timestamps) {
            self.ts_on = true;
            self.ts_recent = val;
            mss -= TS_OPTION_LEN;
        }
        self.send_mss = u32::from(mss);
        // The window in a SYN is never scaled.
        self.snd_wnd = u32::from(fb.window);
        self.snd_wl1 = fb.seq;
        self.snd_wl2 = fb.ack;
        self.ack_pending = true;
        Outcome::Open
    }

    fn feedback_established(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let f = fb.flags;
        // Untrusted input: a payload can never exceed an IP packet; a bigger claim would let
        // one message jump rcv_nxt arbitrarily.
        if fb.payload_len > u32::from(u16::MAX) {
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if f.rst() {
            let off = fb.seq.wrapping_sub(self.rcv_nxt);
            if off < self.rcv_window() {
                return Outcome::Finished(CloseReason::TestReset);
            }
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if f.syn() {
            // A repeated SYN-ACK means our ACK of it was lost; anything else is answered the
            // way RFC 5961 answers an unexpected SYN: with an ACK.
            if fb.seq != self.irs {
                stats.feedback_stale += 1;
            }
            self.ack_pending = true;
            return Outcome::Open;
        }
        if !f.ack() {
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if seq::gt(fb.ack, self.snd_max) {
            stats.feedback_ack_beyond_sent += 1;
            self.ack_pending = true;
            return Outcome::Open;
        }
        self.last_activity = now;
        self.probes = 0;
        if let (true, Some((val, _))) = (self.ts_on, fb.options.timestamps) {
            if seq::gt(val, self.ts_recent) {
                self.ts_recent = val;
            }
        }
        self.process_ack(now, cfg, stats, fb);
        self.process_test_segment(now, cfg, stats, fb);
        Outcome::Open
    }

    fn process_ack(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) {
        let ack = fb.ack;
        if seq::lt(ack, self.snd_una) {
            return; // old duplicate: ignore for sending purposes
        }
        let new_wnd = u32::from(fb.window) << self.snd_wscale;
        let wnd_changed = new_wnd != self.snd_wnd;
        // RFC 793 window update rule: only a segment at least as new as the last one that
        // updated the window may change it, so reordered feedback cannot shrink it.
        if seq::lt(self.snd_wl1, fb.seq) || (self.snd_wl1 == fb.seq && seq::le(self.snd_wl2, ack)) {
            if self.snd_wnd == 0 && new_wnd > 0 {
                // The window reopened: the persist backoff says nothing about the path.
                self.backoff = 0;
            }
            self.snd_wnd = new_wnd;
            self.snd_wl1 = fb.seq;
            self.snd_wl2 = ack;
        }
        if ack == self.snd_una {
            let dup = fb.payload_len == 0
                && !fb.flags.fin()
                && self.snd_max != self.snd_una
                && !wnd_changed;
            if dup {
                self.dupacks += 1;
                if self.dupacks == 3 && self.recover.is_none() {
                    stats.fast_retransmits += 1;
                    self.fast_retx_pending = true;
                    self.recover = Some(self.snd_max);
                    self.rtt_probe = None;
                }
            }
            return;
        }
        // New data acknowledged.
        let acked = ack.wrapping_sub(self.snd_una);
        let data_acked = if seq::gt(ack, self.data_end()) {
            self.data_end().wrapping_sub(self.buf_seq)
        } else {
            ack.wrapping_sub(self.buf_seq)
        } as usize;
        self.send_buf.drain(..data_acked.min(self.send_buf.len()));
        if self.send_buf.is_empty() && self.send_buf.capacity() > SHRINK_ABOVE {
            // One burst (LOAD DATA, a big blob) must not pin megabytes for the session's life.
            self.send_buf.shrink_to(SHRINK_ABOVE / 4);
        }
        self.buf_seq = self.buf_seq.wrapping_add(data_acked as u32);
        self.snd_una = ack;
        if seq::lt(self.snd_nxt, ack) {
            self.snd_nxt = ack;
        }
        if let Some((probe_ack, at)) = self.rtt_probe {
            if seq::ge(ack, probe_ack) {
                self.rtt.sample(now - at, cfg.min_rto, cfg.max_rto);
                self.rtt_probe = None;
            }
        }
        self.backoff = 0;
        self.retries = 0;
        self.dupacks = 0;
        if let Some(r) = self.recover {
            if seq::lt(ack, r) {
                // NewReno partial ACK: the next hole is lost too.
                self.fast_retx_pending = true;
            } else {
                self.recover = None;
            }
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked.min(self.send_mss));
            if self.cwnd >= self.ssthresh {
                self.cwnd = u32::MAX;
            }
        }
        self.rto_at = (self.snd_una != self.snd_max).then(|| now + self.current_rto(cfg));
    }

    fn process_test_segment(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) {
        let fin = fb.flags.fin();
        let seg_len = fb.payload_len + u32::from(fin);
        if seg_len == 0 {
            // A keepalive probe (seq = rcv_nxt - 1) wants an ACK; other pure ACKs do not.
            if fb.seq == self.rcv_nxt.wrapping_sub(1) {
                self.ack_pending = true;
            }
            return;
        }
        // Everything but the plain in-order case below is acknowledged at once: a repeat
        // says our ACK was lost, a segment past a hole asks for the hole (duplicate ACK).
        let owed = self.ack_pending;
        self.ack_pending = true;
        let end = fb.seq.wrapping_add(seg_len);
        let wnd = self.rcv_window();
        if seq::le(end, self.rcv_nxt) {
            stats.feedback_test_retransmits += 1;
            return;
        }
        if end.wrapping_sub(self.rcv_nxt) > wnd {
            stats.feedback_stale += 1;
            return;
        }
        if fin && self.test_fin_at.is_none() {
            self.test_fin_at = Some(end.wrapping_sub(1));
        }
        if seq::le(fb.seq, self.rcv_nxt) {
            // In order. It may wait for a delayed ACK unless it is the second unacknowledged
            // one, closes the stream, fills a hole (the test server is waiting to learn),
            // or we are closing ourselves (the last ACKs must not hang on a timer).
            let plain = !fin
                && self.test_ooo.is_empty()
                && !self.fin_queued
                && self.close_started.is_none();
            if plain && !cfg.delayed_ack.is_zero() && self.unacked_segs == 0 {
                self.ack_pending = owed;
                self.unacked_segs = 1;
                self.ack_at.get_or_insert(now + cfg.delayed_ack);
            }
            let advance = end.wrapping_sub(self.rcv_nxt);
            self.rcv_nxt = end;
            self.test_ooo.shift(advance);
            while let Some((0, run)) = self.test_ooo.first() {
                self.rcv_nxt = self.rcv_nxt.wrapping_add(run);
                self.test_ooo.shift(run);
            }
        } else {
            // We never see the test server's bytes, only that it sent them; acknowledging past
            // a hole would tell it the hole arrived and intercept would never see those bytes.
            // So remember the range, send a duplicate ACK, and let it retransmit the hole.
            stats.feedback_out_of_order += 1;
            let rel = fb.seq.wrapping_sub(self.rcv_nxt);
            self.test_ooo.insert(rel, rel + seg_len);
        }
        if let Some(f) = self.test_fin_at {
            // Nothing the test server sends lies beyond its FIN.
            if seq::gt(self.rcv_nxt, f.wrapping_add(1)) {
                self.rcv_nxt = f.wrapping_add(1);
            }
        }
        if self.test_fin_received() {
            self.close_started.get_or_insert(now);
        }
    }

    // ------------------------------------------------------------------ timers

    pub(crate) fn next_deadline(&self, cfg: &EngineConfig) -> Option<Instant> {
        if let Phase::Lingering { until, .. } = self.phase {
            return Some(until);
        }
        // A plain chain of minimums: this runs several times per packet (settle, schedule,
        // poll_transmit), and the iterator over an array of options it replaces cost a tenth
        // of the engine's instructions.
        fn earlier(a: Instant, b: Option<Instant>) -> Instant {
            match b {
                Some(b) if b < a => b,
                _ => a,
            }
        }
        let mut at = self.last_activity + cfg.idle_timeout;
        if self.phase == Phase::SynSent || !self.client_established {
            at = earlier(at, Some(self.created + cfg.handshake_timeout));
        }
        at = earlier(at, self.close_started.map(|t| t + cfg.close_timeout));
        at = earlier(at, self.gap_since.map(|t| t + cfg.capture_gap_timeout));
        if self.gap_since.is_some() {
            at = earlier(at, self.proven_gap_deadline());
        }
        at = earlier(at, self.rto_at);
        at = earlier(at, self.stale_deadline());
        at = earlier(at, self.persist_at);
        at = earlier(at, self.ack_at);
        if self.transform.is_some() {
            at = earlier(at, self.transform_deadline());
        }
        Some(at)
    }

    /// The transform's deadline. One left at or before the last run is retried a little
    /// later, not at once: a transform bug must not make the engine (or its driver) spin.
    fn transform_deadline(&self) -> Option<Instant> {
        let d = self.transform.as_ref()?.0.next_deadline()?;
        Some(match self.transform_timer_ran {
            Some(ran) if d <= ran => ran + TRANSFORM_RETRY,
            _ => d,
        })
    }

    pub(crate) fn on_timeout(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Outcome {
        if self.is_lingering() {
            return Outcome::Open;
        }
        // A timer is no captured packet: what the last one left here is stale (a gap first
        // suspected now would be dated back to it, and a transform told so).
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if (self.phase == Phase::SynSent || !self.client_established)
            && self.created + cfg.handshake_timeout <= now
        {
            return Outcome::Finished(CloseReason::HandshakeTimeout);
        }
        if self.last_activity + cfg.idle_timeout <= now {
            return Outcome::Finished(CloseReason::IdleTimeout);
        }
        if due(self.close_started.map(|t| t + cfg.close_timeout)) {
            return Outcome::Finished(CloseReason::CloseTimeout);
        }
        if due(self.proven_gap_deadline()) {
            if let Some(reason) = self.settle_gaps(now, None, cfg, stats) {
                return Outcome::Finished(reason);
            }
            if due(self.proven_gap_deadline()) {
                // Still proven and due: nothing could be skipped. Ending the session is the
                // only way that cannot leave a timer in the past for the engine to spin on.
                stats.capture_gaps_fatal += 1;
                stats.capture_gaps_stuck += 1;
                return Outcome::Finished(CloseReason::CaptureGap);
            }
        }
        if due(self.gap_since.map(|t| t + cfg.capture_gap_timeout)) {
            if let Some(reason) = self.gap_timed_out(now, cfg, stats) {
                return Outcome::Finished(reason);
            }
        }
        if due(self.transform_deadline()) {
            self.transform_timer_ran = Some(now);
            self.call_transform(None, cfg, stats, |t, out| t.on_timeout(now, out));
            if let Some(reason) = self.settle_stream(cfg) {
                return Outcome::Finished(reason);
            }
        }
        if due(self.rto_at) {
            self.rto_at = None;
            if self.snd_una != self.snd_max {
                stats.retransmit_timeouts += 1;
                self.retries += 1;
                if self.retries > cfg.max_retransmits {
                    return Outcome::Finished(CloseReason::TooManyRetransmits);
                }
                self.backoff += 1;
                self.rtt_probe = None;
                match self.phase {
                    Phase::SynSent => self.syn_pending = true,
                    _ => {
                        // Go back: everything unacknowledged is sent again, starting with
                        // the oldest, from one segment and slow start (the loss may be the
                        // test server drowning).
                        let flight = self.snd_max.wrapping_sub(self.snd_una);
                        self.ssthresh = (flight / 2).max(2 * self.send_mss);
                        self.cwnd = self.send_mss;
                        self.snd_nxt = self.snd_una;
                        self.recover = None;
                        self.fast_retx_pending = false;
                        self.rto_retx_pending = true;
                        self.dupacks = 0;
                    }
                }
            }
        }
        if due(self.ack_at) {
            // No segment of ours carried it in time: a pure ACK.
            self.ack_at = None;
            self.ack_pending = true;
        }
        if due(self.persist_at) {
            self.persist_at = None;
            self.probes += 1;
            if self.probes > cfg.max_retransmits {
                return Outcome::Finished(CloseReason::TooManyRetransmits);
            }
            self.backoff += 1;
            self.probe_pending = true;
        }
        Outcome::Open
    }

    /// The feedback path is back after an outage (intercept stalled, restarted or away):
    /// whatever this session sent meanwhile was very likely received and acknowledged by the
    /// test server, only the ACKs died with nobody capturing them. Its timers, backed off
    /// through the outage, would leave it silent for as long again (seconds, up to
    /// `max_rto`), so a session waiting on the test server forgets the backoff and the
    /// retries the outage cost it, and sends at once what makes the test server restate its
    /// ACK and window: a probe below `snd_una` (answered with an ACK by any TCP), or its
    /// SYN again. What the test server really lacks is then retransmitted one plain RTO
    /// later. Returns whether the session was waiting.
    pub(crate) fn resync(&mut self, now: Instant, cfg: &EngineConfig) -> bool {
        let waiting = match self.phase {
            Phase::SynSent => self.rto_at.is_some() && self.snd_max != self.iss,
            Phase::Established => self.snd_una != self.snd_max || self.persist_at.is_some(),
            Phase::Lingering { .. } => false,
        };
        if !waiting || self.backoff == 0 {
            return false;
        }
        self.backoff = 0;
        self.retries = 0;
        self.probes = 0;
        self.rtt_probe = None;
        match self.phase {
            Phase::SynSent => {
                self.syn_pending = true;
                self.rto_at = None;
            }
            _ => {
                self.probe_pending = true;
                self.resync_probe = true;
                self.persist_at = None;
                self.rto_at = (self.snd_una != self.snd_max).then(|| now + self.current_rto(cfg));
            }
        }
        true
    }

    /// Arms or disarms the persist timer; called after every change.
    pub(crate) fn refresh_timers(&mut self, now: Instant, cfg: &EngineConfig) {
        if self.phase != Phase::Established {
            self.persist_at = None;
            return;
        }
        if self.snd_una == self.snd_max {
            self.rto_at = None;
            self.rto_retx_pending = false;
        } else if self.rto_at.is_none() {
            // Whatever happened, data in flight always has a retransmission timer.
            self.rto_at = Some(now + self.current_rto(cfg));
        }
        let window_shut = self.snd_una == self.snd_max
            && seq::lt(self.snd_nxt, self.stream_end())
            && !seq::lt(self.snd_nxt, self.send_limit());
        if window_shut && !self.probe_pending {
            if self.persist_at.is_none() {
                self.persist_at = Some(now + self.current_rto(cfg));
            }
        } else {
            self.persist_at = None;
        }
    }

    /// Whether `poll_segment` may have something to send (cheap; may say yes spuriously).
    pub(crate) fn may_transmit(&self) -> bool {
        match self.phase {
            Phase::SynSent => self.syn_pending,
            Phase::Established => {
                self.ack_pending
                    || self.fast_retx_pending
                    || self.rto_retx_pending
                    || self.probe_pending
                    || (seq::lt(self.snd_nxt, self.stream_end())
                        && seq::lt(self.snd_nxt, self.send_limit()))
            }
            Phase::Lingering { .. } => false,
        }
    }

    // ------------------------------------------------------------------ sending

    fn repr(&self, seq: u32, flags: u8, ip_id: u16, ttl: u8) -> SegmentRepr {
        let mut options = TcpOptions::default();
        let mut flags = flags;
        let mut ack = 0;
        if self.phase == Phase::SynSent {
            options.mss = Some(self.adv_mss);
            options.window_scale = self.offer_wscale.then_some(OUR_WSCALE);
            // Never SACK-permitted: intercept relays no SACK blocks and we retransmit from
            // cumulative ACKs only; and as a receiver we could not produce honest SACK blocks
            // for a stream whose bytes we never see. Without the option neither side uses SACK.
            options.sack_permitted = false;
            options.timestamps = self.ts_offer.then_some((self.ts_client, 0));
        } else {
            flags |= TcpFlags::ACK;
            ack = self.rcv_nxt;
            options.timestamps = self.ts_on.then_some((self.ts_client, self.ts_recent));
        }
        SegmentRepr {
            src: *self.mirrored.ip(),
            dst: *self.target.ip(),
            src_port: self.mirrored.port(),
            dst_port: self.target.port(),
            seq,
            ack,
            flags: TcpFlags(flags),
            window: OUR_WINDOW,
            options,
            ip_id,
            ttl,
        }
    }

    /// Length and FIN of the segment starting at `start` that fits before `limit`.
    fn plan_data(&self, start: u32, limit: u32, max_payload: usize) -> (u32, bool) {
        let data_end = self.data_end();
        let avail = if seq::lt(start, data_end) {
            data_end.wrapping_sub(start)
        } else {
            0
        };
        let room = if seq::lt(start, limit) {
            limit.wrapping_sub(start)
        } else {
            0
        };
        let len = avail
            .min(room)
            .min(self.send_mss)
            .min(u32::try_from(max_payload).unwrap_or(u32::MAX));
        // The FIN takes one sequence number and, like data, must fit the window.
        let fin = self.fin_queued && start.wrapping_add(len) == data_end && room > len;
        (len, fin)
    }

    /// Writes this session's next packet into `buf`, if it has one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn poll_segment(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
    ) -> Option<usize> {
        match self.phase {
            Phase::SynSent => {
                if !self.syn_pending {
                    return None;
                }
                let repr = self.repr(self.iss, TcpFlags::SYN, ip_id, cfg.ttl);
                let n = emit(&repr, &[], buf, stats)?;
                self.syn_pending = false;
                if self.snd_max == self.iss {
                    self.rtt_probe = Some((self.iss.wrapping_add(1), now));
                } else {
                    stats.segments_resent += 1;
                }
                self.snd_nxt = self.iss.wrapping_add(1);
                self.snd_max = self.snd_nxt;
                self.rto_at.get_or_insert(now + self.current_rto(cfg));
                Some(n)
            }
            Phase::Established => self.poll_established(now, cfg, stats, scratch, buf, ip_id),
            Phase::Lingering { .. } => None,
        }
    }

    fn poll_established(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
    ) -> Option<usize> {
        let header = self.repr(0, 0, 0, 0).header_len();
        let Some(max_payload) = buf.len().checked_sub(header) else {
            stats.transmit_buffer_too_small += 1;
            return None;
        };
        let fast = self.fast_retx_pending;
        let (start, limit) = if fast {
            (self.snd_una, self.snd_max)
        } else if self.rto_retx_pending && self.snd_nxt == self.snd_una {
            let head = self
                .snd_una
                .wrapping_add(self.send_mss.min(self.snd_max.wrapping_sub(self.snd_una)));
            (self.snd_nxt, seq::max(self.send_limit(), head))
        } else {
            (self.snd_nxt, self.send_limit())
        };
        let (len, fin) = if fast || seq::lt(self.snd_nxt, self.stream_end()) {
            self.plan_data(start, limit, max_payload)
        } else {
            (0, false)
        };
        if len > 0 || fin {
            let n = self.emit_data(start, len, fin, scratch, buf, ip_id, cfg, stats)?;
            let end = start.wrapping_add(len + u32::from(fin));
            if seq::lt(start, self.snd_max) {
                stats.segments_resent += 1;
                let resent_end = if seq::lt(end, self.snd_max) {
                    end
                } else {
                    self.snd_max
                };
                stats.bytes_resent += u64::from(resent_end.wrapping_sub(start).min(len));
                self.rtt_probe = None;
            } else if self.rtt_probe.is_none() {
                self.rtt_probe = Some((end, now));
            }
            if seq::gt(end, self.snd_max) {
                let from = seq::max(start, self.snd_max);
                stats.bytes_sent += u64::from(end.wrapping_sub(from) - u32::from(fin));
                self.snd_max = end;
            }
            if fast {
                self.fast_retx_pending = false;
            } else {
                self.snd_nxt = end;
                self.rto_retx_pending = false;
            }
            self.acked_all();
            self.rto_at.get_or_insert(now + self.current_rto(cfg));
            return Some(n);
        }
        if fast {
            // Nothing left to repeat (acknowledged meanwhile).
            self.fast_retx_pending = false;
        }
        self.rto_retx_pending = false;
        if self.probe_pending {
            // Linux-style window probe: an already-acknowledged sequence number with no data
            // is always answered with an ACK carrying the current window.
            let repr = self.repr(self.snd_una.wrapping_sub(1), 0, ip_id, cfg.ttl);
            let n = emit(&repr, &[], buf, stats)?;
            self.probe_pending = false;
            self.acked_all();
            // A resync's probe is counted as the resync (by the engine), not as a window probe.
            if !std::mem::take(&mut self.resync_probe) {
                stats.zero_window_probes += 1;
            }
            self.refresh_timers(now, cfg);
            return Some(n);
        }
        if self.ack_pending {
            let repr = self.repr(self.acceptable_seq(), 0, ip_id, cfg.ttl);
            let n = emit(&repr, &[], buf, stats)?;
            self.acked_all();
            stats.pure_acks_sent += 1;
            return Some(n);
        }
        None
    }

    /// The sequence number a pure ACK carries: `snd_nxt`, but never beyond the right edge of
    /// the test server's window (Linux's `tcp_acceptable_seq`). A retransmission that went out
    /// into a shut window (see `rto_retx_pending`) leaves `snd_nxt` beyond it, and a receiver
    /// drops a segment that starts beyond its window whole, its ACK unread (Linux 6.x counts
    /// it in `TCPBeyondWindow`). Every ACK of ours would then be ignored while the test server
    /// waits for them with its window shut: a deadlock, seen after intercept stalls, when the
    /// test server's replies to a backlog fill its send buffer.
    fn acceptable_seq(&self) -> u32 {
        let edge = self.snd_una.wrapping_add(self.snd_wnd);
        if seq::gt(self.snd_nxt, edge) {
            edge
        } else {
            self.snd_nxt
        }
    }

    /// A segment carrying ACK = `rcv_nxt` left: nothing is owed any more.
    fn acked_all(&mut self) {
        self.ack_pending = false;
        self.ack_at = None;
        self.unacked_segs = 0;
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_data(
        &self,
        start: u32,
        len: u32,
        fin: bool,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<usize> {
        let off = start.wrapping_sub(self.buf_seq) as usize;
        let len = len as usize;
        let (a, b) = self.send_buf.as_slices();
        let payload: &[u8] = if off + len <= a.len() {
            &a[off..off + len]
        } else if off >= a.len() {
            &b[off - a.len()..off - a.len() + len]
        } else {
            // Wrapped ring: copy into the engine's scratch buffer (pre-sized, no allocation).
            let first = &a[off..];
            let rest = len - first.len();
            scratch[..first.len()].copy_from_slice(first);
            scratch[first.len()..len].copy_from_slice(&b[..rest]);
            &scratch[..len]
        };
        let mut flags = 0;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if len > 0 && start.wrapping_add(len as u32) == self.data_end() {
            flags |= TcpFlags::PSH;
        }
        let repr = self.repr(start, flags, ip_id, cfg.ttl);
        emit(&repr, payload, buf, stats)
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
            r.ack = 0;
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
            r.seq = fb.ack;
            r.ack = 0;
            r.flags = TcpFlags(TcpFlags::RST);
        } else {
            r.seq = 0;
            r.ack = fb
                .seq
                .wrapping_add(fb.payload_len)
                .wrapping_add(u32::from(f.syn()) + u32::from(f.fin()));
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
