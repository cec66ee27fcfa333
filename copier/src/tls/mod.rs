//! The plaintext of production's TLS sessions (issue 21), read where the production server's
//! own TLS library hands it over: eBPF uprobes on `SSL_read` / `SSL_write` (and `SSL_set_fd`)
//! of the process listening on the mirrored port, delivered through a BPF ring buffer.
//!
//! What this room is for: finding that process and its TLS library ([`procfs`]), loading and
//! attaching the probe ([`bpf`]), and turning its ring records into [`TlsChunk`]s: plaintext of
//! one direction of one stream, at a known offset, with the connection's 4-tuple as production
//! sees it (told by the probe inside the kernel, from the server's fd table, when it learns the
//! stream's fd; from /proc/PID/fd and /proc/PID/net/tcp{,6} only when a record says the kernel
//! could not tell). The engine side (what a chunk becomes) is not here.
//!
//! What it must never do: change anything in the production process (the probe only reads), pass
//! on a chunk whose connection it could not resolve (counted as unresolved instead), or trust a
//! ring record (decoded by `common::tls_event`, every inconsistency refused and counted).
//!
//! Streams and offsets: a stream is one TLS session of one `SSL*`, from its `SSL_set_fd`
//! (or, for a session that began before the probe, from the first call seen: `joined_midway`)
//! to the next `SSL_set_fd` of the same object, which starts a new generation. Each direction's
//! offsets count every byte the server's calls moved, emitted or not: a chunk whose offset is
//! past the previous chunk's end follows a loss of exactly that many bytes (ring full, or a
//! call over 16 MiB), also counted in [`TlsProbeStats`].
//!
//! Resolution and fd reuse: the probe tells each stream's socket (family, and for TCP both
//! addresses) in the kernel at the moment it learns the fd, and every later record of the
//! stream carries it, so a stream is resolved however short its life. Only a record that says
//! "not told" (the kernel walk failed, or a joined stream whose fd is not learnt yet) falls
//! back to /proc, when `drain` first sees the fd, which needs the capabilities of
//! [`RESOLVE_CAPS`] ([`TlsProbe::needs_proc`]). For that fallback the probe also reports each
//! close of a stream's fd; a stream whose fd is closed further on in the ring than the record
//! being resolved is not looked up in /proc (the number may already name the next
//! connection), so such a stream is counted as unresolved, never given another connection's
//! 4-tuple. Drain as soon as [`TlsProbe::poll_fd`] is readable.

mod procfs;

#[cfg(not(tcpshadow_no_bpf))]
mod bpf;

#[cfg(tcpshadow_no_bpf)]
#[allow(dead_code)]
mod bpf {
    //! Built without clang: nothing can be loaded, so no `Loaded` value can exist.
    use std::os::fd::BorrowedFd;
    use std::path::Path;

    #[derive(Clone, Copy, Debug, Default)]
    pub struct Losses {
        pub ring_full_records: u64,
        pub ring_full_bytes: u64,
        pub truncated_bytes: u64,
        pub foreign_tgid: u64,
    }
    #[derive(Default)]
    pub struct Staging {
        pub bytes: Vec<u8>,
        pub ends: Vec<usize>,
    }
    #[derive(Debug)]
    pub enum Loaded {}
    pub enum LoadError {
        Permission(String),
        NoSymbol(String),
        Other(String),
    }
    impl Loaded {
        pub fn attach(
            _: u32,
            _: u32,
            _: &Path,
            _: Option<&Path>,
            _: u32,
            _: &mut dyn FnMut() -> bool,
        ) -> Result<Loaded, LoadError> {
            Err(LoadError::Other("built without the probe".into()))
        }
        pub fn learning_fds(&self) -> bool {
            match *self {}
        }
        pub fn stop_learning_fds(&mut self) {
            match *self {}
        }
        pub fn poll_fd(&self) -> BorrowedFd<'_> {
            match *self {}
        }
        pub fn take(&mut self, _: usize, _: &mut Staging) -> usize {
            match *self {}
        }
        pub fn losses(&self) -> Losses {
            match *self {}
        }
        pub fn tells_sockets(&self) -> bool {
            match *self {}
        }
    }
}

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

