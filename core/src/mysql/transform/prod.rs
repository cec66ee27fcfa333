//! Production's side: its replies to the client, as captured, cut into replies the same way
//! as the test server's ([`ReplyTracker`]) and matched in order with the client's commands as
//! they arrived.
//!
//! # What this room is for
//!
//! Production's answers are what the test server's are compared with (`--report`), what
//! pairs production's statement ids with the test server's (its PREPARE_OKs), what tells a
//! picked-up connection's held commands which side of the recovered state they are on, and
//! what proves a transaction boundary to the gates (`txn_gate.rs`). Nothing of production's
//! stream is ever sent anywhere.
//!
//! # What it must never do
//!
//! * Wait for production: its replies are read as they come, and one that cannot be read is
//!   counted lost; only the pickup's gates hold commands for an answer, and never past their
//!   deadlines.
//! * Read a result set's rows: most of the stream, and nothing in them matters but "not a
//!   reply's end" ([`ProdSink`] passes over them).
//! * Frame bytes it did not see start: after a pickup or a gap it waits for the client's next
//!   command (`Unsynced`, `Armed`) rather than guess where a packet starts.

use std::collections::VecDeque;
use std::mem;

use common::mysql::handshake::{ReplyPhase, ServerReply};
use common::mysql::packet::{FrameScanner, ScanSink, ScannedPacket};
use common::mysql::stmt::PrepareAnswer;

use super::super::replies::{ok_status, ReplyKind, ReplyTracker, Role, Seen};
use super::super::txn_gate::ReplyStatus;
use super::super::Counter;
use super::{count_seen, first_reply_id, MysqlTransform, LOST_ANSWER, MAX_IN_FLIGHT};
use crate::engine::TransformOutput;

/// Bytes kept of each of production's reply packets: PREPARE_OK is 12, an ERR code 3.
const PROD_PREFIX: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ProdPhase {
    Greeting,
    Auth,
    Commands,
    /// Production refused the login: the client will go away.
    Failed,
    /// A picked-up connection: replies cannot be framed until the client sends a command.
    Unsynced,
    /// A command went out while unsynced: the next bytes start its reply.
    Armed,
    /// Reading the first packet after arming; it must be a reply start.
    Resyncing,
}

/// One of production's packets as the scanner reported it.
#[derive(Clone, Copy)]
pub(super) struct ProdPacket {
    seq: u8,
    part: u32,
    len: u32,
    prefix: [u8; PROD_PREFIX],
    prefix_len: u8,
    /// The payload's hash (`--compare-results`).
    hash: Option<u64>,
}

impl ProdPacket {
    fn new(p: &ScannedPacket<'_>) -> Self {
        let mut prefix = [0; PROD_PREFIX];
        let n = p.prefix.len().min(PROD_PREFIX);
        prefix[..n].copy_from_slice(&p.prefix[..n]);
        Self {
            seq: p.header.seq,
            part: p.header.part,
            len: p.header.len,
            prefix,
            prefix_len: n as u8,
            hash: p.hash,
        }
    }

    fn prefix(&self) -> &[u8] {
        &self.prefix[..usize::from(self.prefix_len)]
    }
}

/// One reply production owes.
#[derive(Clone, Copy)]
pub(super) struct ProdOwed {
    /// How the reply is built.
    kind: ReplyKind,
    /// The client command it answers.
    serial: u64,
    /// The id of the reply's first packet (see [`first_reply_id`]).
    first_reply_id: u8,
}

/// Production's reply stream and the commands it owes a reply.
pub(super) struct ProdSide {
    phase: ProdPhase,
    scanner: FrameScanner,
    /// Commands production owes a reply, oldest first.
    owed: VecDeque<ProdOwed>,
    prev_seq: Option<u8>,
    replies: ReplyTracker,
}

