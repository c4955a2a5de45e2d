"""The three-way coordination-mismatch detector: accelerator vs link vs host (and network).

Pure functions over inputs fetched first.  ``classify_window(features, thresholds)`` decides one
window from its features; ``window_states(inputs, start, end, window)`` cuts the node's
``MismatchInputs`` (``triscope.analysis.mismatch_inputs.fetch_mismatch_inputs``) into windows,
builds each window's features with ``triscope.analysis.features.window_features`` (the same
function the per-tick ``triscope.analysis.online.MismatchTracker`` uses) and classifies them.
``node_states(store, node, start, end)`` and ``sliding_states`` are the fetch and the pure part in one
call, for callers that hold a store.

Inputs (metric names from ``triscope.metrics``):

* accelerator busy: ``triscope_gpu_sm_active_ratio{gpu}`` (NVML GPM SM activity; never
  ``triscope_gpu_utilization_ratio``, which reads 100 % during pure copies) and
  ``triscope_npu_aicore_utilization_ratio{npu,chip}``;
* link load: ``triscope_gpu_pcie_rx_bytes_total`` / ``_tx_bytes_total{gpu}`` as bytes/s, the busier
  direction against the link's one-way ceiling.  The ceiling is
  ``max(gen x width capacity x link_efficiency, highest rate observed on that link)``; the
  negotiated capacity comes from ``triscope_pcie_link_speed_gts`` x ``triscope_pcie_link_width``
  (``kind="current"``, i.e. as trained now) of the GPU's PCI address (``device`` label, matched
  through ``triscope_gpu_info{gpu,bus_id}``), else ``triscope_pcie_link_capacity_bytes_per_second``;
* host staging: ``triscope_cpu_busy_ratio``, ``triscope_pressure_ratio{resource=cpu|memory,kind=some}``;
* pin churn: ``triscope_dma_map_total`` (the accelerators' own PCI devices when known) as maps/s;
* network: ``triscope_tcp_retransmits_total`` as retransmits/s.

States: ``idle``, ``compute-bound``, ``balanced``, ``io-saturated``, ``staging-bound``,
``network-bound``; the score is the share of accelerator time lost to I/O (0..1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import (  # noqa: F401 - the detector's names, re-exported
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    INPUT_METRICS,
    LINK_CAPACITY,
    LINK_SPEED,
    LINK_WIDTH,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    AcceleratorFeatures,
    AcceleratorWindow,
    WindowFeatures,
    WindowValues,
    buses_of_gpus,
    effective_ceiling,
    is_pressure_input,
    link_ids,
    negotiated_capacity,
    own_dma_series,
    window_features,
)
from triscope.analysis.mismatch_inputs import MismatchInputs, fetch_mismatch_inputs
from triscope.analysis.reader import SeriesPoints, StoreReader, label_name
from triscope.pcie import link_capacity_bytes_per_second  # noqa: F401 - re-exported

STATES: tuple[str, ...] = ("idle", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound")
IO_STATES = frozenset({"io-saturated", "staging-bound", "network-bound"})


@dataclass(slots=True)
class Verdict:
    state: str
    score: float
    pin_churn: bool
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class WindowState:
    start: float
    end: float
    state: str
    score: float
    evidence: dict[str, Any]

    @property
    def pin_churn(self) -> bool:
        return bool(self.evidence.get("pin_churn"))


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def classify_accelerator(acc: AcceleratorFeatures, f: WindowFeatures,
                         th: MismatchThresholds) -> tuple[str, float, list[str]]:
    """State, score and the reasons for one accelerator.  ``acc.busy`` must not be None.

    The state is decided on the window's typical tick (medians), the score on its means."""
    b = max(0.0, min(1.0, acc.busy_typical if acc.busy_typical is not None else (acc.busy or 0.0)))
    u = acc.link_util_typical
    u0 = 0.0 if u is None else u
    bm = max(0.0, min(1.0, acc.busy or 0.0))  # means: the score
    um = acc.link_util or 0.0
    cpu = f.cpu_busy or 0.0
    psi = f.pressure or 0.0
    dma = f.dma_map_rate or 0.0
    rtx = f.retransmit_rate or 0.0
    pin_churn = dma >= th.pin_churn_rate
    net_strength = rtx / th.retransmit_rate if th.retransmit_rate > 0 else 0.0
    host_strength = max(cpu / th.cpu_busy if th.cpu_busy > 0 else 0.0,
                        psi / th.cpu_pressure if th.cpu_pressure > 0 else 0.0,
                        dma / th.pin_churn_rate if th.pin_churn_rate > 0 else 0.0)
    reasons: list[str] = []
    link_share = min(1.0, um / th.io_saturated_link) if th.io_saturated_link > 0 else 0.0
    if b >= th.compute_busy:
        reasons.append(f"accelerator busy {b:.0%} >= {th.compute_busy:.0%}")
        return "compute-bound", (1 - bm) * link_share, reasons
    if b < th.starved_busy:
        starved = f"accelerator starved: busy {b:.0%} < {th.starved_busy:.0%}"
        if u is not None and u0 >= th.io_saturated_link:
            reasons += [starved, f"link at {u0:.0%} of its ceiling >= {th.io_saturated_link:.0%}"]
            return "io-saturated", 1 - bm, reasons
        link_active = u is not None and u0 >= th.idle_link
        if net_strength >= 1 and net_strength >= host_strength:
            reasons += [starved, f"{rtx:.1f} TCP retransmits/s >= {th.retransmit_rate:g}"]
            return "network-bound", 1 - bm, reasons
        # host copying / mapping hard while the link runs well below its ceiling: the pageable case
        host_copying = link_active or pin_churn or psi >= th.cpu_pressure
        if host_copying:
            reasons.append(starved)
            if link_active:
                reasons.append(f"link only at {u0:.0%} of its ceiling (< {th.io_saturated_link:.0%})")
            if cpu >= th.cpu_busy:
                reasons.append(f"host CPU busy {cpu:.0%}")
            if psi >= th.cpu_pressure:
                reasons.append(f"host pressure {psi:.0%}")
            if pin_churn:
                reasons.append(f"pin churn: {dma:.0f} DMA maps/s")
            return "staging-bound", 1 - bm, reasons
        if net_strength >= 1:
            reasons += [starved, f"{rtx:.1f} TCP retransmits/s >= {th.retransmit_rate:g}"]
            return "network-bound", 1 - bm, reasons
        if b < th.idle_busy:
            reasons.append(f"accelerator busy {b:.0%} and link {u0:.0%}: nothing to do")
            return "idle", 0.0, reasons
    reasons.append(f"accelerator busy {b:.0%}, link {u0:.0%} of its ceiling")
    return "balanced", (1 - bm) * link_share, reasons


