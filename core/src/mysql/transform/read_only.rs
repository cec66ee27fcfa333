//! `--read-only`: commands that write are neither sent to the test server nor awaited from
//! it, and every statement command naming a statement prepared from one neither.
//!
//! # What this room is for
//!
//! Judging each COM_QUERY and COM_STMT_PREPARE by its SQL (`common::mysql::classify`, on the
//! text collected whole up to 1 MiB), other commands by their code, and remembering what was
//! kept off: production's ids of statements not prepared on the test server, and SQL-level
//! prepared statement names. The same record serves a picked-up connection's prepares that
//! could not be sent for want of its state ([`Fate::Lost`](super::statements::Fate)): their
//! executes are a loss, not kept off by design.
//!
//! # What it must never do
//!
//! * Let a write through on a guess: a text seen only in part is kept off (as the write its
//!   seen part shows, or as `Other`), and so is a command whose content is not judged.
//! * Grow without bound: at most `max_statements` ids and names are remembered; past that an
//!   execute finds no statement and is dropped as an unknown one.

use std::collections::{HashMap, HashSet};
use std::mem::size_of;

use common::mysql::classify::{self, Effect, NameUse, Rules, WriteKind};
use common::mysql::command::{self, com};
use common::mysql::packet::{PacketHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use common::mysql::stmt::LAST_PREPARED;

use super::super::{Counter, MysqlConfig};
use super::MysqlTransform;
use crate::engine::TransformOutput;

/// What was kept off the test server and must stay off.
#[derive(Default)]
struct Skipped {
    /// Production's ids of statements whose prepare was not sent to the test server.
    statements: HashSet<u32>,
    /// SQL-level prepared statement names whose PREPARE was not sent, with its kind.
    names: HashMap<Box<[u8]>, WriteKind>,
    /// Those of `statements` not sent for want of a picked-up connection's state (`Fate::Lost`):
    /// what they would have run is lost, not kept off by design.
    lost: HashSet<u32>,
}

/// The statements and names kept off the test server.
#[derive(Default)]
pub(super) struct ReadOnly {
    /// `None` until there is one (most sessions never have any, and two empty hash tables take
    /// 96 bytes in line).
    skipped: Option<Box<Skipped>>,
    /// The client's latest COM_STMT_PREPARE was not sent: MariaDB's "last prepared" id
    /// ([`LAST_PREPARED`]) names it.
    last_prepare_skipped: bool,
    /// The last prepare was not sent for want of a picked-up connection's state (`Fate::Lost`).
    last_prepare_lost: bool,
}

impl ReadOnly {
    /// Whether `prod_id` names a statement not sent for want of a picked-up connection's
    /// state.
    pub(super) fn lost(&self, prod_id: u32) -> bool {
        self.skipped
            .as_ref()
            .is_some_and(|k| k.lost.contains(&prod_id))
            || (prod_id == LAST_PREPARED && self.last_prepare_lost)
    }

    /// Whether `prod_id` names a statement kept off the test server.
    pub(super) fn kept_off(&self, prod_id: u32) -> bool {
        self.skipped
            .as_ref()
            .is_some_and(|k| k.statements.contains(&prod_id))
            || (prod_id == LAST_PREPARED && self.last_prepare_skipped)
    }

    /// The client closed a lost statement: nothing of it is left to drop.
    pub(super) fn closed_lost(&mut self, prod_id: u32) {
        if let Some(k) = &mut self.skipped {
            k.statements.remove(&prod_id);
            k.lost.remove(&prod_id);
        }
    }

    /// The client closed a statement kept off.
    pub(super) fn statement_closed(&mut self, prod_id: u32) {
        if let Some(k) = &mut self.skipped {
            k.statements.remove(&prod_id);
        }
    }

    /// Production's id now names a statement the test server has (ids are reused).
    pub(super) fn statement_mapped(&mut self, prod_id: u32) {
        self.statement_closed(prod_id);
    }

    /// The client's latest prepare went to the test server.
    pub(super) fn prepare_sent(&mut self) {
        self.last_prepare_skipped = false;
        self.last_prepare_lost = false;
    }

    /// The client's latest prepare was kept off (`--read-only`).
    pub(super) fn prepare_skipped(&mut self) {
        self.last_prepare_skipped = true;
    }

    /// The client's latest prepare was not sent for want of a picked-up connection's state.
    pub(super) fn prepare_lost(&mut self) {
        self.last_prepare_skipped = false;
        self.last_prepare_lost = true;
    }

    /// Production's statement `prod_id` was not prepared on the test server.
    pub(super) fn skip_statement(
        &mut self,
        prod_id: u32,
        max: usize,
        out: &mut TransformOutput<'_>,
    ) {
        if self.skipped.as_ref().map_or(0, |k| k.statements.len()) >= max {
            // Its executes then find no statement and are dropped as unknown ones.
            out.count(Counter::StatementsOverLimit as usize);
            return;
        }
        self.skipped
            .get_or_insert_with(Box::default)
            .statements
            .insert(prod_id);
    }

    /// The statement `prod_id`, if kept off, was kept off for want of a picked-up connection's
    /// state.
    pub(super) fn mark_lost(&mut self, prod_id: u32) {
        if let Some(k) = &mut self.skipped {
            if k.statements.contains(&prod_id) {
                k.lost.insert(prod_id);
            }
        }
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop every statement on both servers.
    pub(super) fn forget(&mut self) {
        self.skipped = None;
        self.last_prepare_skipped = false;
        self.last_prepare_lost = false;
    }

    /// The kind of write `sql` carries, if any; a COM_QUERY's (`query`) SQL-level PREPAREs and
    /// DEALLOCATEs update the record of names that were not sent.
    fn write_named(
        &mut self,
        sql: &[u8],
        complete: bool,
        query: bool,
        config: &MysqlConfig,
    ) -> Option<WriteKind> {
        let names = self.skipped.as_deref().map(|k| &k.names);
        let skipped = |n: &[u8]| names.and_then(|m| m.get(n).copied());
        let rules = Rules {
            allow_calls: config.allow_calls,
            skipped: &skipped,
        };
        let c = classify::classify_with(sql, &rules);
        let kind = verdict(c.effect, complete);
        if query {
            for u in c.names {
                match u {
                    NameUse::Prepare { name, effect } => match (kind, effect) {
                        (None, _) => {
                            if let Some(k) = &mut self.skipped {
                                k.names.remove(&name[..]);
                            }
                        }
                        (Some(k), e) => {
                            let k = match e {
                                Effect::Write(w) => w,
                                Effect::Read => k,
                            };
                            let max = config.max_statements;
                            let names = &mut self.skipped.get_or_insert_with(Box::default).names;
                            if names.len() < max {
                                names.insert(name.into_boxed_slice(), k);
                            }
                        }
                    },
                    NameUse::Deallocate { name } => {
                        if let Some(k) = &mut self.skipped {
                            k.names.remove(&name[..]);
                        }
                    }
                }
            }
        }
        kind
    }

    pub(super) fn memory_len(&self) -> usize {
        self.skipped.as_ref().map_or(0, |k| {
            size_of::<Skipped>()
                + k.statements.capacity() * (size_of::<u32>() + 1)
                + k.names.len() * (size_of::<(Box<[u8]>, WriteKind)>() + 64)
        })
    }
}

impl MysqlTransform {
    /// The kind of write the command whose head is collected carries, if it must not reach the
    /// test server. Statement commands are judged by their statement
    /// ([`Self::statement_command`]).
    pub(super) fn read_only_skip(&mut self, code: u8, h: PacketHeader) -> Option<WriteKind> {
        match code {
            com::QUERY | com::STMT_PREPARE => {
                let head = self.fwd.head();
                let sql = head.get(HEADER_LEN + 1..).unwrap_or(&[]);
                let seen = head.len().saturating_sub(HEADER_LEN);
                let complete = seen == h.len as usize && (h.len as usize) < MAX_PAYLOAD_LEN;
                self.read_only
                    .write_named(sql, complete, code == com::QUERY, &self.shared.config)
            }
            com::QUIT
            | com::INIT_DB
            | com::FIELD_LIST
            | com::STATISTICS
            | com::PING
            | com::CHANGE_USER
            | com::SET_OPTION
            | com::RESET_CONNECTION => None,
            c if command::carries_statement_id(c) => None,
            // COM_PROCESS_INFO: the process list.
            0x0a => None,
            // COM_CREATE_DB, COM_DROP_DB
            0x05 | 0x06 => Some(WriteKind::Ddl),
            // COM_REFRESH, COM_SHUTDOWN, COM_PROCESS_KILL (another connection's id on the test
            // server), COM_DEBUG, COM_BINLOG_DUMP, COM_REGISTER_SLAVE, COM_BINLOG_DUMP_GTID
            0x07 | 0x08 | com::PROCESS_KILL | 0x0d | com::BINLOG_DUMP | 0x15 | 0x1e => {
                Some(WriteKind::Admin)
            }
            // COM_MULTI and anything unknown: their content is not judged.
            _ => Some(WriteKind::Other),
        }
    }
}

/// The kind of write a recovered statement's (whole) SQL text carries, if any.
pub(super) fn recovered_write(config: &MysqlConfig, sql: &[u8]) -> Option<WriteKind> {
    if !config.read_only {
        return None;
    }
    let rules = Rules {
        allow_calls: config.allow_calls,
        ..Rules::default()
    };
    verdict(classify::classify_with(sql, &rules).effect, true)
}

/// `--read-only`'s verdict on a classified text: the kind of write, if it is not to be sent. A
/// text seen only in part is a write unless its seen part already is one.
fn verdict(effect: Effect, complete: bool) -> Option<WriteKind> {
    match effect {
        Effect::Write(k) => Some(k),
        Effect::Read if complete => None,
        Effect::Read => Some(WriteKind::Other),
    }
}
