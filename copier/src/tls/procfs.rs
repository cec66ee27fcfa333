//! What /proc says about the production server: which process listens on the port, which TLS
//! library it maps, and which connection an fd of it is.
//!
//! What this room is for: reading /proc (ours and the server's) and parsing it, the parsers
//! pure and tested apart. What it must never do: write anywhere, or trust what it reads to be
//! well-formed (a line it cannot parse is skipped, never a panic).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// TCP states of /proc/net/tcp we look for (include/net/tcp_states.h).
pub const TCP_LISTEN: u8 = 0x0a;

/// One socket line of /proc/net/tcp or tcp6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLine {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

/// Parses a hex address as /proc/net/tcp{,6} prints it: each 32-bit word in the host's byte
/// order (little-endian here), then `:PORT` in hex. An IPv4-mapped IPv6 address comes back as
/// IPv4 (a dual-stack server's IPv4 clients appear so in tcp6).
pub fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let addr = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(b);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some(SocketAddr::new(addr, port))
}

/// Parses /proc/net/tcp or tcp6; lines that do not parse are skipped.
pub fn parse_tcp_table(text: &str) -> Vec<TcpLine> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(TcpLine {
                local: parse_addr(f.get(1)?)?,
                remote: parse_addr(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The inode of `socket:[N]`, as /proc/PID/fd/* links read.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// A library a process maps (/proc/PID/maps): the first mapped file whose name starts with
/// `prefix` (`libssl.so`, `libc.so`).
pub fn library_in_maps(maps: &str, prefix: &str) -> Option<String> {
    maps.lines().find_map(|line| {
        let path = line.split_whitespace().nth(5)?;
        let name = path.rsplit('/').next()?;
        (path.starts_with('/') && name.starts_with(prefix)).then(|| path.to_string())
    })
}

/// Whether the process's network namespace has TCP connections (not listeners) on local port
/// `port` that a process holds (inode 0: TIME-WAIT and other orphans, which no SSL object can
/// use); true when that cannot be read (the cautious answer).
pub fn has_connections_on(pid: u32, port: u16) -> bool {
    match read_tcp_tables(Path::new(&format!("/proc/{pid}/net"))) {
        Ok(lines) => lines
            .iter()
            .any(|l| l.state != TCP_LISTEN && l.inode != 0 && l.local.port() == port),
        Err(_) => true,
    }
}

/// Reads /proc/net/tcp and tcp6 under `net` (`/proc/net` or `/proc/PID/net`); a missing
/// table (no IPv6) is empty.
pub fn read_tcp_tables(net: &Path) -> io::Result<Vec<TcpLine>> {
    let mut all = Vec::new();
    for name in ["tcp", "tcp6"] {
        match fs::read_to_string(net.join(name)) {
            Ok(text) => all.extend(parse_tcp_table(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound && name == "tcp6" => {}
            Err(e) => return Err(e),
        }
    }
    Ok(all)
}

/// The inodes of /proc/net/unix (the 7th column); lines that do not parse are skipped.
pub fn parse_unix_inodes(text: &str) -> HashSet<u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(6)?.parse().ok())
        .collect()
}

/// Sockets by inode: (local, remote) of every TCP socket of a network namespace.
pub fn connections_by_inode(lines: &[TcpLine]) -> HashMap<u64, (SocketAddr, SocketAddr)> {
    lines
        .iter()
        .filter(|l| l.inode != 0 && l.state != TCP_LISTEN)
        .map(|l| (l.inode, (l.local, l.remote)))
        .collect()
}

/// Why no process was found for the listening sockets.
#[derive(Debug, Default)]
pub struct OwnerSearch {
    /// Processes whose fds we could not read (permission): the owner may be among them.
    pub unreadable: usize,
    pub unreadable_example: Option<(u32, io::Error)>,
}

/// The processes holding any of `inodes` among their fds, lowest pid first.
pub fn processes_holding(inodes: &[u64], search: &mut OwnerSearch) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let fds = match fs::read_dir(entry.path().join("fd")) {
            Ok(d) => d,
            Err(e) => {
                // A process that exited meanwhile is not a permission problem.
                if e.kind() == io::ErrorKind::PermissionDenied {
                    search.unreadable += 1;
                    search.unreadable_example.get_or_insert((pid, e));
                }
                continue;
            }
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path())
                .ok()
                .and_then(|l| socket_inode(l.to_str()?))
                .is_some_and(|i| inodes.contains(&i))
        });
        if holds {
            found.push(pid);
        }
    }
    found.sort_unstable();
    found
}

/// The socket inode behind fd `fd` of process `pid`, if it is a socket.
pub fn fd_socket_inode(pid: u32, fd: u32) -> io::Result<Option<u64>> {
    let link = fs::read_link(format!("/proc/{pid}/fd/{fd}"))?;
    Ok(link.to_str().and_then(socket_inode))
}

/// A path of the process's file as the process sees it, reachable from our mount namespace:
/// as it is when the process has our root, else through /proc/PID/root (a server in a
/// container).
pub fn in_root(pid: u32, path: &str) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let same = |a: &fs::Metadata, b: &fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
    match (fs::metadata(format!("/proc/{pid}/root")), fs::metadata("/")) {
        (Ok(theirs), Ok(ours)) if same(&theirs, &ours) => PathBuf::from(path),
        _ => PathBuf::from(format!("/proc/{pid}/root{path}")),
    }
}

/// When the process started (field 22 of /proc/PID/stat, in clock ticks since boot): with the
/// pid, it tells a process from a later one that got the same pid.
pub fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The name (field 2) is in parentheses and may hold spaces and parentheses itself.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process's short name (/proc/PID/comm).
pub fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0
   1: 020012C6:0CEA 0A0012C6:B3F4 01 00000000:00000000 02:000A7D8F 00000000     0        0 51234 2 0000000000000000 20 4 30 10 -1
   2: garbage
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF0000020012C6:0CEA 0000000000000000FFFF00000A0012C6:D431 01 00000000:00000000 00:00000000 00000000     0        0 61234 1 0000000000000000 20 4 0 10 -1
   1: 00000000000000000000000001000000:0CEA 00000000000000000000000001000000:9C40 01 00000000:00000000 00:00000000 00000000     0        0 71234 1 0000000000000000 20 4 0 10 -1
";

    #[test]
    fn tcp_tables_parse() {
        let v4 = parse_tcp_table(TCP);
        assert_eq!(v4.len(), 2);
        assert_eq!(v4[0].state, TCP_LISTEN);
        assert_eq!(v4[0].local, "0.0.0.0:3306".parse().unwrap());
        assert_eq!(v4[1].local, "198.18.0.2:3306".parse().unwrap());
        assert_eq!(v4[1].remote, "198.18.0.10:46068".parse().unwrap());
        assert_eq!(v4[1].inode, 51234);
        let v6 = parse_tcp_table(TCP6);
        assert_eq!(
            v6[0].local,
            "198.18.0.2:3306".parse().unwrap(),
            "mapped -> v4"
        );
        assert_eq!(v6[0].remote, "198.18.0.10:54321".parse().unwrap());
        assert_eq!(v6[1].local, "[::1]:3306".parse().unwrap());
        let by = connections_by_inode(&v4);
        assert!(!by.contains_key(&41234), "listeners are not connections");
        assert_eq!(by[&51234].1, "198.18.0.10:46068".parse().unwrap());
    }

    #[test]
    fn odd_fields_are_skipped_not_fatal() {
        for f in [
            "",
            ":",
            "0100007F",
            "0100007F:",
            "0100007F:FFFFF",
            "01007F:0050",
            "zz00007F:0050",
        ] {
            assert_eq!(parse_addr(f), None, "{f}");
        }
        assert_eq!(socket_inode("socket:[123]"), Some(123));
        let unix = "Num RefCount Protocol Flags Type St Inode Path\n\
                    0000: 00000002 00000000 00010000 0001 01 4242 /run/mysqld/mysqld.sock\n\
                    junk\n";
        assert_eq!(parse_unix_inodes(unix), HashSet::from([4242]));
        assert_eq!(socket_inode("pipe:[123]"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
    }

    #[test]
    fn start_time_is_field_22() {
        let stat = "22560 (my (odd) d) S 1 22559 22559 0 -1 4194560 6386 0 0 0 28 17 0 0 20 0 \
                    40 0 5205731 2489434112 40113 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(5205731));
        assert_eq!(parse_start_time("1 (x) S"), None);
        assert!(start_time(std::process::id()).is_some());
    }

    #[test]
    fn the_tls_library_is_found_in_maps() {
        let maps = "\
55d0c0a00000-55d0c0b00000 r--p 00000000 08:01 123 /usr/sbin/mariadbd
7f1a00000000-7f1a00100000 r-xp 00020000 08:01 456 /usr/lib/x86_64-linux-gnu/libssl.so.3
7f1a00200000-7f1a00300000 rw-p 00000000 00:00 0 [heap]
";
        assert_eq!(
            library_in_maps(maps, "libssl.so").as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libssl.so.3")
        );
        assert_eq!(
            library_in_maps("7f-8f r-xp 0 08:01 1 /lib/libcrypto.so.3\n", "libssl.so"),
            None
        );
        assert_eq!(library_in_maps(maps, "libc.so"), None);
    }
}
