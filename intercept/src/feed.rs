//! The way to one copier: what is written to it ([`Outgoing`], [`Batch`]), its bounded queue
//! ([`CopierTx`], [`QueueGauge`]) and its socket ([`Feed`]). What the relay hands over for one
//! copier (feedback batches, and the reader's Pongs and doctor reports) is encoded and written
//! to the copier's control socket at once, by the thread that has it, with a send that never
//! waits.
//!
//! Handing every batch to a writer thread instead cost a thread wakeup and a cross-thread wake
//! per relayed batch: under load, a third of intercept's context switches and a tenth of its
//! CPU (docs/BENCHMARKS.md). The writer thread stays, for what the socket cannot take now: a
//! send that would block leaves its rest to the writer, and until the writer has caught up,
//! everything after it queues behind in the copier's bounded queue ([`CopierTx`]),
//! so the copier reads frames in the order they were handed over.
//!
//! This room must never block its caller (the capture thread) on a copier, nor reorder what it
//! was handed: the busy flag and the queue are only ever touched under the feed's lock.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};

use common::control::{
    encode_doctor_report, encode_feedback, encode_mysql, encode_pong, MysqlEvent, TestFeedback,
};

/// Most bytes the writer coalesces from the queue into one write.
const COALESCE_BYTES: usize = 256 * 1024;

/// What is written to a copier.
#[derive(Debug, PartialEq, Eq)]
pub enum Outgoing {
    Batch(Batch),
    Pong(u64),
    /// The answer to a copier's doctor.
    Doctor(common::control::DoctorReport),
}

/// One flush for one copier, queued as a unit so that a full queue drops both parts or neither.
/// Written as a Feedback frame, then a Mysql frame (each only when not empty).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub feedback: Vec<TestFeedback>,
    /// Events of segments whose feedback is in `feedback` or in an earlier batch.
    pub mysql: Vec<MysqlEvent>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.feedback.is_empty() && self.mysql.is_empty()
    }

    /// Bytes the batch occupies in memory (its vectors' capacity and the heap parts of its
    /// items), for the queue's byte bound (`--max-memory`).
    pub fn memory_len(&self) -> usize {
        use std::mem::size_of;
        self.feedback.capacity() * size_of::<TestFeedback>()
            + self
                .feedback
                .iter()
                .map(TestFeedback::heap_len)
                .sum::<usize>()
            + self.mysql.capacity() * size_of::<MysqlEvent>()
            + self.mysql.iter().map(MysqlEvent::heap_len).sum::<usize>()
    }
}

/// The relay's way to one copier: its socket, written at once while the socket takes it
/// (a [`Feed`]), and otherwise its queue toward its writer thread: bounded in batches by
/// the channel, and in bytes twice: this copier's share (`max_bytes`) and all copiers' queues
/// together (`max_total`), so neither one slow copier nor many can pass `--max-memory`'s part.
/// The writer gives bytes back through its [`QueueGauge`]. A batch that would pass a bound is
/// dropped and counted.
#[derive(Clone, Debug)]
pub struct CopierTx {
    tx: SyncSender<Outgoing>,
    gauge: QueueGauge,
    max_bytes: usize,
    max_total: usize,
    /// The copier's socket, written directly while its writer is not busy (see
    /// [`Feed`]); `None`: every message goes through the queue (tests).
    feed: Option<Arc<Feed>>,
}

