//! The streaming reader: one block (pcapng) or record (pcap) at a time, in a reused buffer.
//!
//! After the first error the reader yields nothing more: everything before the damaged block
//! has been delivered, and guessing where the next good block starts could replay garbage.

use std::fmt;
use std::io::{self, Read};

use super::{FileFrame, MAX_BLOCK_LEN};

/// Which container a file uses, from its first four bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// Classic libpcap format (tcpdump's default), either byte order, µs or ns timestamps.
    Pcap,
    /// pcapng (Wireshark's default, `copier record`'s output).
    Pcapng,
}

impl fmt::Display for FileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileFormat::Pcap => "pcap",
            FileFormat::Pcapng => "pcapng",
        })
    }
}

/// Why a file could not be read further. Each names the byte offset where the damage starts.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "not a pcap or pcapng file (it starts with {magic:02x?}); write captures with `copier record`, \
         `tcpdump -w` or Wireshark"
    )]
    NotACapture { magic: Vec<u8> },
    #[error(
        "truncated {what} at offset {offset}: it needs {needed} bytes, the file ends after {got}"
    )]
    Truncated {
        offset: u64,
        what: &'static str,
        needed: u64,
        got: u64,
    },
    #[error("corrupt {what} at offset {offset}: {why}")]
    Corrupt {
        offset: u64,
        what: &'static str,
        why: String,
    },
    #[error("cannot read at offset {offset}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: io::Error,
    },
}

