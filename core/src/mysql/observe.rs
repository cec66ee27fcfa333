//! The comparison report's view of one session: each client command, production's answer and
//! the test server's, pushed as one [`Observation`] once both are known.
//!
//! The transform owns the protocol; this only listens. It is told, in stream order:
//!
//! * a client command arrived (its serial number, its first bytes): the [`Statement`] it
//!   belongs to is worked out here (fingerprint of its SQL, or of the prepared statement an
//!   execute names), and when its last byte arrived (production's latency starts there);
//! * production's reply to serial `n` started, each of its packets (with its role in the reply
//!   and, under `--compare-results`, its payload hash), its end;
//! * what the forwarding reader decided for serial `n` (sent at `now`, kept off by
//!   `--read-only`, dropped);
//! * the test server's reply to serial `n` started, its packets, its end (from intercept's
//!   summaries);
//! * losses: production's replies no longer followed, the test server's framing lost.
//!
//! Commands the copier sends on its own (synthetic logins, `COM_INIT_DB`, re-prepares,
//! `COM_STMT_CLOSE` of orphans) never get a serial and are never reported. Observations leave
//! in command order; everything still pending when the session ends leaves as it is (counted
//! by the report as not compared).
//!
//! Bounded: at most [`MAX_PENDING`] commands wait for answers, at most `max_statements`
//! prepared statements are remembered, and a small cache of statement shapes makes a repeated
//! COM_QUERY cost a fingerprint into a reused buffer and no allocation. The shapes of prepared
//! SQL are shared by the sessions of a factory ([`PreparedShapes`], at most
//! [`SHARED_SHAPES`] texts of at most [`SHARED_SQL_MAX`] bytes): every connection of a pool
//! prepares the same statements, and each would lex them again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::clock::Instant;
use common::mysql::command::{com, statement_id};
use common::mysql::digest::{self, RowChecksum, Traits};
use common::mysql::stmt::{ByStatementId, LAST_PREPARED};

use super::replies::{Role, Seen};
use crate::observation::{Answer, AnswerKind, Observation, Replica, Statement, TestOutcome};

/// Commands waiting for their answers; beyond, the oldest leaves unanswered.
pub(super) const MAX_PENDING: usize = 4096;
/// Statement shapes cached per session.
const CACHE: usize = 32;
/// Longest example kept, in bytes.
const MAX_EXAMPLE: usize = 1024;
/// The fingerprint of executes of a statement prepared before the capture started (and not
/// recovered with `--prod-dsn`).
const UNKNOWN_STATEMENT: &str = "(statement prepared before the capture)";
/// SQL bytes of a command looked at for its fingerprint (the arrival scanner's prefix).
pub(super) const SQL_LOOKED_AT: usize = 16 * 1024;
/// How long an observer's queues stay empty before they give their room back. A command in
/// flight needs a `Pending` (248 bytes) and its end an `Observation` (208) in queues that grow
/// to four at once: kept, they were 1.8 KiB of every idle session's 4.4 (issue 9's target is
/// 2 KiB); freed at every command's end, they would cost allocations per command. A session
/// busy again within this keeps them.
const IDLE_TRIM: Duration = Duration::from_secs(1);

/// How a session reports (the same for all sessions of a factory). Its observations leave
/// through the engine's poll interface (`StreamTransform::poll_observation`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReportHooks {
    /// `--compare-results`: production's payloads are hashed (intercept hashes the test
    /// server's when the copier's Hello asked).
    pub compare_results: bool,
    /// `--report-literals`: examples keep their values.
    pub literals: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProdSide {
    Waiting,
    Done(Answer),
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestSide {
    /// The forwarding reader has not reached it yet.
    Undecided,
    /// Sent at this time; its answer is awaited.
    Awaiting(Instant),
    Done(TestOutcome),
}

/// What the forwarding reader did with a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    Sent,
    /// Sent, but no answer will be seen (the test server's framing is lost).
    SentBlind,
    /// `--read-only` kept it off.
    Skipped,
    /// It could not be sent (unknown statement, tracking lost).
    Dropped,
    /// It could not be sent: the test server refused its statement's prepare with this code.
    Refused(u16),
}

