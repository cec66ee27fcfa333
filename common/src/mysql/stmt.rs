//! Prepared-statement ids: production and the test server number a connection's statements
//! independently, so every id a client sends must be translated before its command reaches the
//! test server.
//!
//! The copier sees both answers to each COM_STMT_PREPARE: production's (captured on the prod host)
//! and the test server's (relayed by intercept), in either order and at different times. A server
//! answers one connection's prepares in the order it received them, so each side's answers pair
//! with the oldest prepare still waiting for that side.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::codec::ProtocolError;
use super::command::PrepareOk;
use super::handshake::ErrPacket;

/// A reasonable per-connection cap. Applications with statement caches keep a few hundred per
/// connection; MariaDB's `max_prepared_stmt_count` (16382) is for the whole server.
pub const DEFAULT_LIMIT: usize = 4096;

/// SQL text kept per statement, for reports; enough to recognise a statement, bounded per entry.
pub const SQL_KEPT: usize = 256;

/// MariaDB's "the statement this connection prepared last" id, used by direct execution. It means
/// the same on both servers, so it passes through untranslated.
pub const LAST_PREPARED: u32 = u32::MAX;

/// One server's answer to a COM_STMT_PREPARE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareAnswer {
    Ok { statement_id: u32 },
    Err { code: u16 },
}

impl PrepareAnswer {
    /// Reads the first packet of a reply to COM_STMT_PREPARE (PREPARE_OK or ERR).
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        match payload.first() {
            Some(&ErrPacket::HEADER) => Ok(Self::Err {
                code: ErrPacket::parse(payload)?.code,
            }),
            _ => Ok(Self::Ok {
                statement_id: PrepareOk::parse(payload)?.statement_id,
            }),
        }
    }
}

/// Why a production statement id has no test-server counterpart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UnmappedReason {
    #[error("never prepared on this connection as far as the mirror saw")]
    Unknown,
    #[error("the test server has not answered its prepare yet")]
    AwaitingTest,
    #[error("the test server rejected its prepare (error {code})")]
    TestRejected { code: u16 },
    #[error("not tracked: the per-connection statement limit was reached")]
    LimitReached,
    #[error("statement tracking lost step with the servers")]
    Desynchronized,
    #[error("the test server's answer to its prepare was never seen")]
    TestAnswerLost,
}

/// A production statement id that cannot be translated, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("statement {prod_id} has no test-server id: {reason}")]
pub struct Unmapped {
    pub prod_id: u32,
    pub reason: UnmappedReason,
}

/// What an answer settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The other server's answer to this prepare has not been seen yet.
    Waiting,
    Mapped {
        prod_id: u32,
        test_id: u32,
    },
    /// Executes of `prod_id` cannot be replayed.
    TestRejected {
        prod_id: u32,
        code: u16,
    },
    /// Production rejected what the test server accepted: no client command will ever name
    /// `test_id`, so the copier may close it on the test server (COM_STMT_CLOSE gets no reply).
    Orphaned {
        test_id: u32,
    },
    BothRejected,
    /// Answered after the session dropped its statements (COM_RESET_CONNECTION, COM_CHANGE_USER);
    /// the servers dropped it too.
    Discarded,
    /// Not kept: the statement limit was reached. `test_id`, if any, may be closed.
    Dropped {
        prod_id: Option<u32>,
        test_id: Option<u32>,
    },
    /// No prepare was waiting for an answer from this side; the map is now desynchronized.
    Unexpected,
    /// The test server's answer was given up on ([`StatementMap::test_answers_lost`]): the
    /// statement is known, and unusable.
    TestAnswerLost,
}

#[derive(Clone, Debug)]
struct Pending {
    sql: Box<[u8]>,
    prod: Option<PrepareAnswer>,
    test: Option<PrepareAnswer>,
    discarded: bool,
    /// `test` stands in for an answer that will never be seen.
    test_lost: bool,
}

#[derive(Clone, Debug)]
enum Entry {
    Mapped {
        test_id: u32,
        sql: Box<[u8]>,
    },
    Failed {
        reason: UnmappedReason,
        sql: Box<[u8]>,
    },
}

