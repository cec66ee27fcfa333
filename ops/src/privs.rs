//! Dropping capabilities once a daemon has opened what needed them.
//!
//! The copier and intercept need CAP_NET_RAW (and CAP_NET_ADMIN) to open their captures and raw
//! sockets; once those are open, almost nothing they do later needs a privilege. [`drop_all_but`]
//! leaves only the capabilities the caller names: the effective, permitted and bounding sets
//! are cut to them, the inheritable and ambient sets emptied, and no_new_privs set, so neither
//! the daemon nor anything it could ever execute gets the rest back.
//!
//! Linux keeps capabilities per thread, and a daemon has threads by the time its sockets are
//! open (the SIGHUP reloader, metrics, control connections). So the calling thread drops first,
//! then every other thread of the process is signalled to drop its own (the handler makes raw
//! system calls only), and `/proc/self/task/*/status` is read back until every thread shows the
//! same sets. This module must never raise a capability, and never report success while a
//! thread still holds more than was kept.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_NET_BIND_SERVICE: u32 = 10;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_NICE: u32 = 23;

/// What [`drop_all_but`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The capabilities kept (a bit per capability number): those asked for that the process
    /// had.
    pub kept: u64,
    /// Asked for but not held in the first place (running without them): later operations that
    /// need them will fail as they would have anyway.
    pub missing: u64,
    /// Whether the bounding set was cut too (needs CAP_SETPCAP, which a root daemon has; a
    /// daemon given only its ambient capabilities by systemd does not, and its bounding set is
    /// then systemd's `CapabilityBoundingSet=`).
    pub bounding: bool,
    /// Threads of the process when the drop was verified (the caller's included).
    pub threads: usize,
}

impl Dropped {
    /// E.g. `kept cap_net_admin (bounding set cut, 5 threads)`, for the daemon's one log line.
    pub fn describe(&self) -> String {
        let mut s = format!("kept {}", names(self.kept));
        if self.missing != 0 {
            s.push_str(&format!(" (did not have {})", names(self.missing)));
        }
        s.push_str(&format!(
            "; {}, no_new_privs, {} threads",
            if self.bounding {
                "bounding set cut"
            } else {
                "bounding set left as given (no CAP_SETPCAP)"
            },
            self.threads
        ));
        s
    }
}

/// Why the drop failed. The daemon should stop: it would run with more than it should.
#[derive(Debug, thiserror::Error)]
pub enum PrivsError {
    #[error("{what} failed: {err}")]
    Syscall {
        what: &'static str,
        err: std::io::Error,
    },
    #[error(
        "thread {tid} still holds capabilities {have:#x} after {tries} signals (wanted {want:#x})"
    )]
    Straggler {
        tid: u32,
        have: u64,
        want: u64,
        tries: u32,
    },
}

/// The name of capability `cap`, as capabilities(7) spells it in lower case.
pub fn cap_name(cap: u32) -> String {
    const NAMES: [&str; 41] = [
        "cap_chown",
        "cap_dac_override",
        "cap_dac_read_search",
        "cap_fowner",
        "cap_fsetid",
        "cap_kill",
        "cap_setgid",
        "cap_setuid",
        "cap_setpcap",
        "cap_linux_immutable",
        "cap_net_bind_service",
        "cap_net_broadcast",
        "cap_net_admin",
        "cap_net_raw",
        "cap_ipc_lock",
        "cap_ipc_owner",
        "cap_sys_module",
        "cap_sys_rawio",
        "cap_sys_chroot",
        "cap_sys_ptrace",
        "cap_sys_pacct",
        "cap_sys_admin",
        "cap_sys_boot",
        "cap_sys_nice",
        "cap_sys_resource",
        "cap_sys_time",
        "cap_sys_tty_config",
        "cap_mknod",
        "cap_lease",
        "cap_audit_write",
        "cap_audit_control",
        "cap_setfcap",
        "cap_mac_override",
        "cap_mac_admin",
        "cap_syslog",
        "cap_wake_alarm",
        "cap_block_suspend",
        "cap_audit_read",
        "cap_perfmon",
        "cap_bpf",
        "cap_checkpoint_restore",
    ];
    NAMES
        .get(cap as usize)
        .map_or_else(|| format!("cap_{cap}"), |n| (*n).to_owned())
}

/// The names of the capabilities in `mask`, comma-separated; `none` for an empty set.
pub fn names(mask: u64) -> String {
    let v: Vec<String> = (0..64)
        .filter(|c| mask & (1u64 << c) != 0)
        .map(cap_name)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(",")
    }
}

