"""Historical root-cause queries: "what changed on this node in this window?"

``rank_causes(store, node, start, end)`` compares every stored series of the node in the window
with a baseline (by default the preceding window of the same length), scores each change by how
far it moved (robust z-score, bursts count through the window's peak) and how early in the
window it started, groups the changes into candidate causes (host staging, DMA mapping / pin
churn, network, PCIe link load, PCIe/IOMMU errors, GPU health, accelerator activity,
application SLIs...), merges the window's events (XID, AER, IOMMU faults, retransmit bursts with
their peers, mismatch state changes, remediation actions) and adds what the mismatch detector
says about the window compared with the baseline.  Causes come back ranked, each with evidence.

Scoring, per series:  ``effect = max(|mean_w - mean_b|, 0.5 * |peak_w - mean_b|)``,
``z = effect / max(std_b, 5 % of |mean_b|, 1 % of |mean_w|, eps)``, ``magnitude = log(1+z)/log(1+100)``
(0 below z = 3, 1 at z >= 100), ``score = magnitude * (0.6 + 0.4 * earliness) * role weight``, where
earliness is 1 when the series had already moved at the window's start and 0 at its end, and the
role weight is 1 for causes, 0.8 for link/traffic load, 0.6 for symptoms (accelerator activity,
application SLIs), 0.3 for the agent's own metrics; a cause or load series moving in its benign
direction (DMA maps falling, memory available rising) counts half.  A cause's score is its best series score, plus
0.1 per further changed series (at most 0.3), plus its events (0.5 + 0.1 per event, at most 1, x
weight), plus 0.8 x the increase (window over baseline) in the share of mismatch-detector windows
that point at it (staging-bound -> host staging, pin churn -> DMA mapping, io-saturated -> PCIe
load, network-bound -> network).

Fetch first, then compute: ``fetch_rca_inputs`` (``triscope.analysis.rca_inputs``) reads the
node's series in one ``query`` per metric, the events and the stage counters; ``rank_causes_from``
ranks from that without the store (the mismatch detector runs over the same points, through
``mismatch_inputs_from_series`` and ``window_states``).  ``rank_causes`` does both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import GPU_INFO, INPUT_METRICS
from triscope.analysis.mismatch import window_states
from triscope.analysis.mismatch_inputs import mismatch_inputs_from_series
from triscope.analysis.rca_inputs import (
    DERIVED_PREFIX,
    RCAInputs,
    data_end_of,
    data_start_of,
    fetch_onset_points,
    fetch_rca_inputs,
)
from triscope.analysis.rca_noise import agent_trouble, is_agent_metric, never_a_cause, noise_floor
from triscope.analysis.reader import SeriesPoints, StoreReader

DETECTOR_METRICS = frozenset(INPUT_METRICS) | {GPU_INFO}

# ---------------------------------------------------------------------------------------------- categories
ROLE_WEIGHT = {"cause": 1.0, "load": 0.8, "symptom": 0.6, "self": 0.3, "context": 0.2}


@dataclass(frozen=True, slots=True)
class Category:
    key: str
    title: str
    role: str
    match: Callable[[str, Mapping[str, str]], bool]


def _res(labels: Mapping[str, str], *names: str) -> bool:
    return labels.get("resource") in names


# the agent's per-workload host evidence (docs/workloads.md): its feeders, CPU wait and pressure, CPU time
HOST_WORKLOAD_METRICS = frozenset({"triscope_workload_feeder_busy_ratio", "triscope_workload_cpu_wait_ratio",
                                   "triscope_workload_cpu_pressure_ratio", "triscope_workload_cpu_seconds_total"})

CATEGORIES: tuple[Category, ...] = (
    Category("derived", "triscope's own analysis", "self", lambda m, lab: m.startswith(DERIVED_PREFIX)),
    Category("network", "Network retransmits", "cause",
             lambda m, lab: m.startswith(("triscope_tcp_retransmits", "triscope_tcp_synack_retransmits"))),
    Category("network_traffic", "Network traffic", "load", lambda m, lab: m.startswith("triscope_tcp_")),
    Category("iommu_faults", "IOMMU faults / DMA mapping errors", "cause",
             lambda m, lab: m in ("triscope_iommu_page_faults_total", "triscope_dma_map_errors_total")),
    Category("dma_mapping", "DMA mapping / host memory pin churn", "cause",
             lambda m, lab: m.startswith(("triscope_dma_", "triscope_iommu_map", "triscope_iommu_unmap"))),
    Category("pcie_errors", "PCIe link errors / degraded link", "cause",
             lambda m, lab: m.startswith(("triscope_pcie_aer", "triscope_pcie_link_degraded",
                                          "triscope_pcie_link_speed", "triscope_pcie_link_width"))
             or m == "triscope_gpu_pcie_replays_total"),
    Category("pcie_load", "PCIe link load (host <-> device copies)", "load",
             lambda m, lab: m.startswith(("triscope_gpu_pcie_rx", "triscope_gpu_pcie_tx", "triscope_gpu_nvlink_"))),
    Category("numa_locality", "NUMA locality (the workload runs or keeps its pages off its accelerator's socket)",
             "cause", lambda m, lab: m in ("triscope_workload_cpu_local_ratio", "triscope_workload_memory_local_ratio")),
    Category("host_staging", "Host staging (CPU copying / CPU pressure)", "cause",
             lambda m, lab: m == "triscope_cpu_busy_ratio"
             or (m == "triscope_cpu_seconds_total" and lab.get("mode") in ("user", "system", "nice", "irq", "softirq"))
             or (m.startswith("triscope_pressure_") and _res(lab, "cpu"))
             or m in HOST_WORKLOAD_METRICS),
    Category("host_memory", "Host memory pressure", "cause",
             lambda m, lab: m.startswith("triscope_memory_") or (m.startswith("triscope_pressure_") and _res(lab, "memory"))),
    Category("host_io", "Host I/O pressure", "cause",
             lambda m, lab: m.startswith("triscope_pressure_") and _res(lab, "io")),
    Category("gpu_health", "Accelerator health (XID, lost GPU, thermal/throttle)", "cause",
             lambda m, lab: m.startswith(("triscope_gpu_xid", "triscope_gpu_up", "triscope_gpu_temperature",
                                          "triscope_gpu_throttle", "triscope_npu_health", "triscope_npu_temperature"))),
    Category("accelerator_activity", "Accelerator activity", "symptom",
             lambda m, lab: m.startswith(("triscope_gpu_", "triscope_npu_", "triscope_workload_",
                                          "triscope_accelerator_workload"))),
    Category("agent", "triscope agent itself", "self", lambda m, lab: is_agent_metric(m)),
    Category("host_other", "Other host metrics", "symptom", lambda m, lab: m.startswith("triscope_")),
    Category("application", "Application SLIs", "symptom", lambda m, lab: True),
)
CATEGORY_BY_KEY = {c.key: c for c in CATEGORIES}
# events -> category (and weight of one event kind)
EVENT_CATEGORY = {"xid": "gpu_health", "gpu_lost": "gpu_health", "aer": "pcie_errors", "iommu_fault": "iommu_faults",
                  "retransmit_burst": "network", "remediation": "remediation", "collector": "agent"}
MISMATCH_CATEGORY = {"staging-bound": "host_staging", "io-saturated": "pcie_load", "network-bound": "network"}
CATEGORY_BY_KEY["remediation"] = Category("remediation", "Remediation actions in the window", "context",
                                          lambda m, lab: False)


# metrics where a fall is the bad direction (for all others a rise is)
DOWN_IS_BAD = frozenset({"triscope_memory_available_bytes", "triscope_gpu_up", "triscope_pcie_link_speed_gts",
                         "triscope_pcie_link_width", "triscope_collector_up", "triscope_probe_attached"})
BENIGN_FACTOR = 0.5
PRIOR_WEIGHT = 0.8


def _bad_direction(metric: str) -> str:
    return "down" if metric in DOWN_IS_BAD else "up"


def categorize(metric: str, labels: Mapping[str, str]) -> Category:
    for c in CATEGORIES:
        if c.match(metric, labels):
            return c
    return CATEGORIES[-1]


# ---------------------------------------------------------------------------------------------- results
@dataclass(slots=True)
class SeriesChange:
    metric: str
    labels: dict[str, str]
    category: str
    baseline: float | None
    window: float | None
    peak: float | None
    z: float
    onset: float | None
    direction: str               # up | down | appeared | vanished
    score: float
    series_id: int = 0           # the stored series (refining onsets reads it again)
    magnitude: float = 0.0       # 0..1, before earliness and role weight

    @property
    def series(self) -> str:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.metric}{{{lab}}}" if lab else self.metric

    def as_dict(self) -> dict[str, Any]:
        return {"type": "series", "series": self.series, "category": self.category, "baseline": _rnd(self.baseline),
                "window": _rnd(self.window), "peak": _rnd(self.peak), "z": round(self.z, 2), "onset": self.onset,
                "direction": self.direction, "score": round(self.score, 4)}


@dataclass(slots=True)
class Cause:
    key: str
    title: str
    score: float
    onset: float | None
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.key, "title": self.title, "score": round(self.score, 4), "onset": self.onset,
                "summary": self.summary, "peers": self.peers, "evidence": self.evidence}


@dataclass(slots=True)
class RCAResult:
    node: str
    start: float
    end: float
    baseline_start: float
    baseline_end: float
    causes: list[Cause]
    changes: list[SeriesChange]
    events: list[dict[str, Any]]
    mismatch: dict[str, Any]
    series_examined: int
    stages: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "start": self.start, "end": self.end,
                "baseline": {"start": self.baseline_start, "end": self.baseline_end},
                "series_examined": self.series_examined, "mismatch": self.mismatch, "stages": self.stages,
                "causes": [c.as_dict() for c in self.causes], "events": self.events}


def _rnd(x: float | None) -> float | None:
    if x is None:
        return None
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


# ---------------------------------------------------------------------------------------------- scoring
Z_MIN = 3.0
Z_MAX = 100.0


def score_series(bts: Any, bvals: Any, wts: Any, wvals: Any,
                 start: float, end: float, counter: bool) -> tuple[float, float, float | None, str,
                                                                   float | None, float | None, float | None]:
    """(magnitude 0..1, z, onset, direction, baseline mean, window mean, window peak) of one series."""
    import numpy as np

    b = np.asarray(bvals, dtype=float)
    w = np.asarray(wvals, dtype=float)
    b = b[np.isfinite(b)]
    wmask = np.isfinite(w)
    w_t = np.asarray(wts, dtype=float)[wmask]
    w = w[wmask]
    if len(w) == 0:
        if len(b) == 0:
            return 0.0, 0.0, None, "up", None, None, None
        mb = float(b.mean())
        if counter and abs(mb) < 1e-12:
            return 0.0, 0.0, None, "down", mb, None, None
        return 0.8, Z_MAX, start, "vanished", mb, None, None
    mw = float(w.mean())
    if len(b) == 0:
        if not counter:
            return 0.5, Z_MAX, float(w_t[0]), "appeared", None, mw, float(w.max())
        b = np.zeros(1)
    mb = float(b.mean())
    sb = float(b.std()) if len(b) > 1 else 0.0
    dev = np.abs(w - mb)
    ipk = int(dev.argmax())
    peak = float(w[ipk])
    effect = max(abs(mw - mb), 0.5 * float(dev[ipk]))
    scale = max(sb, 0.05 * abs(mb), 0.01 * abs(mw), 1e-12)
    z = effect / scale
    if z < Z_MIN or effect <= 1e-12:
        return 0.0, z, None, "up" if mw >= mb else "down", mb, mw, peak
    mag = min(1.0, math.log1p(z) / math.log1p(Z_MAX))
    thr = max(3 * scale, 0.5 * effect)
    over = dev > thr
    onset = None
    if over.any():
        idx = np.nonzero(over)[0]
        onset = float(w_t[idx[0]])
    # the direction of whatever made the effect: the mean shift, or the peak for a burst
    ref = mw if abs(mw - mb) >= 0.5 * float(dev[ipk]) else peak
    direction = "up" if ref >= mb else "down"
    return mag, z, onset, direction, mb, mw, peak


REFINE_TOP = 24


def refine_onset(ts: Sequence[float], vals: Sequence[float], mb: float, mw: float, peak: float | None) -> float | None:
    """First time the series left the baseline mean by half the window's effect and stayed out
    (median of that point and the next three)."""
    import numpy as np

    v = np.asarray(vals, dtype=float)
    if len(v) == 0:
        return None
    effect = abs(mw - mb)
    if peak is not None and 0.5 * abs(peak - mb) > effect:
        effect = 0.5 * abs(peak - mb)
    thr = 0.5 * effect
    if thr <= 0:
        return None
    dev = np.abs(v - mb)
    for i in np.nonzero(dev > thr)[0]:
        if float(np.median(dev[i:i + 4])) > thr:
            return float(ts[int(i)])
    return None


def _earliness(onset: float | None, start: float, end: float) -> float:
    if onset is None or end <= start:
        return 0.0
    return max(0.0, min(1.0, 1.0 - (onset - start) / (end - start)))


# ---------------------------------------------------------------------------------------------- ranking
def series_score(mag: float, onset: float | None, cat: Category, direction: str, metric: str,
                 start: float, end: float) -> float:
    """A moved series' score: magnitude x (0.6 + 0.4 x earliness) x role weight, halved in a cause's
    benign direction."""
    score = mag * (0.6 + 0.4 * _earliness(onset, start, end)) * ROLE_WEIGHT[cat.role]
    if cat.role in ("cause", "load") and direction != _bad_direction(metric):
        score *= BENIGN_FACTOR
    return score


def change_effect(mb: float | None, mw: float | None, peak: float | None) -> float:
    """The size of a change in the series' own unit: the mean shift, or half the peak's distance
    for a burst (what ``score_series`` scores), from 0 for a series that appeared."""
    base = mb if mb is not None else 0.0
    eff = abs(mw - base) if mw is not None else abs(base)
    if peak is not None:
        eff = max(eff, 0.5 * abs(peak - base))
    return eff


APPEARED_GRACE_STEPS = 3.0   # a series whose first point is this many steps from the data's start came with it


def appeared_with_data(sp: SeriesPoints, data_start: float | None, step: float = 1.0) -> bool:
    """A series whose first point is at the start of the node's data: it did not *appear*."""
    return bool(sp.ts) and data_start is not None and sp.ts[0] <= data_start + max(APPEARED_GRACE_STEPS * step, 5.0)


