//! [`StateLookup`]: the lookup worker thread and its handle. Requests go through a bounded
//! channel (full: counted), are batched for [`BATCH_WINDOW`], and answers come back through a
//! channel plus the engine loop's waker.
//!
//! Must never block the engine thread: the handle's calls only send, receive without waiting,
//! or read counters.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::mysql::RecoveredState;

use super::client::{check, open, MysqlClient, OwnAddress, Readiness};
use super::dsn::ProdDsn;
use super::error::ProdError;
use super::queries::{Job, LookupAnswer, LookupRequest, Reads};
use super::read::{lookup_batch, Found, Wanted};
use super::snapshot::Snapshot;
use super::{BATCH_WINDOW, MAX_BATCH, QUEUE_CAP, SNAPSHOT_TTL};

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requested: AtomicU64,
    pub(super) answered: AtomicU64,
    pub(super) not_found: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) queries: AtomicU64,
    pub(super) from_snapshot: AtomicU64,
    pub(super) snapshot_connections: AtomicU64,
    pub(super) snapshot_queries: AtomicU64,
}

/// Lookup counters, for the status and the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupStats {
    /// Picked-up connections asked about.
    pub requested: u64,
    /// Found on production (state recovered).
    pub answered: u64,
    /// Not in PROCESSLIST any more (or never matched).
    pub not_found: u64,
    /// The lookup failed (production unreachable, refused, broken reply).
    pub failed: u64,
    /// Not asked: the request queue was full.
    pub dropped: u64,
    /// Statements the lookups ran on production (all SELECTs; neither the start-up check's nor
    /// the start snapshot's: those run once as the copier starts, see `snapshot_queries`).
    pub queries: u64,
    /// Of `answered`, those the start snapshot answered ([`Snapshot`]).
    pub from_snapshot: u64,
    /// Connections the start snapshot read.
    pub snapshot_connections: u64,
    /// Statements the start snapshot ran on production (SELECTs).
    pub snapshot_queries: u64,
}

impl LookupStats {
    /// Adds another worker's lookups (`--workers`): each worker has its own lookup thread and
    /// reads its own start snapshot, of the same connections.
    pub fn merge(&mut self, o: &LookupStats) {
        self.requested += o.requested;
        self.answered += o.answered;
        self.not_found += o.not_found;
        self.failed += o.failed;
        self.dropped += o.dropped;
        self.queries += o.queries;
        self.from_snapshot += o.from_snapshot;
        self.snapshot_connections = self.snapshot_connections.max(o.snapshot_connections);
        self.snapshot_queries += o.snapshot_queries;
    }

    /// Picked-up connections that log in with the defaults instead of their own state.
    pub fn not_recovered(&self) -> u64 {
        self.not_found + self.failed + self.dropped
    }
}

/// The lookup worker: one thread, one connection to production, fed by the engine thread.
pub struct StateLookup {
    pub(super) requests: Option<SyncSender<Job>>,
    pub(super) answers: Receiver<LookupAnswer>,
    pub(super) counters: Arc<Counters>,
    pub(super) own: OwnAddress,
    /// Set by `Drop`: the worker abandons what is still queued instead of looking it up.
    pub(super) stop: Arc<AtomicBool>,
    /// Set by [`StateLookup::forget_snapshot`]: the start snapshot answers no more.
    pub(super) forget: Arc<AtomicBool>,
    pub(super) started: Instant,
    pub(super) worker: Option<JoinHandle<()>>,
}

impl StateLookup {
    /// Logs in once and checks the account's grants (an error here should stop the copier:
    /// the operator asked for recovery and would silently not get it), then starts the worker.
    /// `wake` wakes the engine loop when answers are ready.
    pub fn start(
        dsn: ProdDsn,
        wake: impl Fn() + Send + 'static,
    ) -> Result<(Self, Readiness), ProdError> {
        let own = OwnAddress::default();
        let mut conn = open(&dsn, &own)?;
        let ready = check(&mut conn, &dsn.user)?;
        let (req_tx, req_rx) = mpsc::sync_channel(QUEUE_CAP);
        let (ans_tx, ans_rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let forget = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            dsn,
            conn: Some(conn),
            own: own.clone(),
            stop: Arc::clone(&stop),
            forget: Arc::clone(&forget),
            snapshot: None,
            counters: Arc::clone(&counters),
            wanted: Wanted::from(&ready),
            logged: HashSet::new(),
        };
        let handle = std::thread::Builder::new()
            .name("prod-state".into())
            .spawn(move || worker.run(req_rx, ans_tx, wake))?;
        Ok((
            Self {
                requests: Some(req_tx),
                answers: ans_rx,
                counters,
                own,
                stop,
                forget,
                started: Instant::now(),
                worker: Some(handle),
            },
            ready,
        ))
    }

