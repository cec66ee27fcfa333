//! Loading and attaching the embedded BPF program (`copier/bpf/tls_plain.bpf.c`, built by
//! `copier/build.rs`) with libbpf, and reading its ring buffer and loss counters.
//!
//! What this room is for: every call into libbpf. What it must never do: attach to anything
//! but the one target process, or interpret a record (that is `common::tls_event`'s job; here
//! records are only copied out of the ring).

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use libbpf_rs::{
    Link, MapCore, MapFlags, MapHandle, ObjectBuilder, PrintLevel, RingBuffer, RingBufferBuilder,
};

/// The program, compiled by build.rs.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tls_plain.bpf.o"));

/// `TLS_CONFIG_CLOSE_IN_SYS_ENTER` of the C file.
const CONFIG_CLOSE_IN_SYS_ENTER: u32 = 1;

/// Sum over CPUs of the program's `struct losses` (4 x u64, asserted in the C file).
#[derive(Clone, Copy, Debug, Default)]
pub struct Losses {
    pub ring_full_records: u64,
    pub ring_full_bytes: u64,
    pub truncated_bytes: u64,
    pub foreign_tgid: u64,
}

/// Records copied out of the ring by libbpf's callback, until `drain` decodes them.
#[derive(Default)]
pub struct Staging {
    pub bytes: Vec<u8>,
    /// End of each record in `bytes`.
    pub ends: Vec<usize>,
}

/// The loaded program, its links and its ring. Field order is drop order: the ring and the
/// links go before the object they came from.
pub struct Loaded {
    ring: RingBuffer<'static>,
    staging: Arc<Mutex<Staging>>,
    _links: Vec<Link>,
    /// The sys_enter raw tracepoint, while it is attached (see `attach`).
    sys: Option<Link>,
    /// No libc close() is probed: sys_enter watches close() and must stay.
    close_in_sys: bool,
    loss: MapHandle,
    _object: libbpf_rs::Object,
}

/// Why loading or attaching failed, sorted for the user's fix.
pub enum LoadError {
    /// The kernel refused for lack of privilege (EPERM/EACCES).
    Permission(String),
    /// The TLS library has no such function.
    NoSymbol(String),
    Other(String),
}

fn log_libbpf(level: PrintLevel, msg: String) {
    let msg = msg.trim_end();
    match level {
        PrintLevel::Warn => tracing::debug!(target: "tcpshadow::tls::libbpf", "{msg}"),
        _ => tracing::trace!(target: "tcpshadow::tls::libbpf", "{msg}"),
    }
}

fn classify(what: &str, e: libbpf_rs::Error) -> LoadError {
    let text = format!("{what}: {e}");
    match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => LoadError::Permission(text),
        libbpf_rs::ErrorKind::NotFound => LoadError::NoSymbol(text),
        _ => LoadError::Other(text),
    }
}

impl Loaded {
    /// Loads the program for process `pid` (`tgid`: the same process as the kernel's initial
    /// pid namespace numbers it) and attaches its uprobes to `library` and to `libc`'s close().
    /// Then, if `learn_fds()` says streams begun before the probe may exist, or there is no
    /// libc to probe, its raw tracepoint on sys_enter.
    pub fn attach(
        pid: u32,
        tgid: u32,
        library: &Path,
        libc: Option<&Path>,
        ring_bytes: u32,
        learn_fds: &mut dyn FnMut() -> bool,
    ) -> Result<Loaded, LoadError> {
        // libbpf prints to stderr by default; ours goes through the log, at debug: the
        // attach error we return says what matters.
        libbpf_rs::set_print(Some((PrintLevel::Debug, log_libbpf)));
        let mut open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| classify("opening the embedded BPF object", e))?;
        for mut map in open.maps_mut() {
            let name = map.name().to_string_lossy().into_owned();
            if name.ends_with(".rodata") {
                // struct tls_config { u32 target_tgid; u32 flags; }, the only .rodata.
                let flags: u32 = if libc.is_none() {
                    CONFIG_CLOSE_IN_SYS_ENTER
                } else {
                    0
                };
                match map.initial_value_mut() {
                    Some(v) if v.len() == 8 => {
                        v[..4].copy_from_slice(&tgid.to_ne_bytes());
                        v[4..].copy_from_slice(&flags.to_ne_bytes());
                    }
                    _ => {
                        return Err(LoadError::Other(
                            "the BPF object's .rodata is not the expected 8-byte config".into(),
                        ))
                    }
                }
            } else if name == "events" {
                map.set_max_entries(ring_bytes)
                    .map_err(|e| classify("sizing the ring buffer", e))?;
            }
        }
        let object = open
            .load()
            .map_err(|e| classify("loading the BPF program", e))?;

