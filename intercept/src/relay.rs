//! Who gets which feedback: the map from mirrored client address to the copier that owns it,
//! and each copier's pending batch.
//!
//! The relay is owned by the capture thread alone (no lock on the hot path); the control
//! server's threads talk to it through [`RelayEvent`]s. It must never block: a copier whose
//! queue is full loses that batch (counted), so one slow copier cannot stall capture for all.
//!
//! A segment's MySQL events go wherever its feedback goes, in the same [`Batch`] (the feedback
//! frame first): a copier never learns of a MySQL packet before the segment that carried it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddrV4;
use std::sync::mpsc::TrySendError;
use std::time::Duration;

use common::control::{
    MysqlEvent, TestFeedback, FEATURE_PAYLOAD_HASHES, FEATURE_PROMPT_REPLIES, FEATURE_ROW_RUNS,
    MAX_FEEDBACK_PER_FRAME, MAX_MYSQL_EVENTS_PER_FRAME,
};

pub use crate::feed::{Batch, CopierTx, Outgoing, QueueGauge};

/// A control connection, numbered in accept order.
pub type CopierId = u64;

/// Most addresses one copier may own at once; past it claims are ignored (counted) and those
/// sessions' feedback is broadcast instead, which still works, only less efficiently.
pub const MAX_CLAIMS_PER_COPIER: usize = 1 << 20;

/// Changes to the routing table, sent by the control server's reader threads.
#[derive(Clone, Debug)]
pub enum RelayEvent {
    /// A copier completed its handshake; `tx` is the way to it.
    Connected {
        id: CopierId,
        name: String,
        tx: CopierTx,
        /// The features granted in its Welcome (`common::control::FEATURE_*`).
        features: u32,
    },
    Claim {
        id: CopierId,
        addrs: Vec<SocketAddrV4>,
    },
    Release {
        id: CopierId,
        addrs: Vec<SocketAddrV4>,
    },
    /// The copier's last Prompt (`FEATURE_PROMPT_ON_DEMAND`): one of its sessions waits on
    /// the test server, or none does.
    Prompt { id: CopierId, on: bool },
    /// The connection is gone; its claims are dropped with it.
    Disconnected { id: CopierId },
}

/// Counters of the relay, all monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Feedback for a claimed address, sent to its owner only.
    pub routed: u64,
    /// Feedback for an unclaimed address (typically a SYN-ACK racing its Claim), broadcast.
    pub unclaimed: u64,
    /// Feedback that no copier could receive because none was connected.
    pub no_copier: u64,
    /// Items handed to copiers' queues (a broadcast counts once per copier).
    pub relayed: u64,
    /// Items dropped because a copier's queue was full or its connection was closing.
    pub dropped_queue_full: u64,
    /// MySQL events handed to copiers' queues (a broadcast counts once per copier).
    pub mysql_relayed: u64,
    /// MySQL events dropped with their batch (queue full, connection closing).
    pub mysql_dropped: u64,
    /// MySQL events of sessions with no copier connected at all.
    pub mysql_no_copier: u64,
    /// Addresses claimed / released.
    pub claims: u64,
    pub releases: u64,
    /// Claims that took an address away from another copier (the newest claim wins).
    pub claims_moved: u64,
    /// Claims ignored because the copier already owned [`MAX_CLAIMS_PER_COPIER`] addresses.
    pub claims_refused: u64,
}

struct Link {
    name: String,
    features: u32,
    /// Its last Prompt said on.
    prompt: bool,
    tx: CopierTx,
    pending: Batch,
    owned: usize,
    /// Set while the queue overflows, so that each overflow episode is logged once.
    overflowing: bool,
}

/// The gathering while a copier's sessions wait on the test server (its Prompt said on): the
/// 1 ms that was `--relay-flush-us`'s default before Prompt. Not nothing: at 1,000
/// connections a test server slow to answer the logins and prepares keeps some session
/// waiting for seconds, and replies handed over one by one meanwhile cost intercept more than
/// the 4 ms gathering saved (issue 20, docs/BENCHMARKS.md).
pub const PROMPT_GATHER: Duration = Duration::from_millis(1);

