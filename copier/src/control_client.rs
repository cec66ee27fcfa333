//! The copier's end of the control channel to intercept.
//!
//! Two background threads keep one connection alive: the *connection* thread connects (with
//! exponential backoff), says Hello, answers intercept's Challenge (proving it holds
//! `--secret-file`'s secret, and checking intercept's proof back), then hands the welcomed
//! connection to the engine thread and waits for it to end; the *writer* thread owns the set
//! of claimed client addresses, sends Claims and Releases as the engine opens and closes
//! sessions, re-sends the whole set after every (re)connect, and pings.
//!
//! The engine thread reads what intercept relays itself ([`RelayedReceiver`]), at its own
//! pace, without waiting: at each turn of its loop, and when the socket wakes it while it has
//! nothing else to wait for. A reader thread of ours woke for every write intercept made and
//! then woke the engine (issue 20: a sixth of the copier's CPU at 500 transactions a second);
//! the kernel's socket buffer now holds what the engine has not read yet, and a copier that
//! falls far behind fills intercept's queue for it instead, which intercept counts
//! (`dropped_queue_full`, `mysql_dropped`); the capture ring, a couple of seconds deep,
//! overflows long before (kernel drops, counted here). The engine thread only ever calls
//! [`ControlHandle`] methods that never block.

use std::collections::HashSet;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::auth::{Nonce, Secret};
use common::control::{
    encode_auth, encode_claim, encode_hello, encode_ping, encode_prompt, encode_release, Auth,
    Challenge, DecodeError, FrameDecoder, Hello, InterceptMessage, MysqlEvent, TestFeedback,
    Welcome, FEATURE_PROMPT_ON_DEMAND, FEATURE_QUIET_IDLE, IDLE_KEEPALIVE, MAX_ADDRS_PER_FRAME,
};

/// What intercept relays, in the order it sent it. For any session, a MySQL event arrives after
/// the feedback of the segment it was framed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relayed {
    /// Per-segment TCP feedback, for the session engine.
    Feedback(Vec<TestFeedback>),
    /// MySQL packet summaries (greeting, auth exchange, prepare-OK, response heads), in stream
    /// order per session, for the MySQL layer, when their frame was read off the socket, and
    /// the frame's `sent_at_us` (intercept's clock, to date each packet back by how long it
    /// waited at intercept), and our realtime µs when it was read: the frame's transit, whose
    /// excess over the quickest recent frame's ([`crate::transit`]) dates it back again, so
    /// that how long it waited for the engine to read it does not count as the test server's
    /// latency in the report.
    Mysql(Vec<MysqlEvent>, Instant, u32, u32),
}

/// Most bytes one turn of the engine reads off one connection: a copier that fell behind
/// works through intercept's backlog a slice at a time, between its captures.
const READ_PER_TURN: usize = 1 << 20;

/// The engine thread's end of the control connection: it reads the socket itself, never
/// waiting (see the module's doc).
pub struct RelayedReceiver {
    cfg: Arc<ClientConfig>,
    shared: Arc<Shared>,
    /// Welcomed connections from the connection thread.
    handovers: Receiver<Handover>,
    /// How each one ended, back to the connection thread.
    ended: Sender<Ended>,
    live: Option<Live>,
    buf: Vec<u8>,
    /// What this turn may still read (see [`READ_PER_TURN`]).
    budget: usize,
}

/// A welcomed connection, handed to the engine thread.
struct Handover {
    generation: u64,
    stream: TcpStream,
    /// With whatever followed the Welcome in the handshake's last read.
    dec: FrameDecoder<InterceptMessage>,
    /// `FEATURE_QUIET_IDLE` granted and TCP keepalive on: no Pong comes while nothing is
    /// claimed.
    quiet: bool,
    /// When the Welcome came: the connection's silence counts from then.
    welcomed_at: Instant,
}

struct Live {
    generation: u64,
    stream: TcpStream,
    dec: FrameDecoder<InterceptMessage>,
    quiet: bool,
    /// When the read that completed the last frame (a Pong included) returned: the
    /// connection's liveness.
    last_frame: Instant,
    /// When the last read returned bytes, on the monotonic and the realtime (µs) clocks: the
    /// frames it completes are dated by it.
    read_at: (Instant, u32),
}

/// Why the engine thread ended a connection (or, `Stopped` and `EngineGone`, the client).
struct Ended {
    generation: u64,
    end: End,
}

impl RelayedReceiver {
    /// Starts a turn: adopts a connection the connection thread welcomed, and renews the
    /// read budget. Then [`RelayedReceiver::next_relayed`] until it says `None`.
    pub fn begin_turn(&mut self) {
        self.budget = READ_PER_TURN;
        while let Ok(h) = self.handovers.try_recv() {
            self.adopt(h);
        }
    }

    fn adopt(&mut self, h: Handover) {
        if let Some(old) = self.live.take() {
            // The connection thread only welcomes a new one after the last one ended.
            let _ = old.stream.shutdown(Shutdown::Both);
        }
        self.live = Some(Live {
            generation: h.generation,
            stream: h.stream,
            dec: h.dec,
            quiet: h.quiet,
            last_frame: h.welcomed_at,
            read_at: (Instant::now(), common::clock::realtime_us()),
        });
    }

