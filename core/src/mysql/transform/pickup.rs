//! Pickup and recovery: a connection first seen mid-stream (its login never captured) gets a
//! synthetic login, and with `--prod-dsn` the state production reports for it (user, schema,
//! prepared statements, variables); its commands wait at two gates before they go: the
//! recovered variables' place, and a transaction boundary (`txn_gate.rs`, also after a capture
//! gap).
//!
//! # What this room is for
//!
//! Giving the test server the session a client would have had there, as closely as
//! production's answers can tell: the variables go in where production read them (between the
//! commands it answered before and after), each recovered statement is prepared at its first
//! use (in the schema the client is in then), and writes inside a transaction the test server
//! never saw begin are not sent.
//!
//! # What it must never do
//!
//! * Hold a command forever: every wait has a deadline ([`VARIABLES_WAIT`], `recovery_wait`,
//!   the gates' `GATE_WAIT`), after which the command goes (or is dropped, counted).
//! * Send a command that ran before production's read of the state and depends on what it
//!   could not read (a user variable, a schema a later command changed): once sent after the
//!   recovered values it would apply twice. Those are dropped and counted.
//! * Keep strings for a session whose login was seen: it has nothing to recover.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use common::clock::Instant;
use common::mysql::classify;
use common::mysql::command::{self, com};
use common::mysql::packet::{PacketHeader, HEADER_LEN};
use common::mysql::stmt::SQL_KEPT;

use super::super::txn_gate::{Cause, Gate};
use super::super::{Counter, MysqlConfig, RecoveredState};
use super::inject::{init_db, Injection, Register};
use super::prod::ProdPhase;
use super::read_only::recovered_write;
use super::statements::Fate;
use super::test_side::TestExpect;
use super::{earlier, expects_reply, Abandon, MysqlTransform, Verdict};
use crate::engine::TransformOutput;

/// Production's answers remembered per picked-up connection to place its variables.
const ANSWERS_KEPT: usize = 1024;
/// A held command whose production answer is not seen within this goes after the variables.
const VARIABLES_WAIT: Duration = Duration::from_millis(100);

/// The first bytes of a picked-up session's commands looked at as they arrive: enough for a
/// `USE` and for most `SET @...` of a user variable.
pub(super) const VARIABLE_PREFIX: usize = 64;

/// A query that may write a user variable, judged by its first bytes: a `SET` naming one, or
/// an assignment (`:=`, `INTO @`).
fn writes_user_variable(prefix: &[u8]) -> bool {
    let [com::QUERY, sql @ ..] = prefix else {
        return false;
    };
    let sql = sql.trim_ascii_start();
    let has = |needle: &[u8]| {
        sql.windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
    };
    sql.contains(&b'@')
        && (sql.get(..3).is_some_and(|w| w.eq_ignore_ascii_case(b"SET"))
            || has(b":=")
            || has(b"INTO @"))
}

/// Whether a query's text may name a table (so depends on the current schema): all but
/// transaction control and a `SET` without a subquery, by their first bytes.
fn names_tables(sql: &[u8]) -> bool {
    let sql = sql.trim_ascii_start();
    let starts = |w: &[u8]| {
        sql.get(..w.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(w))
    };
    let has_select = sql.windows(6).any(|w| w.eq_ignore_ascii_case(b"SELECT"));
    let control = [
        &b"COMMIT"[..],
        b"ROLLBACK",
        b"BEGIN",
        b"START TRANSACTION",
        b"SAVEPOINT",
        b"RELEASE",
        b"USE",
    ];
    !(control.iter().any(|w| starts(w)) || (starts(b"SET") && !has_select))
}

/// COM_INIT_DB, or a query that starts with `USE` (the first bytes of a command).
fn is_schema_change(prefix: &[u8]) -> bool {
    match prefix {
        [com::INIT_DB, ..] => true,
        [com::QUERY, u, s, e, sep, ..] => {
            [*u, *s, *e].eq_ignore_ascii_case(b"USE") && (sep.is_ascii_whitespace() || *sep == b'`')
        }
        _ => false,
    }
}

/// Recovered variables and the round trip of the read that gave them (capture clock).
struct Snapshot {
    /// When the query that read them was sent, and when its answer came.
    read: (Instant, Instant),
    sets: Vec<Injection>,
}

