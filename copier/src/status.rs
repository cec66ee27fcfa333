//! What the copier tells its operator: a one-line status every few seconds and a summary at
//! the end. Every loss the engine and the edges count is shown here, so "the test server saw
//! less" can be told apart from "we never captured it" and "we gave up on it".

use std::fmt::Write as _;
use std::time::Duration;

use common::clock::Instant;

use crate::capture::CaptureStats;
use crate::control_client::ClientStats;
use crate::engine::{CloseReason, EngineStats};
use crate::prod_state::LookupStats;
use crate::report::fmt_us;
use crate::report::reporting::ReportFigures;
use crate::send::SendStats;

/// All counters at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub engine: EngineStats,
    pub capture: CaptureStats,
    pub send: SendStats,
    pub control: ClientStats,
    /// Names of the protocol layer's counters (`engine.transform`), by id.
    pub transform_names: &'static [&'static str],
    /// `--prod-dsn` lookups, when enabled.
    pub lookup: Option<LookupStats>,
    /// Sessions per captured connection (`--multiply`; 0 or 1: one).
    pub copies: usize,
    /// `--sample`, in percent.
    pub sample_percent: Option<f64>,
    /// `--report` (or `--metrics` in MySQL mode): the comparison so far.
    pub report: Option<ReportFigures>,
    /// The TLS plaintext probe, when attached (`--tls-sessions`).
    pub tls_probe: Option<TlsProbeFigures>,
}

/// What the TLS plaintext probe counted (its own losses; the sessions' are the engine's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsProbeFigures {
    /// Pieces of plaintext handed on, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Bytes not copied: the ring was full, or a call was larger than the probe copies.
    pub ring_full_bytes: u64,
    pub truncated_bytes: u64,
    /// Pieces whose connection could not be told (no 4-tuple for their socket): dropped.
    pub unresolved_chunks: u64,
    pub unresolved_bytes: u64,
    /// Bytes of TLS sessions on a Unix socket (no packet to mirror them as).
    pub not_tcp_bytes: u64,
    /// Bytes of TLS sessions over IPv6 (the mirror is IPv4 only).
    pub ipv6_bytes: u64,
    /// TLS streams seen start, and streams first seen midway (open before the probe).
    pub streams_started: u64,
    pub streams_joined_midway: u64,
}

impl TlsProbeFigures {
    pub fn lost_bytes(&self) -> u64 {
        self.ring_full_bytes + self.truncated_bytes
    }
}

impl Snapshot {
    fn abandoned(&self) -> u64 {
        CloseReason::ALL
            .iter()
            .filter(|r| {
                !matches!(
                    r,
                    CloseReason::Completed
                        | CloseReason::ClientReset
                        | CloseReason::ProdReset
                        | CloseReason::Shutdown
                )
            })
            .map(|r| self.engine.closed(*r))
            .sum()
    }

