#!/usr/bin/env bash
# Lab benchmark of the whole mirror path. For each sysbench thread count it runs the load RUNS
# times, each time with intercept and the copier started afresh, and reports per run: prod's
# queries, the work fidelity (executed work by kind, tests/src/work.rs through bin/work-compare)
# when the load ended and after a drain of at most 10 s, the statement errors the test server
# had that production did not, the CPU the copier spent per captured packet and intercept per relayed
# packet (user and system separately, as below; µs per packet = CPU-seconds per
# million packets), kernel capture drops and both daemons' peak RSS (VmHWM); on stderr also
# intercept's kernel drops and the sessions whose reply framing it lost. --stall-intercept-ms
# stops intercept (SIGSTOP) that long halfway through each load: how much its capture holds.
#
# What the mirror costs (issue 20), per production query over the load: each daemon's CPU (all
# its threads: the scheduler's exact total from /proc/PID/task/*/schedstat, split into user and
# system by perf's samples, or by /proc/PID/stat's ticks without perf), its context switches
# per second (voluntary + involuntary: its wakeups), and its system calls per query (`perf stat
# -e raw_syscalls:sys_enter`, which needs tracefs: mounted for the run if it is not, and "-"
# where perf cannot count). The lab's CPU pinning is off by default here (LAB_PIN=0): a real copier is a service of its own beside
# mysqld, not pinned to production's saturated core; LAB_PIN=1 measures the pinned variant.
#
# The lab's share of the copier's CPU: a packet sent into a veth is received at once, in the
# sender's own softirq, so the test host's whole receive path (bridge, IP, TCP, waking its
# mysqld threads) runs on the copier's time, as intercept's on the copier's for the control
# channel; on a real network that is another machine's. `perf record -g` samples the copier
# over the load and the share of its samples under `net_rx_action` is that path: a column
# gives the copier's CPU per query with it taken out ("-" without perf).
#
# The load's shape: the last two columns give each server's own CPU (all its threads) and its
# voluntary context switches (a thread waited: for its client's next command, mostly) per query
# it ran over the same window, production's against the test server's. Equal work is not an
# equal load: a copier that hands the test server a session's commands together (all it
# captured in one block) spares the test server's threads the wait before each command, which
# production's pay, and the system time that goes with it.
#
#   bench/mirror.sh [--threads "2 8 32"] [--time 30] [--runs 3] [--test oltp_read_only]
#                   [--copier-args "..."] [--intercept-args "..."] [--sysbench-args "..."]
#                   [--stall-intercept-ms MS] [--warmup S]
#
# --warmup S measures the cost columns (CPU per query, wakeups, system calls, perf's samples)
# from S seconds into the load, once every connection is up, to its end: the steady state. A
# sysbench client opens its connections and prepares its statements at its start (1,000
# connections: 1,000 logins and 22,000 prepares, which a 15 s load at 500 tx/s dilutes over
# only 120 commands a connection), and without it that start is in every per-query figure.
# Fidelity, drops and the query count cover the whole load as always; the per-packet columns
# read "-" (the capture's packet count is the whole run's).
#
# Every run is a line on stderr; stdout is a Markdown table with one line per thread count
# holding the MEDIAN of each column over the runs. A thread count is also a connection count
# (sysbench opens one per thread), so --threads 1000 is the 1,000-connection run.
# Run as root. Builds the release binaries (COPIER_BIN, INTERCEPT_BIN: run other builds instead),
# brings up its own lab (LAB_NAME, default bench) and
# tears it down; each run's daemon and sysbench logs (and perf recordings) are kept in BENCH_LOGS
# (/tmp/tcpshadow-bench-logs/THREADS-RUN/), with the test server's failed statements of a run that
# had new errors on test (test-errors.txt: the test server's sql_errlog lines of the run, the last
# 10,000 statements' errors, errors by digest, InnoDB's deadlock and lock wait timeout counts).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

