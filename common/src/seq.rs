//! TCP sequence and acknowledgement numbers as a type of their own.
//!
//! A sequence number counts bytes modulo 2^32, so plain `u32` arithmetic and comparison are
//! wrong as soon as a stream wraps (every 4 GiB, and at once for an ISN near `u32::MAX`).
//! [`SeqNumber`] gives sequence numbers the only operations that make sense for them (after
//! smoltcp's `TcpSeqNumber`): adding a byte count wraps, subtracting two gives a signed
//! distance, and comparison is RFC 1982 serial-number arithmetic.
//!
//! This room is for sequence-space arithmetic and nothing else: no windows, no stream offsets,
//! no policy. It must never offer a total order: two numbers 2^31 apart are *neither* before
//! nor after each other (RFC 1982 leaves the comparison undefined), which is why [`SeqNumber`]
//! is `PartialOrd` only and `partial_cmp` returns `None` for that pair. Nothing may sort or key
//! a map by it either, for the same reason (use a stream offset for that).
//!
//! The `u32` helpers this type replaced (`wire::seq`, gone since every caller holds a
//! [`SeqNumber`]) agreed with it on every pair except the one 2^31 apart, which they called
//! "less than" both ways; the copier's engine keeps their answers where hostile input reaches
//! (its `engine::serial`).

use std::cmp::Ordering;
use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// A TCP sequence (or acknowledgement) number: `u32` modulo 2^32, ordered by RFC 1982.
///
/// ```
/// use common::seq::SeqNumber;
/// let isn = SeqNumber(u32::MAX - 1);
/// let later = isn + 10usize;
/// assert_eq!(later, SeqNumber(8));
/// assert!(isn < later);
/// assert_eq!(later - isn, 10);
/// assert_eq!(later.bytes_since(isn), 10);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct SeqNumber(pub u32);

impl SeqNumber {
    /// Reads a sequence number as TCP carries it (network byte order).
    #[inline]
    pub fn from_be_bytes(b: [u8; 4]) -> Self {
        SeqNumber(u32::from_be_bytes(b))
    }

    /// The sequence number as TCP carries it (network byte order).
    #[inline]
    pub fn to_be_bytes(self) -> [u8; 4] {
        self.0.to_be_bytes()
    }

    /// The later of the two; `self` when neither is later (equal, or 2^31 apart).
    #[inline]
    pub fn max(self, other: Self) -> Self {
        if self < other {
            other
        } else {
            self
        }
    }

    /// The earlier of the two; `self` when neither is earlier (equal, or 2^31 apart).
    #[inline]
    pub fn min(self, other: Self) -> Self {
        if other < self {
            other
        } else {
            self
        }
    }

    /// Bytes from `earlier` forward to `self`, modulo 2^32: the unsigned distance, for a caller
    /// that knows `earlier` is not after `self` (a segment's end against its start). When it
    /// is after, this is the distance the long way round, never a negative number.
    #[inline]
    pub fn bytes_since(self, earlier: Self) -> usize {
        self.0.wrapping_sub(earlier.0) as usize
    }
}

/// Adds a byte count, wrapping modulo 2^32 (a count of 2^32 or more wraps too: only its low
/// 32 bits move a sequence number, as a stream offset's do).
impl Add<usize> for SeqNumber {
    type Output = SeqNumber;
    #[inline]
    fn add(self, rhs: usize) -> SeqNumber {
        SeqNumber(self.0.wrapping_add(rhs as u32))
    }
}

impl Add<u32> for SeqNumber {
    type Output = SeqNumber;
    #[inline]
    fn add(self, rhs: u32) -> SeqNumber {
        SeqNumber(self.0.wrapping_add(rhs))
    }
}

impl AddAssign<usize> for SeqNumber {
    #[inline]
    fn add_assign(&mut self, rhs: usize) {
        *self = *self + rhs;
    }
}

impl AddAssign<u32> for SeqNumber {
    #[inline]
    fn add_assign(&mut self, rhs: u32) {
        *self = *self + rhs;
    }
}

/// Goes back a byte count, wrapping modulo 2^32.
impl Sub<usize> for SeqNumber {
    type Output = SeqNumber;
    #[inline]
    fn sub(self, rhs: usize) -> SeqNumber {
        SeqNumber(self.0.wrapping_sub(rhs as u32))
    }
}

impl Sub<u32> for SeqNumber {
    type Output = SeqNumber;
    #[inline]
    fn sub(self, rhs: u32) -> SeqNumber {
        SeqNumber(self.0.wrapping_sub(rhs))
    }
}

impl SubAssign<usize> for SeqNumber {
    #[inline]
    fn sub_assign(&mut self, rhs: usize) {
        *self = *self - rhs;
    }
}

impl SubAssign<u32> for SeqNumber {
    #[inline]
    fn sub_assign(&mut self, rhs: u32) {
        *self = *self - rhs;
    }
}

/// The signed distance from `rhs` to `self`: positive when `self` is after `rhs`. Two numbers
/// 2^31 apart give `i32::MIN` either way round (see the module doc).
impl Sub for SeqNumber {
    type Output = i32;
    #[inline]
    fn sub(self, rhs: SeqNumber) -> i32 {
        self.0.wrapping_sub(rhs.0) as i32
    }
}

