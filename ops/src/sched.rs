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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What `--capture-priority` asks for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    /// Leave the scheduling as the daemon was started (nice value, policy).
    Normal,
    /// As started while the capture keeps up; [`High`](Self::High) for as long as it falls
    /// behind the wire (see [`OnDemand`]). Only a daemon that measures its lag and calls
    /// [`OnDemand::observe`] ever raises; for any other it is `Normal`.
    Auto,
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
    /// `Nice=`); what became of the session's CPU group.
    Nice { nice: i32, group: Group },
    /// SCHED_RR at `priority`.
    Realtime { priority: i32 },
    /// `Auto`: as started (`nice`) and allowed to raise itself later (`RLIMIT_NICE`), once the
    /// capabilities are gone.
    OnDemand { nice: i32 },
}

/// The kernel's autogroup scheduling (`kernel.sched_autogroup_enabled`, on in Debian's and
/// most distributions' kernels) shares the CPU between sessions first and only then between
/// the threads of a session: a nice value orders a thread among its session's threads and
/// does nothing against another session's. So a copier in a session of its own (a service,
/// `setsid`) raises its session's group as well; one sharing a session with a shell cannot
/// without raising the shell's other children too, and says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// No autogroup scheduling (disabled, or a kernel without it; cgroups decide instead).
    NotGrouped,
    /// The process leads its session: the session's group has the same nice value.
    Raised,
    /// The process shares its session: its group was left as it is.
    Shared,
    /// The group could not be raised (the error is the system's).
    Failed,
}

