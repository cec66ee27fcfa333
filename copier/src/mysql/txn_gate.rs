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
    /// The command whose reply production is sending (its first packet seen, not its last):
    /// set and taken by the transform, which sees the packets.
    pub(super) replying: Option<u64>,
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
            replying: None,
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
}