pub struct Relay {
    owners: HashMap<SocketAddrV4, CopierId>,
    // Ordered so that broadcasts and flushes happen in a stable order (easier to test and read).
    links: BTreeMap<CopierId, Link>,
    batch_limit: usize,
    /// Items routed since the last flush of every copier: bounds how long a quiet copier's
    /// batch can wait while other copiers keep the capture busy.
    since_flush: usize,
    /// Reused list of copier ids for broadcasts (which push while iterating the links).
    scratch: Vec<CopierId>,
    stats: RelayStats,
    /// Connected copiers that asked for payload hashes.
    hashing_links: usize,
    /// Connected copiers that do not know row runs.
    unfolded_links: usize,
}

impl Relay {
    /// `batch_limit` items at most per Feedback frame (clamped to what a frame can hold).
    pub fn new(batch_limit: usize) -> Self {
        Relay {
            owners: HashMap::new(),
            links: BTreeMap::new(),
            batch_limit: batch_limit.clamp(1, MAX_FEEDBACK_PER_FRAME),
            since_flush: 0,
            scratch: Vec::new(),
            stats: RelayStats::default(),
            hashing_links: 0,
            unfolded_links: 0,
        }
    }

    /// Whether any connected copier asked for MySQL payload hashes (`--compare-results`): the
    /// framer then hashes for everyone (a copier that did not ask ignores them; 8 bytes a
    /// packet).
    pub fn wants_payload_hashes(&self) -> bool {
        self.hashing_links > 0
    }

    /// Whether result sets may be folded into runs: every connected copier knows them
    /// (`FEATURE_ROW_RUNS`). Payload hashes turn folding off as well (see the framer's caller).
    pub fn wants_row_runs(&self) -> bool {
        self.unfolded_links == 0
    }

    /// How long the capture lets replies gather after a wakeup, `period` being
    /// `--relay-flush-us`: not at all while a copier times replies; at most
    /// [`PROMPT_GATHER`] while a copier's sessions wait on the test server (Prompt).
    pub fn gather_for(&self, period: Duration) -> Duration {
        let mut gather = period;
        for l in self.links.values() {
            if l.features & FEATURE_PROMPT_REPLIES != 0 {
                return Duration::ZERO;
            }
            if l.prompt {
                gather = gather.min(PROMPT_GATHER);
            }
        }
        gather
    }

    pub fn apply(&mut self, ev: RelayEvent) {
        match ev {
            RelayEvent::Connected {
                id,
                name,
                tx,
                features,
            } => {
                if features & FEATURE_PAYLOAD_HASHES != 0 {
                    self.hashing_links += 1;
                }
                if features & FEATURE_ROW_RUNS == 0 {
                    self.unfolded_links += 1;
                }
                let old = self.links.insert(
                    id,
                    Link {
                        name,
                        features,
                        prompt: false,
                        tx,
                        pending: Batch::default(),
                        owned: 0,
                        overflowing: false,
                    },
                );
                if old
                    .as_ref()
                    .is_some_and(|l| l.features & FEATURE_PAYLOAD_HASHES != 0)
                {
                    self.hashing_links -= 1;
                }
                if old
                    .as_ref()
                    .is_some_and(|l| l.features & FEATURE_ROW_RUNS == 0)
                {
                    self.unfolded_links -= 1;
                }
            }
            RelayEvent::Claim { id, addrs } => self.claim(id, &addrs),
            RelayEvent::Release { id, addrs } => self.release(id, &addrs),
            RelayEvent::Prompt { id, on } => {
                if let Some(link) = self.links.get_mut(&id) {
                    link.prompt = on;
                }
            }
            RelayEvent::Disconnected { id } => self.disconnect(id),
        }
    }

