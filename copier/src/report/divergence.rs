//! Commands the test server did not run as production did, by command, statement kind and
//! reason: an error on one server only, or a command sent and never answered. These are losses
//! of the mirror's last mile (and, apart, commands whose answer intercept could not read, which
//! the test server had but nobody can tell how it ran: [`Reason::is_loss`] is false for them), and the copier counts them whether or not `--report` writes
//! files: the summary lists them under `losses:`, the status line and `--metrics` carry them.
//!
//! Pure and bounded: fed one observation at a time by the collector, at most [`MAX_ENTRIES`]
//! (command, kind, reason) keys; what comes beyond is added to an `other` key of its reason, so
//! the totals stay exact however many error codes a run invents.

use std::collections::BTreeMap;
use std::fmt;

use super::observe::{AnswerKind, Observation, Statement, TestOutcome};

/// Keys kept; real runs have a handful.
pub const MAX_ENTRIES: usize = 256;

/// Why a command counts here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The test server answered ERR with this code where production answered without an error
    /// (or with another code). Includes executes of a statement whose prepare the test server
    /// refused with this code.
    TestError(u16),
    /// Production answered ERR with this code, the test server did not fail.
    ProdError(u16),
    /// Sent to the test server; its answer was never seen because the session ended first.
    Unanswered,
    /// Sent to the test server, which had it; its answer was not read (intercept lost the test
    /// server's framing, or the test server was too far behind to be kept track of). Not
    /// known to be lost: counted apart.
    AnswerUnseen,
}

impl Reason {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::TestError(_) => "test_error",
            Reason::ProdError(_) => "prod_error",
            Reason::Unanswered => "unanswered",
            Reason::AnswerUnseen => "answer_unseen",
        }
    }

    /// Whether the test server is known not to have run the command as production did.
    pub fn is_loss(self) -> bool {
        self != Reason::AnswerUnseen
    }

    pub fn code(self) -> Option<u16> {
        match self {
            Reason::TestError(c) | Reason::ProdError(c) => Some(c),
            Reason::Unanswered | Reason::AnswerUnseen => None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::TestError(c) => write!(f, "error {c} on the test server only"),
            Reason::ProdError(c) => write!(f, "error {c} on production only"),
            Reason::Unanswered => write!(f, "sent, never answered by the test server"),
            Reason::AnswerUnseen => write!(f, "sent, its answer not seen"),
        }
    }
}

/// One row: `count` commands of `command` (`query`, `stmt_execute`, ...) and `kind` (the
/// statement's first keyword: `select`, `insert`, ...) for `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divergent {
    pub command: &'static str,
    pub kind: &'static str,
    pub reason: Reason,
    pub count: u64,
}

type Key = (&'static str, &'static str, Reason);

#[derive(Clone, Debug, Default)]
pub struct Divergence {
    counts: BTreeMap<Key, u64>,
}

impl Divergence {
    pub fn observe(&mut self, o: &Observation) {
        let Some(p) = o.prod else {
            // Production's answer unseen: nothing to hold the test server's against.
            return;
        };
        let prod_err = match p.kind {
            AnswerKind::Err(c) => Some(c),
            _ => None,
        };
        let test_err = match o.test {
            TestOutcome::Answered(t) => match t.kind {
                AnswerKind::Err(c) => Some(c),
                _ => None,
            },
            TestOutcome::Refused(c) => Some(c),
            TestOutcome::Lost => {
                self.add(&o.statement, Reason::Unanswered);
                return;
            }
            TestOutcome::Unseen => {
                self.add(&o.statement, Reason::AnswerUnseen);
                return;
            }
            // Kept off by design, or not sendable (the protocol layer counts those); or sent
            // again by the session that re-established this one.
            TestOutcome::Skipped | TestOutcome::Dropped | TestOutcome::Resent => return,
        };
        let reason = match (prod_err, test_err) {
            (_, Some(t)) if prod_err != Some(t) => Reason::TestError(t),
            (Some(p), None) => Reason::ProdError(p),
            _ => return,
        };
        self.add(&o.statement, reason);
    }

    fn add(&mut self, s: &Statement, reason: Reason) {
        let mut key = (s.command, statement_kind(s), reason);
        if !self.counts.contains_key(&key) && self.counts.len() >= MAX_ENTRIES {
            let reason = match reason {
                Reason::TestError(_) => Reason::TestError(0),
                Reason::ProdError(_) => Reason::ProdError(0),
                r @ (Reason::Unanswered | Reason::AnswerUnseen) => r,
            };
            key = ("other", "other", reason);
        }
        *self.counts.entry(key).or_default() += 1;
    }

