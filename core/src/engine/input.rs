//! The engine's input: captured packets (judged by `--sample`, then routed to their session
//! or opening one), the test server's segments and other relayed knowledge, and the resync
//! after a feedback outage.
//!
//! Never trusts what comes in: a packet of no session, of the target itself or of an unknown
//! flow is counted and dropped, never acted on.

use super::*;

impl Engine {
    /// A captured packet, with the time it was captured (on the engine's clock; it may be a
    /// little after `now` when `now` was read before a batch was drained): transforms see it
    /// as [`TransformOutput::captured_at`] while its bytes are delivered. The engine itself
    /// keeps using `now`. Otherwise as [`Engine::on_captured`].
    pub fn on_captured_at(&mut self, now: Instant, captured: Instant, pkt: &TcpPacket<'_>) {
        self.on_captured_inner(now, Some(captured), pkt);
    }

    /// A captured packet (either direction of the production port; others are counted and
    /// ignored).
    pub fn on_captured(&mut self, now: Instant, pkt: &TcpPacket<'_>) {
        self.on_captured_inner(now, None, pkt);
    }

    pub(super) fn on_captured_inner(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        pkt: &TcpPacket<'_>,
    ) {
        let verdict = match &mut self.sampler {
            Some(s) => s.judge(now, pkt),
            None => Verdict::IN,
        };
        self.on_judged(now, captured, pkt, verdict);
    }

    /// A captured packet and `--sample`'s verdict on it (judged here, or once per route by a
    /// [`Fleet`] for all its copies). Left-out packets are dropped before any lookup, so they
    /// never create session state.
    pub(super) fn on_judged(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        pkt: &TcpPacket<'_>,
        verdict: Verdict,
    ) {
        let t = self.cfg.target;
        if (pkt.dst == *t.ip() && pkt.dst_port == t.port())
            || (pkt.src == *t.ip() && pkt.src_port == t.port())
        {
            self.stats.captured_target += 1;
            return;
        }
        let client_side = pkt.dst_port == self.cfg.prod_port;
        if client_side {
            self.stats.captured_client_to_prod += 1;
        } else if pkt.src_port == self.cfg.prod_port {
            self.stats.captured_prod_to_client += 1;
        } else {
            self.stats.captured_ignored += 1;
            return;
        }
        self.stats.sample_fallbacks += u64::from(verdict.fallback);
        if !verdict.admit {
            self.stats.packets_not_sampled += 1;
            // Once per connection: a repeated SYN gets the remembered verdict, not a new one.
            self.stats.sessions_not_sampled += u64::from(verdict.new_left_out);
            return;
        }
        if client_side {
            self.on_client_packet(now, captured, pkt);
        } else {
            self.on_prod_packet(now, captured, pkt);
        }
    }

    pub(super) fn on_client_packet(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        pkt: &TcpPacket<'_>,
    ) {
        let f = pkt.flags;
        let key = FlowKey {
            client: SocketAddrV4::new(pkt.src, pkt.src_port),
            prod_ip: pkt.dst,
        };
        let is_syn = f.syn() && !f.ack() && !f.rst();
        if f.syn() && !is_syn {
            // A SYN-ACK or SYN+RST toward the production port is no client's.
            self.stats.captured_unknown_session += 1;
            return;
        }
        if let Some(id) = self.by_flow.get(&key).copied() {
            let Some(s) = slot_session(&mut self.slots, id) else {
                return;
            };
            let new_isn = is_syn && pkt.seq != s.client_isn;
            if s.is_lingering() {
                if new_isn {
                    self.release(id);
                    self.open_session(now, captured, pkt, Start::Syn);
                } else if self.try_reestablish(now, captured, id, pkt) {
                    // A new session took the packet through the pickup path.
                } else if let Some(s) = slot_session(&mut self.slots, id) {
                    s.touch_lingering(now, &self.cfg);
                    self.stats.captured_stale += 1;
                    self.hold(id, pkt);
                    self.schedule(id);
                }
                return;
            }
            self.hold(id, pkt);
            let Some(s) = slot_session(&mut self.slots, id) else {
                return;
            };
            if new_isn {
                // The client reused the 4-tuple: the old connection is over whatever we saw.
                self.finish(id, now, CloseReason::Reused);
                self.release(id);
                self.open_session(now, captured, pkt, Start::Syn);
                return;
            }
            if is_syn {
                self.stats.client_syn_retransmits += 1;
            }
            let marks = pure_ack(pkt).then(|| s.ack_marks()).flatten();
            let out = s.on_client(now, captured, &self.cfg, &mut self.stats, pkt);
            if quiet(marks, &out, s) {
                return;
            }
            self.settle(id, now, out);
            return;
        }
        if is_syn {
            self.open_session(now, captured, pkt, Start::Syn);
        } else if f.fin() || f.rst() || !self.cfg.pickup_midstream {
            self.stats.captured_unknown_session += 1;
        } else {
            self.open_session(now, captured, pkt, Start::Pickup);
        }
    }

