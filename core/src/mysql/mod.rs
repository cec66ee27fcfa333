//! MySQL awareness for the mirror: the [`StreamTransform`] that keeps a mirrored session valid on
//! a test server with its own accounts, nonces and statement ids.
//!
//! # What this room is for
//!
//! The engine replays a client's bytes; a MySQL test server would refuse most of them as they
//! are. [`MysqlTransform`] rewrites exactly what ties a session to production:
//!
//! * the login, recomputed with the test server's greeting nonce and the password valid there
//!   (and the auth exchange that follows: AuthSwitchRequest, caching_sha2_password fast and full
//!   auth), while the client's own auth continuation toward production is swallowed;
//! * COM_CHANGE_USER, recomputed the same way;
//! * prepared-statement ids, translated from production's to the test server's by pairing both
//!   servers' answers to each COM_STMT_PREPARE;
//! * connections picked up mid-stream, which get a synthetic login (and, with recovered state,
//!   their schema and prepared statements) before their captured commands;
//! * the parameter types of a COM_STMT_EXECUTE sent without them (clients send them with a
//!   statement's first execute only) for a statement the test server was never given them for,
//!   such as those prepared again after a pickup: learnt from another session's typed execute
//!   of the same SQL, or guessed from the execute's bytes and verified against both servers'
//!   answers (`param_types.rs`); the packet grows by two bytes per parameter;
//! * with `read_only`, commands that write (judged by `common::mysql::classify`; a COM_QUERY or
//!   COM_STMT_PREPARE is collected whole, up to 1 MiB, to be judged) and every statement command
//!   naming a statement prepared from one: they are neither sent nor awaited, LOCAL INFILE
//!   contents and 16 MiB continuations included. Our stream is the client's minus those
//!   commands (the engine numbers it in our own sequence space), and each server's replies
//!   stay matched because each side awaits only what it was sent. The test server so only ever
//!   holds read statements, whatever ids the client names.
//!
//! Everything else passes byte for byte, including commands of 16 MiB and more, which are
//! streamed through without being buffered whole (under `read_only`, once judged).
//!
//! # What it must never do
//!
//! * I/O, clocks, logging or blocking: it is a deterministic function of what the engine feeds
//!   it (randomness for RSA padding comes from the caller's [`RandomBytes`]).
//! * Expose a password or a scramble: nothing here prints them, `Debug` shows phases only, and
//!   passwords are held only during an auth exchange.
//! * Panic or grow without bound on any input: every buffer has a limit, and a session that
//!   would exceed one is given up ([`StreamTransform`]'s `abandon`) and counted.
//! * Parse bytes that are not a packet start as a command: continuation packets of a
//!   0xFFFFFF-long packet, LOCAL INFILE data and auth continuations are recognised by framing
//!   and sequence ids, never by their content.

mod observe;
mod param_types;
mod replies;
mod resync;
mod transform;
mod txn_gate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use common::clock::Instant;
use common::mysql::classify::WriteKind;

use crate::credentials::Credentials;
use crate::engine::{SessionInfo, StreamTransform, TransformFactory};
use crate::observation::Replica;

pub use observe::ReportHooks;
pub use transform::MysqlTransform;

/// Fills the buffer from a cryptographically secure source; returns false if it could not.
/// Only caching_sha2_password's full authentication (RSA-OAEP padding) uses it.
pub type RandomBytes = Arc<dyn Fn(&mut [u8]) -> bool + Send + Sync>;

