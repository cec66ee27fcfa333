#!/usr/bin/env bash
# Installs what tcpshadow needs to build, test and run its lab on Debian 12. Idempotent and
# non-interactive; when everything is present it only checks (dpkg-query) and returns at once.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

PACKAGES=(
    build-essential pkg-config libpcap-dev      # building copier/intercept (libpcap)
    clang libbpf-dev                            # the TLS plaintext probe: BPF C and its headers
    libelf-dev zlib1g-dev                       # ... libbpf-rs builds libbpf, which links them
    openssl                                     # LAB_TLS=1: the lab's certificates
    mariadb-server mariadb-client sysbench      # the lab's servers and load
    libmariadb-dev                              # Connector/C, for the lab's COM_CHANGE_USER client
    iproute2 iptables nftables ethtool tcpdump  # the lab's network and captures
    procps psmisc util-linux perl               # sysctl, setpriv, flock; used by lab.sh and tests
    chromium curl                               # report.html screenshot test; metrics scrapes
    shellcheck                                  # scripts/test.sh lints the shell scripts
    systemd                                     # systemd-analyze verify of deploy/systemd units
    default-jdk-headless libmariadb-java        # the pool test's Connector/J client (javac at test time)
    libhikaricp-java libslf4j-java              # ... and its connection pool
    libjemalloc2                                # LAB_<HOST>_PRELOAD: a test server on jemalloc...
    libtcmalloc-minimal4                        # ... or on tcmalloc (A/B experiments, issue 22)
)
# Installed without their recommendations: prometheus-node-exporter recommends
# prometheus-node-exporter-collectors (systemd timers running smartctl, ipmitool, apt scripts for
# the textfile collector), which the lab, with its own small collector set, does not use.
PACKAGES_NO_RECOMMENDS=(
    prometheus-node-exporter                    # lab.sh node-exporter: per-host CPU figures (issue 22)
)
# Node.js and pip may come from elsewhere (nodesource, pyenv): Debian's only where none is there.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)
python3 -m pip --version >/dev/null 2>&1 || PACKAGES+=(python3-pip)

installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true) == installed ]]; }
missing=() missing_bare=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done
for p in "${PACKAGES_NO_RECOMMENDS[@]}"; do
    installed "$p" || missing_bare+=("$p")
done

if ((${#missing[@]} + ${#missing_bare[@]} > 0)); then
    if [[ $EUID -ne 0 ]]; then
        echo "install-deps: missing packages: ${missing[*]} ${missing_bare[*]}; run as root: sudo $0" >&2
        exit 1
    fi
    echo "install-deps: installing ${missing[*]} ${missing_bare[*]}" >&2
    # Package installs must not start the distribution's own services: the lab runs its own
    # MariaDB servers, and its own node_exporters inside its hosts (the distribution's would
    # listen on :9100 of the machine itself). policy-rc.d (exit 101 = "action forbidden") does
    # that, for this install only: invoke-rc.d and deb-systemd-invoke, which the packages'
    # maintainer scripts start their services with, both ask it first.
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -q
    if ((${#missing[@]} > 0)); then apt-get install -y -q "${missing[@]}"; fi
    if ((${#missing_bare[@]} > 0)); then apt-get install -y -q --no-install-recommends "${missing_bare[@]}"; fi
else
    echo "install-deps: all $((${#PACKAGES[@]} + ${#PACKAGES_NO_RECOMMENDS[@]})) packages present" >&2
fi

# Rust comes from rustup, not apt (Debian 12's cargo is far older than the workspace needs).
[[ -d $HOME/.cargo/bin ]] && PATH=$HOME/.cargo/bin:$PATH
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found: install Rust with rustup (https://rustup.rs), then re-run" >&2
    exit 1
fi
root=$(cd "$(dirname "$0")/.." && pwd)
need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$root/Cargo.toml" | head -n 1)
have=$(cargo --version | awk '{ print $2 }')
if [[ -n $need && $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1) != "$need" ]]; then
    echo "install-deps: cargo $have is older than the workspace's rust-version $need: rustup update" >&2
    exit 1
fi
echo "install-deps: cargo $have" >&2

# The pool test's Python and Node.js connectors, from their registries, into the build tree
# (not the system's packages): pinned, so that a run tests what the last one tested.
clients=$root/target/lab-clients
PY_CONNECTOR=mysql-connector-python==9.5.0
NODE_CONNECTOR=mysql2@3.24.5
if [[ ! -e $clients/py/.installed-$PY_CONNECTOR ]]; then
    echo "install-deps: pip install $PY_CONNECTOR into $clients/py" >&2
    rm -rf "$clients/py"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --target "$clients/py" "$PY_CONNECTOR"
    touch "$clients/py/.installed-$PY_CONNECTOR"
fi
if [[ ! -e $clients/node/.installed-$NODE_CONNECTOR ]]; then
    echo "install-deps: npm install $NODE_CONNECTOR into $clients/node" >&2
    rm -rf "$clients/node"
    mkdir -p "$clients/node"
    npm install --silent --no-audit --no-fund --prefix "$clients/node" "$NODE_CONNECTOR"
    touch "$clients/node/.installed-$NODE_CONNECTOR"
fi
echo "install-deps: pool clients in $clients ($PY_CONNECTOR, $NODE_CONNECTOR)" >&2
