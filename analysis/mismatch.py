"""The three-way coordination-mismatch detector: accelerator vs link vs host (and network).

Pure functions over inputs fetched first.  ``classify_window(features, thresholds)`` decides one
window from its features; ``window_states(inputs, start, end, window)`` cuts the node's
``MismatchInputs`` (``triscope.analysis.mismatch_inputs.fetch_mismatch_inputs``) into windows,
builds each window's features with ``triscope.analysis.features.window_features`` (the same
function the per-tick ``triscope.analysis.online.MismatchTracker`` uses) and classifies them.
``node_states(store, node, start, end)`` and ``sliding_states`` are the fetch and the pure part in one
call, for callers that hold a store.

Inputs (metric names from ``triscope.core.metrics``):

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

* per workload (docs/workloads.md): ``triscope_accelerator_workload_info``,
  ``triscope_workload_processes``, ``triscope_workload_sm_ratio`` (which workload a verdict is
  labelled with), ``triscope_workload_feeder_busy_ratio``, ``triscope_workload_cpu_wait_ratio``,
  ``triscope_workload_cpu_pressure_ratio``, ``triscope_workload_cpu_seconds_total``,
  ``triscope_workload_cpu_periods_total`` / ``_throttled_periods_total`` (whether the host limits the
  accelerator), ``triscope_workload_tcp_retransmits_total`` / ``_segments_sent_total`` (whether its
  own network does).

States (``STATES``): ``idle``, ``demand-limited``, ``compute-bound``, ``balanced``, ``io-saturated``,
``staging-bound``, ``network-bound``, decided per accelerator (``triscope.analysis.verdict``); the
score is the share of accelerator time lost to I/O (0..1).  ``node_states`` gives the node's
roll-up per window (its worst accelerator), ``accelerator_states`` every accelerator's state with
its dominant workload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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
    WAIT_KEYED,
    WORKLOAD_CPU,
    WORKLOAD_CPU_PERIODS,
    WORKLOAD_CPU_PRESSURE,
    WORKLOAD_CPU_THROTTLED,
    WORKLOAD_CPU_WAIT,
    WORKLOAD_FEEDER,
    WORKLOAD_FIELDS,
    WORKLOAD_INFO,
    WORKLOAD_METRICS,
    WORKLOAD_PROCESSES,
    WORKLOAD_SM,
    WORKLOAD_TCP_RETRANSMITS,
    WORKLOAD_TCP_SEGMENTS,
    AcceleratorFeatures,
    AcceleratorWindow,
    WindowFeatures,
    WindowValues,
    WorkloadKey,
    WorkloadWindow,
    accelerator_key,
    accelerator_labels,
    buses_of_gpus,
    dma_series_by_accelerator,
    effective_ceiling,
    is_pressure_input,
    link_ids,
    negotiated_capacity,
    own_dma_series,
    wait_subkey,
    window_features,
    workload_key,
)
from triscope.analysis.mismatch_inputs import MismatchInputs, fetch_mismatch_inputs
from triscope.analysis.reader import SeriesPoints, StoreReader, label_name
from triscope.analysis.verdict import (  # noqa: F401 - re-exported
    AcceleratorVerdict,
    NodeVerdict,
    accelerator_evidence,
    classify_accelerator,
    classify_window,
)
from triscope.core.pcie import link_capacity_bytes_per_second  # noqa: F401 - re-exported


@dataclass(slots=True)
class WindowState:
    """The node's roll-up over one stored window (``node_states``)."""

    start: float
    end: float
    state: str
    score: float
    evidence: dict[str, Any]

    @property
    def pin_churn(self) -> bool:
        return bool(self.evidence.get("pin_churn"))


@dataclass(slots=True)
class AcceleratorState:
    """One accelerator over one stored window (``accelerator_states``): its state, score, dominant
    workload (``namespace``, ``pod``, ``container``, ``workload``; empty strings when none) and
    evidence."""

    start: float
    end: float
    accelerator: str                 # "gpu=0", "chip=0,npu=1"
    state: str
    score: float
    workload: dict[str, str]
    evidence: dict[str, Any]
    pin_churn: bool = False

    @property
    def labels(self) -> dict[str, str]:
        """Its accelerator labels: ``{"gpu": "0"}``, ``{"npu": "1", "chip": "0"}``."""
        return accelerator_labels(self.accelerator)