    /// The next batch intercept relayed, in its order: decoded from what was read, reading
    /// more while this turn's budget lasts. Never blocks. A connection that ended (closed,
    /// garbage, silent for too long) is handed back to the connection thread, which
    /// reconnects.
    pub fn next_relayed(&mut self) -> Option<Relayed> {
        loop {
            let live = self.live.as_mut()?;
            let msg = match live.dec.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => {
                    if self.budget == 0 {
                        // Bytes that never make a frame are silence too.
                        let (last, at) = (live.last_frame, live.read_at.0);
                        if self.silence().is_some_and(|d| at >= last + d) {
                            return self.end(End::Timeout);
                        }
                        return None;
                    }
                    match ops::nowait::recv_now(&live.stream, &mut self.buf) {
                        Ok(Some(0)) => return self.end(End::Closed),
                        Ok(Some(n)) => {
                            self.budget = self.budget.saturating_sub(n);
                            // A read that did not fill the buffer emptied the socket: another
                            // would find nothing, a system call a turn for no data. What
                            // comes meanwhile waits for the next turn.
                            if n < self.buf.len() {
                                self.budget = 0;
                            }
                            live.dec.feed(&self.buf[..n]);
                            live.read_at = (Instant::now(), common::clock::realtime_us());
                            continue;
                        }
                        Ok(None) => {
                            self.budget = 0;
                            let last = live.last_frame;
                            if self.silence().is_some_and(|d| Instant::now() >= last + d) {
                                return self.end(End::Timeout);
                            }
                            return None;
                        }
                        Err(e) => return self.end(End::Io(e)),
                    }
                }
                Err(e) => return self.end(End::Garbage(e)),
            };
            live.last_frame = live.read_at.0;
            bump(&self.shared.frames_in, 1);
            match msg {
                InterceptMessage::Feedback(batch) => {
                    bump(&self.shared.feedback_received, batch.len() as u64);
                    return Some(Relayed::Feedback(batch));
                }
                InterceptMessage::Mysql { sent_at_us, events } => {
                    bump(&self.shared.mysql_received, events.len() as u64);
                    let (at, at_us) = live.read_at;
                    return Some(Relayed::Mysql(events, at, sent_at_us, at_us));
                }
                InterceptMessage::Pong(_) => {}
                InterceptMessage::Reject(r) => return self.end(End::Rejected(r.reason)),
                InterceptMessage::Welcome(_) => return self.end(End::Protocol("second Welcome")),
                InterceptMessage::Challenge(_) => {
                    return self.end(End::Protocol("second Challenge"))
                }
                // Only `copier doctor` asks for one, on a connection of its own.
                InterceptMessage::DoctorReport(_) => {
                    return self.end(End::Protocol("unasked DoctorReport"))
                }
            }
        }
    }

    /// How long the connection may stay silent. Pongs come every ping period; an idle
    /// copier's are far apart, or (quiet) do not come at all, and the kernel's keepalive then
    /// fails the read of a dead peer.
    fn silence(&self) -> Option<Duration> {
        let quiet = self.live.as_ref().is_some_and(|l| l.quiet);
        match (self.shared.claimed.load(Ordering::Relaxed), quiet) {
            (0, true) => None,
            (0, false) => Some(self.cfg.idle_timeout + self.cfg.idle_ping_interval),
            _ => Some(self.cfg.idle_timeout),
        }
    }

    fn end(&mut self, end: End) -> Option<Relayed> {
        if let Some(live) = self.live.take() {
            let _ = live.stream.shutdown(Shutdown::Both);
            let _ = self.ended.send(Ended {
                generation: live.generation,
                end,
            });
        }
        None
    }

    /// The connection's socket, for the engine's poll while nothing else wakes it.
    pub fn fd(&self) -> Option<RawFd> {
        self.live.as_ref().map(|l| l.stream.as_raw_fd())
    }

    /// When a silent connection counts as dead: the engine must look by then.
    pub fn deadline(&self) -> Option<Instant> {
        let live = self.live.as_ref()?;
        Some(live.last_frame + self.silence()?)
    }

    /// The next batch, if one is waiting (tools and tests: the engine uses
    /// [`RelayedReceiver::begin_turn`] and [`RelayedReceiver::next_relayed`]). Never blocks.
    pub fn try_recv(&mut self) -> Result<Relayed, TryRecvError> {
        self.begin_turn();
        match self.next_relayed() {
            Some(r) => Ok(r),
            None if self.live.is_none() && self.client_gone() => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The next batch, waiting at most `timeout` (tests and tools; the engine never waits
    /// here).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Relayed, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_recv() {
                Ok(r) => return Ok(r),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            // Short waits: the silence deadline and a handover are looked at in between.
            let left = left.min(Duration::from_millis(50));
            match self.fd() {
                Some(fd) => crate::waker::wait_readable(&[fd], left),
                None => match self.handovers.recv_timeout(left) {
                    Ok(h) => self.adopt(h),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(RecvTimeoutError::Disconnected)
                    }
                },
            }
        }
    }

    /// The connection thread is gone: no connection will come again.
    fn client_gone(&mut self) -> bool {
        match self.handovers.try_recv() {
            Ok(h) => {
                self.adopt(h);
                false
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => true,
        }
    }
}

impl Drop for RelayedReceiver {
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            let _ = live.stream.shutdown(Shutdown::Both);
        }
        let _ = self.ended.send(Ended {
            generation: 0,
            end: End::EngineGone,
        });
    }
}

/// Settings of the control client. [`ClientConfig::new`] gives sensible defaults.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// intercept's control address (its `--listen`).
    pub intercept: SocketAddr,
    pub hello: Hello,
    /// `--secret-file`: proves this copier to intercept, and intercept to it.
    pub secret: Option<Secret>,
    /// First and longest wait between connection attempts (doubling in between).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub connect_timeout: Duration,
    /// How long intercept may take to answer the Hello.
    pub handshake_timeout: Duration,
    /// Keepalive period while some address is claimed; intercept closes connections silent
    /// for 30 s.
    pub ping_interval: Duration,
    /// Keepalive period while nothing is claimed (no session: an idle copier), below
    /// intercept's 30 s, with an intercept that does not grant `FEATURE_QUIET_IDLE` (one that
    /// does gets no heartbeat at all while nothing is claimed: TCP keepalive instead). On an
    /// idle production host every wakeup is the mirror's alone (issue 20: the 2 s heartbeat
    /// each way was all an idle copier still did); a dead intercept then costs nothing until
    /// the first claim, whose write fails or whose pings go unanswered.
    pub idle_ping_interval: Duration,
    /// No frame at all (not even a Pong) for this long means the connection is dead; while
    /// nothing is claimed, for `idle_ping_interval` more.
    pub idle_timeout: Duration,
    /// intercept not reading our claims for this long means the connection is dead.
    pub write_timeout: Duration,
}

impl ClientConfig {
    pub fn new(intercept: SocketAddr, hello: Hello, secret: Option<Secret>) -> Self {
        ClientConfig {
            intercept,
            hello,
            secret,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(2),
            idle_ping_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters of the control client, for the copier's status line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Whether a welcomed connection is up right now.
    pub connected: bool,
    /// Welcomed connections so far; `reconnects` is that minus the first.
    pub connects: u64,
    pub reconnects: u64,
    /// Attempts that failed before a Welcome (refused, timed out, rejected).
    pub connect_failures: u64,
    /// Handshakes that ended in a refusal: intercept's Reject (wrong version or secret, over
    /// its --max-copiers) or ours (intercept could not prove it holds the secret).
    pub rejects: u64,
    pub frames_in: u64,
    pub frames_out: u64,
    /// Feedback items received.
    pub feedback_received: u64,
    /// MySQL events received.
    pub mysql_received: u64,
    /// Addresses currently claimed.
    pub claimed: u64,
}

impl fmt::Display for ClientStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "intercept={} reconnects={} connect_failures={} rejects={} feedback={} \
             mysql_events={} claimed={}",
            if self.connected { "up" } else { "down" },
            self.reconnects,
            self.connect_failures,
            self.rejects,
            self.feedback_received,
            self.mysql_received,
            self.claimed
        )
    }
}

