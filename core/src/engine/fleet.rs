//! Several engines driven as one: `--map` (several production ports or targets) and
//! `--multiply` (each captured connection mirrored N times).
//!
//! # What this room is for
//!
//! One [`Engine`] per route (production port -> target) and copy. A captured packet goes to
//! every engine of its production port; each copy opens its own session for it, from its own
//! mirrored address, with its own transform (so a MySQL copy logs in by itself and keeps its
//! own statement ids). What intercept relays, and `--prod-dsn` answers, are keyed by mirrored
//! address, so each engine gets its own equal slice of `--client-ip-pool` and everything
//! relayed goes to the engine whose slice holds the address: copies can never share a 4-tuple
//! with each other (nor with real clients, who are not in the pool), however many short
//! connections come and go, and no lookup table has to follow them.
//!
//! # What it must never do
//!
//! * Anything an [`Engine`] must not: no I/O, clocks, logging or randomness; never panic on
//!   untrusted input (what no engine owns is counted and dropped).
//! * Let two engines share a pool address, or run several engines without a pool (their
//!   sessions would all send from the real client's address): [`Fleet::new`] refuses.
//!
//! `--workers N`: each capture worker runs a fleet of its own ([`Fleet::for_worker`]); the pool
//! is cut into `workers x routes x copies` slices and worker `w` takes the `w`-th run of them,
//! so sessions of different workers never share a mirrored address either. Feedback for an
//! address in another worker's slices (intercept broadcasts what nobody has claimed yet) is
//! counted as foreign and dropped.
//!
//! Several `--target` for one production port ([`Fleet::spread`]): those routes share the
//! port's connections instead of each mirroring all of them. A connection goes to one of them,
//! chosen by a fixed hash of the client's address and port ([`placement`]), the same in every
//! copier run, so a restarted copier (or a connection picked up mid-stream) lands where it was.
//!
//! `--tee` ([`Fleet::tee`]): those routes each mirror every connection of the port (test A and
//! test B get the same traffic), the first route's `--sample` deciding for all of them.
//!
//! `max_sessions` applies per engine; `max_memory` is shared: each engine of each worker gets
//! an equal part (its per-session cap no more than a sixteenth of it, see `budget.rs`). `sample` is decided once per route, by one [`Sampler`]
//! that the route's copies share: its decisions depend on what it has seen (the share so far,
//! which connections it took), and one decision handed to every copy keeps the copies of a
//! connection all in or all out together, whatever each copy's own sessions went through
//! (one shed at `max_sessions`, another not), with one table of decisions instead of N.

use std::net::{Ipv4Addr, SocketAddrV4};

use common::clock::Instant;

use crate::observation::Observation;
use common::control::TestFeedback;
use common::wire::TcpPacket;

use super::pool::AddressPool;
use super::sample::{Sampler, Verdict};
use super::{Engine, EngineConfig, EngineEvent, EngineStats, Plaintext, TestEvent};

/// Why a fleet cannot be built; the messages say how to fix the command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FleetError {
    #[error("nothing to mirror: give a production port and a target")]
    NoRoutes,
    #[error(
        "{engines} mirrored copies of each connection (routes x --multiply) need distinct client \
         addresses: add --client-ip-pool CIDR, a range the test servers route to the intercept \
         host (e.g. 198.19.0.0/16)"
    )]
    NeedPool { engines: usize },
    #[error(
        "--client-ip-pool holds {usable} usable addresses, too few for {engines} mirrored copies \
         (routes x --multiply; each needs its own slice): use a larger pool, e.g. a /16"
    )]
    PoolTooSmall { usable: u32, engines: usize },
    #[error(
        "target {target} is inside --client-ip-pool: with several targets, choose a pool that \
         holds none of them"
    )]
    TargetInPool { target: SocketAddrV4 },
}

