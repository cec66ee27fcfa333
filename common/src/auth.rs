//! The control channel's mutual challenge-response over a shared secret (`--secret-file`).
//!
//! Both peers hold the same secret. intercept sends a random nonce, the copier answers with its
//! own nonce and `HMAC-SHA256(secret, "tcpshadow copier" || server_nonce || client_nonce)`;
//! intercept checks it and proves itself back with the same MAC over the label
//! `"tcpshadow intercept"`. The secret never crosses the wire, a recorded proof is useless
//! against a fresh nonce, and the two labels keep one side's proof from being reflected as the
//! other's. The byte layout of the messages that carry these values is in `docs/protocol.md`.
//!
//! This module computes and checks proofs only: it never does I/O (the nonces come from the
//! daemons, which read the kernel's random source) and never lets the secret be printed
//! (`Secret`'s `Debug` is redacted and it has no `Display`).

use std::fmt;

use hmac::{KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

/// Bytes of each peer's nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;
/// Shortest secret accepted: below this a guess is cheap.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret accepted (a file, not a key store).
pub const MAX_SECRET_LEN: usize = 4096;

/// A random challenge, fresh for every connection.
pub type Nonce = [u8; NONCE_LEN];
/// An HMAC-SHA256 tag proving knowledge of the secret.
pub type Proof = [u8; PROOF_LEN];

const COPIER_LABEL: &[u8] = b"tcpshadow copier";
const INTERCEPT_LABEL: &[u8] = b"tcpshadow intercept";

/// The shared secret. Its bytes are only ever fed to the MAC.
// No PartialEq: a comparison of secrets would not be constant-time; compare proofs instead.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

/// Why some bytes cannot be a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the secret is {len} bytes; at least {MIN_SECRET_LEN} are needed (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")]
    TooShort { len: usize },
    #[error("the secret is {len} bytes; at most {MAX_SECRET_LEN} are accepted")]
    TooLong { len: usize },
}

impl Secret {
    /// `bytes` as a secret, after trimming ASCII whitespace at both ends (a file written by
    /// `echo` ends in a newline, and the other host's copy may not).
    pub fn new(bytes: &[u8]) -> Result<Secret, SecretError> {
        let s = bytes.trim_ascii();
        if s.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort { len: s.len() });
        }
        if s.len() > MAX_SECRET_LEN {
            return Err(SecretError::TooLong { len: s.len() });
        }
        Ok(Secret(s.to_vec()))
    }

    /// Whether the secret occurs in `haystack` (tests and audits grep output for it).
    pub fn appears_in(&self, haystack: &[u8]) -> bool {
        haystack
            .windows(self.0.len())
            .any(|w| w == self.0.as_slice())
    }

    fn mac(&self, label: &[u8], server: &Nonce, client: &Nonce) -> HmacSha256 {
        // HMAC takes keys of any length: new_from_slice cannot fail, but there is no reason to
        // panic if a future version disagreed, so an empty key stands in (and proofs then fail).
        let mut m = HmacSha256::new_from_slice(&self.0)
            .unwrap_or_else(|_| HmacSha256::new(&Default::default()));
        m.update(label);
        m.update(server);
        m.update(client);
        m
    }

    /// What a copier sends to prove it holds the secret.
    pub fn copier_proof(&self, server: &Nonce, client: &Nonce) -> Proof {
        self.mac(COPIER_LABEL, server, client)
            .finalize()
            .into_bytes()
            .into()
    }

    /// What intercept sends back to prove it holds the secret too.
    pub fn intercept_proof(&self, server: &Nonce, client: &Nonce) -> Proof {
        self.mac(INTERCEPT_LABEL, server, client)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a copier's proof in constant time.
    pub fn verify_copier(&self, server: &Nonce, client: &Nonce, proof: &Proof) -> bool {
        self.mac(COPIER_LABEL, server, client)
            .verify_slice(proof)
            .is_ok()
    }

    /// Checks intercept's proof in constant time.
    pub fn verify_intercept(&self, server: &Nonce, client: &Nonce, proof: &Proof) -> bool {
        self.mac(INTERCEPT_LABEL, server, client)
            .verify_slice(proof)
            .is_ok()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut m = HmacSha256::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a 131-byte key (longer than the block) is hashed first.
        let mut m = HmacSha256::new_from_slice(&[0xaa; 131]).unwrap();
        m.update(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn proofs_are_the_documented_macs() {
        let s = Secret::new(b"0123456789abcdef\n").unwrap();
        let (sn, cn) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let mut m = HmacSha256::new_from_slice(b"0123456789abcdef").unwrap();
        m.update(b"tcpshadow copier");
        m.update(&sn);
        m.update(&cn);
        let want: Proof = m.finalize().into_bytes().into();
        assert_eq!(s.copier_proof(&sn, &cn), want);
        assert!(s.verify_copier(&sn, &cn, &want));
    }

    #[test]
    fn proofs_bind_secret_nonces_and_direction() {
        let s = Secret::new(b"a shared secret of some length").unwrap();
        let other = Secret::new(b"a shared secret of some lengtH").unwrap();
        let (sn, cn) = ([7u8; NONCE_LEN], [9u8; NONCE_LEN]);
        let p = s.copier_proof(&sn, &cn);
        assert!(s.verify_copier(&sn, &cn, &p));
        assert!(!other.verify_copier(&sn, &cn, &p));
        assert!(!s.verify_copier(&cn, &sn, &p), "nonces swapped");
        assert!(
            !s.verify_copier(&[8u8; NONCE_LEN], &cn, &p),
            "another challenge"
        );
        // A copier's proof is not intercept's: it cannot be reflected back.
        assert!(!s.verify_intercept(&sn, &cn, &p));
        let q = s.intercept_proof(&sn, &cn);
        assert!(s.verify_intercept(&sn, &cn, &q));
        assert_ne!(p, q);
    }

    #[test]
    fn secrets_are_trimmed_bounded_and_never_printed() {
        assert_eq!(
            Secret::new(b"  short \n").unwrap_err(),
            SecretError::TooShort { len: 5 }
        );
        assert!(Secret::new(&[b'x'; MAX_SECRET_LEN + 1]).is_err());
        let s = Secret::new(b"\tcorrect horse battery staple\r\n").unwrap();
        let same = Secret::new(b"correct horse battery staple").unwrap();
        let n = [3u8; NONCE_LEN];
        assert_eq!(s.copier_proof(&n, &n), same.copier_proof(&n, &n));
        let d = format!("{s:?}");
        assert!(!d.contains("horse"), "{d}");
        assert!(s.appears_in(b"xx correct horse battery staple yy"));
        assert!(!s.appears_in(b"correct horse"));
    }
}
