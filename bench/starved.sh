#!/usr/bin/env bash
# A copier starved on purpose: started from the shell that runs the clients, so the kernel's
# per-session CPU groups (autogroup) put it in one group with every sysbench thread, as a copier
# started by hand next to a load generator, or squeezed in a busy container, would be. One run:
# intercept as a service of its own, the copier and sysbench in one session, then production's
# and the test server's executed work compared (tests/src/work.rs) and the copier's summary.
#
#   bench/starved.sh [--threads 32] [--time 20] [--copier-args "..."]
#
# Run as root. Builds the release binaries, brings up its own lab (LAB_NAME, default starved;
# LAB_PIN defaults to 0 here: a starved copier is not pinned to a core of its own) and tears it
# down. Exits 0 whatever the fidelity: the figures are the output.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

THREADS=32
TIME=20
COPIER_ARGS=""
while (($# > 0)); do
    case $1 in
    --threads) THREADS=$2 && shift 2 ;;
    --time) TIME=$2 && shift 2 ;;
    --copier-args) COPIER_ARGS=$2 && shift 2 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench/starved.sh: unknown argument $1 (see --help)" >&2 && exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/starved.sh: run as root (the lab creates network namespaces)" >&2
    exit 1
fi
[[ $THREADS =~ ^[1-9][0-9]*$ && $TIME =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench/starved.sh: --threads and --time take positive integers" >&2 && exit 2; }

export LAB_NAME=${LAB_NAME:-starved} LAB_PIN=${LAB_PIN:-0}
LAB=$PWD/deploy/lab/lab.sh
BIN=$PWD/target/release
cargo build --release -p copier -p intercept >&2
cargo build --release -p tcpshadow-tests --bin work-compare >&2
trap '"$LAB" down >&2' EXIT
"$LAB" up >&2
set -a # the lab's variables are read by the session started below too
eval "$("$LAB" env)"
set +a
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"

"$LAB" service assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --listen "$LAB_ASSIST_IP:36524" --status-interval 0 >"$LAB_DIR/intercept.log" 2>&1 &
ipid=$!
sleep 0.5
"$LAB" work prod >"$LAB_DIR/work-prod-0"
"$LAB" work test >"$LAB_DIR/work-test-0"
read -r -a COPIER_EXTRA <<<"$COPIER_ARGS"
export LAB BIN CREDENTIALS THREADS TIME LAB_DIR
# One session for both: the copier in the background of the shell that runs sysbench.
setsid --wait bash -c '
    "$LAB" exec prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
        --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
        --mysql-credentials "$CREDENTIALS" --status-interval 0 "$@" >"$LAB_DIR/copier.log" 2>&1 &
    echo $! >"$LAB_DIR/copier.pid"
    for _ in $(seq 100); do
        grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" && break
        sleep 0.1
    done
    "$LAB" exec client sysbench oltp_read_only --db-driver=mysql --mysql-host="$LAB_PROD_IP" \
        --mysql-port="$LAB_MYSQL_PORT" --mysql-user="$LAB_USER" --mysql-password="$LAB_PASSWORD" \
        --mysql-db="$LAB_DB" --tables="$LAB_TABLES" --table-size="$LAB_TABLE_SIZE" \
        --threads="$THREADS" --time="$TIME" run >"$LAB_DIR/sysbench.log" 2>&1
' starved "${COPIER_EXTRA[@]}" || echo "bench/starved.sh: sysbench failed: $(tail -3 "$LAB_DIR/sysbench.log")" >&2
cpid=$(cat "$LAB_DIR/copier.pid")
"$LAB" work prod >"$LAB_DIR/work-prod-1"
compare() {
    "$BIN/work-compare" "$LAB_DIR/work-prod-0" "$LAB_DIR/work-prod-1" \
        "$LAB_DIR/work-test-0" "$LAB_DIR/work-test-1" "$@"
}
for _ in $(seq 40); do
    "$LAB" work test >"$LAB_DIR/work-test-1"
    compare --min 0.999 --max 1.001 >/dev/null 2>&1 && break
    sleep 0.25
done
compare || true
kill -TERM "$cpid" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
kill -TERM "$ipid" 2>/dev/null || true
grep -E "capture priority|fell .* behind|kept up for" "$LAB_DIR/copier.log" || true
sed -n '/^copier summary/,$p' "$LAB_DIR/copier.log"
