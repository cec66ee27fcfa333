//! Where a connection picked up mid-stream may start writing on the test server: at a
//! transaction boundary production's own replies prove.
//!
//! A connection picked up inside a transaction has had the start of that transaction run on
//! production only. Its remaining writes would run on the test server outside it, on rows that
//! transaction never changed there: sysbench's `DELETE … WHERE id = N` ran before the copier,
//! its `INSERT … (N, …)` then fails on test with a duplicate key (1062), and every `UPDATE` of
//! the tail changes what production's transaction had changed already. So, until a boundary,
//! the writes (COM_QUERY and COM_STMT_EXECUTE whose SQL `classify` does not call a read) are
//! not sent; they are counted as losses. Reads, COMMIT and SET go as they are: they change
//! nothing on the test server, inside a tail or not (a COMMIT there has nothing to commit).
//!
//! The proof is the server status of production's replies (OK and EOF packets carry
//! `SERVER_STATUS_IN_TRANS`). Any reply that leaves production outside a transaction is a
//! boundary: every command after it runs, or opens its transaction, where the test server
//! sees it too. A `BEGIN` / `START TRANSACTION` the copier sees (as a query or a prepared
//! statement) is one as well (the transform checks it before asking). Otherwise a write is
//! judged by the state before it, from the replies to the commands before it (a reply with
//! no status, PREPARE_OK say, leaves it as it was; an ERR makes it unknown: a deadlock rolls
//! the transaction back, a lock wait timeout does not); when that is unknown (the first write
//! after the pickup), by production's own reply to it: inside a transaction after it means
//! the tail. A session with `autocommit=0` opens transactions implicitly; the gate cannot
//! tell those from a tail, so their writes are dropped too until the first COMMIT: a loss it
//! counts, never a wrong statement.
//!
//! The forwarding side lags behind production while a command is held (a statement prepared
//! again on the test server first): replies are kept by command serial until their command
//! is decided, a bounded number of them.
//!
//! A capture gap the session goes past (`StreamTransform::on_client_gap`) is the same case
//! from its other end: the commands lost in it may have begun a transaction (and written in
//! it) that the test server never saw, or cut one the test server saw begin. The commands
//! after the gap are gated as after a pickup, in a stretch of their own ([`Gates`]): what
//! production's replies proved before the gap says nothing of them, while the commands
//! before it that the forwarding side has not decided yet keep their own stretch's proof.
//! Without it, the tail of a transaction cut by a gap runs on the test server and fails there
//! (sysbench's `INSERT` after the `DELETE` the gap lost: 1062).
//!
//! Sans-IO and small: the transform feeds it production's reply ends and asks it about each
//! write; the transform owns the holding and the counters. It must never hold a command
//! without a bound: past [`GATE_WAIT`] the write goes unproven (counted).

use std::collections::VecDeque;
use std::time::Duration;

use common::clock::Instant;
use common::mysql::handshake::status;

/// The longest a command waits for production's reply to tell whether it ran inside a
/// transaction the copier joined late. Production answers most commands in well under this;
/// a slow first statement is then sent unproven rather than held.
pub(super) const GATE_WAIT: Duration = Duration::from_millis(500);

/// What production's reply to a command said about its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReplyStatus {
    /// An OK or EOF with its server status.
    Status(u16),
    /// An ERR: the transaction may or may not have survived it.
    Err,
    /// A reply without a status (PREPARE_OK, a statistics string): the state is unchanged.
    None,
}

/// The gate's answer for one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// A boundary is proven: this command and every later one go as usual.
    Open,
    /// It ran inside a transaction that began before the copier saw it: not sent.
    Drop,
    /// Not known yet: hold it until production's reply (or the deadline).
    Wait,
}

/// Replies remembered for commands the forwarding side has not decided yet (it lags behind
/// production while a command is held); older ones are folded into [`TxnGate::base`].
const REPLIES_KEPT: usize = 256;

#[derive(Debug)]
pub(super) struct TxnGate {
    /// Production's transaction state after the replies no longer kept: `Some(true)` inside
    /// one, `None` unknown.
    base: Option<bool>,
    /// Replies to commands not decided yet, by serial, in order.
    replies: VecDeque<(u64, ReplyStatus)>,
    /// When the command being waited for started waiting.
    waiting: Option<(u64, Instant)>,
}

/// The state after a reply, from the state before it.
fn after(before: Option<bool>, st: ReplyStatus) -> Option<bool> {
    match st {
        ReplyStatus::Status(s) => Some(s & status::IN_TRANS != 0),
        ReplyStatus::Err => None,
        ReplyStatus::None => before,
    }
}

impl TxnGate {
    pub(super) fn new() -> Self {
        TxnGate {
            base: None,
            replies: VecDeque::new(),
            waiting: None,
        }
    }