struct Pending {
    statement: Arc<Statement>,
    /// When its last byte arrived.
    arrived: Option<Instant>,
    /// A prepare: the shape its executes take, registered under production's statement id.
    registers: Option<Arc<Statement>>,
    /// A statement command naming an id not known when it arrived (a picked-up connection
    /// whose statements `--prod-dsn` may still recover): the id and the command type.
    unresolved: Option<(u32, &'static str)>,
    prod: ProdSide,
    test: TestSide,
}

/// One reply being read.
#[derive(Clone, Copy, Debug)]
struct Acc {
    serial: u64,
    kind: Option<AnswerKind>,
    rows: u64,
    bytes: u64,
    sum: RowChecksum,
    /// Every row's hash was known.
    hashed: bool,
    /// The last packet was a row (a continuation packet belongs to it).
    in_row: bool,
    /// The statement id of a PREPARE_OK.
    prepared: Option<u32>,
    first: bool,
}

impl Acc {
    fn new(serial: u64) -> Self {
        Self {
            serial,
            kind: None,
            rows: 0,
            bytes: 0,
            sum: RowChecksum::default(),
            hashed: true,
            in_row: false,
            prepared: None,
            first: true,
        }
    }

    /// As that many packets with the roles [`Role::Definition`] and [`Role::Row`] (or
    /// [`Role::Unknown`]), without hashes: runs are folded only when none are asked for.
    fn folded(&mut self, rows: Option<u64>, payload: u64) {
        self.bytes += payload;
        self.first = false;
        self.in_row = false;
        if let Some(n @ 1..) = rows {
            self.rows += n;
            self.in_row = true;
            self.hashed = false;
        }
    }

    fn packet(&mut self, seen: &Seen, len: u32, head: &[u8], hash: Option<u64>, cont: bool) {
        self.bytes += u64::from(len);
        if cont {
            if self.in_row {
                match hash {
                    Some(h) => self.sum.add_piece(h),
                    None => self.hashed = false,
                }
            }
            return;
        }
        let first = std::mem::replace(&mut self.first, false);
        self.in_row = false;
        match seen.role {
            Role::Ok => {
                if first && head.len() >= 5 {
                    self.prepared = Some(u32::from_le_bytes([head[1], head[2], head[3], head[4]]));
                }
                self.kind.get_or_insert(AnswerKind::Ok);
            }
            Role::Err => {
                let code = head
                    .get(1..3)
                    .map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
                self.kind = Some(AnswerKind::Err(code));
            }
            Role::ColumnCount => {
                if matches!(self.kind, None | Some(AnswerKind::Ok | AnswerKind::Other)) {
                    self.kind = Some(AnswerKind::ResultSet);
                }
            }
            Role::Row => {
                self.rows += 1;
                self.in_row = true;
                match hash {
                    Some(h) => self.sum.add(h),
                    None => self.hashed = false,
                }
            }
            Role::Other => {
                self.kind.get_or_insert(AnswerKind::Other);
            }
            Role::Definition | Role::RowsEnd | Role::Unknown => {}
        }
    }

    fn answer(&self, latency_from: Option<Instant>, now: Instant, compare: bool) -> Answer {
        self.answer_after(latency_from, latency_from, now, compare)
    }

    /// The answer of a command sent at `sent` whose latency counts from `from` (the end of
    /// the reply before it, when later).
    fn answer_after(
        &self,
        sent: Option<Instant>,
        from: Option<Instant>,
        now: Instant,
        compare: bool,
    ) -> Answer {
        let since =
            |t: Option<Instant>| t.map_or(std::time::Duration::ZERO, |t| now.saturating_since(t));
        let latency = since(from);
        Answer {
            kind: self.kind.unwrap_or(AnswerKind::Other),
            rows: self.rows,
            bytes: self.bytes,
            latency,
            done: now,
            waited: since(sent).saturating_sub(latency),
            checksum: (compare && self.hashed).then_some(self.sum),
        }
    }
}

/// In-line sizes of an [`Observer`] and what its queues hold (see `mysql/mod.rs`'s
/// `session_layout`).
pub(super) fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::size_of;
    vec![
        ("mysql Observer (--report, MySQL)", size_of::<Observer>()),
        ("mysql observer pending item", size_of::<Pending>()),
        ("mysql observer outbox item", size_of::<Observation>()),
        (
            "mysql observer early item",
            size_of::<(u64, Decision, Instant)>(),
        ),
        ("mysql Statement (shared shape)", size_of::<Statement>()),
    ]
}