    /// Sessions or bytes that did not make it to the test server, by where they were lost.
    fn losses(&self) -> Vec<(&'static str, u64)> {
        let e = &self.engine;
        let mut v = vec![
            (
                "kernel capture drops",
                self.capture.kernel_dropped + self.capture.if_dropped,
            ),
            ("frames not parsed", self.capture.skipped()),
            ("connections not mirrored (max sessions)", e.sessions_shed),
            (
                "connections not mirrored (--max-memory)",
                e.sessions_refused_memory,
            ),
            (
                "connections not mirrored (address collision)",
                e.sessions_collided,
            ),
            (
                "connections not mirrored (pool exhausted)",
                e.pool_exhausted,
            ),
            (
                "client segments dropped (too far ahead)",
                e.client_segments_dropped,
            ),
            ("bytes lost to client resets", e.client_reset_bytes_lost),
            (
                "client bytes lost while their session waited for the test server",
                e.held_bytes_lost,
            ),
            (
                "capture gaps gone past (their commands not mirrored; the sessions went on)",
                e.capture_gaps_skipped,
            ),
            (
                "client bytes in those capture gaps",
                e.capture_gap_bytes_lost,
            ),
            ("raw sends failed", self.send.errors + self.send.would_block),
            ("events dropped", e.events_dropped),
            (
                "bytes pushed by a transform after FIN",
                e.transform_bytes_refused,
            ),
            (
                // They log in as --mysql-default-user; executes of statements they prepared
                // before the copier started are then dropped (counted by the protocol layer).
                "pooled connections not recovered (--prod-dsn)",
                self.lookup.map_or(0, |l| l.not_recovered()),
            ),
            (
                "TLS plaintext bytes the probe lost (ring full, or a call larger than it copies)",
                self.tls_probe.map_or(0, |t| t.lost_bytes()),
            ),
            (
                "TLS plaintext bytes of connections the probe could not tell (no 4-tuple)",
                self.tls_probe.map_or(0, |t| t.unresolved_bytes),
            ),
            (
                "TLS plaintext bytes of IPv6 connections (the mirror is IPv4 only)",
                self.tls_probe.map_or(0, |t| t.ipv6_bytes),
            ),
            (
                "TLS plaintext bytes missing inside mirrored sessions",
                e.tls_plain_bytes_lost,
            ),
            (
                "TLS plaintext bytes of connections not mirrored (open before the copier, or \
                 not admitted; --sample's choices are not losses)",
                e.tls_plain_bytes_unmatched,
            ),
            (
                "TLS plaintext bytes whose session never started TLS in the capture",
                e.tls_plain_bytes_unused,
            ),
            (
                "report: observations dropped (queue full)",
                self.report.as_ref().map_or(0, |r| r.dropped) + e.observations_dropped,
            ),
        ];
        for r in CloseReason::ALL {
            if !matches!(
                r,
                CloseReason::Completed | CloseReason::ClientReset | CloseReason::ProdReset
            ) {
                v.push((close_label(r), e.closed(r)));
            }
        }
        v
    }
}

fn close_label(r: CloseReason) -> &'static str {
    match r {
        CloseReason::Completed => "sessions closed normally",
        CloseReason::ClientReset => "sessions reset by the client",
        CloseReason::ProdReset => "sessions reset by production",
        CloseReason::TestReset => "sessions reset by the test server",
        CloseReason::TestRefused => "sessions refused by the test server",
        CloseReason::HandshakeTimeout => "sessions abandoned: handshake timeout",
        CloseReason::IdleTimeout => "sessions abandoned: idle timeout",
        CloseReason::CloseTimeout => "sessions abandoned: close timeout",
        CloseReason::TooManyRetransmits => "sessions abandoned: test server stopped acknowledging",
        CloseReason::BufferOverflow => {
            "sessions abandoned: session buffer full (test server too slow, or a command bigger \
             than a quarter of --max-memory's session part: raise --max-memory)"
        }
        CloseReason::CaptureGap => "sessions abandoned: capture gap",
        CloseReason::Reused => "sessions replaced by a reused client port",
        CloseReason::Shutdown => "sessions reset at copier exit",
        CloseReason::NotMirrorable => "sessions not mirrorable (protocol cannot be rewritten)",
        CloseReason::ShedMemory => "sessions shed: --max-memory reached (largest first)",
    }
}

/// Prints the periodic status line (rates over the last interval).
pub struct StatusLine {
    interval: Option<Duration>,
    next: Option<Instant>,
    last_at: Instant,
    last: Snapshot,
}

impl StatusLine {
    pub fn new(now: Instant, interval: Option<Duration>) -> Self {
        Self {
            interval,
            next: interval.map(|i| now + i),
            last_at: now,
            last: Snapshot::default(),
        }
    }

    pub fn next_due(&self) -> Option<Instant> {
        self.next
    }