/// One production port mirrored to one target, `copies` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Route {
    prod_port: u16,
    /// Its engines are `first..first + copies`.
    first: usize,
    /// Whether an earlier route has the same production port (its packets are then already
    /// counted as captured there).
    port_seen_before: bool,
    /// `(position, size)` in its placement group ([`Fleet::spread`]): the route takes only the
    /// connections whose [`placement`] hash picks `position`.
    spread: Option<(u32, u32)>,
    /// `--tee`: an earlier route of the same port whose `--sample` verdict this one takes, so
    /// every target mirrors the same connections ([`Fleet::tee`]).
    decided_by: Option<usize>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Fleet {
    engines: Vec<Engine>,
    routes: Vec<Route>,
    /// `--sample`'s decisions, per route (index as `routes`).
    samplers: Vec<Option<Sampler>>,
    /// Each route's verdict on the packet being dispatched (read by the routes it decides for).
    verdicts: Vec<Verdict>,
    copies: usize,
    /// The whole pool, to find which engine's slice holds a mirrored address.
    pool: Option<AddressPool>,
    /// Round-robin start of `poll_transmit`, so one busy engine cannot starve the others.
    next_tx: usize,
    /// `(index, count)` of this fleet's capture worker (`(0, 1)` without `--workers`).
    worker: (u32, u32),
    /// Captured packets of no route's port.
    captured_ignored: u64,
    /// Relayed feedback and events for an address in no engine's slice.
    feedback_unrouted: u64,
    test_events_unrouted: u64,
    /// Relayed feedback for an address outside this fleet's slices (another worker's or
    /// another copier's; counted in `unrouted` too).
    feedback_foreign: u64,
    /// TLS plaintext bytes of connections `--sample` left out.
    tls_plain_not_sampled: u64,
}

impl Fleet {
    /// `routes` (production port, target), each mirrored `copies` times (at least 1). Every
    /// engine is made by `make` from `template` with its port, target and pool slice set.
    pub fn new(
        template: &EngineConfig,
        routes: &[(u16, SocketAddrV4)],
        copies: u32,
        make: impl FnMut(EngineConfig) -> Engine,
    ) -> Result<Self, FleetError> {
        Self::for_worker(template, routes, copies, (0, 1), make)
    }

    /// Like [`Fleet::new`], for capture worker `worker.0` of `worker.1` (`--workers`): its
    /// engines take their pool slices from the worker's own share of the pool.
    pub fn for_worker(
        template: &EngineConfig,
        routes: &[(u16, SocketAddrV4)],
        copies: u32,
        worker: (u32, u32),
        mut make: impl FnMut(EngineConfig) -> Engine,
    ) -> Result<Self, FleetError> {
        let workers = worker.1.max(1);
        let worker = (worker.0.min(workers - 1), workers);
        Self::check_workers(template, routes, copies, workers)?;
        let copies = copies.max(1) as usize;
        let count = routes.len() * copies;
        // Without a pool a lone engine per worker sends from the real client address: a
        // client flow lives on one worker only, so workers cannot collide.
        let slices = count as u32 * workers;
        let offset = worker.0 * count as u32;
        let pool = template
            .client_ip_pool
            .and_then(|(net, prefix)| AddressPool::new(net, prefix, Ipv4Addr::UNSPECIFIED));
        let mut engines = Vec::with_capacity(count);
        let mut table = Vec::with_capacity(routes.len());
        let mut samplers = Vec::with_capacity(routes.len());
        for (r, &(prod_port, target)) in routes.iter().enumerate() {
            table.push(Route {
                prod_port,
                first: engines.len(),
                port_seen_before: routes[..r].iter().any(|(p, _)| *p == prod_port),
                spread: None,
                decided_by: None,
            });
            for _ in 0..copies {
                let mut cfg = template.clone();
                cfg.prod_port = prod_port;
                cfg.target = target;
                cfg.pool_slice = (offset + engines.len() as u32, slices);
                (cfg.max_memory, cfg.max_session_buffer) = super::budget::engine_share(
                    cfg.max_memory,
                    cfg.max_session_buffer,
                    slices as usize,
                );
                engines.push(make(cfg));
            }
            // The route decides for its copies: theirs are dropped unused.
            let first = table[r].first;
            samplers.push(engines[first].sampler.take());
            for e in &mut engines[first..] {
                e.sampler = None;
            }
        }
        Ok(Self {
            engines,
            verdicts: vec![Verdict::IN; table.len()],
            routes: table,
            samplers,
            copies,
            pool,
            next_tx: 0,
            worker,
            captured_ignored: 0,
            feedback_unrouted: 0,
            test_events_unrouted: 0,
            feedback_foreign: 0,
            tls_plain_not_sampled: 0,
        })
    }

    /// Whether [`Fleet::new`] would accept these arguments (without building any engine), so a
    /// command line can be refused before anything is opened.
    pub fn check(
        template: &EngineConfig,
        routes: &[(u16, SocketAddrV4)],
        copies: u32,
    ) -> Result<(), FleetError> {
        Self::check_workers(template, routes, copies, 1)
    }

