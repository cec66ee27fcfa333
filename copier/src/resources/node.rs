//! A test host's node_exporter: one HTTP/1.1 GET of its `/metrics` page ([`fetch`]) and the
//! few series of the Prometheus text format the report uses ([`parse`]).
//!
//! Both are bounded and never panic: the page comes over the network from a host we do not
//! control. The client is std `TcpStream` with timeouts, `Connection: close`, a size cap
//! ([`MAX_BODY`]), Content-Length or chunked bodies; the parser looks at a line only if it
//! starts with a name it wants, and skips what it cannot read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::MetricsUrl;

/// Largest page read: node_exporter's is 100-300 KB with every collector; 4 MiB leaves room
/// for a host with many CPUs, disks and interfaces without letting a broken server fill us.
pub const MAX_BODY: usize = 4 << 20;
/// Longest connect, and longest wait for any read: the sampler scrapes every second.
pub const TIMEOUT: Duration = Duration::from_millis(500);
/// Longest a whole scrape may take (a server trickling bytes under the read timeout).
pub const DEADLINE: Duration = Duration::from_millis(900);

/// Fetches `url`'s body.
pub fn fetch(url: &MetricsUrl) -> Result<Vec<u8>, String> {
    let addr = resolve(url)?;
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tcpshadow-copier\r\nAccept: text/plain\r\n\
         Connection: close\r\n\r\n",
        url.path,
        url.host_header()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::with_capacity(256 << 10);
    let mut buf = [0u8; 64 << 10];
    loop {
        if started.elapsed() > DEADLINE {
            return Err("scrape took longer than its deadline".into());
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Headers plus the body: allow a little over the body cap.
                if raw.len() + n > MAX_BODY + (64 << 10) {
                    return Err(format!("page larger than {} MiB", MAX_BODY >> 20));
                }
                raw.extend_from_slice(&buf[..n]);
                // A server that keeps the connection open despite `Connection: close`: stop
                // once the announced body is complete.
                if let Ok(Some(_)) = complete(&raw, false) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    match complete(&raw, true)? {
        Some(body) => Ok(body),
        None => Err("connection closed before the end of the page".into()),
    }
}

fn resolve(url: &MetricsUrl) -> Result<SocketAddr, String> {
    (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("{} has no IPv4 address", url.host))
}

/// The body of a complete response in `raw`; `Ok(None)` while more bytes are needed. `eof`:
/// the server closed, which ends a body that has neither a length nor chunks.
pub fn complete(raw: &[u8], eof: bool) -> Result<Option<Vec<u8>>, String> {
    let Some(end) = find(raw, b"\r\n\r\n") else {
        if raw.len() > 64 << 10 {
            return Err("response headers longer than 64 KiB".into());
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "headers are not text")?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status.split(' ').nth(1).unwrap_or_default();
    if !status.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 response: {:?}", cut(status)));
    }
    if code != "200" {
        return Err(format!("HTTP status {:?}", cut(status)));
    }
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            let n: usize = v.parse().map_err(|_| "bad Content-Length")?;
            if n > MAX_BODY {
                return Err(format!("page larger than {} MiB", MAX_BODY >> 20));
            }
            length = Some(n);
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.to_ascii_lowercase().contains("chunked");
        } else if k.eq_ignore_ascii_case("content-encoding") && !v.eq_ignore_ascii_case("identity")
        {
            // We never ask for compression; a server sending it anyway is not readable.
            return Err(format!("unrequested Content-Encoding {:?}", cut(v)));
        }
    }
    if chunked {
        return dechunk(body);
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some(body[..n].to_vec())),
        Some(_) => Ok(None),
        None if eof => Ok(Some(body.to_vec())),
        None => Ok(None),
    }
}

