//! What the test server was sent and has not answered, kept so that a session that loses its
//! test-side connection can give it to the one that re-establishes it (`engine/recovery.rs`).
//!
//! A test server that restarts while it is behind production (a slower build, a busy host)
//! takes with it every command it had received and not run: thousands, at the lab's load,
//! each a command production ran. The transform knows which commands the test server has
//! answered ([`StreamTransform::replay_from`]); this log keeps the client's bytes from the
//! oldest one that it has not, and the engine seeds the session's held run with them when the
//! connection is lost. The session that comes back replays them ahead of what the client sent
//! meanwhile.
//!
//! # What it must never do
//!
//! * Hold more than the session's buffer allows, or grow once the engine nears its memory
//!   budget: the oldest bytes go instead, and a replay that would need them is not offered (a
//!   replay must start at a request).
//! * Offer bytes across a capture gap: the log restarts after one.
//! * Keep anything for a transform that cannot tell where to replay from (it returns `None`),
//!   nor for a TLS session (its plaintext does not follow the client's sequence numbers).

use common::clock::Instant;
use common::seq::SeqNumber;

use super::recovery::Held;
use super::Session;
use crate::engine::{EngineConfig, EngineStats};

/// Emptied logs kept per thread for the next session that needs one: a session keeps a log
/// only while the test server owes it something (an idle one keeps none: issue 9's 2 KiB),
/// and taking a log for each command from the allocator would cost two allocations a command
/// (`tests/engine_allocs.rs`). At most this many, each of at most [`SPARE_CAPACITY`]: 32 KiB
/// a thread. A busy session's log holds the commands of a capture block, ten or more at the
/// lab's 8 threads: at 512 bytes (the bound before) ten 41-byte commands grew it past the
/// bound, and each such session took a box and five buffer growths from the allocator every
/// block (the engine benchmark's `block=10`).
const SPARES: usize = 8;
const SPARE_CAPACITY: usize = 4096;

/// The spare logs, boxed as sessions hold them: handing one over moves a pointer, where an
/// unboxed one would take an allocation for its box each time.
#[allow(clippy::vec_box)]
#[derive(Default)]
struct Spares(Vec<Box<Kept>>);

/// What a session keeps for a replay (`Session::kept`).
#[derive(Debug)]
pub(crate) enum Kept {
    /// The run the next session replays (see `session/recovery.rs`).
    Held(Held),
    /// What the test server has not answered, while the session runs.
    Log(ReplayLog),
}

impl Kept {
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Kept::Held(h) => h.heap_bytes(),
            Kept::Log(l) => l.bytes.capacity(),
        }
    }
}

thread_local! {
    static SPARE: std::cell::RefCell<Spares> = std::cell::RefCell::new(Spares::default());
}

/// The client bytes the transform was given, from the oldest the test server still needs.
#[derive(Debug, Default)]
pub(crate) struct ReplayLog {
    /// Client sequence number of the first byte kept.
    start: SeqNumber,
    /// The transform's offset of the first byte kept (bytes given to it before).
    offset: u64,
    /// The bytes kept are `bytes[head..]`: a `Vec` and not a `VecDeque`, whose `extend` from
    /// a slice copied byte by byte (four instructions a byte in the engine benchmark).
    bytes: Vec<u8>,
    head: usize,
}

impl ReplayLog {
    /// An empty log whose first byte will be the transform's `offset` (a spare one if the
    /// thread has one).
    pub(super) fn at(offset: u64) -> Box<Kept> {
        let mut kept = SPARE
            .with(|s| s.borrow_mut().0.pop())
            .unwrap_or_else(|| Box::new(Kept::Log(ReplayLog::default())));
        if let Kept::Log(log) = &mut *kept {
            log.offset = offset;
        }
        kept
    }

    /// Gives an emptied log back for another session.
    fn recycle(mut kept: Box<Kept>) {
        let Kept::Log(log) = &mut *kept else {
            return;
        };
        if log.bytes.capacity() > SPARE_CAPACITY {
            return;
        }
        log.bytes.clear();
        log.head = 0;
        SPARE.with(|s| {
            let spares = &mut s.borrow_mut().0;
            if spares.len() < SPARES {
                spares.push(kept);
            }
        });
    }

    /// A held run the transform was given from its first byte on (a session that
    /// re-established another and has now reached the test server): its log.
    fn of_held(run: Held) -> Self {
        let (start, bytes) = run.into_parts();
        Self {
            start,
            offset: 0,
            bytes,
            head: 0,
        }
    }

    fn kept(&self) -> &[u8] {
        self.bytes.get(self.head..).unwrap_or(&[])
    }

    /// Bytes at `seq` given to the transform; `max` bounds what is kept (the oldest go).
    pub(super) fn append(&mut self, seq: SeqNumber, data: &[u8], max: usize) {
        if seq != self.end_seq() {
            // A capture gap (or the first bytes): nothing before it can be replayed.
            self.offset = self.end_offset();
            self.bytes.clear();
            self.head = 0;
            self.start = seq;
        }
        if self.head > 0 && self.head >= self.bytes.len() / 2 {
            // What was let go of is most of the buffer: move the rest down, once.
            self.bytes.drain(..self.head);
            self.head = 0;
        }
        self.bytes.extend_from_slice(data);
        let over = self.len().saturating_sub(max);
        self.drop_front(over);
    }

    pub(super) fn len(&self) -> usize {
        self.bytes.len() - self.head
    }

    fn end_seq(&self) -> SeqNumber {
        self.start + self.len()
    }

    fn end_offset(&self) -> u64 {
        self.offset + self.len() as u64
    }

    fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        self.head += n;
        self.offset += n as u64;
        self.start += n;
        if self.head == self.bytes.len() {
            self.bytes.clear();
            self.head = 0;
        }
    }

    /// Forgets what comes before `from` (`None`: everything).
    fn trim(&mut self, from: Option<u64>) {
        let keep_from = from.unwrap_or(u64::MAX);
        let n = keep_from.saturating_sub(self.offset);
        self.drop_front(usize::try_from(n).unwrap_or(usize::MAX));
    }

    /// The run to replay from `from`, if the log still has all of it.
    fn run_from(&self, from: u64) -> Option<Held> {
        if from < self.offset || from > self.end_offset() {
            return None;
        }
        let skip = usize::try_from(from - self.offset).ok()?;
        let bytes = self.kept().get(skip..)?.to_vec();
        (!bytes.is_empty()).then(|| Held::from_stream(self.start + skip, bytes))
    }
}

impl Session {
    /// The held run, if the session keeps one.
    pub(crate) fn held(&self) -> Option<&Held> {
        match self.kept.as_deref() {
            Some(Kept::Held(h)) => Some(h),
            _ => None,
        }
    }

    /// The held run, a new one if the session keeps none (a log it kept goes: a session
    /// that holds bytes no longer runs).
    pub(crate) fn held_mut(&mut self) -> &mut Held {
        if !matches!(self.kept.as_deref(), Some(Kept::Held(_))) {
            self.kept = Some(Box::new(Kept::Held(Held::default())));
        }
        match self.kept.as_deref_mut() {
            Some(Kept::Held(h)) => h,
            _ => unreachable!("set just above"),
        }
    }

    /// Takes the held run away, if there is one.
    pub(crate) fn take_held(&mut self) -> Option<Held> {
        if !matches!(self.kept.as_deref(), Some(Kept::Held(_))) {
            return None;
        }
        match *self.kept.take()? {
            Kept::Held(h) => Some(h),
            Kept::Log(_) => None,
        }
    }

    pub(crate) fn set_held(&mut self, run: Held) {
        self.kept = Some(Box::new(Kept::Held(run)));
    }

    /// The session reached the test server with a held run (it re-establishes another): the
    /// run is now the log of what its transform was given, trimmed as the test server answers.
    pub(crate) fn held_reached_test(&mut self) {
        let Some(run) = self.take_held() else {
            return;
        };
        // Only a run from the stream's first byte is what the transform was given from its
        // offset 0 (one that restarted after a capture hole is not).
        if run.starts_at(self.client_isn + 1u32) {
            self.kept = Some(Box::new(Kept::Log(ReplayLog::of_held(run))));
            self.trim_replay();
        }
    }

    /// The log goes (the session ends); a held run stays.
    pub(super) fn drop_log(&mut self) {
        if matches!(self.kept.as_deref(), Some(Kept::Log(_))) {
            self.kept = None;
        }
    }

    /// The transform may have let go of some commands (answered, or decided): so does the log.
    pub(super) fn trim_replay(&mut self) {
        let Some(Kept::Log(log)) = self.kept.as_deref_mut() else {
            return;
        };
        let from = self.transform.as_ref().and_then(|t| t.0.replay_from());
        log.trim(from);
        if log.len() == 0 {
            // Everything answered: an idle session keeps no log.
            if let Some(kept) = self.kept.take() {
                ReplayLog::recycle(kept);
            }
        }
    }

    /// The test server's connection is lost: the client bytes it was sent and did not answer,
    /// with everything the transform had not forwarded yet, as the run the next session
    /// replays. The transform hears that they are carried over, not lost. A session that
    /// never reached the test server (it re-established another, and was refused) carries
    /// its whole held run already: nothing is added, but the same is true of its commands.
    pub(crate) fn carry_over(&mut self) -> Option<Held> {
        let t = self.transform.as_mut()?;
        let log = match self.kept.as_deref() {
            Some(Kept::Held(_)) => {
                t.0.carried_over();
                return None;
            }
            Some(Kept::Log(log)) => log,
            None => return None,
        };
        let run = log.run_from(t.0.replay_from()?)?;
        t.0.carried_over();
        Some(run)
    }

    /// This session re-establishes another: the client bytes it was given so far were that
    /// one's replay, answered by production long ago.
    pub(crate) fn replayed(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) {
        self.call_transform(captured, cfg, stats, |t, out| t.on_replayed(now, out));
    }
}

#[cfg(test)]
mod tests {
    use super::ReplayLog;
    use common::seq::SeqNumber;

    fn run(log: &ReplayLog, from: u64) -> Option<(u32, Vec<u8>)> {
        let h = log.run_from(from)?;
        let (start, bytes) = h.parts();
        Some((start.0, bytes.to_vec()))
    }

    #[test]
    fn keeps_from_the_oldest_unanswered_and_restarts_after_a_gap() {
        let mut log = ReplayLog::default();
        log.append(SeqNumber(u32::MAX - 1), b"abcd", 100); // across the wrap
        log.append(SeqNumber(2), b"ef", 100);
        log.trim(Some(3));
        assert_eq!(run(&log, 3), Some((1, b"def".to_vec())));
        assert_eq!(run(&log, 2), None, "trimmed away");
        log.append(SeqNumber(10), b"xy", 100);
        assert_eq!(run(&log, 3), None, "a gap: nothing before it");
        assert_eq!(run(&log, 6), Some((10, b"xy".to_vec())));
        log.trim(None);
        assert_eq!(run(&log, 8), None);
        log.append(SeqNumber(12), b"123456", 4);
        assert_eq!(run(&log, 8), None, "over the bound: the oldest went");
        assert_eq!(run(&log, 10), Some((14, b"3456".to_vec())));
    }
}
