//! On-test-host mode: intercept runs on the test server itself, where no assist host on the
//! same subnet can be had (clouds, where host routes to another machine cannot be set).
//!
//! The test server's replies to mirrored clients (destination in `--client-ip-pool`, source
//! port one of `--port`) are taken by an nftables rule of our own ([`crate::nftables`]) into
//! an NFQUEUE, read here ([`crate::nfqueue`]), relayed like captured replies and dropped. The
//! host's routing is not changed: the pool only needs a route (any, e.g. the default route),
//! because the kernel looks one up before the output hook; no packet ever takes it.
//!
//! What the room is for: the mode's life cycle. At start: refuse without a pool (real
//! clients' replies must never be taken), take a per-host lock, check the pool, bind the
//! queue, remove a table a killed intercept left behind, install ours, say what was done.
//! At exit (normal return, SIGINT/SIGTERM, a panic unwinding through `run`): remove the
//! table. After SIGKILL the table stays and the kernel keeps dropping the replies (no reader,
//! no bypass: fail closed) until the next start replaces it or `intercept --cleanup` removes
//! it. It must never touch a rule or route that is not ours.
//!
//! Why not a route to a dummy interface plus libpcap (the simpler "equivalent"): it changes
//! the host's routing, needs loose rp_filter for the copier's packets, sees TSO-sized
//! segments with partial checksums, and some kernels (the lab's) have no dummy driver. The
//! queue sees each reply before routing takes it anywhere, segmented and checksummed.
//!
//! The host needs: nf_tables with nft_queue (or nft_compat + xt_NFQUEUE), nfnetlink_queue,
//! root or CAP_NET_ADMIN, and rp_filter that accepts the copier's packets (source in the
//! pool) on the interface they arrive on: strict mode (1) does when the pool's route points
//! out of that same interface (usually the default route); otherwise use loose (2).

use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::time::Duration;

use anyhow::{bail, Context};
use common::wire::TcpPacket;

use crate::capture::CaptureSource;
use crate::nfqueue::{QueueError, ReplyQueue, MAX_COPY_RANGE};
use crate::nftables::{NftError, Nftables, QueueStatement, ReplyRule, TABLE};
use crate::pump::{SegmentSource, SourceStats};

/// Queue number unless `--queue-num` says otherwise (the control port's number: easy to
/// remember, unlikely to be taken).
pub const DEFAULT_QUEUE: u16 = 36524;
/// Replies the kernel holds for us at most; beyond it, it drops (never lets them out).
pub const QUEUE_MAXLEN: u32 = 8192;
/// Abstract unix socket name (per network namespace, released by the kernel when the process
/// dies, even by SIGKILL): one on-test-host intercept per host, so a second one cannot delete
/// the live one's table as "stale".
const LOCK_NAME: &[u8] = b"tcpshadow-intercept-on-test-host";

/// The flags of on-test-host mode (flattened into intercept's command line).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OnHostArgs {
    /// Run on the test server itself (no assist host, e.g. in clouds): replies from --port to
    /// --client-ip-pool are taken by an nftables rule (table ip tcpshadow_intercept) into
    /// NFQUEUE --queue-num, relayed and dropped. The rule is installed at start and removed at
    /// exit; one left by a crash is replaced at the next start (or use --cleanup). Needs root
    /// or CAP_NET_ADMIN. --interface and --direction do not apply.
    #[arg(long, env = "TCPSHADOW_ON_TEST_HOST")]
    pub on_test_host: bool,

    /// The mirrored clients' addresses (CIDR), the same as the copiers' --client-ip-pool.
    /// Required with --on-test-host: only replies to these addresses are taken, so the test
    /// server's real clients never lose a reply.
    #[arg(long, env = "TCPSHADOW_CLIENT_IP_POOL", value_parser = parse_pool)]
    pub client_ip_pool: Option<(Ipv4Addr, u8)>,

    /// NFQUEUE number for --on-test-host; no other program on this host may use it.
    #[arg(long, env = "TCPSHADOW_QUEUE_NUM", default_value_t = DEFAULT_QUEUE)]
    pub queue_num: u16,

    /// Remove what an on-test-host intercept that was killed left behind (its nftables table),
    /// then exit. Refused while an on-test-host intercept runs on this host.
    #[arg(long, env = "TCPSHADOW_CLEANUP")]
    pub cleanup: bool,
}

