//! SIGINT/SIGTERM turn into a flag the engine loop polls, and make an eventfd readable that
//! the loop sleeps on ([`stop_fd`]): whichever thread the kernel hands the signal to, the loop
//! wakes at once, so it need not wake on a timer to look (an idle copier sleeps). The loop then
//! drains and prints its summary. SIGUSR1 asks for the comparison report to be written now (`--report`). The handler only stores to an atomic and restores the default disposition (both
//! async-signal-safe: `signal(2)` is on POSIX's list), so a second Ctrl-C or SIGTERM during the
//! drain kills the process at once.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// Written by the stop handler; -1 until [`install`] made it. Never closed: a handler may run
/// at any moment of the process's life.
static STOP_FD: AtomicI32 = AtomicI32::new(-1);
static REPORT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_report_signal(_: libc::c_int) {
    REPORT.store(true, Ordering::SeqCst);
}

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    let fd = STOP_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; eight bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(fd, std::ptr::from_ref(&one).cast(), 8);
        }
    }
    // SAFETY: signal(2) is async-signal-safe; SIG_DFL makes the next such signal terminate.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

pub fn install() {
    if STOP_FD.load(Ordering::SeqCst) < 0 {
        // SAFETY: plain system call; a failure leaves -1 (the loop then looks on its timer).
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        STOP_FD.store(fd.max(-1), Ordering::SeqCst);
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

/// Whether SIGUSR1 arrived since the last call.
pub fn take_report_request() -> bool {
    REPORT.swap(false, Ordering::SeqCst)
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