    pub fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|n| now >= n)
    }

    pub fn print(&mut self, now: Instant, s: &Snapshot) {
        let secs = now.saturating_since(self.last_at).as_secs_f64().max(1e-3);
        let e = &s.engine;
        let l = &self.last.engine;
        let rate = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / secs;
        let shaping = if s.copies > 1 || s.sample_percent.is_some() {
            format!(
                " | multiply={} sample={} not_sampled={}",
                s.copies.max(1),
                s.sample_percent
                    .map_or_else(|| "off".to_string(), |p| format!("{p:.1}%")),
                e.sessions_not_sampled,
            )
        } else {
            String::new()
        };
        let report = match &s.report {
            Some(r) => format!(
                " | qps prod {:.0} test {:.0} | p99 prod {} test {} | mismatches={} test_errors={} \
                 lost_on_test={}",
                r.live.prod_qps,
                r.live.test_qps,
                fmt_us(r.live.prod_p99_us),
                fmt_us(r.live.test_p99_us),
                r.totals.row_mismatches + r.totals.result_mismatches,
                r.totals.test_errors,
                r.divergence
                    .iter()
                    .filter(|d| d.reason.is_loss())
                    .map(|d| d.count)
                    .sum::<u64>(),
            ),
            None => String::new(),
        };
        let shed = |e: &EngineStats| e.closed(CloseReason::ShedMemory) + e.sessions_refused_memory;
        if shed(e) > shed(l) {
            // Once per interval, not per session: under memory pressure sessions go by the
            // hundred and a line each would itself be a burden.
            tracing::warn!(
                "--max-memory reached: {} sessions shed (largest first, reset on the test server) \
                 and {} new connections not mirrored in the last {:.0} s; sessions hold {:.1} MiB \
                 (peak {:.1} MiB)",
                e.closed(CloseReason::ShedMemory) - l.closed(CloseReason::ShedMemory),
                e.sessions_refused_memory - l.sessions_refused_memory,
                secs,
                e.memory_bytes as f64 / 1048576.0,
                e.memory_peak_bytes as f64 / 1048576.0,
            );
        }
        tracing::info!(
            "sessions active={} new={} picked_up={} closed={} abandoned={} reestablished={} awaiting={} mem={:.1}MiB shed_memory={} | captured {:.0}/s (client {} prod {}) \
             | sent {:.0}/s retrans={} rst={} | feedback {:.0}/s | kernel_drops={} | {}{shaping}{report}",
            e.sessions_active,
            e.sessions_opened - l.sessions_opened,
            e.sessions_picked_up - l.sessions_picked_up,
            e.closed_total() - l.closed_total(),
            s.abandoned() - self.last.abandoned(),
            e.reestablished_total() - l.reestablished_total(),
            e.sessions_awaiting_reestablish,
            e.memory_bytes as f64 / 1048576.0,
            shed(e),
            rate(s.capture.frames, self.last.capture.frames),
            e.captured_client_to_prod,
            e.captured_prod_to_client,
            rate(e.segments_sent, l.segments_sent),
            e.segments_resent,
            e.rsts_sent,
            rate(e.feedback_received, l.feedback_received),
            s.capture.kernel_dropped + s.capture.if_dropped,
            s.control,
        );
        self.last = s.clone();
        self.last_at = now;
        self.next = self.interval.map(|i| now + i);
    }
}

// What counts as a loss is the MySQL layer's to say: its counters are named there.
pub(crate) use crate::mysql::{is_protocol_loss, READ_ONLY_PREFIX};