THREADS="2 8 32"
TIME=30
RUNS=3
TEST=oltp_read_only
COPIER_ARGS=""
INTERCEPT_ARGS=""
SYSBENCH_ARGS=""
STALL_MS=0
WARMUP=0
while (($# > 0)); do
    case $1 in
    --threads) THREADS=$2 && shift 2 ;;
    --time) TIME=$2 && shift 2 ;;
    --runs) RUNS=$2 && shift 2 ;;
    --test) TEST=$2 && shift 2 ;;
    --copier-args) COPIER_ARGS=$2 && shift 2 ;;
    --intercept-args) INTERCEPT_ARGS=$2 && shift 2 ;;
    --sysbench-args) SYSBENCH_ARGS=$2 && shift 2 ;;
    --stall-intercept-ms) STALL_MS=$2 && shift 2 ;;
    --warmup) WARMUP=$2 && shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench/mirror.sh: unknown argument $1 (see --help)" >&2 && exit 2 ;;
    esac
done
if [[ $EUID -ne 0 ]]; then
    echo "bench/mirror.sh: run as root (the lab creates network namespaces)" >&2
    exit 1
fi
[[ $RUNS =~ ^[1-9][0-9]*$ && $TIME =~ ^[1-9][0-9]*$ && $STALL_MS =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ ]] ||
    { echo "bench/mirror.sh: --runs and --time take positive integers, --stall-intercept-ms and --warmup counts" >&2 && exit 2; }
((WARMUP < TIME)) ||
    { echo "bench/mirror.sh: --warmup $WARMUP leaves nothing of a $TIME s load to measure: make it shorter than --time" >&2 && exit 2; }

export LAB_NAME=${LAB_NAME:-bench} LAB_PIN=${LAB_PIN:-0}
LOGS=${BENCH_LOGS:-/tmp/tcpshadow-bench-logs}
LAB=deploy/lab/lab.sh
BIN=$PWD/target/release
# Another build of a daemon for an A/B comparison (e.g. INTERCEPT_BIN=/tmp/intercept.old).
COPIER_BIN=${COPIER_BIN:-$BIN/copier}
INTERCEPT_BIN=${INTERCEPT_BIN:-$BIN/intercept}
read -r -a COPIER_EXTRA <<<"$COPIER_ARGS"
read -r -a INTERCEPT_EXTRA <<<"$INTERCEPT_ARGS"
read -r -a SYSBENCH_EXTRA <<<"$SYSBENCH_ARGS"

./scripts/install-deps.sh >&2
cargo build --release -p copier -p intercept >&2
cargo build --release -p tcpshadow-tests --bin work-compare >&2
trap '"$LAB" down >&2' EXIT
"$LAB" up >&2
eval "$("$LAB" env)"
# The test server keeps its accounts: the copier rewrites every login (the real path).
CREDENTIALS=$LAB_DIR/test-credentials
printf '%s:%s\n' "$LAB_USER" "$LAB_PASSWORD" >"$CREDENTIALS"
chmod 600 "$CREDENTIALS"
# The test server keeps its last statements with their error numbers: a run with new errors on
# test leaves them in its logs (test-errors.txt), so that a count comes with its cause.
# performance_schema counts errors by kind but keeps their numbers only for the last 10,000
# statements: MariaDB's sql_errlog plugin logs every one (errno, message, statement).
# (The history needs events_statements_current on as well, or it stays empty.)
"$LAB" sql test "UPDATE performance_schema.setup_consumers SET ENABLED = 'YES'
    WHERE NAME IN ('events_statements_current', 'events_statements_history_long')" >&2
"$LAB" sql test "INSTALL SONAME 'sql_errlog'" >&2 || echo "bench/mirror.sh: no sql_errlog plugin" >&2
SQL_ERRLOG=$LAB_TEST_DATADIR/sql_errors.log

