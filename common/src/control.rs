//! The control channel between intercept and copier: message types (and, below, their codec).
//!
//! Intercept sees the test server's replies; the copier needs a few fields of each to play the
//! client side of the mirrored connection. Everything received here is untrusted input.

use std::net::SocketAddrV4;

use crate::wire::{TcpFlags, TcpOptions};

/// What intercept saw of one segment sent by the test server toward a mirrored client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestFeedback {
    /// The mirrored client address (the reply's destination).
    pub client: SocketAddrV4,
    /// The test server's address (the reply's source).
    pub server: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    /// Raw window field (unscaled).
    pub window: u16,
    pub options: TcpOptions,
    /// Length of the segment's TCP payload.
    pub payload_len: u32,
    /// The first bytes of the payload (up to the configured prefix length).
    pub payload_prefix: Vec<u8>,
}