    /// Production's reply to command `serial` ended.
    pub(super) fn replied(&mut self, serial: u64, st: ReplyStatus) {
        if self.replies.back().is_some_and(|&(s, _)| serial <= s) {
            return;
        }
        if self.replies.len() >= REPLIES_KEPT {
            if let Some(&(oldest, _)) = self.replies.front() {
                // A boundary among the folded ones is kept as the state it left.
                if self.forget_before(oldest + 1) {
                    self.base = Some(false);
                }
            }
        }
        self.replies.push_back((serial, st));
    }

    /// Folds the replies to commands before `serial` into `base`; true if one of them left
    /// production outside a transaction: a boundary before `serial` (every command after it
    /// ran, or opened its transaction, where the test server sees it too).
    fn forget_before(&mut self, serial: u64) -> bool {
        let mut outside = false;
        while let Some(&(s, st)) = self.replies.front() {
            if s >= serial {
                break;
            }
            self.base = after(self.base, st);
            outside |= self.base == Some(false);
            self.replies.pop_front();
        }
        outside
    }

    /// Command `serial`, a write. `earlier_pending`: production still owes (or is sending) a
    /// reply to an earlier command. A read is never asked about: it changes nothing on the
    /// test server, inside a tail or not.
    pub(super) fn decide(&mut self, serial: u64, earlier_pending: bool, now: Instant) -> Gate {
        if self.forget_before(serial) {
            self.waiting = None;
            return Gate::Open;
        }
        let own = self
            .replies
            .front()
            .filter(|&&(s, _)| s == serial)
            .map(|&(_, st)| st);
        let verdict = match (earlier_pending, self.base, own) {
            // The state before it, from every earlier reply.
            (false, Some(false), _) => Gate::Open,
            (false, Some(true), _) => Gate::Drop,
            // Its own reply: what it ran in, from what it left. Inside after a write that
            // did not open the transaction (the caller opens the gate at a BEGIN) is a tail;
            // an ERR proves nothing.
            (_, _, Some(st)) => match after(None, st) {
                Some(false) => Gate::Open,
                _ => Gate::Drop,
            },
            _ => Gate::Wait,
        };
        if verdict != Gate::Wait {
            self.waiting = None;
            return verdict;
        }
        match self.waiting {
            Some((s, since)) if s == serial => {
                if now.saturating_since(since) >= GATE_WAIT {
                    self.waiting = None;
                    // Unproven: the caller counts it and opens.
                    Gate::Open
                } else {
                    Gate::Wait
                }
            }
            _ => {
                self.waiting = Some((serial, now));
                Gate::Wait
            }
        }
    }

    /// When the held command stops waiting, if one is held.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.waiting.map(|(_, since)| since + GATE_WAIT)
    }

    /// Whether the gate gave up waiting on `serial` at `now` (for the caller's counter).
    pub(super) fn timed_out(&self, serial: u64, now: Instant) -> bool {
        self.waiting
            .is_some_and(|(s, since)| s == serial && now.saturating_since(since) >= GATE_WAIT)
    }
}

/// Why a stretch of a session's commands is gated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// The copier picked the connection up mid-stream.
    Pickup,
    /// A capture gap was gone past just before the stretch.
    CaptureGap,
}

/// A session's gated commands, in stretches: each from its first command's serial on, each
/// with its own gate (none once its boundary is proven). A command before every stretch, or
/// in a proven one, is not gated.
#[derive(Debug)]
pub(super) struct Gates {
    stretches: VecDeque<Stretch>,
    /// The command whose reply production is sending (its first packet seen, not its last):
    /// set and taken by the transform, which sees the packets.
    pub(super) replying: Option<u64>,
}

#[derive(Debug)]
struct Stretch {
    from: u64,
    cause: Cause,
    gate: Option<TxnGate>,
}

/// Stretches kept at most: more gaps than this while the forwarding side still holds commands
/// from before the first fold into the newest stretch, which then waits for a proof again (a
/// write more may be dropped, none is sent wrongly).
const STRETCHES_KEPT: usize = 4;

impl Gates {
    /// Commands from serial `from` on wait for a boundary.
    pub(super) fn new(cause: Cause, from: u64) -> Self {
        let mut stretches = VecDeque::with_capacity(1);
        stretches.push_back(Stretch {
            from,
            cause,
            gate: Some(TxnGate::new()),
        });
        Gates {
            stretches,
            replying: None,
        }
    }

    /// A capture gap just before command `at`: from it on, what was proven is not.
    pub(super) fn gap(&mut self, at: u64) {
        let fresh = Stretch {
            from: at,
            cause: Cause::CaptureGap,
            gate: Some(TxnGate::new()),
        };
        let full = self.stretches.len() >= STRETCHES_KEPT;
        match self.stretches.back_mut() {
            Some(last) if last.from >= at || full => {
                last.cause = Cause::CaptureGap;
                last.gate = Some(TxnGate::new());
            }
            _ => self.stretches.push_back(fresh),
        }
    }