/// A map keyed by statement ids. The ids are numbers a server hands out (1, 2, 3, ... per
/// connection), which no client can choose: they need no keyed hash (SipHash cost a lookup per
/// COM_STMT_EXECUTE on each side of the copier, issue 20), only a spread of their low bits,
/// which one multiply by an odd constant (Fibonacci hashing) gives.
pub type ByStatementId<V> = HashMap<u32, V, BuildHasherDefault<StatementIdHasher>>;

/// The hasher of [`ByStatementId`]; for `u32` keys only (anything else is folded in whole).
#[derive(Clone, Copy, Debug, Default)]
pub struct StatementIdHasher(u64);

impl Hasher for StatementIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = (self.0 ^ u64::from(id)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // The table takes its bucket from the low bits and its tag from the top 7: the top
        // bits are the well-mixed ones, so they go to both.
        self.0 ^ (self.0 >> 32)
    }
}

/// Translates one connection's production statement ids into the test server's.
#[derive(Clone, Debug)]
pub struct StatementMap {
    entries: ByStatementId<Entry>,
    pending: VecDeque<Pending>,
    limit: usize,
    dropped: u64,
    desynchronized: bool,
}

impl Default for StatementMap {
    fn default() -> Self {
        Self::new(DEFAULT_LIMIT)
    }
}

fn keep_sql(sql: &[u8]) -> Box<[u8]> {
    sql[..sql.len().min(SQL_KEPT)].into()
}

impl StatementMap {
    /// A map holding at most `limit` statements and `limit` prepares in flight.
    pub fn new(limit: usize) -> Self {
        Self {
            entries: ByStatementId::default(),
            pending: VecDeque::new(),
            limit,
            dropped: 0,
            desynchronized: false,
        }
    }

    /// Records a client COM_STMT_PREPARE that goes to both servers. Call it in the order the
    /// prepares are sent to the test server.
    pub fn prepare_sent(&mut self, sql: &[u8]) {
        self.push_pending(sql, None);
    }

    /// Records a statement production already has (recovered for a pooled connection from
    /// `performance_schema.prepared_statements_instances`) that the copier now prepares on the
    /// test server. Call it when that COM_STMT_PREPARE is sent, in order with [`Self::prepare_sent`];
    /// only the test server's answer is awaited.
    pub fn register_known(&mut self, prod_id: u32, sql: &[u8]) {
        self.push_pending(
            sql,
            Some(PrepareAnswer::Ok {
                statement_id: prod_id,
            }),
        );
    }

    fn push_pending(&mut self, sql: &[u8], prod: Option<PrepareAnswer>) {
        if self.desynchronized {
            return;
        }
        if self.pending.len() >= self.limit {
            // Dropping one prepare would pair every later answer with the wrong statement.
            self.desynchronize();
            return;
        }
        self.pending.push_back(Pending {
            sql: keep_sql(sql),
            prod,
            test: None,
            discarded: false,
            test_lost: false,
        });
    }

    /// Production's answer to the oldest prepare it has not answered yet.
    pub fn prod_answer(&mut self, answer: PrepareAnswer) -> Resolution {
        self.answer(answer, |p| &mut p.prod)
    }

    /// The test server's answer to the oldest prepare it has not answered yet.
    pub fn test_answer(&mut self, answer: PrepareAnswer) -> Resolution {
        self.answer(answer, |p| &mut p.test)
    }

    fn answer(
        &mut self,
        answer: PrepareAnswer,
        side: impl Fn(&mut Pending) -> &mut Option<PrepareAnswer>,
    ) -> Resolution {
        if self.desynchronized {
            return Resolution::Unexpected;
        }
        let Some(slot) = self.pending.iter_mut().map(side).find(|s| s.is_none()) else {
            self.desynchronize();
            return Resolution::Unexpected;
        };
        *slot = Some(answer);
        // Each side answers in order, so a prepare is complete only once every older one is: the
        // front is the only candidate.
        match self.pending.front() {
            Some(p) if p.prod.is_some() && p.test.is_some() => {}
            _ => return Resolution::Waiting,
        }
        let Some(p) = self.pending.pop_front() else {
            return Resolution::Waiting;
        };
        self.settle(p)
    }

