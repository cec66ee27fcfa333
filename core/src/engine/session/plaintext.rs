//! A TLS session mirrored from its plaintext: the bytes production's TLS library read and
//! wrote (the copier's eBPF probe), delivered in place of the captured ciphertext.
//!
//! # What this room is for
//!
//! The capture still sees the session start in the clear: the SYN, production's greeting
//! and the client's SSLRequest go through the usual path. When the transform reads the
//! SSLRequest it says so ([`TransformOutput::start_tls`](super::super::TransformOutput::start_tls));
//! from then on captured payload, both ways, is ciphertext and passed over, and the stream
//! goes on with the plaintext, in the order and at the offsets the probe numbered it. The
//! probe may be ahead of the capture (its ring is read at once, the capture's blocks when
//! they retire): plaintext that comes before the SSLRequest was read waits here.
//!
//! The client's stream ends when production closes (its FIN: everything its TLS library
//! will ever read has been read, and the driver drains the probe before each capture batch,
//! so that plaintext is here first) or when the client resets; the client's own FIN says
//! nothing (production may not have read what came before it yet).
//!
//! # What it must never do
//!
//! * Frame or deliver a byte of ciphertext, or take captured sequence numbers for plaintext
//!   offsets: the two are different streams.
//! * Go on past plaintext the probe lost in the client's direction: the commands in it are
//!   unknown, so the session ends as a capture gap (counted); in production's direction the
//!   replies in it are lost to the report only.
//! * Hold more than the session's buffer bound while waiting for the SSLRequest.

use super::*;

/// What a TLS session's plaintext needs beyond a plain session (boxed: most sessions have
/// none).
#[derive(Debug, Default)]
pub(crate) struct TlsPlain {
    /// The transform read the SSLRequest: plaintext goes to it, ciphertext nowhere.
    switched: bool,
    /// The offset of the next plaintext byte expected, client -> production and back.
    next: [u64; 2],
    /// Plaintext that came before the switch, per direction.
    early: [Vec<u8>; 2],
    /// Production closed (or the client reset): the client's stream ends at this time, once
    /// the plaintext production read before has had time to arrive.
    done_at: Option<Instant>,
}

/// How long the client's stream stays open for plaintext after production's FIN. The driver
/// reads the probe's ring every loop, before the capture's packets; this covers a FIN
/// captured between the two reads, and a ring read late on a busy host. Plaintext later than
/// this is refused after our FIN and counted (`transform_bytes_refused`).
const CLOSE_GRACE: Duration = Duration::from_millis(50);

const FROM_CLIENT: usize = 0;
const FROM_PROD: usize = 1;

/// Where a piece of plaintext sits in its direction's stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlainAt {
    pub(crate) from_client: bool,
    /// Bytes of this direction before the piece (the probe counts those it lost too).
    pub(crate) offset: u64,
}