impl Snapshot {
    /// When production read them, give or take half the round trip.
    fn at(&self) -> Instant {
        let (a, b) = self.read;
        a + (b - a) / 2
    }
}

/// Where a held command goes relative to the recovered variables.
enum Side {
    Before,
    After,
    Unknown,
}

/// When production answered one of the client's commands (capture clock).
struct Answered {
    serial: u64,
    at: Instant,
}

/// Who a picked-up connection logs in as, what its login said (recovery compares it), how
/// long it waits for recovered state, and what recovery gave it.
pub(super) struct PickupState {
    /// Production's state for the connection came (once at most).
    recovered: bool,
    deferred: Option<Box<Deferred>>,
    /// The user and schema to log in with: the defaults, or what recovery learnt.
    user: Option<String>,
    db: Option<String>,
    /// What our synthetic login used.
    login_user: Option<String>,
    login_db: Option<Vec<u8>>,
    /// Until when the login waits for recovered state (`recovery_wait`).
    recovery_deadline: Option<Instant>,
    /// When production answered the client's commands, from the pickup until the recovered
    /// variables are placed.
    answered: VecDeque<Answered>,
    /// Recovered variables' `SET`s, due before the first held command production answered
    /// after it read them.
    variables: Option<Snapshot>,
    /// The same from production's second read, used instead when a command writing a
    /// variable was answered within the first read's round trip.
    variables_again: Option<Snapshot>,
    /// How long a held command waits for production's answer to tell which side it is on.
    variables_deadline: Option<Instant>,
    /// That wait is over: what is still not known goes after the variables. (The deadline
    /// is cleared then, so that a session idle until its next command sets no past timer.)
    variables_expired: bool,
    /// Serials of the schema changes (COM_INIT_DB, `USE`) that arrived meanwhile: a query
    /// production ran before one of them and before its lookup ran in a schema nobody
    /// read.
    schema_changes: Vec<u64>,
    /// Serials of the queries that may write a user variable ([`writes_user_variable`]).
    variable_writes: Vec<u64>,
}

impl PickupState {
    /// The client command `serial` arrived, starting with `prefix`.
    pub(super) fn note_arrival(&mut self, serial: u64, prefix: &[u8]) {
        if is_schema_change(prefix) && self.schema_changes.len() < ANSWERS_KEPT {
            self.schema_changes.push(serial);
        }
        if writes_user_variable(prefix) && self.variable_writes.len() < ANSWERS_KEPT {
            self.variable_writes.push(serial);
        }
    }
}

/// Recovered statements not prepared on the test server yet (production's id, its whole
/// SQL): each is, right before the first client command that names it.
#[derive(Default)]
struct Deferred {
    sql: HashMap<u32, Box<[u8]>>,
    bytes: usize,
}

impl Deferred {
    fn insert(&mut self, prod_id: u32, sql: Vec<u8>) {
        self.bytes += sql.len();
        if let Some(old) = self.sql.insert(prod_id, sql.into_boxed_slice()) {
            self.bytes -= old.len();
        }
    }

    fn remove(&mut self, prod_id: u32) -> Option<Box<[u8]>> {
        let sql = self.sql.remove(&prod_id)?;
        self.bytes -= sql.len();
        Some(sql)
    }

    fn memory_len(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>() + self.sql.capacity() * (size_of::<(u32, Box<[u8]>)>() + 1) + self.bytes
    }
}

/// A picked-up connection's login and recovered state.
pub(super) struct Pickup {
    /// `None` for every session whose login we saw: it is only read by recovery, and such a
    /// session has nothing to recover, so it keeps no strings (and carries one pointer in
    /// line, `a_session_in_line_stays_small`).
    state: Option<Box<PickupState>>,
}

impl Pickup {
    pub(super) fn new(picked_up: bool, config: &MysqlConfig) -> Self {
        let state = picked_up.then(|| {
            Box::new(PickupState {
                recovered: false,
                deferred: None,
                user: config.default_user.clone(),
                db: config.default_db.clone(),
                login_user: None,
                login_db: None,
                recovery_deadline: None,
                answered: VecDeque::new(),
                variables: None,
                variables_again: None,
                variables_deadline: None,
                variables_expired: false,
                schema_changes: Vec::new(),
                variable_writes: Vec::new(),
            })
        });
        Self { state }
    }