    pub(super) fn on_prod_packet(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        pkt: &TcpPacket<'_>,
    ) {
        let key = FlowKey {
            client: SocketAddrV4::new(pkt.dst, pkt.dst_port),
            prod_ip: pkt.src,
        };
        let Some(id) = self.by_flow.get(&key).copied() else {
            self.stats.captured_prod_unknown_session += 1;
            return;
        };
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if s.is_lingering() {
            self.stats.captured_stale += 1;
            return;
        }
        let marks = pure_ack(pkt).then(|| s.ack_marks()).flatten();
        let out = s.on_prod(now, captured, &self.cfg, &mut self.stats, pkt);
        if quiet(marks, &out, s) {
            return;
        }
        self.settle(id, now, out);
    }

    /// A piece of a TLS session's plaintext (see [`Plaintext`]). Plaintext of no session this
    /// engine mirrors is counted (`tls_plain_bytes_unmatched`) and dropped.
    pub fn on_plaintext(&mut self, now: Instant, p: &Plaintext<'_>) {
        let key = FlowKey {
            client: p.client,
            prod_ip: *p.server.ip(),
        };
        let unmatched = |st: &mut EngineStats| st.tls_plain_bytes_unmatched += p.data.len() as u64;
        if p.server.port() != self.cfg.prod_port {
            unmatched(&mut self.stats);
            return;
        }
        let Some(id) = self.by_flow.get(&key).copied() else {
            // A connection open before us: its session may open at its next captured packet.
            self.stats.tls_plain_bytes_unmatched += self.orphans.expire(now);
            if !(self.cfg.pickup_midstream
                && self.orphans.keep(now, key, p.from_client, p.offset, p.data))
            {
                unmatched(&mut self.stats);
            }
            return;
        };
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if s.is_lingering() {
            unmatched(&mut self.stats);
            return;
        }
        let at = PlainAt {
            from_client: p.from_client,
            offset: p.offset,
        };
        let out = s.on_plaintext(now, &self.cfg, &mut self.stats, at, p.data);
        self.settle(id, now, out);
    }

    /// A test-server segment relayed by intercept.
    pub fn on_feedback(&mut self, now: Instant, fb: &TestFeedback) {
        self.stats.feedback_received += 1;
        let resumed = self
            .last_feedback
            .is_some_and(|t| now.saturating_since(t) >= FEEDBACK_SILENCE);
        self.last_feedback = Some(now);
        self.feedback_one(now, fb);
        if resumed {
            // After this one is applied: its ACK may already have settled its own session.
            self.resync(now);
        }
    }

    /// The feedback path is back after an outage: every session still waiting on the test
    /// server is resynced at once (see `Session::resync`) instead of on its backed-off
    /// timer. Called by `on_feedback` after a silence; an edge that knows more (the control
    /// channel was re-established) may call it too. Cheap when nothing waits.
    pub fn resync(&mut self, now: Instant) {
        self.stats.feedback_resumed += 1;
        for idx in 0..self.slots.len() {
            let slot = &mut self.slots[idx];
            let id = SessionId {
                idx: idx as u32,
                gen: slot.gen,
            };
            let Some(s) = slot.session.as_mut() else {
                continue;
            };
            if s.resync(now, &self.cfg) {
                self.stats.sessions_resynced += 1;
                self.settle(id, now, Outcome::Open);
            }
        }
    }

    pub(super) fn feedback_one(&mut self, now: Instant, fb: &TestFeedback) {
        let id = match self.by_mirror.get(&fb.client) {
            Some(&id) if fb.server == self.cfg.target => id,
            _ => {
                self.stats.feedback_unknown_session += 1;
                return;
            }
        };
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if s.is_lingering() {
            self.stats.feedback_stale += 1;
            if let Some(reply) = s.linger_reply(fb, self.cfg.ttl) {
                // Bounded: these answer untrusted input.
                if self.control_out.len() < CONTROL_QUEUE_CAP {
                    self.control_out.push_back(reply);
                } else {
                    self.stats.control_queue_dropped += 1;
                }
            }
            return;
        }
        if let Some(ack) = s.stale_feedback(now, fb, self.cfg.ttl) {
            if self.control_out.len() < CONTROL_QUEUE_CAP {
                self.control_out.push_back(ack);
            } else {
                self.stats.control_queue_dropped += 1;
            }
        }
        let was_syn_sent = s.phase == session::Phase::SynSent;
        let out = s.on_feedback(now, &self.cfg, &mut self.stats, fb);
        if was_syn_sent && s.phase == session::Phase::Established {
            // The test server answers: sessions waiting for it may all come back, and this
            // one's replay is in its stream now (kept as its log until answered).
            s.held_reached_test();
            self.gate.succeeded();
        }
        self.settle(id, now, out);
    }

