//! Socket options, for the sockets the daemons open themselves (the packet capture,
//! intercept's netlink queue, the control channel's keepalive). Thin `setsockopt`/`getsockopt`
//! wrappers; nothing here keeps state.

use std::io;
use std::os::fd::RawFd;

pub fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: `v` lives across the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `got` and `len` live across the call; `len` holds `got`'s size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            std::ptr::from_mut(&mut got).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(got)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks for a receive buffer of `ask` bytes (the kernel doubles it for its bookkeeping);
/// beyond `net.core.rmem_max` only CAP_NET_ADMIN gets it, so FORCE is tried first. Returns
/// what the kernel granted (`SO_RCVBUF`, doubled).
pub fn set_receive_buffer(fd: RawFd, ask: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(ask).unwrap_or(libc::c_int::MAX / 2);
    if set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, want).is_err() {
        set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    }
    Ok(get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?.max(0) as usize)
}

/// TCP keepalive on `stream` as `k` says: the kernel probes a silent peer and fails the
/// socket's next read when it is gone, with no thread of ours awake meanwhile.
pub fn set_keepalive(
    stream: &std::net::TcpStream,
    k: common::control::IdleKeepalive,
) -> io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(k.idle)
        .with_interval(k.interval)
        .with_retries(k.probes);
    socket2::SockRef::from(stream).set_tcp_keepalive(&ka)
}
