//! One mirrored MySQL session: the client's stream in, the test server's stream out, and the
//! knowledge of both servers' replies that decides what goes through (see `mysql/mod.rs`).
//!
//! Three readers of three streams:
//!
//! * **The client's stream, as it arrives** (`arrive`): only packet starts and command bytes,
//!   to know which of production's replies answers which command. It never waits.
//! * **The client's stream, as it is forwarded** (`run`/`decide`): each packet's header and
//!   first bytes are collected (at most `MAX_HEAD`), a verdict is reached (forward, possibly
//!   rewritten; drop; or hold until the test server catches up), then the rest of the packet
//!   streams through or is skipped as it arrives. While a packet is held, later client bytes
//!   wait in `backlog`, so the order toward the test server never changes.
//! * **Production's replies** (`on_prod_data`) and **the test server's** (`on_test_packet`,
//!   summaries from intercept): both are cut into replies the same way, by following each
//!   reply's structure to its end ([`ReplyTracker`]: sequence ids alone cannot tell a reply of
//!   256·k packets, which ends on id 0, from a longer one), and matched in order with the
//!   commands each server was sent.
//!
//! # Rooms
//!
//! The session's state is split by what it is about, each part an owned struct whose fields
//! only its own file touches:
//!
//! | file | room |
//! | --- | --- |
//! | `arrival.rs` | [`Arrival`]: the client's stream as it arrives, command serials |
//! | `forward.rs` | [`Forwarding`]: the client's stream as forwarded, verdicts, backlog |
//! | `login.rs` | [`Login`]: our login and COM_CHANGE_USER on the test server, auth exchanges |
//! | `test_side.rs` | [`TestSide`]: what the test server owes, its replies, resync |
//! | `prod.rs` | [`ProdSide`]: production's replies and what it owes |
//! | `statements.rs` | [`Statements`]: the statement map and prepare pairing |
//! | `read_only.rs` | [`ReadOnly`]: what `--read-only` kept off |
//! | `pickup.rs` | [`Pickup`]: a picked-up connection's login, recovered state, gates |
//! | `inject.rs` | [`Injections`]: bytes of our own for the test server |
//!
//! [`MysqlTransform`] holds them (with the shared rooms of the sibling modules: the
//! transaction gates, the parameter types, the report's observer) and orchestrates: a step
//! that needs several rooms is a method of [`MysqlTransform`], in the file of the room that
//! leads it, and reaches the other rooms only through their methods. This file keeps the
//! [`StreamTransform`] entry points and what every room shares.

mod arrival;
mod forward;
mod inject;
mod login;
mod pickup;
mod prod;
mod read_only;
mod statements;
mod test_side;

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;

use common::clock::Instant;
use common::control::MysqlEvent;
use common::mysql::command::com;
use common::mysql::handshake::{Capabilities, SSL_REQUEST_LEN};
use common::mysql::packet::{write_packet, FrameScanner, PacketHeader, HEADER_LEN};
use common::mysql::stmt::{PrepareAnswer, StatementMap};

use super::observe::{Observer, SQL_LOOKED_AT};
use super::param_types::SessionTypes;
use super::replies::{ReplyTracker, Seen};
use super::txn_gate::{Cause, Gates};
use super::{Counter, NotRecovered, RecoveredState, Shared};
use crate::engine::{SessionInfo, StreamTransform, TestEvent, TransformOutput};
use crate::observation::{Observation, Replica};

use arrival::Arrival;
use forward::{ClientStage, Forwarding};
use inject::{Injection, Injections};
use login::{AuthExchange, Login, PickupPiece};
use pickup::{Pickup, VARIABLE_PREFIX};
use prod::{ProdOwed, ProdPacket, ProdSide};
use read_only::ReadOnly;
use statements::Statements;
use test_side::{TestOwed, TestPhase, TestSide};

/// Commands awaiting a reply from one server, and prepare answers waiting for their partner.
/// Real clients keep a handful in flight. The test server may fall this far behind production
/// (a slower build, a starved CPU): further commands then wait in the session's backlog
/// (bounded by `max_held_bytes`) until it catches up, rather than the session being given up.
pub(super) const MAX_IN_FLIGHT: usize = 4096;
/// What the test server may owe at most, our own injected commands included: a hard bound on
/// the bookkeeping, reached only if the backpressure above failed.
const MAX_TEST_OWED: usize = 2 * MAX_IN_FLIGHT;
/// Stands in for production's answer to a prepare whose reply was never seen: the map then
/// treats the statement as unusable (and closes it on the test server).
const LOST_ANSWER: PrepareAnswer = PrepareAnswer::Err { code: 0 };

