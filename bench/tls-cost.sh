#!/usr/bin/env bash
# What the TLS plaintext probe (issue 21) costs production, alone: sysbench oltp_read_only
# --mysql-ssl=on against the lab's production (LAB_TLS=1, CPU pinning off), alternating runs
# without and with the probe attached (tests' tls-probe-dump draining it; no mirroring).
# --mirror: with the whole mirror instead (copier and intercept, TLS sessions mirrored); the
# reader's figure is then the copier's.
#
#   bench/tls-cost.sh [--threads "8 32"] [--time 15] [--runs 2] [--mirror]
#
# Run as root; brings up its own lab (LAB_NAME, default tlscost) and tears it down. One line
# per run: label, threads, QPS, production's CPU-µs per query (schedstat of every mariadbd
# thread) and the probe reader's.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

THREADS="8 32"
TIME=15
RUNS=2
MIRROR=0
while (($# > 0)); do
    case $1 in
    --mirror) MIRROR=1 && shift ;;
    --threads) THREADS=$2 && shift 2 ;;
    --time) TIME=$2 && shift 2 ;;
    --runs) RUNS=$2 && shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench/tls-cost.sh: unknown argument $1 (see --help)" >&2 && exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/tls-cost.sh: run as root (the lab creates network namespaces)" >&2
    exit 1
fi

export LAB_NAME=${LAB_NAME:-tlscost} LAB_TLS=1 LAB_PIN=0
LAB=deploy/lab/lab.sh
./scripts/install-deps.sh >&2
cargo build --release -p copier -p intercept -p tcpshadow-tests --bin copier --bin intercept \
    --bin tls-probe-dump >&2
BIN=$PWD/target/release
DUMP=$BIN/tls-probe-dump
WORK=$(mktemp -d)
cleanup() {
    touch "$WORK/stop"
    sleep 1
    $LAB down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
$LAB down >/dev/null 2>&1 || true
$LAB up >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2 && exit 1; }
eval "$($LAB env)"
prod=$(cat "$LAB_PROD_PIDFILE")
CRED=$LAB_DIR/bench-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CRED"
chmod 600 "$CRED"

# The reader: the probe alone (tls-probe-dump), or the mirror; prints the pid to measure.
start_reader() {
    rm -f "$WORK/stop"
    if ((MIRROR)); then
        $LAB service assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
            --listen "$LAB_ASSIST_IP:36524" --status-interval 0 >"$WORK/intercept.log" 2>&1 &
        sleep 0.5
        $LAB service prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
            --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
            --mysql-credentials "$CRED" --status-interval 0 >"$WORK/dump.log" 2>&1 &
        sleep 2
        pgrep -f "$BIN/copier --port" | head -n 1
    else
        ip netns exec "$LAB_PROD_NS" "$DUMP" "$LAB_MYSQL_PORT" "$WORK/stop" $((TIME * 4)) \
            >"$WORK/dump.log" 2>&1 &
        sleep 2
        pgrep -f "tls-probe-dump $LAB_MYSQL_PORT $WORK/stop" | head -n 1
    fi
}

stop_reader() {
    if ((MIRROR)); then
        pkill -TERM -f "$BIN/copier --port" || true
        sleep 3
        pkill -TERM -f "$BIN/intercept --port" || true
        sleep 1
        grep -E '^  (tls|losses)' "$WORK/dump.log" | cut -c1-160 >&2 || true
    else
        touch "$WORK/stop"
        sleep 2
        grep -E '^stats' "$WORK/dump.log" | cut -c1-160 >&2 || true
    fi
}

# CPU time of every thread of PID, ns (the scheduler's clock, not ticks).
cpu_ns() {
    local s=0 t
    for t in /proc/"$1"/task/*/schedstat; do
        s=$((s + $(awk '{ print $1 }' "$t" 2>/dev/null || echo 0)))
    done
    echo "$s"
}

run() { # run LABEL THREADS [READER_PID]
    local a r0=0 b r q qps
    a=$(cpu_ns "$prod")
    [[ -n ${3:-} ]] && r0=$(cpu_ns "$3")
    $LAB load --threads "$2" --time "$TIME" --mysql-ssl=on >"$WORK/load.log" 2>&1
    b=$(cpu_ns "$prod")
    r=""
    [[ -n ${3:-} ]] && r=$(($(cpu_ns "$3") - r0))
    q=$(awk '/queries:/ { print $2; exit }' "$WORK/load.log")
    qps=$(awk '/queries:/ { gsub("[(]", "", $3); print $3; exit }' "$WORK/load.log")
    awk -v l="$1" -v t="$2" -v qps="$qps" -v p=$((b - a)) -v r="$r" -v q="$q" 'BEGIN {
        printf "%s threads=%s qps=%s prod_cpu_us_per_query=%.1f", l, t, qps, p / 1000 / q
        if (r != "") printf " reader_cpu_us_per_query=%.2f", r / 1000 / q
        printf "\n" }'
}

for th in $THREADS; do
    for ((i = 0; i < RUNS; i++)); do
        run without "$th"
        reader=$(start_reader)
        run "$( ((MIRROR)) && echo mirror || echo probe)" "$th" "$reader"
        stop_reader
    done
done