/// A chunked body; `Ok(None)` until its last chunk has arrived.
fn dechunk(mut b: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = find(b, b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&b[..eol]).map_err(|_| "bad chunk size")?;
        let hex = line.split(';').next().unwrap_or_default().trim();
        let n = usize::from_str_radix(hex, 16).map_err(|_| "bad chunk size")?;
        if n > MAX_BODY || out.len() + n > MAX_BODY {
            return Err(format!("page larger than {} MiB", MAX_BODY >> 20));
        }
        b = &b[eol + 2..];
        if n == 0 {
            return Ok(Some(out));
        }
        if b.len() < n + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&b[..n]);
        if &b[n..n + 2] != b"\r\n" {
            return Err("chunk without its CRLF".into());
        }
        b = &b[n + 2..];
    }
}

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}

/// What one scrape says about its host. Counters as read (not yet differences).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSample {
    /// `node_cpu_seconds_total` summed over CPUs, by mode, in [`MODES`] order; `None` when
    /// the page had no such series.
    pub cpu: Option<[f64; 8]>,
    /// CPUs seen (distinct `cpu` labels, capped).
    pub cpus: u32,
    pub context_switches: Option<f64>,
    pub interrupts: Option<f64>,
    pub procs_running: Option<f64>,
    pub procs_blocked: Option<f64>,
    pub load1: Option<f64>,
    pub mem_total: Option<f64>,
    pub mem_available: Option<f64>,
}

/// node_exporter's CPU modes, in the order of [`NodeSample::cpu`].
pub const MODES: [&str; 8] = [
    "user", "nice", "system", "iowait", "irq", "softirq", "steal", "idle",
];

/// CPU labels remembered to count CPUs; a bigger page still sums every line.
const MAX_CPUS: usize = 4096;

/// Reads the series the report uses from a text exposition page. Unknown series, comments,
/// bad lines and non-finite values are skipped; never fails.
pub fn parse(page: &[u8]) -> NodeSample {
    let text = String::from_utf8_lossy(page);
    let mut s = NodeSample::default();
    let mut cpu = [0f64; 8];
    let mut cpu_seen = false;
    let mut cpus: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        if !line.starts_with("node_") {
            continue;
        }
        let Some((name, labels, value)) = split_sample(line) else {
            continue;
        };
        match name {
            "node_cpu_seconds_total" => {
                let Some(mode) = label(labels, "mode") else {
                    continue;
                };
                let Some(i) = MODES.iter().position(|m| *m == mode) else {
                    // guest and guest_nice are already in user and nice.
                    continue;
                };
                cpu[i] += value;
                cpu_seen = true;
                if let Some(c) = label(labels, "cpu") {
                    if cpus.len() < MAX_CPUS && !cpus.iter().any(|x| x == c) {
                        cpus.push(c.to_string());
                    }
                }
            }
            "node_context_switches_total" => s.context_switches = Some(value),
            "node_intr_total" => s.interrupts = Some(value),
            "node_procs_running" => s.procs_running = Some(value),
            "node_procs_blocked" => s.procs_blocked = Some(value),
            "node_load1" => s.load1 = Some(value),
            "node_memory_MemTotal_bytes" => s.mem_total = Some(value),
            "node_memory_MemAvailable_bytes" => s.mem_available = Some(value),
            _ => {}
        }
    }
    if cpu_seen && cpu.iter().all(|v| v.is_finite()) {
        s.cpu = Some(cpu);
    }
    s.cpus = cpus.len() as u32;
    s
}

/// `name{labels} value [timestamp]` -> (name, labels without braces, value).
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = "";
    if let Some(r) = rest.strip_prefix('{') {
        let close = closing_brace(r)?;
        labels = &r[..close];
        rest = &r[close + 1..];
    }
    let value = rest.split_ascii_whitespace().next()?;
    let v: f64 = value.parse().ok()?;
    v.is_finite().then_some((name, labels, v))
}

