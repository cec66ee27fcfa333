//! `tls-probe-dump PORT STOP_FILE [MAX_SECONDS] [--drop-caps] [--ring=BYTES]`: attaches the copier's TLS plaintext probe
//! (`copier::tls::TlsProbe`, issue 21) to the server listening on PORT in this network
//! namespace, drains it until STOP_FILE exists (or MAX_SECONDS, 60, have passed), and prints
//! what it saw per stream, for the lab test `tests/tls_probe.rs`.
//!
//! It reads the MySQL packets of the client direction of each stream (4-byte headers, the
//! first byte of each command) and prints one line per stream:
//! `stream PID:SSL:GEN client=IP:PORT server=IP:PORT joined=0|1 c2s=BYTES s2c=BYTES gaps=N
//! gap_bytes=N first_seq=N user=NAME commands=HEX:COUNT,...` (`first_seq` and `user`: the first client
//! packet's sequence id and, read as a HandshakeResponse, its user name), then `stats ...` (TlsProbeStats). On a failed attach it
//! prints `not attached: REASON` and exits with status 3. With `--drop-caps` it drops its
//! capabilities once attached, as the copier does: all of them, or all but
//! `copier::tls::RESOLVE_CAPS` when the probe says it needs /proc (`TlsProbe::needs_proc`).
//!
//! A test tool: it never changes the server, and it reads nothing but the probe's chunks.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use copier::tls::{PlainDir, StreamId, TlsProbe};

#[derive(Default)]
struct Stream {
    client: Option<SocketAddr>,
    server: Option<SocketAddr>,
    joined: bool,
    /// Next expected offset per direction, and holes seen.
    next: [u64; 2],
    gaps: u64,
    gap_bytes: u64,
    bytes: [u64; 2],
    /// Client bytes not yet framed into whole packet headers.
    pending: Vec<u8>,
    /// Bytes of the current client packet still to skip.
    skip: usize,
    first_seq: Option<u8>,
    /// The first client packet's payload, up to 128 bytes (the HandshakeResponse).
    first_payload: Vec<u8>,
    capture: usize,
    commands: BTreeMap<u8, u64>,
}

impl Stream {
    fn client_bytes(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                let c = self.capture.min(n);
                self.first_payload.extend_from_slice(&data[..c]);
                self.capture -= c;
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            // The 4-byte header and the command byte, which a chunk boundary may cut.
            let n = (5 - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.pending.len() < 5 {
                return;
            }
            let p = &self.pending;
            let len = usize::from(p[0]) | usize::from(p[1]) << 8 | usize::from(p[2]) << 16;
            let seq = p[3];
            if self.first_seq.is_none() && len > 0 {
                self.first_seq = Some(seq);
                self.first_payload.push(p[4]);
                self.capture = len.min(128) - 1;
            }
            if len == 0 {
                // An empty packet: its "command byte" was the next header's first byte.
                let next = p[4];
                self.pending = vec![next];
                continue;
            }
            if seq == 0 {
                *self.commands.entry(p[4]).or_default() += 1;
            }
            self.skip = len - 1;
            self.pending.clear();
        }
    }
}

