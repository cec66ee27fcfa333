//! One lookup: the queries of a batch of connections run on the client, in order, and their
//! rows turned into recovered states (what is wanted depends on what the account can read).
//!
//! Runs on the lookup worker only; must never run on the engine thread.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::mysql::RecoveredState;

use super::client::{MysqlClient, Readiness, Row};
use super::error::ProdError;
use super::queries::{
    add_statements, add_variables, match_processlist, number, processlist_query,
    session_variables_query, statements_query, user_variables_query, LookupRequest, Reads,
    Variable,
};

/// What a lookup asks production besides PROCESSLIST (from the start-up [`Readiness`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Wanted {
    pub(super) statements: bool,
    pub(super) session_variables: bool,
    pub(super) user_variables: bool,
}

impl From<&Readiness> for Wanted {
    fn from(r: &Readiness) -> Self {
        let ps = !r.performance_schema_off;
        Wanted {
            statements: ps,
            session_variables: ps && r.session_variables,
            user_variables: ps && r.user_variables,
        }
    }
}

/// What one lookup found, per client, and when production read the variables.
pub(super) type Found = (HashMap<SocketAddrV4, (u64, RecoveredState)>, Reads);

pub(super) fn lookup_batch(
    c: &mut MysqlClient<impl Read + Write>,
    batch: &[LookupRequest],
    wanted: Wanted,
    queries: &AtomicU64,
) -> Result<Found, ProdError> {
    // Each is one SELECT production runs for us, not for its clients: counted so that a
    // comparison of executed work can take them out.
    let mut c = |sql: &str| {
        queries.fetch_add(1, Ordering::Relaxed);
        c.query(sql)
    };
    let clients: Vec<SocketAddrV4> = batch
        .iter()
        .map(|r| r.client)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rows = c(&processlist_query(&clients))?;
    read_state(&mut c, match_processlist(batch, &rows), wanted)
}

/// Rows of the state queries in a fixed order: by connection id, then by their second column
/// (a statement id as a number, a variable's name as bytes). Sorted here, not by the server:
/// an ORDER BY over a join of performance_schema tables makes production build a temporary
/// table, and MariaDB 10.11.19 crashed (NULL pointer in `ha_maria::drop_table`, freeing that
/// table) under one of these queries in the lab's faults test. The copier's queries must not
/// ask production for work it can do itself.
pub(super) fn ordered(mut rows: Vec<Row>) -> Vec<Row> {
    fn key(row: &Row) -> (u64, Option<u64>, Vec<u8>) {
        let second = row.get(1);
        (
            number(row.first()).unwrap_or(u64::MAX),
            number(second),
            second.cloned().flatten().unwrap_or_default(),
        )
    }
    rows.sort_by_cached_key(key);
    rows
}

/// Reads the variables and statements of connections PROCESSLIST found (`found`, by client).
pub(super) fn read_state(
    c: &mut impl FnMut(&str) -> Result<Vec<Row>, ProdError>,
    mut found: HashMap<SocketAddrV4, (u64, RecoveredState)>,
    wanted: Wanted,
) -> Result<Found, ProdError> {
    if found.is_empty() {
        return Ok((found, Reads::default()));
    }
    let ids: Vec<u64> = found.values().map(|(id, _)| *id).collect();
    // Each read's round trip: production read the variables within it (user variables change
    // with every command; session variables seldom).
    let mut reads = Reads::default();
    if wanted.session_variables {
        let t0 = Instant::now();
        let rows = ordered(c(&session_variables_query(&ids))?);
        reads.first = Some((t0, Instant::now()));
        add_variables(&mut found, Variable::Session, &rows);
    }
    if wanted.user_variables {
        let session_only: HashMap<SocketAddrV4, (Vec<Vec<u8>>, u32)> = found
            .iter()
            .map(|(a, (_, s))| (*a, (s.variables.clone(), s.variables_dropped)))
            .collect();
        let t0 = Instant::now();
        let rows = ordered(c(&user_variables_query(&ids))?);
        reads.first = Some((t0, Instant::now()));
        add_variables(&mut found, Variable::User, &rows);
        // Once more, right after: a command that writes a variable may be answered within
        // the first read's round trip, on no known side of it; the session then starts from
        // this read instead (see `RecoveredState::variables_again`).
        let mut again = found.clone();
        for (a, (_, s)) in again.iter_mut() {
            if let Some((v, d)) = session_only.get(a) {
                s.variables.clone_from(v);
                s.variables_dropped = *d;
            }
        }
        let t0 = Instant::now();
        let rows = ordered(c(&user_variables_query(&ids))?);
        reads.again = Some((t0, Instant::now()));
        add_variables(&mut again, Variable::User, &rows);
        for (a, (_, s)) in found.iter_mut() {
            s.variables_again = again.remove(a).map(|(_, g)| (g.variables, None));
        }
    }
    // After the variables: a statement is the same before and after the read, a variable not.
    if wanted.statements {
        let rows = ordered(c(&statements_query(&ids))?);
        add_statements(&mut found, &rows);
    }
    Ok((found, reads))
}
