//! The session's one earliest deadline and what each timer does when it fires: RTO, persist
//! probes, delayed ACK, handshake, idle and close limits, capture-gap waits, the transform's.
//!
//! Never early: a deadline fires at or after its time; stale entries are the engine's to skip.

use super::*;

impl Session {
    pub(crate) fn next_deadline(&self, cfg: &EngineConfig) -> Option<Instant> {
        if let Phase::Lingering { until, .. } = self.phase {
            return Some(until);
        }
        // A plain chain of minimums: this runs several times per packet (settle, schedule,
        // poll_transmit), and the iterator over an array of options it replaces cost a tenth
        // of the engine's instructions.
        fn earlier(a: Instant, b: Option<Instant>) -> Instant {
            match b {
                Some(b) if b < a => b,
                _ => a,
            }
        }
        let mut at = self.last_activity + cfg.idle_timeout;
        if self.phase == Phase::SynSent || !self.client_established {
            at = earlier(at, Some(self.created + cfg.handshake_timeout));
        }
        at = earlier(at, self.close_started.map(|t| t + cfg.close_timeout));
        at = earlier(at, self.gap_since.map(|t| t + cfg.capture_gap_timeout));
        if self.gap_since.is_some() {
            at = earlier(at, self.proven_gap_deadline());
        }
        at = earlier(at, self.rto_at);
        at = earlier(at, self.stale_deadline());
        at = earlier(at, self.persist_at);
        at = earlier(at, self.ack_at);
        if self.tls.is_some() {
            at = earlier(at, self.tls_done_at());
        }
        if self.transform.is_some() {
            at = earlier(at, self.transform_deadline());
        }
        Some(at)
    }

    /// The transform's deadline. One left at or before the last run is retried a little
    /// later, not at once: a transform bug must not make the engine (or its driver) spin.
    pub(super) fn transform_deadline(&self) -> Option<Instant> {
        let d = self.transform.as_ref()?.0.next_deadline()?;
        Some(match self.transform_timer_ran {
            Some(ran) if d <= ran => ran + TRANSFORM_RETRY,
            _ => d,
        })
    }

