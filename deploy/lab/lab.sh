#!/usr/bin/env bash
# The LAB_* variables are read indirectly (${!name}, the ENV_VARS list), which shellcheck cannot see.
# shellcheck disable=SC2034
# tcpshadow lab: a small network of "hosts" (network namespaces joined by a Linux bridge that lives
# in its own namespace) with two real MariaDB servers holding identical data.
#
#   <name>-client  load generator (mariadb client, sysbench)      198.18.<i>.10 (+ .11 .12 .13)
#   <name>-prod    MariaDB "production" (+ copier later)          198.18.<i>.2
#   <name>-test    MariaDB "test"; routes the clients via assist  198.18.<i>.3
#   <name>-assist  intercept later; ip_forward=0 (replies die)    198.18.<i>.4
#   <name>-prod2   optional (LAB_PROD2=1 at `up`): a second "production" MariaDB, same data  198.18.<i>.5
#   <name>-test2   optional (LAB_TEST2=1 at `up`): a second "test" MariaDB, same data, routed
#                  as test is (A/B experiments: two test servers with different options)  198.18.<i>.6
#   <name>-br      the bridge br0, one port per host
#
# <i> is the lab index, allocated per lab name (lowest free, 0..255), so several labs can run at once;
# the client pool of lab <i> is 198.19.<i>.0/24 (also routed via assist on test).
# Only 198.18.0.0/15 is used, only inside the lab's own namespaces; the root namespace's network is
# never touched (veths are created directly inside the namespaces).
#
# Run `lab.sh help` for the subcommands. Everything here needs root.
set -euo pipefail

PROG=lab.sh
LAB_SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")

# Bump when the golden data directory's contents change (accounts, schema, prepare method).
GOLDEN_LAYOUT=1
RUN_DIR=${LAB_RUN_DIR:-/run/tcpshadow-lab}
CACHE_DIR=${LAB_CACHE_DIR:-/var/cache/tcpshadow-lab}
BASE_DIR=${LAB_BASE_DIR:-/tmp}
HOSTS=(client prod test assist)
SERVERS=(prod test)

# Tools; each can be overridden (LAB_MARIADBD=/path/to/mariadbd ...), mainly for tests.
MARIADBD=${LAB_MARIADBD:-mariadbd}
INSTALL_DB=${LAB_INSTALL_DB:-mariadb-install-db}
MARIADB=${LAB_MARIADB:-mariadb}
MARIADB_ADMIN=${LAB_MARIADB_ADMIN:-mariadb-admin}
SYSBENCH=${LAB_SYSBENCH:-sysbench}
TCPDUMP=${LAB_TCPDUMP:-tcpdump}
IP=${LAB_IP:-ip}
SS=${LAB_SS:-ss}
ETHTOOL=${LAB_ETHTOOL:-ethtool}
NODE_EXPORTER=${LAB_NODE_EXPORTER:-prometheus-node-exporter}
NODE_EXPORTER_PORT=${LAB_NODE_EXPORTER_PORT:-9100}

START_TIMEOUT=${LAB_START_TIMEOUT:-120}
STOP_TIMEOUT=${LAB_STOP_TIMEOUT:-60}

# ---------------------------------------------------------------------------------------------------
# small helpers

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
info() { printf '%s\n' "$*" >&2; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }

# Quote a value for `KEY='value'` lines (readable by sh `eval` and by simple parsers).
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

now() { printf '%s' "${EPOCHREALTIME:-$(date +%s.%N)}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
    cat <<'EOF'
usage: lab.sh [--name NAME] COMMAND [ARGS...]

The lab name comes from --name or $LAB_NAME (default: tsd); labs with different names run side by side.

commands:
  up                    build the lab: namespaces, bridge, addresses, routes, two MariaDB servers
                        with identical data (idempotent; a stale half-built lab is torn down first)
  down                  stop the servers, delete the namespaces and the lab dir (idempotent)
  status                hosts, addresses, servers; exit status 0 only when the lab is up and healthy
  list                  all labs known on this machine
  env                   print KEY='value' lines describing the lab (eval "$(lab.sh env)")
  exec HOST [CMD...]    run CMD (default: a shell) in HOST's namespace, with the env variables set;
                        HOST is client, prod, test, assist, br (prod2, test2: see LAB_PROD2, LAB_TEST2)
  service HOST CMD...   like exec, in a session of its own, as a daemon of that machine runs (the
                        kernel shares the CPU between sessions, so one in ours would compete
                        with this shell's other children, not with the machine's services)
  load [OPTIONS] [SYSBENCH ARGS...]
                        run sysbench; options: --test oltp_read_only|oltp_read_write|... (default
                        oltp_read_only), --threads N (8), --time S (10), --target
                        prod|prod2|test|test2 (prod), --from HOST (client for prod, the test
                        server itself for test and test2: the client cannot reach them directly);
                        other args go to sysbench (e.g. --report-interval=1)
  counters HOST [--all] SHOW GLOBAL STATUS counters of HOST (a server: prod test prod2 test2) as
                        `name value` lines
  work HOST             what HOST's server executed: `counter NAME VALUE`, `errors EVENT N` (statement
                        errors by kind, performance_schema) and `reads N` lines, for
                        `work-compare` (tests/src/bin/work-compare.rs)
  sql HOST [SQL...]     run SQL (or stdin) as root over HOST's local socket; tab-separated output
  start|stop|restart HOST
                        start/stop the MariaDB server of HOST; start and restart apply the
                        server options of the environment if set ($LAB_MYSQLD_ARGS,
                        $LAB_<HOST>_MYSQLD_ARGS, $LAB_<HOST>_PRELOAD, as at `up`; recorded for
                        later starts), e.g. LAB_TEST2_PRELOAD= lab.sh restart test2 (no preload)
  logs HOST [N]         last N (50) lines of HOST's MariaDB error log
  node-exporter HOST [start|stop]
                        Debian's prometheus-node-exporter in HOST's namespace, in a session of its
                        own, on <HOST's address>:9100 (LAB_NODE_EXPORTER_PORT), collectors cpu,
                        stat, loadavg, meminfo, pressure, schedstat; log and pid in
                        LAB_DIR/HOST/node-exporter.*; `down` stops it. The figures are the whole
                        machine's, not the host's: every namespace shares one kernel, and
                        node_exporter reads its /proc and /sys, so each host's exporter reports
                        the same CPU, load and memory (a server's own CPU: /proc/PID/stat of its
                        mariadbd). test and test2 answer prod and assist, not the client (their
                        replies to the client's addresses go to assist)

environment for `up` (defaults in brackets):
  LAB_NAME [tsd]  LAB_TABLES [4]  LAB_TABLE_SIZE [20000]  LAB_MYSQL_PORT [3306]
  LAB_MAX_CONNECTIONS [2000]  LAB_START_TIMEOUT [120]  LAB_BASE_DIR [/tmp]
  LAB_CACHE_DIR [/var/cache/tcpshadow-lab]  (golden data directories, reused by every `up`)
  LAB_MYSQLD_ARGS       extra mariadbd options for every server (whitespace-separated)
  LAB_PROD_MYSQLD_ARGS  extra options for prod only
  LAB_TEST_MYSQLD_ARGS  extra options for test only, e.g. "--skip-grant-tables"
  LAB_PROD2_MYSQLD_ARGS, LAB_TEST2_MYSQLD_ARGS
                        extra options for prod2, test2; when unset they take prod's, test's (set
                        one empty for none), so a pair differs only where told, e.g.
                        LAB_TEST_MYSQLD_ARGS=--default-time-zone=SYSTEM
                        LAB_TEST2_MYSQLD_ARGS=--default-time-zone=+00:00
  LAB_<HOST>_PRELOAD    libraries to preload into that server only (LD_PRELOAD in its environment;
                        absolute paths, ':' or space separated): for malloc variants
                        /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 (Debian libjemalloc2) or
                        /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 (libtcmalloc-minimal4);
                        prod2 and test2 take prod's, test's when unset, as with the options
  LAB_OFFLOADS [on]     on: veth offloads at the kernel's defaults (TSO/GSO/GRO on, as real NICs);
                        off: every offload off (one segment per packet; the friendlier variant)
  LAB_TLS=1             both servers offer TLS (a self-signed CA and server and client certificates,
                        made with openssl once into LAB_CACHE_DIR, copied to LAB_DIR/tls); `load
                        --mysql-ssl=on` then runs sysbench over TLS (it reads its client files from
                        the current directory, so `load` runs it in LAB_DIR/tls). Default: no TLS
  LAB_PROD2=1           also a second production host prod2 (198.18.<i>.5, its own MariaDB with
                        prod's data and options; `load --target prod2`, `counters prod2`): several
                        copiers sharing one intercept and test server (docs/scaling.md); it
                        routes the client pool via assist, so it can also be a second target
  LAB_TEST2=1           also a second test host test2 (198.18.<i>.6, its own MariaDB with test's
                        data and options unless LAB_TEST2_* say otherwise; routed exactly as test:
                        the clients and the pool via assist): A/B experiments, a copier with
                        --target test and test2 mirroring the same traffic to both
  LAB_MARIADBD, LAB_MARIADB, LAB_SYSBENCH, ...  paths of the tools
EOF
}

# Tool (by its usual name) -> configured path or name, and the Debian package that provides it.
tool_path() {
    case $1 in
    mariadbd) echo "$MARIADBD" ;;
    mariadb-install-db) echo "$INSTALL_DB" ;;
    mariadb) echo "$MARIADB" ;;
    mariadb-admin) echo "$MARIADB_ADMIN" ;;
    sysbench) echo "$SYSBENCH" ;;
    tcpdump) echo "$TCPDUMP" ;;
    ip) echo "$IP" ;;
    ss) echo "$SS" ;;
    ethtool) echo "$ETHTOOL" ;;
    prometheus-node-exporter) echo "$NODE_EXPORTER" ;;
    *) echo "$1" ;;
    esac
}

