#!/usr/bin/env bash
# The whole test suite: dependencies, build, and every test of the workspace, including the lab
# integration tests (network namespaces and real MariaDB servers, hence root). Exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
    echo "scripts/test.sh: run as root: sudo $0 (the lab tests create network namespaces)" >&2
    exit 1
fi
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

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
step cargo build --workspace --all-targets
step cargo test --workspace --no-fail-fast
# A short bounded run of every fuzz target against its committed corpus (the long runs that
# reached 10 million executions each are in docs/RELIABILITY.md); a crash fails the suite.
step ./scripts/fuzz.sh --seconds "${TCPSHADOW_FUZZ_SECONDS:-5}"
