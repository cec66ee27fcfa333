//! Scheduling priority of a daemon's packet path (`--capture-priority`).
//!
//! A capture thread cannot wait for the CPU the way a database thread can: once the kernel's
//! capture ring is full, every further packet is dropped for good and the connections it
//! belonged to can no longer be mirrored, while a database thread that runs 100 ms later only
//! answers 100 ms later. At normal priority, the Linux scheduler gives a busy thread its fair
//! share among the runnable threads of its group, so a thousand runnable threads (a burst of
//! connections on the same host, or a load generator in the same session) leave the capture a
//! thousandth of the CPU, far less than it needs to keep up (docs/BENCHMARKS.md, "1,000
//! connections": the copier waited 2 s on the run queue in the first 2 s of such a burst).
//!
//! [`raise`] gives the calling thread, and every thread it starts afterwards (they inherit
//! it), either the highest nice value or the lowest real-time round-robin priority. The
//! packet path's CPU is bounded by the traffic (a few microseconds per packet, and it sleeps
//! in poll(2) when there is nothing to read), so a higher priority changes when it runs, not
//! how much.
//!
//! This module never lowers a priority the process was given, never touches another process
//! and never fails the daemon: it reports what it could not do and the caller logs it.

use std::io;

/// What `--capture-priority` asks for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    /// Leave the scheduling as the daemon was started (nice value, policy).
    Normal,
    /// Nice -20 (the weight of about 87 normal threads): enough in the lab for 1,000
    /// connections opened at once next to the capture.
    #[default]
    High,
    /// SCHED_RR at priority 1: runs before every normal thread; the kernel still leaves them
    /// 5% of each CPU (`kernel.sched_rt_runtime_us`).
    Realtime,
}

/// The nice value of [`Priority::High`].
pub const HIGH_NICE: i32 = -20;
/// The SCHED_RR priority of [`Priority::Realtime`] (the lowest real-time one).
pub const REALTIME_PRIORITY: i32 = 1;

/// What [`raise`] did, for the daemon's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// `Normal`: nothing asked; the thread's nice value as found.
    Unchanged { nice: i32 },
    /// The nice value is now `nice` (it may already have been that low, e.g. systemd's
    /// `Nice=`).
    Nice { nice: i32 },
    /// SCHED_RR at `priority`.
    Realtime { priority: i32 },
}

impl Raised {
    pub fn describe(&self) -> String {
        match self {
            Raised::Unchanged { nice } => format!("as started (nice {nice})"),
            Raised::Nice { nice } => format!("nice {nice}"),
            Raised::Realtime { priority } => format!("SCHED_RR priority {priority}"),
        }
    }
}

/// Gives the calling thread (and the threads it starts later) the priority `p` asks for.
/// Call it before dropping capabilities (raising needs CAP_SYS_NICE unless the daemon was
/// started that high already) and before starting the threads that should inherit it.
///
/// An error is the system's (typically permission denied: no CAP_SYS_NICE, a systemd unit with
/// `RestrictRealtime=`); the thread keeps its priority.
pub fn raise(p: Priority) -> io::Result<Raised> {
    match p {
        Priority::Normal => Ok(Raised::Unchanged {
            nice: current_nice()?,
        }),
        Priority::High => {
            let nice = current_nice()?;
            if nice <= HIGH_NICE {
                return Ok(Raised::Nice { nice });
            }
            set_nice(HIGH_NICE)?;
            Ok(Raised::Nice {
                nice: current_nice()?,
            })
        }
        Priority::Realtime => {
            let param = libc::sched_param {
                sched_priority: REALTIME_PRIORITY,
            };
            // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is
            // the calling thread.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Raised::Realtime {
                priority: REALTIME_PRIORITY,
            })
        }
    }
}

