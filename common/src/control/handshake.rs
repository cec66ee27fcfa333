//! Challenge (0x87) and Auth (0x06): the challenge-response between Hello and Welcome, and the
//! optional proof field that Auth and Welcome share. The proofs themselves are computed in
//! [`crate::auth`]; this file only carries them.
//!
//! Never accept a proof-presence or secret-required byte other than 0 or 1, and never log a
//! proof.

use std::fmt;

use super::codec::Reader;
use super::frame::frame;
use super::hello::{emit_magic_version, parse_magic_version};
use super::{ty, DecodeError, EncodeError, PROTOCOL_VERSION};
use crate::auth::{Nonce, Proof, NONCE_LEN, PROOF_LEN};

/// Appends `has_proof`(1) then the proof when there is one.
pub(super) fn emit_proof(p: Option<&Proof>, o: &mut Vec<u8>) {
    match p {
        None => o.push(0),
        Some(p) => {
            o.push(1);
            o.extend_from_slice(p);
        }
    }
}

pub(super) fn parse_proof(r: &mut Reader<'_>) -> Result<Option<Proof>, DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.array::<PROOF_LEN>()?)),
        _ => Err(r.invalid("proof presence flag is not 0 or 1")),
    }
}

/// intercept's answer to a Hello of the right version: prove you hold the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh random bytes for this connection.
    pub nonce: Nonce,
    /// Whether intercept was started with `--secret-file` and will check the [`Auth`]'s proof.
    /// A copier with a secret refuses an intercept without one: such an intercept cannot prove
    /// it is the one the copier was configured for.
    pub secret_required: bool,
}

impl Challenge {
    /// magic(4) version(2) server_nonce(32) secret_required(1)
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        parse_magic_version(r)?;
        let nonce = r.array::<NONCE_LEN>()?;
        let secret_required = r.bool("secret-required flag is not 0 or 1")?;
        Ok(Challenge {
            nonce,
            secret_required,
        })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        emit_magic_version(PROTOCOL_VERSION, o);
        o.extend_from_slice(&self.nonce);
        o.push(u8::from(self.secret_required));
        Ok(())
    }
}

/// Appends a Challenge frame.
pub fn encode_challenge(c: &Challenge, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::CHALLENGE, |o| c.emit(o))
}

/// The copier's answer to a [`Challenge`].
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    /// The copier's own fresh random bytes: intercept's proof covers them too.
    pub nonce: Nonce,
    /// `Secret::copier_proof(challenge nonce, this nonce)`; `None` for a copier without a
    /// secret (intercept then refuses it, or lets it in when it has no secret either).
    pub proof: Option<Proof>,
}

// Proofs are not secrets, but nobody needs them in a log either.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("proof", &self.proof.map(|_| "<present>"))
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// client_nonce(32) has_proof(1) [proof(32)]
    pub(super) fn parse(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let nonce = r.array::<NONCE_LEN>()?;
        let proof = parse_proof(r)?;
        Ok(Auth { nonce, proof })
    }

    pub(super) fn emit(&self, o: &mut Vec<u8>) -> Result<(), EncodeError> {
        o.extend_from_slice(&self.nonce);
        emit_proof(self.proof.as_ref(), o);
        Ok(())
    }
}

/// Appends an Auth frame.
pub fn encode_auth(a: &Auth, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    frame(out, ty::AUTH, |o| a.emit(o))
}

#[cfg(test)]
mod tests {
    use super::super::tests::decode_all;
    use super::super::{CopierMessage, InterceptMessage, WireMessage};
    use super::*;

    #[test]
    fn handshake_layouts_are_as_documented() {
        let mut out = Vec::new();
        let c = Challenge {
            nonce: [0xab; NONCE_LEN],
            secret_required: true,
        };
        encode_challenge(&c, &mut out).unwrap();
        let mut want = vec![0, 0, 0, 40, 0x87, b'T', b'S', b'H', b'D', 0, 6];
        want.extend([0xab; NONCE_LEN]);
        want.push(1);
        assert_eq!(out, want);
        assert_eq!(
            decode_all::<InterceptMessage>(&out).unwrap(),
            [InterceptMessage::Challenge(c)]
        );

        for proof in [None, Some([0xcd; PROOF_LEN])] {
            let a = Auth {
                nonce: [0x11; NONCE_LEN],
                proof,
            };
            let mut out = Vec::new();
            encode_auth(&a, &mut out).unwrap();
            let body = NONCE_LEN + 1 + if proof.is_some() { PROOF_LEN } else { 0 };
            assert_eq!(out[..5], [0, 0, 0, 1 + body as u8, 0x06]);
            assert_eq!(out[5..5 + NONCE_LEN], [0x11; NONCE_LEN]);
            assert_eq!(out[5 + NONCE_LEN], u8::from(proof.is_some()));
            assert_eq!(
                decode_all::<CopierMessage>(&out).unwrap(),
                [CopierMessage::Auth(a)]
            );
        }
        // A bad presence flag or a short proof is refused, never guessed at.
        let mut bad = Vec::new();
        encode_auth(
            &Auth {
                nonce: [0; NONCE_LEN],
                proof: Some([0; PROOF_LEN]),
            },
            &mut bad,
        )
        .unwrap();
        bad[5 + NONCE_LEN] = 2;
        assert!(matches!(
            decode_all::<CopierMessage>(&bad),
            Err(DecodeError::Invalid { .. })
        ));
        let mut short = vec![0; NONCE_LEN];
        short.extend([1, 0, 0, 0, 0, 0]);
        assert_eq!(
            CopierMessage::decode(0x06, &short),
            Err(DecodeError::Truncated { ty: 0x06 })
        );
    }

    #[test]
    fn auth_debug_hides_the_proof() {
        let a = Auth {
            nonce: [0; NONCE_LEN],
            proof: Some([0x41; PROOF_LEN]),
        };
        let s = format!("{a:?}");
        assert!(!s.contains("65") && !s.contains("41"), "{s}");
    }
}