pub use common::tls_event::PlainDir;
use common::tls_event::{self, EventKind, SockInfo};

/// The ring buffer's size: 16 MiB, a second of plaintext at 16 MB/s, so a consumer that drains
/// every few milliseconds never lets it fill.
pub const RING_BYTES: u32 = 16 << 20;
/// Records taken from the ring per batch; `drain` takes batches until the ring is empty or
/// [`DRAIN_MAX_RECORDS`] have passed, so one call cannot run for ever behind a busy server.
const BATCH: usize = 1024;
const DRAIN_MAX_RECORDS: usize = 64 * BATCH;
/// Streams remembered for their 4-tuple (the probe's own map holds as many).
const MAX_STREAMS: usize = 65536;

/// One TLS stream: a session of one `SSL*` of the production process, from its start to the
/// next start of the same object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamId {
    pub pid: u32,
    pub ssl: u64,
    pub generation: u64,
}

/// Plaintext of one direction of one stream.
#[derive(Clone, Copy, Debug)]
pub struct TlsChunk<'a> {
    /// The client's address as production sees it.
    pub client: SocketAddr,
    /// Production's address:port of the connection (its listening port).
    pub server: SocketAddr,
    pub stream: StreamId,
    pub dir: PlainDir,
    /// Bytes of this direction of this stream before `data` (emitted or lost).
    pub offset: u64,
    pub data: &'a [u8],
    /// The stream began before the probe (no `SSL_set_fd` seen): offset 0 is wherever the
    /// probe first saw it, not the session's first byte.
    pub joined_midway: bool,
    /// When the server's call returned, CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub monotonic_ns: u64,
}

/// What the probe is attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    pub pid: u32,
    /// The process's name (/proc/PID/comm), e.g. `mariadbd`.
    pub comm: String,
    /// The file the uprobes are on, as we reach it (/proc/PID/root/...).
    pub library: PathBuf,
    /// The same file as the server names it (a libssl, or the server binary itself when the
    /// TLS library is linked in).
    pub library_in_server: String,
    /// The server's listening port (our argument).
    pub port: u16,
    /// The server's libc (as it names it), whose close() tells the probe a stream's fd is
    /// going; None when it maps none (then the syscall tracepoint watches close()).
    pub libc: Option<String>,
}

impl fmt::Display for ProbeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} ({}) listening on port {}, TLS library {}",
            self.pid, self.comm, self.port, self.library_in_server
        )
    }
}

/// Counters of the probe since it attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsProbeStats {
    /// Chunks handed to `drain`'s callback, and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Records the probe could not put in the ring (ring full), and their plaintext bytes.
    pub lost_records: u64,
    pub lost_bytes: u64,
    /// Bytes of calls over the probe's per-call cap (16 MiB), never emitted.
    pub truncated_bytes: u64,
    /// Chunks (and bytes) whose connection could not be resolved to a 4-tuple: not passed on.
    pub unresolved_chunks: u64,
    pub unresolved_bytes: u64,
    /// Chunks (and bytes) of sessions that are not TCP (clients on the server's Unix socket):
    /// the probe sees them, a packet-level mirror has no connection to play them on.
    pub not_tcp_chunks: u64,
    pub not_tcp_bytes: u64,
    /// Closes of a stream's fd the probe reported.
    pub fds_closed: u64,
    /// Streams whose socket the probe told in the kernel, and streams resolved from /proc
    /// instead (the record said the kernel could not tell).
    pub streams_told_by_kernel: u64,
    pub streams_resolved_from_proc: u64,
    /// Streams started (`SSL_set_fd` seen), and streams joined midway (begun before the probe).
    pub streams_started: u64,
    pub streams_joined_midway: u64,
    /// Records that did not decode, or named another process: a bug, never expected.
    pub bad_records: u64,
    /// Probe calls from another process than the target (the copier runs in a pid namespace
    /// that is not the kernel's initial one: then every call is filtered out).
    pub foreign_calls: u64,
}

/// Why the probe is not attached: one line a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAttached {
    pub kind: NotAttachedKind,
    message: String,
}