/// `198.19.0.0/16` -> (network, prefix). /8 at the widest: a pool is a range set aside for
/// mirrored clients, never "everything".
pub fn parse_pool(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = ops::host::parse_cidr(s)?;
    if !(8..=32).contains(&len) {
        return Err(format!("prefix length /{len} must be between /8 and /32"));
    }
    Ok((addr, len))
}

fn mask(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn in_pool(pool: (Ipv4Addr, u8), ip: Ipv4Addr) -> bool {
    u32::from(ip) & mask(pool.1) == u32::from(pool.0)
}

/// What the rest of intercept's command line says about the replies to take.
#[derive(Clone, Debug)]
pub struct OnHostCapture {
    pub ports: Vec<u16>,
    pub server: Option<Ipv4Addr>,
    /// Bytes of each reply to copy: [`MAX_COPY_RANGE`] for whole packets.
    pub copy_range: u32,
    pub recv_buffer: usize,
}

impl OnHostCapture {
    /// Copy range for a payload prefix of `prefix` bytes: room for maximal IP and TCP headers.
    pub fn prefix_range(prefix: usize) -> u32 {
        (prefix as u32).saturating_add(120).min(MAX_COPY_RANGE)
    }
}

/// The running mode: the installed table, the bound queue, the lock. Dropping it removes the
/// table first (no new replies are queued), then unbinds the queue (the kernel drops what is
/// still queued), then releases the lock.
pub struct OnHostQueue {
    /// Held for its Drop (removes the table); declared first so it drops first.
    _rules: InstalledRules,
    queue: ReplyQueue,
    _lock: UnixListener,
}

struct InstalledRules {
    nft: Nftables,
}

impl Drop for InstalledRules {
    fn drop(&mut self) {
        match self.nft.remove() {
            Ok(true) => tracing::info!("on-test-host: removed nftables table ip {TABLE}"),
            Ok(false) => tracing::warn!(
                "on-test-host: nftables table ip {TABLE} was already gone (removed by hand?)"
            ),
            Err(e) => tracing::error!(
                "on-test-host: cannot remove nftables table ip {TABLE}: {e}; remove it with \
                 `intercept --cleanup` or `nft delete table ip {TABLE}` (until then the test \
                 server's replies to the pool are dropped)"
            ),
        }
    }
}

fn take_lock() -> anyhow::Result<UnixListener> {
    let addr = UnixAddr::from_abstract_name(LOCK_NAME).context("abstract socket name")?;
    match UnixListener::bind_addr(&addr) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => bail!(
            "another intercept runs in on-test-host mode on this host (it holds the lock \
             @{}); stop it first — it removes its own rules when it stops",
            String::from_utf8_lossy(LOCK_NAME)
        ),
        Err(e) => Err(e).context("cannot take the on-test-host lock (abstract unix socket)"),
    }
}

/// IPv4 addresses of this host's interfaces.
fn local_addresses() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says how to read it.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Refuses a pool holding one of this host's own addresses (its replies to itself, e.g. a
/// health check, would be taken), and a pool without a route (the test server could not
/// answer a mirrored client at all: the route lookup comes before the output hook).
fn check_pool(pool: (Ipv4Addr, u8), locals: &[Ipv4Addr]) -> anyhow::Result<()> {
    let (net, prefix) = pool;
    if let Some(own) = locals.iter().find(|ip| in_pool(pool, **ip)) {
        bail!(
            "--client-ip-pool {net}/{prefix} contains {own}, an address of this host: choose a \
             range no real host uses (e.g. 198.19.0.0/16), the same as the copiers'"
        );
    }
    let probe = if prefix >= 31 {
        net
    } else {
        Ipv4Addr::from(u32::from(net) + 1)
    };
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("probe socket")?;
    if let Err(e) = sock.connect((probe, 9)) {
        bail!(
            "this host has no route to --client-ip-pool {net}/{prefix} ({e}), so the test server \
             cannot answer mirrored clients; add one (e.g. a default route, or `ip route add \
             {net}/{prefix} via <gateway>`); intercept takes the replies before they use it"
        );
    }
    Ok(())
}

