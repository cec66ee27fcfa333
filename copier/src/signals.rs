//! SIGINT/SIGTERM turn into a flag the engine loop polls; the loop then drains and prints its
//! summary. SIGUSR1 asks for the comparison report to be written now (`--report`). The handler only stores to an atomic and restores the default disposition (both
//! async-signal-safe: `signal(2)` is on POSIX's list), so a second Ctrl-C or SIGTERM during the
//! drain kills the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static REPORT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_report_signal(_: libc::c_int) {
    REPORT.store(true, Ordering::SeqCst);
}

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: signal(2) is async-signal-safe; SIG_DFL makes the next such signal terminate.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

pub fn install() {
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

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
