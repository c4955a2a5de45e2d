#!/bin/bash
# On the H200 machine, from the repository root (nothing can be installed there):
#   bash examples/inference/h200_run.sh probe|tests|short|hold OUTDIR [SCENARIOS] [HOLD_S]
# probe: GPU, packages, drop tools; tests: tests/*/test_inference_*.py; short: the scenario runner with
# the torch backend, 3 s per scenario; hold: the named scenarios (comma-separated), HOLD_S each (>= 45).
# nft comes from Debian 12's packages carried in .deb/nft (apt-get download nftables libnftables1
# libnftnl11 libmnl0 libjansson4 libxtables12), unpacked into /opt/nft.
set -u
mode=${1:-tests}
out=${2:-/tmp/inference-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! command -v nft >/dev/null && ls .deb/nft/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/nft
  for f in .deb/nft/*.deb; do dpkg -x "$f" /opt/nft; done
  export PATH=/opt/nft/usr/sbin:$PATH
  export LD_LIBRARY_PATH=/opt/nft/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
gpus=$(python3 -c 'import torch; print(",".join(str(i) for i in range(min(2, torch.cuda.device_count()))) or "0")')
case $mode in
  probe)
    {
      nvidia-smi --query-gpu=index,name,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv
      python3 -c 'import sys, torch, timm, transformers, PIL, numpy, prometheus_client, yaml; print(sys.version.split()[0], "torch", torch.__version__, "timm", timm.__version__, "transformers", transformers.__version__, "pillow", PIL.__version__, "numpy", numpy.__version__, "gpus", torch.cuda.device_count())'
      for t in nft iptables tc unshare ip; do printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"; done
      nft --version 2>&1 | head -1
      echo "kernel $(uname -r), nproc $(nproc)"
      echo "offline tokenizer files:"; find / -xdev \( -name 'bpe_simple_vocab_16e6*' -o -name '*.tiktoken' -o -name 'merges.txt' \) 2>/dev/null | head -5
    } 2>&1 | tee "$out/probe.txt"
    ;;
  tests)
    python3 -m pytest tests/unit/test_inference_preprocess.py tests/unit/test_inference_batching.py tests/integration/test_inference_knobs.py \
      tests/integration/test_inference_server.py tests/integration/test_inference_netfault.py tests/integration/test_inference_scenarios.py \
      tests/integration/test_inference_gpu.py -q -rs -s -p no:cacheprovider 2>&1 | tee "$out/pytest.log"
    ;;
  short)
    python3 -m examples.inference.scenarios --backend torch --gpus "$gpus" --short \
      --timeline "$out/timeline_short.jsonl" 2>&1 | tee "$out/short.log"
    ;;
  hold)
    python3 -m examples.inference.scenarios --backend torch --gpus "$gpus" --hold "${4:-45}" --only "${3:-healthy_full}" \
      --timeline "$out/timeline_hold.jsonl" 2>&1 | tee "$out/hold.log"
    ;;
esac
