//! Welcome (0x81): intercept's answer to an authenticated Hello, announcing how it frames the
//! test server's replies and which features it grants.
//!
//! Never accept a framing byte other than 0 or 1, nor a MySQL head longer than
//! [`MAX_MYSQL_HEAD`]: the copier sizes what it expects of every Mysql message from it.

use super::codec::{check_len, Reader};
use super::frame::frame;
use super::handshake::{emit_proof, parse_proof};
use super::hello::{emit_magic_version, parse_magic_version};
use super::{ty, DecodeError, EncodeError, MAX_MYSQL_HEAD, MAX_NAME_LEN, PROTOCOL_VERSION};
use crate::auth::Proof;

// Framing announced in a Welcome.
const FRAMING_NONE: u8 = 0;
const FRAMING_MYSQL: u8 = 1;

/// Intercept's answer to an accepted Hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// Who this intercept is (host, port watched), for the copier's logs.
    pub name: String,
    /// How many payload bytes each feedback carries at most; the copier needs it to know
    /// whether a reply it wants to parse (a MySQL greeting) can arrive whole.
    pub payload_prefix: u16,
    /// `Some(head)` when intercept frames MySQL packets (`--protocol mysql`) and sends Mysql
    /// messages, `head` being its `--mysql-head` (≤ [`MAX_MYSQL_HEAD`]); `None` when it relays
    /// TCP segments only, so mirrored sessions cannot learn the test server's greeting.
    pub mysql_head: Option<u16>,
    /// The features of the Hello that intercept grants (`FEATURE_*`).
    pub features: u32,
    /// `Secret::intercept_proof(challenge nonce, Auth nonce)` when intercept checked the
    /// copier's proof; `None` when it has no secret.
    pub proof: Option<Proof>,
}

impl Welcome {
    /// magic(4) version(2) name_len(1) name payload_prefix(2) framing(1) [mysql_head(2)]
    /// features(4) has_proof(1) [proof(32)]
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        parse_magic_version(r)?;
        let name_len = usize::from(r.u8()?);
        let name = r.string(name_len)?;
        let payload_prefix = r.u16()?;
        let mysql_head = match r.u8()? {
            FRAMING_NONE => None,
            FRAMING_MYSQL => {
                let head = r.u16()?;
                if usize::from(head) > MAX_MYSQL_HEAD {
                    return Err(r.invalid("MySQL head longer than 1024 bytes"));
                }
                Some(head)
            }
            _ => return Err(r.invalid("unknown framing")),
        };
        let features = r.u32()?;
        let proof = parse_proof(r)?;
        Ok(Welcome {
            version: PROTOCOL_VERSION,
            name,
            payload_prefix,
            mysql_head,
            features,
            proof,
        })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        check_len("intercept name", self.name.len(), MAX_NAME_LEN)?;
        if let Some(head) = self.mysql_head {
            check_len("MySQL head", usize::from(head), MAX_MYSQL_HEAD)?;
        }
        emit_magic_version(self.version, o);
        o.push(self.name.len() as u8);
        o.extend_from_slice(self.name.as_bytes());
        o.extend_from_slice(&self.payload_prefix.to_be_bytes());
        match self.mysql_head {
            None => o.push(FRAMING_NONE),
            Some(head) => {
                o.push(FRAMING_MYSQL);
                o.extend_from_slice(&head.to_be_bytes());
            }
        }
        o.extend_from_slice(&self.features.to_be_bytes());
        emit_proof(self.proof.as_ref(), o);
        Ok(())
    }
}

/// Appends a Welcome frame.
pub fn encode_welcome(w: &Welcome, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::WELCOME, |o| w.emit(o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::{InterceptMessage, FEATURE_PAYLOAD_HASHES};
    use super::*;
    use crate::auth::PROOF_LEN;

    #[test]
    fn welcome_layout_is_as_documented() {
        let w = Welcome {
            version: PROTOCOL_VERSION,
            name: "i".into(),
            payload_prefix: 0x0102,
            mysql_head: Some(16),
            features: 5,
            proof: Some([0xcd; PROOF_LEN]),
        };
        let mut out = Vec::new();
        encode_welcome(&w, &mut out).unwrap();
        let mut want = vec![
            0, 0, 0, 51, // length: type + 50-byte body
            0x81, b'T', b'S', b'H', b'D', 0, 6, // type, magic, version
            1, b'i', // name
            1, 2, // payload_prefix
            1, 0, 16, // framing MySQL, mysql_head
            0, 0, 0, 5, // features
            1, // has_proof
        ];
        want.extend([0xcd; PROOF_LEN]);
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Welcome(w)]
        );
        // Another framing byte is refused, not taken for "none". Offset: length(4) type(1)
        // magic(4) version(2) name(2) payload_prefix(2).
        let framing_at = 4 + 1 + 4 + 2 + 2 + 2;
        out[framing_at] = 2;
        assert!(matches!(
            decode_all::<InterceptMessage>(&out),
            Err(DecodeError::Invalid { ty: 0x81, .. })
        ));
    }

    #[test]
    fn welcome_announces_the_framing() {
        for mysql_head in [None, Some(0), Some(16), Some(MAX_MYSQL_HEAD as u16)] {
            let w = Welcome {
                version: PROTOCOL_VERSION,
                name: "i".into(),
                payload_prefix: 0,
                mysql_head,
                features: FEATURE_PAYLOAD_HASHES,
                proof: mysql_head.map(|_| [5; PROOF_LEN]),
            };
            let mut out = Vec::new();
            encode_welcome(&w, &mut out).unwrap();
            assert_eq!(
                decode_all::<InterceptMessage>(&out).unwrap(),
                [InterceptMessage::Welcome(w)]
            );
        }
        let too_long = Welcome {
            version: PROTOCOL_VERSION,
            name: "i".into(),
            payload_prefix: 0,
            mysql_head: Some(MAX_MYSQL_HEAD as u16 + 1),
            features: 0,
            proof: None,
        };
        assert!(encode_welcome(&too_long, &mut Vec::new()).is_err());
    }
}
