//! `--metrics ADDR:PORT`: intercept's counters in the Prometheus text format
//! (`tcpshadow_intercept_*`, listed in `docs/metrics.md`). The same numbers as the status
//! line and the final summary ([`Status`]), rendered by `outputs` (for the capture loop, or
//! the `--workers` coordinator) at most once a second and served by `tcpshadow_metrics`'s
//! responder thread. Never per packet.

use tcpshadow_metrics::{Exposition, Kind};

use crate::pump::Status;

/// Renders one exposition from a status.
pub fn render_intercept_metrics(s: &Status) -> String {
    let mut e = Exposition::new();
    e.family(
        "tcpshadow_intercept_build_info",
        Kind::Gauge,
        "Always 1; the version label says which intercept runs.",
    );
    e.sample(
        "tcpshadow_intercept_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    e.gauge(
        "tcpshadow_intercept_copiers",
        "Copiers connected now (welcomed control connections).",
        s.copiers as u64,
    );
    e.gauge(
        "tcpshadow_intercept_claimed_addresses",
        "Client addresses claimed by copiers now.",
        s.claimed as u64,
    );

    // --- capture ---
    let src = &s.source;
    e.counter(
        "tcpshadow_intercept_captured_frames_total",
        "Test-server reply frames read from the capture.",
        src.captured,
    );
    let p = &src.parse_errors;
    e.counters(
        "tcpshadow_intercept_parse_errors_total",
        "Captured frames skipped because they did not parse, by reason.",
        [
            ("truncated", p.truncated),
            ("not_ipv4", p.not_ipv4),
            ("not_tcp", p.not_tcp),
            ("bad_ip_header", p.bad_ip_header),
            ("bad_tcp_header", p.bad_tcp_header),
            ("fragment", p.fragment),
            ("other", p.other),
        ]
        .map(|(r, v)| (vec![("reason", r)], v)),
    );
    if let Some(k) = src.kernel {
        e.counter(
            "tcpshadow_intercept_kernel_received_total",
            "Packets the kernel passed the capture filter (pcap_stats; 32-bit, wraps).",
            u64::from(k.received),
        );
        e.counters(
            "tcpshadow_intercept_kernel_drops_total",
            "Packets the kernel dropped before intercept saw them, by where (32-bit, wraps).",
            [
                ("buffer", u64::from(k.dropped)),
                ("interface", u64::from(k.if_dropped)),
            ]
            .map(|(r, v)| (vec![("reason", r)], v)),
        );
    }

    // --- relay ---
    let r = &s.relay;
    e.counters(
        "tcpshadow_intercept_feedback_total",
        "Reply segments turned into feedback, by routing: to the claiming copier, or \
         broadcast because nobody had claimed the address yet.",
        [("routed", r.routed), ("unclaimed_broadcast", r.unclaimed)]
            .map(|(k, v)| (vec![("route", k)], v)),
    );
    e.counter(
        "tcpshadow_intercept_feedback_relayed_total",
        "Feedback items handed to copiers' queues (a broadcast counts once per copier).",
        r.relayed,
    );
    e.counter(
        "tcpshadow_intercept_mysql_events_relayed_total",
        "MySQL packet summaries handed to copiers' queues.",
        r.mysql_relayed,
    );
    e.counters(
        "tcpshadow_intercept_claims_total",
        "Claim bookkeeping, by event.",
        [
            ("claimed", r.claims),
            ("released", r.releases),
            ("moved", r.claims_moved),
            ("refused", r.claims_refused),
        ]
        .map(|(k, v)| (vec![("event", k)], v)),
    );

    // --- MySQL framing ---
    if let Some((m, live)) = &s.mysql {
        e.gauge(
            "tcpshadow_intercept_mysql_sessions",
            "Reply streams framed now.",
            *live as u64,
        );
        e.counter(
            "tcpshadow_intercept_mysql_sessions_framed_total",
            "Reply streams whose framing started at a SYN-ACK.",
            m.sessions_framed,
        );
        e.counter(
            "tcpshadow_intercept_mysql_framing_resumed_total",
            "Lost reply streams framed again from the copier's resync probe.",
            m.framing_resumed,
        );
        e.counter(
            "tcpshadow_intercept_mysql_packets_framed_total",
            "MySQL packets framed (summaries emitted and packets folded).",
            m.packets,
        );
        e.counter(
            "tcpshadow_intercept_mysql_packets_folded_total",
            "Rows and column definitions folded into runs instead of one summary each.",
            m.folded,
        );
        e.counter(
            "tcpshadow_intercept_mysql_runs_total",
            "Runs of folded packets relayed.",
            m.runs,
        );
        e.counter(
            "tcpshadow_intercept_mysql_sessions_expired_total",
            "Reply streams forgotten after --mysql-idle-secs without a segment.",
            m.sessions_expired,
        );
        let a = &m.reassembly;
        e.counters(
            "tcpshadow_intercept_reassembly_total",
            "Reply-stream reassembly events, by kind.",
            [
                ("duplicate", a.duplicates),
                ("hole", a.holes),
                ("out_of_order_held", a.ooo_held),
                ("out_of_order_dropped", a.ooo_dropped),
            ]
            .map(|(k, v)| (vec![("kind", k)], v)),
        );
    }

    // --- control server ---
    let c = &s.server;
    e.gauge(
        "tcpshadow_intercept_control_connections",
        "Control connections open now.",
        c.active,
    );
    e.counters(
        "tcpshadow_intercept_control_connections_total",
        "Control connections, by outcome.",
        [
            ("accepted", c.accepted),
            ("welcomed", c.welcomed),
            ("rejected", c.rejected),
            ("closed", c.closed),
        ]
        .map(|(k, v)| (vec![("result", k)], v)),
    );
    e.counters(
        "tcpshadow_intercept_control_refused_total",
        "Control connections refused, by reason: not_allowed (outside --allow, closed unread), \
         no_secret, bad_secret, version, full (--max-copiers).",
        [
            ("not_allowed", c.refused_allow),
            ("no_secret", c.refused_no_secret),
            ("bad_secret", c.refused_bad_secret),
            ("version", c.refused_version),
            ("full", c.refused_full),
        ]
        .map(|(k, v)| (vec![("reason", k)], v)),
    );
    e.counters(
        "tcpshadow_intercept_control_addresses_total",
        "Addresses received in Claim and Release frames.",
        [("claim", c.claimed_addrs), ("release", c.released_addrs)]
            .map(|(k, v)| (vec![("frame", k)], v)),
    );

    // --- losses ---
    e.family(
        "tcpshadow_intercept_losses_total",
        Kind::Counter,
        "What copiers did not get, by stage and reason (units: see docs/metrics.md).",
    );
    let mut losses: Vec<(&str, &str, u64)> = vec![
        ("capture", "parse_errors", p.total()),
        (
            "capture",
            "kernel_drops",
            src.kernel
                .map_or(0, |k| u64::from(k.dropped) + u64::from(k.if_dropped)),
        ),
        ("relay", "feedback_no_copier", r.no_copier),
        ("relay", "feedback_queue_full", r.dropped_queue_full),
        ("relay", "mysql_events_queue_full", r.mysql_dropped),
        ("relay", "mysql_events_no_copier", r.mysql_no_copier),
        ("control", "refused_full", c.refused_full),
        ("control", "bad_frames", c.garbage),
        ("control", "timeouts", c.timeouts),
        ("control", "write_failures", c.write_failures),
        ("control", "pongs_dropped", c.pongs_dropped),
        ("control", "encode_errors", c.encode_errors),
    ];
    if let Some((m, _)) = &s.mysql {
        losses.extend([
            ("framing", "midstream", m.lost_midstream),
            ("framing", "gap", m.lost_gap),
            ("framing", "snapped", m.lost_snapped),
            ("framing", "memory", m.lost_memory),
            ("framing", "sessions_shed", m.sessions_shed),
        ]);
    }
    for (stage, reason, v) in losses {
        e.sample(
            "tcpshadow_intercept_losses_total",
            &[("stage", stage), ("reason", reason)],
            v,
        );
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pump::KernelStats;
    use crate::sessions::MysqlStats;

    #[test]
    fn status_counters_are_exposed() {
        let mut s = Status {
            copiers: 2,
            claimed: 17,
            mysql: Some((
                MysqlStats {
                    packets: 900,
                    lost_gap: 1,
                    ..MysqlStats::default()
                },
                5,
            )),
            ..Status::default()
        };
        s.source.captured = 1234;
        s.source.kernel = Some(KernelStats {
            received: 1300,
            dropped: 3,
            if_dropped: 0,
        });
        s.relay.relayed = 1200;
        s.relay.dropped_queue_full = 4;
        let text = render_intercept_metrics(&s);
        let samples = tcpshadow_metrics::parse(&text).unwrap();
        let v = |n: &str, l: &[(&str, &str)]| {
            samples
                .iter()
                .find(|s| s.name == n && l.iter().all(|(k, v)| s.label(k) == Some(*v)))
                .map(|s| s.value)
        };
        assert_eq!(
            v("tcpshadow_intercept_captured_frames_total", &[]),
            Some(1234.0)
        );
        assert_eq!(
            v("tcpshadow_intercept_feedback_relayed_total", &[]),
            Some(1200.0)
        );
        assert_eq!(v("tcpshadow_intercept_copiers", &[]), Some(2.0));
        assert_eq!(
            v("tcpshadow_intercept_mysql_packets_framed_total", &[]),
            Some(900.0)
        );
        assert_eq!(
            v(
                "tcpshadow_intercept_losses_total",
                &[("stage", "relay"), ("reason", "feedback_queue_full")]
            ),
            Some(4.0)
        );
        assert_eq!(
            v(
                "tcpshadow_intercept_losses_total",
                &[("stage", "framing"), ("reason", "gap")]
            ),
            Some(1.0)
        );
        assert_eq!(
            v(
                "tcpshadow_intercept_kernel_drops_total",
                &[("reason", "buffer")]
            ),
            Some(3.0)
        );
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let unique: std::collections::BTreeSet<_> =
            text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert_eq!(types, unique.len(), "a family declared twice");
    }
}