/// For the protocol-layer losses a flag or a file would have avoided: why they happened and
/// what to change. A loss a user can do nothing about (the test server rejected a statement,
/// say) gets no hint; its name says what happened.
fn protocol_loss_fix(name: &str) -> Option<&'static str> {
    Some(match name {
        "executes_dropped_prepared_before_pickup" => {
            "statements prepared before the copier saw the connection: --prod-dsn recovers them"
        }
        "commands_dropped_before_state_read" => {
            "picked-up connections ran them before --prod-dsn read their state (their user \
             variables or schema then are unknown)"
        }
        "commands_dropped_before_transaction_boundary" => {
            "picked-up connections were inside a transaction whose start ran before the copier \
             saw them; they are mirrored from its end on"
        }
        "commands_dropped_in_transaction_cut_by_gap" => {
            "writes of transactions a capture gap (kernel drops) cut, from the gap to their end: \
             see the capture ring"
        }
        "executes_dropped_prepared_in_capture_gap" => {
            "statements whose prepare the capture lost (kernel drops): see the capture ring"
        }
        "pickup_no_default_user" => {
            "connections open before the copier started, user unknown: set --mysql-default-user \
             or --prod-dsn"
        }
        "no_credentials" => "logins of users missing from --mysql-credentials",
        "not_mirrorable_tls" => {
            "TLS sessions: mirrored from production's plaintext when the eBPF probe is attached \
             (--tls-sessions on); the log said why it is not"
        }
        "not_mirrorable_compression" => {
            "cannot be rewritten at packet level; the log names each client once"
        }
        _ => return None,
    })
}

/// TLS sessions mirrored from their plaintext, and what the probe saw; `None` when the
/// probe is not attached and no TLS session was mirrored.
fn tls_line(s: &Snapshot) -> Option<String> {
    let e = &s.engine;
    let from_plaintext = e
        .transform
        .named(s.transform_names)
        .find(|(n, _)| *n == "tls_sessions_from_plaintext")
        .map_or(0, |(_, v)| v);
    let p = s.tls_probe?;
    Some(format!(
        "  tls: {from_plaintext} sessions mirrored from their plaintext ({} bytes from clients, \
         {} from production; {} bytes of ciphertext passed over); probe: {} streams started, {} \
         joined midway, {} pieces ({} bytes), {} lost bytes, {} pieces of unknown connections; \
         {} bytes of sessions on a Unix socket (never captured, like any); {} bytes of \
         connections --sample left out (by design)",
        e.tls_plain_client_bytes,
        e.tls_plain_prod_bytes,
        e.tls_ciphertext_bytes,
        p.streams_started,
        p.streams_joined_midway,
        p.chunks,
        p.bytes,
        p.lost_bytes(),
        p.unresolved_chunks,
        p.not_tcp_bytes,
        e.tls_plain_bytes_not_sampled,
    ))
}