/// What the allocator's own headers and rounding add to the sizes `memory_len` sums (glibc:
/// 8 bytes and up to 15 of rounding per allocation; an idle session holds about five: this
/// struct, the engine's send queue, the two reply queues, a packet head), and the small
/// allocations of a login that come and go. Calibrated in the lab (`bench/idle.sh --conns
/// 10000`, docs/BENCHMARKS.md): the copier's RSS grew 1.78 KiB per idle mirrored MySQL
/// session while the sizes the budget sums (engine's fixed part included) came to 1.70 KiB;
/// with this the charge is 1.96 KiB, a little above what a session really takes, so many idle
/// sessions stay within `--max-memory`.
const SMALL_ALLOCATIONS: usize = 256;

/// Mirrors `Command::expects_reply` from the command byte alone: the reply queues are kept from
/// packet heads, which may be too short for `Command::parse`.
pub(super) fn expects_reply(code: u8) -> bool {
    !matches!(code, com::QUIT | com::STMT_CLOSE | com::STMT_SEND_LONG_DATA)
}

/// Whether the first captured packet of a picked-up connection looks like a command a client
/// sends (a capture that starts mid-packet almost never passes this).
fn plausible_command(head: &[u8]) -> bool {
    let (Some(h), Some(&code)) = (PacketHeader::parse(head), head.get(HEADER_LEN)) else {
        return false;
    };
    if h.seq != 0 {
        return false;
    }
    let len = h.len;
    match code {
        com::QUIT | com::STATISTICS | com::PING | com::RESET_CONNECTION => len == 1,
        // COM_PROCESS_INFO, COM_DEBUG
        0x0a | 0x0d => len == 1,
        // COM_REFRESH
        0x07 => len == 2,
        com::QUERY => len >= 1,
        com::INIT_DB | com::FIELD_LIST | com::STMT_PREPARE | com::CHANGE_USER => len >= 2,
        com::PROCESS_KILL | com::STMT_CLOSE | com::STMT_RESET => len == 5,
        com::SET_OPTION => len == 3,
        com::STMT_FETCH => len == 9,
        com::STMT_SEND_LONG_DATA | com::STMT_BULK_EXECUTE => len >= 7,
        com::STMT_EXECUTE => len >= 10,
        _ => false,
    }
}

/// Whether captured client bytes start with a TLS record (handshake, alert or application
/// data, TLS 1.0 to 1.3 record versions): a connection picked up midway that is TLS. A MySQL
/// command never starts so (that would be a packet of 200 KiB or more numbered 3).
fn tls_record_start(data: &[u8]) -> bool {
    matches!(data, [0x15..=0x17, 0x03, 0x01..=0x04, ..])
}

/// Why a session is given up: the counter to bump and the reason for the close event.
#[derive(Clone, Copy, Debug)]
struct Abandon {
    counter: Counter,
    why: &'static str,
}

fn abandon(counter: Counter, why: &'static str) -> Abandon {
    Abandon { counter, why }
}

fn protocol(why: &'static str) -> Abandon {
    abandon(Counter::ProtocolErrors, why)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Forward,
    Drop,
    /// Wait: the test server must answer something first.
    Block,
}

/// The id of the first packet of the reply to a command whose last packet had id `last`:
/// replies go on counting where the command stopped, so a command of 16 MiB or more (two
/// packets and up) is answered from id 3 on, not 1.
fn first_reply_id(last: u8) -> u8 {
    last.wrapping_add(1)
}

/// When a wait ends, if it does, in the eight bytes of an [`Instant`] where an
/// `Option<Instant>` takes sixteen: every session carries two in line
/// (`a_session_in_line_stays_small`). A deadline is a positive wait after some `now`, so it
/// is never the epoch itself, which stands for none.
#[derive(Clone, Copy, Debug, Default)]
struct Deadline(Option<NonZeroU64>);

impl Deadline {
    const NONE: Self = Self(None);

    fn at(t: Instant) -> Self {
        Self(NonZeroU64::new(t.0))
    }

    fn get(self) -> Option<Instant> {
        self.0.map(|n| Instant(n.get()))
    }

    fn is_some(self) -> bool {
        self.0.is_some()
    }
}

/// The earlier of two deadlines, if any.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn count_seen(seen: Seen, out: &mut TransformOutput<'_>) {
    if seen.mismatch {
        out.count(Counter::ReplySeqMismatches as usize);
    }
    if seen.lost {
        out.count(Counter::ReplyStructureLost as usize);
    }
}

