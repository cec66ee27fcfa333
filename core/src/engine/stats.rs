//! The engine's counters: plain integers, owned by the engine's thread, read by whoever
//! aggregates them (one engine per capture thread; sum them for the report).
//!
//! Every place the mirror can lose or distort traffic increments one of these, so a user can
//! tell "the test server saw less" apart from "we never captured it" and "we gave up on it".

use super::transform::TransformStats;
use super::CloseReason;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    // --- sessions ---
    /// Sessions currently mirrored (handshaking or established; not lingering).
    pub sessions_active: u64,
    /// Closed sessions kept briefly to absorb late packets (see `EngineConfig::linger`).
    pub sessions_lingering: u64,
    /// Sessions started from a captured client SYN.
    pub sessions_opened: u64,
    /// Sessions started mid-stream (connection open before we started).
    pub sessions_picked_up: u64,
    /// Sessions ended, by reason; index with [`CloseReason::index`] or use [`Self::closed`].
    pub sessions_closed: [u64; CloseReason::COUNT],
    /// New connections not mirrored because `max_sessions` sessions were active.
    pub sessions_shed: u64,
    /// New connections not mirrored because the engine's memory budget (`--max-memory`) had
    /// no room for one more session (live sessions shed for memory are in
    /// `sessions_closed[ShedMemory]`).
    pub sessions_refused_memory: u64,
    /// Bytes the sessions hold now, as charged to the memory budget (a gauge: fixed size per
    /// session plus buffer capacities; see `budget.rs`).
    pub memory_bytes: u64,
    /// The most `memory_bytes` has been (a high-water mark; merged engines add theirs).
    pub memory_peak_bytes: u64,
    /// New connections not mirrored because their address was already used toward the target
    /// by another live session (no pool configured).
    pub sessions_collided: u64,
    /// New connections not mirrored because every pool address was in use with that port.
    pub pool_exhausted: u64,
    /// New connections (client SYNs, a repeated SYN counted once) left out by `sample`.
    pub sessions_not_sampled: u64,
    /// Captured packets (both directions) of connections left out by `sample`.
    pub packets_not_sampled: u64,
    /// New connections `sample` decided by its stateless hash alone because its table of
    /// decisions was full (the share is then less exact, and a repeated SYN of one left out
    /// counts again in `sessions_not_sampled`; each connection is still whole).
    pub sample_fallbacks: u64,

    // --- capture ---
    pub captured_client_to_prod: u64,
    pub captured_prod_to_client: u64,
    /// Packets of neither direction of the production port.
    pub captured_ignored: u64,
    /// Packets to or from the target itself (e.g. our own output seen by the capture): ignored
    /// so the mirror never feeds on itself.
    pub captured_target: u64,
    /// Client->prod packets for no session that cannot start one (FIN, RST, SYN-ACK, or
    /// mid-stream pickup disabled).
    pub captured_unknown_session: u64,
    /// Prod->client packets for no live session.
    pub captured_prod_unknown_session: u64,
    /// Captured packets of a closed (lingering) session.
    pub captured_stale: u64,
    /// Client SYNs repeated with the same ISN (the client retransmitted).
    pub client_syn_retransmits: u64,
    /// Client payload bytes we had already captured (client retransmissions, overlaps).
    pub client_bytes_duplicate: u64,
    /// Client segments captured ahead of a hole and held until it fills.
    pub client_segments_held: u64,
    /// Client segments dropped: too far ahead of the stream, or too many holes at once.
    pub client_segments_dropped: u64,
    /// Client RSTs ignored: behind the stream (as the production kernel would ignore them),
    /// or after the client's FIN was reached (our FIN already follows its whole stream, and the
    /// test server runs all of it; a socket closed with unread data resets after its FIN).
    pub client_rsts_ignored: u64,
    /// Client RSTs after the client's whole stream: the test server's connection was closed
    /// with a FIN after it instead, so that it runs what it has not yet (not a loss).
    pub client_resets_closed_with_fin: u64,
    /// Client RSTs that arrived while bytes were still queued toward the test server...
    pub client_resets_with_queued_data: u64,
    /// ...and how many bytes the test server therefore never got.
    pub client_reset_bytes_lost: u64,
    /// Times a capture gap was suspected (hole in the client stream, or production acked bytes
    /// we never captured; the same for production's replies when a transform reads them);
    /// sessions where it did not heal are closed with `CaptureGap`.
    pub capture_gaps_suspected: u64,
    /// Capture gaps in the client's stream that the session went on after (proven by
    /// production's ACKs, or not healed in time): the commands in them never reached the test
    /// server...
    pub capture_gaps_skipped: u64,
    /// ...the client bytes given up with them...
    pub capture_gap_bytes_lost: u64,
    /// ...and segments given up after them because they did not start a command.
    pub capture_gap_segments_skipped: u64,
    /// Holes in production's stream (a transform reads it) that its session went on after.
    pub prod_gaps_skipped: u64,
    /// Capture gaps a session could not go on after (no framing, a login or a command cut in
    /// two): the session ended with `CaptureGap`.
    pub capture_gaps_fatal: u64,
    /// ...of which gaps still proven after every skip (a defect; ended rather than spun on).
    pub capture_gaps_stuck: u64,
    /// Client bytes that came out of reassembly in order (the client's stream; what we send is
    /// `bytes_queued`, the same unless a transform rewrites).
    pub client_bytes_reassembled: u64,
    /// Production reply bytes reassembled in order for transforms that read them.
    pub prod_bytes_reassembled: u64,
    /// Production segments dropped: too far ahead of the stream, or too many holes at once.
    pub prod_segments_dropped: u64,

    // --- TLS sessions, mirrored from their plaintext (`Engine::on_plaintext`) ---
    /// Plaintext bytes taken into sessions, client -> production.
    pub tls_plain_client_bytes: u64,
    /// Plaintext bytes taken into sessions, production -> client.
    pub tls_plain_prod_bytes: u64,
    /// Captured ciphertext bytes passed over (the plaintext stands for them).
    pub tls_ciphertext_bytes: u64,
    /// Plaintext bytes the probe said it lost inside a session's stream (client side: the
    /// session ends as `CaptureGap`; production side: its replies are lost to the report).
    pub tls_plain_bytes_lost: u64,
    /// Plaintext bytes of no session we mirror: a TLS connection opened before the copier
    /// (not mirrored yet), one not admitted or already ended, or one never seen start TLS.
    pub tls_plain_bytes_unmatched: u64,
    /// Plaintext bytes that arrived before their session's SSLRequest was read, and were
    /// still waiting when it ended (its TLS never started in our eyes).
    pub tls_plain_bytes_unused: u64,
    /// Plaintext bytes of connections `--sample` left out: not mirrored by design, not a loss.
    pub tls_plain_bytes_not_sampled: u64,

    // --- toward the test server ---
    /// Bytes queued toward the test server (client bytes, or what transforms pushed).
    pub bytes_queued: u64,
    /// Bytes a transform pushed after our FIN was placed (a transform bug): discarded.
    pub transform_bytes_refused: u64,
    /// Bytes sent for the first time.
    pub bytes_sent: u64,
    /// Bytes sent again (retransmissions).
    pub bytes_resent: u64,
    /// Every packet handed out by `poll_transmit`.
    pub segments_sent: u64,
    /// Segments (SYN, data, FIN) that repeat something already sent.
    pub segments_resent: u64,
    pub pure_acks_sent: u64,
    /// Retransmission timer expirations (each triggers a go-back retransmission).
    pub retransmit_timeouts: u64,
    /// Fast retransmits (three duplicate ACKs).
    pub fast_retransmits: u64,
    pub zero_window_probes: u64,
    /// Times feedback came back after a silence long enough to mean the path was away
    /// (intercept stalled, restarted or unreachable): every waiting session was resynced.
    pub feedback_resumed: u64,
    /// Sessions resynced then: their backoff forgotten and a probe sent that makes the test
    /// server restate its ACK and window at once.
    pub sessions_resynced: u64,
    /// Client bytes captured while their session waited to be re-established (the test server
    /// restarted or refused it), replayed by the session that came back, ahead of the packet
    /// that brought it back (see `session/recovery.rs`)...
    pub held_bytes_replayed: u64,
    /// Of those held, bytes the lost connection had been sent and had not answered (or not
    /// been sent yet): carried over to the session that re-establishes it
    /// (`session/replay.rs`), counted when carried.
    pub held_bytes_carried: u64,
    /// ...and those lost: a capture hole in the run, over the session's buffer or the memory
    /// budget, or the session never re-established (its client left first).
    pub held_bytes_lost: u64,
    pub rsts_sent: u64,
    /// RSTs sent because the copier shut down with the session still open.
    pub shutdown_resets: u64,
    /// `poll_transmit` was given a buffer too small for the next packet (an edge bug).
    pub transmit_buffer_too_small: u64,
    /// Observations of finished commands (the report's) dropped because the engine's queue
    /// held `EngineConfig::max_observations` the driver had not collected yet.
    pub observations_dropped: u64,
    /// Engine-generated RST/ACK packets dropped because too many were queued.
    pub control_queue_dropped: u64,
    /// Events dropped because the edge did not drain `poll_event`.
    pub events_dropped: u64,

    // --- feedback from intercept ---
    pub feedback_received: u64,
    /// Feedback for an address we do not mirror (or from another server).
    pub feedback_unknown_session: u64,
    /// Feedback that did not fit the session: late, duplicate or for a closed session.
    pub feedback_stale: u64,
    /// Feedback acknowledging bytes we never sent.
    pub feedback_ack_beyond_sent: u64,
    /// Test-server segments seen beyond a hole (an earlier one's feedback was lost).
    pub feedback_out_of_order: u64,
    /// Test-server segments seen again (it retransmitted: an ACK of ours was lost).
    pub feedback_test_retransmits: u64,
    /// `on_test_event` for an address we do not mirror (or a closed session).
    pub test_events_unknown_session: u64,

    // --- transforms ---
    /// Sessions re-established through the pickup path after losing only their test-side
    /// connection, by why that connection ended (`CloseReason::index`).
    pub sessions_reestablished: [u64; CloseReason::COUNT],
    /// Closed sessions now waiting to be re-established on their client's next data (gauge).
    pub sessions_awaiting_reestablish: u64,
    /// Client packets of waiting sessions not used to re-establish them yet (pacing).
    pub reestablish_deferred: u64,
    /// Older connections on our 4-tuple that the test server still held, reset so our SYN
    /// could get through (after a copier restart, or a lost RST), once drained: the segments
    /// with replies they sent meanwhile (acknowledged by us), and intercept's framing of those
    /// replies, dropped (they answer the killed copier's commands, not ours).
    pub stale_test_connections_reset: u64,
    pub stale_replies_drained: u64,
    pub stale_test_events: u64,
    /// Counters the sessions' transforms bump, by the id they define; see
    /// `Engine::transform_counter_names`.
    pub transform: TransformStats,
}