package_of() {
    case $1 in
    mariadbd | mariadb-install-db) echo mariadb-server ;;
    mariadb | mariadb-admin) echo mariadb-client ;;
    sysbench) echo sysbench ;;
    tcpdump) echo tcpdump ;;
    ip | ss) echo iproute2 ;;
    ethtool) echo ethtool ;;
    prometheus-node-exporter) echo prometheus-node-exporter ;;
    sysctl) echo procps ;;
    flock | setsid) echo util-linux ;;
    *) echo "the package providing $1" ;;
    esac
}

have_tool() {
    if [[ $1 == */* ]]; then [[ -x $1 && ! -d $1 ]]; else command -v "$1" >/dev/null 2>&1; fi
}

need_tools() { # need_tools TOOL... (usual names; paths from LAB_MARIADBD etc.)
    local t p msg="" pkgs=()
    for t in "$@"; do
        p=$(tool_path "$t")
        have_tool "$p" && continue
        msg+="${msg:+; }$t not found ($p): install the Debian package $(package_of "$t")"
        pkgs+=("$(package_of "$t")")
    done
    [[ -z $msg ]] && return 0
    die "$msg -- run: apt-get install ${pkgs[*]}  (or scripts/install-deps.sh)"
}

need_root() {
    if [[ $EUID -ne 0 ]]; then
        die "run as root: sudo $0 ${LAB_ARGV[*]} (the lab creates network namespaces and runs MariaDB servers)"
    fi
}

validate_name() {
    [[ $LAB_NAME =~ ^[a-z][a-z0-9-]{0,14}$ ]] ||
        die "bad lab name '$LAB_NAME': use 1-15 characters a-z 0-9 -, starting with a letter"
}

# Names derived from the lab name (valid whether the lab is up or not).
set_names() {
    validate_name
    LAB_DIR=$BASE_DIR/tcpshadow-lab-$LAB_NAME
    LAB_ENV_FILE=$LAB_DIR/lab.env
    LAB_CLIENT_NS=$LAB_NAME-client
    LAB_PROD_NS=$LAB_NAME-prod
    LAB_TEST_NS=$LAB_NAME-test
    LAB_ASSIST_NS=$LAB_NAME-assist
    LAB_BR_NS=$LAB_NAME-br
    LAB_PROD2_NS=$LAB_NAME-prod2
    LAB_TEST2_NS=$LAB_NAME-test2
    LAB_IFACE=eth0
    LAB_BRIDGE=br0
    # Accounts created in the golden data directory (part of its layout: bump GOLDEN_LAYOUT).
    LAB_DB=sbtest
    LAB_USER=sbtest
    LAB_PASSWORD=sbtest
    LAB_RO_USER=tsd_ro
    LAB_RO_PASSWORD=tsd_ro
    LAB_ROOT_USER=root # over the local socket only, no password
    LAB_MYSQL_PORT=${LAB_MYSQL_PORT:-3306}
    LAB_TABLES=${LAB_TABLES:-4}
    LAB_TABLE_SIZE=${LAB_TABLE_SIZE:-20000}
    LAB_MAX_CONNECTIONS=${LAB_MAX_CONNECTIONS:-2000}
}

# Whitespace-separated words of all arguments, joined by single spaces (no quote processing).
join_words() {
    local -a w=()
    read -r -a w <<<"$*" || true
    printf '%s' "${w[*]}"
}

# Optional hosts, each with a MariaDB server of its own from the same golden data, enabled by
# LAB_<HOST>=1 at `up`:
#   prod2  a second production host (several copiers sharing one intercept and test server);
#   test2  a second test server (A/B experiments: the same mirrored traffic, other options).
# Decided once, before anything reads HOSTS or SERVERS: from the environment at `up`, afterwards
# from what the lab has (its recorded env or its namespace), so `down` removes them whatever the
# caller's environment says.
OPTIONAL_HOSTS=(prod2 test2)
LAB_PROD2=${LAB_PROD2:-0}
LAB_TEST2=${LAB_TEST2:-0}

is_optional() { [[ " ${OPTIONAL_HOSTS[*]} " == *" $1 "* ]]; }
has_optional() { # has_optional HOST: this lab has the optional HOST
    local flag
    flag=LAB_$(uc "$1")
    [[ ${!flag:-0} == 1 ]]
}
need_optional() {
    has_optional "$1" || die "this lab has no $1 (bring the lab up with LAB_$(uc "$1")=1 $PROG up)"
}

enable_optional_hosts() {
    local h flag
    for h in "${OPTIONAL_HOSTS[@]}"; do
        flag=LAB_$(uc "$h")
        [[ ${!flag} == 0 || ${!flag} == 1 ]] || die "$flag must be 0 or 1, not '${!flag}'"
        if [[ ${!flag} != 1 ]] && { grep -qs "^$flag='1'" "$LAB_ENV_FILE" || ns_exists "$LAB_NAME-$h"; }; then
            printf -v "$flag" 1
        fi
        [[ ${!flag} == 1 ]] || continue
        HOSTS+=("$h")
        SERVERS+=("$h")
        ENV_VARS+=("${flag}_IP" "${flag}_NS" "${flag}_IF" "${flag}_MAC" "${flag}_DATADIR" "${flag}_SOCKET"
            "${flag}_PIDFILE" "${flag}_ERRLOG" "${flag}_SERVER_ARGS" "${flag}_SERVER_PRELOAD")
    done
}

# The host an optional one copies its server options from when the environment says nothing.
twin_of() { printf '%s' "${1%2}"; }

ns_of() {
    case $1 in
    client | prod | test | assist | br) ;;
    *)
        is_optional "$1" ||
            die "unknown host '$1' (hosts: client prod test assist br; ${OPTIONAL_HOSTS[*]} when brought up with LAB_<HOST>=1)"
        need_optional "$1"
        ;;
    esac
    printf '%s-%s' "$LAB_NAME" "$1"
}

server_host() {
    case $1 in
    prod | test) ;;
    *)
        is_optional "$1" ||
            die "'$1' runs no MariaDB server (servers: prod test; ${OPTIONAL_HOSTS[*]} when brought up with LAB_<HOST>=1)"
        need_optional "$1"
        ;;
    esac
}

ns_exists() { [[ -e /run/netns/$1 ]]; }
all_ns() {
    local h
    printf '%s\n' "$LAB_CLIENT_NS" "$LAB_PROD_NS" "$LAB_TEST_NS" "$LAB_ASSIST_NS" "$LAB_BR_NS"
    for h in "${OPTIONAL_HOSTS[@]}"; do
        if has_optional "$h"; then printf '%s-%s\n' "$LAB_NAME" "$h"; fi
    done
}

# Upper-case host name, for variable names: prod -> PROD.
uc() { printf '%s' "${1^^}"; }
var() {
    local n=$1
    printf '%s' "${!n}"
}

# The lab's recorded description (written by `up`).
load_lab_env() {
    [[ -f $LAB_ENV_FILE ]] || die "lab '$LAB_NAME' is not up (no $LAB_ENV_FILE); start it with: $0 --name $LAB_NAME up"
    # shellcheck disable=SC1090
    source "$LAB_ENV_FILE"
}

# ---------------------------------------------------------------------------------------------------
# address plan

mac_of() { printf '02:54:53:44:%02x:%02x' "$1" "$2"; } # 02 = locally administered; 54 53 44 = "TSD"

set_plan() {
    local i=$1 h
    LAB_INDEX=$i
    LAB_SUBNET=198.18.$i.0/24
    LAB_PREFIX_LEN=24
    LAB_POOL=198.19.$i.0/24
    LAB_CLIENT_IP=198.18.$i.10
    LAB_CLIENT_IPS="198.18.$i.10 198.18.$i.11 198.18.$i.12 198.18.$i.13"
    LAB_PROD_IP=198.18.$i.2
    LAB_TEST_IP=198.18.$i.3
    LAB_ASSIST_IP=198.18.$i.4
    LAB_PROD2_IP=198.18.$i.5
    LAB_PROD2_MAC=$(mac_of "$i" 5)
    LAB_TEST2_IP=198.18.$i.6
    LAB_TEST2_MAC=$(mac_of "$i" 6)
    LAB_CLIENT_MAC=$(mac_of "$i" 10)
    LAB_PROD_MAC=$(mac_of "$i" 2)
    LAB_TEST_MAC=$(mac_of "$i" 3)
    LAB_ASSIST_MAC=$(mac_of "$i" 4)
    for h in "${HOSTS[@]}"; do
        printf -v "LAB_$(uc "$h")_IF" '%s' "$LAB_IFACE"
    done
    for h in "${SERVERS[@]}"; do
        printf -v "LAB_$(uc "$h")_DATADIR" '%s' "$LAB_DIR/$h/data"
        printf -v "LAB_$(uc "$h")_SOCKET" '%s' "$LAB_DIR/$h/mysqld.sock"
        printf -v "LAB_$(uc "$h")_PIDFILE" '%s' "$LAB_DIR/$h/mysqld.pid"
        printf -v "LAB_$(uc "$h")_ERRLOG" '%s' "$LAB_DIR/$h/error.log"
    done
}

ENV_VARS=(
    LAB_NAME LAB_INDEX LAB_DIR LAB_SCRIPT
    LAB_SUBNET LAB_PREFIX_LEN LAB_POOL
    LAB_CLIENT_IP LAB_CLIENT_IPS LAB_PROD_IP LAB_TEST_IP LAB_ASSIST_IP
    LAB_CLIENT_NS LAB_PROD_NS LAB_TEST_NS LAB_ASSIST_NS LAB_BR_NS
    LAB_IFACE LAB_CLIENT_IF LAB_PROD_IF LAB_TEST_IF LAB_ASSIST_IF LAB_BRIDGE
    LAB_CLIENT_MAC LAB_PROD_MAC LAB_TEST_MAC LAB_ASSIST_MAC
    LAB_MYSQL_PORT LAB_DB LAB_USER LAB_PASSWORD LAB_RO_USER LAB_RO_PASSWORD LAB_ROOT_USER
    LAB_TABLES LAB_TABLE_SIZE LAB_MAX_CONNECTIONS
    LAB_PROD_DATADIR LAB_PROD_SOCKET LAB_PROD_PIDFILE LAB_PROD_ERRLOG
    LAB_TEST_DATADIR LAB_TEST_SOCKET LAB_TEST_PIDFILE LAB_TEST_ERRLOG
    LAB_PROD_SERVER_ARGS LAB_TEST_SERVER_ARGS LAB_PROD_SERVER_PRELOAD LAB_TEST_SERVER_PRELOAD
    LAB_MARIADB_VERSION LAB_GOLDEN LAB_PROD2 LAB_TEST2 LAB_TLS LAB_TLS_DIR
)

write_lab_env() {
    local v tmp=$LAB_ENV_FILE.tmp
    {
        echo "# tcpshadow lab '$LAB_NAME' -- written by lab.sh up"
        for v in "${ENV_VARS[@]}"; do
            printf '%s=%s\n' "$v" "$(shq "${!v-}")"
        done
    } >"$tmp"
    mv "$tmp" "$LAB_ENV_FILE"
}

# Lowest lab index not used by another lab; registry in $RUN_DIR/labs/<name> ("index dir").
# Caller holds the global lock.
alloc_index() {
    local f n idx dir i
    local -A used=()
    mkdir -p "$RUN_DIR/labs"
    for f in "$RUN_DIR/labs"/*; do
        [[ -f $f ]] || continue
        n=${f##*/}
        [[ $n == "$LAB_NAME" ]] && continue
        read -r idx dir <"$f" || true
        if ! ns_exists "$n-br" && [[ ! -d $dir ]]; then
            rm -f "$f" # left behind by a lab that is gone (reboot, killed `up`)
            continue
        fi
        used[$idx]=1
    done
    for ((i = 0; i < 256; i++)); do
        if [[ -z ${used[$i]:-} ]]; then
            printf '%s %s\n' "$i" "$LAB_DIR" >"$RUN_DIR/labs/$LAB_NAME"
            set_plan "$i"
            return 0
        fi
    done
    die "no free lab index (256 labs registered in $RUN_DIR/labs); see: $0 list"
}

# with_lock FILE CMD... : run CMD holding an exclusive flock on FILE. CMD runs in the normal errexit
# context (a failure exits the script, which releases the lock).
with_lock() {
    local file=$1 fd
    shift
    mkdir -p "${file%/*}"
    exec {fd}>"$file"
    flock "$fd"
    "$@"
    exec {fd}>&-
}

# One lab command at a time per lab name (up, down, start/stop): an exclusive flock held until this
# script exits. Servers started while holding it must not inherit the descriptor (see start_server).
LAB_LOCK_FD=""
lock_lab() {
    mkdir -p "$RUN_DIR"
    exec {LAB_LOCK_FD}>"$RUN_DIR/$LAB_NAME.lock"
    if ! flock -w 600 "$LAB_LOCK_FD"; then
        die "another lab.sh command for lab '$LAB_NAME' has held its lock for 10 minutes"
    fi
}

# ---------------------------------------------------------------------------------------------------
# network

nsx() { # nsx NS CMD... : run CMD inside namespace NS
    local ns=$1
    shift
    "$IP" netns exec "$ns" "$@"
}

# CPU placement. Each lab host stands for a machine of its own, but they share this machine's
# cores. Left to float, the scheduler favours prod's threads (they sleep and wake on every
# request) over test's (busy working through the mirrored backlog), so test lags for a reason no
# real deployment has. So each host gets its own CPUs where there are enough: with 2-3 cores,
# client and prod share one and test and assist the other (prod also pays for the copier, as it
# would in production); with 4+, one each. test2 runs on test's CPUs (a fifth of its own with 5+):
# an A/B pair then competes for the same cores on equal terms, neither gets a CPU the other lacks.
# LAB_PIN=0 turns this off, LAB_CPUS_<HOST> overrides.
host_cpus() { # host_cpus HOST: prints a taskset CPU list, or nothing for "no pinning"
    local h=$1 n var
    var="LAB_CPUS_${h^^}"
    if [[ -n ${!var-} ]]; then
        printf '%s' "${!var}"
        return
    fi
    [[ ${LAB_PIN:-1} != 0 ]] || return 0
    n=$(nproc)
    if ((n >= 5)) && [[ $h == test2 ]]; then
        echo 4
    elif ((n >= 4)); then
        case $h in client) echo 0 ;; prod | prod2) echo 1 ;; test | test2) echo 2 ;; assist) echo 3 ;; esac
    elif ((n >= 2)); then
        case $h in client | prod | prod2) echo 0 ;; test | test2 | assist) echo 1 ;; esac
    fi
}

