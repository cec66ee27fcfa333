//! The sans-IO session engine: the client side of every mirrored TCP connection.
//!
//! # What this room is for
//!
//! The copier captures client<->production traffic and replays each client connection toward
//! the test server as if it were the client. This module holds all of the TCP logic that makes
//! that replay faithful: handshake (same ISN, options derived from the client's), re-basing
//! every ACK on the test server's own stream as relayed by intercept, our own ACKs,
//! retransmission (RFC 6298 RTO with Karn's rule, fast retransmit/NewReno), the test server's
//! window (with zero-window probes), FIN/RST in both directions, timeouts, mid-stream pickup
//! and client-address pooling. It also offers one seam where a protocol layer may change the
//! bytes a session sends ([`StreamTransform`], see `transform.rs`), without the TCP machinery
//! knowing any protocol.
//!
//! # What it must never do
//!
//! * No sockets, threads, clocks, logging or randomness: it is fed events and asked for
//!   actions, so every behaviour is reproducible in a unit test with a fake clock.
//! * Never panic and never grow without bound on any input: captured packets and feedback are
//!   untrusted. Bad input is counted in [`EngineStats`] and skipped.
//! * Never wait for the client's pace: a captured byte is sent as soon as the test server's
//!   window allows (the C tcpcopy holds each request for a client round trip and falls
//!   behind; we must not).
//! * Never emit anything but packets toward the configured target.
//! * Never know a protocol: MySQL (or any other) logic lives in a transform, outside.
//!
//! # Driving it (the I/O edges)
//!
//! ```text
//! loop {
//!     engine.on_captured(now, &pkt)      // every captured packet of the production port
//!     engine.on_feedback(now, &fb)       // every TestFeedback relayed by intercept
//!     engine.on_test_event(now, addr, &ev) // other relayed knowledge, for transforms
//!     engine.on_timeout(now)             // whenever now >= the last next_deadline()
//!     while let Some(n) = engine.poll_transmit(now, &mut buf) { raw_send(&buf[..n]) }
//!     while let Some(ev) = engine.poll_event() { tell_intercept(ev) }
//!     sleep_until(engine.next_deadline())   // or until more input arrives
//! }
//! ```
//!
//! * Drain `poll_transmit` after every batch of input and after `on_timeout`: timers (RTO)
//!   are armed when a segment is handed out, so `next_deadline` is only meaningful after the
//!   drain. Each call returns one complete IPv4 packet (checksums done) to send as is.
//! * `buf` must hold [`Engine::transmit_buffer_len`] bytes (`mss + 60`); with a smaller one
//!   the packet is not produced (counted in `transmit_buffer_too_small`; the session keeps its
//!   state and tries again on its next event or timer).
//! * Drain `poll_event` as well: [`EngineEvent::SessionOpened`] must reach intercept before the
//!   test server's SYN-ACK can be relayed, and [`EngineEvent::SessionReleased`] says when it
//!   may forget an address.
//! * `next_deadline` may be earlier than strictly needed (stale timer entries are discarded
//!   lazily); calling `on_timeout` early is cheap and harmless.
//! * The capture should exclude the target's own traffic; packets to/from the target are
//!   ignored here anyway (`captured_target`) so the mirror never feeds on itself.
//! * Sessions are independent; an edge with several capture threads runs one engine per
//!   thread and must route both directions of a connection and its feedback to the same
//!   engine. The client port is the one field they all share (the mirrored address keeps it,
//!   pool or not), so shard by it.
//! * `shutdown` is for the very end: it RSTs and forgets every session; drain
//!   `poll_transmit` once more afterwards.

