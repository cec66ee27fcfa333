//! The engine's memory budget: byte accounting of its sessions, and shedding whole sessions
//! when the budget is reached (`--max-memory`, see docs/RELIABILITY.md "Bounded memory").
//!
//! # What this room is for
//!
//! The copier runs on the production host, maybe on the day it is already short of memory: it
//! must never grow past what the operator allowed, whatever the clients or the test server do.
//! Every session is charged what it holds: a fixed size ([`SESSION_FIXED_BYTES`]: its slot,
//! its index and timer entries) plus the capacity of its buffers (send queue, client and
//! production reassembly) plus its transform's own estimate
//! ([`StreamTransform::memory_len`](super::StreamTransform::memory_len): held commands,
//! prepared-statement maps, ...). The charge is refreshed after every event that may change
//! it (`settle`, `finish`, `release`), so the engine always knows its total in O(1), without
//! malloc hooks.
//!
//! When the total passes `EngineConfig::max_memory`, sessions are shed **largest first**, until
//! the total is back under the bound: the largest is the one that fell furthest behind (the
//! test server is not taking its bytes, or its commands wait for a PREPARE_OK that does not
//! come), so it is both the most likely to be broken already and the one whose loss frees the
//! most; shedding the newest instead would throw away healthy sessions and keep the laggard
//! growing. A shed session ends as `CloseReason::ShedMemory`: reset on the test server like any
//! abandoned one, counted by reason. A new session is refused (`sessions_refused_memory`) when
//! its opening charge does not fit under 15/16 of the budget (the rest is room for the open
//! sessions to grow): so many small sessions are bounded too, and an open session is not shed
//! to make room for a new one.
//!
//! # What it must never do
//!
//! * Block, or wait for memory to come back: shedding is immediate and whole (a session with a
//!   hole in its stream would be worse than none).
//! * Let the total stay over the bound after an event returns: the overshoot is at most what
//!   one event added (one captured segment, one relayed message).
//! * Cost anything on the hot path when under budget: one subtraction per event. Picking the
//!   largest session is O(sessions), and only runs when over budget.

use std::mem::size_of;

use common::clock::Instant;

use super::{CloseReason, Engine, FlowKey, SessionId, Slot};

/// Bytes charged per session whatever it holds: its slot in the table (the session struct
/// lives inline), its entries in the two indexes (hashbrown: key, value, one control byte; a
/// table doubles when 7/8 full, so it is between 7/16 and 7/8 full: at most 16/7 of that per
/// session), its timer-heap entry (with room for a stale one) and ready-queue entry.
pub const SESSION_FIXED_BYTES: usize = size_of::<Slot>()
    + 2 * (size_of::<FlowKey>() + size_of::<SessionId>() + 1) * 16 / 7
    + 2 * size_of::<(Instant, u32, u32)>()
    + 2 * size_of::<SessionId>()
    + size_of::<u32>();

/// How `--max-memory` is shared out. The parts are fixed fractions so that the bound holds
/// whatever the traffic does; see docs/RELIABILITY.md for why these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// The whole budget, bytes.
    pub total: usize,
}

impl MemoryBudget {
    pub const fn from_mib(mib: usize) -> Self {
        Self {
            total: mib.saturating_mul(1 << 20),
        }
    }

    /// Sessions (all engines together): fixed size, send queues, reassembly, held commands,
    /// prepared-statement maps. Three eighths.
    pub const fn sessions(&self) -> usize {
        self.total / 8 * 3
    }

    /// The capture ring (libpcap's mmap'ed TPACKET ring: every page of it ends up resident).
    /// A quarter: 64 MiB at the default 256 MiB, and more for whoever gives `--max-memory`
    /// more (a larger ring holds a longer stall of the copier at high packet rates).
    pub const fn capture(&self) -> usize {
        self.total / 4
    }

    /// The comparison report's tables and the queue of observations feeding them. An eighth.
    pub const fn report(&self) -> usize {
        self.total / 8
    }

    /// The control channel: what the engine thread reads off each connection in a turn and
    /// decodes (what it has not read waits in the kernel's socket buffer). A sixteenth.
    pub const fn control(&self) -> usize {
        self.total / 16
    }

