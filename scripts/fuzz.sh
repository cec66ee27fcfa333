#!/usr/bin/env bash
# Bounded fuzz run of the parsers of untrusted input (issue #8): builds the cargo-fuzz targets in
# fuzz/ and runs each for a few seconds from its committed corpus (fuzz/corpus/<target>/). Exits
# non-zero on any crash, timeout or memory blow-up; the input that did it is left in
# fuzz/artifacts/<target>/ and reproduces with `cargo fuzz run -s none <target> <file>`.
#
#   scripts/fuzz.sh [--seconds N] [--quick] [TARGET...]   (default: 20 s each, every target)
#
# --quick builds the fuzz crate's dev profile (opt-level 1, overflow checks and debug assertions,
# cargo's 16 codegen units) instead of cargo-fuzz's release build, which uses one codegen unit:
# on 2 cores it builds in ~160 s instead of ~570 and runs at 0.6-0.75 of the speed. The test
# command's short run uses it; long runs should not.
#
# New inputs the fuzzer finds go to a scratch directory, never into the committed corpus; to
# grow the corpus, see docs/RELIABILITY.md ("Hostile input and fuzzing").
#
# Works on a fresh machine: installs cargo-fuzz if missing, uses the nightly toolchain when one is
# installed and otherwise stable with RUSTC_BOOTSTRAP=1 (cargo-fuzz's instrumentation flags are
# nightly-only in name; without a sanitizer they work on stable).
#
# Sanitizer: none by default. The code under test is safe Rust (bounds and overflow are checked
# in the build anyway), and without AddressSanitizer the build is quicker and runs go 2-3 times
# faster. FUZZ_SANITIZER=address gives ASan (nightly only), which also enforces the
# -malloc_limit_mb bound on single allocations; -rss_limit_mb applies either way.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
profile=(-O)
targets=()
while (($#)); do
    case $1 in
        --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
        --seconds=*) seconds=${1#--seconds=}; shift ;;
        --quick) profile=(--dev); shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        -*) echo "scripts/fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ $seconds =~ ^[0-9]+$ ]] || { echo "scripts/fuzz.sh: --seconds takes a whole number" >&2; exit 2; }

[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cargo=(cargo)
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    cargo=(cargo +nightly)
else
    echo "==> no nightly toolchain: stable with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
fi
sanitizer=${FUZZ_SANITIZER:-none}

cd fuzz
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <("${cargo[@]}" fuzz list)
fi

t0=$SECONDS
echo "==> building ${#targets[@]} fuzz targets (sanitizer: $sanitizer, ${profile[*]})" >&2
# All targets at once: they share one crate, so building one builds nearly everything anyway.
"${cargo[@]}" fuzz build "${profile[@]}" -s "$sanitizer"
echo "==> built in $((SECONDS - t0)) s" >&2

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
    if [[ ! -d corpus/$t ]]; then
        echo "scripts/fuzz.sh: no corpus for target $t (fuzz/corpus/$t)" >&2
        failed+=("$t")
        continue
    fi
    mkdir -p "$scratch/$t"
    echo "==> fuzzing $t for $seconds s" >&2
    # -rss_limit_mb / -malloc_limit_mb: no input may make a parser hold or ask for this much.
    # -timeout: no input may take this long (seconds).
    if "${cargo[@]}" fuzz run "${profile[@]}" -s "$sanitizer" "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=10 \
        -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
        grep -E '^stat::number_of_executed_units' "$scratch/$t.log" \
            | sed "s/^/    $t: /" >&2 || true
    else
        tail -n 40 "$scratch/$t.log" >&2
        echo "==> FAILED: $t (input kept in fuzz/artifacts/$t/)" >&2
        failed+=("$t")
    fi
done

if ((${#failed[@]})); then
    echo "scripts/fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi
echo "==> all ${#targets[@]} targets clean ($((SECONDS - t0)) s in all)" >&2
