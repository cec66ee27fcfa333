//! Every committed fuzz corpus file (`fuzz/corpus/<target>/`) run through the same harnesses the
//! cargo-fuzz targets use (the workspace crate tcpshadow-fuzz-harness, `fuzz-harness/`), on
//! stable: a parser that regresses on an input the fuzzer once found interesting fails the
//! ordinary `cargo test`, without nightly or cargo-fuzz. Lives in intercept's tests because intercept (with copier as a dev-dependency)
//! reaches every parser the harnesses drive.
//!
//! Beside the replay, a short seeded mutation run of every harness (200,000 inputs a target,
//! about 6 s on 2 cores) is the test command's fuzz run; see its test for why it is not
//! cargo-fuzz.

use std::path::Path;

use tcpshadow_fuzz_harness as harness;
use tcpshadow_fuzz_harness::seeds;

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

/// A short, seeded mutation run of every harness, on stable, from the committed corpus: the test
/// command's fuzz run (issue 24). cargo-fuzz's coverage-guided runs need a second build of the
/// whole workspace with its instrumentation (160-570 s on 2 cores, and on a machine busy with the
/// lab tests it was the suite's last 10 minutes); this one reuses the test build and costs
/// seconds. It finds what blind mutation near known-interesting inputs finds, not what coverage
/// feedback would: the long runs stay with `scripts/fuzz.sh` (docs/RELIABILITY.md).
///
/// Deterministic: the seed is fixed (`TCPSHADOW_MUTATION_SEED` overrides it, and
/// `TCPSHADOW_MUTATIONS` the inputs per target), so a failure reproduces from the test alone, and
/// the input that failed is written out to be replayed or committed to the corpus.
#[test]
fn mutations_of_every_corpus_pass_their_harness() {
    let per_target: u64 = env_or("TCPSHADOW_MUTATIONS", 200_000);
    let seed: u64 = env_or("TCPSHADOW_MUTATION_SEED", 0x7c95_d0a3_41e2_b86f);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-mutations");
    let failed: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = harness::TARGETS
            .iter()
            .map(|&(name, run)| {
                let (root, out) = (&root, &out);
                s.spawn(move || {
                    let corpus = read_corpus(&root.join(name));
                    mutate_target(name, run, &corpus, per_target, seed, out)
                })
            })
            .collect();
        runs.into_iter()
            .filter_map(|h| h.join().unwrap_or_else(|_| Some("harness thread".into())))
            .collect()
    });
    assert!(
        failed.is_empty(),
        "{} target(s) failed on a mutated input:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: a whole number, please")),
        Err(_) => default,
    }
}

fn read_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    // read_dir's order is the file system's: sorted, the same seed gives the same inputs.
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Runs `n` mutated inputs through `run`; on the first panic, writes the input under `out` and
/// returns what to report.
fn mutate_target(
    name: &str,
    run: harness::Harness,
    corpus: &[Vec<u8>],
    n: u64,
    seed: u64,
    out: &Path,
) -> Option<String> {
    let mut rng = Rng(seed
        ^ name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        }));
    let mut input = Vec::new();
    for i in 0..n {
        input.clear();
        input.extend_from_slice(&corpus[rng.below(corpus.len())]);
        for _ in 0..=rng.below(4) {
            mutate(&mut input, corpus, &mut rng);
        }
        if std::panic::catch_unwind(|| run(&input)).is_err() {
            std::fs::create_dir_all(out.join(name)).unwrap();
            let file = out.join(name).join(format!("mutation-{seed:x}-{i}"));
            std::fs::write(&file, &input).unwrap();
            return Some(format!(
                "{name}: input {i} of seed {seed:#x}, kept in {} (replay: copy it into \
                 fuzz/corpus/{name}/ and run this test file, or `cargo fuzz run {name} FILE`)",
                file.display()
            ));
        }
    }
    eprintln!("{name}: {n} mutated inputs passed");
    None
}

/// libFuzzer's cheap mutations, minus the ones that need coverage feedback: bit flips, random
/// and boundary bytes and integers, inserted, erased, repeated and spliced-in ranges.
fn mutate(data: &mut Vec<u8>, corpus: &[Vec<u8>], rng: &mut Rng) {
    const MAX_LEN: usize = 64 * 1024;
    let len = data.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next() as u8;
        }
        2 if len > 0 => {
            // A length, count or flag field at its edges is where parsers go wrong.
            const EDGES: [u8; 8] = [0, 1, 0x7f, 0x80, 0xfb, 0xfc, 0xfe, 0xff];
            let i = rng.below(len);
            let width = (1 + rng.below(4)).min(len - i);
            let b = EDGES[rng.below(EDGES.len())];
            data[i..i + width].fill(b);
        }
        3 if len < MAX_LEN => {
            let i = rng.below(len + 1);
            let k = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
            data.splice(i..i, bytes);
        }
        4 if len > 0 => {
            let i = rng.below(len);
            let k = 1 + rng.below((len - i).min(64));
            data.drain(i..i + k);
        }
        5 if len > 0 && len < MAX_LEN => {
            let i = rng.below(len);
            let k = 1 + rng.below((len - i).min(256));
            let chunk = data[i..i + k].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, chunk);
        }
        6 if len > 0 => data.truncate(rng.below(len)),
        7 => {
            // Crossover: part of another interesting input.
            let other = &corpus[rng.below(corpus.len())];
            if !other.is_empty() && len < MAX_LEN {
                let i = rng.below(other.len());
                let k = 1 + rng.below((other.len() - i).min(512));
                let at = rng.below(len + 1);
                data.splice(at..at, other[i..i + k].iter().copied());
            }
        }
        8 if len >= 2 => {
            let i = rng.below(len - 1);
            let v = (rng.next() as u16).to_le_bytes();
            data[i..i + 2].copy_from_slice(&v);
        }
        _ => data.push(rng.next() as u8),
    }
}

/// splitmix64: small, seedable, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform enough in `0..n` for choosing mutations; `n` must be above 0.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
