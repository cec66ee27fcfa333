//! The client side of the plain-TCP mirror test: opens CONNS connections to ADDR one after the
//! other in parallel threads and sends each a deterministic pseudo-random stream of mixed-size
//! writes (small requests, bursts, one large blob that exceeds any window), reading the server's
//! replies as it goes, then closes. Prints how many bytes each connection sent.
//!
//! usage: stream-source ADDR CONNS SEED [PAUSE_MS]
//!
//! PAUSE_MS: connect, then wait that long before sending (a connection already open when the
//! copier starts).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::thread;
use std::time::Duration;

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn run(addr: &str, seed: u64, pause: Duration) -> std::io::Result<u64> {
    let mut conn = TcpStream::connect(addr)?;
    println!("connected from {}", conn.local_addr()?);
    thread::sleep(pause);
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = conn.try_clone()?;
    let drain = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    let mut rng = Rng(seed | 1);
    let mut sent = 0u64;
    for i in 0..40 {
        let len = match i {
            // One blob larger than the receive windows involved: exercises segmentation,
            // window updates and many feedback round trips.
            20 => 1_500_000,
            _ if rng.below(4) == 0 => 1 + rng.below(20_000) as usize,
            _ => 1 + rng.below(300) as usize,
        };
        let chunk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        conn.write_all(&chunk)?;
        sent += len as u64;
        if rng.below(3) == 0 {
            thread::sleep(Duration::from_millis(rng.below(30)));
        }
    }
    conn.shutdown(Shutdown::Write)?;
    let _ = drain.join();
    Ok(sent)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 && args.len() != 5 {
        eprintln!("usage: stream-source ADDR CONNS SEED [PAUSE_MS]");
        std::process::exit(2);
    }
    let conns: u64 = args[2].parse().expect("CONNS is a number");
    let seed: u64 = args[3].parse().expect("SEED is a number");
    let pause = Duration::from_millis(
        args.get(4)
            .map_or(0, |p| p.parse().expect("PAUSE_MS is a number")),
    );
    let workers: Vec<_> = (0..conns)
        .map(|c| {
            let addr = args[1].clone();
            thread::spawn(move || run(&addr, seed.wrapping_mul(1000).wrapping_add(c), pause))
        })
        .collect();
    let mut failed = false;
    for (c, w) in workers.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(n)) => println!("connection {c}: sent {n} bytes"),
            Ok(Err(e)) => {
                eprintln!("connection {c}: {e}");
                failed = true;
            }
            Err(_) => failed = true,
        }
    }
    if failed {
        std::process::exit(1);
    }
}
