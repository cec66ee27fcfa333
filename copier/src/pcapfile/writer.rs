//! The pcapng writer: one section, one interface description per link type seen, Enhanced
//! Packet Blocks with nanosecond timestamps (`if_tsresol` = 9), little-endian.
//!
//! Blocks are encoded into a pending buffer and handed to the sink whole, so the caller always
//! knows the offset of the last block that reached it ([`PcapngWriter::committed`]): after a
//! failed write (a full disk) it can cut the file back there and keep a valid capture.

use std::io::{self, Write};

use super::SNAPLEN;

/// A write to the sink failed; the sink holds `committed` bytes of complete blocks, plus perhaps
/// part of the failed flush.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct WriteFailure {
    /// Bytes of complete blocks known to be in the sink.
    pub committed: u64,
    /// Frames lost with the failed flush.
    pub frames_lost: u64,
    #[source]
    pub source: io::Error,
}

pub struct PcapngWriter<W: Write> {
    sink: W,
    /// LINKTYPE of each interface described so far; the index is the interface id.
    interfaces: Vec<u16>,
    pending: Vec<u8>,
    pending_frames: u64,
    committed: u64,
    frames: u64,
}

/// Flush by itself once this much is pending: bounds memory between flushes, and what a failed
/// flush (a full disk) loses.
const FLUSH_AT: usize = 256 << 10;

const APPLICATION: &str = concat!("tcpshadow copier ", env!("CARGO_PKG_VERSION"));

impl<W: Write> PcapngWriter<W> {
    /// Starts a section (its header is written with the first flush).
    pub fn new(sink: W) -> Self {
        let mut w = Self {
            sink,
            interfaces: Vec::new(),
            pending: Vec::with_capacity(FLUSH_AT + 64 * 1024),
            pending_frames: 0,
            committed: 0,
            frames: 0,
        };
        w.section_header();
        w
    }

    fn section_header(&mut self) {
        let mut opts = Vec::new();
        push_option(&mut opts, 4, APPLICATION.as_bytes()); // shb_userappl
        push_option(&mut opts, 0, &[]); // opt_endofopt
        let total = 28 + opts.len() as u32;
        let p = &mut self.pending;
        p.extend_from_slice(&0x0A0D_0D0Au32.to_le_bytes());
        p.extend_from_slice(&total.to_le_bytes());
        p.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
        p.extend_from_slice(&1u16.to_le_bytes());
        p.extend_from_slice(&0u16.to_le_bytes());
        // Section length unknown: we stream.
        p.extend_from_slice(&(-1i64).to_le_bytes());
        p.extend_from_slice(&opts);
        p.extend_from_slice(&total.to_le_bytes());
    }

    fn interface_for(&mut self, link_type: u16) -> u32 {
        if let Some(i) = self.interfaces.iter().position(|l| *l == link_type) {
            return i as u32;
        }
        let mut opts = Vec::new();
        push_option(&mut opts, 9, &[9]); // if_tsresol: nanoseconds
        push_option(&mut opts, 0, &[]);
        let total = 20 + opts.len() as u32;
        let p = &mut self.pending;
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&total.to_le_bytes());
        p.extend_from_slice(&link_type.to_le_bytes());
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(&SNAPLEN.to_le_bytes());
        p.extend_from_slice(&opts);
        p.extend_from_slice(&total.to_le_bytes());
        self.interfaces.push(link_type);
        (self.interfaces.len() - 1) as u32
    }

    /// Queues one frame; flushes when enough is pending. `data` longer than the snap length is
    /// cut to it (`orig_len` keeps the wire length).
    pub fn write_frame(
        &mut self,
        ts_ns: u64,
        link_type: u16,
        data: &[u8],
        orig_len: u32,
    ) -> Result<(), WriteFailure> {
        let id = self.interface_for(link_type);
        let data = &data[..data.len().min(SNAPLEN as usize)];
        let padded = (data.len() + 3) & !3;
        let total = (32 + padded) as u32;
        let p = &mut self.pending;
        p.extend_from_slice(&6u32.to_le_bytes());
        p.extend_from_slice(&total.to_le_bytes());
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        p.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(&orig_len.max(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        p.resize(p.len() + padded - data.len(), 0);
        p.extend_from_slice(&total.to_le_bytes());
        self.pending_frames += 1;
        self.frames += 1;
        if self.pending.len() >= FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands every pending block to the sink and flushes it.
    pub fn flush(&mut self) -> Result<(), WriteFailure> {
        if !self.pending.is_empty() {
            if let Err(source) = self.sink.write_all(&self.pending) {
                return Err(self.fail(source));
            }
            self.committed += self.pending.len() as u64;
            self.pending.clear();
            self.pending_frames = 0;
        }
        self.sink.flush().map_err(|source| WriteFailure {
            committed: self.committed,
            frames_lost: 0,
            source,
        })
    }

    fn fail(&mut self, source: io::Error) -> WriteFailure {
        let lost = self.pending_frames;
        self.frames -= lost;
        self.pending.clear();
        self.pending_frames = 0;
        WriteFailure {
            committed: self.committed,
            frames_lost: lost,
            source,
        }
    }

    /// Bytes of complete blocks handed to the sink.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Bytes the file will hold once pending blocks are flushed.
    pub fn len(&self) -> u64 {
        self.committed + self.pending.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frames written or pending (not those lost to a failed flush).
    pub fn frames(&self) -> u64 {
        self.frames
    }

    pub fn get_ref(&self) -> &W {
        &self.sink
    }

    /// Flushes and returns the sink.
    pub fn finish(mut self) -> Result<W, WriteFailure> {
        self.flush()?;
        Ok(self.sink)
    }
}

fn push_option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + ((value.len() + 3) & !3) - value.len(), 0);
}