_TIE_ORDER = {s: i for i, s in enumerate(("io-saturated", "staging-bound", "network-bound", "balanced",
                                          "compute-bound", "idle"))}


def classify_window(features: WindowFeatures, thresholds: MismatchThresholds | None = None) -> Verdict | None:
    """Classify one window of one node; ``None`` when no accelerator has enough data.

    Each accelerator is classified on its own link; the node gets the state of the accelerator
    that loses the most time to I/O (highest score; ties: I/O states first, then the busiest).
    The evidence names that accelerator, carries every input and the per-accelerator results.
    """
    th = thresholds or MismatchThresholds()
    per: list[tuple[float, int, str, AcceleratorFeatures, list[str]]] = []
    for acc in features.accelerators:
        if acc.busy is None or acc.coverage < th.min_coverage or math.isnan(acc.busy):
            continue
        state, score, reasons = classify_accelerator(acc, features, th)
        per.append((max(0.0, min(1.0, score)), _TIE_ORDER[state], state, acc, reasons))
    if not per:
        return None
    per.sort(key=lambda p: (-p[0], p[1]))
    score, _, state, acc, reasons = per[0]
    dma = features.dma_map_rate or 0.0
    pin_churn = dma >= th.pin_churn_rate
    evidence: dict[str, Any] = {
        "accelerator": acc.name,
        "busy": _r(acc.busy),
        "busy_median": _r(acc.busy_typical),
        "link_util": _r(acc.link_util),
        "link_util_median": _r(acc.link_util_typical),
        "link_bytes_per_second": _r(acc.link_bytes_per_second, 0),
        "link_ceiling_bytes_per_second": _r(acc.link_ceiling, 0),
        "cpu_busy": _r(features.cpu_busy),
        "pressure": _r(features.pressure),
        "dma_map_rate": _r(features.dma_map_rate, 2),
        "retransmit_rate": _r(features.retransmit_rate, 2),
        "pin_churn": pin_churn,
        "reasons": reasons,
    }
    if len(per) > 1:
        evidence["accelerators"] = {p[3].name: {"state": p[2], "score": round(p[0], 4)} for p in per}
    return Verdict(state, round(score, 4), pin_churn, evidence)


