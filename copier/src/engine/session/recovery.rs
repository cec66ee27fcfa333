//! The parts of a session that fault recovery needs (see `engine/recovery.rs`): whether a closed
//! session may be re-established, and the answer to a test server that still holds an older
//! connection on our 4-tuple.
//!
//! Kept apart from the TCP machinery of `session.rs`; it only reads that state, except that a
//! reset stale connection lets the SYN go out again at once.

use common::control::TestFeedback;
use common::wire::{SegmentRepr, TcpFlags, TcpOptions};

use common::clock::Instant;

use super::{Phase, Session};
use crate::engine::recovery::{lost_test_answers, test_side_loss, Revival};
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
        if !self.client_established || self.client_fin_reached {
            return false;
        }
        // A handshake timeout is a test-side loss only when the test server never answered;
        // otherwise it was the client that never completed its handshake with production.
        reason != CloseReason::HandshakeTimeout || self.phase == Phase::SynSent
    }

    /// Our SYN met an acknowledgment of something else: the test server still has an older
    /// connection on this 4-tuple (the copier was restarted, or our RST for an abandoned session
    /// was lost) and answers the SYN with a challenge ACK (RFC 5961). RFC 793's answer from
    /// SYN-SENT is a RST with the ACK's number, which is exactly in that connection's window and
    /// ends it; our SYN is then repeated at once rather than after a retransmission timeout.
    pub(crate) fn stale_connection_reset(
        &mut self,
        fb: &TestFeedback,
        ttl: u8,
    ) -> Option<SegmentRepr> {
        let f = fb.flags;
        if self.phase != Phase::SynSent || f.rst() || !f.ack() || self.snd_max == self.iss {
            return None;
        }
        if fb.ack == self.iss.wrapping_add(1) {
            return None; // it acknowledges our SYN: the normal path
        }
        let mut r = self.repr(fb.ack, TcpFlags::RST, 0, ttl);
        r.ack = 0;
        r.options = TcpOptions::default();
        self.syn_pending = true;
        Some(r)
    }
}