    /// Whether production's state for the connection came.
    fn recovered(&self) -> bool {
        self.state.as_ref().is_some_and(|p| p.recovered)
    }

    /// What the arrival reader notes of each command: only while production's answers may
    /// still place the recovered variables.
    /// Whether the session was picked up mid-stream.
    pub(super) fn active(&self) -> bool {
        self.state.is_some()
    }

    pub(super) fn arrival_notes(&mut self) -> Option<&mut PickupState> {
        self.state
            .as_deref_mut()
            .filter(|p| !p.recovered || p.variables.is_some())
    }

    /// Production answered the client command `serial` at `at`: true when a command held for
    /// the variables' place may now go.
    pub(super) fn answered(&mut self, serial: u64, at: Instant) -> bool {
        let Some(pk) = self.state.as_deref_mut() else {
            return false;
        };
        if pk.recovered && pk.variables.is_none() {
            return false;
        }
        if pk.answered.len() >= ANSWERS_KEPT {
            pk.answered.pop_front();
        }
        pk.answered.push_back(Answered { serial, at });
        pk.variables.is_some()
    }

    /// The user our synthetic login uses.
    pub(super) fn user(&self) -> Option<String> {
        self.state.as_ref().and_then(|p| p.user.clone())
    }

    /// The schema our synthetic login selects.
    pub(super) fn db(&self) -> Option<String> {
        self.state.as_ref().and_then(|p| p.db.clone())
    }

    /// Our synthetic login went out as `user`, with `db` in it.
    pub(super) fn logged_in_as(&mut self, user: String, db: Option<Vec<u8>>) {
        if let Some(p) = &mut self.state {
            p.login_db = db;
            p.login_user = Some(user);
        }
    }

    pub(super) fn recovery_deadline(&self) -> Option<Instant> {
        self.state.as_ref().and_then(|p| p.recovery_deadline)
    }

    /// The login waits for recovered state until `at`.
    pub(super) fn wait_for_recovery(&mut self, at: Instant) {
        if let Some(p) = &mut self.state {
            p.recovery_deadline = Some(at);
        }
    }

    fn stop_waiting_for_recovery(&mut self) {
        if let Some(p) = &mut self.state {
            p.recovery_deadline = None;
        }
    }

    /// Whether a picked-up connection has no one to log in as.
    pub(super) fn no_user(&self) -> bool {
        self.state.as_ref().is_none_or(|p| p.user.is_none())
    }

    /// The earliest of this room's deadlines.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.state
            .as_deref()
            .and_then(|p| earlier(p.recovery_deadline, p.variables_deadline))
    }

    /// The wait for production's answers to place the variables is over at `now`: what is
    /// still not known goes after them.
    pub(super) fn variables_wait_over(&mut self, now: Instant) -> bool {
        let Some(p) = self
            .state
            .as_deref_mut()
            .filter(|p| p.variables_deadline.is_some_and(|d| now >= d))
        else {
            return false;
        };
        p.variables_deadline = None;
        p.variables_expired = true;
        true
    }

    /// Whether the held commands still wait for the recovered variables' place.
    pub(super) fn variables_pending(&self) -> bool {
        self.state.as_deref().is_some_and(|p| p.variables.is_some())
    }

    /// Whether `prod_id` is a recovered statement not prepared yet.
    pub(super) fn holds_deferred(&self, prod_id: u32) -> bool {
        self.state
            .as_ref()
            .and_then(|p| p.deferred.as_ref())
            .is_some_and(|d| d.sql.contains_key(&prod_id))
    }

    /// The recovered statement `prod_id`'s SQL, no longer deferred.
    pub(super) fn take_deferred(&mut self, prod_id: u32) -> Option<Box<[u8]>> {
        self.state
            .as_mut()
            .and_then(|p| p.deferred.as_mut())
            .and_then(|d| d.remove(prod_id))
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop production's statements: the recovered
    /// ones not prepared yet are gone with them.
    pub(super) fn forget_deferred(&mut self) {
        if let Some(p) = &mut self.state {
            p.deferred = None;
        }
    }

    pub(super) fn memory_len(&self) -> usize {
        self.state
            .as_ref()
            .and_then(|p| p.deferred.as_ref())
            .map_or(0, |d| d.memory_len())
    }
}

