//! Facts about this host that set-ups go wrong on: sysctls, capabilities, interfaces and their
//! addresses, the interface and path MTU toward an address, clock synchronisation, conntrack.
//!
//! Everything is read from /proc, /sys and plain socket calls (no netlink, no `ip` command),
//! and every reader returns `None` rather than failing when the kernel does not have the file:
//! a doctor must report what it could not see, not crash on it.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::Path;

/// `/proc/sys/<path>` (slashes, not dots: interface names may contain dots), trimmed.
pub fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// An integer sysctl.
pub fn sysctl_int(path: &str) -> Option<i64> {
    sysctl(path)?.parse().ok()
}

/// `net.ipv4.conf.<iface>.<key>` as an integer (`iface` may be `all` or `default`).
pub fn ipv4_conf(iface: &str, key: &str) -> Option<i64> {
    if iface.is_empty() || iface.contains('/') || iface == "." || iface == ".." {
        return None;
    }
    sysctl_int(&format!("net/ipv4/conf/{iface}/{key}"))
}

/// The rp_filter the kernel applies on `iface`: the larger of `all` and the interface's own
/// value (0 off, 1 strict, 2 loose).
pub fn effective_rp_filter(iface: &str) -> Option<i64> {
    match (ipv4_conf("all", "rp_filter"), ipv4_conf(iface, "rp_filter")) {
        (Some(a), Some(i)) => Some(a.max(i)),
        (a, i) => a.or(i),
    }
}

pub fn rp_filter_name(v: i64) -> &'static str {
    match v {
        0 => "off",
        1 => "strict",
        2 => "loose",
        _ => "unknown",
    }
}

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;

/// The effective capability set of this process (`CapEff` of /proc/self/status).
pub fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

pub fn has_cap(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// One IPv4 address of an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub iface: String,
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

/// Every IPv4 address of this host's interfaces (getifaddrs(3)).
pub fn ipv4_addrs() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs; we only read
    // it in between, checking every pointer for null and the family before casting.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            if i32::from((*ifa.ifa_addr).sa_family) != libc::AF_INET {
                continue;
            }
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            let prefix = if ifa.ifa_netmask.is_null() {
                32
            } else {
                let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                u32::from_be(m.sin_addr.s_addr).count_ones() as u8
            };
            let iface = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            out.push(IfAddr {
                iface,
                addr,
                prefix,
            });
        }
        libc::freeifaddrs(head);
    }
    out
}

/// Names of this host's network interfaces.
pub fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The interface's hardware address (`/sys/class/net/<iface>/address`).
pub fn mac_of(iface: &str) -> Option<[u8; 6]> {
    if iface.contains('/') || iface.is_empty() {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address")).ok()?;
    parse_mac(text.trim())
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The interface's MTU.
pub fn mtu_of(iface: &str) -> Option<u32> {
    if iface.contains('/') || iface.is_empty() {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `ip` is assigned to this host (binding to it succeeds only then).
pub fn is_local(ip: Ipv4Addr) -> bool {
    UdpSocket::bind(SocketAddrV4::new(ip, 0)).is_ok()
}

/// How this host reaches `dst`: the source address the kernel picks, its interface, and the
/// route's MTU (a connected UDP socket: the kernel does the route lookup, nothing is sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTo {
    pub src: Ipv4Addr,
    pub iface: Option<String>,
    /// IP_MTU of the route (the interface MTU unless the route sets one).
    pub mtu: Option<u32>,
    /// Whether `dst` is in the subnet of the outgoing interface (no gateway in between).
    pub on_link: bool,
}

pub fn route_to(dst: Ipv4Addr) -> std::io::Result<RouteTo> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(SocketAddrV4::new(dst, 9))?;
    let src = match sock.local_addr()? {
        std::net::SocketAddr::V4(a) => *a.ip(),
        std::net::SocketAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    let mtu = ip_mtu(&sock);
    let addrs = ipv4_addrs();
    let own = addrs.iter().find(|a| a.addr == src);
    let on_link = own.is_some_and(|a| same_subnet(a.addr, dst, a.prefix));
    Ok(RouteTo {
        src,
        iface: own.map(|a| a.iface.clone()),
        mtu,
        on_link,
    })
}

fn ip_mtu(sock: &UdpSocket) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: IP_MTU writes one int into `mtu`, whose size we pass.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0 && mtu > 0).then_some(mtu as u32)
}

pub fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let mask = u32::MAX << (32 - u32::from(prefix.min(32)));
    u32::from(a) & mask == u32::from(b) & mask
}