//!
//! # Design in brief
//!
//! * **Streams.** Captured client segments are reassembled in the client's sequence space
//!   (trim duplicates, hold out-of-order bytes, bounded); in-order bytes move once into a
//!   per-session `VecDeque<u8>` in *our* sequence space, from which segments of at most the
//!   effective MSS are cut (so GRO super-segments are split naturally) and retransmitted until
//!   acknowledged. Without a transform the two streams are the same bytes (our ISN is the
//!   client's, so the numbers coincide too); with one, the send buffer holds whatever the
//!   transform pushed, and no number is ever mapped between the spaces: reassembly and
//!   capture gaps stay in the client's, sending, ACKs and FIN in ours.
//! * **Transforms.** One per session from the engine's [`TransformFactory`] (default: none).
//!   It sees in-order client bytes, production's in-order replies if it asks (a second,
//!   bounded reassembly), relayed test-server knowledge and its own timer; its pushes count
//!   against `max_session_buffer`, our FIN waits while it is `pending`, and it may abandon
//!   the session (`CloseReason::NotMirrorable`).
//! * **ACKs.** The test server's bytes die at the assist host; we only see headers. We ACK the
//!   highest *contiguous* end we have seen (remembering a few out-of-order ranges), never past
//!   a hole, so lost feedback makes the test server retransmit rather than skip bytes.
//!   Plain in-order data is acknowledged like a delayed-ACK receiver does
//!   ([`EngineConfig::delayed_ack`]): every second segment at once, otherwise on our next
//!   segment (the client's next command) or a short timer; in the lab each pure ACK we spare
//!   is a veth, bridge and test-host TCP input run the copier no longer pays for.
//! * **Timers.** Each session has one earliest deadline (RTO, persist, handshake, idle, close,
//!   capture gap, linger); the engine keeps them in a binary heap with lazy invalidation.
//! * **Sessions** live in a slab with generation-checked ids, indexed by captured flow and by
//!   mirrored address; sessions with something to send wait in a round-robin ready queue.

mod budget;
mod fleet;
mod flowhash;
mod input;
mod orphans;
mod pool;
mod ranges;
mod reassembly;
mod recovery;
mod rtt;
mod sample;
mod serial;
mod session;
mod stats;
mod transform;

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod delayed_ack_tests;
#[cfg(test)]
mod gap_tests;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod resync_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
#[cfg(test)]
mod transform_tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use crate::observation::Observation;
use common::clock::Instant;
use common::control::TestFeedback;
use common::wire::{emit_ipv4_tcp, SegmentRepr, TcpPacket};

pub use budget::{MemoryBudget, SESSION_FIXED_BYTES};
pub use fleet::{Fleet, FleetError};
use flowhash::FlowHash;
use pool::AddressPool;
pub use recovery::lost_test_answers;
pub use sample::Sample;
use sample::{Sampler, Verdict};
use session::{AckMarks, Held, Outcome, PlainAt, Session, Start};
pub use stats::EngineStats;

/// A piece of a TLS session's plaintext, as production's TLS library read it (the client's
/// direction) or wrote it (production's), numbered by the probe that saw it.
#[derive(Clone, Copy, Debug)]
pub struct Plaintext<'a> {
    /// The client's address, as production sees it.
    pub client: SocketAddrV4,
    /// Production's address and port.
    pub server: SocketAddrV4,
    pub from_client: bool,
    /// Bytes of this direction of the session before `data` (those the probe lost included).
    pub offset: u64,
    pub data: &'a [u8],
}
pub use transform::{
    Identity, IdentityFactory, SessionInfo, StreamTransform, TestEvent, TestSegment,
    TransformFactory, TransformOutput, TransformStats, TRANSFORM_COUNTERS,
};

/// Largest IPv4 + TCP header we ever emit (20 + 20 + 20 bytes of options, SYN).
pub const MAX_HEADER_LEN: usize = 60;
/// Replies to late feedback (RST/ACK from a lingering session) waiting for `poll_transmit`;
/// beyond, dropped and counted (the test server retransmits and gets another chance).
const CONTROL_QUEUE_CAP: usize = 4096;
/// Events waiting for `poll_event`; beyond, the oldest is dropped and counted.
const EVENT_QUEUE_CAP: usize = 65536;
/// Sessions the two indexes (by flow, by mirrored address) are sized for at the start.
const INDEX_PRESIZE: usize = 8192;

/// The largest segment a replayed run is cut into (see `try_reestablish`).
const REPLAY_SEGMENT: usize = 32 * 1024;

/// No feedback at all for this long, then some: the path was away (intercept stalled,
/// restarted, or unreachable), not merely quiet, if sessions waited on it meanwhile. Under
/// load feedback comes every few milliseconds; longer than the smallest RTO, so a session
/// that waited has backed off at least once, and short enough that resyncing saves seconds.
pub const FEEDBACK_SILENCE: Duration = Duration::from_millis(500);

/// The delayed-ACK bound (see [`EngineConfig::delayed_ack`]): far below the test server's
/// RTO (200 ms at least) and its tail-loss probe with one segment in flight (RTO_MIN more
/// than 2 RTTs), long enough for the client's next command to carry the ACK.
pub const DEFAULT_DELAYED_ACK: Duration = Duration::from_millis(5);