/// [`raise`] for a daemon's `--capture-priority`, logged: what was set, or (once, as a
/// warning) why not and what to do. The daemon runs on either way.
pub fn raise_logged(p: Priority) {
    match raise(p) {
        Ok(r) => tracing::info!("capture priority: {}", r.describe()),
        Err(e) => tracing::warn!(
            "cannot raise the capture's scheduling priority (--capture-priority {}): {e}; it runs \
             as started, and behind many runnable threads (a burst of connections) its ring may \
             overflow (kernel drops). Grant CAP_SYS_NICE, or start it with `nice -n -20` \
             (systemd: Nice=-20), or pass --capture-priority normal to silence this",
            clap::ValueEnum::to_possible_value(&p)
                .map_or_else(String::new, |v| v.get_name().to_owned())
        ),
    }
}

/// The calling thread's id: on Linux the nice value belongs to a thread, and
/// `setpriority(PRIO_PROCESS, 0)` is the calling thread only; naming it makes that explicit.
fn tid() -> libc::id_t {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    libc::id_t::try_from(tid).unwrap_or(0)
}

/// The calling thread's nice value.
pub fn current_nice() -> io::Result<i32> {
    // getpriority(2) may legitimately return -1: errno tells an error apart.
    // SAFETY: errno is thread-local; __errno_location returns a valid pointer to it.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: plain system call on our own thread id.
    let v = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid()) };
    if v == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error().unwrap_or(0) != 0 {
            return Err(e);
        }
    }
    Ok(v)
}

fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: plain system call on our own thread id.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid(), nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's scheduling policy (`libc::SCHED_OTHER`, `SCHED_RR`, ...).
pub fn current_policy() -> io::Result<i32> {
    // SAFETY: pid 0 is the calling thread.
    let p = unsafe { libc::sched_getscheduler(0) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each check runs in a thread of its own: the priority belongs to the thread, so the test
    /// harness's other threads keep theirs.
    fn in_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    /// Not root and no CAP_SYS_NICE: the only acceptable failure.
    fn denied(e: &io::Error) -> bool {
        e.kind() == io::ErrorKind::PermissionDenied
    }

    #[test]
    fn normal_changes_nothing() {
        let (before, raised, after) = in_thread(|| {
            let before = current_nice().unwrap();
            let raised = raise(Priority::Normal).unwrap();
            (before, raised, current_nice().unwrap())
        });
        assert_eq!(raised, Raised::Unchanged { nice: before });
        assert_eq!(before, after);
    }

    #[test]
    fn high_gives_the_thread_and_its_children_nice_minus_20() {
        let got = in_thread(|| match raise(Priority::High) {
            // A thread started afterwards inherits it: the packet path's helper threads.
            Ok(r) => Ok((r, current_nice().unwrap(), in_thread(current_nice).unwrap())),
            Err(e) => Err(e),
        });
        match got {
            Ok((r, nice, child)) => {
                assert_eq!(r, Raised::Nice { nice: HIGH_NICE });
                assert_eq!((nice, child), (HIGH_NICE, HIGH_NICE));
            }
            Err(e) => assert!(denied(&e), "{e}"),
        }
        // The test's own thread is untouched.
        assert_ne!(current_nice().unwrap(), HIGH_NICE);
    }

    #[test]
    fn realtime_is_round_robin_and_inherited() {
        let got = in_thread(|| match raise(Priority::Realtime) {
            Ok(r) => Ok((
                r,
                current_policy().unwrap(),
                in_thread(current_policy).unwrap(),
            )),
            Err(e) => Err(e),
        });
        match got {
            Ok((r, policy, child)) => {
                assert_eq!(
                    r,
                    Raised::Realtime {
                        priority: REALTIME_PRIORITY
                    }
                );
                assert_eq!((policy, child), (libc::SCHED_RR, libc::SCHED_RR));
            }
            Err(e) => assert!(denied(&e), "{e}"),
        }
        assert_eq!(current_policy().unwrap(), libc::SCHED_OTHER);
    }

    #[test]
    fn descriptions_name_the_setting() {
        assert_eq!(Raised::Nice { nice: -20 }.describe(), "nice -20");
        assert_eq!(
            Raised::Realtime { priority: 1 }.describe(),
            "SCHED_RR priority 1"
        );
        assert_eq!(
            Raised::Unchanged { nice: 0 }.describe(),
            "as started (nice 0)"
        );
    }
}
