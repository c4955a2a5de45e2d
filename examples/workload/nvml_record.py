#!/usr/bin/env python3
"""Run triscope's NVML collector on its own, once per interval, and write every sample as JSON lines.

A device-side check independent of the agent and the store:
``nvml_record.py --seconds 60 --out nvml.jsonl`` -> one line per tick ``{"ts", "tick_s", "samples":
[[name, labels, value], ...], "events": [...]}``; ``--bench`` first times each NVML query used on
the tick path (median of repeated calls) and prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triscope.agent.collectors.nvml import NvmlCollector  # noqa: E402
from triscope.core.samples import EventRecord  # noqa: E402


def bench_calls(n: int = 50) -> dict[str, float]:
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "replay": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "throttle": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "pcie_gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "pcie_throughput_tx": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
    }
    out: dict[str, float] = {}
    for k, fn in calls.items():
        ts = []
        for _ in range(n if k != "pcie_throughput_tx" else 5):
            t0 = time.perf_counter()
            try:
                fn()
            except nv.NVMLError as e:
                out[k + "_error"] = str(e)  # type: ignore[assignment]
                break
            ts.append(time.perf_counter() - t0)
        if ts:
            out[k] = statistics.median(ts)
    try:
        s = nv.nvmlGpmSampleAlloc()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            nv.nvmlGpmSampleGet(h, s)
            ts.append(time.perf_counter() - t0)
        out["gpm_sample"] = statistics.median(ts)
        nv.nvmlGpmSampleFree(s)
    except (nv.NVMLError, AttributeError) as e:   # unsupported here, or a pynvml without GPM
        out["gpm_error"] = str(e)  # type: ignore[assignment]
    # the cumulative GPM PCIe metrics (ids 255/256) of newer NVML: supported on this driver?
    try:
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, s1)
        time.sleep(0.05)
        nv.nvmlGpmSampleGet(h, s2)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        ids = [2, 5, 10, 20, 21, 255, 256, 248, 249]
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = s1, s2
        for i, m in enumerate(ids):
            mg.metrics[i].metricId = m
        t0 = time.perf_counter()
        nv.nvmlGpmMetricsGet(mg)
        out["gpm_metrics_get"] = time.perf_counter() - t0
        out["gpm_metric_probe"] = {str(ids[i]): [int(mg.metrics[i].nvmlReturn), mg.metrics[i].value]  # type: ignore[assignment]
                                   for i in range(len(ids))}
    except (nv.NVMLError, AttributeError) as e:   # unsupported here, or a pynvml without these names
        out["gpm_metrics_error"] = str(e)  # type: ignore[assignment]
    try:
        out["nvlink0"] = nv.nvmlDeviceGetNvLinkState(h, 0)
    except nv.NVMLError as e:
        out["nvlink0_error"] = str(e)  # type: ignore[assignment]
    try:
        out["supported_events"] = nv.nvmlDeviceGetSupportedEventTypes(h)
    except nv.NVMLError as e:
        out["supported_events_error"] = str(e)  # type: ignore[assignment]
    out["max_gen"] = nv.nvmlDeviceGetMaxPcieLinkGeneration(h)
    out["gpu_max_gen"] = nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)
    out["max_width"] = nv.nvmlDeviceGetMaxPcieLinkWidth(h)
    nv.nvmlShutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("nvml.jsonl"))
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    if args.bench:
        print(json.dumps({"bench": bench_calls()}), flush=True)
    c = NvmlCollector()
    av = c.check()
    print(json.dumps({"check": [av.ok, av.reason, av.hint], "gpus": c.gpus if av.ok else []}), flush=True)
    if not av.ok:
        return 1
    end = time.monotonic() + args.seconds
    nxt = time.monotonic()
    with args.out.open("w") as f:
        while time.monotonic() < end:
            now = time.time()
            t0 = time.perf_counter()
            items = list(c.collect(now))
            dt = time.perf_counter() - t0
            rec = {"ts": now, "tick_s": dt, "per_gpu_s": dict(c.tick_seconds_per_gpu),
                   "samples": [[s.name, dict(s.labels), s.value] for s in items if not isinstance(s, EventRecord)],
                   "events": [[e.kind, e.severity, e.message, e.details] for e in items if isinstance(e, EventRecord)]}
            f.write(json.dumps(rec) + "\n")
            nxt += args.interval
            time.sleep(max(0.0, nxt - time.monotonic()))
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