def vanished_with_data(sp: SeriesPoints, data_end: float | None, step: float = 1.0) -> bool:
    """A series whose last point is at the end of the node's data: it did not *vanish*."""
    return bool(sp.ts) and data_end is not None and sp.ts[-1] >= data_end - max(APPEARED_GRACE_STEPS * step, 5.0)


def score_changes(inputs: RCAInputs) -> list[SeriesChange]:
    """Every series that moved in the window against the baseline beyond its noise floor
    (``rca_noise.NOISE_FLOORS``), best score first.  Not changes: series that are never causes,
    the agent's own metrics while the agent was healthy, and series without baseline points when
    the baseline holds no data at all or the series came with the node's data.  Pure."""
    import numpy as np

    start, end, b0, b1 = inputs.start, inputs.end, inputs.baseline_start, inputs.baseline_end
    changes: list[SeriesChange] = []
    data_start = data_start_of(inputs.series, min(b0, start))
    data_end = data_end_of(inputs.series, max(b1, end))
    baseline_has_data = any(sp.ts and bisect_any(sp.ts, b0, b1) for sp in inputs.series)
    window_has_data = any(sp.ts and bisect_any(sp.ts, start, end) for sp in inputs.series)
    agent_ok = not agent_trouble(inputs.series, inputs.events, start, end)
    for sp in inputs.series:
        cat = categorize(sp.metric, sp.labels)
        if cat.key == "derived" or (cat.key == "agent" and agent_ok) or never_a_cause(sp.metric, sp.labels, sp.kind):
            continue
        ts = np.asarray(sp.ts, dtype=float)
        vals = np.asarray(sp.values, dtype=float)
        bm = (ts >= b0) & (ts < b1)
        wm = (ts >= start) & (ts < end)
        if not bm.any() and (not baseline_has_data or appeared_with_data(sp, data_start)):
            continue
        if not wm.any() and (not window_has_data or vanished_with_data(sp, data_end)):
            continue
        mag, z, onset, direction, mb, mw, peak = score_series(ts[bm], vals[bm], ts[wm], vals[wm], start, end,
                                                              sp.kind == "counter")
        if mag <= 0 or change_effect(mb, mw, peak) < noise_floor(sp.metric, sp.labels, sp.kind).floor:
            continue
        changes.append(SeriesChange(sp.metric, dict(sp.labels), cat.key, mb, mw, peak, z, onset, direction,
                                    series_score(mag, onset, cat, direction, sp.metric, start, end), sp.id, mag))
    changes.sort(key=lambda c: -c.score)
    return changes


