//! SIGINT/SIGTERM turn into a flag the engine loop polls, and make an eventfd readable that
//! the loop sleeps on ([`stop_fd`]): whichever thread the kernel hands the signal to, the loop
//! wakes at once, so it need not wake on a timer to look (an idle copier sleeps). The loop then
//! drains and prints its summary. The handler only stores to an atomic and restores the default
//! disposition (both async-signal-safe: `signal(2)` is on POSIX's list), so a second Ctrl-C or
//! SIGTERM during the drain kills the process at once.
//!
//! SIGUSR1 asks for the comparison report to be written now (`--report`): a flag, and an
//! eventfd of its own ([`report_fd`]) that wakes the loop, so that an idle copier need not wake
//! on a timer to look for it either (issue 20).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// Written by the stop handler; -1 until [`install`] made it. Never closed: a handler may run
/// at any moment of the process's life.
static STOP_FD: AtomicI32 = AtomicI32::new(-1);
static REPORT: AtomicBool = AtomicBool::new(false);
/// Written by the report handler, drained by [`take_report_request`]; -1 until [`install`].
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_report_signal(_: libc::c_int) {
    // The eventfd first: a loop that sees the flag drains the eventfd, and one that does not
    // yet see it finds the eventfd readable and looks again (see `take_report_request`).
    wake(&REPORT_FD);
    REPORT.store(true, Ordering::SeqCst);
}

/// Makes an eventfd readable. Async-signal-safe.
fn wake(fd: &AtomicI32) {
    let fd = fd.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; eight bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(fd, std::ptr::from_ref(&one).cast(), 8);
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    wake(&STOP_FD);
    // SAFETY: signal(2) is async-signal-safe; SIG_DFL makes the next such signal terminate.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

pub fn install() {
    for slot in [&STOP_FD, &REPORT_FD] {
        if slot.load(Ordering::SeqCst) < 0 {
            // SAFETY: plain system call; a failure leaves -1 (the loop then looks on its
            // timer).
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            slot.store(fd.max(-1), Ordering::SeqCst);
        }
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler is an extern "C" fn that only touches an atomic and calls
        // signal(2), both async-signal-safe. SA_RESTART is not
        // set so a blocking poll(2) returns EINTR and the loop notices the flag at once.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    // SAFETY: as above; this handler only stores to an atomic and stays installed (a second
    // SIGUSR1 asks again instead of killing the process, SIGUSR1's default).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_report_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
}

/// Whether SIGUSR1 arrived since the last call; empties [`report_fd`] when it did. Called at
/// every turn of the copier's loop: without a signal it makes no system call.
pub fn take_report_request() -> bool {
    if !REPORT.swap(false, Ordering::SeqCst) {
        // A handler that has written the eventfd but not yet set the flag leaves the eventfd
        // readable: the loop wakes again and comes back here.
        return false;
    }
    let fd = REPORT_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let mut n: u64 = 0;
        // SAFETY: a nonblocking read of eight bytes into a live u64 from our eventfd; one
        // read empties its counter (EAGAIN when it was empty: a second signal's write came
        // after this read's, and its flag makes the next call read again).
        unsafe {
            libc::read(fd, std::ptr::from_mut(&mut n).cast(), 8);
        }
    }
    true
}

/// The eventfd SIGUSR1 makes readable until [`take_report_request`] is called. Only a loop
/// that calls it may sleep on it. `None` before [`install`] or if it could not be made.
pub fn report_fd() -> Option<RawFd> {
    let fd = REPORT_FD.load(Ordering::SeqCst);
    (fd >= 0).then_some(fd)
}

/// The eventfd a stop signal makes readable (and leaves readable: a loop that has seen the
/// stop must not sleep on it any more). `None` before [`install`] or if it could not be made.
pub fn stop_fd() -> Option<RawFd> {
    let fd = STOP_FD.load(Ordering::SeqCst);
    (fd >= 0).then_some(fd)
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one initialised pollfd, valid for the call; no wait.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    /// The loop calls `take_report_request` at every turn and sleeps on `report_fd`: a
    /// SIGUSR1 must be taken exactly once, and leave nothing readable behind to spin on.
    #[test]
    fn a_report_signal_is_taken_once_and_leaves_nothing_to_wake_on() {
        install();
        let fd = report_fd().expect("an eventfd for SIGUSR1");
        assert!(!take_report_request());
        // SAFETY: raise(3) runs the installed handler on this thread before it returns.
        unsafe {
            libc::raise(libc::SIGUSR1);
        }
        assert!(readable(fd));
        assert!(take_report_request());
        assert!(!readable(fd));
        assert!(!take_report_request());
    }
}