/// Prepared SQL texts whose shapes [`PreparedShapes`] keeps, at most; past it the oldest goes.
pub(super) const SHARED_SHAPES: usize = 1024;
/// Longer prepared SQL is not kept there (its shapes are made per session, as any SQL's).
pub(super) const SHARED_SQL_MAX: usize = 1024;

/// The shapes (the executes', the prepare's) of each prepared SQL text, shared by the sessions
/// of one factory. A connection that has just opened has an empty cache of its own, and a
/// pooled application's connections each prepare the same statements (sysbench 22 each): the
/// first session's fingerprint serves the rest. Exact: keyed by the whole text, and the shapes
/// depend on nothing else a factory's sessions do not share (their `ReportHooks`). At most
/// [`SHARED_SHAPES`] texts of at most [`SHARED_SQL_MAX`] bytes: a few MiB at worst, outside
/// any session's charge, like the learnt parameter types.
#[derive(Default)]
pub(crate) struct PreparedShapes {
    map: Mutex<ShapeMap>,
}

/// A prepared SQL text's shapes: its executes', the prepare's.
type Shapes = (Arc<Statement>, Arc<Statement>);

#[derive(Default)]
struct ShapeMap {
    by_sql: HashMap<Box<[u8]>, Shapes>,
    /// Texts in the order first kept: the eviction order.
    order: VecDeque<Box<[u8]>>,
}

impl PreparedShapes {
    fn lock(&self) -> std::sync::MutexGuard<'_, ShapeMap> {
        // The map holds no invariant a panicking holder could break halfway.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn get(&self, sql: &[u8]) -> Option<Shapes> {
        if sql.len() > SHARED_SQL_MAX {
            return None;
        }
        self.lock().by_sql.get(sql).cloned()
    }

    pub(super) fn put(&self, sql: &[u8], exec: &Arc<Statement>, prepare: &Arc<Statement>) {
        if sql.len() > SHARED_SQL_MAX {
            return;
        }
        let mut m = self.lock();
        if m.by_sql.contains_key(sql) {
            return;
        }
        if m.order.len() >= SHARED_SHAPES {
            if let Some(old) = m.order.pop_front() {
                m.by_sql.remove(&old);
            }
        }
        m.order.push_back(sql.into());
        m.by_sql
            .insert(sql.into(), (Arc::clone(exec), Arc::clone(prepare)));
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().by_sql.len()
    }
}

/// See the module documentation.
pub(super) struct Observer {
    hooks: ReportHooks,
    replica: Replica,
    max_statements: usize,
    pending: VecDeque<Pending>,
    /// Serial of `pending[0]`.
    base: u64,
    /// The newest command whose last byte has not arrived: (serial, stream end offset).
    arriving: Option<(u64, u64)>,
    /// Production's statement id -> the shape of its executes.
    statements: ByStatementId<Arc<Statement>>,
    last_prepared: Option<Arc<Statement>>,
    cache: Vec<Arc<Statement>>,
    cache_next: usize,
    /// What the cached shapes take (see [`shape_bytes`]), kept as they come and go: the memory
    /// charge reads fields, never scans.
    cache_bytes: usize,
    scratch: Vec<u8>,
    prod: Option<Acc>,
    test: Option<Acc>,
    /// When each server's previous reply ended: a command sent while the server was still
    /// answering the one before starts being served only then (one connection runs one command
    /// at a time). Production's clients wait for answers, the test server's do not (we send as
    /// production's client sent), so without this a slow command would make every later one of
    /// its session look slow on the test server.
    prod_last_end: Option<Instant>,
    test_last_end: Option<Instant>,
    /// Decisions on commands the arrival reader has not reported yet: it waits for a whole
    /// command (up to [`SQL_LOOKED_AT`] bytes) while the forwarding reader may decide from its
    /// first five.
    early: VecDeque<(u64, Decision, Instant)>,
    /// Commands whose both answers are known (or will never be), oldest first, until the
    /// engine collects them after the event that completed them.
    outbox: VecDeque<Observation>,
    /// When the queues, empty since, give their room back (see [`IDLE_TRIM`]).
    trim_at: Option<Instant>,
    /// The factory's shapes of prepared SQL.
    prepared: Arc<PreparedShapes>,
}

