//! Prepared statements: production's statement ids translated to the test server's, by
//! pairing both servers' answers to each COM_STMT_PREPARE (`common::mysql::stmt`), and every
//! statement command (execute, close, reset, fetch, long data, bulk execute) rewritten or
//! dropped accordingly.
//!
//! # What this room is for
//!
//! The two servers number statements independently. Each prepare the client sends is paired
//! with production's answer (seen as captured, possibly before the forwarding reader reaches
//! the prepare: the answers wait in `prod_answers`, the prepares in `unanswered`) and with
//! the test server's; once both are in, the map translates every later command naming it.
//!
//! # What it must never do
//!
//! * Send a statement command with production's id untranslated when the ids differ: a
//!   command naming a statement the test server does not have is dropped and counted (by why:
//!   unknown, refused, prepared before the pickup or in a capture gap, untracked).
//! * Grow without bound: answers and prepares waiting for their partner are bounded by
//!   [`MAX_IN_FLIGHT`]; past it pairing is given up (`tracking_lost`) and every id is
//!   untranslatable, rather than pairing the wrong ones.

use std::collections::VecDeque;
use std::mem::size_of;

use common::mysql::command::{self, com};
use common::mysql::packet::{write_packet, PacketHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::stmt::{PrepareAnswer, Resolution, StatementMap, UnmappedReason, LAST_PREPARED};

use super::super::param_types::{Exec, Execute};
use super::super::replies::ReplyKind;
use super::super::{Counter, Shared};
use super::test_side::{TestExpect, TestPhase};
use super::{expects_reply, protocol, Abandon, MysqlTransform, Verdict, MAX_IN_FLIGHT};
use crate::engine::TransformOutput;

/// What became of a client's COM_STMT_PREPARE, for pairing production's answer with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// Sent to the test server and given to the statement map.
    Tracked,
    /// Sent, not tracked (framing or tracking lost): production's answer is not needed.
    Untracked,
    /// Not sent (`--read-only`): production's id is remembered so its executes are not sent.
    Skipped,
    /// Not sent: a picked-up connection prepared it in a schema nobody read
    /// (`variables_first`). Like `Skipped`, its executes are lost with it, and counted.
    Lost,
}

/// The statement map and the pairing of prepares with production's answers.
pub(super) struct Statements {
    /// `None` until the first statement command: a session that never prepares one (most
    /// text-protocol clients) does not carry an empty map's 104 bytes.
    map: Option<Box<StatementMap>>,
    /// Production's answers to prepares the forwarding reader has not reached yet.
    prod_answers: VecDeque<PrepareAnswer>,
    /// Prepares passed (forwarded or skipped) before production's answer was seen.
    unanswered: VecDeque<Fate>,
    /// Statement pairing gave up (too many answers in flight): every id is untranslatable.
    tracking_lost: bool,
    /// Statements may exist that were prepared before we saw the connection.
    predate_us: bool,
    /// Statements may exist whose prepare the capture lost (a gap was gone past).
    in_gap: bool,
}

impl Statements {
    pub(super) fn new(picked_up: bool) -> Self {
        Self {
            map: None,
            prod_answers: VecDeque::new(),
            unanswered: VecDeque::new(),
            tracking_lost: false,
            predate_us: picked_up,
            in_gap: false,
        }
    }

    /// The map, made at its first use.
    pub(super) fn map(&mut self, shared: &Shared) -> &mut StatementMap {
        self.map
            .get_or_insert_with(|| Box::new(StatementMap::new(shared.config.max_statements)))
    }

    /// The map, if a statement command made it.
    pub(super) fn known(&self) -> Option<&StatementMap> {
        self.map.as_deref()
    }

    pub(super) fn tracking_lost(&self) -> bool {
        self.tracking_lost
    }

    /// The test server's replies are no longer read: a later prepare would otherwise be
    /// paired with an answer owed from before.
    pub(super) fn test_answers_lost(&mut self) {
        if let Some(m) = &mut self.map {
            m.test_answers_lost();
        }
    }

    /// A capture gap was gone past: its prepares were lost with it.
    pub(super) fn capture_gap(&mut self) {
        self.in_gap = true;
    }

    /// Prepares not sent are now of statements gone on both servers: their answers are not
    /// needed any more.
    fn untrack_skipped(&mut self) {
        for f in &mut self.unanswered {
            if matches!(*f, Fate::Skipped | Fate::Lost) {
                *f = Fate::Untracked;
            }
        }
    }

