//! One send or receive on a stream socket that does not wait, whatever the socket's mode.
//!
//! `MSG_DONTWAIT` makes the one call non-blocking without touching `O_NONBLOCK`, which every
//! descriptor of the socket shares (a `try_clone` is a `dup`): another thread's blocking writes
//! with their write timeout keep blocking. Retried on `EINTR`; nothing here keeps state.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// The bytes the socket took: 0 when its send buffer is full.
pub fn send_now(stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    retried(|| {
        // SAFETY: `bytes` is a valid buffer of its length for the call's duration, and the fd
        // is the open socket `stream` owns.
        unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        }
    })
    .map(|n| n.unwrap_or(0))
}

/// The bytes read into `buf`: `None` when nothing is waiting, `Some(0)` at the end of the
/// stream.
pub fn recv_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    retried(|| {
        // SAFETY: `buf` is a valid, writable buffer of its length for the call's duration, and
        // the fd is the open socket `stream` owns.
        unsafe {
            libc::recv(
                stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        }
    })
}

/// `call`'s byte count, `None` for `EAGAIN`, again after `EINTR`.
fn retried(mut call: impl FnMut() -> isize) -> io::Result<Option<usize>> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{Shutdown, TcpListener};

    #[test]
    fn a_receive_says_nothing_waiting_then_the_bytes_then_the_end() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(recv_now(&a, &mut buf).unwrap(), None);
        b.write_all(b"abc").unwrap();
        assert_eq!(first_answer(&a, &mut buf), Some(3));
        assert_eq!(&buf[..3], b"abc");
        b.shutdown(Shutdown::Write).unwrap();
        assert_eq!(first_answer(&a, &mut buf), Some(0));
    }

    /// The first receive that does not say "nothing waiting", within a second.
    fn first_answer(a: &TcpStream, buf: &mut [u8]) -> Option<usize> {
        for _ in 0..1000 {
            if let Some(n) = recv_now(a, buf).unwrap() {
                return Some(n);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn a_send_to_a_full_socket_takes_nothing_and_the_socket_stays_blocking() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_b, _) = l.accept().unwrap();
        let chunk = vec![0u8; 64 << 10];
        let mut total = 0usize;
        // Nobody reads: both buffers fill, and then the send takes nothing.
        loop {
            let n = send_now(&a, &chunk).unwrap();
            if n == 0 {
                break;
            }
            total += n;
            assert!(total < 1 << 30, "the socket never filled");
        }
        assert!(total > 0);
        // SAFETY: F_GETFL on an open fd.
        let flags = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
    }
}
