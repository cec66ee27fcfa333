#!/usr/bin/env bash
# Copier memory per idle mirrored session (issue 9): opens CONNS MySQL connections from the
# lab's client to prod (mysql-crowd: real logins, one `SELECT 1` each, then held idle), with
# the copier mirroring them, and reports the copier's RSS before and with the crowd, the
# difference per session, and how many sessions the test server holds.
#
#   bench/idle.sh [--conns 10000] [--copier-args "..."]
#
# Run as root; brings up its own lab (LAB_NAME, default idle) and tears it down. Prints one
# Markdown table line on stdout: connections, what mysql-crowd opened, sessions on test, copier
# RSS before and with the crowd (MiB), KiB per session.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

CONNS=10000
COPIER_ARGS=""
while (($# > 0)); do
    case $1 in
    --conns) CONNS=$2 && shift 2 ;;
    --copier-args) COPIER_ARGS=$2 && shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench/idle.sh: unknown argument $1 (see --help)" >&2 && exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/idle.sh: run as root (the lab creates network namespaces)" >&2
    exit 1
fi
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || { echo "bench/idle.sh: --conns takes a positive integer" >&2 && exit 2; }
read -r -a COPIER_EXTRA <<<"$COPIER_ARGS"

export LAB_NAME=${LAB_NAME:-idle}
# Both servers must take every connection (a thread each: about 3 GiB of RSS for 10,000).
export LAB_MAX_CONNECTIONS=$((CONNS + 500))
LAB=deploy/lab/lab.sh
BIN=$PWD/target/release

./scripts/install-deps.sh >&2
cargo build --release -p copier -p intercept -p tcpshadow-tests --bin copier --bin intercept \
    --bin mysql-crowd >&2
trap '"$LAB" down >&2' EXIT
"$LAB" up >&2
eval "$("$LAB" env)"
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"
rss_kib() { awk -v k="$2" '$1 == k ":" { print $2 }' "/proc/$1/status"; }
threads() { "$LAB" counters "$1" | awk '$1 == "Threads_connected" { print $2 }'; }

"$LAB" exec assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --listen "$LAB_ASSIST_IP:36524" --status-interval 0 \
    >"$LAB_DIR/intercept.log" 2>&1 &
ipid=$!
sleep 0.5
"$LAB" exec prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
    --mysql-credentials "$CREDENTIALS" --status-interval 5 "${COPIER_EXTRA[@]}" \
    >"$LAB_DIR/copier.log" 2>&1 &
cpid=$!
for _ in $(seq 100); do
    grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" && break
    sleep 0.1
done
sleep 1
before=$(rss_kib "$cpid" VmRSS)
t0=$(threads test)
crowd_log=$LAB_DIR/crowd.log
"$LAB" exec client sh -c "ulimit -n $((CONNS + 1000)) && exec $BIN/mysql-crowd \
    $LAB_PROD_IP:$LAB_MYSQL_PORT $LAB_USER $LAB_PASSWORD $LAB_DB $CONNS 1 30" >"$crowd_log" 2>&1 &
crowd=$!
for _ in $(seq 1200); do
    grep -q '^ready' "$crowd_log" && break
    kill -0 "$crowd" 2>/dev/null || break
    sleep 0.25
done
grep -q '^ready' "$crowd_log" || { cat "$crowd_log" >&2 && exit 1; }
sleep 5 # idle: every session established, nothing in flight
with=$(rss_kib "$cpid" VmRSS)
t1=$(threads test)
wait "$crowd" || true
kill -TERM "$cpid" "$ipid" 2>/dev/null || true
wait "$cpid" "$ipid" 2>/dev/null || true
opened=$(grep '^ready' "$crowd_log")
echo "copier log:" >&2 && grep -E "session memory|closed|not mirrored" "$LAB_DIR/copier.log" | tail -5 >&2
awk -v c="$CONNS" -v b="$before" -v w="$with" -v t=$((t1 - t0)) -v o="$opened" 'BEGIN {
    printf "| %d | %s | %d | %.1f | %.1f | %.2f |\n", c, o, t, b / 1024, w / 1024, (w - b) / t }'
