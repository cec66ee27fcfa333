#!/usr/bin/env bash
# tcpshadow demo: the experiment this project grew from (../shared/background: a MySQL host
# burning sys CPU on TIMESTAMP results with time_zone=SYSTEM, settled by replaying the peak onto
# test servers that differed in that one setting). Installs what is needed, builds, brings up a
# lab of five hosts (client, prod, test, test2, assist), gives test A `time_zone=SYSTEM` and test
# B `+00:00` (or a malloc preloaded: DEMO_B), starts the mirror with --tee (intercept on assist,
# copier on prod, every connection to both test servers), runs a load whose result sets carry
# TIMESTAMP columns from the client against prod, and shows:
#   * what prod, test A and test B executed (by kind, with the test servers' new statement
#     errors) and the work fidelity of each, once the mirror drained;
#   * A against B: each server's CPU (user/system) and context switches over the load, read from
#     its mariadbd's /proc (the lab's hosts share one kernel, so the hosts' node_exporters, also
#     in the report, see the same machine), and the report's digest-by-digest comparison;
#   * what difference was measured, or that none was beyond the noise on this machine.
# Exits non-zero when either test server's work fidelity is below 0.99 or it had errors
# production did not. Tears the lab down at the end. Run as root on Debian 12.
#
#   DEMO_THREADS=8 DEMO_TIME=20 DEMO_RATE=1500 LAB_NAME=demo ./demo.sh
#   DEMO_B=tz|jemalloc|tcmalloc   what test B changes (default tz: time_zone='+00:00')
#   DEMO_TEST=PATH|oltp_read_only the load (default deploy/lab/ab.lua, TIMESTAMP result sets)
#   DEMO_REPORT=/tmp/tcpshadow-demo-report: where the comparison report (txt, json, html) is kept
set -euo pipefail
cd "$(dirname "$0")"

if [[ $EUID -ne 0 ]]; then
    echo "demo.sh: run as root: sudo $0 (the lab creates network namespaces and runs MariaDB)" >&2
    exit 1
fi
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

DEMO_TEST=${DEMO_TEST:-$PWD/deploy/lab/ab.lua}
DEMO_THREADS=${DEMO_THREADS:-8}
DEMO_TIME=${DEMO_TIME:-20}
DEMO_REPORT=${DEMO_REPORT:-/tmp/tcpshadow-demo-report}
DEMO_B=${DEMO_B:-tz}
# sysbench events per second: production's peak here, which both test servers must keep up with
# on a machine they share with it (at full speed they fall seconds behind, and a server queueing
# commands is compared on its queue, not on the setting).
DEMO_RATE=${DEMO_RATE:-1500}
export LAB_NAME=${LAB_NAME:-demo}
LAB=deploy/lab/lab.sh
BIN=$PWD/target/release

# Test A is the baseline; test B differs in one thing.
export LAB_TEST2=1 LAB_TEST_MYSQLD_ARGS=--default-time-zone=SYSTEM
case $DEMO_B in
tz)
    export LAB_TEST2_MYSQLD_ARGS=--default-time-zone=+00:00
    B_CHANGE="time_zone='+00:00' (A: SYSTEM)"
    ;;
jemalloc | tcmalloc)
    export LAB_TEST2_MYSQLD_ARGS=--default-time-zone=SYSTEM
    lib=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
    [[ $DEMO_B == tcmalloc ]] && lib=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    export LAB_TEST2_PRELOAD=$lib
    B_CHANGE="$DEMO_B preloaded (A: glibc malloc); both time_zone=SYSTEM"
    ;;
*)
    echo "demo.sh: DEMO_B is tz, jemalloc or tcmalloc, not '$DEMO_B'" >&2
    exit 2
    ;;
esac

# What each server executed (lab.sh work: counters by kind, statement errors) into a file;
# bin/work-compare compares four of them, as the lab tests do (tests/src/work.rs).
snapshot() { "$LAB" work "$1" >"$LAB_DIR/work-$1-$2"; }
compare() { # compare HOST LABEL [work-compare options]: prod 0->1 against HOST 0->LABEL
    local host=$1 label=$2
    shift 2
    "$BIN/work-compare" "$LAB_DIR/work-prod-0" "$LAB_DIR/work-prod-1" \
        "$LAB_DIR/work-$host-0" "$LAB_DIR/work-$host-$label" "$@"
}

