//! The SQL the lookup sends and the reading of its answers: the processlist, prepared
//! statement and variable queries (only numbers and addresses it formatted itself go in), the
//! matching of their rows to captured client addresses, and the `SET` statements that give a
//! test session production's variables.
//!
//! Pure: no I/O. Must never put text from the wire into SQL: values go in as hex literals or
//! canonical numbers only.

use std::collections::HashMap;
use std::net::SocketAddrV4;

use crate::mysql::RecoveredState;

use std::time::Instant;

use super::client::{text, Row};
use super::SNAPSHOT_MAX;

/// One picked-up connection to look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupRequest {
    /// The client as production sees it (PROCESSLIST.HOST).
    pub client: SocketAddrV4,
    /// The session's address toward the test server (the engine's key).
    pub mirrored: SocketAddrV4,
}

/// What the worker is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Job {
    Lookup(LookupRequest),
    /// A session of this client opened from its SYN: the start snapshot's entry for the address
    /// (an earlier connection on the same port) must never describe it.
    Seen(SocketAddrV4),
}

/// What production knew about one session; `None`: nothing (not found, or the lookup failed).
#[derive(Clone, Debug)]
pub struct LookupAnswer {
    pub mirrored: SocketAddrV4,
    pub state: Option<RecoveredState>,
    /// When production read the variables (those queries' round trips); the driver puts them
    /// on the engine's clock ([`RecoveredState::variables_at`], `variables_again`).
    pub variables_read: Reads,
}

/// The PROCESSLIST query for these clients. Only addresses we format ourselves go in.
pub fn processlist_query(clients: &[SocketAddrV4]) -> String {
    let mut q = String::from(
        "SELECT ID, USER, HOST, DB FROM information_schema.PROCESSLIST WHERE HOST IN (",
    );
    for (i, c) in clients.iter().enumerate() {
        if i > 0 {
            q.push_str(", ");
        }
        // Digits, dots and a colon only: nothing to escape.
        q.push_str(&format!("'{}:{}'", c.ip(), c.port()));
    }
    q.push(')');
    q
}

/// The prepared-statements query for these connection ids (numbers only).
pub fn statements_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, p.STATEMENT_ID, p.SQL_TEXT \
         FROM performance_schema.prepared_statements_instances p \
         JOIN performance_schema.threads t ON t.THREAD_ID = p.OWNER_THREAD_ID \
         WHERE t.PROCESSLIST_ID IN ({})",
        list.join(", ")
    )
}

