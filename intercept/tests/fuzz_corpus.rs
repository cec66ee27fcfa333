//! Every committed fuzz corpus file (`fuzz/corpus/<target>/`) run through the same harnesses the
//! cargo-fuzz targets use (`fuzz/src/harness.rs`), on stable: a parser that regresses on an input
//! the fuzzer once found interesting fails the ordinary `cargo test`, without nightly or
//! cargo-fuzz. Lives in intercept's tests because intercept (with copier as a dev-dependency)
//! reaches every parser the harnesses drive.

#[allow(dead_code)]
#[path = "../../common/src/mysql/fixtures.rs"]
mod fixtures;
#[allow(dead_code)]
#[path = "../../fuzz/src/harness.rs"]
mod harness;
#[path = "../../fuzz/src/seeds.rs"]
mod seeds;

use std::path::Path;

#[test]
fn every_committed_corpus_file_passes_its_harness() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut total = 0;
    for (name, run) in harness::TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (every target has a corpus)", dir.display()));
        let mut n = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            // A failure names the file: `cargo fuzz run <target> <file>` reproduces it.
            eprintln!("{name}: {}", path.display());
            run(&data);
            n += 1;
        }
        assert!(n > 0, "{name}: empty corpus");
        total += n;
    }
    eprintln!("{total} corpus files passed");
}

#[test]
fn harnesses_take_any_short_input() {
    // Every target must accept the empty input and a few degenerate ones (the fuzzer's first
    // tries), independent of the corpus.
    for (_, run) in harness::TARGETS {
        for data in [&[][..], &[0], &[0xff; 64], &[1, 2, 3, 4, 5, 6, 7, 8]] {
            run(data);
        }
    }
}

#[test]
fn seeds_pass_their_harness() {
    for (name, seeds) in seeds::all() {
        let run = harness::TARGETS.iter().find(|(n, _)| *n == name).unwrap().1;
        for s in &seeds {
            run(s);
        }
    }
}
