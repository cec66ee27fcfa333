//! Packet framing: a 3-byte little-endian payload length and a 1-byte sequence id before every
//! payload. A payload of 0xFFFFFF bytes or more is cut into 0xFFFFFF-byte packets followed by a
//! shorter one (possibly empty); together they are one *logical* packet.
//!
//! Two readers, for two jobs:
//!
//! * [`FrameScanner`] walks a byte stream and reports where each packet starts, its sequence id and
//!   length, and the first few bytes of each logical payload, buffering nothing else. The copier
//!   forwards client commands of any size (16 MiB and more) byte for byte and only needs to look at
//!   (and possibly rewrite) their first bytes; it walks production's replies the same way. It is
//!   also intercept's only MySQL framer (`intercept::framer` is an adapter around it that turns
//!   what it reports into the summaries sent to copiers), so both sides cut a stream into packets
//!   with the same code. It must never keep more than a prefix of a payload, never interpret one,
//!   and never look for a header again after bytes are missing: any byte may start one, so the
//!   caller feeds it in-order bytes only and stops at a gap.
//! * [`PacketSplitter`] reassembles whole logical payloads, up to a limit, for the packets that must
//!   be read entirely: greetings, logins, auth exchanges, PREPARE_OK.

/// Bytes of the header before each payload.
pub const HEADER_LEN: usize = 4;

/// The largest payload of one physical packet; a packet this long is continued by the next one.
pub const MAX_PAYLOAD_LEN: usize = 0xFF_FFFF;

/// Reassembled payloads and prefixes larger than this are shed from the buffers once delivered, so a
/// single big packet does not pin its memory for the rest of the session.
const KEEP_CAPACITY: usize = 64 * 1024;

/// A physical packet's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketHeader {
    pub len: u32,
    pub seq: u8,
}

impl PacketHeader {
    /// Reads a header from the first four bytes; `None` if there are fewer.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        match *bytes {
            [a, b, c, seq, ..] => Some(Self {
                len: u32::from_le_bytes([a, b, c, 0]),
                seq,
            }),
            _ => None,
        }
    }

    /// The header as on the wire; `len` above 0xFFFFFF is cut to its low 24 bits.
    pub fn to_bytes(self) -> [u8; 4] {
        let l = self.len.to_le_bytes();
        [l[0], l[1], l[2], self.seq]
    }

    /// Whether another physical packet continues this logical one.
    pub fn is_continued(self) -> bool {
        self.len as usize == MAX_PAYLOAD_LEN
    }
}

/// Appends `payload` framed as one logical packet starting at sequence id `seq`, and returns the
/// sequence id the next packet of the exchange takes.
pub fn write_packet(seq: u8, payload: &[u8], out: &mut Vec<u8>) -> u8 {
    write_packet_split(seq, payload, MAX_PAYLOAD_LEN, out)
}

/// How many bytes [`write_packet`] emits for a payload of `payload_len` bytes.
pub fn framed_len(payload_len: usize) -> usize {
    payload_len + HEADER_LEN * packet_count(payload_len, MAX_PAYLOAD_LEN)
}

fn packet_count(payload_len: usize, split: usize) -> usize {
    // A length that is an exact multiple of the split needs an empty packet to say "no more".
    payload_len / split + 1
}

fn write_packet_split(mut seq: u8, payload: &[u8], split: usize, out: &mut Vec<u8>) -> u8 {
    out.reserve(payload.len() + HEADER_LEN * packet_count(payload.len(), split));
    let mut rest = payload;
    loop {
        let n = rest.len().min(split);
        let (chunk, tail) = rest.split_at(n);
        out.extend_from_slice(&PacketHeader { len: n as u32, seq }.to_bytes());
        out.extend_from_slice(chunk);
        seq = seq.wrapping_add(1);
        rest = tail;
        if n < split {
            return seq;
        }
    }
}

/// Where a physical packet sits in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Stream offset of the packet's 4-byte header (bytes fed before it).
    pub offset: u64,
    pub seq: u8,
    /// Payload bytes of this physical packet.
    pub len: u32,
    /// 0 for the packet that starts a logical packet, n for its n-th continuation.
    pub part: u32,
    /// Whether another physical packet continues this logical one.
    pub more: bool,
}

impl FrameHeader {
    /// Stream offset of the first payload byte.
    pub fn payload_offset(&self) -> u64 {
        self.offset + HEADER_LEN as u64
    }
}

