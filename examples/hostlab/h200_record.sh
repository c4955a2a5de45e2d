#!/bin/bash
# The H200 host-lab recording in one device command (root, no registries there):
#   OUT=... NODE=h200-lab-1 bash examples/hostlab/h200_record.sh [--only a,b --hold 15]
#   OUT=... NODE=h200-lab-7 bash examples/hostlab/h200_record.sh --hold 50 --only fourth-a   # the fourth set's
#   first half (examples/hostlab/fourth.py; ~5.5 min of lab time), then NODE=h200-lab-8 ... --only fourth-b
#   BUDGET=585 OUT=... NODE=h200-lab-N bash examples/hostlab/h200_record.sh --hold 45 --only fifth-a   # the fifth
#   set's first half (examples/hostlab/fifth.py, 4 classes, one device call), then --only fifth-b
# Installs the carried wheels, BCC and nftables (examples/workload/h200_setup.sh), runs
# examples.hostlab.h200 (the real agent, two stock-PyTorch services on GPU 0, one scenario after
# another) into a scratch folder, replays the trace through today's verdict, and copies back at most
# eight files: the trace, its timeline, the agent's CPU, the acceptance table, and the logs
# (TOPOLOGY=1: topology.json first; PROFILE_AGENT=1: py-spy's agent-profile.txt in the logs; py-spy
# travels as a wheel: here `pip download --no-deps -d .prof py-spy` with /.prof/ in .git/info/exclude,
# there `pip install --no-index --no-deps --target /tmp/pyspy .prof/*.whl; PATH=/tmp/pyspy/bin:$PATH`).
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
NODE=${NODE:-h200-lab-1}
WORK=${WORK:-/tmp/h200-lab}; rm -rf "$WORK"; mkdir -p "$WORK"
exec > >(tee "$FINAL/record.log") 2>&1
T0=$(date +%s)
. examples/workload/h200_setup.sh
if ! command -v nft >/dev/null && ls .deb/nft/*.deb >/dev/null 2>&1; then    # Debian 12's nftables, carried
  mkdir -p /opt/nft
  for f in .deb/nft/*.deb; do dpkg -x "$f" /opt/nft; done
  export PATH=/opt/nft/usr/sbin:$PATH
  export LD_LIBRARY_PATH=/opt/nft/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=index,name,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
  echo "kernel $(uname -r), nproc $(nproc)"; command -v nft; nft --version
  python3 -c 'import torch, torchvision, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "pillow", PIL.__version__)'
  python3 -c 'import bcc; print("bcc", bcc.__file__)'
  cat /sys/fs/cgroup/cgroup.controllers; } 2>&1 | tee "$WORK/machine.txt"
echo "setup took $(( $(date +%s) - T0 )) s"
if [ -n "$TOPOLOGY" ]; then     # the one-socket topology measurement (examples/hostlab/h200_topology.py)
  timeout 90 python3 -m examples.hostlab.h200_topology --out "$FINAL"
  echo "topology rc=$? after $(( $(date +%s) - T0 )) s"
fi
# BUDGET=SECONDS: the whole call must end within it (the device's per-call limit): the lab gets what
# the set-up left, less a margin for copying back, and skips the classes that would not fit
LAB_S=540
if [ -n "$BUDGET" ]; then LAB_S=$(( BUDGET - ($(date +%s) - T0) - 45 )); fi
echo "lab time: $LAB_S s"
timeout "$LAB_S" python3 -m examples.hostlab.h200 --node "$NODE" --out "$WORK" --deadline $(( LAB_S - 15 )) "$@"
echo "lab rc=$? after $(( $(date +%s) - T0 )) s"
cp "$WORK/$NODE.jsonl.gz" "$WORK/$NODE.timeline.jsonl" "$WORK/$NODE.agent.json" "$FINAL/" 2>&1
mkdir -p /tmp/lab-traces && cp "$WORK/$NODE.jsonl.gz" "$WORK/$NODE.timeline.jsonl" /tmp/lab-traces/ 2>/dev/null
python3 - "$NODE" <<'PY' 2>&1 | tee "$FINAL/acceptance.txt"
import sys
from pathlib import Path
from examples.inference.acceptance import Recording, score_all, markdown
r = score_all([Recording(sys.argv[1], "device", "held_out", "", Path("/tmp/lab-traces"))])
for x in r:
    print(x["node"], x["summary"])
    for name, c in x["classes"].items():
        print(" ", name, c["right"], "/", c["windows"], c["states"], c["io_named"])
print(markdown(r))
PY
tail -40 "$WORK/agent.log"
tar czf "$FINAL/logs.tgz" -C "$WORK" --exclude="*.db" --exclude="*.db-*" --exclude=spool . || true
echo "done after $(( $(date +%s) - T0 )) s"
