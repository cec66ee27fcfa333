//! The client side of MySQL authentication: what a client sends, given a password and the nonce
//! of the server it is talking to. The copier uses it to log mirrored sessions in on the test server
//! with the test server's own nonce.
//!
//! Nothing here keeps a password longer than a call, and no type prints secret bytes in its Debug
//! output.

use std::fmt;

use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::DecodePublicKey;
use rsa::traits::PublicKeyParts;
use rsa::PublicKey as RsaPublicKey;
use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::handshake::Redacted;

/// The RNG trait [`encrypt_password`] takes (rand_core 0.10); for example `getrandom::SysRng`
/// with getrandom's `sys_rng` feature.
pub use rsa::rand_core;

/// Why an auth response could not be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("auth nonce has {0} bytes, expected at least {NONCE_LEN}")]
    ShortNonce(usize),
    #[error("auth plugin {0:?} is not supported")]
    UnsupportedPlugin(String),
    #[error("server public key: {0}")]
    BadPublicKey(&'static str),
    #[error("password of {len} bytes is too long for a {bits}-bit RSA key (max {max})")]
    PasswordTooLong { len: usize, bits: usize, max: usize },
    #[error("RSA encryption failed")]
    Encrypt,
}

/// Bytes of the server nonce ("scramble") that every supported plugin uses.
pub const NONCE_LEN: usize = 20;

/// The 20-byte nonce of a greeting or AuthSwitchRequest. Not secret: it crosses the wire in clear.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce(pub [u8; NONCE_LEN]);

impl Nonce {
    /// Takes the first 20 bytes of auth-plugin data; servers append a NUL (and may send more),
    /// which the algorithms ignore.
    pub fn from_auth_data(data: &[u8]) -> Result<Self, AuthError> {
        data.get(..NONCE_LEN)
            .and_then(|d| d.try_into().ok())
            .map(Self)
            .ok_or(AuthError::ShortNonce(data.len()))
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce(")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A password, kept out of Debug output and wiped (best effort) when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(Box<[u8]>);

impl Password {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into().into_boxed_slice())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Password")
            .field(&Redacted(self.0.len()))
            .finish()
    }
}

impl Drop for Password {
    fn drop(&mut self) {
        self.0.fill(0);
        // Keeps the wipe from being dropped as a dead store (best effort, as documented).
        std::hint::black_box(&self.0);
    }
}

/// The auth plugins we can answer for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthPlugin {
    MysqlNativePassword,
    CachingSha2Password,
}

impl AuthPlugin {
    pub fn from_name(name: &[u8]) -> Result<Self, AuthError> {
        match name {
            b"mysql_native_password" => Ok(Self::MysqlNativePassword),
            b"caching_sha2_password" => Ok(Self::CachingSha2Password),
            other => Err(AuthError::UnsupportedPlugin(
                String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
            )),
        }
    }

    pub fn name(self) -> &'static [u8] {
        match self {
            Self::MysqlNativePassword => b"mysql_native_password",
            Self::CachingSha2Password => b"caching_sha2_password",
        }
    }

    /// The first auth response for this plugin: the scramble of `password` with `nonce`.
    pub fn scramble(self, password: &[u8], nonce: &Nonce) -> AuthResponse {
        match self {
            Self::MysqlNativePassword => native_password(password, nonce),
            Self::CachingSha2Password => caching_sha2_password(password, nonce),
        }
    }
}

/// A scrambled password as sent in a login: a secret (it replays for that nonce), so Debug shows
/// only its length. Empty for an empty password.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AuthResponse {
    bytes: [u8; 32],
    len: u8,
}

impl AuthResponse {
    const EMPTY: Self = Self {
        bytes: [0; 32],
        len: 0,
    };

    fn from_slice(s: &[u8]) -> Self {
        let mut r = Self::EMPTY;
        r.bytes[..s.len()].copy_from_slice(s);
        r.len = s.len() as u8;
        r
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for AuthResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AuthResponse")
            .field(&Redacted(usize::from(self.len)))
            .finish()
    }
}

