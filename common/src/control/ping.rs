//! Ping (0x04) and Pong (0x84): the keepalive, one u64 nonce that the Pong echoes.
//!
//! Nothing to validate beyond the exact length; never give the nonce any meaning on the
//! receiving side other than "echo it".

use super::codec::Reader;
use super::frame::frame;
use super::{ty, DecodeError, EncodeError};

/// nonce(8)
pub(super) fn parse_nonce(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    r.u64()
}

fn emit_nonce(nonce: u64, o: &mut Vec<u8>) -> Result<(), EncodeError> {
    o.extend_from_slice(&nonce.to_be_bytes());
    Ok(())
}

/// Appends a Ping frame.
pub fn encode_ping(nonce: u64, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::PING, |o| emit_nonce(nonce, o))
}

/// Appends a Pong frame.
pub fn encode_pong(nonce: u64, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::PONG, |o| emit_nonce(nonce, o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::{CopierMessage, InterceptMessage};
    use super::*;

    #[test]
    fn ping_and_pong_layouts_are_as_documented() {
        let mut ping = Vec::new();
        encode_ping(0x0102_0304_0506_0708, &mut ping).unwrap();
        assert_eq!(ping, [0, 0, 0, 9, 0x04, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            decode_all::<CopierMessage>(&ping).unwrap(),
            [CopierMessage::Ping(0x0102_0304_0506_0708)]
        );
        let mut pong = Vec::new();
        encode_pong(0x0102_0304_0506_0708, &mut pong).unwrap();
        assert_eq!(pong, [0, 0, 0, 9, 0x84, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            decode_all::<InterceptMessage>(&pong).unwrap(),
            [InterceptMessage::Pong(0x0102_0304_0506_0708)]
        );
    }

    #[test]
    fn messages_of_the_other_direction_are_refused() {
        let mut out = Vec::new();
        encode_pong(1, &mut out).unwrap();
        assert_eq!(
            decode_all::<CopierMessage>(&out).unwrap_err(),
            DecodeError::UnexpectedType { ty: 0x84 }
        );
    }
}