    fn settle(&mut self, p: Pending) -> Resolution {
        use PrepareAnswer::{Err, Ok};
        let (Some(prod), Some(test)) = (p.prod, p.test) else {
            return Resolution::Waiting;
        };
        if p.discarded {
            return Resolution::Discarded;
        }
        if p.test_lost {
            if let Ok { statement_id } = prod {
                if self.entries.len() < self.limit || self.entries.contains_key(&statement_id) {
                    self.entries.insert(
                        statement_id,
                        Entry::Failed {
                            reason: UnmappedReason::TestAnswerLost,
                            sql: p.sql,
                        },
                    );
                } else {
                    self.dropped += 1;
                }
            }
            return Resolution::TestAnswerLost;
        }
        let (prod_id, entry, resolution) = match (prod, test) {
            (
                Ok {
                    statement_id: prod_id,
                },
                Ok {
                    statement_id: test_id,
                },
            ) => (
                prod_id,
                Entry::Mapped {
                    test_id,
                    sql: p.sql,
                },
                Resolution::Mapped { prod_id, test_id },
            ),
            (
                Ok {
                    statement_id: prod_id,
                },
                Err { code },
            ) => (
                prod_id,
                Entry::Failed {
                    reason: UnmappedReason::TestRejected { code },
                    sql: p.sql,
                },
                Resolution::TestRejected { prod_id, code },
            ),
            (Err { .. }, Ok { statement_id }) => {
                return Resolution::Orphaned {
                    test_id: statement_id,
                }
            }
            (Err { .. }, Err { .. }) => return Resolution::BothRejected,
        };
        if self.entries.len() >= self.limit && !self.entries.contains_key(&prod_id) {
            self.dropped += 1;
            let test_id = match entry {
                Entry::Mapped { test_id, .. } => Some(test_id),
                Entry::Failed { .. } => None,
            };
            return Resolution::Dropped {
                prod_id: Some(prod_id),
                test_id,
            };
        }
        self.entries.insert(prod_id, entry);
        resolution
    }

    fn desynchronize(&mut self) {
        self.desynchronized = true;
        self.entries.clear();
        self.pending.clear();
    }

    /// The test server's answers to every prepare still awaiting one will never be seen (the
    /// copier lost its view of the test server's replies). Those statements become unusable
    /// rather than waiting forever, and answers seen later pair with later prepares only.
    pub fn test_answers_lost(&mut self) {
        for p in self.pending.iter_mut().filter(|p| p.test.is_none()) {
            p.test = Some(PrepareAnswer::Err { code: 0 });
            p.test_lost = true;
        }
        while self
            .pending
            .front()
            .is_some_and(|p| p.prod.is_some() && p.test.is_some())
        {
            if let Some(p) = self.pending.pop_front() {
                self.settle(p);
            }
        }
    }

    /// The test server's id for production's `prod_id`.
    pub fn lookup(&self, prod_id: u32) -> Result<u32, Unmapped> {
        let fail = |reason| Err(Unmapped { prod_id, reason });
        if self.desynchronized {
            return fail(UnmappedReason::Desynchronized);
        }
        if prod_id == LAST_PREPARED {
            return Ok(LAST_PREPARED);
        }
        match self.entries.get(&prod_id) {
            Some(Entry::Mapped { test_id, .. }) => Ok(*test_id),
            Some(Entry::Failed { reason, .. }) => fail(*reason),
            None if self.awaits_test(prod_id) => fail(UnmappedReason::AwaitingTest),
            None if self.dropped > 0 => fail(UnmappedReason::LimitReached),
            None => fail(UnmappedReason::Unknown),
        }
    }

    fn awaits_test(&self, prod_id: u32) -> bool {
        self.pending.iter().any(|p| {
            !p.discarded
                && p.test.is_none()
                && p.prod
                    == Some(PrepareAnswer::Ok {
                        statement_id: prod_id,
                    })
        })
    }