/// How MySQL sessions are mirrored.
#[derive(Clone, Debug)]
pub struct MysqlConfig {
    /// The user a picked-up connection logs in as on the test server (its real user is unknown
    /// without recovered state). `None`: picked-up connections are not mirrored.
    pub default_user: Option<String>,
    /// The schema a picked-up connection selects at login, if any.
    pub default_db: Option<String>,
    /// For a picked-up connection, how long to wait for [`MysqlTransform::recover`] before
    /// logging in with the defaults. `None`: no state will be recovered; log in at once.
    pub recovery_wait: Option<Duration>,
    /// Client bytes a session may hold back (commands waiting for the test server's login or a
    /// PREPARE_OK); beyond, the session is given up. The engine's `max_session_buffer` also
    /// counts them.
    pub max_held_bytes: usize,
    /// Prepared statements tracked per session (see `StatementMap::new`).
    pub max_statements: usize,
    /// A login (or COM_CHANGE_USER) of a user without credentials passes unchanged instead of
    /// giving the session up: for a test server that does not check passwords
    /// (`--skip-grant-tables`). A picked-up connection then logs in with an empty response.
    pub forward_without_credentials: bool,
    /// `--read-only`: commands that write (see `common::mysql::classify`) are not sent to the
    /// test server, nor awaited from it; executes of statements prepared from them neither.
    /// Counted per kind (`read_only_skipped_*`).
    pub read_only: bool,
    /// With `read_only`: CALL is mirrored (the operator vouches that the procedures only read).
    pub allow_calls: bool,
    /// `--report`: every client command and both servers' answers go to this sink.
    pub report: Option<ReportHooks>,
    /// TLS sessions are mirrored from the plaintext production's TLS library handled
    /// (`--tls-sessions`, the copier's eBPF probe): a client's SSLRequest is dropped and its
    /// login and commands arrive through [`Engine::on_plaintext`](crate::engine::Engine::on_plaintext).
    /// Off: a TLS session is given up at its login and counted (`not_mirrorable_tls`).
    pub tls_plaintext: bool,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            default_user: None,
            default_db: None,
            recovery_wait: None,
            max_held_bytes: 4 << 20,
            max_statements: common::mysql::stmt::DEFAULT_LIMIT,
            forward_without_credentials: false,
            read_only: false,
            allow_calls: false,
            report: None,
            tls_plaintext: false,
        }
    }
}

/// When a query to production was sent and its answer received (capture clock).
pub type RoundTrip = (Instant, Instant);

/// What `--prod-dsn` learnt about a picked-up connection on production.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RecoveredState {
    /// The connection's user (`information_schema.PROCESSLIST.USER`).
    pub user: String,
    /// Its current schema (`PROCESSLIST.DB`).
    pub db: Option<String>,
    /// Its prepared statements: production's statement id and SQL text
    /// (`performance_schema.prepared_statements_instances`).
    pub statements: Vec<(u32, Vec<u8>)>,
    /// `SET` statements that give the test session the variables this connection set on
    /// production: session system variables where the server exposes them (MySQL's
    /// `performance_schema.variables_by_thread`) and user variables
    /// (`performance_schema.user_variables_by_thread`, MySQL and MariaDB). Built by
    /// `prod_state::set_statement`, which alone decides what production's bytes may become.
    pub variables: Vec<Vec<u8>>,
    /// Variables production had that no `SET` can carry (a name or value out of bounds).
    pub variables_dropped: u32,
    /// The round trip of the query that read the variables, on the capture's clock:
    /// production read them within it. What the client's commands production answered before
    /// it did is in them; their `SET`s go to the test server where production read them
    /// (`transform/pickup.rs`, `variables_first`). `None`: before every held command.
    pub variables_at: Option<RoundTrip>,
    /// The same `SET`s from a second read right after the first, and its round trip: the
    /// session starts from it when a command writing a variable was answered within the first
    /// read's round trip (on neither known side of it).
    pub variables_again: Option<(Vec<Vec<u8>>, Option<RoundTrip>)>,
}

impl fmt::Debug for RecoveredState {
    // SQL text can hold literals a user would not want in a log; lengths are enough.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveredState")
            .field("user", &self.user)
            .field("db", &self.db)
            .field("statements", &self.statements.len())
            .field("variables", &self.variables.len())
            .field("variables_dropped", &self.variables_dropped)
            .finish()
    }
}

