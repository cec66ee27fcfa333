//! Parameter types on the test server.
//!
//! libmariadb (sysbench, the mariadb CLI) and most drivers send a statement's parameter types
//! with its first COM_STMT_EXECUTE only (new-params-bound flag 1), never again (flag 0). A
//! statement the copier prepares again for a picked-up connection (`--prod-dsn`) never had that
//! first execute on the test server, which then refuses every execute of it (1210, "Incorrect
//! arguments to mysqld_stmt_execute"). [`SessionTypes`] remembers, per test-side statement of
//! one session, whether the test server has types for it, and turns a flag-0 execute of one
//! that has none into a flag-1 execute carrying them, from, in this order:
//!
//! 1. **learnt**: what a client sent with a typed execute of the same SQL text on any session
//!    of this copier ([`LearntTypes`], shared by the sessions of one factory): a client's own
//!    types are right by definition;
//! 2. **guessed** from the execute's own bytes (`common::mysql::params::guess`).
//!
//! The bytes of a guessed execute fit its types, but they may still be the wrong ones (a LONG
//! that looks like a 3-character string). A guess is therefore checked against every later
//! execute before it is sent (types that cannot read its bytes were wrong), and against the
//! servers' answers ([`SessionTypes::prod_answered`], [`SessionTypes::test_answered`]): the
//! test server refusing an execute production ran marks the guess wrong, and the next execute
//! of that statement carries the next candidate. Types learnt later replace a guess.
//!
//! Nothing here does I/O or reads a clock; the shared cache is a bounded map behind a lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use common::mysql::params::{self, ExecuteParams};
use common::mysql::stmt::ByStatementId;

/// Statements whose types the copier remembers across sessions; the oldest learnt goes first.
const LEARNT_STATEMENTS: usize = 1024;
/// Parameters of a statement whose types are remembered across sessions (2 bytes each).
const LEARNT_MAX_PARAMS: usize = 1024;
/// Wrong guesses per statement before guessing for it stops (each cost an error on the test
/// server); its executes are then dropped and counted.
const MAX_WRONG_GUESSES: usize = 8;
/// Executes in a row that no guess could read before guessing for the statement stops (a
/// search that runs out of budget costs milliseconds: not for every execute).
const MAX_UNDECODED: u8 = 8;
/// Guessed executes awaiting both servers' answers. The oldest goes when full: its answers
/// were most likely lost.
const MAX_CHECKS: usize = 256;
/// Production's answers kept for commands not decided yet (held while the test server
/// answers a re-prepare): the first guessed execute of a statement is usually one of them.
const EARLY_ANSWERS: usize = 64;

/// Error codes that say nothing about a guess: the data or the session's state differ between
/// the servers (a duplicate key, a lock, a missing table, a grant, a timeout).
const NOT_ABOUT_TYPES: &[u16] = &[
    1044, // ER_DBACCESS_DENIED_ERROR
    1054, // ER_BAD_FIELD_ERROR
    1062, // ER_DUP_ENTRY
    1142, // ER_TABLEACCESS_DENIED_ERROR
    1143, // ER_COLUMNACCESS_DENIED_ERROR
    1146, // ER_NO_SUCH_TABLE
    1205, // ER_LOCK_WAIT_TIMEOUT
    1213, // ER_LOCK_DEADLOCK
    1243, // ER_UNKNOWN_STMT_HANDLER
    1290, // ER_OPTION_PREVENTS_STATEMENT (read-only server)
    1317, // ER_QUERY_INTERRUPTED
    1451, // ER_ROW_IS_REFERENCED_2
    1452, // ER_NO_REFERENCED_ROW_2
    1792, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
    1969, // ER_STATEMENT_TIMEOUT (MariaDB)
    3024, // ER_QUERY_TIMEOUT (MySQL)
];

