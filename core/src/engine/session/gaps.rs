//! Capture gaps: bytes production received (or the client received) that the capture lost.
//! Proven by the other side's ACKs or a timeout, then gone past at a point the transform
//! accepts as the start of a command, or the session ends as a capture gap.
//!
//! Never guesses a boundary: a stream without framing cannot go on past a gap.

use super::*;

impl Session {
    /// A capture gap costs the commands in it, not the session. Once production's own stream
    /// proves bytes were lost for good, the session goes on from the next client segment that
    /// starts a command (client side), or tells the transform its view of production's replies
    /// has a hole (production side). The proof, client side: production acknowledged the
    /// whole hole, so it has those bytes and the client will never send them again (the
    /// capture sees a client segment before production's ACK of it). Production side: the
    /// client acknowledged them. A hole without proof is only suspected (`update_gap`) and
    /// given `capture_gap_timeout` to heal. A session whose transform cannot go on (no
    /// framing; a login or a command cut in two) ends as `CaptureGap`.
    pub(super) fn settle_gaps(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<CloseReason> {
        if self.tls_switched() {
            // The captured stream is ciphertext: its holes are not the plaintext's
            // (`plaintext.rs` sees those by the probe's offsets).
            self.gap_since = None;
            return None;
        }
        if self.gap_since.is_some_and(|t| now >= t + PROVEN_GAP_GRACE) || self.prod_held_too_long()
        {
            // Each skip goes past one hole, and bytes held beyond it may end at another that
            // production's ACKs prove too: a few rounds, each moving the stream on.
            for _ in 0..GAP_ROUNDS {
                let client = self.client_gap_proven();
                let prod = self.prod_gap_proven();
                if client.is_none() && prod.is_none() {
                    break;
                }
                if let Some(to) = client {
                    if let Some(r) = self.skip_client_gap(now, captured, cfg, stats, to) {
                        return Some(r);
                    }
                }
                if let Some(to) = prod {
                    if let Some(r) = self.skip_prod_gap(now, captured, cfg, stats, to) {
                        return Some(r);
                    }
                }
            }
        }
        self.update_gap(now, captured, stats);
        None
    }

    /// When a suspected gap that is proven will be gone past.
    pub(super) fn proven_gap_deadline(&self) -> Option<Instant> {
        let since = self.gap_since?;
        (self.client_gap_proven().is_some() || self.prod_gap_proven().is_some())
            .then(|| since + PROVEN_GAP_GRACE)
    }

    /// Where the client stream goes on after a hole production proved lost, if it did.
    pub(super) fn client_gap_proven(&self) -> Option<SeqNumber> {
        let ack = self.prod_ack?;
        if self.floating_start && self.reasm.pristine() {
            return None;
        }
        let end = self.reasm.end();
        // The 2^30 bound rules out the pair 2^31 apart, where `>` and `seq::gt` differ.
        if !(ack > end && ack.bytes_since(end) < 1 << 30) {
            return None;
        }
        // A held run starts less than 2^30 past `end` (the reassembly's limit), and `ack`
        // lies less than 2^30 past it: never 2^31 apart.
        match self.reasm.first_held_run() {
            Some((held, _)) => (ack >= held).then_some(held),
            None => Some(ack),
        }
    }

    /// Production's bytes held behind a hole in its stream beyond [`PROD_HOLD_LIMIT`]: the
    /// capture saw production send what follows the hole, and a hole the network made would
    /// have been sent again by now (production retransmits within its RTO, far less than the
    /// time that many bytes take). The hole is the capture's: its replies are given up.
    pub(super) fn prod_held_too_long(&self) -> bool {
        self.prod_reasm
            .as_ref()
            .is_some_and(|r| r.held_len() > PROD_HOLD_LIMIT)
    }

    pub(super) fn prod_gap_proven(&self) -> Option<SeqNumber> {
        let r = self.prod_reasm.as_ref()?;
        if self.prod_held_too_long() {
            // The client's ACKs that would prove it may come far later in the capture (a
            // copier catching up on its ring meets production's bursts first).
            return r.first_held_run().map(|(held, _)| held);
        }
        let ack = self.client_ack?;
        let end = r.end();
        // As in `client_gap_proven`: both bounds keep the pair 2^31 apart out.
        if !(ack > end && ack.bytes_since(end) < 1 << 30) {
            return None;
        }
        match r.first_held_run() {
            Some((held, _)) => (ack >= held).then_some(held),
            None => Some(ack),
        }
    }

    /// Gives up the client bytes up to `to`, if the transform can go on after them.
    pub(super) fn skip_client_gap(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        to: SeqNumber,
    ) -> Option<CloseReason> {
        if !self.resync_client {
            if !self.transform_goes_on(captured, cfg, stats, |t, out| t.on_client_gap(now, out)) {
                return Some(CloseReason::CaptureGap);
            }
            stats.capture_gaps_skipped += 1;
            self.resync_client = true;
        }
        stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(to));
        self.resume_client(now, captured, cfg, stats);
        self.settle_stream(cfg)
    }