fn push_packet(seq: u8, payload: &[u8], out: &mut TransformOutput<'_>) {
    let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN);
    write_packet(seq, payload, &mut bytes);
    out.push(&bytes);
}

/// In-line sizes of the parts of a [`MysqlTransform`] (see `mysql/mod.rs`'s `session_layout`).
pub(super) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::size_of;
    vec![
        ("mysql MysqlTransform", size_of::<MysqlTransform>()),
        ("mysql Arrival", size_of::<Arrival>()),
        ("mysql Forwarding", size_of::<Forwarding>()),
        ("mysql Login", size_of::<Login>()),
        ("mysql TestSide", size_of::<TestSide>()),
        ("mysql ProdSide", size_of::<ProdSide>()),
        ("mysql Statements", size_of::<Statements>()),
        ("mysql ReadOnly", size_of::<ReadOnly>()),
        ("mysql Pickup", size_of::<Pickup>()),
        ("mysql Injections", size_of::<Injections>()),
        ("mysql FrameScanner", size_of::<FrameScanner>()),
        ("mysql ReplyTracker", size_of::<ReplyTracker>()),
        ("mysql StatementMap", size_of::<StatementMap>()),
        ("mysql SessionTypes", size_of::<SessionTypes>()),
        ("mysql AuthExchange", size_of::<AuthExchange>()),
        ("mysql ProdPacket", size_of::<ProdPacket>()),
        ("mysql Injection", size_of::<Injection>()),
        ("mysql test_fifo item", size_of::<TestOwed>()),
        ("mysql prod_fifo item", size_of::<ProdOwed>()),
    ]
    .into_iter()
    .chain(super::observe::layout())
    .collect()
}

/// The [`StreamTransform`] of one MySQL session. See the module documentation.
pub struct MysqlTransform {
    shared: Arc<Shared>,
    /// The latest time the engine gave us (deadlines are set where no `now` is passed).
    now: Instant,
    /// When the captured bytes being handled were captured (the engine's `now` when it did not
    /// say): production's latencies are measured between capture times.
    captured: Instant,
    /// `--report`: what the comparison report learns of this session.
    observer: Option<Box<Observer>>,
    arrival: Arrival,
    fwd: Forwarding,
    login: Login,
    pickup: Pickup,
    test: TestSide,
    inject: Injections,
    /// The waits for a transaction boundary before writes go, after a pickup or a capture
    /// gap (`txn_gate.rs`); gone once each is proven.
    gates: Option<Box<Gates>>,
    prod: ProdSide,
    stmts: Statements,
    /// Which statements the test server has parameter types for; `None` until one with
    /// parameters is prepared there.
    types: Option<Box<SessionTypes>>,
    read_only: ReadOnly,
}

impl fmt::Debug for MysqlTransform {
    // Phases and sizes only: the state holds passwords during auth exchanges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlTransform")
            .field("picked_up", &self.picked_up())
            .field("dead", &self.dead())
            .field("stage", &self.fwd.stage())
            .field("test_phase", &self.test.phase())
            .field("prod_phase", &self.prod.phase())
            .field("blocked", &self.fwd.blocked())
            .field("backlog", &self.fwd.backlog_len())
            .field("statements", &self.stmts.len())
            .finish_non_exhaustive()
    }
}

impl MysqlTransform {
    pub(super) fn new(
        now: Instant,
        session: &SessionInfo,
        shared: Arc<Shared>,
        replica: Replica,
    ) -> Self {
        let picked_up = session.picked_up;
        let observer = shared.config.report.map(|h| {
            let prepared = Arc::clone(&shared.prepared_shapes);
            Box::new(Observer::new(
                h,
                replica,
                shared.config.max_statements,
                prepared,
            ))
        });
        // The report fingerprints each command's SQL: the arrival reader then keeps that much
        // of each packet (only packets split across segments are copied).
        // A picked-up session tells `USE` from other queries as they arrive (see
        // `PickupState::schema_changes`).
        let arrival_prefix = if observer.is_some() {
            SQL_LOOKED_AT
        } else if picked_up {
            VARIABLE_PREFIX
        } else {
            1
        };
        let compare = observer.as_ref().is_some_and(|o| o.compare_results());
        // A picked-up session's statements are prepared again without types (`--prod-dsn`),
        // and production answers the executes held for them before the test server can: those
        // answers verify the first guesses, so they are kept from the start.
        let types = (picked_up && shared.config.recovery_wait.is_some())
            .then(|| Box::new(SessionTypes::new(shared.config.max_statements)));
        Self {
            now,
            captured: now,
            observer,
            arrival: Arrival::new(arrival_prefix, picked_up),
            fwd: Forwarding::new(picked_up),
            login: Login::new(),
            pickup: Pickup::new(picked_up, &shared.config),
            test: TestSide::new(),
            inject: Injections::new(),
            gates: picked_up.then(|| Box::new(Gates::new(Cause::Pickup, 0))),
            prod: ProdSide::new(picked_up, compare),
            stmts: Statements::new(picked_up),
            types,
            read_only: ReadOnly::default(),
            shared,
        }
    }

