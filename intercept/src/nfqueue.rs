//! The NFQUEUE edge of on-test-host mode: the test server's replies to mirrored clients, as the
//! kernel queued them (see [`crate::nftables`]), read as raw IPv4 packets and dropped.
//!
//! What the room is for: binding the queue, reading queued packets, parsing them with
//! `common::wire` and giving every one of them a DROP verdict, in batches. It must never
//! accept a packet: intercept has nothing to send toward a client, and a reply that left this
//! host would reach the network under a pool address. It never reinjects or modifies anything.
//!
//! The kernel hands packets over complete: without NFQA_CFG_F_GSO it segments GSO packets
//! before queueing them and fills in partial checksums, so what we see is what a wire would
//! carry. Packets are held in the kernel until their verdict, so verdicts go out whenever the
//! queue runs dry and at least every [`VERDICT_BATCH`] packets; one batch verdict covers every
//! packet id up to the one named.

use std::io;
use std::time::Duration;

use common::wire::{parse_frame_headers, LinkType, TcpPacket};

use crate::netlink::{self, MessageBuf, NetlinkSocket, NLM_F_ACK, NLM_F_REQUEST};
use crate::pump::{KernelStats, ParseErrors, SegmentSource, SourceStats};

// Kernel ABI (include/uapi/linux/netfilter/nfnetlink_queue.h, nfnetlink.h, netfilter.h).
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NF_DROP: u32 = 0;
const AF_UNSPEC: u8 = 0;
const AF_INET: u16 = 2;

/// Most packets read before their verdict is sent even though more are waiting.
pub const VERDICT_BATCH: u32 = 64;
/// Largest copy range the kernel accepts (a whole IP packet).
pub const MAX_COPY_RANGE: u32 = 0xffff;
/// Receive buffer for one datagram: a packet of MAX_COPY_RANGE bytes plus its attributes.
const DATAGRAM: usize = 128 * 1024;

fn queue_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_QUEUE << 8) | msg
}

/// The config message that binds queue `num` to our socket and asks for packets of up to
/// `copy_range` bytes, at most `max_len` held in the kernel at once.
pub fn config_message(seq: u32, num: u16, copy_range: u32, max_len: u32) -> Vec<u8> {
    let mut b = MessageBuf::new();
    let m = b.begin(queue_type(NFQNL_MSG_CONFIG), NLM_F_REQUEST | NLM_F_ACK, seq);
    b.nfgen(AF_UNSPEC, num);
    // struct nfqnl_msg_config_cmd { __u8 command; __u8 _pad; __be16 pf; }
    let mut cmd = [0u8; 4];
    cmd[0] = NFQNL_CFG_CMD_BIND;
    cmd[2..4].copy_from_slice(&AF_INET.to_be_bytes());
    b.put(NFQA_CFG_CMD, &cmd);
    // struct nfqnl_msg_config_params { __be32 copy_range; __u8 copy_mode; } (packed, 5 bytes)
    let mut params = [0u8; 5];
    params[0..4].copy_from_slice(&copy_range.min(MAX_COPY_RANGE).to_be_bytes());
    params[4] = NFQNL_COPY_PACKET;
    b.put(NFQA_CFG_PARAMS, &params);
    b.put_u32_be(NFQA_CFG_QUEUE_MAXLEN, max_len);
    // No NFQA_CFG_FLAGS: not FAIL_OPEN (a full queue drops instead of letting replies out),
    // not GSO (the kernel segments and checksums for us).
    b.end(m);
    b.as_bytes().to_vec()
}

/// DROP for every queued packet with an id up to `id`.
pub fn drop_verdict_message(seq: u32, num: u16, id: u32) -> Vec<u8> {
    let mut b = MessageBuf::new();
    // No ACK: verdicts are many; an error still comes back as NLMSG_ERROR and is counted.
    let m = b.begin(queue_type(NFQNL_MSG_VERDICT_BATCH), NLM_F_REQUEST, seq);
    b.nfgen(AF_UNSPEC, num);
    // struct nfqnl_msg_verdict_hdr { __be32 verdict; __be32 id; }
    let mut hdr = [0u8; 8];
    hdr[0..4].copy_from_slice(&NF_DROP.to_be_bytes());
    hdr[4..8].copy_from_slice(&id.to_be_bytes());
    b.put(NFQA_VERDICT_HDR, &hdr);
    b.end(m);
    b.as_bytes().to_vec()
}

