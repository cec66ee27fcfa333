//! SIGINT/SIGTERM become a flag the capture loop polls, so it can flush and print its summary.
//! The handler only stores to an atomic (async-signal-safe). It is installed with SA_RESETHAND:
//! a second Ctrl-C kills at once if the shutdown ever hangs.

use std::sync::atomic::{AtomicBool, Ordering};

pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler is an extern "C" fn that only touches an atomic. SA_RESTART is not
        // set, so a blocking poll(2) returns EINTR and the loop sees the flag at once.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
