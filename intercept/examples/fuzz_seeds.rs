//! Writes the fuzz targets' seed inputs (`fuzz-harness/src/seeds.rs`, feature `seeds`) into
//! `fuzz/corpus/<target>/seed-N`.
//! Run after changing a harness's input layout, then minimise the corpus again
//! (docs/RELIABILITY.md, "Hostile input and fuzzing"):
//!
//!     cargo run -p intercept --example fuzz_seeds
//!
//! An example rather than a test: it writes into the source tree, which no test should do.

use std::path::Path;

use tcpshadow_fuzz_harness::seeds;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut written = 0;
    for (name, seeds) in seeds::all() {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)?;
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s)?;
            written += 1;
        }
    }
    println!("{written} seeds written under {}", root.display());
    Ok(())
}