    /// [`Fleet::check`] for `workers` capture workers, each with its own fleet and share of
    /// the pool.
    pub fn check_workers(
        template: &EngineConfig,
        routes: &[(u16, SocketAddrV4)],
        copies: u32,
        workers: u32,
    ) -> Result<(), FleetError> {
        if routes.is_empty() {
            return Err(FleetError::NoRoutes);
        }
        let copies = copies.max(1) as usize;
        let count = routes.len() * copies;
        // Only the pool is shared between workers: without one, each worker's lone engine
        // mirrors from the client's own address, which no other worker sees.
        let slices_total = u32::try_from(count)
            .unwrap_or(u32::MAX)
            .saturating_mul(workers.max(1));
        let pool = template
            .client_ip_pool
            .and_then(|(net, prefix)| AddressPool::new(net, prefix, Ipv4Addr::UNSPECIFIED));
        if count > 1 || (slices_total > 1 && pool.is_some()) {
            let (Some(pool), Some((net, prefix))) = (pool, template.client_ip_pool) else {
                return Err(FleetError::NeedPool { engines: count });
            };
            let slices = slices_total;
            let distinct_targets = {
                let mut t: Vec<Ipv4Addr> = routes.iter().map(|(_, t)| *t.ip()).collect();
                t.sort_unstable();
                t.dedup();
                t.len()
            };
            for (_, target) in routes {
                // One target inside the pool is excluded by its engines; another engine's
                // slice could still hand its address out.
                if distinct_targets > 1 && pool.slice_of(*target.ip(), 1).is_some() {
                    return Err(FleetError::TargetInPool { target: *target });
                }
                let with_target = AddressPool::new(net, prefix, *target.ip());
                let too_small = (0..slices).any(|i| {
                    with_target
                        .and_then(|p| p.slice(i, slices))
                        .is_none_or(|s| s.usable() == 0)
                });
                if too_small {
                    return Err(FleetError::PoolTooSmall {
                        usable: pool.usable(),
                        engines: slices as usize,
                    });
                }
            }
        }
        Ok(())
    }

    /// Spreads the connections of `prod_port` over the routes to `targets` (several
    /// `--target`): each connection goes to one of them (by [`placement`], in the order of
    /// `targets`) instead of to each. Routes of the port to other targets (`--map`) still get
    /// every connection.
    pub fn spread(&mut self, prod_port: u16, targets: &[SocketAddrV4]) {
        let size = targets.len() as u32;
        if size < 2 {
            return;
        }
        let mut first_seen = None;
        for r in &mut self.routes {
            if r.prod_port != prod_port {
                continue;
            }
            let target = self.engines[r.first].config().target;
            if let Some(pos) = targets.iter().position(|t| *t == target) {
                r.spread = Some((pos as u32, size));
                // The group's routes see disjoint packets: each counts its captures.
                match first_seen {
                    None => first_seen = Some(r.port_seen_before),
                    Some(before) => r.port_seen_before = before,
                }
            }
        }
    }

    /// Mirrors every connection of `prod_port` to each of the routes to `targets` (`--tee`),
    /// as routes do by default, and makes the first of them decide `--sample` for all: test A
    /// and test B must get the same connections, or their comparison compares different work.
    pub fn tee(&mut self, prod_port: u16, targets: &[SocketAddrV4]) {
        let mut first = None;
        for i in 0..self.routes.len() {
            let r = self.routes[i];
            let target = self.engines[r.first].config().target;
            if r.prod_port != prod_port || !targets.contains(&target) {
                continue;
            }
            match first {
                None => first = Some(i),
                Some(f) => {
                    self.routes[i].decided_by = Some(f);
                    self.samplers[i] = None;
                }
            }
        }
    }

    /// The target of the engine owning `mirrored`, if any (to find its intercept).
    pub fn target_of(&self, mirrored: SocketAddrV4) -> Option<SocketAddrV4> {
        self.owner(mirrored)
            .map(|i| self.engines[i].config().target)
    }

