//! The client's stream as it is forwarded: each packet's header and first bytes are collected
//! (at most [`MAX_HEAD`]), a verdict is reached (forward, possibly rewritten; drop; or hold
//! until the test server catches up), then the rest of the packet streams through or is
//! skipped as it arrives. While a packet is held, later client bytes wait in `backlog`, so
//! the order toward the test server never changes.
//!
//! # What this room is for
//!
//! Deciding, command by command, what the test server gets, and sending it in the client's
//! order. The verdict itself draws on every other room (login, statements, read-only,
//! pickup gates, the test server's backlog); this room owns the reading, the holding and the
//! bookkeeping of what was decided.
//!
//! # What it must never do
//!
//! * Reorder: a held packet holds everything after it.
//! * Buffer a packet whole unless it must be rewritten or judged whole (a login, a
//!   COM_CHANGE_USER, an execute that needs parameter types, SQL under `--read-only`): the rest
//!   of a packet streams through, 16 MiB commands included.
//! * Hold more than `max_held_bytes`: past it the session is given up (`held_overflow`), not
//!   grown.
//! * Parse a continuation, an auth continuation or LOCAL INFILE data as a command: only
//!   packets with id 0 after the login are commands.

use std::mem;
use std::num::NonZeroU16;
use std::time::Duration;