/// The kind of reason, for callers that act on it (the doctor's level, a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAttachedKind {
    /// This copier was built without the BPF program (no clang at build time).
    NotBuilt,
    /// Missing capabilities (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE) or kernel support.
    Privilege,
    /// No process listens on the port, or it could not be identified.
    NoServer,
    /// The server maps no TLS library we know (no libssl, no SSL_read in its binary).
    NoTlsLibrary,
    /// Anything else the kernel or libbpf refused.
    Failed,
}

impl NotAttached {
    fn new(kind: NotAttachedKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for NotAttached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NotAttached {}

/// Capability numbers (linux/capability.h).
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// What attaching needs (checked by [`TlsProbe::attach`] before it tries, named in its error):
/// CAP_BPF (load the program, create its links), CAP_PERFMON (tracing programs: uprobes, the
/// raw tracepoint), and the two of [`RESOLVE_CAPS`] (discovery: which process holds the
/// listening socket, its /proc/PID/maps). CAP_SYS_ADMIN would stand for the first
/// two, and is not needed: the uprobes are uprobe_multi links, not perf events (a pid-scoped
/// uprobe perf event is refused under CAP_PERFMON on kernel 6.18).
pub const ATTACH_CAPS: &[u32] = &[CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH];

/// What an attached probe needs for as long as it runs only when it resolves fds from /proc
/// ([`TlsProbe::needs_proc`]), for a server of another user: CAP_DAC_READ_SEARCH to enter its
/// /proc/PID/fd, CAP_SYS_PTRACE to read the links there. Reading the ring and the loss map
/// needs none.
pub const RESOLVE_CAPS: &[u32] = &[CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH];

/// The TLS plaintext probe, attached to production's server.
///
/// Send: it may be created on one thread and drained on another; one thread at a time drains
/// it (`&mut self`).
pub struct TlsProbe {
    loaded: bpf::Loaded,
    target: ProbeTarget,
    resolver: Resolver,
    /// The target's start time (/proc/PID/stat), to tell it from a later process of its pid.
    started: u64,
    staging: bpf::Staging,
    /// fd -> index of its last close in the batch being drained.
    closes: HashMap<u32, usize>,
    stats: TlsProbeStats,
}

impl fmt::Debug for TlsProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsProbe")
            .field("target", &self.target)
            .field("stats", &self.stats)
            .finish()
    }
}

impl TlsProbe {
    /// Finds the process listening on `port` in our network namespace, its TLS library, and
    /// attaches. Err: one line a user can act on (what is missing and the fix).
    pub fn attach(port: u16) -> Result<TlsProbe, NotAttached> {
        Self::attach_with_ring(port, RING_BYTES)
    }

    /// [`TlsProbe::attach`] with a ring of `ring_bytes` (a power of two, at least the page size).
    pub fn attach_with_ring(port: u16, ring_bytes: u32) -> Result<TlsProbe, NotAttached> {
        if cfg!(tcpshadow_no_bpf) {
            return Err(NotAttached::new(
                NotAttachedKind::NotBuilt,
                format!(
                    "TLS sessions cannot be mirrored: {}",
                    option_env!("TCPSHADOW_NO_BPF_REASON").unwrap_or("built without the probe")
                ),
            ));
        }
        check_capabilities()?;
        let target = discover(port)?;
        let started = procfs::start_time(target.pid).unwrap_or(0);
        let libc = target
            .libc
            .as_deref()
            .map(|l| procfs::in_root(target.pid, l));
        let (pid, port) = (target.pid, target.port);
        let loaded = bpf::Loaded::attach(
            pid,
            pid,
            &target.library,
            libc.as_deref(),
            ring_bytes,
            &mut || procfs::has_connections_on(pid, port),
        )
        .map_err(|e| load_error(&target, e))?;
        Ok(TlsProbe {
            loaded,
            resolver: Resolver::new(target.pid),
            started,
            target,
            staging: bpf::Staging::default(),
            closes: HashMap::new(),
            stats: TlsProbeStats::default(),
        })
    }