    pub(crate) fn on_timeout(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Outcome {
        if self.is_lingering() {
            return Outcome::Open;
        }
        // A timer is no captured packet: what the last one left here is stale (a gap first
        // suspected now would be dated back to it, and a transform told so).
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if (self.phase == Phase::SynSent || !self.client_established)
            && self.created + cfg.handshake_timeout <= now
        {
            return Outcome::Finished(CloseReason::HandshakeTimeout);
        }
        if self.last_activity + cfg.idle_timeout <= now {
            return Outcome::Finished(CloseReason::IdleTimeout);
        }
        if due(self.close_started.map(|t| t + cfg.close_timeout)) {
            return Outcome::Finished(CloseReason::CloseTimeout);
        }
        if due(self.proven_gap_deadline()) {
            if let Some(reason) = self.settle_gaps(now, None, cfg, stats) {
                return Outcome::Finished(reason);
            }
            if due(self.proven_gap_deadline()) {
                // Still proven and due: nothing could be skipped. Ending the session is the
                // only way that cannot leave a timer in the past for the engine to spin on.
                stats.capture_gaps_fatal += 1;
                stats.capture_gaps_stuck += 1;
                return Outcome::Finished(CloseReason::CaptureGap);
            }
        }
        if due(self.gap_since.map(|t| t + cfg.capture_gap_timeout)) {
            if let Some(reason) = self.gap_timed_out(now, cfg, stats) {
                return Outcome::Finished(reason);
            }
        }
        if due(self.tls_done_at()) {
            if let Outcome::Finished(reason) = self.on_tls_done(now, cfg, stats) {
                return Outcome::Finished(reason);
            }
        }
        if due(self.transform_deadline()) {
            self.transform_timer_ran = Some(now);
            self.call_transform(None, cfg, stats, |t, out| t.on_timeout(now, out));
            if let Some(reason) = self.settle_stream(cfg) {
                return Outcome::Finished(reason);
            }
        }
        if due(self.rto_at) {
            self.rto_at = None;
            if self.snd_una != self.snd_max {
                stats.retransmit_timeouts += 1;
                self.retries += 1;
                if self.retries > cfg.max_retransmits {
                    return Outcome::Finished(CloseReason::TooManyRetransmits);
                }
                self.backoff += 1;
                self.rtt_probe = None;
                match self.phase {
                    Phase::SynSent => self.syn_pending = true,
                    _ => {
                        // Go back: everything unacknowledged is sent again, starting with
                        // the oldest, from one segment and slow start (the loss may be the
                        // test server drowning).
                        let flight = self.snd_max.bytes_since(self.snd_una) as u32;
                        self.ssthresh = (flight / 2).max(2 * self.send_mss);
                        self.cwnd = self.send_mss;
                        self.snd_nxt = self.snd_una;
                        self.recover = None;
                        self.fast_retx_pending = false;
                        self.rto_retx_pending = true;
                        self.dupacks = 0;
                    }
                }
            }
        }
        if due(self.ack_at) {
            // No segment of ours carried it in time: a pure ACK.
            self.ack_at = None;
            self.ack_pending = true;
        }
        if due(self.persist_at) {
            self.persist_at = None;
            self.probes += 1;
            if self.probes > cfg.max_retransmits {
                return Outcome::Finished(CloseReason::TooManyRetransmits);
            }
            self.backoff += 1;
            self.probe_pending = true;
        }
        Outcome::Open
    }

    /// The feedback path is back after an outage (intercept stalled, restarted or away):
    /// whatever this session sent meanwhile was very likely received and acknowledged by the
    /// test server, only the ACKs died with nobody capturing them. Its timers, backed off
    /// through the outage, would leave it silent for as long again (seconds, up to
    /// `max_rto`), so a session waiting on the test server forgets the backoff and the
    /// retries the outage cost it, and sends at once what makes the test server restate its
    /// ACK and window: a probe below `snd_una` (answered with an ACK by any TCP), or its
    /// SYN again. What the test server really lacks is then retransmitted one plain RTO
    /// later. Returns whether the session was waiting.
    pub(crate) fn resync(&mut self, now: Instant, cfg: &EngineConfig) -> bool {
        let waiting = match self.phase {
            Phase::SynSent => self.rto_at.is_some() && self.snd_max != self.iss,
            Phase::Established => self.snd_una != self.snd_max || self.persist_at.is_some(),
            Phase::Lingering { .. } => false,
        };
        if !waiting || self.backoff == 0 {
            return false;
        }
        self.backoff = 0;
        self.retries = 0;
        self.probes = 0;
        self.rtt_probe = None;
        match self.phase {
            Phase::SynSent => {
                self.syn_pending = true;
                self.rto_at = None;
            }
            _ => {
                self.probe_pending = true;
                self.resync_probe = true;
                self.persist_at = None;
                self.rto_at = (self.snd_una != self.snd_max).then(|| now + self.current_rto(cfg));
            }
        }
        true
    }

    /// Arms or disarms the persist timer; called after every change.
    pub(crate) fn refresh_timers(&mut self, now: Instant, cfg: &EngineConfig) {
        if self.phase != Phase::Established {
            self.persist_at = None;
            return;
        }
        if self.snd_una == self.snd_max {
            self.rto_at = None;
            self.rto_retx_pending = false;
        } else if self.rto_at.is_none() {
            // Whatever happened, data in flight always has a retransmission timer.
            self.rto_at = Some(now + self.current_rto(cfg));
        }
        let window_shut = self.snd_una == self.snd_max
            && self.snd_nxt < self.stream_end()
            // Ours, and the limit at most a window (2^30) past `snd_una`: ordered.
            && self.snd_nxt >= self.send_limit();
        if window_shut && !self.probe_pending {
            if self.persist_at.is_none() {
                self.persist_at = Some(now + self.current_rto(cfg));
            }
        } else {
            self.persist_at = None;
        }
    }

    /// Whether `poll_segment` may have something to send (cheap; may say yes spuriously).
    pub(crate) fn may_transmit(&self) -> bool {
        match self.phase {
            Phase::SynSent => self.syn_pending,
            Phase::Established => {
                self.ack_pending
                    || self.fast_retx_pending
                    || self.rto_retx_pending
                    || self.probe_pending
                    || (self.snd_nxt < self.stream_end() && self.snd_nxt < self.send_limit())
            }
            Phase::Lingering { .. } => false,
        }
    }
}
