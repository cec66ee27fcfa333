//! TLS plaintext that came before its session.
//!
//! # What this room is for
//!
//! A TLS connection open before the copier (a pooled one) gets its session at its first
//! captured packet, which is ciphertext; the probe's ring is read before each capture batch,
//! so the plaintext of that same command is often here first, for a flow with no session yet.
//! Kept a moment, it is handed to the session when it opens (`Engine::open_session`), and
//! the command is mirrored instead of lost.
//!
//! # What it must never do
//!
//! * Hold more than [`MAX_BYTES`], or anything longer than [`MAX_AGE`]: what is dropped is
//!   counted as plaintext of no session (`tls_plain_bytes_unmatched`), never lost silently.
//! * Keep plaintext for a flow that has a session: only the engine's lookup decides.

use std::collections::VecDeque;
use std::time::Duration;

use common::clock::Instant;

use super::FlowKey;

/// Bytes kept at most, all flows together.
const MAX_BYTES: usize = 256 << 10;
/// How long a piece waits for its session: the capture's block timeout and a batch, with room.
const MAX_AGE: Duration = Duration::from_millis(200);

pub(super) struct Orphan {
    at: Instant,
    pub(super) key: FlowKey,
    pub(super) from_client: bool,
    pub(super) offset: u64,
    pub(super) data: Box<[u8]>,
}

#[derive(Default)]
pub(super) struct Orphans {
    q: VecDeque<Orphan>,
    bytes: usize,
}

impl std::fmt::Debug for Orphans {
    // Sizes only: plaintext may hold a login's password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orphans")
            .field("pieces", &self.q.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Orphans {
    /// Keeps a piece; `false` (and nothing kept) when there is no room.
    pub(super) fn keep(
        &mut self,
        now: Instant,
        key: FlowKey,
        from_client: bool,
        offset: u64,
        data: &[u8],
    ) -> bool {
        if self.bytes + data.len() > MAX_BYTES {
            return false;
        }
        self.bytes += data.len();
        self.q.push_back(Orphan {
            at: now,
            key,
            from_client,
            offset,
            data: data.into(),
        });
        true
    }

    /// Drops the pieces older than [`MAX_AGE`]; returns their bytes.
    pub(super) fn expire(&mut self, now: Instant) -> u64 {
        let mut dropped = 0;
        while let Some(o) = self.q.front() {
            if now.saturating_since(o.at) < MAX_AGE {
                break;
            }
            dropped += o.data.len() as u64;
            self.bytes -= o.data.len();
            self.q.pop_front();
        }
        dropped
    }

    pub(super) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The pieces of `key`, in the order they came.
    pub(super) fn take(&mut self, key: FlowKey) -> Vec<Orphan> {
        let mut mine = Vec::new();
        let mut rest = VecDeque::with_capacity(self.q.len());
        for o in self.q.drain(..) {
            if o.key == key {
                self.bytes -= o.data.len();
                mine.push(o);
            } else {
                rest.push_back(o);
            }
        }
        self.q = rest;
        mine
    }
}
