//! The copier's sans-IO heart: the session engine ([`engine`]) and the MySQL layer that rides
//! on it ([`mysql`]), with the few types they share with the copier's edges ([`credentials`],
//! [`observation`]).
//!
//! # What this crate is for
//!
//! Everything that decides what the test server receives: TCP replay, reassembly, timers,
//! retransmission, the MySQL login rewrite, statement ids, reply tracking, the report's
//! observations. It is fed events (a captured packet, a relayed reply, a timeout, each with
//! the caller's `now`) and asked for actions (`poll_transmit`, `poll_event`,
//! `next_deadline`), so every behaviour is reproducible in a unit test with a fake clock.
//!
//! # What it must never do
//!
//! * I/O of any kind, read a clock, log, spawn threads or draw randomness of its own: it
//!   depends on `common` and `thiserror` only, so no capture library, no libc, no sockets and
//!   no logging crate can reach it (`cargo tree -p tcpshadow-core` shows it). Randomness comes
//!   in as a function the caller provides (`mysql::RandomBytes`).
//! * Panic or grow without bound on input: captured packets, relayed summaries and
//!   production's bytes are untrusted. Bad input is counted and skipped.

pub mod credentials;
pub mod engine;
pub mod mysql;
pub mod observation;