impl Raised {
    pub fn describe(&self) -> String {
        match self {
            Raised::Unchanged { nice } => format!("as started (nice {nice})"),
            Raised::Nice { nice, group } => match group {
                Group::NotGrouped => format!("nice {nice}"),
                Group::Raised => format!("nice {nice}, its session's CPU group too"),
                Group::Shared => format!(
                    "nice {nice}, among its session's threads only: it shares its session \
                     (and so the kernel's CPU group) with other processes, against which the \
                     priority counts for nothing; run it as a service or under setsid"
                ),
                Group::Failed => format!(
                    "nice {nice}, among its session's threads only: its session's CPU group \
                     could not be raised (/proc/self/autogroup)"
                ),
            },
            Raised::Realtime { priority } => format!("SCHED_RR priority {priority}"),
            Raised::OnDemand { nice } => format!(
                "as started (nice {nice}); raised to nice {HIGH_NICE} while the capture is over \
                 {} ms behind the wire",
                AUTO_RAISE_AT.as_millis()
            ),
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
        Priority::Auto => {
            // Without the limit (no CAP_SYS_RESOURCE, in some containers) the daemon can keep
            // CAP_SYS_NICE instead (`raise_needs_capability`); an error only if neither.
            if let Err(e) = allow_nice(HIGH_NICE) {
                if !has_cap_sys_nice() {
                    return Err(e);
                }
            }
            // For a copier sharing its session (`OnDemand`); without it, nice only.
            let _ = allow_rtprio(REALTIME_PRIORITY);
            Ok(Raised::OnDemand {
                nice: current_nice()?,
            })
        }
        Priority::High => {
            if current_nice()? > HIGH_NICE {
                set_nice(HIGH_NICE)?;
            }
            let nice = current_nice()?;
            Ok(Raised::Nice {
                nice,
                group: raise_session_group(nice),
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

/// How far behind the wire the capture may fall before [`Priority::Auto`] raises it: a tenth
/// of what the capture ring holds by default (1 s), so that a raise comes long before a drop.
pub const AUTO_RAISE_AT: Duration = Duration::from_millis(100);
/// A raised capture that stays this close to the wire...
pub const AUTO_CALM: Duration = Duration::from_millis(20);
/// ...for this long goes back to its own priority: raised, it runs before the threads it
/// shares the CPU with (production's, on a master) and sends in larger bursts, which shows in
/// the report's test latencies (docs/BENCHMARKS.md).
pub const AUTO_LOWER_AFTER: Duration = Duration::from_secs(30);

/// [`Priority::Auto`] for one capture thread: fed the capture's lag (how long ago the packets
/// it just handled crossed the wire), it raises the thread and its session's CPU group to
/// [`Priority::High`] once the lag reaches [`AUTO_RAISE_AT`] and lowers them again after
/// [`AUTO_LOWER_AFTER`] within [`AUTO_CALM`]. A fair share of a saturated host is not what a
/// capture needs: its work is fixed by the traffic, and what it cannot do in time the kernel
/// drops for good (docs/BENCHMARKS.md: 8 threads, pinning off, a fair share lost 0.75-0.97 of
/// the work). Raising needs [`raise`] with `Auto` earlier, while the daemon was privileged.
///
/// A copier that shares its session (started by hand from the shell that runs other work, or
/// squeezed in with a load) cannot raise its session's CPU group without raising the others,
/// and a nice value counts for nothing against other sessions' groups: there it takes
/// [`Priority::Realtime`] instead, for as long as it would have been raised
/// (docs/BENCHMARKS.md, "A copier starved on purpose").
///
/// A capture that gets no CPU cannot measure its lag: it learns it when it runs again, up to
/// a ring's worth late (unpinned lab, 32 threads: "fell 1000 ms behind", 20,745 and 71,621
/// kernel drops in 2 of 3 runs). [`OnDemand::watch`] adds a watchdog thread that raises the
/// capture for it when the ring has had packets waiting [`STALL`] long without the capture
/// finishing a round.
#[derive(Debug)]
pub struct OnDemand {
    started_nice: i32,
    raised: bool,
    /// Raised to SCHED_RR rather than nice (the session is shared).
    realtime: bool,
    gave_up: bool,
    calm_since: Option<Instant>,
    raises: u64,
    watchdog: Option<Watchdog>,
}

/// How long the ring may hold packets without the capture finishing a round before its
/// watchdog raises it: well under what the ring holds (1 s by default), above any round's
/// work (at most 512 packets).
pub const STALL: Duration = Duration::from_millis(60);
/// How often the watchdog looks while the ring holds packets or the capture keeps reading
/// them (its wakeups per second then: 50). Once the capture has finished no round for a look
/// and the ring is empty, it sleeps in poll(2) until packets come: an idle copier wakes for
/// nothing (issue 20).
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// What a capture thread and its watchdog share.
#[derive(Debug)]
struct Watched {
    /// Rounds the capture finished.
    rounds: AtomicU64,
    /// 0: as started; 1: raised to nice -20; 2: to SCHED_RR (by either of them).
    raised: AtomicU8,
    stop: AtomicBool,
    /// An eventfd written when `stop` is set: it ends the watchdog's sleep in poll(2).
    wake: OwnedFd,
}

#[derive(Debug)]
struct Watchdog {
    watched: Arc<Watched>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.watched.stop.store(true, Ordering::Relaxed);
        let one: u64 = 1;
        // SAFETY: eight bytes from a valid u64 to our own eventfd.
        let _ = unsafe {
            libc::write(
                self.watched.wake.as_raw_fd(),
                std::ptr::from_ref(&one).cast(),
                8,
            )
        };
        // Joined: it polls the capture's descriptor, which must outlive it.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl OnDemand {
    /// For the calling thread, as it is now.
    pub fn new() -> Self {
        Self {
            started_nice: current_nice().unwrap_or(0),
            raised: false,
            realtime: false,
            gave_up: false,
            calm_since: None,
            raises: 0,
            watchdog: None,
        }
    }

    /// Starts a watchdog for the calling (capture) thread, which reads the capture ring `fd`:
    /// see the type's documentation. `fd` must stay open while `self` lives.
    pub fn watch(&mut self, fd: RawFd) -> io::Result<()> {
        // SAFETY: plain system call; the result is checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        let watched = Arc::new(Watched {
            rounds: AtomicU64::new(0),
            raised: AtomicU8::new(0),
            stop: AtomicBool::new(false),
            // SAFETY: a descriptor we just opened and own from here on.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
        });
        let capture = tid();
        let shared = watched.clone();
        let thread = std::thread::Builder::new()
            .name("capture-watch".into())
            .spawn(move || watchdog(capture, fd, &shared))?;
        self.watchdog = Some(Watchdog {
            watched,
            thread: Some(thread),
        });
        Ok(())
    }

    fn mark_raised(&self, how: u8) {
        if let Some(w) = &self.watchdog {
            w.watched.raised.store(how, Ordering::Relaxed);
        }
    }

    /// Times the capture was raised so far.
    pub fn raises(&self) -> u64 {
        self.raises
    }

    pub fn is_raised(&self) -> bool {
        self.raised
    }

    /// Raised to SCHED_RR (its session is shared), not only to nice -20.
    pub fn is_realtime(&self) -> bool {
        self.realtime
    }

    /// The capture handled packets that crossed the wire `lag` ago (the largest of a batch).
    pub fn observe(&mut self, lag: Duration, now: Instant) {
        if let Some(w) = &self.watchdog {
            w.watched.rounds.fetch_add(1, Ordering::Relaxed);
            if !self.raised {
                let how = w.watched.raised.load(Ordering::Relaxed);
                if how != 0 {
                    // Raised by the watchdog while this thread had no CPU.
                    self.raised = true;
                    self.realtime = how == 2;
                    self.raises += 1;
                    self.calm_since = None;
                }
            }
        }
        if self.gave_up {
            return;
        }
        if !self.raised {
            if lag < AUTO_RAISE_AT {
                return;
            }
            match raise(Priority::High) {
                Ok(Raised::Nice {
                    group: Group::Shared | Group::Failed,
                    ..
                }) if raise(Priority::Realtime).is_ok() => {
                    self.raised = true;
                    self.realtime = true;
                    self.raises += 1;
                    self.calm_since = None;
                    self.mark_raised(2);
                    tracing::info!(
                        "the capture fell {} ms behind the wire: raised to SCHED_RR priority \
                         {REALTIME_PRIORITY} until it keeps up for {} s (it shares its \
                         session, and so its CPU group, with other processes, against which \
                         a nice value counts for nothing; run it as a service or under setsid)",
                        lag.as_millis(),
                        AUTO_LOWER_AFTER.as_secs()
                    );
                }
                Ok(r) => {
                    self.raised = true;
                    self.raises += 1;
                    self.calm_since = None;
                    self.mark_raised(1);
                    tracing::info!(
                        "the capture fell {} ms behind the wire: raised to {} until it keeps up \
                         for {} s",
                        lag.as_millis(),
                        r.describe(),
                        AUTO_LOWER_AFTER.as_secs()
                    );
                }
                Err(e) => {
                    self.gave_up = true;
                    tracing::warn!(
                        "the capture fell {} ms behind the wire and cannot raise its priority \
                         ({e}): on a saturated host the kernel will drop what it cannot keep \
                         up with. Start it as root, with CAP_SYS_NICE, or with RLIMIT_NICE \
                         allowing -20 (systemd: LimitNICE=-20)",
                        lag.as_millis()
                    );
                }
            }
            return;
        }
        if lag > AUTO_CALM {
            self.calm_since = None;
            return;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.saturating_duration_since(since) < AUTO_LOWER_AFTER {
            return;
        }
        // Lowering a priority is always allowed.
        if self.realtime {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is
            // the calling thread.
            let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
            self.realtime = false;
        }
        let _ = set_nice(self.started_nice);
        if lead_session_group() {
            let _ = std::fs::write("/proc/self/autogroup", "0");
        }
        self.raised = false;
        self.calm_since = None;
        self.mark_raised(0);
        tracing::info!(
            "the capture kept up for {} s: back to nice {}",
            AUTO_LOWER_AFTER.as_secs(),
            self.started_nice
        );
    }
}

impl Default for OnDemand {
    fn default() -> Self {
        Self::new()
    }
}

/// The watchdog of the capture thread `capture` (see [`OnDemand`]): raises it once the ring
/// `fd` has held packets for [`STALL`] without the capture finishing a round. It runs at the
/// priority it would give the capture, so that it runs when the capture cannot; it never
/// lowers anything (the capture thread does, once it keeps up).
fn watchdog(capture: libc::id_t, fd: RawFd, w: &Watched) {
    let param = libc::sched_param {
        sched_priority: REALTIME_PRIORITY,
    };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is the
    // calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) } != 0 {
        let _ = set_nice(HIGH_NICE);
    }
    // The round count when the ring was first seen holding packets, and when.
    let mut waiting: Option<(u64, Instant)> = None;
    // The round count at the last look.
    let mut looked = w.rounds.load(Ordering::Relaxed);
    while !w.stop.load(Ordering::Relaxed) {
        std::thread::sleep(WATCH_EVERY);
        if w.stop.load(Ordering::Relaxed) {
            return;
        }
        let rounds = w.rounds.load(Ordering::Relaxed);
        let ran = rounds != looked;
        looked = rounds;
        if !readable(fd) {
            waiting = None;
            // Nothing waiting: nothing can stall until something comes. While the capture
            // keeps finishing rounds the ring fills again within a block: the next look comes
            // on the timer. Waiting in poll(2) there woke the watchdog at every block as well
            // (95 wakeups a second at 10 ms blocks, issue 20); only a capture that finished no
            // round since the last look is idle enough for it.
            if !ran {
                sleep_until_readable(fd, w.wake.as_raw_fd());
                looked = w.rounds.load(Ordering::Relaxed);
            }
            continue;
        }
        if w.raised.load(Ordering::Relaxed) != 0 {
            waiting = None;
            continue;
        }
        let since = match waiting {
            Some((r, since)) if r == rounds => since,
            _ => {
                waiting = Some((rounds, Instant::now()));
                continue;
            }
        };
        let stalled = since.elapsed();
        if stalled < STALL {
            continue;
        }
        waiting = None;
        if set_nice_of(capture, HIGH_NICE).is_err() {
            // No permission, and none comes later (capabilities are only ever dropped): the
            // capture's own attempt says so, once, when it runs; nothing left to watch for.
            return;
        }
        let realtime = matches!(
            raise_session_group(HIGH_NICE),
            Group::Shared | Group::Failed
        ) && set_realtime_of(capture).is_ok();
        w.raised
            .store(if realtime { 2 } else { 1 }, Ordering::Relaxed);
        tracing::info!(
            "the capture held packets for {} ms without running: raised to {} by its watchdog \
             until it keeps up for {} s",
            stalled.as_millis() + WATCH_EVERY.as_millis(),
            if realtime {
                format!("SCHED_RR priority {REALTIME_PRIORITY}")
            } else {
                format!("nice {HIGH_NICE}")
            },
            AUTO_LOWER_AFTER.as_secs()
        );
    }
}

/// Sleeps until `fd` or `wake` is readable (or a signal).
fn sleep_until_readable(fd: RawFd, wake: RawFd) {
    let mut p = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds, for the duration of the call.
    unsafe {
        libc::poll(p.as_mut_ptr(), 2, -1);
    }
}

/// Whether `fd` has something to read now.
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

fn set_nice_of(thread: libc::id_t, nice: i32) -> io::Result<()> {
    // SAFETY: plain system call naming a thread of this process.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, thread, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_realtime_of(thread: libc::id_t) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: REALTIME_PRIORITY,
    };
    let pid =
        libc::pid_t::try_from(thread).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `param` is a valid sched_param for the duration of the call; `pid` names a
    // thread of this process.
    if unsafe { libc::sched_setscheduler(pid, libc::SCHED_RR, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes sure this process may later lower its nice value to `nice` without a capability:
/// `RLIMIT_NICE` (which also covers its session's autogroup). Raising the hard limit needs
/// CAP_SYS_RESOURCE, which a daemon has only until it drops its capabilities.
fn allow_nice(nice: i32) -> io::Result<()> {
    allow_at_least(
        libc::RLIMIT_NICE,
        libc::rlim_t::try_from(20 - nice).unwrap_or(40),
    )
}

/// Makes sure this process may later take SCHED_RR at `priority` without a capability
/// (`RLIMIT_RTPRIO`), as [`allow_nice`] does for nice values.
fn allow_rtprio(priority: i32) -> io::Result<()> {
    allow_at_least(
        libc::RLIMIT_RTPRIO,
        libc::rlim_t::try_from(priority).unwrap_or(1),
    )
}

/// Raises the soft (and if needed the hard) limit `resource` to at least `want`.
fn allow_at_least(resource: libc::__rlimit_resource_t, want: libc::rlim_t) -> io::Result<()> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `cur` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(resource, &mut cur) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if cur.rlim_cur >= want {
        return Ok(());
    }
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: cur.rlim_max.max(want),
    };
    // SAFETY: `new` is a valid rlimit.
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// After [`raise`] with `Auto`: whether raising later needs CAP_SYS_NICE kept, because
/// `RLIMIT_NICE` could not be set to allow it.
pub fn raise_needs_capability() -> bool {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `cur` is a valid rlimit to fill.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut cur) } == 0;
    !(ok && cur.rlim_cur >= libc::rlim_t::try_from(20 - HIGH_NICE).unwrap_or(40))
}

fn has_cap_sys_nice() -> bool {
    // The effective set, from our own status: no capget(2) plumbing for one bit.
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|eff| eff & (1 << crate::privs::CAP_SYS_NICE) != 0)
}

/// Whether autogroup scheduling is on and this process leads its session (so its session's
/// group is its own).
fn lead_session_group() -> bool {
    // SAFETY: plain system calls on our own process.
    let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
    sid == pid && autogroup_enabled()
}

fn autogroup_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|v| v.trim() == "1")
}