/// A capability mask from capability numbers.
pub fn mask(caps: &[u32]) -> u64 {
    caps.iter()
        .filter(|&&c| c < 64)
        .fold(0, |m, &c| m | (1u64 << c))
}

/// The capability sets of one thread, from its `/proc/.../status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCaps {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub bounding: u64,
    pub ambient: u64,
}

/// Parses the `Cap*:` lines of a `/proc/PID/status` (or `/proc/PID/task/TID/status`) text.
pub fn parse_status(text: &str) -> Option<ThreadCaps> {
    let get = |key: &str| -> Option<u64> {
        let hex = text.lines().find_map(|l| l.strip_prefix(key))?;
        u64::from_str_radix(hex.trim(), 16).ok()
    };
    Some(ThreadCaps {
        effective: get("CapEff:")?,
        permitted: get("CapPrm:")?,
        inheritable: get("CapInh:")?,
        bounding: get("CapBnd:")?,
        ambient: get("CapAmb:").unwrap_or(0),
    })
}

// What every thread installs; set before any thread is signalled.
static KEEP: AtomicU64 = AtomicU64::new(0);
static CUT_BOUNDING: AtomicBool = AtomicBool::new(false);
static LAST_CAP: AtomicU32 = AtomicU32::new(40);
/// Threads whose handler failed (a raw errno is not worth more: the verification names them).
static HANDLER_FAILURES: AtomicU32 = AtomicU32::new(0);
/// One drop at a time: the statics above are its parameters.
static BUSY: Mutex<()> = Mutex::new(());

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// The calling thread's (effective, permitted) sets.
fn capget() -> std::io::Result<(u64, u64)> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a version-3 header writes two CapData structs, which `data` holds.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

/// Installs the target sets in the calling thread. Raw system calls and atomics only: it also
/// runs in a signal handler. Returns the failing step.
fn apply_here() -> Result<(), &'static str> {
    let keep = KEEP.load(Ordering::SeqCst);
    // SAFETY (whole block): prctl and capset with plain integer arguments and a pointer to
    // local structs that outlive the call; none of them touch memory otherwise.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) != 0 {
            return Err("prctl(PR_SET_NO_NEW_PRIVS)");
        }
        if CUT_BOUNDING.load(Ordering::SeqCst) {
            for cap in 0..=LAST_CAP.load(Ordering::SeqCst).min(63) {
                if keep & (1u64 << cap) == 0
                    && libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) == 1
                    && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                {
                    return Err("prctl(PR_CAPBSET_DROP)");
                }
            }
        }
        // EINVAL on kernels before 4.3, which have no ambient set to clear.
        let _ = libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut hdr = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let data = [
            CapData {
                effective: keep as u32,
                permitted: keep as u32,
                inheritable: 0,
            },
            CapData {
                effective: (keep >> 32) as u32,
                permitted: (keep >> 32) as u32,
                inheritable: 0,
            },
        ];
        if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) != 0 {
            return Err("capset");
        }
    }
    Ok(())
}