use common::clock::Instant;
use common::mysql::command::{self, com};
use common::mysql::packet::{PacketHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::stmt::SQL_KEPT;

use super::super::observe::Decision;
use super::super::read_only_counter;
use super::super::replies::ReplyKind;
use super::super::resync::RESYNC_WAIT;
use super::super::Counter;
use super::statements::Fate;
use super::test_side::{TestExpect, TestPhase};
use super::{
    abandon, expects_reply, plausible_command, Abandon, Deadline, MysqlTransform, Verdict,
    MAX_IN_FLIGHT,
};
use crate::engine::TransformOutput;

/// Payload bytes of one client packet looked at before its verdict. Logins and COM_CHANGE_USER
/// must fit whole (real ones are a few hundred bytes); other commands need at most a statement
/// id or [`SQL_KEPT`] bytes of SQL.
const MAX_HEAD: usize = 64 * 1024;
/// SQL bytes of a COM_QUERY or COM_STMT_PREPARE collected to classify it under `--read-only`
/// (at most `max_held_bytes`). A longer text is judged by this prefix, and is not mirrored unless
/// the prefix already shows a write (its unseen rest could hold `FOR UPDATE` or `; DELETE`).
const MAX_SQL_HEAD: usize = 1 << 20;
/// Commands held for a test server behind go out again once it owes no more than this: in
/// batches, since each resume moves the rest of the backlog to its front (megabytes, when the
/// test server stalled for seconds), which once per answer would cost the copier its capture.
const RESUME_BEHIND: usize = MAX_IN_FLIGHT - MAX_IN_FLIGHT / 4;
/// Buffers grown beyond this are released once empty, so one big packet does not pin memory.
const KEEP_CAPACITY: usize = 64 * 1024;
/// How often a command waiting for the test server's PREPARE_OK, without a word from the test
/// server, looks at why. intercept drops summaries when its relay queue is full; a lost
/// PREPARE_OK would otherwise hold the session (and its FIN) until the backlog overflows or the
/// session idles out. It was lost if the test server's stream was seen past the last summary
/// ([`TransformOutput::test_stream_seen`]); if not, the test server has not answered yet and the
/// wait goes on. A plain deadline took slow for lost: at 2 s, a 1,000-connection run on the
/// lab's two cores (test threads waiting seconds for a CPU, nothing dropped anywhere) lost the
/// framing of 18 sessions and dropped 8,604 of their executes (work fidelity 0.961); at 10 s,
/// now and then still a few (240 executes in one run of 200,000 queries).
const HELD_TIMEOUT: Duration = RESYNC_WAIT;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientStage {
    /// The next packet is the login (a session whose SYN we saw).
    Login,
    Commands,
}

/// Where the forwarding reader is in the client's stream.
#[derive(Clone, Copy, Debug)]
enum Fwd {
    /// Collecting the header and first bytes of a logical packet into `head`.
    Head,
    /// The rest of a physical packet: `left` bytes, passed on or skipped.
    Body {
        left: u32,
        more: bool,
        forward: bool,
    },
    /// The header of a continuation packet (the previous one was 0xFFFFFF long).
    ContHeader {
        hdr: [u8; HEADER_LEN],
        have: u8,
        forward: bool,
    },
}

/// The forwarding reader.
pub(super) struct Forwarding {
    stage: ClientStage,
    at: Fwd,
    /// The head of the packet being decided.
    head: Vec<u8>,
    /// Client bytes after a held packet, from `backlog_read` on (see [`MysqlTransform::resume`]).
    backlog: Vec<u8>,
    /// Bytes at the front of `backlog` already read (below 4 GiB: past it the rest is moved
    /// instead): each resume reads a batch of commands, and moving the rest to the front every
    /// time cost a copy of the whole backlog per batch (the copier's largest user-space item
    /// while a test server was megabytes behind).
    backlog_read: u32,
    /// When a command held for the test server's PREPARE_OK stops waiting ([`HELD_TIMEOUT`]).
    held_deadline: Deadline,
    /// Serial of the next client command to decide.
    serial: u64,
    /// The command just dropped names a statement the test server refused (its error code;
    /// MySQL's are never 0). Two bytes, not four: `a_session_in_line_stays_small`.
    dropped_refused: Option<NonZeroU16>,
    /// The packet whose head is collected waits for a verdict.
    blocked: bool,
    /// The current command was counted as waiting for a PREPARE_OK.
    held_counted: bool,
    /// The current command was counted as waiting for the test server to catch up.
    behind_counted: bool,
    /// The logical packet being forwarded is a client command the test server owes a reply
    /// (the newest it owes): its continuation packets move that reply's first id.
    owed: bool,
    /// The command just dropped was kept off by design (`--read-only`, nothing to run): not a
    /// loss.
    dropped_by_design: bool,
    /// The client's own auth continuation (answers to production's auth switch) is not ours
    /// to send: swallowed until its next command.
    swallow_client_auth: bool,
    /// The first packet of a picked-up connection was checked for a command start.
    first_checked: bool,
    /// The packets after a command that was not sent (LOCAL INFILE contents) are not sent either.
    skip_data: bool,
    /// The session was given up (`MysqlTransform::give_up`): nothing more is forwarded, nor
    /// read. Here, not beside the rooms, because this struct has a spare byte and the
    /// transform's own fields would take a word for it (`a_session_in_line_stays_small`).
    given_up: bool,
}

impl Forwarding {
    pub(super) fn new(picked_up: bool) -> Self {
        Self {
            stage: if picked_up {
                ClientStage::Commands
            } else {
                ClientStage::Login
            },
            at: Fwd::Head,
            head: Vec::new(),
            backlog: Vec::new(),
            backlog_read: 0,
            held_deadline: Deadline::NONE,
            serial: 0,
            dropped_refused: None,
            blocked: false,
            held_counted: false,
            behind_counted: false,
            owed: false,
            dropped_by_design: false,
            swallow_client_auth: false,
            first_checked: !picked_up,
            skip_data: false,
            given_up: false,
        }
    }

    pub(super) fn given_up(&self) -> bool {
        self.given_up
    }

    pub(super) fn give_up(&mut self) {
        self.given_up = true;
    }

    pub(super) fn stage(&self) -> ClientStage {
        self.stage
    }

    pub(super) fn blocked(&self) -> bool {
        self.blocked
    }

    /// The blocked command waits only for the test server to owe fewer replies (and not,
    /// after that, for a PREPARE_OK).
    pub(super) fn backpressed(&self) -> bool {
        self.blocked && self.behind_counted && !self.held_counted
    }

    /// The head of the packet being decided.
    pub(super) fn head(&self) -> &[u8] {
        &self.head
    }

    /// Its command byte, if it has one.
    pub(super) fn code(&self) -> Option<u8> {
        self.head.get(HEADER_LEN).copied()
    }

    /// Its payload, to rewrite in place.
    pub(super) fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.head[HEADER_LEN..]
    }

    /// The packet being decided goes out as `packet` instead (whole, rewritten).
    pub(super) fn replace_head(&mut self, packet: Vec<u8>) {
        self.head = packet;
    }

    /// Serial of the client command being decided.
    pub(super) fn serial(&self) -> u64 {
        self.serial
    }

    /// The command being decided is dropped by design, not lost.
    pub(super) fn kept_off(&mut self) {
        self.dropped_by_design = true;
    }

    /// The command being decided is dropped: it names a statement the test server refused.
    pub(super) fn refused(&mut self, code: u16) {
        self.dropped_refused = NonZeroU16::new(code);
    }

    /// The command being decided waits for the test server's PREPARE_OK (counted once).
    pub(super) fn hold_for_prepare(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        if !self.held_counted {
            self.held_counted = true;
            out.count(Counter::CommandsHeldAwaitingPrepare as usize);
        }
        if !self.held_deadline.is_some() {
            self.held_deadline = Deadline::at(now + HELD_TIMEOUT);
        }
    }

    /// The test server said something: a command held for its PREPARE_OK waits longer.
    pub(super) fn test_progressed(&mut self, now: Instant) {
        if self.held_deadline.is_some() {
            self.held_deadline = Deadline::at(now + HELD_TIMEOUT);
        }
    }

    pub(super) fn held_deadline(&self) -> Option<Instant> {
        self.held_deadline.get()
    }

    /// The test server has not answered the held command's PREPARE yet: look again later.
    pub(super) fn hold_on(&mut self, now: Instant) {
        self.held_deadline = Deadline::at(now + HELD_TIMEOUT);
    }

    /// Whether the wait for a PREPARE_OK ran out at `now` (it is then over).
    pub(super) fn held_timed_out(&mut self, now: Instant) -> bool {
        if self.held_deadline.get().is_some_and(|d| now >= d) {
            self.held_deadline = Deadline::NONE;
            return true;
        }
        false
    }

    /// Client bytes held: the head being decided and the backlog.
    pub(super) fn buffered_len(&self) -> usize {
        self.head.len() + self.backlog_len()
    }

    /// Backlog bytes not read yet.
    pub(super) fn backlog_len(&self) -> usize {
        self.backlog.len() - self.backlog_read as usize
    }

    /// Arrived client bytes the reader has not passed yet, between two calls: the backlog, and
    /// the head of the packet being decided.
    pub(super) fn unread_len(&self) -> usize {
        self.head.len() + self.backlog_len()
    }

    /// Whether the reader stands at (or inside the head of) a packet that may start a command:
    /// a replay could begin there (not in a packet's body, nor in the client's own auth or
    /// LOCAL INFILE data, which no command precedes in a replay).
    pub(super) fn at_command_start(&self) -> bool {
        matches!(self.at, Fwd::Head) && !self.skip_data && !self.swallow_client_auth
    }

    pub(super) fn memory_len(&self) -> usize {
        self.head.capacity() + self.backlog.capacity()
    }

    /// The session is given up: held bytes go now.
    pub(super) fn forget(&mut self) {
        self.head = Vec::new();
        self.backlog = Vec::new();
        self.backlog_read = 0;
        self.blocked = false;
        self.held_deadline = Deadline::NONE;
    }

    /// Sends (or not) the decided head and moves on to the rest of its packet.
    fn release_head(&mut self, len: u32, taken: u32, forward: bool, out: &mut TransformOutput<'_>) {
        if forward {
            out.push(&self.head);
        }
        self.head.clear();
        if self.head.capacity() > KEEP_CAPACITY {
            self.head = Vec::new();
        }
        self.held_counted = false;
        self.behind_counted = false;
        self.held_deadline = Deadline::NONE;
        self.at = body(
            len.saturating_sub(taken),
            len as usize == MAX_PAYLOAD_LEN,
            forward,
        );
    }
}

