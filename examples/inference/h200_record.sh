#!/bin/bash
# One recording of the inference scenarios on the H200 machine, in one device command:
#   OUT=... bash examples/inference/h200_record.sh
# Two instances of examples/inference/server.py (inference-a healthy, inference-b carrying one fault
# per scenario; on one GPU when only one is lent), the whole agent (eBPF, NVML/GPM, host collectors,
# workload attribution, scraping both services) into a SQLite store, the remediation engine in
# dry-run during the scenarios and acting for the closed loop at the end (its knobs-file fallback,
# examples/inference/policy.yaml), then the trace export.  Everything lands under $OUT; every step is
# bounded so the export runs inside the device's 10-minute command.
# Knobs (environment): NODE, HOLD_S (45), SCENARIOS (comma-separated), LIMIT_S (whole run, 585),
# BACKEND (torch; cpu rehearses the plumbing on a machine without a GPU), SHORT=1 (3 s scenarios).
# Everything is written to a scratch folder ($WORK) and only the six files that matter are copied
# to $OUT at the end: the device brings back at most 8 files from $OUT, chosen by count when there
# are more (the first recording lost its timeline that way).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FINAL=$OUT
OUT=${WORK:-/tmp/triscope-record}; rm -rf "$OUT"; mkdir -p "$OUT"
exec > "$OUT/record.log" 2>&1
set -x
T0=$(date +%s)
LIMIT=${LIMIT_S:-585}
NODE=${NODE:-h200-inference-1}
HOLD=${HOLD_S:-45}
BACKEND=${BACKEND:-torch}
SCEN=${SCENARIOS:-healthy_low,pageable,one_core,pin_churn,pcie_saturation,net_drop,healthy_full,neighbour_copy}
left() { echo $((LIMIT - ($(date +%s) - T0))); }

[ -f examples/workload/h200_setup.sh ] && [ "$BACKEND" = torch ] && . examples/workload/h200_setup.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# nft for the dropped-packets scenario: Debian 12's packages carried in .deb/nft
if ! command -v nft >/dev/null && ls .deb/nft/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/nft
  for f in .deb/nft/*.deb; do dpkg -x "$f" /opt/nft; done
  export PATH=/opt/nft/usr/sbin:$PATH
  export LD_LIBRARY_PATH=/opt/nft/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
{ nvidia-smi --query-gpu=index,name,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
  echo "kernel $(uname -r), nproc $(nproc)"; command -v nft; } > "$OUT/machine.txt"

DB="sqlite:///$OUT/$NODE.db"
KN="$OUT/knobs"; mkdir -p "$KN"
python3 -m triscope db upgrade --db "$DB" || exit 1
# the agent: everything it has, both services scraped (they come up a few seconds later: the first
# scrapes fail and say so, then succeed)
python3 -m triscope -v agent --db "$DB" --interval 1 --node "$NODE" \
  --scrape http://127.0.0.1:9601/metrics --scrape http://127.0.0.1:9602/metrics \
  --listen 127.0.0.1:9464 > "$OUT/agent.log" 2>&1 &
AG=$!
# the engine: the policy's knobs directory is this run's; dry-run until the closed loop
sed "s#@KNOBS_DIR@#$KN#" examples/inference/policy.yaml > "$OUT/policy.yaml"
python3 -m triscope remediate check "$OUT/policy.yaml" || exit 1
python3 -m triscope remediate --db "$DB" --policy "$OUT/policy.yaml" --listen off --dry-run \
  > "$OUT/engine-dry-run.log" 2>&1 &
echo $! > "$OUT/engine.pid"
LIVE="kill \$(cat $OUT/engine.pid); sleep 1; python3 -m triscope remediate --db $DB --policy $OUT/policy.yaml --listen off > $OUT/engine.log 2>&1 & echo \$! > $OUT/engine.pid"

extra=()
[ "${SHORT:-0}" = 1 ] && extra+=(--short)
timeout $(( $(left) - 40 )) python3 -m examples.inference.scenarios --backend "$BACKEND" --gpus 0 --hold "$HOLD" \
  --only "$SCEN" --ports 9601,9602 --knobs-dir "$KN" --timeline "$OUT/timeline.jsonl" \
  --loop-closed --loop-max-fault 60 --before-loop "$LIVE" "${extra[@]}" > "$OUT/scenarios.log" 2>&1
echo "scenarios rc=$?"

python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=10).read().decode())" \
  > "$OUT/agent_metrics.txt"
kill "$(cat "$OUT/engine.pid")" 2>/dev/null
kill -TERM $AG; wait $AG; echo "agent rc=$?"
sleep 1
python3 -m triscope remediate audit --db "$DB" --since -2h --limit 100000 --json > "$OUT/$NODE.audit.jsonl" 2>"$OUT/audit.err"
python3 -m triscope export-trace --db "$DB" --node "$NODE" -o "$OUT/$NODE.jsonl.gz"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()" "$OUT/$NODE.db"
ls -la "$OUT" "$KN"
echo "elapsed $(( $(date +%s) - T0 )) s"
tail -30 "$OUT/agent.log"
# at most 8 files come back from the device: the store, the trace, the timeline, the decisions, the
# log of this script, and everything else in one archive
tar czf "$OUT/logs.tgz" -C "$OUT" --exclude="$NODE.db" --exclude="$NODE.jsonl.gz" --exclude=timeline.jsonl \
  --exclude="$NODE.audit.jsonl" --exclude=logs.tgz --exclude=record.log . || echo "tar rc=$?"
for f in "$NODE.db" "$NODE.jsonl.gz" timeline.jsonl "$NODE.audit.jsonl" logs.tgz record.log; do
  cp "$OUT/$f" "$FINAL/" || echo "missing $f"
done
