//! The field-level codec every message file builds on: a bounds-checked big-endian reader over
//! one frame body, and the few writers and checks that several messages share (addresses, length
//! limits, UTF-8 truncation).
//!
//! The reader must never panic, whatever the body: every read is checked against what is left
//! and turns a short body into [`DecodeError::Truncated`]. It never allocates more than the bytes
//! it hands out, so a length field can cost at most the frame it came in.

use std::net::{Ipv4Addr, SocketAddrV4};

use super::{DecodeError, EncodeError};

/// Bounds-checked big-endian reads over one frame body.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    ty: u8,
}

impl<'a> Reader<'a> {
    pub(super) fn new(ty: u8, body: &'a [u8]) -> Self {
        Reader { buf: body, ty }
    }

    /// The message type, for errors raised outside the reader.
    pub(super) fn ty(&self) -> u8 {
        self.ty
    }

    /// Bytes not read yet: what a claimed item count must be checked against before reserving.
    pub(super) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(super) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { ty: self.ty });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// A 0/1 byte; anything else is refused rather than read as true, so that a later version
    /// can give the other values a meaning.
    pub(super) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.invalid(what)),
        }
    }
    /// An `addr`: IPv4 address then port.
    pub(super) fn addr(&mut self) -> Result<SocketAddrV4, DecodeError> {
        let ip: [u8; 4] = self.array()?;
        Ok(SocketAddrV4::new(Ipv4Addr::from(ip), self.u16()?))
    }
    /// Names and reasons only end up in logs: a bad byte must not cost the connection.
    pub(super) fn string(&mut self, n: usize) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(self.bytes(n)?).into_owned())
    }
    pub(super) fn invalid(&self, what: &'static str) -> DecodeError {
        DecodeError::Invalid { ty: self.ty, what }
    }
    /// Every body is consumed exactly: trailing bytes mean the peer and we disagree on the
    /// layout, and guessing past that would misread everything after.
    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                ty: self.ty,
                extra: self.buf.len(),
            })
        }
    }
}

/// Appends an `addr` (6 bytes).
pub(super) fn write_addr(a: &SocketAddrV4, o: &mut Vec<u8>) {
    o.extend_from_slice(&a.ip().octets());
    o.extend_from_slice(&a.port().to_be_bytes());
}

pub(super) fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), EncodeError> {
    if len > max {
        return Err(EncodeError::FieldTooLong { what, len, max });
    }
    Ok(())
}

/// The longest prefix of `s` of at most `max` bytes that is still valid UTF-8, so that a
/// constructor can cut a name to its wire limit instead of failing later in the encoder.
pub(super) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("abc", 5), "abc");
        assert_eq!(truncate_utf8("éé", 3), "é");
        assert_eq!(truncate_utf8("éé", 4), "éé");
    }

    #[test]
    fn short_reads_are_truncation_and_leftovers_are_trailing() {
        let mut r = Reader::new(0x42, &[1, 2, 3]);
        assert_eq!(r.u16(), Ok(0x0102));
        assert_eq!(r.u16(), Err(DecodeError::Truncated { ty: 0x42 }));
        assert_eq!(
            r.finish(),
            Err(DecodeError::TrailingBytes { ty: 0x42, extra: 1 })
        );
        assert_eq!(r.bool("flag"), Err(r.invalid("flag")));
    }
}