    /// The engines, route by route, copies of a route next to each other.
    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }

    /// Sessions mirrored per captured connection (`--multiply`).
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// A captured packet and when it was captured (see [`Engine::on_captured_at`]).
    pub fn on_captured_at(&mut self, now: Instant, captured: Instant, pkt: &TcpPacket<'_>) {
        self.dispatch(now, Some(captured), pkt);
    }

    /// A captured packet: judged once per route by `--sample`, then handed to every engine of
    /// its production port with that verdict.
    pub fn on_captured(&mut self, now: Instant, pkt: &TcpPacket<'_>) {
        self.dispatch(now, None, pkt);
    }

    fn dispatch(&mut self, now: Instant, captured: Option<Instant>, pkt: &TcpPacket<'_>) {
        let mut taken = false;
        for i in 0..self.routes.len() {
            let r = &self.routes[i];
            if r.prod_port == pkt.dst_port || r.prod_port == pkt.src_port {
                taken = true;
                if let Some((pos, size)) = r.spread {
                    let client = if pkt.dst_port == r.prod_port {
                        SocketAddrV4::new(pkt.src, pkt.src_port)
                    } else {
                        SocketAddrV4::new(pkt.dst, pkt.dst_port)
                    };
                    if placement(client, size) != pos {
                        continue;
                    }
                }
                let verdict = match (r.decided_by, &mut self.samplers[i]) {
                    (Some(j), _) => self.verdicts[j],
                    (None, Some(s)) => s.judge(now, pkt),
                    (None, None) => Verdict::IN,
                };
                self.verdicts[i] = verdict;
                for e in &mut self.engines[r.first..r.first + self.copies] {
                    e.on_judged(now, captured, pkt, verdict);
                }
            }
        }
        if !taken {
            self.captured_ignored += 1;
        }
    }

    /// A piece of a TLS session's plaintext: to every engine of its production port that
    /// mirrors its client (each copy of `--multiply` has its own session of it).
    pub fn on_plaintext(&mut self, now: Instant, p: &Plaintext<'_>) {
        let port = p.server.port();
        for (i, r) in self.routes.iter().enumerate() {
            if r.prod_port != port {
                continue;
            }
            if let Some((pos, size)) = r.spread {
                if placement(p.client, size) != pos {
                    continue;
                }
            }
            let decider = &self.samplers[r.decided_by.unwrap_or(i)];
            if decider
                .as_ref()
                .is_some_and(|s| s.left_out(now, p.client, *p.server.ip()))
            {
                // Once per route, as its packets are counted once (not per copy).
                self.tls_plain_not_sampled += p.data.len() as u64;
                continue;
            }
            for e in &mut self.engines[r.first..r.first + self.copies] {
                e.on_plaintext(now, p);
            }
        }
    }

    /// A test-server segment relayed by intercept, for the engine mirroring from `fb.client`.
    pub fn on_feedback(&mut self, now: Instant, fb: &TestFeedback) {
        match self.owner(fb.client) {
            Some(i) => self.engines[i].on_feedback(now, fb),
            None => {
                self.feedback_unrouted += 1;
                if self.is_foreign(fb.client) {
                    self.feedback_foreign += 1;
                }
            }
        }
    }

    /// Other relayed knowledge (MySQL summaries, `--prod-dsn` answers) about `mirrored`.
    pub fn on_test_event(&mut self, now: Instant, mirrored: SocketAddrV4, ev: &TestEvent<'_>) {
        match self.owner(mirrored) {
            Some(i) => self.engines[i].on_test_event(now, mirrored, ev),
            None => self.test_events_unrouted += 1,
        }
    }

    /// A test event and when it was received (see [`Engine::on_test_event_at`]).
    pub fn on_test_event_at(
        &mut self,
        now: Instant,
        received: Instant,
        mirrored: SocketAddrV4,
        ev: &TestEvent<'_>,
    ) {
        match self.owner(mirrored) {
            Some(i) => self.engines[i].on_test_event_at(now, received, mirrored, ev),
            None => self.test_events_unrouted += 1,
        }
    }

    /// A run of test events of one session (see [`Engine::on_test_events_at`]).
    pub fn on_test_events_at<'e>(
        &mut self,
        now: Instant,
        mirrored: SocketAddrV4,
        events: impl IntoIterator<Item = (Instant, TestEvent<'e>)>,
    ) {
        match self.owner(mirrored) {
            Some(i) => self.engines[i].on_test_events_at(now, mirrored, events),
            None => self.test_events_unrouted += events.into_iter().count() as u64,
        }
    }

    /// Runs the timers due at `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        for e in &mut self.engines {
            if e.next_deadline().is_some_and(|d| d <= now) {
                e.on_timeout(now);
            }
        }
    }

    /// The earliest instant at which `on_timeout` has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.engines.iter().filter_map(Engine::next_deadline).min()
    }

    /// The next packet to send, and the target it goes to (its destination address).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<(usize, Ipv4Addr)> {
        let n = self.engines.len();
        for k in 0..n {
            let i = (self.next_tx + k) % n;
            if let Some(len) = self.engines[i].poll_transmit(now, buf) {
                self.next_tx = (i + 1) % n;
                return Some((len, *self.engines[i].config().target.ip()));
            }
        }
        None
    }

    /// The next session event of any engine.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.engines.iter_mut().find_map(Engine::poll_event)
    }

    /// The next observation of any engine (see [`Engine::poll_observation`]).
    pub fn poll_observation(&mut self) -> Option<Observation> {
        self.engines.iter_mut().find_map(Engine::poll_observation)
    }

    /// Resets and forgets every session of every engine; drain `poll_transmit` afterwards.
    pub fn shutdown(&mut self, now: Instant) {
        for e in &mut self.engines {
            e.shutdown(now);
        }
    }

    /// See [`Engine::waits_on_test`]: any engine's.
    pub fn waits_on_test(&self) -> bool {
        self.engines.iter().any(Engine::waits_on_test)
    }

    /// Bytes queued toward the targets, over all engines. O(sessions).
    pub fn queued_bytes(&self) -> usize {
        self.engines.iter().map(Engine::queued_bytes).sum()
    }

    /// [`Engine::sessions_closing`] of every engine.
    pub fn sessions_closing(&self) -> usize {
        self.engines.iter().map(Engine::sessions_closing).sum()
    }

    /// The `buf` size `poll_transmit` needs.
    pub fn transmit_buffer_len(&self) -> usize {
        self.engines
            .iter()
            .map(Engine::transmit_buffer_len)
            .max()
            .unwrap_or(0)
    }

    /// Names of the transform counters (every engine has the same kind of transform).
    pub fn transform_counter_names(&self) -> &'static [&'static str] {
        self.engines
            .first()
            .map_or(&[], Engine::transform_counter_names)
    }

    /// All engines' counters summed; packets captured once count once, however many copies
    /// (and routes of the same port) were handed them.
    pub fn stats(&self) -> EngineStats {
        let mut total = EngineStats::default();
        for r in &self.routes {
            for (k, e) in self.engines[r.first..r.first + self.copies]
                .iter()
                .enumerate()
            {
                if k == 0 && !r.port_seen_before {
                    total.merge(e.stats());
                } else {
                    total.merge_copy(e.stats());
                }
            }
        }
        total.captured_ignored += self.captured_ignored;
        total.tls_plain_bytes_not_sampled += self.tls_plain_not_sampled;
        total.feedback_received += self.feedback_unrouted;
        total.feedback_unknown_session += self.feedback_unrouted;
        total.test_events_unknown_session += self.test_events_unrouted;
        total
    }

    /// Relayed feedback items for addresses outside this fleet's pool slices: another
    /// worker's (`--workers`) or another copier's sharing the intercept. Only counted with a
    /// pool (without one the real client addresses cannot be told apart).
    pub fn feedback_foreign(&self) -> u64 {
        self.feedback_foreign
    }

    /// The engine whose pool slice holds `mirrored`. Without a pool there is one engine (see
    /// [`Fleet::check`]), mirroring from the real client addresses: it owns everything.
    fn owner(&self, mirrored: SocketAddrV4) -> Option<usize> {
        let count = self.engines.len() as u32;
        let (worker, workers) = self.worker;
        let Some(pool) = self.pool else {
            return (count == 1).then_some(0);
        };
        let slice = pool.slice_of(*mirrored.ip(), count * workers)?;
        let first = worker * count;
        (first..first + count)
            .contains(&slice)
            .then(|| (slice - first) as usize)
    }

    /// Whether `mirrored` is none of this fleet's addresses although it has a pool: another
    /// worker's, or another copier's that shares the intercept (both get what intercept
    /// broadcasts because nobody has claimed it yet).
    fn is_foreign(&self, mirrored: SocketAddrV4) -> bool {
        self.pool.is_some() && self.owner(mirrored).is_none()
    }
}

