//! The seam where a protocol layer may change what the test server receives.
//!
//! # What this room is for
//!
//! The engine plays the TCP client side of every mirrored connection; it knows nothing of the
//! bytes it carries. A [`StreamTransform`] (one per session, made by a [`TransformFactory`])
//! sits between the client's reassembled stream and the stream we send: it sees every in-order
//! client byte once, may see production's in-order replies and what intercept relays about the
//! test server, and decides which bytes we send: the same, others, more (a synthetic login
//! before a picked-up connection's commands), fewer (a dropped command), or none yet (a login
//! that must wait for the test server's greeting). It may also give the session up
//! ([`CloseReason::NotMirrorable`](super::CloseReason::NotMirrorable)) and bump its own counters.
//!
//! Two sequence spaces meet here and nowhere else: what a transform receives is in the client's
//! space (and production's), what it pushes is appended to *our* stream toward the test server.
//! Nothing in the engine maps one onto the other afterwards: retransmission, ACKs and FIN live
//! entirely in our space, reassembly and capture-gap detection entirely in the client's.
//!
//! # What it must never do
//!
//! * Know a protocol. MySQL lives in `core/src/mysql/`; this file only defines the hook.
//! * Do I/O, read a clock, log, or block: a transform is called on the packet hot path with the
//!   engine's `now`, and must be a deterministic function of what it was fed.
//! * Cost anything when unused: a factory that returns `None` keeps the session on the plain
//!   path (bytes go straight from reassembly into the send buffer, no virtual call, no copy).
//! * Allocate per packet: [`TransformOutput`] writes into the session's own send buffer and its
//!   counters are a fixed array.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddrV4;

use common::clock::Instant;
use common::control::{MysqlEvent, TestFeedback};

use crate::observation::Observation;

/// Counters a transform can bump, per engine (ids `0..TRANSFORM_COUNTERS`).
pub const TRANSFORM_COUNTERS: usize = 96;

/// What a factory knows about the session it makes a transform for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The real client, as captured.
    pub client: SocketAddrV4,
    /// The production server the client talks to.
    pub prod: SocketAddrV4,
    /// The address we send from toward the test server (the client's, or a pool address).
    pub mirrored: SocketAddrV4,
    /// The connection was open before we saw it (no SYN): its login happened long ago.
    pub picked_up: bool,
}

