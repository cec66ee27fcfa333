//! What we send toward the test server: data cut to the effective MSS from our stream,
//! retransmissions, our ACKs, window probes, our FIN.
//!
//! Never sends beyond the test server's window nor a byte the stream does not hold.

use super::*;

impl Session {
    pub(super) fn repr(&self, seq: SeqNumber, flags: u8, ip_id: u16, ttl: u8) -> SegmentRepr {
        let mut options = TcpOptions::default();
        let mut flags = flags;
        let mut ack = SeqNumber(0);
        if self.phase == Phase::SynSent {
            options.mss = Some(self.adv_mss);
            options.window_scale = self.offer_wscale.then_some(OUR_WSCALE);
            // Never SACK-permitted: intercept relays no SACK blocks and we retransmit from
            // cumulative ACKs only; and as a receiver we could not produce honest SACK blocks
            // for a stream whose bytes we never see. Without the option neither side uses SACK.
            options.sack_permitted = false;
            options.timestamps = self.ts_offer.then_some((self.ts_client, 0));
        } else {
            flags |= TcpFlags::ACK;
            ack = self.rcv_nxt;
            options.timestamps = self.ts_on.then_some((self.ts_client, self.ts_recent));
        }
        SegmentRepr {
            src: *self.mirrored.ip(),
            dst: *self.target.ip(),
            src_port: self.mirrored.port(),
            dst_port: self.target.port(),
            seq,
            ack,
            flags: TcpFlags(flags),
            window: OUR_WINDOW,
            options,
            ip_id,
            ttl,
        }
    }

    /// Length and FIN of the segment starting at `start` that fits before `limit`.
    pub(super) fn plan_data(
        &self,
        start: SeqNumber,
        limit: SeqNumber,
        max_payload: usize,
    ) -> (u32, bool) {
        let data_end = self.data_end();
        let avail = if start < data_end {
            data_end.bytes_since(start) as u32
        } else {
            0
        };
        let room = if start < limit {
            limit.bytes_since(start) as u32
        } else {
            0
        };
        let len = avail
            .min(room)
            .min(self.send_mss)
            .min(u32::try_from(max_payload).unwrap_or(u32::MAX));
        // The FIN takes one sequence number and, like data, must fit the window.
        let fin = self.fin_queued() && start + len == data_end && room > len;
        (len, fin)
    }

