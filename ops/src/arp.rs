//! Who answers ARP for an address on a segment: the "switch answers ARP" trap check.
//!
//! The test server must hand its replies for mirrored clients to the assistant. Any other host
//! that answers ARP for a client address on that segment (a router with proxy ARP, a host that
//! has the address configured, a switch feature) may get them instead, and since it knows
//! nothing of the connection it resets it. So the doctor broadcasts ARP requests for the
//! mirrored client addresses and reports every answer with its hardware address.
//!
//! The requests carry the interface's real address as sender (not 0.0.0.0, the RFC 5227 probe
//! form) because proxy ARP, the usual culprit, does not answer address probes.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const ETH_P_ARP: u16 = 0x0806;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
/// Ethernet header (14) + ARP for IPv4 over Ethernet (28), padded to the 60-byte minimum.
const FRAME_LEN: usize = 60;
/// Most addresses asked in one probe: enough for a /22 pool or a sample of a larger one.
pub const MAX_TARGETS: usize = 1024;

/// One ARP reply.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ArpAnswer {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

/// The ARP request for `target`, from `mac`/`sender`, as a broadcast Ethernet frame.
pub fn request_frame(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&ARP_REQUEST.to_be_bytes());
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&sender.octets());
    // Target hardware address stays zero.
    f[38..42].copy_from_slice(&target.octets());
    f
}

/// The (sender address, sender hardware address) of an ARP reply frame; `None` for anything
/// else. The frame is untrusted: every length is checked.
pub fn parse_reply(frame: &[u8]) -> Option<ArpAnswer> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() {
        return None;
    }
    let arp = &frame[14..];
    let ok = arp[0..2] == 1u16.to_be_bytes()
        && arp[2..4] == 0x0800u16.to_be_bytes()
        && arp[4] == 6
        && arp[5] == 4
        && arp[6..8] == ARP_REPLY.to_be_bytes();
    if !ok {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&arp[8..14]);
    let ip = Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17]);
    Some(ArpAnswer { ip, mac })
}

/// Asks, on `iface`, who has each of `targets` (at most [`MAX_TARGETS`]), waiting `wait` for
/// the answers. Needs CAP_NET_RAW. Returns every distinct (address, hardware address) seen.
pub fn probe(
    iface: &str,
    sender: Ipv4Addr,
    targets: &[Ipv4Addr],
    wait: Duration,
) -> io::Result<Vec<ArpAnswer>> {
    ArpSocket::open()?.probe(iface, sender, targets, wait)
}

/// A packet socket for ARP probes, opened while the process has CAP_NET_RAW so that a daemon
/// can still probe after dropping it (a running intercept answers `copier doctor`). It receives
/// nothing until its first probe binds it to an interface; after that it stays bound and its
/// receive buffer (bounded by the kernel) holds that segment's ARP traffic until the next probe
/// drains it.
pub struct ArpSocket {
    fd: OwnedFd,
}

impl ArpSocket {
    /// Opens the socket (protocol 0: no packet is queued yet). Needs CAP_NET_RAW.
    pub fn open() -> io::Result<ArpSocket> {
        // SAFETY: plain socket(2); the descriptor is owned by `fd` from here on.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        Ok(ArpSocket {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// [`probe`] on this socket; needs no capability.
    pub fn probe(
        &self,
        iface: &str,
        sender: Ipv4Addr,
        targets: &[Ipv4Addr],
        wait: Duration,
    ) -> io::Result<Vec<ArpAnswer>> {
        probe_on(&self.fd, iface, sender, targets, wait)
    }
}

fn probe_on(
    fd: &OwnedFd,
    iface: &str,
    sender: Ipv4Addr,
    targets: &[Ipv4Addr],
    wait: Duration,
) -> io::Result<Vec<ArpAnswer>> {
    let mac = crate::host::mac_of(iface).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no hardware address for interface {iface}"),
        )
    })?;
    let name = std::ffi::CString::new(iface)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
    // SAFETY: if_nametoindex reads the NUL-terminated name only.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_ll is valid; the fields set below are plain integers.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ARP.to_be();
    sll.sll_ifindex = index as i32;
    sll.sll_halen = 6;
    sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    let sll_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `sll` is a valid sockaddr_ll of the length given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            sll_len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // Whatever an earlier probe left queued is stale.
    let mut buf = [0u8; 2048];
    // SAFETY: reads at most buf.len() bytes into our buffer, without waiting.
    while unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    } > 0
    {}
    for target in targets.iter().take(MAX_TARGETS) {
        let frame = request_frame(mac, sender, *target);
        // SAFETY: sends our buffer to the broadcast address in `sll`; both outlive the call.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                sll_len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // A burst of broadcasts is what ARP storm control on switches drops: pace them.
        std::thread::sleep(Duration::from_micros(500));
    }
    let wanted: std::collections::HashSet<Ipv4Addr> = targets.iter().copied().collect();
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one pollfd, valid for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        // SAFETY: reads at most buf.len() bytes into our buffer.
        let got = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if got <= 0 {
            continue;
        }
        if let Some(a) = parse_reply(&buf[..got as usize]) {
            if wanted.contains(&a.ip) && a.mac != mac {
                seen.insert((a.ip, a.mac), a);
            }
        }
    }
    Ok(seen.into_values().collect())
}