/// Starts the control client.
pub struct ControlClient;

impl ControlClient {
    /// Connects to intercept at `addr` in the background with default settings. `wake` is
    /// called (from the client's thread) after a welcomed connection was handed to the
    /// returned receiver.
    pub fn spawn(
        addr: SocketAddr,
        hello: Hello,
        secret: Option<Secret>,
        wake: impl Fn() + Send + 'static,
    ) -> io::Result<(ControlHandle, RelayedReceiver)> {
        Self::spawn_with(ClientConfig::new(addr, hello, secret), wake)
    }

    pub fn spawn_with(
        config: ClientConfig,
        wake: impl Fn() + Send + 'static,
    ) -> io::Result<(ControlHandle, RelayedReceiver)> {
        let shared = Arc::new(Shared::default());
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let (handover_tx, handovers) = mpsc::channel();
        let (ended, ended_rx) = mpsc::channel();
        let config = Arc::new(config);

        let writer = {
            let (config, shared) = (config.clone(), shared.clone());
            thread::Builder::new()
                .name("control-tx".into())
                .spawn(move || writer_loop(&config, &shared, &cmd_rx))?
        };
        let conn = {
            let (config, shared, cmd_tx) = (config.clone(), shared.clone(), cmd_tx.clone());
            let link = Link {
                handovers: handover_tx,
                ended: ended_rx,
                wake: Box::new(wake),
            };
            thread::Builder::new()
                .name("control-conn".into())
                .spawn(move || connection_loop(&config, &shared, &cmd_tx, &link))
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                let _ = cmd_tx.send(Command::Stop);
                return Err(e);
            }
        };
        Ok((
            ControlHandle {
                cmds: cmd_tx,
                shared: shared.clone(),
                ended: ended.clone(),
                threads: vec![conn, writer],
            },
            RelayedReceiver {
                cfg: config,
                shared,
                handovers,
                ended,
                live: None,
                buf: vec![0u8; 64 * 1024],
                budget: 0,
            },
        ))
    }
}

/// The engine thread's grip on the control client. Dropping it stops the client's threads.
pub struct ControlHandle {
    cmds: Sender<Command>,
    shared: Arc<Shared>,
    /// To wake the connection thread while the engine holds its connection.
    ended: Sender<Ended>,
    threads: Vec<JoinHandle<()>>,
}

impl ControlHandle {
    /// Asks intercept for the replies to `client` (a mirrored client address). Call it before
    /// sending the session's SYN, so the SYN-ACK is routed to this copier. Never blocks.
    pub fn claim(&self, client: SocketAddrV4) {
        let _ = self.cmds.send(Command::Claim(client));
    }

    /// Gives `client` up, once its session is over. Never blocks.
    pub fn release(&self, client: SocketAddrV4) {
        let _ = self.cmds.send(Command::Release(client));
    }

    /// Tells intercept whether a session waits on the test server, so it relays within a
    /// millisecond (true) or gathers for its `--relay-flush-us` (false); sent only when it changes, and
    /// only to an intercept that granted `FEATURE_PROMPT_ON_DEMAND` (again after every
    /// reconnection). Never blocks.
    pub fn prompt(&self, on: bool) {
        let _ = self.cmds.send(Command::Prompt(on));
    }

    pub fn stats(&self) -> ClientStats {
        let s = &self.shared;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let connects = g(&s.connects);
        ClientStats {
            connected: s.connected.load(Ordering::Relaxed),
            connects,
            reconnects: connects.saturating_sub(1),
            connect_failures: g(&s.connect_failures),
            rejects: g(&s.rejects),
            frames_in: g(&s.frames_in),
            frames_out: g(&s.frames_out),
            feedback_received: g(&s.feedback_received),
            mysql_received: g(&s.mysql_received),
            claimed: g(&s.claimed),
        }
    }

    /// What the current (or last) intercept said about itself, e.g. its payload prefix length
    /// and whether it frames MySQL packets (`mysql_head`).
    pub fn welcome(&self) -> Option<Welcome> {
        self.shared.welcome.lock().ok().and_then(|w| w.clone())
    }

    /// Why intercept last refused us (or we it), if it did.
    pub fn last_reject(&self) -> Option<String> {
        self.shared.last_reject.lock().ok().and_then(|r| r.clone())
    }

    /// Why the handshake was refused, while no connection has been welcomed yet, when the
    /// reason is a mistake in the set-up (secret, protocol version, --allow) that waiting will
    /// not fix.
    pub fn refused_before_welcome(&self) -> Option<String> {
        if self.shared.connects.load(Ordering::Relaxed) > 0
            || !self.shared.refused_for_good.load(Ordering::Relaxed)
        {
            return None;
        }
        self.last_reject()
    }

