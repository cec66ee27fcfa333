//! The test server's side: what it owes for what it was sent, and its replies as intercept
//! summarises them (`on_test_packet`, `on_test_event`), cut into replies by following each
//! reply's structure ([`ReplyTracker`]) and matched in order with what it owes.
//!
//! # What this room is for
//!
//! Knowing, for every reply the test server sends, which command it answers: a client's
//! (numbered by its serial) or one of ours (login, injected `SET`s, re-prepares, the resync
//! probe). The statement map pairs prepares through it, and the forwarding reader holds a
//! command until the test server owes few enough. When intercept loses the stream the session
//! goes blind (commands still go, replies are no longer read), and one probe of ours
//! (`resync.rs`) may find a reply boundary again.
//!
//! # What it must never do
//!
//! * Pair replies across a hole: replies are matched in order only while intercept's
//!   summaries are whole; a gap (or a PREPARE_OK that never came) ends the framing and the
//!   session goes blind, since one wrong pairing would shift every reply after it.
//! * Owe more than [`MAX_TEST_OWED`]: past it the session is given up, so a test server that
//!   stopped answering cannot grow the bookkeeping without bound.
//! * Read a reply's rows: intercept folds them into runs, only their count and structure are
//!   checked.

use std::collections::VecDeque;

use common::clock::Instant;
use common::control::{MysqlPacket, MysqlRows};
use common::mysql::command::{com, PrepareOk};
use common::mysql::handshake::Capabilities;
use common::mysql::packet::{HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::stmt::PrepareAnswer;

use super::super::param_types::SessionTypes;
use super::super::replies::{ReplyKind, ReplyTracker};
use super::super::resync::{self, RESYNC_WAIT};
use super::super::Counter;
use super::login::AuthExchange;
use super::{
    abandon, count_seen, first_reply_id, protocol, Abandon, Deadline, MysqlTransform, LOST_ANSWER,
    MAX_TEST_OWED,
};
use crate::engine::TransformOutput;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TestPhase {
    Greeting,
    /// Greeting known, our login not sent yet (no client login, or waiting for recovery).
    Login,
    /// Our login sent; following the auth exchange.
    Auth,
    Commands,
    /// intercept lost framing after the login: no more replies will be seen.
    Blind,
    /// Blind, and our COM_STATISTICS sent to find a reply boundary again (`resync.rs`):
    /// commands are expected as in `Commands`, their replies seen once the probe's is.
    Resyncing,
}

/// What the test server owes for something we sent it.
pub(super) enum TestExpect {
    Reply(ReplyKind),
    /// A COM_STMT_PREPARE tracked in the statement map; `recovered`: ours, of a statement
    /// production had before we saw the connection.
    Prepare {
        recovered: bool,
    },
    /// Our own COM_INIT_DB (recovered or default schema).
    InitDb,
    /// Our own `SET` of a recovered variable.
    SetVariable,
    /// A COM_CHANGE_USER, whose reply is an auth exchange.
    ChangeUser(Box<AuthExchange>),
}

impl TestExpect {
    fn kind(&self) -> ReplyKind {
        match self {
            Self::Reply(k) => *k,
            Self::Prepare { .. } => ReplyKind::Prepare,
            Self::InitDb | Self::SetVariable => ReplyKind::Generic,
            Self::ChangeUser(_) => ReplyKind::Auth,
        }
    }
}

/// `TestOwed::client` of something of ours.
const OURS: u64 = u64::MAX;
/// `TestOwed::start` not known.
const UNKNOWN: u64 = u64::MAX;

/// One reply the test server owes.
pub(super) struct TestOwed {
    expect: TestExpect,
    /// The serial of the client command it answers, or [`OURS`] (not `Option`s, these two:
    /// the entry stays 40 bytes with `start` beside it, and an idle session keeps a few).
    client: u64,
    /// Where that command starts in the client's stream (a replay's start), or [`UNKNOWN`].
    start: u64,
    /// The id of the reply's first packet (see [`first_reply_id`]).
    first_reply_id: u8,
}

impl TestOwed {
    fn serial(&self) -> Option<u64> {
        (self.client != OURS).then_some(self.client)
    }
}

/// The test server's replies and what it owes.
pub(super) struct TestSide {
    phase: TestPhase,
    /// What the test server owes, oldest first.
    owed: VecDeque<TestOwed>,
    /// Where the next summary is due in the test server's stream (a gap before it ends the
    /// framing).
    next_offset: u64,
    prev_len: u32,
    prev_seq: Option<u8>,
    replies: ReplyTracker,
    /// While `Resyncing`: when the probe is given up.
    resync_until: Deadline,
    /// The probe for this loss of framing was tried (or cannot work): no other until intercept
    /// says it lost the stream again.
    resync_spent: bool,
}

impl TestSide {
    /// Whether every byte of the test server's stream seen so far (`seen`, modulo 2^32: see
    /// `TransformOutput::test_stream_seen`) has had its summary. A summary may run ahead of
    /// the bytes seen (a packet's summary covers the whole packet from its first segment).
    pub(super) fn summarized(&self, seen: u32) -> bool {
        // Truncated: both are offsets modulo 2^32, compared within half of it.
        (seen.wrapping_sub(self.next_offset as u32) as i32) <= 0
    }

    pub(super) fn new() -> Self {
        Self {
            phase: TestPhase::Greeting,
            owed: VecDeque::new(),
            next_offset: 0,
            prev_len: 0,
            prev_seq: None,
            replies: ReplyTracker::new(),
            resync_until: Deadline::NONE,
            resync_spent: false,
        }
    }

    pub(super) fn phase(&self) -> TestPhase {
        self.phase
    }

    pub(super) fn blind(&self) -> bool {
        self.phase == TestPhase::Blind
    }

    /// Logged in: client commands may go (whether or not their replies can be read).
    pub(super) fn past_login(&self) -> bool {
        matches!(
            self.phase,
            TestPhase::Commands | TestPhase::Blind | TestPhase::Resyncing
        )
    }

    /// The greeting was read; our login is next.
    pub(super) fn greeted(&mut self) {
        self.phase = TestPhase::Login;
    }

    /// Our login went out: its auth exchange follows.
    pub(super) fn login_sent(&mut self) {
        self.phase = TestPhase::Auth;
    }

    /// The test server accepted our login.
    pub(super) fn logged_in(&mut self) {
        self.phase = TestPhase::Commands;
    }

    /// How many replies the test server owes.
    pub(super) fn owed(&self) -> usize {
        self.owed.len()
    }

    /// The test server owes a reply to `e`, sent for the client command `serial` (`None`: for
    /// something of ours). Nothing is owed while blind: no reply would be read.
    pub(super) fn owe(&mut self, e: TestExpect, serial: Option<u64>) -> Result<(), Abandon> {
        if self.blind() {
            return Ok(());
        }
        if self.owed.len() >= MAX_TEST_OWED {
            return Err(protocol("test_server_not_answering"));
        }
        self.owed.push_back(TestOwed {
            expect: e,
            client: serial.unwrap_or(OURS),
            start: UNKNOWN,
            first_reply_id: 1,
        });
        Ok(())
    }

    /// The oldest client command the test server owes a reply.
    pub(super) fn oldest_owed_serial(&self) -> Option<u64> {
        self.owed.iter().find_map(TestOwed::serial)
    }

    /// Where the oldest client command the test server owes a reply starts in the client's
    /// stream: `None` if it owes none, `Some(None)` if that start is not known.
    pub(super) fn oldest_owed_start(&self) -> Option<Option<u64>> {
        self.owed
            .iter()
            .find(|o| o.client != OURS)
            .map(|o| (o.start != UNKNOWN).then_some(o.start))
    }

    /// The newest reply owed answers a command that starts at `start` in the client's stream.
    pub(super) fn newest_starts_at(&mut self, start: u64) {
        if let Some(b) = self.owed.back_mut() {
            b.start = start;
        }
    }

    /// Whether the newest reply owed answers the client command `serial`.
    pub(super) fn newest_owed_to(&self, serial: u64) -> bool {
        self.owed.back().is_some_and(|b| b.serial() == Some(serial))
    }

    /// The newest command owed a reply went on in a continuation packet with id `seq`.
    pub(super) fn continued(&mut self, seq: u8) {
        if let Some(owed) = self.owed.back_mut() {
            owed.first_reply_id = first_reply_id(seq);
        }
    }

    pub(super) fn set_deprecate_eof(&mut self, on: bool) {
        self.replies.set_deprecate_eof(on);
    }

    pub(super) fn resync_deadline(&self) -> Option<Instant> {
        self.resync_until.get()
    }

    /// The session is given up: nothing owed is awaited any more (passwords in a
    /// COM_CHANGE_USER's exchange go with it).
    pub(super) fn forget_owed(&mut self) {
        self.owed.clear();
    }

    pub(super) fn memory_len(&self) -> usize {
        self.owed.capacity() * std::mem::size_of::<TestOwed>()
    }
}

impl MysqlTransform {
    /// One MySQL packet of the test server's reply stream, as intercept summarised it (in
    /// stream order; a copy of one already seen is ignored, a gap ends framing).
    pub fn on_test_packet(
        &mut self,
        now: Instant,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) {
        self.test_packet_at(now, now, pkt, out);
    }

    /// What every summary or run of the test server's stream goes through first: `bytes` of
    /// the stream from `stream_offset`, received at `received`. False when there is nothing
    /// more to do with it: the session is dead, it was seen already, or events were lost
    /// before it (the framing is then lost).
    fn test_in_order(
        &mut self,
        now: Instant,
        received: Instant,
        stream_offset: u64,
        bytes: u64,
        out: &mut TransformOutput<'_>,
    ) -> bool {
        if self.dead() {
            return false;
        }
        self.now = now;
        self.captured = received;
        // The test server is making progress (slow commands before the prepare).
        self.fwd.test_progressed(now);
        if stream_offset < self.test.next_offset {
            return false;
        }
        if stream_offset > self.test.next_offset && self.test.phase != TestPhase::Resyncing {
            self.lose_framing(out);
            self.resume(out);
            return false;
        }
        self.test.next_offset = stream_offset.saturating_add(bytes);
        true
    }

    /// A packet summary received from intercept at `received` (the report's test latencies
    /// end there).
    pub(super) fn test_packet_at(
        &mut self,
        now: Instant,
        received: Instant,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) {
        let bytes = HEADER_LEN as u64 + u64::from(pkt.len);
        if !self.test_in_order(now, received, pkt.stream_offset, bytes, out) {
            return;
        }
        let test = &mut self.test;
        let continuation = test.prev_len as usize == MAX_PAYLOAD_LEN;
        let prev = test.prev_seq.replace(pkt.seq_id);
        test.prev_len = pkt.len;
        let seen = (test.phase == TestPhase::Commands).then(|| {
            let next = test.owed.front().map_or((ReplyKind::Generic, 1), |o| {
                (o.expect.kind(), o.first_reply_id)
            });
            let seen =
                test.replies
                    .packet(pkt.seq_id, prev, pkt.len, &pkt.head, continuation, next);
            count_seen(seen, out);
            seen
        });
        let starts_reply = seen.is_some_and(|s| s.start);
        let r = match self.test.phase {
            TestPhase::Greeting => self.test_greeting(pkt, continuation, out),
            TestPhase::Login => Err(protocol("test_server_spoke_first")),
            TestPhase::Auth if continuation => Err(protocol("auth_packet_too_long")),
            TestPhase::Auth => self.auth_packet(pkt, out),
            TestPhase::Commands if self.login.in_exchange() => {
                if continuation {
                    Ok(())
                } else {
                    self.auth_packet(pkt, out)
                }
            }
            TestPhase::Commands if starts_reply => self.test_reply(pkt, out),
            TestPhase::Resyncing => {
                if resync::is_probe_answer(pkt.seq_id, pkt.len, &pkt.head, continuation) {
                    self.resynced(out);
                }
                Ok(())
            }
            TestPhase::Commands | TestPhase::Blind => Ok(()),
        };
        if let (Some(seen), Some(o)) = (seen, &mut self.observer) {
            o.test_packet(&seen, pkt.len, &pkt.head, pkt.hash, continuation, received);
        }
        if let Err(a) = r {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// Rows and definitions intercept folded into a run: only counted, and checked against
    /// the structure followed so far.
    pub(super) fn test_rows_at(
        &mut self,
        now: Instant,
        received: Instant,
        run: &MysqlRows,
        out: &mut TransformOutput<'_>,
    ) {
        if !self.test_in_order(now, received, run.stream_offset, run.bytes, out) {
            return;
        }
        let prev = self.test.prev_seq.replace(run.last_seq_id());
        // Runs never hold a 16 MiB packet: the next packet starts a payload.
        self.test.prev_len = 0;
        if self.test.phase != TestPhase::Commands || self.login.in_exchange() {
            // intercept folds only result sets; nothing here reads them.
            return;
        }
        let follows = prev.map(|p| p.wrapping_add(1)) == Some(run.seq_id);
        let folded = self.test.replies.folded(run.count, run.eof, follows);
        if folded.is_none() {
            out.count(Counter::ReplyStructureLost as usize);
        }
        if let Some(o) = &mut self.observer {
            o.test_folded(folded.map(|(_definitions, rows)| rows), run.payload_bytes());
        }
        self.resume(out);
    }

    /// intercept can no longer frame the test server's replies of this session.
    pub fn on_test_framing_lost(
        &mut self,
        now: Instant,
        _at_seq: u32,
        out: &mut TransformOutput<'_>,
    ) {
        if self.dead() || self.test.phase == TestPhase::Resyncing {
            // A restarted intercept finds our probe's answer as well as the one before it,
            // if the test server has not sent it yet; if it has, the wait runs out.
            return;
        }
        self.now = now;
        self.lose_framing(out);
        // intercept holds the stream as lost from now on: a probe of ours can find it again.
        self.test.resync_spent = false;
        self.resume(out);
    }

    pub(super) fn lose_framing(&mut self, out: &mut TransformOutput<'_>) {
        match self.test.phase {
            TestPhase::Blind => return,
            _ if !self.test_ready() || self.login.in_exchange() => {
                // Without the test server's answers the login cannot be completed.
                self.give_up(abandon(Counter::FramingLost, "framing_lost"), out);
                return;
            }
            TestPhase::Resyncing => {
                // The probe did not find the stream again: its wait ends blind, as before it.
                out.count(Counter::ResyncsFailed as usize);
                self.test.resync_until = Deadline::NONE;
                self.test.resync_spent = true;
            }
            _ => {
                out.count(Counter::FramingLost as usize);
                self.test.resync_spent = false;
            }
        }
        self.test.phase = TestPhase::Blind;
        self.test.owed.clear();
        out.settled();
        // Otherwise a later prepare would be paired with an answer owed from before.
        self.stmts.test_answers_lost();
        if let Some(t) = &mut self.types {
            t.test_lost();
        }
        if let Some(o) = &mut self.observer {
            o.test_lost_all();
        }
        // Re-prepares would never be paired: not worth sending.
        self.inject.drop_reprepares();
    }

    /// intercept frames the test server's replies again from the end of our probe's answer:
    /// stream offsets count from there.
    pub(super) fn on_test_framing_resumed(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if self.dead() {
            return;
        }
        self.now = now;
        if self.test.phase != TestPhase::Resyncing {
            // The answer to a probe given up on: the replies that follow belong to commands
            // this session no longer expects.
            return;
        }
        self.test.next_offset = 0;
        self.resynced(out);
        self.resume(out);
    }

    /// The probe's answer is behind us: the next reply is the first command's after it.
    fn resynced(&mut self, out: &mut TransformOutput<'_>) {
        out.count(Counter::TestFramingResumed as usize);
        let test = &mut self.test;
        test.phase = TestPhase::Commands;
        test.resync_until = Deadline::NONE;
        test.prev_seq = None;
        test.prev_len = 0;
        test.replies.reset();
    }

    /// A blind session sends its probe in front of the client command about to go, the
    /// one place (with `flush_injections`) where bytes of ours cannot split a command.
    pub(super) fn probe_before_command(&mut self, out: &mut TransformOutput<'_>) {
        let client_asks = self.fwd.code() == Some(com::STATISTICS);
        match self.test.phase {
            TestPhase::Resyncing if client_asks => {
                // Two answers would then be on their way; which one intercept finds is a
                // guess, and a wrong guess shifts every reply after it.
                self.lose_framing(out);
            }
            TestPhase::Blind if client_asks => self.test.resync_spent = true,
            TestPhase::Blind if !self.test.resync_spent && !self.login.in_exchange() => {
                out.count(Counter::ResyncProbes as usize);
                out.push(&resync::PROBE);
                let test = &mut self.test;
                test.phase = TestPhase::Resyncing;
                test.resync_until = Deadline::at(self.now + RESYNC_WAIT);
                test.resync_spent = true;
            }
            _ => {}
        }
    }

    /// The first packet of the test server's reply to the oldest command it owes one.
    fn test_reply(
        &mut self,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some(owed) = self.test.owed.pop_front() else {
            out.count(Counter::RepliesUnmatched as usize);
            return Ok(());
        };
        out.settled();
        let serial = owed.serial();
        let expect = owed.expect;
        if let (Some(serial), Some(o)) = (serial, &mut self.observer) {
            o.test_start(serial, self.captured);
        }
        match expect {
            TestExpect::Reply(_) => {
                if let (Some(serial), Some(t)) = (serial, self.types.as_deref_mut()) {
                    let refused = (pkt.head.first() == Some(&0xff)).then(|| {
                        pkt.head
                            .get(1..3)
                            .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]))
                    });
                    if t.test_answered(serial, refused) {
                        out.count(Counter::ParamTypesCorrected as usize);
                    }
                }
            }
            TestExpect::Prepare { recovered } => {
                let answer = PrepareAnswer::parse(&pkt.head).unwrap_or_else(|_| {
                    out.count(Counter::ProtocolErrors as usize);
                    LOST_ANSWER
                });
                if let PrepareAnswer::Ok { statement_id } = answer {
                    self.test_prepared(statement_id, &pkt.head, recovered);
                }
                let r = self.stmts.map(&self.shared).test_answer(answer);
                self.resolved(r, out);
            }
            TestExpect::InitDb => {
                if pkt.head.first() == Some(&0xff) {
                    out.count(Counter::RecoveryInitDbFailed as usize);
                }
            }
            TestExpect::SetVariable => {
                if pkt.head.first() == Some(&0xff) {
                    out.count(Counter::RecoverySetFailed as usize);
                }
            }
            TestExpect::ChangeUser(ex) => {
                self.login.resume_exchange(ex);
                return self.auth_packet(pkt, out);
            }
        }
        Ok(())
    }

    /// The test server prepared `test_id` (`recovered`: for a statement production had before
    /// we saw the connection): the parameter count its executes need types for.
    fn test_prepared(&mut self, test_id: u32, head: &[u8], recovered: bool) {
        let Ok(ok) = PrepareOk::parse(head) else {
            return;
        };
        // With MySQL's query attributes an execute carries parameter names and a count too:
        // a layout the type bookkeeping does not read. Its executes pass as they are.
        if self
            .login
            .caps_either()
            .contains(Capabilities::QUERY_ATTRIBUTES)
        {
            return;
        }
        if ok.num_params == 0 && self.types.is_none() {
            return;
        }
        let limit = self.shared.config.max_statements;
        self.types
            .get_or_insert_with(|| Box::new(SessionTypes::new(limit)))
            .prepared(test_id, ok.num_params, recovered);
    }

    /// Whether the test server takes client commands now.
    pub(super) fn test_ready(&self) -> bool {
        self.test.past_login() && !self.login.change_user_in_flight()
    }

    /// The test server owes an answer to something of ours.
    pub(super) fn test_owes_ours(&mut self, e: TestExpect) -> Result<(), Abandon> {
        self.test.owe(e, None)
    }

    /// The test server owes an answer to the client command being decided.
    pub(super) fn test_owes_client(&mut self, e: TestExpect) -> Result<(), Abandon> {
        self.test.owe(e, Some(self.fwd.serial()))
    }
}