/// A per-session rewrite of the client's byte stream. See the module documentation.
///
/// Every method gets the engine's `now` and an output; pushed bytes go to the test server in
/// the order pushed, after everything pushed before. Methods are never called again after the
/// session ended (abandoned, reset, closed).
pub trait StreamTransform: Send {
    /// In-order client bytes, each exactly once (retransmissions and reordering are already
    /// undone). Push what the test server should receive; it may be nothing yet.
    /// [`TransformOutput::captured_at`] tells when the packet that completed them was captured,
    /// when the driver knows.
    fn on_client_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>);

    /// The client closed its side (its FIN was reached in order). Last chance to flush; our FIN
    /// follows everything pushed, once [`pending`](Self::pending) is false.
    fn on_client_fin(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) {}

    /// The session was picked up mid-stream; called once, before any client byte, so bytes
    /// pushed here come first (a synthetic login, `COM_INIT_DB`, re-prepares).
    fn on_pickup(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) {}

    /// Whether [`on_prod_data`](Self::on_prod_data) is wanted. Asked once, when the session
    /// starts; when false the engine does not reassemble production's replies at all.
    fn wants_prod_data(&self) -> bool {
        false
    }

    /// In-order production->client bytes (captured on the production host), each exactly once.
    /// The stream starts at production's SYN-ACK, or for a picked-up session at the first
    /// production segment with data that was captured.
    fn on_prod_data(&mut self, _now: Instant, _data: &[u8], _out: &mut TransformOutput<'_>) {}

    /// The capture lost client bytes that production received (a kernel drop: the client
    /// will never send them again). The next bytes given start a segment that
    /// [`starts_command`](Self::starts_command) accepted; what came between is gone. Returns
    /// whether the transform can carry on from there with what it knows; `false` ends the
    /// session as a capture gap. The default cannot: a stream without framing has no
    /// boundary to go on from.
    fn on_client_gap(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) -> bool {
        false
    }

    /// Whether `head`, the first captured bytes of a client segment after a capture gap,
    /// begins a request of the protocol (the engine skips segments until one does).
    fn starts_command(&self, _head: &[u8]) -> bool {
        false
    }

    /// The same for production's stream: bytes the client received were not captured, and the
    /// next bytes given may start anywhere. `false` ends the session as a capture gap.
    fn on_prod_gap(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) -> bool {
        false
    }

    /// Something learnt about the test server's side of the connection.
    fn on_test_event(
        &mut self,
        _now: Instant,
        _ev: &TestEvent<'_>,
        _out: &mut TransformOutput<'_>,
    ) {
    }

    /// Whether [`replay_from`](Self::replay_from) can ever answer: the engine keeps client
    /// bytes for a replay only then. Asked when the session starts.
    fn replays(&self) -> bool {
        false
    }

    /// Bytes of the client's stream given so far ([`on_client_data`](Self::on_client_data)),
    /// in the offsets of [`replay_from`](Self::replay_from): where a log of the client's bytes
    /// that starts now starts. Asked only of a transform that [`replays`](Self::replays).
    fn client_offset(&self) -> u64 {
        0
    }

    /// Where the client's stream would have to be given again for the test server to get
    /// everything it has not answered: an offset into the bytes this transform was given
    /// ([`on_client_data`](Self::on_client_data), counted from the session's first), always
    /// the start of a request. Asked after calls that may move it, and when the test server's
    /// connection is lost (`engine/recovery.rs`): the engine keeps the client bytes from this
    /// offset on, and a session that re-establishes this one replays them. `None`: nothing
    /// can be replayed (the default: a stream without requests has no point to start from).
    fn replay_from(&self) -> Option<u64> {
        None
    }

    /// The test server's connection was lost and the client's stream from
    /// [`replay_from`](Self::replay_from) goes to the session that re-establishes this one:
    /// what was sent and not answered is not lost (yet). Called just before
    /// [`end`](Self::end).
    fn carried_over(&mut self) {}

    /// A re-established session: the client bytes given so far were replayed (held while the
    /// test server was away, or sent to it before and not answered). Production answered them
    /// long ago, in bytes this session never sees; its next bytes answer what comes next.
    fn on_replayed(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) {}

    /// Whether client bytes may still be withheld (e.g. waiting for the greeting): while true,
    /// the engine does not send our FIN even if the client closed. Asked after every call.
    fn pending(&self) -> bool {
        false
    }

    /// Whether the client bytes it withholds wait for the test server to say something soon
    /// (a greeting, a PREPARE_OK), so that the session cannot go on without it: the copier
    /// then takes intercept's relays as they come rather than at its capture's pace
    /// (`Session::waits_on_test`). Withholding as backpressure (the test server already holds
    /// plenty of work) is not such a wait. Asked after every call.
    fn waits_on_test(&self) -> bool {
        self.pending()
    }

    /// Bytes the transform holds and still means to send: they count toward the session's
    /// `max_session_buffer` and toward [`Engine::queued_bytes`](super::Engine::queued_bytes).
    fn buffered_len(&self) -> usize {
        0
    }

    /// Bytes of memory the transform occupies (its own size plus what it allocated), for the
    /// engine's memory budget (`--max-memory`, see `budget.rs`). An estimate is fine; it must
    /// be cheap (it is asked after every call) and must grow with anything that grows with
    /// input. The default counts the transform's size and [`buffered_len`](Self::buffered_len).
    fn memory_len(&self) -> usize {
        std::mem::size_of_val(self) + self.buffered_len()
    }

    /// When [`on_timeout`](Self::on_timeout) should run next, if ever.
    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    /// Called once `now >= next_deadline()` (possibly a little late, never early). A deadline
    /// still not after `now` when this returns is taken as 1 ms later.
    fn on_timeout(&mut self, _now: Instant, _out: &mut TransformOutput<'_>) {}

    /// What the transform observed of a finished command, oldest first, for the report. The
    /// engine collects them after every event that reached the session, and once more after
    /// [`end`](Self::end).
    fn poll_observation(&mut self) -> Option<Observation> {
        None
    }

    /// The session is over (closed, reset, given up, shut down): whatever the transform still
    /// waits on will not come. It hands out what it knows through
    /// [`poll_observation`](Self::poll_observation); no other method is called afterwards.
    fn end(&mut self) {}
}

/// Makes one transform per new session.
pub trait TransformFactory: Send {
    /// `None` keeps the session on the plain byte-for-byte path, at no cost.
    fn create(&mut self, now: Instant, session: &SessionInfo) -> Option<Box<dyn StreamTransform>>;

    /// Names of the counters the transforms bump, indexed by counter id (for metrics labels
    /// and the summary). Ids without a name are still counted.
    fn counter_names(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Any closure can be a factory (handy in tests).
impl<F> TransformFactory for F
where
    F: FnMut(Instant, &SessionInfo) -> Option<Box<dyn StreamTransform>> + Send,
{
    fn create(&mut self, now: Instant, session: &SessionInfo) -> Option<Box<dyn StreamTransform>> {
        self(now, session)
    }
}

/// The default: every session byte-for-byte.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityFactory;

impl TransformFactory for IdentityFactory {
    fn create(&mut self, _: Instant, _: &SessionInfo) -> Option<Box<dyn StreamTransform>> {
        None
    }
}

/// Passes every client byte through unchanged. Behaves exactly like no transform (slower): a
/// base to wrap, and a check that the transform path changes nothing by itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity;

impl StreamTransform for Identity {
    fn on_client_data(&mut self, _: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        out.push(data);
    }
}

/// Knowledge about the test server's side of a session. Segments come from
/// [`Engine::on_feedback`](super::Engine::on_feedback); a variant added here (e.g. the MySQL
/// packet summaries intercept will relay) is delivered with
/// [`Engine::on_test_event`](super::Engine::on_test_event) and needs no other engine change.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum TestEvent<'a> {
    /// A segment of the test server, after the engine's own TCP processing of it.
    Segment(TestSegment<'a>),
    /// A MySQL packet summary or a framing loss, from intercept's framing of the test server's
    /// reply stream (in stream order per session).
    Mysql(&'a MysqlEvent),
    /// Application data from outside the capture (e.g. session state a protocol layer
    /// recovered from production), opaque to the engine: the transform downcasts it to the
    /// types it knows and ignores the rest. Keeps the engine free of protocol types.
    App(&'a (dyn std::any::Any + Send + Sync)),
}

impl<'a> TestEvent<'a> {
    /// The segment, if this is one (matching on it this way keeps compiling when variants
    /// are added).
    pub fn segment(&self) -> Option<&TestSegment<'a>> {
        match self {
            TestEvent::Segment(s) => Some(s),
            TestEvent::Mysql(_) | TestEvent::App(_) => None,
        }
    }
}

/// A relayed test-server segment as the engine understood it. Only the engine makes these
/// (every duplicate and reordered copy is passed on; `in_order` tells the new ones).
#[derive(Clone, Copy, Debug)]
pub struct TestSegment<'a> {
    feedback: &'a TestFeedback,
    in_order: bool,
}

impl<'a> TestSegment<'a> {
    pub(super) fn new(feedback: &'a TestFeedback, in_order: bool) -> Self {
        Self { feedback, in_order }
    }

    pub fn feedback(&self) -> &'a TestFeedback {
        self.feedback
    }

    /// The segment carries data that starts exactly at the next byte of the test server's
    /// stream and is seen for the first time: its `payload_prefix` is the continuation of the
    /// stream (complete if [`TestFeedback::payload_complete`]). False for duplicates,
    /// retransmissions and segments beyond a hole (their bytes are never offered again).
    pub fn in_order(&self) -> bool {
        self.in_order
    }

    /// The payload bytes relayed, if the segment is in order.
    pub fn in_order_payload(&self) -> Option<&'a [u8]> {
        self.in_order
            .then_some(self.feedback.payload_prefix.as_slice())
    }
}

/// Counters bumped by transforms, summed over an engine's sessions. Ids are defined by the
/// transform (an enum cast to `usize`); names come from [`TransformFactory::counter_names`].
#[derive(Clone, PartialEq, Eq)]
pub struct TransformStats {
    counters: [u64; TRANSFORM_COUNTERS],
}

impl Default for TransformStats {
    fn default() -> Self {
        Self {
            counters: [0; TRANSFORM_COUNTERS],
        }
    }
}

impl fmt::Debug for TransformStats {
    // Only what was bumped: 64 zeros drown every other counter in a Debug dump.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.counters.iter().enumerate().filter(|(_, n)| **n > 0))
            .finish()
    }
}