    /// A client packet for a session waiting to be re-established (see `recovery.rs`): if
    /// it carries data and the pacing allows, the old session is forgotten and a new one
    /// starts from this packet through the pickup path. Returns whether that happened.
    pub(super) fn try_reestablish(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        id: SessionId,
        pkt: &TcpPacket<'_>,
    ) -> bool {
        let Some(s) = slot_session(&mut self.slots, id) else {
            return false;
        };
        let Some(revival) = s.revival else {
            return false;
        };
        let f = pkt.flags;
        if pkt.payload.is_empty() || f.fin() || f.rst() || f.syn() || !self.cfg.pickup_midstream {
            return false;
        }
        if now < revival.not_before || !self.gate.admit(now, self.cfg.handshake_timeout) {
            self.stats.reestablish_deferred += 1;
            return false;
        }
        // What the client sent while the session waited goes first, then this packet.
        let held = s.take_held().unwrap_or_default();
        let (start, stream) = match held.joined(pkt.seq, pkt.payload) {
            Ok(joined) => joined,
            Err(lost) => {
                self.stats.held_bytes_lost += lost as u64;
                (pkt.seq, pkt.payload.to_vec())
            }
        };
        self.release(id);
        let key = FlowKey {
            client: SocketAddrV4::new(pkt.src, pkt.src_port),
            prod_ip: pkt.dst,
        };
        let replayed = stream.len().saturating_sub(pkt.payload.len());
        // As captured segments: one may not exceed an IPv4 packet (the reassembly's bound),
        // and one ends where the replay does (the transform hears of it there).
        let end_of = |at: usize| {
            let end = stream.len().min(at + REPLAY_SEGMENT);
            if at < replayed && replayed < end {
                replayed
            } else {
                end
            }
        };
        let segment = |at: usize| {
            let bytes = &stream[at..end_of(at)];
            TcpPacket {
                seq: start + at,
                payload: bytes,
                payload_len: bytes.len() as u32,
                ..*pkt
            }
        };
        self.open_session(now, captured, &segment(0), Start::Pickup);
        let Some(new) = self.by_flow.get(&key).copied() else {
            // Not opened (shed, pool exhausted): counted there.
            self.stats.held_bytes_lost += replayed as u64;
            return true;
        };
        self.stats.held_bytes_replayed += replayed as u64;
        if let Some(s) = slot_session(&mut self.slots, new) {
            s.revived_after = Some(revival.attempts);
            // Kept until the test server answers: if it refuses this one too, the next
            // attempt replays the whole run again.
            s.set_held(Held::from_stream(start, stream.clone()));
        }
        self.recharge(new);
        let mut at = end_of(0);
        loop {
            if at == replayed && replayed > 0 {
                if let Some(s) = slot_session(&mut self.slots, new) {
                    s.replayed(now, captured, &self.cfg, &mut self.stats);
                }
            }
            if at >= stream.len() {
                break;
            }
            let next = end_of(at);
            self.on_client_packet(now, captured, &segment(at));
            at = next;
        }
        self.stats.sessions_reestablished[revival.reason.index()] += 1;
        true
    }

    /// Keeps a client packet's bytes for a session that waits to be re-established (see
    /// `Session::held`), within its buffer and the memory budget.
    pub(super) fn hold(&mut self, id: SessionId, pkt: &TcpPacket<'_>) {
        // On every client packet: the common case (an established session) leaves at once.
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if pkt.payload.is_empty() || !s.holds_client_bytes() {
            return;
        }
        let admit_below = self.cfg.max_memory - self.cfg.max_memory / 16;
        let budget_room = admit_below.saturating_sub(self.mem_used);
        let max_buffer = self.cfg.max_session_buffer;
        let held = s.held_mut();
        let room = max_buffer.saturating_sub(held.len()).min(budget_room);
        let lost = held.push(pkt.seq, pkt.payload, room);
        self.stats.held_bytes_lost += lost as u64;
        self.recharge(id);
    }

