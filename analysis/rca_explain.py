"""One bad episode explained: causes ranked from absolute evidence, changes against its reference,
and the events inside it.  Pure.

A cause's score (the keys and titles are ``triscope.analysis.rca.CATEGORIES``):

    absolute part   the strength of the family's strongest figure (``rca_evidence``) up to ABS_CAP
                    when it is past its threshold; strength - ABS_MIN between ABS_MIN and 1; else 0
  + relative part   (best series score + 0.1 per further moved series, at most 0.3) x limit factor
  + events part     0.5 + 0.1 per event (+0.2 if one is an error), at most 1, x role weight

Series scores are ``rca.series_score`` against the reference (z-score, earliness from the episode's
start, role weight), kept only beyond their noise floor (``rca_noise``).  The **limit factor** is
what keeps "it rose" from beating "it is at its limit": for a family with a figure it is
``max(LIMIT_FLOOR, min(1, strength))`` (PCIe traffic that rose from 0 to 5 GB/s on a 55 GB/s link
keeps a quarter of its score); fault families (GPU health, PCIe errors, IOMMU faults) without a
figure keep ``LIMIT_FLOOR`` (a GPU warming up under load is not a fault); the agent's own metrics
count only with an agent figure (the agent was unhealthy); symptoms (accelerator activity,
application SLIs, other host metrics) keep their score.  With no reference there is no relative
part: the ranking is the absolute evidence and the events.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triscope.analysis.episodes import Episode, accelerator_of
from triscope.analysis.rca import (
    CATEGORY_BY_KEY,
    EVENT_CATEGORY,
    ROLE_WEIGHT,
    Cause,
    SeriesChange,
    _fmt,
    appeared_with_data,
    categorize,
    change_effect,
    score_series,
    series_score,
)
from triscope.analysis.rca_evidence import (
    ABS_MIN,
    EvidenceContext,
    Figure,
    _mine,
    absolute_part,
    figures,
    limit_factor,
    strengths,
)
from triscope.analysis.rca_noise import noise_floor
from triscope.analysis.rca_reference import Reference, compare_key
from triscope.analysis.reader import SeriesPoints

MAX_SERIES_EVIDENCE = 6
FIGURE_MIN = 0.25
MAX_EVENT_EVIDENCE = 5


@dataclass(slots=True)
class IndexedSeries:
    sp: SeriesPoints
    ts: Any          # numpy arrays
    values: Any
    category: str
    floor: float
    key: tuple[str, tuple[tuple[str, str], ...]]


def index_series(series: Sequence[SeriesPoints]) -> list[IndexedSeries]:
    """Each series that may be a cause, with its arrays, category and noise floor, once."""
    import numpy as np

    out = []
    for sp in series:
        cat = categorize(sp.metric, sp.labels).key
        floor = noise_floor(sp.metric, sp.labels, sp.kind).floor
        if cat == "derived" or math.isinf(floor) or not len(sp.ts):
            continue
        out.append(IndexedSeries(sp, np.asarray(sp.ts, dtype=float), np.asarray(sp.values, dtype=float), cat, floor,
                                 compare_key(sp)))
    return out


def _slice(ix: IndexedSeries, a: float, b: float) -> tuple[Any, Any]:
    i, j = int(ix.ts.searchsorted(a, "left")), int(ix.ts.searchsorted(b, "left"))
    return ix.ts[i:j], ix.values[i:j]


def reference_values(ref: Reference, ix: IndexedSeries, by_key: Mapping[Any, list[SeriesPoints]]) -> list[float]:
    """The reference's values for one series: the same series over the reference ranges (this
    node), else every series with its ``compare_key`` there (other nodes or accelerators, pooled)."""
    out: list[float] = []
    if ref.series is None:
        for a, b in ref.ranges:
            _t, v = _slice(ix, a, b)
            out.extend(float(x) for x in v)
        return out
    for sp in by_key.get(ix.key, ()):
        for a, b in ref.ranges:
            i, j = bisect.bisect_left(sp.ts, a), bisect.bisect_left(sp.ts, b)
            out.extend(sp.values[i:j])
    return out


def series_changes(e: Episode, ref: Reference, ctx: EvidenceContext, index: Sequence[IndexedSeries],
                   data_start: float | None, agent_trouble: bool) -> list[SeriesChange]:
    """The episode's series that moved against the reference beyond their noise floor."""
    import numpy as np

    if ref.kind == "none":
        return []
    by_key: dict[Any, list[SeriesPoints]] = {}
    for sp in ref.series or ():
        by_key.setdefault(compare_key(sp), []).append(sp)
    out: list[SeriesChange] = []
    for ix in index:
        sp = ix.sp
        if (ix.category == "agent" and not agent_trouble) or not _mine(sp, e.accelerator, ctx):
            continue
        wts, wv = _slice(ix, e.start, e.end)
        if not len(wv):
            continue
        rv = reference_values(ref, ix, by_key)
        counter = sp.kind == "counter"
        if not rv:
            # not seen in the reference: a counter that started counting later on this node rose from 0
            if ref.series is not None or not counter or appeared_with_data(sp, data_start):
                continue
            rv = [0.0]
        mag, z, onset, direction, mb, mw, peak = score_series(np.zeros(len(rv)), rv, wts, wv, e.start, e.end,
                                                              counter)
        if mag <= 0 or change_effect(mb, mw, peak) < ix.floor:
            continue
        cat = CATEGORY_BY_KEY[ix.category]
        out.append(SeriesChange(sp.metric, dict(sp.labels), ix.category, mb, mw, peak, z, onset, direction,
                                series_score(mag, onset, cat, direction, sp.metric, e.start, e.end), sp.id, mag))
    out.sort(key=lambda c: -c.score)
    return out


