//! The copier: runs on the production host, captures the clients' traffic of a port and plays
//! the client side of each connection toward a test server.
//!
//! The sans-IO heart, the session engine and the MySQL layer, lives in its own crate
//! (`tcpshadow-core`, re-exported here as `engine` and `mysql`) so that the compiler keeps I/O
//! out of it; everything in this crate is an edge (capture, raw send, control channel,
//! signals, status), the driver that wires them to the engine (`driver`), or a loop that feeds
//! the driver (`run`: the live capture).
//!
//! A daemon is wired one way: `cli` parses and validates the command line into `settings`
//! (plain data), `builders` turns settings into engines, `driver` owns the I/O around them.

pub mod builders;
pub mod capture;
pub mod cli;
pub mod control_client;
pub mod credentials;
pub mod doctor;
pub mod driver;
pub mod metrics;
pub mod outputs;
pub mod pcapfile;
pub mod probe;
pub mod prod_state;
pub mod record;
pub mod replay;
pub mod report;
pub mod resources;
pub mod run;
pub mod sampling;
pub mod send;
pub mod settings;
pub mod signals;
pub mod status;
pub mod tls;
pub mod transit;
pub mod waker;

pub use tcpshadow_core::{engine, mysql};
