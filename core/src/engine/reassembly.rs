//! Reassembly of the client's byte stream from captured segments, in the client's sequence
//! space.
//!
//! The capture shows what the client sent, not what production accepted, and in whatever order
//! the capture queues delivered it: retransmissions and overlaps are trimmed here, segments
//! beyond a hole are held (bounded) until the hole fills, and only in-order bytes leave, through
//! the `deliver` callback, toward the session's send buffer. Nothing here knows about the test
//! server.
//!
//! Not shared with intercept's `reassembly` (issue 19): past its bound this one drops the
//! segment and later skips a proven gap (`skip_to`), where intercept must stop framing for
//! good; it bounds holes and distance in one boxed ring (an idle session costs a pointer)
//! where intercept bounds held bytes and segments under `--max-memory`; and it works in raw
//! sequence space with FIN, `rebase` and held-run lookups, intercept in 64-bit offsets with
//! segments the capture's snap length cut short. A generic one would be policy switches with
//! no code left in common.

use std::collections::VecDeque;
use std::mem::size_of;

use common::seq::SeqNumber;

use super::ranges::Ranges;

/// Holes tolerated at once in the captured client stream; more means the capture is badly
/// damaged and the extra segment is dropped (the gap timer then decides).
const MAX_HOLES: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Insert {
    /// New bytes or a new FIN were taken (delivered or held); `trimmed` bytes of the segment
    /// were already known.
    Accepted { held: bool, trimmed: usize },
    /// Nothing new: everything was captured before.
    Duplicate,
    /// Too far ahead of the stream, or too many holes: dropped.
    Dropped,
}

/// Bytes that arrived beyond a hole, and where they lie.
#[derive(Debug, Default)]
struct OutOfOrder {
    /// Bytes at client seq `next + i`; holes read as zeros and are tracked by `ranges`.
    held: VecDeque<u8>,
    ranges: Ranges<MAX_HOLES>,
}

#[derive(Debug)]
pub(crate) struct Reassembly {
    /// Client sequence number of the next byte to deliver.
    next: SeqNumber,
    /// Client sequence number of the FIN, once captured.
    fin_at: Option<SeqNumber>,
    /// The FIN has been reached: every byte before it was delivered.
    fin_done: bool,
    /// What arrived beyond a hole; `None` while nothing does (nearly always: it is boxed so
    /// that a session in order, the usual one, does not carry its 100 bytes).
    ooo: Option<Box<OutOfOrder>>,
    /// How far ahead of `next` a segment may reach and still be held.
    limit: u32,
    /// Whether any byte was delivered yet (a mid-stream pickup may still move its start).
    delivered_any: bool,
}

impl Reassembly {
    pub(crate) fn new(next: SeqNumber, limit: usize) -> Self {
        Self {
            next,
            fin_at: None,
            fin_done: false,
            ooo: None,
            limit: u32::try_from(limit).unwrap_or(u32::MAX).min(1 << 30),
            delivered_any: false,
        }
    }

    pub(crate) fn next(&self) -> SeqNumber {
        self.next
    }

    /// Sequence number just past everything delivered, FIN included.
    pub(crate) fn end(&self) -> SeqNumber {
        self.next + u32::from(self.fin_done)
    }

    pub(crate) fn fin_done(&self) -> bool {
        self.fin_done
    }

    pub(crate) fn has_held(&self) -> bool {
        self.ooo.is_some()
    }

    pub(crate) fn held_len(&self) -> usize {
        self.ooo.as_ref().map_or(0, |o| o.held.len())
    }