/// Configuration of one engine. Build with [`EngineConfig::new`] and adjust fields.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The production server port whose clients are mirrored.
    pub prod_port: u16,
    /// The test server.
    pub target: SocketAddrV4,
    /// If set (network, prefix length), clients are mirrored from pool addresses: same port,
    /// address probed so no two live sessions share a 4-tuple toward the target.
    pub client_ip_pool: Option<(Ipv4Addr, u8)>,
    /// `(index, count)`: this engine uses only the index-th of `count` equal slices of the
    /// pool, so engines sharing a pool (a [`Fleet`]) never pick the same address.
    pub pool_slice: (u32, u32),
    /// Mirror only this share of client connections (see `sample.rs`); `None`: all. New
    /// connections are decided at their SYN and remembered; mid-stream ones by a fixed hash.
    pub sample: Option<Sample>,
    /// Our largest segment payload toward the target (path MTU - 40). Clamped to 64..=65495.
    pub mss: u16,
    pub min_rto: Duration,
    pub max_rto: Duration,
    pub initial_rto: Duration,
    /// Abandon a session whose handshake (test SYN-ACK and the client's own ACK to
    /// production) is not done within this.
    pub handshake_timeout: Duration,
    /// Abandon a session with no captured packet and no feedback for this long. Longer than
    /// MySQL's default `wait_timeout` (8 h) so pooled idle connections survive.
    pub idle_timeout: Duration,
    /// Abandon a session not fully closed this long after the first FIN (either side).
    pub close_timeout: Duration,
    /// Abandon a session whose captured client stream has a hole (or production acknowledged
    /// bytes we never captured) for this long: the capture lost bytes production received.
    /// Longer than a few client RTOs so a genuine client loss can be retransmitted first.
    pub capture_gap_timeout: Duration,
    /// How long a closed session is remembered to absorb late packets (re-ACK a repeated FIN,
    /// RST late test segments, ignore a client's retransmitted FIN).
    pub linger: Duration,
    /// Consecutive retransmission timeouts (or unanswered window probes) before abandoning.
    pub max_retransmits: u32,
    /// Bytes queued per session toward the test server (unacknowledged + unsent + held out of
    /// order); beyond, the session is abandoned with `BufferOverflow`.
    pub max_session_buffer: usize,
    /// Mirror connections that were open before we started (no SYN seen).
    pub pickup_midstream: bool,
    /// Live sessions at most; new connections beyond are not mirrored (`sessions_shed`).
    pub max_sessions: usize,
    /// Bytes all of this engine's sessions may hold together (fixed size and buffers, see
    /// `budget.rs`); beyond, whole sessions are shed, largest first, and new ones refused
    /// (`CloseReason::ShedMemory`, `sessions_refused_memory`). Its share of `--max-memory`.
    pub max_memory: usize,
    /// IPv4 TTL of what we send.
    pub ttl: u8,
    /// Delayed ACK toward the test server (RFC 1122 4.2.3.2, RFC 9293 3.8.6.3): an in-order
    /// segment of the test server is acknowledged at once only if it is the second one not
    /// yet acknowledged; otherwise the ACK waits for our next segment (the client's next
    /// command, which carries it for free) or this long, whichever comes first. FIN,
    /// out-of-order, repeated and window-probe segments are always acknowledged at once.
    /// Zero: every test-server segment is acknowledged at once (a pure ACK each).
    pub delayed_ack: Duration,
    /// Observations (the report's, see [`Engine::poll_observation`]) kept until the driver
    /// collects them; beyond, they are dropped and counted (`observations_dropped`).
    pub max_observations: usize,
}

impl EngineConfig {
    pub fn new(prod_port: u16, target: SocketAddrV4) -> Self {
        Self {
            prod_port,
            target,
            client_ip_pool: None,
            pool_slice: (0, 1),
            sample: None,
            mss: 1460,
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            initial_rto: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(9 * 3600),
            close_timeout: Duration::from_secs(60),
            capture_gap_timeout: Duration::from_secs(3),
            linger: Duration::from_secs(10),
            max_retransmits: 12,
            max_session_buffer: 4 << 20,
            pickup_midstream: false,
            max_sessions: 10_000,
            max_memory: 256 << 20,
            ttl: 64,
            delayed_ack: DEFAULT_DELAYED_ACK,
            // A second of a busy copier's commands; the driver collects after every batch.
            max_observations: 1 << 16,
        }
    }