/// One queued packet: its id (for the verdict) and the IP packet, possibly cut to the copy
/// range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedPacket<'a> {
    pub queue: u16,
    pub id: u32,
    pub ip: &'a [u8],
}

/// What one received netlink message was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueMessage<'a> {
    Packet(QueuedPacket<'a>),
    /// A packet message without an id or payload; counted, nothing else can be done.
    BadPacket,
    /// An error answer (negative errno), e.g. to a verdict.
    Error(i32),
    /// Anything else (acks, other types).
    Other,
}

pub fn classify<'a>(msg: &netlink::Message<'a>) -> QueueMessage<'a> {
    if let Some(code) = netlink::error_code(msg) {
        return if code == 0 {
            QueueMessage::Other
        } else {
            QueueMessage::Error(code)
        };
    }
    if msg.header.ty != queue_type(NFQNL_MSG_PACKET) {
        return QueueMessage::Other;
    }
    let Some((_, queue, rest)) = netlink::nfgen(msg.payload) else {
        return QueueMessage::BadPacket;
    };
    let (mut id, mut ip) = (None, None);
    for attr in netlink::attrs(rest) {
        let Ok(attr) = attr else {
            return QueueMessage::BadPacket;
        };
        match attr.ty {
            // struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; __u8 hook; }
            NFQA_PACKET_HDR => {
                id = attr
                    .data
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes)
            }
            NFQA_PAYLOAD => ip = Some(attr.data),
            _ => {}
        }
    }
    match (id, ip) {
        (Some(id), Some(ip)) => QueueMessage::Packet(QueuedPacket { queue, id, ip }),
        _ => QueueMessage::BadPacket,
    }
}

/// The kernel's counters of one queue, from `/proc/net/netfilter/nfnetlink_queue`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Packets queued since the queue was bound (its id sequence).
    pub queued: u32,
    /// Dropped because the queue was full (`queue_dropped`).
    pub queue_full: u32,
    /// Dropped because our socket's buffer was full (`user_dropped`).
    pub socket_full: u32,
}

/// Parses the proc file (`queue portid waiting copy_mode copy_range queue_dropped
/// user_dropped id_sequence 1`, one line per queue) for queue `num`.
pub fn parse_proc(text: &str, num: u16) -> Option<QueueCounters> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let field = |i: usize| f.get(i).and_then(|s| s.parse::<u32>().ok());
        (field(0)? == u32::from(num)).then_some(())?;
        Some(QueueCounters {
            queued: field(7)?,
            queue_full: field(5)?,
            socket_full: field(6)?,
        })
    })
}

/// Why the queue could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot open a netfilter netlink socket for NFQUEUE ({0}); the kernel needs nfnetlink_queue (modprobe nfnetlink_queue)")]
    Socket(io::Error),
    #[error("NFQUEUE {num} is already bound by another program (another intercept, suricata, ...): choose another --queue-num")]
    Busy { num: u16 },
    #[error(
        "binding NFQUEUE {num} is not permitted: run intercept as root or give it CAP_NET_ADMIN"
    )]
    NotPermitted { num: u16 },
    #[error(
        "cannot bind NFQUEUE {num}: {err} (is nfnetlink_queue available? modprobe nfnetlink_queue)"
    )]
    Other { num: u16, err: io::Error },
}

/// The bound queue, as a source of replies.
pub struct ReplyQueue {
    sock: NetlinkSocket,
    num: u16,
    buf: Vec<u8>,
    /// Unread part of the last datagram (`buf[at..end]`).
    at: usize,
    end: usize,
    /// Highest id read and not yet given its verdict.
    pending: Option<u32>,
    pending_count: u32,
    seq: u32,
    received: u64,
    parse_errors: ParseErrors,
    bad_messages: u64,
    truncated_datagrams: u64,
    socket_overruns: u64,
    verdict_errors: u64,
}

