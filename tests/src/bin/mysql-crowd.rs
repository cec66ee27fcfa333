//! Many concurrent MySQL connections from one process, for the memory-budget lab test: opens
//! CONNS connections to ADDR one after the other, logs each in (mysql_native_password, the
//! lab's account), runs `SELECT 1` on every one ROUNDS times, says `ready`, holds them all open
//! for HOLD_SECS, runs one more round on all, then closes them (COM_QUIT).
//!
//! usage: mysql-crowd ADDR USER PASSWORD DB CONNS ROUNDS HOLD_SECS
//!
//! One thread, blocking sockets: 2,000 connections are 2,000 file descriptors (raise
//! `ulimit -n` first), not 2,000 threads or processes on a 2-core lab machine. Prints one line
//! per phase with what failed, never panics on a server's answer.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::mysql::auth::{native_password, Nonce};

const CLIENT_LONG_PASSWORD: u32 = 0x1;
const CLIENT_CONNECT_WITH_DB: u32 = 0x8;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_PLUGIN_AUTH: u32 = 0x80000;

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn read_packet(s: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((h[3], body))
}

fn write_packet(s: &mut TcpStream, seq: u8, body: &[u8]) -> io::Result<()> {
    let len = body.len() as u32;
    let mut p = Vec::with_capacity(4 + body.len());
    p.extend_from_slice(&len.to_le_bytes()[..3]);
    p.push(seq);
    p.extend_from_slice(body);
    s.write_all(&p)
}

/// Connects and logs in; returns the connection ready for commands.
fn login(addr: &str, user: &str, password: &str, db: &str) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.set_nodelay(true)?;
    let (_, g) = read_packet(&mut s)?;
    if g.first() != Some(&10) {
        return Err(bad("not a protocol-10 greeting"));
    }
    let ver_end = g[1..]
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| bad("greeting"))?
        + 2;
    // thread id (4), nonce part 1 (8), filler (1), caps (2), charset (1), status (2), caps (2),
    // auth data length (1), reserved (10), nonce part 2 (12 + NUL).
    let n1 = g
        .get(ver_end + 4..ver_end + 12)
        .ok_or_else(|| bad("greeting"))?;
    let p2 = ver_end + 12 + 1 + 2 + 1 + 2 + 2 + 1 + 10;
    let n2 = g.get(p2..p2 + 12).ok_or_else(|| bad("greeting"))?;
    let mut nonce = Vec::with_capacity(20);
    nonce.extend_from_slice(n1);
    nonce.extend_from_slice(n2);
    let nonce = Nonce::from_auth_data(&nonce).map_err(|_| bad("nonce"))?;
    let scramble = native_password(password.as_bytes(), &nonce);
    let caps = CLIENT_LONG_PASSWORD
        | CLIENT_CONNECT_WITH_DB
        | CLIENT_PROTOCOL_41
        | CLIENT_TRANSACTIONS
        | CLIENT_SECURE_CONNECTION
        | CLIENT_PLUGIN_AUTH;
    let mut r = Vec::new();
    r.extend_from_slice(&caps.to_le_bytes());
    r.extend_from_slice(&(1u32 << 24).to_le_bytes());
    r.push(33); // utf8_general_ci
    r.extend_from_slice(&[0; 23]);
    r.extend_from_slice(user.as_bytes());
    r.push(0);
    r.push(scramble.as_bytes().len() as u8);
    r.extend_from_slice(scramble.as_bytes());
    r.extend_from_slice(db.as_bytes());
    r.push(0);
    r.extend_from_slice(b"mysql_native_password\0");
    write_packet(&mut s, 1, &r)?;
    let (_, ok) = read_packet(&mut s)?;
    match ok.first() {
        Some(0) => Ok(s),
        Some(0xff) => Err(bad(&format!(
            "login refused: {}",
            String::from_utf8_lossy(ok.get(9..).unwrap_or(&[]))
        ))),
        _ => Err(bad("unexpected answer to the login")),
    }
}

/// One `SELECT 1`, its whole result set read.
fn select_one(s: &mut TcpStream) -> io::Result<()> {
    write_packet(s, 0, b"\x03SELECT 1")?;
    let (_, first) = read_packet(s)?;
    match first.first() {
        Some(0xff) => return Err(bad("query error")),
        Some(0) => return Ok(()),
        _ => {}
    }
    // Column definitions up to EOF, then rows up to EOF.
    let mut eofs = 0;
    while eofs < 2 {
        let (_, p) = read_packet(s)?;
        match p.first() {
            Some(0xfe) if p.len() < 9 => eofs += 1,
            Some(0xff) => return Err(bad("error in result")),
            _ => {}
        }
    }
    Ok(())
}

fn round(conns: &mut [Option<TcpStream>]) -> usize {
    let mut failed = 0;
    for c in conns.iter_mut() {
        if let Some(s) = c {
            if select_one(s).is_err() {
                failed += 1;
                *c = None;
            }
        }
    }
    failed
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 8 {
        eprintln!("usage: mysql-crowd ADDR USER PASSWORD DB CONNS ROUNDS HOLD_SECS");
        std::process::exit(2);
    }
    let (addr, user, password, db) = (&a[1], &a[2], &a[3], &a[4]);
    let n: usize = a[5].parse().expect("CONNS");
    let rounds: usize = a[6].parse().expect("ROUNDS");
    let hold: u64 = a[7].parse().expect("HOLD_SECS");
    let t0 = Instant::now();
    let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(n);
    let mut first_error = None;
    for _ in 0..n {
        match login(addr, user, password, db) {
            Ok(s) => conns.push(Some(s)),
            Err(e) => {
                first_error.get_or_insert(e.to_string());
                conns.push(None);
            }
        }
    }
    let open = conns.iter().filter(|c| c.is_some()).count();
    println!(
        "opened {open} of {n} in {:.1} s (first error: {})",
        t0.elapsed().as_secs_f64(),
        first_error.as_deref().unwrap_or("none")
    );
    let mut failed = 0;
    for _ in 0..rounds {
        failed += round(&mut conns);
    }
    let open = conns.iter().filter(|c| c.is_some()).count();
    println!("ready {open} open, {failed} failed queries");
    std::thread::sleep(Duration::from_secs(hold));
    let failed = round(&mut conns);
    let open = conns.iter().filter(|c| c.is_some()).count();
    println!("held {open} open, {failed} failed queries after holding");
    for s in conns.iter_mut().flatten() {
        let _ = write_packet(s, 0, b"\x01");
    }
    drop(conns);
    println!("done in {:.1} s", t0.elapsed().as_secs_f64());
}
