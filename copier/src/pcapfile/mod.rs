//! Capture files: a streaming reader for classic pcap and pcapng (ours or tcpdump's / Wireshark's)
//! and a pcapng writer for `copier record`.
//!
//! This room turns bytes on disk into frames with their timestamp and link type, and back. It
//! never interprets what is inside a frame (that is `common::wire`), never holds more than one
//! block in memory, and treats every file as hostile: a length field of 4 GiB is an error naming
//! its offset, not a 4 GiB allocation, and nothing here panics on any input.
//!
//! libpcap's own reader would do, but it cannot say *where* a file is broken; offsets in errors
//! are what let a user cut a damaged capture at the right place.

pub mod reader;
pub mod writer;

pub use reader::{CaptureReader, FileFormat, ReadError};
pub use writer::{PcapngWriter, WriteFailure};

/// One captured frame as a file stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileFrame<'a> {
    /// Capture time, nanoseconds since the Unix epoch (saturating; files cannot go before 1970).
    pub ts_ns: u64,
    /// LINKTYPE_* number of the interface the frame was captured on (1 Ethernet, 113 Linux
    /// cooked, 276 Linux cooked v2, 101 raw IP, ...); `common::wire::LinkType::from_dlt` maps
    /// the ones the copier can parse.
    pub link_type: u16,
    /// The bytes captured (perhaps cut short by the snap length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
}

/// Largest block (pcapng) or record (pcap) accepted. Real frames are at most 256 KiB (libpcap's
/// largest snap length); anything claiming more than this is a damaged length field, and
/// refusing it bounds what one block can make us allocate.
pub const MAX_BLOCK_LEN: u32 = 16 << 20;

/// Snap length written into our interface descriptions: libpcap's maximum, what `record` uses.
pub const SNAPLEN: u32 = 262_144;

#[cfg(test)]
mod tests;