impl ReplyQueue {
    /// Binds queue `num`; packets are copied up to `copy_range` bytes; `recv_buffer` bytes
    /// absorb bursts (kernel socket buffer).
    pub fn bind(
        num: u16,
        copy_range: u32,
        max_len: u32,
        recv_buffer: usize,
    ) -> Result<Self, QueueError> {
        let sock = NetlinkSocket::open(libc::NETLINK_NETFILTER).map_err(QueueError::Socket)?;
        let granted = sock
            .set_recv_buffer(recv_buffer)
            .map_err(|err| QueueError::Other { num, err })?;
        if granted < recv_buffer {
            tracing::warn!(
                wanted = recv_buffer,
                granted,
                "NFQUEUE socket buffer smaller than asked (raise net.core.rmem_max or run as root)"
            );
        }
        let seq = netlink::initial_seq();
        let msg = config_message(seq, num, copy_range, max_len);
        let codes = sock
            .transact(&msg, &[seq], Duration::from_secs(5))
            .map_err(|err| QueueError::Other { num, err })?;
        match codes.first().copied().unwrap_or(0) {
            0 => {}
            c if c == -libc::EBUSY => return Err(QueueError::Busy { num }),
            c if c == -libc::EPERM => return Err(QueueError::NotPermitted { num }),
            c => {
                return Err(QueueError::Other {
                    num,
                    err: io::Error::from_raw_os_error(-c),
                })
            }
        }
        Ok(ReplyQueue {
            sock,
            num,
            buf: vec![0; DATAGRAM],
            at: 0,
            end: 0,
            pending: None,
            pending_count: 0,
            seq: seq.wrapping_add(1),
            received: 0,
            parse_errors: ParseErrors::default(),
            bad_messages: 0,
            truncated_datagrams: 0,
            socket_overruns: 0,
            verdict_errors: 0,
        })
    }

    pub fn num(&self) -> u16 {
        self.num
    }

    /// Sends the DROP verdict for everything read so far.
    pub fn send_verdicts(&mut self) {
        let Some(id) = self.pending else { return };
        let msg = drop_verdict_message(self.seq, self.num, id);
        self.seq = self.seq.wrapping_add(1);
        match self.sock.send(&msg) {
            Ok(()) => {
                self.pending = None;
                self.pending_count = 0;
            }
            // Kept pending: the next call covers these ids too. Meanwhile the kernel holds the
            // packets (they still never leave).
            Err(_) => self.verdict_errors += 1,
        }
    }

    /// Reads the next datagram into the buffer; false when none is ready.
    fn fill(&mut self) -> anyhow::Result<bool> {
        loop {
            match self.sock.recv(&mut self.buf) {
                Ok(n) if n > self.buf.len() => {
                    // Cannot happen with our copy range; counted rather than misparsed.
                    self.truncated_datagrams += 1;
                }
                Ok(n) => {
                    self.at = 0;
                    self.end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // The kernel dropped packets for lack of socket buffer (it counts them as
                    // user_dropped too); nothing was delivered, keep reading.
                    self.socket_overruns += 1;
                }
                Err(e) => anyhow::bail!("reading NFQUEUE {}: {e}", self.num),
            }
        }
    }

    /// Extra counters for the final summary: (bad messages, truncated datagrams, socket
    /// overruns, verdict errors).
    pub fn anomalies(&self) -> (u64, u64, u64, u64) {
        (
            self.bad_messages,
            self.truncated_datagrams,
            self.socket_overruns,
            self.verdict_errors,
        )
    }
}

