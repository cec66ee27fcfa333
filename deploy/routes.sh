#!/usr/bin/env bash
# tcpshadow route helpers: the test server's routes to the mirrored client addresses via the
# assistant, and the assistant's kernel settings. Every command is idempotent and prints what it
# changed (or that nothing needed to). Needs root (ip route, /proc/sys).
#
#   routes.sh test-host add    --pool CIDR [--pool CIDR...] --via ASSIST_IP [--dev IF]
#                              [--in-dev IF...] [--persist]
#   routes.sh test-host del    --pool CIDR [--pool CIDR...] --via ASSIST_IP
#   routes.sh test-host status --pool CIDR [--pool CIDR...] --via ASSIST_IP [--in-dev IF...]
#   routes.sh assist-host setup [--dev IF] [--persist]
#   routes.sh assist-host undo
#   routes.sh assist-host status [--dev IF]
#
# On the test server, --pool is the copier's --client-ip-pool, or (without a pool) the real
# clients' addresses as /32s; --via is the assistant's address on the test server's subnet;
# --dev the interface toward it (default: the one `ip route get` picks); --in-dev the interface
# the copier's packets arrive on (default: --dev), which must not filter them by strict rp_filter.
# Routes are not made persistent here (that belongs to the distribution's network config:
# ifupdown `up ip route replace ...`, netplan `routes:`, NetworkManager `+ipv4.routes`); the
# kernel settings are, with --persist (a file in /etc/sysctl.d).
# Environment: ROUTES_STATE_DIR (/run/tcpshadow: values saved for `assist-host undo`),
# ROUTES_SYSCTL_DIR (/etc/sysctl.d), ROUTES_IP (ip).
set -euo pipefail

PROG=routes.sh
IP=${ROUTES_IP:-ip}
SYSCTL_DIR=${ROUTES_SYSCTL_DIR:-/etc/sysctl.d}
STATE_DIR=${ROUTES_STATE_DIR:-/run/tcpshadow}
PROC=${ROUTES_PROC:-/proc/sys}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
say() { printf '%s\n' "$*"; }

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

# --- sysctl through /proc/sys (no procps needed); keys use slashes: net/ipv4/conf/eth0/rp_filter

sysctl_get() { cat "$PROC/$1" 2>/dev/null || echo "?"; }

# sysctl_set KEY VALUE: sets it if different, printing the change.
sysctl_set() {
    local key=$1 want=$2 have
    [[ -e $PROC/$key ]] || {
        say "  ${key//\//.}: not in this kernel, skipped"
        return 0
    }
    have=$(sysctl_get "$key")
    if [[ $have == "$want" ]]; then
        say "  ${key//\//.} = $want (already)"
    else
        printf '%s\n' "$want" >"$PROC/$key"
        say "  ${key//\//.}: $have -> $want"
    fi
}

# persist FILE LINE...: writes the sysctl.d file (whole), printing whether it changed.
persist() {
    local file=$1 tmp
    shift
    mkdir -p "${file%/*}"
    tmp=$(mktemp "$file.XXXXXX")
    {
        echo "# written by tcpshadow deploy/routes.sh; remove it with: $PROG ${MODE_UNDO:-}"
        printf '%s\n' "$@"
    } >"$tmp"
    if [[ -f $file ]] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
        say "  $file: unchanged"
    else
        chmod 644 "$tmp"
        mv "$tmp" "$file"
        say "  $file: written"
    fi
}

valid_cidr() {
    [[ $1 =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}(/([0-9]|[12][0-9]|3[0-2]))?$ ]]
}
valid_ip() {
    [[ $1 =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}$ ]]
}
valid_dev() {
    [[ $1 =~ ^[A-Za-z0-9_.:@-]{1,15}$ ]] && [[ -e /sys/class/net/$1 ]]
}

# The interface the kernel uses to reach ADDRESS (from `ip route get`).
dev_to() {
    "$IP" -4 route get "$1" 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }'
}

# ---------------------------------------------------------------------------------------------------

POOLS=()
VIA=""
DEV=""
IN_DEVS=()
PERSIST=0