    fn claim(&mut self, id: CopierId, addrs: &[SocketAddrV4]) {
        let Some(link) = self.links.get(&id) else {
            // A claim queued behind its connection's end: the connection and claims are gone.
            return;
        };
        let mut owned = link.owned;
        for &a in addrs {
            match self.owners.get(&a).copied() {
                Some(o) if o == id => {}
                Some(_) if owned >= MAX_CLAIMS_PER_COPIER => self.stats.claims_refused += 1,
                Some(prev) => {
                    // A copier that claims an address has just opened a session with it: the
                    // previous owner's session is stale (e.g. the address came back from a pool).
                    if let Some(l) = self.links.get_mut(&prev) {
                        l.owned -= 1;
                    }
                    self.owners.insert(a, id);
                    owned += 1;
                    self.stats.claims += 1;
                    self.stats.claims_moved += 1;
                }
                None if owned >= MAX_CLAIMS_PER_COPIER => self.stats.claims_refused += 1,
                None => {
                    self.owners.insert(a, id);
                    owned += 1;
                    self.stats.claims += 1;
                }
            }
        }
        if let Some(l) = self.links.get_mut(&id) {
            l.owned = owned;
        }
    }

    fn release(&mut self, id: CopierId, addrs: &[SocketAddrV4]) {
        for a in addrs {
            // Only the owner may release: a late Release from the previous owner must not undo
            // the new owner's claim.
            if self.owners.get(a) == Some(&id) {
                self.owners.remove(a);
                self.stats.releases += 1;
                if let Some(l) = self.links.get_mut(&id) {
                    l.owned -= 1;
                }
            }
        }
    }

    fn disconnect(&mut self, id: CopierId) {
        let Some(link) = self.links.remove(&id) else {
            return;
        };
        if link.features & FEATURE_PAYLOAD_HASHES != 0 {
            self.hashing_links -= 1;
        }
        if link.features & FEATURE_ROW_RUNS == 0 {
            self.unfolded_links -= 1;
        }
        if link.owned > 0 {
            self.owners.retain(|_, o| *o != id);
        }
        tracing::debug!(
            copier = %link.name,
            claims = link.owned,
            pending = link.pending.feedback.len(),
            "dropped the claims of a disconnected copier"
        );
        self.stats.dropped_queue_full += link.pending.feedback.len() as u64;
        self.stats.mysql_dropped += link.pending.mysql.len() as u64;
    }

    /// Queues one feedback for its owner, or for every copier if nobody owns its address.
    pub fn route(&mut self, fb: TestFeedback) {
        self.route_segment(fb, &mut Vec::new());
    }

    /// Queues one segment's feedback, then the MySQL events framed from it (drained from
    /// `mysql`; all of them are about `fb.client`), for its owner or for every copier.
    pub fn route_segment(&mut self, fb: TestFeedback, mysql: &mut Vec<MysqlEvent>) {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        match self.owners.get(&fb.client).copied() {
            Some(id) => {
                self.stats.routed += 1;
                ids.push(id);
            }
            None if self.links.is_empty() => {
                self.stats.no_copier += 1;
                self.stats.mysql_no_copier += mysql.len() as u64;
            }
            None => {
                self.stats.unclaimed += 1;
                ids.extend(self.links.keys().copied());
            }
        }
        if let Some((&last, rest)) = ids.split_last() {
            for &id in rest {
                self.push(id, fb.clone(), mysql.iter().cloned());
            }
            self.push(last, fb, mysql.drain(..));
        }
        mysql.clear();
        self.scratch = ids;
        self.since_flush += 1;
        if self.since_flush >= self.batch_limit {
            self.flush();
        }
    }

    fn push(&mut self, id: CopierId, fb: TestFeedback, mysql: impl Iterator<Item = MysqlEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let pending = &mut link.pending;
        if pending.feedback.capacity() == 0 {
            pending.feedback.reserve_exact(self.batch_limit);
        }
        pending.feedback.push(fb);
        // A segment can hold hundreds of small rows: its events may span several batches,
        // the first of which carries the segment's feedback.
        for ev in mysql {
            link.pending.mysql.push(ev);
            if link.pending.mysql.len() >= MAX_MYSQL_EVENTS_PER_FRAME {
                Self::send(link, &mut self.stats);
            }
        }
        // Checked after the events, so a segment's feedback and events usually share a batch
        // and are delivered or dropped together.
        if link.pending.feedback.len() >= self.batch_limit {
            Self::send(link, &mut self.stats);
        }
    }