/// One step of walking the stream: the walker hands out borrowed pieces of the input.
#[derive(Debug)]
enum Piece<'c> {
    Header(FrameHeader),
    Payload(&'c [u8]),
    /// The physical packet is complete; `logical` when it also completes the logical packet.
    End {
        logical: bool,
    },
}

#[derive(Clone, Copy, Debug)]
enum WalkState {
    Header { have: u8 },
    Payload { remaining: u32 },
    End,
}

/// The framing state machine shared by both readers. It holds at most 3 bytes of a split header.
#[derive(Clone, Debug)]
struct Walker {
    split: u32,
    offset: u64,
    state: WalkState,
    hdr: [u8; 4],
    part: u32,
    more: bool,
}

impl Walker {
    fn new(split: usize) -> Self {
        Self {
            split: split as u32,
            offset: 0,
            state: WalkState::Header { have: 0 },
            hdr: [0; 4],
            part: 0,
            more: false,
        }
    }

    fn at_boundary(&self) -> bool {
        matches!(self.state, WalkState::Header { have: 0 }) && self.part == 0
    }

    /// Passes over the packet whose header starts `input`, at a boundary, without handing out
    /// its pieces: its header and what `input` holds of its payload (the rest is walked as a
    /// payload nobody wants). The caller has checked the header is whole and `len` below the split.
    fn pass(&mut self, input: &mut &[u8], len: u32) {
        let avail = (input.len() - HEADER_LEN).min(len as usize);
        *input = &input[HEADER_LEN + avail..];
        self.offset += (HEADER_LEN + avail) as u64;
        let remaining = len - avail as u32;
        if remaining > 0 {
            self.more = false;
            self.state = WalkState::Payload { remaining };
        }
    }

    fn next<'c>(&mut self, input: &mut &'c [u8]) -> Option<Piece<'c>> {
        match self.state {
            WalkState::End => {
                let logical = !self.more;
                self.part = if logical {
                    0
                } else {
                    self.part.saturating_add(1)
                };
                self.state = WalkState::Header { have: 0 };
                Some(Piece::End { logical })
            }
            WalkState::Header { have } => {
                if input.is_empty() {
                    return None;
                }
                let have = usize::from(have);
                let take = (HEADER_LEN - have).min(input.len());
                self.hdr[have..have + take].copy_from_slice(&input[..take]);
                *input = &input[take..];
                self.offset += take as u64;
                let have = have + take;
                if have < HEADER_LEN {
                    self.state = WalkState::Header { have: have as u8 };
                    return None;
                }
                let PacketHeader { len, seq } = PacketHeader::parse(&self.hdr)?;
                self.more = len == self.split;
                self.state = if len == 0 {
                    WalkState::End
                } else {
                    WalkState::Payload { remaining: len }
                };
                Some(Piece::Header(FrameHeader {
                    offset: self.offset - HEADER_LEN as u64,
                    seq,
                    len,
                    part: self.part,
                    more: self.more,
                }))
            }
            WalkState::Payload { remaining } => {
                if input.is_empty() {
                    return None;
                }
                let n = (remaining as usize).min(input.len());
                let (piece, rest) = input.split_at(n);
                *input = rest;
                self.offset += n as u64;
                let remaining = remaining - n as u32;
                self.state = if remaining == 0 {
                    WalkState::End
                } else {
                    WalkState::Payload { remaining }
                };
                Some(Piece::Payload(piece))
            }
        }
    }
}

/// A physical packet found by [`FrameScanner`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedPacket<'a> {
    pub header: FrameHeader,
    /// The first `min(prefix_len, len)` payload bytes when `header.part == 0` (`prefix_len`
    /// as [`ScanSink::prefix_len`] answered, else the scanner's); empty for continuation
    /// packets, whose payload is the middle of a larger one.
    pub prefix: &'a [u8],
    /// The hash of this physical packet's whole payload
    /// ([`PayloadHasher`](super::digest::PayloadHasher)), from a scanner made with
    /// [`FrameScanner::with_hashes`] (or switched to it); `None` otherwise.
    pub hash: Option<u64>,
}

/// Where [`FrameScanner::feed_skimming`] reports.
pub trait ScanSink {
    /// A packet offered before it is walked: its sequence id, payload length and first
    /// `min(len, FrameScanner::SKIM_HEAD)` payload bytes. True passes over it unreported.
    fn skim(&mut self, seq: u8, len: u32, head: &[u8]) -> bool;