impl TransformStats {
    /// Ids out of range are ignored (a transform bug must not panic the hot path).
    pub fn add(&mut self, id: usize, n: u64) {
        if let Some(c) = self.counters.get_mut(id) {
            *c = c.wrapping_add(n);
        }
    }

    pub fn get(&self, id: usize) -> u64 {
        self.counters.get(id).copied().unwrap_or(0)
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.counters
    }

    /// `(name, value)` for every named counter.
    pub fn named<'a>(
        &'a self,
        names: &'a [&'static str],
    ) -> impl Iterator<Item = (&'static str, u64)> + 'a {
        names
            .iter()
            .zip(self.counters.iter())
            .map(|(n, v)| (*n, *v))
    }

    pub fn merge(&mut self, o: &TransformStats) {
        for (a, b) in self.counters.iter_mut().zip(o.counters.iter()) {
            *a = a.wrapping_add(*b);
        }
    }
}

/// Where a transform puts its decisions: bytes for our stream, counters, giving up.
pub struct TransformOutput<'a> {
    send: &'a mut VecDeque<u8>,
    counters: &'a mut TransformStats,
    /// Our FIN is already placed: nothing may follow it.
    closed: bool,
    /// Bytes `send` may still take (the session's buffer bound).
    room: usize,
    pushed: usize,
    refused: usize,
    overflowed: bool,
    abandoned: Option<&'static str>,
    captured: Option<Instant>,
    test_seen: u32,
    tls_started: bool,
    settled: bool,
}