/// Sent instead of a [`RecoveredState`] when `--prod-dsn` has nothing for a picked-up
/// connection (not found on production, lookup failed or was dropped): the session logs in with
/// the defaults at once rather than waiting out `recovery_wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotRecovered;

/// Counter ids the MySQL transform bumps (`TransformStats` index = discriminant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    LoginsRewritten,
    AuthSwitches,
    FullAuthRsa,
    AuthFailedOnTest,
    NoCredentials,
    NotMirrorableTls,
    /// TLS sessions mirrored from the plaintext capture: their SSLRequest dropped, or picked
    /// up midway (their first captured bytes a TLS record).
    TlsSessionsFromPlaintext,
    /// Plaintext of TLS connections picked up midway, passed over until a command's header
    /// (the command the probe joined inside is lost: a loss).
    TlsPickupBytesLost,
    /// Picked-up TLS connections whose first command's header was read before the probe
    /// joined: restored from its body's length (see `transform::login::pickup_piece`).
    TlsPickupHeadersRestored,
    NotMirrorableCompression,
    ClientAuthPacketsSwallowed,
    CommandsForwarded,
    CommandsHeldAwaitingPrepare,
    /// Times a session's commands started waiting in the copier because the test server was
    /// [`MAX_IN_FLIGHT`] commands behind production (slower, or short of CPU); they go out
    /// once it has caught up by a quarter of that.
    ///
    /// [`MAX_IN_FLIGHT`]: transform::MAX_IN_FLIGHT
    TestBehindHolds,
    StatementsMapped,
    ExecutesDroppedUnknownStatement,
    ExecutesDroppedRejected,
    ExecutesDroppedPreparedBeforePickup,
    ExecutesDroppedUntracked,
    StmtCommandsDropped,
    /// COM_STMT_CLOSE/RESET/FETCH/SEND_LONG_DATA of a statement whose prepare the test server
    /// refused: not sent, and not a loss of their own (the prepare and the executes are).
    StmtCommandsOfRejectedStatement,
    ChangeUser,
    ResetConnection,
    PickupLogins,
    PickupNoDefaultUser,
    PickupUnframed,
    FramingLost,
    ProtocolErrors,
    UnsupportedAuthPlugin,
    FullAuthFailed,
    TestRefused,
    HeldOverflow,
    StatementsRejectedOnTest,
    StatementsOrphanedClosed,
    StatementsOverLimit,
    StatementTrackingLost,
    RepliesUnmatched,
    ProdResyncs,
    ProdAnswersLost,
    RecoveredSessions,
    RecoveredStatements,
    RecoveryUserMismatch,
    RecoveryTimeouts,
    RecoveryInitDbFailed,
    /// Variables set again on the test server for a recovered session.
    RecoveredVariables,
    /// COM_INIT_DB the copier sent on its own: the schema of a picked-up connection.
    InjectedInitDb,
    /// Variables production reported that no `SET` could carry (name or value out of bounds).
    RecoveryVariablesDropped,
    /// A recovered variable's `SET` the test server refused.
    RecoverySetFailed,
    AuthSwitchNonceAssumed,
    AuthForwardedUnchanged,
    /// A command held for the test server's PREPARE_OK whose summary was lost: the test
    /// server's stream was seen past the last summary at one of the wait's 10 s looks.
    HeldTimeouts,
    /// A reply's sequence ids disagreed with its structure (the ids were followed).
    ReplySeqMismatches,
    /// A reply whose structure could not be followed: cut by sequence ids alone.
    ReplyStructureLost,
    // `--read-only`: commands not sent to the test server, by the kind of write they carry
    // (`common::mysql::classify::WriteKind`, same order). By design, not losses.
    ReadOnlySkippedInsert,
    ReadOnlySkippedUpdate,
    ReadOnlySkippedDelete,
    ReadOnlySkippedReplace,
    ReadOnlySkippedDdl,
    ReadOnlySkippedLoadData,
    ReadOnlySkippedLockingRead,
    ReadOnlySkippedCall,
    ReadOnlySkippedSelectInto,
    ReadOnlySkippedAdmin,
    ReadOnlySkippedOther,
    /// COM_STMT_EXECUTE / BULK_EXECUTE of a statement whose prepare was not sent.
    ReadOnlySkippedStmtExecute,
    // Parameter types the test server was never given (`param_types.rs`).
    /// Executes sent with the types a client of another session gave the same SQL.
    ParamTypesLearnt,
    /// Executes sent with types guessed from their own bytes.
    ParamTypesGuessed,
    /// Guesses found wrong (the test server refused where production ran, or a later
    /// execute's bytes did not fit them): the next execute carries another.
    ParamTypesCorrected,
    /// Executes not sent: the test server needed types and none could be given (too long to
    /// hold, or no guess reads their bytes). A loss.
    ExecutesDroppedUndecodable,
    /// Executes of a statement unknown after a capture gap (its prepare may have been in it).
    ExecutesDroppedPreparedInCaptureGap,
    /// Capture gaps the session could not go on after: in a login, or cutting a command in
    /// two (its start already read). The session ends as a capture gap.
    CaptureGapsInsideCommand,
    /// Recovered statements prepared on the test server at their first use after the pickup
    /// (in the schema the session is in then, as the client's own use shows it).
    RecoveredPreparedAtFirstUse,
    /// Statements of a picked-up connection closed before their next use (recovered, or gone
    /// before production's lookup): never prepared on the test server, nothing lost.
    RecoveredClosedUnused,
    /// Queries, prepares and executes of a picked-up connection that production ran between
    /// the pickup and its read of the connection's state, and that depend on what it could
    /// not read: a user variable (`@` in their SQL), or the schema when a later command of
    /// that stretch changed it. Not sent (a loss); the others go as they are. They ran in a state the
    /// copier cannot give the test server (before the snapshot), and once sent after it they
    /// would apply twice (`SET @n = @n + 1`).
    CommandsDroppedBeforeStateRead,
    /// Picked-up sessions started from production's second read of their variables: a
    /// command writing one was answered within the first read's round trip.
    RecoveryVariablesReadAgain,
    /// Queries and executes of a picked-up connection inside a transaction that began before
    /// the copier saw it (production's replies said so, `txn_gate.rs`): not sent (a loss),
    /// since the test server never ran that transaction's start.
    CommandsDroppedBeforeTransactionBoundary,
    /// Commands of a picked-up connection (or after a capture gap) sent before a transaction
    /// boundary was proven: production's reply to them did not come within `GATE_WAIT` (or
    /// its replies cannot be framed). Sent as they are; a duplicate key on the test server may follow.
    TransactionBoundaryUnproven,
    /// COM_STMT_RESET of a statement prepared before the pickup that nobody could recover
    /// (closed before `--prod-dsn` read the connection, or no `--prod-dsn`): not sent, and not
    /// a loss of its own (a reset runs nothing; the execute after it is counted).
    StmtResetsOfStatementsBeforePickup,
    /// COM_STATISTICS sent to a blind session's test server to find its replies again
    /// (`resync.rs`).
    ResyncProbes,
    /// Blind sessions whose replies are followed again: the probe's answer was found.
    TestFramingResumed,
    /// Probes whose answer was not found in time (or a client's own COM_STATISTICS made it
    /// ambiguous): the session stays blind.
    ResyncsFailed,
    /// Queries and executes that wrote inside a transaction a capture gap cut (the gap may
    /// hold its start, or writes of it the test server never ran; production's replies said
    /// it was still open, `txn_gate.rs`): not sent (a loss), since on the test server they
    /// would run on rows that transaction never changed there.
    CommandsDroppedInTransactionCutByGap,
}