impl Observer {
    /// Bytes this observer occupies, roughly (for the engine's memory budget): its tables'
    /// capacities; statement shapes are shared (`Arc`) and bounded by `max_statements`, each
    /// counted at the size of its digest text's bound.
    pub(super) fn memory_len(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>()
            + self.pending.capacity() * size_of::<Pending>()
            + self.statements.capacity() * (size_of::<(u32, Arc<Statement>)>() + 1)
            + self.statements.len() * (size_of::<Statement>() + SQL_LOOKED_AT / 16)
            + self.cache.capacity() * size_of::<Arc<Statement>>()
            + self.cache_bytes
            + self.scratch.capacity()
            + self.early.capacity() * size_of::<(u64, Decision, Instant)>()
            + self.outbox.capacity() * size_of::<Observation>()
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("pending", &self.pending.len())
            .field("statements", &self.statements.len())
            .finish_non_exhaustive()
    }
}

impl Observer {
    pub(super) fn new(
        hooks: ReportHooks,
        replica: Replica,
        max_statements: usize,
        prepared: Arc<PreparedShapes>,
    ) -> Self {
        Self {
            hooks,
            replica,
            max_statements,
            pending: VecDeque::new(),
            base: 0,
            arriving: None,
            statements: ByStatementId::default(),
            last_prepared: None,
            cache: Vec::new(),
            cache_next: 0,
            cache_bytes: 0,
            scratch: Vec::new(),
            prod: None,
            test: None,
            prod_last_end: None,
            test_last_end: None,
            early: VecDeque::new(),
            outbox: VecDeque::new(),
            trim_at: None,
            prepared,
        }
    }

    /// The oldest finished command, for the engine to collect. Once there is none left and no
    /// command is in flight, the queues' room is given back [`IDLE_TRIM`] after `now` unless
    /// the session is busy again by then (see [`Observer::trim_deadline`]).
    pub(super) fn poll(&mut self, now: Instant) -> Option<Observation> {
        // Returned straight from the queue: an observation is 208 bytes, and holding it in a
        // local across the check below cost a copy each (the engine benchmark's memcpy).
        if !self.outbox.is_empty() {
            return self.outbox.pop_front();
        }
        if self.trim_at.is_none() && self.idle() && self.holds_room() {
            self.trim_at = Some(now + IDLE_TRIM);
        }
        None
    }

    /// When [`Observer::on_timeout`] may give the idle queues' room back.
    pub(super) fn trim_deadline(&self) -> Option<Instant> {
        self.trim_at
    }

    /// At [`Observer::trim_deadline`]: the queues' room goes back to the allocator if they are
    /// still empty; a session busy again keeps it (and arms again when next idle).
    pub(super) fn on_timeout(&mut self, now: Instant) {
        if self.trim_at.is_none_or(|at| now < at) {
            return;
        }
        self.trim_at = None;
        if self.idle() {
            self.pending = VecDeque::new();
            self.early = VecDeque::new();
            self.outbox = VecDeque::new();
            self.scratch = Vec::new();
        }
    }

    /// No command in flight, nothing to collect.
    fn idle(&self) -> bool {
        self.pending.is_empty() && self.early.is_empty() && self.outbox.is_empty()
    }

    fn holds_room(&self) -> bool {
        self.pending.capacity() + self.early.capacity() + self.outbox.capacity() > 0
            || self.scratch.capacity() > 0
    }

    pub(super) fn compare_results(&self) -> bool {
        self.hooks.compare_results
    }

    fn get(&mut self, serial: u64) -> Option<&mut Pending> {
        let i = serial.checked_sub(self.base)?;
        self.pending.get_mut(usize::try_from(i).ok()?)
    }

    // ------------------------------------------------------------------ the client's commands

    /// A client command awaiting a reply arrived: `payload` is its first bytes (command byte
    /// first, empty for an empty packet), `end` the stream offset just past it.
    pub(super) fn arrived(&mut self, serial: u64, payload: &[u8], end: u64) {
        if serial != self.base + self.pending.len() as u64 {
            // Never happens while the transform numbers commands in order; if it did, what is
            // pending could no longer be matched.
            self.flush();
            self.base = serial;
        }
        if self.pending.len() >= MAX_PENDING {
            // The test server is this far behind (a slower one, --multiply): the oldest leaves
            // the bookkeeping before its answer, which will come, unread. Not lost: the
            // session goes on and the test server runs it.
            self.emit_front_as(TestOutcome::Unseen);
        }
        let (statement, registers) = self.statement_of(payload);
        let unresolved = match payload.first() {
            Some(&c) if statement.fingerprint.as_ref() == UNKNOWN_STATEMENT => {
                statement_id(payload).map(|id| (id, command_name(c)))
            }
            _ => None,
        };
        first_room(&mut self.pending);
        self.pending.push_back(Pending {
            statement,
            arrived: None,
            registers,
            unresolved,
            prod: ProdSide::Waiting,
            test: TestSide::Undecided,
        });
        self.arriving = Some((serial, end));
        while let Some(&(s, d, at)) = self.early.front() {
            if s > serial {
                break;
            }
            self.early.pop_front();
            self.decided(s, d, at);
        }
    }