fn xor_into(dst: &mut [u8], pattern: &[u8]) {
    for (d, p) in dst.iter_mut().zip(pattern.iter().cycle()) {
        *d ^= p;
    }
}

/// mysql_native_password: `SHA1(pw) XOR SHA1(nonce + SHA1(SHA1(pw)))`, 20 bytes.
pub fn native_password(password: &[u8], nonce: &Nonce) -> AuthResponse {
    if password.is_empty() {
        // The server stores no hash for an empty password and expects no response.
        return AuthResponse::EMPTY;
    }
    let stage1 = Sha1::digest(password);
    let stage2 = Sha1::digest(stage1);
    let mut out: [u8; 20] = Sha1::new()
        .chain_update(nonce.0)
        .chain_update(stage2)
        .finalize()
        .into();
    xor_into(&mut out, &stage1);
    AuthResponse::from_slice(&out)
}

/// caching_sha2_password fast auth: `SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) + nonce)`, 32
/// bytes.
pub fn caching_sha2_password(password: &[u8], nonce: &Nonce) -> AuthResponse {
    if password.is_empty() {
        return AuthResponse::EMPTY;
    }
    let stage1 = Sha256::digest(password);
    let stage2 = Sha256::digest(stage1);
    let mut out: [u8; 32] = Sha256::new()
        .chain_update(stage2)
        .chain_update(nonce.0)
        .finalize()
        .into();
    xor_into(&mut out, &stage1);
    AuthResponse::from_slice(&out)
}

/// What a client sends, after the server asked for full authentication on a plain connection, to
/// get the server's RSA public key (the server answers AuthMoreData with a PEM).
pub const REQUEST_PUBLIC_KEY: u8 = 0x02;

/// PEMs longer than this are refused before decoding: real keys (up to 8192 bits) are far shorter.
const MAX_PEM_LEN: usize = 16 * 1024;

/// A server's RSA public key, as caching_sha2_password (and sha256_password) hand it out.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerPublicKey(RsaPublicKey);

impl ServerPublicKey {
    /// Parses a PEM "PUBLIC KEY" (SubjectPublicKeyInfo, what MySQL sends) or "RSA PUBLIC KEY"
    /// (PKCS#1). Trailing NULs and whitespace around it are ignored.
    pub fn from_pem(pem: &[u8]) -> Result<Self, AuthError> {
        if pem.len() > MAX_PEM_LEN {
            return Err(AuthError::BadPublicKey("PEM too long"));
        }
        let text = std::str::from_utf8(pem).map_err(|_| AuthError::BadPublicKey("not UTF-8"))?;
        let text = text.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
        let key = if text.starts_with("-----BEGIN PUBLIC KEY-----") {
            RsaPublicKey::from_public_key_pem(text)
                .map_err(|_| AuthError::BadPublicKey("malformed SubjectPublicKeyInfo"))?
        } else if text.starts_with("-----BEGIN RSA PUBLIC KEY-----") {
            RsaPublicKey::from_pkcs1_pem(text)
                .map_err(|_| AuthError::BadPublicKey("malformed PKCS#1 key"))?
        } else {
            return Err(AuthError::BadPublicKey("no PEM public key"));
        };
        Ok(Self(key))
    }

    pub fn bits(&self) -> usize {
        self.0.size() * 8
    }

    /// The longest plaintext OAEP with SHA-1 can carry under this key.
    fn max_plaintext(&self) -> usize {
        self.0.size().saturating_sub(2 * 20 + 2)
    }
}

impl fmt::Debug for ServerPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerPublicKey({} bits)", self.bits())
    }
}