    /// Whether the probe relies on the server's /proc to tell its streams' connections, and so
    /// needs [`RESOLVE_CAPS`] for as long as it runs. False when the loaded program tells each
    /// stream's socket in the kernel (this build's does): then /proc is only a fallback for a
    /// record whose socket the kernel walk could not tell, tried with whatever capabilities
    /// are left (a copier that dropped them counts such a record's plaintext as unresolved).
    pub fn needs_proc(&self) -> bool {
        !self.loaded.tells_sockets()
    }

    /// What the probe is attached to (for the log line and the doctor).
    pub fn target(&self) -> &ProbeTarget {
        &self.target
    }

    /// Whether the probe watches the server's syscalls to learn the fd of streams that began
    /// before it (`joined_midway`). It does from `attach` when the port had connections then
    /// (or always, when the server's libc could not be probed for close()); it costs every
    /// process of the host the syscall slow path (about 9% of production's queries per second
    /// in the lab, sysbench over TLS at 8 threads).
    pub fn learning_fds(&self) -> bool {
        self.loaded.learning_fds()
    }

    /// Stops learning joined streams' fds (see [`TlsProbe::learning_fds`]): once every
    /// connection open at attach time has been seen or has closed. A stream that joins
    /// afterwards has no fd, so its chunks are counted as unresolved.
    pub fn stop_learning_fds(&mut self) {
        self.loaded.stop_learning_fds();
    }

    /// Whether the process the probe is attached to still runs. A restarted server is a new
    /// process that the probe does not see: drop this probe and attach again.
    pub fn target_alive(&self) -> bool {
        procfs::start_time(self.target.pid).is_some_and(|t| t == self.started)
    }

