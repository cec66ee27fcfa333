#!/usr/bin/env bash
# tcpshadow demo: installs what is needed, builds, brings up a lab (client, prod, test, assist),
# starts the mirror (intercept on assist, copier on prod), runs a sysbench load from the client
# against prod, and shows what prod and test executed, how far test was behind when the load
# ended, and the fidelity once the mirror drained. Tears the lab down at the end. Run as root on
# Debian 12.
#
#   DEMO_TEST=oltp_read_only DEMO_THREADS=8 DEMO_TIME=20 LAB_NAME=demo ./demo.sh
#   DEMO_REPORT=/tmp/tcpshadow-demo-report: where the comparison report (txt, json, html) is kept
set -euo pipefail
cd "$(dirname "$0")"

if [[ $EUID -ne 0 ]]; then
    echo "demo.sh: run as root: sudo $0 (the lab creates network namespaces and runs MariaDB)" >&2
    exit 1
fi
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

DEMO_TEST=${DEMO_TEST:-oltp_read_only}
DEMO_THREADS=${DEMO_THREADS:-8}
DEMO_TIME=${DEMO_TIME:-20}
DEMO_REPORT=${DEMO_REPORT:-/tmp/tcpshadow-demo-report}
export LAB_NAME=${LAB_NAME:-demo}
LAB=deploy/lab/lab.sh
BIN=$PWD/target/release

# Counters worth comparing between prod and test.
SHOWN=(Questions Com_select Com_stmt_prepare Com_stmt_execute Com_begin Com_commit
    Com_insert Com_update Com_delete Connections Aborted_connects)

counters() { # counters HOST VAR: fill the associative array VAR with HOST's counters
    local -n into=$2
    local name value
    while read -r name value; do
        # shellcheck disable=SC2034 # into is a nameref
        into["$name"]=$value
    done < <("$LAB" counters "$1")
}

# Each `lab.sh counters` call adds 2 to its server's Questions (its SHOW STATUS, and its COM_QUIT,
# counted at the next call). net_questions HOST BASE sets Q to HOST's Questions since the call that
# read BASE, less what our own calls added since then; CALLS counts the calls per host.
declare -A CALLS=([prod]=0 [test]=0)
net_questions() {
    local raw
    raw=$("$LAB" counters "$1" | awk '$1 == "Questions" { print $2 }')
    CALLS[$1]=$((CALLS[$1] + 1))
    Q=$((raw - $2 - 2 * (CALLS[$1] - BASE_CALLS[$1])))
}

stop_mirror() {
    local pid
    for pid in ${COPIER_PID-} ${INTERCEPT_PID-}; do
        kill -TERM "$pid" 2>/dev/null || true
        # The copier drains for up to 2 s, then prints its summary.
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    COPIER_PID='' INTERCEPT_PID=''
}

echo "==> dependencies"
./scripts/install-deps.sh

echo "==> build"
cargo build --workspace --release

echo "==> lab '$LAB_NAME'"
trap 'stop_mirror; "$LAB" down' EXIT
"$LAB" up
eval "$("$LAB" env)"
"$LAB" status

# The test server keeps its own accounts: the copier logs every mirrored session in with the
# test server's scramble, from the passwords valid there (a file only root may read).
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"

echo "==> mirror: intercept on assist ($LAB_ASSIST_IP), copier on prod ($LAB_PROD_IP) -> test ($LAB_TEST_IP)"
"$LAB" exec assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --listen "$LAB_ASSIST_IP:36524" >"$LAB_DIR/intercept.log" 2>&1 &
INTERCEPT_PID=$!
sleep 0.5
"$LAB" exec prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
    --mysql-credentials "$CREDENTIALS" --report "$LAB_DIR/report" --compare-results \
    >"$LAB_DIR/copier.log" 2>&1 &
COPIER_PID=$!
for _ in $(seq 50); do
    grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" 2>/dev/null && break
    sleep 0.1
done
grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" || {
    echo "the copier did not connect to intercept:" >&2
    cat "$LAB_DIR/copier.log" "$LAB_DIR/intercept.log" >&2
    exit 1
}

declare -A prod0 test0 prod1 test1 BASE_CALLS
counters prod prod0
counters test test0
BASE_CALLS=([prod]=0 [test]=0)

echo "==> load: sysbench $DEMO_TEST, $DEMO_THREADS threads, ${DEMO_TIME}s, client -> prod (mirrored to test)"
"$LAB" load --test "$DEMO_TEST" --threads "$DEMO_THREADS" --time "$DEMO_TIME" |
    grep -E 'queries:|transactions:|errors:|95th'
# How far test is behind the moment the load ends: the mirror forwards each request as soon as
# it is captured, so this should be (almost) everything.
net_questions prod "${prod0[Questions]}"
prod_q=$Q
net_questions test "${test0[Questions]}"
test_at_end=$Q

echo "==> drain: waiting up to 10 s for test to finish what was mirrored"
test_q=$test_at_end
for _ in $(seq 40); do
    ((test_q >= prod_q)) && break
    sleep 0.25
    net_questions test "${test0[Questions]}"
    test_q=$Q
done
stop_mirror
counters prod prod1
counters test test1

echo
echo "==> what the servers executed during the load (counter deltas)"
printf '%-20s %14s %14s\n' counter "prod $LAB_PROD_IP" "test $LAB_TEST_IP"
for c in "${SHOWN[@]}"; do
    printf '%-20s %14s %14s\n' "$c" $((prod1[$c] - prod0[$c])) $((test1[$c] - test0[$c]))
done

echo
echo "==> copier summary"
sed -n '/copier summary/,$p' "$LAB_DIR/copier.log"

# The lab directory goes with the lab: keep the comparison report where the user can open it.
if [[ -f $LAB_DIR/report/report.txt ]]; then
    rm -rf "$DEMO_REPORT" && mkdir -p "$DEMO_REPORT" && cp "$LAB_DIR"/report/report.* "$DEMO_REPORT"/
    echo "==> comparison report (top of $DEMO_REPORT/report.txt; charts in $DEMO_REPORT/report.html)"
    head -n 30 "$DEMO_REPORT/report.txt"
    echo
else
    echo "==> no comparison report was written (see $LAB_DIR/copier.log above)" >&2
fi

echo "==> summary"
echo "prod executed $prod_q statements in ${DEMO_TIME}s ($((prod_q / DEMO_TIME))/s)"
echo "test had executed $test_at_end of them when the load ended, $test_q after draining"
awk -v e="$test_at_end" -v t="$test_q" -v p="$prod_q" 'BEGIN {
    if (p > 0) printf "in step when the load ended: %.4f   fidelity (test/prod): %.4f\n", e / p, t / p }'