/// Which of `size` spread targets a client connection goes to: a fixed mix of the client's
/// address and port (no per-process seed), so the answer is the same in every run.
pub fn placement(client: SocketAddrV4, size: u32) -> u32 {
    let mut h = (u64::from(u32::from(*client.ip())) << 16) | u64::from(client.port());
    // splitmix64's finaliser: every input bit moves every output bit.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h % u64::from(size.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use common::wire::{parse_ipv4_tcp, TcpFlags, TcpOptions};

    use super::super::tests::{packet, parse_sent, Sent, C, CLIENT, PROD, T, TARGET};
    use super::super::Sample;
    use super::*;

    const SYN: u8 = TcpFlags::SYN;
    const ACK: u8 = TcpFlags::ACK;
    const PSH: u8 = TcpFlags::PSH;
    const POOL: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 19, 0, 0), 24);
    const TARGET2: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 5), 5002);

    fn template() -> EngineConfig {
        let mut cfg = EngineConfig::new(3306, TARGET);
        cfg.client_ip_pool = Some(POOL);
        cfg
    }

    fn fleet(routes: &[(u16, SocketAddrV4)], copies: u32) -> Fleet {
        Fleet::new(&template(), routes, copies, Engine::new).unwrap()
    }

    fn now() -> Instant {
        Instant::from_nanos(1_000_000_000)
    }

    fn capture(f: &mut Fleet, bytes: &[u8]) {
        f.on_captured(now(), &parse_ipv4_tcp(bytes).unwrap());
    }

    fn drain(f: &mut Fleet) -> Vec<(Sent, Ipv4Addr)> {
        let mut buf = vec![0u8; f.transmit_buffer_len()];
        let mut out = Vec::new();
        while let Some((n, to)) = f.poll_transmit(now(), &mut buf) {
            out.push((parse_sent(&buf[..n]), to));
        }
        out
    }

    fn syn_ack(f: &mut Fleet, mirrored: SocketAddrV4, server: SocketAddrV4) {
        f.on_feedback(
            now(),
            &TestFeedback {
                client: mirrored,
                server,
                seq: T,
                ack: C.wrapping_add(1),
                flags: TcpFlags(SYN | ACK),
                window: 65535,
                options: TcpOptions {
                    mss: Some(1460),
                    ..Default::default()
                },
                payload_len: 0,
                payload_prefix: Vec::new(),
            },
        );
    }

    #[test]
    fn each_connection_is_mirrored_once_per_copy_from_its_own_slice() {
        let mut f = fleet(&[(3306, TARGET)], 3);
        capture(
            &mut f,
            &packet(CLIENT, PROD, C, 0, SYN, b"", Default::default()),
        );
        let syns = drain(&mut f);
        assert_eq!(syns.len(), 3);
        let mirrored: HashSet<SocketAddrV4> = syns.iter().map(|(s, _)| s.src).collect();
        assert_eq!(mirrored.len(), 3, "three distinct client addresses");
        let pool = AddressPool::new(POOL.0, POOL.1, Ipv4Addr::UNSPECIFIED).unwrap();
        let slices: HashSet<u32> = mirrored
            .iter()
            .map(|a| pool.slice_of(*a.ip(), 3).unwrap())
            .collect();
        assert_eq!(slices.len(), 3, "one per slice");
        for (s, to) in &syns {
            assert_eq!((s.seq, s.dst, s.src.port()), (C, TARGET, CLIENT.port()));
            assert_eq!(*to, *TARGET.ip());
        }
        let opened: Vec<_> = std::iter::from_fn(|| f.poll_event()).collect();
        assert_eq!(opened.len(), 3);

        // Each copy completes its own handshake and gets the client's bytes.
        for m in &mirrored {
            syn_ack(&mut f, *m, TARGET);
        }
        let acks = drain(&mut f);
        assert_eq!(acks.len(), 3);
        capture(
            &mut f,
            &packet(CLIENT, PROD, C + 1, 1, ACK, b"", Default::default()),
        );
        capture(
            &mut f,
            &packet(
                CLIENT,
                PROD,
                C + 1,
                1,
                ACK | PSH,
                b"select 1",
                Default::default(),
            ),
        );
        let data = drain(&mut f);
        let mut per: HashMap<SocketAddrV4, Vec<u8>> = HashMap::new();
        for (s, _) in data {
            per.entry(s.src).or_default().extend(s.payload);
        }
        assert_eq!(per.len(), 3);
        assert!(per.values().all(|p| p == b"select 1"));

        let st = f.stats();
        assert_eq!(st.sessions_opened, 3);
        assert_eq!(st.sessions_active, 3);
        assert_eq!(st.captured_client_to_prod, 3, "captured packets count once");
        assert_eq!(f.copies(), 3);
    }

    #[test]
    fn routes_send_their_own_port_to_their_own_target() {
        let mut f = fleet(&[(3306, TARGET), (5002, TARGET2)], 1);
        let prod2 = SocketAddrV4::new(*PROD.ip(), 5002);
        capture(
            &mut f,
            &packet(CLIENT, prod2, C, 0, SYN, b"", Default::default()),
        );
        let sent = drain(&mut f);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0.dst, TARGET2);
        assert_eq!(sent[0].1, *TARGET2.ip());
        let m = sent[0].0.src;
        // Feedback reaches the engine that owns the address, and only it.
        syn_ack(&mut f, m, TARGET2);
        assert_eq!(drain(&mut f).len(), 1);
        assert_eq!(f.engines()[1].stats().feedback_received, 1);
        assert_eq!(f.engines()[0].stats().feedback_received, 0);
        // A port nobody mirrors, and feedback for an address outside every slice.
        let other = SocketAddrV4::new(*PROD.ip(), 9999);
        capture(
            &mut f,
            &packet(CLIENT, other, C, 0, SYN, b"", Default::default()),
        );
        syn_ack(&mut f, CLIENT, TARGET);
        let st = f.stats();
        assert_eq!(st.captured_ignored, 1);
        assert_eq!(st.feedback_unknown_session, 1);
        assert_eq!(st.sessions_opened, 1);
    }

    #[test]
    fn workers_mirror_from_disjoint_shares_of_the_pool() {
        let routes = [(3306, TARGET)];
        let make = |w| Fleet::for_worker(&template(), &routes, 2, (w, 2), Engine::new).unwrap();
        let (mut a, mut b) = (make(0), make(1));
        let pool = AddressPool::new(POOL.0, POOL.1, Ipv4Addr::UNSPECIFIED).unwrap();
        let mut slices = HashSet::new();
        let mut mirrored = Vec::new();
        for (f, port) in [(&mut a, 40000u16), (&mut b, 40001)] {
            let c = SocketAddrV4::new(*CLIENT.ip(), port);
            capture(f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            for (s, _) in drain(f) {
                slices.insert(pool.slice_of(*s.src.ip(), 4).unwrap());
                mirrored.push(s.src);
            }
        }
        assert_eq!(slices.len(), 4, "2 workers x 2 copies, one slice each");
        // Worker 0's addresses are foreign to worker 1: dropped and counted there.
        syn_ack(&mut b, mirrored[0], TARGET);
        assert_eq!(b.feedback_foreign(), 1);
        assert_eq!(b.stats().feedback_unknown_session, 1);
        syn_ack(&mut a, mirrored[0], TARGET);
        assert_eq!(a.feedback_foreign(), 0);
        assert_eq!(a.stats().feedback_unknown_session, 0);
        // Without a pool, one engine per worker is fine (real client addresses), more are not.
        let mut no_pool = template();
        no_pool.client_ip_pool = None;
        assert!(Fleet::check_workers(&no_pool, &routes, 1, 4).is_ok());
        assert_eq!(
            Fleet::check_workers(&no_pool, &routes, 2, 4),
            Err(FleetError::NeedPool { engines: 2 })
        );
        let mut tiny = template();
        tiny.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 30));
        assert!(matches!(
            Fleet::check_workers(&tiny, &routes, 1, 4),
            Err(FleetError::PoolTooSmall { engines: 4, .. })
        ));
    }

    #[test]
    fn spread_targets_each_get_a_share_of_the_connections_and_keep_it() {
        let routes = [(3306, TARGET), (3306, TARGET2)];
        let mut f = fleet(&routes, 1);
        f.spread(3306, &[TARGET, TARGET2]);
        let mut per_target: HashMap<Ipv4Addr, usize> = HashMap::new();
        for port in 40000..40200u16 {
            let c = SocketAddrV4::new(*CLIENT.ip(), port);
            capture(&mut f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            let sent = drain(&mut f);
            assert_eq!(sent.len(), 1, "{c}: one SYN, to one target");
            let (s, to) = &sent[0];
            let want = [TARGET, TARGET2][placement(c, 2) as usize];
            assert_eq!(s.dst, want, "{c}");
            *per_target.entry(*to).or_default() += 1;
            assert_eq!(f.target_of(s.src), Some(want));
        }
        let (a, b) = (per_target[TARGET.ip()], per_target[TARGET2.ip()]);
        assert!((70..=130).contains(&a) && a + b == 200, "{a} / {b}");
        let st = f.stats();
        assert_eq!(st.captured_client_to_prod, 200, "each packet counted once");
        assert_eq!(st.sessions_opened, 200);
        // Fixed: the same client lands on the same target in any run.
        let c = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 51234);
        assert_eq!(placement(c, 2), placement(c, 2));
        assert_eq!(placement(c, 1), 0);
    }

    #[test]
    fn tee_targets_each_mirror_every_connection_and_sample_the_same_ones() {
        let mut t = template();
        t.sample = Sample::from_percent(50.0);
        let routes = [(3306, TARGET), (3306, TARGET2)];
        let mut f = Fleet::new(&t, &routes, 1, Engine::new).unwrap();
        f.tee(3306, &[TARGET, TARGET2]);
        let mut opened = 0;
        for port in 40000..40200u16 {
            let c = SocketAddrV4::new(*CLIENT.ip(), port);
            capture(&mut f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            let sent = drain(&mut f);
            // Both targets or neither: a connection sampled for A but not B would make their
            // comparison one of different work.
            let to: Vec<SocketAddrV4> = sent.iter().map(|(s, _)| s.dst).collect();
            assert!(to.is_empty() || to == [TARGET, TARGET2], "{c}: {to:?}");
            opened += usize::from(!to.is_empty());
        }
        assert!((80..=120).contains(&opened), "{opened}");
        let st = f.stats();
        assert_eq!(st.sessions_opened, 2 * opened as u64);
        assert_eq!(st.captured_client_to_prod, 200, "each packet counted once");
        assert!(
            f.samplers[0].is_some() && f.samplers[1].is_none(),
            "one decides"
        );
    }

    #[test]
    fn plaintext_of_a_sampled_out_connection_is_left_out_by_design_not_lost() {
        let mut t = template();
        t.sample = Sample::from_percent(50.0);
        let mut f = Fleet::new(&t, &[(3306, TARGET)], 1, Engine::new).unwrap();
        let mut opened = 0;
        for port in 40000..40100u16 {
            let c = SocketAddrV4::new(*CLIENT.ip(), port);
            capture(&mut f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            opened += std::iter::from_fn(|| f.poll_event())
                .filter(|e| matches!(e, EngineEvent::SessionOpened { .. }))
                .count();
            let piece = Plaintext {
                client: c,
                server: PROD,
                from_client: true,
                offset: 0,
                data: b"0123456789",
            };
            f.on_plaintext(now(), &piece);
        }
        let st = f.stats();
        assert!((40..=60).contains(&opened), "{opened}");
        assert_eq!(st.tls_plain_bytes_not_sampled, 10 * (100 - opened as u64));
        assert_eq!(st.tls_plain_bytes_unmatched, 0, "no loss counted for them");
    }

    #[test]
    fn set_ups_that_would_collide_are_refused() {
        let mut no_pool = template();
        no_pool.client_ip_pool = None;
        let one = [(3306, TARGET)];
        assert!(Fleet::check(&no_pool, &one, 1).is_ok());
        assert_eq!(
            Fleet::check(&no_pool, &one, 2),
            Err(FleetError::NeedPool { engines: 2 })
        );
        assert_eq!(
            Fleet::check(&no_pool, &[(3306, TARGET), (5002, TARGET2)], 1),
            Err(FleetError::NeedPool { engines: 2 })
        );
        let mut tiny = template();
        tiny.client_ip_pool = Some((Ipv4Addr::new(198, 19, 0, 0), 30));
        assert!(
            Fleet::check(&tiny, &one, 2).is_ok(),
            "2 addresses, 2 copies"
        );
        assert!(matches!(
            Fleet::check(&tiny, &one, 3),
            Err(FleetError::PoolTooSmall { usable: 2, .. })
        ));
        let inside = SocketAddrV4::new(Ipv4Addr::new(198, 19, 0, 7), 3306);
        assert_eq!(
            Fleet::check(&template(), &[(3306, TARGET), (3307, inside)], 1),
            Err(FleetError::TargetInPool { target: inside })
        );
        assert_eq!(Fleet::check(&template(), &[], 1), Err(FleetError::NoRoutes));
        assert!(FleetError::NeedPool { engines: 3 }
            .to_string()
            .contains("--client-ip-pool"));
    }

    #[test]
    fn copies_of_a_sampled_out_connection_all_stay_out() {
        let mut t = template();
        t.sample = Sample::from_percent(50.0);
        t.pickup_midstream = true;
        let mut f = Fleet::new(&t, &[(3306, TARGET)], 2, Engine::new).unwrap();
        let mut opened = 0;
        for port in 40000..40100u16 {
            let c = SocketAddrV4::new(*CLIENT.ip(), port);
            capture(&mut f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            // The client repeats its SYN and sends its first bytes.
            capture(&mut f, &packet(c, PROD, C, 0, SYN, b"", Default::default()));
            capture(
                &mut f,
                &packet(c, PROD, C + 1, 1, ACK | PSH, b"q", Default::default()),
            );
            let copies = std::iter::from_fn(|| f.poll_event())
                .filter(|e| matches!(e, EngineEvent::SessionOpened { client, .. } if *client == c))
                .count();
            assert!(copies == 0 || copies == 2, "{c}: {copies} copies opened");
            opened += copies / 2;
        }
        let st = f.stats();
        assert_eq!(
            st.sessions_opened,
            2 * opened as u64,
            "both copies of each one in"
        );
        assert_eq!(
            st.sessions_not_sampled,
            100 - opened as u64,
            "counted once, not per copy nor per SYN"
        );
        assert!((48..=52).contains(&opened), "{opened}");
        let route = f.samplers[0].as_ref().expect("the route decides");
        assert_eq!(route.remembered(), 100);
        assert!(
            f.engines().iter().all(|e| e.sampler.is_none()),
            "one table, not one per copy"
        );
    }
}
