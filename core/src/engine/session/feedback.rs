//! The test server's segments, as intercept relays their headers: the handshake, ACKs of our
//! stream (RTT, congestion, fast retransmit), its window, its data (which we acknowledge and
//! let die), its FIN and RST.
//!
//! Never acknowledges past a hole in the test server's stream: lost feedback must make it
//! retransmit, not skip bytes.

use super::*;

impl Session {
    pub(crate) fn on_feedback(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let was_established = self.phase == Phase::Established;
        let rcv_before = self.rcv_nxt;
        let out = match self.phase {
            Phase::SynSent => self.feedback_syn_sent(now, cfg, stats, fb),
            Phase::Established => self.feedback_established(now, cfg, stats, fb),
            Phase::Lingering { .. } => Outcome::Open,
        };
        if self.transform.is_none() || matches!(out, Outcome::Finished(_)) {
            return out;
        }
        // The TCP view above decides what is new: the transform must not take a duplicate
        // greeting for a second one.
        let in_order = was_established
            && fb.payload_len > 0
            && fb.seq_number() == rcv_before
            // One segment moves `rcv_nxt` on by at most our window (2^23), never 2^31.
            && self.rcv_nxt > rcv_before;
        let ev = TestEvent::Segment(TestSegment::new(fb, in_order));
        self.call_transform(None, cfg, stats, |t, o| t.on_test_event(now, &ev, o));
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    pub(super) fn feedback_syn_sent(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let f = fb.flags;
        let syn_acked = f.ack() && fb.ack_number() == self.iss + 1u32 && self.snd_max != self.iss;
        if f.rst() {
            if syn_acked {
                return Outcome::Finished(CloseReason::TestRefused);
            }
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if !(f.syn() && syn_acked) {
            // A hostile ACK 2^31 from `snd_max` is counted as beyond, as `seq::gt` did.
            if f.ack() && serial::behind(self.snd_max, fb.ack_number()) {
                stats.feedback_ack_beyond_sent += 1;
            } else {
                stats.feedback_stale += 1;
            }
            return Outcome::Open;
        }
        self.last_activity = now;
        self.phase = Phase::Established;
        self.irs = fb.seq_number();
        self.rcv_nxt = self.irs + 1u32;
        self.snd_una = self.iss + 1u32;
        self.snd_nxt = self.snd_una;
        // Ours, at most one apart (see the fields' comment).
        self.snd_max = self.snd_max.max(self.snd_una);
        if let Some((sent_ack, at)) = self.rtt_probe.take() {
            if sent_ack == self.snd_una {
                self.rtt.sample(now - at, cfg.min_rto, cfg.max_rto);
            }
        }
        self.rto_at = None;
        self.retries = 0;
        self.backoff = 0;
        let peer_mss = fb.options.mss.unwrap_or(DEFAULT_MSS).max(MIN_MSS);
        let mut mss = peer_mss.min(cfg.mss);
        // Window scaling is on only if both SYNs carried the option.
        if let (true, Some(ws)) = (self.offer_wscale, fb.options.window_scale) {
            self.snd_wscale = ws.min(MAX_WSCALE);
            self.rcv_wscale = OUR_WSCALE;
        }
        if let (true, Some((val, _))) = (self.ts_offer, fb.options.timestamps) {
            self.ts_on = true;
            self.ts_recent = val;
            mss -= TS_OPTION_LEN;
        }
        self.send_mss = u32::from(mss);
        // The window in a SYN is never scaled.
        self.snd_wnd = u32::from(fb.window);
        self.snd_wl1 = fb.seq_number();
        self.snd_wl2 = fb.ack_number();
        self.ack_pending = true;
        Outcome::Open
    }

    pub(super) fn feedback_established(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) -> Outcome {
        let f = fb.flags;
        // Untrusted input: a payload can never exceed an IP packet; a bigger claim would let
        // one message jump rcv_nxt arbitrarily.
        if fb.payload_len > u32::from(u16::MAX) {
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if f.rst() {
            let off = fb.seq_number().bytes_since(self.rcv_nxt);
            if off < self.rcv_window() as usize {
                return Outcome::Finished(CloseReason::TestReset);
            }
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        if f.syn() {
            // A repeated SYN-ACK means our ACK of it was lost; anything else is answered the
            // way RFC 5961 answers an unexpected SYN: with an ACK.
            if fb.seq_number() != self.irs {
                stats.feedback_stale += 1;
            }
            self.ack_pending = true;
            return Outcome::Open;
        }
        if !f.ack() {
            stats.feedback_stale += 1;
            return Outcome::Open;
        }
        // A hostile ACK 2^31 from `snd_max` is beyond, as `seq::gt` said. Past this test the
        // ACK lies less than 2^31 behind `snd_max`, so never 2^31 from `snd_una` either (the
        // flight between them is far smaller): `process_ack` compares it with `SeqNumber`'s.
        if serial::behind(self.snd_max, fb.ack_number()) {
            stats.feedback_ack_beyond_sent += 1;
            self.ack_pending = true;
            return Outcome::Open;
        }
        self.last_activity = now;
        self.probes = 0;
        if let (true, Some((val, _))) = (self.ts_on, fb.options.timestamps) {
            if serial::ts_after(val, self.ts_recent) {
                self.ts_recent = val;
            }
        }
        self.process_ack(now, cfg, stats, fb);
        self.process_test_segment(now, cfg, stats, fb);
        Outcome::Open
    }

    pub(super) fn process_ack(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) {
        let ack = fb.ack_number();
        // `ack` is not beyond `snd_max` (`feedback_established`), nor 2^31 from `snd_una`,
        // and every test below against our numbers is between ordered pairs.
        if ack < self.snd_una {
            return; // old duplicate: ignore for sending purposes
        }
        let new_wnd = u32::from(fb.window) << self.snd_wscale;
        let wnd_changed = new_wnd != self.snd_wnd;
        // RFC 793 window update rule: only a segment at least as new as the last one that
        // updated the window may change it, so reordered feedback cannot shrink it.
        // The test server's seq is unchecked here and `snd_wl2` may be old: both keep the old
        // answers for a pair 2^31 apart.
        let seq = fb.seq_number();
        if serial::behind(self.snd_wl1, seq)
            || (self.snd_wl1 == seq && serial::not_ahead(self.snd_wl2, ack))
        {
            if self.snd_wnd == 0 && new_wnd > 0 {
                // The window reopened: the persist backoff says nothing about the path.
                self.backoff = 0;
            }
            self.snd_wnd = new_wnd;
            self.snd_wl1 = seq;
            self.snd_wl2 = ack;
        }
        if ack == self.snd_una {
            let dup = fb.payload_len == 0
                && !fb.flags.fin()
                && self.snd_max != self.snd_una
                && !wnd_changed;
            if dup {
                self.dupacks += 1;
                if self.dupacks == 3 && self.recover.is_none() {
                    stats.fast_retransmits += 1;
                    self.fast_retx_pending = true;
                    self.recover = Some(self.snd_max);
                    self.rtt_probe = None;
                }
            }
            return;
        }
        // New data acknowledged.
        let acked = ack.bytes_since(self.snd_una) as u32;
        let data_acked = if ack > self.data_end() {
            self.data_end().bytes_since(self.buf_seq)
        } else {
            ack.bytes_since(self.buf_seq)
        };
        self.send_buf.drain(..data_acked.min(self.send_buf.len()));
        if self.send_buf.is_empty() && self.send_buf.capacity() > SHRINK_ABOVE {
            // One burst (LOAD DATA, a big blob) must not pin megabytes for the session's life.
            self.send_buf.shrink_to(SHRINK_ABOVE / 4);
        }
        self.buf_seq += data_acked;
        self.snd_una = ack;
        if self.snd_nxt < ack {
            self.snd_nxt = ack;
        }
        if let Some((probe_ack, at)) = self.rtt_probe {
            if ack >= probe_ack {
                self.rtt.sample(now - at, cfg.min_rto, cfg.max_rto);
                self.rtt_probe = None;
            }
        }
        self.backoff = 0;
        self.retries = 0;
        self.dupacks = 0;
        if let Some(r) = self.recover {
            if ack < r {
                // NewReno partial ACK: the next hole is lost too.
                self.fast_retx_pending = true;
            } else {
                self.recover = None;
            }
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked.min(self.send_mss));
            if self.cwnd >= self.ssthresh {
                self.cwnd = u32::MAX;
            }
        }
        self.rto_at = (self.snd_una != self.snd_max).then(|| now + self.current_rto(cfg));
    }

    pub(super) fn process_test_segment(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        fb: &TestFeedback,
    ) {
        let fin = fb.flags.fin();
        let seg_len = fb.payload_len + u32::from(fin);
        if seg_len == 0 {
            // A keepalive probe (seq = rcv_nxt - 1) wants an ACK; other pure ACKs do not.
            if fb.seq_number() == self.rcv_nxt - 1u32 {
                self.ack_pending = true;
            }
            return;
        }
        // Everything but the plain in-order case below is acknowledged at once: a repeat
        // says our ACK was lost, a segment past a hole asks for the hole (duplicate ACK).
        let owed = self.ack_pending;
        self.ack_pending = true;
        let end = fb.seq_number() + seg_len;
        let wnd = self.rcv_window();
        // Unchecked: an `end` 2^31 from `rcv_nxt` is a repeat, as `seq::le` said.
        if serial::not_ahead(end, self.rcv_nxt) {
            stats.feedback_test_retransmits += 1;
            return;
        }
        if end.bytes_since(self.rcv_nxt) > wnd as usize {
            stats.feedback_stale += 1;
            return;
        }
        if fin && self.test_fin_at.is_none() {
            self.test_fin_at = Some(end - 1u32);
        }
        // `end` is now within a window past `rcv_nxt` and the segment shorter than 64 KiB:
        // its start is never 2^31 from `rcv_nxt`.
        if fb.seq_number() <= self.rcv_nxt {
            // In order. It may wait for a delayed ACK unless it is the second unacknowledged
            // one, closes the stream, fills a hole (the test server is waiting to learn),
            // or we are closing ourselves (the last ACKs must not hang on a timer).
            let plain = !fin
                && self.test_ooo.is_empty()
                && !self.fin_queued()
                && self.close_started.is_none();
            if plain && !cfg.delayed_ack.is_zero() && self.unacked_segs == 0 {
                self.ack_pending = owed;
                self.unacked_segs = 1;
                self.ack_at.get_or_insert(now + cfg.delayed_ack);
            }
            let advance = end.bytes_since(self.rcv_nxt) as u32;
            self.rcv_nxt = end;
            self.test_ooo.shift(advance);
            while let Some((0, run)) = self.test_ooo.first() {
                self.rcv_nxt += run;
                self.test_ooo.shift(run);
            }
        } else {
            // We never see the test server's bytes, only that it sent them; acknowledging past
            // a hole would tell it the hole arrived and intercept would never see those bytes.
            // So remember the range, send a duplicate ACK, and let it retransmit the hole.
            stats.feedback_out_of_order += 1;
            let rel = fb.seq_number().bytes_since(self.rcv_nxt) as u32;
            self.test_ooo.insert(rel, rel + seg_len);
        }
        if let Some(f) = self.test_fin_at {
            // Nothing the test server sends lies beyond its FIN.
            // Both within a window of each other (the FIN was taken inside one).
            if self.rcv_nxt > f + 1u32 {
                self.rcv_nxt = f + 1u32;
            }
        }
        if self.test_fin_received() {
            self.close_started.get_or_insert(now);
        }
    }
}