/// The user name of a HandshakeResponse41 payload (NUL-terminated at offset 32: capabilities,
/// max packet size, character set, 23 bytes of filler), or `-`.
fn login_user(payload: &[u8]) -> String {
    let name = payload.get(32..).unwrap_or_default();
    let end = name.iter().position(|&b| b == 0);
    match end {
        Some(e) if e > 0 => String::from_utf8_lossy(&name[..e]).into_owned(),
        _ => "-".into(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(port), Some(stop)) = (args.get(1).and_then(|p| p.parse::<u16>().ok()), args.get(2))
    else {
        eprintln!("usage: tls-probe-dump PORT STOP_FILE [MAX_SECONDS]");
        return ExitCode::from(2);
    };
    let max = Duration::from_secs(args.get(3).and_then(|s| s.parse().ok()).unwrap_or(60));
    let drop_caps = args.iter().any(|a| a == "--drop-caps");
    let ring = args
        .iter()
        .find_map(|a| a.strip_prefix("--ring=")?.parse().ok())
        .unwrap_or(copier::tls::RING_BYTES);
    let mut probe = match TlsProbe::attach_with_ring(port, ring) {
        Ok(p) => p,
        Err(e) => {
            println!("not attached: {e}");
            return ExitCode::from(3);
        }
    };
    if drop_caps {
        // What the copier does once attached: keep only what resolving fds from /proc needs,
        // and only if the probe cannot tell sockets in the kernel.
        let keep: &[u32] = if probe.needs_proc() {
            copier::tls::RESOLVE_CAPS
        } else {
            &[]
        };
        if let Err(e) = ops::privs::drop_all_but(keep) {
            println!("cannot drop capabilities: {e}");
            return ExitCode::from(4);
        }
    }
    println!(
        "attached: {} (learning fds: {}) (needs /proc: {})",
        probe.target(),
        if probe.learning_fds() { "yes" } else { "no" },
        if probe.needs_proc() { "yes" } else { "no" }
    );
    let mut streams: HashMap<StreamId, Stream> = HashMap::new();
    let start = Instant::now();
    let mut last = false;
    loop {
        probe.drain(&mut |c| {
            let s = streams.entry(c.stream).or_default();
            s.client = Some(c.client);
            s.server = Some(c.server);
            s.joined = c.joined_midway;
            let d = match c.dir {
                PlainDir::FromClient => 0,
                PlainDir::FromServer => 1,
            };
            if c.offset != s.next[d] {
                s.gaps += 1;
                s.gap_bytes += c.offset.saturating_sub(s.next[d]);
            }
            s.next[d] = c.offset + c.data.len() as u64;
            s.bytes[d] += c.data.len() as u64;
            if d == 0 {
                s.client_bytes(c.data);
            }
        });
        if last {
            break;
        }
        if Path::new(stop).exists() || start.elapsed() > max {
            // One more drain after the stop: what the last calls wrote.
            std::thread::sleep(Duration::from_millis(200));
            last = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut ids: Vec<_> = streams.keys().copied().collect();
    ids.sort_by_key(|id| (id.ssl, id.generation));
    for id in ids {
        let s = &streams[&id];
        let show = |a: Option<SocketAddr>| a.map_or("?".to_string(), |a| a.to_string());
        let cmds: Vec<String> = s
            .commands
            .iter()
            .map(|(c, n)| format!("{c:02x}:{n}"))
            .collect();
        println!(
            "stream {}:{:x}:{} client={} server={} joined={} c2s={} s2c={} gaps={} gap_bytes={} first_seq={} \
             user={} commands={}",
            id.pid,
            id.ssl,
            id.generation,
            show(s.client),
            show(s.server),
            u8::from(s.joined),
            s.bytes[0],
            s.bytes[1],
            s.gaps,
            s.gap_bytes,
            s.first_seq.map_or(-1, i32::from),
            login_user(&s.first_payload),
            cmds.join(",")
        );
    }
    if !probe.target_alive() {
        println!("target gone");
    }
    let st = probe.stats();
    println!(
        "stats chunks={} bytes={} lost_records={} lost_bytes={} truncated_bytes={} \
         unresolved_chunks={} unresolved_bytes={} not_tcp_chunks={} fds_closed={} streams_started={} \
         streams_joined={} \
         bad_records={} foreign_calls={} not_tcp_bytes={} told_by_kernel={} from_proc={}",
        st.chunks,
        st.bytes,
        st.lost_records,
        st.lost_bytes,
        st.truncated_bytes,
        st.unresolved_chunks,
        st.unresolved_bytes,
        st.not_tcp_chunks,
        st.fds_closed,
        st.streams_started,
        st.streams_joined_midway,
        st.bad_records,
        st.foreign_calls,
        st.not_tcp_bytes,
        st.streams_told_by_kernel,
        st.streams_resolved_from_proc
    );
    ExitCode::SUCCESS
}
