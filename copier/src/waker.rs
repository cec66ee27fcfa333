//! Wakes the engine thread from other threads (the control channel) while it sleeps in poll(2)
//! on the capture descriptor. An eventfd coalesces many wakes into one readable event.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Waker {
    fd: Arc<OwnedFd>,
}

impl Waker {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; we check its result.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        Ok(Self {
            fd: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }),
        })
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN)
        // already means "awake", so the result is deliberately ignored.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Clears pending wakes.
    pub fn reset(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes. EINTR (a signal) returns early,
/// which is what the caller wants: it re-checks its shutdown flag.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) {
    const NONE: libc::pollfd = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    // On the stack for the usual few; a copier with many intercepts polls their sockets too.
    let mut few = [NONE; 8];
    let mut many = Vec::new();
    let pfds = if fds.len() <= few.len() {
        &mut few[..fds.len()]
    } else {
        many.resize(fds.len(), NONE);
        &mut many[..]
    };
    for (p, fd) in pfds.iter_mut().zip(fds) {
        p.fd = *fd;
        p.events = libc::POLLIN;
    }
    let n = pfds.len();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // A sub-millisecond deadline must not become a busy loop of zero-timeout polls... but must
    // not oversleep either: round up to 1 ms.
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    // SAFETY: pfds is n initialised pollfd entries.
    unsafe {
        libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms);
    }
}
