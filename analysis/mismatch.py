"""The three-way coordination-mismatch detector: accelerator vs link vs host (and network).

Pure functions.  ``classify_window(features, thresholds)`` decides one window from its features;
``node_states(store, node, start, end)`` cuts a stored range into windows, builds the features
from the stored series and classifies each one.  ``triscope.analysis.online.MismatchTracker`` does the
same per agent tick.

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
* pin churn: ``triscope_dma_map_total`` (all devices/directions) as maps/s;
* network: ``triscope_tcp_retransmits_total`` as retransmits/s.

States: ``idle``, ``compute-bound``, ``balanced``, ``io-saturated``, ``staging-bound``,
``network-bound``; the score is the share of accelerator time lost to I/O (0..1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.pcie import link_capacity_bytes_per_second

STATES: tuple[str, ...] = ("idle", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound")
IO_STATES = frozenset({"io-saturated", "staging-bound", "network-bound"})

# metric names the detector reads
GPU_BUSY = "triscope_gpu_sm_active_ratio"
NPU_BUSY = "triscope_npu_aicore_utilization_ratio"
PCIE_RX = "triscope_gpu_pcie_rx_bytes_total"
PCIE_TX = "triscope_gpu_pcie_tx_bytes_total"
LINK_CAPACITY = ("triscope_gpu_pcie_link_capacity_bytes_per_second", "triscope_pcie_link_capacity_bytes_per_second")
LINK_SPEED = ("triscope_gpu_pcie_link_speed_gts", "triscope_pcie_link_speed_gts")
LINK_WIDTH = ("triscope_gpu_pcie_link_width", "triscope_pcie_link_width")
GPU_INFO = "triscope_gpu_info"
CPU_BUSY = "triscope_cpu_busy_ratio"
PRESSURE = "triscope_pressure_ratio"
DMA_MAPS = "triscope_dma_map_total"
RETRANSMITS = "triscope_tcp_retransmits_total"
INPUT_METRICS = (GPU_BUSY, NPU_BUSY, PCIE_RX, PCIE_TX, CPU_BUSY, PRESSURE, DMA_MAPS, RETRANSMITS,
                 *LINK_CAPACITY, *LINK_SPEED, *LINK_WIDTH)


# ---------------------------------------------------------------------------------------------- links
def effective_ceiling(negotiated: float | None, observed_max: float | None, th: MismatchThresholds) -> float:
    """The rate a link can really carry: the negotiated capacity x efficiency, raised to the
    highest rate actually seen on it (links that beat the efficiency estimate), or, with no
    negotiated capacity, the observed maximum (floored) or the configured fallback."""
    obs = observed_max or 0.0
    if negotiated and negotiated > 0:
        return max(negotiated * th.link_efficiency, obs)
    if th.fallback_link_bytes_per_second > 0:
        return max(th.fallback_link_bytes_per_second, obs)
    return max(obs, th.min_ceiling_bytes_per_second)


# ---------------------------------------------------------------------------------------------- features
@dataclass(slots=True)
class AcceleratorFeatures:
    """One accelerator over one window.  ``None``: no data."""

    name: str                               # "gpu=0", "npu=1,chip=0"
    busy: float | None                      # mean SM activity / AICore utilisation, 0..1
    link_bytes_per_second: float | None = None  # mean of the busier PCIe direction
    link_ceiling: float | None = None       # effective one-way ceiling, bytes/s
    coverage: float = 1.0                   # share of the window's ticks with busy data
    # the window's typical (median) tick: what the state is decided on, so a window that straddles
    # a change (half idle, half pinned copies) takes one side instead of a made-up middle; the
    # means above give the score (share of time lost).  None: use the means.
    busy_typical: float | None = None
    link_typical_bytes_per_second: float | None = None

    @property
    def link_util(self) -> float | None:
        if self.link_bytes_per_second is None or not self.link_ceiling:
            return None
        return min(1.5, self.link_bytes_per_second / self.link_ceiling)

    @property
    def link_util_typical(self) -> float | None:
        if self.link_typical_bytes_per_second is None:
            return self.link_util
        if not self.link_ceiling:
            return None
        return min(1.5, self.link_typical_bytes_per_second / self.link_ceiling)


@dataclass(slots=True)
class WindowFeatures:
    """Everything the classifier looks at for one window of one node."""

    accelerators: list[AcceleratorFeatures]
    cpu_busy: float | None = None           # 0..1, all CPUs
    pressure: float | None = None           # max of PSI cpu/memory "some" avg10, 0..1
    dma_map_rate: float | None = None       # DMA maps/s, all devices
    retransmit_rate: float | None = None    # TCP retransmits/s


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


# ---------------------------------------------------------------------------------------------- store side
def _acc_name(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _window_means(ts: Sequence[float], vals: Sequence[float], start: float, window: float, n: int) -> tuple[Any, Any]:
    import numpy as np

    sums = np.zeros(n)
    counts = np.zeros(n)
    if len(ts):
        t = np.asarray(ts, dtype=float)
        v = np.asarray(vals, dtype=float)
        idx = np.floor((t - start) / window).astype(np.int64)
        ok = (idx >= 0) & (idx < n) & np.isfinite(v)
        np.add.at(sums, idx[ok], v[ok])
        np.add.at(counts, idx[ok], 1)
    return sums, counts


def _window_medians(ts: Sequence[float], vals: Sequence[float], start: float, window: float, n: int) -> Any:
    """Upper median of the points in each window (NaN where none): always one of the window's own
    points, so a window split half and half takes one side rather than the average of both."""
    import numpy as np

    out = np.full(n, np.nan)
    if not len(ts):
        return out
    t = np.asarray(ts, dtype=float)
    v = np.asarray(vals, dtype=float)
    idx = np.floor((t - start) / window).astype(np.int64)
    ok = (idx >= 0) & (idx < n) & np.isfinite(v)
    idx, v = idx[ok], v[ok]
    if not len(v):
        return out
    order = np.lexsort((v, idx))
    idx, v = idx[order], v[order]
    counts = np.bincount(idx, minlength=n)
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    out[has] = v[offsets[has] + counts[has] // 2]
    return out


def _bus_ids(store: Any, node: str) -> set[str]:
    return {i.labels["bus_id"] for i in store.series(node=node, metric=GPU_INFO) if i.labels.get("bus_id")}


def accelerator_dma_series(series: Sequence[Any], bus_ids: set[str]) -> list[Any]:
    """The DMA-map series of the accelerators' own PCI devices when they can be told apart (a NIC
    maps per packet, which is not pin churn); all of them otherwise."""
    mine = [sd for sd in series if sd.info.labels.get("device") in bus_ids]
    return mine if mine else list(series)


def _link_labels(store: Any, node: str, labels: Mapping[str, str], start: float, end: float) -> list[dict[str, str]]:
    """Label sets that identify the accelerator's PCIe link in the link metrics: its PCI address
    (``device``, from ``triscope_gpu_info{gpu,bus_id}``) and, as a fallback, its ``gpu`` label."""
    gpu = labels.get("gpu")
    if gpu is None:
        return []
    out: list[dict[str, str]] = []
    for info in store.series(node=node, metric=GPU_INFO, labels={"gpu": gpu}):
        bus = info.labels.get("bus_id")
        if bus and {"device": bus} not in out:
            out.append({"device": bus})
    out.append({"gpu": gpu})
    return out


def _negotiated_capacity(store: Any, node: str, labels: Mapping[str, str], start: float, end: float) -> float | None:
    """gen x width capacity of the accelerator's link as currently trained (``kind="current"``)."""
    for key in _link_labels(store, node, labels, start, end):

        def latest(metrics: Iterable[str], key: dict[str, str] = key) -> float | None:
            for m in metrics:
                best: float | None = None
                for sd in store.query(m, node=node, labels=key, start=start - 3600, end=end, max_points=50,
                                      rate=False):
                    if sd.info.labels.get("kind", "current") != "current" or not sd.values:
                        continue
                    best = sd.values[-1]
                if best is not None:
                    return best
            return None

        speed, width = latest(LINK_SPEED), latest(LINK_WIDTH)
        if speed and width:
            return link_capacity_bytes_per_second(speed, width)
        cap = latest(LINK_CAPACITY)
        if cap:
            return cap
    return None