/// caching_sha2_password full auth on a plain connection: RSA-OAEP (SHA-1, MGF1-SHA-1, as
/// OpenSSL's RSA_PKCS1_OAEP_PADDING that MySQL uses) of `(password + NUL) XOR nonce`, the nonce
/// repeated over the whole plaintext.
pub fn encrypt_password<R>(
    password: &[u8],
    nonce: &Nonce,
    key: &ServerPublicKey,
    rng: &mut R,
) -> Result<Vec<u8>, AuthError>
where
    R: rand_core::TryCryptoRng + ?Sized,
{
    let len = password.len() + 1;
    if len > key.max_plaintext() {
        return Err(AuthError::PasswordTooLong {
            len: password.len(),
            bits: key.bits(),
            max: key.max_plaintext().saturating_sub(1),
        });
    }
    let mut plain = Vec::with_capacity(len);
    plain.extend_from_slice(password);
    plain.push(0);
    xor_into(&mut plain, &nonce.0);
    let sealed = key
        .0
        .oaep_encrypt_with_rng::<Sha1, R>(rng, &plain)
        .map_err(|_| AuthError::Encrypt);
    plain.fill(0);
    sealed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::fixtures::{self, hex};
    use crate::mysql::handshake::{AuthSwitchRequest, Greeting, HandshakeResponse};
    use rsa::pkcs8::DecodePrivateKey;
    use std::convert::Infallible;

    fn nonce(h: &str) -> Nonce {
        Nonce::from_auth_data(&hex(h)).unwrap()
    }

    // Expected values computed independently with python3's hashlib:
    //   a = sha1(pw); native = a XOR sha1(nonce + sha1(a))
    //   a = sha256(pw); sha2 = a XOR sha256(sha256(a) + nonce)
    const VECTORS: &[(&[u8], &str, &str, &str)] = &[
        (
            b"secret",
            "0102030405060708090a0b0c0d0e0f1011121314",
            "b32bb3a583e1340c0a1108d58b1be49781ad8c2f",
            "746ebe205d56a0707acb3e796e834e0dd7b1d61743b26bd5202c7a623230c7c9",
        ),
        (
            b"sbpass",
            "274b2576473f44774d5b5f4c3f352f28784b4a70",
            "de061bc4b12fb3e30b37a8620f4961f324fc3988",
            "c3aa125e5b4d89ee079ceb3035f87eb9ccbd9eb4795541a4f3192eb637adb0c9",
        ),
        (
            "p\u{e4}ssw\u{f6}rd with spaces & symbols!".as_bytes(),
            "7d30726f553c6c2c32584635746c3f36302d3047",
            "9642540d1a7a19216e64dc553da9330d5e3cbc5d",
            "c9c1628d3fdef54d4c7a4352281d6b25f5a3f441472ca938373708fc65184ba7",
        ),
        (
            &[b'x'; 100],
            "7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f",
            "c1b0e4bea3b34abd30c45f6ebb25ec5ae4c4bbfe",
            "ff1b1a6d5eec192394812e5f54a0dda450b03459ac1b8a8225142883f31a5c50",
        ),
    ];

    #[test]
    fn known_answers() {
        for (pw, n, native, sha2) in VECTORS {
            let n = nonce(n);
            assert_eq!(native_password(pw, &n).as_bytes(), &hex(native)[..]);
            assert_eq!(caching_sha2_password(pw, &n).as_bytes(), &hex(sha2)[..]);
        }
        let n = nonce("0102030405060708090a0b0c0d0e0f1011121314");
        assert!(native_password(b"", &n).as_bytes().is_empty());
        assert!(caching_sha2_password(b"", &n).as_bytes().is_empty());
    }

    #[test]
    fn reproduces_real_logins() {
        // Three clients logged in as sb/sbpass: each response must be our scramble of the nonce
        // in the greeting that client got.
        for (greeting, response) in [
            (fixtures::CLI_GREETING, fixtures::CLI_RESPONSE),
            (fixtures::CAPI_GREETING, fixtures::CAPI_RESPONSE),
            (fixtures::SB_GREETING, fixtures::SB_RESPONSE),
        ] {
            let g = hex(greeting);
            let g = Greeting::parse(&g).unwrap();
            let n = Nonce::from_auth_data(&g.nonce()).unwrap();
            let login = hex(response);
            let login = HandshakeResponse::parse(&login).unwrap();
            let plugin = AuthPlugin::from_name(login.auth_plugin.unwrap()).unwrap();
            assert_eq!(
                plugin.scramble(b"sbpass", &n).as_bytes(),
                login.auth_response
            );
        }

        // After COM_CHANGE_USER MariaDB sent an AuthSwitchRequest; the reply is other/otherpw
        // scrambled with the switch's nonce (20 bytes + NUL on the wire).
        let sw = hex(fixtures::CAPI_AUTH_SWITCH);
        let sw = AuthSwitchRequest::parse(&sw).unwrap();
        let n = Nonce::from_auth_data(sw.data).unwrap();
        assert_eq!(
            native_password(b"otherpw", &n).as_bytes(),
            &hex(fixtures::CAPI_AUTH_SWITCH_REPLY)[..]
        );
    }

    #[test]
    fn short_nonce_and_unknown_plugin_are_errors() {
        assert_eq!(
            Nonce::from_auth_data(&[1; 19]),
            Err(AuthError::ShortNonce(19))
        );
        assert!(matches!(
            AuthPlugin::from_name(b"client_ed25519"),
            Err(AuthError::UnsupportedPlugin(p)) if p == "client_ed25519"
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let p = Password::new("hunter2");
        assert_eq!(format!("{p:?}"), "Password(<7 bytes redacted>)");
        let r = native_password(
            p.as_bytes(),
            &nonce("0102030405060708090a0b0c0d0e0f1011121314"),
        );
        assert_eq!(format!("{r:?}"), "AuthResponse(<20 bytes redacted>)");
    }

    /// Made with `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048` for these tests
    /// only; `openssl pkey -pubout` and `openssl rsa -RSAPublicKey_out` gave the public forms.
    const TEST_PRIVATE_KEY: &str = include_str!("testdata/rsa_private.pem");
    const TEST_PUBLIC_SPKI: &str = include_str!("testdata/rsa_public_spki.pem");
    const TEST_PUBLIC_PKCS1: &str = include_str!("testdata/rsa_public_pkcs1.pem");
    /// `openssl pkeyutl -encrypt -pkeyopt rsa_padding_mode:oaep -pkeyopt rsa_oaep_md:sha1
    /// -pkeyopt rsa_mgf1_md:sha1` of `("otherpw" + NUL) XOR 7d30726f...` with the key above.
    const OPENSSL_CIPHERTEXT: &str = concat!(
        "22166f30cfc6c7eeba2650cb6756858c8cb5e26f55da584b4985753991d3fe8828532c2d27626b67ee137032",
        "fe594fa5f0e7153c4092498d1e12aedfe9f5f5557029951801bfb993fe0da2489e566b1772885125c43a39f5",
        "44519e5754e39fdb88f4f54f5c0ea880aa4ac8d73d64105a2d65140a516200ba1b67afc33ce2a86846263392",
        "360d7332d4eeb7a48b79a040d7a3d014172f8a0594e229d20fcfb66d5f5d39a233746e346d038e6c48c0582d",
        "bcd5e7b917a90704209cc8d027975fd89e5f08ad4f8535c8ca2ad520c4815fdd13db41e242df40b9410e86d9",
        "e35ca9da65eca1009129039a0a1ebc84a07f4f534e54fc5838faddbceefcc0d194460be7",
    );

    /// A deterministic stand-in RNG; OAEP only needs its bytes to differ between calls.
    struct TestRng(u64);

    impl rand_core::TryRng for TestRng {
        type Error = Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Infallible> {
            Ok(self.try_next_u64()? as u32)
        }
        fn try_next_u64(&mut self) -> Result<u64, Infallible> {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            Ok(self.0.wrapping_mul(0x2545_f491_4f6c_dd1d))
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
            for chunk in dst.chunks_mut(8) {
                let v = self.try_next_u64()?.to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            Ok(())
        }
    }

    impl rand_core::TryCryptoRng for TestRng {}

    fn xored(pw: &[u8], n: &Nonce) -> Vec<u8> {
        let mut p = [pw, &[0]].concat();
        xor_into(&mut p, &n.0);
        p
    }

    #[test]
    fn full_auth_encryption_decrypts_to_the_xored_password() {
        let private = rsa::PrivateKey::from_pkcs8_pem(TEST_PRIVATE_KEY).unwrap();
        let n = nonce("7d30726f553c6c2c32584635746c3f36302d3047");
        let mut rng = TestRng(0x9e37_79b9_7f4a_7c15);
        for pem in [TEST_PUBLIC_SPKI, TEST_PUBLIC_PKCS1] {
            // As the server sends it: AuthMoreData data may end in a NUL.
            let key = ServerPublicKey::from_pem(format!("{pem}\0").as_bytes()).unwrap();
            assert_eq!(key.bits(), 2048);
            for pw in [
                &b"otherpw"[..],
                b"",
                "p\u{e4}ss w\u{f6}rd, longer than the 20-byte nonce".as_bytes(),
            ] {
                let sealed = encrypt_password(pw, &n, &key, &mut rng).unwrap();
                assert_eq!(sealed.len(), 256);
                let opened = private.oaep_decrypt::<Sha1>(&sealed).unwrap();
                assert_eq!(opened, xored(pw, &n));
                let mut unmasked = opened.clone();
                xor_into(&mut unmasked, &n.0);
                assert_eq!(unmasked, [pw, &[0]].concat());
            }
        }
        // Decrypting what the openssl CLI sealed pins the padding to OpenSSL's OAEP.
        let opened = private
            .oaep_decrypt::<Sha1>(&hex(OPENSSL_CIPHERTEXT))
            .unwrap();
        assert_eq!(opened, xored(b"otherpw", &n));
        assert_eq!(opened, hex("12441a0a274c1b2c"));
    }

    #[test]
    fn bad_keys_and_long_passwords_are_errors() {
        let key = ServerPublicKey::from_pem(TEST_PUBLIC_SPKI.as_bytes()).unwrap();
        let n = nonce("0102030405060708090a0b0c0d0e0f1011121314");
        let mut rng = TestRng(1);
        assert!(encrypt_password(&[b'a'; 213], &n, &key, &mut rng).is_ok());
        assert_eq!(
            encrypt_password(&[b'a'; 214], &n, &key, &mut rng),
            Err(AuthError::PasswordTooLong {
                len: 214,
                bits: 2048,
                max: 213
            })
        );
        for bad in [
            &b""[..],
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            b"-----BEGIN RSA PUBLIC KEY-----\n-----END RSA PUBLIC KEY-----\n",
            b"\xff\xfe",
            &[b'A'; MAX_PEM_LEN + 1],
        ] {
            assert!(matches!(
                ServerPublicKey::from_pem(bad),
                Err(AuthError::BadPublicKey(_))
            ));
        }
        // The PKCS#1 key body under an SPKI label is malformed, not a panic.
        let swapped = TEST_PUBLIC_PKCS1.replace("RSA PUBLIC KEY", "PUBLIC KEY");
        assert!(ServerPublicKey::from_pem(swapped.as_bytes()).is_err());
    }

    proptest::proptest! {
        #[test]
        fn key_parsing_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = ServerPublicKey::from_pem(&bytes);
            let mut pem = b"-----BEGIN PUBLIC KEY-----\n".to_vec();
            pem.extend_from_slice(&bytes);
            let _ = ServerPublicKey::from_pem(&pem);
        }
    }
}