    /// The prefix wanted of the packet whose header was just read: asked once for every
    /// physical packet walked (never for one [`Self::skim`] took), with the scanner's own
    /// `prefix_len` as `default`. The answer is cut to [`FrameScanner::MAX_PREFIX`] and used
    /// only for a packet that starts a logical one. The copier takes the default; intercept
    /// keeps the login's packets whole and later ones short (`intercept::framer`).
    #[inline]
    fn prefix_len(&mut self, _header: &FrameHeader, default: usize) -> usize {
        default
    }

    /// A packet reported as [`FrameScanner::feed`] reports it.
    fn packet(&mut self, p: ScannedPacket<'_>);
}

/// [`FrameScanner::feed`]'s callback as a sink that is never offered a packet to skim.
struct Each<F>(F);

impl<F: FnMut(ScannedPacket<'_>)> ScanSink for Each<F> {
    #[inline]
    fn skim(&mut self, _: u8, _: u32, _: &[u8]) -> bool {
        false
    }

    #[inline]
    fn packet(&mut self, p: ScannedPacket<'_>) {
        (self.0)(p)
    }
}

/// Finds packet boundaries in a byte stream without keeping payloads.
///
/// Fed chunks of the stream in order (any sizes, TCP segments as they come), it reports each
/// physical packet once its header and the requested prefix of its payload have arrived. Memory
/// is fixed: 3 bytes of a split header and `prefix_len` bytes of a split prefix.
#[derive(Clone, Debug)]
pub struct FrameScanner {
    walker: Walker,
    /// At most [`Self::MAX_PREFIX`], hence a `u32`: that leaves `switch` room in the same word
    /// (see `a_scanner_stays_small`).
    prefix_len: u32,
    /// [`Self::set_hashing`] asked for the other mode: it starts with the next header read.
    switch: bool,
    prefix: Vec<u8>,
    /// The packet being read, with the prefix length wanted: without hashing, a header
    /// reported once its prefix is complete; with hashing, the packet being hashed.
    // One field for both modes, and the hasher boxed: a copier keeps two scanners per
    // session, idle ones included (docs/BENCHMARKS.md, memory per idle session).
    pending: Option<(FrameHeader, usize)>,
    /// Hashing every payload: packets are reported at their end, with their hash.
    hasher: Option<Box<super::digest::PayloadHasher>>,
}

impl FrameScanner {
    /// The longest prefix a scanner keeps; larger requests are cut to this.
    pub const MAX_PREFIX: usize = 64 * 1024;

    /// A scanner that reports the first `prefix_len` bytes of each logical payload (5 covers a
    /// command byte and a statement id).
    pub fn new(prefix_len: usize) -> Self {
        Self::with_split(prefix_len, MAX_PAYLOAD_LEN)
    }

    fn with_split(prefix_len: usize, split: usize) -> Self {
        let prefix_len = prefix_len.min(Self::MAX_PREFIX) as u32;
        Self {
            walker: Walker::new(split),
            prefix_len,
            switch: false,
            prefix: Vec::new(),
            pending: None,
            hasher: None,
        }
    }

    /// A scanner that also hashes each physical packet's whole payload and therefore reports
    /// each packet when it ends (not when its prefix is in), with [`ScannedPacket::hash`]. The
    /// prefix is copied (at most `prefix_len` bytes per packet), the payload never kept.
    pub fn with_hashes(prefix_len: usize) -> Self {
        let mut s = Self::new(prefix_len);
        s.hasher = Some(Box::default());
        s
    }

    /// Turns payload hashes (as [`Self::with_hashes`]) on or off from the next physical packet
    /// whose header is read: the packet being read, if any, ends in the mode it started in.
    /// Intercept switches when a copier asking for hashes connects or leaves.
    pub fn set_hashing(&mut self, on: bool) {
        self.switch = on != self.hasher.is_some();
    }

    /// Stream bytes fed so far.
    pub fn position(&self) -> u64 {
        self.walker.offset
    }

    /// Whether the bytes fed so far end exactly between two logical packets.
    pub fn at_boundary(&self) -> bool {
        self.walker.at_boundary()
    }