def node_states(store: Any, node: str, start: float, end: float, window: float | None = None,
                thresholds: MismatchThresholds | None = None, ceiling_lookback_s: float = 86400.0,
                tier: str | None = None) -> list[WindowState]:
    """Cut [start, end) into windows of ``window`` seconds (default ``thresholds.window_s``) and
    classify each one from the node's stored series.  Windows without accelerator data are left
    out.  The link ceiling's observed part is the highest per-tick rate seen in
    [start - ceiling_lookback_s, end].  ``tier`` (``raw``, ``1m``, ``1h``) forces the store tier read;
    by default windows of 2 min or more over more than an hour read the 1-minute rollups (2 h
    windows over more than 2 days the hourly ones), which hold exact mean rates for counters.
    """
    import numpy as np

    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    if end <= start or w <= 0:
        return []
    n = int(math.ceil((end - start) / w))
    span = end - start
    if tier is None:  # coarse windows over long ranges: rollups (counter rates per bucket are exact means)
        tier = "1h" if w >= 7200 and span > 2 * 86400 else "1m" if w >= 120 and span > 3600 else None
    mp = None if span <= 6 * 3600 and tier in (None, "raw") else max(2000, int(span / w) * 2)

    def q(metric: str) -> list[Any]:
        return store.query(metric, node=node, start=start, end=end, max_points=mp, tier=tier)

    def host_mean(series_list: list[Any]) -> tuple[Any, Any]:
        tot_s = np.zeros(n)
        tot_c = np.zeros(n)
        for sd in series_list:
            s, c = _window_means(sd.ts, sd.values, start, w, n)
            tot_s += s
            tot_c += c
        return tot_s, tot_c

    def summed_rate(series_list: list[Any]) -> Any:
        """Sum over series of each series' window-mean rate (NaN where none has data)."""
        out = np.full(n, np.nan)
        for sd in series_list:
            s, c = _window_means(sd.ts, sd.values, start, w, n)
            m = np.where(c > 0, s / np.maximum(c, 1), np.nan)
            out = np.where(np.isnan(out), m, np.where(np.isnan(m), out, out + m))
        return out

    cpu_s, cpu_c = host_mean(q(CPU_BUSY))
    cpu = np.where(cpu_c > 0, cpu_s / np.maximum(cpu_c, 1), np.nan)
    pressure = np.full(n, np.nan)
    for sd in q(PRESSURE):
        if sd.info.labels.get("resource") in ("cpu", "memory") and sd.info.labels.get("kind", "some") == "some":
            s, c = _window_means(sd.ts, sd.values, start, w, n)
            m = np.where(c > 0, s / np.maximum(c, 1), np.nan)
            pressure = np.fmax(pressure, m)
    dma = summed_rate(accelerator_dma_series(q(DMA_MAPS), _bus_ids(store, node)))
    rtx = summed_rate(q(RETRANSMITS))

    # accelerators
    accs: list[tuple[str, Any, Any, Any, float, Any, Any]] = []  # name, busy, coverage, link, ceiling, medians
    busy_series = q(GPU_BUSY) + q(NPU_BUSY)
    rx = {_acc_name(sd.info.labels): sd for sd in q(PCIE_RX)}
    tx = {_acc_name(sd.info.labels): sd for sd in q(PCIE_TX)}
    for sd in busy_series:
        name = _acc_name(sd.info.labels)
        s, c = _window_means(sd.ts, sd.values, start, w, n)
        busy = np.where(c > 0, s / np.maximum(c, 1), np.nan)
        busy_med = _window_medians(sd.ts, sd.values, start, w, n)
        # points a window normally holds (the median, so a finer-grained tail does not set it)
        nz = c[c > 0]
        expected = max(float(np.median(nz)) if len(nz) else 1.0, 1.0)
        coverage = np.minimum(1.0, c / expected)
        link = None
        link_med = None
        ceiling = 0.0
        if name in rx or name in tx:
            link = np.full(n, np.nan)
            # busier direction per point: align rx and tx on timestamps
            pts: dict[float, float] = {}
            for d in (rx.get(name), tx.get(name)):
                if d is None:
                    continue
                for t, v in zip(d.ts, d.values, strict=False):
                    if v > pts.get(t, -1.0):
                        pts[t] = v
            if pts:
                tt = sorted(pts)
                vv = [pts[t] for t in tt]
                ls, lc = _window_means(tt, vv, start, w, n)
                link = np.where(lc > 0, ls / np.maximum(lc, 1), np.nan)
                link_med = _window_medians(tt, vv, start, w, n)
                observed = max(vv)
                if ceiling_lookback_s > 0:
                    for direction in (PCIE_RX, PCIE_TX):
                        for hist in store.query(direction, node=node, labels=dict(sd.info.labels),
                                                start=start - ceiling_lookback_s, end=start, max_points=2000,
                                                tier=tier):
                            if hist.values:
                                observed = max(observed, max(hist.values))
                negotiated = _negotiated_capacity(store, node, sd.info.labels, start, end)
                ceiling = effective_ceiling(negotiated, observed, th)
        accs.append((name, busy, coverage, link, ceiling, busy_med, link_med))

    out: list[WindowState] = []
    for i in range(n):
        a_list = []
        for name, busy, cov, link, ceiling, busy_med, link_med in accs:
            b = float(busy[i])
            if math.isnan(b):
                continue
            lb = None if link is None or math.isnan(float(link[i])) else float(link[i])
            lm = None if link_med is None or math.isnan(float(link_med[i])) else float(link_med[i])
            bmed = float(busy_med[i])
            a_list.append(AcceleratorFeatures(name, b, lb, ceiling or None, float(cov[i]),
                                              None if math.isnan(bmed) else bmed, lm))
        if not a_list:
            continue
        f = WindowFeatures(
            a_list,
            cpu_busy=None if math.isnan(cpu[i]) else float(cpu[i]),
            pressure=None if math.isnan(pressure[i]) else float(pressure[i]),
            dma_map_rate=None if math.isnan(dma[i]) else float(dma[i]),
            retransmit_rate=None if math.isnan(rtx[i]) else float(rtx[i]),
        )
        v = classify_window(f, th)
        if v is None:
            continue
        ws = start + i * w
        out.append(WindowState(ws, min(end, ws + w), v.state, v.score, v.evidence))
    return out


def state_fractions(states: Sequence[WindowState]) -> dict[str, float]:
    """Share of windows in each state (for summaries and acceptance checks)."""
    if not states:
        return {}
    out: dict[str, float] = {}
    for s in states:
        out[s.state] = out.get(s.state, 0.0) + 1.0
    return {k: v / len(states) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def sliding_states(store: Any, node: str, start: float, end: float, window: float | None = None,
                   step: float = 1.0, thresholds: MismatchThresholds | None = None) -> list[WindowState]:
    """Windows of ``window`` seconds every ``step`` seconds that lie fully inside [start, end]
    (the view the per-tick tracker has), sorted by start."""
    th = thresholds or default_thresholds()
    w = float(window or th.window_s)
    out: list[WindowState] = []
    k = 0
    while k * step < w and start + k * step + w <= end:
        s0 = start + k * step
        n_full = int((end - s0) // w)
        out += node_states(store, node, s0, s0 + n_full * w, window=w, thresholds=th)
        k += 1
    return sorted(out, key=lambda x: x.start)