impl SegmentSource for ReplyQueue {
    fn poll_segment(&mut self, f: impl FnOnce(&TcpPacket<'_>, u32)) -> anyhow::Result<bool> {
        loop {
            if self.at >= self.end && !self.fill()? {
                // Dry: the replies read so far are handled, drop them now.
                self.send_verdicts();
                return Ok(false);
            }
            let mut iter = netlink::messages(&self.buf[self.at..self.end]);
            let Some(next) = iter.next() else {
                self.at = self.end;
                continue;
            };
            let msg = match next {
                Ok(msg) => msg,
                Err(_) => {
                    self.bad_messages += 1;
                    self.at = self.end;
                    continue;
                }
            };
            // Advance past this message: the iterator's remainder starts at the next one.
            let consumed = (self.end - self.at) - iter.remaining();
            self.at += consumed;
            match classify(&msg) {
                QueueMessage::Packet(p) => {
                    self.received += 1;
                    self.pending = Some(match self.pending {
                        // Ids grow by one per packet and wrap; keep the later one.
                        Some(prev) if (p.id.wrapping_sub(prev) as i32) < 0 => prev,
                        _ => p.id,
                    });
                    self.pending_count += 1;
                    match parse_frame_headers(LinkType::RawIp, p.ip) {
                        // Queued as they arrive, read at once: now is when.
                        Ok(pkt) => f(&pkt, common::clock::realtime_us()),
                        Err(e) => self.parse_errors.count(e),
                    }
                    if self.pending_count >= VERDICT_BATCH {
                        self.send_verdicts();
                    }
                    return Ok(true);
                }
                QueueMessage::BadPacket => self.bad_messages += 1,
                QueueMessage::Error(_) => self.verdict_errors += 1,
                QueueMessage::Other => {}
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.send_verdicts();
        if self.at < self.end {
            return Ok(());
        }
        self.sock.wait_readable(timeout);
        Ok(())
    }

    fn stats(&mut self) -> SourceStats {
        let kernel = std::fs::read_to_string("/proc/net/netfilter/nfnetlink_queue")
            .ok()
            .and_then(|t| parse_proc(&t, self.num))
            .map(|c| KernelStats {
                received: c.queued,
                dropped: c.queue_full.saturating_add(c.socket_full),
                if_dropped: 0,
            });
        SourceStats {
            captured: self.received,
            parse_errors: self.parse_errors,
            kernel,
        }
    }
}

impl Drop for ReplyQueue {
    fn drop(&mut self) {
        // Closing the socket unbinds the queue and the kernel drops whatever is still queued;
        // saying so explicitly first keeps the kernel's counters honest.
        self.send_verdicts();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{attrs, messages, nfgen};
    use proptest::prelude::*;

    #[test]
    fn constants_match_libc() {
        assert_eq!(i32::from(NFNL_SUBSYS_QUEUE), libc::NFNL_SUBSYS_QUEUE);
        assert_eq!(i32::from(NFQNL_MSG_PACKET), libc::NFQNL_MSG_PACKET);
        assert_eq!(i32::from(NFQNL_MSG_CONFIG), libc::NFQNL_MSG_CONFIG);
        assert_eq!(
            i32::from(NFQNL_MSG_VERDICT_BATCH),
            libc::NFQNL_MSG_VERDICT_BATCH
        );
        assert_eq!(i32::from(NFQA_PACKET_HDR), libc::NFQA_PACKET_HDR);
        assert_eq!(i32::from(NFQA_VERDICT_HDR), libc::NFQA_VERDICT_HDR);
        assert_eq!(i32::from(NFQA_PAYLOAD), libc::NFQA_PAYLOAD);
        assert_eq!(i32::from(NFQA_CFG_CMD), libc::NFQA_CFG_CMD);
        assert_eq!(i32::from(NFQA_CFG_PARAMS), libc::NFQA_CFG_PARAMS);
        assert_eq!(
            i32::from(NFQA_CFG_QUEUE_MAXLEN),
            libc::NFQA_CFG_QUEUE_MAXLEN
        );
        assert_eq!(i32::from(NFQNL_CFG_CMD_BIND), libc::NFQNL_CFG_CMD_BIND);
        assert_eq!(i32::from(NFQNL_COPY_PACKET), libc::NFQNL_COPY_PACKET);
        assert_eq!(NF_DROP as i32, libc::NF_DROP);
    }

    #[test]
    fn the_config_message_is_byte_exact() {
        let bytes = config_message(9, 36524, 0xffff, 8192);
        let mut want: Vec<u8> = Vec::new();
        want.extend_from_slice(&48u32.to_ne_bytes()); // 16 + 4 + 8 + 12 + 8
        want.extend_from_slice(&0x0302u16.to_ne_bytes());
        want.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        want.extend_from_slice(&9u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[0, 0, 0x8e, 0xac]); // AF_UNSPEC, v0, queue 36524 BE
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&1u16.to_ne_bytes());
        want.extend_from_slice(&[1, 0, 0, 2]); // BIND, pad, AF_INET BE
        want.extend_from_slice(&9u16.to_ne_bytes());
        want.extend_from_slice(&2u16.to_ne_bytes());
        want.extend_from_slice(&[0, 0, 0xff, 0xff, 2, 0, 0, 0]); // range BE, COPY_PACKET, pad
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&3u16.to_ne_bytes());
        want.extend_from_slice(&8192u32.to_be_bytes());
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_verdict_drops_everything_up_to_an_id() {
        let bytes = drop_verdict_message(5, 7, 0x01020304);
        let msg = messages(&bytes).next().unwrap().unwrap();
        assert_eq!(msg.header.ty, 0x0303);
        assert_eq!(msg.header.flags, NLM_F_REQUEST);
        let (_, queue, rest) = nfgen(msg.payload).unwrap();
        assert_eq!(queue, 7);
        let a = attrs(rest).next().unwrap().unwrap();
        assert_eq!(a.ty, NFQA_VERDICT_HDR);
        assert_eq!(a.data, &[0, 0, 0, 0, 1, 2, 3, 4]);
    }

    /// A packet message as the kernel builds it.
    fn packet_message(queue: u16, id: u32, ip: &[u8]) -> Vec<u8> {
        let mut b = MessageBuf::new();
        let m = b.begin(queue_type(NFQNL_MSG_PACKET), 0, 0);
        b.nfgen(2, queue);
        let mut hdr = id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&0x0800u16.to_be_bytes());
        hdr.push(3);
        b.put(NFQA_PACKET_HDR, &hdr);
        b.put_u32_be(6, 2); // NFQA_IFINDEX_OUTDEV
        b.put(NFQA_PAYLOAD, ip);
        b.end(m);
        b.as_bytes().to_vec()
    }

    #[test]
    fn packets_are_read_with_their_id() {
        let ip = [0x45u8, 0, 0, 40, 1, 2, 3, 4, 5];
        let bytes = packet_message(36524, 77, &ip);
        let msg = messages(&bytes).next().unwrap().unwrap();
        assert_eq!(
            classify(&msg),
            QueueMessage::Packet(QueuedPacket {
                queue: 36524,
                id: 77,
                ip: &ip
            })
        );
        // Without a payload it is counted as bad, not read.
        let mut b = MessageBuf::new();
        let m = b.begin(queue_type(NFQNL_MSG_PACKET), 0, 0);
        b.nfgen(2, 1);
        b.put(NFQA_PACKET_HDR, &[0, 0, 0, 1, 8, 0, 3]);
        b.end(m);
        let msg = messages(b.as_bytes()).next().unwrap().unwrap();
        assert_eq!(classify(&msg), QueueMessage::BadPacket);
    }

    #[test]
    fn proc_counters_are_read_for_our_queue_only() {
        let text = "    0  12345     0 2 65535     0     0        0  1\n36524  -4567     3 2 65535     5     7    12345  1\n";
        assert_eq!(
            parse_proc(text, 36524),
            Some(QueueCounters {
                queued: 12345,
                queue_full: 5,
                socket_full: 7
            })
        );
        assert_eq!(parse_proc(text, 1), None);
        assert_eq!(parse_proc("garbage\n", 0), None);
    }

    proptest! {
        #[test]
        fn random_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            for msg in messages(&bytes).flatten() {
                let _ = classify(&msg);
            }
            // Also with a valid packet header in front of random attributes.
            let mut framed = MessageBuf::new();
            let m = framed.begin(queue_type(NFQNL_MSG_PACKET), 0, 0);
            framed.nfgen(2, 1);
            framed.end(m);
            let mut all = framed.as_bytes().to_vec();
            all.extend_from_slice(&bytes);
            let len = all.len() as u32;
            all[0..4].copy_from_slice(&len.to_ne_bytes());
            for msg in messages(&all).flatten() {
                if let QueueMessage::Packet(p) = classify(&msg) {
                    let _ = parse_frame_headers(LinkType::RawIp, p.ip);
                }
            }
        }
    }
}