/// FNV-1a: types are compared by hash where only "the same as before?" matters.
fn fingerprint(types: &[u8]) -> u64 {
    types.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Types clients sent with typed executes, by statement SQL text (the first `SQL_KEPT` bytes,
/// as the statement map keeps it), shared by every session of a factory.
pub(super) struct LearntTypes {
    /// Bumped by every change, so a session sees "nothing new" without taking the lock.
    generation: AtomicU64,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    types: HashMap<Box<[u8]>, Box<[u8]>>,
    /// SQL texts in the order first learnt: the eviction order.
    order: VecDeque<Box<[u8]>>,
}

impl LearntTypes {
    pub(super) fn new() -> Self {
        Self {
            // A session's first look (generation 0) always consults the cache.
            generation: AtomicU64::new(1),
            cache: Mutex::new(Cache::default()),
        }
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The cache holds no invariant a panicking holder could break halfway.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A client sent `types` (2 bytes per parameter) with a typed execute of `sql`.
    pub(super) fn learn(&self, sql: &[u8], types: &[u8]) {
        if sql.is_empty() || types.is_empty() || types.len() > 2 * LEARNT_MAX_PARAMS {
            return;
        }
        let mut c = self.lock();
        match c.types.get_mut(sql) {
            Some(t) if **t == *types => return,
            Some(t) => *t = types.into(),
            None => {
                if c.order.len() >= LEARNT_STATEMENTS {
                    if let Some(old) = c.order.pop_front() {
                        c.types.remove(&old);
                    }
                }
                c.types.insert(sql.into(), types.into());
                c.order.push_back(sql.into());
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// What clients last sent for `sql`, if it has `num_params` parameters.
    pub(super) fn get(&self, sql: &[u8], num_params: u16) -> Option<Box<[u8]>> {
        let c = self.lock();
        c.types
            .get(sql)
            .filter(|t| t.len() == 2 * usize::from(num_params))
            .cloned()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().types.len()
    }
}

/// Whether, and how, the test server was given types for a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Given {
    /// Never: prepared again after a pickup.
    Nothing,
    /// A client's typed execute was sent (its types' fingerprint: only a change is learnt; 0
    /// for a statement the client prepared, whose typed execute it sends or sent its own way).
    Client { fingerprint: u64 },
    /// We sent types learnt from a client of another session.
    Learnt,
    /// We sent [`Guessing::types`].
    Guessed,
}

/// One test-side statement of the session.
#[derive(Debug)]
struct Statement {
    num_params: u16,
    given: Given,
    /// Once guessing is needed: what carries over from one guess to the next.
    guessing: Option<Box<Guessing>>,
}

#[derive(Debug, Default)]
struct Guessing {
    /// The guess the test server has (when `Given::Guessed`).
    types: Box<[u8]>,
    /// Numbers the guesses, so an answer to an execute sent with an older one is ignored.
    attempt: u32,
    /// The test server refused an execute that relied on `types`: the next carries a new guess.
    wrong: bool,
    /// Fingerprints of guesses found wrong, never sent again.
    rejected: Vec<u64>,
    /// Executes in a row no guess could read.
    undecoded: u8,
    /// Guessing stopped for this statement: its executes are dropped unless types are learnt.
    gave_up: bool,
    /// [`LearntTypes::generation`] when the cache was last consulted for this statement.
    generation: u64,
}

impl Guessing {
    fn memory_len(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.types.len()
            + self.rejected.capacity() * std::mem::size_of::<u64>()
    }

    /// The guess in force was wrong: never again.
    fn reject(&mut self) {
        self.rejected.push(fingerprint(&self.types));
        self.wrong = true;
    }
}

/// A guessed execute whose answers are awaited: production's (`Some(true)`: it ran) and the
/// test server's (`Some(Some(code))`: refused).
#[derive(Clone, Copy, Debug)]
struct Check {
    serial: u64,
    test_id: u32,
    attempt: u32,
    prod: Option<bool>,
    test: Option<Option<u16>>,
}

/// One COM_STMT_EXECUTE the transform is about to send.
pub(super) struct Execute<'a> {
    pub(super) test_id: u32,
    /// Its payload as collected (statement id still production's).
    pub(super) payload: &'a [u8],
    /// `payload` is the whole packet (it may be cut at the transform's head limit).
    pub(super) complete: bool,
    /// The statement's SQL text as the statement map keeps it.
    pub(super) sql: Option<&'a [u8]>,
    /// The client command's serial number, which both servers' answers carry.
    pub(super) serial: u64,
    /// The test server's answers will be seen (its framing is not lost).
    pub(super) verify: bool,
}

/// What to do with an execute.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Exec {
    /// Send it as it is.
    AsIs,
    /// Send `payload` instead: the same execute with the new-params-bound flag set and types.
    Typed { payload: Vec<u8>, learnt: bool },
    /// The test server needs types this execute does not let us give: do not send it.
    Undecodable,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Decision {
    pub(super) exec: Exec,
    /// A guess in force was found wrong by this execute's bytes.
    pub(super) corrected: bool,
}

impl Decision {
    fn new(exec: Exec) -> Self {
        Self {
            exec,
            corrected: false,
        }
    }
}

/// The bookkeeping of one session. See the module documentation.
#[derive(Debug)]
pub(super) struct SessionTypes {
    statements: ByStatementId<Statement>,
    checks: VecDeque<Check>,
    /// Production's answers (serial, it ran) to commands the forwarding reader had not decided.
    early: VecDeque<(u64, bool)>,
    limit: usize,
    /// What the statements' guessing state holds, for `memory_len`.
    guessing_bytes: usize,
}

impl SessionTypes {
    /// Tracks at most `limit` statements (the statement map's limit).
    pub(super) fn new(limit: usize) -> Self {
        Self {
            statements: ByStatementId::default(),
            checks: VecDeque::new(),
            early: VecDeque::new(),
            limit,
            guessing_bytes: 0,
        }
    }

    /// The test server answered a prepare with statement `test_id` of `num_params` parameters;
    /// `recovered`: the copier's own prepare of a statement production had before the copier
    /// saw the connection. A client's own prepare is followed by its own typed execute, which
    /// the test server gets as production did (sometimes by MariaDB's "last prepared" id,
    /// unknown here): its flag-0 executes are left alone.
    pub(super) fn prepared(&mut self, test_id: u32, num_params: u16, recovered: bool) {
        self.closed(test_id);
        if num_params == 0 || self.statements.len() >= self.limit {
            // Without an entry its executes pass as they are, as before this bookkeeping.
            return;
        }
        self.statements.insert(
            test_id,
            Statement {
                num_params,
                given: if recovered {
                    Given::Nothing
                } else {
                    Given::Client { fingerprint: 0 }
                },
                guessing: None,
            },
        );
    }

    /// The test server no longer has `test_id` (closed, or never named by the client).
    pub(super) fn closed(&mut self, test_id: u32) {
        if let Some(s) = self.statements.remove(&test_id) {
            self.guessing_bytes -= s.guessing.map_or(0, |g| g.memory_len());
        }
    }

    /// COM_RESET_CONNECTION or COM_CHANGE_USER: the test server dropped every statement.
    pub(super) fn reset(&mut self) {
        self.statements.clear();
        self.guessing_bytes = 0;
    }

    /// Payload bytes of an execute of `test_id` to collect before [`Self::execute`]: the flag,
    /// the types a client sends, or (types to give) the whole packet (`usize::MAX`).
    pub(super) fn wanted(&self, test_id: u32, payload: &[u8]) -> usize {
        let Some(s) = self.statements.get(&test_id) else {
            return 0;
        };
        let flag_at = params::bound_flag_offset(s.num_params);
        match (payload.get(flag_at), s.given) {
            (None, _) => flag_at + 1,
            (Some(&f), _) if f != 0 => params::types_end(s.num_params),
            (Some(_), Given::Client { .. } | Given::Learnt) => flag_at + 1,
            (Some(_), Given::Nothing | Given::Guessed) => usize::MAX,
        }
    }

    /// The verdict on an execute; a typed one's types are learnt for every session.
    pub(super) fn execute(&mut self, ex: &Execute<'_>, learnt: &LearntTypes) -> Decision {
        let Some(st) = self.statements.get_mut(&ex.test_id) else {
            return Decision::new(Exec::AsIs);
        };
        let n = st.num_params;
        let flag_at = params::bound_flag_offset(n);
        let Some(&flag) = ex.payload.get(flag_at) else {
            // Shorter than its own NULL bitmap: both servers refuse it alike.
            return Decision::new(Exec::AsIs);
        };
        if flag != 0 {
            let types = ex.payload.get(flag_at + 1..params::types_end(n));
            let fingerprint = types.map_or(0, fingerprint);
            if let (Some(types), Some(sql)) = (types, ex.sql) {
                if st.given != (Given::Client { fingerprint }) {
                    learnt.learn(sql, types);
                }
            }
            st.given = Given::Client { fingerprint };
            return Decision::new(Exec::AsIs);
        }
        if matches!(st.given, Given::Client { .. } | Given::Learnt) {
            return Decision::new(Exec::AsIs);
        }
        let before = st.guessing.as_ref().map_or(0, |g| g.memory_len());
        let d = untyped(st, ex, learnt, &mut self.checks, &mut self.early);
        let after = st.guessing.as_ref().map_or(0, |g| g.memory_len());
        self.guessing_bytes = self.guessing_bytes + after - before;
        d
    }

    /// Production's answer to command `serial` started (`ran`: not an ERR); `decided`: the
    /// forwarding reader has passed that command. True when it proved a guess wrong.
    pub(super) fn prod_answered(&mut self, serial: u64, ran: bool, decided: bool) -> bool {
        if let Some(i) = self.checks.iter().position(|c| c.serial == serial) {
            self.checks[i].prod = Some(ran);
            return self.settle(i);
        }
        if !decided {
            if self.early.len() >= EARLY_ANSWERS {
                self.early.pop_front();
            }
            self.early.push_back((serial, ran));
        }
        false
    }

    /// The test server's answer to command `serial` started (`refused`: its ERR code). True
    /// when it proved a guess wrong.
    pub(super) fn test_answered(&mut self, serial: u64, refused: Option<u16>) -> bool {
        match self.checks.iter().position(|c| c.serial == serial) {
            Some(i) => {
                self.checks[i].test = Some(refused);
                self.settle(i)
            }
            None => false,
        }
    }

    /// Production's answer to `serial` will not be seen.
    pub(super) fn prod_lost(&mut self, serial: u64) {
        self.checks.retain(|c| c.serial != serial);
        self.early.retain(|e| e.0 != serial);
    }

    /// None of the test server's answers awaited will be seen.
    pub(super) fn test_lost(&mut self) {
        self.checks.clear();
    }

    fn settle(&mut self, i: usize) -> bool {
        let Some(&c) = self.checks.get(i) else {
            return false;
        };
        let (Some(ran), Some(refused)) = (c.prod, c.test) else {
            return false;
        };
        self.checks.remove(i);
        let (true, Some(code)) = (ran, refused) else {
            return false;
        };
        if NOT_ABOUT_TYPES.contains(&code) {
            return false;
        }
        let Some(st) = self.statements.get_mut(&c.test_id) else {
            return false;
        };
        let Some(g) = st.guessing.as_deref_mut() else {
            return false;
        };
        if st.given != Given::Guessed || g.attempt != c.attempt || g.wrong {
            return false;
        }
        let before = g.memory_len();
        g.reject();
        self.guessing_bytes = self.guessing_bytes + g.memory_len() - before;
        true
    }

    /// Bytes held beyond the owner's in-line `Box`: an estimate, O(1).
    pub(super) fn memory_len(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>()
            + self.statements.capacity() * (size_of::<(u32, Statement)>() + 1)
            + self.checks.capacity() * size_of::<Check>()
            + self.early.capacity() * size_of::<(u64, bool)>()
            + self.guessing_bytes
    }
}

/// An untyped (flag 0) execute of a statement the test server has no client's types for.
fn untyped(
    st: &mut Statement,
    ex: &Execute<'_>,
    learnt: &LearntTypes,
    checks: &mut VecDeque<Check>,
    early: &mut VecDeque<(u64, bool)>,
) -> Decision {
    let Ok(exec) = ExecuteParams::parse(ex.payload, st.num_params) else {
        return Decision::new(Exec::AsIs);
    };
    let g = st.guessing.get_or_insert_with(Box::default);
    let generation = learnt.generation();
    if g.generation != generation {
        let found = ex.sql.and_then(|sql| learnt.get(sql, st.num_params));
        match found {
            // Looked at again with the whole packet.
            Some(_) if !ex.complete => return Decision::new(Exec::Undecodable),
            Some(types) if exec.fits(&types) => {
                let had = st.given == Given::Guessed && !g.wrong && g.types == types;
                let Some(payload) = typed(exec, &types) else {
                    return Decision::new(Exec::Undecodable);
                };
                st.given = Given::Learnt;
                st.guessing = None;
                if had {
                    return Decision::new(Exec::AsIs);
                }
                return Decision::new(Exec::Typed {
                    payload,
                    learnt: true,
                });
            }
            // Learnt types that cannot read these bytes belong to another statement whose
            // first `SQL_KEPT` bytes are the same (or its values came as long data): guess.
            Some(_) | None => g.generation = generation,
        }
    }
    if g.gave_up {
        return Decision::new(Exec::Undecodable);
    }
    let guessed = st.given == Given::Guessed && !g.wrong;
    if guessed && exec.fits(&g.types) {
        watch(checks, early, ex, g.attempt);
        return Decision::new(Exec::AsIs);
    }
    if !ex.complete {
        return Decision::new(Exec::Undecodable);
    }
    // Bytes the guess cannot read prove it wrong, unless a parameter it left unknown (NULL
    // then) has a value now.
    let corrected = guessed && !exec.has_unknown(&g.types);
    if corrected {
        g.reject();
    }
    let undecodable = Decision {
        exec: Exec::Undecodable,
        corrected,
    };
    if g.rejected.len() >= MAX_WRONG_GUESSES {
        g.gave_up = true;
        return undecodable;
    }
    let rejected = &g.rejected;
    let Some(types) = params::guess(&exec, |t| !rejected.contains(&fingerprint(t))) else {
        g.undecoded += 1;
        g.gave_up = g.undecoded >= MAX_UNDECODED;
        return undecodable;
    };
    let Some(payload) = typed(exec, &types) else {
        return undecodable;
    };
    g.undecoded = 0;
    g.wrong = false;
    g.attempt = g.attempt.wrapping_add(1);
    g.types = types.into();
    st.given = Given::Guessed;
    watch(checks, early, ex, g.attempt);
    Decision {
        exec: Exec::Typed {
            payload,
            learnt: false,
        },
        corrected,
    }
}

/// The execute with the new-params-bound flag set and `types` (2 bytes per parameter).
fn typed(exec: ExecuteParams<'_>, types: &[u8]) -> Option<Vec<u8>> {
    let t = exec.with_types(types)?;
    let mut out = Vec::new();
    t.write(&mut out);
    Some(out)
}

/// Awaits both servers' answers to a guessed execute.
fn watch(
    checks: &mut VecDeque<Check>,
    early: &mut VecDeque<(u64, bool)>,
    ex: &Execute<'_>,
    attempt: u32,
) {
    // Commands are decided in serial order: answers kept for earlier ones are not needed.
    while early.front().is_some_and(|e| e.0 < ex.serial) {
        early.pop_front();
    }
    let prod = match early.front() {
        Some(&(s, ran)) if s == ex.serial => {
            early.pop_front();
            Some(ran)
        }
        _ => None,
    };
    if !ex.verify {
        return;
    }
    if checks.len() >= MAX_CHECKS {
        checks.pop_front();
    }
    checks.push_back(Check {
        serial: ex.serial,
        test_id: ex.test_id,
        attempt,
        prod,
        test: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::mysql::params::field_type::{LONG, LONGLONG, VAR_STRING};

    fn untyped_execute(values: &[u8]) -> Vec<u8> {
        let mut p = vec![0x17, 9, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0];
        p.extend_from_slice(values);
        p
    }

    fn ex<'a>(payload: &'a [u8], serial: u64, sql: &'a [u8]) -> Execute<'a> {
        Execute {
            test_id: 1,
            payload,
            complete: true,
            sql: Some(sql),
            serial,
            verify: true,
        }
    }

    fn typed_types(d: &Decision) -> Option<Vec<u8>> {
        match &d.exec {
            Exec::Typed { payload, .. } => ExecuteParams::parse(payload, 1)
                .ok()
                .and_then(|e| e.types.map(<[u8]>::to_vec)),
            _ => None,
        }
    }

    #[test]
    fn the_learnt_cache_is_bounded_and_keeps_the_latest() {
        let l = LearntTypes::new();
        let g0 = l.generation();
        l.learn(b"SELECT ?", &[LONG, 0]);
        assert!(l.generation() > g0);
        let g1 = l.generation();
        l.learn(b"SELECT ?", &[LONG, 0]);
        assert_eq!(l.generation(), g1, "the same types change nothing");
        l.learn(b"SELECT ?", &[LONGLONG, 0]);
        assert_eq!(l.get(b"SELECT ?", 1).as_deref(), Some(&[LONGLONG, 0][..]));
        assert_eq!(l.get(b"SELECT ?", 2), None, "another parameter count");
        for i in 0..LEARNT_STATEMENTS + 10 {
            l.learn(format!("SELECT {i}, ?").as_bytes(), &[LONG, 0]);
        }
        assert_eq!(l.len(), LEARNT_STATEMENTS);
        assert_eq!(l.get(b"SELECT ?", 1), None, "the oldest went first");
        l.learn(b"", &[LONG, 0]);
        l.learn(b"SELECT ?", &[0; 2 * LEARNT_MAX_PARAMS + 2]);
        assert_eq!(l.get(b"SELECT ?", 1), None);
    }

    #[test]
    fn a_guess_the_test_server_refuses_is_replaced_by_the_next_candidate() {
        let l = LearntTypes::new();
        let mut t = SessionTypes::new(16);
        t.prepared(1, 1, true);
        // "\x03abc": text first, though it is a LONG here.
        let p = untyped_execute(b"\x03abc");
        assert_eq!(t.wanted(1, &p[..11]), 12, "first the flag");
        assert_eq!(
            t.wanted(1, &p[..12]),
            usize::MAX,
            "then, types to give, all of it"
        );
        // Production answered before the execute was decided (it waited for the re-prepare).
        assert!(!t.prod_answered(5, true, false));
        let d = t.execute(&ex(&p, 5, b"SELECT c FROM t WHERE id=?"), &l);
        assert_eq!(typed_types(&d), Some(vec![VAR_STRING, 0]));
        assert!(
            t.test_answered(5, Some(1366)),
            "refused where production ran"
        );
        // The next execute carries the next candidate, whatever the client's flag says.
        let d = t.execute(&ex(&p, 6, b"SELECT c FROM t WHERE id=?"), &l);
        assert_eq!(typed_types(&d), Some(vec![LONG, 0]));
        assert!(!d.corrected);
        assert!(!t.prod_answered(6, true, true));
        assert!(!t.test_answered(6, None));
        // Accepted: later executes pass as they are.
        let d = t.execute(&ex(&p, 7, b"SELECT c FROM t WHERE id=?"), &l);
        assert_eq!(d.exec, Exec::AsIs);
        // An error about the data, not the types, changes nothing.
        assert!(!t.test_answered(7, Some(1062)));
        assert!(!t.prod_answered(7, true, true));
        assert_eq!(t.execute(&ex(&p, 8, b"x"), &l).exec, Exec::AsIs);
        // Both refusing says nothing either.
        assert!(!t.prod_answered(8, false, true));
        assert!(!t.test_answered(8, Some(1366)));
    }

    #[test]
    fn bytes_a_guess_cannot_read_prove_it_wrong_and_guessing_stops_eventually() {
        let l = LearntTypes::new();
        let mut t = SessionTypes::new(16);
        t.prepared(1, 1, true);
        let d = t.execute(&ex(&untyped_execute(&7u32.to_le_bytes()), 1, b"q"), &l);
        assert_eq!(typed_types(&d), Some(vec![LONG, 0]));
        // A 5-byte value: not a LONG after all.
        let d = t.execute(&ex(&untyped_execute(b"\x04abcd"), 2, b"q"), &l);
        assert!(d.corrected);
        assert_eq!(typed_types(&d), Some(vec![VAR_STRING, 0]));
        // Bytes nothing reads, again and again: guessing stops.
        let junk = untyped_execute(&[0xfc, 0xff, 0xff]);
        for i in 0..u64::from(MAX_UNDECODED) {
            let d = t.execute(&ex(&junk, 3 + i, b"q"), &l);
            assert_eq!(d.exec, Exec::Undecodable);
        }
        let ok = untyped_execute(&7u32.to_le_bytes());
        assert_eq!(t.execute(&ex(&ok, 20, b"q"), &l).exec, Exec::Undecodable);
        // Types learnt meanwhile still apply.
        l.learn(b"q", &[LONG, 0]);
        let d = t.execute(&ex(&ok, 21, b"q"), &l);
        assert_eq!(
            d.exec,
            Exec::Typed {
                payload: untyped_execute(&[])
                    .into_iter()
                    .take(11)
                    .chain([1, LONG, 0, 7, 0, 0, 0])
                    .collect(),
                learnt: true
            }
        );
        assert_eq!(t.execute(&ex(&ok, 22, b"q"), &l).exec, Exec::AsIs);
    }

    #[test]
    fn typed_executes_are_learnt_once_and_bookkeeping_stays_bounded() {
        let l = LearntTypes::new();
        let mut t = SessionTypes::new(2);
        t.prepared(1, 1, true);
        let mut p = untyped_execute(&7u32.to_le_bytes());
        p[11] = 1;
        p.splice(12..12, [LONG, 0]);
        assert_eq!(t.wanted(1, &p[..12]), 14, "the types, to learn them");
        assert_eq!(t.execute(&ex(&p, 1, b"q"), &l).exec, Exec::AsIs);
        let g = l.generation();
        assert_eq!(l.get(b"q", 1).as_deref(), Some(&[LONG, 0][..]));
        assert_eq!(t.execute(&ex(&p, 2, b"q"), &l).exec, Exec::AsIs);
        assert_eq!(l.generation(), g, "learnt only when they change");
        let bare = untyped_execute(&7u32.to_le_bytes());
        assert_eq!(
            t.wanted(1, &bare),
            12,
            "the client gave types: the flag is enough"
        );
        assert_eq!(t.execute(&ex(&bare, 3, b"q"), &l).exec, Exec::AsIs);

        t.prepared(2, 3, false);
        assert_eq!(
            t.wanted(2, &bare),
            12,
            "a client's own statement: the flag only"
        );
        t.prepared(3, 1, true);
        assert_eq!(t.wanted(3, &bare), 0, "over the limit: not tracked");
        assert_eq!(t.wanted(9, &bare), 0);
        t.closed(1);
        t.prepared(3, 1, true);
        assert_eq!(t.wanted(3, &bare[..5]), 12);
        t.reset();
        assert_eq!(t.wanted(3, &bare), 0);
        assert_eq!(t.guessing_bytes, 0);

        for s in 0..(EARLY_ANSWERS as u64 * 2) {
            t.prod_answered(s, true, false);
        }
        assert_eq!(t.early.len(), EARLY_ANSWERS);
    }
}