/// Bytes queued toward one copier, and toward all of them.
#[derive(Clone, Debug, Default)]
pub struct QueueGauge {
    mine: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl QueueGauge {
    /// What the writer calls for each message it took off the queue.
    pub fn taken(&self, m: &Outgoing) {
        if let Outgoing::Batch(b) = m {
            let n = b.memory_len();
            self.mine.fetch_sub(n, Ordering::Relaxed);
            self.total.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Counts `n` bytes held toward this copier outside the queue (a direct write's rest).
    pub fn add(&self, n: usize) {
        self.mine.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back what [`QueueGauge::add`] counted.
    pub fn sub(&self, n: usize) {
        self.mine.fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes queued toward this copier now.
    pub fn queued(&self) -> usize {
        self.mine.load(Ordering::Relaxed)
    }
}

impl CopierTx {
    /// `total` is shared by every copier's queue (at most `max_total` bytes together).
    pub fn new(
        tx: SyncSender<Outgoing>,
        max_bytes: usize,
        total: Arc<AtomicUsize>,
        max_total: usize,
    ) -> Self {
        Self {
            tx,
            gauge: QueueGauge {
                mine: Arc::new(AtomicUsize::new(0)),
                total,
            },
            max_bytes,
            max_total,
            feed: None,
        }
    }

    /// Writes through `feed` whenever its writer is not busy.
    pub fn with_feed(mut self, feed: Arc<Feed>) -> Self {
        self.feed = Some(feed);
        self
    }

    /// The gauge the writer thread gives bytes back to.
    pub fn gauge(&self) -> QueueGauge {
        self.gauge.clone()
    }

    /// Writes `m` to the copier now, or queues it unless a bound (batches or bytes) is
    /// reached; never blocks.
    pub fn try_send(&self, m: Outgoing) -> Result<(), TrySendError<Outgoing>> {
        match &self.feed {
            Some(feed) => feed.send(m, |m| self.queue(m)),
            None => self.queue(m),
        }
    }

    fn queue(&self, m: Outgoing) -> Result<(), TrySendError<Outgoing>> {
        let bytes = match &m {
            Outgoing::Batch(b) => b.memory_len(),
            _ => 0,
        };
        let g = &self.gauge;
        let mine = g.mine.fetch_add(bytes, Ordering::Relaxed);
        let total = g.total.fetch_add(bytes, Ordering::Relaxed);
        let over = bytes > 0
            && (mine.saturating_add(bytes) > self.max_bytes
                || total.saturating_add(bytes) > self.max_total);
        let r = if over {
            Err(TrySendError::Full(m))
        } else {
            self.tx.try_send(m)
        };
        if r.is_err() {
            g.mine.fetch_sub(bytes, Ordering::Relaxed);
            g.total.fetch_sub(bytes, Ordering::Relaxed);
        }
        r
    }
}

/// Unbounded in bytes (tests, and callers that bound the channel only in batches).
impl From<SyncSender<Outgoing>> for CopierTx {
    fn from(tx: SyncSender<Outgoing>) -> Self {
        Self::new(tx, usize::MAX, Arc::default(), usize::MAX)
    }
}

/// The feeds' counters, shared by every copier's (the control server's status reads them).
#[derive(Debug, Default)]
pub struct FeedCounters {
    /// Connections closed because the copier did not read its feedback.
    pub write_failures: AtomicU64,
    /// Messages that could not be encoded (a bug, never expected).
    pub encode_errors: AtomicU64,
}

/// One copier's socket and who may write to it now.
#[derive(Debug)]
pub struct Feed {
    stream: TcpStream,
    state: Mutex<FeedState>,
    writer: OnceLock<Thread>,
    gauge: QueueGauge,
    counters: Arc<FeedCounters>,
}

#[derive(Debug, Default)]
struct FeedState {
    /// While `busy`: the unsent rest of the last direct write, for the writer. Otherwise
    /// scratch space for the next encoding (kept to save an allocation per batch).
    buf: Vec<u8>,
    /// The writer owns the socket: handed-over messages go to the queue, behind its work.
    busy: bool,
    /// The connection is over (a failed write, or its reader ended it).
    closed: bool,
}

impl Feed {
    /// `stream` must be a blocking socket with a write timeout: the writer's writes block, at
    /// most that long, and the feed's own sends never do. `gauge` counts the rest a direct
    /// write left for the writer, beside the queue's bytes; `counters` are the control
    /// server's (write failures, encode errors).
    pub fn new(stream: TcpStream, gauge: QueueGauge, counters: Arc<FeedCounters>) -> Arc<Self> {
        Arc::new(Feed {
            stream,
            state: Mutex::new(FeedState::default()),
            writer: OnceLock::new(),
            gauge,
            counters,
        })
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        // Nothing under this lock can panic halfway through an update that matters.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `m` now if the socket takes it, or leaves the rest to the writer; while the
    /// writer is busy, hands `m` to `queue` (the copier's bounded queue) instead, under the
    /// lock, so that it is written after the writer's work. Never blocks.
    pub fn send(
        &self,
        m: Outgoing,
        queue: impl FnOnce(Outgoing) -> Result<(), TrySendError<Outgoing>>,
    ) -> Result<(), TrySendError<Outgoing>> {
        let mut st = self.lock();
        if st.closed {
            return Err(TrySendError::Disconnected(m));
        }
        if st.busy {
            return queue(m);
        }
        st.buf.clear();
        encode_outgoing(&m, &mut st.buf, &self.counters);
        let sent = match ops::nowait::send_now(&self.stream, &st.buf) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("write to a copier failed: {e}");
                st.closed = true;
                drop(st);
                // The reader sees the shutdown, reports the disconnect and drops its claims.
                let _ = self.stream.shutdown(Shutdown::Both);
                self.wake_writer();
                return Err(TrySendError::Disconnected(m));
            }
        };
        if sent < st.buf.len() {
            st.buf.drain(..sent);
            self.gauge.add(st.buf.len());
            st.busy = true;
            drop(st);
            self.wake_writer();
        } else if st.buf.capacity() > 4 * COALESCE_BYTES {
            // A capture burst can leave a large buffer behind; do not keep it per copier.
            st.buf = Vec::new();
        }
        Ok(())
    }

    /// Ends the feed: the writer exits. Called by the connection's reader when it ends.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        if st.busy {
            self.gauge.sub(st.buf.len());
            st.buf = Vec::new();
        }
        drop(st);
        self.wake_writer();
    }

    fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }
}

/// Closes its feed when dropped: the writer ends however its connection's reader does (an
/// early return included), since it parks rather than waiting on its queue.
pub struct CloseOnDrop(pub Arc<Feed>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Starts `feed`'s writer thread, which takes over whenever a direct write could not finish,
/// writes the rest and then the queue (`rx`) with blocking writes, and hands the socket back
/// once the queue is empty.
pub fn spawn_writer(
    feed: &Arc<Feed>,
    rx: Receiver<Outgoing>,
    name: String,
) -> io::Result<thread::JoinHandle<()>> {
    let f = Arc::clone(feed);
    let h = thread::Builder::new()
        .name(name)
        .spawn(move || write_loop(&f, &rx))?;
    let _ = feed.writer.set(h.thread().clone());
    Ok(h)
}

fn write_loop(feed: &Feed, rx: &Receiver<Outgoing>) {
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        {
            let mut st = feed.lock();
            if st.closed {
                break;
            }
            if !st.busy {
                drop(st);
                // Unparked by a send that left bytes behind and by `close`; a token left by
                // an earlier unpark only costs one more pass.
                thread::park();
                continue;
            }
            out.clear();
            if st.buf.is_empty() {
                while out.len() < COALESCE_BYTES {
                    match rx.try_recv() {
                        Ok(m) => {
                            feed.gauge.taken(&m);
                            encode_outgoing(&m, &mut out, &feed.counters);
                        }
                        Err(_) => break,
                    }
                }
                if out.is_empty() {
                    // Caught up, checked under the lock the senders queue under: the next
                    // message is written directly, after everything before it.
                    st.busy = false;
                    continue;
                }
            } else {
                std::mem::swap(&mut out, &mut st.buf);
                feed.gauge.sub(out.len());
            }
        }
        if let Err(e) = (&feed.stream).write_all(&out) {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                feed.counters.write_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("copier stopped reading its feedback; closing its connection");
            }
            feed.close();
            let _ = feed.stream.shutdown(Shutdown::Both);
            break;
        }
        // A capture burst can leave a large buffer behind; do not keep it per copier forever.
        if out.capacity() > 4 * COALESCE_BYTES {
            out = Vec::with_capacity(64 * 1024);
        }
    }
    // What the queue still holds goes with the connection; its bytes go back to the total all
    // copiers share. Nothing is queued once the feed is closed.
    while let Ok(m) = rx.try_recv() {
        feed.gauge.taken(&m);
    }
}

/// Appends `m`'s frames to `out`.
pub fn encode_outgoing(m: &Outgoing, out: &mut Vec<u8>, counters: &FeedCounters) {
    let res = match m {
        // Feedback first: the copier must know a segment before the MySQL packets framed
        // from it. Each part is encoded on its own, so a bad one cannot take the other along.
        Outgoing::Batch(b) => {
            let fb = if b.feedback.is_empty() {
                Ok(())
            } else {
                encode_feedback(&b.feedback, out)
            };
            let my = if b.mysql.is_empty() {
                Ok(())
            } else {
                // Encoded just before it is written: the copier dates each reply back from the
                // frame's arrival by how long it waited here.
                encode_mysql(common::clock::realtime_us(), &b.mysql, out)
            };
            fb.and(my)
        }
        Outgoing::Pong(n) => encode_pong(*n, out),
        Outgoing::Doctor(d) => encode_doctor_report(d, out),
    };
    if let Err(e) = res {
        counters.encode_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!("cannot encode a message for a copier (dropped): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::control::{FrameDecoder, InterceptMessage};
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::mpsc::sync_channel;
    use std::time::{Duration, Instant};

    const WAIT: Duration = Duration::from_secs(10);

    /// A connected pair on loopback with small buffers (ours, theirs), and a feed on ours.
    fn pair(queue: usize) -> (CopierTx, Arc<Feed>, thread::JoinHandle<()>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        socket2::SockRef::from(&ours)
            .set_send_buffer_size(4096)
            .unwrap();
        socket2::SockRef::from(&theirs)
            .set_recv_buffer_size(4096)
            .unwrap();
        ours.set_write_timeout(Some(WAIT)).unwrap();
        theirs.set_read_timeout(Some(WAIT)).unwrap();
        let (tx, rx) = sync_channel(queue);
        let tx = CopierTx::new(tx, usize::MAX, Arc::default(), usize::MAX);
        let feed = Feed::new(ours, tx.gauge(), Arc::default());
        let writer = spawn_writer(&feed, rx, "test-tx".into()).unwrap();
        (tx.with_feed(Arc::clone(&feed)), feed, writer, theirs)
    }

    fn pongs(s: &mut TcpStream, dec: &mut FrameDecoder<InterceptMessage>, n: usize) -> Vec<u64> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < n {
            match dec.next_message().unwrap() {
                Some(InterceptMessage::Pong(k)) => got.push(k),
                Some(m) => panic!("unexpected {m:?}"),
                None => {
                    let r = s
                        .read(&mut buf)
                        .expect("the copier's feed within the timeout");
                    assert!(r > 0, "the feed closed after {} pongs", got.len());
                    dec.feed(&buf[..r]);
                }
            }
        }
        got
    }

    #[test]
    fn what_the_socket_cannot_take_waits_behind_the_writer_in_order() {
        let (tx, _feed, _writer, mut theirs) = pair(64);
        // The copier does not read: the socket fills, the writer blocks, the queue fills.
        let accepted: Vec<u64> = (0..20_000u64)
            .filter(|&n| tx.try_send(Outgoing::Pong(n)).is_ok())
            .collect();
        assert!(
            accepted.len() < 20_000,
            "a copier that does not read must fill its socket and its queue"
        );
        // Now it reads: everything accepted arrives, in the order it was handed over.
        let mut dec = FrameDecoder::new();
        assert_eq!(pongs(&mut theirs, &mut dec, accepted.len()), accepted);
        // Caught up: the writer hands the socket back and the next one is written at once.
        let until = Instant::now() + WAIT;
        loop {
            assert!(Instant::now() < until, "the writer never caught up");
            if tx.try_send(Outgoing::Pong(u64::MAX)).is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pongs(&mut theirs, &mut dec, 1), [u64::MAX]);
        assert_eq!(tx.gauge().queued(), 0, "no bytes left counted");
    }

    #[test]
    fn a_closed_feed_gives_its_queued_bytes_back() {
        let (tx, feed, writer, theirs) = pair(1000);
        let server = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(198, 18, 0, 3), 3306);
        let batch = |seq| {
            Outgoing::Batch(Batch {
                feedback: vec![TestFeedback {
                    client: std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(198, 18, 0, 9), 1),
                    server,
                    seq,
                    ack: 0,
                    flags: common::wire::TcpFlags(common::wire::TcpFlags::ACK),
                    window: 100,
                    options: common::wire::TcpOptions::default(),
                    payload_len: 0,
                    payload_prefix: Vec::new(),
                }],
                mysql: Vec::new(),
            })
        };
        // The copier does not read: the socket fills and batches queue behind the writer.
        for seq in 0..20_000 {
            let _ = tx.try_send(batch(seq));
        }
        assert!(
            tx.gauge().queued() > 0,
            "batches queued behind a full socket"
        );
        // Its reader ends the connection while the writer is busy; the copier still reads, so
        // the writer's write finishes and it finds the feed closed, with batches still queued.
        feed.close();
        let mut theirs = theirs;
        theirs
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while matches!(theirs.read(&mut buf), Ok(n) if n > 0) {}
        });
        let (done_tx, done) = sync_channel(1);
        thread::spawn(move || {
            let _ = writer.join();
            let _ = done_tx.send(());
        });
        done.recv_timeout(WAIT).expect("the writer thread to exit");
        assert_eq!(tx.gauge().queued(), 0, "every queued byte given back");
    }

    #[test]
    fn a_copier_that_went_away_ends_its_writer() {
        let (tx, feed, writer, theirs) = pair(4);
        drop(theirs);
        let until = Instant::now() + WAIT;
        while !matches!(
            tx.try_send(Outgoing::Pong(1)),
            Err(TrySendError::Disconnected(_))
        ) {
            assert!(
                Instant::now() < until,
                "writes to a closed copier kept succeeding"
            );
            thread::sleep(Duration::from_millis(1));
        }
        feed.close();
        let (done_tx, done) = sync_channel(1);
        thread::spawn(move || {
            let _ = writer.join();
            let _ = done_tx.send(());
        });
        done.recv_timeout(WAIT).expect("the writer thread to exit");
    }
}
