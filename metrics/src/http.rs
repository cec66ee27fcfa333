//! A tiny blocking HTTP/1.x responder: one thread, one connection at a time, one answer per
//! connection. Prometheus scrapes every few seconds; nothing here needs more, and an HTTP
//! framework would cost more than the whole daemon's control plane.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head read; a scrape sends a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;
/// Longest a connection may take to send its request, in total (a client trickling bytes
/// must not hold the only responder thread).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Per-read and per-write timeout.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The latest exposition, shared between the daemon's loop (writer) and the responder
/// (reader). Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct Published(Arc<Mutex<Arc<String>>>);

impl Published {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the text served. The lock is held for a pointer swap only.
    pub fn set(&self, text: String) {
        let text = Arc::new(text);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    /// The text served now.
    pub fn get(&self) -> Arc<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The running responder. Dropping it stops the thread (it is woken with a connection to
/// itself).
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The address actually bound (the port, when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `addr` and serves `GET /metrics` from `published` on a thread named `thread_name`.
/// Binding errors are returned (a taken port is a startup mistake the user must see).
pub fn serve(
    addr: SocketAddr,
    published: Published,
    thread_name: &str,
) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let mut local = listener.local_addr()?;
    if local.ip().is_unspecified() {
        // To wake ourselves on drop.
        local.set_ip(match local {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name(thread_name.into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                // Accept errors (EMFILE, ECONNABORTED) are transient: keep serving.
                if let Ok(stream) = conn {
                    let _ = answer(stream, &published);
                }
            }
        })?;
    Ok(MetricsServer {
        addr: local,
        stop,
        thread: Some(thread),
    })
}

/// Reads one request head and writes one response, then the connection is dropped (closed).
fn answer(mut stream: TcpStream, published: &Published) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let started = Instant::now();
    let mut buf = [0u8; MAX_REQUEST];
    let mut len = 0;
    let head_end = loop {
        if let Some(end) = find_head_end(&buf[..len]) {
            break end;
        }
        if len == buf.len() {
            return respond(&mut stream, "431 Request Header Fields Too Large", "", b"");
        }
        if started.elapsed() > REQUEST_DEADLINE {
            return respond(&mut stream, "408 Request Timeout", "", b"");
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => return Ok(()),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let text = published.get();
            let body = if method == "HEAD" {
                b"" as &[u8]
            } else {
                text.as_bytes()
            };
            respond_len(
                &mut stream,
                "200 OK",
                "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
                body,
                text.len(),
            )
        }
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "",
            b"not found: try /metrics\n",
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            b"",
        ),
    }
}

fn find_head_end(b: &[u8]) -> Option<usize> {
    b.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .or_else(|| b.windows(2).position(|w| w == b"\n\n").map(|p| p + 2))
}

fn respond(stream: &mut TcpStream, status: &str, headers: &str, body: &[u8]) -> io::Result<()> {
    respond_len(stream, status, headers, body, body.len())
}

fn respond_len(
    stream: &mut TcpStream,
    status: &str,
    headers: &str,
    body: &[u8],
    content_length: usize,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {content_length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let published = Published::new();
        published.set("a_total 1\n".into());
        let server = serve("127.0.0.1:0".parse().unwrap(), published.clone(), "t").unwrap();
        let addr = server.local_addr();
        let ok = request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(ok.ends_with("\r\n\r\na_total 1\n"), "{ok}");
        published.set("a_total 2\n".into());
        let ok = request(addr, b"GET /metrics?x=1 HTTP/1.0\n\n");
        assert!(ok.ends_with("a_total 2\n"), "{ok}");
        let head = request(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.contains("Content-Length: 10\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(request(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(request(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let big = vec![b'a'; MAX_REQUEST + 10];
        let r = request(addr, &big);
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 431"), "{r}");
        // Garbage and an early close do not stop the responder.
        let _ = request(addr, b"\x00\xff\r\n\r\n");
        drop(TcpStream::connect(addr).unwrap());
        assert!(request(addr, b"GET /metrics HTTP/1.1\r\n\r\n").contains("a_total 2"));
        drop(server);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err());
    }

    #[test]
    fn a_taken_port_is_an_error() {
        let server = serve("127.0.0.1:0".parse().unwrap(), Published::new(), "t").unwrap();
        assert!(serve(server.local_addr(), Published::new(), "t").is_err());
    }
}