def bisect_any(ts: Sequence[float], a: float, b: float) -> bool:
    """Whether sorted ``ts`` has a point in [a, b)."""
    import bisect

    i = bisect.bisect_left(ts, a)
    return i < len(ts) and ts[i] < b


def onset_candidates(changes: Sequence[SeriesChange]) -> list[SeriesChange]:
    """The leading changes whose onsets are refined from finer points (hourly reads)."""
    return [ch for ch in changes[:REFINE_TOP]
            if ch.direction in ("up", "down") and ch.baseline is not None and ch.window is not None]


def refine_onsets(changes: list[SeriesChange], points: Mapping[int, SeriesPoints], start: float, end: float) -> None:
    """Move the onsets of ``onset_candidates`` to where their finer ``points`` left the baseline
    (and rescore them), then re-sort.  Pure (changes the list in place)."""
    for ch in onset_candidates(changes):
        sp = points.get(ch.series_id)
        if sp is None or ch.baseline is None or ch.window is None:
            continue
        onset = refine_onset(sp.ts, sp.values, ch.baseline, ch.window, ch.peak)
        if onset is not None:
            ch.onset = onset
            ch.score = series_score(ch.magnitude, onset, CATEGORY_BY_KEY[ch.category], ch.direction, ch.metric,
                                     start, end)
    changes.sort(key=lambda c: -c.score)


