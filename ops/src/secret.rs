//! The control channel's shared secret on disk (`--secret-file`), and the random bytes its
//! challenge-response needs.
//!
//! The file is refused when group or others may read it, as ssh refuses such keys: a secret
//! that any local user can read protects nothing. This module reads the file and the kernel's
//! random source; it never logs, formats or returns the secret in an error message (the MAC and
//! its checks live in `common::auth`).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Said when the removed `--token-file` (control protocol 3's cleartext token) is given.
pub const TOKEN_FILE_GONE: &str =
    "--token-file (token-file, TCPSHADOW_TOKEN_FILE) was replaced by \
    --secret-file: the secret no longer crosses the wire (control protocol 4). Rename the flag \
    on both hosts; the same file works if it holds at least 16 bytes and is chmod 600";

/// Largest file read: a secret is a line, not a document.
const MAX_FILE_LEN: u64 = 64 * 1024;

/// The raw contents of `--secret-file` (`flag` names it in errors), after checking that only its
/// owner can read it. The caller trims and bounds it (`common::auth::Secret::new`).
pub fn read_secret_file(flag: &str, path: &Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read {flag} {}", path.display()))?;
    if !meta.is_file() {
        bail!("{flag} {} is not a regular file", path.display());
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "{flag} {} is accessible by group or others (mode {:o}): it holds the control \
             channel's secret; run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    if meta.len() > MAX_FILE_LEN {
        bail!(
            "{flag} {} is {} bytes: a secret is one line (e.g. `head -c 32 /dev/urandom | base64`)",
            path.display(),
            meta.len()
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

/// `N` bytes from the kernel's random source (getrandom(2), which blocks only until the pool
/// is first initialised, long before a daemon starts).
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: getrandom writes at most `N - filled` bytes into our buffer from `filled` on.
        let rc = unsafe { libc::getrandom(out[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += rc as usize;
    }
    Ok(out)
}

/// The control channel's secret as both daemons take it: from `--secret-file` when given
/// (checked by [`read_secret_file`], then trimmed and bounded by `common::auth::Secret`),
/// none without it.
pub fn control_secret(secret_file: Option<&Path>) -> Result<Option<common::auth::Secret>> {
    let Some(path) = secret_file else {
        return Ok(None);
    };
    let raw = read_secret_file("--secret-file", path)?;
    let secret = common::auth::Secret::new(&raw)
        .with_context(|| format!("--secret-file {}", path.display()))?;
    Ok(Some(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owner_readable_files_are_accepted_and_errors_never_echo_the_secret() {
        let dir = std::env::temp_dir().join(format!("tsd-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "swordfish-swordfish\n").unwrap();
        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = format!(
                "{:#}",
                read_secret_file("--secret-file", &path).unwrap_err()
            );
            assert!(e.contains("chmod 600") && !e.contains("swordfish"), "{e}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_secret_file("--secret-file", &path).unwrap(),
            b"swordfish-swordfish\n"
        );
        let e = format!(
            "{:#}",
            read_secret_file("--secret-file", &dir.join("nope")).unwrap_err()
        );
        assert!(e.contains("--secret-file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn random_bytes_differ() {
        let a: [u8; 32] = random_bytes().unwrap();
        let b: [u8; 32] = random_bytes().unwrap();
        assert_ne!(a, b);
    }
}