    /// Sends every pending batch. Called whenever the capture has nothing more to read right
    /// now, so a lone reply waits for no timer.
    pub fn flush(&mut self) {
        self.since_flush = 0;
        for link in self.links.values_mut() {
            if !link.pending.is_empty() {
                Self::send(link, &mut self.stats);
            }
        }
    }

    fn send(link: &mut Link, stats: &mut RelayStats) {
        let batch = std::mem::take(&mut link.pending);
        let n = batch.feedback.len() as u64;
        let m = batch.mysql.len() as u64;
        match link.tx.try_send(Outgoing::Batch(batch)) {
            Ok(()) => {
                stats.relayed += n;
                stats.mysql_relayed += m;
                if link.overflowing {
                    link.overflowing = false;
                    tracing::info!(copier = %link.name, "copier keeps up again; feedback flows");
                }
            }
            Err(TrySendError::Full(_)) => {
                stats.dropped_queue_full += n;
                stats.mysql_dropped += m;
                if !link.overflowing {
                    link.overflowing = true;
                    tracing::warn!(
                        copier = %link.name,
                        "copier's queue is full: dropping its feedback until it catches up \
                         (its sessions will stall or retransmit; check the copier's host and the network to it)"
                    );
                }
            }
            // The writer is gone; the Disconnected event is on its way.
            Err(TrySendError::Disconnected(_)) => {
                stats.dropped_queue_full += n;
                stats.mysql_dropped += m;
            }
        }
    }

    /// Connected copiers.
    pub fn copiers(&self) -> usize {
        self.links.len()
    }

    /// Addresses currently owned by some copier.
    pub fn claimed(&self) -> usize {
        self.owners.len()
    }

    pub fn owner(&self, addr: &SocketAddrV4) -> Option<CopierId> {
        self.owners.get(addr).copied()
    }

    pub fn stats(&self) -> RelayStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::wire::{TcpFlags, TcpOptions};
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{sync_channel, Receiver};
    use std::sync::Arc;