def rank_causes_from(inputs: RCAInputs, thresholds: MismatchThresholds | None = None, top: int | None = None,
                     use_mismatch: bool = True, onset_points: Mapping[int, SeriesPoints] | None = None) -> RCAResult:
    """Rank the likely causes of what changed in ``inputs`` (``fetch_rca_inputs``); ``onset_points``
    (``fetch_onset_points`` of ``onset_candidates``) refine the onsets read from hourly rollups.
    Pure: no store, no clock."""
    start, end, b0, b1 = inputs.start, inputs.end, inputs.baseline_start, inputs.baseline_end
    changes = score_changes(inputs)
    if onset_points:
        refine_onsets(changes, onset_points, start, end)

    # events
    ev_dicts: list[dict[str, Any]] = []
    by_cat_events: dict[str, list[Any]] = {}
    for e in inputs.events:
        d = {"type": "event", "ts": e.ts, "kind": e.kind, "severity": e.severity, "message": e.message,
             "details": e.details}
        ev_dicts.append(d)
        cat_key = EVENT_CATEGORY.get(e.kind)
        if e.kind == "mismatch_state" and use_mismatch:
            continue  # the detector is re-run over window and baseline below: listed, not scored twice
        if e.kind == "mismatch_state":
            to = (e.details or {}).get("to")
            cat_key = "dma_mapping" if (e.details or {}).get("pin_churn") and to == "staging-bound" else \
                MISMATCH_CATEGORY.get(to or "")
        if cat_key:
            by_cat_events.setdefault(cat_key, []).append(e)

    # the mismatch detector's view: window vs baseline, from the points already read
    mismatch: dict[str, Any] = {}
    prior: dict[str, float] = {}
    if use_mismatch:
        mismatch, prior = _mismatch_prior(inputs, thresholds)

    causes: dict[str, Cause] = {}

    def cause(key: str) -> Cause:
        c = causes.get(key)
        if c is None:
            cat = CATEGORY_BY_KEY[key]
            c = causes[key] = Cause(key, cat.title, 0.0, None, "")
        return c

    # absolute evidence over the window (``rca_evidence``): how close each suspect is to its limit;
    # what moved counts in proportion (``limit_factor``), as in the timeline's episodes
    from triscope.analysis.rca_evidence import (
        absolute_part,
        evidence_context,
        figures,
        limit_factor,
        strengths,
    )

    figs = figures(evidence_context(inputs.series, inputs.events, thresholds or default_thresholds()), "node",
                   start, end)
    strength = strengths(figs)
    per_cat: dict[str, list[SeriesChange]] = {}
    for ch in changes:
        per_cat.setdefault(ch.category, []).append(ch)
    for key in figs:
        part = absolute_part(strength.get(key))
        if part > 0 and key in CATEGORY_BY_KEY:
            c = cause(key)
            c.score += part
            c.evidence.extend(f.as_dict() for f in sorted(figs[key], key=lambda f: -f.strength) if f.strength >= 0.25)
    for key, chs in per_cat.items():
        c = cause(key)
        c.score += (chs[0].score + min(0.3, 0.1 * (len(chs) - 1))) * limit_factor(key, strength.get(key))
        onsets = [x.onset for x in chs if x.onset is not None]
        c.onset = min(onsets) if onsets else None
        c.evidence.extend(x.as_dict() for x in chs[:8])
    for key, evs in by_cat_events.items():
        c = cause(key)
        w = ROLE_WEIGHT[CATEGORY_BY_KEY[key].role]
        severe = any(e.severity in ("error", "critical") for e in evs)
        c.score += min(1.0, 0.5 + 0.1 * len(evs) + (0.2 if severe else 0.0)) * w
        first = min(e.ts for e in evs)
        c.onset = first if c.onset is None else min(c.onset, first)
        for e in evs[:10]:
            c.evidence.append({"type": "event", "ts": e.ts, "kind": e.kind, "severity": e.severity,
                               "message": e.message, "details": e.details})
        if key == "network":
            c.peers = _peers(evs)
    for key, p in prior.items():
        if p <= 0:
            continue
        c = cause(key)
        c.score += PRIOR_WEIGHT * p
        c.evidence.append({"type": "mismatch", "detail": f"mismatch detector: {p:.0%} more windows point here "
                                                         "than in the baseline", "share": round(p, 4)})
    # peers also from per-peer series
    if "network" in causes:
        for ch in per_cat.get("network", []):
            if "peer" in ch.labels and ch.labels["peer"] not in causes["network"].peers:
                causes["network"].peers.append(ch.labels["peer"])
    out = [c for c in causes.values() if c.score > 0.05 and c.key != "derived"]
    out.sort(key=lambda c: (-c.score, c.onset if c.onset is not None else math.inf))
    for c in out:
        c.summary = _summary(c)
    if top is not None:
        out = out[:top]
    return RCAResult(inputs.node, start, end, b0, b1, out, changes, ev_dicts, mismatch, inputs.series_examined,
                     stage_view(inputs))