/// Gives the session's autogroup the nice value `nice` if this process leads the session.
fn raise_session_group(nice: i32) -> Group {
    if !autogroup_enabled() {
        return Group::NotGrouped;
    }
    // SAFETY: plain system calls on our own process.
    let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
    if sid != pid {
        return Group::Shared;
    }
    match std::fs::write("/proc/self/autogroup", nice.to_string()) {
        Ok(()) => Group::Raised,
        Err(_) => Group::Failed,
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
                assert!(
                    matches!(
                        r,
                        Raised::Nice {
                            nice: HIGH_NICE,
                            ..
                        }
                    ),
                    "{r:?}"
                );
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
    fn on_demand_raises_only_when_behind_and_lowers_after_keeping_up() {
        let got = in_thread(|| {
            let before = current_nice().unwrap();
            let mut p = OnDemand::new();
            let t0 = Instant::now();
            p.observe(Duration::from_millis(50), t0);
            let calm = (p.is_raised(), current_nice().unwrap());
            p.observe(Duration::from_millis(150), t0);
            let behind = (p.is_raised(), current_nice().unwrap());
            let rr = (p.is_realtime(), current_policy().unwrap());
            p.observe(Duration::from_millis(5), t0);
            p.observe(Duration::from_millis(5), t0 + AUTO_LOWER_AFTER);
            (
                before,
                calm,
                behind,
                rr,
                p.is_raised(),
                (current_nice().unwrap(), current_policy().unwrap()),
                p.raises(),
            )
        });
        let (before, calm, behind, rr, still, after, raises) = got;
        assert_eq!(calm, (false, before));
        if behind.0 {
            assert_eq!(behind.1, HIGH_NICE);
            // The test harness shares its session: with autogroup on, SCHED_RR as well.
            let shared = autogroup_enabled() && !lead_session_group();
            assert_eq!(rr.0, shared);
            assert_eq!(rr.1 == libc::SCHED_RR, shared);
            assert_eq!(raises, 1);
            assert!(!still, "lowered after keeping up");
            assert_eq!(after, (before, libc::SCHED_OTHER));
        } else {
            // Not root, no CAP_SYS_NICE: it gives up once and stays as it was.
            assert_eq!((behind.1, raises, after.0), (before, 0, before));
        }
    }

    /// The watchdog tests look at their watchdog thread by name: one at a time.
    static ONE_WATCHDOG: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Context switches of this process's thread named `name`.
    fn switches_of(name: &str) -> Option<u64> {
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            return Some(
                status
                    .lines()
                    .filter(|l| l.contains("voluntary_ctxt_switches"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum(),
            );
        }
        None
    }

    #[test]
    fn an_idle_watchdog_sleeps() {
        let _one = ONE_WATCHDOG.lock().unwrap_or_else(|e| e.into_inner());
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [read, write] = fds;
        let mut p = OnDemand::new();
        p.watch(read).unwrap();
        // Its first look, then asleep in poll(2) with nothing to read.
        std::thread::sleep(WATCH_EVERY * 3);
        let a = switches_of("capture-watch").expect("the watchdog thread");
        std::thread::sleep(WATCH_EVERY * 10);
        let b = switches_of("capture-watch").expect("the watchdog thread");
        assert!(
            b - a <= 1,
            "{} wakeups in {:?} idle",
            b - a,
            WATCH_EVERY * 10
        );
        // And it still stops promptly.
        drop(p);
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(read);
            libc::close(write);
        }
    }

    #[test]
    fn the_watchdog_raises_a_capture_that_does_not_run_with_packets_waiting() {
        let _one = ONE_WATCHDOG.lock().unwrap_or_else(|e| e.into_inner());
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [read, write] = fds;
        let got = in_thread(move || {
            let before = current_nice().unwrap();
            let mut p = OnDemand::new();
            p.watch(read).unwrap();
            // Nothing to read: a capture asleep in poll(2) is not starved.
            std::thread::sleep(STALL * 3);
            p.observe(Duration::ZERO, Instant::now());
            let idle = (p.is_raised(), current_nice().unwrap());
            // Packets waiting, and this thread "gets no CPU": it finishes no round.
            // SAFETY: one byte from a valid buffer.
            assert_eq!(unsafe { libc::write(write, [1u8].as_ptr().cast(), 1) }, 1);
            // Waited for, with a bound (the watchdog runs every WATCH_EVERY).
            let deadline = Instant::now() + Duration::from_secs(5);
            // The watchdog raises the thread, then its group, then says so in `raised`: wait
            // for the word, not only the nice value (a loaded machine may preempt it between).
            let said = |p: &OnDemand| {
                p.watchdog
                    .as_ref()
                    .is_some_and(|w| w.watched.raised.load(Ordering::Relaxed) != 0)
            };
            while (current_nice().unwrap() != HIGH_NICE || !said(&p)) && Instant::now() < deadline {
                std::thread::sleep(WATCH_EVERY);
            }
            let stalled = current_nice().unwrap();
            let t0 = Instant::now();
            p.observe(Duration::ZERO, t0);
            let seen = (p.is_raised(), p.raises());
            p.observe(Duration::ZERO, t0 + AUTO_LOWER_AFTER);
            let after = (
                p.is_raised(),
                current_nice().unwrap(),
                current_policy().unwrap(),
            );
            drop(p);
            (before, idle, stalled, seen, after)
        });
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(read);
            libc::close(write);
        }
        let (before, idle, stalled, seen, after) = got;
        assert_eq!(idle, (false, before), "nothing waiting, nothing raised");
        if stalled == before {
            // Not root, no CAP_SYS_NICE: nothing could be raised.
            assert_eq!(seen, (false, 0));
            return;
        }
        assert_eq!(stalled, HIGH_NICE, "raised by the watchdog");
        assert_eq!(seen, (true, 1), "the capture learns it was raised");
        assert_eq!(
            after,
            (false, before, libc::SCHED_OTHER),
            "and lowers itself later"
        );
    }

    #[test]
    fn descriptions_name_the_setting() {
        let nice = |group| Raised::Nice { nice: -20, group }.describe();
        assert_eq!(nice(Group::NotGrouped), "nice -20");
        assert_eq!(nice(Group::Raised), "nice -20, its session's CPU group too");
        assert!(nice(Group::Shared).contains("run it as a service or under setsid"));
        assert!(Raised::OnDemand { nice: 0 }
            .describe()
            .contains("raised to nice -20 while the capture is over 100 ms behind"));
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
