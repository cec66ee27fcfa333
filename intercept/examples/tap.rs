//! A copier that claims nothing, so intercept broadcasts every reply to it, and prints what it
//! gets, one line per item: for checking intercept against real traffic by hand.
//!
//! `cargo run -p intercept --example tap -- 127.0.0.1:36524`
//!
//! Lines: `F <client> seq=<u32> len=<payload> flags=<hex>` per segment's feedback,
//! `P <client> off=<u64> seq=<u32> id=<u8> len=<u32> head=<hex>` per MySQL packet,
//! `L <client> at=<u32>` when framing is lost. It never claims, so it never takes replies away
//! from a real copier. Its client's counters go to stderr every 2 s. A tap that cannot keep up
//! fills intercept's queue for it: intercept counts what it then drops (`mysql_dropped`).

use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use common::control::{Hello, MysqlEvent};
use copier::control_client::{ControlClient, Relayed};

fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:36524".into())
        .parse()?;
    let (handle, mut rx) = ControlClient::spawn(addr, Hello::new("tap"), None, || {})?;
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut connected = false;
    let mut next_stats = Instant::now();
    loop {
        let item = match rx.try_recv() {
            Ok(item) => item,
            Err(TryRecvError::Empty) => {
                // Flushed only when idle: a line-buffered write per item cannot keep up.
                out.flush()?;
                match rx.recv_timeout(Duration::from_secs(2)) {
                    Ok(item) => item,
                    Err(RecvTimeoutError::Timeout) => {
                        eprintln!("{}", handle.stats());
                        continue;
                    }
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if Instant::now() >= next_stats {
            eprintln!("{}", handle.stats());
            next_stats = Instant::now() + Duration::from_secs(2);
        }
        if !connected {
            connected = true;
            if let Some(w) = handle.welcome() {
                writeln!(
                    out,
                    "W {} payload_prefix={} mysql_head={:?}",
                    w.name, w.payload_prefix, w.mysql_head
                )?;
            }
        }
        match item {
            Relayed::Feedback(batch) => {
                for f in batch {
                    writeln!(
                        out,
                        "F {} seq={} len={} flags={:#04x}",
                        f.client, f.seq, f.payload_len, f.flags.0
                    )?;
                }
            }
            Relayed::Mysql(batch, _, _, _) => {
                for e in batch {
                    match e {
                        MysqlEvent::Packet { client, packet: p } => {
                            write!(
                                out,
                                "P {client} off={} seq={} id={} len={} head=",
                                p.stream_offset, p.tcp_seq, p.seq_id, p.len
                            )?;
                            for b in &p.head {
                                write!(out, "{b:02x}")?;
                            }
                            writeln!(out)?;
                        }
                        MysqlEvent::FramingLost { client, at_seq } => {
                            writeln!(out, "L {client} at={at_seq}")?
                        }
                        MysqlEvent::FramingResumed { client, at_seq } => {
                            writeln!(out, "S {client} at={at_seq}")?
                        }
                        MysqlEvent::Rows { client, rows: r } => writeln!(
                            out,
                            "R {client} off={} id={} count={} bytes={}",
                            r.stream_offset, r.seq_id, r.count, r.bytes
                        )?,
                    }
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}