impl ReadError {
    /// Where the damage starts (0 for a file that is no capture at all).
    pub fn offset(&self) -> u64 {
        match self {
            ReadError::NotACapture { .. } => 0,
            ReadError::Truncated { offset, .. }
            | ReadError::Corrupt { offset, .. }
            | ReadError::Io { offset, .. } => *offset,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endian {
    Little,
    Big,
}

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> u16 {
        let mut a = [0u8; 2];
        if let Some(s) = b.get(at..at + 2) {
            a.copy_from_slice(s);
        }
        match self {
            Endian::Little => u16::from_le_bytes(a),
            Endian::Big => u16::from_be_bytes(a),
        }
    }
    fn u32(self, b: &[u8], at: usize) -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = b.get(at..at + 4) {
            a.copy_from_slice(s);
        }
        match self {
            Endian::Little => u32::from_le_bytes(a),
            Endian::Big => u32::from_be_bytes(a),
        }
    }
    fn u64(self, b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        if let Some(s) = b.get(at..at + 8) {
            a.copy_from_slice(s);
        }
        match self {
            Endian::Little => u64::from_le_bytes(a),
            Endian::Big => u64::from_be_bytes(a),
        }
    }
}

/// An interface described by a pcapng IDB.
#[derive(Clone, Copy, Debug)]
struct Interface {
    link_type: u16,
    snaplen: u32,
    /// Timestamp units per second (`if_tsresol`; 10^6 when absent).
    units_per_sec: u64,
    /// `if_tsoffset`: seconds added to every timestamp.
    offset_secs: i64,
}

/// Interfaces per pcapng section at most: bounds the table a hostile file can make us build.
const MAX_INTERFACES: usize = 65_536;

const PCAP_HEADER_LEN: usize = 24;
const PCAP_RECORD_HEADER_LEN: usize = 16;
const SHB_TYPE: u32 = 0x0A0D_0D0A;

enum State {
    Pcap {
        endian: Endian,
        nanos: bool,
        link_type: u16,
    },
    Pcapng {
        endian: Endian,
        interfaces: Vec<Interface>,
        /// Simple Packet Blocks carry no timestamp: they get the last one seen.
        last_ts_ns: u64,
    },
}

/// Reads frames from a pcap or pcapng stream. Wrap files in a `BufReader`.
pub struct CaptureReader<R> {
    src: R,
    /// File offset of the next byte `src` yields.
    offset: u64,
    buf: Vec<u8>,
    state: State,
    format: FileFormat,
    done: bool,
}

/// What a pcapng block turned out to be.
enum Block {
    Frame {
        ts_ns: u64,
        link_type: u16,
        start: usize,
        len: usize,
        orig_len: u32,
    },
    Other,
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header (pcap) or first section header (pcapng).
    pub fn new(mut src: R) -> Result<Self, ReadError> {
        let mut buf = Vec::with_capacity(64 << 10);
        let got = read_up_to(&mut src, &mut buf, 4)
            .map_err(|source| ReadError::Io { offset: 0, source })?;
        if got < 4 {
            return Err(if got == 0 {
                ReadError::Truncated {
                    offset: 0,
                    what: "file header",
                    needed: 4,
                    got: 0,
                }
            } else {
                ReadError::NotACapture { magic: buf.clone() }
            });
        }
        let magic = [buf[0], buf[1], buf[2], buf[3]];
        let pcap = match u32::from_le_bytes(magic) {
            0xa1b2_c3d4 => Some((Endian::Little, false)),
            0xa1b2_3c4d => Some((Endian::Little, true)),
            _ => match u32::from_be_bytes(magic) {
                0xa1b2_c3d4 => Some((Endian::Big, false)),
                0xa1b2_3c4d => Some((Endian::Big, true)),
                _ => None,
            },
        };
        if let Some((endian, nanos)) = pcap {
            let got = read_up_to(&mut src, &mut buf, PCAP_HEADER_LEN - 4)
                .map_err(|source| ReadError::Io { offset: 4, source })?;
            if got < PCAP_HEADER_LEN - 4 {
                return Err(ReadError::Truncated {
                    offset: 0,
                    what: "pcap file header",
                    needed: PCAP_HEADER_LEN as u64,
                    got: 4 + got as u64,
                });
            }
            // The upper bits of the link field carry FCS information; the type is the low 16.
            let link_type = endian.u32(&buf, 20) as u16;
            return Ok(Self {
                src,
                offset: PCAP_HEADER_LEN as u64,
                buf,
                state: State::Pcap {
                    endian,
                    nanos,
                    link_type,
                },
                format: FileFormat::Pcap,
                done: false,
            });
        }
        if u32::from_le_bytes(magic) != SHB_TYPE {
            return Err(ReadError::NotACapture {
                magic: magic.to_vec(),
            });
        }
        let mut reader = Self {
            src,
            offset: 0,
            buf,
            state: State::Pcapng {
                endian: Endian::Little,
                interfaces: Vec::new(),
                last_ts_ns: 0,
            },
            format: FileFormat::Pcapng,
            done: false,
        };
        // The first section header is read now so a file that is pcapng in name only fails
        // before anything is replayed from it.
        match reader.next_pcapng_block(true)? {
            Some(_) => Ok(reader),
            None => Err(ReadError::Truncated {
                offset: 0,
                what: "section header block",
                needed: 28,
                got: 4,
            }),
        }
    }

    pub fn format(&self) -> FileFormat {
        self.format
    }