# What each server executed (lab.sh work) into a file; work-compare compares four of them.
snapshot() { "$LAB" work "$1" >"$LAB_DIR/work-$1-$2"; }
compare() { # compare TEST_LABEL [options]: prod 0->1 against test 0->TEST_LABEL
    local label=$1
    shift
    "$BIN/work-compare" "$LAB_DIR/work-prod-0" "$LAB_DIR/work-prod-1" \
        "$LAB_DIR/work-test-0" "$LAB_DIR/work-test-$label" "$@"
}
# The figures of a comparison: "work_fidelity new_errors prod_questions".
figures() {
    awk '/^  work fidelity:/ { f = $3 }
        /^  new errors on test:/ { n = 0; for (i = 5; i <= NF; i++) { split($i, kv, "="); n += kv[2] } }
        $1 == "Questions" { q = $2 }
        END { printf "%s %d %d\n", f == "" ? 0 : f, n, q }'
}
cpu_ticks() { # cpu_ticks PID: "utime stime" in clock ticks
    awk '{ print $14, $15 }' "/proc/$1/stat"
}
# CPU time of every thread of PID, in ns, from the scheduler's own clock (schedstat's first
# field): exact, where /proc/PID/stat's ticks are a sample taken at each timer tick, and a
# daemon that wakes in step with the ticks (a capture ring's block timer) is sampled askew.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%d", s }'; }
# Context switches of every thread of PID, voluntary (it waited: a wakeup) and involuntary.
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }'; }
# Voluntary switches only: how often PID's threads waited for something (a server thread: for
# its client's next command). Involuntary ones tell the CPU's contention, not the load's shape.
waits() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }'; }
# Questions between two work snapshots of one server.
questions() {
    awk '$1 == "counter" && $2 == "Questions" { q[FILENAME] = $3 }
        END { print q[ARGV[2]] - q[ARGV[1]] }' "$1" "$2"
}
# "HOST N cpu-ns waits questions" of both servers now (N: which sample).
server_sample() {
    local h p
    for h in prod test; do
        p=$(cat "$LAB_DIR/$h/mysqld.pid" 2>/dev/null) || continue
        echo "$h $1 $(cpu_ns "$p") $(waits "$p") $("$LAB" sql "$h" "SHOW GLOBAL STATUS LIKE 'Questions'" | awk '{ print $2 }')"
    done
}
# From server_sample's two samples: "prod-cpu-us test-cpu-us prod-waits test-waits" per query
# each server ran between them (-1 each without both samples).
server_costs() {
    awk '{ c[$1, $2] = $3; w[$1, $2] = $4; q[$1, $2] = $5 }
        function per(x, h) { d = q[h, 1] - q[h, 0]; return d > 0 && ((h, 0) in x) ? (x[h, 1] - x[h, 0]) / d : -1 }
        END {
            pc = per(c, "prod"); tc = per(c, "test")
            printf "%.2f %.2f %.3f %.3f", pc < 0 ? -1 : pc / 1000, tc < 0 ? -1 : tc / 1000, per(w, "prod"), per(w, "test")
        }' "$1" 2>/dev/null || echo "-1 -1 -1 -1"
}
# System calls need the raw_syscalls tracepoint, hence tracefs.
PERF_SYSCALLS=""
if command -v perf >/dev/null 2>&1; then
    if [[ ! -e /sys/kernel/tracing/events/raw_syscalls ]] && mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; then
        echo "bench/mirror.sh: mounted tracefs on /sys/kernel/tracing for the run (perf's syscall count needs it)" >&2
        trap '"$LAB" down >&2; umount /sys/kernel/tracing 2>/dev/null || true' EXIT
    fi
    perf stat -e raw_syscalls:sys_enter -x, -- true >/dev/null 2>&1 && PERF_SYSCALLS=1
fi
[[ -n $PERF_SYSCALLS ]] || echo "bench/mirror.sh: perf cannot count system calls here: those columns read -" >&2
# perf record works without tracefs; the receive-path share needs call chains of kernel frames.
PERF_RECORD=""
command -v perf >/dev/null 2>&1 && perf record -F 99 -g -o /dev/null -- true >/dev/null 2>&1 && PERF_RECORD=1
# The fraction of a recording's samples with net_rx_action on their stack (-1: none read).
rx_share() {
    perf report -i "$1" --children --sort sym --stdio --no-call-graph 2>/dev/null |
        awk '$NF == "net_rx_action" { v = $1 } END { sub("%", "", v); print (v == "" ? 0 : v / 100) }'
}
# The fraction of a recording's samples taken in user space.
user_share() {
    perf report -i "$1" --no-children --sort dso --stdio 2>/dev/null |
        awk '/^ *[0-9.]+%/ { v = $1; sub("%", "", v); all += v; if ($2 != "[kernel.kallsyms]") u += v }
             END { if (all > 0) printf "%.4f", u / all }'
}
# split_us NS USER_SHARE UTICKS STICKS: "user_us sys_us" of NS nanoseconds.
split_us() {
    awk -v ns="$1" -v share="$2" -v ut="$3" -v st="$4" 'BEGIN {
        if (share == "") share = (ut + st > 0 ? ut / (ut + st) : 0)
        printf "%.0f %.0f\n", ns / 1000 * share, ns / 1000 * (1 - share) }'
}
syscalls_in() { awk -F, '$3 ~ /raw_syscalls:sys_enter/ { n = $1 } END { print (n == "" ? -1 : n) }' "$1"; }
peak_rss_mib() { awk '$1 == "VmHWM:" { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
# The process run by `lab.sh exec` is the program itself (exec chain), so $! is its pid.
stop() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
}