/// `A.B.C.D/LEN`, the address masked to its network.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not CIDR (expected e.g. 198.19.0.0/16)"))?;
    let addr: Ipv4Addr = addr.parse().map_err(|e| format!("{addr:?}: {e}"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("prefix length {len:?} must be 0 to 32"))?;
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Ok((Ipv4Addr::from(u32::from(addr) & mask), len))
}

/// What adjtimex(2) says about the system clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockState {
    /// The kernel considers the clock synchronised (an NTP daemon disciplines it).
    pub synchronized: bool,
    /// Estimated error, in microseconds.
    pub est_error_us: i64,
}

pub fn clock_state() -> Option<ClockState> {
    // SAFETY: with modes = 0 adjtimex only reads the kernel's clock state into `tx`.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        return None;
    }
    Some(ClockState {
        synchronized: state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0,
        est_error_us: tx.esterror as i64,
    })
}

/// Connection tracking entries in use and the table's size, when the module is loaded.
pub fn conntrack() -> Option<(u64, u64)> {
    let count = sysctl("net/netfilter/nf_conntrack_count")?.parse().ok()?;
    let max = sysctl("net/netfilter/nf_conntrack_max")?.parse().ok()?;
    Some((count, max))
}

/// This host's name, for messages.
pub fn hostname() -> String {
    sysctl("kernel/hostname").unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_print() {
        let m = parse_mac("02:54:53:44:00:0a").unwrap();
        assert_eq!(format_mac(&m), "02:54:53:44:00:0a");
        assert!(parse_mac("02:54:53:44:00").is_none());
        assert!(parse_mac("02:54:53:44:00:0a:01").is_none());
        assert!(parse_mac("zz:54:53:44:00:0a").is_none());
    }

    #[test]
    fn cidrs() {
        assert_eq!(
            parse_cidr("198.19.3.7/16"),
            Ok((Ipv4Addr::new(198, 19, 0, 0), 16))
        );
        assert_eq!(parse_cidr("0.0.0.0/0"), Ok((Ipv4Addr::UNSPECIFIED, 0)));
        assert!(parse_cidr("198.19.0.0/33").is_err());
        assert!(parse_cidr("198.19.0.0").is_err());
    }

    #[test]
    fn subnets() {
        let a = Ipv4Addr::new(198, 18, 0, 3);
        assert!(same_subnet(a, Ipv4Addr::new(198, 18, 0, 200), 24));
        assert!(!same_subnet(a, Ipv4Addr::new(198, 19, 0, 3), 24));
        assert!(same_subnet(a, Ipv4Addr::new(198, 19, 0, 3), 15));
        assert!(same_subnet(a, Ipv4Addr::new(1, 1, 1, 1), 0));
    }

    #[test]
    fn this_host_is_readable() {
        // Loopback exists everywhere, with 127.0.0.1/8.
        let lo = ipv4_addrs();
        assert!(
            lo.iter()
                .any(|a| a.addr == Ipv4Addr::LOCALHOST && a.prefix == 8),
            "{lo:?}"
        );
        assert!(is_local(Ipv4Addr::LOCALHOST));
        let r = route_to(Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(r.src, Ipv4Addr::LOCALHOST);
        assert_eq!(r.iface.as_deref(), Some("lo"));
        assert!(r.mtu.unwrap_or(0) >= 1280);
        assert!(effective_caps().is_some());
        assert!(ipv4_conf("../x", "rp_filter").is_none());
        assert!(clock_state().is_some());
    }
}