hostx() { # hostx HOST CMD... : run CMD inside HOST's namespace, on HOST's CPUs
    local h=$1 ns cpus
    shift
    ns=$(ns_of "$h")
    cpus=$(host_cpus "$h")
    if [[ -n $cpus ]]; then
        "$IP" netns exec "$ns" taskset -c "$cpus" "$@"
    else
        "$IP" netns exec "$ns" "$@"
    fi
}

ns_sysctl() { # ns_sysctl NS key=value...; keys missing in this kernel are skipped
    local ns=$1 kv
    shift
    for kv in "$@"; do
        local key=${kv%%=*}
        if nsx "$ns" test -e "/proc/sys/${key//.//}"; then
            nsx "$ns" sysctl -qw "$kv" >/dev/null
        fi
    done
}

# NIC offloads. By default each veth end keeps the kernel's defaults (TSO, GSO, GRO and checksum
# offload on), as real NICs have them: the captures then see what real hosts produce, super-frames
# bigger than the MTU and partial checksums, and the mirror must cope. LAB_OFFLOADS=off turns them
# off on every end (one segment per packet, full checksums), the friendlier variant.
offloads_apply() {
    local ns=$1 dev=$2
    [[ ${LAB_OFFLOADS:-on} == off ]] || return 0
    if have_tool "$ETHTOOL"; then
        nsx "$ns" "$ETHTOOL" -K "$dev" tx off tso off gso off gro off >/dev/null 2>&1 ||
            warn "ethtool -K $dev (in $ns) failed; offloads stay at the kernel's defaults"
    else
        warn "ethtool not found (Debian package ethtool): LAB_OFFLOADS=off not applied"
    fi
}

