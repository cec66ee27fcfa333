//! Captured packets of the client and of production: reassembled in their own sequence
//! spaces, in-order bytes moved once into our stream (straight or through the transform).
//!
//! Never maps a client number onto ours: the `deliver` callback is the only bridge.

use super::*;

impl Session {
    /// A captured client->prod packet of this session (not a SYN with a new ISN: the engine
    /// handles 4-tuple reuse).
    pub(crate) fn on_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        self.last_activity = now;
        self.note_ts(&pkt.options);
        if self.tls_switched() {
            return self.on_client_tls(now, stats, pkt);
        }
        let f = pkt.flags;
        let mut fin = f.fin();
        if f.rst() {
            // Production would ignore a RST behind the stream; so do we.
            if pkt.seq.bytes_since(self.reasm.next()) < 1 << 30 {
                if self.client_closed() {
                    // Closing already, with our FIN after the client's whole stream: a reset
                    // after the FIN (a socket closed with unread data) changes nothing there.
                    stats.client_rsts_ignored += 1;
                    return Outcome::Open;
                }
                if pkt.seq == self.reasm.next()
                    && pkt.payload.is_empty()
                    && !self.reasm.has_held()
                    && !self.resync_client
                {
                    // The client reset with its whole stream in our hands: production had
                    // every command before the reset and answered those the client waited
                    // for. Resetting the test server's connection too would throw away what
                    // it has not run yet (a test server behind, issue 20's 1,000-connection
                    // run: "error writing communication packets" and a lost COMMIT); a FIN
                    // after the stream lets it run everything, then close.
                    stats.client_resets_closed_with_fin += 1;
                    fin = true;
                } else {
                    let lost = self.queued_bytes();
                    if lost > 0 {
                        stats.client_resets_with_queued_data += 1;
                        stats.client_reset_bytes_lost += lost as u64;
                    }
                    return Outcome::Finished(CloseReason::ClientReset);
                }
            } else {
                stats.client_rsts_ignored += 1;
                return Outcome::Open;
            }
        }
        if f.ack() && !f.syn() {
            self.client_established = true;
            if self.wants_prod {
                // A hostile ACK 2^31 from the last one replaces it, as `seq::max` did.
                self.client_ack = Some(match self.client_ack {
                    Some(a) => serial::max_or_seen(a, pkt.ack),
                    None => pkt.ack,
                });
            }
        }
        if pkt.payload.is_empty() && !fin {
            if self.wants_prod {
                if let Some(reason) = self.settle_gaps(now, captured, cfg, stats) {
                    return Outcome::Finished(reason);
                }
            }
            return Outcome::Open;
        }
        let start = if f.syn() { pkt.seq + 1u32 } else { pkt.seq };
        let next = self.reasm.next();
        if self.floating_start
            && self.reasm.pristine()
            && (start == next + 1u32
                // `>` is safe beside the 2^30 bound; production's ACK may lie 2^31 from
                // `start` (both captured), which the old `seq::ge` took as at or after it.
                || (start > next
                    && start.bytes_since(next) < 1 << 30
                    && self.prod_ack.is_some_and(|a| serial::not_ahead(start, a))))
        {
            // Picked up from a keepalive probe (seq = next - 1), or from a pure ACK that the
            // command after it overtook on its way to the tap (each CPU's backlog feeds the
            // veth hops on its own, so a busy host reorders the two): production has every
            // byte before this segment, taken before the capture saw the flow, and none of
            // them can still come. The real stream starts here, not behind a hole.
            self.reasm.rebase(start);
            self.floating_start = false;
        }
        let delivered = if self.resync_client && !self.resync_at(stats, start, pkt.payload) {
            0
        } else {
            let seg = Segment {
                start,
                payload: pkt.payload,
                fin,
            };
            self.take_client_bytes(now, captured, cfg, stats, seg)
        };
        if delivered > 0 {
            self.floating_start = false;
        }
        if self.tls_switched() {
            // The SSLRequest was in this segment: the rest of the stream is ciphertext.
            self.flush_early_plaintext(now, cfg, stats);
            return match self.settle_stream(cfg) {
                Some(reason) => Outcome::Finished(reason),
                None => Outcome::Open,
            };
        }
        if let Some(reason) = self.settle_gaps(now, captured, cfg, stats) {
            return Outcome::Finished(reason);
        }
        if self.reasm.fin_done() && self.closing == Closing::Open {
            self.closing = Closing::ClientFinished;
            // Also bounds a transform that never stops withholding.
            self.close_started.get_or_insert(now);
            self.call_transform(captured, cfg, stats, |t, out| t.on_client_fin(now, out));
        }
        if let Some(reason) = self.settle_stream(cfg) {
            return Outcome::Finished(reason);
        }
        Outcome::Open
    }

    /// The seam (see module doc): reassembles one captured segment and moves the client bytes
    /// now in order into our stream, through the transform if there is one. Returns how many
    /// client bytes came out of the reassembly.
    pub(super) fn take_client_bytes(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        seg: Segment<'_>,
    ) -> usize {
        let Segment {
            start,
            payload,
            fin,
        } = seg;
        let mut r = Insert::Duplicate;
        let delivered = self.feed_client(now, captured, cfg, stats, |reasm, deliver| {
            r = reasm.insert(start, payload, fin, deliver);
        });
        match r {
            Insert::Accepted { held, trimmed } => {
                stats.client_segments_held += u64::from(held);
                stats.client_bytes_duplicate += trimmed as u64;
            }
            Insert::Duplicate => stats.client_bytes_duplicate += payload.len() as u64,
            Insert::Dropped => stats.client_segments_dropped += 1,
        }
        delivered
    }

    /// Runs `op` on the client reassembly with a sink that moves the bytes it delivers into
    /// our stream (straight, or through the transform); returns how many it delivered.
    pub(super) fn feed_client(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        op: impl FnOnce(&mut Reassembly, &mut dyn FnMut(&[u8])),
    ) -> usize {
        let room = self.push_room(cfg);
        // Every delivery of one call continues the stream from here.
        let mut at = self.reasm.next();
        // A replay log is bounded as a held run is (`Engine::hold`): by the session's buffer,
        // and it grows no further once the engine nears its memory budget (the oldest bytes go
        // instead: a replay is worth less than the sessions the budget would shed for it).
        let log_max = (self.tls.is_none()
            && self.transform.as_ref().is_some_and(|t| t.0.replays()))
        .then(|| {
            let admit_below = cfg.max_memory - cfg.max_memory / 16;
            let room = admit_below
                .saturating_sub(usize::try_from(stats.memory_bytes).unwrap_or(usize::MAX));
            let kept = match self.kept.as_deref() {
                Some(Kept::Log(l)) => l.len(),
                _ => 0,
            };
            cfg.max_session_buffer.min(kept + room)
        });
        let Session {
            reasm,
            send_buf,
            transform,
            closing,
            kept,
            ..
        } = self;
        let mut delivered = 0usize;
        let result = match transform {
            None => {
                op(reasm, &mut |bytes| {
                    send_buf.extend(bytes);
                    delivered += bytes.len();
                });
                TransformResult {
                    pushed: delivered,
                    ..TransformResult::default()
                }
            }
            Some(t) => {
                let mut out = TransformOutput::bound(
                    send_buf,
                    &mut stats.transform,
                    *closing == Closing::FinQueued,
                    room,
                );
                out.set_captured(captured);
                op(reasm, &mut |bytes| {
                    delivered += bytes.len();
                    if !out.is_done() {
                        if let Some(max) = log_max {
                            // Nothing while a held run is kept: it has these bytes already.
                            let k = kept.get_or_insert_with(|| ReplayLog::at(t.0.client_offset()));
                            if let Kept::Log(log) = &mut **k {
                                log.append(at, bytes, max);
                            }
                        }
                        t.0.on_client_data(now, bytes, &mut out);
                    }
                    at += bytes.len();
                });
                out.result()
            }
        };
        stats.client_bytes_reassembled += delivered as u64;
        self.apply(result, stats);
        delivered
    }

    /// Runs one transform callback with an output bound to our send buffer and applies what it
    /// asked for. Nothing happens without a transform, or once it gave the session up.
    pub(super) fn call_transform(
        &mut self,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        call: impl FnOnce(&mut dyn StreamTransform, &mut TransformOutput<'_>),
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let room = self.push_room(cfg);
        let test_seen = self.test_stream_seen();
        let Session {
            transform,
            send_buf,
            closing,
            ..
        } = self;
        let Some(t) = transform else {
            return;
        };
        let mut out = TransformOutput::bound(
            send_buf,
            &mut stats.transform,
            *closing == Closing::FinQueued,
            room,
        );
        out.set_captured(captured);
        out.set_test_stream_seen(test_seen);
        call(t.0.as_mut(), &mut out);
        let result = out.result();
        self.apply(result, stats);
    }

    pub(super) fn apply(&mut self, r: TransformResult, stats: &mut EngineStats) {
        stats.bytes_queued += r.pushed as u64;
        stats.transform_bytes_refused += r.refused as u64;
        self.overflowed |= r.overflowed;
        if let Some(why) = r.abandoned {
            self.abandoned.get_or_insert(why);
        }
        if r.tls_started {
            self.start_tls();
        }
        if r.settled {
            self.trim_replay();
        }
    }

    /// After anything that may have changed our stream: whether the session must end, and
    /// our FIN placed once the client closed and the transform holds nothing back (it goes
    /// right after the last byte pushed; nothing may be pushed after it).
    pub(super) fn settle_stream(&mut self, cfg: &EngineConfig) -> Option<CloseReason> {
        if self.abandoned.is_some() {
            return Some(CloseReason::NotMirrorable);
        }
        if self.overflowed || self.queued_bytes() > cfg.max_session_buffer {
            return Some(CloseReason::BufferOverflow);
        }
        if self.closing == Closing::ClientFinished
            && !self.transform.as_ref().is_some_and(|t| t.0.pending())
        {
            self.closing = Closing::FinQueued;
        }
        None
    }

    /// The session was just created: a picked-up one lets its transform speak first.
    pub(crate) fn on_open(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        picked_up: bool,
    ) -> Outcome {
        if picked_up {
            self.call_transform(captured, cfg, stats, |t, out| t.on_pickup(now, out));
        }
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// Knowledge about the test server that is not a segment (see [`TestEvent`]).
    pub(crate) fn on_test_event(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        ev: &TestEvent<'_>,
    ) -> Outcome {
        if self.draining_stale() && matches!(ev, TestEvent::Mysql(_)) {
            // The older connection's replies: ours cannot begin before it is reset.
            stats.stale_test_events += 1;
            return Outcome::Open;
        }
        self.call_transform(captured, cfg, stats, |t, out| t.on_test_event(now, ev, out));
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// A captured prod->client packet of this session.
    pub(crate) fn on_prod(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        self.last_activity = now;
        if pkt.flags.rst() {
            // The production connection is gone; the client will send nothing more.
            return Outcome::Finished(CloseReason::ProdReset);
        }
        if !pkt.payload.is_empty() {
            // Production only sends data on an established connection (even if the capture
            // missed the client's ACK of the handshake).
            self.client_established = true;
        }
        if self.tls_switched() {
            return self.on_prod_tls(now, stats, pkt);
        }
        if pkt.flags.ack() {
            let ack = pkt.ack;
            // A hostile ACK 2^31 from the last one replaces it, as `seq::max` did.
            self.prod_ack = Some(match self.prod_ack {
                Some(a) => serial::max_or_seen(a, ack),
                None => ack,
            });
        }
        if self.wants_prod {
            self.take_prod_bytes(now, captured, cfg, stats, pkt);
            if let Some(reason) = self.settle_stream(cfg) {
                return Outcome::Finished(reason);
            }
        }
        match self.settle_gaps(now, captured, cfg, stats) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    /// Production's replies, in order, to the transform.
    pub(super) fn take_prod_bytes(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let f = pkt.flags;
        let carries = !pkt.payload.is_empty() || f.fin();
        let start = if f.syn() { pkt.seq + 1u32 } else { pkt.seq };
        if self.prod_reasm.is_none() {
            // A pure ACK may be a keepalive probe (seq = next - 1): only a SYN-ACK or a
            // segment with data says where the stream is.
            if !f.syn() && !carries {
                return;
            }
            self.prod_reasm = Some(Reassembly::new(start, cfg.max_session_buffer));
        }
        if !carries {
            return;
        }
        let mut r = Insert::Duplicate;
        self.feed_prod(now, captured, cfg, stats, |reasm, deliver| {
            r = reasm.insert(start, pkt.payload, f.fin(), deliver);
        });
        if r == Insert::Dropped {
            stats.prod_segments_dropped += 1;
        }
    }

    /// Runs `op` on production's reassembly with a sink into the transform.
    pub(super) fn feed_prod(
        &mut self,
        now: Instant,
        captured: Option<Instant>,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        op: impl FnOnce(&mut Reassembly, &mut dyn FnMut(&[u8])),
    ) {
        if self.abandoned.is_some() || self.overflowed {
            return;
        }
        let room = self.push_room(cfg);
        let Session {
            prod_reasm: Some(reasm),
            transform: Some(t),
            send_buf,
            closing,
            ..
        } = self
        else {
            return;
        };
        let mut delivered = 0usize;
        let mut out = TransformOutput::bound(
            send_buf,
            &mut stats.transform,
            *closing == Closing::FinQueued,
            room,
        );
        out.set_captured(captured);
        op(reasm, &mut |bytes| {
            delivered += bytes.len();
            if !out.is_done() {
                t.0.on_prod_data(now, bytes, &mut out);
            }
        });
        let result = out.result();
        stats.prod_bytes_reassembled += delivered as u64;
        self.apply(result, stats);
    }
}
