//! The doctor's control connection to intercept, as a copier's would be: the Hello checks
//! reachability, the secret and the protocol version; a Doctor query has intercept check the
//! assistant host (forwarding, the segment it shares with the test server, who answers ARP).
//!
//! Must never claim an address it does not probe, nor keep the connection past the doctor's
//! run: it is a copier's channel used for a few seconds.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::control::{
    ArpTarget, CopierMessage, DoctorQuery, FrameDecoder, Hello, InterceptMessage, WireMessage,
    PROTOCOL_VERSION,
};
use ops::check::{Check, Level, Report};

use super::DoctorArgs;
use crate::settings::{Protocol, Route};

/// A control connection of our own.
pub(super) struct Link {
    pub(super) stream: TcpStream,
    pub(super) dec: FrameDecoder<InterceptMessage>,
    pub(super) buf: Vec<u8>,
    /// intercept's ports, from its name (`intercept@host port 3306,3307`), when readable.
    pub(super) ports: Option<Vec<u16>>,
}

impl Link {
    pub(super) fn send(&mut self, m: &CopierMessage) -> io::Result<()> {
        let mut out = Vec::new();
        m.encode(&mut out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&out)
    }

    /// The next frame other than a Pong, or `None` at the deadline.
    pub(super) fn recv_until(&mut self, deadline: Instant) -> io::Result<Option<InterceptMessage>> {
        loop {
            match self.dec.next_message() {
                Ok(Some(InterceptMessage::Pong(_))) => continue,
                Ok(Some(m)) => return Ok(Some(m)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "intercept closed the connection",
                    ))
                }
                Ok(n) => self.dec.feed(&self.buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a Ping and waits for its Pong: everything sent before has been read by intercept.
    pub(super) fn sync(&mut self, nonce: u64, wait: Duration) -> io::Result<bool> {
        self.send(&CopierMessage::Ping(nonce))?;
        let deadline = Instant::now() + wait;
        loop {
            match self.dec.next_message() {
                Ok(Some(InterceptMessage::Pong(n))) if n == nonce => return Ok(true),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Ok(false),
                Ok(n) => self.dec.feed(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Ok(false),
            }
        }
    }
}

/// Hello, Challenge, Auth, Welcome: intercept reachable, same version, each side holding the
/// same secret (or neither).
pub(super) fn intercept_link(
    r: &mut Report,
    addr: SocketAddr,
    hello: Hello,
    secret: Option<&common::auth::Secret>,
    protocol: Protocol,
) -> Option<Link> {
    let stream = match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "nothing listens on {addr} (connection refused): intercept is not running on \
                     the assistant, or listens elsewhere; fix: start it there (`systemctl start \
                     tcpshadow-intercept`), and check its --listen against this --intercept"
                ),
            ));
            return None;
        }
        Err(e) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "cannot reach {addr}: {e}; fix: check the address, and that no firewall \
                     drops the control port between this host and the assistant"
                ),
            ));
            return None;
        }
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(3)));
    let mut link = Link {
        stream,
        dec: FrameDecoder::new(),
        buf: vec![0; 64 * 1024],
        ports: None,
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answer = link
        .send(&CopierMessage::Hello(hello))
        .and_then(|()| link.recv_until(deadline));
    if let Ok(Some(InterceptMessage::Challenge(ch))) = &answer {
        let ch = ch.clone();
        let auth = match crate::control_client::answer_challenge(&ch, secret) {
            Ok(a) => a,
            Err(why) => {
                r.add(Check::fail("intercept", format!("{addr}: {why}")));
                return None;
            }
        };
        answer = link
            .send(&CopierMessage::Auth(auth.clone()))
            .and_then(|()| link.recv_until(deadline));
        if let Ok(Some(InterceptMessage::Welcome(w))) = &answer {
            if let Err(why) = crate::control_client::check_welcome(w, &ch, &auth, secret) {
                r.add(Check::fail("intercept", format!("{addr}: {why}")));
                return None;
            }
        }
    }
    match answer {
        Ok(Some(InterceptMessage::Welcome(w))) => {
            link.ports = w
                .name
                .rsplit_once(" port ")
                .map(|(_, p)| p.split(',').filter_map(|x| x.trim().parse().ok()).collect());
            let framing = match (w.mysql_head, protocol) {
                (Some(_), _) => "frames MySQL",
                (None, Protocol::Tcp) => "TCP feedback only",
                (None, Protocol::Mysql) => {
                    r.add(Check::fail(
                        "intercept",
                        format!(
                            "{addr} ({}) runs with --protocol tcp, but this copier mirrors \
                             MySQL: mirrored sessions cannot log in to the test server; fix: \
                             the same --protocol on both",
                            w.name
                        ),
                    ));
                    return Some(link);
                }
            };
            r.add(Check::ok(
                "intercept",
                format!(
                    "{addr} answers: {}, control protocol {PROTOCOL_VERSION}, {framing}, {}",
                    w.name,
                    if secret.is_some() {
                        "both hold the same secret"
                    } else {
                        "open control channel (no --secret-file on either side)"
                    }
                ),
            ));
            Some(link)
        }
        Ok(Some(InterceptMessage::Reject(j))) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr} refused this copier (its protocol version {}): {}",
                    j.version, j.reason
                ),
            ));
            None
        }
        Ok(Some(other)) => {
            r.add(Check::fail(
                "intercept",
                format!("{addr} sent {other:?} instead of a Welcome: not a tcpshadow intercept?"),
            ));
            None
        }
        Ok(None) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr} accepted the connection but did not answer the Hello within 5 s: \
                     not an intercept (another service on that port?)"
                ),
            ));
            None
        }
        Err(e) => {
            r.add(Check::fail(
                "intercept",
                format!(
                    "{addr}: {e} (a different tcpshadow release? run the same release on both \
                     hosts)"
                ),
            ));
            None
        }
    }
}