def rank_causes(store: StoreReader, node: str, start: float, end: float,
                baseline: tuple[float, float] | None = None, max_points: int = 600,
                thresholds: MismatchThresholds | None = None, top: int | None = None,
                use_mismatch: bool = True) -> RCAResult:
    """Rank the likely causes of what changed on ``node`` in [start, end].

    ``baseline`` (start, end) defaults to the preceding window of the same length.  The fetch
    (``fetch_rca_inputs``) reads every series once over [baseline start, end], in one ``query``
    per metric: raw points downsampled to at most ``2 * max_points`` (min/max preserving) up to an
    hour, 1-minute rollups up to 12 hours, hourly rollups beyond (the onsets of the leading
    changes are then refined from the window's 1-minute rollups, ``fetch_onset_points``); the
    ranking is ``rank_causes_from`` over what was read.
    """
    inputs = fetch_rca_inputs(store, node, start, end, baseline, max_points)
    onset_points = None
    if inputs.tier == "1h":
        onset_points = fetch_onset_points(store, node, onset_candidates(score_changes(inputs)), start, end)
    return rank_causes_from(inputs, thresholds, top, use_mismatch, onset_points)


def stage_view(inputs: RCAInputs) -> dict[str, Any]:
    """Stage skew / pipeline bubbles in the window and the baseline, where the app exports them.  Pure."""
    from triscope.analysis.stages import stage_skew_from_counters

    win = (inputs.start, inputs.end)
    base = (inputs.baseline_start, inputs.baseline_end)
    out: dict[str, Any] = {}
    for metric in inputs.stage_metrics:
        w = stage_skew_from_counters(inputs.stage_counters.get(win, []), win[1] - win[0], metric)
        if w is None:
            continue
        b = stage_skew_from_counters(inputs.stage_counters.get(base, []), base[1] - base[0], metric)
        out[metric] = {"window": w.as_dict(), "baseline": b.as_dict() if b else None}
    return out