/// What one call asked for, applied by the session afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TransformResult {
    pub(super) pushed: usize,
    /// Bytes pushed after our FIN was placed (a transform bug), discarded.
    pub(super) refused: usize,
    pub(super) overflowed: bool,
    pub(super) abandoned: Option<&'static str>,
    /// The client's stream turned to TLS: see [`TransformOutput::start_tls`].
    pub(super) tls_started: bool,
    /// See [`TransformOutput::settled`].
    pub(super) settled: bool,
}

impl<'a> TransformOutput<'a> {
    /// An unbounded output appending to `send`: for testing a transform without an engine.
    pub fn new(send: &'a mut VecDeque<u8>, counters: &'a mut TransformStats) -> Self {
        Self::bound(send, counters, false, usize::MAX)
    }

    pub(super) fn bound(
        send: &'a mut VecDeque<u8>,
        counters: &'a mut TransformStats,
        closed: bool,
        room: usize,
    ) -> Self {
        Self {
            send,
            counters,
            closed,
            room,
            pushed: 0,
            refused: 0,
            overflowed: false,
            abandoned: None,
            captured: None,
            test_seen: 0,
            tls_started: false,
            settled: false,
        }
    }

    /// When the captured packet whose bytes are being delivered (`on_client_data`,
    /// `on_prod_data`) was captured, or the relayed test event (`on_test_event`) was received
    /// from intercept, on the engine's clock, if the driver said
    /// ([`Engine::on_captured_at`](super::Engine::on_captured_at),
    /// [`Engine::on_test_event_at`](super::Engine::on_test_event_at)). The engine's `now` is when
    /// the packet is processed, which lags behind while a batch of captured packets is worked
    /// through; latencies between captured packets (production's) want this instead.
    pub fn captured_at(&self) -> Option<Instant> {
        self.captured
    }

    pub(super) fn set_captured(&mut self, at: Option<Instant>) {
        self.captured = at;
    }

    /// How much of the test server's stream (on the current test connection) the engine has
    /// seen in order through relayed feedback, in bytes from its first one, modulo 2^32 (0
    /// before its SYN-ACK). Relayed summaries (`on_test_event`) of those bytes come with
    /// them: bytes seen whose summaries never came were summarised and lost on the way, while
    /// an answer not seen at all has not been sent yet (a lost segment is sent again, and
    /// seen then).
    pub fn test_stream_seen(&self) -> u32 {
        self.test_seen
    }

    /// Sets [`TransformOutput::test_stream_seen`]: the engine does for every call; a test of a
    /// transform without an engine, as it needs.
    pub fn set_test_stream_seen(&mut self, seen: u32) {
        self.test_seen = seen;
    }

    /// The test server began answering a request, or one will never be sent: where a replay
    /// would start ([`StreamTransform::replay_from`]) may have moved on, and the engine lets
    /// go of the client bytes before it. Only a hint for memory: a replay is always taken from
    /// `replay_from` as it stands.
    pub fn settled(&mut self) {
        self.settled = true;
    }

