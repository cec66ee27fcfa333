//! `--prod-dsn`: recovers, from production itself, the state of MySQL connections the copier
//! picked up mid-stream (opened before it started, typically by a connection pool).
//!
//! # What this room is for
//!
//! An I/O edge, like the capture and the control channel. A picked-up connection's login
//! happened long ago, so the copier does not know its user, its current schema, or the
//! statements it prepared; without them the test server would reject every execute. Production
//! knows all three, and a read-only account can read them (MariaDB 10.11 and MySQL):
//!
//! * `information_schema.PROCESSLIST`: ID, USER, DB, and HOST as `ip:port`, matched against the
//!   captured client address;
//! * `performance_schema.prepared_statements_instances` (OWNER_THREAD_ID, STATEMENT_ID — the
//!   protocol statement id — and SQL_TEXT), joined with `performance_schema.threads`
//!   (THREAD_ID -> PROCESSLIST_ID). Needs `performance_schema=ON`.
//!
//! * `performance_schema.user_variables_by_thread` (MySQL and MariaDB): the connection's user
//!   variables (`@name`);
//! * `performance_schema.variables_by_thread` where the server has it (MySQL 5.7 and later; not
//!   MariaDB 10.11): the session system variables of [`SESSION_VARIABLES`] whose value differs
//!   from production's global one, i.e. those the connection changed (`time_zone`, `sql_mode`,
//!   ...).
//!
//! Variables reach the test session as `SET` statements that [`set_statement`] builds: names
//! from a fixed list or of a plain shape, values as numbers or hex literals, never as text.
//!
//! # How
//!
//! A minimal blocking MySQL client ([`MysqlClient`], text protocol only) runs on one worker
//! thread ([`StateLookup`]). The engine thread never blocks on it: requests go through a bounded
//! channel (full: counted, the session logs in with the defaults), the worker batches what
//! arrives within [`BATCH_WINDOW`] into at most four queries, and answers come back through a
//! channel plus the engine loop's waker.
//!
//! Before its first request the worker reads every connection once ([`Snapshot`]): the capture
//! is already open then, so a connection idle at that moment has its exact state ready when its
//! next command comes, instead of one read a few milliseconds after that command (what it ran
//! in between is on no known side of the read, and partly lost). The first kernel drop ends the
//! snapshot (a lost packet may have changed a connection not yet seen); so does
//! [`SNAPSHOT_TTL`].
//!
//! Rooms: [`dsn`] (the `--prod-dsn` value), [`error`] (what goes wrong and its fix),
//! [`client`] (the blocking MySQL client, its own address), [`queries`] (the SQL builders and
//! the reading of their rows: pure), [`read`] (one lookup's queries in order), [`snapshot`]
//! (the start snapshot), [`worker`] ([`StateLookup`] and its thread).
//!
//! # What it must never do
//!
//! * Log or `Debug` the password ([`ProdDsn`] redacts it).
//! * Put anything but numbers and addresses it formatted itself into SQL: client addresses come
//!   from captured packets, so they are formatted from `SocketAddrV4`, never passed through as text.
//!   The same holds for the `SET` statements sent to the test server: production's variable
//!   values go in as hex literals or canonical numbers only.
//! * Panic or allocate without bound on production's bytes: a hostile or broken server is input
//!   too; every packet and result set has a size limit.
//! * Be mirrored: its connection is on the production port; [`OwnAddress`] lets the capture
//!   skip it.

use std::time::Duration;

use common::mysql::packet::MAX_PAYLOAD_LEN;

mod client;
mod dsn;
mod error;
mod queries;
mod read;
mod snapshot;
#[cfg(test)]
mod tests;
mod worker;

pub use client::*;
pub use dsn::*;
pub use error::*;
pub use queries::*;
pub use snapshot::*;
pub use worker::*;

/// How long requests are gathered before one lookup runs: pools reconnect in bursts, and one
/// query for many connections costs production less than many queries. Short: what a
/// connection runs between its pickup and the read of its variables is lost (their state
/// before the read is unknown), and a busy pool connection runs a command every millisecond
/// or so; a pool picked up at the copier's start shows up within a few.
pub const BATCH_WINDOW: Duration = Duration::from_millis(2);
/// Most connections looked up in one query (bounds the query's length).
pub const MAX_BATCH: usize = 256;
/// Most connections the start snapshot reads ([`Snapshot`]).
pub const SNAPSHOT_MAX: usize = 4096;
/// How long the start snapshot answers. Its entries stay exact for as long as the capture loses
/// nothing; the bound is for memory: a connection idle longer is looked up when it is seen.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(120);
/// Requests waiting for the worker; beyond, a request is dropped (counted).
pub const QUEUE_CAP: usize = 4096;
/// Connect, read and write timeout toward production.
pub const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest logical packet accepted from production.
const MAX_PACKET: usize = 4 * MAX_PAYLOAD_LEN;
/// Largest result set accepted (all payload bytes).
const MAX_RESULT_BYTES: usize = 64 << 20;
const MAX_ROWS: usize = 1_000_000;
const MAX_COLUMNS: u64 = 4096;
/// Auth round trips before we call the exchange broken.
const MAX_AUTH_STEPS: usize = 4;
