#!/usr/bin/env bash
# tcpshadow demo: installs what is needed, builds, brings up a lab (client, prod, test, assist),
# starts the mirror (intercept on assist, copier on prod), runs a sysbench load from the client
# against prod, and shows what prod and test executed (by kind, with the test server's new
# statement errors), how far test was behind when the load ended, and the work fidelity once the
# mirror drained. Exits non-zero when work fidelity is below 0.99 or the test server had errors
# production did not. Tears the lab down at the end. Run as root on Debian 12.
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

# What each server executed (lab.sh work: counters by kind, statement errors) into a file;
# bin/work-compare compares four of them, as the lab tests do (tests/src/work.rs).
snapshot() { "$LAB" work "$1" >"$LAB_DIR/work-$1-$2"; }
compare() { # compare LABEL [work-compare options]: prod 0->1 against test 0->LABEL
    local label=$1
    shift
    "$BIN/work-compare" "$LAB_DIR/work-prod-0" "$LAB_DIR/work-prod-1" \
        "$LAB_DIR/work-test-0" "$LAB_DIR/work-test-$label" "$@"
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

snapshot prod 0
snapshot test 0

echo "==> load: sysbench $DEMO_TEST, $DEMO_THREADS threads, ${DEMO_TIME}s, client -> prod (mirrored to test)"
"$LAB" load --test "$DEMO_TEST" --threads "$DEMO_THREADS" --time "$DEMO_TIME" |
    grep -E 'queries:|transactions:|errors:|95th'
# How far test is behind the moment the load ends: the mirror forwards each request as soon as
# it is captured, so this should be (almost) everything.
snapshot prod 1
snapshot test end
at_end=$( (compare end --min 0 --max 1e9 || true) | sed -n 's/^  work fidelity: \([0-9.]*\).*/\1/p')

echo "==> drain: waiting up to 10 s for test to finish what was mirrored"
for _ in $(seq 40); do
    snapshot test 1
    compare 1 --min 0.999 --max 1.001 >/dev/null && break
    sleep 0.25
done
stop_mirror
snapshot test 1

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

echo "==> summary: what the servers executed during the load"
status=0
compare 1 --copier-log "$LAB_DIR/copier.log" || status=$?
echo "  in step when the load ended: ${at_end:-?} of production's work"
if ((status != 0)); then
    echo "demo: the test server did not execute what production did (work fidelity below 0.99, or new errors): see above" >&2
    exit 1
fi