    fn stretch_mut(&mut self, serial: u64) -> Option<&mut Stretch> {
        self.stretches.iter_mut().rev().find(|s| s.from <= serial)
    }

    /// The gate deciding command `serial` and why it is there; none if it is not gated.
    pub(super) fn gate_mut(&mut self, serial: u64) -> Option<(&mut TxnGate, Cause)> {
        let s = self.stretch_mut(serial)?;
        let cause = s.cause;
        s.gate.as_mut().map(|g| (g, cause))
    }

    /// Whether command `serial` would be asked about.
    pub(super) fn gates(&self, serial: u64) -> bool {
        self.stretches
            .iter()
            .rev()
            .find(|s| s.from <= serial)
            .is_some_and(|s| s.gate.is_some())
    }

    /// Whether some command from `serial` on may be gated.
    pub(super) fn any_from(&self, serial: u64) -> bool {
        self.gates(serial) || self.stretches.iter().any(|s| s.from > serial)
    }

    /// The boundary of the stretch holding command `serial` is proven: its gate goes.
    pub(super) fn open(&mut self, serial: u64) {
        if let Some(s) = self.stretch_mut(serial) {
            s.gate = None;
        }
    }

    /// Production's reply to command `serial` ended.
    pub(super) fn replied(&mut self, serial: u64, st: ReplyStatus) {
        if let Some((g, _)) = self.gate_mut(serial) {
            g.replied(serial, st);
        }
    }

    /// The forwarding side decides command `serial` next: stretches it is past, and proven
    /// ones first in line, are forgotten. True when nothing is left to gate.
    pub(super) fn passed(&mut self, serial: u64) -> bool {
        while let Some(first) = self.stretches.front() {
            let over = self
                .stretches
                .get(1)
                .is_some_and(|next| next.from <= serial);
            if over || first.gate.is_none() {
                self.stretches.pop_front();
            } else {
                break;
            }
        }
        self.stretches.is_empty()
    }

    /// When the held command stops waiting, if one is held.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.stretches
            .iter()
            .filter_map(|s| s.gate.as_ref()?.deadline())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IN: ReplyStatus = ReplyStatus::Status(status::IN_TRANS | status::AUTOCOMMIT);
    const OUT: ReplyStatus = ReplyStatus::Status(status::AUTOCOMMIT);

    fn t0() -> Instant {
        Instant::from_nanos(1_000_000_000)
    }

    #[test]
    fn a_tail_is_dropped_until_its_commit() {
        let mut g = TxnGate::new();
        let now = t0();
        // The first write: nothing known before it, so it waits for its own reply.
        assert_eq!(g.decide(0, false, now), Gate::Wait);
        g.replied(0, IN);
        assert_eq!(g.decide(0, false, now), Gate::Drop);
        // Inside still (a read's reply between): the next write goes the same way, at once.
        g.replied(1, IN);
        assert_eq!(g.decide(2, false, now), Gate::Drop);
        // Production still answering 2: the write after it waits.
        assert_eq!(g.decide(3, true, now), Gate::Wait);
        g.replied(2, IN);
        assert_eq!(g.decide(3, false, now), Gate::Drop);
        // The COMMIT (a read to the gate, never asked about) leaves production outside.
        g.replied(4, OUT);
        assert_eq!(g.decide(5, false, now), Gate::Open);
    }

    #[test]
    fn a_boundary_between_two_writes_opens_whatever_follows_it() {
        // sysbench: COMMIT and BEGIN are executes of prepared statements, reads to the gate;
        // the write after them is inside a transaction the test server saw begin.
        let mut g = TxnGate::new();
        g.replied(0, IN);
        assert_eq!(g.decide(0, false, t0()), Gate::Drop);
        g.replied(1, OUT); // COMMIT
        g.replied(2, IN); // BEGIN
        assert_eq!(g.decide(3, false, t0()), Gate::Open);
    }

    #[test]
    fn replies_ahead_of_the_decisions_are_kept_by_serial() {
        // The forwarding side held command 0 (its statement prepared again on test first)
        // while production answered it and two more.
        let mut g = TxnGate::new();
        g.replied(0, IN);
        g.replied(1, IN);
        g.replied(2, OUT);
        assert_eq!(g.decide(0, false, t0()), Gate::Drop);
        assert_eq!(g.decide(1, false, t0()), Gate::Drop);
        assert_eq!(g.decide(3, false, t0()), Gate::Open);
        // Bounded: the oldest fold into the state before.
        let mut g = TxnGate::new();
        for s in 0..(REPLIES_KEPT as u64 + 10) {
            g.replied(s, if s == 5 { IN } else { ReplyStatus::None });
        }
        assert!(g.replies.len() <= REPLIES_KEPT);
        assert_eq!(g.decide(REPLIES_KEPT as u64 + 10, false, t0()), Gate::Drop);
    }