extern "C" fn on_drop_signal(_: libc::c_int) {
    // SAFETY: errno is thread-local; saved and restored so the interrupted code never sees
    // ours.
    let saved = unsafe { *libc::__errno_location() };
    if apply_here().is_err() {
        HANDLER_FAILURES.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// The signal that asks a thread to drop: a real-time one nobody else in the daemons uses.
fn drop_signal() -> libc::c_int {
    libc::SIGRTMAX() - 1
}

fn thread_ids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn thread_caps(tid: u32) -> Option<ThreadCaps> {
    parse_status(&std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?)
}

/// Whether a thread shows exactly the target sets.
fn settled(c: &ThreadCaps, keep: u64, cut_bounding: bool) -> bool {
    c.effective == keep
        && c.permitted == keep
        && c.inheritable == 0
        && c.ambient == 0
        && (!cut_bounding || c.bounding & !keep == 0)
}

/// Leaves the process with only `keep` (capability numbers, e.g. [`CAP_NET_ADMIN`]) in every
/// thread, as described in the module documentation. Capabilities in `keep` that the process
/// does not have are reported in [`Dropped::missing`], not an error.
pub fn drop_all_but(keep: &[u32]) -> Result<Dropped, PrivsError> {
    let _busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
    let (effective, permitted) = capget().map_err(|err| PrivsError::Syscall {
        what: "capget",
        err,
    })?;
    let wanted = mask(keep);
    let kept = wanted & permitted;
    let cut_bounding = effective & (1u64 << CAP_SETPCAP) != 0;
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    KEEP.store(kept, Ordering::SeqCst);
    CUT_BOUNDING.store(cut_bounding, Ordering::SeqCst);
    LAST_CAP.store(last, Ordering::SeqCst);

    apply_here().map_err(|what| PrivsError::Syscall {
        what,
        err: std::io::Error::last_os_error(),
    })?;

    // SAFETY: installs a handler that makes raw system calls only (see `on_drop_signal`);
    // SA_RESTART so that the system calls it interrupts mostly resume by themselves.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_drop_signal as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(drop_signal(), &sa, std::ptr::null_mut()) != 0 {
            return Err(PrivsError::Syscall {
                what: "sigaction",
                err: std::io::Error::last_os_error(),
            });
        }
    }
    // SAFETY: plain system calls returning ids.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tries = 0u32;
    loop {
        let tids = thread_ids();
        let pending: Vec<(u32, ThreadCaps)> = tids
            .iter()
            .filter(|&&t| t as i32 != me)
            .filter_map(|&t| thread_caps(t).map(|c| (t, c)))
            .filter(|(_, c)| !settled(c, kept, cut_bounding))
            .collect();
        if pending.is_empty() {
            return Ok(Dropped {
                kept,
                missing: wanted & !permitted,
                bounding: cut_bounding,
                threads: tids.len().max(1),
            });
        }
        if Instant::now() >= deadline {
            let (tid, c) = pending[0];
            return Err(PrivsError::Straggler {
                tid,
                have: c.effective | c.permitted,
                want: kept,
                tries,
            });
        }
        for (tid, _) in &pending {
            // SAFETY: tgkill to a thread of our own process; ESRCH (it just exited) is fine.
            unsafe {
                libc::syscall(libc::SYS_tgkill, pid, *tid as libc::c_long, drop_signal());
            }
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_masks() {
        assert_eq!(names(0), "none");
        assert_eq!(
            names(mask(&[CAP_NET_RAW, CAP_NET_ADMIN])),
            "cap_net_admin,cap_net_raw"
        );
        assert_eq!(cap_name(40), "cap_checkpoint_restore");
        assert_eq!(cap_name(50), "cap_50");
        assert_eq!(mask(&[64, 0]), 1);
    }

    #[test]
    fn status_lines_parse() {
        let text = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000001000\n\
                    CapEff:\t0000000000001000\nCapBnd:\t0000000000003000\nCapAmb:\t0000000000000000\n";
        let c = parse_status(text).unwrap();
        assert_eq!(c.effective, 1 << CAP_NET_ADMIN);
        assert_eq!(c.bounding, (1 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW));
        assert!(settled(&c, 1 << CAP_NET_ADMIN, false));
        assert!(
            !settled(&c, 1 << CAP_NET_ADMIN, true),
            "bounding set still has net_raw"
        );
        assert!(parse_status("Name: x\n").is_none());
    }

    #[test]
    fn describe_says_what_was_kept() {
        let d = Dropped {
            kept: mask(&[CAP_NET_ADMIN]),
            missing: 0,
            bounding: true,
            threads: 3,
        };
        assert_eq!(
            d.describe(),
            "kept cap_net_admin; bounding set cut, no_new_privs, 3 threads"
        );
    }

    /// Runs in a child process (this test binary again): the drop is irreversible, and other
    /// tests of this process must keep their privileges.
    #[test]
    fn every_thread_drops() {
        const CHILD: &str = "TSD_PRIVS_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // Threads that exist before the drop, blocked in different ways.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let waiting = std::thread::spawn(move || rx.recv().is_ok());
            let sleeping = std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                capget().unwrap()
            });
            let d = drop_all_but(&[CAP_NET_ADMIN]).unwrap();
            assert!(d.threads >= 3, "{d:?}");
            for tid in thread_ids() {
                let c = thread_caps(tid).unwrap();
                assert!(settled(&c, d.kept, d.bounding), "thread {tid}: {c:?}");
            }
            // The interrupted sleep and wait carry on unharmed, with the kept set.
            assert_eq!(sleeping.join().unwrap(), (d.kept, d.kept));
            tx.send(()).unwrap();
            assert!(waiting.join().unwrap());
            // A thread started afterwards inherits the reduced sets.
            let later = std::thread::spawn(|| capget().unwrap()).join().unwrap();
            assert_eq!(later, (d.kept, d.kept));
            // Nothing can raise what was dropped.
            assert_eq!(capget().unwrap().1 & (1 << CAP_NET_RAW), 0);
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "privs::tests::every_thread_drops", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