impl MysqlTransform {
    pub(super) fn hold(&mut self, data: &[u8], out: &mut TransformOutput<'_>) {
        if self.dead() || data.is_empty() {
            return;
        }
        if self.fwd.buffered_len() + data.len() > self.shared.config.max_held_bytes {
            self.give_up(abandon(Counter::HeldOverflow, "held_overflow"), out);
            return;
        }
        self.fwd.backlog.extend_from_slice(data);
    }

    /// Carries on after whatever held the current packet may have changed.
    pub(super) fn resume(&mut self, out: &mut TransformOutput<'_>) {
        if self.dead() || !self.fwd.blocked {
            return;
        }
        if self.fwd.behind_counted && self.test.owed() > RESUME_BEHIND {
            return;
        }
        self.fwd.blocked = false;
        let mut backlog = mem::take(&mut self.fwd.backlog);
        let read = mem::take(&mut self.fwd.backlog_read) as usize;
        let n = self.run(&backlog[read.min(backlog.len())..], out);
        if self.dead() {
            return;
        }
        let read = (read + n).min(backlog.len());
        if read == backlog.len() {
            backlog.clear();
            if backlog.capacity() > KEEP_CAPACITY {
                backlog = Vec::new();
            }
        } else if let (false, Ok(at)) = (read >= backlog.len() - read, u32::try_from(read)) {
            self.fwd.backlog_read = at;
        } else {
            // The read part is at least the rest: moving the rest costs no more than reading
            // took, so each byte is moved a bounded number of times. (Or, past 4 GiB read,
            // which a --max-memory of over 16 GiB allows, the offset would not fit.)
            backlog.drain(..read);
        }
        self.fwd.backlog = backlog;
    }