# A server's mariadbd CPU so far, from /proc/PID/stat (exited threads included): "user_s
# system_s".
cpu_seconds() {
    local pid tick
    tick=$(getconf CLK_TCK)
    pid=$(server_pid "$1")
    awk -v t="$tick" '{ sub(/^.*\) /, ""); printf "%.2f %.2f\n", $12 / t, $13 / t }' "/proc/$pid/stat"
}
server_pid() { local n="LAB_${1^^}_PIDFILE"; cat "${!n}"; }
# Context switches have no process-wide counter in /proc (each thread has its own, gone when it
# exits): every thread's are read twice a second into FILE, a line "round" after each reading.
switch_sampler() { # switch_sampler HOST FILE, until killed
    local pid f
    pid=$(server_pid "$1")
    while :; do
        for f in /proc/"$pid"/task/*/status; do
            awk -v tid="${f//[^0-9]/}" '/^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { n = $2 }
                END { if (v != "") print tid, v, n }' "$f" 2>/dev/null || true
        done >>"$2"
        echo round >>"$2"
        sleep 0.5
    done
}
# Switches over the sampled window, "voluntary nonvoluntary": per thread, its last reading minus
# its first; a thread first seen after the first round was born in the window and counts from
# 0. A thread that exits loses at most its last half second.
switches() { # switches FILE
    awk '$1 == "round" { r++; next }
         !($1 in fv) { fv[$1] = (r == 0 ? $2 : 0); fn[$1] = (r == 0 ? $3 : 0) }
         { lv[$1] = $2; ln[$1] = $3 }
         END { for (t in lv) { v += lv[t] - fv[t]; n += ln[t] - fn[t] }; print v + 0, n + 0 }' "$1"
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

echo "==> lab '$LAB_NAME': test A and test B differ in: $B_CHANGE"
SAMPLERS=()
trap 'kill "${SAMPLERS[@]}" 2>/dev/null || true; stop_mirror; "$LAB" down' EXIT
"$LAB" up
eval "$("$LAB" env)"
"$LAB" status
for h in prod test test2; do "$LAB" sql "$h" <deploy/lab/ab-schema.sql >/dev/null; done
A_METRICS=$("$LAB" node-exporter test)
B_METRICS=$("$LAB" node-exporter test2)

# The test servers keep their own accounts: the copier logs every mirrored session in with the
# test server's scramble, from the passwords valid there (a file only root may read).
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"

echo "==> mirror: intercept on assist ($LAB_ASSIST_IP), copier on prod ($LAB_PROD_IP) --tee -> test A ($LAB_TEST_IP) and test B ($LAB_TEST2_IP)"
"$LAB" exec assist "$BIN/intercept" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --listen "$LAB_ASSIST_IP:36524" >"$LAB_DIR/intercept.log" 2>&1 &
INTERCEPT_PID=$!
sleep 0.5
"$LAB" exec prod "$BIN/copier" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
    --tee --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --target "$LAB_TEST2_IP:$LAB_MYSQL_PORT" \
    --client-ip-pool "$LAB_POOL" --intercept "$LAB_ASSIST_IP:36524" \
    --mysql-credentials "$CREDENTIALS" --mysql-default-user "$LAB_USER" \
    --target-metrics "$A_METRICS" --target-metrics "$B_METRICS" \
    --report "$LAB_DIR/report" --compare-results \
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

for h in prod test test2; do snapshot "$h" 0; done
read -r a_u0 a_s0 <<<"$(cpu_seconds test)"
read -r b_u0 b_s0 <<<"$(cpu_seconds test2)"
switch_sampler test "$LAB_DIR/switches-test" &
SAMPLERS=($!)
switch_sampler test2 "$LAB_DIR/switches-test2" &
SAMPLERS+=($!)
t0=$(date +%s.%N)

echo "==> load: sysbench $(basename "$DEMO_TEST"), $DEMO_THREADS threads, ${DEMO_TIME}s at $DEMO_RATE/s, client -> prod (mirrored to test A and test B)"
"$LAB" load --test "$DEMO_TEST" --threads "$DEMO_THREADS" --time "$DEMO_TIME" --rate="$DEMO_RATE" |
    grep -E 'queries:|transactions:|errors:|95th'
snapshot prod 1

echo "==> drain: waiting up to 10 s for both test servers to finish what was mirrored"
for _ in $(seq 40); do
    snapshot test 1
    snapshot test2 1
    compare test 1 --min 0.999 --max 1.001 >/dev/null && compare test2 1 --min 0.999 --max 1.001 >/dev/null && break
    sleep 0.25
done
read -r a_u1 a_s1 <<<"$(cpu_seconds test)"
read -r b_u1 b_s1 <<<"$(cpu_seconds test2)"
t1=$(date +%s.%N)
kill "${SAMPLERS[@]}" 2>/dev/null || true
wait "${SAMPLERS[@]}" 2>/dev/null || true
read -r av an <<<"$(switches "$LAB_DIR/switches-test")"
read -r bv bn <<<"$(switches "$LAB_DIR/switches-test2")"
stop_mirror
snapshot test 1
snapshot test2 1

echo
echo "==> copier summary"
sed -n '/copier summary/,$p' "$LAB_DIR/copier.log"

# The lab directory goes with the lab: keep the comparison report where the user can open it.
if [[ -f $LAB_DIR/report/report.txt ]]; then
    rm -rf "$DEMO_REPORT" && mkdir -p "$DEMO_REPORT" && cp "$LAB_DIR"/report/report.* "$DEMO_REPORT"/
    echo "==> comparison report: test A vs test B, digest by digest (all of it, with prod vs each and charts: $DEMO_REPORT/report.{txt,html})"
    sed -n '/^A\/B: /,$p' "$DEMO_REPORT/report.txt" | cut -c1-200
    echo
    echo "==> the test hosts as their node_exporters saw them (this lab's hosts share one kernel: both read the same machine)"
    sed -n '/^Resources per target/,/^$/p' "$DEMO_REPORT/report.txt"
else
    echo "==> no comparison report was written (see $LAB_DIR/copier.log above)" >&2
fi

echo "==> what each server executed during the load"
status=0
for h in test test2; do
    echo "  -- $h"
    compare "$h" 1 --copier-log "$LAB_DIR/copier.log" || status=$?
done

echo
echo "==> test A vs test B over the load and drain (each mariadbd's /proc; B: $B_CHANGE)"
awk -v secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    -v au="$(awk -v a="$a_u0" -v b="$a_u1" 'BEGIN { print b - a }')" -v as="$(awk -v a="$a_s0" -v b="$a_s1" 'BEGIN { print b - a }')" \
    -v bu="$(awk -v a="$b_u0" -v b="$b_u1" 'BEGIN { print b - a }')" -v bs="$(awk -v a="$b_s0" -v b="$b_s1" 'BEGIN { print b - a }')" \
    -v av="$av" -v an="$an" -v bv="$bv" -v bn="$bn" 'BEGIN {
    printf "  %-30s %12s %12s %8s\n", "", "test A", "test B", "B/A"
    row("CPU user, % of one core", 100 * au / secs, 100 * bu / secs)
    row("CPU system, % of one core", 100 * as / secs, 100 * bs / secs)
    row("context switches /s", (av + an) / secs, (bv + bn) / secs)
    row("  of them voluntary /s", av / secs, bv / secs)
    printf "  over %.1f s\n", secs
    # Two runs of one build on this lab differ by a few per cent: call less than 10 % noise.
    d = (as > 0) ? bs / as : 0; c = (av + an > 0) ? (bv + bn) / (av + an) : 0
    if (d > 1.1 || d < 0.9 || c > 1.1 || c < 0.9)
        printf "  measured: test B used %.2fx test A'\''s system CPU and %.2fx its context switches (one run: identical servers differed by up to 8 %% here; repeat it before trusting less than 20 %%)\n", d, c
    else
        printf "  measured: no difference beyond 10 %% in system CPU or context switches on this machine (B/A %.2f and %.2f)\n", d, c
}
function row(label, a, b) { printf "  %-30s %12.1f %12.1f %8s\n", label, a, b, (a > 0 ? sprintf("%.2fx", b / a) : "-") }'

if ((status != 0)); then
    echo "demo: a test server did not execute what production did (work fidelity below 0.99, or new errors): see above" >&2
    exit 1
fi