    /// Stops the client and waits for its threads: at once when connected or backing off, at
    /// most `connect_timeout + handshake_timeout` when caught mid-handshake.
    pub fn shutdown(mut self) {
        self.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.cmds.send(Command::Stop);
        let _ = self.ended.send(Ended {
            generation: 0,
            end: End::Stopped,
        });
        if let Ok(mut live) = self.shared.live.lock() {
            if let Some(s) = live.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for t in &self.threads {
            t.thread().unpark();
        }
    }
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Command {
    Claim(SocketAddrV4),
    Release(SocketAddrV4),
    Prompt(bool),
    /// A welcomed connection: the writer re-sends every claim on it.
    Connected {
        generation: u64,
        stream: TcpStream,
        /// `FEATURE_QUIET_IDLE` granted and TCP keepalive on: no Ping while nothing is claimed.
        quiet: bool,
        /// `FEATURE_PROMPT_ON_DEMAND` granted: Prompt frames may be sent.
        prompts: bool,
    },
    Disconnected {
        generation: u64,
    },
    Stop,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// The last refusal was about the secret or the version, not a passing condition.
    refused_for_good: AtomicBool,
    connected: AtomicBool,
    connects: AtomicU64,
    connect_failures: AtomicU64,
    rejects: AtomicU64,
    frames_in: AtomicU64,
    frames_out: AtomicU64,
    feedback_received: AtomicU64,
    mysql_received: AtomicU64,
    claimed: AtomicU64,
    /// The current connection, so that stopping can cut it.
    live: Mutex<Option<TcpStream>>,
    welcome: Mutex<Option<Welcome>>,
    last_reject: Mutex<Option<String>>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn set_live(&self, s: Option<TcpStream>) {
        if let Ok(mut live) = self.live.lock() {
            *live = s;
        }
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Why a connection attempt or a connection ended.
enum End {
    Io(io::Error),
    Closed,
    Timeout,
    Garbage(DecodeError),
    Rejected(String),
    /// The handshake failed on our side: intercept could not prove it holds the secret.
    Auth(String),
    /// intercept closed the connection before answering the Hello.
    ClosedUnanswered,
    Protocol(&'static str),
    /// The engine dropped its receiver: nobody wants feedback any more.
    EngineGone,
    Stopped,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Io(e) => write!(f, "{e}"),
            End::Closed => write!(f, "intercept closed the connection"),
            End::Timeout => write!(f, "no answer from intercept within the timeout"),
            End::Garbage(e) => write!(f, "invalid frame from intercept: {e}"),
            End::Rejected(r) => write!(f, "intercept refused this copier: {r}"),
            End::Auth(r) => write!(f, "refused intercept: {r}"),
            End::ClosedUnanswered => write!(
                f,
                "intercept closed the connection without answering the Hello (is this host \
                 outside intercept's --allow? intercept's log says why)"
            ),
            End::Protocol(w) => write!(f, "protocol error: {w}"),
            End::EngineGone => write!(f, "engine stopped"),
            End::Stopped => write!(f, "stopped"),
        }
    }
}

/// The connection thread's ends of its ties to the engine thread.
struct Link {
    handovers: Sender<Handover>,
    ended: Receiver<Ended>,
    wake: Box<dyn Fn() + Send>,
}

fn connection_loop(cfg: &ClientConfig, shared: &Shared, cmds: &Sender<Command>, link: &Link) {
    let mut backoff = cfg.backoff_min;
    let mut failures = 0u64;
    let mut generation = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stopped() {
        let (stream, welcome, dec) = match handshake(cfg, &mut buf) {
            Ok(c) => c,
            Err(end) => {
                if shared.stopped() {
                    break;
                }
                bump(&shared.connect_failures, 1);
                failures += 1;
                if let End::Rejected(_) | End::Auth(_) | End::ClosedUnanswered = &end {
                    bump(&shared.rejects, 1);
                    // A full intercept (--max-copiers) makes room eventually; a secret, a
                    // version or an address outside --allow (closed unanswered) never changes.
                    let for_good = match &end {
                        End::Rejected(r) => !r.contains("--max-copiers"),
                        End::Auth(_) | End::ClosedUnanswered => true,
                        _ => false,
                    };
                    shared.refused_for_good.store(for_good, Ordering::Relaxed);
                    if let Ok(mut r) = shared.last_reject.lock() {
                        *r = Some(end.to_string());
                    }
                }
                // 1st, 2nd, 4th, 8th... failure: an outage of hours logs a dozen lines.
                if failures.is_power_of_two() {
                    tracing::warn!(
                        intercept = %cfg.intercept,
                        attempts = failures,
                        "cannot connect to intercept: {end}; retrying every {:?} at most",
                        cfg.backoff_max
                    );
                }
                sleep_unless_stopped(shared, backoff);
                backoff = (backoff * 2).min(cfg.backoff_max);
                continue;
            }
        };
        let clone = match stream.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("cannot clone the control socket: {e}");
                sleep_unless_stopped(shared, backoff);
                continue;
            }
        };
        generation += 1;
        failures = 0;
        shared.set_live(stream.try_clone().ok());
        if shared.stopped() {
            let _ = stream.shutdown(Shutdown::Both);
            break;
        }
        tracing::info!(
            intercept = %cfg.intercept,
            name = %welcome.name,
            payload_prefix = welcome.payload_prefix,
            mysql_head = ?welcome.mysql_head,
            "control channel to intercept is up"
        );
        if welcome.mysql_head.is_none() {
            tracing::warn!(
                intercept = %cfg.intercept,
                "intercept runs with --protocol tcp: it sends no MySQL packet summaries, so \
                 mirrored sessions cannot log in to the test server nor map prepared statements"
            );
        }
        let quiet = welcome.features & FEATURE_QUIET_IDLE != 0
            && match ops::sockopt::set_keepalive(&stream, IDLE_KEEPALIVE) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(intercept = %cfg.intercept, "cannot set TCP keepalive on the control channel: {e}; an idle copier pings instead");
                    false
                }
            };
        let welcome_prompts = welcome.features & FEATURE_PROMPT_ON_DEMAND != 0;
        if let Ok(mut w) = shared.welcome.lock() {
            *w = Some(welcome);
        }
        bump(&shared.connects, 1);
        shared.connected.store(true, Ordering::SeqCst);
        let prompts = welcome_prompts;
        if cmds
            .send(Command::Connected {
                generation,
                stream: clone,
                quiet,
                prompts,
            })
            .is_err()
        {
            break;
        }
        let up_since = Instant::now();
        let end = engine_reads(
            link,
            Handover {
                generation,
                stream,
                dec,
                quiet,
                welcomed_at: up_since,
            },
        );
        shared.connected.store(false, Ordering::SeqCst);
        shared.set_live(None);
        let _ = cmds.send(Command::Disconnected { generation });
        match end {
            End::Stopped | End::EngineGone => break,
            _ if shared.stopped() => break,
            end => {
                tracing::warn!(intercept = %cfg.intercept, "control channel to intercept lost: {end}; reconnecting (feedback is lost until then)")
            }
        }
        // A connection that held for a while earns a quick retry; one that keeps failing
        // right after the handshake keeps backing off.
        if up_since.elapsed() >= cfg.backoff_max {
            backoff = cfg.backoff_min;
        }
        sleep_unless_stopped(shared, backoff);
        backoff = (backoff * 2).min(cfg.backoff_max);
    }
    shared.connected.store(false, Ordering::SeqCst);
    let _ = cmds.send(Command::Stop);
}

fn sleep_unless_stopped(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while !shared.stopped() {
        let now = Instant::now();
        if now >= until {
            return;
        }
        thread::park_timeout(until - now);
    }
}