    /// The client's stream has reached `position` at `now`.
    pub(super) fn arrival_progress(&mut self, position: u64, now: Instant) {
        if let Some((serial, end)) = self.arriving {
            if position >= end {
                self.arriving = None;
                if let Some(p) = self.get(serial) {
                    p.arrived = Some(now);
                }
            }
        }
    }

    /// A client command without a reply (COM_STMT_CLOSE, SEND_LONG_DATA, QUIT).
    pub(super) fn no_reply_command(&mut self, payload: &[u8]) {
        if payload.first() == Some(&com::STMT_CLOSE) {
            if let Some(id) = statement_id(payload) {
                self.statements.remove(&id);
            }
        }
    }

    /// Statements prepared on production before we saw the connection (`--prod-dsn`).
    pub(super) fn recovered(&mut self, prod_id: u32, sql: &[u8]) {
        let s = self.build("stmt_execute", sql);
        // Commands that arrived before the state did (they wait for it) are named now.
        for i in 0..self.pending.len() {
            if let Some((id, command)) = self.pending[i].unresolved {
                if id == prod_id {
                    let named = self.derived(command, &s);
                    self.pending[i].statement = named;
                    self.pending[i].unresolved = None;
                }
            }
        }
        self.register(prod_id, s);
    }

    fn register(&mut self, id: u32, s: Arc<Statement>) {
        if self.statements.len() < self.max_statements || self.statements.contains_key(&id) {
            self.statements.insert(id, s);
        }
    }

    /// The shape of a command, and for a prepare the shape of its executes.
    fn statement_of(&mut self, payload: &[u8]) -> (Arc<Statement>, Option<Arc<Statement>>) {
        let Some((&code, rest)) = payload.split_first() else {
            return (self.named("empty_packet"), None);
        };
        match code {
            com::QUERY => (self.cached("query", rest), None),
            com::STMT_PREPARE => {
                // Lexing the SQL is most of what a prepare costs the copier, and a connection's
                // prepares come once each, never from the cache of a connection that has just
                // opened (issue 20): the factory's shapes first, else one fingerprint for both.
                let (exec, prepare) = match self.prepared.get(rest) {
                    Some(shapes) => shapes,
                    None => {
                        let mut fp = std::mem::take(&mut self.scratch);
                        fp.clear();
                        let traits = digest::fingerprint_into(rest, &mut fp);
                        let exec = self.shape("stmt_execute", rest, &fp, traits, None);
                        let prepare = self.shape("stmt_prepare", rest, &fp, traits, Some(&exec));
                        self.scratch = fp;
                        self.prepared.put(rest, &exec, &prepare);
                        (exec, prepare)
                    }
                };
                self.last_prepared = Some(Arc::clone(&exec));
                (prepare, Some(exec))
            }
            com::STMT_EXECUTE | com::STMT_BULK_EXECUTE | com::STMT_FETCH | com::STMT_RESET => {
                let known = statement_id(payload).and_then(|id| {
                    if id == LAST_PREPARED {
                        self.last_prepared.clone()
                    } else {
                        self.statements.get(&id).cloned()
                    }
                });
                let command = match code {
                    com::STMT_EXECUTE => "stmt_execute",
                    com::STMT_BULK_EXECUTE => "stmt_bulk_execute",
                    com::STMT_FETCH => "stmt_fetch",
                    _ => "stmt_reset",
                };
                let s = match known {
                    Some(s) if s.command == command => s,
                    Some(s) => self.derived(command, &s),
                    // Prepared before the capture started and not recovered.
                    None => self.named_as(command, UNKNOWN_STATEMENT),
                };
                (s, None)
            }
            com::INIT_DB => {
                let mut sql = b"use ".to_vec();
                sql.extend_from_slice(rest);
                (self.cached("init_db", &sql), None)
            }
            com::CHANGE_USER | com::RESET_CONNECTION => {
                // Both drop every prepared statement on the server.
                self.statements.clear();
                self.last_prepared = None;
                (self.named(command_name(code)), None)
            }
            c => (self.named(command_name(c)), None),
        }
    }