impl MysqlTransform {
    /// State of a picked-up connection recovered from production (`--prod-dsn`). Before our
    /// login it decides who we log in as; after it, the schema is selected with COM_INIT_DB.
    /// Either way each statement is prepared again on the test server before the client's next
    /// command, and executes of it are translated once the test server answered.
    pub fn recover(&mut self, now: Instant, state: RecoveredState, out: &mut TransformOutput<'_>) {
        if self.dead() || !self.picked_up() || self.pickup.recovered() {
            return;
        }
        self.now = now;
        if let Some(p) = &mut self.pickup.state {
            p.recovered = true;
        }
        out.count(Counter::RecoveredSessions as usize);
        let RecoveredState {
            user,
            db,
            statements,
            variables,
            variables_dropped,
            variables_at,
            variables_again,
        } = state;
        let Some(pickup) = self.pickup.state.as_deref_mut() else {
            return;
        };
        if self.login.sent() {
            if pickup.login_user.as_deref() != Some(user.as_str()) {
                // Not worth a COM_CHANGE_USER: statements the other user cannot run are
                // rejected by the test server and counted.
                out.count(Counter::RecoveryUserMismatch as usize);
            }
            if let Some(db) = db.filter(|d| pickup.login_db.as_deref() != Some(d.as_bytes())) {
                if self.queue_injection(init_db(db.as_bytes()), out) {
                    out.count(Counter::InjectedInitDb as usize);
                }
            }
        } else {
            pickup.user = Some(user);
            pickup.db = db;
            pickup.recovery_deadline = None;
        }
        out.add(
            Counter::RecoveryVariablesDropped as usize,
            u64::from(variables_dropped),
        );
        // Before the re-prepares (at first use): sql_mode (ANSI_QUOTES) and the character set
        // change how the test server parses them.
        let injections = |variables: Vec<Vec<u8>>| -> Vec<Injection> {
            variables
                .into_iter()
                .map(|set| {
                    let mut payload = Vec::with_capacity(1 + set.len());
                    payload.push(com::QUERY);
                    payload.extend_from_slice(&set);
                    Injection::packet(&payload, Some(TestExpect::SetVariable), None)
                })
                .collect()
        };
        let sets = injections(variables);
        match (variables_at, self.pickup.state.as_deref_mut()) {
            // Also without variables: the schema production reported has the same boundary.
            (Some(read), Some(p)) => {
                p.variables = Some(Snapshot { read, sets });
                p.variables_again = variables_again.and_then(|(v, read)| {
                    read.map(|read| Snapshot {
                        read,
                        sets: injections(v),
                    })
                });
            }
            _ => self.queue_variables(sets, out),
        }
        if !self.test.blind() {
            let max = self.shared.config.max_statements;
            for (prod_id, sql) in statements.into_iter().take(max) {
                if let Some(o) = &mut self.observer {
                    o.recovered(prod_id, &sql);
                }
                if recovered_write(&self.shared.config, &sql).is_some() {
                    // Its executes are not sent either, and counted as such.
                    self.read_only.skip_statement(prod_id, max, out);
                    continue;
                }
                // Prepared at its first use, not now: production does not say which schema a
                // statement was prepared in, and the test server resolves its tables in the
                // schema current at the prepare. A statement is used where it was prepared far
                // more often than not (a pool's `setCatalog` and its cache of statements).
                if let Some(p) = &mut self.pickup.state {
                    p.deferred
                        .get_or_insert_with(Box::default)
                        .insert(prod_id, sql);
                }
                out.count(Counter::RecoveredStatements as usize);
            }
        }
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// Production had nothing for this connection (gone already, lookup failed or refused):
    /// log in with the defaults now instead of holding its commands until `recovery_wait`.
    pub(super) fn recovery_unavailable(&mut self, out: &mut TransformOutput<'_>) {
        if self.dead()
            || !self.picked_up()
            || self.pickup.recovered()
            || self.pickup.recovery_deadline().is_none()
        {
            return;
        }
        self.pickup.stop_waiting_for_recovery();
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// `recovery_wait` ran out at `now`: log in with what is known.
    pub(super) fn recovery_timed_out(&mut self, now: Instant, out: &mut TransformOutput<'_>) {
        match self.pickup.recovery_deadline() {
            Some(d) if now >= d => {}
            _ => return,
        }
        self.pickup.stop_waiting_for_recovery();
        out.count(Counter::RecoveryTimeouts as usize);
        if let Err(a) = self.try_login(out) {
            self.give_up(a, out);
        }
        self.resume(out);
    }

    /// Sends the test server a recovered statement's PREPARE now, between two client commands
    /// (the one naming it waits for the answer, as after a client's own prepare).
    pub(super) fn prepare_recovered(
        &mut self,
        prod_id: u32,
        sql: &[u8],
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let mut payload = Vec::with_capacity(1 + sql.len());
        payload.push(com::STMT_PREPARE);
        payload.extend_from_slice(sql);
        let register = Register::new(prod_id, sql[..sql.len().min(SQL_KEPT)].to_vec());
        let queued = self.queue_injection(
            Injection::packet(
                &payload,
                Some(TestExpect::Prepare { recovered: true }),
                Some(register),
            ),
            out,
        );
        if queued {
            out.count(Counter::RecoveredPreparedAtFirstUse as usize);
        }
        self.flush_injections(out)
    }

    fn queue_variables(&mut self, sets: Vec<Injection>, out: &mut TransformOutput<'_>) {
        for inj in sets {
            if self.queue_injection(inj, out) {
                out.count(Counter::RecoveredVariables as usize);
            }
        }
    }

    /// Which side of the recovered variables' snapshot the held command `serial` is on: before
    /// it when production answered it (by the capture's clock) before it read them.
    fn variables_side(&self, serial: u64) -> Side {
        let Some(p) = self.pickup.state.as_deref() else {
            return Side::After;
        };
        let Some(snap) = &p.variables else {
            return Side::After;
        };
        let at = snap.at();
        match p.answered.iter().find(|a| a.serial == serial) {
            Some(a) if a.at <= at => Side::Before,
            Some(_) => Side::After,
            // Its answer went by unframed, or will never come.
            None if p.answered.back().is_some_and(|a| a.serial > serial) => Side::After,
            None if p.variables_expired || p.variables_deadline.is_some_and(|d| self.now >= d) => {
                Side::After
            }
            None if self.prod.unframed() => Side::After,
            None => Side::Unknown,
        }
    }

    /// The recovered variables go out now, ahead of the command being decided.
    fn place_variables(&mut self, out: &mut TransformOutput<'_>) {
        let Some(p) = self.pickup.state.as_deref_mut() else {
            return;
        };
        let sets = p.variables.take().map(|s| s.sets).unwrap_or_default();
        p.variables_again = None;
        p.answered = VecDeque::new();
        p.schema_changes = Vec::new();
        p.variable_writes = Vec::new();
        p.variables_deadline = None;
        p.variables_expired = false;
        self.queue_variables(sets, out);
    }

    /// Whether the query or execute being decided may read or write a user variable: its SQL
    /// holds an `@`, or is not all known.
    fn names_user_variable(&self, code: u8) -> bool {
        let head = self.fwd.head();
        let payload = &head[HEADER_LEN..];
        let sql = match code {
            com::QUERY => {
                let whole =
                    PacketHeader::parse(head).is_some_and(|h| h.len as usize == payload.len());
                if !whole {
                    return true;
                }
                payload.get(1..)
            }
            _ => {
                let Some(id) = command::statement_id(payload) else {
                    return true;
                };
                let deferred = self.pickup.state.as_ref().and_then(|p| p.deferred.as_ref());
                if let Some(sql) = deferred.and_then(|d| d.sql.get(&id)) {
                    Some(&sql[..])
                } else {
                    // The map keeps the first SQL_KEPT bytes: a text that long may go on.
                    self.stmts
                        .known()
                        .and_then(|m| m.sql(id))
                        .filter(|s| s.len() < SQL_KEPT)
                }
            }
        };
        sql.is_none_or(|s| s.contains(&b'@'))
    }

    /// Whether the command `serial` (production ran it before its lookup) depends on a schema
    /// nobody read: a later command that production also ran before the lookup changed the
    /// schema, so the one production reported is not the one this command ran in. Executes of
    /// statements already prepared do not depend on it (the statement keeps its schema).
    fn schema_unknown(&self, code: u8, serial: u64) -> bool {
        let head = self.fwd.head();
        let depends = match code {
            com::QUERY => names_tables(&head[HEADER_LEN + 1..]),
            com::STMT_PREPARE => true,
            _ => command::statement_id(&head[HEADER_LEN..])
                .is_some_and(|id| self.pickup.holds_deferred(id)),
        };
        depends && self.later_before(serial, |p| &p.schema_changes)
    }

    /// Whether one of `list`'s commands after `serial` also ran before production's lookup.
    fn later_before(&self, serial: u64, list: impl Fn(&PickupState) -> &Vec<u64>) -> bool {
        self.pickup.state.as_deref().is_some_and(|p| {
            list(p)
                .iter()
                .any(|&c| c > serial && matches!(self.variables_side(c), Side::Before))
        })
    }

    /// Which read the session starts from: the first, unless a command writing a variable
    /// was answered within its round trip (it may be in that read or not) and there is a
    /// second. False while production's answers up to the read's end are not all in (capture
    /// lag), for at most [`VARIABLES_WAIT`].
    fn settle_snapshot(&mut self, out: &mut TransformOutput<'_>) -> bool {
        let now = self.now;
        let unframed = self.prod.unframed();
        let Some(p) = self.pickup.state.as_deref_mut() else {
            return true;
        };
        loop {
            let Some(snap) = &p.variables else {
                return true;
            };
            let (a, b) = snap.read;
            let settled = unframed
                || p.answered.back().is_some_and(|l| l.at > b)
                || p.variables_expired
                || p.variables_deadline.is_some_and(|d| now >= d);
            if !settled {
                p.variables_deadline.get_or_insert(now + VARIABLES_WAIT);
                return false;
            }
            let ambiguous = p.variable_writes.iter().any(|w| {
                p.answered
                    .iter()
                    .any(|l| l.serial == *w && (a..=b).contains(&l.at))
            });
            if !ambiguous || p.variables_again.is_none() {
                return true;
            }
            p.variables = p.variables_again.take();
            out.count(Counter::RecoveryVariablesReadAgain as usize);
        }
    }

    /// Before the client command `fwd.serial` of a picked-up connection: `Some(Block)` while
    /// it is not known whether production ran it before reading the recovered variables,
    /// `Some(Drop)` for a query or an execute it ran before and that depends on what it could
    /// not read (see [`Counter::CommandsDroppedBeforeStateRead`]).
    pub(super) fn variables_first(&mut self, out: &mut TransformOutput<'_>) -> Option<Verdict> {
        if !self.pickup.variables_pending() {
            return None;
        }
        if !self.settle_snapshot(out) {
            return Some(Verdict::Block);
        }
        let code = self.fwd.code()?;
        if !expects_reply(code) {
            return None;
        }
        let serial = self.fwd.serial();
        match self.variables_side(serial) {
            // A prepare, a schema change, a close: no variable in them, and the statements and
            // schema the client has after them are what recovery gives anyway. (A prepare is
            // never dropped here: the statement map pairs every prepare with both answers.)
            Side::Before if code == com::STMT_PREPARE => {
                if !self.schema_unknown(code, serial) {
                    return None;
                }
                // Its answer is paired like any prepare's; its executes are lost with it.
                self.read_only.prepare_lost();
                self.prepare_passed(Fate::Lost, out);
                out.count(Counter::CommandsDroppedBeforeStateRead as usize);
                Some(Verdict::Drop)
            }
            Side::Before if !matches!(code, com::QUERY | com::STMT_EXECUTE) => None,
            Side::Before => {
                let later_write = self.later_before(serial, |p| &p.variable_writes);
                let own_write = self
                    .pickup
                    .state
                    .as_deref()
                    .is_some_and(|p| p.variable_writes.contains(&serial));
                let drop = if self.schema_unknown(code, serial) || own_write {
                    // It ran in a schema nobody read, or sent after the recovered values it
                    // would apply twice (`SET @n = @n + 1`).
                    true
                } else if self.names_user_variable(code) {
                    // It read the variables as production read them unless a later command
                    // of this stretch wrote them; if so it saw older values, else the SETs go
                    // ahead of it (before any, it would read none on the test server).
                    if !later_write {
                        self.place_variables(out);
                    }
                    later_write
                } else {
                    // It runs the same in any state of the variables.
                    false
                };
                if drop {
                    out.count(Counter::CommandsDroppedBeforeStateRead as usize);
                    return Some(Verdict::Drop);
                }
                None
            }
            Side::After => {
                self.place_variables(out);
                None
            }
            Side::Unknown => {
                if let Some(p) = self.pickup.state.as_deref_mut() {
                    p.variables_deadline
                        .get_or_insert(self.now + VARIABLES_WAIT);
                }
                Some(Verdict::Block)
            }
        }
    }

    /// Whether the command `fwd.serial` (or one after it) may be held at a transaction gate.
    pub(super) fn gated(&self) -> bool {
        self.gates
            .as_ref()
            .is_some_and(|g| g.any_from(self.fwd.serial()))
    }

    /// The stretch holding `serial` has its boundary proven.
    fn open_gate(&mut self, serial: u64) {
        if let Some(g) = &mut self.gates {
            g.open(serial);
            if g.passed(serial) {
                self.gates = None;
            }
        }
    }

    /// Before the client command `fwd.serial` of a picked-up connection, or one after a
    /// capture gap: `Some(Drop)` for a query or an execute inside a transaction that began
    /// before the copier saw the connection (or that the gap cut), `Some(Block)` while
    /// production's replies have not told yet (bounded by `GATE_WAIT`), `None` once a
    /// boundary is proven (that stretch's gate is then gone). See `txn_gate.rs`.
    pub(super) fn transaction_first(&mut self, out: &mut TransformOutput<'_>) -> Option<Verdict> {
        let serial = self.fwd.serial();
        let gates = self.gates.as_deref_mut()?;
        if gates.passed(serial) {
            self.gates = None;
            return None;
        }
        if !gates.gates(serial) {
            return None;
        }
        let head = self.fwd.head();
        let code = head.get(HEADER_LEN).copied()?;
        let body = head.get(HEADER_LEN + 1..).unwrap_or(&[]);
        let sql = match code {
            com::QUERY => body,
            com::STMT_EXECUTE | com::STMT_BULK_EXECUTE => {
                let id = command::statement_id(&head[HEADER_LEN..])?;
                // An unknown statement is dropped further on anyway.
                self.stmts.known()?.sql(id)?
            }
            // Prepares, closes, pings, schema changes: no row is changed by them.
            _ => return None,
        };
        if classify::starts_transaction(sql) {
            // A transaction the test server sees from its start (a BEGIN inside one commits
            // it first): the boundary.
            self.open_gate(serial);
            return None;
        }
        if classify::classify(sql).effect.is_read() {
            // A read, a COMMIT, a SET: inside a tail it runs on the test server outside the
            // transaction, and changes nothing there. Only writes wait for the proof.
            return None;
        }
        if self.prod.phase() == ProdPhase::Failed {
            // Production's replies will not be read: nothing can be proven.
            self.gates = None;
            out.count(Counter::TransactionBoundaryUnproven as usize);
            return None;
        }
        let pending = self.prod.owes_before(serial);
        let now = self.now;
        let gates = self.gates.as_deref_mut()?;
        let earlier_pending = pending || gates.replying.is_some_and(|s| s < serial);
        let (gate, cause) = gates.gate_mut(serial)?;
        let unproven = gate.timed_out(serial, now);
        match gate.decide(serial, earlier_pending, now) {
            Gate::Open => {
                if unproven {
                    out.count(Counter::TransactionBoundaryUnproven as usize);
                }
                self.open_gate(serial);
                None
            }
            Gate::Drop => {
                out.count(match cause {
                    Cause::Pickup => Counter::CommandsDroppedBeforeTransactionBoundary,
                    Cause::CaptureGap => Counter::CommandsDroppedInTransactionCutByGap,
                } as usize);
                Some(Verdict::Drop)
            }
            Gate::Wait => Some(Verdict::Block),
        }
    }
}