# One run: prints "prod_queries fidelity_at_end fidelity new_errors copier_user_us copier_sys_us icpt_user_us icpt_sys_us
# drops copier_rss icpt_rss captured relayed icpt_drops icpt_framing_lost" (µs per packet), then
# "copier_user_us_q copier_sys_us_q icpt_user_us_q icpt_sys_us_q copier_wakeups_s icpt_wakeups_s
# copier_syscalls_q icpt_syscalls_q" (per production query; -1: not counted).
one_run() {
    local threads=$1
    "$LAB" service assist "$INTERCEPT_BIN" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
        --listen "$LAB_ASSIST_IP:36524" --status-interval 0 "${INTERCEPT_EXTRA[@]}" \
        >"$LAB_DIR/intercept.log" 2>&1 &
    local ipid=$!
    sleep 0.5
    "$LAB" service prod "$COPIER_BIN" --port "$LAB_MYSQL_PORT" --interface "$LAB_IFACE" \
        --target "$LAB_TEST_IP:$LAB_MYSQL_PORT" --intercept "$LAB_ASSIST_IP:36524" \
        --mysql-credentials "$CREDENTIALS" --status-interval 0 "${COPIER_EXTRA[@]}" \
        >"$LAB_DIR/copier.log" 2>&1 &
    local cpid=$!
    local up=""
    for _ in $(seq 100); do
        grep -q "control channel to intercept is up" "$LAB_DIR/copier.log" && up=1 && break
        kill -0 "$cpid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $up ]]; then
        echo "bench/mirror.sh: the copier did not connect to intercept; its log:" >&2
        tail -20 "$LAB_DIR/copier.log" >&2
        tail -20 "$LAB_DIR/intercept.log" >&2
        exit 1
    fi
    snapshot prod 0
    snapshot test 0
    local errlog0
    errlog0=$(stat -c %s "$SQL_ERRLOG" 2>/dev/null || echo 0)
    if ((STALL_MS > 0)); then
        # intercept without a CPU for STALL_MS in the middle of the load (a saturated assist
        # host): what its capture queue cannot hold meanwhile the kernel drops.
        (sleep $((TIME / 2)) && kill -STOP "$ipid" && sleep "$(awk -v m="$STALL_MS" 'BEGIN { print m / 1000 }')" &&
            kill -CONT "$ipid") &
    fi
    "$LAB" load --test "$TEST" --threads "$threads" --time "$TIME" -- "${SYSBENCH_EXTRA[@]}" \
        >"$LAB_DIR/sysbench-$threads.log" 2>&1 &
    local load=$!
    local from=0
    if ((WARMUP > 0)); then
        sleep "$WARMUP"
        snapshot prod w
        from=w
    fi
    # The servers' own cost per query they ran over the same span: how the test server ran what
    # it was sent against how production ran it (the load's shape: a mirror that hands the test
    # server a session's commands together spares it the wait for each, which production's
    # threads pay). Sampled while every connection is up: a server thread's counters leave with
    # it when its connection closes (1,000 connections at the load's end).
    local span=$((TIME - WARMUP - 2)) sampler=""
    rm -f "$LAB_DIR/servers.txt"
    if ((span >= 3)); then
        (
            server_sample 0
            sleep "$span"
            server_sample 1
        ) >"$LAB_DIR/servers.txt" 2>/dev/null &
        sampler=$!
    fi
    read -r cu0 cs0 < <(cpu_ticks "$cpid")
    read -r iu0 is0 < <(cpu_ticks "$ipid")
    local cn0 in0
    cn0=$(cpu_ns "$cpid")
    in0=$(cpu_ns "$ipid")
    local cw0 iw0 t0 cperf iperf
    cw0=$(switches "$cpid")
    iw0=$(switches "$ipid")
    t0=$(date +%s.%N)
    # Children of this shell (not of a command substitution's), so that `wait` below waits
    # for them to write their counts after SIGINT.
    cperf="" iperf="" crec="" irec=""
    if [[ -n $PERF_RECORD ]]; then
        perf record -F 499 -g -p "$cpid" -o "$LAB_DIR/copier.perf" >/dev/null 2>&1 &
        crec=$!
        perf record -F 499 -p "$ipid" -o "$LAB_DIR/intercept.perf" >/dev/null 2>&1 &
        irec=$!
    fi
    if [[ -n $PERF_SYSCALLS ]]; then
        perf stat -e raw_syscalls:sys_enter -x, -o "$LAB_DIR/copier-syscalls.csv" -p "$cpid" >/dev/null 2>&1 &
        cperf=$!
        perf stat -e raw_syscalls:sys_enter -x, -o "$LAB_DIR/intercept-syscalls.csv" -p "$ipid" >/dev/null 2>&1 &
        iperf=$!
    fi
    if ! wait "$load"; then
        echo "bench/mirror.sh: sysbench failed at $threads threads; the end of its log:" >&2
        tail -5 "$LAB_DIR/sysbench-$threads.log" >&2
        exit 1
    fi
    [[ -z $sampler ]] || wait "$sampler" || true
    snapshot prod 1
    snapshot test end
    local at_end fidelity errors prod_q
    read -r at_end _ _ < <( (compare end --min 0 --max 1e9 || true) | figures)
    # Until the test server has run all of it: stopped at 0.999, a test server still finishing
    # its last transactions read as a loss of a few hundredths of a per cent (0.99968 in one
    # run of issue 20's eleventh session, with nothing lost).
    for _ in $(seq 40); do
        snapshot test 1
        compare 1 --min 1 --max 1.001 >/dev/null && break
        sleep 0.25
    done
    read -r fidelity errors prod_q < <( (compare 1 || true) | tee "$LAB_DIR/work-compare.txt" | figures)
    local servers
    servers=$(server_costs "$LAB_DIR/servers.txt")
    # The queries the cost columns are divided by: the whole load's, or those after --warmup.
    local cost_q=$prod_q
    if [[ $from != 0 ]]; then
        cost_q=$(questions "$LAB_DIR/work-prod-$from" "$LAB_DIR/work-prod-1")
    fi
    read -r cu1 cs1 < <(cpu_ticks "$cpid")
    read -r iu1 is1 < <(cpu_ticks "$ipid")
    local cn1 in1
    cn1=$(cpu_ns "$cpid")
    in1=$(cpu_ns "$ipid")
    local cw1 iw1 t1 csc=-1 isc=-1
    cw1=$(switches "$cpid")
    iw1=$(switches "$ipid")
    t1=$(date +%s.%N)
    for p in $cperf $iperf $crec $irec; do kill -INT "$p" 2>/dev/null || true; done
    for p in $cperf $iperf $crec $irec; do wait "$p" 2>/dev/null || true; done
    if [[ -n $cperf ]]; then
        csc=$(syscalls_in "$LAB_DIR/copier-syscalls.csv")
        isc=$(syscalls_in "$LAB_DIR/intercept-syscalls.csv")
    fi
    local rx=-1 cuser="" iuser=""
    if [[ -n $crec ]]; then
        rx=$(rx_share "$LAB_DIR/copier.perf")
        cuser=$(user_share "$LAB_DIR/copier.perf")
        iuser=$(user_share "$LAB_DIR/intercept.perf")
    fi
    # Each daemon's CPU in µs: the scheduler's exact total, split into user and system by
    # perf's samples (a timer of the daemon's own running time, not the tick's), or by the
    # ticks' split without perf.
    read -r cu cs < <(split_us $((cn1 - cn0)) "$cuser" $((cu1 - cu0)) $((cs1 - cs0)))
    read -r iu is < <(split_us $((in1 - in0)) "$iuser" $((iu1 - iu0)) $((is1 - is0)))
    local crss irss
    crss=$(peak_rss_mib "$cpid")
    irss=$(peak_rss_mib "$ipid")
    stop "$cpid"
    stop "$ipid"
    if ((errors > 0)); then
        # The history keeps the last 10,000 statements only; the digests keep the whole run's
        # error counts, and InnoDB's metrics tell a deadlock or a lock wait timeout.
        "$LAB" sql test "SELECT 'history', MYSQL_ERRNO, EVENT_NAME, IFNULL(MESSAGE_TEXT, ''),
            LEFT(IFNULL(SQL_TEXT, ''), 120) FROM performance_schema.events_statements_history_long
            WHERE MYSQL_ERRNO <> 0;
            SELECT 'digest', SUM_ERRORS, LEFT(IFNULL(DIGEST_TEXT, ''), 120)
            FROM performance_schema.events_statements_summary_by_digest WHERE SUM_ERRORS > 0;
            SELECT 'innodb', NAME, COUNT FROM information_schema.INNODB_METRICS
            WHERE NAME IN ('lock_deadlocks', 'lock_timeouts')" >"$LAB_DIR/test-errors.txt" 2>&1 || true
        tail -c +$((errlog0 + 1)) "$SQL_ERRLOG" 2>/dev/null | sed 's/^/errlog\t/' | cut -c1-300 \
            >>"$LAB_DIR/test-errors.txt" || true
    else
        : >"$LAB_DIR/test-errors.txt"
    fi
    "$LAB" sql test "TRUNCATE performance_schema.events_statements_history_long;
        TRUNCATE performance_schema.events_statements_summary_by_digest" >&2 || true
    local frames drops relayed
    frames=$(sed -n 's/^  captured: \([0-9]*\) frames.*/\1/p' "$LAB_DIR/copier.log" | tail -1)
    drops=$(sed -n 's/^  captured: .* \([0-9]*\) kernel drops$/\1/p' "$LAB_DIR/copier.log" | tail -1)
    relayed=$(sed -n 's/.*final:.* relayed=\([0-9]*\).*/\1/p' "$LAB_DIR/intercept.log" | tail -1)
    local idrops ilost
    idrops=$(sed -n 's/.*final:.* kernel_dropped=\([0-9]*\).*/\1/p' "$LAB_DIR/intercept.log" | tail -1)
    ilost=$(sed -n 's/.*final:.* framing_lost=\([0-9]*\).*/\1/p' "$LAB_DIR/intercept.log" | tail -1)
    awk -v p="$prod_q" -v q="$cost_q" -v pp=$((WARMUP == 0)) -v e="$at_end" -v t="$fidelity" -v ne="$errors" \
        -v cu="$cu" -v cs="$cs" -v iu="$iu" -v is="$is" \
        -v f="${frames:-0}" -v r="${relayed:-0}" -v d="${drops:-0}" \
        -v crss="$crss" -v irss="$irss" -v id="${idrops:-0}" -v il="${ilost:-0}" \
        -v cw=$((cw1 - cw0)) -v iw=$((iw1 - iw0)) -v t0="$t0" -v t1="$t1" -v csc="$csc" -v isc="$isc" \
        -v rx="$rx" -v servers="$servers" 'BEGIN {
        us = 1
        secs = t1 - t0
        # Per packet -1 ("-") after a warmup: the packet counts cover the whole load.
        fp = pp ? f : 0
        rp = pp ? r : 0
        printf "%d %.5f %.5f %d %.3f %.3f %.3f %.3f %d %s %s %d %d %d %d", p, e, t, ne,
            fp ? cu * us / fp : -1, fp ? cs * us / fp : -1, rp ? iu * us / rp : -1, rp ? is * us / rp : -1,
            d, crss, irss, f, r, id, il
        # Parenthesised: a bare > in printf arguments would redirect its output.
        printf " %.3f %.3f %.3f %.3f %.0f %.0f %.3f %.3f %.4f",
            (q ? cu * us / q : 0), (q ? cs * us / q : 0), (q ? iu * us / q : 0), (q ? is * us / q : 0),
            (secs > 0 ? cw / secs : 0), (secs > 0 ? iw / secs : 0),
            (q && csc >= 0 ? csc / q : -1), (q && isc >= 0 ? isc / q : -1), rx
        printf " %s\n", servers }'
}