# ---------------------------------------------------------------------------------------------- stored windows
_NONE: tuple[float, ...] = ()


def _cut(sp: SeriesPoints, start: float, w: float, n: int) -> list[Sequence[float]]:
    """The finite values of a series in each of ``n`` windows of ``w`` seconds from ``start``
    (window i holds start + i w <= t < start + (i + 1) w), in time order."""
    import numpy as np

    if not len(sp.ts):
        return [_NONE] * n
    t = np.asarray(sp.ts, dtype=float)
    v = np.asarray(sp.values, dtype=float)
    idx = np.floor((t - start) / w).astype(np.int64)
    ok = (idx >= 0) & (idx < n) & np.isfinite(v)
    idx, v = idx[ok], v[ok]
    if not len(idx):
        return [_NONE] * n
    order = np.argsort(idx, kind="stable")
    idx, vals = idx[order], v[order].tolist()
    b = np.searchsorted(idx, np.arange(n + 1), side="left").tolist()
    return [vals[b[i]:b[i + 1]] for i in range(n)]


def busier_direction(rx: SeriesPoints | None, tx: SeriesPoints | None) -> SeriesPoints | None:
    """The busier PCIe direction at each timestamp of either series (bytes/s)."""
    pts: dict[float, float] = {}
    for d in (rx, tx):
        if d is None:
            continue
        for t, v in zip(d.ts, d.values, strict=False):
            if v > pts.get(t, -1.0):
                pts[t] = v
    if rx is None and tx is None:
        return None
    base = rx if rx is not None else tx
    assert base is not None
    tt = sorted(pts)
    return SeriesPoints("pcie_busier_direction", base.labels, tt, [pts[t] for t in tt], "gauge", base.node)