pub(super) fn number(v: Option<&Option<Vec<u8>>>) -> Option<u64> {
    std::str::from_utf8(v?.as_deref()?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// PROCESSLIST rows (ID, USER, HOST, DB) matched to the batch: client -> (id, state without
/// statements). Rows that do not parse or match no client are ignored.
pub fn match_processlist(
    batch: &[LookupRequest],
    rows: &[Row],
) -> HashMap<SocketAddrV4, (u64, RecoveredState)> {
    let wanted: HashMap<String, SocketAddrV4> = batch
        .iter()
        .map(|r| (format!("{}:{}", r.client.ip(), r.client.port()), r.client))
        .collect();
    rows.iter()
        .filter_map(processlist_row)
        .filter_map(|(host, id, state)| Some((*wanted.get(&host)?, (id, state))))
        .collect()
}

/// The query of [`Snapshot::read`]: every TCP client's connection but ours (HOST `ip:port`;
/// local socket connections show `localhost`), at most [`SNAPSHOT_MAX`].
pub fn snapshot_query() -> String {
    format!(
        "SELECT ID, USER, HOST, DB FROM information_schema.PROCESSLIST \
         WHERE HOST LIKE '%:%' AND ID <> CONNECTION_ID() LIMIT {SNAPSHOT_MAX}"
    )
}

/// PROCESSLIST rows of [`snapshot_query`]: every client whose HOST is an IPv4 `ip:port` ->
/// (id, state without statements). Other rows (IPv6 clients, unparsable) are ignored.
pub fn match_all_processlist(rows: &[Row]) -> HashMap<SocketAddrV4, (u64, RecoveredState)> {
    rows.iter()
        .filter_map(processlist_row)
        .filter_map(|(host, id, state)| Some((host.parse().ok()?, (id, state))))
        .take(SNAPSHOT_MAX)
        .collect()
}

/// One PROCESSLIST row (ID, USER, HOST, DB): its HOST as production wrote it, its id, and the
/// state it gives (user and schema).
pub(super) fn processlist_row(row: &Row) -> Option<(String, u64, RecoveredState)> {
    let [id, user, host, db] = row.as_slice() else {
        return None;
    };
    let state = RecoveredState {
        user: text(user)?,
        db: text(db).filter(|d| !d.is_empty()),
        statements: Vec::new(),
        variables: Vec::new(),
        variables_dropped: 0,
        variables_at: None,
        variables_again: None,
    };
    Some((text(host)?, number(Some(id))?, state))
}

/// Adds statement rows (PROCESSLIST_ID, STATEMENT_ID, SQL_TEXT) to the states they belong to.
pub fn add_statements(found: &mut HashMap<SocketAddrV4, (u64, RecoveredState)>, rows: &[Row]) {
    let by_id: HashMap<u64, SocketAddrV4> = found.iter().map(|(c, (id, _))| (*id, *c)).collect();
    for row in rows {
        let [pid, sid, sql] = row.as_slice() else {
            continue;
        };
        let (Some(pid), Some(sid), Some(sql)) = (number(Some(pid)), number(Some(sid)), sql) else {
            continue;
        };
        let (Some(client), Ok(sid)) = (by_id.get(&pid), u32::try_from(sid)) else {
            continue;
        };
        if let Some((_, state)) = found.get_mut(client) {
            state.statements.push((sid, sql.clone()));
        }
    }
}

// ------------------------------------------------------------------------------------ variables

/// Session system variables recovered where the server exposes them: those that change what a
/// statement returns or how it is parsed, locks and limits. Anything else a connection set keeps
/// the test server's value. Only these names (ours, not production's) reach the `SET`.
pub const SESSION_VARIABLES: &[&str] = &[
    "auto_increment_increment",
    "auto_increment_offset",
    "autocommit",
    "big_tables",
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
    "cte_max_recursion_depth",
    "default_storage_engine",
    "default_tmp_storage_engine",
    "default_week_format",
    "div_precision_increment",
    "explicit_defaults_for_timestamp",
    "foreign_key_checks",
    "group_concat_max_len",
    "innodb_lock_wait_timeout",
    "lc_time_names",
    "lock_wait_timeout",
    "max_execution_time",
    "max_join_size",
    "max_sort_length",
    "optimizer_switch",
    "sql_auto_is_null",
    "sql_big_selects",
    "sql_mode",
    "sql_safe_updates",
    "sql_select_limit",
    "time_zone",
    "transaction_isolation",
    "transaction_read_only",
    "unique_checks",
    "updatable_views_with_limit",
];

/// Longest variable value carried (bytes); a longer one is dropped and counted.
pub const MAX_VARIABLE_VALUE: usize = 64 << 10;

/// Which kind of variable a [`set_statement`] sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variable {
    /// A session system variable (`SET SESSION name = value`); names outside
    /// [`SESSION_VARIABLES`] are refused.
    Session,
    /// A user variable (`SET @name = value`).
    User,
}

/// The `SET` statement that gives a test session the variable production reported.
/// `Ok(None)`: nothing to set (a NULL user variable reads the same as an unset one).
/// `Err(())`: the name or the value cannot be carried safely; the caller counts it.
///
/// Production's bytes never go into the SQL as text: a name must be one of ours (session) or
/// of the plain unquoted shape `[A-Za-z0-9_$.]{1,64}` (user); a value is a canonical integer, or
/// (session variables) a word of `[A-Za-z0-9_,.+:/=-]` the way `SHOW VARIABLES` prints
/// enumerations, time zones and switches, or (user variables) a hex literal.
#[allow(clippy::result_unit_err)]
pub fn set_statement(
    kind: Variable,
    name: &[u8],
    value: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, ()> {
    let value = match (kind, value) {
        (Variable::User, None) => return Ok(None),
        (Variable::Session, None) => return Err(()),
        (_, Some(v)) if v.len() > MAX_VARIABLE_VALUE => return Err(()),
        (_, Some(v)) => v,
    };
    let mut sql = match kind {
        Variable::Session => {
            let name = SESSION_VARIABLES
                .iter()
                .find(|n| n.as_bytes().eq_ignore_ascii_case(name))
                .ok_or(())?;
            format!("SET SESSION {name} = ").into_bytes()
        }
        Variable::User => {
            let plain = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.');
            if name.is_empty() || name.len() > 64 || !name.iter().all(plain) {
                return Err(());
            }
            let mut sql = b"SET @`".to_vec();
            sql.extend_from_slice(name);
            sql.extend_from_slice(b"` = ");
            sql
        }
    };
    if canonical_integer(value) {
        sql.extend_from_slice(value);
        return Ok(Some(sql));
    }
    match kind {
        Variable::Session => {
            let word = |c: &u8| c.is_ascii_alphanumeric() || b"_,.+:/=-".contains(c);
            if !value.iter().all(word) {
                return Err(());
            }
            sql.push(b'\'');
            sql.extend_from_slice(value);
            sql.push(b'\'');
        }
        Variable::User => {
            // Text stays text in the connection's usual collation; other bytes stay binary.
            let utf8 = std::str::from_utf8(value).is_ok();
            if utf8 {
                sql.extend_from_slice(b"CONVERT(");
            }
            sql.extend_from_slice(b"X'");
            for b in value {
                sql.extend_from_slice(format!("{b:02X}").as_bytes());
            }
            sql.push(b'\'');
            if utf8 {
                sql.extend_from_slice(b" USING utf8mb4)");
            }
        }
    }
    Ok(Some(sql))
}

/// `0`, or an optional minus and up to 18 digits without a leading zero: what a number prints
/// as, and safely an integer on both sides. "007" is text, and stays so.
pub(super) fn canonical_integer(v: &[u8]) -> bool {
    let digits = v.strip_prefix(b"-").unwrap_or(v);
    match digits {
        [b'0'] => v.len() == 1,
        [first, rest @ ..] => {
            (b'1'..=b'9').contains(first) && rest.len() < 18 && rest.iter().all(u8::is_ascii_digit)
        }
        [] => false,
    }
}

/// The session-variables query for these connection ids (numbers only): the listed variables
/// whose session value differs from the global one.
pub fn session_variables_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let names: Vec<String> = SESSION_VARIABLES.iter().map(|n| format!("'{n}'")).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, v.VARIABLE_NAME, v.VARIABLE_VALUE \
         FROM performance_schema.variables_by_thread v \
         JOIN performance_schema.threads t ON t.THREAD_ID = v.THREAD_ID \
         JOIN performance_schema.global_variables g ON g.VARIABLE_NAME = v.VARIABLE_NAME \
         WHERE t.PROCESSLIST_ID IN ({}) AND v.VARIABLE_NAME IN ({}) \
         AND NOT (v.VARIABLE_VALUE <=> g.VARIABLE_VALUE)",
        list.join(", "),
        names.join(", ")
    )
}