impl EngineStats {
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.sessions_closed[reason.index()]
    }

    pub fn closed_total(&self) -> u64 {
        self.sessions_closed.iter().sum()
    }

    /// Sessions re-established after losing their test-side connection, for any reason.
    pub fn reestablished_total(&self) -> u64 {
        self.sessions_reestablished.iter().sum()
    }

    /// Adds the counters of another copy of the same captured traffic (`--multiply`): its
    /// sessions, bytes and losses are its own, but the packets it was handed are not more
    /// captured packets, so the capture-side counters stay ours.
    pub fn merge_copy(&mut self, o: &EngineStats) {
        let keep = (
            self.captured_client_to_prod,
            self.captured_prod_to_client,
            self.captured_ignored,
            self.captured_target,
            self.sessions_not_sampled,
            self.packets_not_sampled,
            self.sample_fallbacks,
        );
        self.merge(o);
        (
            self.captured_client_to_prod,
            self.captured_prod_to_client,
            self.captured_ignored,
            self.captured_target,
            self.sessions_not_sampled,
            self.packets_not_sampled,
            self.sample_fallbacks,
        ) = keep;
    }

    /// Adds another engine's counters (one engine per capture thread).
    pub fn merge(&mut self, o: &EngineStats) {
        macro_rules! add {
            ($($f:ident),* $(,)?) => { $( self.$f += o.$f; )* };
        }
        add!(
            sessions_active,
            sessions_lingering,
            sessions_opened,
            sessions_picked_up,
            sessions_shed,
            sessions_refused_memory,
            memory_bytes,
            memory_peak_bytes,
            sessions_collided,
            pool_exhausted,
            sessions_not_sampled,
            packets_not_sampled,
            sample_fallbacks,
            captured_client_to_prod,
            captured_prod_to_client,
            captured_ignored,
            captured_target,
            captured_unknown_session,
            captured_prod_unknown_session,
            captured_stale,
            client_syn_retransmits,
            client_bytes_duplicate,
            client_segments_held,
            client_segments_dropped,
            client_rsts_ignored,
            client_resets_closed_with_fin,
            client_resets_with_queued_data,
            client_reset_bytes_lost,
            capture_gaps_suspected,
            capture_gaps_skipped,
            capture_gap_bytes_lost,
            capture_gap_segments_skipped,
            prod_gaps_skipped,
            capture_gaps_fatal,
            capture_gaps_stuck,
            client_bytes_reassembled,
            prod_bytes_reassembled,
            prod_segments_dropped,
            tls_plain_client_bytes,
            tls_plain_prod_bytes,
            tls_ciphertext_bytes,
            tls_plain_bytes_lost,
            tls_plain_bytes_unmatched,
            tls_plain_bytes_unused,
            tls_plain_bytes_not_sampled,
            bytes_queued,
            transform_bytes_refused,
            bytes_sent,
            bytes_resent,
            segments_sent,
            segments_resent,
            pure_acks_sent,
            retransmit_timeouts,
            fast_retransmits,
            zero_window_probes,
            feedback_resumed,
            sessions_resynced,
            held_bytes_replayed,
            held_bytes_carried,
            held_bytes_lost,
            rsts_sent,
            shutdown_resets,
            transmit_buffer_too_small,
            observations_dropped,
            control_queue_dropped,
            events_dropped,
            feedback_received,
            feedback_unknown_session,
            feedback_stale,
            feedback_ack_beyond_sent,
            feedback_out_of_order,
            feedback_test_retransmits,
            test_events_unknown_session,
            sessions_awaiting_reestablish,
            reestablish_deferred,
            stale_test_connections_reset,
            stale_replies_drained,
            stale_test_events,
        );
        self.transform.merge(&o.transform);
        for (a, b) in self.sessions_closed.iter_mut().zip(o.sessions_closed) {
            *a += b;
        }
        for (a, b) in self
            .sessions_reestablished
            .iter_mut()
            .zip(o.sessions_reestablished)
        {
            *a += b;
        }
    }
}