    /// Total bytes of the current packet's head to collect before its verdict.
    fn head_needed(&self) -> usize {
        let Some(h) = PacketHeader::parse(&self.fwd.head) else {
            return HEADER_LEN;
        };
        let config = &self.shared.config;
        let want = if self.fwd.stage == ClientStage::Login {
            MAX_HEAD
        } else if h.seq != 0 {
            0
        } else {
            match self.fwd.head.get(HEADER_LEN) {
                None => 1,
                Some(&com::CHANGE_USER) => MAX_HEAD,
                Some(&(com::QUERY | com::STMT_PREPARE)) if config.read_only => {
                    1 + MAX_SQL_HEAD.min(config.max_held_bytes)
                }
                Some(&com::STMT_PREPARE) => 1 + SQL_KEPT,
                // Whether it names a user variable (`variables_first`), or writes inside a
                // transaction begun before the pickup or cut by a gap (`transaction_first`).
                Some(&com::QUERY) if self.pickup.variables_pending() || self.gated() => {
                    1 + SQL_KEPT
                }
                Some(&com::STMT_EXECUTE) => self.execute_head(),
                Some(&c) if command::carries_statement_id(c) => 5,
                Some(_) => 1,
            }
        };
        HEADER_LEN + (h.len as usize).min(want)
    }

    /// Payload bytes of a COM_STMT_EXECUTE to collect: its statement id, then what the
    /// parameter types of its statement need seen (see `param_types.rs`).
    fn execute_head(&self) -> usize {
        const ID: usize = 5;
        let payload = &self.fwd.head[HEADER_LEN..];
        let (Some(types), Some(map)) = (self.types.as_deref(), self.stmts.known()) else {
            return ID;
        };
        match command::statement_id(payload).map(|id| map.lookup(id)) {
            Some(Ok(test_id)) => types.wanted(test_id, payload).clamp(ID, MAX_HEAD),
            _ => ID,
        }
    }

