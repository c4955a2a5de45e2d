#!/bin/bash
# Source this on the H200 machine (no package registries there): installs the carried wheels
# (.whl/) into /tmp/site, unpacks BCC + kernel headers into /opt/bcc (.deb/bcc.tar.xz, a trimmed
# dpkg -x tree of Debian 12's packages; else the raw .deb/gpu/*.deb) and, where the host has no
# nft, Debian's nftables (.deb/nft/*.deb) into /opt/nft. scripts/device-bundle.sh builds .whl/
# and .deb/ (and checks them in a chroot like this machine: no BCC, LLVM, libz3 or libbpf).
#   . examples/workload/h200_setup.sh
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
bcc_unpacked=
if [ -f .deb/bcc.tar.xz ]; then
  mkdir -p /opt/bcc
  # same layout as dpkg -x into /opt/bcc; Python's lzma where there is no xz program
  { tar xJf .deb/bcc.tar.xz -C /opt/bcc 2>/dev/null \
    || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="fully_trusted")' \
         .deb/bcc.tar.xz /opt/bcc; } && bcc_unpacked=1
elif ls .deb/gpu/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/bcc
  for f in .deb/gpu/*.deb; do dpkg -x "$f" /opt/bcc; done
  bcc_unpacked=1
fi
if [ -n "$bcc_unpacked" ]; then
  export LD_LIBRARY_PATH=/opt/bcc/usr/lib/x86_64-linux-gnu:/opt/bcc/usr/lib/llvm-14/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/opt/bcc/usr/lib/python3/dist-packages
  hdr=$(ls -d /opt/bcc/usr/src/linux-headers-*-amd64 | head -1)
  common=$(ls -d /opt/bcc/usr/src/linux-headers-*-common | head -1)
  # where the agent's eBPF loader looks for BCC (Debian layout); links only, nothing overwritten
  [ -e /usr/lib/python3/dist-packages/bcc ] || { mkdir -p /usr/lib/python3/dist-packages; ln -s /opt/bcc/usr/lib/python3/dist-packages/bcc /usr/lib/python3/dist-packages/bcc; }
  for l in libbcc.so.0 libbcc_bpf.so.0; do
    [ -e /usr/lib/x86_64-linux-gnu/$l ] || ln -s /opt/bcc/usr/lib/x86_64-linux-gnu/$l /usr/lib/x86_64-linux-gnu/$l
  done
  mkdir -p /lib/modules/$(uname -r)
  ln -sfn "$hdr" /lib/modules/$(uname -r)/build
  ln -sfn "$common" /lib/modules/$(uname -r)/source
fi
if ! command -v nft >/dev/null 2>&1 && ls .deb/nft/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/nft
  for f in .deb/nft/*.deb; do dpkg -x "$f" /opt/nft; done
  export PATH=/opt/nft/usr/sbin${PATH:+:$PATH}
  export LD_LIBRARY_PATH=/opt/nft/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# libraries BCC (libLLVM-14, libbcc) or nft need that this host may lack: the tarball's fallbacks
# (scripts/device-bundle.sh: a stand-in libz3.so.4; its README says which), linked into
# /opt/bcc/compat only for a soname that ldconfig does not know here
if [ -d /opt/bcc/usr/lib/bcc-compat ]; then
  mkdir -p /opt/bcc/compat
  for f in /opt/bcc/usr/lib/bcc-compat/lib*.so.[0-9]; do
    [ -e "$f" ] || continue
    l=${f##*/}
    ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$l (" || ln -sfn "$f" /opt/bcc/compat/$l
  done
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/opt/bcc/compat
fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
true
