//! Bounds-checked reading and writing of the protocol's primitive types: fixed-width little-endian
//! integers, NUL-terminated strings and length-encoded ("lenenc") integers and strings.
//!
//! Every read borrows from the input, so a hostile length can only make a read fail, never make us
//! allocate.

/// Why a MySQL payload could not be parsed or emitted. Each variant names the structure (`what`) so
/// a counter or a log line can say which packet was bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("{0}: truncated")]
    Truncated(&'static str),
    #[error("{0}: string without NUL terminator")]
    Unterminated(&'static str),
    #[error("{what}: unexpected byte {byte:#04x}")]
    UnexpectedByte { what: &'static str, byte: u8 },
    #[error("{0}: invalid length-encoded integer")]
    BadLenenc(&'static str),
    #[error("{0}: not supported")]
    Unsupported(&'static str),
    #[error("{0}: value cannot be encoded with the negotiated capabilities")]
    Unencodable(&'static str),
}

/// A cursor over an untrusted payload. Every accessor checks bounds and reports which structure
/// was being read when the input ran out.
#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub(crate) fn truncated(&self) -> ProtocolError {
        ProtocolError::Truncated(self.what)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let r = &self.buf[self.pos..];
        self.pos = self.buf.len();
        r
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if n > self.remaining() {
            return Err(self.truncated());
        }
        let r = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(r)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A NUL-terminated string, without its terminator.
    pub(crate) fn nul_str(&mut self) -> Result<&'a [u8], ProtocolError> {
        let rest = &self.buf[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ProtocolError::Unterminated(self.what))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    /// A NUL-terminated string whose terminator some senders omit at the very end of a packet.
    /// Returns the string and whether the terminator was there.
    pub(crate) fn nul_str_or_eof(&mut self) -> (&'a [u8], bool) {
        let rest = &self.buf[self.pos..];
        match rest.iter().position(|&b| b == 0) {
            Some(n) => {
                self.pos += n + 1;
                (&rest[..n], true)
            }
            None => {
                self.pos = self.buf.len();
                (rest, false)
            }
        }
    }

    pub(crate) fn lenenc_int(&mut self) -> Result<u64, ProtocolError> {
        let (v, n) = read_lenenc_int_as(&self.buf[self.pos..], self.what)?;
        self.pos += n;
        Ok(v)
    }

    pub(crate) fn lenenc_bytes(&mut self) -> Result<&'a [u8], ProtocolError> {
        let len = self.lenenc_int()?;
        let len = usize::try_from(len).map_err(|_| self.truncated())?;
        self.bytes(len)
    }
}

fn read_lenenc_int_as(buf: &[u8], what: &'static str) -> Result<(u64, usize), ProtocolError> {
    let t = ProtocolError::Truncated(what);
    let first = *buf.first().ok_or(t)?;
    let width = match first {
        0..=0xfa => return Ok((u64::from(first), 1)),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        // 0xfb is SQL NULL in a row and 0xff an ERR header: neither is a length.
        _ => return Err(ProtocolError::BadLenenc(what)),
    };
    let body = buf.get(1..1 + width).ok_or(t)?;
    let mut le = [0u8; 8];
    le[..width].copy_from_slice(body);
    Ok((u64::from_le_bytes(le), 1 + width))
}

/// Reads a length-encoded integer; returns the value and how many bytes it took.
pub fn read_lenenc_int(buf: &[u8]) -> Result<(u64, usize), ProtocolError> {
    read_lenenc_int_as(buf, "lenenc integer")
}

/// Reads a length-encoded string; returns it (borrowed) and how many bytes it took in all.
pub fn read_lenenc_bytes(buf: &[u8]) -> Result<(&[u8], usize), ProtocolError> {
    let mut r = Reader::new(buf, "lenenc string");
    let s = r.lenenc_bytes()?;
    Ok((s, r.pos))
}

/// How many bytes `v` takes as a length-encoded integer.
pub fn lenenc_int_len(v: u64) -> usize {
    match v {
        0..=0xfa => 1,
        0xfb..=0xffff => 3,
        0x1_0000..=0xff_ffff => 4,
        _ => 9,
    }
}

/// Appends `v` as a length-encoded integer, in its shortest form (as every real sender does).
pub fn write_lenenc_int(v: u64, out: &mut Vec<u8>) {
    let le = v.to_le_bytes();
    match lenenc_int_len(v) {
        1 => out.push(le[0]),
        3 => {
            out.push(0xfc);
            out.extend_from_slice(&le[..2]);
        }
        4 => {
            out.push(0xfd);
            out.extend_from_slice(&le[..3]);
        }
        _ => {
            out.push(0xfe);
            out.extend_from_slice(&le);
        }
    }
}

/// Appends a length-encoded string.
pub fn write_lenenc_bytes(b: &[u8], out: &mut Vec<u8>) {
    write_lenenc_int(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// Appends a NUL-terminated string; a string that holds a NUL could not be read back, so it is
/// refused.
pub(crate) fn write_nul_str(
    s: &[u8],
    what: &'static str,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    if s.contains(&0) {
        return Err(ProtocolError::Unencodable(what));
    }
    out.extend_from_slice(s);
    out.push(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lenenc_boundaries() {
        for (v, len) in [
            (0u64, 1),
            (250, 1),
            (251, 3),
            (0xffff, 3),
            (0x1_0000, 4),
            (0xff_ffff, 4),
            (0x100_0000, 9),
            (u64::MAX, 9),
        ] {
            let mut out = Vec::new();
            write_lenenc_int(v, &mut out);
            assert_eq!(out.len(), len, "{v}");
            assert_eq!(read_lenenc_int(&out), Ok((v, len)));
        }
    }

    #[test]
    fn lenenc_rejects_null_and_err_markers_and_truncation() {
        assert_eq!(
            read_lenenc_int(&[0xfb]),
            Err(ProtocolError::BadLenenc("lenenc integer"))
        );
        assert_eq!(
            read_lenenc_int(&[0xff]),
            Err(ProtocolError::BadLenenc("lenenc integer"))
        );
        assert_eq!(
            read_lenenc_int(&[0xfc, 1]),
            Err(ProtocolError::Truncated("lenenc integer"))
        );
        assert_eq!(
            read_lenenc_int(&[]),
            Err(ProtocolError::Truncated("lenenc integer"))
        );
        // A length far beyond the buffer fails without allocating.
        let huge = [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            read_lenenc_bytes(&huge),
            Err(ProtocolError::Truncated("lenenc string"))
        );
    }

    proptest! {
        #[test]
        fn lenenc_round_trip(v in any::<u64>(), s in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut out = Vec::new();
            write_lenenc_int(v, &mut out);
            write_lenenc_bytes(&s, &mut out);
            let (got, n) = read_lenenc_int(&out).unwrap();
            prop_assert_eq!(got, v);
            prop_assert_eq!(n, lenenc_int_len(v));
            let (gs, m) = read_lenenc_bytes(&out[n..]).unwrap();
            prop_assert_eq!(gs, &s[..]);
            prop_assert_eq!(n + m, out.len());
        }

        #[test]
        fn lenenc_never_panics(b in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = read_lenenc_int(&b);
            let _ = read_lenenc_bytes(&b);
        }
    }
}