/// RFC 1982: `a < b` iff `(b - a) as i32 > 0`; `None` for two numbers 2^31 apart.
///
/// The four operators are written out rather than derived from `partial_cmp`: each is then
/// one subtraction and one signed comparison (the derived ones also test for `i32::MIN`), and
/// the engine compares sequence numbers several times per packet.
impl PartialOrd for SeqNumber {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match *self - *other {
            0 => Some(Ordering::Equal),
            i32::MIN => None,
            d if d > 0 => Some(Ordering::Greater),
            _ => Some(Ordering::Less),
        }
    }

    #[inline]
    fn lt(&self, other: &Self) -> bool {
        *other - *self > 0
    }

    #[inline]
    fn le(&self, other: &Self) -> bool {
        *other - *self >= 0
    }

    #[inline]
    fn gt(&self, other: &Self) -> bool {
        *self - *other > 0
    }

    #[inline]
    fn ge(&self, other: &Self) -> bool {
        *self - *other >= 0
    }
}

impl fmt::Display for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SeqNumber({})", self.0)
    }
}

impl From<u32> for SeqNumber {
    #[inline]
    fn from(v: u32) -> Self {
        SeqNumber(v)
    }
}

impl From<SeqNumber> for u32 {
    #[inline]
    fn from(s: SeqNumber) -> u32 {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HALF: u32 = 1 << 31;

    #[test]
    fn arithmetic_wraps() {
        let s = SeqNumber(u32::MAX - 1);
        assert_eq!(s + 2usize, SeqNumber(0));
        assert_eq!(s + 3u32, SeqNumber(1));
        assert_eq!(SeqNumber(1) - 3usize, SeqNumber(u32::MAX - 1));
        assert_eq!(SeqNumber(1) - 3u32, SeqNumber(u32::MAX - 1));
        // A stream offset past 4 GiB moves the number by its low 32 bits.
        assert_eq!(SeqNumber(10) + ((1usize << 32) + 5), SeqNumber(15));
        let mut m = s;
        m += 5usize;
        m -= 1u32;
        assert_eq!(m, SeqNumber(2));
        assert_eq!(SeqNumber(5) - s, 7);
        assert_eq!(s - SeqNumber(5), -7);
        assert_eq!(SeqNumber(5).bytes_since(s), 7);
    }

    #[test]
    fn comparison_is_serial() {
        let (a, b) = (SeqNumber(0xffff_fff0), SeqNumber(5));
        // Each operator on its own: they are PartialOrd's, not derived from one another here.
        assert_eq!([a < b, b > a, a <= b, b >= a], [true; 4]);
        assert_eq!([b < a, a > b, b <= a, a >= b], [false; 4]);
        assert_eq!(a.max(b), b);
        assert_eq!(b.max(a), b);
        assert_eq!(a.min(b), a);
        assert_eq!(b.min(a), a);
        assert_eq!(a.partial_cmp(&a), Some(Ordering::Equal));
        // 2^31 apart: neither before nor after; max and min keep the first.
        let c = SeqNumber(7) + HALF;
        let d = SeqNumber(7);
        assert_eq!(c.partial_cmp(&d), None);
        assert_eq!([c < d, d < c, c <= d, c >= d, c > d, d > c], [false; 6]);
        assert_ne!(c, d);
        assert_eq!((c.max(d), c.min(d)), (c, c));
        assert_eq!(c - d, i32::MIN);
    }

    #[test]
    fn formats_as_its_number() {
        assert_eq!(SeqNumber(42).to_string(), "42");
        assert_eq!(format!("{:?}", SeqNumber(42)), "SeqNumber(42)");
        assert_eq!(format!("{:>5}", SeqNumber(42)), "   42");
        assert_eq!(
            SeqNumber::from_be_bytes([1, 2, 3, 4]),
            SeqNumber(0x0102_0304)
        );
        assert_eq!(SeqNumber(0x0102_0304).to_be_bytes(), [1, 2, 3, 4]);
    }

    proptest! {
        #[test]
        fn distance_and_order_agree(a in any::<u32>(), n in 0u32..HALF) {
            let a = SeqNumber(a);
            let b = a + n;
            prop_assert_eq!(b - a, n as i32);
            prop_assert_eq!(a - b, (n as i32).wrapping_neg());
            prop_assert_eq!(b.bytes_since(a), n as usize);
            prop_assert_eq!(b - n, a);
            prop_assert_eq!(a < b, n > 0);
            prop_assert_eq!(b > a, n > 0);
            prop_assert_eq!(a <= b, true);
            prop_assert_eq!(b < a, false);
            prop_assert_eq!(a.max(b), b);
            prop_assert_eq!(a.min(b), a);
            prop_assert_eq!(b.max(a), b);
            prop_assert_eq!(b.min(a), a);
        }

        #[test]
        fn order_is_antisymmetric_and_matches_the_u32_helpers(a in any::<u32>(), b in any::<u32>()) {
            let (x, y) = (SeqNumber(a), SeqNumber(b));
            // Exactly one of <, ==, > holds, except for the undefined pair 2^31 apart.
            let held = [x < y, x == y, x > y].iter().filter(|&&h| h).count();
            if b.wrapping_sub(a) == HALF {
                prop_assert_eq!(held, 0);
            } else {
                prop_assert_eq!(held, 1);
                // The signed distance, as the old `u32` helpers compared.
                let d = a.wrapping_sub(b) as i32;
                prop_assert_eq!(x < y, d < 0);
                prop_assert_eq!(x <= y, d <= 0);
                prop_assert_eq!(x > y, d > 0);
                prop_assert_eq!(x >= y, d >= 0);
                prop_assert_eq!(x.max(y).0, if d < 0 { b } else { a });
            }
            prop_assert_eq!(x.partial_cmp(&y).map(Ordering::reverse), y.partial_cmp(&x));
        }
    }
}
