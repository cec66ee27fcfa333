//! A tiny fixed-capacity set of byte ranges, used to remember what arrived out of order.
//!
//! Offsets are relative to a base that only moves forward (the next expected sequence number),
//! so plain `u32` comparisons are safe: every stored range lies within one bounded window ahead
//! of the base. They are byte counts, not sequence numbers, so they stay `u32` when the base
//! is a [`SeqNumber`](common::seq::SeqNumber): the owner adds one to its base to get a sequence
//! number back. A fixed array instead of a `Vec` keeps out-of-order bookkeeping allocation-free
//! and bounded; when it is full the caller drops the segment and counts it (TCP allows that:
//! the sender will retransmit, or for capture the gap timer decides).

#[derive(Clone, Copy, Debug)]
pub(crate) struct Ranges<const N: usize> {
    r: [(u32, u32); N],
    len: usize,
}

impl<const N: usize> Default for Ranges<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Ranges<N> {
    pub(crate) const fn new() -> Self {
        Self {
            r: [(0, 0); N],
            len: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn first(&self) -> Option<(u32, u32)> {
        (self.len > 0).then(|| self.r[0])
    }

    /// End of the furthest range (0 when empty).
    pub(crate) fn last_end(&self) -> u32 {
        if self.len == 0 {
            0
        } else {
            self.r[self.len - 1].1
        }
    }

    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &[(u32, u32)] {
        &self.r[..self.len]
    }

    /// Adds `[start, end)`, merging with ranges it overlaps or touches. Returns `false` and
    /// changes nothing when a new disjoint range would not fit.
    pub(crate) fn insert(&mut self, start: u32, end: u32) -> bool {
        if start >= end {
            return true;
        }
        let live = &self.r[..self.len];
        // Ranges are sorted and disjoint: i is the first one that touches or follows `start`,
        // j the first one entirely after `end`; i..j are merged with the new range.
        let i = live
            .iter()
            .position(|&(_, e)| e >= start)
            .unwrap_or(self.len);
        let j = live.iter().position(|&(s, _)| s > end).unwrap_or(self.len);
        if i == j {
            if self.len == N {
                return false;
            }
            self.r.copy_within(i..self.len, i + 1);
            self.r[i] = (start, end);
            self.len += 1;
        } else {
            let merged = (start.min(self.r[i].0), end.max(self.r[j - 1].1));
            self.r[i] = merged;
            self.r.copy_within(j..self.len, i + 1);
            self.len -= j - i - 1;
        }
        true
    }

    /// The base moved forward by `d`: ranges are re-expressed relative to it, and what now lies
    /// behind it is forgotten.
    pub(crate) fn shift(&mut self, d: u32) {
        let mut w = 0;
        for k in 0..self.len {
            let (s, e) = self.r[k];
            if e <= d {
                continue;
            }
            self.r[w] = (s.saturating_sub(d), e - d);
            w += 1;
        }
        self.len = w;
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_overlapping_and_touching() {
        let mut r = Ranges::<4>::new();
        assert!(r.insert(10, 20));
        assert!(r.insert(30, 40));
        assert!(r.insert(20, 25));
        assert_eq!(r.as_slice(), &[(10, 25), (30, 40)]);
        assert!(r.insert(5, 35));
        assert_eq!(r.as_slice(), &[(5, 40)]);
        assert!(r.insert(50, 60));
        assert!(r.insert(0, 1));
        assert_eq!(r.as_slice(), &[(0, 1), (5, 40), (50, 60)]);
    }

    #[test]
    fn full_set_refuses_new_disjoint_range_but_still_merges() {
        let mut r = Ranges::<2>::new();
        assert!(r.insert(10, 20));
        assert!(r.insert(30, 40));
        assert!(!r.insert(50, 60));
        assert_eq!(r.as_slice(), &[(10, 20), (30, 40)]);
        assert!(r.insert(15, 35));
        assert_eq!(r.as_slice(), &[(10, 40)]);
    }

    #[test]
    fn shift_trims_and_drops() {
        let mut r = Ranges::<4>::new();
        r.insert(10, 20);
        r.insert(30, 40);
        r.shift(15);
        assert_eq!(r.as_slice(), &[(0, 5), (15, 25)]);
        r.shift(100);
        assert!(r.is_empty());
    }
}