@dataclass(slots=True)
class WindowVerdict:
    """One stored window: the node's roll-up and every accelerator's verdict."""

    start: float
    end: float
    verdict: NodeVerdict

    def node(self) -> WindowState:
        v = self.verdict
        return WindowState(self.start, self.end, v.state, v.score, v.evidence)

    def accelerators(self) -> list[AcceleratorState]:
        return [AcceleratorState(self.start, self.end, a.accelerator, a.state, a.score, a.workload, a.evidence,
                                 a.pin_churn) for a in self.verdict.accelerators]


# ---------------------------------------------------------------------------------------------- stored windows
_NONE: tuple[float, ...] = ()


def _cut(sp: SeriesPoints, start: float, w: float, n: int) -> list[Sequence[float]]:
    """The finite values of a series in each of ``n`` windows of ``w`` seconds from ``start``
    (window i holds start + i w <= t < start + (i + 1) w), in time order."""
    return _cut_last(sp, start, w, n)[0]


def _cut_last(sp: SeriesPoints, start: float, w: float, n: int
              ) -> tuple[list[Sequence[float]], list[float | None]]:
    """``_cut``, and the time of each window's newest finite point (None: none)."""
    import numpy as np

    if not len(sp.ts):
        return [_NONE] * n, [None] * n
    t = np.asarray(sp.ts, dtype=float)
    v = np.asarray(sp.values, dtype=float)
    idx = np.floor((t - start) / w).astype(np.int64)
    ok = (idx >= 0) & (idx < n) & np.isfinite(v)
    idx, v, t = idx[ok], v[ok], t[ok]
    if not len(idx):
        return [_NONE] * n, [None] * n
    order = np.argsort(idx, kind="stable")
    idx, vals, tt = idx[order], v[order].tolist(), t[order].tolist()
    b = np.searchsorted(idx, np.arange(n + 1), side="left").tolist()
    return ([vals[b[i]:b[i + 1]] for i in range(n)],
            [tt[b[i + 1] - 1] if b[i + 1] > b[i] else None for i in range(n)])


def _workload_windows(series: Sequence[SeriesPoints], start: float, w: float, n: int
                      ) -> dict[str, list[list[WorkloadWindow]]]:
    """Accelerator -> for each window, its workloads' values (``WorkloadWindow``)."""
    by: dict[str, dict[WorkloadKey, list[SeriesPoints]]] = {}
    for sp in series:
        acc = accelerator_key(sp.labels)
        if acc is not None:
            by.setdefault(acc, {}).setdefault(workload_key(sp.labels), []).append(sp)
    out: dict[str, list[list[WorkloadWindow]]] = {}
    for acc, wls in by.items():
        per: list[list[WorkloadWindow]] = [[] for _ in range(n)]
        for key, sps in sorted(wls.items()):
            cuts = [((sp.metric, wait_subkey(sp.metric, sp.labels) if sp.metric in WAIT_KEYED else None),
                     *_cut_last(sp, start, w, n)) for sp in sps]
            for i in range(n):
                last = [lt[i] for _m, _v, lt in cuts if lt[i] is not None]
                if not last:
                    continue
                ww = WorkloadWindow(key, max(x for x in last if x is not None))
                for (metric, sub), vals, _lt in cuts:
                    if not vals[i]:
                        continue
                    if sub is not None:
                        getattr(ww, WAIT_KEYED[metric][0])[sub] = vals[i]
                    elif (fld := WORKLOAD_FIELDS.get(metric)) is not None:
                        setattr(ww, fld, vals[i])
                per[i].append(ww)
        out[acc] = per
    return out


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