/// Names of [`Counter`] ids, in id order (metrics labels and the summary).
pub const COUNTER_NAMES: &[&str] = &[
    "logins_rewritten",
    "auth_switches",
    "full_auth_rsa",
    "auth_failed_on_test",
    "no_credentials",
    "not_mirrorable_tls",
    "tls_sessions_from_plaintext",
    "tls_pickup_bytes_lost",
    "tls_pickup_headers_restored",
    "not_mirrorable_compression",
    "client_auth_packets_swallowed",
    "commands_forwarded",
    "commands_held_awaiting_prepare",
    "test_behind_holds",
    "statements_mapped",
    "executes_dropped_unknown_statement",
    "executes_dropped_rejected",
    "executes_dropped_prepared_before_pickup",
    "executes_dropped_untracked",
    "stmt_commands_dropped",
    "stmt_commands_of_rejected_statement",
    "change_user",
    "reset_connection",
    "pickup_logins",
    "pickup_no_default_user",
    "pickup_unframed",
    "framing_lost",
    "protocol_errors",
    "unsupported_auth_plugin",
    "full_auth_failed",
    "test_refused",
    "held_overflow",
    "statements_rejected_on_test",
    "statements_orphaned_closed",
    "statements_over_limit",
    "statement_tracking_lost",
    "replies_unmatched",
    "prod_resyncs",
    "prod_answers_lost",
    "recovered_sessions",
    "recovered_statements",
    "recovery_user_mismatch",
    "recovery_timeouts",
    "recovery_init_db_failed",
    "recovered_variables",
    "injected_init_db",
    "recovery_variables_dropped",
    "recovery_set_failed",
    "auth_switch_nonce_assumed",
    "auth_forwarded_unchanged",
    "held_timeouts",
    "reply_seq_mismatches",
    "reply_structure_lost",
    "read_only_skipped_insert",
    "read_only_skipped_update",
    "read_only_skipped_delete",
    "read_only_skipped_replace",
    "read_only_skipped_ddl",
    "read_only_skipped_load_data",
    "read_only_skipped_locking_read",
    "read_only_skipped_call",
    "read_only_skipped_select_into",
    "read_only_skipped_admin",
    "read_only_skipped_other",
    "read_only_skipped_stmt_execute",
    "param_types_learnt",
    "param_types_guessed",
    "param_types_corrected",
    "executes_dropped_undecodable",
    "executes_dropped_prepared_in_capture_gap",
    "capture_gaps_inside_command",
    "recovered_prepared_at_first_use",
    "recovered_closed_unused",
    "commands_dropped_before_state_read",
    "recovery_variables_read_again",
    "commands_dropped_before_transaction_boundary",
    "transaction_boundary_unproven",
    "stmt_resets_of_statements_before_pickup",
    "resync_probes",
    "test_framing_resumed",
    "resyncs_failed",
    "commands_dropped_in_transaction_cut_by_gap",
];

