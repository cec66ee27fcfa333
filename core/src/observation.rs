//! What the MySQL layer tells the report about each mirrored command.
//!
//! The transforms run on the packet path and must not do I/O, block or grow without bound:
//! each hands out one [`Observation`] per client command through the engine's poll
//! interface (`StreamTransform::poll_observation`, collected by the engine after every event
//! into a bounded queue, `Engine::poll_observation`), and the driver moves them into the
//! copier's report between batches. A full queue drops the observation and counts it
//! (`EngineStats::observations_dropped`): the report says how many were lost.

use std::sync::Arc;
use std::time::Duration;

use common::clock::Instant;
use common::mysql::digest::{RowChecksum, Traits};

/// A statement shape: everything the report groups and labels commands by. Shared (`Arc`)
/// by all the commands of a session that have it, so an observation costs no allocation.
#[derive(Debug, PartialEq, Eq)]
pub struct Statement {
    /// The digest id (`common::mysql::digest::digest_id` of `command` and `fingerprint`).
    pub id: u64,
    /// The command type: `query`, `stmt_execute`, `stmt_prepare`, `init_db`, `ping`, ...
    pub command: &'static str,
    /// The normalised statement (or the command's name for commands without SQL).
    pub fingerprint: Box<str>,
    /// One concrete statement: literals masked unless `--report-literals`.
    pub example: Box<str>,
    pub traits: Traits,
}

/// What a reply was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerKind {
    /// OK (or PREPARE_OK, an auth exchange's OK).
    Ok,
    /// ERR with its error code (the last one, for a multi-result reply cut by an error).
    Err(u16),
    /// At least one result set.
    ResultSet,
    /// Something else (COM_STATISTICS' string, structure not followed).
    Other,
}

/// One server's answer to one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub kind: AnswerKind,
    /// Rows of all its result sets.
    pub rows: u64,
    /// Payload bytes of all its packets.
    pub bytes: u64,
    /// Production: the command's last byte captured to the reply's last packet captured (both
    /// on the production host). Test server: the command pushed toward it to intercept's
    /// summary of the reply's last packet received (the copier's clock).
    pub latency: Duration,
    /// When the answer completed (the copier's clock): the report's per-second series.
    pub done: Instant,
    /// Test server: how long the command waited there behind the previous reply (sent before
    /// that reply ended). `latency` leaves it out, the server's time on the command alone;
    /// `latency + waited` is what a client of that server would have waited, the measure of
    /// test A against test B (a server that falls behind is slower for its clients). Zero for
    /// production, whose clients wait for each reply.
    pub waited: Duration,
    /// The rows' checksum, when every row's payload hash was known (`--compare-results`).
    pub checksum: Option<RowChecksum>,
}

/// What became of a command on the test server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestOutcome {
    Answered(Answer),
    /// Not sent by design (`--read-only` keeps writes off): not compared, not an error.
    Skipped,
    /// Not sent because it could not be (its statement is unknown on the test server).
    Dropped,
    /// Not sent: the test server had refused its statement's prepare with this error code, so
    /// it could not run there (an execute of a statement on a table the test account may not
    /// read). Reported as a test-server error without a latency.
    Refused(u16),
    /// Sent, but its answer was never seen: the session ended first (the test server reset
    /// it, a capture gap), so it may not have run there.
    Lost,
    /// Sent, or about to be, when the test server's connection was lost with it unanswered;
    /// the session that re-established the connection sent it again (`engine/recovery.rs`).
    /// That one's answer has no production answer to go with (production's went by before
    /// it began), so nothing is compared; not a loss (a replay lost is counted in bytes).
    Resent,
    /// Sent, and the test server had it (the session went on), but its answer was not read:
    /// intercept lost the framing of the test server's stream (restarted, or dropped packets),
    /// or the test server was so far behind (`--multiply`, a slower build) that the command
    /// left the bounded bookkeeping first. Whether it ran as on production is unknown; not a
    /// loss of the mirror's.
    Unseen,
}

/// Which mirrored copy of a client command a transform plays: the `--tee` target (index in
/// `--target`) and the `--multiply` copy toward it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Replica {
    pub target: u32,
    pub copy: u32,
}

/// One client command and both servers' answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub statement: Arc<Statement>,
    /// The `--multiply` copy that observed it (0 for the first). Every copy sees production's
    /// answer; the collector counts production's side from copy 0 of target 0 only.
    pub copy: u32,
    /// The `--tee` target whose test server answered (its place in `--target`, 0 for the first
    /// and without `--tee`). Each target's side is reported apart, so test A and test B can be
    /// compared on the same commands.
    pub target: u32,
    /// Production's answer; `None` if it was not seen (capture gap, session ended first).
    pub prod: Option<Answer>,
    pub test: TestOutcome,
}