def window_verdicts(inputs: MismatchInputs, start: float | None = None, end: float | None = None,
                    window: float | None = None, thresholds: MismatchThresholds | None = None) -> list[WindowVerdict]:
    """Cut [start, end) (default: the inputs' range) into windows of ``window`` seconds (default
    ``thresholds.window_s``) and classify each one: the node's roll-up and every accelerator.
    Windows without accelerator data are left out.  Pure: no store, no clock."""
    th = thresholds or default_thresholds()
    out: list[WindowVerdict] = []
    for ws, we, feats in window_feature_list(inputs, start, end, window, th):
        v = classify_window(feats, th)
        if v is not None:
            out.append(WindowVerdict(ws, we, v))
    return out


def window_feature_list(inputs: MismatchInputs, start: float | None = None, end: float | None = None,
                        window: float | None = None, thresholds: MismatchThresholds | None = None
                        ) -> list[tuple[float, float, WindowFeatures]]:
    """(start, end, features) of each window ``window_verdicts`` classifies (root cause reads an
    episode's chain from these: one window as long as the episode).

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
    devices = [sp.labels.get("device") for sp in inputs.dma_maps]
    dma_cut = [_cut(sp, start, w, n) for sp in inputs.dma_maps]
    workloads = _workload_windows(inputs.workloads, start, w, n)
    util = {label_name(sp.labels): _cut(sp, start, w, n) for sp in inputs.util}
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
    own = own_dma_series(devices, (b for bs in buses.values() for b in bs))
    rtx = [_cut(sp, start, w, n) for sp in inputs.retransmits]

    out: list[tuple[float, float, WindowFeatures]] = []
    for i in range(n):
        if not any(a[1][i] for a in accs):
            continue
        # which DMA series are an accelerator's own, among those with points in this window (the
        # tracker's view: a series it has no rate for in its window is not there)
        present = [j for j in range(len(devices)) if dma_cut[j][i]]
        dma_of = dma_series_by_accelerator([devices[j] for j in present], buses) if present else None
        values = WindowValues(
            [AcceleratorWindow(name, busy[i], None if link is None else link[i], ceiling, expected,
                               None if dma_of is None or name not in dma_of else
                               [dma_cut[present[k]][i] for k in dma_of[name]],
                               workloads[name][i] if name in workloads else (),
                               util[name][i] if name in util and util[name][i] else None)
             for name, busy, link, ceiling, expected in accs],
            cpu_busy=cpu[0][i] if len(cpu) == 1 else [v for c in cpu for v in c[i]],
            pressure=[c[i] for c in psi], dma_map_rates=[dma_cut[j][i] for j in own],
            retransmit_rates=[c[i] for c in rtx])
        ws = start + i * w
        out.append((ws, min(end, ws + w), window_features(values)))
    return out


def window_states(inputs: MismatchInputs, start: float | None = None, end: float | None = None,
                  window: float | None = None, thresholds: MismatchThresholds | None = None) -> list[WindowState]:
    """The node's roll-up of each window (``window_verdicts``).  Pure."""
    return [wv.node() for wv in window_verdicts(inputs, start, end, window, thresholds)]


def accelerator_window_states(inputs: MismatchInputs, start: float | None = None, end: float | None = None,
                              window: float | None = None, thresholds: MismatchThresholds | None = None
                              ) -> list[AcceleratorState]:
    """Every accelerator's state in each window (``window_verdicts``), by window start, then
    accelerator.  Pure."""
    return [a for wv in window_verdicts(inputs, start, end, window, thresholds) for a in wv.accelerators()]


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


def accelerator_states(store: StoreReader, node: str, start: float, end: float, window: float | None = None,
                       thresholds: MismatchThresholds | None = None, ceiling_lookback_s: float = 86400.0,
                       tier: str | None = None) -> list[AcceleratorState]:
    """One state per accelerator per window of ``window`` seconds over [start, end], with each
    accelerator's dominant workload: the same fetch as ``node_states``
    (``fetch_mismatch_inputs``), then ``accelerator_window_states``."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    if end <= start or w <= 0:
        return []
    inputs = fetch_mismatch_inputs(store, node, start, end, w, ceiling_lookback_s, tier)
    return accelerator_window_states(inputs, start, end, w, th)


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