def _events_in(e: Episode, events: Sequence[Any]) -> list[Any]:
    out = []
    for ev in events:
        if not (e.start <= ev.ts < e.end) or ev.kind not in EVENT_CATEGORY:
            continue
        d = ev.details or {}
        place = accelerator_of({k: str(v) for k, v in d.items() if k in ("gpu", "npu", "chip")})
        if place is not None and e.accelerator not in ("node", place):
            continue
        out.append(ev)
    return out


def explain(e: Episode, ref: Reference, ctx: EvidenceContext, index: Sequence[IndexedSeries],
            data_start: float | None, top: int | None = None) -> list[Cause]:
    """The episode's causes, best first."""
    figs = figures(ctx, e.accelerator, e.start, e.end)
    strength = strengths(figs)
    changes = series_changes(e, ref, ctx, index, data_start, "agent" in strength)
    per_cat: dict[str, list[SeriesChange]] = {}
    for ch in changes:
        per_cat.setdefault(ch.category, []).append(ch)
    evs: dict[str, list[Any]] = {}
    for ev in _events_in(e, ctx.events):
        evs.setdefault(EVENT_CATEGORY[ev.kind], []).append(ev)
    causes: list[Cause] = []
    for key in dict.fromkeys([*figs, *per_cat, *evs]):
        if key not in CATEGORY_BY_KEY:
            continue
        s = strength.get(key)
        abs_part = absolute_part(s)
        chs = per_cat.get(key, [])
        rel = chs[0].score + min(0.3, 0.1 * (len(chs) - 1)) if chs else 0.0
        limit = limit_factor(key, s)
        ev = evs.get(key, [])
        ev_part = 0.0
        if ev:
            severe = any(x.severity in ("error", "critical") for x in ev)
            ev_part = min(1.0, 0.5 + 0.1 * len(ev) + (0.2 if severe else 0.0)) * ROLE_WEIGHT[CATEGORY_BY_KEY[key].role]
        score = abs_part + rel * limit + ev_part
        if score <= 0.05:
            continue
        cat = CATEGORY_BY_KEY[key]
        onsets = [c.onset for c in chs if c.onset is not None] + [x.ts for x in ev]
        ranked = sorted(figs.get(key, []), key=lambda f: -f.strength)
        # the figures that say something (a quarter of their threshold or more), else the strongest
        evidence = [f.as_dict() for f in ranked if f.strength >= FIGURE_MIN] or [f.as_dict() for f in ranked[:1]]
        evidence += [c.as_dict() for c in chs[:MAX_SERIES_EVIDENCE]]
        evidence += [{"type": "event", "ts": x.ts, "kind": x.kind, "severity": x.severity, "message": x.message,
                      "details": x.details} for x in ev[:MAX_EVENT_EVIDENCE]]
        c = Cause(key, cat.title, score, min(onsets) if onsets else None, "", evidence)
        if key == "network":
            c.peers = _peers(ev, chs)
        c.summary = summary(figs.get(key, []), chs, ev, limit)
        causes.append(c)
    causes.sort(key=lambda c: (-c.score, c.onset if c.onset is not None else math.inf))
    return causes[:top] if top is not None else causes


def _peers(evs: Sequence[Any], chs: Sequence[SeriesChange]) -> list[str]:
    from triscope.analysis.rca import _peers as event_peers

    out = event_peers(evs)
    for ch in chs:
        if "peer" in ch.labels and ch.labels["peer"] not in out:
            out.append(ch.labels["peer"])
    return out


def summary(figs: Sequence[Figure], chs: Sequence[SeriesChange], evs: Sequence[Any], limit: float) -> str:
    parts = []
    strong = [f for f in sorted(figs, key=lambda f: -f.strength) if f.strength >= ABS_MIN]
    if strong:
        parts.append(strong[0].detail)
    if chs:
        c = chs[0]
        parts.append(f"{c.series} {_fmt(c.baseline)} -> {_fmt(c.window)} against the reference"
                     + (f" (+{len(chs) - 1} more series)" if len(chs) > 1 else ""))
    if not strong and figs and limit < 1:
        weak = max(figs, key=lambda f: f.strength)
        parts.append(f"but {weak.detail}")
    if evs:
        parts.append(f"{len(evs)} event(s): {', '.join(sorted({x.kind for x in evs}))}")
    return "; ".join(parts)