    /// How many statements are mapped (`Debug`).
    pub(super) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub(super) fn memory_len(&self) -> usize {
        self.prod_answers.capacity() * size_of::<PrepareAnswer>()
            + self.unanswered.capacity() * size_of::<Fate>()
            + self
                .map
                .as_ref()
                .map_or(0, |m| size_of::<StatementMap>() + m.memory_len())
    }
}

impl MysqlTransform {
    /// Production's answer to the oldest prepare it had not answered. Its partner in the map
    /// is the oldest prepare forwarded without one, which the forwarding reader may not have
    /// reached yet (commands held while the test server logs in).
    pub(super) fn prod_prepare_answer(
        &mut self,
        answer: PrepareAnswer,
        out: &mut TransformOutput<'_>,
    ) {
        match self.stmts.unanswered.pop_front() {
            Some(fate) => self.prepare_answered(fate, answer, out),
            None if self.stmts.prod_answers.len() >= MAX_IN_FLIGHT => self.lose_tracking(out),
            None => self.stmts.prod_answers.push_back(answer),
        }
    }

    /// A client's COM_STMT_PREPARE was forwarded (and given to the map if tracked) or skipped.
    pub(super) fn prepare_passed(&mut self, fate: Fate, out: &mut TransformOutput<'_>) {
        match self.stmts.prod_answers.pop_front() {
            Some(answer) => self.prepare_answered(fate, answer, out),
            None if self.stmts.unanswered.len() >= MAX_IN_FLIGHT => self.lose_tracking(out),
            None => self.stmts.unanswered.push_back(fate),
        }
    }

    /// Production's answer paired with the prepare it answers.
    fn prepare_answered(
        &mut self,
        fate: Fate,
        answer: PrepareAnswer,
        out: &mut TransformOutput<'_>,
    ) {
        let max = self.shared.config.max_statements;
        match (fate, answer) {
            (Fate::Tracked, _) => {
                let r = self.stmts.map(&self.shared).prod_answer(answer);
                self.resolved(r, out);
            }
            (Fate::Skipped, PrepareAnswer::Ok { statement_id }) => {
                self.read_only.skip_statement(statement_id, max, out)
            }
            (Fate::Lost, PrepareAnswer::Ok { statement_id }) => {
                self.read_only.skip_statement(statement_id, max, out);
                self.read_only.mark_lost(statement_id);
            }
            (Fate::Skipped | Fate::Lost, PrepareAnswer::Err { .. }) | (Fate::Untracked, _) => {}
        }
    }

    fn lose_tracking(&mut self, out: &mut TransformOutput<'_>) {
        let s = &mut self.stmts;
        if !s.tracking_lost {
            out.count(Counter::StatementTrackingLost as usize);
        }
        s.tracking_lost = true;
        s.prod_answers.clear();
        s.unanswered.clear();
    }

    pub(super) fn resolved(&mut self, r: Resolution, out: &mut TransformOutput<'_>) {
        match r {
            Resolution::Waiting
            | Resolution::BothRejected
            | Resolution::Discarded
            | Resolution::TestAnswerLost => {}
            Resolution::Mapped { prod_id, .. } => {
                // A reused id names the new statement.
                self.read_only.statement_mapped(prod_id);
                // Prepared by the client itself between the pickup and production's lookup:
                // its own prepare is the one to use.
                self.pickup.take_deferred(prod_id);
                out.count(Counter::StatementsMapped as usize)
            }
            Resolution::TestRejected { .. } => {
                out.count(Counter::StatementsRejectedOnTest as usize)
            }
            Resolution::Orphaned { test_id } => {
                // No client command will name it; the test server would keep it until the
                // session ends (and count it against max_prepared_stmt_count).
                out.count(Counter::StatementsOrphanedClosed as usize);
                if let Some(t) = &mut self.types {
                    t.closed(test_id);
                }
                self.close_on_test(test_id, out);
            }
            Resolution::Dropped { test_id, .. } => {
                out.count(Counter::StatementsOverLimit as usize);
                if let Some(t) = test_id {
                    if let Some(types) = &mut self.types {
                        types.closed(t);
                    }
                    self.close_on_test(t, out);
                }
            }
            Resolution::Unexpected => out.count(Counter::StatementTrackingLost as usize),
        }
    }

