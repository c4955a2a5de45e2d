"""What counts as a change worth naming: noise floors per kind of series, the series that are never
causes, the agent's own metrics, and GPU throttle reasons that are faults.

Root cause compares a series over an episode with a reference (``triscope.analysis.rca.explain``)
or a window with its baseline (``triscope.analysis.rca.ranked.rank_causes``).  A z-score alone is not
enough: a series that sat at exactly 0 has no spread, so 0 -> 0.0015 s/s of softirq time has an
infinite z.  Each kind of series therefore has a **noise floor** in its own unit: a change smaller
than the floor is not a change, whatever its z.  ``NOISE_FLOORS`` is the one table; the first row
whose ``match`` accepts a series decides (``noise_floor``).  Counters are compared as per-second
rates (the store's default read).

The agent's own metrics (ticks, collector durations, tick duration, its process, the spool and
store self-metrics, probe attachment) move whenever the node does: they are context beside an
episode, and only while the agent is unhealthy (``agent_trouble``: a collector down, store write
errors, dropped samples, lost probe events), never a ranked cause.  A GPU held at its power cap during work is not a health fault: of the NVML
clocks-event reasons only thermal and hardware slowdowns are (``THROTTLE_FAULT_BITS``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triscope.analysis.episodes import is_application_collector

MB = 1e6
MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class NoiseFloor:
    unit: str                                        # what the series' values are (after rates)
    floor: float                                     # smallest change that counts; inf: never a cause
    match: Callable[[str, Mapping[str, str], str], bool]   # (metric, labels, kind)
    why: str


def _ends(*suffixes: str) -> Callable[[str, Mapping[str, str], str], bool]:
    return lambda m, lab, kind: m.endswith(suffixes)


def _is(*names: str) -> Callable[[str, Mapping[str, str], str], bool]:
    return lambda m, lab, kind: m in names


INF = math.inf

NOISE_FLOORS: tuple[NoiseFloor, ...] = (
    # never causes: identity, static facts, bitmasks, histogram buckets
    NoiseFloor("identity", INF, lambda m, lab, kind: m.endswith("_info") or m.startswith("python_gc_")
               or m in ("process_start_time_seconds", "triscope_process_start_time_seconds", "process_max_fds"),
               "labels carriers and runtime internals: they say what runs, not how it runs"),
    NoiseFloor("static", INF, lambda m, lab, kind: m.endswith(("_total_bytes", "_capacity", "_capacity_bytes_per_second"))
               or (m.startswith(("triscope_pcie_link_speed", "triscope_pcie_link_width")) and lab.get("kind") == "max"),
               "sizes and capacities of the hardware: facts, not load"),
    NoiseFloor("bitmask", INF, _is("triscope_gpu_throttle_reasons"),
               "a bitmask has no meaningful mean; its fault bits are read as absolute evidence"),
    NoiseFloor("histogram bucket", INF, _ends("_bucket"),
               "the histogram's _count and _sum carry the change; 10+ buckets would drown the evidence"),
    NoiseFloor("derived", INF, lambda m, lab, kind: m.startswith("triscope_mismatch_"),
               "the detector's own output is the verdict, not evidence for it"),
    # errors: any increase counts
    NoiseFloor("errors/s", 1e-9, lambda m, lab, kind: m.endswith(("_errors_total", "_faults_total"))
               or m in ("triscope_gpu_pcie_replays_total", "triscope_probe_lost_events_total"),
               "errors are rare by nature: one is news"),
    NoiseFloor("CPU seconds/s", 0.05, _ends("cpu_seconds_total", "triscope_process_cpu_seconds"),
               "5 % of one core: less is housekeeping (0.0015 s/s of softirq is not a cause)"),
    NoiseFloor("stalled seconds/s", 0.02, _is("triscope_pressure_stalled_seconds_total"),
               "2 % of the time stalled"),
    NoiseFloor("retransmits/s", 0.5, lambda m, lab, kind: "retransmits" in m,
               "a tenth of the network-bound threshold (5/s)"),
    NoiseFloor("maps/s", 1.0, _is("triscope_dma_map_total", "triscope_dma_unmap_total"),
               "a tenth of the pin-churn threshold (10 maps/s)"),
    NoiseFloor("bytes/s", 10 * MB, _ends("_bytes_total"),
               "10 MB/s: 0.02 % of a PCIe Gen5 x16 link, 1 % of a 10 GbE NIC"),
    NoiseFloor("segments/s", 100.0, lambda m, lab, kind: m.startswith("triscope_tcp_segments"),
               "a metrics scrape moves tens of segments a second"),
    NoiseFloor("ratio", 0.02, _ends("_ratio"), "2 percentage points"),
    NoiseFloor("bytes", 256 * MIB, _ends("_bytes"), "256 MiB of memory: page cache and allocator churn"),
    NoiseFloor("watts", 20.0, _ends("_watts"), "20 W: an H200 idles near 90 W and draws 700 W at its cap"),
    NoiseFloor("celsius", 5.0, _ends("_celsius"), "5 degrees C"),
    NoiseFloor("hertz", 100e6, _ends("_hertz"), "100 MHz of clock: boost steps"),
    NoiseFloor("GT/s, lanes", 0.5, _ends("_gts", "_width"), "one step of link speed or width"),
    NoiseFloor("seconds", 0.005, _ends("_seconds"), "5 ms"),
    NoiseFloor("events/s", 0.1, lambda m, lab, kind: kind == "counter", "one event every 10 s"),
    NoiseFloor("value", 0.0, lambda m, lab, kind: True, "no floor known: the z-score alone decides"),
)


def noise_floor(metric: str, labels: Mapping[str, str], kind: str = "gauge") -> NoiseFloor:
    """The first row of ``NOISE_FLOORS`` that matches the series."""
    for row in NOISE_FLOORS:
        if row.match(metric, labels, kind):
            return row
    return NOISE_FLOORS[-1]


def never_a_cause(metric: str, labels: Mapping[str, str], kind: str = "gauge") -> bool:
    return math.isinf(noise_floor(metric, labels, kind).floor)


# ---------------------------------------------------------------------------------------------- the agent
AGENT_PREFIXES = ("triscope_collector", "triscope_probe", "triscope_tick", "triscope_ticks", "triscope_spool",
                  "triscope_dropped", "triscope_store", "triscope_process_", "triscope_exporter_")


def is_agent_metric(metric: str) -> bool:
    """The agent's own metrics (self-monitoring), not the node's."""
    return metric.startswith(AGENT_PREFIXES)


def agent_trouble(series: Iterable[Any], events: Iterable[Any], start: float, end: float) -> list[str]:
    """Why the agent was unhealthy in [start, end), one line per reason (empty: it was fine).

    ``series``: ``SeriesPoints``-like objects (``metric``, ``labels``, ``ts``, ``values``, counters as
    rates); ``events``: ``EventRow``-like (``kind``, ``ts``, ``details``, ``message``).

    A scrape collector (``scrape:HOST:PORT``) reads a workload's own ``/metrics``: when it is down the
    workload answered late or not at all — on the H200, a service under a fault missed the tick's
    0.25 s budget while every kernel and NVML collector ran — which is the workload's symptom, not
    the agent's trouble, and ranking ``agent`` above the fault's own evidence would send the SRE to
    the wrong place: its late answers are events on the workload's lane (``rca.context``)."""
    out: list[str] = []
    for e in events:
        if e.kind == "collector" and start <= e.ts < end and (e.details or {}).get("up") is False:
            name = str((e.details or {}).get("collector", "?"))
            if not is_application_collector(name):
                out.append(f"collector {name} down")
    for sp in series:
        m = sp.metric
        if m not in ("triscope_collector_up", "triscope_store_write_errors_total", "triscope_dropped_samples_total",
                     "triscope_probe_lost_events_total", "triscope_spool_pending_samples"):
            continue
        if m == "triscope_collector_up" and is_application_collector(sp.labels.get("collector", "")):
            continue
        i, j = bisect.bisect_left(sp.ts, start), bisect.bisect_left(sp.ts, end)
        vals = [v for v in sp.values[i:j] if v == v]
        if not vals:
            continue
        if m == "triscope_collector_up" and min(vals) < 0.5 and max(sp.values) >= 0.5:
            # (a collector that was never up in the range read cannot run here: not trouble)
            out.append(f"collector {sp.labels.get('collector', '?')} not up")
        elif m != "triscope_collector_up" and max(vals) > 0:
            out.append({"triscope_store_write_errors_total": "store write errors",
                        "triscope_dropped_samples_total": "samples dropped (spool full)",
                        "triscope_probe_lost_events_total": f"probe {sp.labels.get('probe', '?')} lost events",
                        "triscope_spool_pending_samples": "ticks waiting in the spool"}[m])
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------- GPU throttling
# NVML clocks-event reasons (nvmlClocksEventReason*): 0x1 GPU idle, 0x2 application clocks setting,
# 0x4 SW power cap, 0x10 sync boost, 0x100 display clock setting are how a GPU normally runs (a
# GPU held at its power cap during a matmul is doing its job).  Faults slow it down against its will:
THROTTLE_FAULT_BITS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                       0x80: "HW power brake"}


def throttle_faults(values: Sequence[float]) -> tuple[float, list[str]]:
    """(share of ticks with a fault bit set, the fault names seen) of a throttle-reason series."""
    if not values:
        return 0.0, []
    names: dict[str, None] = {}
    bad = 0
    for v in values:
        if v != v or v < 0:
            continue
        bits = int(v)
        hit = [n for b, n in THROTTLE_FAULT_BITS.items() if bits & b]
        if hit:
            bad += 1
            names.update(dict.fromkeys(hit))
    return bad / len(values), list(names)