        let pid_i = i32::try_from(pid).map_err(|_| LoadError::Other(format!("pid {pid}")))?;
        let mut links = Vec::new();
        let probes = [
            ("ssl_set_fd", "SSL_set_fd", false),
            ("ssl_read_enter", "SSL_read", false),
            ("ssl_read_leave", "SSL_read", true),
            ("ssl_write_enter", "SSL_write", false),
            ("ssl_write_leave", "SSL_write", true),
        ];
        // uprobe_multi links (kernel 6.6+), not uprobe perf events: the kernel creates them
        // under CAP_BPF + CAP_PERFMON, where a perf event scoped to one pid wants
        // CAP_SYS_ADMIN (6.18, measured); no tracefs either way.
        let close = [("libc_close", "close", false)];
        let targets = probes.iter().map(|p| (p, library)).chain(
            libc.into_iter()
                .flat_map(|l| close.iter().map(move |p| (p, l))),
        );
        for (&(prog_name, func, retprobe), file) in targets {
            let prog = object
                .progs_mut()
                .find(|p| p.name() == prog_name)
                .ok_or_else(|| LoadError::Other(format!("program {prog_name} missing")))?;
            let link = prog
                .attach_uprobe_multi(pid_i, file, func, retprobe, false)
                .map_err(|e| {
                    classify(
                        &format!(
                            "attaching a uprobe to {func} in {} of pid {pid}",
                            file.display()
                        ),
                        e,
                    )
                })?;
            links.push(link);
        }
        // Asked only now: a stream begun before the uprobes were attached has a connection
        // that exists now.
        let close_in_sys = libc.is_none();
        let sys = if close_in_sys || learn_fds() {
            let prog = object
                .progs_mut()
                .find(|p| p.name() == "sys_enter")
                .ok_or_else(|| LoadError::Other("program sys_enter missing".into()))?;
            Some(
                prog.attach_raw_tracepoint("sys_enter")
                    .map_err(|e| classify("attaching the raw tracepoint sys_enter", e))?,
            )
        } else {
            None
        };

        let loss_map = object
            .maps()
            .find(|m| m.name() == "loss")
            .ok_or_else(|| LoadError::Other("map loss missing".into()))?;
        let loss = MapHandle::try_from(&loss_map).map_err(|e| classify("map loss", e))?;
        let events = object
            .maps()
            .find(|m| m.name() == "events")
            .ok_or_else(|| LoadError::Other("map events missing".into()))?;
        let staging = Arc::new(Mutex::new(Staging::default()));
        let sink = Arc::clone(&staging);
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&events, move |record: &[u8]| {
                let mut s = sink.lock().unwrap_or_else(PoisonError::into_inner);
                s.bytes.extend_from_slice(record);
                let end = s.bytes.len();
                s.ends.push(end);
                0
            })
            .map_err(|e| classify("ring buffer", e))?;
        let ring = builder.build().map_err(|e| classify("ring buffer", e))?;
        Ok(Loaded {
            ring,
            staging,
            _links: links,
            sys,
            close_in_sys,
            loss,
            _object: object,
        })
    }

    /// Whether the program tells each stream's socket in the kernel (its fd-table walk, CO-RE
    /// relocated at load: a program that loaded has it), so that user space reads /proc only
    /// as a fallback.
    pub fn tells_sockets(&self) -> bool {
        true
    }

    /// Whether the sys_enter tracepoint (joined streams' fds) is attached.
    pub fn learning_fds(&self) -> bool {
        self.sys.is_some()
    }

    /// Detaches the sys_enter tracepoint, unless it also watches close() (no libc probed).
    pub fn stop_learning_fds(&mut self) {
        if !self.close_in_sys {
            self.sys = None;
        }
    }

    /// The ring's epoll fd: readable when records wait.
    pub fn poll_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd belongs to the ring buffer manager, which lives as long as `self`
        // (the borrow ties the returned fd to it).
        unsafe { BorrowedFd::borrow_raw(self.ring.epoll_fd()) }
    }

    /// Copies up to `max` waiting records into `out` (cleared first); returns how many.
    pub fn take(&mut self, max: usize, out: &mut Staging) -> usize {
        {
            let mut s = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
            s.bytes.clear();
            s.ends.clear();
        }
        let n = self.ring.consume_raw_n(max);
        let mut s = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *s, out);
        if n < 0 {
            tracing::debug!("tls probe: ring consume failed: {n}");
        }
        out.ends.len()
    }

    /// The program's loss counters, summed over CPUs.
    pub fn losses(&self) -> Losses {
        let mut l = Losses::default();
        let Ok(Some(per_cpu)) = self.loss.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) else {
            return l;
        };
        for v in per_cpu {
            let field = |i: usize| -> u64 {
                v.get(i * 8..i * 8 + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_ne_bytes)
            };
            l.ring_full_records += field(0);
            l.ring_full_bytes += field(1);
            l.truncated_bytes += field(2);
            l.foreign_tgid += field(3);
        }
        l
    }
}

impl AsFd for Loaded {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.poll_fd()
    }
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Loaded(ring epoll fd {})", self.ring.epoll_fd())
    }
}