def _peers(evs: Sequence[Any]) -> list[str]:
    counts: dict[str, float] = {}
    for e in evs:
        for p in (e.details or {}).get("top_peers", []) or []:
            if isinstance(p, dict) and p.get("peer"):
                counts[str(p["peer"])] = counts.get(str(p["peer"]), 0) + float(p.get("retransmits", 1) or 1)
            elif isinstance(p, str):
                counts[p] = counts.get(p, 0) + 1
        if (e.details or {}).get("peer"):
            counts[str(e.details["peer"])] = counts.get(str(e.details["peer"]), 0) + 1
    return [p for p, _ in sorted(counts.items(), key=lambda kv: -kv[1])]


def _summary(c: Cause) -> str:
    parts = [str(e["detail"]) for e in c.evidence[:1] if e.get("type") == "absolute"]
    series = [e for e in c.evidence if e.get("type") == "series"]
    if series:
        s = series[0]
        if s["direction"] in ("appeared", "vanished"):
            parts.append(f"{s['series']} {s['direction']}")
        else:
            parts.append(f"{s['series']} {s['direction']} {_fmt(s['baseline'])} -> {_fmt(s['window'])}"
                         + (f" (peak {_fmt(s['peak'])})" if s["peak"] != s["window"] else ""))
        if len(series) > 1:
            parts.append(f"+{len(series) - 1} more series")
    evs = [e for e in c.evidence if e.get("type") == "event"]
    if evs:
        kinds = sorted({e["kind"] for e in evs})
        parts.append(f"{len(evs)} event(s): {', '.join(kinds)}")
    if c.peers:
        parts.append("peer " + ", ".join(c.peers[:3]))
    mm = [e for e in c.evidence if e.get("type") == "mismatch"]
    if mm:
        parts.append(mm[0]["detail"])
    return "; ".join(parts)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 1e9:
        return f"{x / 1e9:.3g}G"
    if ax >= 1e6:
        return f"{x / 1e6:.3g}M"
    if ax >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