    /// Appends bytes to our stream toward the test server. Ignored once the session was
    /// abandoned; more than the session's buffer can hold ends it with `BufferOverflow`.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.abandoned.is_some() || self.overflowed || bytes.is_empty() {
            return;
        }
        if self.closed {
            self.refused += bytes.len();
            return;
        }
        if bytes.len() > self.room {
            // Refused whole: the session is over anyway, and the buffer stays within its bound.
            self.overflowed = true;
            return;
        }
        self.room -= bytes.len();
        self.pushed += bytes.len();
        self.send.extend(bytes);
    }

    /// The session cannot be mirrored (TLS, compression, ...): the engine resets it toward the
    /// test server and closes it with `NotMirrorable`; `why` goes into the close event.
    pub fn abandon(&mut self, why: &'static str) {
        self.abandoned.get_or_insert(why);
    }

    /// The client's stream turns to TLS after the bytes taken so far (an SSLRequest): from
    /// now on the session's captured bytes, both ways, are ciphertext and never delivered;
    /// its plaintext comes through [`Engine::on_plaintext`](super::Engine::on_plaintext).
    /// Bytes of the current delivery after that point must be ignored by the transform.
    pub fn start_tls(&mut self) {
        self.tls_started = true;
    }

    /// Whether this call started TLS ([`Self::start_tls`]).
    pub fn tls_started(&self) -> bool {
        self.tls_started
    }

    pub fn count(&mut self, counter: usize) {
        self.counters.add(counter, 1);
    }

    pub fn add(&mut self, counter: usize, n: u64) {
        self.counters.add(counter, n);
    }

    /// Bytes pushed through this output so far.
    pub fn pushed(&self) -> usize {
        self.pushed
    }

    pub fn abandoned(&self) -> Option<&'static str> {
        self.abandoned
    }

    /// Nothing more of the current delivery may reach the transform.
    pub(super) fn is_done(&self) -> bool {
        self.abandoned.is_some() || self.overflowed || self.tls_started
    }

    pub(super) fn result(&self) -> TransformResult {
        TransformResult {
            pushed: self.pushed,
            refused: self.refused,
            overflowed: self.overflowed,
            abandoned: self.abandoned,
            tls_started: self.tls_started,
            settled: self.settled,
        }
    }
}

/// A session's transform; its `Debug` never shows the transform's state (which may hold
/// credentials).
pub(super) struct Slot(pub(super) Box<dyn StreamTransform>);

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamTransform")
    }
}

/// The engine's factory, kept out of `Debug` for the same reason.
pub(super) struct FactorySlot(pub(super) Box<dyn TransformFactory>);

impl fmt::Debug for FactorySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TransformFactory")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_bounds_and_refusals() {
        let mut buf = VecDeque::new();
        let mut st = TransformStats::default();
        let mut out = TransformOutput::bound(&mut buf, &mut st, false, 5);
        out.push(b"abc");
        out.push(b"def"); // would exceed the room: refused whole
        out.push(b"g");
        out.count(3);
        out.add(3, 2);
        out.count(TRANSFORM_COUNTERS + 7); // ignored, no panic
        let r = out.result();
        assert_eq!((r.pushed, r.overflowed), (3, true));
        assert_eq!(buf, b"abc");
        assert_eq!(st.get(3), 3);

        let mut out = TransformOutput::bound(&mut buf, &mut st, true, 100);
        out.push(b"late");
        assert_eq!(out.result().refused, 4);
        let mut out = TransformOutput::new(&mut buf, &mut st);
        out.abandon("tls");
        out.abandon("second reason is not kept");
        out.push(b"x");
        assert_eq!(out.result().abandoned, Some("tls"));
        assert_eq!(buf, b"abc");
    }

    #[test]
    fn stats_merge_and_names() {
        let mut a = TransformStats::default();
        a.add(0, 2);
        let mut b = TransformStats::default();
        b.add(0, 1);
        b.add(1, 5);
        a.merge(&b);
        let named: Vec<_> = a.named(&["seen", "dropped"]).collect();
        assert_eq!(named, vec![("seen", 3), ("dropped", 5)]);
        assert_eq!(format!("{a:?}"), "{0: 3, 1: 5}");
    }
}
