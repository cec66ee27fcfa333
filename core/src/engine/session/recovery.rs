//! The parts of a session that fault recovery needs (see `engine/recovery.rs`): whether a closed
//! session may be re-established, and what to do with an older connection the test server
//! still holds on our 4-tuple: drain it, then reset it.
//!
//! Kept apart from the TCP machinery of `session.rs`; it only reads that state, except that a
//! reset stale connection lets the SYN go out again at once.

use common::control::TestFeedback;
use common::seq::SeqNumber;
use common::wire::{SegmentRepr, TcpFlags, TcpOptions};

use std::time::Duration;

use common::clock::Instant;

use super::{Phase, Session};
use crate::engine::recovery::{lost_test_answers, test_side_loss, Revival};
use crate::engine::serial;
use crate::engine::CloseReason;

impl Session {
    /// The waiting record for this session ending at `now` for `reason`, if it is to be
    /// re-established: only a test-side loss while the client is still connected.
    pub(crate) fn revival(&self, reason: CloseReason, now: Instant) -> Option<Revival> {
        let test_side = test_side_loss(reason)
            || (reason == CloseReason::NotMirrorable
                && self.abandoned.is_some_and(lost_test_answers));
        (test_side && self.client_still_connected(reason))
            .then(|| Revival::after(reason, now, self.created, self.revived_after))
    }

    /// Whether this session, ending for `reason` (a test-side loss), leaves a client still
    /// talking to production: it completed its own handshake and has not closed.
    fn client_still_connected(&self, reason: CloseReason) -> bool {
        if !self.client_established || self.client_closed() {
            return false;
        }
        // A handshake timeout is a test-side loss only when the test server never answered;
        // otherwise it was the client that never completed its handshake with production.
        reason != CloseReason::HandshakeTimeout || self.phase == Phase::SynSent
    }

    /// Our SYN met an acknowledgment of something else: the test server still has an older
    /// connection on this 4-tuple (the copier was restarted, or our RST for an abandoned session
    /// was lost) and answers the SYN with a challenge ACK (RFC 5961), or goes on sending that
    /// connection's replies.
    ///
    /// That connection may still hold commands the test server has received and not yet run
    /// (the killed copier's last ones): reset at once, the statement it runs fails on the test
    /// server only (`ER_NET_ERROR_ON_WRITE`, a new error) and the rest never run. So it is
    /// drained first: every segment it sends is acknowledged (the returned ACK, in its own
    /// sequence space: no timestamps, which would be older than its last), and once it has
    /// sent nothing new for [`STALE_QUIET`] (or after [`STALE_MAX`]) it is reset
    /// ([`Session::stale_reset_due`]) and our SYN repeated at once.
    pub(crate) fn stale_feedback(
        &mut self,
        now: Instant,
        fb: &TestFeedback,
        ttl: u8,
    ) -> Option<SegmentRepr> {
        let f = fb.flags;
        if self.phase != Phase::SynSent || f.rst() || !f.ack() || self.snd_max == self.iss {
            return None;
        }
        if fb.ack_number() == self.iss + 1u32 {
            return None; // it acknowledges our SYN: the normal path
        }
        let end = fb.seq_number() + fb.payload_len + u32::from(f.fin());
        let st = self.stale.get_or_insert_with(|| {
            Box::new(Stale {
                their_ack: fb.ack_number(),
                acked: fb.seq_number(),
                active_at: now,
                since: now,
                replies: 0,
            })
        });
        st.their_ack = fb.ack_number();
        // The older connection's numbers are unchecked: one 2^31 on counts as new, as
        // `seq::gt` said.
        if serial::behind(st.acked, end) {
            st.acked = end;
            st.active_at = now;
            st.replies += 1;
        }
        let (their_ack, acked) = (st.their_ack, st.acked);
        let mut r = self.repr(their_ack, 0, 0, ttl);
        r.flags = TcpFlags(TcpFlags::ACK);
        r.ack = acked;
        r.options = TcpOptions::default();
        Some(r)
    }

    /// When the older connection being drained is to be reset.
    pub(crate) fn stale_deadline(&self) -> Option<Instant> {
        self.stale
            .as_ref()
            .map(|st| (st.active_at + STALE_QUIET).min(st.since + STALE_MAX))
    }

    /// At [`Session::stale_deadline`]: the RST that ends the older connection (RFC 793: the
    /// sequence number its last segment acknowledged, exactly in its window), with the
    /// replies it sent while drained; our SYN then goes out again at once.
    pub(crate) fn stale_reset_due(&mut self, now: Instant, ttl: u8) -> Option<(SegmentRepr, u64)> {
        if self.stale_deadline()? > now {
            return None;
        }
        let st = self.stale.take()?;
        let mut r = self.repr(st.their_ack, TcpFlags::RST, 0, ttl);
        r.ack = SeqNumber(0);
        r.options = TcpOptions::default();
        self.syn_pending = true;
        Some((r, st.replies))
    }

    /// Whether an older connection on our 4-tuple is being drained: what intercept frames
    /// meanwhile are its replies, not ours.
    pub(crate) fn draining_stale(&self) -> bool {
        self.stale.is_some()
    }
}

/// How long an older connection being drained may send nothing new before it is reset: the
/// test server runs its remaining commands back to back, each answered at once, but a busy
/// one may leave a thread without a CPU for tens of milliseconds.
pub(crate) const STALE_QUIET: Duration = Duration::from_millis(150);
/// The longest an older connection is drained: past it, what it still holds is lost.
pub(crate) const STALE_MAX: Duration = Duration::from_secs(2);