    /// Asks about a picked-up connection. Never blocks: a full queue drops the request
    /// (counted) and returns false; the session then logs in with the defaults.
    pub fn request(&self, client: SocketAddrV4, mirrored: SocketAddrV4) -> bool {
        self.counters.requested.fetch_add(1, Ordering::Relaxed);
        let sent = self.send(Job::Lookup(LookupRequest { client, mirrored }));
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            // Its snapshot entry (if any) stays behind, and a later session of the same
            // connection (re-established) would find it stale.
            self.forget_snapshot();
        }
        sent
    }

    /// A session of `client` opened from its SYN, not picked up: while the start snapshot may
    /// answer, its entry for that address (a connection closed since) is removed.
    pub fn seen(&self, client: SocketAddrV4) {
        if self.snapshot_may_answer() && !self.send(Job::Seen(client)) {
            self.forget_snapshot();
        }
    }

    fn send(&self, job: Job) -> bool {
        self.requests
            .as_ref()
            .is_some_and(|tx| match tx.try_send(job) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            })
    }

    /// Whether the start snapshot may still answer a request. While it may, the capture must
    /// say whether it dropped anything ([`StateLookup::forget_snapshot`]) before the driver
    /// asks about a connection it just picked up.
    pub fn snapshot_may_answer(&self) -> bool {
        !self.forget.load(Ordering::Relaxed) && self.started.elapsed() <= SNAPSHOT_TTL
    }

    /// The capture dropped packets: one may have been a command of a connection the copier
    /// has not seen yet, which the start snapshot would then describe wrongly. Requests made
    /// after this call are looked up on production.
    pub fn forget_snapshot(&self) {
        self.forget.store(true, Ordering::SeqCst);
    }

    pub fn try_answer(&self) -> Option<LookupAnswer> {
        self.answers.try_recv().ok()
    }

    /// Our own connection's address, for the capture to skip.
    pub fn own_address(&self) -> &OwnAddress {
        &self.own
    }

    pub fn stats(&self) -> LookupStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LookupStats {
            requested: get(&c.requested),
            answered: get(&c.answered),
            not_found: get(&c.not_found),
            failed: get(&c.failed),
            dropped: get(&c.dropped),
            queries: get(&c.queries),
            from_snapshot: get(&c.from_snapshot),
            snapshot_connections: get(&c.snapshot_connections),
            snapshot_queries: get(&c.snapshot_queries),
        }
    }
}

impl Drop for StateLookup {
    fn drop(&mut self) {
        // The stop flag makes the worker drop what is still queued (up to QUEUE_CAP requests:
        // with production unreachable each batch would cost a connect and a read timeout) and
        // skip any reconnect; closing the queue wakes it if idle. So shutdown waits at most for
        // the batch in flight (bounded by IO_TIMEOUT per step).
        self.stop.store(true, Ordering::SeqCst);
        self.requests = None;
        if let Some(h) = self.worker.take() {
            let _ = h.join();
        }
    }
}

pub(super) struct Worker {
    pub(super) dsn: ProdDsn,
    pub(super) conn: Option<MysqlClient<TcpStream>>,
    pub(super) own: OwnAddress,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) forget: Arc<AtomicBool>,
    pub(super) snapshot: Option<Snapshot>,
    pub(super) counters: Arc<Counters>,
    pub(super) wanted: Wanted,
    /// Failure kinds already logged: production being down must not flood the log.
    pub(super) logged: HashSet<String>,
}