    fn normalized(mut self) -> Self {
        self.mss = self.mss.clamp(64, 65495);
        self.max_rto = self.max_rto.max(Duration::from_millis(1));
        self.min_rto = self.min_rto.min(self.max_rto);
        self.initial_rto = self.initial_rto.clamp(self.min_rto, self.max_rto);
        self.max_session_buffer = self.max_session_buffer.max(1);
        self.max_memory = self.max_memory.max(1);
        self.ttl = self.ttl.max(1);
        // A bound longer than the smallest RTO could make the test server retransmit.
        self.delayed_ack = self.delayed_ack.min(self.min_rto / 2);
        self
    }
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Both sides sent FIN and had it acknowledged.
    Completed,
    /// The client reset its connection; we reset ours.
    ClientReset,
    /// Production reset the client's connection; we reset ours.
    ProdReset,
    /// The test server reset the connection.
    TestReset,
    /// The test server answered our SYN with RST (nothing listening).
    TestRefused,
    HandshakeTimeout,
    IdleTimeout,
    CloseTimeout,
    /// The test server stopped acknowledging (or answering window probes).
    TooManyRetransmits,
    /// More than `max_session_buffer` bytes queued: the test server is too slow.
    BufferOverflow,
    /// The capture missed client bytes production received.
    CaptureGap,
    /// The client reused the 4-tuple (new SYN, new ISN) while we still had the old session.
    Reused,
    /// The copier is exiting.
    Shutdown,
    /// The session's transform gave it up (e.g. TLS or compression: the protocol cannot be
    /// rewritten); the event's `why` says what it found.
    NotMirrorable,
    /// The engine's memory budget (`--max-memory`) was reached and this session held the most
    /// (it fell furthest behind): shed whole, reset on the test server.
    ShedMemory,
}

impl CloseReason {
    pub const COUNT: usize = 15;
    pub const ALL: [CloseReason; Self::COUNT] = [
        Self::Completed,
        Self::ClientReset,
        Self::ProdReset,
        Self::TestReset,
        Self::TestRefused,
        Self::HandshakeTimeout,
        Self::IdleTimeout,
        Self::CloseTimeout,
        Self::TooManyRetransmits,
        Self::BufferOverflow,
        Self::CaptureGap,
        Self::Reused,
        Self::Shutdown,
        Self::NotMirrorable,
        Self::ShedMemory,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Label for metrics (`tcpshadow_copier_sessions_closed_total{reason="..."}`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::ClientReset => "client_reset",
            Self::ProdReset => "prod_reset",
            Self::TestReset => "test_reset",
            Self::TestRefused => "test_refused",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::CloseTimeout => "close_timeout",
            Self::TooManyRetransmits => "too_many_retransmits",
            Self::BufferOverflow => "buffer_overflow",
            Self::CaptureGap => "capture_gap",
            Self::Reused => "reused",
            Self::Shutdown => "shutdown",
            Self::NotMirrorable => "not_mirrorable",
            Self::ShedMemory => "shed_memory",
        }
    }

    /// Whether a session ending for this reason may have lost only its test-side connection
    /// and be re-established (see `recovery.rs`; `NotMirrorable` only for some causes).
    pub fn is_test_side_loss(self) -> bool {
        recovery::test_side_loss(self) || self == Self::NotMirrorable
    }

    /// Whether ending for this reason means we send the test server a RST (we abort; it did
    /// not end the connection itself).
    pub fn sends_reset(self) -> bool {
        !matches!(self, Self::Completed | Self::TestReset | Self::TestRefused)
    }
}