/// An older connection the test server holds on our 4-tuple, being drained.
#[derive(Debug)]
pub(crate) struct Stale {
    /// Its receive point (what its segments acknowledge): our RST's sequence number.
    their_ack: SeqNumber,
    /// How far into its stream we have acknowledged.
    acked: SeqNumber,
    /// When it last sent something new, and when it was first seen.
    active_at: Instant,
    since: Instant,
    /// Segments with new data (or FIN) it sent while drained.
    replies: u64,
}

/// Client bytes kept for a session waiting to be re-established (see `Session::held`): one
/// contiguous run of the client's stream, from the first packet captured after its test-side
/// connection was lost. Bounded by the caller (`room`).
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The client sequence number of `bytes[0]`.
    start: SeqNumber,
    bytes: Vec<u8>,
}

impl Held {
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    fn end(&self) -> SeqNumber {
        self.start + self.bytes.len()
    }

    /// Keeps what `payload` at `seq` adds to the run, if at most `room` more bytes fit.
    /// Returns the bytes lost: held ones dropped for a hole (the capture missed client
    /// bytes, so the run cannot go on; it starts again at this packet), or everything when
    /// the packet does not fit (a replay must be contiguous). Repeats are trimmed.
    pub(crate) fn push(&mut self, seq: SeqNumber, payload: &[u8], room: usize) -> usize {
        let mut lost = 0;
        // A captured `seq` may lie 2^31 from the run's end: taken as a repeat (its bytes
        // trimmed away) as the old `seq::lt` did, never appended.
        let new = if self.bytes.is_empty() {
            self.start = seq;
            payload
        } else if serial::behind(seq, self.end()) {
            let skip = self.end().bytes_since(seq);
            payload.get(skip..).unwrap_or(&[])
        } else if seq > self.end() {
            lost += self.bytes.len();
            self.bytes.clear();
            self.start = seq;
            payload
        } else {
            payload
        };
        if new.len() > room {
            lost += self.bytes.len() + new.len();
            self.bytes = Vec::new();
            return lost;
        }
        self.bytes.extend_from_slice(new);
        lost
    }

    /// The run joined with a packet that continues it (or overlaps its end): the client
    /// stream from the run's start to the packet's end, as one payload. When the packet does
    /// not continue the run (a hole between), the run's length: lost, the packet goes alone.
    pub(crate) fn joined(
        self,
        seq: SeqNumber,
        payload: &[u8],
    ) -> Result<(SeqNumber, Vec<u8>), usize> {
        if self.bytes.is_empty() {
            return Ok((seq, payload.to_vec()));
        }
        // A captured `seq` 2^31 from the run's end is a hole, as the old `seq::gt` said.
        if serial::behind(self.end(), seq) {
            return Err(self.bytes.len());
        }
        let start = self.start;
        let skip = self.end().bytes_since(seq);
        let mut bytes = self.bytes;
        bytes.extend_from_slice(payload.get(skip..).unwrap_or(&[]));
        Ok((start, bytes))
    }

    /// A run that starts at `start`.
    pub(crate) fn from_stream(start: SeqNumber, bytes: Vec<u8>) -> Self {
        Self { start, bytes }
    }

    pub(crate) fn starts_at(&self, seq: SeqNumber) -> bool {
        self.start == seq
    }

    /// Where the run starts, and its bytes.
    pub(crate) fn into_parts(self) -> (SeqNumber, Vec<u8>) {
        (self.start, self.bytes)
    }

    #[cfg(test)]
    pub(crate) fn parts(&self) -> (SeqNumber, &[u8]) {
        (self.start, &self.bytes)
    }
}

impl Session {
    /// Whether client bytes captured now are to be held: the session waits to be
    /// re-established, or re-establishes one and has not reached the test server yet (its
    /// SYN may still be refused, and then the next attempt replays them all).
    pub(crate) fn holds_client_bytes(&self) -> bool {
        match self.phase {
            Phase::Lingering { .. } => self.revival.is_some(),
            Phase::SynSent => self.held().is_some(),
            Phase::Established => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Held;
    use common::seq::SeqNumber;

    #[test]
    fn a_run_trims_repeats_restarts_after_a_hole_and_keeps_its_bound() {
        let mut h = Held::default();
        assert_eq!(h.push(SeqNumber(u32::MAX - 1), b"abcd", 100), 0); // across the wrap
        assert_eq!(h.push(SeqNumber(u32::MAX - 1), b"abcdef", 100), 0); // a repeat, longer
        assert_eq!(h.len(), 6);
        assert_eq!(h.push(SeqNumber(4), b"g", 100), 0);
        assert_eq!(
            h.push(SeqNumber(10), b"xyz", 100),
            7,
            "a hole: the run starts again"
        );
        assert_eq!(
            h.push(SeqNumber(13), b"12345", 4),
            8,
            "over the bound: all of it is lost"
        );
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn a_continuing_packet_joins_the_run_and_a_later_one_does_not() {
        let mut h = Held::default();
        h.push(SeqNumber(100), b"abc", 100);
        assert_eq!(
            Held::from_stream(SeqNumber(100), b"abc".to_vec()).joined(SeqNumber(102), b"cde"),
            Ok((SeqNumber(100), b"abcde".to_vec()))
        );
        assert_eq!(h.joined(SeqNumber(104), b"x"), Err(3));
        assert_eq!(
            Held::default().joined(SeqNumber(7), b"q"),
            Ok((SeqNumber(7), b"q".to_vec()))
        );
    }
}