impl ProdSide {
    /// `picked_up`: the login was not seen, replies are framed from the first command on;
    /// `hashes`: every payload is hashed (`--compare-results`).
    pub(super) fn new(picked_up: bool, hashes: bool) -> Self {
        Self {
            phase: if picked_up {
                ProdPhase::Unsynced
            } else {
                ProdPhase::Greeting
            },
            scanner: prod_scanner(hashes),
            owed: VecDeque::new(),
            prev_seq: None,
            replies: ReplyTracker::new(),
        }
    }

    pub(super) fn phase(&self) -> ProdPhase {
        self.phase
    }

    /// Production's replies are not being read (refused login, or not framed yet): their
    /// answers will not tell anything.
    pub(super) fn unframed(&self) -> bool {
        matches!(self.phase, ProdPhase::Failed | ProdPhase::Unsynced)
    }

    /// Production owes a reply to a command before `serial`.
    pub(super) fn owes_before(&self, serial: u64) -> bool {
        self.owed.front().is_some_and(|f| f.serial < serial)
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

    /// Production's replies cannot be framed until the client's next command arms a resync.
    pub(super) fn unsync(&mut self) {
        if self.phase != ProdPhase::Failed {
            self.phase = ProdPhase::Unsynced;
        }
    }

    /// What the oldest command production owes expects: its reply's kind and first id.
    fn next(&self) -> (ReplyKind, u8) {
        self.owed
            .front()
            .map_or((ReplyKind::Generic, 1), |f| (f.kind, f.first_reply_id))
    }

    pub(super) fn memory_len(&self) -> usize {
        self.owed.capacity() * mem::size_of::<ProdOwed>()
    }
}

impl MysqlTransform {
    /// Production's bytes, as captured.
    pub(super) fn prod_data(&mut self, data: &[u8], out: &mut TransformOutput<'_>) {
        match self.prod.phase {
            ProdPhase::Unsynced | ProdPhase::Failed => return,
            ProdPhase::Armed => {
                // Replies to earlier commands ended before this command was sent (clients
                // wait for them), so these bytes start a packet.
                let compare = self.observer.as_ref().is_some_and(|o| o.compare_results());
                self.prod.scanner = prod_scanner(compare);
                self.prod.prev_seq = None;
                self.prod.phase = ProdPhase::Resyncing;
            }
            _ => {}
        }
        // The scanner is lent out for the call so that each packet is read with the state the
        // packets before it left: whether the next ones are rows to pass over depends on it.
        let mut scanner = mem::replace(&mut self.prod.scanner, FrameScanner::new(0));
        let mut sink = ProdSink {
            t: self,
            out,
            rows: 0,
            bytes: 0,
        };
        scanner.feed_skimming(data, &mut sink);
        sink.flush();
        self.prod.scanner = scanner;
    }

    fn prod_packet(&mut self, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let prev = self.prod.prev_seq.replace(p.seq);
        if p.part > 0 {
            if let Some(o) = &mut self.observer {
                o.prod_packet(&Seen::default(), p.len, &[], p.hash, true, self.captured);
            }
            return;
        }
        match self.prod.phase {
            ProdPhase::Greeting => {
                self.prod.phase = if p.prefix().first() == Some(&0xff) {
                    ProdPhase::Failed
                } else {
                    ProdPhase::Auth
                };
            }
            ProdPhase::Auth => match ServerReply::classify(p.prefix(), ReplyPhase::Auth) {
                ServerReply::Ok => self.prod.phase = ProdPhase::Commands,
                ServerReply::Err => self.prod.phase = ProdPhase::Failed,
                _ => {}
            },
            ProdPhase::Commands => {
                let next = self.prod.next();
                let seen = self
                    .prod
                    .replies
                    .packet(p.seq, prev, p.len, p.prefix(), false, next);
                count_seen(seen, out);
                if seen.start {
                    self.prod_reply(p, out);
                }
                self.observe_prod(&seen, p);
                if seen.end {
                    self.prod_reply_ended(&seen, p, out);
                }
            }
            ProdPhase::Resyncing => {
                let (_, first_id) = self.prod.next();
                if p.seq == first_id {
                    // The reply to the latest command; the earlier ones were answered in bytes
                    // we could not frame.
                    while self.prod.owed.len() > 1 {
                        if let Some(owed) = self.prod.owed.pop_front() {
                            self.lose_prod_reply(owed.kind, owed.serial, out);
                        }
                    }
                    out.count(Counter::ProdResyncs as usize);
                    self.prod.phase = ProdPhase::Commands;
                    self.prod.replies.reset();
                    let next = self.prod.next();
                    let seen =
                        self.prod
                            .replies
                            .packet(p.seq, None, p.len, p.prefix(), false, next);
                    count_seen(seen, out);
                    self.prod_reply(p, out);
                    self.observe_prod(&seen, p);
                    if seen.end {
                        self.prod_reply_ended(&seen, p, out);
                    }
                } else {
                    self.lose_all_prod(out);
                    self.prod.phase = ProdPhase::Unsynced;
                }
            }
            ProdPhase::Failed | ProdPhase::Unsynced | ProdPhase::Armed => {}
        }
    }

