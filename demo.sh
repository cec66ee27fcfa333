#!/usr/bin/env bash
# tcpshadow demo: installs what is needed, builds, brings up a lab (client, prod, test, assist),
# runs a sysbench load from the client against prod, shows what prod and test executed, and tears
# the lab down again. Run as root on Debian 12.
#
#   DEMO_TEST=oltp_read_only DEMO_THREADS=8 DEMO_TIME=10 LAB_NAME=demo ./demo.sh
set -euo pipefail
cd "$(dirname "$0")"

if [[ $EUID -ne 0 ]]; then
    echo "demo.sh: run as root: sudo $0 (the lab creates network namespaces and runs MariaDB)" >&2
    exit 1
fi
[[ -d $HOME/.cargo/bin ]] && export PATH=$HOME/.cargo/bin:$PATH

DEMO_TEST=${DEMO_TEST:-oltp_read_only}
DEMO_THREADS=${DEMO_THREADS:-8}
DEMO_TIME=${DEMO_TIME:-10}
export LAB_NAME=${LAB_NAME:-demo}
LAB=deploy/lab/lab.sh

# Counters worth comparing between prod and test.
SHOWN=(Questions Com_select Com_stmt_prepare Com_stmt_execute Com_begin Com_commit
    Com_insert Com_update Com_delete Connections Bytes_received)

counters() { # counters HOST VAR: fill the associative array VAR with HOST's counters
    local -n into=$2
    local name value
    while read -r name value; do
        # shellcheck disable=SC2034 # into is a nameref
        into["$name"]=$value
    done < <("$LAB" counters "$1")
}

echo "==> dependencies"
./scripts/install-deps.sh

echo "==> build"
cargo build --workspace --release

echo "==> lab '$LAB_NAME'"
trap '"$LAB" down' EXIT
"$LAB" up
eval "$("$LAB" env)"
"$LAB" status

declare -A prod0 test0 prod1 test1
counters prod prod0
counters test test0

# The mirror starts here: intercept on assist ($LAB_ASSIST_NS, capturing test's replies), then the
# copier on prod ($LAB_PROD_NS) mirroring port $LAB_MYSQL_PORT from the clients to $LAB_TEST_IP.

echo "==> load: sysbench $DEMO_TEST, $DEMO_THREADS threads, ${DEMO_TIME}s, client -> prod"
"$LAB" load --test "$DEMO_TEST" --threads "$DEMO_THREADS" --time "$DEMO_TIME"

# With the mirror running: let test drain, then stop copier and intercept here.

counters prod prod1
counters test test1

echo
echo "==> what the servers executed during the load (counter deltas)"
printf '%-20s %14s %14s\n' counter "prod $LAB_PROD_IP" "test $LAB_TEST_IP"
for c in "${SHOWN[@]}"; do
    printf '%-20s %14s %14s\n' "$c" $((prod1[$c] - prod0[$c])) $((test1[$c] - test0[$c]))
done

# Between two `lab.sh counters` calls, Questions also counts the first call's COM_QUIT and the
# second call's SHOW STATUS (local socket, never mirrored): 2 to subtract.
prod_q=$((prod1[Questions] - prod0[Questions] - 2))
test_q=$((test1[Questions] - test0[Questions] - 2))
echo
echo "==> summary"
echo "prod executed $prod_q statements in ${DEMO_TIME}s ($((prod_q / DEMO_TIME))/s)"
echo "test executed $test_q statements"
if ((prod_q > 0)); then
    awk -v t="$test_q" -v p="$prod_q" 'BEGIN { printf "test/prod: %.2f\n", t / p }'
fi
echo "(the mirror is under construction: until copier and intercept run here, test executes nothing)"
