#!/usr/bin/env bash
# Install the servers used by lockkit's integration tests (Debian/Ubuntu, apt).
# Idempotent: installs only what is missing; prints nothing when all is present.
#   redis-server, redis-sentinel, zookeeper (jars in /usr/share/java), etcd-server, etcd-client, headless JRE,
#   libcurator-recipes-java and a JDK with javac (tests/test_interop_curator.py compiles a Curator client),
#   postgresql (15: the server binaries, run from /usr/lib/postgresql/15/bin; no cluster is used),
#   prometheus (for promtool: the alert rules of monitoring/ are checked and unit-tested)
set -euo pipefail

missing=()

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

check() {  # check PACKAGE TEST...
    local pkg=$1
    shift
    if ! pkg_installed "$pkg" || ! "$@" >/dev/null 2>&1; then
        missing+=("$pkg")
    fi
}

have_cmd() { command -v "$1"; }

check redis-server have_cmd redis-server
check redis-sentinel have_cmd redis-sentinel   # tests/test_sentinel*.py: a master, two replicas, three sentinels
check zookeeper test -f /usr/share/java/zookeeper.jar
check etcd-server have_cmd etcd
check etcd-client have_cmd etcdctl
check openssl have_cmd openssl   # the TLS tests make a CA and certificates at run time
check prometheus have_cmd promtool   # tests/test_metrics_rules.py: promtool check/test rules
check postgresql test -x /usr/lib/postgresql/15/bin/postgres   # tests/test_postgres*.py (initdb'd per run)
check libcurator-recipes-java test -f /usr/share/java/curator-recipes.jar   # tests/test_interop_curator.py
# the Curator interop test compiles its client at test time: any JDK with javac will do
if ! have_cmd javac >/dev/null 2>&1; then
    missing+=(default-jdk-headless)
fi
# any working JRE will do; install the headless default only if there is none
if ! have_cmd java >/dev/null 2>&1 || ! java -version >/dev/null 2>&1; then
    missing+=(default-jre-headless)
fi

if [ ${#missing[@]} -eq 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "backends/install.sh: not root, but all test servers are installed; skipping" >&2
    fi
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "backends/install.sh: missing packages: ${missing[*]}" >&2
    echo "backends/install.sh: run this script as root (e.g. sudo bash backends/install.sh)" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "backends/install.sh: apt-get not found; install manually: ${missing[*]}" >&2
    exit 1
fi

echo "backends/install.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# wait for another apt/dpkg run to release its lock instead of failing at once
apt_opts=(-o DPkg::Lock::Timeout=600)
apt-get "${apt_opts[@]}" update -q
# prometheus alone without its recommends: only promtool is wanted, not node-exporter (which a systemd host
# would start as a service listening on :9100)
others=()
for pkg in "${missing[@]}"; do
    if [ "$pkg" = prometheus ]; then
        apt-get "${apt_opts[@]}" install -y -q --no-install-recommends prometheus
    else
        others+=("$pkg")
    fi
done
if [ ${#others[@]} -gt 0 ]; then
    apt-get "${apt_opts[@]}" install -y -q "${others[@]}"
fi

fail=0
for cmd in redis-server redis-sentinel etcd etcdctl java javac promtool; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        echo "backends/install.sh: $cmd still missing after install" >&2
        fail=1
    fi
done
for jar in zookeeper.jar curator-recipes.jar; do
    if [ ! -f "/usr/share/java/$jar" ]; then
        echo "backends/install.sh: /usr/share/java/$jar still missing after install" >&2
        fail=1
    fi
done
exit "$fail"
