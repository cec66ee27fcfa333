//! Retransmission timeout estimation (RFC 6298).
//!
//! Samples come only from segments sent once (Karn's rule, enforced by the caller). TCP
//! timestamps cannot help here: the TSval we send is the *client's* clock, so the test server's
//! echo tells nothing about our own send times.

use std::time::Duration;

/// Clock granularity G of RFC 6298 (2.3).
const GRANULARITY: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug)]
pub(crate) struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
}

impl RttEstimator {
    pub(crate) fn new(initial_rto: Duration) -> Self {
        Self {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: initial_rto,
        }
    }

    pub(crate) fn sample(&mut self, r: Duration, min_rto: Duration, max_rto: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(r);
                self.rttvar = self.rttvar * 3 / 4 + err / 4;
                self.srtt = Some(srtt * 7 / 8 + r / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        self.rto = (srtt + (self.rttvar * 4).max(GRANULARITY)).clamp(min_rto, max_rto);
    }

    /// The RTO after `backoff` consecutive expirations (doubling each time), capped.
    pub(crate) fn backed_off(&self, backoff: u32, max_rto: Duration) -> Duration {
        self.rto
            .saturating_mul(1u32 << backoff.min(20))
            .min(max_rto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn first_sample_then_smoothing_and_floor() {
        let mut e = RttEstimator::new(Duration::from_secs(1));
        assert_eq!(e.backed_off(0, MAX), Duration::from_secs(1));
        e.sample(Duration::from_millis(100), MIN, MAX);
        // 100ms + 4 * 50ms = 300ms
        assert_eq!(e.backed_off(0, MAX), Duration::from_millis(300));
        for _ in 0..50 {
            e.sample(Duration::from_millis(1), MIN, MAX);
        }
        assert_eq!(e.backed_off(0, MAX), MIN, "a LAN RTT is floored at min_rto");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let e = RttEstimator::new(Duration::from_secs(1));
        assert_eq!(e.backed_off(3, MAX), Duration::from_secs(8));
        assert_eq!(e.backed_off(30, MAX), MAX);
    }
}