echo "Each line on stderr is one run: prod-queries work-fidelity-at-end work-fidelity" \
    "new-errors-on-test copier-us/pkt(user sys) intercept-us/pkt(user sys) drops copier-MiB" \
    "intercept-MiB captured relayed intercept-kernel-drops intercept-framing-lost" \
    "copier-us/query(user sys) intercept-us/query(user sys) wakeups/s(copier intercept)" \
    "syscalls/query(copier intercept) copier-receive-path-share" \
    "server-cpu-us/query(prod test) server-waits/query(prod test)" >&2
echo "LAB_PIN=$LAB_PIN (1: the lab's CPU pinning on)" >&2
echo "| test | threads | s | runs | prod queries | work fidelity at end | work fidelity | new errors on test | copier µs/pkt (user + sys) | intercept µs/pkt (user + sys) | kernel drops | peak RSS copier / intercept MiB | copier µs/query (user + sys) | intercept µs/query (user + sys) | wakeups/s copier / intercept | syscalls/query copier / intercept | copier µs/query without the lab's receive path (its share) | server CPU µs/query prod / test | server waits/query prod / test |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for threads in $THREADS; do
    rows=()
    for run in $(seq "$RUNS"); do
        row=$(one_run "$threads") || exit 1
        echo "run $run, $threads threads: $row" >&2
        # Each run's logs outlive the lab, for a look at whatever the table shows.
        mkdir -p "$LOGS/$threads-$run"
        cp "$LAB_DIR"/copier.log "$LAB_DIR"/intercept.log "$LAB_DIR/sysbench-$threads.log" \
            "$LAB_DIR"/work-compare.txt "$LAB_DIR"/test-errors.txt \
            "$LOGS/$threads-$run/" 2>/dev/null || true
        # perf's recordings too (`perf report -i .../copier.perf --no-children`): the profile
        # of the very run the table measured.
        mv "$LAB_DIR"/copier.perf "$LAB_DIR"/intercept.perf "$LOGS/$threads-$run/" 2>/dev/null || true
        rows+=("$row")
    done
    # The median of each column, taken on its own (a run's fidelity and CPU need not come from the
    # same run: the table reports the typical value of each). CPU leads with the median of each
    # run's user + sys: the kernel samples the split per tick, so one run may read 4.4 + 0.2 and
    # the next 1.6 + 3.1 for the same work, while their sum is stable.
    printf '%s\n' "${rows[@]}" | awk -v test="$TEST" -v th="$threads" -v s="$TIME" -v n="$RUNS" '
        { for (i = 1; i <= NF; i++) col[i, NR] = $i; nf = NF }
        function median(c,   k, j, t, a) {
            for (k = 1; k <= NR; k++) a[k] = col[c, k]
            for (k = 2; k <= NR; k++) for (j = k; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) {
                t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        }
        function fig(f, v) { return v < 0 ? "-" : sprintf(f, v) }
        function cpu(sum, u, s) { return sum < 0 ? "-" : sprintf("%.2f (%.2f + %.2f)", sum, u, s) }
        END {
            # Fields 16-24 are per query (see one_run); 31-34 the user + sys sums, 35 the
            # copier'"'"'s sum without its receive-path share (field 24).
            for (k = 1; k <= NR; k++) {
                col[31, k] = col[5, k] + col[6, k]; col[32, k] = col[7, k] + col[8, k]
                col[33, k] = col[16, k] + col[17, k]; col[34, k] = col[18, k] + col[19, k]
                col[35, k] = col[33, k] * (1 - (col[24, k] < 0 ? 0 : col[24, k]))
            }
            rx = median(24)
            csc = median(22); isc = median(23)
            printf "| %s | %d | %d | %d | %d | %.5f | %.5f | %d | %s | %s | %d | %.1f / %.1f | %.2f (%.2f + %.2f) | %.2f (%.2f + %.2f) | %d / %d | %s / %s | %s ",
                test, th, s, n, median(1), median(2), median(3), median(4),
                cpu(median(31), median(5), median(6)), cpu(median(32), median(7), median(8)), median(9),
                median(10), median(11), median(33), median(16), median(17), median(34), median(18), median(19),
                median(20), median(21), (csc < 0 ? "-" : sprintf("%.2f", csc)), (isc < 0 ? "-" : sprintf("%.2f", isc)),
                (rx < 0 ? "-" : sprintf("%.2f (%.0f%%)", median(35), rx * 100))
            printf "| %s / %s | %s / %s |\n", fig("%.1f", median(25)), fig("%.1f", median(26)),
                fig("%.3f", median(27)), fig("%.3f", median(28))
        }'
done
