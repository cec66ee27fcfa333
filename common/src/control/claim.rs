//! Claim (0x02) and Release (0x03): the mirrored client addresses a copier takes or gives up,
//! which is how intercept routes replies. Both are a counted list of `addr`s.
//!
//! Never trust the count: it is checked against [`MAX_ADDRS_PER_FRAME`] and against the body's
//! exact length before anything is reserved for it.

use std::net::SocketAddrV4;

use super::codec::{check_len, write_addr, Reader};
use super::frame::frame;
use super::{ty, DecodeError, EncodeError};

/// Most addresses in one Claim or Release frame (6 bytes each: always fits a frame).
pub const MAX_ADDRS_PER_FRAME: usize = 65_536;

/// Bytes of one `addr`.
const ADDR_LEN: usize = 6;

/// count(4) addr(6) × count; the body is exactly that long.
pub(super) fn parse_addrs(r: &mut Reader<'_>) -> Result<Vec<SocketAddrV4>, DecodeError> {
    let count = r.u32()? as usize;
    if count > MAX_ADDRS_PER_FRAME {
        return Err(r.invalid("more addresses than one frame may carry"));
    }
    let want = count * ADDR_LEN;
    if r.remaining() != want {
        return Err(if r.remaining() < want {
            DecodeError::Truncated { ty: r.ty() }
        } else {
            DecodeError::TrailingBytes {
                ty: r.ty(),
                extra: r.remaining() - want,
            }
        });
    }
    (0..count).map(|_| r.addr()).collect()
}

fn emit_addrs(addrs: &[SocketAddrV4], o: &mut Vec<u8>) -> Result<(), EncodeError> {
    check_len("address list", addrs.len(), MAX_ADDRS_PER_FRAME)?;
    o.extend_from_slice(&(addrs.len() as u32).to_be_bytes());
    for a in addrs {
        write_addr(a, o);
    }
    Ok(())
}

/// Appends a Claim frame; at most [`MAX_ADDRS_PER_FRAME`] addresses.
pub fn encode_claim(addrs: &[SocketAddrV4], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::CLAIM, |o| emit_addrs(addrs, o))
}

/// Appends a Release frame; at most [`MAX_ADDRS_PER_FRAME`] addresses.
pub fn encode_release(addrs: &[SocketAddrV4], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::RELEASE, |o| emit_addrs(addrs, o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{addr, decode_all};
    use super::super::{CopierMessage, WireMessage};
    use super::*;

    #[test]
    fn claim_and_release_layouts_are_as_documented() {
        let addrs = [addr(10, 40000), addr(11, 2)];
        let mut out = Vec::new();
        encode_claim(&addrs, &mut out).unwrap();
        encode_release(&addrs[1..], &mut out).unwrap();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 17, 0x02, 0, 0, 0, 2, // length, type, count
            198, 18, 0, 10, 0x9c, 0x40, // addr
            198, 18, 0, 11, 0, 2, // addr
            0, 0, 0, 11, 0x03, 0, 0, 0, 1, // length, type, count
            198, 18, 0, 11, 0, 2, // addr
        ];
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<CopierMessage>(&out).unwrap(),
            [
                CopierMessage::Claim(addrs.to_vec()),
                CopierMessage::Release(addrs[1..].to_vec())
            ]
        );
    }

    #[test]
    fn the_count_must_match_the_body() {
        let body = [0, 0, 0, 1, 198, 18, 0, 10, 0, 1];
        assert_eq!(
            CopierMessage::decode(0x02, &body[..9]),
            Err(DecodeError::Truncated { ty: 0x02 })
        );
        let mut long = body.to_vec();
        long.push(0);
        assert_eq!(
            CopierMessage::decode(0x03, &long),
            Err(DecodeError::TrailingBytes { ty: 0x03, extra: 1 })
        );
        // A huge count is refused from the count alone.
        assert!(matches!(
            CopierMessage::decode(0x02, &[0, 1, 0, 1]),
            Err(DecodeError::Invalid { ty: 0x02, .. })
        ));
    }
}