    /// Asks the transform whether it can go on after a gap (`ask`); a session without one, or
    /// whose transform cannot, counts a fatal gap.
    pub(super) fn transform_goes_on(
        &mut self,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        ask: impl FnOnce(&mut dyn StreamTransform, &mut TransformOutput<'_>) -> bool,
    ) -> bool {
        let mut can = false;
        self.call_transform(captured, cfg, stats, |t, out| can = ask(t, out));
        if !can {
            stats.capture_gaps_fatal += 1;
        }
        can
    }

    /// While resynchronising: the first held run that starts a command goes on; the runs
    /// before it are given up.
    pub(super) fn resume_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) {
        while self.resync_client {
            let Some((at, len)) = self.reasm.first_held_run() else {
                return;
            };
            stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(at));
            let mut head = [0u8; 16];
            let n = self.reasm.first_held_prefix(&mut head);
            if self.starts_command(&head[..n]) {
                self.resync_client = false;
                self.feed_client(now, captured, cfg, stats, |reasm, deliver| {
                    reasm.flush(deliver)
                });
            } else {
                stats.capture_gap_segments_skipped += 1;
                stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(at + len));
            }
        }
    }

    pub(super) fn starts_command(&self, head: &[u8]) -> bool {
        self.transform
            .as_ref()
            .is_some_and(|t| t.0.starts_command(head))
    }

    /// A segment captured while resynchronising with nothing held: whether it goes into the
    /// reassembly. One that starts a command does, and the stream goes on at its start; any
    /// other is given up whole (it starts inside a command, so nothing in it can be framed).
    pub(super) fn resync_at(
        &mut self,
        stats: &mut EngineStats,
        start: SeqNumber,
        payload: &[u8],
    ) -> bool {
        let next = self.reasm.next();
        let end = start + payload.len();
        // A captured segment may lie 2^31 from `next`: it keeps the old answers (`end` not
        // after `next`, `start` at or after it), so it is skipped whole, as before.
        if !payload.is_empty() && !serial::behind(next, end) {
            return true; // all behind: a duplicate, counted as such
        }
        if serial::not_ahead(next, start) && (payload.is_empty() || self.starts_command(payload)) {
            stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(start));
            self.resync_client = false;
            return true;
        }
        stats.capture_gap_segments_skipped += 1;
        stats.capture_gap_bytes_lost += u64::from(self.reasm.skip_to(end));
        false
    }

    pub(super) fn skip_prod_gap(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        to: SeqNumber,
    ) -> Option<CloseReason> {
        if !self.transform_goes_on(captured, cfg, stats, |t, out| t.on_prod_gap(now, out)) {
            return Some(CloseReason::CaptureGap);
        }
        stats.prod_gaps_skipped += 1;
        self.feed_prod(now, captured, cfg, stats, |reasm, deliver| {
            reasm.skip_to(to);
            reasm.flush(deliver);
        });
        self.settle_stream(cfg)
    }

    /// A suspected gap that did not heal within `capture_gap_timeout`: its bytes are taken as
    /// lost (the client would have retransmitted them by now) and skipped like a proven gap.
    pub(super) fn gap_timed_out(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<CloseReason> {
        self.gap_since = None;
        if let Some((at, _)) = self.reasm.first_held_run() {
            if let Some(r) = self.skip_client_gap(now, None, cfg, stats, at) {
                return Some(r);
            }
        }
        let prod_to = self.prod_reasm.as_ref().and_then(|r| {
            r.first_held_run().map(|(at, _)| at).or(self
                .client_ack
                .filter(|&a| a > r.end() && a.bytes_since(r.end()) < 1 << 30))
        });
        if let Some(to) = prod_to {
            if let Some(r) = self.skip_prod_gap(now, None, cfg, stats, to) {
                return Some(r);
            }
        }
        // Production acknowledged bytes never captured, and nothing came after them.
        if let Some(to) = self.client_gap_proven() {
            if let Some(r) = self.skip_client_gap(now, None, cfg, stats, to) {
                return Some(r);
            }
        }
        self.update_gap(now, None, stats);
        None
    }

    /// A gap exists while client bytes are held beyond a hole, or production acknowledged
    /// client bytes we never captured; and, when a transform reads production's replies, the
    /// same in that direction (the transform would silently miss a reply).
    pub(super) fn update_gap(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        stats: &mut EngineStats,
    ) {
        let end = self.reasm.end();
        // While a pickup from a pure ACK has not seen its first byte, production being ahead
        // proves nothing: that ACK may have been a keepalive probe (seq = next - 1).
        let unsure_start = self.floating_start && self.reasm.pristine();
        let prod_ahead = !unsure_start
            && self
                .prod_ack
                .is_some_and(|a| a > end && a.bytes_since(end) < 1 << 30);
        let prod_gap = self.prod_reasm.as_ref().is_some_and(|r| {
            let end = r.end();
            r.has_held()
                || self
                    .client_ack
                    .is_some_and(|a| a > end && a.bytes_since(end) < 1 << 30)
        });
        if self.reasm.has_held() || prod_ahead || prod_gap {
            if self.gap_since.is_none() {
                // Dated by the capture when it says: a copier catching up on a backlog of
                // its ring handles a second of traffic in a fraction of one, and a gap must
                // not hold that second beyond its hole waiting out a grace measured in the
                // copier's own time (three sessions of eight were shed for memory so).
                self.gap_since = Some(captured.map_or(now, |c| c.min(now)));
                stats.capture_gaps_suspected += 1;
            }
        } else {
            self.gap_since = None;
        }
    }
}