    #[test]
    fn a_begin_opens_and_autocommit_statements_open() {
        let mut g = TxnGate::new();
        g.replied(0, IN);
        assert_eq!(
            g.decide(0, false, t0()),
            Gate::Drop,
            "a write inside after it: a tail"
        );
        let mut g = TxnGate::new();
        g.replied(0, OUT);
        assert_eq!(g.decide(0, false, t0()), Gate::Open, "autocommit SELECT");
        // The state before a command, known from an earlier reply.
        let mut g = TxnGate::new();
        g.replied(4, OUT);
        assert_eq!(g.decide(5, false, t0()), Gate::Open);
    }

    #[test]
    fn errors_and_statusless_replies() {
        let mut g = TxnGate::new();
        g.replied(0, IN);
        // A PREPARE_OK leaves the state as it was: still inside.
        g.replied(1, ReplyStatus::None);
        assert_eq!(g.decide(2, false, t0()), Gate::Drop);
        // An ERR makes it unknown: the next command waits for its own reply; an ERR of its
        // own drops it.
        g.replied(2, ReplyStatus::Err);
        assert_eq!(g.decide(3, false, t0()), Gate::Wait);
        g.replied(3, ReplyStatus::Err);
        assert_eq!(g.decide(3, false, t0()), Gate::Drop);
    }

    #[test]
    fn a_wait_is_bounded() {
        let mut g = TxnGate::new();
        let now = t0();
        assert_eq!(g.decide(0, false, now), Gate::Wait);
        assert_eq!(g.deadline(), Some(now + GATE_WAIT));
        let later = now + GATE_WAIT;
        assert!(g.timed_out(0, later));
        assert_eq!(g.decide(0, false, later), Gate::Open);
        assert_eq!(g.deadline(), None);
    }

    #[test]
    fn an_earlier_pending_reply_is_waited_for() {
        let mut g = TxnGate::new();
        g.replied(0, IN);
        // Production still answers command 1 (pipelined): 2's state before is not known.
        assert_eq!(g.decide(2, true, t0()), Gate::Wait);
        g.replied(1, OUT);
        assert_eq!(g.decide(2, false, t0()), Gate::Open);
    }

    #[test]
    fn a_gap_starts_a_stretch_of_its_own() {
        // A pickup's stretch from 0; production left its transaction at 1's reply.
        let mut g = Gates::new(Cause::Pickup, 0);
        g.replied(0, IN);
        g.replied(1, OUT);
        // A gap before command 5: commands 2-4 (held by the forwarding side) keep the proof.
        g.gap(5);
        assert!(!g.passed(2));
        let (gate, cause) = g.gate_mut(2).unwrap();
        assert_eq!(
            (gate.decide(2, false, t0()), cause),
            (Gate::Open, Cause::Pickup)
        );
        g.open(2);
        // ...which says nothing of 5 on: it waits for its own reply, and a tail is the gap's.
        assert!(g.gates(5));
        let (gate, cause) = g.gate_mut(5).unwrap();
        assert_eq!(
            (gate.decide(5, false, t0()), cause),
            (Gate::Wait, Cause::CaptureGap)
        );
        g.replied(5, IN);
        assert_eq!(g.gate_mut(5).unwrap().0.decide(5, false, t0()), Gate::Drop);
        // Past the first stretch it is forgotten; the gap's goes once proven.
        assert!(!g.passed(6));
        g.replied(6, OUT);
        assert_eq!(g.gate_mut(7).unwrap().0.decide(7, false, t0()), Gate::Open);
        g.open(7);
        assert!(g.passed(7), "nothing is left to gate");
    }

    #[test]
    fn commands_before_every_stretch_are_not_gated_and_stretches_are_bounded() {
        let mut g = Gates::new(Cause::CaptureGap, 10);
        assert!(!g.gates(9));
        assert!(g.any_from(9));
        assert!(g.gate_mut(9).is_none());
        g.replied(9, IN);
        assert!(g.gates(10));
        for at in [20, 30, 40, 50, 60] {
            g.gap(at);
        }
        assert!(g.stretches.len() <= STRETCHES_KEPT);
        // The newest stretch took the last gap: from 40 on, nothing proven.
        assert_eq!(
            g.gate_mut(65).unwrap().0.decide(65, false, t0()),
            Gate::Wait
        );
        assert!(g.deadline().is_some(), "the wait is bounded");
    }
}