fn handshake(
    cfg: &ClientConfig,
    buf: &mut [u8],
) -> Result<(TcpStream, Welcome, FrameDecoder<InterceptMessage>), End> {
    let mut stream =
        TcpStream::connect_timeout(&cfg.intercept, cfg.connect_timeout).map_err(End::Io)?;
    let _ = stream.set_nodelay(true);
    stream
        .set_write_timeout(Some(cfg.write_timeout))
        .map_err(End::Io)?;
    stream
        .set_read_timeout(Some(cfg.handshake_timeout))
        .map_err(End::Io)?;
    let mut out = Vec::new();
    if let Err(e) = encode_hello(&cfg.hello, &mut out) {
        tracing::error!("cannot encode the Hello: {e}");
        return Err(End::Protocol("Hello does not encode"));
    }
    stream.write_all(&out).map_err(End::Io)?;
    let mut dec = FrameDecoder::new();
    let challenge = match read_message(&mut stream, &mut dec, buf) {
        Ok(InterceptMessage::Challenge(c)) => c,
        Ok(InterceptMessage::Reject(r)) => return Err(End::Rejected(r.reason)),
        Ok(_) => {
            return Err(End::Protocol(
                "intercept sent something before its Challenge",
            ))
        }
        // Closed unread: what intercept does to an address outside its --allow.
        Err(End::Closed) => return Err(End::ClosedUnanswered),
        Err(End::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
            return Err(End::ClosedUnanswered)
        }
        Err(e) => return Err(e),
    };
    let auth = answer_challenge(&challenge, cfg.secret.as_ref()).map_err(End::Auth)?;
    out.clear();
    if encode_auth(&auth, &mut out).is_err() {
        return Err(End::Protocol("Auth does not encode"));
    }
    stream.write_all(&out).map_err(End::Io)?;
    match read_message(&mut stream, &mut dec, buf)? {
        InterceptMessage::Welcome(w) => {
            check_welcome(&w, &challenge, &auth, cfg.secret.as_ref()).map_err(End::Auth)?;
            stream
                .set_read_timeout(Some(cfg.idle_timeout))
                .map_err(End::Io)?;
            Ok((stream, w, dec))
        }
        InterceptMessage::Reject(r) => Err(End::Rejected(r.reason)),
        _ => Err(End::Protocol("intercept sent something before its Welcome")),
    }
}

/// The Auth answering intercept's Challenge: a fresh nonce and, with a secret, the proof. A
/// copier with a secret refuses an intercept that does not check one: it could not prove it is
/// the intercept the secret was shared with. Also used by `copier doctor`.
pub fn answer_challenge(ch: &Challenge, secret: Option<&Secret>) -> Result<Auth, String> {
    if secret.is_some() && !ch.secret_required {
        return Err(
            "intercept does not check a secret (it runs without --secret-file), so it \
                    cannot prove it is the intercept this copier's --secret-file is shared with; \
                    give intercept the same --secret-file"
                .into(),
        );
    }
    let nonce: Nonce = ops::secret::random_bytes()
        .map_err(|e| format!("cannot read random bytes for the handshake: {e}"))?;
    Ok(Auth {
        nonce,
        proof: secret.map(|k| k.copier_proof(&ch.nonce, &nonce)),
    })
}

/// Checks intercept's proof in its Welcome (with a secret; without one there is nothing to
/// check). Also used by `copier doctor`.
pub fn check_welcome(
    w: &Welcome,
    ch: &Challenge,
    auth: &Auth,
    secret: Option<&Secret>,
) -> Result<(), String> {
    let Some(secret) = secret else {
        return Ok(());
    };
    match &w.proof {
        Some(p) if secret.verify_intercept(&ch.nonce, &auth.nonce, p) => Ok(()),
        _ => Err(format!(
            "{} did not prove it holds this copier's secret: it is not the intercept configured \
             with the same --secret-file",
            w.name
        )),
    }
}

fn read_message(
    stream: &mut TcpStream,
    dec: &mut FrameDecoder<InterceptMessage>,
    buf: &mut [u8],
) -> Result<InterceptMessage, End> {
    loop {
        if let Some(m) = dec.next_message().map_err(End::Garbage)? {
            return Ok(m);
        }
        fill(stream, dec, buf)?;
    }
}

fn fill(
    stream: &mut TcpStream,
    dec: &mut FrameDecoder<InterceptMessage>,
    buf: &mut [u8],
) -> Result<(), End> {
    loop {
        match stream.read(buf) {
            Ok(0) => return Err(End::Closed),
            Ok(n) => {
                dec.feed(&buf[..n]);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(End::Timeout)
            }
            Err(e) => return Err(End::Io(e)),
        }
    }
}

/// Hands a welcomed connection to the engine thread, and waits until it ends there (or the
/// client stops).
fn engine_reads(link: &Link, h: Handover) -> End {
    let generation = h.generation;
    if link.handovers.send(h).is_err() {
        return End::EngineGone;
    }
    (link.wake)();
    loop {
        match link.ended.recv() {
            Ok(Ended {
                end: end @ (End::Stopped | End::EngineGone),
                ..
            }) => return end,
            Ok(e) if e.generation == generation => return e.end,
            // An earlier connection's, already dealt with.
            Ok(_) => {}
            Err(_) => return End::EngineGone,
        }
    }
}

