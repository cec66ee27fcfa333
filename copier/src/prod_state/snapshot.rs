//! The start snapshot: every production connection read once before the first request, so a
//! connection idle at the copier's start has its exact state ready when its next command comes.
//!
//! Must never answer once the capture has dropped a packet, nor after [`SNAPSHOT_TTL`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::mysql::RecoveredState;

use super::client::MysqlClient;
use super::error::ProdError;
use super::queries::{match_all_processlist, snapshot_query, Reads};
use super::read::{read_state, Wanted};
use super::{MAX_BATCH, SNAPSHOT_TTL};

/// Every client connection's state, read once as the copier starts, its capture already open.
///
/// A lookup made when a picked-up connection is first seen reads its state a few milliseconds
/// after the commands that made the copier ask, and what the connection ran in between is on no
/// known side of the read: some of it is dropped and counted
/// (`commands_dropped_before_state_read`). Most of a pool's connections are idle at any moment.
/// Read while idle, after the capture opened, their state is exact when their next command
/// comes: every command after the read is captured, so the first one the copier sees is the
/// first after the read. A connection busy during the read is no worse off than with a lookup:
/// its commands are placed against the read's round trip as they would be against a lookup's.
///
/// That holds while the capture loses nothing: a dropped packet may have been a command of a
/// connection not yet seen, so the driver ends the snapshot at the first kernel drop
/// ([`StateLookup::forget_snapshot`]). Each entry answers once: a later lookup of the same
/// client (a new connection on a reused port) asks production.
#[derive(Debug)]
pub struct Snapshot {
    pub(super) taken: Instant,
    pub(super) states: HashMap<SocketAddrV4, (RecoveredState, Reads)>,
}

impl Snapshot {
    /// Reads every connection's user, schema, variables and statements (at most
    /// [`SNAPSHOT_MAX`], [`MAX_BATCH`] to a query). Each query is counted in `queries`.
    pub(super) fn read(
        c: &mut MysqlClient<impl Read + Write>,
        wanted: Wanted,
        queries: &AtomicU64,
    ) -> Result<Self, ProdError> {
        let taken = Instant::now();
        let mut q = |sql: &str| {
            queries.fetch_add(1, Ordering::Relaxed);
            c.query(sql)
        };
        let rows = q(&snapshot_query())?;
        let all: Vec<_> = match_all_processlist(&rows).into_iter().collect();
        let mut states = HashMap::with_capacity(all.len());
        for chunk in all.chunks(MAX_BATCH) {
            let (found, reads) = read_state(&mut q, chunk.iter().cloned().collect(), wanted)?;
            states.extend(
                found
                    .into_iter()
                    .map(|(client, (_, s))| (client, (s, reads))),
            );
        }
        Ok(Self { taken, states })
    }

    /// `client`'s state as read at start, once; nothing once [`SNAPSHOT_TTL`] has passed.
    pub(super) fn take(
        &mut self,
        client: SocketAddrV4,
        now: Instant,
    ) -> Option<(RecoveredState, Reads)> {
        if now.saturating_duration_since(self.taken) > SNAPSHOT_TTL {
            self.states.clear();
        }
        self.states.remove(&client)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}
