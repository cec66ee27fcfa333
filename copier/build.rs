//! Compiles the TLS plaintext probe (`bpf/tls_plain.bpf.c`, issue 21) with clang into OUT_DIR,
//! where `src/tls/probe.rs` embeds it.
//!
//! A missing or failing clang must not fail the copier's build: everything else works without
//! the probe. Then the build sets `cfg(tcpshadow_no_bpf)` and `TCPSHADOW_NO_BPF_REASON`, and
//! `TlsProbe::attach` says why it cannot attach ("built without clang: ...").

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/tls_plain.bpf.c";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tcpshadow_no_bpf)");
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=CLANG");
    if let Err(reason) = build() {
        println!("cargo::warning=TLS plaintext probe not built: {reason}");
        println!("cargo::rustc-cfg=tcpshadow_no_bpf");
        println!("cargo::rustc-env=TCPSHADOW_NO_BPF_REASON={reason}");
    }
}

fn build() -> Result<(), String> {
    // The program reads x86-64 user registers (bpf_tracing.h's __TARGET_ARCH_x86, the syscall
    // numbers in the C file).
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" {
        return Err(format!("the probe supports x86_64 only, not {arch}"));
    }
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let object = out.join("tls_plain.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let output = Command::new(&clang)
        .args([
            "-target",
            "bpf",
            "-O2",
            "-g",
            "-mcpu=v3",
            "-D__TARGET_ARCH_x86",
        ])
        // asm/ptrace.h and the other uapi headers of the host's multiarch include directory.
        .arg("-I/usr/include/x86_64-linux-gnu")
        .args(["-Wall", "-Werror", "-c", SOURCE, "-o"])
        .arg(&object)
        .output()
        .map_err(|e| {
            format!(
                "built without clang: cannot run {clang} ({e}); install clang and libbpf-dev \
                 (scripts/install-deps.sh) and rebuild"
            )
        })?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
        return Err(format!(
            "{clang} failed to compile {SOURCE}: {}; are libbpf-dev's headers installed \
             (scripts/install-deps.sh)?",
            first.trim()
        ));
    }
    Ok(())
}
