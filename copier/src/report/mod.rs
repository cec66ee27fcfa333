//! The comparison report: what the test server did differently from production.
//!
//! `model` is the data (and the `report.json` schema); the renderers turn one `Report` into
//! text, JSON, HTML or Prometheus text and never collect anything themselves.

pub mod collect;
pub mod model;
pub mod observe;

pub use model::*;
