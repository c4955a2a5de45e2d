#!/bin/bash
# The recording run on the H200: the whole agent (NVML, host collectors, eBPF probes, scrape of the
# workload's /metrics) into a SQLite store while h200_phases.py runs; then the phase events, the
# per-phase check and the trace export.  Everything lands under $OUT.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > "$OUT/record.log" 2>&1
set -x
PS=${PHASE_S:-20}
. examples/workload/h200_setup.sh
DB="sqlite:///$OUT/h200.db"
timeout 90 python3 -m triscope doctor
python3 -m triscope db upgrade --db "$DB"
python3 examples/workload/h200_phases.py --phase-seconds "$PS" --start-delay 30 --phases "$OUT/phases.jsonl" \
  --port 9500 > "$OUT/workload.log" 2>&1 &
WL=$!
for i in $(seq 60); do python3 -c "import urllib.request;urllib.request.urlopen('http://127.0.0.1:9500/metrics')" 2>/dev/null && break; sleep 1; done
python3 -m triscope -v agent --db "$DB" --interval 1 --node h200 --scrape http://127.0.0.1:9500/metrics \
  --listen 127.0.0.1:9464 --duration $((PS*7+50)) > "$OUT/agent.log" 2>&1 &
AG=$!
sleep $((PS*5+30))
python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode())" > "$OUT/agent_metrics.txt"
wait $WL
wait $AG
echo "agent rc=$?"
python3 examples/workload/check_phases.py --db "$DB" --node h200 --phases "$OUT/phases.jsonl" --record
python3 examples/workload/check_phases.py --db "$DB" --node h200 --json > /dev/null
python3 -m triscope export-trace --db "$DB" --node h200 -o "$OUT/h200-phases.jsonl.gz"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()" "$OUT/h200.db"
ls -la "$OUT"
tail -40 "$OUT/agent.log"