fn writer_loop(cfg: &ClientConfig, shared: &Shared, cmds: &Receiver<Command>) {
    let mut claimed: HashSet<SocketAddrV4> = HashSet::new();
    // Addresses whose state changed since the last write; their net state is what is sent.
    let mut touched: Vec<SocketAddrV4> = Vec::new();
    let mut conn: Option<(u64, TcpStream)> = None;
    let mut resend_all = false;
    let mut out = Vec::new();
    let mut next_ping = Instant::now() + cfg.ping_interval;
    let mut nonce = 0u64;
    // The connection is quiet while idle, and its first Pong was asked for.
    let (mut quiet, mut proved) = (false, false);
    // What the driver last said of its sessions (`Command::Prompt`), and what the connection
    // was last told: `None` when it may not be told anything (not granted, or no connection).
    let mut prompt = false;
    let mut told: Option<bool> = None;
    loop {
        // Disconnected, only commands matter (Connected among them); the ping clock restarts
        // then. Quiet and idle, only commands matter too: a Claim restarts the clock.
        let silent = quiet && proved && claimed.is_empty();
        let timeout = match conn {
            Some(_) if !silent => next_ping.saturating_duration_since(Instant::now()),
            _ => Duration::from_secs(3600),
        };
        let first = match cmds.recv_timeout(timeout) {
            Ok(c) => Some(c),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut stop = false;
        for cmd in first
            .into_iter()
            .chain(std::iter::from_fn(|| cmds.try_recv().ok()))
        {
            match cmd {
                Command::Claim(a) => {
                    claimed.insert(a);
                    touched.push(a);
                    // Busy again: the heartbeat resumes its short period from now.
                    next_ping = next_ping.min(Instant::now() + cfg.ping_interval);
                }
                Command::Release(a) => {
                    claimed.remove(&a);
                    touched.push(a);
                }
                Command::Prompt(on) => prompt = on,
                Command::Connected {
                    generation,
                    stream,
                    quiet: q,
                    prompts,
                } => {
                    conn = Some((generation, stream));
                    resend_all = true;
                    (quiet, proved) = (q, false);
                    // A connection starts off.
                    told = prompts.then_some(false);
                    // A first Pong soon proves the new connection, busy or idle.
                    next_ping = Instant::now() + cfg.ping_interval;
                }
                Command::Disconnected { generation } => {
                    if conn.as_ref().is_some_and(|(g, _)| *g == generation) {
                        conn = None;
                    }
                }
                Command::Stop => stop = true,
            }
        }
        shared
            .claimed
            .store(claimed.len() as u64, Ordering::Relaxed);
        if stop || shared.stopped() {
            break;
        }
        let Some((_, stream)) = &mut conn else {
            // Nothing to tell: a new connection gets the whole set anyway.
            touched.clear();
            continue;
        };
        out.clear();
        let mut frames = 0u64;
        if resend_all {
            resend_all = false;
            touched.clear();
            let all: Vec<SocketAddrV4> = claimed.iter().copied().collect();
            for chunk in all.chunks(MAX_ADDRS_PER_FRAME) {
                frames += u64::from(encode_claim(chunk, &mut out).is_ok());
            }
        } else if !touched.is_empty() {
            touched.sort_unstable();
            touched.dedup();
            let (claims, releases): (Vec<_>, Vec<_>) =
                touched.drain(..).partition(|a| claimed.contains(a));
            for chunk in claims.chunks(MAX_ADDRS_PER_FRAME) {
                frames += u64::from(encode_claim(chunk, &mut out).is_ok());
            }
            for chunk in releases.chunks(MAX_ADDRS_PER_FRAME) {
                frames += u64::from(encode_release(chunk, &mut out).is_ok());
            }
        }
        if told.is_some_and(|t| t != prompt) {
            frames += u64::from(encode_prompt(prompt, &mut out).is_ok());
            told = Some(prompt);
        }
        let now = Instant::now();
        let silent = quiet && proved && claimed.is_empty();
        if now >= next_ping && !silent {
            nonce = nonce.wrapping_add(1);
            frames += u64::from(encode_ping(nonce, &mut out).is_ok());
            proved = true;
            next_ping = now
                + if claimed.is_empty() {
                    cfg.idle_ping_interval
                } else {
                    cfg.ping_interval
                };
        }
        if out.is_empty() {
            continue;
        }
        match stream.write_all(&out) {
            Ok(()) => bump(&shared.frames_out, frames),
            Err(e) => {
                tracing::debug!("writing to intercept failed: {e}");
                // The connection thread notices, reports it and reconnects.
                let _ = stream.shutdown(Shutdown::Both);
                conn = None;
            }
        }
    }
    if let Some((_, s)) = conn {
        let _ = s.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::auth::NONCE_LEN;
    use common::control::{
        encode_challenge, encode_feedback, encode_welcome, CopierMessage, PROTOCOL_VERSION,
    };
    use std::net::{Ipv4Addr, TcpListener};

    fn addr(n: u8) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, n), 40000)
    }

    /// A hand-driven intercept on 127.0.0.1: accepts one connection, challenges it and says
    /// Welcome, with a proof made with `secret` (`None`: an intercept without a secret).
    fn accept_with(
        l: &TcpListener,
        secret: Option<&Secret>,
    ) -> (TcpStream, FrameDecoder<CopierMessage>) {
        accept_granting(l, secret, 0)
    }

    /// `accept_with`, granting `features` in the Welcome.
    fn accept_granting(
        l: &TcpListener,
        secret: Option<&Secret>,
        features: u32,
    ) -> (TcpStream, FrameDecoder<CopierMessage>) {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut dec = FrameDecoder::new();
        match next(&mut s, &mut dec) {
            CopierMessage::Hello(h) => assert_eq!(h.name, "t"),
            other => panic!("expected Hello, got {other:?}"),
        }
        let nonce = [0x42; NONCE_LEN];
        let mut out = Vec::new();
        encode_challenge(
            &Challenge {
                nonce,
                secret_required: secret.is_some(),
            },
            &mut out,
        )
        .unwrap();
        s.write_all(&out).unwrap();
        let auth = match next(&mut s, &mut dec) {
            CopierMessage::Auth(a) => a,
            other => panic!("expected Auth, got {other:?}"),
        };
        let mut out = Vec::new();
        let welcome = Welcome {
            version: PROTOCOL_VERSION,
            name: "fake".into(),
            payload_prefix: 64,
            mysql_head: Some(16),
            features,
            proof: secret.map(|k| k.intercept_proof(&nonce, &auth.nonce)),
        };
        encode_welcome(&welcome, &mut out).unwrap();
        s.write_all(&out).unwrap();
        (s, dec)
    }

    fn accept_welcomed(l: &TcpListener) -> (TcpStream, FrameDecoder<CopierMessage>) {
        accept_with(l, None)
    }

    fn next(s: &mut TcpStream, dec: &mut FrameDecoder<CopierMessage>) -> CopierMessage {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(m) = dec.next_message().unwrap() {
                return m;
            }
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "client closed");
            dec.feed(&buf[..n]);
        }
    }

    /// Reads frames until the claimed set (as the server would track it) equals `want`.
    fn await_claims(
        s: &mut TcpStream,
        dec: &mut FrameDecoder<CopierMessage>,
        have: &mut HashSet<SocketAddrV4>,
        want: &[SocketAddrV4],
    ) {
        let want: HashSet<_> = want.iter().copied().collect();
        while *have != want {
            match next(s, dec) {
                CopierMessage::Claim(a) => have.extend(a),
                CopierMessage::Release(a) => a.iter().for_each(|x| {
                    have.remove(x);
                }),
                CopierMessage::Ping(_) | CopierMessage::Prompt(_) => {}
                CopierMessage::Hello(_) => panic!("second Hello"),
                CopierMessage::Auth(_) => panic!("second Auth"),
                CopierMessage::Doctor(_) => panic!("a running copier never asks the doctor"),
            }
        }
    }

    #[test]
    fn claims_are_sent_as_net_state_and_resent_after_a_reconnect() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..ClientConfig::new(l.local_addr().unwrap(), Hello::new("t"), None)
        };
        let (handle, mut rx) = ControlClient::spawn_with(config, || {}).unwrap();
        handle.claim(addr(1));
        let (mut s, mut dec) = accept_welcomed(&l);
        let mut have = HashSet::new();
        await_claims(&mut s, &mut dec, &mut have, &[addr(1)]);

        handle.claim(addr(2));
        handle.claim(addr(3));
        handle.release(addr(1));
        await_claims(&mut s, &mut dec, &mut have, &[addr(2), addr(3)]);

        // Feedback reaches the engine, which reads it off the socket.
        let (fb, frame) = feedback_frame(addr(2), 1);
        s.write_all(&frame).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            Relayed::Feedback(vec![fb])
        );

        // Garbage from intercept: the engine's read ends the connection, and the client comes
        // back with all of its claims, including one made in between.
        s.write_all(&[0, 0, 0, 0]).unwrap();
        handle.release(addr(3));
        handle.claim(addr(4));
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        let (mut s2, mut dec2) = accept_welcomed(&l);
        let mut have2 = HashSet::new();
        await_claims(&mut s2, &mut dec2, &mut have2, &[addr(2), addr(4)]);
        let st = handle.stats();
        assert_eq!(st.connects, 2);
        assert_eq!(st.claimed, 2);
        handle.shutdown();
    }

    /// The next frame that is not a Ping.
    fn next_but_pings(s: &mut TcpStream, dec: &mut FrameDecoder<CopierMessage>) -> CopierMessage {
        loop {
            match next(s, dec) {
                CopierMessage::Ping(_) => {}
                other => return other,
            }
        }
    }

    #[test]
    fn prompts_are_told_as_they_change_again_after_a_reconnect_and_only_if_granted() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig::new(
            l.local_addr().unwrap(),
            Hello::new("t").with_features(FEATURE_PROMPT_ON_DEMAND),
            None,
        );
        let (handle, rx) = ControlClient::spawn_with(config, || {}).unwrap();
        // The engine's reads notice a connection's end.
        let engine = read_until_stopped(rx);
        let (mut s, mut dec) = accept_granting(&l, None, FEATURE_PROMPT_ON_DEMAND);
        // A connection starts off: off again says nothing; on, on, off say on, then off.
        handle.prompt(false);
        handle.prompt(true);
        handle.prompt(true);
        handle.prompt(false);
        handle.claim(addr(1));
        let (mut got, mut claimed) = (Vec::new(), false);
        while !claimed || got.last() == Some(&true) {
            match next_but_pings(&mut s, &mut dec) {
                CopierMessage::Prompt(on) => got.push(on),
                CopierMessage::Claim(_) => claimed = true,
                other => panic!("unexpected {other:?}"),
            }
        }
        // Commands taken in one turn are told as their net state: on then off may say nothing.
        assert!(got == [true, false] || got.is_empty(), "{got:?}");
        // On, and the connection lost: the next one is told at once.
        handle.prompt(true);
        assert_eq!(
            next_but_pings(&mut s, &mut dec),
            CopierMessage::Prompt(true)
        );
        drop(s);
        let (mut s, mut dec) = accept_granting(&l, None, FEATURE_PROMPT_ON_DEMAND);
        let mut told = false;
        while !told {
            match next_but_pings(&mut s, &mut dec) {
                CopierMessage::Prompt(on) => told = on,
                CopierMessage::Claim(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        // An intercept that did not grant the feature is never told.
        drop(s);
        let (mut s, mut dec) = accept_granting(&l, None, 0);
        // Its claims resent: the copier has taken the connection.
        assert_eq!(
            next_but_pings(&mut s, &mut dec),
            CopierMessage::Claim(vec![addr(1)])
        );
        handle.prompt(false);
        handle.prompt(true);
        handle.release(addr(1));
        assert_eq!(
            next_but_pings(&mut s, &mut dec),
            CopierMessage::Release(vec![addr(1)])
        );
        handle.shutdown();
        engine.join().unwrap();
    }

    /// A client that has claimed an address and gives a silent connection up after 300 ms,
    /// reconnecting within 50 ms, and the listener it connects to.
    fn claimed_with_short_timeout() -> (TcpListener, ControlHandle, RelayedReceiver) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            idle_timeout: Duration::from_millis(300),
            ..ClientConfig::new(l.local_addr().unwrap(), Hello::new("t"), None)
        };
        let (handle, rx) = ControlClient::spawn_with(config, || {}).unwrap();
        handle.claim(addr(1));
        (l, handle, rx)
    }

    #[test]
    fn a_claimed_connection_that_stays_silent_is_ended_by_the_engines_reads() {
        let (l, handle, mut rx) = claimed_with_short_timeout();
        // No Pong ever: the reads find the connection silent past the timeout.
        let (_s, _dec) = accept_welcomed(&l);
        let started = Instant::now();
        while handle.stats().connects < 1 {
            thread::sleep(Duration::from_millis(5));
        }
        // Nothing read, nothing ended, however long the engine stays away.
        thread::sleep(Duration::from_millis(400));
        assert_eq!(handle.stats().connects, 1);
        assert!(handle.stats().connected);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        let (_s2, _dec2) = accept_welcomed(&l);
        assert!(started.elapsed() >= Duration::from_millis(300));
        handle.shutdown();
    }

    /// Each turn's read ends at the first one that leaves the socket empty; a peer that
    /// keeps sending a byte now and then, never a whole frame, must still count as silent.
    #[test]
    fn bytes_that_never_make_a_frame_are_silence() {
        let (l, handle, mut rx) = claimed_with_short_timeout();
        let (mut s, _dec) = accept_welcomed(&l);
        // A Feedback frame announced at 64 KiB whose body comes a byte every 10 ms: done in
        // ten minutes, long after the connection must have been given up.
        let stop = Arc::new(AtomicBool::new(false));
        let trickling = Arc::clone(&stop);
        let trickle = thread::spawn(move || {
            let mut head = (64u32 * 1024).to_be_bytes().to_vec();
            head.push(0x83);
            if s.write_all(&head).is_ok() {
                while !trickling.load(Ordering::Relaxed) && s.write_all(&[0]).is_ok() {
                    thread::sleep(Duration::from_millis(10));
                }
            }
        });
        // The engine's turns, each when the socket has something to read, as a busy copier's
        // are: every read finds a byte, none finds the socket empty.
        let deadline = Instant::now() + Duration::from_secs(5);
        while rx.fd().is_none() {
            assert!(Instant::now() < deadline, "no connection handed over");
            let _ = rx.recv_timeout(Duration::from_millis(10));
        }
        while let Some(fd) = rx.fd() {
            assert!(
                Instant::now() < deadline,
                "a trickle of bytes kept the connection alive"
            );
            crate::waker::wait_readable(&[fd], Duration::from_secs(1));
            assert!(rx.try_recv().is_err());
        }
        let (_s2, _dec2) = accept_welcomed(&l);
        stop.store(true, Ordering::Relaxed);
        trickle.join().unwrap();
        handle.shutdown();
    }

    #[test]
    fn frames_right_behind_the_welcome_reach_the_engine() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig::new(l.local_addr().unwrap(), Hello::new("t"), None);
        let (handle, mut rx) = ControlClient::spawn_with(config, || {}).unwrap();
        let server = thread::spawn(move || {
            let (mut s, _dec) = accept_welcomed(&l);
            let (fb, frame) = feedback_frame(addr(7), 9);
            s.write_all(&frame).unwrap();
            (s, fb)
        });
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let (_s, fb) = server.join().unwrap();
        assert_eq!(got, Relayed::Feedback(vec![fb]));
        assert_eq!(handle.stats().feedback_received, 1);
        handle.shutdown();
    }

    /// A test server's segment toward `client`, and intercept's frame relaying it.
    fn feedback_frame(client: SocketAddrV4, seq: u32) -> (TestFeedback, Vec<u8>) {
        let fb = TestFeedback {
            client,
            server: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306),
            seq,
            ack: 2,
            flags: common::wire::TcpFlags(0x12),
            window: 1,
            options: Default::default(),
            payload_len: 0,
            payload_prefix: Vec::new(),
        };
        let mut out = Vec::new();
        encode_feedback(std::slice::from_ref(&fb), &mut out).unwrap();
        (fb, out)
    }

    /// What the engine thread does with the receiver, on a thread of its own, until the
    /// client stops.
    fn read_until_stopped(mut rx: RelayedReceiver) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            while !matches!(
                rx.recv_timeout(Duration::from_millis(20)),
                Err(RecvTimeoutError::Disconnected)
            ) {}
        })
    }

    #[test]
    fn a_quiet_idle_connection_pings_once_then_only_while_something_is_claimed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig {
            ping_interval: Duration::from_millis(20),
            idle_ping_interval: Duration::from_millis(40),
            // Far below the silence below: only a quiet reader survives it.
            idle_timeout: Duration::from_millis(50),
            ..ClientConfig::new(
                l.local_addr().unwrap(),
                Hello::new("t").with_features(FEATURE_QUIET_IDLE),
                None,
            )
        };
        let (handle, _rx) = ControlClient::spawn_with(config, || {}).unwrap();
        let (mut s, mut dec) = accept_granting(&l, None, FEATURE_QUIET_IDLE);
        // The first Ping proves the new connection.
        assert!(matches!(next(&mut s, &mut dec), CopierMessage::Ping(_)));
        // Then nothing while idle: no Ping in ten idle periods, and the copier keeps the
        // connection (closed, the read would return 0 instead of timing out).
        s.set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        let mut b = [0u8; 64];
        let e = s.read(&mut b).map(|n| n.to_string()).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        assert_eq!(handle.stats().connects, 1);
        // A claim brings the heartbeat back.
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        handle.claim(addr(1));
        let mut pings = 0;
        let mut claimed = false;
        while pings < 2 || !claimed {
            match next(&mut s, &mut dec) {
                CopierMessage::Ping(_) => pings += 1,
                CopierMessage::Claim(a) => claimed = a == [addr(1)],
                other => panic!("unexpected {other:?}"),
            }
        }
        handle.shutdown();
    }

    fn wait_until(mut cond: impl FnMut() -> bool, what: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn an_intercept_that_cannot_prove_the_secret_is_refused() {
        let key = Secret::new(b"the real shared secret").unwrap();
        let impostor = Secret::new(b"some other secret entirely").unwrap();
        for intercept_secret in [Some(&impostor), None] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let config = ClientConfig {
                backoff_min: Duration::from_secs(5),
                ..ClientConfig::new(l.local_addr().unwrap(), Hello::new("t"), Some(key.clone()))
            };
            let (handle, _rx) = ControlClient::spawn_with(config, || {}).unwrap();
            if intercept_secret.is_some() {
                let _conn = accept_with(&l, intercept_secret);
                wait_until(|| handle.last_reject().is_some(), "the refusal");
                let why = handle.refused_before_welcome().unwrap();
                assert!(why.contains("did not prove"), "{why}");
            } else {
                // An intercept without a secret: the copier does not even answer its Challenge.
                let (mut s, _) = l.accept().unwrap();
                let mut dec = FrameDecoder::<CopierMessage>::new();
                assert!(matches!(next(&mut s, &mut dec), CopierMessage::Hello(_)));
                let mut out = Vec::new();
                let ch = Challenge {
                    nonce: [1; NONCE_LEN],
                    secret_required: false,
                };
                encode_challenge(&ch, &mut out).unwrap();
                s.write_all(&out).unwrap();
                wait_until(|| handle.last_reject().is_some(), "the refusal");
                let why = handle.last_reject().unwrap();
                assert!(why.contains("--secret-file"), "{why}");
            }
            let st = handle.stats();
            assert_eq!((st.connects, st.rejects), (0, 1));
            handle.shutdown();
        }
    }

    #[test]
    fn a_copier_with_the_secret_checks_intercepts_proof_and_connects() {
        let key = Secret::new(b"the real shared secret").unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig::new(l.local_addr().unwrap(), Hello::new("t"), Some(key.clone()));
        let (handle, _rx) = ControlClient::spawn_with(config, || {}).unwrap();
        let _conn = accept_with(&l, Some(&key));
        wait_until(|| handle.stats().connected, "the connection");
        assert_eq!(handle.refused_before_welcome(), None);
        handle.shutdown();
    }
}