    /// Writes this session's next packet into `buf`, if it has one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn poll_segment(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
    ) -> Option<usize> {
        match self.phase {
            Phase::SynSent => {
                if !self.syn_pending {
                    return None;
                }
                let repr = self.repr(self.iss, TcpFlags::SYN, ip_id, cfg.ttl);
                let n = emit(&repr, &[], buf, stats)?;
                self.syn_pending = false;
                if self.snd_max == self.iss {
                    self.rtt_probe = Some((self.iss + 1u32, now));
                } else {
                    stats.segments_resent += 1;
                }
                self.snd_nxt = self.iss + 1u32;
                self.snd_max = self.snd_nxt;
                self.rto_at.get_or_insert(now + self.current_rto(cfg));
                Some(n)
            }
            Phase::Established => self.poll_established(now, cfg, stats, scratch, buf, ip_id),
            Phase::Lingering { .. } => None,
        }
    }

    pub(super) fn poll_established(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
    ) -> Option<usize> {
        let header = self.repr(SeqNumber(0), 0, 0, 0).header_len();
        let Some(max_payload) = buf.len().checked_sub(header) else {
            stats.transmit_buffer_too_small += 1;
            return None;
        };
        let fast = self.fast_retx_pending;
        let (start, limit) = if fast {
            (self.snd_una, self.snd_max)
        } else if self.rto_retx_pending && self.snd_nxt == self.snd_una {
            let head = self.snd_una
                + self
                    .send_mss
                    .min(self.snd_max.bytes_since(self.snd_una) as u32);
            (self.snd_nxt, self.send_limit().max(head))
        } else {
            (self.snd_nxt, self.send_limit())
        };
        let (len, fin) = if fast || self.snd_nxt < self.stream_end() {
            self.plan_data(start, limit, max_payload)
        } else {
            (0, false)
        };
        if len > 0 || fin {
            let n = self.emit_data(start, len, fin, scratch, buf, ip_id, cfg, stats)?;
            let end = start + (len + u32::from(fin));
            if start < self.snd_max {
                stats.segments_resent += 1;
                let resent_end = if end < self.snd_max {
                    end
                } else {
                    self.snd_max
                };
                stats.bytes_resent += u64::from((resent_end.bytes_since(start) as u32).min(len));
                self.rtt_probe = None;
            } else if self.rtt_probe.is_none() {
                self.rtt_probe = Some((end, now));
            }
            if end > self.snd_max {
                let from = start.max(self.snd_max);
                stats.bytes_sent += u64::from(end.bytes_since(from) as u32 - u32::from(fin));
                self.snd_max = end;
            }
            if fast {
                self.fast_retx_pending = false;
            } else {
                self.snd_nxt = end;
                self.rto_retx_pending = false;
            }
            self.acked_all();
            self.rto_at.get_or_insert(now + self.current_rto(cfg));
            return Some(n);
        }
        if fast {
            // Nothing left to repeat (acknowledged meanwhile).
            self.fast_retx_pending = false;
        }
        self.rto_retx_pending = false;
        if self.probe_pending {
            // Linux-style window probe: an already-acknowledged sequence number with no data
            // is always answered with an ACK carrying the current window.
            let repr = self.repr(self.snd_una - 1u32, 0, ip_id, cfg.ttl);
            let n = emit(&repr, &[], buf, stats)?;
            self.probe_pending = false;
            self.acked_all();
            // A resync's probe is counted as the resync (by the engine), not as a window probe.
            if !std::mem::take(&mut self.resync_probe) {
                stats.zero_window_probes += 1;
            }
            self.refresh_timers(now, cfg);
            return Some(n);
        }
        if self.ack_pending {
            let repr = self.repr(self.acceptable_seq(), 0, ip_id, cfg.ttl);
            let n = emit(&repr, &[], buf, stats)?;
            self.acked_all();
            stats.pure_acks_sent += 1;
            return Some(n);
        }
        None
    }

    /// The sequence number a pure ACK carries: `snd_nxt`, but never beyond the right edge of
    /// the test server's window (Linux's `tcp_acceptable_seq`). A retransmission that went out
    /// into a shut window (see `rto_retx_pending`) leaves `snd_nxt` beyond it, and a receiver
    /// drops a segment that starts beyond its window whole, its ACK unread (Linux 6.x counts
    /// it in `TCPBeyondWindow`). Every ACK of ours would then be ignored while the test server
    /// waits for them with its window shut: a deadlock, seen after intercept stalls, when the
    /// test server's replies to a backlog fill its send buffer.
    pub(super) fn acceptable_seq(&self) -> SeqNumber {
        let edge = self.snd_una + self.snd_wnd;
        // The window is at most 2^30 (65535 << 14): `edge` is never 2^31 from `snd_nxt`.
        if self.snd_nxt > edge {
            edge
        } else {
            self.snd_nxt
        }
    }

    /// A segment carrying ACK = `rcv_nxt` left: nothing is owed any more.
    pub(super) fn acked_all(&mut self) {
        self.ack_pending = false;
        self.ack_at = None;
        self.unacked_segs = 0;
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_data(
        &self,
        start: SeqNumber,
        len: u32,
        fin: bool,
        scratch: &mut [u8],
        buf: &mut [u8],
        ip_id: u16,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Option<usize> {
        let off = start.bytes_since(self.buf_seq);
        let len = len as usize;
        let (a, b) = self.send_buf.as_slices();
        let payload: &[u8] = if off + len <= a.len() {
            &a[off..off + len]
        } else if off >= a.len() {
            &b[off - a.len()..off - a.len() + len]
        } else {
            // Wrapped ring: copy into the engine's scratch buffer (pre-sized, no allocation).
            let first = &a[off..];
            let rest = len - first.len();
            scratch[..first.len()].copy_from_slice(first);
            scratch[first.len()..len].copy_from_slice(&b[..rest]);
            &scratch[..len]
        };
        let mut flags = 0;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if len > 0 && start + len == self.data_end() {
            flags |= TcpFlags::PSH;
        }
        let repr = self.repr(start, flags, ip_id, cfg.ttl);
        emit(&repr, payload, buf, stats)
    }
}
