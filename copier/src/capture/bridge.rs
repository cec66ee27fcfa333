//! The bridge: a plain packet socket that captures while libpcap's ring is being allocated.
//!
//! A copier (re)started under load captures nothing until its capture is bound, and libpcap
//! binds its TPACKET_V3 ring only after the kernel has allocated and zeroed it: about 20 ms for
//! the default 64 MiB here, longer on a busy host, all of it traffic a restarted copier never
//! sees (docs/RELIABILITY.md, fault b). The bridge socket
//! ([`ops::packet_socket::PacketSocket`]) has no ring; it is opened first, with the same
//! filter, and carries the traffic until the ring has it too.
//!
//! Then both hold the same packets for a moment, in the same order (the kernel hands each
//! packet to every capture socket in one pass). [`Overlap`] decides which copy is kept: every
//! bridge frame is handed over as it is read; the ring's first frame ends the bridge, once
//! what it still holds is handed over too; from then on a ring frame the bridge already handed
//! over is skipped, until the ring is past the bridge's last timestamp. A ring frame is
//! recognised by a hash of its TCP/IP identity and payload (IP id, sequence and
//! acknowledgement numbers, flags, window, payload), not by its timestamp: the two sockets'
//! timestamps differ in precision.
//!
//! This room never reorders or alters a frame; it only drops the ring's copy of what the bridge
//! already handed over, and counts it.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use common::wire::TcpPacket;

/// The identity of one captured TCP segment, the same in both captures' copies.
pub fn key(p: &TcpPacket<'_>) -> u64 {
    let mut h = DefaultHasher::new();
    (p.src, p.dst, p.src_port, p.dst_port).hash(&mut h);
    (p.seq, p.ack, p.flags.0, p.ip_id, p.window).hash(&mut h);
    (p.payload_len, p.payload).hash(&mut h);
    h.finish()
}

/// Where the handover stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Both captures are open; the bridge's frames are handed over.
    Bridging,
    /// The bridge is closed; ring frames it already handed over may still come, up to the
    /// bridge's last timestamp.
    Filtering,
    /// The ring alone.
    Done,
}

/// What to do with a ring frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A copy of a frame the bridge handed over: skip it.
    Duplicate,
    /// The ring's first frame: hand over what the bridge still holds, close it, then ask
    /// [`Overlap::after_reread`].
    Reread,
    /// Hand it over.
    Keep,
}

/// The handover's bookkeeping, free of I/O (see the module docs).
#[derive(Debug)]
pub struct Overlap {
    phase: Phase,
    seen: HashSet<u64>,
    /// The latest capture timestamp among the bridge's frames, nanoseconds.
    last_ns: u64,
    /// Frames the bridge handed over, and ring frames skipped as their copies.
    pub bridged: u64,
    pub skipped: u64,
}

/// Bridge frames remembered at most. The bridge lives a few tens of milliseconds; past this
/// (a flood while the ring is set up) the handover ends early instead of growing.
const MAX_SEEN: usize = 1 << 18;

impl Default for Overlap {
    fn default() -> Self {
        Overlap {
            phase: Phase::Bridging,
            seen: HashSet::new(),
            last_ns: 0,
            bridged: 0,
            skipped: 0,
        }
    }
}

impl Overlap {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// A frame the bridge read at `ts_ns` with identity `key`, handed over.
    pub fn bridge_frame(&mut self, key: u64, ts_ns: u64) {
        self.bridged += 1;
        self.last_ns = self.last_ns.max(ts_ns);
        if self.seen.len() < MAX_SEEN {
            self.seen.insert(key);
        }
    }

    /// Whether the bridge must stop now: it has remembered as much as it may.
    pub fn full(&self) -> bool {
        self.seen.len() >= MAX_SEEN
    }

    /// A frame the ring read at `ts_ns` with identity `key` (`None`: it does not parse, so the
    /// bridge cannot have handed it over).
    pub fn ring_frame(&mut self, key: Option<u64>, ts_ns: u64) -> Verdict {
        match self.phase {
            Phase::Done => Verdict::Keep,
            // Read first, the bridge is always ahead of the ring: were it read on, the ring
            // would never catch up.
            Phase::Bridging => Verdict::Reread,
            Phase::Filtering => {
                // Nothing later than the bridge's last frame can be a copy of one of them.
                if ts_ns > self.last_ns {
                    self.finish();
                    return Verdict::Keep;
                }
                match key {
                    Some(k) if self.seen.contains(&k) => self.skip(),
                    _ => Verdict::Keep,
                }
            }
        }
    }

    /// After [`Verdict::Reread`], the bridge read to its end and closed: what to do with the
    /// ring's first frame.
    pub fn after_reread(&mut self, key: Option<u64>, ts_ns: u64) -> Verdict {
        self.close();
        self.ring_frame(key, ts_ns)
    }

    /// Ends the bridge (its socket is closed by the caller); ring frames are still checked
    /// against what it handed over until they are later than its last one.
    pub fn close(&mut self) {
        if self.phase == Phase::Bridging {
            self.phase = Phase::Filtering;
        }
    }

