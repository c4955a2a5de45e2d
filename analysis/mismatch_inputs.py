"""What the stored-window mismatch classifier reads, fetched first.

``fetch_mismatch_inputs(store, node, start, end)`` reads the detector's inputs for one node and
range in a fixed number of store calls whatever the number of accelerators and workloads (one
``query`` per input metric, the per-workload ones included, one per PCIe direction for the ceiling's look-back, one per link-fact metric, one
``series`` for ``triscope_gpu_info``) into a ``MismatchInputs``; ``mismatch_inputs_from_series``
builds the same object from series already in memory (the root-cause query reads every series of
the node once and runs the detector over them).  ``triscope.analysis.mismatch.window_states``
classifies windows from it without touching the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from triscope.analysis.features import (
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    GPU_UTIL,
    LINK_FACT_METRICS,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    WORKLOAD_METRICS,
    LinkFacts,
    is_current,
    link_id,
)
from triscope.analysis.reader import SeriesPoints, StoreReader, label_name, points_of

MAIN_METRICS = (GPU_BUSY, NPU_BUSY, GPU_UTIL, PCIE_RX, PCIE_TX, CPU_BUSY, PRESSURE, DMA_MAPS, RETRANSMITS,
                *WORKLOAD_METRICS)
LINK_FACT_LOOKBACK_S = 3600.0      # link facts: the newest value in the hour before the range and in it


@dataclass(slots=True)
class MismatchInputs:
    """The detector's inputs for one node over [start, end], counters as per-second rates.

    Series may hold points outside [start, end]; windows take only their own."""

    start: float
    end: float
    busy: list[SeriesPoints] = field(default_factory=list)          # GPM SM activity / AICore
    pcie_rx: list[SeriesPoints] = field(default_factory=list)       # bytes/s
    pcie_tx: list[SeriesPoints] = field(default_factory=list)
    cpu_busy: list[SeriesPoints] = field(default_factory=list)
    pressure: list[SeriesPoints] = field(default_factory=list)      # every PSI series
    dma_maps: list[SeriesPoints] = field(default_factory=list)      # maps/s, every device
    retransmits: list[SeriesPoints] = field(default_factory=list)
    gpu_info: list[dict[str, str]] = field(default_factory=list)    # labels of triscope_gpu_info (gpu, bus_id)
    link_facts: LinkFacts = field(default_factory=dict)             # negotiated speed / width / capacity per link
    # accelerator -> highest PCIe rate (either direction) in the look-back before ``start``
    link_history_max: dict[str, float] = field(default_factory=dict)
    # every per-workload series (docs/workloads.md: accelerator + workload labels), all metrics
    workloads: list[SeriesPoints] = field(default_factory=list)
    util: list[SeriesPoints] = field(default_factory=list)          # NVML utilisation per GPU


def read_plan(span: float, window: float, tier: str | None) -> tuple[str | None, int | None]:
    """(tier, max_points) of the main read: coarse windows over long ranges read rollups (counter
    rates per bucket are exact means): 1-minute rollups for windows of 2 min or more over more
    than an hour, hourly ones for 2 h windows over more than 2 days; raw points in full up to 6 h."""
    if tier is None:
        tier = "1h" if window >= 7200 and span > 2 * 86400 else "1m" if window >= 120 and span > 3600 else None
    mp = None if span <= 6 * 3600 and tier in (None, "raw") else max(2000, int(span / window) * 2)
    return tier, mp


def link_facts_from(series_by_metric: Mapping[str, Sequence[SeriesPoints]],
                    lo: float = -math.inf, hi: float = math.inf) -> LinkFacts:
    """Each link's newest value in [lo, hi] of its speed, width and capacity as trained now
    (``kind="current"``); of two metrics for the same fact the first in ``LINK_FACT_METRICS`` wins."""
    out: LinkFacts = {}
    for kind, metrics in LINK_FACT_METRICS:
        for m in metrics:
            got: dict[str, float] = {}
            for sp in series_by_metric.get(m, ()):
                lid = link_id(sp.labels)
                if lid is None or not is_current(sp.labels):
                    continue
                last = _last_in(sp, lo, hi)
                if last is not None:
                    got[lid] = last
            for lid, v in got.items():
                out.setdefault(lid, {}).setdefault(kind, v)
    return out


def _last_in(sp: SeriesPoints, lo: float, hi: float) -> float | None:
    for t, v in zip(reversed(sp.ts), reversed(sp.values), strict=True):
        if t < lo:
            return None
        if t <= hi:
            return float(v)
    return None


def _history_max(series: Iterable[SeriesPoints], lo: float, hi: float) -> dict[str, float]:
    """Accelerator -> highest value of its PCIe series in [lo, hi]."""
    out: dict[str, float] = {}
    for sp in series:
        vals = [v for t, v in zip(sp.ts, sp.values, strict=True) if lo <= t <= hi and v == v]
        if vals:
            name = label_name(sp.labels)
            out[name] = max(out.get(name, -math.inf), max(vals))
    return out


def fetch_mismatch_inputs(store: StoreReader, node: str, start: float, end: float, window: float,
                          ceiling_lookback_s: float = 86400.0, tier: str | None = None) -> MismatchInputs:
    """Read the detector's inputs for ``node`` over [start, end] (windows of ``window`` seconds
    decide the tier, ``read_plan``).  The link ceiling's observed part looks back
    ``ceiling_lookback_s`` before ``start`` (downsampled, min/max preserving, so the peak stays).
    Reads: one ``query`` per input metric (the six per-workload metrics included), one
    ``series``, and when a link ceiling is needed one ``query`` per link-fact metric and per PCIe
    direction, whatever the number of accelerators and workloads."""
    span = end - start
    tier, mp = read_plan(span, window, tier)
    # raw points in full start one window early: a counter's rate at the range's first tick needs
    # the point before it (the first window then holds every tick's rate, as the tracker's does)
    lo = start - window if mp is None else start
    got: dict[str, list[SeriesPoints]] = {}
    for m in MAIN_METRICS:
        got[m] = [points_of(sd) for sd in store.query(m, node=node, start=lo, end=end, max_points=mp, tier=tier)]
    inputs = MismatchInputs(start, end, got[GPU_BUSY] + got[NPU_BUSY], got[PCIE_RX], got[PCIE_TX], got[CPU_BUSY],
                            got[PRESSURE], got[DMA_MAPS], got[RETRANSMITS],
                            [dict(i.labels) for i in store.series(node=node, metric=GPU_INFO)],
                            workloads=[sp for m in WORKLOAD_METRICS for sp in got[m]], util=got[GPU_UTIL])
    if inputs.busy and (inputs.pcie_rx or inputs.pcie_tx):   # the link ceiling is needed
        facts: dict[str, list[SeriesPoints]] = {}
        for _kind, metrics in LINK_FACT_METRICS:
            for m in metrics:
                facts[m] = [points_of(sd) for sd in store.query(m, node=node, start=start - LINK_FACT_LOOKBACK_S,
                                                                 end=end, max_points=50, rate=False)]
        inputs.link_facts = link_facts_from(facts)
        if ceiling_lookback_s > 0:
            hist = [points_of(sd) for m in (PCIE_RX, PCIE_TX)
                    for sd in store.query(m, node=node, start=start - ceiling_lookback_s, end=start,
                                          max_points=2000, tier=tier)]
            inputs.link_history_max = _history_max(hist, -math.inf, math.inf)
    return inputs


def mismatch_inputs_from_series(series: Iterable[SeriesPoints], start: float, end: float,
                                ceiling_lookback_s: float = 0.0) -> MismatchInputs:
    """The detector's inputs over [start, end] from series already read (every detector input
    metric and ``triscope_gpu_info``, counters as rates, over a range that covers [start, end]
    and the look-back).  Pure: nothing is read."""
    by_metric: dict[str, list[SeriesPoints]] = {}
    for sp in series:
        by_metric.setdefault(sp.metric, []).append(sp)

    def main(metric: str) -> list[SeriesPoints]:
        return [_between(sp, start, end) for sp in by_metric.get(metric, ())]

    inputs = MismatchInputs(start, end, main(GPU_BUSY) + main(NPU_BUSY), main(PCIE_RX), main(PCIE_TX),
                            main(CPU_BUSY), main(PRESSURE), main(DMA_MAPS), main(RETRANSMITS),
                            [dict(sp.labels) for sp in by_metric.get(GPU_INFO, ())],
                            workloads=[sp for m in WORKLOAD_METRICS for sp in main(m)], util=main(GPU_UTIL))
    inputs.link_facts = link_facts_from(by_metric, start - LINK_FACT_LOOKBACK_S, end)
    if ceiling_lookback_s > 0:
        inputs.link_history_max = _history_max(by_metric.get(PCIE_RX, []) + by_metric.get(PCIE_TX, []),
                                               start - ceiling_lookback_s, start)
    return inputs


def _between(sp: SeriesPoints, lo: float, hi: float) -> SeriesPoints:
    import bisect

    i = bisect.bisect_left(sp.ts, lo)
    j = bisect.bisect_right(sp.ts, hi)
    return SeriesPoints(sp.metric, sp.labels, sp.ts[i:j], sp.values[i:j], sp.kind, sp.node, sp.id)
