//! Rewriting client addresses into a pool (`client_ip_pool`).
//!
//! Mirrored connections from many production clients may be sent from a handful of pool
//! addresses so the test host needs one route, not one per client. The client port is kept
//! (it is what makes the 4-tuple recognisable in logs on both sides); the pool address is
//! chosen from a hash of the client IP so a client tends to keep the same pool address, and the
//! next address is probed when that (address, port) is already in use by another live session.

use std::net::{Ipv4Addr, SocketAddrV4};

#[derive(Clone, Copy, Debug)]
pub(crate) struct AddressPool {
    first: u32,
    len: u32,
    /// The target's own address, if it falls inside the pool: never use it as a source.
    exclude: u32,
}

impl AddressPool {
    /// `None` when the pool holds no usable address.
    pub(crate) fn new(net: Ipv4Addr, prefix: u8, exclude: Ipv4Addr) -> Option<Self> {
        let prefix = prefix.min(32);
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        let base = u32::from(net) & mask;
        let size = 1u64 << (32 - prefix);
        // Network and broadcast addresses of a real subnet would be dropped or answered by
        // routers; /31 and /32 have none.
        let (first, len) = if prefix <= 30 {
            (base + 1, (size - 2) as u32)
        } else {
            (base, size as u32)
        };
        let pool = Self {
            first,
            len,
            exclude: u32::from(exclude),
        };
        let only_excluded = len == 1 && first == pool.exclude;
        (len > 0 && !only_excluded).then_some(pool)
    }

    /// The `index`-th of `count` equal slices (the remainder of the division is left unused);
    /// `None` if a slice would be empty. Engines given different slices never share an address.
    pub(crate) fn slice(self, index: u32, count: u32) -> Option<Self> {
        let each = self.len / count.max(1);
        if each == 0 || index >= count {
            return None;
        }
        Some(Self {
            first: self.first + index * each,
            len: each,
            exclude: self.exclude,
        })
    }

    /// Which of `count` slices (see [`AddressPool::slice`]) holds `ip`, if any.
    pub(crate) fn slice_of(&self, ip: Ipv4Addr, count: u32) -> Option<u32> {
        let each = self.len / count.max(1);
        let offset = u32::from(ip).checked_sub(self.first)?;
        let index = offset.checked_div(each)?;
        (index < count).then_some(index)
    }

    /// Usable addresses (the target's, when inside, does not count).
    pub(crate) fn usable(&self) -> u32 {
        let hit = self.exclude >= self.first && self.exclude - self.first < self.len;
        self.len - u32::from(hit)
    }

    /// A pool address with the client's port whose (address, port) `taken` does not claim.
    /// Probing stops at the first free address, so it costs at most one step per live session
    /// using that port.
    pub(crate) fn pick(
        &self,
        client: SocketAddrV4,
        mut taken: impl FnMut(SocketAddrV4) -> bool,
    ) -> Option<SocketAddrV4> {
        let start = mix(u32::from(*client.ip())) % self.len;
        for i in 0..self.len {
            let ip = self.first.wrapping_add((start.wrapping_add(i)) % self.len);
            if ip == self.exclude {
                continue;
            }
            let cand = SocketAddrV4::new(Ipv4Addr::from(ip), client.port());
            if !taken(cand) {
                return Some(cand);
            }
        }
        None
    }
}

/// A fixed integer mix: deterministic across runs (tests, replays), unlike `RandomState`.
fn mix(x: u32) -> u32 {
    let mut h = x.wrapping_mul(0x9e37_79b1);
    h ^= h >> 15;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^ (h >> 13)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn skips_network_broadcast_and_target() {
        let p = AddressPool::new(
            Ipv4Addr::new(198, 19, 1, 3),
            30,
            Ipv4Addr::new(198, 19, 1, 1),
        )
        .unwrap();
        let mut used = HashSet::new();
        let c = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 5000);
        let a = p.pick(c, |x| used.contains(&x)).unwrap();
        assert_eq!(*a.ip(), Ipv4Addr::new(198, 19, 1, 2));
        used.insert(a);
        assert_eq!(p.pick(c, |x| used.contains(&x)), None);
    }

    #[test]
    fn same_port_different_clients_do_not_collide() {
        let p = AddressPool::new(Ipv4Addr::new(198, 19, 2, 0), 29, Ipv4Addr::UNSPECIFIED).unwrap();
        let mut used = HashSet::new();
        for i in 0..6 {
            let c = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10 + i), 4000);
            let a = p.pick(c, |x| used.contains(&x)).unwrap();
            assert_eq!(a.port(), 4000);
            assert!(used.insert(a));
        }
        let c = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 99), 4000);
        assert_eq!(
            p.pick(c, |x| used.contains(&x)),
            None,
            "6 usable addresses in a /29"
        );
    }

    #[test]
    fn slices_are_disjoint_and_found_again() {
        let p = AddressPool::new(Ipv4Addr::new(198, 19, 0, 0), 24, Ipv4Addr::UNSPECIFIED).unwrap();
        let mut seen = HashSet::new();
        for i in 0..3 {
            let s = p.slice(i, 3).unwrap();
            assert_eq!(s.len, 84);
            let mut used = HashSet::new();
            for n in 0..84u8 {
                let c = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, n), 4000);
                let a = s.pick(c, |x| used.contains(&x)).unwrap();
                used.insert(a);
                assert!(seen.insert(a), "{a} in two slices");
                assert_eq!(p.slice_of(*a.ip(), 3), Some(i));
            }
        }
        assert_eq!(p.slice_of(Ipv4Addr::new(198, 19, 0, 0), 3), None);
        assert_eq!(
            p.slice_of(Ipv4Addr::new(198, 19, 0, 254), 3),
            None,
            "remainder"
        );
        assert_eq!(p.slice_of(Ipv4Addr::new(10, 0, 0, 1), 3), None);
        assert!(p.slice(0, 255).is_none());
    }

    #[test]
    fn empty_pools() {
        assert!(
            AddressPool::new(Ipv4Addr::new(1, 2, 3, 4), 32, Ipv4Addr::new(1, 2, 3, 4)).is_none()
        );
        assert!(
            AddressPool::new(Ipv4Addr::new(1, 2, 3, 4), 32, Ipv4Addr::new(1, 2, 3, 5)).is_some()
        );
        assert!(
            AddressPool::new(Ipv4Addr::new(1, 2, 3, 4), 40, Ipv4Addr::new(9, 9, 9, 9)).is_some()
        );
    }
}
