#!/usr/bin/env bash
# The whole test suite: dependencies, build, and every test of the workspace, including the lab
# integration tests (network namespaces and real MariaDB servers, hence root), the doc tests and
# a short seeded mutation run of every fuzz harness from its committed corpus
# (intercept/tests/fuzz_corpus.rs). Exits non-zero on any failure; the last line says what
# passed, what failed and how long it took. Measured times are in the README.
#
#   TCPSHADOW_TEST_JOBS    lab test binaries at a time (default 2)
#   TCPSHADOW_FUZZ_SECONDS also run cargo-fuzz's coverage-guided targets this many seconds each
#                          (default 0: off; it builds the workspace a second time, instrumented,
#                          which on 2 cores adds 3-10 minutes; see docs/RELIABILITY.md)
#
# Logs of every test binary: target/test-logs/. One binary alone, as usual:
# `cargo test -p tcpshadow-tests --test faults`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
    echo "scripts/test.sh: run as root: sudo $0 (the lab tests create network namespaces)" >&2
    exit 1
fi
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH
started=$(date +%s)

step() {
    local t0=$SECONDS
    echo "==> $*" >&2
    "$@"
    echo "==> ok ($((SECONDS - t0)) s): $*" >&2
}

step ./scripts/install-deps.sh
if command -v shellcheck >/dev/null 2>&1; then
    step shellcheck deploy/lab/lab.sh deploy/routes.sh scripts/*.sh demo.sh .ci/run
else
    echo "==> shellcheck not installed: shell scripts not linted" >&2
fi
# No import cycle between a crate's top-level modules (issue #19); reads sources, takes < 1 s.
step python3 scripts/module-cycles.py
step python3 scripts/architecture-names.py
# Built once: the release daemons the lab tests run (what a user runs) and every test binary,
# side by side: each profile has its own lock, and two builds fill the cores where one waits
# on a link or a long crate.
build() {
    mkdir -p target
    cargo build --release -p copier -p intercept --bins >target/build-release.log 2>&1 &
    local release=$!
    cargo test --workspace --no-run
    if ! wait "$release"; then
        cat target/build-release.log >&2
        echo "scripts/test.sh: cargo build --release failed (log: target/build-release.log)" >&2
        return 1
    fi
}
step build
export TCPSHADOW_RELEASE_BUILT=1 CARGO
CARGO=$(command -v cargo)
fuzz_seconds=${TCPSHADOW_FUZZ_SECONDS:-0}
[[ $fuzz_seconds =~ ^[0-9]+$ ]] || { echo "scripts/test.sh: TCPSHADOW_FUZZ_SECONDS takes a whole number" >&2; exit 2; }
# The doc tests (and, when asked for, the coverage-guided fuzz run; the long runs are in
# docs/RELIABILITY.md) are CPU-bound: they run beside the lab tests at idle priority.
background=(--background "doc tests" "cargo test --workspace --doc")
if ((fuzz_seconds > 0)); then
    background+=(--background fuzz "./scripts/fuzz.sh --quick --seconds $fuzz_seconds")
fi
cargo test --workspace --no-run --message-format=json 2>/dev/null |
    python3 scripts/run-tests.py --since "$started" --jobs "${TCPSHADOW_TEST_JOBS:-2}" "${background[@]}"
