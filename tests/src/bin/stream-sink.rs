//! A plain TCP service for the mirror tests: records every connection's received byte stream to
//! `DIR/<peer ip>_<peer port>.bin` and answers each read with a short reply, so the mirror has
//! server data to acknowledge. Runs until killed.
//!
//! usage: stream-sink LISTEN_ADDR DIR

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;

fn serve(mut conn: TcpStream, dir: &Path) -> std::io::Result<()> {
    let peer = conn.peer_addr()?;
    let path = dir.join(format!("{}_{}.bin", peer.ip(), peer.port()));
    let mut out = File::create(&path)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        total += n as u64;
        // A reply per read: server->client data the mirror must acknowledge on the test side.
        conn.write_all(format!("got {total}\n").as_bytes())?;
    }
    out.sync_all()?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: stream-sink LISTEN_ADDR DIR");
        std::process::exit(2);
    }
    let dir = PathBuf::from(&args[2]);
    std::fs::create_dir_all(&dir).expect("cannot create the output directory");
    let listener = TcpListener::bind(&args[1]).expect("cannot listen");
    println!("listening on {}", args[1]);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let dir = dir.clone();
        thread::spawn(move || {
            if let Err(e) = serve(conn, &dir) {
                eprintln!("connection failed: {e}");
            }
        });
    }
}