    /// Feeds the next chunk of the stream; `on_packet` is called for each physical packet whose
    /// header (and prefix) completed within it.
    pub fn feed(&mut self, chunk: &[u8], on_packet: impl FnMut(ScannedPacket<'_>)) {
        self.walk::<_, false>(chunk, &mut Each(on_packet));
    }

    /// Head bytes a [`ScanSink::skim`] is shown: enough to tell a row from an EOF, OK or ERR.
    pub const SKIM_HEAD: usize = 5;

    /// [`Self::feed`], with a sink that may pass over packets unreported: each packet that
    /// starts a logical packet, shorter than the split, whose header and first
    /// `min(len, SKIM_HEAD)` payload bytes are in `chunk`, is first offered to
    /// [`ScanSink::skim`]; one it takes costs no more than its header. A reply stream is mostly
    /// rows, of which the copier reads nothing but "not 0xFE, not 0xFF" (issue 20). A hashing
    /// scanner never skims: every payload must be hashed.
    pub fn feed_skimming(&mut self, chunk: &[u8], sink: &mut impl ScanSink) {
        self.walk::<_, true>(chunk, sink);
    }

    /// Walks `chunk` in the current mode, changing loops (at most once per [`Self::set_hashing`])
    /// where the next packet starts.
    fn walk<S: ScanSink, const SKIM: bool>(&mut self, chunk: &[u8], sink: &mut S) {
        let mut input = chunk;
        // Between two packets the switch is taken at once, so the next packet may be skimmed.
        if self.switch && self.pending.is_none() && self.walker.at_boundary() {
            self.take_switch();
        }
        loop {
            let switched = if self.hasher.is_some() {
                self.walk_hashing(&mut input, sink)
            } else {
                self.walk_plain::<S, SKIM>(&mut input, sink)
            };
            if !switched {
                return;
            }
        }
    }

    /// True when it stopped at a header that switched to hashing (the header is handled).
    fn walk_plain<S: ScanSink, const SKIM: bool>(
        &mut self,
        input: &mut &[u8],
        sink: &mut S,
    ) -> bool {
        loop {
            if !self.switch && self.pending.is_none() && self.walker.at_boundary() {
                if let Some(h) = PacketHeader::parse(input) {
                    if h.len < self.walker.split {
                        // A whole header at a boundary, not continued: the common case, taken
                        // here in one step instead of piece by piece through the walker.
                        if SKIM {
                            let head = (h.len as usize).min(Self::SKIM_HEAD);
                            if input.len() - HEADER_LEN >= head
                                && sink.skim(h.seq, h.len, &input[HEADER_LEN..HEADER_LEN + head])
                            {
                                self.walker.pass(input, h.len);
                                continue;
                            }
                        }
                        self.packet_at_boundary(h, input, sink);
                        continue;
                    }
                }
            }
            let Some(piece) = self.walker.next(input) else {
                return false;
            };
            if self.piece(piece, sink) {
                return true;
            }
        }
    }

    /// Reads the packet whose whole header starts `input`, at a boundary, below the split, as
    /// the walker would: reported at once with its prefix when that is in `input` too (and the
    /// payload there passed over), otherwise its header walked and its prefix left pending.
    fn packet_at_boundary<S: ScanSink>(
        &mut self,
        h: PacketHeader,
        input: &mut &[u8],
        sink: &mut S,
    ) {
        let header = FrameHeader {
            offset: self.walker.offset,
            seq: h.seq,
            len: h.len,
            part: 0,
            more: false,
        };
        let prefix_len = sink
            .prefix_len(&header, self.prefix_len as usize)
            .min(Self::MAX_PREFIX);
        let want = (h.len as usize).min(prefix_len);
        if input.len() - HEADER_LEN >= want {
            sink.packet(ScannedPacket {
                header,
                prefix: &input[HEADER_LEN..HEADER_LEN + want],
                hash: None,
            });
            self.walker.pass(input, h.len);
            return;
        }
        // The prefix goes on in a later chunk: want > 0 here.
        let walked = self.walker.next(input);
        debug_assert_eq!(
            walked.map(|p| matches!(p, Piece::Header(w) if w == header)),
            Some(true)
        );
        self.pending = Some((header, want));
        self.prefix.clear();
    }

    /// One piece without hashing; true when it was a header that switched to hashing.
    fn piece<S: ScanSink>(&mut self, piece: Piece<'_>, sink: &mut S) -> bool {
        match piece {
            Piece::Header(header) => {
                if self.switch {
                    self.take_switch();
                    self.hashing_piece(Piece::Header(header), sink);
                    return true;
                }
                let prefix_len = sink
                    .prefix_len(&header, self.prefix_len as usize)
                    .min(Self::MAX_PREFIX);
                let want = (header.len as usize).min(prefix_len);
                if header.part == 0 && want > 0 {
                    self.pending = Some((header, want));
                    self.prefix.clear();
                } else {
                    sink.packet(ScannedPacket {
                        header,
                        prefix: &[],
                        hash: None,
                    });
                }
            }
            Piece::Payload(data) => {
                let Some((header, want)) = self.pending else {
                    return false;
                };
                if self.prefix.is_empty() && data.len() >= want {
                    self.pending = None;
                    sink.packet(ScannedPacket {
                        header,
                        prefix: &data[..want],
                        hash: None,
                    });
                    return false;
                }
                let take = (want - self.prefix.len()).min(data.len());
                self.prefix.extend_from_slice(&data[..take]);
                if self.prefix.len() == want {
                    self.pending = None;
                    sink.packet(ScannedPacket {
                        header,
                        prefix: &self.prefix,
                        hash: None,
                    });
                    if self.prefix.capacity() > KEEP_CAPACITY {
                        self.prefix = Vec::new();
                    }
                }
            }
            Piece::End { .. } => {}
        }
        false
    }

    /// True when it switched hashing off: at a header (handled), or at the end of a logical
    /// packet.
    fn walk_hashing<S: ScanSink>(&mut self, input: &mut &[u8], sink: &mut S) -> bool {
        while let Some(piece) = self.walker.next(input) {
            if self.hashing_piece(piece, sink) {
                return true;
            }
        }
        false
    }

    /// One piece with hashing; true when it switched hashing off (see [`Self::walk_hashing`]).
    fn hashing_piece<S: ScanSink>(&mut self, piece: Piece<'_>, sink: &mut S) -> bool {
        match piece {
            Piece::Header(header) => {
                if self.switch {
                    self.take_switch();
                    self.piece(Piece::Header(header), sink);
                    return true;
                }
                let prefix_len = sink
                    .prefix_len(&header, self.prefix_len as usize)
                    .min(Self::MAX_PREFIX);
                let want = if header.part == 0 {
                    (header.len as usize).min(prefix_len)
                } else {
                    0
                };
                self.pending = Some((header, want));
                self.prefix.clear();
                if let Some(h) = &mut self.hasher {
                    **h = super::digest::PayloadHasher::new();
                }
            }
            Piece::Payload(data) => {
                if let Some(h) = &mut self.hasher {
                    h.update(data);
                }
                if let Some((_, want)) = self.pending {
                    let take = want.saturating_sub(self.prefix.len()).min(data.len());
                    self.prefix.extend_from_slice(&data[..take]);
                }
            }
            Piece::End { .. } => {
                let Some((header, _)) = self.pending.take() else {
                    return false;
                };
                sink.packet(ScannedPacket {
                    header,
                    prefix: &self.prefix,
                    hash: self.hasher.as_ref().map(|h| h.finish()),
                });
                if self.prefix.capacity() > KEEP_CAPACITY {
                    self.prefix = Vec::new();
                }
                // Hashes off between two logical packets: the next one may be skimmed.
                if self.switch && self.walker.at_boundary() {
                    self.take_switch();
                    return true;
                }
            }
        }
        false
    }

    /// Changes mode as [`Self::set_hashing`] asked; only between two physical packets.
    fn take_switch(&mut self) {
        self.switch = false;
        self.hasher = match self.hasher {
            Some(_) => None,
            None => Some(Box::default()),
        };
    }
}

/// What a [`PacketSplitter`] does with a logical packet larger than its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oversize {
    /// Stop with [`FrameError::TooLarge`]; the splitter refuses further input.
    Fail,
    /// Drop its bytes as they arrive and report it as a [`Packet`] without payload.
    Skip,
}

/// Why a [`PacketSplitter`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("logical packet at stream offset {offset} exceeds the {limit}-byte limit")]
    TooLarge { offset: u64, limit: usize },
}

