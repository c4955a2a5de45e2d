#!/bin/bash
# Install the system packages triscope's run and tests need, when missing (Debian/Ubuntu, as root).
# Safe to run twice. Without root it only says what is missing.
set -euo pipefail

PKGS=(
  python3 python3-venv python3-dev gcc make ca-certificates procps iproute2 psmisc
  postgresql                       # the fleet store, and the store tests' real server
  prometheus prometheus-alertmanager prometheus-node-exporter   # promtool, amtool, the e2e tests, the node_exporter baseline
  python3-bpfcc libbpfcc bpfcc-tools   # BCC for the eBPF probes (used from a short-lived child process only)
  chromium chromium-driver          # the dashboard's browser tests
)

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

# The Debian services must not hold the ports our tests use: they run their own instances.
if [[ $(id -u) -eq 0 ]]; then
  for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
      systemctl stop "$svc" || true
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