    /// Readable (epoll) when records wait in the ring.
    pub fn poll_fd(&self) -> BorrowedFd<'_> {
        self.loaded.poll_fd()
    }

    /// Hands every waiting chunk to `f`, in ring order; returns how many. Stops after 65,536
    /// records even if more keep coming (the poll fd stays readable then).
    pub fn drain(&mut self, f: &mut dyn FnMut(TlsChunk<'_>)) -> usize {
        self.resolver.next_round();
        let mut handed = 0;
        let mut seen = 0;
        while seen < DRAIN_MAX_RECORDS {
            let mut staging = std::mem::take(&mut self.staging);
            let n = self.loaded.take(BATCH, &mut staging);
            seen += n;
            // Where each fd is last closed in this batch: an fd closed after a record was
            // written may already be another connection's when /proc is read, so a stream
            // not resolved before its fd's close is never resolved from /proc.
            self.closes.clear();
            for (i, r) in records(&staging).enumerate() {
                if let Ok(e) = tls_event::decode(r) {
                    if let (EventKind::FdClosed, Some(fd)) = (e.kind, e.fd) {
                        self.closes.insert(fd, i);
                    }
                }
            }
            for (i, record) in records(&staging).enumerate() {
                handed += self.on_record(i, record, f);
            }
            self.staging = staging;
            if n < BATCH {
                break;
            }
        }
        handed
    }

    fn on_record(&mut self, index: usize, record: &[u8], f: &mut dyn FnMut(TlsChunk<'_>)) -> usize {
        let s = &mut self.stats;
        let Ok(e) = tls_event::decode(record) else {
            s.bad_records += 1;
            return 0;
        };
        if e.pid != self.target.pid {
            s.bad_records += 1;
            return 0;
        }
        let closed_later =
            e.fd.and_then(|fd| self.closes.get(&fd))
                .is_some_and(|&at| at > index);
        match e.kind {
            EventKind::FdClosed => {
                s.fds_closed += 1;
                self.resolver.closed(e.ssl, e.generation);
                0
            }
            EventKind::StreamStart => {
                if e.joined_midway {
                    s.streams_joined_midway += 1;
                } else {
                    s.streams_started += 1;
                }
                // Resolve now: the connection is young and its fd certainly still its own.
                self.resolver
                    .lookup(e.ssl, e.generation, e.fd, e.sock, closed_later);
                0
            }
            EventKind::Data => {
                match self
                    .resolver
                    .lookup(e.ssl, e.generation, e.fd, e.sock, closed_later)
                {
                    Resolved::Tcp(server, client) => {
                        s.chunks += 1;
                        s.bytes += e.data.len() as u64;
                        f(TlsChunk {
                            client,
                            server,
                            stream: StreamId {
                                pid: e.pid,
                                ssl: e.ssl,
                                generation: e.generation,
                            },
                            dir: e.dir,
                            offset: e.offset,
                            data: e.data,
                            joined_midway: e.joined_midway,
                            monotonic_ns: e.time_ns,
                        });
                        1
                    }
                    Resolved::NotTcp => {
                        s.not_tcp_chunks += 1;
                        s.not_tcp_bytes += e.data.len() as u64;
                        0
                    }
                    Resolved::Unknown => {
                        s.unresolved_chunks += 1;
                        s.unresolved_bytes += e.data.len() as u64;
                        0
                    }
                }
            }
        }
    }

    /// Counters since the probe attached (the kernel side's losses included).
    pub fn stats(&self) -> TlsProbeStats {
        let l = self.loaded.losses();
        TlsProbeStats {
            lost_records: l.ring_full_records,
            lost_bytes: l.ring_full_bytes,
            truncated_bytes: l.truncated_bytes,
            foreign_calls: l.foreign_tgid,
            streams_told_by_kernel: self.resolver.told_by_kernel,
            streams_resolved_from_proc: self.resolver.from_proc,
            ..self.stats
        }
    }
}

/// The records of a batch, in ring order.
fn records(st: &bpf::Staging) -> impl Iterator<Item = &[u8]> {
    let starts = std::iter::once(0).chain(st.ends.iter().copied());
    starts
        .zip(st.ends.iter().copied())
        .map(|(a, b)| st.bytes.get(a..b).unwrap_or_default())
}

/// The capabilities loading and attaching need, checked first so that their absence is named
/// rather than left to an errno from deep inside libbpf.
fn check_capabilities() -> Result<(), NotAttached> {
    let Some(caps) = ops::host::effective_caps() else {
        return Ok(());
    };
    let has = |c: u32| ops::host::has_cap(caps, c);
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !(has(CAP_BPF) || admin) {
        missing.push("CAP_BPF");
    }
    if !(has(CAP_PERFMON) || admin) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE");
    }
    if !has(CAP_DAC_READ_SEARCH) {
        missing.push("CAP_DAC_READ_SEARCH");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(NotAttached::new(
        NotAttachedKind::Privilege,
        format!(
            "TLS sessions cannot be mirrored: the copier lacks {} (eBPF uprobes on the server's \
             TLS library need CAP_BPF and CAP_PERFMON; reading the server's /proc/PID/fd and \
             maps needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH); fix: run as root, or add them to AmbientCapabilities= \
             (deploy/systemd/tcpshadow-copier.service)",
            missing.join(", ")
        ),
    ))
}

fn load_error(target: &ProbeTarget, e: bpf::LoadError) -> NotAttached {
    match e {
        bpf::LoadError::Permission(m) => NotAttached::new(
            NotAttachedKind::Privilege,
            format!(
                "TLS sessions cannot be mirrored: the kernel refused the probe ({m}); fix: run \
                 as root or with CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, \
                 and check kernel.unprivileged_bpf_disabled, kernel.perf_event_paranoid and a \
                 lockdown that forbids BPF"
            ),
        ),
        bpf::LoadError::NoSymbol(m) => NotAttached::new(
            NotAttachedKind::NoTlsLibrary,
            format!(
                "TLS sessions cannot be mirrored: {} has no SSL_set_fd/SSL_read/SSL_write to \
                 probe ({m}); only OpenSSL-compatible libraries are supported",
                target.library_in_server
            ),
        ),
        bpf::LoadError::Other(m) => NotAttached::new(
            NotAttachedKind::Failed,
            format!(
                "TLS sessions cannot be mirrored: {m} (target {target}); the probe needs a \
                 kernel of 6.6 or later (uprobe_multi links, BPF ring buffers, bpf_loop)"
            ),
        ),
    }
}

/// Finds the process listening on TCP `port` in our network namespace and the file whose
/// `SSL_read` it calls.
pub fn discover(port: u16) -> Result<ProbeTarget, NotAttached> {
    let fail =
        |kind, m: String| NotAttached::new(kind, format!("TLS sessions cannot be mirrored: {m}"));
    let lines = procfs::read_tcp_tables(std::path::Path::new("/proc/net")).map_err(|e| {
        fail(
            NotAttachedKind::NoServer,
            format!("cannot read /proc/net/tcp: {e}"),
        )
    })?;
    let listeners: Vec<u64> = lines
        .iter()
        .filter(|l| l.state == procfs::TCP_LISTEN && l.local.port() == port && l.inode != 0)
        .map(|l| l.inode)
        .collect();
    if listeners.is_empty() {
        return Err(fail(
            NotAttachedKind::NoServer,
            format!(
                "no process listens on TCP port {port} in the copier's network namespace (is \
                 the server running, and does the copier run in its network namespace?)"
            ),
        ));
    }
    let mut search = procfs::OwnerSearch::default();
    let pids = procfs::processes_holding(&listeners, &mut search);
    let Some(&pid) = pids.first() else {
        let why = match &search.unreadable_example {
            Some((p, e)) => format!(
                "; the fds of {} processes could not be read (pid {p}: {e}): needs \
                 CAP_SYS_PTRACE, or root",
                search.unreadable
            ),
            None => String::new(),
        };
        return Err(fail(
            NotAttachedKind::NoServer,
            format!("found no process holding the socket listening on port {port}{why}"),
        ));
    };
    let comm = procfs::comm(pid);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        fail(
            NotAttachedKind::Privilege,
            format!("cannot read /proc/{pid}/maps of {comm} ({e}): needs CAP_SYS_PTRACE, or root"),
        )
    })?;
    // A shared libssl, else the server binary itself (TLS linked in statically): libbpf
    // then finds SSL_read among its symbols, or the attach says it is not there.
    let libc = procfs::library_in_maps(&maps, "libc.so");
    let in_server = match procfs::library_in_maps(&maps, "libssl.so") {
        Some(lib) => lib,
        None => std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| p.to_str().map(str::to_string))
            .ok_or_else(|| {
                fail(
                    NotAttachedKind::NoTlsLibrary,
                    format!("pid {pid} ({comm}) maps no libssl.so and its binary cannot be read"),
                )
            })?,
    };
    Ok(ProbeTarget {
        pid,
        library: procfs::in_root(pid, &in_server),
        library_in_server: in_server,
        comm,
        port,
        libc,
    })
}

