//! A monotonic instant the session engine can be driven with: the binaries feed it the real
//! monotonic clock, tests feed it a fake one. The engine never reads a clock itself.

use std::ops::{Add, Sub};
use std::time::Duration;

/// Nanoseconds since an arbitrary epoch chosen by whoever drives the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub fn from_nanos(n: u64) -> Self {
        Instant(n)
    }
    pub fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

/// The real monotonic clock, for binaries.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: std::time::Instant::now(),
        }
    }
    pub fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The real-time clock in microseconds, wrapping: the clock of the kernel's capture timestamps.
/// intercept dates replies with it and says when it relayed them, so the copier can tell how
/// long a reply waited at intercept. Only differences taken on one host mean anything, and a
/// step of the clock (NTP) spoils the difference across it, so readers bound them.
pub fn realtime_us() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| timeval_us(d.as_secs(), u64::from(d.subsec_micros())))
}

/// The real-time clock in nanoseconds since the Unix epoch: the copier's capture timestamps.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A capture timestamp in nanoseconds since the epoch on the [`realtime_us`] scale.
pub fn ns_us(ns: u64) -> u32 {
    timeval_us(ns / 1_000_000_000, ns % 1_000_000_000 / 1000)
}

/// A capture timestamp (seconds, microseconds) on the [`realtime_us`] scale.
pub fn timeval_us(secs: u64, micros: u64) -> u32 {
    secs.wrapping_mul(1_000_000).wrapping_add(micros) as u32
}