    fn give_up(&mut self, a: Abandon, out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        out.count(a.counter as usize);
        out.abandon(a.why);
        self.fwd.give_up();
        // Passwords and held bytes go now, not when the engine drops the session.
        self.login.forget();
        self.test.forget_owed();
        self.fwd.forget();
        self.inject.clear();
        self.types = None;
        if let Some(o) = &mut self.observer {
            o.flush();
        }
    }
}

impl MysqlTransform {
    /// Picked up mid-stream: the login was not seen (only such a session has pickup state).
    fn picked_up(&self) -> bool {
        self.pickup.active()
    }

    /// The session was given up: nothing more is read or sent.
    fn dead(&self) -> bool {
        self.fwd.given_up()
    }

    /// The serial of the oldest client command the test server has not answered, if a replay
    /// could start there.
    fn unsettled_serial(&self) -> Option<u64> {
        if self.dead() || self.login.is_tls() || self.fwd.stage() != ClientStage::Commands {
            return None;
        }
        Some(
            self.test
                .oldest_owed_serial()
                .unwrap_or_else(|| self.fwd.serial()),
        )
    }

    /// The length of the SSLRequest `data` starts with, when TLS sessions are mirrored from
    /// their plaintext and `data` is the start of a client's stream.
    fn ssl_request_at_start(&self, data: &[u8]) -> Option<usize> {
        if !self.shared.config.tls_plaintext
            || self.picked_up()
            || self.login.is_tls()
            || self.fwd.stage() != ClientStage::Login
            || !self.arrival.at_start()
        {
            return None;
        }
        let h = PacketHeader::parse(data)?;
        let len = HEADER_LEN + SSL_REQUEST_LEN;
        let caps = data.get(HEADER_LEN..HEADER_LEN + 4)?;
        let caps = Capabilities(u32::from_le_bytes([caps[0], caps[1], caps[2], caps[3]]));
        (data.len() >= len
            && h.len as usize == SSL_REQUEST_LEN
            && h.seq == 1
            && caps.contains(Capabilities::SSL)
            && caps.contains(Capabilities::PROTOCOL_41))
        .then_some(len)
    }
}

