//! I/O-free pieces shared by copier and intercept. Nothing in this crate opens a socket, reads
//! a clock or spawns a thread.

pub mod alloc_count;
pub mod auth;
pub mod clock;
pub mod control;
pub mod mysql;
pub mod seq;
pub mod tls_event;
pub mod wire;