impl Worker {
    pub(super) fn run(
        mut self,
        requests: Receiver<Job>,
        answers: mpsc::Sender<LookupAnswer>,
        wake: impl Fn(),
    ) {
        self.snapshot = self.read_snapshot();
        while let Some(batch) = next_batch(&requests) {
            // Checked right before the lookup, hence before any reconnect.
            if self.stopping() {
                return;
            }
            let mut misses = Vec::with_capacity(batch.len());
            for job in batch {
                let r = match job {
                    Job::Lookup(r) => r,
                    Job::Seen(client) => {
                        self.snapshot_forget_client(client);
                        continue;
                    }
                };
                let Some((state, reads)) = self.snapshot_answer(r.client) else {
                    misses.push(r);
                    continue;
                };
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
                self.counters.from_snapshot.fetch_add(1, Ordering::Relaxed);
                let answer = LookupAnswer {
                    mirrored: r.mirrored,
                    state: Some(state),
                    variables_read: reads,
                };
                if answers.send(answer).is_err() {
                    return;
                }
            }
            let batch = misses;
            if batch.is_empty() {
                wake();
                continue;
            }
            let ((mut found, reads), failed) = match self.lookup(&batch) {
                Ok(found) => (found, false),
                Err(e) => {
                    self.counters
                        .failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.report(&e);
                    // Reconnect on the next batch: the connection's state is unknown now.
                    self.conn = None;
                    ((HashMap::new(), Reads::default()), true)
                }
            };
            for r in &batch {
                let state = found.remove(&r.client).map(|(_, s)| s);
                if !failed {
                    let c = if state.is_some() {
                        &self.counters.answered
                    } else {
                        &self.counters.not_found
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                }
                if answers
                    .send(LookupAnswer {
                        mirrored: r.mirrored,
                        state,
                        variables_read: reads,
                    })
                    .is_err()
                {
                    return;
                }
            }
            wake();
        }
    }

    /// The start snapshot, on the connection `StateLookup::start` logged in with. A failure is
    /// said and costs nothing else: every picked-up connection is then looked up when seen.
    fn read_snapshot(&mut self) -> Option<Snapshot> {
        let conn = self.conn.as_mut()?;
        match Snapshot::read(conn, self.wanted, &self.counters.snapshot_queries) {
            Ok(s) if s.is_empty() => {
                self.forget.store(true, Ordering::SeqCst);
                None
            }
            Ok(s) => {
                let n = s.states.len() as u64;
                self.counters
                    .snapshot_connections
                    .store(n, Ordering::Relaxed);
                tracing::info!(
                    "--prod-dsn {}: read the state of {n} connections open on production; \
                     those picked up from now on start from it while the capture drops nothing",
                    self.dsn
                );
                Some(s)
            }
            Err(e) => {
                tracing::warn!(
                    "--prod-dsn {}: reading the connections open on production failed ({e}); \
                     each picked-up connection is looked up when it is seen",
                    self.dsn
                );
                self.conn = None;
                self.forget.store(true, Ordering::SeqCst);
                None
            }
        }
    }

    pub(super) fn snapshot_answer(
        &mut self,
        client: SocketAddrV4,
    ) -> Option<(RecoveredState, Reads)> {
        if self.forget.load(Ordering::SeqCst) {
            self.snapshot = None;
        }
        let snapshot = self.snapshot.as_mut()?;
        let hit = snapshot.take(client, Instant::now());
        if snapshot.is_empty() {
            // Nothing left to answer: the driver need not watch the capture's drops for it.
            self.snapshot = None;
            self.forget.store(true, Ordering::SeqCst);
        }
        hit
    }

    pub(super) fn snapshot_forget_client(&mut self, client: SocketAddrV4) {
        if let Some(s) = &mut self.snapshot {
            s.states.remove(&client);
        }
    }

    fn lookup(&mut self, batch: &[LookupRequest]) -> Result<Found, ProdError> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(open(&self.dsn, &self.own)?),
        };
        lookup_batch(conn, batch, self.wanted, &self.counters.queries)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn report(&mut self, e: &ProdError) {
        if self.logged.len() < 64 && self.logged.insert(e.kind()) {
            match e.fix(&self.dsn.user) {
                Some(fix) => tracing::warn!(
                    "--prod-dsn {}: {e}; pooled connections log in with the defaults until it \
                     works again (fix: {fix}; said once per kind of failure)",
                    self.dsn
                ),
                None => tracing::warn!(
                    "--prod-dsn {}: {e}; pooled connections log in with the defaults until it \
                     works again (said once per kind of failure)",
                    self.dsn
                ),
            }
        }
    }
}

/// Waits for a request, then gathers what else arrives within [`BATCH_WINDOW`] (at most
/// [`MAX_BATCH`]). `None` once the queue is closed and empty.
pub(super) fn next_batch<T>(requests: &Receiver<T>) -> Option<Vec<T>> {
    let first = requests.recv().ok()?;
    let mut batch = vec![first];
    let until = Instant::now() + BATCH_WINDOW;
    while batch.len() < MAX_BATCH {
        let left = until.saturating_duration_since(Instant::now());
        match requests.recv_timeout(left) {
            Ok(r) => batch.push(r),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    Some(batch)
}