    /// Forgets `prod_id` after a COM_STMT_CLOSE and returns the test id to close. While the test
    /// server's answer is still awaited nothing changes ([`UnmappedReason::AwaitingTest`]): hold
    /// the close and retry once the prepare settles.
    pub fn close(&mut self, prod_id: u32) -> Result<u32, Unmapped> {
        let found = self.lookup(prod_id);
        match found {
            Err(Unmapped {
                reason: UnmappedReason::AwaitingTest | UnmappedReason::Desynchronized,
                ..
            }) => {}
            _ if prod_id == LAST_PREPARED => {}
            _ => {
                self.entries.remove(&prod_id);
            }
        }
        found
    }

    /// Drops every statement, as COM_RESET_CONNECTION and COM_CHANGE_USER do on the servers. Call
    /// it when the command is sent: prepares sent before it still get their answers, which are
    /// paired and then discarded.
    pub fn reset_all(&mut self) {
        self.entries.clear();
        for p in &mut self.pending {
            p.discarded = true;
        }
    }

    /// Bytes the map occupies at most (its tables' capacity, each SQL text counted at
    /// [`SQL_KEPT`]): an upper bound, O(1), for a memory budget.
    pub fn memory_len(&self) -> usize {
        use std::mem::size_of;
        self.entries.capacity() * (size_of::<(u32, Entry)>() + 1)
            + self.entries.len() * SQL_KEPT
            + self.pending.capacity() * size_of::<Pending>()
            + self.pending.len() * SQL_KEPT
    }

    /// The (first [`SQL_KEPT`] bytes of the) SQL text of a tracked statement.
    pub fn sql(&self, prod_id: u32) -> Option<&[u8]> {
        if let Some(Entry::Mapped { sql, .. } | Entry::Failed { sql, .. }) =
            self.entries.get(&prod_id)
        {
            return Some(sql);
        }
        self.pending
            .iter()
            .find(|p| {
                !p.discarded
                    && p.prod
                        == Some(PrepareAnswer::Ok {
                            statement_id: prod_id,
                        })
            })
            .map(|p| &*p.sql)
    }