impl Session {
    /// The session's captured payload is ciphertext now.
    pub(super) fn tls_switched(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.switched)
    }

    /// Bytes waiting for the SSLRequest (for the memory budget).
    pub(super) fn tls_heap_bytes(&self) -> usize {
        self.tls
            .as_ref()
            .map_or(0, |t| t.early.iter().map(Vec::capacity).sum())
    }

    /// Plaintext waiting for an SSLRequest that never came (the session is ending).
    pub(crate) fn tls_unused_bytes(&self) -> usize {
        self.tls
            .as_ref()
            .map_or(0, |t| t.early.iter().map(Vec::len).sum())
    }

    /// A piece of the session's plaintext.
    pub(crate) fn on_plaintext(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        at: PlainAt,
        data: &[u8],
    ) -> Outcome {
        self.last_activity = now;
        let dir = if at.from_client {
            FROM_CLIENT
        } else {
            FROM_PROD
        };
        let tls = self.tls.get_or_insert_with(Box::default);
        let next = tls.next[dir];
        let mut data = data;
        if at.offset < next {
            // Already had (a probe never sends a byte twice, but a hostile or buggy event
            // must not repeat a command).
            let had = usize::try_from(next - at.offset).unwrap_or(usize::MAX);
            if had >= data.len() {
                return Outcome::Open;
            }
            data = &data[had..];
        } else if at.offset > next {
            // Offsets are the probe's (untrusted): a hostile one near 2^64 must not overflow.
            let lost = at.offset - next;
            stats.tls_plain_bytes_lost = stats.tls_plain_bytes_lost.saturating_add(lost);
            tls.next[dir] = at.offset;
            if dir == FROM_CLIENT || !tls.switched {
                // Commands (or the login) are missing: nothing after can be framed.
                stats.capture_gaps_fatal += 1;
                return Outcome::Finished(CloseReason::CaptureGap);
            }
            self.call_transform(None, cfg, stats, |t, out| {
                t.on_prod_gap(now, out);
            });
        }
        let Some(tls) = self.tls.as_mut() else {
            return Outcome::Open;
        };
        tls.next[dir] = tls.next[dir].saturating_add(data.len() as u64);
        if dir == FROM_CLIENT {
            stats.tls_plain_client_bytes += data.len() as u64;
        } else {
            stats.tls_plain_prod_bytes += data.len() as u64;
        }
        if !tls.switched {
            let waiting: usize = tls.early.iter().map(Vec::len).sum();
            if waiting + data.len() > cfg.max_session_buffer {
                return Outcome::Finished(CloseReason::BufferOverflow);
            }
            tls.early[dir].extend_from_slice(data);
            return Outcome::Open;
        }
        self.deliver_plain(now, cfg, stats, dir, data);
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }

    fn deliver_plain(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
        dir: usize,
        data: &[u8],
    ) {
        if data.is_empty() {
            return;
        }
        if dir == FROM_CLIENT {
            self.call_transform(None, cfg, stats, |t, out| t.on_client_data(now, data, out));
        } else {
            self.call_transform(None, cfg, stats, |t, out| t.on_prod_data(now, data, out));
        }
    }

    /// The transform read the SSLRequest (see [`Session::apply`]).
    pub(super) fn start_tls(&mut self) {
        self.tls.get_or_insert_with(Box::default).switched = true;
    }

    /// After the SSLRequest was read: plaintext that came early goes in now, the client's
    /// first (its login comes before production's answer to it).
    pub(super) fn flush_early_plaintext(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) {
        let Some(tls) = self.tls.as_mut().filter(|t| t.switched) else {
            return;
        };
        if tls.early.iter().all(Vec::is_empty) {
            return;
        }
        let early = std::mem::take(&mut tls.early);
        for (dir, bytes) in early.iter().enumerate() {
            self.deliver_plain(now, cfg, stats, dir, bytes);
        }
    }

    /// A captured client packet of a switched session: its payload is ciphertext; only a
    /// reset means anything (production will read nothing more after it).
    pub(super) fn on_client_tls(
        &mut self,
        now: Instant,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        stats.tls_ciphertext_bytes += pkt.payload.len() as u64;
        if pkt.flags.rst() {
            self.tls_ending(now);
        }
        Outcome::Open
    }

    /// A captured production packet of a switched session: ciphertext, and its FIN says
    /// the client's plaintext is all read (and here within [`CLOSE_GRACE`]).
    pub(super) fn on_prod_tls(
        &mut self,
        now: Instant,
        stats: &mut EngineStats,
        pkt: &TcpPacket<'_>,
    ) -> Outcome {
        stats.tls_ciphertext_bytes += pkt.payload.len() as u64;
        if pkt.flags.fin() {
            self.tls_ending(now);
        }
        Outcome::Open
    }

    fn tls_ending(&mut self, now: Instant) {
        if let Some(t) = self.tls.as_mut() {
            t.done_at.get_or_insert(now + CLOSE_GRACE);
        }
    }

    /// When the client's stream ends (see [`CLOSE_GRACE`]).
    pub(super) fn tls_done_at(&self) -> Option<Instant> {
        self.tls.as_ref().and_then(|t| t.done_at)
    }

    /// The grace after production's FIN is over.
    pub(super) fn on_tls_done(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Outcome {
        if let Some(t) = self.tls.as_mut() {
            t.done_at = None;
        }
        self.tls_client_done(now, cfg, stats)
    }

    /// The client's stream is over: our FIN follows it, as for a client's FIN in the clear.
    fn tls_client_done(
        &mut self,
        now: Instant,
        cfg: &EngineConfig,
        stats: &mut EngineStats,
    ) -> Outcome {
        if self.closing == Closing::Open {
            self.closing = Closing::ClientFinished;
            self.close_started.get_or_insert(now);
            self.call_transform(None, cfg, stats, |t, out| t.on_client_fin(now, out));
        }
        match self.settle_stream(cfg) {
            Some(reason) => Outcome::Finished(reason),
            None => Outcome::Open,
        }
    }
}