/// The end-of-run summary, several lines, for a person.
pub fn summary(s: &Snapshot, elapsed: Duration) -> String {
    let e = &s.engine;
    let mut out = String::new();
    let _ = writeln!(out, "copier summary after {:.1} s", elapsed.as_secs_f64());
    let _ = writeln!(
        out,
        "  sessions: {} opened from SYN, {} picked up mid-stream, {} closed normally{}, {} reset by client/prod, {} abandoned",
        e.sessions_opened,
        e.sessions_picked_up,
        e.closed(CloseReason::Completed),
        if e.client_resets_closed_with_fin > 0 {
            format!(
                " ({} after a client's reset: a FIN after its whole stream let the test server \
                 run it all)",
                e.client_resets_closed_with_fin
            )
        } else {
            String::new()
        },
        e.closed(CloseReason::ClientReset) + e.closed(CloseReason::ProdReset),
        s.abandoned()
    );
    if s.copies > 1 || s.sample_percent.is_some() {
        let _ = writeln!(
            out,
            "  shaping: multiply={} (sessions above count every copy), sample={}: {} connections \
             not sampled ({} packets)",
            s.copies.max(1),
            s.sample_percent
                .map_or_else(|| "off".to_string(), |p| format!("{p:.1}%")),
            e.sessions_not_sampled,
            e.packets_not_sampled,
        );
        if e.sample_fallbacks > 0 {
            let _ = writeln!(
                out,
                "  sample: {} new connections decided by the fixed hash alone (table of decisions \
                 full: the share is less exact)",
                e.sample_fallbacks,
            );
        }
    }
    if e.reestablished_total() > 0 || e.stale_test_connections_reset > 0 {
        let by: Vec<String> = CloseReason::ALL
            .iter()
            .filter(|r| e.sessions_reestablished[r.index()] > 0)
            .map(|r| format!("{}={}", r.as_str(), e.sessions_reestablished[r.index()]))
            .collect();
        let _ = writeln!(
            out,
            "  recovery: {} sessions re-established after losing their test-side connection ({}); \
             {} still waiting; {} stale test connections reset (after draining {} replies); {} \
             bytes the clients sent meanwhile replayed, {} lost; {} bytes of commands the lost \
             connections had not answered carried over to be sent again",
            e.reestablished_total(),
            by.join(" "),
            e.sessions_awaiting_reestablish,
            e.stale_test_connections_reset,
            e.stale_replies_drained,
            e.held_bytes_replayed,
            e.held_bytes_lost,
            e.held_bytes_carried,
        );
    }
    if let Some(line) = tls_line(s) {
        let _ = writeln!(out, "{line}");
    }
    let bridged = if s.capture.bridged > 0 {
        format!(
            "; {} carried by the bridge socket while the ring was allocated",
            s.capture.bridged
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  captured: {} frames ({} client->prod, {} prod->client packets); {} kernel drops{bridged}",
        s.capture.frames,
        e.captured_client_to_prod,
        e.captured_prod_to_client,
        s.capture.kernel_dropped + s.capture.if_dropped
    );
    let _ = writeln!(
        out,
        "  to test: {} bytes queued, {} sent, {} resent; {} packets ({} retransmitted, {} RTO, {} fast), {} RST",
        e.bytes_queued,
        e.bytes_sent,
        e.bytes_resent,
        e.segments_sent,
        e.segments_resent,
        e.retransmit_timeouts,
        e.fast_retransmits,
        e.rsts_sent
    );
    let _ = writeln!(
        out,
        "  raw socket: {} packets in {} send calls",
        s.send.packets, s.send.syscalls
    );
    let _ = writeln!(
        out,
        "  feedback: {} from intercept ({} unknown session, {} stale, {} MySQL events for \
         sessions already ended; back after {} outages, {} waiting sessions resynced); \
         control: {}",
        e.feedback_received,
        e.feedback_unknown_session,
        e.feedback_stale,
        e.test_events_unknown_session,
        e.feedback_resumed,
        e.sessions_resynced,
        s.control
    );
    if e.capture_gaps_suspected > 0 {
        let _ = writeln!(
            out,
            "  capture gaps: {} suspected; {} gone past (the session went on from the next \
             command: {} client bytes lost, {} segments after them skipped; {} holes in \
             production's replies), {} ended their session ({} in a login or inside a \
             command, {} stuck)",
            e.capture_gaps_suspected,
            e.capture_gaps_skipped,
            e.capture_gap_bytes_lost,
            e.capture_gap_segments_skipped,
            e.prod_gaps_skipped,
            e.capture_gaps_fatal,
            e.transform
                .get(crate::mysql::Counter::CaptureGapsInsideCommand as usize),
            e.capture_gaps_stuck,
        );
    }
    let proto: Vec<String> = s
        .engine
        .transform
        .named(s.transform_names)
        .filter(|(name, n)| *n > 0 && !name.starts_with(READ_ONLY_PREFIX))
        .map(|(name, n)| format!("{name}={n}"))
        .collect();
    if !proto.is_empty() {
        let _ = writeln!(out, "  protocol layer: {}", proto.join(" "));
    }
    let skipped: Vec<(&str, u64)> = s
        .engine
        .transform
        .named(s.transform_names)
        .filter_map(|(name, n)| Some((name.strip_prefix(READ_ONLY_PREFIX)?, n)))
        .filter(|(_, n)| *n > 0)
        .collect();
    if !skipped.is_empty() {
        let total: u64 = skipped.iter().map(|(_, n)| n).sum();
        let each: Vec<String> = skipped.iter().map(|(k, n)| format!("{k}={n}")).collect();
        let _ = writeln!(
            out,
            "  read-only: {total} commands not mirrored (writes, by design): {}",
            each.join(" ")
        );
    }
    if let Some(r) = &s.report {
        let t = &r.totals;
        let _ = writeln!(
            out,
            "  report: {} commands, {} compared ({} not compared), {} row mismatches, {} result \
             mismatches, {} non-deterministic; errors prod {} test {}{}",
            t.commands,
            t.compared,
            t.not_compared,
            t.row_mismatches,
            t.result_mismatches,
            t.nondeterministic,
            t.prod_errors,
            t.test_errors,
            r.dir
                .as_ref()
                .map_or_else(String::new, |d| format!("; written to {}", d.display())),
        );
    }
    if let Some(l) = &s.lookup {
        let _ = writeln!(
            out,
            "  --prod-dsn lookups: {} requested, {} answered, {} not found, {} failed, {} dropped (queue full)",
            l.requested, l.answered, l.not_found, l.failed, l.dropped
        );
        if l.snapshot_queries > 0 {
            // Not among the own statements below: the snapshot runs once, as the copier starts.
            let _ = writeln!(
                out,
                "  --prod-dsn start snapshot: {} connections read in {} queries before any was \
                 seen, {} picked-up sessions started from it",
                l.snapshot_connections, l.snapshot_queries, l.from_snapshot
            );
        }
    }
    // Statements the copier ran itself, by the name of the server counter they bump: a
    // comparison of what both servers executed takes them out (tests/src/work.rs reads this).
    let proto = |name: &str| {
        s.engine
            .transform
            .named(s.transform_names)
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| v)
    };
    let own_prod = s.lookup.map_or(0, |l| l.queries);
    let (init_db, sets) = (proto("injected_init_db"), proto("recovered_variables"));
    if own_prod + init_db + sets > 0 {
        let _ = writeln!(
            out,
            "  own statements: production select={own_prod}; test change_db={init_db} \
             set_option={sets}"
        );
    }
    let _ = writeln!(
        out,
        "  session memory (--max-memory): peak {:.1} MiB, {} sessions shed, {} connections refused",
        e.memory_peak_bytes as f64 / 1048576.0,
        e.closed(CloseReason::ShedMemory),
        e.sessions_refused_memory,
    );
    let mut losses: Vec<(String, u64)> = s
        .losses()
        .into_iter()
        .map(|(what, n)| (what.to_string(), n))
        .collect();
    // The protocol layer's counters that mean "the test server did not get what production
    // did" are losses too; the names say which.
    losses.extend(
        s.engine
            .transform
            .named(s.transform_names)
            .filter(|(name, _)| is_protocol_loss(name))
            .map(|(name, n)| {
                let what = format!("protocol layer: {}", name.replace('_', " "));
                match protocol_loss_fix(name) {
                    Some(fix) => (format!("{what} ({fix})"), n),
                    None => (what, n),
                }
            }),
    );
    if let Some(r) = &s.report {
        // Executes of a statement the test server refused to prepare are listed here, by
        // kind and code, so the protocol layer's count of the same commands is not repeated.
        losses.retain(|(what, _)| !what.starts_with("protocol layer: executes dropped rejected"));
        losses.extend(r.divergence.iter().filter(|d| d.reason.is_loss()).map(|d| {
            let what = if d.kind == "-" {
                d.command.to_string()
            } else {
                format!("{} {}", d.command, d.kind)
            };
            (format!("commands: {what}: {}", d.reason), d.count)
        }));
    }
    losses.retain(|(_, n)| *n > 0);
    if let Some(r) = &s.report {
        // Not losses, and not nothing either: the test server had these, but how it ran
        // them nobody saw.
        let unseen: Vec<String> = r
            .divergence
            .iter()
            .filter(|d| !d.reason.is_loss())
            .map(|d| format!("{} {} {}", d.count, d.command, d.kind))
            .collect();
        if !unseen.is_empty() {
            let _ = writeln!(
                out,
                "  answers not seen (intercept lost the test server's framing, or the test server \
                 was over 4096 commands behind; it had these commands, how it ran them is \
                 unknown): {}",
                unseen.join(", ")
            );
        }
    }
    if losses.is_empty() {
        let _ = writeln!(out, "  losses: none");
    } else {
        let _ = writeln!(out, "  losses:");
        for (what, n) in losses {
            let _ = writeln!(out, "    {n:>10}  {what}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lists_protocol_drops_as_losses() {
        let mut s = Snapshot {
            transform_names: &["commands_forwarded", "executes_dropped_unknown_statement"],
            ..Snapshot::default()
        };
        s.engine.transform.add(0, 10);
        s.engine.transform.add(1, 3);
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains(
                "protocol layer: commands_forwarded=10 executes_dropped_unknown_statement=3"
            ),
            "{text}"
        );
        assert!(
            text.contains("3  protocol layer: executes dropped unknown statement"),
            "{text}"
        );
        assert!(!text.contains("losses: none"), "{text}");
    }

    #[test]
    fn parameter_types_given_are_events_and_executes_that_could_not_be_typed_losses() {
        use crate::mysql::{Counter, COUNTER_NAMES};
        let mut s = Snapshot {
            transform_names: COUNTER_NAMES,
            ..Snapshot::default()
        };
        for (c, n) in [
            (Counter::ParamTypesLearnt, 3),
            (Counter::ParamTypesGuessed, 176),
            (Counter::ParamTypesCorrected, 2),
            (Counter::ExecutesDroppedUndecodable, 5),
        ] {
            s.engine.transform.add(c as usize, n);
        }
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains(
                "protocol layer: param_types_learnt=3 param_types_guessed=176 \
                 param_types_corrected=2 executes_dropped_undecodable=5"
            ),
            "{text}"
        );
        assert!(
            text.contains("5  protocol layer: executes dropped undecodable"),
            "{text}"
        );
        for name in [
            "param_types_learnt",
            "param_types_guessed",
            "param_types_corrected",
        ] {
            assert!(!is_protocol_loss(name), "{name}");
        }
    }

    #[test]
    fn losses_a_flag_would_avoid_name_it() {
        let mut s = Snapshot {
            transform_names: &["executes_dropped_prepared_before_pickup", "no_credentials"],
            ..Snapshot::default()
        };
        s.engine.transform.add(0, 662);
        s.engine.transform.add(1, 2);
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains(
                "662  protocol layer: executes dropped prepared before pickup (statements \
                 prepared before the copier saw the connection: --prod-dsn recovers them)"
            ),
            "{text}"
        );
        assert!(
            text.contains("2  protocol layer: no credentials (logins of users missing from --mysql-credentials)"),
            "{text}"
        );
    }

    #[test]
    fn unrecovered_pooled_connections_are_losses() {
        let s = Snapshot {
            lookup: Some(LookupStats {
                requested: 8,
                answered: 5,
                not_found: 1,
                failed: 1,
                dropped: 1,
                queries: 9,
                from_snapshot: 4,
                snapshot_connections: 20,
                snapshot_queries: 3,
            }),
            ..Snapshot::default()
        };
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains(
                "start snapshot: 20 connections read in 3 queries before any was seen, 4 \
                 picked-up sessions started from it"
            ),
            "{text}"
        );
        assert!(
            text.contains("own statements: production select=9; test change_db=0 set_option=0"),
            "{text}"
        );
        assert!(
            text.contains("8 requested, 5 answered, 1 not found, 1 failed, 1 dropped"),
            "{text}"
        );
        assert!(
            text.contains("3  pooled connections not recovered (--prod-dsn)"),
            "{text}"
        );
    }

    #[test]
    fn shaping_is_shown_only_when_used() {
        let mut s = Snapshot {
            copies: 3,
            sample_percent: Some(60.0),
            ..Snapshot::default()
        };
        s.engine.sessions_not_sampled = 79;
        s.engine.packets_not_sampled = 1422;
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains("multiply=3")
                && text.contains("sample=60.0%: 79 connections not sampled (1422 packets)"),
            "{text}"
        );
        assert!(
            text.contains("losses: none"),
            "sampled out is not a loss: {text}"
        );
        assert!(!text.contains("fixed hash alone"), "{text}");
        s.engine.sample_fallbacks = 4;
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains("4 new connections decided by the fixed hash alone"),
            "{text}"
        );
        let plain = summary(&Snapshot::default(), Duration::from_secs(1));
        assert!(!plain.contains("shaping"), "{plain}");
    }

    #[test]
    fn read_only_skips_are_shown_but_are_not_losses() {
        let mut s = Snapshot {
            transform_names: &[
                "commands_forwarded",
                "read_only_skipped_insert",
                "read_only_skipped_update",
                "read_only_skipped_other",
                "read_only_skipped_stmt_execute",
            ],
            ..Snapshot::default()
        };
        s.engine.transform.add(0, 10);
        s.engine.transform.add(1, 3);
        s.engine.transform.add(2, 6);
        s.engine.transform.add(4, 40);
        let text = summary(&s, Duration::from_secs(1));
        assert!(
            text.contains(
                "read-only: 49 commands not mirrored (writes, by design): insert=3 update=6 stmt_execute=40"
            ),
            "{text}"
        );
        assert!(
            text.contains("protocol layer: commands_forwarded=10\n"),
            "{text}"
        );
        assert!(text.contains("losses: none"), "{text}");
    }

    #[test]
    fn commands_the_test_server_failed_are_losses_by_kind_and_code() {
        use crate::report::divergence::{Divergent, Reason};
        use crate::report::reporting::ReportFigures;
        let clean = Snapshot {
            report: Some(ReportFigures::default()),
            ..Snapshot::default()
        };
        assert!(summary(&clean, Duration::from_secs(1)).contains("losses: none"));
        let s = Snapshot {
            report: Some(ReportFigures {
                divergence: vec![
                    Divergent {
                        command: "stmt_execute",
                        kind: "select",
                        reason: Reason::TestError(1210),
                        count: 7,
                    },
                    Divergent {
                        command: "query",
                        kind: "update",
                        reason: Reason::Unanswered,
                        count: 2,
                    },
                    Divergent {
                        command: "stmt_execute",
                        kind: "begin",
                        reason: Reason::AnswerUnseen,
                        count: 40,
                    },
                ],
                ..ReportFigures::default()
            }),
            ..Snapshot::default()
        };
        let text = summary(&s, Duration::from_secs(1));
        assert!(!text.contains("losses: none"), "{text}");
        assert!(
            text.contains("7  commands: stmt_execute select: error 1210 on the test server only"),
            "{text}"
        );
        assert!(
            text.contains("2  commands: query update: sent, never answered by the test server"),
            "{text}"
        );
        // Answers intercept could not read are said apart, not claimed as losses.
        assert!(!text.contains("commands: stmt_execute begin"), "{text}");
        assert!(
            text.contains("how it ran them is unknown): 40 stmt_execute begin"),
            "{text}"
        );
    }

    #[test]
    fn closes_of_a_statement_the_test_server_rejected_are_not_losses() {
        assert!(!is_protocol_loss("stmt_commands_of_rejected_statement"));
        assert!(is_protocol_loss("stmt_commands_dropped"));
    }

    #[test]
    fn a_clean_run_says_no_losses() {
        let text = summary(&Snapshot::default(), Duration::from_secs(1));
        assert!(text.contains("losses: none"), "{text}");
    }
}