net_up() {
    local h ns ip mac
    for ns in $(all_ns); do
        "$IP" netns add "$ns"
        "$IP" -n "$ns" link set lo up
        # No IPv6: keeps captures free of router solicitations/ND noise.
        ns_sysctl "$ns" net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    done
    # The bridge: plain L2, no STP (ports forward at once), no bridge netfilter.
    "$IP" -n "$LAB_BR_NS" link add "$LAB_BRIDGE" type bridge stp_state 0 forward_delay 0
    ns_sysctl "$LAB_BR_NS" net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-arptables=0
    "$IP" -n "$LAB_BR_NS" link set "$LAB_BRIDGE" up

    for h in "${HOSTS[@]}"; do
        ns=$(var "LAB_$(uc "$h")_NS")
        ip=$(var "LAB_$(uc "$h")_IP")
        mac=$(var "LAB_$(uc "$h")_MAC")
        # Created inside the bridge namespace, peer moved straight into the host: the root
        # namespace never sees these interfaces.
        "$IP" -n "$LAB_BR_NS" link add "$h" type veth peer name "$LAB_IFACE" netns "$ns" address "$mac"
        "$IP" -n "$LAB_BR_NS" link set "$h" master "$LAB_BRIDGE"
        offloads_apply "$LAB_BR_NS" "$h"
        "$IP" -n "$LAB_BR_NS" link set "$h" up

        # rp_filter off: test must accept the copier's packets whose source is a client address,
        # and prod/assist see traffic for/from addresses they do not route that way either.
        ns_sysctl "$ns" net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
        offloads_apply "$ns" "$LAB_IFACE"
        "$IP" -n "$ns" addr add "$ip/$LAB_PREFIX_LEN" dev "$LAB_IFACE"
        "$IP" -n "$ns" link set "$LAB_IFACE" up
        ns_sysctl "$ns" "net.ipv4.conf.$LAB_IFACE.rp_filter=0" net.ipv4.conf.lo.rp_filter=0
    done
    local extra
    for extra in $LAB_CLIENT_IPS; do
        [[ $extra == "$LAB_CLIENT_IP" ]] && continue
        "$IP" -n "$LAB_CLIENT_NS" addr add "$extra/$LAB_PREFIX_LEN" dev "$LAB_IFACE"
    done

    # assist: never forwards, so the test server's replies that are routed to it die here.
    ns_sysctl "$LAB_ASSIST_NS" net.ipv4.ip_forward=0 net.ipv4.conf.all.forwarding=0

    # test and test2: the clients (one /32 each, so prod and assist stay on-link) and the client
    # pool go via assist. The SYN-ACKs and replies for mirrored connections thus reach assist, not
    # the client. prod2 routes the pool via assist too, so it can also stand in as a second test
    # server (a copier with two --target); as a production host it never talks to pool addresses.
    for h in "${SERVERS[@]}"; do
        [[ $h == prod ]] && continue
        ns=$(var "LAB_$(uc "$h")_NS")
        if [[ $h == test || $h == test2 ]]; then
            for extra in $LAB_CLIENT_IPS; do
                "$IP" -n "$ns" route add "$extra/32" via "$LAB_ASSIST_IP" dev "$LAB_IFACE"
            done
        fi
        "$IP" -n "$ns" route add "$LAB_POOL" via "$LAB_ASSIST_IP" dev "$LAB_IFACE"
    done
}