/// The user-variables query for these connection ids (numbers only).
pub fn user_variables_query(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "SELECT t.PROCESSLIST_ID, u.VARIABLE_NAME, u.VARIABLE_VALUE \
         FROM performance_schema.user_variables_by_thread u \
         JOIN performance_schema.threads t ON t.THREAD_ID = u.THREAD_ID \
         WHERE t.PROCESSLIST_ID IN ({})",
        list.join(", ")
    )
}

/// Adds variable rows (PROCESSLIST_ID, VARIABLE_NAME, VARIABLE_VALUE) to the states they
/// belong to, as `SET` statements; what cannot be carried is counted in `variables_dropped`.
pub fn add_variables(
    found: &mut HashMap<SocketAddrV4, (u64, RecoveredState)>,
    kind: Variable,
    rows: &[Row],
) {
    let by_id: HashMap<u64, SocketAddrV4> = found.iter().map(|(c, (id, _))| (*id, *c)).collect();
    for row in rows {
        let [pid, name, value] = row.as_slice() else {
            continue;
        };
        let (Some(pid), Some(name)) = (number(Some(pid)), name) else {
            continue;
        };
        let Some((_, state)) = by_id.get(&pid).and_then(|c| found.get_mut(c)) else {
            continue;
        };
        match set_statement(kind, name, value.as_deref()) {
            Ok(Some(set)) => state.variables.push(set),
            Ok(None) => {}
            Err(()) => state.variables_dropped = state.variables_dropped.saturating_add(1),
        }
    }
}

/// The round trips of a lookup's reads of the variables, on the standard clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reads {
    pub first: Option<(Instant, Instant)>,
    pub again: Option<(Instant, Instant)>,
}