impl StreamTransform for MysqlTransform {
    fn on_client_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        self.now = now;
        self.captured = out.captured_at().unwrap_or(now);
        // A TLS session's SSLRequest: the bytes after it are ciphertext (the TLS handshake
        // may share its segment), never to be framed; the session's stream goes on with the
        // plaintext of the client's login.
        let data = match self.ssl_request_at_start(data) {
            Some(len) => &data[..len],
            None => data,
        };
        if self.picked_up() && self.shared.config.tls_plaintext {
            if !self.login.is_tls() && self.arrival.at_start() && tls_record_start(data) {
                // A pooled TLS connection: its plaintext comes from the probe.
                self.login.picked_up_tls();
                out.count(Counter::TlsSessionsFromPlaintext as usize);
                out.start_tls();
                return;
            }
            if self.login.tls_wants_header() {
                match login::pickup_piece(data, plausible_command) {
                    PickupPiece::Header | PickupPiece::Whole => self.login.tls_framed(),
                    PickupPiece::Body(header) => {
                        self.login.tls_framed();
                        out.count(Counter::TlsPickupHeadersRestored as usize);
                        self.on_client_data(now, &header, out);
                    }
                    PickupPiece::Unknown => {
                        out.add(Counter::TlsPickupBytesLost as usize, data.len() as u64);
                        return;
                    }
                }
            }
        }
        self.arrive(data, out);
        if self.fwd.blocked() {
            self.hold(data, out);
        } else {
            let n = self.run(data, out);
            self.hold(&data[n.min(data.len())..], out);
        }
        self.resume(out);
    }

    fn on_pickup(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead() || !self.picked_up() {
            return;
        }
        if let Some(wait) = self.shared.config.recovery_wait {
            self.pickup.wait_for_recovery(now + wait);
        } else if self.pickup.no_user() {
            self.give_up(
                abandon(Counter::PickupNoDefaultUser, "pickup_no_default_user"),
                out,
            );
        }
    }

    fn wants_prod_data(&self) -> bool {
        true
    }

    fn replays(&self) -> bool {
        true
    }

    fn client_offset(&self) -> u64 {
        self.arrival.position()
    }

    /// The oldest client command the test server has not answered (sent and awaiting its
    /// reply, or not forwarded yet): only between commands, and not for a TLS session (its
    /// plaintext is not the captured stream).
    fn replay_from(&self) -> Option<u64> {
        self.unsettled_serial()?;
        match self.test.oldest_owed_start() {
            Some(start) => start,
            // Nothing owed: the next packet the forwarding reader decides, if it stands at one.
            None => self.fwd.at_command_start().then(|| {
                self.arrival
                    .position()
                    .saturating_sub(self.fwd.unread_len() as u64)
            }),
        }
    }

    fn carried_over(&mut self) {
        if let (Some(serial), Some(o)) = (self.unsettled_serial(), &mut self.observer) {
            o.resent_from(serial);
        }
    }

    /// Production's replies to the replayed commands went by before this session began: its
    /// next bytes answer the next command, framed from there as after a pickup.
    fn on_replayed(&mut self, _now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        self.lose_all_prod(out);
        self.prod.unsync();
    }

    /// Commands lost whole cost nothing else: the test server has every command before them
    /// and gets every command after. That holds only while both client readers stand between
    /// two packets (the forwarding one lags the arrival one by whole packets held in
    /// `backlog`, so the arrival reader tells for both) and the login is over; a command cut
    /// in two cannot be completed, and its start may be on the test server already.
    fn on_client_gap(&mut self, _now: Instant, out: &mut TransformOutput<'_>) -> bool {
        if self.dead() {
            return false;
        }
        if self.fwd.stage() != ClientStage::Commands
            || !self.arrival.at_boundary()
            || self.login.change_user_in_flight()
        {
            out.count(Counter::CaptureGapsInsideCommand as usize);
            return false;
        }
        self.arrival.gap();
        // Production answered the lost commands too, in bytes no reply can be paired with: its
        // replies are framed again from the next command on, as after a pickup.
        self.lose_all_prod(out);
        self.prod.unsync();
        self.stmts.capture_gap();
        // The gap may hold a transaction's start, or writes of one the test server saw
        // begin: the writes after it wait for a boundary production proves. (`--read-only`
        // keeps every write off anyway.)
        if !self.shared.config.read_only {
            let at = self.arrival.next_serial();
            match &mut self.gates {
                Some(g) => g.gap(at),
                None => self.gates = Some(Box::new(Gates::new(Cause::CaptureGap, at))),
            }
        }
        true
    }

    fn starts_command(&self, head: &[u8]) -> bool {
        self.fwd.stage() == ClientStage::Commands && plausible_command(head)
    }

    /// Production's replies have a hole: the replies owed are lost to the comparison (and a
    /// prepare's answer to the statement map), and framing starts again at the next command.
    /// Nothing changes for the test server.
    fn on_prod_gap(&mut self, _now: Instant, out: &mut TransformOutput<'_>) -> bool {
        if self.dead() {
            return false;
        }
        self.lose_all_prod(out);
        self.prod.unsync();
        if self.gates.is_some() {
            // A write held for one of the lost replies is decided now.
            self.resume(out);
        }
        true
    }

    fn on_prod_data(&mut self, now: Instant, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        self.now = now;
        self.captured = out.captured_at().unwrap_or(now);
        self.prod_data(data, out);
    }

    /// intercept's MySQL summaries of the test server's replies. Segments are the engine's
    /// TCP business: everything MySQL needs is in the summaries.
    fn on_test_event(&mut self, now: Instant, ev: &TestEvent<'_>, out: &mut TransformOutput<'_>) {
        match ev {
            TestEvent::Mysql(MysqlEvent::Packet { packet, .. }) => {
                let received = out.captured_at().unwrap_or(now);
                self.test_packet_at(now, received, packet, out)
            }
            TestEvent::Mysql(MysqlEvent::Rows { rows, .. }) => {
                let received = out.captured_at().unwrap_or(now);
                self.test_rows_at(now, received, rows, out)
            }
            TestEvent::Mysql(MysqlEvent::FramingLost { at_seq, .. }) => {
                self.on_test_framing_lost(now, *at_seq, out)
            }
            TestEvent::Mysql(MysqlEvent::FramingResumed { .. }) => {
                self.on_test_framing_resumed(now, out)
            }
            TestEvent::App(any) => {
                if let Some(state) = any.downcast_ref::<RecoveredState>() {
                    self.recover(now, state.clone(), out);
                } else if any.is::<NotRecovered>() {
                    self.recovery_unavailable(out);
                }
            }
            _ => {}
        }
    }

    fn pending(&self) -> bool {
        !self.dead() && (self.login.client_login_held() || self.fwd.blocked())
    }

    /// Not while the held command waits only because the test server owes `MAX_IN_FLIGHT`
    /// replies already: it has work for far longer than a capture block.
    fn waits_on_test(&self) -> bool {
        !self.dead()
            && (self.login.client_login_held() || (self.fwd.blocked() && !self.fwd.backpressed()))
    }

    fn buffered_len(&self) -> usize {
        self.fwd.buffered_len() + self.login.held_len() + self.inject.bytes()
    }

    /// Our size and everything we allocated that grows with the session: held commands, the
    /// statement map, the queues of expected replies, the report's observer. Capacities, since
    /// that is what the allocator gave out; an estimate where exact is O(n).
    fn memory_len(&self) -> usize {
        SMALL_ALLOCATIONS
            + std::mem::size_of::<Self>()
            + self.fwd.memory_len()
            + self.login.held_len()
            + self.inject.memory_len()
            + self.pickup.memory_len()
            + self.test.memory_len()
            + self.prod.memory_len()
            + self.stmts.memory_len()
            + self.read_only.memory_len()
            + self.types.as_ref().map_or(0, |t| t.memory_len())
            + self.observer.as_ref().map_or(0, |o| o.memory_len())
    }

    fn next_deadline(&self) -> Option<Instant> {
        // The engine asks several times per packet (issue 20's profile: 3% of the copier's
        // CPU as an iterator over an array of options): plain minimums, and the picked-up
        // session's two only when there is one.
        if self.dead() {
            return None;
        }
        let mut at = earlier(self.fwd.held_deadline(), self.test.resync_deadline());
        at = earlier(at, self.pickup.deadline());
        if let Some(g) = self.gates.as_deref() {
            at = earlier(at, g.deadline());
        }
        if let Some(o) = self.observer.as_deref() {
            at = earlier(at, o.trim_deadline());
        }
        at
    }

    fn on_timeout(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        self.now = now;
        if let Some(o) = &mut self.observer {
            o.on_timeout(now);
        }
        if self.test.resync_deadline().is_some_and(|d| now >= d) {
            // The probe's answer never came (intercept missed it, or the test server is
            // further behind than we wait): blind for the rest of this loss.
            self.lose_framing(out);
            self.resume(out);
            if self.dead() {
                return;
            }
        }
        if self.fwd.held_timed_out(now) {
            if self.test.summarized(out.test_stream_seen()) {
                // Nothing the test server sent lacks its summary: it has not answered yet (its
                // threads may wait seconds for a CPU), and its answer will come with one.
                self.fwd.hold_on(now);
            } else {
                // The test server's stream went on past its summaries: the PREPARE_OK's was
                // dropped on the way (intercept's relay queue). Nothing more will come (the
                // test server gets no new command), so stop following its replies.
                out.count(Counter::HeldTimeouts as usize);
                self.lose_framing(out);
                self.resume(out);
                if self.dead() {
                    return;
                }
            }
        }
        if self.pickup.variables_wait_over(now) {
            self.resume(out);
            if self.dead() {
                return;
            }
        }
        if self
            .gates
            .as_deref()
            .and_then(Gates::deadline)
            .is_some_and(|d| now >= d)
        {
            // The held command goes unproven (`transaction_first` counts it).
            self.resume(out);
            if self.dead() {
                return;
            }
        }
        self.recovery_timed_out(now, out);
    }

    fn poll_observation(&mut self) -> Option<Observation> {
        let now = self.now;
        self.observer.as_mut()?.poll(now)
    }

    fn end(&mut self) {
        let resyncing = self.test.phase() == TestPhase::Resyncing;
        if let Some(o) = &mut self.observer {
            if resyncing {
                // The test server's answers to what went after the probe were never readable:
                // unseen, as in a blind session, not lost.
                o.test_lost_all();
            }
            o.flush();
        }
    }
}