    /// A command without SQL: its name is its fingerprint.
    fn named(&mut self, command: &'static str) -> Arc<Statement> {
        self.named_as(command, command)
    }

    fn named_as(&mut self, command: &'static str, fingerprint: &str) -> Arc<Statement> {
        let id = digest::digest_id(command, fingerprint.as_bytes());
        if let Some(s) = self.cache.iter().find(|s| s.id == id) {
            return Arc::clone(s);
        }
        let s = Arc::new(Statement {
            id,
            command,
            fingerprint: fingerprint.into(),
            example: fingerprint.into(),
            traits: Traits::default(),
        });
        self.remember(&s);
        s
    }

    /// `s` as another command type (a fetch of an executed statement).
    fn derived(&mut self, command: &'static str, s: &Statement) -> Arc<Statement> {
        let id = digest::digest_id(command, s.fingerprint.as_bytes());
        if let Some(c) = self.cache.iter().find(|c| c.id == id) {
            return Arc::clone(c);
        }
        let d = Arc::new(Statement {
            id,
            command,
            fingerprint: s.fingerprint.clone(),
            example: s.example.clone(),
            traits: s.traits,
        });
        self.remember(&d);
        d
    }

    /// The shape of SQL `sql` run as `command`, from the cache when seen before.
    fn cached(&mut self, command: &'static str, sql: &[u8]) -> Arc<Statement> {
        let mut fp = std::mem::take(&mut self.scratch);
        fp.clear();
        let traits = digest::fingerprint_into(sql, &mut fp);
        let s = self.shape(command, sql, &fp, traits, None);
        self.scratch = fp;
        s
    }

    /// The shape of `sql` run as `command`, whose fingerprint is `fp` (and `traits`): from the
    /// cache, or made from them (the example masked from `sql`, or taken from `like`, a shape
    /// of the same SQL) and remembered. Never fingerprints `sql` again.
    fn shape(
        &mut self,
        command: &'static str,
        sql: &[u8],
        fp: &[u8],
        traits: Traits,
        like: Option<&Statement>,
    ) -> Arc<Statement> {
        let id = digest::digest_id(command, fp);
        if let Some(s) = self.cache.iter().find(|s| s.id == id) {
            return Arc::clone(s);
        }
        let (fingerprint, example) = match like {
            Some(l) => (l.fingerprint.clone(), l.example.clone()),
            None => (String::from_utf8_lossy(fp).into(), self.example(sql)),
        };
        let s = Arc::new(Statement {
            id,
            command,
            fingerprint,
            example,
            traits,
        });
        self.remember(&s);
        s
    }

    /// The shape of `sql` run as `command`, made anew (not looked up) and remembered.
    fn build(&mut self, command: &'static str, sql: &[u8]) -> Arc<Statement> {
        let mut fp = std::mem::take(&mut self.scratch);
        fp.clear();
        let traits = digest::fingerprint_into(sql, &mut fp);
        let s = Arc::new(Statement {
            id: digest::digest_id(command, &fp),
            command,
            fingerprint: String::from_utf8_lossy(&fp).into(),
            example: self.example(sql),
            traits,
        });
        self.scratch = fp;
        self.remember(&s);
        s
    }

    /// What a report shows of `sql`: its literals masked, or with `--report-literals` as it
    /// came. Credentials stay masked whatever the user asked: `--report-literals` is for the
    /// values of queries, and reports and logs travel further than the database.
    fn example(&self, sql: &[u8]) -> Box<str> {
        let example = if self.hooks.literals && !digest::holds_secrets(sql) {
            String::from_utf8_lossy(sql).into_owned()
        } else {
            digest::mask_literals(sql)
        };
        truncate(example, MAX_EXAMPLE).into()
    }

    fn remember(&mut self, s: &Arc<Statement>) {
        self.cache_bytes += shape_bytes(s);
        if self.cache.len() < CACHE {
            self.cache.push(Arc::clone(s));
        } else {
            let old = std::mem::replace(&mut self.cache[self.cache_next], Arc::clone(s));
            self.cache_bytes -= shape_bytes(&old);
            self.cache_next = (self.cache_next + 1) % CACHE;
        }
    }

    // ------------------------------------------------------------------ production

