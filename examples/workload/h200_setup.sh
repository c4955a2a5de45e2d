#!/bin/bash
# Source this on the H200 machine (no package registries there): installs the carried wheels
# (.whl/) into /tmp/site and unpacks Debian's BCC + kernel headers (.deb/) into /opt/bcc.
#   . examples/workload/h200_setup.sh
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ls .deb/gpu/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/bcc
  for f in .deb/gpu/*.deb; do dpkg -x "$f" /opt/bcc; done
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
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
true