    /// Statements tracked (mapped or failed).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Prepares still waiting for one or both answers.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Statements not kept because the limit was reached.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether an answer arrived that no prepare was waiting for (or too many prepares were in
    /// flight): pairing can no longer be trusted and every lookup fails until the session ends.
    pub fn is_desynchronized(&self) -> bool {
        self.desynchronized
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::fixtures::{self, hex};
    use proptest::prelude::*;

    fn ok(id: u32) -> PrepareAnswer {
        PrepareAnswer::Ok { statement_id: id }
    }

    fn err(code: u16) -> PrepareAnswer {
        PrepareAnswer::Err { code }
    }

    fn unmapped(prod_id: u32, reason: UnmappedReason) -> Result<u32, Unmapped> {
        Err(Unmapped { prod_id, reason })
    }

    #[test]
    fn parses_answers_from_real_packets() {
        assert_eq!(
            PrepareAnswer::parse(&hex(fixtures::SB_PREPARE_OK_4)),
            Ok(ok(4))
        );
        assert_eq!(
            PrepareAnswer::parse(&hex(fixtures::WRONG_PW_ERR)),
            Ok(err(1045))
        );
        assert!(PrepareAnswer::parse(&[]).is_err());
        assert!(PrepareAnswer::parse(&[0x00, 1]).is_err());
    }

    #[test]
    fn pairs_answers_in_order_whichever_side_is_first() {
        let mut m = StatementMap::default();
        m.prepare_sent(b"SELECT c FROM sbtest1 WHERE id=?");
        m.prepare_sent(b"BEGIN");
        m.prepare_sent(b"SELECT nope");
        assert_eq!(m.prod_answer(ok(1)), Resolution::Waiting);
        assert_eq!(m.lookup(1), unmapped(1, UnmappedReason::AwaitingTest));
        assert_eq!(m.sql(1), Some(&b"SELECT c FROM sbtest1 WHERE id=?"[..]));
        assert_eq!(m.prod_answer(ok(2)), Resolution::Waiting);
        assert_eq!(m.prod_answer(ok(3)), Resolution::Waiting);
        assert_eq!(
            m.test_answer(ok(11)),
            Resolution::Mapped {
                prod_id: 1,
                test_id: 11
            }
        );
        assert_eq!(
            m.test_answer(ok(12)),
            Resolution::Mapped {
                prod_id: 2,
                test_id: 12
            }
        );
        assert_eq!(
            m.test_answer(err(1146)),
            Resolution::TestRejected {
                prod_id: 3,
                code: 1146
            }
        );
        assert_eq!(m.lookup(1), Ok(11));
        assert_eq!(m.lookup(2), Ok(12));
        assert_eq!(
            m.lookup(3),
            unmapped(3, UnmappedReason::TestRejected { code: 1146 })
        );
        assert_eq!(m.lookup(4), unmapped(4, UnmappedReason::Unknown));
        assert_eq!(m.pending_len(), 0);

        // Test first this time; production rejects the second.
        m.prepare_sent(b"SELECT 1");
        m.prepare_sent(b"SELEC 2");
        assert_eq!(m.test_answer(ok(13)), Resolution::Waiting);
        assert_eq!(m.test_answer(ok(14)), Resolution::Waiting);
        assert_eq!(
            m.prod_answer(ok(5)),
            Resolution::Mapped {
                prod_id: 5,
                test_id: 13
            }
        );
        assert_eq!(
            m.prod_answer(err(1064)),
            Resolution::Orphaned { test_id: 14 }
        );
    }

    #[test]
    fn close_and_reset() {
        let mut m = StatementMap::default();
        m.prepare_sent(b"a");
        m.prod_answer(ok(1));
        assert_eq!(m.close(1), unmapped(1, UnmappedReason::AwaitingTest));
        m.test_answer(ok(7));
        assert_eq!(m.close(1), Ok(7));
        assert_eq!(m.lookup(1), unmapped(1, UnmappedReason::Unknown));

        m.prepare_sent(b"b");
        m.prod_answer(ok(2));
        m.test_answer(ok(8));
        m.prepare_sent(b"c");
        m.prod_answer(ok(3));
        // COM_RESET_CONNECTION goes out while the test server still owes an answer.
        m.reset_all();
        assert_eq!(m.lookup(2), unmapped(2, UnmappedReason::Unknown));
        assert_eq!(m.lookup(3), unmapped(3, UnmappedReason::Unknown));
        m.prepare_sent(b"d");
        m.prod_answer(ok(4));
        assert_eq!(m.test_answer(ok(9)), Resolution::Discarded);
        assert_eq!(
            m.test_answer(ok(1)),
            Resolution::Mapped {
                prod_id: 4,
                test_id: 1
            }
        );
        assert_eq!(m.len(), 1);
        assert!(!m.is_desynchronized());
    }

    #[test]
    fn recovered_statements_only_wait_for_the_test_server() {
        let mut m = StatementMap::default();
        m.register_known(5, b"SELECT c FROM sbtest1 WHERE id=?");
        m.register_known(6, b"SELECT broken");
        // A client prepare interleaves with the re-prepares; production answers only it.
        m.prepare_sent(b"SELECT 3");
        assert_eq!(m.lookup(5), unmapped(5, UnmappedReason::AwaitingTest));
        assert_eq!(m.prod_answer(ok(7)), Resolution::Waiting);
        assert_eq!(
            m.test_answer(ok(1)),
            Resolution::Mapped {
                prod_id: 5,
                test_id: 1
            }
        );
        assert_eq!(
            m.test_answer(err(1064)),
            Resolution::TestRejected {
                prod_id: 6,
                code: 1064
            }
        );
        assert_eq!(
            m.test_answer(ok(2)),
            Resolution::Mapped {
                prod_id: 7,
                test_id: 2
            }
        );
        assert_eq!(m.lookup(5), Ok(1));
        assert_eq!(m.lookup(LAST_PREPARED), Ok(LAST_PREPARED));
    }

    #[test]
    fn limits_and_desynchronization() {
        let mut m = StatementMap::new(2);
        for (p, t) in [(1, 11), (2, 12)] {
            m.prepare_sent(b"x");
            m.prod_answer(ok(p));
            m.test_answer(ok(t));
        }
        m.prepare_sent(b"x");
        m.prod_answer(ok(3));
        assert_eq!(
            m.test_answer(ok(13)),
            Resolution::Dropped {
                prod_id: Some(3),
                test_id: Some(13)
            }
        );
        assert_eq!(m.lookup(3), unmapped(3, UnmappedReason::LimitReached));
        assert_eq!(m.dropped(), 1);

        // An answer nobody waits for means the mirror missed a prepare: stop trusting ids.
        assert_eq!(m.test_answer(ok(14)), Resolution::Unexpected);
        assert!(m.is_desynchronized());
        assert_eq!(m.lookup(1), unmapped(1, UnmappedReason::Desynchronized));

        let mut m = StatementMap::new(2);
        m.prepare_sent(b"1");
        m.prepare_sent(b"2");
        m.prepare_sent(b"3");
        assert!(m.is_desynchronized());
        assert_eq!(m.pending_len(), 0);
    }

    #[test]
    fn keeps_sql_bounded() {
        let mut m = StatementMap::default();
        m.prepare_sent(&[b'x'; 10_000]);
        m.prod_answer(ok(1));
        assert_eq!(m.sql(1).map(<[u8]>::len), Some(SQL_KEPT));
    }

    #[derive(Clone, Debug)]
    struct Script {
        // Per prepare: (prod outcome, test outcome); `None` = rejected.
        outcomes: Vec<(bool, bool)>,
        // Order in which the two answer streams interleave: true = prod next.
        order: Vec<bool>,
    }

    fn arb_script() -> impl Strategy<Value = Script> {
        proptest::collection::vec((any::<bool>(), any::<bool>()), 0..20).prop_flat_map(|outcomes| {
            let n = outcomes.len();
            let order = Just([vec![true; n], vec![false; n]].concat()).prop_shuffle();
            (Just(outcomes), order).prop_map(|(outcomes, order)| Script { outcomes, order })
        })
    }

    proptest! {
        #[test]
        fn any_interleaving_of_answers_gives_the_same_map(s in arb_script()) {
            let mut m = StatementMap::default();
            for _ in &s.outcomes {
                m.prepare_sent(b"q");
            }
            let (mut pi, mut ti) = (0usize, 0usize);
            for prod_next in &s.order {
                if *prod_next {
                    let ok_ = s.outcomes[pi].0;
                    m.prod_answer(if ok_ { ok(100 + pi as u32) } else { err(1064) });
                    pi += 1;
                } else {
                    let ok_ = s.outcomes[ti].1;
                    m.test_answer(if ok_ { ok(1 + ti as u32) } else { err(1146) });
                    ti += 1;
                }
            }
            prop_assert_eq!(m.pending_len(), 0);
            prop_assert!(!m.is_desynchronized());
            for (i, (p, t)) in s.outcomes.iter().enumerate() {
                let prod_id = 100 + i as u32;
                let want = match (p, t) {
                    (true, true) => Ok(1 + i as u32),
                    (true, false) => unmapped(prod_id, UnmappedReason::TestRejected { code: 1146 }),
                    (false, _) => unmapped(prod_id, UnmappedReason::Unknown),
                };
                prop_assert_eq!(m.lookup(prod_id), want);
            }
        }

        #[test]
        fn arbitrary_call_sequences_stay_bounded(ops in proptest::collection::vec((0u8..6, any::<u32>()), 0..200)) {
            let mut m = StatementMap::new(8);
            for (op, v) in ops {
                match op {
                    0 => m.prepare_sent(b"q"),
                    1 => m.register_known(v % 16, b"r"),
                    2 => { m.prod_answer(if v % 3 == 0 { err(1) } else { ok(v % 16) }); }
                    3 => { m.test_answer(if v % 3 == 0 { err(2) } else { ok(v) }); }
                    4 => { let _ = m.close(v % 16); }
                    _ => m.reset_all(),
                }
                prop_assert!(m.len() <= 8 && m.pending_len() <= 8);
                let _ = m.lookup(v % 16);
            }
        }
    }
}