    pub(super) fn prod_start(&mut self, serial: u64, now: Instant) {
        if let Some(acc) = self.prod.take() {
            // The previous reply's end was not recognised (structure lost): it ends here.
            self.prod_done(acc, now);
        }
        self.prod = Some(Acc::new(serial));
    }

    pub(super) fn prod_packet(
        &mut self,
        seen: &Seen,
        len: u32,
        head: &[u8],
        hash: Option<u64>,
        cont: bool,
        now: Instant,
    ) {
        let Some(acc) = &mut self.prod else {
            return;
        };
        acc.packet(seen, len, head, hash, cont);
        if seen.end && !cont {
            if let Some(acc) = self.prod.take() {
                self.prod_done(acc, now);
            }
        }
    }

    fn prod_done(&mut self, acc: Acc, now: Instant) {
        let compare = self.hooks.compare_results;
        let last = self.prod_last_end.replace(now);
        let Some(p) = self.get(acc.serial) else {
            return;
        };
        let answer = acc.answer(later(p.arrived, last), now, compare);
        p.prod = ProdSide::Done(answer);
        let register = match (answer.kind, acc.prepared) {
            (AnswerKind::Ok, Some(id)) => p.registers.take().map(|s| (id, s)),
            _ => None,
        };
        if let Some((id, s)) = register {
            self.register(id, s);
        }
        self.emit_ready();
    }

    /// Production's answer to `serial` will not be seen.
    pub(super) fn prod_lost(&mut self, serial: u64) {
        if self.prod.is_some_and(|a| a.serial == serial) {
            self.prod = None;
        }
        if let Some(p) = self.get(serial) {
            if p.prod == ProdSide::Waiting {
                p.prod = ProdSide::Lost;
            }
        }
        self.emit_ready();
    }

    // ------------------------------------------------------------------ the test server

    pub(super) fn decided(&mut self, serial: u64, d: Decision, now: Instant) {
        if serial >= self.base + self.pending.len() as u64 {
            if self.early.len() < MAX_PENDING {
                self.early.push_back((serial, d, now));
            }
            return;
        }
        let Some(p) = self.get(serial) else {
            return;
        };
        p.test = match d {
            Decision::Sent => TestSide::Awaiting(now),
            Decision::SentBlind => TestSide::Done(TestOutcome::Unseen),
            Decision::Skipped => TestSide::Done(TestOutcome::Skipped),
            Decision::Dropped => TestSide::Done(TestOutcome::Dropped),
            Decision::Refused(code) => TestSide::Done(TestOutcome::Refused(code)),
        };
        self.emit_ready();
    }

    pub(super) fn test_start(&mut self, serial: u64, now: Instant) {
        if let Some(acc) = self.test.take() {
            self.test_done(acc, now);
        }
        self.test = Some(Acc::new(serial));
    }

    pub(super) fn test_packet(
        &mut self,
        seen: &Seen,
        len: u32,
        head: &[u8],
        hash: Option<u64>,
        cont: bool,
        now: Instant,
    ) {
        let Some(acc) = &mut self.test else {
            return;
        };
        acc.packet(seen, len, head, hash, cont);
        if seen.end && !cont {
            if let Some(acc) = self.test.take() {
                self.test_done(acc, now);
            }
        }
    }

    /// Rows of production's reply passed over unread: `rows` rows of `payload` bytes.
    pub(super) fn prod_folded(&mut self, rows: u64, payload: u64) {
        if let Some(acc) = &mut self.prod {
            acc.folded(Some(rows), payload);
        }
    }

    /// Packets intercept folded into a run: `rows` rows (and some definitions) of
    /// `payload` bytes in all; `None`: the structure had no place for them.
    pub(super) fn test_folded(&mut self, rows: Option<u64>, payload: u64) {
        if let Some(acc) = &mut self.test {
            acc.folded(rows, payload);
        }
    }

    fn test_done(&mut self, acc: Acc, now: Instant) {
        let compare = self.hooks.compare_results;
        let last = self.test_last_end.replace(now);
        let Some(p) = self.get(acc.serial) else {
            return;
        };
        if let TestSide::Awaiting(sent) = p.test {
            let from = later(Some(sent), last);
            let answer = acc.answer_after(Some(sent), from, now, compare);
            p.test = TestSide::Done(TestOutcome::Answered(answer));
        }
        self.emit_ready();
    }

