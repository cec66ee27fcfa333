//! SIGINT/SIGTERM turn into a flag the engine loop polls; the loop then drains and prints its
//! summary. The handler only stores to an atomic and restores the default disposition (both
//! async-signal-safe: `signal(2)` is on POSIX's list), so a second Ctrl-C or SIGTERM during the
//! drain kills the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

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
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
