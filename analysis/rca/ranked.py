"""The ranked view: "what changed on this node in this window?" as one ranked list of causes
(``triscope rca --ranked``, the dashboard's explain and its fallback timeline).

``rank_causes(store, node, start, end)`` compares every stored series of the node in the window
with a baseline (by default the preceding window of the same length; ``changes.score_series``,
``changes.series_score``), groups the changes into the cause families (``categories``), merges the
window's events, adds the absolute evidence over the window (``evidence.figures`` for the node)
and what the mismatch detector says about the window compared with the baseline (the growth in
the share of its windows pointing at a family: staging-bound -> host staging, pin churn -> DMA
mapping, io-saturated -> PCIe load, network-bound -> network), and scores each family with the
one scorer, ``score.score_cause``, as the timeline scores an episode's.  Application SLIs,
remediation actions and the agent itself are context (``context.context_lines``), not causes.

Fetch first, then compute: ``fetch_rca_inputs`` (``inputs``) reads the node's series in one
``query`` per metric, the events and the stage counters; ``rank_causes_from`` ranks from that
without the store (the mismatch detector runs over the same points, through
``mismatch_inputs_from_series`` and ``window_states``).  ``rank_causes`` does both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import GPU_INFO, INPUT_METRICS
from triscope.analysis.mismatch import window_states
from triscope.analysis.mismatch_inputs import mismatch_inputs_from_series
from triscope.analysis.rca.categories import CATEGORY_BY_KEY, EVENT_CATEGORY, MISMATCH_CATEGORY, categorize
from triscope.analysis.rca.changes import (
    SeriesChange,
    appeared_with_data,
    bisect_any,
    change_effect,
    refine_onset,
    score_series,
    series_score,
    vanished_with_data,
)
from triscope.analysis.rca.context import Context, context_lines
from triscope.analysis.rca.evidence import evidence_context, figures
from triscope.analysis.rca.inputs import (
    RCAInputs,
    baseline_of,
    data_end_of,
    data_start_of,
    fetch_onset_points,
    fetch_rca_inputs,
)
from triscope.analysis.rca.noise import agent_trouble, never_a_cause, noise_floor
from triscope.analysis.rca.score import Cause, event_dict, rank, score_cause
from triscope.analysis.reader import SeriesPoints, StoreReader
from triscope.analysis.stages import stage_skew_from_counters

DETECTOR_METRICS = frozenset(INPUT_METRICS) | {GPU_INFO}
REFINE_TOP = 24


# ---------------------------------------------------------------------------------------------- results
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
    context: list[Context] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "start": self.start, "end": self.end,
                "baseline": {"start": self.baseline_start, "end": self.baseline_end},
                "series_examined": self.series_examined, "mismatch": self.mismatch, "stages": self.stages,
                "causes": [c.as_dict() for c in self.causes], "context": [c.as_dict() for c in self.context],
                "events": self.events}


def score_changes(inputs: RCAInputs) -> list[SeriesChange]:
    """Every series that moved in the window against the baseline beyond its noise floor
    (``noise.NOISE_FLOORS``), best score first.  Not changes: series that are never causes,
    the agent's own metrics while the agent was healthy, and series without baseline points when
    the baseline holds no data at all or the series came with the node's data.  Pure."""
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

    by_cat_events: dict[str, list[Any]] = {}
    for e in inputs.events:
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
    # absolute evidence over the window: how close each suspect is to its limit (as for an episode)
    figs = figures(evidence_context(inputs.series, inputs.events, thresholds or default_thresholds()), "node",
                   start, end)
    per_cat: dict[str, list[SeriesChange]] = {}
    for ch in changes:
        per_cat.setdefault(ch.category, []).append(ch)
    keys = dict.fromkeys([*figs, *per_cat, *by_cat_events, *(k for k, p in prior.items() if p > 0)])
    causes = rank([score_cause(k, figs.get(k, ()), per_cat.get(k, ()), by_cat_events.get(k, ()), prior.get(k, 0.0),
                               against="the baseline") for k in keys if k in CATEGORY_BY_KEY], top)
    context = context_lines(changes, [e for e in inputs.events if e.kind in EVENT_CATEGORY], figs)
    return RCAResult(inputs.node, start, end, b0, b1, causes, changes, [event_dict(e) for e in inputs.events],
                     mismatch, inputs.series_examined, stage_view(inputs), context)


def rank_causes(store: StoreReader, node: str, start: float, end: float,
                baseline: tuple[float, float] | None = None, max_points: int = 600,
                thresholds: MismatchThresholds | None = None, top: int | None = None,
                use_mismatch: bool = True, inputs: RCAInputs | None = None) -> RCAResult:
    """Rank the likely causes of what changed on ``node`` in [start, end].

    ``baseline`` (start, end) defaults to the preceding window of the same length.  The fetch
    (``fetch_rca_inputs``) reads every series once over [baseline start, end], in one ``query``
    per metric: raw points downsampled to at most ``2 * max_points`` (min/max preserving) up to an
    hour, 1-minute rollups up to 12 hours, hourly rollups beyond (the onsets of the leading
    changes are then refined from the window's 1-minute rollups, ``fetch_onset_points``); the
    ranking is ``rank_causes_from`` over what was read.  ``inputs``: a read made already (the
    timeline's), used when it is the read this call would make: the same node, window and baseline,
    from rollups (whose points do not depend on ``max_points``).
    """
    if not (inputs is not None and inputs.tier is not None and
            (inputs.node, inputs.start, inputs.end, (inputs.baseline_start, inputs.baseline_end))
            == (node, start, end, baseline_of(start, end, baseline))):
        inputs = fetch_rca_inputs(store, node, start, end, baseline, max_points)
    onset_points = None
    if inputs.tier == "1h":
        onset_points = fetch_onset_points(store, node, onset_candidates(score_changes(inputs)), start, end)
    return rank_causes_from(inputs, thresholds, top, use_mismatch, onset_points)


def stage_view(inputs: RCAInputs) -> dict[str, Any]:
    """Stage skew / pipeline bubbles in the window and the baseline, where the app exports them.  Pure."""
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