fn nft_error(e: NftError) -> anyhow::Error {
    match e.errno() {
        Some(libc::EPERM) => {
            anyhow::anyhow!("{e}: not permitted; run intercept as root or give it CAP_NET_ADMIN")
        }
        Some(libc::ENOENT | libc::EOPNOTSUPP) => anyhow::anyhow!(
            "{e}: this kernel can queue packets neither with nft_queue nor with xt_NFQUEUE via \
             nft_compat; load one (`modprobe nft_queue`, or `modprobe nft_compat xt_NFQUEUE`)"
        ),
        Some(libc::EEXIST) => anyhow::anyhow!(
            "{e}: table ip {TABLE} appeared while installing; is another intercept starting?"
        ),
        _ => anyhow::anyhow!("{e}"),
    }
}

fn queue_error(e: QueueError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

impl OnHostArgs {
    /// The pool, or the reason there must be one.
    pub fn pool(&self) -> anyhow::Result<(Ipv4Addr, u8)> {
        self.client_ip_pool.ok_or_else(|| {
            anyhow::anyhow!(
                "--on-test-host needs --client-ip-pool CIDR (the copiers' pool): only replies \
                 to mirrored clients may be taken and dropped, and the pool is what tells them \
                 from the test server's real clients"
            )
        })
    }
}

/// Sets the mode up (see the module doc) and returns the queue to read replies from.
pub fn start(args: &OnHostArgs, capture: &OnHostCapture) -> anyhow::Result<OnHostQueue> {
    let pool = args.pool()?;
    if capture.ports.is_empty() {
        bail!("--on-test-host needs at least one --port");
    }
    let lock = take_lock()?;
    check_pool(pool, &local_addresses())?;
    // Bound before touching the table: a live reader of this queue number makes this fail,
    // so a table we find afterwards can only be a dead intercept's.
    let queue = ReplyQueue::bind(
        args.queue_num,
        capture.copy_range,
        QUEUE_MAXLEN,
        capture.recv_buffer,
    )
    .map_err(queue_error)?;
    let mut nft = Nftables::open().map_err(nft_error)?;
    if nft.remove().map_err(nft_error)? {
        tracing::warn!(
            "on-test-host: removed a stale nftables table ip {TABLE} left by an intercept that \
             did not stop cleanly (killed or crashed)"
        );
    }
    let rule = ReplyRule {
        pool,
        ports: capture.ports.clone(),
        server: capture.server,
        queue: args.queue_num,
        comment: format!(
            "tcpshadow intercept --on-test-host pid {}",
            std::process::id()
        ),
    };
    let stmt = nft.install(&rule).map_err(nft_error)?;
    let rules = InstalledRules { nft };
    tracing::info!(
        queue = args.queue_num,
        statement = %stmt,
        "on-test-host: installed nftables table ip {TABLE} (replies to {}/{} are queued to \
         intercept and dropped; removed at exit; after a crash, replaced at the next start or \
         removed by `intercept --cleanup`):\n{}",
        pool.0,
        pool.1,
        rule.describe()
    );
    if stmt == QueueStatement::XtNfqueue {
        tracing::info!(
            "on-test-host: this kernel has no nft_queue; the rule queues through nft_compat's \
             NFQUEUE target instead (same behaviour)"
        );
    }
    Ok(OnHostQueue {
        _rules: rules,
        queue,
        _lock: lock,
    })
}

/// `intercept --cleanup`: removes our table if a killed intercept left it.
pub fn cleanup() -> anyhow::Result<()> {
    let _lock = take_lock()?;
    let mut nft = Nftables::open().map_err(nft_error)?;
    if nft.remove().map_err(nft_error)? {
        tracing::info!("cleanup: removed nftables table ip {TABLE}");
    } else {
        tracing::info!("cleanup: nothing to remove (no nftables table ip {TABLE})");
    }
    Ok(())
}

impl OnHostQueue {
    pub fn queue(&self) -> &ReplyQueue {
        &self.queue
    }
}

impl Drop for OnHostQueue {
    fn drop(&mut self) {
        let (bad, truncated, overruns, verdict_errors) = self.queue.anomalies();
        if bad + truncated + overruns + verdict_errors > 0 {
            tracing::warn!(
                bad_messages = bad,
                truncated,
                socket_overruns = overruns,
                verdict_errors,
                "on-test-host: queue anomalies (replies lost to intercept are retransmitted by \
                 the test server; a larger --buffer-mib helps against overruns)"
            );
        }
        // Fields drop next, in order: rules (table removed), queue, lock.
    }
}

impl SegmentSource for OnHostQueue {
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool> {
        self.queue.poll_segment(f)
    }
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.queue.wait(timeout)
    }
    fn stats(&mut self) -> SourceStats {
        self.queue.stats()
    }
}

