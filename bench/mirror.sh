#!/usr/bin/env bash
# Lab benchmark of the whole mirror path: for each sysbench thread count, starts intercept and
# the copier afresh, runs the load on prod, and reports prod and test queries, how much of
# prod's work test had done when the load ended and after a drain of at most 10 s (fidelity),
# and the CPU the copier and intercept spent per packet (user and system, from /proc).
#
#   bench/mirror.sh [--threads "2 8 32"] [--time 30] [--test oltp_read_only]
#
# Run as root. Builds the release binaries, brings up its own lab (LAB_NAME, default bench) and
# tears it down. One line per thread count on stdout, as a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

THREADS="2 8 32"
TIME=30
TEST=oltp_read_only
while (($# > 0)); do
    case $1 in
    --threads) THREADS=$2 && shift 2 ;;
    --time) TIME=$2 && shift 2 ;;
    --test) TEST=$2 && shift 2 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench/mirror.sh: unknown argument $1 (see --help)" >&2 && exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/mirror.sh: run as root (the lab creates network namespaces)" >&2
    exit 1
fi

export LAB_NAME=${LAB_NAME:-bench}
LAB=deploy/lab/lab.sh
BIN=$PWD/target/release
TICK=$(getconf CLK_TCK)

./scripts/install-deps.sh >&2
cargo build --release -p copier -p intercept >&2
trap '"$LAB" down >&2' EXIT
"$LAB" up >&2
eval "$("$LAB" env)"
# The test server keeps its accounts: the copier rewrites every login (the real path).
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"

# Questions since BASE on HOST, less what our own `counters` calls added (2 each).
declare -A CALLS
net_questions() {
    local raw
    raw=$("$LAB" counters "$1" | awk '$1 == "Questions" { print $2 }')
    CALLS[$1]=$((CALLS[$1] + 1))
    Q=$((raw - $2 - 2 * CALLS[$1]))
}
raw_questions() { "$LAB" counters "$1" | awk '$1 == "Questions" { print $2 }'; }
cpu_ticks() { # cpu_ticks PID: "utime stime" in clock ticks
    awk '{ print $14, $15 }' "/proc/$1/stat"
}
# The process run by `lab.sh exec` is the program itself (exec chain), so $! is its pid.
stop() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
}

echo "| test | threads | s | prod queries | test at end | test after drain | fidelity | copier µs/pkt user+sys | intercept µs/pkt user+sys | kernel drops |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for threads in $THREADS; do
    "$LAB" exec assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
        --listen "$LAB_ASSIST_IP:36524" --status-interval 0 >"$LAB_DIR/intercept.log" 2>&1 &
    ipid=$!
    sleep 0.5
    "$LAB" exec prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
        --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
        --mysql-credentials "$CREDENTIALS" --status-interval 0 >"$LAB_DIR/copier.log" 2>&1 &
    cpid=$!
    for _ in $(seq 50); do
        grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" && break
        sleep 0.1
    done
    p0=$(raw_questions prod)
    t0=$(raw_questions test)
    CALLS=([prod]=0 [test]=0)
    read -r cu0 cs0 < <(cpu_ticks "$cpid")
    read -r iu0 is0 < <(cpu_ticks "$ipid")
    "$LAB" load --test "$TEST" --threads "$threads" --time "$TIME" >"$LAB_DIR/sysbench-$threads.log"
    net_questions prod "$p0"
    prod_q=$Q
    net_questions test "$t0"
    at_end=$Q
    test_q=$at_end
    for _ in $(seq 40); do
        ((test_q >= prod_q)) && break
        sleep 0.25
        net_questions test "$t0"
        test_q=$Q
    done
    read -r cu1 cs1 < <(cpu_ticks "$cpid")
    read -r iu1 is1 < <(cpu_ticks "$ipid")
    stop "$cpid"
    stop "$ipid"
    frames=$(sed -n 's/^  captured: \([0-9]*\) frames.*/\1/p' "$LAB_DIR/copier.log")
    drops=$(sed -n 's/.* \([0-9]*\) kernel drops$/\1/p' "$LAB_DIR/copier.log")
    relayed=$(sed -n 's/.*final:.* relayed=\([0-9]*\).*/\1/p' "$LAB_DIR/intercept.log")
    awk -v test="$TEST" -v th="$threads" -v s="$TIME" -v p="$prod_q" -v e="$at_end" -v t="$test_q" \
        -v cu=$((cu1 - cu0)) -v cs=$((cs1 - cs0)) -v iu=$((iu1 - iu0)) -v is=$((is1 - is0)) \
        -v f="${frames:-0}" -v r="${relayed:-0}" -v d="${drops:-?}" -v tick="$TICK" 'BEGIN {
        us = 1e6 / tick
        printf "| %s | %d | %d | %d | %d (%.4f) | %d | %.5f | %.2f + %.2f | %.2f + %.2f | %s |\n",
            test, th, s, p, e, e / p, t, t / p,
            f ? cu * us / f : 0, f ? cs * us / f : 0, r ? iu * us / r : 0, r ? is * us / r : 0, d }'
done
