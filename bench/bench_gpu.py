"""GPU / NPU part: the cost these collectors put on the agent's tick, and trace import speed.

Without a GPU here, the NVML figure is read from the H200 recording (the agent's own
``triscope_collector_duration_seconds{collector="nvml"}`` in examples/traces/h200-phases.jsonl.gz);
where NVML answers, it is measured live.
"""

from __future__ import annotations

import stat
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Row

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "npu-smi"
TRACE = REPO / "examples" / "traces" / "h200-phases.jsonl.gz"


def _npu_rows(quick: bool) -> list[Row]:
    from triscope.agent.collectors.npu import NpuSmiCollector, parse_info, run_smi

    text = (FIX / "info-910a-24.1.RC2.txt").read_text()
    n = 200 if quick else 2000
    t0 = time.perf_counter()
    for _ in range(n):
        parse_info(text)
    parse_us = (time.perf_counter() - t0) / n * 1e6
    rows = [Row("npu-smi", "parse 'npu-smi info' (8 x 910A)", parse_us, "us/call", "<= 1000")]
    rows[-1].ok = parse_us <= 1000
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "npu-smi"
        exe.write_text(f"#!/bin/sh\ncat {FIX / 'info-910a-24.1.RC2.txt'}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        m = 10 if quick else 50
        t0 = time.perf_counter()
        for _ in range(m):
            parse_info(run_smi([str(exe), "info"], 5.0))
        inline_ms = (time.perf_counter() - t0) / m * 1e3
        c = NpuSmiCollector(npu_smi=str(exe), interval=0.1, usages=False)
        try:
            end = time.monotonic() + 5
            while time.monotonic() < end and not list(c.collect(time.time())):
                time.sleep(0.02)
            costs = []
            for _ in range(200 if quick else 2000):
                t0 = time.perf_counter()
                c.collect(time.time())
                costs.append(time.perf_counter() - t0)
        finally:
            c.close()
    tick_ms = statistics.median(costs) * 1e3
    rows.append(Row("npu-smi", "collect() on the tick (background runs)", tick_ms, "ms", "<= 1",
                    "npu-smi run + parse on the tick path", inline_ms, tick_ms <= 1))
    return rows


def _nvml_row() -> Row:
    from triscope.agent.collectors.nvml import NvmlCollector

    c = NvmlCollector(xid_events=False)
    try:
        if c.check().ok:
            c.collect(time.time())
            costs = []
            for _ in range(50):
                c.collect(time.time())
                costs.extend(c.tick_seconds_per_gpu.values())
                time.sleep(0.01)
            v = statistics.median(costs) * 1e3
            return Row("nvml", "tick cost per GPU (live)", v, "ms", "<= 3", ok=v <= 3)
    finally:
        c.close()
    from triscope.core.trace import read_trace

    tr = read_trace(TRACE)
    sid = next(s[0] for s in tr.header["series"]
               if s[1] == "triscope_collector_duration_seconds" and s[2].get("collector") == "nvml")
    vals = [v for _, pts in tr.ticks for i, v in pts if i == sid]
    v = statistics.median(vals) * 1e3
    return Row("nvml", "tick cost per GPU (H200 recording, 1 GPU)", v, "ms", "<= 3", ok=v <= 3)


def _trace_row(quick: bool) -> Row:
    from triscope.core.trace import import_trace
    from triscope.store import Store

    with tempfile.TemporaryDirectory() as d:
        st = Store.open(f"sqlite:///{d}/b.db")
        st.upgrade()
        t0 = time.perf_counter()
        info = import_trace(st, TRACE, node="bench")
        dt = time.perf_counter() - t0
        st.close()
    return Row("trace", "import-trace H200 recording into SQLite", info.samples / dt, "samples/s", ">= 20000",
               ok=info.samples / dt >= 20000)


def run(quick: bool = False) -> list[Row]:
    return [*_npu_rows(quick), _nvml_row(), _trace_row(quick)]


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
