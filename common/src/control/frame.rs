//! The frame: a 4-byte big-endian length (of type + body), a type byte, the body. Writing one
//! ([`frame`]) and cutting a byte stream back into them ([`FrameDecoder`]).
//!
//! The decoder must never buffer more than one frame of at most [`MAX_FRAME_LEN`] bytes plus
//! what it was fed since the last drain: a length is judged from the 4 header bytes alone,
//! before any of its body is kept. After any error it stays failed, because nothing after a bad
//! frame can be trusted to start on a frame boundary.

use std::marker::PhantomData;

use super::{DecodeError, EncodeError, WireMessage};

/// Bytes of the frame header (the big-endian length of type + body).
pub const FRAME_HEADER_LEN: usize = 4;
/// Largest accepted value of the length field (type byte + body).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Writes header + type + body, patching the length in afterwards; on any error `out` is
/// restored to its previous length so a caller batching several frames keeps a valid stream.
pub(super) fn frame(
    out: &mut Vec<u8>,
    t: u8,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    out.push(t);
    let res = body(out).and_then(|()| {
        let len = out.len() - start - FRAME_HEADER_LEN;
        if len > MAX_FRAME_LEN {
            return Err(EncodeError::FrameTooLarge { len });
        }
        out[start..start + FRAME_HEADER_LEN].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    });
    if res.is_err() {
        out.truncate(start);
    }
    res
}

/// Splits a byte stream into frames and decodes them as `M`.
///
/// Feed it whatever the socket returned, then call [`next_message`](Self::next_message) until it
/// yields `Ok(None)`. The buffer holds at most one partial frame plus what was fed since the
/// last drain. After an error the decoder is poisoned: it returns that error forever, because
/// the stream's framing can no longer be trusted.
pub struct FrameDecoder<M> {
    buf: Vec<u8>,
    start: usize,
    failed: Option<DecodeError>,
    _msg: PhantomData<fn() -> M>,
}

impl<M: WireMessage> FrameDecoder<M> {
    pub fn new() -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            failed: None,
            _msg: PhantomData,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 {
            // Only the partial frame left over moves; usually a few bytes.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<M>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let res = self.next_inner();
        if let Err(e) = &res {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
            self.start = 0;
        }
        res
    }

    fn next_inner(&mut self) -> Result<Option<M>, DecodeError> {
        let avail = &self.buf[self.start..];
        let Some(header) = avail.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            return Err(DecodeError::EmptyFrame);
        }
        if len > MAX_FRAME_LEN {
            return Err(DecodeError::FrameTooLarge { len });
        }
        let Some(frame) = avail.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
            return Ok(None);
        };
        let msg = M::decode(frame[0], &frame[1..])?;
        self.start += FRAME_HEADER_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(msg))
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

impl<M: WireMessage> Default for FrameDecoder<M> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{addr, decode_all};
    use super::super::{encode_claim, encode_ping, CopierMessage};
    use super::*;

    #[test]
    fn frame_layout_is_length_then_type_then_body() {
        let mut out = b"keep".to_vec();
        frame(&mut out, 0x42, |o| {
            o.extend_from_slice(&[7, 8, 9]);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, [b'k', b'e', b'e', b'p', 0, 0, 0, 4, 0x42, 7, 8, 9]);
        // A body that fails leaves what was there before, so a batch of frames stays valid.
        let err = frame(&mut out, 0x42, |o| {
            o.push(1);
            Err(EncodeError::EmptyRowRun)
        });
        assert_eq!(err, Err(EncodeError::EmptyRowRun));
        assert_eq!(out.len(), 12);
    }

    #[test]
    fn http_probe_is_refused_from_the_header() {
        let err = decode_all::<CopierMessage>(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert!(matches!(err, DecodeError::FrameTooLarge { .. }));
    }

    #[test]
    fn decoder_is_poisoned_after_an_error() {
        let mut d = FrameDecoder::<CopierMessage>::new();
        d.feed(&[0, 0, 0, 0]);
        assert_eq!(d.next_message(), Err(DecodeError::EmptyFrame));
        let mut ok = Vec::new();
        encode_ping(1, &mut ok).unwrap();
        d.feed(&ok);
        assert_eq!(d.next_message(), Err(DecodeError::EmptyFrame));
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut out = Vec::new();
        encode_claim(&[addr(10, 1), addr(11, 2)], &mut out).unwrap();
        encode_ping(5, &mut out).unwrap();
        let mut d = FrameDecoder::<CopierMessage>::new();
        let mut got = Vec::new();
        for b in &out {
            d.feed(std::slice::from_ref(b));
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            [
                CopierMessage::Claim(vec![addr(10, 1), addr(11, 2)]),
                CopierMessage::Ping(5)
            ]
        );
    }
}