    fn client(n: u8) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, n), 40000)
    }

    fn fb(to: SocketAddrV4, seq: u32) -> TestFeedback {
        TestFeedback {
            client: to,
            server: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 3306),
            seq,
            ack: 0,
            flags: TcpFlags(TcpFlags::ACK),
            window: 100,
            options: TcpOptions::default(),
            payload_len: 0,
            payload_prefix: Vec::new(),
        }
    }

    #[test]
    fn payload_hashes_are_on_while_a_copier_that_asked_is_connected() {
        let mut r = Relay::new(16);
        let _a = connect(&mut r, 1, 4);
        assert!(!r.wants_payload_hashes());
        let (tx, _b) = sync_channel(4);
        r.apply(RelayEvent::Connected {
            id: 2,
            name: "hashing".into(),
            tx: tx.into(),
            features: FEATURE_PAYLOAD_HASHES,
        });
        assert!(r.wants_payload_hashes());
        r.apply(RelayEvent::Disconnected { id: 1 });
        assert!(r.wants_payload_hashes());
        r.apply(RelayEvent::Disconnected { id: 2 });
        r.apply(RelayEvent::Disconnected { id: 2 });
        assert!(!r.wants_payload_hashes());
    }

    const PERIOD: Duration = Duration::from_millis(4);

    #[test]
    fn replies_are_prompt_while_a_copier_that_times_them_is_connected() {
        let mut r = Relay::new(16);
        assert_eq!(r.gather_for(PERIOD), PERIOD);
        let _a = connect(&mut r, 1, 4);
        assert_eq!(r.gather_for(PERIOD), PERIOD);
        let (tx, _b) = sync_channel(4);
        r.apply(RelayEvent::Connected {
            id: 2,
            name: "report".into(),
            tx: tx.into(),
            features: FEATURE_PROMPT_REPLIES,
        });
        assert_eq!(r.gather_for(PERIOD), Duration::ZERO);
        // A Prompt does not make such a copier's replies any later.
        r.apply(RelayEvent::Prompt { id: 1, on: true });
        assert_eq!(r.gather_for(PERIOD), Duration::ZERO);
        r.apply(RelayEvent::Disconnected { id: 2 });
        assert_eq!(r.gather_for(PERIOD), PROMPT_GATHER);
    }

    #[test]
    fn replies_gather_less_while_a_copier_says_a_session_waits_on_the_test_server() {
        let mut r = Relay::new(16);
        let _a = connect(&mut r, 1, 4);
        let _b = connect(&mut r, 2, 4);
        r.apply(RelayEvent::Prompt { id: 2, on: true });
        assert_eq!(r.gather_for(PERIOD), PROMPT_GATHER);
        // Never longer than the configured period.
        assert_eq!(
            r.gather_for(Duration::from_micros(300)),
            Duration::from_micros(300)
        );
        r.apply(RelayEvent::Prompt { id: 1, on: false });
        assert_eq!(
            r.gather_for(PERIOD),
            PROMPT_GATHER,
            "another copier's off changes nothing"
        );
        r.apply(RelayEvent::Prompt { id: 2, on: false });
        assert_eq!(r.gather_for(PERIOD), PERIOD);
        r.apply(RelayEvent::Prompt { id: 1, on: true });
        r.apply(RelayEvent::Disconnected { id: 1 });
        assert_eq!(r.gather_for(PERIOD), PERIOD, "gone with its connection");
        // A Prompt queued behind its connection's end names nobody.
        r.apply(RelayEvent::Prompt { id: 1, on: true });
        assert_eq!(r.gather_for(PERIOD), PERIOD);
    }

    fn connect(r: &mut Relay, id: CopierId, cap: usize) -> Receiver<Outgoing> {
        let (tx, rx) = sync_channel(cap);
        r.apply(RelayEvent::Connected {
            id,
            name: format!("c{id}"),
            tx: tx.into(),
            features: 0,
        });
        rx
    }

    fn seqs(rx: &Receiver<Outgoing>) -> Vec<u32> {
        rx.try_iter()
            .flat_map(|m| match m {
                Outgoing::Batch(b) => b.feedback.into_iter().map(|f| f.seq).collect(),
                Outgoing::Pong(_) | Outgoing::Doctor(_) => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn claimed_feedback_goes_to_its_owner_only() {
        let mut r = Relay::new(16);
        let a = connect(&mut r, 1, 8);
        let b = connect(&mut r, 2, 8);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        r.apply(RelayEvent::Claim {
            id: 2,
            addrs: vec![client(11)],
        });
        r.route(fb(client(10), 1));
        r.route(fb(client(11), 2));
        r.flush();
        assert_eq!(seqs(&a), [1]);
        assert_eq!(seqs(&b), [2]);
        assert_eq!(r.stats().routed, 2);
    }

    #[test]
    fn unclaimed_feedback_is_broadcast_and_counted() {
        let mut r = Relay::new(16);
        let a = connect(&mut r, 1, 8);
        let b = connect(&mut r, 2, 8);
        r.route(fb(client(10), 7));
        r.flush();
        assert_eq!(seqs(&a), [7]);
        assert_eq!(seqs(&b), [7]);
        let s = r.stats();
        assert_eq!((s.unclaimed, s.relayed), (1, 2));
    }

    #[test]
    fn broadcast_reaches_every_copier() {
        let mut r = Relay::new(16);
        let rxs: Vec<_> = (0..12).map(|id| connect(&mut r, id, 4)).collect();
        r.route(fb(client(10), 5));
        r.flush();
        for rx in &rxs {
            assert_eq!(seqs(rx), [5]);
        }
    }

    #[test]
    fn feedback_without_any_copier_is_counted_as_lost() {
        let mut r = Relay::new(16);
        r.route(fb(client(10), 1));
        assert_eq!(r.stats().no_copier, 1);
    }

    #[test]
    fn disconnect_drops_claims_so_later_replies_are_broadcast() {
        let mut r = Relay::new(16);
        let a = connect(&mut r, 1, 8);
        let b = connect(&mut r, 2, 8);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10), client(12)],
        });
        r.apply(RelayEvent::Disconnected { id: 1 });
        drop(a);
        assert_eq!(r.claimed(), 0);
        assert_eq!(r.copiers(), 1);
        r.route(fb(client(10), 3));
        r.flush();
        assert_eq!(seqs(&b), [3]);
        // A claim queued behind the disconnect is ignored.
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        assert_eq!(r.owner(&client(10)), None);
    }

    #[test]
    fn newest_claim_wins_and_a_stale_release_does_not_undo_it() {
        let mut r = Relay::new(16);
        let _a = connect(&mut r, 1, 8);
        let _b = connect(&mut r, 2, 8);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        r.apply(RelayEvent::Claim {
            id: 2,
            addrs: vec![client(10)],
        });
        r.apply(RelayEvent::Release {
            id: 1,
            addrs: vec![client(10)],
        });
        assert_eq!(r.owner(&client(10)), Some(2));
        assert_eq!(r.stats().claims_moved, 1);
        r.apply(RelayEvent::Release {
            id: 2,
            addrs: vec![client(10)],
        });
        assert_eq!(r.owner(&client(10)), None);
    }

    #[test]
    fn full_batches_leave_without_waiting_for_a_flush() {
        let mut r = Relay::new(3);
        let a = connect(&mut r, 1, 8);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        for s in 0..7 {
            r.route(fb(client(10), s));
        }
        assert_eq!(seqs(&a), [0, 1, 2, 3, 4, 5]);
        r.flush();
        assert_eq!(seqs(&a), [6]);
    }

    #[test]
    fn a_quiet_copier_is_not_starved_by_a_busy_one() {
        let mut r = Relay::new(4);
        let quiet = connect(&mut r, 1, 64);
        let _busy = connect(&mut r, 2, 64);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        r.apply(RelayEvent::Claim {
            id: 2,
            addrs: vec![client(11)],
        });
        r.route(fb(client(10), 1));
        // The capture never goes idle, yet the quiet copier's lone item leaves within a batch.
        for s in 0..4 {
            r.route(fb(client(11), 100 + s));
        }
        assert_eq!(seqs(&quiet), [1]);
    }

    #[test]
    fn a_queue_full_in_bytes_drops_and_counts_until_the_writer_takes_some() {
        let mut r = Relay::new(1);
        let (tx, rx) = sync_channel(1000);
        // Room for two one-item batches, whatever the channel's count allows.
        let one = Batch {
            feedback: vec![fb(client(10), 0)],
            mysql: Vec::new(),
        }
        .memory_len();
        let total = Arc::new(AtomicUsize::new(0));
        let tx = CopierTx::new(tx, 2 * one, Arc::clone(&total), 3 * one);
        let gauge = tx.gauge();
        r.apply(RelayEvent::Connected {
            id: 1,
            name: "slow".into(),
            tx,
            features: 0,
        });
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        for s in 0..5 {
            r.route(fb(client(10), s));
        }
        assert_eq!(r.stats().dropped_queue_full, 3);
        assert_eq!(gauge.queued(), 2 * one);
        assert_eq!(total.load(Ordering::Relaxed), 2 * one);
        // The writer takes one: room for one more.
        let m = rx.try_recv().unwrap();
        gauge.taken(&m);
        r.route(fb(client(10), 9));
        assert_eq!(r.stats().dropped_queue_full, 3);
        assert_eq!(seqs(&rx), [1, 9]);
        // Other copiers' queues count toward the total: with 2 of 3 taken elsewhere, this one
        // gets one batch however much of its own share is left.
        seqs(&rx);
        gauge.taken(&Outgoing::Batch(Batch {
            feedback: vec![fb(client(10), 1)],
            mysql: Vec::new(),
        }));
        gauge.taken(&Outgoing::Batch(Batch {
            feedback: vec![fb(client(10), 9)],
            mysql: Vec::new(),
        }));
        total.fetch_add(2 * one, Ordering::Relaxed);
        for s in 20..23 {
            r.route(fb(client(10), s));
        }
        assert_eq!(seqs(&rx), [20]);
        assert_eq!(r.stats().dropped_queue_full, 5);
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let mut r = Relay::new(1);
        let a = connect(&mut r, 1, 2);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        for s in 0..5 {
            r.route(fb(client(10), s));
        }
        assert_eq!(r.stats().dropped_queue_full, 3);
        assert_eq!(seqs(&a), [0, 1]);
        // Room again: feedback flows again.
        r.route(fb(client(10), 9));
        assert_eq!(seqs(&a), [9]);
    }

    fn lost(to: SocketAddrV4, at_seq: u32) -> MysqlEvent {
        MysqlEvent::FramingLost { client: to, at_seq }
    }

    /// Everything a copier received, flattened: feedback as `F(seq)`, events as `M(at_seq)`.
    fn log(rx: &Receiver<Outgoing>) -> Vec<String> {
        rx.try_iter()
            .flat_map(|m| match m {
                Outgoing::Batch(b) => b
                    .feedback
                    .iter()
                    .map(|f| format!("F{}", f.seq))
                    .chain(b.mysql.iter().map(|e| match e {
                        MysqlEvent::FramingLost { at_seq, .. } => format!("M{at_seq}"),
                        MysqlEvent::FramingResumed { at_seq, .. } => format!("S{at_seq}"),
                        MysqlEvent::Packet { packet, .. } => format!("P{}", packet.tcp_seq),
                        MysqlEvent::Rows { rows, .. } => format!("R{}", rows.count),
                    }))
                    .collect::<Vec<_>>(),
                Outgoing::Pong(_) | Outgoing::Doctor(_) => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn mysql_events_follow_their_segments_feedback_to_the_same_copiers() {
        let mut r = Relay::new(16);
        let a = connect(&mut r, 1, 8);
        let b = connect(&mut r, 2, 8);
        r.apply(RelayEvent::Claim {
            id: 1,
            addrs: vec![client(10)],
        });
        r.route_segment(fb(client(10), 1), &mut vec![lost(client(10), 1)]);
        r.route_segment(fb(client(11), 2), &mut vec![lost(client(11), 2)]);
        r.route(fb(client(10), 3));
        r.flush();
        assert_eq!(log(&a), ["F1", "F2", "F3", "M1", "M2"]);
        assert_eq!(log(&b), ["F2", "M2"], "unclaimed: broadcast, events too");
        let s = r.stats();
        assert_eq!((s.mysql_relayed, s.mysql_dropped), (3, 0));
    }

    #[test]
    fn a_segment_with_many_events_spans_batches_after_its_feedback() {
        let mut r = Relay::new(4);
        let a = connect(&mut r, 1, 64);
        let n = MAX_MYSQL_EVENTS_PER_FRAME + 5;
        let mut evs: Vec<_> = (0..n as u32).map(|i| lost(client(10), i)).collect();
        r.route_segment(fb(client(10), 7), &mut evs);
        assert!(evs.is_empty(), "drained");
        r.flush();
        let batches: Vec<_> = a.try_iter().collect();
        assert_eq!(batches.len(), 2);
        match &batches[0] {
            Outgoing::Batch(b) => {
                assert_eq!(b.feedback.len(), 1);
                assert_eq!(b.mysql.len(), MAX_MYSQL_EVENTS_PER_FRAME);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.stats().mysql_relayed, n as u64);
    }

    #[test]
    fn a_full_queue_drops_feedback_and_events_together() {
        let mut r = Relay::new(1);
        let a = connect(&mut r, 1, 1);
        r.route_segment(fb(client(10), 1), &mut vec![lost(client(10), 1)]);
        r.route_segment(fb(client(10), 2), &mut vec![lost(client(10), 2)]);
        r.flush();
        let s = r.stats();
        assert_eq!((s.relayed, s.mysql_relayed), (1, 1));
        assert_eq!((s.dropped_queue_full, s.mysql_dropped), (1, 1));
        assert_eq!(log(&a), ["F1", "M1"]);
    }
}