def window_states(inputs: MismatchInputs, start: float | None = None, end: float | None = None,
                  window: float | None = None, thresholds: MismatchThresholds | None = None) -> list[WindowState]:
    """Cut [start, end) (default: the inputs' range) into windows of ``window`` seconds (default
    ``thresholds.window_s``) and classify each one.  Windows without accelerator data are left
    out.  Pure: no store, no clock.

    Each window's values go through ``window_features``: the same features the per-tick tracker
    builds over its sliding window.  A window's coverage is its accelerator points against the
    points a window normally holds (the median over the range's windows).  The link ceiling's
    observed part is the highest rate in the inputs' look-back and in [inputs.start, end]."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    start = inputs.start if start is None else start
    end = inputs.end if end is None else end
    if end <= start or w <= 0:
        return []
    import numpy as np

    n = int(math.ceil((end - start) / w))
    obs_lo = min(inputs.start, start)
    buses = buses_of_gpus(inputs.gpu_info)
    rx = {label_name(sp.labels): sp for sp in inputs.pcie_rx}
    tx = {label_name(sp.labels): sp for sp in inputs.pcie_tx}
    accs: list[tuple[str, list[Sequence[float]], list[Sequence[float]] | None, float | None, float]] = []
    for sp in inputs.busy:
        name = label_name(sp.labels)
        busy = _cut(sp, start, w, n)
        counts = [len(b) for b in busy if b]
        expected = max(float(np.median(counts)) if counts else 1.0, 1.0)
        link: list[Sequence[float]] | None = None
        ceiling = None
        merged = busier_direction(rx.get(name), tx.get(name))
        if merged is not None:
            link = _cut(merged, start, w, n)
            seen = [v for t, v in zip(merged.ts, merged.values, strict=True) if obs_lo <= t <= end]
            if seen:
                observed = max(max(seen), inputs.link_history_max.get(name, 0.0))
                ceiling = effective_ceiling(negotiated_capacity(link_ids(sp.labels, buses), inputs.link_facts),
                                            observed, th)
        accs.append((name, busy, link, ceiling, expected))
    cpu = [_cut(sp, start, w, n) for sp in inputs.cpu_busy]
    psi = [_cut(sp, start, w, n) for sp in inputs.pressure if is_pressure_input(sp.labels)]
    own = own_dma_series([sp.labels.get("device") for sp in inputs.dma_maps], (b for bs in buses.values() for b in bs))
    dma = [_cut(inputs.dma_maps[i], start, w, n) for i in own]
    rtx = [_cut(sp, start, w, n) for sp in inputs.retransmits]

    out: list[WindowState] = []
    for i in range(n):
        if not any(a[1][i] for a in accs):
            continue
        values = WindowValues(
            [AcceleratorWindow(name, busy[i], None if link is None else link[i], ceiling, expected)
             for name, busy, link, ceiling, expected in accs],
            cpu_busy=cpu[0][i] if len(cpu) == 1 else [v for c in cpu for v in c[i]],
            pressure=[c[i] for c in psi], dma_map_rates=[c[i] for c in dma],
            retransmit_rates=[c[i] for c in rtx])
        v = classify_window(window_features(values), th)
        if v is None:
            continue
        ws = start + i * w
        out.append(WindowState(ws, min(end, ws + w), v.state, v.score, v.evidence))
    return out


def sliding_window_states(inputs: MismatchInputs, window: float | None = None, step: float = 1.0,
                          thresholds: MismatchThresholds | None = None) -> list[WindowState]:
    """Windows of ``window`` seconds every ``step`` seconds that lie fully inside the inputs'
    range (the view the per-tick tracker has), sorted by start.  Pure."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    out: list[WindowState] = []
    k = 0
    while k * step < w and inputs.start + k * step + w <= inputs.end:
        s0 = inputs.start + k * step
        n_full = int((inputs.end - s0) // w)
        out += window_states(inputs, s0, s0 + n_full * w, w, th)
        k += 1
    return sorted(out, key=lambda x: x.start)


def node_states(store: StoreReader, node: str, start: float, end: float, window: float | None = None,
                thresholds: MismatchThresholds | None = None, ceiling_lookback_s: float = 86400.0,
                tier: str | None = None) -> list[WindowState]:
    """Fetch the node's inputs over [start, end] and classify windows of ``window`` seconds
    (``fetch_mismatch_inputs`` then ``window_states``).  The link ceiling's observed part is the
    highest per-tick rate seen in [start - ceiling_lookback_s, end].  ``tier`` (``raw``, ``1m``,
    ``1h``) forces the store tier read; by default windows of 2 min or more over more than an hour
    read the 1-minute rollups (2 h windows over more than 2 days the hourly ones), which hold
    exact mean rates for counters."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    if end <= start or w <= 0:
        return []
    inputs = fetch_mismatch_inputs(store, node, start, end, w, ceiling_lookback_s, tier)
    return window_states(inputs, start, end, w, th)


def state_fractions(states: Sequence[WindowState]) -> dict[str, float]:
    """Share of windows in each state (for summaries and acceptance checks)."""
    if not states:
        return {}
    out: dict[str, float] = {}
    for s in states:
        out[s.state] = out.get(s.state, 0.0) + 1.0
    return {k: v / len(states) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def sliding_states(store: StoreReader, node: str, start: float, end: float, window: float | None = None,
                   step: float = 1.0, thresholds: MismatchThresholds | None = None) -> list[WindowState]:
    """Windows of ``window`` seconds every ``step`` seconds that lie fully inside [start, end]
    (the view the per-tick tracker has), sorted by start: one fetch, then
    ``sliding_window_states``."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    if end - start < w:
        return []
    return sliding_window_states(fetch_mismatch_inputs(store, node, start, end, w), w, step, th)
