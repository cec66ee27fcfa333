//! The hasher of the engine's session tables (by captured flow, by mirrored address): every
//! captured packet and every relayed feedback does one lookup, and std's SipHash-1-3 took a
//! sixth of the engine's instructions per packet for keys of 6-12 bytes.
//!
//! # What this room is for
//!
//! A keyed multiply-fold hash (in the manner of foldhash/wyhash): each written word is
//! xor-ed into the state and folded through a 64x64->128-bit multiply by a per-table secret.
//! The secret comes from std's `RandomState` (the randomness std's own `HashMap` already
//! used here), so a client choosing its addresses and ports cannot aim them at one bucket
//! without knowing it.
//!
//! # What it must never do
//!
//! * Be used where keys can be chosen by someone who also sees the hash values: it resists
//!   blind flooding, not an adversary with an oracle (SipHash's stronger claim).
//! * Be used for anything persistent or shared across processes: the seed differs per table.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Odd 64-bit constants (from the fractional digits of pi), mixed with the random seed.
const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

/// Builds [`FlowHasher`]s sharing one random secret.
#[derive(Clone, Debug)]
pub(crate) struct FlowHash {
    seed: u64,
    mul: u64,
}

impl Default for FlowHash {
    fn default() -> Self {
        let seed = RandomState::new().hash_one(K0);
        // Odd, so the multiply is a bijection on the low bits it keeps.
        Self {
            seed: seed ^ K0,
            mul: (seed.rotate_left(32) ^ K1) | 1,
        }
    }
}

impl BuildHasher for FlowHash {
    type Hasher = FlowHasher;

    #[inline]
    fn build_hasher(&self) -> FlowHasher {
        FlowHasher {
            state: self.seed,
            mul: self.mul,
        }
    }
}

/// See the module documentation.
pub(crate) struct FlowHasher {
    state: u64,
    mul: u64,
}

impl FlowHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.state = fold_mul(self.state ^ word, self.mul);
    }
}

impl Hasher for FlowHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" and "ab\0" apart.
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // One more fold so the last word reaches the top bits (hashbrown's control bytes)
        // as well as the low ones (its bucket index).
        fold_mul(self.state, self.mul ^ K1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::{Ipv4Addr, SocketAddrV4};

    #[test]
    fn consecutive_ports_spread_over_buckets() {
        let h = FlowHash::default();
        let mut low = HashSet::new();
        let mut top = HashSet::new();
        for port in 10_000..11_024u16 {
            let v = h.hash_one(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), port));
            low.insert(v & 1023);
            top.insert(v >> 57);
        }
        // 1024 keys into 1024 buckets: a uniform hash fills about 63% of them.
        assert!(low.len() > 550, "{} buckets used", low.len());
        // 1024 keys into 128 control-byte values: a uniform hash leaves one out about 4% of
        // the time (the seed is random), nine or more practically never.
        assert!(top.len() >= 120, "{} control-byte values used", top.len());
    }

    #[test]
    fn tables_get_different_secrets() {
        let key = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 40000);
        let a = FlowHash::default().hash_one(key);
        let b = FlowHash::default().hash_one(key);
        assert_ne!(a, b);
    }
}
