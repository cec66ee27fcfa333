//! The MySQL/MariaDB client protocol, as far as a packet-level mirror needs it.
//!
//! The copier replays each captured client connection toward a test server. Plain bytes replay
//! fine, except where the protocol ties a session to the server it first talked to:
//!
//! * the login answers the greeting's random nonce, so it must be recomputed with the test
//!   server's nonce and a password valid there ([`handshake`], [`auth`]);
//! * prepared-statement ids are assigned by each server, so every id a client sends must be
//!   translated ([`command`], [`stmt`]);
//! * commands are framed in packets that can be split across TCP segments, and one command can
//!   span many packets ([`packet`]).
//!
//! This module is the protocol knowledge for that, and nothing else:
//!
//! * **No I/O.** Nothing here reads a socket, a file, a clock or the environment; randomness for
//!   RSA padding is passed in by the caller. Callers feed bytes and get values back.
//! * **Untrusted input.** Every byte parsed may be hostile or truncated (a capture can start
//!   mid-stream). Parsers never panic, never index out of bounds, and never allocate according to
//!   a length read from the input: they borrow from the payload and return a typed
//!   [`ProtocolError`] that the caller counts. Buffers that must exist ([`packet::PacketSplitter`],
//!   [`stmt::StatementMap`]) have explicit limits.
//! * **No secrets in output.** Passwords and auth responses (which replay for their nonce) never
//!   appear in `Debug` output: the types holding them implement `Debug` by hand and print only
//!   lengths. Nothing here logs at all.
//!
//! Parsed types borrow their payload (`&'a [u8]` fields) and have `write` methods that emit the
//! payload back; for the login and COM_CHANGE_USER the emitted bytes equal the captured ones when
//! nothing was changed, so a rewrite touches only the fields it means to.

pub mod auth;
pub mod classify;
mod codec;
pub mod command;
pub mod digest;
pub mod fold;
pub mod handshake;
pub mod packet;
pub mod params;
pub mod stmt;

// Captured bytes for tests, and (feature `fixtures`) for the fuzz seeds in tcpshadow-fuzz-harness.
#[cfg(any(test, feature = "fixtures"))]
#[doc(hidden)]
pub mod fixtures;

pub use codec::{
    lenenc_int_len, read_lenenc_bytes, read_lenenc_int, write_lenenc_bytes, write_lenenc_int,
    ProtocolError,
};
