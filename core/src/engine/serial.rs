//! The engine's sequence-number comparisons where [`SeqNumber`]'s own would change behaviour.
//!
//! [`SeqNumber`] leaves two numbers exactly 2^31 apart unordered (`<` is false both ways,
//! `max` keeps the first). The engine predates it and compared raw `u32`s with
//! `common::wire::seq` (since removed), which called that pair "before" both ways and whose
//! `max` took the second. At a site a hostile or corrupt packet can reach (a captured `seq`/`ack`, a test
//! server's feedback) with nothing else ruling the pair out, the engine keeps the old answer
//! through these helpers, so that typing the numbers changes no decision, byte for byte.
//! Every other comparison uses [`SeqNumber`]'s operators, with a comment where the pair is
//! ruled out by a bound checked beside it.

use common::seq::SeqNumber;

/// `a` before `b`, or exactly 2^31 from it: the old `seq::lt(a, b)`.
#[inline]
pub(crate) fn behind(a: SeqNumber, b: SeqNumber) -> bool {
    a - b < 0
}

/// `a` at or before `b`, or exactly 2^31 from it: the old `seq::le(a, b)`.
#[inline]
pub(crate) fn not_ahead(a: SeqNumber, b: SeqNumber) -> bool {
    a - b <= 0
}

/// The later of `kept` and `seen`, and `seen` when they are 2^31 apart: the old
/// `seq::max(kept, seen)` (the newest report wins the undefined pair).
#[inline]
pub(crate) fn max_or_seen(kept: SeqNumber, seen: SeqNumber) -> SeqNumber {
    if behind(kept, seen) {
        seen
    } else {
        kept
    }
}

/// TCP timestamps (RFC 7323) are not sequence numbers and stay `u32`, but PAWS orders them
/// the same way, modulo 2^32: `val` later than `than`, or exactly 2^31 from it (the engine's
/// answer before `SeqNumber`, kept: a client's or test server's TSval is unchecked input).
#[inline]
pub(crate) fn ts_after(val: u32, than: u32) -> bool {
    (than.wrapping_sub(val) as i32) < 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The removed `common::wire::seq` helpers, as they were: the reference.
    mod seq {
        pub(super) fn lt(a: u32, b: u32) -> bool {
            (a.wrapping_sub(b) as i32) < 0
        }
        pub(super) fn le(a: u32, b: u32) -> bool {
            (a.wrapping_sub(b) as i32) <= 0
        }
        pub(super) fn gt(a: u32, b: u32) -> bool {
            lt(b, a)
        }
        pub(super) fn ge(a: u32, b: u32) -> bool {
            le(b, a)
        }
        pub(super) fn max(a: u32, b: u32) -> u32 {
            if lt(a, b) {
                b
            } else {
                a
            }
        }
    }

    proptest! {
        #[test]
        fn agree_with_the_u32_helpers_on_every_pair(a in any::<u32>(), b in any::<u32>()) {
            let (x, y) = (SeqNumber(a), SeqNumber(b));
            prop_assert_eq!(behind(x, y), seq::lt(a, b));
            prop_assert_eq!(not_ahead(x, y), seq::le(a, b));
            prop_assert_eq!(behind(y, x), seq::gt(a, b));
            prop_assert_eq!(not_ahead(y, x), seq::ge(a, b));
            prop_assert_eq!(max_or_seen(x, y).0, seq::max(a, b));
            prop_assert_eq!(ts_after(a, b), seq::gt(a, b));
        }

        #[test]
        fn agree_with_seq_number_off_the_half_way_pair(a in any::<u32>(), b in any::<u32>()) {
            prop_assume!(b.wrapping_sub(a) != 1 << 31);
            let (x, y) = (SeqNumber(a), SeqNumber(b));
            prop_assert_eq!(behind(x, y), x < y);
            prop_assert_eq!(not_ahead(x, y), x <= y);
            prop_assert_eq!(max_or_seen(x, y), x.max(y));
        }
    }

    #[test]
    fn the_half_way_pair_keeps_the_old_answers() {
        let (x, y) = (SeqNumber(7), SeqNumber(7 + (1 << 31)));
        assert!(behind(x, y) && behind(y, x));
        assert!(not_ahead(x, y) && not_ahead(y, x));
        assert_eq!((max_or_seen(x, y), max_or_seen(y, x)), (y, x));
    }
}