/// What a stream's fd is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resolved {
    /// A TCP connection: (production's address, the client's).
    Tcp(SocketAddr, SocketAddr),
    /// A socket that is not TCP (a client on the server's Unix socket), or no socket at all:
    /// there is no 4-tuple to give, and none will come.
    NotTcp,
    /// Not known (yet): no fd, or the fd is gone or no longer in the tables.
    Unknown,
}

type TcpTable = HashMap<u64, (SocketAddr, SocketAddr)>;

/// What a record's kernel-told socket means here; None when the kernel could not tell.
/// An IPv4-mapped IPv6 address (a dual-stack server's IPv4 client) becomes IPv4, as
/// /proc/net/tcp6 is read in [`procfs::parse_addr`]: the engine speaks IPv4.
fn from_kernel(sock: SockInfo) -> Option<Resolved> {
    let unmap = |a: SocketAddr| match a.ip() {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), a.port()),
            None => a,
        },
        std::net::IpAddr::V4(_) => a,
    };
    match sock {
        SockInfo::Unknown => None,
        SockInfo::Tcp { local, remote } => Some(Resolved::Tcp(unmap(local), unmap(remote))),
        SockInfo::Unix | SockInfo::Other { .. } => Some(Resolved::NotTcp),
    }
}

/// fd -> 4-tuple, per stream: resolved when a stream starts (or its fd becomes known) and
/// kept until the same `SSL*` starts again.
struct Resolver {
    pid: u32,
    streams: HashMap<u64, Stream>,
    /// The server's TCP sockets by inode, read at most twice per drain round.
    table: Option<TcpTable>,
    reloaded: bool,
    /// The server's Unix sockets' inodes, read at most once per round.
    unix: Option<HashSet<u64>>,
    round: u64,
    /// Streams resolved from what the kernel told, and from /proc.
    told_by_kernel: u64,
    from_proc: u64,
}