/// At most `max` addresses of `base/prefix` to ask about: all usable ones of a small pool,
/// else an even spread over it (a pool is configured or routed as a whole, so a spread finds
/// a whole-range culprit such as proxy ARP, and `always` adds the addresses that matter most).
pub fn sample_pool(base: Ipv4Addr, prefix: u8, max: usize, always: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
    let size: u64 = 1u64 << (32 - u32::from(prefix.min(32)));
    let first = u64::from(u32::from(base));
    // Network and broadcast addresses are never client addresses.
    let usable = if size > 2 { size - 2 } else { size };
    let start = if size > 2 { first + 1 } else { first };
    let mut out: Vec<Ipv4Addr> = always.to_vec();
    let room = max.saturating_sub(out.len()) as u64;
    let step = usable.div_ceil(room.max(1)).max(1);
    let mut i = 0;
    while i < usable && (out.len() as u64) < max as u64 {
        let ip = Ipv4Addr::from((start + i) as u32);
        if !out.contains(&ip) {
            out.push(ip);
        }
        i += step;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_reply_frames() {
        let mac = [2, 0x54, 0x53, 0x44, 0, 4];
        let f = request_frame(
            mac,
            Ipv4Addr::new(198, 18, 0, 4),
            Ipv4Addr::new(198, 19, 0, 7),
        );
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[8, 6]);
        assert_eq!(&f[20..22], &[0, 1]);
        assert_eq!(&f[38..42], &[198, 19, 0, 7]);
        assert!(parse_reply(&f).is_none(), "a request is not a reply");
        let mut r = f;
        r[20..22].copy_from_slice(&[0, 2]);
        r[22..28].copy_from_slice(&[2, 0x54, 0x53, 0x44, 0, 10]);
        r[28..32].copy_from_slice(&[198, 19, 0, 7]);
        assert_eq!(
            parse_reply(&r),
            Some(ArpAnswer {
                ip: Ipv4Addr::new(198, 19, 0, 7),
                mac: [2, 0x54, 0x53, 0x44, 0, 10]
            })
        );
        for n in 0..42 {
            assert!(parse_reply(&r[..n]).is_none());
        }
    }

    #[test]
    fn pool_samples() {
        let base = Ipv4Addr::new(198, 19, 0, 0);
        let all = sample_pool(base, 24, 1024, &[]);
        assert_eq!(all.len(), 254);
        assert_eq!(all[0], Ipv4Addr::new(198, 19, 0, 1));
        assert_eq!(all[253], Ipv4Addr::new(198, 19, 0, 254));
        let pick = Ipv4Addr::new(198, 19, 77, 77);
        let some = sample_pool(base, 16, 256, &[pick]);
        assert_eq!(some.len(), 256);
        assert_eq!(some[0], pick);
        assert!(some.iter().all(|a| a.octets()[..2] == [198, 19]));
        assert_eq!(sample_pool(base, 32, 10, &[]), vec![base]);
    }
}