/// Asks intercept to check the assistant, and who answers ARP for our client addresses.
pub(super) fn assistant_checks(
    r: &mut Report,
    link: &mut Link,
    args: &DoctorArgs,
    route: Route,
    probe_ip: Option<Ipv4Addr>,
) {
    let mut arp: Vec<ArpTarget> = Vec::new();
    if let Some((base, prefix)) = args.daemon.mirror.client_ip_pool {
        let always: Vec<Ipv4Addr> = probe_ip.into_iter().collect();
        arp.extend(
            ops::arp::sample_pool(base, prefix, 256, &always)
                .into_iter()
                .map(|addr| ArpTarget { addr, pool: true }),
        );
    } else if let Some(ip) = args.probe_client {
        arp.push(ArpTarget {
            addr: ip,
            pool: false,
        });
    }
    let asked = Instant::now();
    let q = DoctorQuery {
        target: *route.target.ip(),
        arp,
    };
    let answer = link
        .send(&CopierMessage::Doctor(q))
        .and_then(|()| link.recv_until(Instant::now() + Duration::from_secs(10)));
    match answer {
        Ok(Some(InterceptMessage::DoctorReport(rep))) => {
            let rtt = asked.elapsed();
            for c in &rep.checks {
                r.add(Check::new(
                    Level::from_u8(c.level),
                    format!("assistant {}", c.name),
                    c.detail.clone(),
                ));
            }
            // The report was stamped between asking and now; the ARP wait is in there too,
            // so only a skew well beyond the round trip is reported.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let skew = now - rep.unix_ms as i64;
            let slack = rtt.as_millis() as i64 + 1000;
            if rep.unix_ms != 0 && skew.abs() > slack {
                r.add(Check::warn(
                    "clock skew",
                    format!(
                        "the assistant's clock is {:.1} s {} this host's: logs of the two hosts \
                         will not line up; fix: NTP on both",
                        skew.abs() as f64 / 1000.0,
                        if skew > 0 { "behind" } else { "ahead of" }
                    ),
                ));
            }
        }
        Ok(Some(other)) => r.add(Check::warn(
            "assistant",
            format!("intercept answered the doctor query with {other:?}"),
        )),
        Ok(None) => r.add(Check::warn(
            "assistant",
            "intercept did not answer the doctor query within 10 s",
        )),
        Err(e) => r.add(Check::warn(
            "assistant",
            format!(
                "intercept did not take the doctor query ({e}): it predates `copier doctor`; \
                 upgrade it to this release (run `intercept doctor` on the assistant meanwhile)"
            ),
        )),
    }
}
