//! How much later than the quickest recent frame a frame from intercept arrived.
//!
//! A reply's time on the copier's clock is when its frame arrived, dated back by how long the
//! reply waited at intercept (protocol v5: `sent_at_us - framed_at_us`, both on intercept's
//! clock). What that leaves in is the frame's transit: the control connection, and the
//! copier's engine thread getting round to reading it (at its capture's next block, while
//! packets flow). Its floor is the same for every frame; what a frame spends above the floor
//! is queueing (a frame that arrived early in a block, a big coalesced write read in pieces,
//! the engine waiting for a core), which would otherwise show up as test-server latency in
//! the report. This measures that excess from `recv - sent`, a difference of two hosts' clocks
//! whose offset is unknown but constant over seconds: only its variation is used, against the
//! smallest value of the last two windows (so a drift or a stepped clock is forgotten).
//!
//! Pure arithmetic on the times it is given; it never reads a clock.

use std::time::Duration;

use common::clock::Instant;

/// One window of the running minimum; the floor is the smaller of this one's and the last's.
const WINDOW: Duration = Duration::from_secs(10);
/// An excess over this is a clock step on either host, not queueing: nothing is dated back.
const MAX_EXCESS_US: i64 = 1_000_000;

/// The running floor of `recv - sent` for one control connection.
#[derive(Clone, Debug)]
pub struct TransitFloor {
    /// The first difference seen: later ones are taken relative to it, so the wrapping µs of
    /// two unrelated clocks never meet a wrap in between.
    base: Option<u32>,
    window_start: Option<Instant>,
    current: i64,
    previous: i64,
}

impl Default for TransitFloor {
    fn default() -> Self {
        Self::new()
    }
}

impl TransitFloor {
    pub fn new() -> Self {
        TransitFloor {
            base: None,
            window_start: None,
            current: i64::MAX,
            previous: i64::MAX,
        }
    }

    /// A frame encoded at `sent_us` (intercept's realtime µs) was read at `recv_us` (ours),
    /// at `now`: how much longer than the floor it took.
    pub fn excess(&mut self, now: Instant, recv_us: u32, sent_us: u32) -> Duration {
        let d = recv_us.wrapping_sub(sent_us);
        let base = *self.base.get_or_insert(d);
        let rel = i64::from(d.wrapping_sub(base) as i32);
        match self.window_start {
            Some(s) if now.saturating_since(s) < WINDOW => {}
            _ => {
                self.previous = self.current;
                self.current = i64::MAX;
                self.window_start = Some(now);
            }
        }
        self.current = self.current.min(rel);
        let over = rel - self.current.min(self.previous);
        if over > MAX_EXCESS_US {
            return Duration::ZERO;
        }
        Duration::from_micros(over as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(1_000_000_000 + ms * 1_000_000)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn the_excess_is_measured_against_the_quickest_frame_whatever_the_clock_offset() {
        // intercept's clock is 3,600 s and a bit ahead of ours, and wraps in between.
        let offset = 3_600_123_456u32;
        let mut f = TransitFloor::new();
        let sent = |t: u32| t.wrapping_add(offset);
        assert_eq!(f.excess(at(0), 1_000_050, sent(1_000_000)), us(0));
        assert_eq!(f.excess(at(1), 2_000_030, sent(2_000_000)), us(0));
        assert_eq!(f.excess(at(2), 3_000_330, sent(3_000_000)), us(300));
        assert_eq!(f.excess(at(3), u32::MAX - 10, sent(u32::MAX - 40)), us(0));
        assert_eq!(f.excess(at(4), 45, sent(u32::MAX - 400)), us(416));
    }

    #[test]
    fn a_drift_or_a_step_is_forgotten_after_two_windows() {
        let mut f = TransitFloor::new();
        assert_eq!(f.excess(at(0), 1_000, 0), us(0));
        // Our clock steps 5 s ahead: no dating back while the old floor stands.
        assert_eq!(f.excess(at(1_000), 5_001_000, 0), Duration::ZERO);
        assert_eq!(f.excess(at(11_000), 5_001_000, 0), Duration::ZERO);
        // Two windows later the floor is the new one.
        assert_eq!(f.excess(at(21_000), 5_001_000, 0), us(0));
        assert_eq!(f.excess(at(21_001), 5_001_200, 0), us(200));
        // A step back is a new floor at once.
        assert_eq!(f.excess(at(21_002), 900, 0), us(0));
        assert_eq!(f.excess(at(21_003), 1_000, 0), us(100));
    }
}