    /// Bytes consumed so far: the offset of the next block.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next frame, `Ok(None)` at the end of the file. After an error, always `Ok(None)`.
    pub fn next_frame(&mut self) -> Result<Option<FileFrame<'_>>, ReadError> {
        if self.done {
            return Ok(None);
        }
        let result = match self.state {
            State::Pcap { .. } => self.next_pcap_record(),
            State::Pcapng { .. } => loop {
                match self.next_pcapng_block(false) {
                    Ok(Some(Block::Other)) => continue,
                    Ok(Some(Block::Frame {
                        ts_ns,
                        link_type,
                        start,
                        len,
                        orig_len,
                    })) => break Ok(Some((ts_ns, link_type, start, len, orig_len))),
                    Ok(None) => break Ok(None),
                    Err(e) => break Err(e),
                }
            },
        };
        match result {
            Ok(Some((ts_ns, link_type, start, len, orig_len))) => Ok(Some(FileFrame {
                ts_ns,
                link_type,
                data: self.buf.get(start..start + len).unwrap_or(&[]),
                orig_len,
            })),
            Ok(None) => {
                self.done = true;
                Ok(None)
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    /// Reads exactly `n` more bytes of the block that began at `block_start` into `buf`
    /// (after what it holds); a short read is a truncated block.
    fn read_block_part(
        &mut self,
        n: usize,
        block_start: u64,
        what: &'static str,
        needed: u64,
    ) -> Result<(), ReadError> {
        let got = read_up_to(&mut self.src, &mut self.buf, n).map_err(|source| ReadError::Io {
            offset: self.offset,
            source,
        })?;
        self.offset += got as u64;
        if got < n {
            return Err(ReadError::Truncated {
                offset: block_start,
                what,
                needed,
                got: self.offset - block_start,
            });
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn next_pcap_record(&mut self) -> Result<Option<(u64, u16, usize, usize, u32)>, ReadError> {
        let State::Pcap {
            endian,
            nanos,
            link_type,
        } = self.state
        else {
            return Ok(None);
        };
        let start = self.offset;
        self.buf.clear();
        let got =
            read_up_to(&mut self.src, &mut self.buf, PCAP_RECORD_HEADER_LEN).map_err(|source| {
                ReadError::Io {
                    offset: start,
                    source,
                }
            })?;
        self.offset += got as u64;
        if got == 0 {
            return Ok(None);
        }
        if got < PCAP_RECORD_HEADER_LEN {
            return Err(ReadError::Truncated {
                offset: start,
                what: "packet record",
                needed: PCAP_RECORD_HEADER_LEN as u64,
                got: got as u64,
            });
        }
        let secs = u64::from(endian.u32(&self.buf, 0));
        let frac = u64::from(endian.u32(&self.buf, 4));
        let caplen = endian.u32(&self.buf, 8);
        let orig_len = endian.u32(&self.buf, 12);
        if caplen > MAX_BLOCK_LEN {
            return Err(ReadError::Corrupt {
                offset: start,
                what: "packet record",
                why: format!(
                    "captured length {caplen} is beyond the {MAX_BLOCK_LEN}-byte limit (a damaged length field)"
                ),
            });
        }
        let needed = (PCAP_RECORD_HEADER_LEN as u64) + u64::from(caplen);
        self.buf.clear();
        self.read_block_part(caplen as usize, start, "packet record", needed)?;
        let frac_ns = if nanos {
            frac
        } else {
            frac.saturating_mul(1000)
        };
        let ts_ns = secs.saturating_mul(1_000_000_000).saturating_add(frac_ns);
        Ok(Some((ts_ns, link_type, 0, caplen as usize, orig_len)))
    }

    /// One pcapng block. `first`: the section header that opens the file (already detected).
    fn next_pcapng_block(&mut self, first: bool) -> Result<Option<Block>, ReadError> {
        let start = self.offset;
        self.buf.clear();
        if first {
            // The magic (= block type) was consumed by `new`.
            self.buf.extend_from_slice(&SHB_TYPE.to_le_bytes());
        }
        let have = self.buf.len();
        let got =
            read_up_to(&mut self.src, &mut self.buf, 8 - have).map_err(|source| ReadError::Io {
                offset: start,
                source,
            })?;
        self.offset += (have + got) as u64;
        if have + got == 0 {
            return Ok(None);
        }
        if have + got < 8 {
            return Err(ReadError::Truncated {
                offset: start,
                what: "block header",
                needed: 8,
                got: (have + got) as u64,
            });
        }
        let State::Pcapng {
            endian: section_endian,
            ..
        } = self.state
        else {
            return Ok(None);
        };
        let raw_type = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
        // The section header's type reads the same in both byte orders; its byte-order magic,
        // right after the length, says how to read the rest of the section.
        let endian = if u32::from_le_bytes(raw_type) == SHB_TYPE {
            self.read_block_part(4, start, "section header block", 12)?;
            match &self.buf[8..12] {
                [0x4D, 0x3C, 0x2B, 0x1A] => Endian::Little,
                [0x1A, 0x2B, 0x3C, 0x4D] => Endian::Big,
                other => {
                    return Err(ReadError::Corrupt {
                        offset: start,
                        what: "section header block",
                        why: format!(
                            "byte-order magic {other:02x?} is neither 1a2b3c4d nor its reverse"
                        ),
                    })
                }
            }
        } else {
            section_endian
        };
        let block_type = endian.u32(&self.buf, 0);
        let total = endian.u32(&self.buf, 4);
        let what = block_name(block_type);
        let min = if block_type == SHB_TYPE { 28 } else { 12 };
        if total < min || total % 4 != 0 || total > MAX_BLOCK_LEN {
            return Err(ReadError::Corrupt {
                offset: start,
                what,
                why: format!(
                    "block length {total} is impossible (at least {min}, a multiple of 4, at most {MAX_BLOCK_LEN})"
                ),
            });
        }
        let read_so_far = self.buf.len();
        self.read_block_part(total as usize - read_so_far, start, what, u64::from(total))?;
        let trailer = endian.u32(&self.buf, total as usize - 4);
        if trailer != total {
            return Err(ReadError::Corrupt {
                offset: start,
                what,
                why: format!(
                    "its closing length {trailer} differs from its opening length {total}"
                ),
            });
        }
        // Block body, between the 8-byte header and the 4-byte trailer.
        let body = 8..total as usize - 4;
        let corrupt = |why: String| ReadError::Corrupt {
            offset: start,
            what,
            why,
        };
        let State::Pcapng {
            interfaces,
            last_ts_ns,
            endian: state_endian,
        } = &mut self.state
        else {
            return Ok(None);
        };
        match block_type {
            SHB_TYPE => {
                let b = &self.buf[body];
                let major = endian.u16(b, 4);
                if major != 1 {
                    return Err(corrupt(format!(
                        "pcapng version {major}.{} is not supported (only 1.x)",
                        endian.u16(b, 6)
                    )));
                }
                *state_endian = endian;
                interfaces.clear();
                Ok(Some(Block::Other))
            }
            // Interface Description Block.
            1 => {
                let b = &self.buf[body];
                if b.len() < 8 {
                    return Err(corrupt("shorter than its fixed fields".into()));
                }
                if interfaces.len() >= MAX_INTERFACES {
                    return Err(corrupt(format!(
                        "more than {MAX_INTERFACES} interfaces in one section"
                    )));
                }
                let mut iface = Interface {
                    link_type: endian.u16(b, 0),
                    snaplen: endian.u32(b, 4),
                    units_per_sec: 1_000_000,
                    offset_secs: 0,
                };
                for (code, value) in Options::new(&b[8..], endian) {
                    match (code, value.len()) {
                        (9, 1) => {
                            let v = value[0];
                            iface.units_per_sec = if v & 0x80 == 0 {
                                match 10u64.checked_pow(u32::from(v)) {
                                    Some(u) => u,
                                    None => {
                                        return Err(corrupt(format!(
                                            "if_tsresol 10^-{v} is out of range"
                                        )))
                                    }
                                }
                            } else {
                                match 1u64.checked_shl(u32::from(v & 0x7f)) {
                                    Some(u) => u,
                                    None => {
                                        return Err(corrupt(format!(
                                            "if_tsresol 2^-{} is out of range",
                                            v & 0x7f
                                        )))
                                    }
                                }
                            };
                        }
                        (14, 8) => iface.offset_secs = endian.u64(value, 0) as i64,
                        _ => {}
                    }
                }
                interfaces.push(iface);
                Ok(Some(Block::Other))
            }
            // Enhanced Packet Block, and the obsolete Packet Block (same shape, 16-bit interface).
            6 | 2 => {
                let b = &self.buf[body.clone()];
                if b.len() < 20 {
                    return Err(corrupt("shorter than its fixed fields".into()));
                }
                let id = if block_type == 6 {
                    endian.u32(b, 0)
                } else {
                    u32::from(endian.u16(b, 0))
                };
                let Some(iface) = interfaces.get(id as usize).copied() else {
                    return Err(corrupt(format!(
                        "packet of interface {id}, but the section describes {}",
                        interfaces.len()
                    )));
                };
                let units = (u64::from(endian.u32(b, 4)) << 32) | u64::from(endian.u32(b, 8));
                let caplen = endian.u32(b, 12);
                let orig_len = endian.u32(b, 16);
                if u64::from(caplen) > (b.len() - 20) as u64 {
                    return Err(corrupt(format!(
                        "captured length {caplen} does not fit in the block ({} bytes of data)",
                        b.len() - 20
                    )));
                }
                let ts_ns = to_nanos(units, iface);
                *last_ts_ns = ts_ns;
                Ok(Some(Block::Frame {
                    ts_ns,
                    link_type: iface.link_type,
                    start: body.start + 20,
                    len: caplen as usize,
                    orig_len,
                }))
            }
            // Simple Packet Block: no interface id (always 0), no timestamp, no captured length.
            3 => {
                let b = &self.buf[body.clone()];
                if b.len() < 4 {
                    return Err(corrupt("shorter than its fixed fields".into()));
                }
                let Some(iface) = interfaces.first().copied() else {
                    return Err(corrupt(
                        "simple packet before any interface description".into(),
                    ));
                };
                let orig_len = endian.u32(b, 0);
                let mut len = (b.len() - 4).min(orig_len as usize);
                if iface.snaplen != 0 {
                    len = len.min(iface.snaplen as usize);
                }
                Ok(Some(Block::Frame {
                    ts_ns: *last_ts_ns,
                    link_type: iface.link_type,
                    start: body.start + 4,
                    len,
                    orig_len,
                }))
            }
            _ => Ok(Some(Block::Other)),
        }
    }
}

fn block_name(t: u32) -> &'static str {
    match t {
        SHB_TYPE => "section header block",
        1 => "interface description block",
        2 => "packet block",
        3 => "simple packet block",
        6 => "enhanced packet block",
        _ => "block",
    }
}

fn to_nanos(units: u64, iface: Interface) -> u64 {
    let ns = u128::from(units) * 1_000_000_000 / u128::from(iface.units_per_sec.max(1));
    let ns =
        i128::try_from(ns).unwrap_or(i128::MAX) + i128::from(iface.offset_secs) * 1_000_000_000;
    u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
}

/// pcapng options: (code, value) until opt_endofopt or the end; a malformed tail ends the list
/// (options only refine a block, so what was read stays usable).
struct Options<'a> {
    rest: &'a [u8],
    endian: Endian,
}

impl<'a> Options<'a> {
    fn new(rest: &'a [u8], endian: Endian) -> Self {
        Self { rest, endian }
    }
}

impl<'a> Iterator for Options<'a> {
    type Item = (u16, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 4 {
            return None;
        }
        let code = self.endian.u16(self.rest, 0);
        let len = usize::from(self.endian.u16(self.rest, 2));
        if code == 0 {
            return None;
        }
        let padded = (len + 3) & !3;
        let value = self.rest.get(4..4 + len)?;
        self.rest = self.rest.get(4 + padded..).unwrap_or(&[]);
        Some((code, value))
    }
}

/// Appends up to `n` bytes from `src` to `buf`; fewer only at the end of the stream. Grows
/// `buf` as bytes arrive, so a length field claiming more than the file holds allocates only
/// what is actually there.
fn read_up_to(src: &mut impl Read, buf: &mut Vec<u8>, n: usize) -> io::Result<usize> {
    let before = buf.len();
    src.take(n as u64).read_to_end(buf)?;
    Ok(buf.len() - before)
}