    /// Heap bytes held (capacity: what the allocator handed out).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ooo
            .as_ref()
            .map_or(0, |o| size_of::<OutOfOrder>() + o.held.capacity())
    }

    /// Whether the start of the stream may still move: nothing delivered, held or finished.
    pub(crate) fn pristine(&self) -> bool {
        !self.delivered_any && self.ooo.is_none() && self.fin_at.is_none()
    }

    /// Moves the start of a pristine stream (mid-stream pickup that learnt the real next byte).
    pub(crate) fn rebase(&mut self, next: SeqNumber) {
        debug_assert!(self.pristine());
        self.next = next;
    }

    /// Frees held memory (session is closing).
    pub(crate) fn release(&mut self) {
        self.ooo = None;
    }

    /// Takes one captured segment: `data` starts at client seq `start`; `fin` if it carried
    /// FIN. In-order bytes are passed to `deliver` (possibly in several slices).
    pub(crate) fn insert(
        &mut self,
        start: SeqNumber,
        data: &[u8],
        fin: bool,
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Insert {
        let mut start = start;
        let mut data = data;
        let original_len = data.len();
        // A segment cannot be larger than an IPv4 packet; this keeps the arithmetic below far
        // from wrapping even for hostile input.
        if data.len() > usize::from(u16::MAX) {
            return Insert::Dropped;
        }
        let mut new_fin = false;
        if fin {
            let at = start + data.len();
            // `at` may lie 2^31 from `next` (a hostile seq), where `>=` is false and the old
            // `seq::ge` was true; the bound by `limit` (at most 2^30) refuses that FIN either way.
            if self.fin_at.is_none()
                && at >= self.next
                && at.bytes_since(self.next)
                    >= self
                        .ooo
                        .as_ref()
                        .map_or(0, |o| o.ranges.last_end() as usize)
                && at.bytes_since(self.next) <= self.limit as usize
            {
                self.fin_at = Some(at);
                new_fin = true;
            }
        }
        // Nothing exists after the FIN: bytes there are garbage.
        if let Some(f) = self.fin_at {
            let room = f - start;
            if room <= 0 {
                data = &[];
            } else if (room as usize) < data.len() {
                data = &data[..room as usize];
            }
        }
        let behind = self.next - start;
        if behind > 0 {
            let behind = behind as usize;
            if behind >= data.len() {
                data = &[];
            } else {
                data = &data[behind..];
                start = self.next;
            }
        }
        let mut held = false;
        if !data.is_empty() {
            let rel = start.bytes_since(self.next) as u32;
            let len = data.len() as u32;
            if u64::from(rel) + u64::from(len) > u64::from(self.limit) {
                return Insert::Dropped;
            }
            if rel == 0 && self.ooo.is_none() {
                // The common case: in order, nothing pending. No copy.
                deliver(data);
                self.next += len;
                self.delivered_any = true;
            } else {
                let o = self.ooo.get_or_insert_with(Box::default);
                if !o.ranges.insert(rel, rel + len) {
                    if o.ranges.is_empty() {
                        self.ooo = None;
                    }
                    return Insert::Dropped;
                }
                let (rel, len) = (rel as usize, len as usize);
                if o.held.len() < rel + len {
                    o.held.resize(rel + len, 0);
                }
                for (dst, src) in o.held.range_mut(rel..rel + len).zip(data) {
                    *dst = *src;
                }
                held = rel > 0;
                self.deliver_ready(deliver);
            }
        } else if !new_fin {
            return Insert::Duplicate;
        }
        if self.fin_at == Some(self.next) {
            self.fin_done = true;
        }
        Insert::Accepted {
            held,
            trimmed: original_len - data.len(),
        }
    }

    /// Delivers the held run that starts at `next`, if there is one.
    fn deliver_ready(&mut self, deliver: &mut dyn FnMut(&[u8])) {
        let Some(o) = self.ooo.as_mut() else {
            return;
        };
        if let Some((0, run)) = o.ranges.first() {
            let run_len = run as usize;
            let (a, b) = o.held.as_slices();
            let from_a = a.len().min(run_len);
            deliver(&a[..from_a]);
            if run_len > from_a {
                deliver(&b[..run_len - from_a]);
            }
            o.held.drain(..run_len);
            o.ranges.shift(run);
            self.next += run;
            self.delivered_any = true;
        }
        if o.ranges.is_empty() {
            // The hole is filled: give the room back (holes are rare; a session that has
            // one now and then pays one allocation for each).
            self.ooo = None;
        }
    }

    /// Where the first run held beyond a hole starts (client seq) and its length.
    pub(crate) fn first_held_run(&self) -> Option<(SeqNumber, u32)> {
        let (start, end) = self.ooo.as_ref()?.ranges.first()?;
        Some((self.next + start, end - start))
    }

    /// Copies the first bytes of the first held run into `buf`; returns how many.
    pub(crate) fn first_held_prefix(&self, buf: &mut [u8]) -> usize {
        let Some(o) = self.ooo.as_ref() else {
            return 0;
        };
        let Some((start, end)) = o.ranges.first() else {
            return 0;
        };
        let n = buf.len().min((end - start) as usize);
        for (dst, src) in buf
            .iter_mut()
            .zip(o.held.range(start as usize..start as usize + n))
        {
            *dst = *src;
        }
        n
    }

    /// Gives up the bytes from `next` to `to`, held ones included: the capture lost some of
    /// them for good, and the stream goes on at `to`. A FIN before `to` stops the skip there.
    /// Nothing is delivered (see [`flush`](Self::flush)). Returns the bytes given up; `to`
    /// behind `next` (or a quarter of the sequence space ahead) skips nothing. A skip may go
    /// beyond what a held segment may reach: the bytes are gone, none is kept.
    pub(crate) fn skip_to(&mut self, to: SeqNumber) -> u32 {
        let mut d = to.bytes_since(self.next) as u32;
        if d >= 1 << 30 {
            d = 0;
        }
        if let Some(f) = self.fin_at {
            d = d.min(f.bytes_since(self.next) as u32);
        }
        if let Some(o) = self.ooo.as_mut() {
            let drop = (d as usize).min(o.held.len());
            o.held.drain(..drop);
            o.ranges.shift(d);
            if o.ranges.is_empty() {
                self.ooo = None;
            }
        }
        self.next += d;
        if d > 0 {
            self.delivered_any = true;
        }
        if self.fin_at == Some(self.next) {
            self.fin_done = true;
        }
        d
    }

    /// Delivers the held run that starts at `next` (after [`skip_to`](Self::skip_to)).
    pub(crate) fn flush(&mut self, deliver: &mut dyn FnMut(&[u8])) {
        self.deliver_ready(deliver);
        if self.fin_at == Some(self.next) {
            self.fin_done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(r: &mut Reassembly, start: u32, data: &[u8], fin: bool, out: &mut Vec<u8>) -> Insert {
        r.insert(SeqNumber(start), data, fin, &mut |b| {
            out.extend_from_slice(b)
        })
    }

    #[test]
    fn in_order_duplicates_and_overlaps() {
        let mut r = Reassembly::new(SeqNumber(100), 1000);
        let mut out = Vec::new();
        assert_eq!(
            run(&mut r, 100, b"abc", false, &mut out),
            Insert::Accepted {
                held: false,
                trimmed: 0
            }
        );
        assert_eq!(run(&mut r, 100, b"abc", false, &mut out), Insert::Duplicate);
        assert_eq!(
            run(&mut r, 101, b"bcde", false, &mut out),
            Insert::Accepted {
                held: false,
                trimmed: 2
            }
        );
        assert_eq!(out, b"abcde");
        assert_eq!(r.next(), SeqNumber(105));
    }

    #[test]
    fn holes_fill_in_any_order_and_fin_waits_for_them() {
        let mut r = Reassembly::new(SeqNumber(u32::MAX - 2), 1000); // wraps mid-stream
        let mut out = Vec::new();
        let s = u32::MAX - 2;
        assert_eq!(
            run(&mut r, s.wrapping_add(6), b"gh", true, &mut out),
            Insert::Accepted {
                held: true,
                trimmed: 0
            }
        );
        assert_eq!(
            run(&mut r, s.wrapping_add(3), b"de", false, &mut out),
            Insert::Accepted {
                held: true,
                trimmed: 0
            }
        );
        assert!(out.is_empty() && !r.fin_done());
        assert_eq!(
            run(&mut r, s, b"abc", false, &mut out),
            Insert::Accepted {
                held: false,
                trimmed: 0
            }
        );
        assert_eq!(out, b"abcde");
        assert!(r.has_held());
        assert_eq!(
            run(&mut r, s.wrapping_add(4), b"ef", false, &mut out),
            Insert::Accepted {
                held: false,
                trimmed: 1
            }
        );
        assert_eq!(out, b"abcdefgh");
        assert!(r.fin_done() && !r.has_held());
        assert_eq!(r.end(), SeqNumber(s.wrapping_add(9)));
        // Bytes after the FIN are garbage.
        assert_eq!(
            run(&mut r, s.wrapping_add(8), b"zz", false, &mut out),
            Insert::Duplicate
        );
    }

    #[test]
    fn skipping_a_hole_delivers_the_run_beyond_it() {
        let mut r = Reassembly::new(SeqNumber(100), 1000);
        let mut out = Vec::new();
        run(&mut r, 100, b"ab", false, &mut out);
        run(&mut r, 105, b"fgh", false, &mut out);
        run(&mut r, 110, b"kl", true, &mut out);
        assert_eq!(r.first_held_run(), Some((SeqNumber(105), 3)));
        let mut head = [0u8; 2];
        assert_eq!(r.first_held_prefix(&mut head), 2);
        assert_eq!(&head, b"fg");
        assert_eq!(r.skip_to(SeqNumber(105)), 3);
        assert!(out == b"ab");
        r.flush(&mut |b| out.extend_from_slice(b));
        assert_eq!(out, b"abfgh");
        assert_eq!(r.first_held_run(), Some((SeqNumber(110), 2)));
        // Skipping into the FIN stops there.
        assert_eq!(r.skip_to(SeqNumber(500)), 4);
        assert!(r.fin_done() && !r.has_held());
        assert_eq!(out, b"abfgh");
    }

    #[test]
    fn skipping_with_nothing_held_moves_the_stream_on() {
        let mut r = Reassembly::new(SeqNumber(0), 1000);
        let mut out = Vec::new();
        assert_eq!(r.skip_to(SeqNumber(40)), 40);
        assert_eq!(r.skip_to(SeqNumber(10)), 0);
        assert_eq!(r.skip_to(SeqNumber(40 + (1 << 30))), 0);
        assert_eq!(
            r.skip_to(SeqNumber(5040)),
            5000,
            "further than a segment may be held"
        );
        run(&mut r, 5040, b"x", false, &mut out);
        assert_eq!(out, b"x");
    }

    #[test]
    fn too_far_ahead_is_dropped() {
        let mut r = Reassembly::new(SeqNumber(0), 100);
        let mut out = Vec::new();
        assert_eq!(run(&mut r, 90, &[1; 11], false, &mut out), Insert::Dropped);
        assert_eq!(
            run(&mut r, 90, &[1; 10], false, &mut out),
            Insert::Accepted {
                held: true,
                trimmed: 0
            }
        );
        assert_eq!(r.held_len(), 100);
    }
}