/// A logical packet delivered by [`PacketSplitter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Stream offset of its first header.
    pub offset: u64,
    /// Sequence id of its first physical packet.
    pub seq: u8,
    /// Sequence id of its last physical packet (`seq` unless it was split).
    pub last_seq: u8,
    /// Physical packets it took.
    pub parts: u32,
    /// Logical payload length.
    pub len: u64,
    payload: Option<&'a [u8]>,
}

impl<'a> Packet<'a> {
    /// The whole logical payload; `None` when it was over the limit and skipped.
    pub fn payload(&self) -> Option<&'a [u8]> {
        self.payload
    }

    pub fn is_skipped(&self) -> bool {
        self.payload.is_none()
    }

    /// Stream offset just past its last byte.
    pub fn end_offset(&self) -> u64 {
        self.offset + self.len + HEADER_LEN as u64 * u64::from(self.parts)
    }
}

#[derive(Clone, Copy, Debug)]
struct Assembling {
    offset: u64,
    seq: u8,
    last_seq: u8,
    parts: u32,
    len: u64,
    skipping: bool,
}

/// Reassembles logical packets from a byte stream fed in arbitrary chunks.
///
/// A packet that lies whole in one fed chunk is handed out as a slice of that chunk; only packets
/// split across chunks or physical packets are copied, into a buffer never larger than the limit.
#[derive(Clone, Debug)]
pub struct PacketSplitter {
    walker: Walker,
    max_len: usize,
    oversize: Oversize,
    buf: Vec<u8>,
    current: Option<Assembling>,
    failed: Option<FrameError>,
}