    /// No more of the test server's replies will be seen.
    pub(super) fn test_lost_all(&mut self) {
        self.test = None;
        for p in &mut self.pending {
            if matches!(p.test, TestSide::Awaiting(_)) {
                p.test = TestSide::Done(TestOutcome::Unseen);
            }
        }
        self.emit_ready();
    }

    /// The commands from `serial` on that the test server has not answered go to the session
    /// that re-establishes this one (`engine/session/replay.rs`): resent, not lost.
    pub(super) fn resent_from(&mut self, serial: u64) {
        let skip = usize::try_from(serial.saturating_sub(self.base)).unwrap_or(usize::MAX);
        for p in self.pending.iter_mut().skip(skip) {
            if matches!(p.test, TestSide::Undecided | TestSide::Awaiting(_)) {
                p.test = TestSide::Done(TestOutcome::Resent);
            }
        }
        self.emit_ready();
    }

    // ------------------------------------------------------------------ leaving

    fn emit_ready(&mut self) {
        while let Some(p) = self.pending.front() {
            if p.prod == ProdSide::Waiting || !matches!(p.test, TestSide::Done(_)) {
                return;
            }
            self.emit_front();
        }
    }

    fn emit_front(&mut self) {
        self.emit_front_as(TestOutcome::Lost);
    }

    /// Emits the oldest command; `unfinished` is its test outcome if none is known yet.
    fn emit_front_as(&mut self, unfinished: TestOutcome) {
        let Some(p) = self.pending.pop_front() else {
            return;
        };
        self.base += 1;
        let prod = match p.prod {
            ProdSide::Done(a) => Some(a),
            ProdSide::Waiting | ProdSide::Lost => None,
        };
        let test = match p.test {
            TestSide::Done(t) => t,
            TestSide::Undecided | TestSide::Awaiting(_) => unfinished,
        };
        first_room(&mut self.outbox);
        self.outbox.push_back(Observation {
            statement: p.statement,
            copy: self.replica.copy,
            target: self.replica.target,
            prod,
            test,
        });
    }

    /// Everything pending leaves as it is (the session ended or was given up).
    pub(super) fn flush(&mut self) {
        self.prod = None;
        self.test = None;
        self.arriving = None;
        self.early.clear();
        while !self.pending.is_empty() {
            self.emit_front();
        }
    }
}

/// The later of a command's own start and the previous reply's end (when both are known).
fn later(start: Option<Instant>, last_end: Option<Instant>) -> Option<Instant> {
    match (start, last_end) {
        (Some(s), Some(l)) => Some(s.max(l)),
        (s, _) => s,
    }
}

fn command_name(code: u8) -> &'static str {
    match code {
        0x00 => "sleep",
        com::QUIT => "quit",
        com::INIT_DB => "init_db",
        com::QUERY => "query",
        com::FIELD_LIST => "field_list",
        0x05 => "create_db",
        0x06 => "drop_db",
        0x07 => "refresh",
        0x08 => "shutdown",
        com::STATISTICS => "statistics",
        0x0a => "process_info",
        0x0b => "connect",
        com::PROCESS_KILL => "process_kill",
        0x0d => "debug",
        com::PING => "ping",
        com::CHANGE_USER => "change_user",
        com::STMT_PREPARE => "stmt_prepare",
        com::STMT_EXECUTE => "stmt_execute",
        com::STMT_SEND_LONG_DATA => "stmt_send_long_data",
        com::STMT_CLOSE => "stmt_close",
        com::STMT_RESET => "stmt_reset",
        com::SET_OPTION => "set_option",
        com::STMT_FETCH => "stmt_fetch",
        com::RESET_CONNECTION => "reset_connection",
        com::STMT_BULK_EXECUTE => "stmt_bulk_execute",
        _ => "other",
    }
}

/// What a cached shape takes on the heap, counted whole for each observer that caches it
/// (a shape is shared with the observations that name it, and often with no other session).
fn shape_bytes(s: &Statement) -> usize {
    // The Arc's two counts, the shape, its two strings.
    2 * std::mem::size_of::<usize>()
        + std::mem::size_of::<Statement>()
        + s.fingerprint.len()
        + s.example.len()
}

/// Room for one in an empty queue that has none: a queue grows to four at its first push,
/// and most sessions (a client that waits for each answer) never hold more than one.
fn first_room<T>(q: &mut VecDeque<T>) {
    if q.capacity() == 0 {
        q.reserve_exact(1);
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}