/// The `}` ending a label set, skipping those inside quoted values.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` (the label values we read carry no escapes: `cpu="3"`,
/// `mode="user"`; one that does is simply not matched).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        let rest_t = rest.trim_start_matches([',', ' ']);
        if rest_t.is_empty() {
            return None;
        }
        let (k, after) = rest_t.split_once('=')?;
        let after = after.strip_prefix('"')?;
        let end = after.find('"')?;
        if k.trim() == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a node_exporter 1.5 page the parser reads, with their neighbours
    /// (HELP/TYPE, guest modes, other collectors) as they come.
    pub const PAGE: &str = r#"# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.1e-05
# HELP node_context_switches_total Total number of context switches.
# TYPE node_context_switches_total counter
node_context_switches_total 1.234567891e+09
# HELP node_cpu_guest_seconds_total Seconds the CPUs spent in guests (VMs) for each mode.
# TYPE node_cpu_guest_seconds_total counter
node_cpu_guest_seconds_total{cpu="0",mode="nice"} 0
node_cpu_guest_seconds_total{cpu="0",mode="user"} 0
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 152087.45
node_cpu_seconds_total{cpu="0",mode="iowait"} 120.5
node_cpu_seconds_total{cpu="0",mode="irq"} 0
node_cpu_seconds_total{cpu="0",mode="nice"} 12.25
node_cpu_seconds_total{cpu="0",mode="softirq"} 310.75
node_cpu_seconds_total{cpu="0",mode="steal"} 4.5
node_cpu_seconds_total{cpu="0",mode="system"} 2201.5
node_cpu_seconds_total{cpu="0",mode="user"} 8100.25
node_cpu_seconds_total{cpu="1",mode="idle"} 151990.55
node_cpu_seconds_total{cpu="1",mode="iowait"} 99.5
node_cpu_seconds_total{cpu="1",mode="irq"} 0
node_cpu_seconds_total{cpu="1",mode="nice"} 7.75
node_cpu_seconds_total{cpu="1",mode="softirq"} 250.25
node_cpu_seconds_total{cpu="1",mode="steal"} 3.5
node_cpu_seconds_total{cpu="1",mode="system"} 2298.5
node_cpu_seconds_total{cpu="1",mode="user"} 7999.75
# HELP node_intr_total Total number of interrupts serviced.
# TYPE node_intr_total counter
node_intr_total 5.87654321e+08
# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 1.37
# HELP node_memory_MemAvailable_bytes Memory information field MemAvailable_bytes.
# TYPE node_memory_MemAvailable_bytes gauge
node_memory_MemAvailable_bytes 6.442450944e+09
# HELP node_memory_MemTotal_bytes Memory information field MemTotal_bytes.
# TYPE node_memory_MemTotal_bytes gauge
node_memory_MemTotal_bytes 8.33007616e+09
# HELP node_procs_blocked Number of processes blocked waiting for I/O to complete.
# TYPE node_procs_blocked gauge
node_procs_blocked 1
# HELP node_procs_running Number of processes in runnable state.
# TYPE node_procs_running gauge
node_procs_running 3
# HELP node_scrape_collector_success node_exporter: Whether a collector succeeded.
# TYPE node_scrape_collector_success gauge
node_scrape_collector_success{collector="cpu"} 1
"#;

    #[test]
    fn reads_a_node_exporter_page() {
        let s = parse(PAGE.as_bytes());
        let cpu = s.cpu.unwrap();
        assert_eq!(cpu[0], 8100.25 + 7999.75); // user
        assert_eq!(cpu[1], 12.25 + 7.75); // nice
        assert_eq!(cpu[2], 2201.5 + 2298.5); // system
        assert_eq!(cpu[7], 152087.45 + 151990.55); // idle
        assert_eq!(s.cpus, 2);
        assert_eq!(s.context_switches, Some(1_234_567_891.0));
        assert_eq!(s.interrupts, Some(587_654_321.0));
        assert_eq!((s.procs_running, s.procs_blocked), (Some(3.0), Some(1.0)));
        assert_eq!(s.load1, Some(1.37));
        assert_eq!(s.mem_total, Some(8_330_076_160.0));
        assert_eq!(s.mem_available, Some(6_442_450_944.0));
    }

    #[test]
    fn labels_in_any_order_with_timestamps_and_braces_in_values() {
        let page = "node_cpu_seconds_total{mode=\"user\",cpu=\"0\"} 5 1700000000000\n\
                    node_cpu_seconds_total{weird=\"a}b\",cpu=\"1\",mode=\"user\"} 6\n\
                    node_load1 NaN\nnode_procs_running +Inf\nnode_procs_blocked\n";
        let s = parse(page.as_bytes());
        assert_eq!(s.cpu.unwrap()[0], 11.0);
        assert_eq!(s.cpus, 2);
        assert_eq!(
            (s.load1, s.procs_running, s.procs_blocked),
            (None, None, None)
        );
    }

    #[test]
    fn a_page_without_the_series_is_all_missing() {
        let s = parse(b"# nothing\nfoo 1\n\xff\xfe garbage {{{\n");
        assert_eq!(s, NodeSample::default());
    }

    fn response(head: &str, body: &[u8]) -> Vec<u8> {
        let mut v = head.as_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn http_bodies_by_length_chunks_or_close() {
        let r = response(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            b"hello+junk",
        );
        assert_eq!(complete(&r, false).unwrap().unwrap(), b"hello");
        let r = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"3\r\nnod\r\n2;ext=1\r\ne_\r\n0\r\n\r\n",
        );
        assert_eq!(complete(&r, false).unwrap().unwrap(), b"node_");
        let partial = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"3\r\nno",
        );
        assert_eq!(complete(&partial, false).unwrap(), None);
        let r = response("HTTP/1.0 200 OK\r\n\r\n", b"until close");
        assert_eq!(complete(&r, false).unwrap(), None);
        assert_eq!(complete(&r, true).unwrap().unwrap(), b"until close");
        let r = response("HTTP/1.1 404 Not Found\r\n\r\n", b"");
        assert!(complete(&r, false).unwrap_err().contains("404"));
        let r = response(
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
            b"",
        );
        assert!(complete(&r, false).is_err());
        let r = response("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n", b"");
        assert!(complete(&r, false).is_err());
        let r = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"zz\r\n",
        );
        assert!(complete(&r, false).is_err());
    }

    #[test]
    fn fetches_from_a_local_server_in_pieces() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = [0u8; 1024];
            let n = c.read(&mut req).unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            let body = PAGE.as_bytes();
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
            c.write_all(head.as_bytes()).unwrap();
            for part in body.chunks(700) {
                c.write_all(format!("{:x}\r\n", part.len()).as_bytes())
                    .unwrap();
                c.write_all(part).unwrap();
                c.write_all(b"\r\n").unwrap();
            }
            c.write_all(b"0\r\n\r\n").unwrap();
            // Kept open: the client stops at the last chunk, not at the close.
            std::thread::sleep(Duration::from_millis(300));
            req
        });
        let url = MetricsUrl::parse(&format!("http://127.0.0.1:{port}/metrics")).unwrap();
        let body = fetch(&url).unwrap();
        assert_eq!(body, PAGE.as_bytes());
        let req = server.join().unwrap();
        assert!(req.starts_with("GET /metrics HTTP/1.1\r\n"), "{req}");
        assert!(req.contains("Connection: close"), "{req}");
    }

    proptest::proptest! {
        #[test]
        fn hostile_pages_and_responses_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let _ = parse(&bytes);
            let _ = complete(&bytes, true);
            let mut r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            r.extend_from_slice(&bytes);
            let _ = complete(&r, false);
        }

        #[test]
        fn mangled_real_lines_never_panic(cut in 0usize..3000, insert in ".{0,8}") {
            let mut page = PAGE.to_string();
            let at = page.char_indices().map(|(i, _)| i).nth(cut % page.chars().count()).unwrap_or(0);
            page.insert_str(at, &insert);
            let _ = parse(page.as_bytes());
            let _ = parse(&page.as_bytes()[..at]);
        }
    }
}