impl PacketSplitter {
    /// A splitter that delivers logical payloads up to `max_len` bytes and treats larger ones as
    /// `oversize` says.
    pub fn new(max_len: usize, oversize: Oversize) -> Self {
        Self::with_split(max_len, oversize, MAX_PAYLOAD_LEN)
    }

    fn with_split(max_len: usize, oversize: Oversize, split: usize) -> Self {
        Self {
            walker: Walker::new(split),
            max_len,
            oversize,
            buf: Vec::new(),
            current: None,
            failed: None,
        }
    }

    /// Stream bytes fed so far.
    pub fn position(&self) -> u64 {
        self.walker.offset
    }

    /// Payload bytes held for a logical packet not yet complete.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Whether the bytes fed so far end exactly between two logical packets.
    pub fn at_boundary(&self) -> bool {
        self.walker.at_boundary()
    }

    /// Feeds the next chunk of the stream; `on_packet` is called for each logical packet that
    /// completed within it, in stream order.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        mut on_packet: impl FnMut(Packet<'_>),
    ) -> Result<(), FrameError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut input = chunk;
        // A packet met whole in this chunk is lent out directly instead of being copied.
        let mut direct: Option<&[u8]> = None;
        while let Some(piece) = self.walker.next(&mut input) {
            match piece {
                Piece::Header(h) => match &mut self.current {
                    Some(cur) if h.part > 0 => {
                        cur.parts = cur.parts.saturating_add(1);
                        cur.last_seq = h.seq;
                    }
                    _ => {
                        self.buf.clear();
                        direct = None;
                        self.current = Some(Assembling {
                            offset: h.offset,
                            seq: h.seq,
                            last_seq: h.seq,
                            parts: 1,
                            len: 0,
                            skipping: false,
                        });
                        if h.len as usize > self.max_len {
                            self.overflow()?;
                        } else if !h.more && input.len() >= h.len as usize {
                            direct = Some(&input[..h.len as usize]);
                        }
                    }
                },
                Piece::Payload(data) => {
                    let Some(cur) = &mut self.current else {
                        continue;
                    };
                    cur.len += data.len() as u64;
                    if cur.skipping || direct.is_some() {
                        continue;
                    }
                    if cur.len > self.max_len as u64 {
                        self.overflow()?;
                        continue;
                    }
                    self.buf.extend_from_slice(data);
                }
                Piece::End { logical: true } => {
                    let Some(cur) = self.current.take() else {
                        continue;
                    };
                    let payload = if cur.skipping {
                        None
                    } else {
                        Some(direct.take().unwrap_or(&self.buf))
                    };
                    on_packet(Packet {
                        offset: cur.offset,
                        seq: cur.seq,
                        last_seq: cur.last_seq,
                        parts: cur.parts,
                        len: cur.len,
                        payload,
                    });
                    self.buf.clear();
                    if self.buf.capacity() > KEEP_CAPACITY {
                        self.buf = Vec::new();
                    }
                }
                Piece::End { logical: false } => {}
            }
        }
        Ok(())
    }

    fn overflow(&mut self) -> Result<(), FrameError> {
        let Some(cur) = &mut self.current else {
            return Ok(());
        };
        match self.oversize {
            Oversize::Skip => {
                cur.skipping = true;
                self.buf = Vec::new();
                Ok(())
            }
            Oversize::Fail => {
                let e = FrameError::TooLarge {
                    offset: cur.offset,
                    limit: self.max_len,
                };
                self.failed = Some(e);
                self.buf = Vec::new();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;
