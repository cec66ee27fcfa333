//! The queue the workers' observations reach the report through.
//!
//! Each engine hands out its transforms' observations through its poll interface
//! (`Fleet::poll_observation`); the driver that owns an engine moves them here after every
//! batch, and the driver that owns the report drains this queue into the
//! [`Collector`](super::collect::Collector). With several workers it is the one place their
//! threads meet: a bounded queue behind a mutex held for one `Vec::push` or one swap. A full
//! queue drops the observation and counts it: the report says how many were lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::observe::Observation;

/// Observations waiting for the report. See the module documentation.
#[derive(Debug)]
pub struct ObservationSink {
    queue: Mutex<Vec<Observation>>,
    capacity: usize,
    pushed: AtomicU64,
    dropped: AtomicU64,
}

impl ObservationSink {
    /// A queue holding at most `capacity` observations between two drains.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Vec::new()),
            capacity: capacity.max(1),
            pushed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    pub fn push(&self, o: Observation) {
        // A poisoned lock (a panic elsewhere while holding it) still holds valid data.
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.capacity {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push(o);
        drop(q);
        self.pushed.fetch_add(1, Ordering::Relaxed);
    }

    /// As many [`ObservationSink::push`]es, under one lock: a batch's observations (the
    /// driver's, after every batch) take it once, not once each.
    pub fn extend(&self, observations: impl Iterator<Item = Observation>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (mut pushed, mut dropped) = (0u64, 0u64);
        for o in observations {
            if q.len() >= self.capacity {
                dropped += 1;
            } else {
                q.push(o);
                pushed += 1;
            }
        }
        drop(q);
        if pushed > 0 {
            self.pushed.fetch_add(pushed, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// Moves everything queued to the end of `out`.
    pub fn drain_into(&self, out: &mut Vec<Observation>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if out.is_empty() {
            std::mem::swap(&mut *q, out);
        } else {
            out.append(&mut q);
        }
    }

    /// Observations accepted so far.
    pub fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// Observations dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use common::mysql::digest::Traits;

    use super::super::observe::{Statement, TestOutcome};
    use super::*;

    fn obs() -> Observation {
        Observation {
            statement: Arc::new(Statement {
                id: 1,
                command: "ping",
                fingerprint: "ping".into(),
                example: "ping".into(),
                traits: Traits::default(),
            }),
            copy: 0,
            target: 0,
            prod: None,
            test: TestOutcome::Lost,
        }
    }

    #[test]
    fn the_sink_is_bounded_and_counts_what_it_drops() {
        let s = ObservationSink::new(2);
        for _ in 0..5 {
            s.push(obs());
        }
        assert_eq!((s.pushed(), s.dropped()), (2, 3));
        let mut out = vec![obs()];
        s.drain_into(&mut out);
        assert_eq!(out.len(), 3);
        s.push(obs());
        let mut out = Vec::new();
        s.drain_into(&mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn extend_counts_and_drops_as_pushes_do() {
        let s = ObservationSink::new(3);
        s.push(obs());
        s.extend(std::iter::repeat_with(obs).take(4));
        assert_eq!((s.pushed(), s.dropped()), (3, 2));
        let mut out = Vec::new();
        s.drain_into(&mut out);
        assert_eq!(out.len(), 3);
        s.extend(std::iter::empty());
        assert_eq!((s.pushed(), s.dropped()), (3, 2));
    }
}
