#!/bin/bash
# Exploratory run on the H200: environment, NVML call costs, the NVML collector alone, the BCC DMA
# probe alone, and a short pass of the phase workload; outputs under $OUT.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > "$OUT/explore.log" 2>&1
set -x
nvidia-smi; uname -r; python3 -V; cat /etc/os-release | head -2
python3 -m pip show nvidia-ml-py prometheus-client torch 2>/dev/null | grep -E "^(Name|Version)"
. examples/workload/h200_setup.sh
python3 -c "import pynvml, sqlalchemy, alembic; print('pynvml', pynvml.__file__, 'sqlalchemy', sqlalchemy.__version__)"
ls /sys/kernel/tracing/events/dma/ ; ls /sys/kernel/tracing/events | tr '\n' ' '
ls -la /lib/modules/$(uname -r)/
PS=${PHASE_S:-12}
timeout 200 python3 examples/workload/dma_probe.py --seconds $((PS*7+25)) > "$OUT/dma.jsonl" 2> "$OUT/dma.err" &
timeout 200 python3 examples/workload/nvml_record.py --bench --seconds $((PS*7+25)) --out "$OUT/nvml.jsonl" > "$OUT/nvml.out" 2>&1 &
sleep 5
timeout 200 python3 examples/workload/h200_phases.py --phase-seconds $PS --phases "$OUT/phases.jsonl" --port 9500 &
WL=$!
sleep $((PS*3+15)); python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9500/metrics').read().decode())" > "$OUT/workload_metrics.txt"
wait $WL
wait
cd "$OUT" && tail -c 3000 dma.err; cd - >/dev/null
timeout 150 python3 -m pytest -p no:cacheprovider -q -s tests/integration/test_nvml_gpu.py -o addopts="" 2>&1 | tail -30
echo done
