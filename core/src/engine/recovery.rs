//! Re-establishing sessions whose test-side connection was lost while production's lives on.
//!
//! # What this is for
//!
//! The test server restarts, intercept goes away long enough for our retransmissions to give up,
//! or the test server resets a connection: the mirrored session ends, but the client keeps
//! talking to production on the same connection (a pool keeps it for hours). Without help that
//! connection would never be mirrored again: a closed session lingers as long as the client
//! talks, so mid-stream pickup cannot resurrect it half-way by accident.
//!
//! Here such a session is remembered as *waiting to re-establish* ([`Revival`]): it lingers with
//! no buffers but the held run below (`enter_linger` dropped them), and the next captured client packet that
//! carries data starts a new session through the mid-stream pickup path (for MySQL: a synthetic
//! login and, with `--prod-dsn`, the connection's user, schema and statements from production).
//! What the client sent while the session waited is held (`session/recovery.rs`, `Held`): one
//! contiguous run of its stream, bounded by the session's buffer and the memory budget, replayed
//! by the new session ahead of the packet that brought it back. Ahead of that run go the
//! commands the lost connection had been sent and had not answered (`session/replay.rs`): a
//! test server behind production holds thousands when it restarts. A test server's restart
//! then costs nothing it can be given again; a run the bounds cut is counted lost.
//!
//! # Pacing
//!
//! A down test server must not draw a storm of SYNs, however many sessions wait. The engine keeps
//! one [`Gate`]: open while the test server answers; after a failure to connect (refused,
//! unanswered, stopped acknowledging) it admits a single probe per interval (from 20 ms,
//! doubling, at most every 100 ms, after 5 s of outage every second), and the first session
//! that completes a handshake opens it for all. A session the test server accepts and then resets again quickly (a login it
//! refuses, say) also waits on its own, longer and longer (100 ms doubling to 5 s), so it
//! cannot loop.
//!
//! # What it must never do
//!
//! * Never re-establish a session whose client or production ended the connection (FIN, RST),
//!   nor one cut for a reason that is the copier's own decision (buffer overflow, capture gap,
//!   shedding, not mirrorable): those would only fail again or defeat a bound.
//! * Never hold client bytes beyond the session's buffer or the engine's memory budget, and
//!   never replay a run with a hole in it (the capture missed bytes production received).

use std::time::Duration;

use common::clock::Instant;

use super::CloseReason;

/// The gate's first interval between probes while the test server does not answer.
pub(super) const PROBE_MIN: Duration = Duration::from_millis(20);
/// The gate's longest interval between probes in the first [`PROBE_PATIENT_AFTER`] of an
/// outage. Short on purpose: every moment between the test server coming back and the first
/// probe is traffic not mirrored (a restart takes seconds), and one SYN per 100 ms per engine
/// is no load for any server.
pub(super) const PROBE_MAX: Duration = Duration::from_millis(100);
/// After this long without an answer the outage is a long one...
pub(super) const PROBE_PATIENT_AFTER: Duration = Duration::from_secs(5);
/// ...and probes slow down to one per second: each probe is a picked-up session, which with
/// `--prod-dsn` also asks production for the connection's state, and production must not pay
/// ten lookups a second for a test server that is gone.
pub(super) const PROBE_SLOW_MAX: Duration = Duration::from_secs(1);
/// A session reset again within this long of being re-established waits on its own.
pub(super) const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Its own wait: from this, doubling per quick reset...
pub(super) const HOLD_MIN: Duration = Duration::from_millis(100);
/// ...up to this.
pub(super) const HOLD_MAX: Duration = Duration::from_secs(5);

/// Whether a session that ended for `reason` lost only its test-side connection (production's
/// may live on). The session itself says whether the client was still connected.
pub(super) fn test_side_loss(reason: CloseReason) -> bool {
    matches!(
        reason,
        CloseReason::TestReset
            | CloseReason::TestRefused
            | CloseReason::HandshakeTimeout
            | CloseReason::TooManyRetransmits
    )
}

/// Whether a session its transform gave up (`CloseReason::NotMirrorable`) for `why` lost only
/// the test server's side: the test server's answers stopped coming (intercept restarted and
/// could not tell where its MySQL packets start, say). A fresh connection fixes that.
pub fn lost_test_answers(why: &str) -> bool {
    matches!(why, "test_server_not_answering" | "framing_lost")
}

/// Whether `reason` says the test server could not be reached at all (as opposed to reached
/// and then resetting the connection): such a failure closes the [`Gate`].
pub(super) fn unreachable(reason: CloseReason) -> bool {
    matches!(
        reason,
        CloseReason::TestRefused | CloseReason::HandshakeTimeout | CloseReason::TooManyRetransmits
    )
}

/// A lingering session waiting to be re-established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Revival {
    /// Why its test-side connection ended (the `reestablished` counters are by this).
    pub(crate) reason: CloseReason,
    /// Not before this (the session's own wait after quick resets).
    pub(crate) not_before: Instant,
    /// Quick resets in a row so far, carried into the new session.
    pub(crate) attempts: u32,
}

impl Revival {
    /// The waiting record of a session that ended for `reason` at `now`, created at `created`;
    /// `revived_after` is `Some(quick resets so far)` if that session re-established another.
    pub(crate) fn after(
        reason: CloseReason,
        now: Instant,
        created: Instant,
        revived_after: Option<u32>,
    ) -> Self {
        let quick = !unreachable(reason) && now.saturating_since(created) < STABLE_AFTER;
        let attempts = match revived_after {
            Some(n) if quick => n.saturating_add(1),
            _ => 0,
        };
        let hold = if attempts == 0 {
            Duration::ZERO
        } else {
            HOLD_MIN
                .saturating_mul(1u32 << (attempts - 1).min(16))
                .min(HOLD_MAX)
        };
        Revival {
            reason,
            not_before: now + hold,
            attempts,
        }
    }
}

/// Engine-wide pacing of re-establishment attempts (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Gate {
    /// Zero: open (the test server answers). Otherwise the current interval between probes.
    interval: Duration,
    next_probe: Option<Instant>,
    /// A probe is out until then (its handshake cannot take longer); no second one meanwhile.
    probe_until: Option<Instant>,
    /// When the test server first failed to answer, since the last success.
    down_since: Option<Instant>,
}

impl Gate {
    pub(super) fn is_open(&self) -> bool {
        self.interval.is_zero()
    }

    /// Whether a waiting session may try now; when the gate is shut this takes the one probe.
    pub(super) fn admit(&mut self, now: Instant, probe_timeout: Duration) -> bool {
        if self.is_open() {
            return true;
        }
        if self.next_probe.is_some_and(|t| now < t) || self.probe_until.is_some_and(|t| now < t) {
            return false;
        }
        self.probe_until = Some(now + probe_timeout);
        true
    }

    /// A session could not reach the test server.
    pub(super) fn failed(&mut self, now: Instant) {
        let since = *self.down_since.get_or_insert(now);
        let max = if now.saturating_since(since) < PROBE_PATIENT_AFTER {
            PROBE_MAX
        } else {
            PROBE_SLOW_MAX
        };
        self.interval = (self.interval * 2).clamp(PROBE_MIN, max);
        self.next_probe = Some(now + self.interval);
        self.probe_until = None;
    }

    /// A session completed its handshake: the test server is there.
    pub(super) fn succeeded(&mut self) {
        *self = Gate::default();
    }
}