    /// Something learnt about the test server's side of the session that sends from
    /// `mirrored`, for its transform (TCP segments go through [`Engine::on_feedback`]).
    /// A test event and when it was received from intercept (on the engine's clock; see
    /// [`Engine::on_captured_at`]): the transform sees it as [`TransformOutput::captured_at`].
    /// Otherwise as [`Engine::on_test_event`].
    pub fn on_test_event_at(
        &mut self,
        now: Instant,
        received: Instant,
        mirrored: SocketAddrV4,
        ev: &TestEvent<'_>,
    ) {
        self.on_test_event_inner(now, Some(received), mirrored, ev);
    }

    pub fn on_test_event(&mut self, now: Instant, mirrored: SocketAddrV4, ev: &TestEvent<'_>) {
        self.on_test_event_inner(now, None, mirrored, ev);
    }

    /// A run of test events of one session, each with when it was received: what as many
    /// [`Engine::on_test_event_at`] calls would do, settled once at the end. Intercept relays
    /// a reply's MySQL packets one after the other; settling (timers, the memory charge, the
    /// budget) after each was a quarter of the engine's instructions. The session is settled
    /// at once, and the rest of the run taken one event at a time, if an event finishes or
    /// completes it: what follows must meet the session as it would have one by one.
    pub fn on_test_events_at<'e>(
        &mut self,
        now: Instant,
        mirrored: SocketAddrV4,
        events: impl IntoIterator<Item = (Instant, TestEvent<'e>)>,
    ) {
        let mut events = events.into_iter();
        let Some(id) = self.by_mirror.get(&mirrored).copied() else {
            self.stats.test_events_unknown_session += events.count() as u64;
            return;
        };
        let mut unsettled = false;
        while let Some((received, ev)) = events.next() {
            let Some(s) = slot_session(&mut self.slots, id) else {
                break;
            };
            if s.is_lingering() {
                self.stats.test_events_unknown_session += 1;
                continue;
            }
            let out = s.on_test_event(now, Some(received), &self.cfg, &mut self.stats, &ev);
            if matches!(out, Outcome::Open) && !s.is_complete() {
                unsettled = true;
                continue;
            }
            self.settle(id, now, out);
            for (received, ev) in events.by_ref() {
                self.on_test_event_inner(now, Some(received), mirrored, &ev);
            }
            return;
        }
        if unsettled {
            self.settle(id, now, Outcome::Open);
        }
    }

    pub(super) fn on_test_event_inner(
        &mut self,
        now: Instant,
        received: Option<Instant>,
        mirrored: SocketAddrV4,
        ev: &TestEvent<'_>,
    ) {
        let Some(id) = self.by_mirror.get(&mirrored).copied() else {
            self.stats.test_events_unknown_session += 1;
            return;
        };
        let Some(s) = slot_session(&mut self.slots, id) else {
            return;
        };
        if s.is_lingering() {
            self.stats.test_events_unknown_session += 1;
            return;
        }
        let out = s.on_test_event(now, received, &self.cfg, &mut self.stats, ev);
        self.settle(id, now, out);
    }

    /// Runs every timer due at `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        if !self.orphans.is_empty() {
            self.stats.tls_plain_bytes_unmatched += self.orphans.expire(now);
        }
        while let Some(&Reverse((at, idx, gen))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let id = SessionId { idx, gen };
            let Some(s) = slot_session(&mut self.slots, id) else {
                continue;
            };
            if s.heap_at != Some(at) {
                continue; // superseded by an earlier entry that already ran
            }
            s.heap_at = None;
            if s.is_lingering() {
                match s.next_deadline(&self.cfg) {
                    Some(until) if until > now => self.schedule(id),
                    _ => self.release(id),
                }
                continue;
            }
            if let Some((rst, replies)) = s.stale_reset_due(now, self.cfg.ttl) {
                self.stats.stale_test_connections_reset += 1;
                self.stats.stale_replies_drained += replies;
                if self.control_out.len() < CONTROL_QUEUE_CAP {
                    self.control_out.push_back(rst);
                } else {
                    self.stats.control_queue_dropped += 1;
                }
            }
            let out = s.on_timeout(now, &self.cfg, &mut self.stats);
            self.settle(id, now, out);
        }
        self.compact_timers();
    }

    /// The earliest instant at which `on_timeout` has work (possibly a little early).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }
}

/// A segment with no payload and no flag but ACK (and PSH).
fn pure_ack(pkt: &TcpPacket<'_>) -> bool {
    let f = pkt.flags;
    pkt.payload.is_empty() && f.ack() && !(f.syn() || f.fin() || f.rst())
}

/// Whether a pure ACK left its session as it was for the engine (see [`Session::ack_marks`]):
/// then settling it would only redo what the last settle did.
fn quiet(before: Option<AckMarks>, out: &Outcome, s: &Session) -> bool {
    matches!(out, Outcome::Open) && before.is_some() && before == s.ack_marks()
}