    fn skip(&mut self) -> Verdict {
        self.skipped += 1;
        Verdict::Duplicate
    }

    fn finish(&mut self) {
        self.phase = Phase::Done;
        self.seen = HashSet::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::seq::SeqNumber;

    /// Frames are numbered; a frame's key is its number and its time is its number in ms.
    fn ms(n: u64) -> u64 {
        n * 1_000_000
    }

    /// Runs a handover: `bridge` the frames the bridge reads before the ring's first, `late`
    /// those it holds unread when the ring starts, `ring` the ring's frames. Returns the frames
    /// handed over, in order.
    fn run(bridge: &[u64], late: &[u64], ring: &[u64]) -> (Vec<u64>, Overlap) {
        let mut o = Overlap::default();
        let mut out = Vec::new();
        for &f in bridge {
            o.bridge_frame(f, ms(f));
            out.push(f);
        }
        for &f in ring {
            let v = match o.ring_frame(Some(f), ms(f)) {
                Verdict::Reread => {
                    for &l in late {
                        o.bridge_frame(l, ms(l));
                        out.push(l);
                    }
                    o.after_reread(Some(f), ms(f))
                }
                v => v,
            };
            if v == Verdict::Keep {
                out.push(f);
            }
        }
        (out, o)
    }

    #[test]
    fn the_overlap_is_handed_over_once_in_order() {
        // The ring starts at 3: frames 3..=5 are in both.
        let (out, o) = run(&[1, 2, 3, 4, 5], &[], &[3, 4, 5, 6, 7]);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!((o.bridged, o.skipped, o.phase()), (5, 3, Phase::Done));
    }

    #[test]
    fn frames_the_bridge_holds_unread_come_before_the_ring_goes_on() {
        // The ring's 4 was in the bridge's queue, not yet read; so were 5 and 6.
        let (out, o) = run(&[1, 2, 3], &[4, 5, 6], &[4, 5, 6, 7]);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(o.skipped, 3);
    }

    #[test]
    fn a_ring_with_nothing_in_common_takes_over_at_once() {
        let (out, o) = run(&[1, 2], &[], &[3, 4]);
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!((o.skipped, o.phase()), (0, Phase::Done));
    }

    #[test]
    fn a_frame_the_bridge_dropped_does_not_bring_back_the_ones_it_had() {
        // The bridge lost 3 (its queue overflowed) but had 4: the ring's 3 is kept, its 4
        // skipped, and 6 (later than anything bridged) ends the filtering.
        let (out, o) = run(&[1, 2, 4, 5], &[], &[3, 4, 5, 6]);
        assert_eq!(out, [1, 2, 4, 5, 3, 6]);
        assert_eq!((o.skipped, o.phase()), (2, Phase::Done));
    }

    #[test]
    fn a_ring_frame_that_does_not_parse_is_kept() {
        let mut o = Overlap::default();
        o.bridge_frame(1, ms(1));
        o.bridge_frame(3, ms(3));
        assert_eq!(o.ring_frame(None, ms(2)), Verdict::Reread);
        assert_eq!(o.after_reread(None, ms(2)), Verdict::Keep);
        assert_eq!(o.phase(), Phase::Filtering);
        assert_eq!(o.ring_frame(Some(3), ms(3)), Verdict::Duplicate);
        assert_eq!(o.ring_frame(Some(9), ms(9)), Verdict::Keep);
        assert_eq!(o.phase(), Phase::Done);
    }

    #[test]
    fn the_bridge_ends_at_the_ring_s_first_frame_even_if_it_is_a_copy() {
        // The bridge, read first each round, is always ahead: the ring's copies must not keep
        // it open.
        let mut o = Overlap::default();
        o.bridge_frame(1, ms(1));
        o.bridge_frame(2, ms(2));
        assert_eq!(o.ring_frame(Some(1), ms(1)), Verdict::Reread);
        assert_eq!(o.after_reread(Some(1), ms(1)), Verdict::Duplicate);
        assert_eq!(o.phase(), Phase::Filtering);
    }

    #[test]
    fn keys_tell_apart_what_differs_and_match_what_does_not() {
        use common::wire::{TcpFlags, TcpOptions};
        let p = TcpPacket {
            src: [198, 18, 0, 1].into(),
            dst: [198, 18, 0, 2].into(),
            src_port: 40000,
            dst_port: 3306,
            seq: SeqNumber(7),
            ack: SeqNumber(9),
            flags: TcpFlags(0x18),
            window: 512,
            options: TcpOptions::default(),
            ip_id: 3,
            ttl: 64,
            payload: b"\x05\0\0\0\x03abc",
            payload_len: 8,
        };
        let mut q = p;
        assert_eq!(key(&p), key(&q));
        q.ttl = 63; // a hop, not a different packet
        assert_eq!(key(&p), key(&q));
        q.ip_id = 4;
        assert_ne!(key(&p), key(&q));
    }
}