    fn observe_prod(&mut self, seen: &Seen, p: &ProdPacket) {
        if let Some(o) = &mut self.observer {
            o.prod_packet(seen, p.len, p.prefix(), p.hash, false, self.captured);
        }
    }

    /// The last packet of production's reply to the command the gates hold as `replying`:
    /// the transaction gates (a picked-up connection's, or after a capture gap) learn what the
    /// reply said of its transaction.
    fn prod_reply_ended(&mut self, seen: &Seen, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let Some(gates) = self.gates.as_deref_mut() else {
            return;
        };
        let Some(serial) = gates.replying.take() else {
            return;
        };
        let st = match seen.role {
            Role::Ok | Role::RowsEnd => {
                ok_status(p.len, p.prefix()).map_or(ReplyStatus::Err, ReplyStatus::Status)
            }
            Role::Err => ReplyStatus::Err,
            _ => ReplyStatus::None,
        };
        gates.replied(serial, st);
        // A command held for this answer may now go.
        self.resume(out);
    }

    fn prod_reply(&mut self, p: &ProdPacket, out: &mut TransformOutput<'_>) {
        let popped = self.prod.owed.pop_front();
        if let Some(gates) = self.gates.as_deref_mut() {
            gates.replying = popped.map(|f| f.serial);
        }
        if let Some(owed) = popped {
            if self.pickup.answered(owed.serial, self.captured) {
                // A command held for this answer may now go.
                self.resume(out);
            }
        }
        if let (Some(owed), Some(o)) = (popped, &mut self.observer) {
            o.prod_start(owed.serial, self.captured);
        }
        if let (Some(owed), Some(t)) = (popped, &mut self.types) {
            if owed.kind == ReplyKind::Generic {
                let ran = p.prefix().first() != Some(&0xff);
                if t.prod_answered(owed.serial, ran, owed.serial < self.fwd.serial()) {
                    out.count(Counter::ParamTypesCorrected as usize);
                }
            }
        }
        match popped.map(|f| f.kind) {
            None => out.count(Counter::RepliesUnmatched as usize),
            Some(ReplyKind::Prepare) => {
                let answer = PrepareAnswer::parse(p.prefix()).unwrap_or_else(|_| {
                    out.count(Counter::ProtocolErrors as usize);
                    LOST_ANSWER
                });
                self.prod_prepare_answer(answer, out);
            }
            Some(_) => {}
        }
    }

    fn lose_prod_answer(&mut self, out: &mut TransformOutput<'_>) {
        out.count(Counter::ProdAnswersLost as usize);
        self.prod_prepare_answer(LOST_ANSWER, out);
    }

    /// Every reply production owes is lost (a capture gap, a reply that could not be framed).
    pub(super) fn lose_all_prod(&mut self, out: &mut TransformOutput<'_>) {
        self.prod.replies.reset();
        if let Some(g) = &mut self.gates {
            // The reply being read will not end where it can be seen either.
            if let Some(serial) = g.replying.take() {
                g.replied(serial, ReplyStatus::Err);
            }
        }
        while let Some(owed) = self.prod.owed.pop_front() {
            self.lose_prod_reply(owed.kind, owed.serial, out);
        }
    }