parse_opts() {
    while (($# > 0)); do
        case $1 in
        --pool)
            (($# >= 2)) || die "--pool needs a value"
            valid_cidr "$2" || die "--pool $2: not an IPv4 address or CIDR (e.g. 198.19.0.0/16)"
            POOLS+=("$2")
            shift 2
            ;;
        --via)
            (($# >= 2)) || die "--via needs a value"
            valid_ip "$2" || die "--via $2: not an IPv4 address"
            VIA=$2
            shift 2
            ;;
        --dev)
            (($# >= 2)) || die "--dev needs a value"
            valid_dev "$2" || die "--dev $2: no such interface (see: ip link)"
            DEV=$2
            shift 2
            ;;
        --in-dev)
            (($# >= 2)) || die "--in-dev needs a value"
            valid_dev "$2" || die "--in-dev $2: no such interface (see: ip link)"
            IN_DEVS+=("$2")
            shift 2
            ;;
        --persist)
            PERSIST=1
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unexpected argument '$1' (see: $PROG --help)" ;;
        esac
    done
}

need_root() {
    [[ $EUID -eq 0 ]] || die "run as root (it changes routes and kernel settings)"
}

# ip route shows a /32 without its prefix.
route_key() {
    case $1 in
    */32) printf '%s' "${1%/32}" ;;
    */*) printf '%s' "$1" ;;
    *) printf '%s' "$1" ;;
    esac
}

current_route() { "$IP" -4 route show exact "$(route_key "$1")" 2>/dev/null | head -n 1; }

test_host() {
    local op=${1:-}
    shift || true
    parse_opts "$@"
    ((${#POOLS[@]} > 0)) || die "test-host $op: give --pool CIDR (the copier's --client-ip-pool, or client /32s)"
    [[ -n $VIA ]] || die "test-host $op: give --via ASSIST_IP (the assistant's address on this subnet)"
    local dev=$DEV pool cur want rc=0 rp_all rp_dev eff in lines=()
    if [[ -z $dev ]]; then
        dev=$(dev_to "$VIA")
        [[ -n $dev ]] || die "no route to the assistant $VIA from this host: is it on this host's subnet?"
    fi
    ((${#IN_DEVS[@]} > 0)) || IN_DEVS=("$dev")
    case $op in
    add)
        need_root
        say "test host: routes to the mirrored clients via the assistant $VIA (dev $dev)"
        for pool in "${POOLS[@]}"; do
            cur=$(current_route "$pool")
            want="$(route_key "$pool") via $VIA dev $dev"
            if [[ $cur == "$want" || $cur == "$want "* ]]; then
                say "  route $want (already)"
            else
                "$IP" -4 route replace "$pool" via "$VIA" dev "$dev"
                say "  route $want: ${cur:+replaced \"$cur\"}${cur:-added}"
            fi
        done
        # Loose rp_filter where the copier's packets arrive: they carry client source
        # addresses that this host routes via the assistant, and strict mode (1) drops them
        # whenever that route leaves by another interface than the one they arrive on. The
        # kernel applies max(all, dev): strict on `all` makes every interface strict, so `all`
        # goes from strict to loose too (it stays off if it is off).
        say "test host: rp_filter loose on ${IN_DEVS[*]} (strict drops the mirrored packets when the route to the clients leaves by another interface than they arrive on)"
        for in in "${IN_DEVS[@]}"; do
            sysctl_set "net/ipv4/conf/$in/rp_filter" 2
            lines+=("net.ipv4.conf.$in.rp_filter = 2")
        done
        if [[ $(sysctl_get net/ipv4/conf/all/rp_filter) == 1 ]]; then
            say "  note: net.ipv4.conf.all.rp_filter was strict, which makes every interface strict: set to loose"
            sysctl_set net/ipv4/conf/all/rp_filter 2
            lines+=("net.ipv4.conf.all.rp_filter = 2")
        fi
        if ((PERSIST)); then
            MODE_UNDO="test-host del ..." persist "$SYSCTL_DIR/60-tcpshadow-test-host.conf" "${lines[@]}"
        fi
        ;;
    del)
        need_root
        say "test host: removing routes via $VIA"
        for pool in "${POOLS[@]}"; do
            cur=$(current_route "$pool")
            if [[ -z $cur ]]; then
                say "  route $(route_key "$pool"): not present"
            elif [[ $cur == *" via $VIA "* || $cur == *" via $VIA" ]]; then
                "$IP" -4 route del "$pool" via "$VIA"
                say "  route $cur: removed"
            else
                say "  route $cur: not via $VIA, left alone"
            fi
        done
        if [[ -f $SYSCTL_DIR/60-tcpshadow-test-host.conf ]]; then
            rm -f "$SYSCTL_DIR/60-tcpshadow-test-host.conf"
            say "  $SYSCTL_DIR/60-tcpshadow-test-host.conf: removed"
        fi
        say "  rp_filter left as it is (all=$(sysctl_get net/ipv4/conf/all/rp_filter), $dev=$(sysctl_get "net/ipv4/conf/$dev/rp_filter")); set it back with sysctl if you want strict"
        ;;
    status)
        say "test host: routes to the mirrored clients (assistant $VIA, dev $dev)"
        for pool in "${POOLS[@]}"; do
            cur=$(current_route "$pool")
            if [[ -z $cur ]]; then
                say "  MISSING route for $pool: replies to mirrored clients do not reach the assistant; fix: $PROG test-host add --pool $pool --via $VIA"
                rc=1
            elif [[ $cur == *" via $VIA "* || $cur == *" via $VIA" ]]; then
                say "  ok: $cur"
            else
                say "  WRONG route: $cur (not via $VIA); fix: $PROG test-host add --pool $pool --via $VIA"
                rc=1
            fi
        done
        rp_all=$(sysctl_get net/ipv4/conf/all/rp_filter)
        for in in "${IN_DEVS[@]}"; do
            rp_dev=$(sysctl_get "net/ipv4/conf/$in/rp_filter")
            eff=$rp_dev
            [[ $rp_all =~ ^[0-9]+$ && $rp_dev =~ ^[0-9]+$ ]] && ((rp_all > rp_dev)) && eff=$rp_all
            if [[ $eff == 1 && $in != "$dev" ]]; then
                say "  STRICT rp_filter on $in (all=$rp_all, $in=$rp_dev) while the route to the clients leaves by $dev: the mirrored packets arriving on $in are dropped; fix: $PROG test-host add ... --in-dev $in (sets loose)"
                rc=1
            elif [[ $eff == 1 ]]; then
                say "  ok: rp_filter on $in is strict (all=$rp_all, $in=$rp_dev): fine while the mirrored packets arrive on $dev, the route's interface; loose is safer ($PROG test-host add sets it)"
            else
                say "  ok: rp_filter on $in: all=$rp_all, $in=$rp_dev"
            fi
        done
        return "$rc"
        ;;
    *) die "test-host: expected add, del or status (see: $PROG --help)" ;;
    esac
}

assist_devs() {
    if [[ -n $DEV ]]; then
        printf '%s\n' "$DEV"
    else
        local d
        for d in /sys/class/net/*; do
            d=${d##*/}
            [[ $d == lo ]] || printf '%s\n' "$d"
        done
    fi
}

# The keys setup changes on the assistant.
assist_keys() {
    local d
    echo net/ipv4/ip_forward
    echo net/ipv4/conf/all/forwarding
    echo net/ipv4/conf/all/proxy_arp
    echo net/ipv4/conf/all/send_redirects
    while read -r d; do
        echo "net/ipv4/conf/$d/forwarding"
        echo "net/ipv4/conf/$d/proxy_arp"
        echo "net/ipv4/conf/$d/send_redirects"
    done < <(assist_devs)
}

assist_host() {
    local op=${1:-}
    shift || true
    parse_opts "$@"
    local saved=$STATE_DIR/assist-host.saved key val rc=0 lines=()
    case $op in
    setup)
        need_root
        mkdir -p "$STATE_DIR"
        # The values before the first setup, for undo (kept across repeated setups).
        if [[ ! -f $saved ]]; then
            while read -r key; do
                [[ -e $PROC/$key ]] && printf '%s %s\n' "$key" "$(sysctl_get "$key")"
            done < <(assist_keys) >"$saved"
        fi
        # ip_forward=0: the test server's replies for mirrored clients must die here after
        # intercept captured them; forwarded, they reach the real clients, which reset them.
        # proxy_arp=0: this host must not answer ARP for addresses it routes elsewhere.
        # send_redirects=0: never tell the test server to bypass this host.
        say "assistant: no forwarding, no proxy ARP, no redirects"
        while read -r key; do
            sysctl_set "$key" 0
            [[ -e $PROC/$key ]] && lines+=("$(printf '%s = 0' "${key//\//.}")")
        done < <(assist_keys)
        if ((PERSIST)); then
            MODE_UNDO="assist-host undo" persist "$SYSCTL_DIR/60-tcpshadow-assist.conf" "${lines[@]}"
        fi
        ;;
    undo)
        need_root
        if [[ -f $saved ]]; then
            say "assistant: restoring the settings from before setup"
            while read -r key val; do
                [[ -n $key ]] && sysctl_set "$key" "$val"
            done <"$saved"
            rm -f "$saved"
        else
            say "assistant: nothing to restore (no setup recorded in $saved)"
        fi
        if [[ -f $SYSCTL_DIR/60-tcpshadow-assist.conf ]]; then
            rm -f "$SYSCTL_DIR/60-tcpshadow-assist.conf"
            say "  $SYSCTL_DIR/60-tcpshadow-assist.conf: removed"
        fi
        ;;
    status)
        say "assistant: forwarding and proxy ARP must be off"
        while read -r key; do
            val=$(sysctl_get "$key")
            case $key in
            */send_redirects) say "  ${key//\//.} = $val" ;;
            *)
                if [[ $val == 1 ]]; then
                    say "  WRONG ${key//\//.} = 1; fix: $PROG assist-host setup"
                    rc=1
                else
                    say "  ok: ${key//\//.} = $val"
                fi
                ;;
            esac
        done < <(assist_keys)
        return "$rc"
        ;;
    *) die "assist-host: expected setup, undo or status (see: $PROG --help)" ;;
    esac
}

(($# > 0)) || {
    usage >&2
    exit 2
}
case $1 in
test-host)
    shift
    test_host "$@"
    ;;
assist-host)
    shift
    assist_host "$@"
    ;;
-h | --help | help) usage ;;
*) die "unknown command '$1' (see: $PROG --help)" ;;
esac