    pub fn rows(&self) -> Vec<Divergent> {
        self.counts
            .iter()
            .map(|(&(command, kind, reason), &count)| Divergent {
                command,
                kind,
                reason,
                count,
            })
            .collect()
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// Statement kinds named after their first keyword (MariaDB's `Com_*` counters name the same);
/// anything else is `other`.
const KINDS: &[&str] = &[
    "select",
    "insert",
    "update",
    "delete",
    "replace",
    "begin",
    "start",
    "commit",
    "rollback",
    "set",
    "use",
    "call",
    "create",
    "alter",
    "drop",
    "truncate",
    "show",
    "lock",
    "unlock",
    "load",
    "savepoint",
    "release",
    "prepare",
    "execute",
    "deallocate",
    "do",
    "handler",
    "with",
    "grant",
    "revoke",
    "flush",
    "analyze",
    "optimize",
    "explain",
    "describe",
    "kill",
];

/// The statement's first keyword for SQL-carrying commands, `-` for the others (ping,
/// init_db, ...: their command says it all).
pub fn statement_kind(s: &Statement) -> &'static str {
    if !matches!(s.command, "query" | "stmt_execute" | "stmt_prepare") {
        return "-";
    }
    let text = s
        .fingerprint
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(');
    let word: &str = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    KINDS
        .iter()
        .find(|k| k.eq_ignore_ascii_case(word))
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use common::clock::Instant;

    use super::*;
    use crate::report::observe::Answer;

    fn stmt(command: &'static str, fingerprint: &str) -> Arc<Statement> {
        Arc::new(Statement {
            id: 1,
            command,
            fingerprint: fingerprint.into(),
            example: fingerprint.into(),
            traits: Default::default(),
        })
    }

    fn answer(kind: AnswerKind) -> Answer {
        Answer {
            kind,
            rows: 0,
            bytes: 0,
            latency: Duration::ZERO,
            done: Instant::ZERO,
            waited: Duration::ZERO,
            checksum: None,
        }
    }

    fn obs(s: &Arc<Statement>, prod: Option<AnswerKind>, test: TestOutcome) -> Observation {
        Observation {
            statement: Arc::clone(s),
            copy: 0,
            target: 0,
            prod: prod.map(answer),
            test,
        }
    }

    #[test]
    fn counts_by_command_kind_and_code() {
        let sel = stmt("stmt_execute", "select c from sbtest1 where id=?");
        let upd = stmt("query", "UPDATE sbtest1 SET k=k+? WHERE id=?");
        let mut d = Divergence::default();
        for _ in 0..3 {
            d.observe(&obs(
                &sel,
                Some(AnswerKind::ResultSet),
                TestOutcome::Answered(answer(AnswerKind::Err(1210))),
            ));
        }
        d.observe(&obs(&upd, Some(AnswerKind::Ok), TestOutcome::Refused(1142)));
        d.observe(&obs(
            &upd,
            Some(AnswerKind::Err(1062)),
            TestOutcome::Answered(answer(AnswerKind::Ok)),
        ));
        d.observe(&obs(&upd, Some(AnswerKind::Ok), TestOutcome::Lost));
        // Counted apart, not as a loss: the test server had it, its answer was unreadable.
        d.observe(&obs(&upd, Some(AnswerKind::Ok), TestOutcome::Unseen));
        // Not losses here: the same answers, the same error, production unseen, by design.
        d.observe(&obs(
            &upd,
            Some(AnswerKind::Err(1062)),
            TestOutcome::Answered(answer(AnswerKind::Err(1062))),
        ));
        d.observe(&obs(&upd, None, TestOutcome::Lost));
        d.observe(&obs(&upd, Some(AnswerKind::Ok), TestOutcome::Skipped));
        d.observe(&obs(
            &sel,
            Some(AnswerKind::ResultSet),
            TestOutcome::Answered(answer(AnswerKind::ResultSet)),
        ));
        let rows = d.rows();
        let find = |kind: &str, reason: Reason| {
            rows.iter()
                .find(|r| r.kind == kind && r.reason == reason)
                .map(|r| r.count)
        };
        assert_eq!(find("select", Reason::TestError(1210)), Some(3));
        assert_eq!(find("update", Reason::TestError(1142)), Some(1));
        assert_eq!(find("update", Reason::ProdError(1062)), Some(1));
        assert_eq!(find("update", Reason::Unanswered), Some(1));
        assert_eq!(find("update", Reason::AnswerUnseen), Some(1));
        assert!(!Reason::AnswerUnseen.is_loss() && Reason::Unanswered.is_loss());
        assert_eq!(d.total(), 7);
    }

    #[test]
    fn bounded_with_exact_totals() {
        let s = stmt("query", "select ?");
        let mut d = Divergence::default();
        for code in 0..2000u16 {
            d.observe(&obs(
                &s,
                Some(AnswerKind::Ok),
                TestOutcome::Answered(answer(AnswerKind::Err(code))),
            ));
        }
        assert!(d.rows().len() <= MAX_ENTRIES + 1);
        assert_eq!(d.total(), 2000);
    }

    #[test]
    fn kinds_from_first_keyword() {
        assert_eq!(statement_kind(&stmt("query", "  (SELECT 1)")), "select");
        assert_eq!(statement_kind(&stmt("query", "start transaction")), "start");
        assert_eq!(statement_kind(&stmt("query", "frobnicate")), "other");
        assert_eq!(statement_kind(&stmt("query", "")), "other");
        assert_eq!(statement_kind(&stmt("init_db", "init_db")), "-");
    }
}