    /// Forwards `data` as far as verdicts allow; returns the bytes consumed (fewer only when a
    /// packet is held).
    pub(super) fn run(&mut self, data: &[u8], out: &mut TransformOutput<'_>) -> usize {
        let mut rest = data;
        while !self.dead() {
            match self.fwd.at {
                Fwd::Head => {
                    let need = self.head_needed();
                    let head = &mut self.fwd.head;
                    if head.len() < need {
                        if rest.is_empty() {
                            break;
                        }
                        let n = (need - head.len()).min(rest.len());
                        head.extend_from_slice(&rest[..n]);
                        rest = &rest[n..];
                        continue;
                    }
                    let Some(h) = PacketHeader::parse(head) else {
                        break;
                    };
                    let taken = (head.len() - HEADER_LEN) as u32;
                    let code = head.get(HEADER_LEN).copied();
                    // Judged before the verdict, which may end the login stage.
                    let client_command = self.fwd.stage == ClientStage::Commands
                        && h.seq == 0
                        && code.is_none_or(expects_reply);
                    // A login or COM_CHANGE_USER is the one big head a session collects: its
                    // room is given back after it, so an idle session does not keep it.
                    let auth_head = self.fwd.stage == ClientStage::Login
                        || (h.seq == 0 && code == Some(com::CHANGE_USER));
                    self.fwd.dropped_by_design = false;
                    self.fwd.dropped_refused = None;
                    match self.decide(h, out) {
                        Ok(Verdict::Block) => {
                            self.fwd.blocked = true;
                            break;
                        }
                        Ok(v) => {
                            self.fwd.owed = client_command
                                && v == Verdict::Forward
                                && self.test.newest_owed_to(self.fwd.serial);
                            if self.fwd.owed {
                                // Where it starts in the client's stream, for a replay: what
                                // arrived, less what this reader has not passed yet (this
                                // call's rest, the backlog, the head).
                                let unread = rest.len() + self.fwd.unread_len();
                                let start = self.arrival.position().saturating_sub(unread as u64);
                                self.test.newest_starts_at(start);
                            }
                            if client_command {
                                self.client_command_decided(v == Verdict::Forward);
                                if !self.fwd.owed {
                                    // Kept off, dropped, or sent blind: nothing will answer it.
                                    out.settled();
                                }
                            }
                            self.fwd
                                .release_head(h.len, taken, v == Verdict::Forward, out);
                            if auth_head {
                                self.fwd.head = Vec::new();
                            }
                        }
                        Err(a) => self.give_up(a, out),
                    }
                }
                Fwd::Body {
                    left,
                    more,
                    forward,
                } => {
                    if rest.is_empty() {
                        break;
                    }
                    let n = (left as usize).min(rest.len());
                    if forward {
                        out.push(&rest[..n]);
                    }
                    rest = &rest[n..];
                    self.fwd.at = body(left - n as u32, more, forward);
                }
                Fwd::ContHeader {
                    mut hdr,
                    have,
                    forward,
                } => {
                    if rest.is_empty() {
                        break;
                    }
                    let have = usize::from(have);
                    let n = (HEADER_LEN - have).min(rest.len());
                    hdr[have..have + n].copy_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    if have + n < HEADER_LEN {
                        self.fwd.at = Fwd::ContHeader {
                            hdr,
                            have: (have + n) as u8,
                            forward,
                        };
                        continue;
                    }
                    if forward {
                        out.push(&hdr);
                    }
                    let parsed = PacketHeader::parse(&hdr);
                    if let (true, Some(h)) = (forward && self.fwd.owed, parsed) {
                        self.test.continued(h.seq);
                    }
                    let len = parsed.map_or(0, |h| h.len);
                    self.fwd.at = body(len, len as usize == MAX_PAYLOAD_LEN, forward);
                }
            }
        }
        if self.dead() {
            data.len()
        } else {
            data.len() - rest.len()
        }
    }

    /// The forwarding reader decided the client command numbered `fwd.serial`.
    fn client_command_decided(&mut self, forwarded: bool) {
        let serial = self.fwd.serial;
        self.fwd.serial += 1;
        let by_design = mem::take(&mut self.fwd.dropped_by_design);
        let refused = self.fwd.dropped_refused.take().map(NonZeroU16::get);
        if let Some(o) = &mut self.observer {
            let d = match (forwarded, by_design, refused) {
                (true, _, _) if self.test.phase() == TestPhase::Blind => Decision::SentBlind,
                (true, _, _) => Decision::Sent,
                (false, true, _) => Decision::Skipped,
                (false, false, Some(code)) => Decision::Refused(code),
                (false, false, None) => Decision::Dropped,
            };
            o.decided(serial, d, self.now);
        }
    }