/// Prefix of the protocol-layer counters of commands `--read-only` keeps off the test server.
pub const READ_ONLY_PREFIX: &str = "read_only_skipped_";

/// Whether a protocol-layer counter counts commands, logins or sessions the test server did not
/// get as production did. What `--read-only` skips was asked for: not a loss.
pub fn is_protocol_loss(name: &str) -> bool {
    if name.starts_with(READ_ONLY_PREFIX) {
        return false;
    }
    const MARKS: [&str; 10] = [
        "dropped",
        "failed",
        "no_credentials",
        "not_mirrorable",
        "lost",
        "overflow",
        "unframed",
        "unmatched",
        "no_default_user",
        "refused",
    ];
    MARKS.iter().any(|m| name.contains(m))
}

/// What `--read-only` counts a command under.
pub(crate) fn read_only_counter(kind: WriteKind) -> Counter {
    match kind {
        WriteKind::Insert => Counter::ReadOnlySkippedInsert,
        WriteKind::Update => Counter::ReadOnlySkippedUpdate,
        WriteKind::Delete => Counter::ReadOnlySkippedDelete,
        WriteKind::Replace => Counter::ReadOnlySkippedReplace,
        WriteKind::Ddl => Counter::ReadOnlySkippedDdl,
        WriteKind::LoadData => Counter::ReadOnlySkippedLoadData,
        WriteKind::LockingRead => Counter::ReadOnlySkippedLockingRead,
        WriteKind::Call => Counter::ReadOnlySkippedCall,
        WriteKind::SelectInto => Counter::ReadOnlySkippedSelectInto,
        WriteKind::Admin => Counter::ReadOnlySkippedAdmin,
        WriteKind::Other => Counter::ReadOnlySkippedOther,
    }
}

