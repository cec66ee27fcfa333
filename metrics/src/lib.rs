//! Prometheus for the daemons: the text exposition format 0.0.4 ([`Exposition`], and a small
//! [`parse`] for tests), and a tiny blocking HTTP/1.x responder for `GET /metrics`
//! ([`serve`]).
//!
//! # What this room is for
//!
//! copier and intercept both serve `--metrics ADDR:PORT`. The responder is ~150 lines that
//! both need identically; `common` promises no OS calls, so it lives in this small crate
//! instead of being copied into each daemon.
//!
//! # What it must never do
//!
//! * Block or lock the daemons' packet loops: a loop renders its text at most about once a
//!   second and [`Published::set`]s it (one pointer swap under a mutex); the responder's
//!   thread only clones the pointer and writes from it.
//! * Trust the network: requests are bounded in size and time, anything but
//!   `GET`/`HEAD /metrics` gets 404/405, and every connection is closed after one answer.
//! * Know what is measured: names and values come from the daemons.

mod http;
mod text;

pub use http::{serve, MetricsServer, Published};
pub use text::{parse, Exposition, Kind, Sample};