/// What the edges need to know about sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// We now send from `mirrored` toward the target: intercept must relay what the test
    /// server sends to that address.
    SessionOpened {
        client: SocketAddrV4,
        mirrored: SocketAddrV4,
        picked_up: bool,
    },
    /// The session ended. It lingers (answering late feedback) until `SessionReleased`.
    SessionClosed {
        client: SocketAddrV4,
        mirrored: SocketAddrV4,
        reason: CloseReason,
        /// For `NotMirrorable`: what the transform found (e.g. "tls"), for the one log line a
        /// person should see about it. `None` otherwise.
        why: Option<&'static str>,
    },
    /// We forgot the session: intercept may stop relaying for `mirrored`.
    SessionReleased { mirrored: SocketAddrV4 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowKey {
    client: SocketAddrV4,
    prod_ip: Ipv4Addr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SessionId {
    idx: u32,
    gen: u32,
}

#[derive(Debug)]
struct Slot {
    gen: u32,
    session: Option<Session>,
    /// Bytes this session was last charged to the engine's memory budget (`budget.rs`).
    charged: usize,
    /// The session was counted in `Engine::waiting_on_test` when last charged.
    waits: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    pool: Option<AddressPool>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_flow: HashMap<FlowKey, SessionId, FlowHash>,
    by_mirror: HashMap<SocketAddrV4, SessionId, FlowHash>,
    /// Earliest deadline per session, lazily invalidated: an entry is live only if its session
    /// still exists and `Session::heap_at` equals its instant.
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// Sessions that may have something to send, round-robin.
    ready: VecDeque<SessionId>,
    control_out: VecDeque<SegmentRepr>,
    /// TLS plaintext of flows whose session has not opened yet (`orphans.rs`).
    orphans: orphans::Orphans,
    events: VecDeque<EngineEvent>,
    /// What the transforms observed, collected after each event (see `poll_observation`).
    observations: VecDeque<Observation>,
    scratch: Vec<u8>,
    ip_id: u16,
    stats: EngineStats,
    factory: transform::FactorySlot,
    /// `--sample`'s decisions; `None` without sampling, or when a [`Fleet`] decides for all
    /// copies of a route.
    sampler: Option<Sampler>,
    /// Bytes charged to the memory budget by all sessions (see `budget.rs`).
    mem_used: usize,
    /// What the last new session was charged when it opened: the admission test's estimate
    /// for the next one.
    mem_new_session: usize,
    /// Sessions that cannot go on until the test server says something
    /// (`Session::waits_on_test`), as of their last charge.
    waiting_on_test: usize,
    /// Paces re-establishing sessions while the test server does not answer (`recovery.rs`).
    gate: recovery::Gate,
    /// When the last feedback arrived: feedback after a longer silence than
    /// [`FEEDBACK_SILENCE`] means the path is back, and waiting sessions are resynced.
    last_feedback: Option<Instant>,
}

impl Engine {
    /// An engine that mirrors every session byte for byte.
    pub fn new(cfg: EngineConfig) -> Self {
        Self::with_transform(cfg, Box::new(IdentityFactory))
    }

    /// An engine whose sessions each get a transform from `factory` (see [`StreamTransform`]).
    pub fn with_transform(cfg: EngineConfig, factory: Box<dyn TransformFactory>) -> Self {
        let cfg = cfg.normalized();
        let (slice, slices) = cfg.pool_slice;
        let pool = cfg
            .client_ip_pool
            .and_then(|(net, prefix)| AddressPool::new(net, prefix, *cfg.target.ip()))
            .and_then(|p| p.slice(slice, slices));
        let presize = cfg.max_sessions.min(1 << 16);
        // The indexes are pre-sized for fewer sessions than the table: a hash table's entries
        // are scattered, so every page of a table sized for 65,536 sessions is touched (and
        // resident) long before it holds that many, about 470 bytes per session at 10,000.
        // Beyond this they double, which costs one rehash per doubling, at a session's
        // opening, never per packet. The slot table and the timer heap fill in order, so
        // their unused capacity is never touched.
        let index_presize = cfg.max_sessions.min(INDEX_PRESIZE);
        Self {
            pool,
            slots: Vec::with_capacity(presize),
            free: Vec::new(),
            by_flow: HashMap::with_capacity_and_hasher(index_presize, FlowHash::default()),
            by_mirror: HashMap::with_capacity_and_hasher(index_presize, FlowHash::default()),
            timers: BinaryHeap::with_capacity(presize),
            ready: VecDeque::with_capacity(presize.min(4096)),
            control_out: VecDeque::with_capacity(64),
            events: VecDeque::with_capacity(256),
            observations: VecDeque::new(),
            orphans: orphans::Orphans::default(),
            scratch: vec![0; usize::from(cfg.mss)],
            ip_id: 0,
            stats: EngineStats::default(),
            factory: transform::FactorySlot(factory),
            sampler: Sampler::for_engine(&cfg),
            mem_used: 0,
            mem_new_session: SESSION_FIXED_BYTES,
            waiting_on_test: 0,
            gate: recovery::Gate::default(),
            last_feedback: None,
            cfg,
        }
    }

    /// Names of the transform counters in `stats().transform`, by id.
    pub fn transform_counter_names(&self) -> &'static [&'static str] {
        self.factory.0.counter_names()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Bytes queued toward the test server and not yet acknowledged (or still withheld by a
    /// transform), over all live sessions (the copier waits for this to reach zero before it
    /// exits). O(sessions).
    pub fn queued_bytes(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.session.as_ref())
            .filter(|s| !s.is_lingering())
            .map(Session::queued_bytes)
            .sum()
    }

    /// Whether some session cannot go on until the test server says something (its SYN-ACK,
    /// an ACK opening its window, the reply its transform holds client bytes for): a driver
    /// that takes the test server's feedback in batches should take it at once meanwhile.
    /// O(1): kept with each session's memory charge.
    pub fn waits_on_test(&self) -> bool {
        self.waiting_on_test > 0
    }

    /// Live sessions whose client has closed (its FIN, or a reset closed like one) and whose
    /// test-side close has not completed: at a stop they are waited for, so that the test
    /// server runs what it holds and closes instead of being reset.
    pub fn sessions_closing(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.session.as_ref())
            .filter(|s| !s.is_lingering() && s.client_closed())
            .count()
    }

    /// The `buf` size `poll_transmit` needs for any packet of ours.
    pub fn transmit_buffer_len(&self) -> usize {
        usize::from(self.cfg.mss) + MAX_HEADER_LEN
    }

    // ------------------------------------------------------------------ output

    /// Writes the next packet to send toward the target into `buf` and returns its length.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if let Some(mut repr) = self.control_out.pop_front() {
            repr.ip_id = self.next_ip_id();
            match emit_ipv4_tcp(&repr, &[], buf) {
                Ok(n) => {
                    self.stats.segments_sent += 1;
                    return Some(n);
                }
                Err(_) => {
                    self.stats.transmit_buffer_too_small += 1;
                    self.control_out.push_front(repr);
                    return None;
                }
            }
        }
        while let Some(id) = self.ready.pop_front() {
            let ip_id = self.ip_id.wrapping_add(1);
            let Engine {
                slots,
                cfg,
                stats,
                scratch,
                ..
            } = self;
            let Some(s) = slot_session(slots, id) else {
                continue;
            };
            s.in_ready = false;
            let sent = s.poll_segment(now, cfg, stats, scratch, buf, ip_id);
            s.refresh_timers(now, cfg);
            let complete = s.is_complete();
            match sent {
                Some(n) => {
                    self.ip_id = ip_id;
                    if complete {
                        self.finish(id, now, CloseReason::Completed);
                    } else {
                        // It may have more; it goes to the back so sessions take turns.
                        self.schedule(id);
                        self.mark_ready(id);
                    }
                    return Some(n);
                }
                None => {
                    if complete {
                        self.finish(id, now, CloseReason::Completed);
                    } else {
                        self.schedule(id);
                    }
                }
            }
        }
        None
    }

    /// The next session event, if any.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// The next observation of a finished command (the report's), oldest first. Drain it
    /// after every batch, as `poll_event`: what is not collected within
    /// [`EngineConfig::max_observations`] is dropped and counted.
    pub fn poll_observation(&mut self) -> Option<Observation> {
        self.observations.pop_front()
    }

    /// Moves what the session's transform observed into the engine's queue.
    fn collect_observations(&mut self, id: SessionId) {
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        while let Some(o) = s.poll_observation() {
            if self.observations.len() < self.cfg.max_observations {
                self.observations.push_back(o);
            } else {
                self.stats.observations_dropped += 1;
            }
        }
    }

    /// The copier is exiting: RST every live session so the test server frees it, and
    /// forget everything. Drain `poll_transmit` afterwards to actually send the RSTs.
    pub fn shutdown(&mut self, now: Instant) {
        for idx in 0..self.slots.len() {
            let slot = &self.slots[idx];
            let Some(s) = &slot.session else {
                continue;
            };
            let id = SessionId {
                idx: idx as u32,
                gen: slot.gen,
            };
            if !s.is_lingering() {
                if s.reset_repr(self.cfg.ttl).is_some() {
                    self.stats.shutdown_resets += 1;
                }
                self.finish(id, now, CloseReason::Shutdown);
            }
            self.release(id);
        }
        self.ready.clear();
        self.timers.clear();
    }

    // ------------------------------------------------------------------ bookkeeping

    fn next_ip_id(&mut self) -> u16 {
        self.ip_id = self.ip_id.wrapping_add(1);
        self.ip_id
    }

    fn open_session(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        pkt: &TcpPacket<'_>,
        start: Start,
    ) {
        if self.stats.sessions_active as usize >= self.cfg.max_sessions {
            self.stats.sessions_shed += 1;
            return;
        }
        if !self.admits_new_session(matches!(start, Start::Syn)) {
            return;
        }
        let client = SocketAddrV4::new(pkt.src, pkt.src_port);
        let mirrored = match &self.pool {
            Some(pool) => match pool.pick(client, |a| self.by_mirror.contains_key(&a)) {
                Some(a) => a,
                None => {
                    self.stats.pool_exhausted += 1;
                    return;
                }
            },
            None => {
                if self.by_mirror.contains_key(&client) {
                    self.stats.sessions_collided += 1;
                    return;
                }
                client
            }
        };
        let picked_up = matches!(start, Start::Pickup);
        let info = SessionInfo {
            client,
            prod: SocketAddrV4::new(pkt.dst, pkt.dst_port),
            mirrored,
            picked_up,
        };
        let transform = self.factory.0.create(now, &info);
        let session = Session::new(now, &self.cfg, pkt, mirrored, start, transform);
        let id = match self.free.pop() {
            Some(idx) => {
                let slot = &mut self.slots[idx as usize];
                slot.session = Some(session);
                slot.charged = 0;
                SessionId { idx, gen: slot.gen }
            }
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    session: Some(session),
                    charged: 0,
                    waits: false,
                });
                SessionId {
                    idx: (self.slots.len() - 1) as u32,
                    gen: 0,
                }
            }
        };
        self.by_flow.insert(
            FlowKey {
                client,
                prod_ip: pkt.dst,
            },
            id,
        );
        self.by_mirror.insert(mirrored, id);
        self.stats.sessions_active += 1;
        if picked_up {
            self.stats.sessions_picked_up += 1;
        } else {
            self.stats.sessions_opened += 1;
        }
        self.push_event(EngineEvent::SessionOpened {
            client,
            mirrored,
            picked_up,
        });
        // A picked-up session's transform speaks before any captured byte; then the opening
        // packet may carry data (pickup, TFO) or a FIN, and the session takes it.
        let out = match slot_session(&mut self.slots, id) {
            Some(s) => match s.on_open(now, captured, &self.cfg, &mut self.stats, picked_up) {
                Outcome::Open if picked_up || !pkt.payload.is_empty() => {
                    s.on_client(now, captured, &self.cfg, &mut self.stats, pkt)
                }
                out => out,
            },
            None => Outcome::Open,
        };
        self.settle(id, now, out);
        self.note_new_session_charge(id);
        if !self.orphans.is_empty() {
            let key = FlowKey {
                client,
                prod_ip: pkt.dst,
            };
            for o in self.orphans.take(key) {
                let p = Plaintext {
                    client,
                    server: info.prod,
                    from_client: o.from_client,
                    offset: o.offset,
                    data: &o.data,
                };
                self.on_plaintext(now, &p);
            }
        }
    }

    /// After any change to a session: end it, or re-arm its timer and queue it for sending.
    fn settle(&mut self, id: SessionId, now: Instant, out: Outcome) {
        self.collect_observations(id);
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        match out {
            Outcome::Finished(reason) => self.finish(id, now, reason),
            Outcome::Open => {
                s.refresh_timers(now, &self.cfg);
                if s.is_complete() {
                    self.finish(id, now, CloseReason::Completed);
                    return;
                }
                if s.may_transmit() {
                    self.mark_ready(id);
                }
                self.schedule(id);
                self.recharge(id);
                self.enforce_budget(now);
            }
        }
    }

    /// Ends a live session: RST if we abort, event, counters; it then lingers.
    fn finish(&mut self, id: SessionId, now: Instant, reason: CloseReason) {
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if s.is_lingering() {
            return;
        }
        let rst = if reason.sends_reset() {
            s.reset_repr(self.cfg.ttl)
        } else {
            None
        };
        let (client, mirrored) = (s.client, s.mirrored);
        let why = if reason == CloseReason::NotMirrorable {
            s.abandoned
        } else {
            None
        };
        s.revival = if self.cfg.pickup_midstream {
            s.revival(reason, now)
        } else {
            None
        };
        if s.revival.is_some() {
            self.stats.sessions_awaiting_reestablish += 1;
            // What the test server did not answer goes first in the next session's replay
            // (`session/replay.rs`).
            if let Some(run) = s.carry_over() {
                self.stats.held_bytes_carried += run.len() as u64;
                s.set_held(run);
            }
        } else if let Some(h) = s.take_held() {
            // Not to be re-established (its client left): there is nobody to replay it to.
            self.stats.held_bytes_lost += h.len() as u64;
        }
        // A handshake timeout says nothing about the test server if it did answer (the client
        // never finished its own handshake with production).
        if recovery::unreachable(reason)
            && (reason != CloseReason::HandshakeTimeout || s.phase == session::Phase::SynSent)
        {
            self.gate.failed(now);
        }
        self.stats.tls_plain_bytes_unused += s.tls_unused_bytes() as u64;
        s.end_transform();
        self.collect_observations(id);
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        s.enter_linger(now + self.cfg.linger, reason == CloseReason::Completed);
        self.recharge(id);
        self.stats.sessions_active -= 1;
        self.stats.sessions_lingering += 1;
        self.stats.sessions_closed[reason.index()] += 1;
        if let Some(rst) = rst {
            // Not capped: at most one per session, and losing it would leave the test
            // server holding the connection.
            self.stats.rsts_sent += 1;
            self.control_out.push_back(rst);
        }
        self.push_event(EngineEvent::SessionClosed {
            client,
            mirrored,
            reason,
            why,
        });
        self.schedule(id);
    }

    /// Forgets a lingering session.
    fn release(&mut self, id: SessionId) {
        let Some(slot) = self.slots.get_mut(id.idx as usize) else {
            return;
        };
        if slot.gen != id.gen {
            return;
        }
        let Some(s) = slot.session.take() else {
            return;
        };
        slot.gen = slot.gen.wrapping_add(1);
        self.mem_used -= std::mem::take(&mut slot.charged);
        self.waiting_on_test -= usize::from(std::mem::take(&mut slot.waits));
        self.free.push(id.idx);
        debug_assert!(s.is_lingering());
        self.stats.sessions_lingering -= 1;
        if let Some(h) = s.held() {
            self.stats.held_bytes_lost += h.len() as u64;
        }
        if s.revival.is_some() {
            self.stats.sessions_awaiting_reestablish -= 1;
        }
        let key = FlowKey {
            client: s.client,
            prod_ip: s.prod_ip,
        };
        if self.by_flow.get(&key) == Some(&id) {
            self.by_flow.remove(&key);
        }
        if self.by_mirror.get(&s.mirrored) == Some(&id) {
            self.by_mirror.remove(&s.mirrored);
        }
        self.push_event(EngineEvent::SessionReleased {
            mirrored: s.mirrored,
        });
        if self.stats.sessions_active + self.stats.sessions_lingering == 0 {
            // Only stale entries can remain: drop them so an idle engine has no deadline.
            self.timers.clear();
        }
    }

    fn mark_ready(&mut self, id: SessionId) {
        if let Some(s) = slot_session(&mut self.slots, id) {
            if !s.in_ready {
                s.in_ready = true;
                self.ready.push_back(id);
            }
        }
    }

    /// Makes sure the heap holds an entry no later than the session's next deadline. A later
    /// deadline needs no new entry: the earlier one fires, finds nothing due, and re-arms.
    fn schedule(&mut self, id: SessionId) {
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        let Some(d) = s.next_deadline(&self.cfg) else {
            return;
        };
        if s.heap_at.is_none_or(|h| d < h) {
            s.heap_at = Some(d);
            self.timers.push(Reverse((d, id.idx, id.gen)));
        }
    }

    /// Stale heap entries are dropped as they surface; if deadlines keep moving earlier they
    /// could pile up, so rebuild when the heap is much larger than the session table.
    fn compact_timers(&mut self) {
        let live = (self.stats.sessions_active + self.stats.sessions_lingering) as usize;
        if self.timers.len() <= 2 * live + 1024 {
            return;
        }
        self.timers.clear();
        for (idx, slot) in self.slots.iter().enumerate() {
            if let Some(at) = slot.session.as_ref().and_then(|s| s.heap_at) {
                self.timers.push(Reverse((at, idx as u32, slot.gen)));
            }
        }
    }

    fn push_event(&mut self, ev: EngineEvent) {
        if self.events.len() >= EVENT_QUEUE_CAP {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(ev);
    }
}

/// The in-line sizes of a session's parts (bytes), for the memory breakdown of
/// `examples/idle_memory.rs` (docs/BENCHMARKS.md "Memory per idle mirrored session").
#[doc(hidden)]
pub fn session_layout() -> Vec<(&'static str, usize)> {
    use std::mem::size_of;
    vec![
        ("engine Slot (session in line)", size_of::<Slot>()),
        ("engine Session", size_of::<Session>()),
        ("engine Reassembly", size_of::<reassembly::Reassembly>()),
        ("engine by_flow entry", size_of::<(FlowKey, SessionId)>()),
        (
            "engine by_mirror entry",
            size_of::<(SocketAddrV4, SessionId)>(),
        ),
        ("engine timer entry", size_of::<(Instant, u32, u32)>()),
        ("SESSION_FIXED_BYTES (budget)", SESSION_FIXED_BYTES),
    ]
}

fn slot_session(slots: &mut [Slot], id: SessionId) -> Option<&mut Session> {
    let slot = slots.get_mut(id.idx as usize)?;
    if slot.gen != id.gen {
        return None;
    }
    slot.session.as_mut()
}