    /// The verdict on the packet whose head is collected.
    fn decide(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        if !self.fwd.first_checked {
            self.fwd.first_checked = true;
            if !plausible_command(&self.fwd.head) {
                return Err(abandon(Counter::PickupUnframed, "pickup_unframed"));
            }
        }
        if self.fwd.stage == ClientStage::Login {
            let tls_plaintext = self.shared.config.tls_plaintext;
            if self
                .login
                .keep_client_login(h, &self.fwd.head[HEADER_LEN..], tls_plaintext)?
            {
                // An SSLRequest: the login comes next, from the plaintext capture.
                out.count(Counter::TlsSessionsFromPlaintext as usize);
                out.start_tls();
                return Ok(Verdict::Drop);
            }
            self.fwd.stage = ClientStage::Commands;
            self.fwd.swallow_client_auth = true;
            self.try_login(out)?;
            return Ok(Verdict::Drop);
        }
        if h.seq != 0 {
            if self.fwd.swallow_client_auth {
                out.count(Counter::ClientAuthPacketsSwallowed as usize);
                return Ok(Verdict::Drop);
            }
            if self.fwd.skip_data {
                return Ok(Verdict::Drop);
            }
            // LOCAL INFILE contents: they follow their command as they are.
            return Ok(if self.test_ready() {
                Verdict::Forward
            } else {
                Verdict::Block
            });
        }
        self.fwd.swallow_client_auth = false;
        self.fwd.skip_data = false;
        if !self.test_ready() {
            return Ok(Verdict::Block);
        }
        if self.test.owed() >= MAX_IN_FLIGHT && !self.test.blind() {
            // Backpressure, not a verdict on the server: it is answering, only later than
            // production. Each of its replies resumes the backlog one command further.
            if !self.fwd.behind_counted {
                self.fwd.behind_counted = true;
                out.count(Counter::TestBehindHolds as usize);
            }
            return Ok(Verdict::Block);
        }
        if let Some(v) = self.variables_first(out) {
            return Ok(v);
        }
        if let Some(v) = self.transaction_first(out) {
            return Ok(v);
        }
        self.probe_before_command(out);
        self.flush_injections(out)?;
        self.command(h, out)
    }

    /// A command (sequence id 0) while the test server is ready for one.
    fn command(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        let Some(code) = self.fwd.code() else {
            // An empty packet: the servers answer it with an error.
            out.count(Counter::ProtocolErrors as usize);
            self.test_owes_client(TestExpect::Reply(ReplyKind::Generic))?;
            return Ok(Verdict::Forward);
        };
        if self.shared.config.read_only {
            if let Some(kind) = self.read_only_skip(code, h) {
                out.count(read_only_counter(kind) as usize);
                self.fwd.dropped_by_design = true;
                self.fwd.skip_data = true;
                if code == com::STMT_PREPARE {
                    self.read_only.prepare_skipped();
                    self.prepare_passed(Fate::Skipped, out);
                }
                return Ok(Verdict::Drop);
            }
        }
        match code {
            com::STMT_PREPARE => self.client_prepare(out)?,
            c if command::carries_statement_id(c) => return self.statement_command(c, h, out),
            com::CHANGE_USER => return self.change_user(h, out),
            com::RESET_CONNECTION => {
                self.forget_statements();
                out.count(Counter::ResetConnection as usize);
                self.test_owes_client(TestExpect::Reply(ReplyKind::Generic))?;
            }
            c => {
                if expects_reply(c) {
                    self.test_owes_client(TestExpect::Reply(ReplyKind::of_command(Some(c))))?;
                }
            }
        }
        out.count(Counter::CommandsForwarded as usize);
        Ok(Verdict::Forward)
    }

    /// COM_CHANGE_USER with its auth response recomputed for the test server (`login.rs`);
    /// the client's own auth continuation is swallowed.
    fn change_user(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Verdict, Abandon> {
        if let Some(framed) = self.rewrite_change_user(h, out)? {
            self.fwd.head = framed;
        }
        self.forget_statements();
        self.fwd.swallow_client_auth = true;
        out.count(Counter::ChangeUser as usize);
        out.count(Counter::CommandsForwarded as usize);
        Ok(Verdict::Forward)
    }
}

/// Where the reader goes after `left` bytes of a packet's payload (`more`: a continuation
/// packet follows).
fn body(left: u32, more: bool, forward: bool) -> Fwd {
    match (left, more) {
        (0, false) => Fwd::Head,
        (0, true) => Fwd::ContHeader {
            hdr: [0; HEADER_LEN],
            have: 0,
            forward,
        },
        _ => Fwd::Body {
            left,
            more,
            forward,
        },
    }
}