    /// The cap of one session's queue toward the test server (`max_session_buffer`, also the
    /// MySQL layer's held bytes): a quarter of the session budget (24 MiB at the default
    /// 256 MiB), so one session can never take the whole budget and laggards are shed one at a
    /// time. It must hold a whole big command: a client that logs in and sends a 17 MiB INSERT
    /// at once has sent it all to production before the test server has answered our login,
    /// and the test server's receive window then opens only as fast as its ACKs come back
    /// through intercept. At most 1 GiB, MySQL's largest packet size setting.
    pub fn session_buffer(&self, engines: usize) -> usize {
        (self.sessions() / engines.max(1) / 4).clamp(64 << 10, 1 << 30)
    }
}

/// The part of a template's session budget (`max_memory`) and per-session cap each of
/// `engines` engines gets when they share it (a [`Fleet`](super::Fleet): routes x copies).
pub(super) fn engine_share(
    max_memory: usize,
    max_session_buffer: usize,
    engines: usize,
) -> (usize, usize) {
    let mine = max_memory / engines.max(1);
    // One session never takes more than a quarter of its engine's part.
    (mine, max_session_buffer.min((mine / 4).max(64 << 10)))
}

impl Engine {
    /// Bytes charged to the memory budget now (all sessions, lingering ones included).
    pub fn memory_used(&self) -> usize {
        self.mem_used
    }

    /// Refreshes one session's charge.
    pub(super) fn recharge(&mut self, id: SessionId) {
        let Some(slot) = self.slots.get_mut(id.idx as usize) else {
            return;
        };
        if slot.gen != id.gen {
            return;
        }
        let Some(s) = &slot.session else {
            return;
        };
        let now_charged = SESSION_FIXED_BYTES + s.heap_bytes();
        self.mem_used = self.mem_used - slot.charged + now_charged;
        slot.charged = now_charged;
        // Refreshed with the charge: both change only with the session's state.
        let waits = s.waits_on_test();
        if waits != slot.waits {
            slot.waits = waits;
            if waits {
                self.waiting_on_test += 1;
            } else {
                self.waiting_on_test -= 1;
            }
        }
        self.stats.memory_bytes = self.mem_used as u64;
        self.stats.memory_peak_bytes = self.stats.memory_peak_bytes.max(self.mem_used as u64);
    }

    /// Whether one more session fits (its estimated opening charge). A refused SYN is counted;
    /// a refused pick-up is not: every later packet of a refused connection asks again (it is
    /// picked up mid-stream once there is room), and one connection must count once.
    /// New sessions may only fill the budget up to 15/16: sessions grow after they open (a
    /// login exchange, the first commands), and that growth must find room, or every new
    /// session admitted at the edge would make an older one be shed.
    pub(super) fn admits_new_session(&mut self, syn: bool) -> bool {
        let admit_below = self.cfg.max_memory - self.cfg.max_memory / 16;
        if self.mem_used.saturating_add(self.mem_new_session) <= admit_below {
            return true;
        }
        self.stats.sessions_refused_memory += u64::from(syn);
        false
    }

    /// Remembers what a session was charged right after it opened: the estimate for the next.
    pub(super) fn note_new_session_charge(&mut self, id: SessionId) {
        if let Some(slot) = self.slots.get(id.idx as usize) {
            if slot.gen == id.gen && slot.session.is_some() {
                self.mem_new_session = slot.charged.max(SESSION_FIXED_BYTES);
            }
        }
    }

    /// Sheds the largest live sessions until the total is within the budget.
    pub(super) fn enforce_budget(&mut self, now: Instant) {
        while self.mem_used > self.cfg.max_memory {
            let Some(id) = self.largest_live() else {
                // Only lingering sessions (fixed size each): they go by themselves soon, and
                // no new one is admitted meanwhile.
                return;
            };
            let before = self.mem_used;
            self.finish(id, now, CloseReason::ShedMemory);
            if self.mem_used >= before {
                return; // nothing freed: never loop
            }
        }
    }

    fn largest_live(&self) -> Option<SessionId> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.session.as_ref().is_some_and(|s| !s.is_lingering()))
            .max_by_key(|(_, slot)| slot.charged)
            .map(|(idx, slot)| SessionId {
                idx: idx as u32,
                gen: slot.gen,
            })
    }
}