const _: () =
    assert!(COUNTER_NAMES.len() == Counter::CommandsDroppedInTransactionCutByGap as usize + 1);
const _: () = assert!(COUNTER_NAMES.len() <= crate::engine::TRANSFORM_COUNTERS);

/// The in-line sizes of a MySQL session's parts (bytes), for the memory breakdown of
/// `examples/idle_memory.rs` (docs/BENCHMARKS.md "Memory per idle mirrored session").
#[doc(hidden)]
pub fn session_layout() -> Vec<(&'static str, usize)> {
    transform::layout()
}

/// What every session of a factory shares: read-only, but for the parameter types learnt from
/// clients (a bounded cache behind a lock).
pub(crate) struct Shared {
    pub(crate) config: MysqlConfig,
    pub(crate) credentials: Arc<Credentials>,
    pub(crate) random: RandomBytes,
    learnt: param_types::LearntTypes,
    /// The report observer's shapes of prepared SQL, shared by the factory's sessions.
    pub(crate) prepared_shapes: Arc<observe::PreparedShapes>,
}

/// Makes a [`MysqlTransform`] for every session. Clones share the configuration and
/// credentials (engines of one fleet).
#[derive(Clone)]
pub struct MysqlFactory {
    shared: Arc<Shared>,
    /// The `--tee` target and `--multiply` copy this factory's engine plays (reported with
    /// each observation).
    replica: Replica,
}

impl fmt::Debug for MysqlFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlFactory")
            .field("config", &self.shared.config)
            .field("credentials", &self.shared.credentials)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl MysqlFactory {
    /// `credentials` are the test server's passwords (`--mysql-credentials`); `random` fills
    /// buffers from a CSPRNG (e.g. getrandom, or `/dev/urandom`).
    pub fn new(config: MysqlConfig, credentials: Arc<Credentials>, random: RandomBytes) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                credentials,
                random,
                learnt: param_types::LearntTypes::new(),
                prepared_shapes: Arc::default(),
            }),
            replica: Replica::default(),
        }
    }

    /// The same factory for `--multiply` copy `copy` (0 is the first).
    pub fn for_copy(mut self, copy: u32) -> Self {
        self.replica.copy = copy;
        self
    }

    /// The same factory for `--tee` target `target` (its index in `--target`, 0 is the first).
    pub fn for_target(mut self, target: u32) -> Self {
        self.replica.target = target;
        self
    }

    /// The transform for one session, for callers that need its MySQL-specific methods
    /// ([`MysqlTransform::on_test_packet`], [`MysqlTransform::recover`]) without the engine.
    pub fn make(&self, now: Instant, session: &SessionInfo) -> MysqlTransform {
        MysqlTransform::new(now, session, Arc::clone(&self.shared), self.replica)
    }
}

impl TransformFactory for MysqlFactory {
    fn create(&mut self, now: Instant, session: &SessionInfo) -> Option<Box<dyn StreamTransform>> {
        Some(Box::new(self.make(now, session)))
    }

    fn counter_names(&self) -> &'static [&'static str] {
        COUNTER_NAMES
    }
}