/// Where intercept's replies come from: the wire (assist host) or the queue (on the test host).
pub enum ReplyCapture {
    Wire(CaptureSource),
    Queue(OnHostQueue),
}

impl SegmentSource for ReplyCapture {
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool> {
        match self {
            ReplyCapture::Wire(s) => s.poll_segment(f),
            ReplyCapture::Queue(s) => s.poll_segment(f),
        }
    }
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        match self {
            ReplyCapture::Wire(s) => s.wait(timeout),
            ReplyCapture::Queue(s) => s.wait(timeout),
        }
    }
    fn stats(&mut self) -> SourceStats {
        match self {
            ReplyCapture::Wire(s) => s.stats(),
            ReplyCapture::Queue(s) => s.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_parsed_and_bounded() {
        assert_eq!(
            parse_pool("198.19.3.7/16").unwrap(),
            (Ipv4Addr::new(198, 19, 0, 0), 16)
        );
        assert_eq!(
            parse_pool("198.19.3.7/32").unwrap(),
            (Ipv4Addr::new(198, 19, 3, 7), 32)
        );
        assert!(parse_pool("0.0.0.0/0").is_err());
        assert!(parse_pool("10.0.0.0/7").is_err());
        assert!(parse_pool("198.19.0.0").is_err());
        assert!(parse_pool("198.19.0.0/33").is_err());
        assert!(parse_pool("x/24").is_err());
    }

    #[test]
    fn membership() {
        let pool = (Ipv4Addr::new(198, 19, 5, 0), 24);
        assert!(in_pool(pool, Ipv4Addr::new(198, 19, 5, 200)));
        assert!(!in_pool(pool, Ipv4Addr::new(198, 19, 6, 1)));
        let one = (Ipv4Addr::new(198, 19, 5, 7), 32);
        assert!(in_pool(one, Ipv4Addr::new(198, 19, 5, 7)));
        assert!(!in_pool(one, Ipv4Addr::new(198, 19, 5, 8)));
    }

    #[test]
    fn a_pool_holding_an_own_address_is_refused() {
        let pool = (Ipv4Addr::new(198, 18, 5, 0), 24);
        let err = check_pool(pool, &[Ipv4Addr::new(198, 18, 5, 3)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("198.18.5.3") && err.contains("address of this host"),
            "{err}"
        );
    }

    #[test]
    fn without_a_pool_the_mode_refuses_and_says_why() {
        let args = OnHostArgs {
            on_test_host: true,
            ..OnHostArgs::default()
        };
        let err = args.pool().unwrap_err().to_string();
        assert!(
            err.contains("--client-ip-pool") && err.contains("real clients"),
            "{err}"
        );
    }

    #[test]
    fn prefix_copy_ranges_cover_headers() {
        assert_eq!(OnHostCapture::prefix_range(64), 184);
        assert_eq!(OnHostCapture::prefix_range(usize::MAX), MAX_COPY_RANGE);
    }
}