    /// Production's reply to command `serial` will not be seen.
    fn lose_prod_reply(&mut self, kind: ReplyKind, serial: u64, out: &mut TransformOutput<'_>) {
        if kind == ReplyKind::Prepare {
            self.lose_prod_answer(out);
        }
        if let Some(g) = &mut self.gates {
            // What the command ran in cannot be told any more: a write waiting for this reply
            // is dropped (a tail sent unproven fails on test), and what follows waits for a
            // reply of its own.
            g.replied(serial, ReplyStatus::Err);
        }
        if let Some(t) = &mut self.types {
            t.prod_lost(serial);
        }
        if let Some(o) = &mut self.observer {
            o.prod_lost(serial);
        }
    }

    /// A client command production will answer (seen as it arrives), numbered `serial`.
    pub(super) fn prod_expects(
        &mut self,
        kind: ReplyKind,
        serial: u64,
        out: &mut TransformOutput<'_>,
    ) {
        if self.prod.owed.len() >= MAX_IN_FLIGHT {
            // Production's replies are not being seen: start over from the next command.
            self.lose_all_prod(out);
            self.prod.phase = ProdPhase::Unsynced;
        }
        self.prod.owed.push_back(ProdOwed {
            kind,
            serial,
            first_reply_id: 1,
        });
        match self.prod.phase {
            // The client only sends commands once logged in; its OK may not have been read.
            ProdPhase::Greeting | ProdPhase::Auth => {
                self.prod.phase = ProdPhase::Commands;
                // The rest of the auth exchange, if any, ends before the reply (id 1).
                self.prod.replies.skip_to_next_reply();
            }
            ProdPhase::Unsynced => self.prod.phase = ProdPhase::Armed,
            _ => {}
        }
    }
}

/// Production's reply stream read packet by packet, its rows passed over: a result set's rows
/// are most of the stream and nothing of them is read but "not 0xFE, not 0xFF" (the structure
/// in [`ReplyTracker`]), so a row the tracker expects, with the next id, is counted into a run
/// from its first byte, without a summary (issue 20: walking each row was a third of the
/// copier's user time). The run goes to the report before the next packet that is read.
struct ProdSink<'t, 'o, 'a> {
    t: &'t mut MysqlTransform,
    out: &'o mut TransformOutput<'a>,
    /// Rows passed over since the last packet read, and their payload bytes.
    rows: u64,
    bytes: u64,
}

impl ProdSink<'_, '_, '_> {
    fn flush(&mut self) {
        if self.rows > 0 {
            if let Some(o) = &mut self.t.observer {
                o.prod_folded(self.rows, self.bytes);
            }
            self.rows = 0;
            self.bytes = 0;
        }
    }
}

impl ScanSink for ProdSink<'_, '_, '_> {
    fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool {
        let prod = &mut self.t.prod;
        let row = head.first().is_some_and(|&b| b != 0xfe && b != 0xff);
        if !row
            || prod.phase != ProdPhase::Commands
            || prod.prev_seq.map(|p| p.wrapping_add(1)) != Some(seq)
            || !prod.replies.expects_rows()
        {
            return false;
        }
        prod.prev_seq = Some(seq);
        prod.replies.row_passed();
        self.rows += 1;
        self.bytes += u64::from(len);
        true
    }

    fn packet(&mut self, p: ScannedPacket<'_>) {
        self.flush();
        self.t.prod_packet(&ProdPacket::new(&p), self.out);
    }
}

/// Production's reply reader; with `--compare-results` it hashes every payload.
fn prod_scanner(hashes: bool) -> FrameScanner {
    if hashes {
        FrameScanner::with_hashes(PROD_PREFIX)
    } else {
        FrameScanner::new(PROD_PREFIX)
    }
}