def _mismatch_prior(inputs: RCAInputs, th: MismatchThresholds | None) -> tuple[dict[str, Any], dict[str, float]]:
    """The detector over window and baseline, from the series already read: the share of windows
    in each state, and the growth of the share pointing at each cause."""
    th = th or MismatchThresholds()
    start, end, b0, b1 = inputs.start, inputs.end, inputs.baseline_start, inputs.baseline_end
    span = end - start
    tier = inputs.tier
    window = max(th.window_s, span / 200.0, 120.0 if tier == "1m" else 0.0, 7200.0 if tier == "1h" else 0.0)
    detector_series = [sp for sp in inputs.series if sp.metric in DETECTOR_METRICS]

    def shares(a: float, b: float) -> tuple[dict[str, float], int]:
        # the window looks back over the baseline for the link's observed ceiling
        mi = mismatch_inputs_from_series(detector_series, a, b, ceiling_lookback_s=max(0.0, a - min(b0, start)))
        ws = window_states(mi, a, b, window, th)
        if not ws:
            return {}, 0
        out: dict[str, float] = {}
        for w in ws:
            key = "dma_mapping" if w.pin_churn else MISMATCH_CATEGORY.get(w.state)
            if key:
                out[key] = out.get(key, 0.0) + 1.0 / len(ws)
            out["state:" + w.state] = out.get("state:" + w.state, 0.0) + 1.0 / len(ws)
        return out, len(ws)

    win, n_w = shares(start, end)
    if n_w == 0:
        return {}, {}
    base, n_b = shares(b0, b1)
    prior = {k: max(0.0, v - base.get(k, 0.0)) for k, v in win.items() if not k.startswith("state:")}
    summary = {
        "windows": n_w,
        "window_states": {k[6:]: round(v, 4) for k, v in win.items() if k.startswith("state:")},
        "baseline_states": {k[6:]: round(v, 4) for k, v in base.items() if k.startswith("state:")},
        "pin_churn_share": round(win.get("dma_mapping", 0.0), 4),
    }
    return summary, prior
