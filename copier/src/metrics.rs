//! `--metrics ADDR:PORT`: the copier's counters in the Prometheus text format
//! (`tcpshadow_copier_*`, listed in `docs/metrics.md`), served by `tcpshadow_metrics`'s
//! responder thread.
//!
//! # What this room is for
//!
//! [`render_copier_metrics`] turns a status [`Snapshot`] (and, when the comparison report is
//! collected, a [`Report`]) into an exposition; [`MetricsPublisher`] re-renders it at most
//! once per [`PUBLISH_INTERVAL`] from the driver's loop and hands it to the responder.
//!
//! # What it must never do
//!
//! * Run per packet or block the loop: one render per second, one pointer swap to publish.
//! * Invent numbers: every value is a counter the summary prints too, under a stable name,
//!   so a dashboard and the end-of-run summary agree.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use common::clock::Instant;
use tcpshadow_metrics::{Exposition, Kind, MetricsServer, Published};

use crate::engine::CloseReason;
use crate::report::{Latency, Report};
use crate::status::{is_protocol_loss, Snapshot, READ_ONLY_PREFIX};

/// How often the loop re-renders the exposition: Prometheus scrapes every 10-60 s, so a
/// second of staleness is invisible and the render cost (a few kB of formatting) negligible.
pub const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// Upper bounds of the per-digest latency histograms, seconds. Fixed, so series stay the same
/// from scrape to scrape whatever buckets the report's latencies use (each report bucket is
/// counted under the first bound at or above its own upper bound: never below a bound it
/// might exceed).
pub const LATENCY_BOUNDS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Renders the copier's metrics. `top_n` digests of `report` (the most frequent: a stable set
/// for dashboards, unlike the regression ranking) get latency histograms.
pub fn render_copier_metrics(s: &Snapshot, report: Option<&Report>, top_n: usize) -> String {
    let mut e = Exposition::new();
    let en = &s.engine;
    let c = &s.capture;
    e.family(
        "tcpshadow_copier_build_info",
        Kind::Gauge,
        "Always 1; the version label says which copier runs.",
    );
    e.sample(
        "tcpshadow_copier_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );

    // --- capture ---
    e.counter(
        "tcpshadow_copier_capture_frames_total",
        "Frames read from the capture.",
        c.frames,
    );
    e.counters(
        "tcpshadow_copier_capture_frames_skipped_total",
        "Captured frames not parsed, by reason.",
        [
            ("truncated", c.truncated),
            ("not_ipv4", c.not_ipv4),
            ("not_tcp", c.not_tcp),
            ("bad_header", c.bad_header),
            ("fragment", c.fragments),
            ("snapped", c.snapped),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );
    e.counters(
        "tcpshadow_copier_capture_kernel_drops_total",
        "Packets the kernel dropped before the copier saw them (pcap_stats), by where.",
        [("buffer", c.kernel_dropped), ("interface", c.if_dropped)]
            .map(|(r, v)| (vec![("reason", r)], v)),
    );
    e.counters(
        "tcpshadow_copier_captured_packets_total",
        "Parsed packets of the production port, by direction.",
        [
            ("client_to_prod", en.captured_client_to_prod),
            ("prod_to_client", en.captured_prod_to_client),
        ]
        .map(|(d, v)| (vec![("direction", d)], v)),
    );
    e.counters(
        "tcpshadow_copier_captured_packets_ignored_total",
        "Captured packets not used, by reason.",
        [
            ("other_traffic", en.captured_ignored),
            ("target", en.captured_target),
            ("unknown_session", en.captured_unknown_session),
            ("prod_unknown_session", en.captured_prod_unknown_session),
            ("stale", en.captured_stale),
            ("not_sampled", en.packets_not_sampled),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );

    // --- sessions ---
    e.gauge(
        "tcpshadow_copier_sessions_active",
        "Sessions mirrored now (handshaking or established).",
        en.sessions_active,
    );
    e.gauge(
        "tcpshadow_copier_sessions_lingering",
        "Closed sessions kept briefly to absorb late packets.",
        en.sessions_lingering,
    );
    e.counters(
        "tcpshadow_copier_sessions_opened_total",
        "Sessions started, by how: from a captured SYN, or picked up mid-stream.",
        [
            ("syn", en.sessions_opened),
            ("picked_up", en.sessions_picked_up),
        ]
        .map(|(h, v)| (vec![("how", h)], v)),
    );
    e.family(
        "tcpshadow_copier_sessions_closed_total",
        Kind::Counter,
        "Sessions ended, by reason.",
    );
    for r in CloseReason::ALL {
        e.sample(
            "tcpshadow_copier_sessions_closed_total",
            &[("reason", r.as_str())],
            en.closed(r),
        );
    }
    e.gauge(
        "tcpshadow_copier_session_memory_bytes",
        "Bytes the sessions hold now, as charged to --max-memory's session budget (fixed size \
         per session plus buffer capacities).",
        en.memory_bytes,
    );
    e.gauge(
        "tcpshadow_copier_session_memory_peak_bytes",
        "Highest session_memory_bytes since start.",
        en.memory_peak_bytes,
    );
    // Fault recovery (engine/recovery.rs): sessions that lost only their test-side connection.
    e.family(
        "tcpshadow_copier_sessions_reestablished_total",
        Kind::Counter,
        "Sessions re-established through the pickup path after losing their test-side \
         connection, by why it ended.",
    );
    for r in CloseReason::ALL {
        let n = en.sessions_reestablished[r.index()];
        if n > 0 || r.is_test_side_loss() {
            e.sample(
                "tcpshadow_copier_sessions_reestablished_total",
                &[("reason", r.as_str())],
                n,
            );
        }
    }
    e.gauge(
        "tcpshadow_copier_sessions_awaiting_reestablish",
        "Closed sessions waiting for their client's next data to be re-established.",
        en.sessions_awaiting_reestablish,
    );
    e.counter(
        "tcpshadow_copier_reestablish_deferred_total",
        "Client packets of waiting sessions not used to re-establish them yet (pacing while \
         the test server does not answer).",
        en.reestablish_deferred,
    );
    e.counter(
        "tcpshadow_copier_client_resets_closed_with_fin_total",
        "Client resets after the client's whole stream: the test server's connection closed \
         with a FIN after it (so it runs what it has not yet) instead of a RST.",
        en.client_resets_closed_with_fin,
    );
    e.counter(
        "tcpshadow_copier_stale_test_connections_reset_total",
        "Older connections the test server still held on a new session's address, reset.",
        en.stale_test_connections_reset,
    );
    e.counters(
        "tcpshadow_copier_sessions_not_mirrored_total",
        "New connections not mirrored, by reason.",
        [
            ("max_sessions", en.sessions_shed),
            ("shed_memory", en.sessions_refused_memory),
            ("address_collision", en.sessions_collided),
            ("pool_exhausted", en.pool_exhausted),
            ("not_sampled", en.sessions_not_sampled),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );

    // --- toward the test server ---
    e.counter(
        "tcpshadow_copier_packets_sent_total",
        "Packets the raw socket sent toward the test servers.",
        s.send.packets,
    );
    e.counter(
        "tcpshadow_copier_sent_bytes_total",
        "Bytes (IP packets) the raw socket sent.",
        s.send.bytes,
    );
    e.counters(
        "tcpshadow_copier_send_failures_total",
        "Raw sends that failed, by reason.",
        [
            ("would_block", s.send.would_block),
            ("error", s.send.errors),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );
    e.counter(
        "tcpshadow_copier_segments_transmitted_total",
        "Packets the engines handed out for sending (SYN, data, ACK, FIN, RST).",
        en.segments_sent,
    );
    e.counter(
        "tcpshadow_copier_segments_retransmitted_total",
        "Segments that repeat something already sent.",
        en.segments_resent,
    );
    e.counters(
        "tcpshadow_copier_retransmissions_total",
        "Retransmission triggers, by kind.",
        [
            ("timeout", en.retransmit_timeouts),
            ("fast", en.fast_retransmits),
            ("zero_window_probe", en.zero_window_probes),
        ]
        .map(|(k, v)| (vec![("kind", k)], v)),
    );
    e.counter(
        "tcpshadow_copier_rsts_sent_total",
        "RSTs sent to the test servers.",
        en.rsts_sent,
    );
    e.counter(
        "tcpshadow_copier_pure_acks_sent_total",
        "ACKs without data sent.",
        en.pure_acks_sent,
    );
    e.counters(
        "tcpshadow_copier_payload_bytes_total",
        "Client payload bytes toward the test servers, by stage.",
        [
            ("reassembled", en.client_bytes_reassembled),
            ("queued", en.bytes_queued),
            ("sent", en.bytes_sent),
            ("resent", en.bytes_resent),
        ]
        .map(|(k, v)| (vec![("stage", k)], v)),
    );

    // --- feedback and the control channel ---
    e.counter(
        "tcpshadow_copier_feedback_total",
        "Test-server segments learnt from intercept and fed to the engines.",
        en.feedback_received,
    );
    e.counter(
        "tcpshadow_copier_held_bytes_replayed_total",
        "Client bytes captured while their session waited to be re-established (the test \
         server restarted or refused it), replayed ahead of the packet that brought it back.",
        en.held_bytes_replayed,
    );
    e.counter(
        "tcpshadow_copier_held_bytes_carried_total",
        "Client bytes of commands a lost test-server connection had been sent and had not \
         answered (or not been sent), carried over to the session that re-establishes it.",
        en.held_bytes_carried,
    );
    e.counter(
        "tcpshadow_copier_feedback_resumed_total",
        "Times feedback came back after a silence of 500 ms or more (intercept stalled, \
         restarted or unreachable, or merely no traffic).",
        en.feedback_resumed,
    );
    e.counter(
        "tcpshadow_copier_sessions_resynced_total",
        "Sessions that waited on the test server through such a silence, resynced at once \
         (backoff forgotten, a probe for the test server's ACK and window) when it ended.",
        en.sessions_resynced,
    );
    e.counters(
        "tcpshadow_copier_feedback_ignored_total",
        "Feedback that did not fit a session, by reason.",
        [
            ("unknown_session", en.feedback_unknown_session),
            ("stale", en.feedback_stale),
            ("ack_beyond_sent", en.feedback_ack_beyond_sent),
            ("out_of_order", en.feedback_out_of_order),
            ("test_retransmit", en.feedback_test_retransmits),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );
    let ctl = &s.control;
    e.gauge(
        "tcpshadow_copier_control_connected",
        "1 while the control channel to intercept is up.",
        u64::from(ctl.connected),
    );
    e.gauge(
        "tcpshadow_copier_control_claimed_addresses",
        "Client addresses claimed at intercept now.",
        ctl.claimed,
    );
    e.counters(
        "tcpshadow_copier_control_connections_total",
        "Control-channel connection attempts, by result.",
        [
            ("welcomed", ctl.connects),
            ("failed", ctl.connect_failures),
            ("rejected", ctl.rejects),
        ]
        .map(|(r, v)| (vec![("result", r)], v)),
    );
    e.counter(
        "tcpshadow_copier_control_reconnects_total",
        "Welcomed control connections after the first.",
        ctl.reconnects,
    );
    e.counters(
        "tcpshadow_copier_control_frames_total",
        "Control-channel frames, by direction.",
        [("in", ctl.frames_in), ("out", ctl.frames_out)].map(|(d, v)| (vec![("direction", d)], v)),
    );
    e.counters(
        "tcpshadow_copier_control_items_total",
        "Items received from intercept, by kind (including those then dropped).",
        [
            ("feedback", ctl.feedback_received),
            ("mysql_event", ctl.mysql_received),
        ]
        .map(|(k, v)| (vec![("kind", k)], v)),
    );

    // --- protocol layer ---
    e.family(
        "tcpshadow_copier_protocol_events_total",
        Kind::Counter,
        "The protocol layer's counters (MySQL logins, commands, statements...), by name.",
    );
    for (name, v) in en.transform.named(s.transform_names) {
        if !name.starts_with(READ_ONLY_PREFIX) {
            e.sample(
                "tcpshadow_copier_protocol_events_total",
                &[("name", name)],
                v,
            );
        }
    }
    e.family(
        "tcpshadow_copier_read_only_skipped_total",
        Kind::Counter,
        "Commands --read-only kept off the test server (by design, not a loss), by kind.",
    );
    for (name, v) in en.transform.named(s.transform_names) {
        if let Some(kind) = name.strip_prefix(READ_ONLY_PREFIX) {
            e.sample(
                "tcpshadow_copier_read_only_skipped_total",
                &[("kind", kind)],
                v,
            );
        }
    }
    if let Some(l) = &s.lookup {
        e.counters(
            "tcpshadow_copier_prod_dsn_lookups_total",
            "--prod-dsn state lookups of picked-up connections, by result.",
            [
                ("requested", l.requested),
                ("answered", l.answered),
                ("not_found", l.not_found),
                ("failed", l.failed),
                ("dropped", l.dropped),
            ]
            .map(|(r, v)| (vec![("result", r)], v)),
        );
        e.counters(
            "tcpshadow_copier_prod_dsn_snapshot_answers_total",
            "Of the answered --prod-dsn lookups, those the start snapshot answered.",
            [(Vec::new(), l.from_snapshot)],
        );
    }

    // --- losses: everything the summary lists under "losses", with machine names ---
    e.family(
        "tcpshadow_copier_losses_total",
        Kind::Counter,
        "Traffic the test server did not get as production did, by stage and reason (units: \
         see docs/metrics.md; packets, sessions, bytes or commands as the reason says).",
    );
    for (stage, reason, v) in losses(s) {
        e.sample(
            "tcpshadow_copier_losses_total",
            &[("stage", stage), ("reason", reason)],
            v,
        );
    }

    if let Some(figures) = &s.report {
        e.family(
            "tcpshadow_copier_commands_lost_total",
            Kind::Counter,
            "Commands the test server did not run as production did, by command, statement kind \
             (first keyword), reason (test_error: ERR on test only; prod_error: ERR on \
             production only; unanswered: sent, never answered, the session ended first; \
             answer_unseen: sent and had by the test server, its answer unreadable at intercept, \
             not known to be lost) and error code.",
        );
        for d in &figures.divergence {
            let code = d.reason.code().map(|c| c.to_string()).unwrap_or_default();
            e.sample(
                "tcpshadow_copier_commands_lost_total",
                &[
                    ("command", d.command),
                    ("kind", d.kind),
                    ("reason", d.reason.label()),
                    ("code", &code),
                ],
                d.count,
            );
        }
    }
    if let Some(r) = report {
        report_metrics(&mut e, r, top_n);
    }
    e.finish()
}

fn losses(s: &Snapshot) -> Vec<(&'static str, &'static str, u64)> {
    let en = &s.engine;
    let mut v = vec![
        (
            "capture",
            "kernel_drops",
            s.capture.kernel_dropped + s.capture.if_dropped,
        ),
        ("capture", "frames_not_parsed", s.capture.skipped()),
        ("session", "max_sessions", en.sessions_shed),
        ("session", "shed_memory", en.sessions_refused_memory),
        ("session", "address_collision", en.sessions_collided),
        ("session", "pool_exhausted", en.pool_exhausted),
        (
            "stream",
            "client_segments_dropped",
            en.client_segments_dropped,
        ),
        ("stream", "client_reset_bytes", en.client_reset_bytes_lost),
        ("stream", "held_while_waiting_bytes", en.held_bytes_lost),
        ("stream", "capture_gaps_gone_past", en.capture_gaps_skipped),
        ("stream", "capture_gap_bytes", en.capture_gap_bytes_lost),
        (
            "send",
            "raw_send_failed",
            s.send.errors + s.send.would_block,
        ),
        ("engine", "events_dropped", en.events_dropped),
        (
            "engine",
            "transform_bytes_after_fin",
            en.transform_bytes_refused,
        ),
        (
            "tls",
            "probe_lost_bytes",
            s.tls_probe.map_or(0, |t| t.lost_bytes()),
        ),
        (
            "tls",
            "probe_unresolved_bytes",
            s.tls_probe.map_or(0, |t| t.unresolved_bytes),
        ),
        ("tls", "ipv6_bytes", s.tls_probe.map_or(0, |t| t.ipv6_bytes)),
        ("tls", "plaintext_missing_bytes", en.tls_plain_bytes_lost),
        (
            "tls",
            "plaintext_unmatched_bytes",
            en.tls_plain_bytes_unmatched,
        ),
        ("tls", "plaintext_unused_bytes", en.tls_plain_bytes_unused),
        (
            "prod_dsn",
            "pooled_connections_not_recovered",
            s.lookup.map_or(0, |l| l.not_recovered()),
        ),
    ];
    for r in CloseReason::ALL {
        if !matches!(
            r,
            CloseReason::Completed | CloseReason::ClientReset | CloseReason::ProdReset
        ) {
            v.push(("session_closed", r.as_str(), en.closed(r)));
        }
    }
    for (name, n) in en.transform.named(s.transform_names) {
        if is_protocol_loss(name) {
            v.push(("protocol", name, n));
        }
    }
    v
}

/// Totals and the top digests' histograms from the comparison report.
fn report_metrics(e: &mut Exposition, r: &Report, top_n: usize) {
    let t = &r.totals;
    e.counter(
        "tcpshadow_copier_commands_total",
        "Commands mirrored and observed (the comparison report's total).",
        t.commands,
    );
    e.counter(
        "tcpshadow_copier_commands_compared_total",
        "Commands whose production and test answers were both known and compared.",
        t.compared,
    );
    e.counters(
        "tcpshadow_copier_command_errors_total",
        "Commands answered with an ERR packet, by side.",
        [("prod", t.prod_errors), ("test", t.test_errors)].map(|(s, v)| (vec![("side", s)], v)),
    );
    e.counters(
        "tcpshadow_copier_command_mismatches_total",
        "Commands whose answers differed, by kind.",
        [("rows", t.row_mismatches), ("result", t.result_mismatches)]
            .map(|(k, v)| (vec![("kind", k)], v)),
    );
    e.counter(
        "tcpshadow_copier_commands_nondeterministic_total",
        "Compared commands with non-deterministic results (differences not counted).",
        t.nondeterministic,
    );
    e.counter(
        "tcpshadow_copier_commands_not_compared_total",
        "Commands with one answer missing.",
        t.not_compared,
    );

    let mut top: Vec<_> = r.digests.iter().collect();
    top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.id.cmp(&b.id)));
    top.truncate(top_n);
    e.family(
        "tcpshadow_copier_digest_info",
        Kind::Gauge,
        "Always 1: the fingerprint and command of each digest with a latency histogram.",
    );
    for d in &top {
        let fp: String = d.fingerprint.chars().take(200).collect();
        e.sample(
            "tcpshadow_copier_digest_info",
            &[
                ("digest", &d.id),
                ("command", &d.command),
                ("fingerprint", &fp),
            ],
            1,
        );
    }
    e.family(
        "tcpshadow_copier_digest_commands_total",
        Kind::Counter,
        "Commands of the digest.",
    );
    for d in &top {
        e.sample(
            "tcpshadow_copier_digest_commands_total",
            &[("digest", &d.id)],
            d.count,
        );
    }
    e.family(
        "tcpshadow_copier_digest_errors_total",
        Kind::Counter,
        "ERR answers of the digest, by side and MySQL error code.",
    );
    for d in &top {
        for (side, errs) in [("prod", &d.prod_errors), ("test", &d.test_errors)] {
            for (code, n) in errs {
                let code = code.to_string();
                e.sample(
                    "tcpshadow_copier_digest_errors_total",
                    &[("digest", &d.id), ("side", side), ("code", &code)],
                    *n,
                );
            }
        }
    }
    e.family(
        "tcpshadow_copier_digest_mismatches_total",
        Kind::Counter,
        "Commands of the digest whose answers differed, by kind.",
    );
    for d in &top {
        for (kind, n) in [("rows", d.row_mismatches), ("result", d.result_mismatches)] {
            e.sample(
                "tcpshadow_copier_digest_mismatches_total",
                &[("digest", &d.id), ("kind", kind)],
                n,
            );
        }
    }
    let name = "tcpshadow_copier_digest_latency_seconds";
    e.family(
        name,
        Kind::Histogram,
        "Command latency of the digest, by side: production measured on the prod host, test \
         on the copier's clock from sending to intercept's summary of the reply.",
    );
    for d in &top {
        for (side, l) in [("prod", &d.prod), ("test", &d.test)] {
            histogram(e, name, &d.id, side, l);
        }
    }
}

fn histogram(e: &mut Exposition, name: &str, digest: &str, side: &str, l: &Latency) {
    let bucket = format!("{name}_bucket");
    for le in LATENCY_BOUNDS_S {
        let le_us = (le * 1e6).round() as u64;
        let n = l
            .buckets
            .iter()
            .filter(|(ub, _)| *ub <= le_us)
            .fold(0u64, |a, (_, n)| a.saturating_add(*n))
            .min(l.count);
        let le = le.to_string();
        e.sample(
            &bucket,
            &[("digest", digest), ("side", side), ("le", &le)],
            n,
        );
    }
    e.sample(
        &bucket,
        &[("digest", digest), ("side", side), ("le", "+Inf")],
        l.count,
    );
    let sum = if l.mean_us.is_finite() {
        l.mean_us * l.count as f64 / 1e6
    } else {
        0.0
    };
    e.sample_f64(
        &format!("{name}_sum"),
        &[("digest", digest), ("side", side)],
        sum,
    );
    e.sample(
        &format!("{name}_count"),
        &[("digest", digest), ("side", side)],
        l.count,
    );
}

/// Serves `--metrics` and re-publishes the exposition at most every [`PUBLISH_INTERVAL`].
pub struct MetricsPublisher {
    published: Published,
    server: MetricsServer,
    next: Instant,
    top_n: usize,
}

impl MetricsPublisher {
    /// Binds `addr` (an error names the flag: a taken port must stop the start-up).
    pub fn start(addr: SocketAddr, top_n: usize, now: Instant) -> Result<Self> {
        let published = Published::new();
        let server = tcpshadow_metrics::serve(addr, published.clone(), "copier-metrics")
            .with_context(|| format!("--metrics {addr}: cannot listen"))?;
        tracing::info!("metrics on http://{}/metrics", server.local_addr());
        Ok(Self {
            published,
            server,
            next: now,
            top_n,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// When the next publish is due.
    pub fn next_due(&self) -> Instant {
        self.next
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Renders and publishes now.
    pub fn publish(&mut self, now: Instant, s: &Snapshot, report: Option<&Report>) {
        self.published
            .set(render_copier_metrics(s, report, self.top_n));
        self.next = now + PUBLISH_INTERVAL;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::report::fixtures::sample_report;
    use tcpshadow_metrics::parse;

    fn value(samples: &[tcpshadow_metrics::Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
        samples
            .iter()
            .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {name} {labels:?}"))
            .value
    }

    #[test]
    fn parameter_type_counters_are_exposed_by_name() {
        use crate::mysql::{Counter, COUNTER_NAMES};
        let mut s = Snapshot {
            transform_names: COUNTER_NAMES,
            ..Snapshot::default()
        };
        s.engine
            .transform
            .add(Counter::ParamTypesGuessed as usize, 176);
        s.engine
            .transform
            .add(Counter::ExecutesDroppedUndecodable as usize, 5);
        let text = render_copier_metrics(&s, None, 10);
        let samples = parse(&text).unwrap();
        let v = |n: &str, l: &[(&str, &str)]| value(&samples, n, l);
        assert_eq!(
            v(
                "tcpshadow_copier_protocol_events_total",
                &[("name", "param_types_guessed")]
            ),
            176.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_losses_total",
                &[
                    ("stage", "protocol"),
                    ("reason", "executes_dropped_undecodable")
                ]
            ),
            5.0
        );
        assert!(!samples
            .iter()
            .any(|s| s.name == "tcpshadow_copier_losses_total"
                && s.label("reason") == Some("param_types_guessed")));
    }

    #[test]
    fn snapshot_counters_are_exposed_under_stable_names() {
        let mut s = Snapshot {
            transform_names: &[
                "commands_forwarded",
                "executes_dropped_unknown_statement",
                "read_only_skipped_insert",
            ],
            ..Snapshot::default()
        };
        s.engine.sessions_opened = 12;
        s.engine.sessions_picked_up = 3;
        s.engine.sessions_active = 4;
        s.engine.sessions_closed[CloseReason::IdleTimeout.index()] = 2;
        s.engine.transform.add(0, 100);
        s.engine.transform.add(1, 5);
        s.engine.transform.add(2, 9);
        s.capture.frames = 1000;
        s.capture.kernel_dropped = 7;
        s.send.packets = 990;
        s.control.connected = true;
        let text = render_copier_metrics(&s, None, 10);
        let samples = parse(&text).unwrap();
        let v = |n: &str, l: &[(&str, &str)]| value(&samples, n, l);
        assert_eq!(
            v("tcpshadow_copier_sessions_opened_total", &[("how", "syn")]),
            12.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_sessions_opened_total",
                &[("how", "picked_up")]
            ),
            3.0
        );
        assert_eq!(v("tcpshadow_copier_sessions_active", &[]), 4.0);
        assert_eq!(
            v(
                "tcpshadow_copier_sessions_closed_total",
                &[("reason", "idle_timeout")]
            ),
            2.0
        );
        assert_eq!(v("tcpshadow_copier_capture_frames_total", &[]), 1000.0);
        assert_eq!(v("tcpshadow_copier_packets_sent_total", &[]), 990.0);
        assert_eq!(v("tcpshadow_copier_control_connected", &[]), 1.0);
        assert_eq!(
            v(
                "tcpshadow_copier_protocol_events_total",
                &[("name", "commands_forwarded")]
            ),
            100.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_read_only_skipped_total",
                &[("kind", "insert")]
            ),
            9.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_losses_total",
                &[
                    ("stage", "protocol"),
                    ("reason", "executes_dropped_unknown_statement")
                ]
            ),
            5.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_losses_total",
                &[("stage", "capture"), ("reason", "kernel_drops")]
            ),
            7.0
        );
        assert_eq!(
            v(
                "tcpshadow_copier_losses_total",
                &[("stage", "session_closed"), ("reason", "idle_timeout")]
            ),
            2.0
        );
        // Every family is declared once and its samples follow it; counters end in _total.
        let mut declared = BTreeSet::new();
        let mut kinds = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line[7..].split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(declared.insert(name.to_string()), "{name} declared twice");
            kinds.insert(name.to_string(), kind.to_string());
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            }
            assert!(name.starts_with("tcpshadow_copier_"), "{name}");
        }
        for s in &samples {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suf| {
                    s.name
                        .strip_suffix(suf)
                        .filter(|f| kinds.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(&s.name);
            assert!(declared.contains(family), "{} has no TYPE", s.name);
        }
    }

    #[test]
    fn report_digests_get_cumulative_histograms() {
        let r = sample_report();
        let text = render_copier_metrics(&Snapshot::default(), Some(&r), 3);
        let samples = parse(&text).unwrap();
        let digests: BTreeSet<&str> = samples
            .iter()
            .filter(|s| s.name == "tcpshadow_copier_digest_latency_seconds_count")
            .filter_map(|s| s.label("digest"))
            .collect();
        assert_eq!(digests.len(), 3, "top 3 digests only");
        for d in &digests {
            for side in ["prod", "test"] {
                let buckets: Vec<f64> = samples
                    .iter()
                    .filter(|s| {
                        s.name == "tcpshadow_copier_digest_latency_seconds_bucket"
                            && s.label("digest") == Some(d)
                            && s.label("side") == Some(side)
                    })
                    .map(|s| s.value)
                    .collect();
                assert_eq!(buckets.len(), LATENCY_BOUNDS_S.len() + 1);
                assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
                let count = value(
                    &samples,
                    "tcpshadow_copier_digest_latency_seconds_count",
                    &[("digest", d), ("side", side)],
                );
                assert_eq!(*buckets.last().unwrap(), count);
            }
        }
        assert_eq!(
            value(
                &samples,
                "tcpshadow_copier_command_errors_total",
                &[("side", "test")]
            ),
            r.totals.test_errors as f64
        );
        // The hostile fingerprint is not among the top 3; with all digests, it stays one line.
        let all = render_copier_metrics(&Snapshot::default(), Some(&r), 100);
        assert!(parse(&all).is_ok());
        assert!(
            all.contains("t<script>alert(1)</script>"),
            "label values are not HTML"
        );
    }

    #[test]
    fn publisher_serves_what_it_renders() {
        let mut p =
            MetricsPublisher::start("127.0.0.1:0".parse().unwrap(), 5, Instant::ZERO).unwrap();
        assert!(p.due(Instant::ZERO));
        let mut s = Snapshot::default();
        s.capture.frames = 42;
        p.publish(Instant::ZERO, &s, None);
        assert!(!p.due(Instant::ZERO));
        assert!(p.due(Instant::ZERO + PUBLISH_INTERVAL));
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(p.local_addr()).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(
            out.contains("\ntcpshadow_copier_capture_frames_total 42\n"),
            "{out}"
        );
    }
}