# Kill every process still inside the lab's namespaces (tcpdump, sysbench, copier... started with
# `lab.sh exec`), by pid: TERM, then KILL after a grace period.
kill_ns_processes() {
    local ns pids=() p i
    for ns in $(all_ns); do
        ns_exists "$ns" || continue
        while read -r p; do
            [[ -n $p ]] && pids+=("$p")
        done < <("$IP" netns pids "$ns" 2>/dev/null || true)
    done
    ((${#pids[@]} == 0)) && return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for p in "${pids[@]}"; do [[ -e /proc/$p ]] && alive=1; done
        ((alive == 0)) && return 0
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# ---------------------------------------------------------------------------------------------------
# MariaDB

mariadb_version() {
    "$MARIADBD" --version 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i == "Ver") { print $(i + 1); exit } }'
}

# Options for every server the lab runs (golden build included).
#  skip-name-resolve: a reverse DNS lookup per connection would hang inside a namespace.
#  max-connect-errors: mirrored connections that never finish their handshake must not get the
#    client address blocked ("Host is blocked because of many connection errors").
#  innodb-flush-log-at-trx-commit=2: lab disks are slow VM disks; same setting on both servers.
common_server_args() {
    local dir=$1
    SARGS=(--no-defaults --user=root
        "--datadir=$dir/data" "--socket=$dir/mysqld.sock" "--pid-file=$dir/mysqld.pid"
        "--log-error=$dir/error.log"
        --skip-name-resolve --max-connect-errors=4294967295 --innodb-flush-log-at-trx-commit=2)
}

server_args() { # server_args HOST -> SARGS
    local h=$1 extra
    common_server_args "$LAB_DIR/$h"
    # sysbench prepares about 20 statements per connection: 1,000 connections pass MariaDB's
    # default max_prepared_stmt_count (16382).
    SARGS+=("--port=$LAB_MYSQL_PORT" --bind-address=0.0.0.0 "--max-connections=$LAB_MAX_CONNECTIONS"
        "--max-prepared-stmt-count=$((LAB_MAX_CONNECTIONS * 40))")
    # Every server: the --prod-dsn lookups read production's, and the executed-work comparison
    # reads each server's statement errors (events_statements_summary_global_by_event_name).
    SARGS+=(--performance-schema=ON)
    # LAB_TLS=1: the server offers TLS (issue 21's plaintext probe is tested against it). Without
    # it the servers have no certificate and offer none, as every other test expects.
    if [[ ${LAB_TLS:-0} == 1 ]]; then
        SARGS+=("--ssl-ca=$LAB_TLS_DIR/cacert.pem" "--ssl-cert=$LAB_TLS_DIR/server-cert.pem"
            "--ssl-key=$LAB_TLS_DIR/server-key.pem")
    fi
    extra=$(var "LAB_$(uc "$h")_SERVER_ARGS")
    local -a words=()
    read -r -a words <<<"$extra" || true
    SARGS+=(${words[@]+"${words[@]}"})
}

# Value of variable NAME if set (even empty), else of FALLBACK (an optional host's twin's).
set_or() {
    if [[ -n ${!1+x} ]]; then printf '%s' "${!1}"; else printf '%s' "${!2-}"; fi
}

# HOST's extra mariadbd options from the caller's environment into LAB_<HOST>_SERVER_ARGS:
# LAB_MYSQLD_ARGS (every server), then LAB_<HOST>_MYSQLD_ARGS. prod2 and test2 take their twin's
# (prod's, test's) when theirs is unset, so an A/B pair differs only where the experiment says.
server_args_from_env() {
    local h=$1 hv tv
    hv=$(uc "$h")
    tv=$(uc "$(twin_of "$h")")
    printf -v "LAB_${hv}_SERVER_ARGS" '%s' \
        "$(join_words "${LAB_MYSQLD_ARGS:-}" "$(set_or "LAB_${hv}_MYSQLD_ARGS" "LAB_${tv}_MYSQLD_ARGS")")"
}

# HOST's preload (LAB_<HOST>_PRELOAD, its twin's when unset) into LAB_<HOST>_SERVER_PRELOAD, as
# LD_PRELOAD wants it (':'-separated). Checked here: the dynamic linker only warns about a
# missing library and starts the server without it, and the experiment would measure nothing.
server_preload_from_env() {
    local h=$1 hv tv list lib out=""
    hv=$(uc "$h")
    tv=$(uc "$(twin_of "$h")")
    list=$(set_or "LAB_${hv}_PRELOAD" "LAB_${tv}_PRELOAD")
    local -a libs=()
    read -r -a libs <<<"${list//:/ }" || true
    for lib in ${libs[@]+"${libs[@]}"}; do
        [[ $lib == /* ]] || die "LAB_${hv}_PRELOAD: '$lib' is not an absolute path (LD_PRELOAD of a server needs one, e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2)"
        [[ -f $lib && -r $lib ]] ||
            die "LAB_${hv}_PRELOAD: no library $lib (jemalloc: apt-get install libjemalloc2; tcmalloc: apt-get install libtcmalloc-minimal4; or scripts/install-deps.sh)"
        out+="${out:+:}$lib"
    done
    printf -v "LAB_${hv}_SERVER_PRELOAD" '%s' "$out"
}

server_pid() { # pid of HOST's mariadbd if it is running, else nothing
    local h=$1 f p
    for f in "$LAB_DIR/$h/mysqld.pid" "$LAB_DIR/$h/launch.pid"; do
        [[ -s $f ]] || continue
        p=$(<"$f")
        [[ $p =~ ^[0-9]+$ ]] || continue
        # Ours, not only a mariadbd: a pid file outlives its server, and with pid numbers
        # reused (pid_max is 32768 here) a stale one may name another lab's server.
        if [[ -r /proc/$p/comm && $(</proc/"$p"/comm) == mariadbd ]] &&
            tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "--pid-file=$LAB_DIR/$h/mysqld.pid"; then
            printf '%s' "$p"
            return 0
        fi
    done
    return 0
}

admin_ping() { # admin_ping SOCKET
    "$MARIADB_ADMIN" --no-defaults --socket="$1" -u root --connect-timeout=2 ping >/dev/null 2>&1
}

server_log_tail() {
    local log=$1
    if [[ -s $log ]]; then
        echo "--- last lines of $log:"
        tail -n 20 "$log"
    fi
}

start_server() { # start_server HOST (does not wait)
    local h=$1 ns dir listening cpus preload
    ns=$(ns_of "$h")
    dir=$LAB_DIR/$h
    listening=$(nsx "$ns" "$SS" -Hltnp "sport = :$LAB_MYSQL_PORT" 2>/dev/null || true)
    if [[ -n $listening ]]; then
        die "port $LAB_MYSQL_PORT is already taken in namespace $ns (host $h): $listening"
    fi
    server_args "$h"
    rm -f "$dir/mysqld.pid" "$dir/launch.pid"
    local pin=() pre=()
    cpus=$(host_cpus "$h")
    [[ -z $cpus ]] || pin=(taskset -c "$cpus")
    # The preload goes into the server's environment only (env(1), exec'd last), not into ip,
    # setsid and taskset on the way. A lab recorded before preloads existed has no variable.
    preload=LAB_$(uc "$h")_SERVER_PRELOAD
    [[ -z ${!preload-} ]] || pre=(env "LD_PRELOAD=${!preload}")
    # setsid: the server must not share our session (Ctrl-C on lab.sh, test harness pipes).
    # A plain command, not a function: bash execs it in the forked child (no subshell carrying our
    # traps), ip netns exec, setsid, taskset and env exec too, so $! ends up being mariadbd's pid.
    if [[ -n $LAB_LOCK_FD ]]; then
        "$IP" netns exec "$ns" setsid "${pin[@]}" "${pre[@]}" "$MARIADBD" "${SARGS[@]}" </dev/null >>"$dir/mariadbd.out" 2>&1 {LAB_LOCK_FD}>&- &
    else
        "$IP" netns exec "$ns" setsid "${pin[@]}" "${pre[@]}" "$MARIADBD" "${SARGS[@]}" </dev/null >>"$dir/mariadbd.out" 2>&1 &
    fi
    echo "$!" >"$dir/launch.pid"
}

wait_server() { # wait_server HOST STARTED_AT
    local h=$1 t0=$2 ns dir pid deadline
    ns=$(ns_of "$h")
    dir=$LAB_DIR/$h
    pid=$(<"$dir/launch.pid")
    deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        if [[ ! -e /proc/$pid ]]; then
            if grep -qsE 'Address already in use|Do you already have another server running' "$dir/error.log"; then
                die "$h: mariadbd could not bind port $LAB_MYSQL_PORT in namespace $ns: the port is already taken
$(server_log_tail "$dir/error.log")"
            fi
            die "$h: mariadbd exited during start-up
$(server_log_tail "$dir/error.log")$(tail -n 5 "$dir/mariadbd.out" 2>/dev/null)"
        fi
        if admin_ping "$dir/mysqld.sock" &&
            [[ -n $(nsx "$ns" "$SS" -Hltn "sport = :$LAB_MYSQL_PORT" 2>/dev/null) ]]; then
            info "  $h: mariadbd ready (pid $pid, $(since "$t0") s)"
            return 0
        fi
        if ((SECONDS >= deadline)); then
            die "$h: mariadbd did not accept connections within ${START_TIMEOUT}s (pid $pid)
$(server_log_tail "$dir/error.log")"
        fi
        sleep 0.1
    done
}

stop_pid() { # stop_pid PID WHAT: TERM, wait up to STOP_TIMEOUT for exit, then KILL
    local pid=$1 what=$2 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        [[ -e /proc/$pid ]] || return 0
        sleep 0.1
    done
    warn "$what (pid $pid) did not exit within ${STOP_TIMEOUT}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [[ -e /proc/$pid ]] || return 0
        sleep 0.1
    done
}

stop_server() {
    local h=$1 pid
    pid=$(server_pid "$h")
    [[ -n $pid ]] || return 0
    stop_pid "$pid" "$h mariadbd"
}

# LAB_TLS=1: a CA, a server and a client certificate, made once into the cache (openssl, RSA 2048,
# ten years) and copied into the lab. The file names of the client side are the ones sysbench
# 1.0 reads from its current directory with --mysql-ssl=on.
TLS_LAYOUT=1
ensure_tls() {
    local cache=$CACHE_DIR/tls-v$TLS_LAYOUT
    if [[ ! -f $cache/complete ]]; then
        need_tools openssl
        mkdir -p "$CACHE_DIR"
        with_lock "$CACHE_DIR/lock" make_tls "$cache"
    fi
    mkdir -p "$LAB_TLS_DIR"
    cp "$cache"/{cacert,server-cert,server-key,client-cert,client-key}.pem "$LAB_TLS_DIR/"
}

make_tls() { # make_tls DIR (caller holds the cache lock)
    local dir=$1 b who
    [[ -f $dir/complete ]] && return 0
    b=$(mktemp -d "$CACHE_DIR/.tls.XXXXXX")
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=tcpshadow lab CA" \
        -keyout "$b/ca-key.pem" -out "$b/cacert.pem" 2>/dev/null || die "openssl: cannot make the lab CA"
    for who in server client; do
        if ! openssl req -newkey rsa:2048 -nodes -subj "/CN=tcpshadow-lab-$who" \
            -keyout "$b/$who-key.pem" -out "$b/$who.csr" 2>/dev/null ||
            ! openssl x509 -req -in "$b/$who.csr" -CA "$b/cacert.pem" -CAkey "$b/ca-key.pem" \
                -CAcreateserial -days 3650 -out "$b/$who-cert.pem" 2>/dev/null; then
            die "openssl: cannot make the lab's $who certificate"
        fi
    done
    touch "$b/complete"
    rm -rf "$dir"
    mv "$b" "$dir"
}

# The golden data directory: installed and prepared once per (MariaDB version, tables, rows), then
# copied for every server of every lab. Built with networking off, outside the lab namespaces.
ensure_golden() {
    LAB_MARIADB_VERSION=$(mariadb_version)
    [[ -n $LAB_MARIADB_VERSION ]] || die "cannot read the version of $MARIADBD (try: $MARIADBD --version)"
    LAB_GOLDEN=$CACHE_DIR/golden-$LAB_MARIADB_VERSION-t$LAB_TABLES-s$LAB_TABLE_SIZE-v$GOLDEN_LAYOUT
    [[ -f $LAB_GOLDEN/complete ]] && return 0
    with_lock "$CACHE_DIR/lock" build_golden
}

build_golden() {
    [[ -f $LAB_GOLDEN/complete ]] && return 0 # built by someone else while we waited for the lock
    local t0 b pid rc=0
    t0=$(now)
    info "preparing the golden data directory (once per MariaDB version and table size): $LAB_GOLDEN"
    rm -rf "$CACHE_DIR"/.build.* # left by an interrupted build (we hold the lock)
    b=$(mktemp -d "$CACHE_DIR/.build.XXXXXX")
    mkdir -p "$b/srv"
    if ! "$INSTALL_DB" --no-defaults --datadir="$b/srv/data" --user=root \
        --auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
        >"$b/install.log" 2>&1; then
        tail -n 20 "$b/install.log" >&2
        rm -rf "$b"
        die "mariadb-install-db failed (log above)"
    fi
    common_server_args "$b/srv"
    setsid "$MARIADBD" "${SARGS[@]}" --skip-networking </dev/null >"$b/srv/mariadbd.out" 2>&1 &
    pid=$!
    local i ready=0
    for ((i = 0; i < START_TIMEOUT * 10; i++)); do
        if admin_ping "$b/srv/mysqld.sock"; then
            ready=1
            break
        fi
        [[ -e /proc/$pid ]] || break
        sleep 0.1
    done
    if ((ready == 0)); then
        server_log_tail "$b/srv/error.log" >&2
        kill -KILL "$pid" 2>/dev/null || true
        rm -rf "$b"
        die "the MariaDB server for the golden data directory did not start"
    fi
    cat >"$b/accounts.sql" <<EOF
DELETE FROM mysql.global_priv WHERE User = '';
FLUSH PRIVILEGES;
CREATE DATABASE $LAB_DB;
CREATE USER '$LAB_USER'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('$LAB_PASSWORD');
GRANT ALL PRIVILEGES ON $LAB_DB.* TO '$LAB_USER'@'%';
CREATE USER '$LAB_RO_USER'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('$LAB_RO_PASSWORD');
GRANT PROCESS, SELECT ON *.* TO '$LAB_RO_USER'@'%';
EOF
    {
        "$MARIADB" --no-defaults --socket="$b/srv/mysqld.sock" -u root <"$b/accounts.sql" &&
            "$SYSBENCH" oltp_read_only --db-driver=mysql --mysql-socket="$b/srv/mysqld.sock" \
                --mysql-user=root --mysql-db="$LAB_DB" --tables="$LAB_TABLES" \
                --table-size="$LAB_TABLE_SIZE" --threads=2 prepare
    } >"$b/prepare.log" 2>&1 || rc=$?
    # Stop the server and wait for its process to exit (the socket disappears earlier).
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || true
    if ((rc != 0)); then
        tail -n 20 "$b/prepare.log" >&2
        rm -rf "$b"
        die "preparing the golden data directory failed (log above)"
    fi
    rm -f "$b/srv/mysqld.pid" "$b/srv/mysqld.sock"
    mv "$b/srv/data" "$b/data"
    mv "$b/srv/error.log" "$b/prepare-error.log"
    rm -rf "$b/srv"
    printf 'mariadb %s\ntables %s\ntable_size %s\nlayout %s\nbuilt %s in %s s\n' \
        "$LAB_MARIADB_VERSION" "$LAB_TABLES" "$LAB_TABLE_SIZE" "$GOLDEN_LAYOUT" "$(date -Is)" \
        "$(since "$t0")" >"$b/complete"
    mv "$b" "$LAB_GOLDEN"
    info "golden data directory ready ($(since "$t0") s)"
}

# ---------------------------------------------------------------------------------------------------
# health

lab_healthy() { # quiet; true when the recorded lab is complete and both servers answer
    [[ -f $LAB_ENV_FILE ]] || return 1
    local ns h
    for ns in $(all_ns); do ns_exists "$ns" || return 1; done
    (
        # shellcheck disable=SC1090
        source "$LAB_ENV_FILE"
        for h in "${SERVERS[@]}"; do
            [[ -n $(server_pid "$h") ]] || exit 1
            admin_ping "$LAB_DIR/$h/mysqld.sock" || exit 1
        done
    )
}

lab_traces() { # true when anything of this lab exists
    local ns
    [[ -e $LAB_DIR || -e $RUN_DIR/labs/$LAB_NAME ]] && return 0
    for ns in $(all_ns); do ns_exists "$ns" && return 0; done
    return 1
}

# ---------------------------------------------------------------------------------------------------
# commands

cmd_up() {
    need_root
    need_tools ip ss mariadbd mariadb-install-db mariadb mariadb-admin sysbench tcpdump \
        flock setsid sysctl
    lock_lab
    [[ ${LAB_OFFLOADS:-on} == on || ${LAB_OFFLOADS:-on} == off ]] ||
        die "LAB_OFFLOADS must be on (the kernel's defaults, as real NICs) or off, not '$LAB_OFFLOADS'"
    if lab_healthy; then
        load_lab_env
        info "lab '$LAB_NAME' is already up ($LAB_SUBNET, dir $LAB_DIR)"
        return 0
    fi
    if lab_traces; then
        info "lab '$LAB_NAME': tearing down a stale or half-built lab first"
        do_down
    fi
    local t0 h
    t0=$(now)
    for h in "${SERVERS[@]}"; do
        server_args_from_env "$h"
        server_preload_from_env "$h"
    done
    LAB_TLS=${LAB_TLS:-0}
    [[ $LAB_TLS == 0 || $LAB_TLS == 1 ]] || die "LAB_TLS must be 0 or 1, not '$LAB_TLS'"
    LAB_TLS_DIR=""
    if [[ $LAB_TLS == 1 ]]; then LAB_TLS_DIR=$LAB_DIR/tls; fi
    [[ $LAB_TABLES =~ ^[1-9][0-9]*$ && $LAB_TABLE_SIZE =~ ^[1-9][0-9]*$ ]] ||
        die "LAB_TABLES and LAB_TABLE_SIZE must be positive integers"
    ensure_golden

    UP_DONE=0
    trap 'up_failed' EXIT
    trap 'exit 130' INT TERM
    with_lock "$RUN_DIR/lock" up_network
    info "lab '$LAB_NAME': network up ($LAB_SUBNET, client pool $LAB_POOL) in $(since "$t0") s"

    local t1
    t1=$(now)
    if [[ $LAB_TLS == 1 ]]; then ensure_tls; fi
    for h in "${SERVERS[@]}"; do
        mkdir -p "$LAB_DIR/$h/data"
        cp -a "$LAB_GOLDEN/data/." "$LAB_DIR/$h/data/" &
    done
    wait
    for h in "${SERVERS[@]}"; do start_server "$h"; done
    for h in "${SERVERS[@]}"; do wait_server "$h" "$t1"; done
    UP_DONE=1
    trap - EXIT INT TERM
    local where=""
    for h in "${HOSTS[@]}"; do where+="${where:+, }$h $(var "LAB_$(uc "$h")_IP")"; done
    info "lab '$LAB_NAME' is up in $(since "$t0") s: $where (MariaDB $LAB_MARIADB_VERSION on port $LAB_MYSQL_PORT)"
    info "  eval \"\$($LAB_SCRIPT --name $LAB_NAME env)\"  to get the lab's variables"
}

up_network() {
    mkdir -p "$LAB_DIR"
    alloc_index
    write_lab_env
    net_up
}

up_failed() {
    local rc=$?
    ((UP_DONE == 1)) && return 0
    if [[ ${LAB_KEEP_ON_FAILURE:-0} == 1 ]]; then
        info "lab '$LAB_NAME': up failed; leaving it in place (LAB_KEEP_ON_FAILURE=1); clean up with: $0 --name $LAB_NAME down"
    else
        info "lab '$LAB_NAME': up failed; tearing down what was built"
        do_down >/dev/null 2>&1 || true
    fi
    exit "$rc"
}

do_down() {
    local h ns idx dir
    # The registry knows where the lab dir is even if LAB_BASE_DIR differs now.
    if [[ -f $RUN_DIR/labs/$LAB_NAME ]]; then
        read -r idx dir <"$RUN_DIR/labs/$LAB_NAME" || true
        if [[ ${dir:-} == */tcpshadow-lab-"$LAB_NAME" ]]; then
            LAB_DIR=$dir
            LAB_ENV_FILE=$LAB_DIR/lab.env
        fi
    fi
    # The data directories are deleted next, so there is nothing to shut down cleanly: SIGKILL
    # (a clean InnoDB shutdown takes ~2 s per server) and wait for the processes to be gone.
    local pids=() p i
    for h in "${SERVERS[@]}"; do
        p=$(server_pid "$h")
        [[ -n $p ]] && pids+=("$p")
    done
    if ((${#pids[@]} > 0)); then
        kill -KILL "${pids[@]}" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            local alive=0
            for p in "${pids[@]}"; do [[ -e /proc/$p ]] && alive=1; done
            ((alive == 0)) && break
            sleep 0.1
        done
    fi
    kill_ns_processes
    for ns in $(all_ns); do
        if ns_exists "$ns"; then
            "$IP" netns del "$ns" 2>/dev/null || warn "could not delete namespace $ns"
        fi
    done
    if [[ -d $LAB_DIR ]]; then
        case $LAB_DIR in
        */tcpshadow-lab-"$LAB_NAME") rm -rf -- "$LAB_DIR" ;;
        *) warn "not removing unexpected lab dir $LAB_DIR" ;;
        esac
    fi
    rm -f "$RUN_DIR/labs/$LAB_NAME"
}

cmd_down() {
    need_root
    need_tools ip flock
    lock_lab
    if ! lab_traces; then
        rm -f "$RUN_DIR/$LAB_NAME.lock"
        info "lab '$LAB_NAME' is already down"
        return 0
    fi
    do_down
    # Drop the lock file too (held until we exit), so /run does not collect one per lab name.
    rm -f "$RUN_DIR/$LAB_NAME.lock"
    info "lab '$LAB_NAME' is down"
}

cmd_status() {
    need_root
    need_tools ip ss
    if [[ ! -f $LAB_ENV_FILE ]]; then
        if lab_traces; then
            echo "lab '$LAB_NAME': partial (no $LAB_ENV_FILE; run: $0 --name $LAB_NAME down)"
        else
            echo "lab '$LAB_NAME': down"
        fi
        return 1
    fi
    load_lab_env
    local healthy=1 h ns state addr pid
    echo "lab '$LAB_NAME' (index $LAB_INDEX): subnet $LAB_SUBNET, client pool $LAB_POOL, dir $LAB_DIR"
    echo "MariaDB $LAB_MARIADB_VERSION, $LAB_TABLES tables x $LAB_TABLE_SIZE rows, port $LAB_MYSQL_PORT"
    printf '%-7s %-18s %-6s %-48s %s\n' HOST NAMESPACE IFACE ADDRESSES NOTES
    for h in "${HOSTS[@]}"; do
        ns=$(ns_of "$h")
        if ! ns_exists "$ns"; then
            printf '%-7s %-18s %s\n' "$h" "$ns" "MISSING"
            healthy=0
            continue
        fi
        addr=$("$IP" -n "$ns" -4 -o addr show dev "$LAB_IFACE" 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }' | paste -sd' ')
        state=""
        case $h in
        test | test2 | prod2) state="routes: $("$IP" -n "$ns" route show | awk '/via/ { print $1 }' | paste -sd' ') via $LAB_ASSIST_IP" ;;
        assist) state="ip_forward=$(nsx "$ns" sysctl -n net.ipv4.ip_forward)" ;;
        esac
        pid=$(node_exporter_pid "$h")
        [[ -z $pid ]] || state+="${state:+; }node_exporter (pid $pid)"
        if [[ " ${SERVERS[*]} " == *" $h "* ]]; then
            pid=$(server_pid "$h")
            if [[ -n $pid ]] && admin_ping "$LAB_DIR/$h/mysqld.sock"; then
                state="mariadbd up (pid $pid)${state:+; $state}"
            else
                state="mariadbd DOWN${state:+; $state}"
                healthy=0
            fi
        fi
        printf '%-7s %-18s %-6s %-48s %s\n' "$h" "$ns" "$LAB_IFACE" "${addr:-NONE}" "$state"
    done
    if ns_exists "$LAB_BR_NS"; then
        printf '%-7s %-18s %-6s %-48s %s\n' br "$LAB_BR_NS" "$LAB_BRIDGE" "-" \
            "ports: $("$IP" -n "$LAB_BR_NS" -o link show master "$LAB_BRIDGE" | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | paste -sd' ')"
    else
        printf '%-7s %-18s %s\n' br "$LAB_BR_NS" MISSING
        healthy=0
    fi
    local pv
    for h in "${SERVERS[@]}"; do
        [[ -n $(var "LAB_$(uc "$h")_SERVER_ARGS") ]] && echo "$h server extra args: $(var "LAB_$(uc "$h")_SERVER_ARGS")"
        pv=LAB_$(uc "$h")_SERVER_PRELOAD
        [[ -n ${!pv-} ]] && echo "$h server preload: ${!pv}"
    done
    if ((healthy)); then
        echo "state: up"
    else
        echo "state: DEGRADED (re-run up to rebuild it)"
        return 1
    fi
}

cmd_list() {
    need_root
    local f n idx dir st
    shopt -s nullglob
    local files=("$RUN_DIR/labs"/*)
    if ((${#files[@]} == 0)); then
        echo "no labs"
        return 0
    fi
    for f in "${files[@]}"; do
        n=${f##*/}
        read -r idx dir <"$f" || true
        st=down
        if ns_exists "$n-br"; then st=up; fi
        printf '%-16s index %-3s 198.18.%s.0/24  %-4s %s\n' "$n" "$idx" "$idx" "$st" "$dir"
    done
}

cmd_env() {
    need_root
    load_lab_env
    local v
    for v in "${ENV_VARS[@]}"; do
        printf '%s=%s\n' "$v" "$(shq "${!v-}")"
    done
}

cmd_service() {
    [[ $# -ge 2 ]] || die "usage: $PROG service HOST CMD..."
    need_tools setsid
    local host=$1
    shift
    # setsid(1) forks only when it leads its process group, which a child of ours does not:
    # the daemon keeps the pid it was started with (callers signal it).
    cmd_exec "$host" setsid "$@"
}

cmd_exec() {
    need_root
    [[ $# -ge 1 ]] || die "usage: $PROG exec HOST [CMD...]"
    local ns host=$1
    ns=$(ns_of "$1")
    shift
    ns_exists "$ns" || die "namespace $ns does not exist (is lab '$LAB_NAME' up?)"
    if [[ -f $LAB_ENV_FILE ]]; then
        set -a
        # shellcheck disable=SC1090
        source "$LAB_ENV_FILE"
        set +a
    fi
    (($# > 0)) || set -- "${SHELL:-/bin/bash}"
    local cpus
    cpus=$(host_cpus "$host")
    if [[ -n $cpus ]]; then
        exec "$IP" netns exec "$ns" taskset -c "$cpus" "$@"
    fi
    exec "$IP" netns exec "$ns" "$@"
}

cmd_load() {
    need_root
    load_lab_env
    need_tools sysbench
    local test=oltp_read_only threads=8 time=10 target=prod from="" extra=()
    while (($# > 0)); do
        case $1 in
        --test | --threads | --time | --target | --from)
            (($# >= 2)) || die "load: $1 needs a value"
            printf -v "${1#--}" '%s' "$2"
            shift 2
            ;;
        --test=* | --threads=* | --time=* | --target=* | --from=*)
            local k=${1%%=*}
            printf -v "${k#--}" '%s' "${1#*=}"
            shift
            ;;
        --)
            shift
            extra+=("$@")
            break
            ;;
        *)
            extra+=("$1")
            shift
            ;;
        esac
    done
    [[ $threads =~ ^[0-9]+$ && $time =~ ^[0-9]+$ ]] || die "load: --threads and --time take integers"
    local ip
    case $target in
    prod) ip=$LAB_PROD_IP ;;
    prod2)
        server_host prod2
        ip=$LAB_PROD2_IP
        ;;
    test) ip=$LAB_TEST_IP ;;
    test2)
        server_host test2
        ip=$LAB_TEST2_IP
        ;;
    *) die "load: --target is prod, prod2, test or test2" ;;
    esac
    # The client cannot talk to test or test2 directly (they route the clients via assist), so a
    # load on them runs inside the server's host itself unless --from says otherwise.
    if [[ -z $from ]]; then
        if [[ $target == test || $target == test2 ]]; then from=$target; else from=client; fi
    fi
    info "load: sysbench $test, $threads threads, ${time}s, from $from to $target ($ip:$LAB_MYSQL_PORT)"
    # sysbench 1.0's --mysql-ssl=on reads client-key.pem, client-cert.pem and cacert.pem from
    # its current directory: with LAB_TLS=1 they are in LAB_TLS_DIR.
    if [[ ${LAB_TLS:-0} == 1 && -d ${LAB_TLS_DIR:-} ]]; then cd "$LAB_TLS_DIR"; fi
    # setsid: the clients are another machine. In our session, the kernel's per-session
    # scheduling groups (autogroup) would put sysbench's threads in one group with whatever else
    # we started (the copier), which then gets 1/THREADS of a CPU: at 1,000 threads its capture
    # waited over a second and its ring overflowed (docs/BENCHMARKS.md, "1,000 connections").
    hostx "$from" setsid --wait "$SYSBENCH" "$test" --db-driver=mysql --mysql-host="$ip" --mysql-port="$LAB_MYSQL_PORT" \
        --mysql-user="$LAB_USER" --mysql-password="$LAB_PASSWORD" --mysql-db="$LAB_DB" \
        --tables="$LAB_TABLES" --table-size="$LAB_TABLE_SIZE" --threads="$threads" --time="$time" \
        "${extra[@]}" run
}

COUNTERS=(Questions Queries Com_select Com_insert Com_update Com_delete Com_replace
    Com_begin Com_commit Com_rollback Com_stmt_prepare Com_stmt_execute Com_stmt_close Com_stmt_reset
    Com_stmt_fetch Com_stmt_send_long_data Com_set_option Com_change_db
    Connections Threads_connected Threads_running Max_used_connections
    Aborted_connects Aborted_clients Bytes_received Bytes_sent)

root_sql() { # root_sql HOST ARGS... : mariadb client as root over HOST's socket, inside HOST's ns
    local h=$1 ns
    shift
    ns=$(ns_of "$h")
    nsx "$ns" "$MARIADB" --no-defaults --socket="$LAB_DIR/$h/mysqld.sock" -u root --batch \
        --skip-column-names "$@"
}

# Counters via the local socket, so no TCP traffic at all. Each call is one connection (Connections
# +1) and adds 2 to Questions/Queries (its SHOW STATUS, counted at once, and its COM_QUIT, seen by
# the next call) and 1 to Com_show_status.
# What a server executed, for the executed-work comparison (tests/src/work.rs, bin work-compare):
# `counter NAME VALUE` lines (the COUNTERS above), `errors EVENT N` lines (statement errors per
# kind, performance_schema) and `reads N`: how many `work` reads this lab made of HOST, each of
# which adds exactly 1 to Com_select (its SELECT of performance_schema), so a comparison can take
# its own reads out. Over the local socket: no TCP traffic.
cmd_work() {
    need_root
    load_lab_env
    need_tools mariadb flock
    [[ $# -eq 1 ]] || die "usage: $PROG work prod|test|prod2|test2"
    local h=$1 list name value n f mine
    server_host "$h"
    f="$LAB_DIR/$h/work-reads"
    # The read is counted before it is made: a snapshot's Com_select includes its own SELECT.
    exec {wfd}>>"$f.lock"
    flock "$wfd"
    mine=$(($(cat "$f" 2>/dev/null || echo 0) + 1))
    echo "$mine" >"$f"
    list=$(printf "'%s'," "${COUNTERS[@]}")
    local out
    out=$(root_sql "$h" -e "SELECT 'errors', EVENT_NAME, SUM_ERRORS FROM performance_schema.events_statements_summary_global_by_event_name WHERE SUM_ERRORS > 0; SHOW GLOBAL STATUS WHERE Variable_name IN (${list%,})") ||
        die "work: no answer from the $h server"
    exec {wfd}>&-
    [[ -n $out ]] || die "work: no answer from the $h server"
    while IFS=$'\t' read -r name value n; do
        if [[ $name == errors ]]; then
            printf 'errors %s %s\n' "$value" "$n"
        else
            printf 'counter %s %s\n' "$name" "$value"
        fi
    done <<<"$out"
    # This read's own number, not the file's: a read made at the same time (another thread of
    # the test) may be rewriting it, and its count is in the next snapshot anyway.
    printf 'reads %s\n' "$mine"
}

cmd_counters() {
    need_root
    load_lab_env
    need_tools mariadb
    [[ $# -ge 1 ]] || die "usage: $PROG counters prod|test|prod2|test2 [--all]"
    local h=$1
    server_host "$h"
    if [[ ${2:-} == --all ]]; then
        root_sql "$h" -e 'SHOW GLOBAL STATUS' | tr '\t' ' '
        return 0
    fi
    local list name value
    list=$(printf "'%s'," "${COUNTERS[@]}")
    local -A got=()
    while IFS=$'\t' read -r name value; do
        got[${name,,}]=$value
    done < <(root_sql "$h" -e "SHOW GLOBAL STATUS WHERE Variable_name IN (${list%,})")
    ((${#got[@]} > 0)) || die "counters: no answer from the $h server"
    for name in "${COUNTERS[@]}"; do
        [[ -n ${got[${name,,}]+x} ]] && printf '%s %s\n' "$name" "${got[${name,,}]}"
    done
    return 0
}

cmd_sql() {
    need_root
    load_lab_env
    need_tools mariadb
    [[ $# -ge 1 ]] || die "usage: $PROG sql prod|test|prod2|test2 [SQL...]  (SQL from stdin when not given)"
    local h=$1
    shift
    server_host "$h"
    if (($# > 0)); then
        root_sql "$h" -e "$*"
    else
        root_sql "$h"
    fi
}

cmd_server() { # start|stop|restart HOST
    local op=$1
    need_root
    load_lab_env
    [[ $# -ge 2 ]] || die "usage: $PROG $op prod|test|prod2|test2"
    local h=$2 t0
    server_host "$h"
    lock_lab
    # New server options from the environment, if given (otherwise those recorded by `up`).
    if [[ $op != stop ]]; then
        local hv changed=0
        hv=$(uc "$h")
        local argsvar="LAB_${hv}_MYSQLD_ARGS" preloadvar="LAB_${hv}_PRELOAD"
        if [[ -n ${LAB_MYSQLD_ARGS+x} || -n ${!argsvar+x} ]]; then
            server_args_from_env "$h"
            changed=1
        fi
        if [[ -n ${!preloadvar+x} ]]; then
            server_preload_from_env "$h"
            changed=1
        fi
        if ((changed)); then write_lab_env; fi
    fi
    if [[ $op == stop || $op == restart ]]; then
        stop_server "$h"
        info "$h: mariadbd stopped"
    fi
    if [[ $op == start || $op == restart ]]; then
        if [[ -n $(server_pid "$h") ]]; then
            info "$h: mariadbd is already running"
            return 0
        fi
        t0=$(now)
        start_server "$h"
        wait_server "$h" "$t0"
    fi
}

cmd_logs() {
    need_root
    load_lab_env
    [[ $# -ge 1 ]] || die "usage: $PROG logs prod|test|prod2|test2 [N]"
    server_host "$1"
    tail -n "${2:-50}" "$LAB_DIR/$1/error.log"
}

# node_exporter per host. What it reports is the machine's: the namespaces share one kernel and
# it reads /proc and /sys, so every host's exporter gives the same CPU, load and memory figures.
# One per host still makes sense: a scrape reaches each host at its own address, as it would in
# a real deployment, and the exporter's own CPU is spent on that host's cores.
# Collectors: cpu (node_cpu_seconds_total), stat (context switches, forks, procs_running and
# procs_blocked), loadavg, meminfo, and pressure (PSI: how long tasks waited for a CPU) and
# schedstat (per-CPU run-queue waits), which show CPU contention between two servers. The
# defaults' others (filesystems, disks, network, hwmon, textfile...) cost scrape time and say
# nothing a lab host's CPU experiment needs.
NODE_EXPORTER_COLLECTORS=(cpu stat loadavg meminfo pressure schedstat)

node_exporter_pid() { # pid of HOST's node_exporter if it is running, else nothing
    local h=$1 f=$LAB_DIR/$1/node-exporter.pid ip p
    [[ -s $f ]] || return 0
    p=$(<"$f")
    [[ $p =~ ^[0-9]+$ ]] || return 0
    ip=$(var "LAB_$(uc "$h")_IP")
    # Ours, not a reused pid: its listen address is this host's.
    if tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "--web.listen-address=$ip:$NODE_EXPORTER_PORT"; then
        printf '%s' "$p"
    fi
    return 0
}

cmd_node_exporter() { # node-exporter HOST [start|stop]
    need_root
    load_lab_env
    (($# == 1 || $# == 2)) || die "usage: $PROG node-exporter HOST [start|stop]  (HOST: ${HOSTS[*]})"
    local h=$1 op=${2:-start} ns ip dir pid listening c
    [[ $op == start || $op == stop ]] || die "node-exporter: '$op' is neither start nor stop"
    [[ $h != br ]] || die "node-exporter: br has no address to listen on; use one of: ${HOSTS[*]}"
    ns=$(ns_of "$h")
    ns_exists "$ns" || die "namespace $ns does not exist (is lab '$LAB_NAME' up?)"
    [[ $NODE_EXPORTER_PORT =~ ^[1-9][0-9]{0,4}$ ]] ||
        die "LAB_NODE_EXPORTER_PORT must be a port number, not '$NODE_EXPORTER_PORT'"
    ip=$(var "LAB_$(uc "$h")_IP")
    dir=$LAB_DIR/$h
    lock_lab
    pid=$(node_exporter_pid "$h")
    if [[ $op == stop ]]; then
        if [[ -n $pid ]]; then stop_pid "$pid" "$h node_exporter"; fi
        rm -f "$dir/node-exporter.pid"
        info "$h: node_exporter stopped"
        return 0
    fi
    if [[ -n $pid ]]; then
        info "$h: node_exporter is already running (pid $pid)"
        echo "http://$ip:$NODE_EXPORTER_PORT/metrics"
        return 0
    fi
    need_tools prometheus-node-exporter setsid ss
    listening=$(nsx "$ns" "$SS" -Hltnp "sport = :$NODE_EXPORTER_PORT" 2>/dev/null || true)
    [[ -z $listening ]] ||
        die "port $NODE_EXPORTER_PORT is already taken in namespace $ns (host $h): $listening (another port: LAB_NODE_EXPORTER_PORT)"
    mkdir -p "$dir"
    local args=("--web.listen-address=$ip:$NODE_EXPORTER_PORT" --collector.disable-defaults)
    for c in "${NODE_EXPORTER_COLLECTORS[@]}"; do args+=("--collector.$c"); done
    local pin=() cpus
    cpus=$(host_cpus "$h")
    [[ -z $cpus ]] || pin=(taskset -c "$cpus")
    # In a session of its own, as a daemon of that host (as `service` starts them), and without
    # our lock descriptor (it would hold the lab's lock for as long as it runs). Every command
    # on the way execs, so $! is node_exporter's pid.
    "$IP" netns exec "$ns" setsid "${pin[@]}" "$NODE_EXPORTER" "${args[@]}" \
        </dev/null >>"$dir/node-exporter.log" 2>&1 {LAB_LOCK_FD}>&- &
    pid=$!
    echo "$pid" >"$dir/node-exporter.pid"
    local deadline=$((SECONDS + 10))
    while [[ -z $(nsx "$ns" "$SS" -Hltn "sport = :$NODE_EXPORTER_PORT" 2>/dev/null) ]]; do
        if [[ ! -e /proc/$pid ]]; then
            die "$h: node_exporter exited during start-up
$(tail -n 10 "$dir/node-exporter.log" 2>/dev/null)"
        fi
        if ((SECONDS >= deadline)); then
            die "$h: node_exporter (pid $pid) did not listen on $ip:$NODE_EXPORTER_PORT within 10 s; its log: $dir/node-exporter.log"
        fi
        sleep 0.1
    done
    info "$h: node_exporter (pid $pid) on $ip:$NODE_EXPORTER_PORT; log $dir/node-exporter.log"
    echo "http://$ip:$NODE_EXPORTER_PORT/metrics"
}

# ---------------------------------------------------------------------------------------------------
# main

# name_option ARGS...: if ARGS start with --name VALUE or --name=VALUE, sets LAB_NAME and NSHIFT
# (how many arguments it took); otherwise NSHIFT=0.
name_option() {
    NSHIFT=0
    case ${1-} in
    --name)
        (($# >= 2)) || die "--name needs a value"
        LAB_NAME=$2
        NSHIFT=2
        ;;
    --name=*)
        LAB_NAME=${1#--name=}
        NSHIFT=1
        ;;
    esac
}

LAB_ARGV=("$@")
LAB_NAME=${LAB_NAME:-tsd}
while (($# > 0)); do
    name_option "$@"
    if ((NSHIFT > 0)); then
        shift "$NSHIFT"
        continue
    fi
    case $1 in
    -h | --help)
        usage
        exit 0
        ;;
    -*) die "unknown option $1 (see: $PROG help)" ;;
    *) break ;;
    esac
done
(($# > 0)) || {
    usage >&2
    exit 2
}
CMD=$1
shift
# up/down/status/env also take --name after the command.
case $CMD in
up | down | status | env)
    while (($# > 0)); do
        name_option "$@"
        ((NSHIFT > 0)) || die "$CMD: unexpected argument '$1'"
        shift "$NSHIFT"
    done
    ;;
esac
[[ $CMD == help ]] && {
    usage
    exit 0
}
set_names
enable_optional_hosts

case $CMD in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
list) cmd_list ;;
env) cmd_env ;;
exec) cmd_exec "$@" ;;
service) cmd_service "$@" ;;
load) cmd_load "$@" ;;
counters) cmd_counters "$@" ;;
work) cmd_work "$@" ;;
sql) cmd_sql "$@" ;;
start | stop | restart) cmd_server "$CMD" "$@" ;;
logs) cmd_logs "$@" ;;
node-exporter) cmd_node_exporter "$@" ;;
*) die "unknown command '$CMD' (see: $PROG help)" ;;
esac