    /// The client's COM_STMT_PREPARE goes to the test server: tracked in the map unless its
    /// answer could not be paired.
    pub(super) fn client_prepare(&mut self, out: &mut TransformOutput<'_>) -> Result<(), Abandon> {
        let tracked = !self.test.blind() && !self.stmts.tracking_lost;
        if tracked {
            let sql = &self.fwd.head()[HEADER_LEN + 1..];
            self.stmts.map(&self.shared).prepare_sent(sql);
        }
        self.read_only.prepare_sent();
        self.prepare_passed(
            if tracked {
                Fate::Tracked
            } else {
                Fate::Untracked
            },
            out,
        );
        self.test_owes_client(if tracked {
            TestExpect::Prepare { recovered: false }
        } else {
            TestExpect::Reply(ReplyKind::Prepare)
        })
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop every statement on both servers (the
    /// recovered ones not prepared yet with them).
    pub(super) fn forget_statements(&mut self) {
        if let Some(m) = &mut self.stmts.map {
            m.reset_all();
        }
        if let Some(t) = &mut self.types {
            t.reset();
        }
        self.read_only.forget();
        self.stmts.untrack_skipped();
        self.pickup.forget_deferred();
        self.stmts.predate_us = false;
        self.stmts.in_gap = false;
    }

    /// COM_STMT_EXECUTE, SEND_LONG_DATA, CLOSE, RESET, FETCH, BULK_EXECUTE: production's
    /// statement id becomes the test server's.
    pub(super) fn statement_command(
        &mut self,
        code: u8,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        let Some(prod_id) = command::statement_id(&self.fwd.head()[HEADER_LEN..]) else {
            // Too short to hold an id: the servers reject it alike.
            out.count(Counter::ProtocolErrors as usize);
            if expects_reply(code) {
                self.test_owes_client(TestExpect::Reply(ReplyKind::of_command(Some(code))))?;
            }
            out.count(Counter::CommandsForwarded as usize);
            return Ok(Verdict::Forward);
        };
        if self.read_only.lost(prod_id) {
            if code == com::STMT_CLOSE {
                // A close runs nothing: it only ends what the test server never had.
                self.fwd.kept_off();
                self.read_only.closed_lost(prod_id);
            } else {
                out.count(Counter::CommandsDroppedBeforeStateRead as usize);
            }
            return Ok(Verdict::Drop);
        }
        if self.shared.config.read_only && self.read_only.kept_off(prod_id) {
            self.fwd.kept_off();
            match code {
                com::STMT_EXECUTE | com::STMT_BULK_EXECUTE => {
                    out.count(Counter::ReadOnlySkippedStmtExecute as usize)
                }
                com::STMT_CLOSE if prod_id != LAST_PREPARED => {
                    self.read_only.statement_closed(prod_id)
                }
                _ => {}
            }
            return Ok(Verdict::Drop);
        }
        if self.stmts.tracking_lost {
            return Ok(self.drop_statement_command(code, UnmappedReason::Desynchronized, out));
        }
        if code == com::STMT_RESET && self.pickup.holds_deferred(prod_id) {
            // Nothing of it exists on the test server to reset, and preparing it now would
            // prepare it in the schema current now: a pool's reset and close at the end of a
            // use often come after the code moved on (mysql-connector-python: prepare in one
            // schema, `USE` another, then reset and close the cursor; a test-only 1146). It
            // stays deferred for an execute; the reset is not lost work.
            self.fwd.kept_off();
            out.count(Counter::StmtResetsOfStatementsBeforePickup as usize);
            return Ok(Verdict::Drop);
        }
        if let Some(sql) = self.pickup.take_deferred(prod_id) {
            if code == com::STMT_CLOSE {
                out.count(Counter::RecoveredClosedUnused as usize);
                self.fwd.kept_off();
                return Ok(Verdict::Drop);
            }
            self.prepare_recovered(prod_id, &sql, out)?;
        }
        let found = if code == com::STMT_CLOSE {
            self.stmts.map(&self.shared).close(prod_id)
        } else {
            self.stmts.map(&self.shared).lookup(prod_id)
        };
        match found {
            Ok(test_id) => {
                if code == com::STMT_CLOSE {
                    if let Some(t) = &mut self.types {
                        t.closed(test_id);
                    }
                }
                if code == com::STMT_EXECUTE {
                    if let Some(v) = self.execute_types(prod_id, test_id, h, out) {
                        return Ok(v);
                    }
                }
                if test_id != prod_id
                    && command::set_statement_id(self.fwd.payload_mut(), test_id).is_err()
                {
                    return Err(protocol("statement_id_unwritable"));
                }
                if expects_reply(code) {
                    self.test_owes_client(TestExpect::Reply(ReplyKind::of_command(Some(code))))?;
                }
                out.count(Counter::CommandsForwarded as usize);
                Ok(Verdict::Forward)
            }
            Err(u) if u.reason == UnmappedReason::AwaitingTest && !self.test.blind() => {
                self.fwd.hold_for_prepare(self.now, out);
                Ok(Verdict::Block)
            }
            Err(u) => Ok(self.drop_statement_command(code, u.reason, out)),
        }
    }

    /// Gives the test server the parameter types it lacks for `test_id` (`param_types.rs`),
    /// rewriting the collected head; `Some(Drop)` when this execute cannot carry them.
    fn execute_types(
        &mut self,
        prod_id: u32,
        test_id: u32,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Option<Verdict> {
        let types = self.types.as_deref_mut()?;
        let payload = &self.fwd.head()[HEADER_LEN..];
        let ex = Execute {
            test_id,
            payload,
            complete: payload.len() == h.len as usize && (h.len as usize) < MAX_PAYLOAD_LEN,
            sql: self.stmts.known().and_then(|m| m.sql(prod_id)),
            serial: self.fwd.serial(),
            verify: self.test.phase() != TestPhase::Blind,
        };
        let d = types.execute(&ex, &self.shared.learnt);
        if d.corrected {
            out.count(Counter::ParamTypesCorrected as usize);
        }
        match d.exec {
            Exec::AsIs => None,
            Exec::Typed { payload, learnt } => {
                out.count(if learnt {
                    Counter::ParamTypesLearnt
                } else {
                    Counter::ParamTypesGuessed
                } as usize);
                // Like a rewritten COM_CHANGE_USER: the whole packet is in `head`, which goes
                // out instead, longer by the types; our stream simply carries more bytes.
                let mut framed = Vec::with_capacity(HEADER_LEN + payload.len());
                write_packet(h.seq, &payload, &mut framed);
                self.fwd.replace_head(framed);
                None
            }
            Exec::Undecodable => {
                out.count(Counter::ExecutesDroppedUndecodable as usize);
                Some(Verdict::Drop)
            }
        }
    }

    fn drop_statement_command(
        &mut self,
        code: u8,
        reason: UnmappedReason,
        out: &mut TransformOutput<'_>,
    ) -> Verdict {
        if let UnmappedReason::TestRejected { code } = reason {
            self.fwd.refused(code);
        }
        let in_stretch = reason == UnmappedReason::Unknown && self.pickup.variables_pending();
        let predate_us = self.stmts.predate_us;
        // A reset or close runs nothing: of a statement known to no one, the execute is the
        // loss, counted once.
        let runs_nothing = matches!(code, com::STMT_CLOSE | com::STMT_RESET);
        let counter = if in_stretch && !runs_nothing {
            // Production ran it before reading the connection's state, and closed its
            // statement before that read too: the statement is known to no one.
            Counter::CommandsDroppedBeforeStateRead
        } else if !matches!(code, com::STMT_EXECUTE | com::STMT_BULK_EXECUTE) {
            if code == com::STMT_CLOSE && reason == UnmappedReason::Unknown && predate_us {
                // Prepared before the pickup, closed before production's lookup listed it:
                // the test server never had it, and a close runs nothing.
                self.fwd.kept_off();
                Counter::RecoveredClosedUnused
            } else if code == com::STMT_RESET
                && reason == UnmappedReason::Unknown
                && (predate_us || in_stretch)
            {
                // mysql-connector-python resets before every execute: the execute after it
                // is counted, the reset is not lost work.
                self.fwd.kept_off();
                Counter::StmtResetsOfStatementsBeforePickup
            } else if let UnmappedReason::TestRejected { .. } = reason {
                // A close, reset or fetch of a statement that does not exist on the test
                // server: nothing it could have run is lost beyond its refused prepare and
                // executes, which are counted as such.
                Counter::StmtCommandsOfRejectedStatement
            } else {
                Counter::StmtCommandsDropped
            }
        } else {
            match reason {
                UnmappedReason::Unknown if predate_us => {
                    Counter::ExecutesDroppedPreparedBeforePickup
                }
                UnmappedReason::Unknown if self.stmts.in_gap => {
                    Counter::ExecutesDroppedPreparedInCaptureGap
                }
                UnmappedReason::Unknown => Counter::ExecutesDroppedUnknownStatement,
                UnmappedReason::TestRejected { .. } => Counter::ExecutesDroppedRejected,
                UnmappedReason::AwaitingTest
                | UnmappedReason::LimitReached
                | UnmappedReason::Desynchronized
                | UnmappedReason::TestAnswerLost => Counter::ExecutesDroppedUntracked,
            }
        };
        out.count(counter as usize);
        Verdict::Drop
    }
}