struct Stream {
    generation: u64,
    fd: Option<u32>,
    resolved: Resolved,
    /// The round of the last failed attempt: one try per drain, not one per chunk.
    failed_round: Option<u64>,
}

impl Resolver {
    fn new(pid: u32) -> Self {
        Self {
            pid,
            streams: HashMap::new(),
            table: None,
            reloaded: false,
            unix: None,
            round: 0,
            told_by_kernel: 0,
            from_proc: 0,
        }
    }

    fn next_round(&mut self) {
        self.round += 1;
        self.table = None;
        self.reloaded = false;
        self.unix = None;
    }

    /// The stream's fd has been closed: what it has not resolved yet it never will, and the
    /// entry is not needed after its last chunk, which came before the close.
    fn closed(&mut self, ssl: u64, generation: u64) {
        if self
            .streams
            .get(&ssl)
            .is_some_and(|s| s.generation == generation)
        {
            self.streams.remove(&ssl);
        }
    }

    /// `sock`: what the probe told in the kernel (taken as it is, whenever it is known).
    /// `closed_later`: the fd is closed further on in the ring, so /proc may already show
    /// another connection under its number.
    fn lookup(
        &mut self,
        ssl: u64,
        generation: u64,
        fd: Option<u32>,
        sock: SockInfo,
        closed_later: bool,
    ) -> Resolved {
        if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&ssl) {
            // Forget them all: each is resolved again on its next chunk.
            self.streams.clear();
        }
        let fresh = Stream {
            generation,
            fd,
            resolved: Resolved::Unknown,
            failed_round: None,
        };
        let s = self.streams.entry(ssl).or_insert(fresh);
        if s.generation != generation {
            *s = Stream {
                generation,
                fd,
                resolved: Resolved::Unknown,
                failed_round: None,
            };
        }
        if fd.is_some() && fd != s.fd {
            // A joined stream whose fd the probe has just learnt.
            s.fd = fd;
            s.resolved = Resolved::Unknown;
            s.failed_round = None;
        }
        if s.resolved != Resolved::Unknown {
            return s.resolved;
        }
        if let Some(told) = from_kernel(sock) {
            // Told when the fd was learnt, inside the stream's own call: right whatever has
            // happened to the fd number since.
            s.resolved = told;
            self.told_by_kernel += 1;
            return told;
        }
        let Some(fd) = s.fd else {
            return Resolved::Unknown;
        };
        if s.failed_round == Some(self.round) || closed_later {
            return Resolved::Unknown;
        }
        let round = self.round;
        let found = self.resolve_fd(fd);
        if let Some(s) = self.streams.get_mut(&ssl) {
            s.resolved = found;
            if found == Resolved::Unknown {
                s.failed_round = Some(round);
            }
        }
        if found != Resolved::Unknown {
            self.from_proc += 1;
        }
        found
    }

    fn resolve_fd(&mut self, fd: u32) -> Resolved {
        let pid = self.pid;
        let inode = match procfs::fd_socket_inode(pid, fd) {
            Ok(Some(inode)) => inode,
            Ok(None) => return Resolved::NotTcp,
            Err(_) => return Resolved::Unknown,
        };
        if let Some(&(server, client)) =
            Self::table(&mut self.table, pid).and_then(|t| t.get(&inode))
        {
            return Resolved::Tcp(server, client);
        }
        if !self.reloaded {
            // A connection younger than this round's table.
            self.reloaded = true;
            self.table = None;
            if let Some(&(server, client)) =
                Self::table(&mut self.table, pid).and_then(|t| t.get(&inode))
            {
                return Resolved::Tcp(server, client);
            }
        }
        if self.unix.is_none() {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
            self.unix = Some(procfs::parse_unix_inodes(&text));
        }
        if self.unix.as_ref().is_some_and(|u| u.contains(&inode)) {
            Resolved::NotTcp
        } else {
            Resolved::Unknown
        }
    }

    fn table(table: &mut Option<TcpTable>, pid: u32) -> Option<&TcpTable> {
        if table.is_none() {
            let net = PathBuf::from(format!("/proc/{pid}/net"));
            let lines = procfs::read_tcp_tables(&net).ok()?;
            *table = Some(procfs::connections_by_inode(&lines));
        }
        table.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn the_probe_can_move_to_another_thread() {
        assert_send::<TlsProbe>();
    }

    #[test]
    fn a_port_nobody_listens_on_is_named() {
        // Port 1 (tcpmux) is not served on a build or CI host.
        let e = discover(1).unwrap_err();
        assert_eq!(e.kind, NotAttachedKind::NoServer, "{e}");
        assert!(e.to_string().contains("port 1"), "{e}");
    }

    #[test]
    fn fds_that_are_not_tcp_connections() {
        let mut r = Resolver::new(std::process::id());
        r.next_round();
        // No fd known: nothing to resolve yet.
        assert_eq!(
            r.lookup(1, 1, None, SockInfo::Unknown, false),
            Resolved::Unknown
        );
        // An fd that is no socket, or no fd at all.
        let file = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(
            r.lookup(
                2,
                1,
                Some(file.as_raw_fd() as u32),
                SockInfo::Unknown,
                false
            ),
            Resolved::NotTcp
        );
        assert_eq!(
            r.lookup(3, 1, Some(999_999), SockInfo::Unknown, false),
            Resolved::Unknown
        );
        // A new generation of the same SSL object starts over.
        assert_eq!(
            r.lookup(3, 2, None, SockInfo::Unknown, false),
            Resolved::Unknown
        );
        assert_eq!(r.streams[&3].generation, 2);
        assert_eq!(r.streams[&3].fd, None);
        // A Unix socket's session is not TCP.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            r.lookup(4, 1, Some(a.as_raw_fd() as u32), SockInfo::Unknown, false),
            Resolved::NotTcp
        );
    }

    #[test]
    fn what_the_kernel_told_wins_over_proc() {
        let mut r = Resolver::new(std::process::id());
        r.next_round();
        let local: SocketAddr = "198.18.0.1:3306".parse().unwrap();
        let remote: SocketAddr = "[::ffff:198.18.1.2]:40001".parse().unwrap();
        let told = SockInfo::Tcp { local, remote };
        // Even with the fd closed later in the ring, and with an fd /proc knows nothing of.
        assert_eq!(
            r.lookup(1, 1, Some(999_999), told, true),
            Resolved::Tcp(local, "198.18.1.2:40001".parse().unwrap())
        );
        assert_eq!(
            r.lookup(2, 1, Some(999_999), SockInfo::Unix, true),
            Resolved::NotTcp
        );
        assert_eq!(
            r.lookup(3, 1, None, SockInfo::Other { family: 16 }, false),
            Resolved::NotTcp
        );
        // A joined stream's start says nothing; its later chunk carries the socket.
        assert_eq!(
            r.lookup(4, 1, None, SockInfo::Unknown, false),
            Resolved::Unknown
        );
        assert_eq!(
            r.lookup(4, 1, Some(999_999), told, false),
            Resolved::Tcp(local, "198.18.1.2:40001".parse().unwrap())
        );
        assert_eq!((r.told_by_kernel, r.from_proc), (4, 0));
    }

    #[test]
    fn our_own_connection_resolves() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, peer) = l.accept().unwrap();
        use std::os::fd::AsRawFd;
        let mut r = Resolver::new(std::process::id());
        r.next_round();
        let fd = server.as_raw_fd() as u32;
        // Closed further on in the ring: /proc is not asked (the number may be reused).
        assert_eq!(
            r.lookup(7, 1, Some(fd), SockInfo::Unknown, true),
            Resolved::Unknown
        );
        let Resolved::Tcp(prod, client) = r.lookup(8, 1, Some(fd), SockInfo::Unknown, false) else {
            panic!("not resolved");
        };
        // Resolved once, kept; gone at its close.
        assert_eq!(
            r.lookup(8, 1, Some(fd), SockInfo::Unknown, true),
            Resolved::Tcp(prod, client)
        );
        r.closed(8, 1);
        assert!(!r.streams.contains_key(&8));
        assert_eq!(prod, l.local_addr().unwrap());
        assert_eq!(client, c.local_addr().unwrap());
        assert_eq!(client, peer);
    }
}
