"""One bad episode explained: its causes ranked by ``score.score_cause`` from its absolute evidence
(``evidence.figures``), what moved against its reference (``series_changes``) and the events
inside it; and its context (``context.context_lines``).  Pure.

Series scores are ``changes.series_score`` against the reference (z-score, earliness from the
episode's start, role weight), kept only beyond their noise floor (``noise``).  With no reference
there is no relative part: the ranking is the absolute evidence and the events.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triscope.analysis.episodes import Episode
from triscope.analysis.rca.categories import CATEGORY_BY_KEY, EVENT_CATEGORY, categorize
from triscope.analysis.rca.chain import chain_cause, put_first
from triscope.analysis.rca.changes import (
    SeriesChange,
    appeared_with_data,
    change_effect,
    score_series,
    series_score,
)
from triscope.analysis.rca.context import Context, context_lines
from triscope.analysis.rca.evidence import EvidenceContext, figures, mine
from triscope.analysis.rca.noise import noise_floor
from triscope.analysis.rca.reference import Reference, compare_key
from triscope.analysis.rca.score import Cause, rank, score_cause
from triscope.analysis.reader import SeriesPoints
from triscope.core.vocabulary import accelerator_name


@dataclass(slots=True)
class IndexedSeries:
    sp: SeriesPoints
    ts: Any          # numpy arrays
    values: Any
    category: str
    floor: float
    key: tuple[str, tuple[tuple[str, str], ...]]


def index_series(series: Sequence[SeriesPoints]) -> list[IndexedSeries]:
    """Each series that may be a cause or context, with its arrays, category and noise floor, once."""
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
            out.extend(v.tolist())        # the same floats as float(x) of each, without a loop here
        return out
    for sp in by_key.get(ix.key, ()):
        for a, b in ref.ranges:
            i, j = bisect.bisect_left(sp.ts, a), bisect.bisect_left(sp.ts, b)
            out.extend(sp.values[i:j])
    return out


def series_changes(e: Episode, ref: Reference, ctx: EvidenceContext, index: Sequence[IndexedSeries],
                   data_start: float | None, agent_trouble: bool) -> list[SeriesChange]:
    """The episode's series that moved against the reference beyond their noise floor, best first."""
    if ref.kind == "none":
        return []
    by_key: dict[Any, list[SeriesPoints]] = {}
    for sp in ref.series or ():
        by_key.setdefault(compare_key(sp), []).append(sp)
    out: list[SeriesChange] = []
    for ix in index:
        sp = ix.sp
        if (ix.category == "agent" and not agent_trouble) or not mine(sp, e.accelerator, ctx):
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


def events_in(e: Episode, events: Sequence[Any]) -> list[Any]:
    """The events inside the episode that are evidence (``EVENT_CATEGORY``) on its accelerator."""
    out = []
    for ev in events:
        if not (e.start <= ev.ts < e.end) or ev.kind not in EVENT_CATEGORY:
            continue
        d = ev.details or {}
        place = accelerator_name({k: str(v) for k, v in d.items() if k in ("gpu", "npu", "chip")})
        if place is not None and e.accelerator not in ("node", place):
            continue
        out.append(ev)
    return out


def explain(e: Episode, ref: Reference, ctx: EvidenceContext, index: Sequence[IndexedSeries],
            data_start: float | None, top: int | None = None) -> tuple[list[Cause], list[Context]]:
    """The episode's causes, best first, and its context."""
    figs = figures(ctx, e.accelerator, e.start, e.end)
    changes = series_changes(e, ref, ctx, index, data_start, "agent" in figs)
    per_cat: dict[str, list[SeriesChange]] = {}
    for ch in changes:
        per_cat.setdefault(ch.category, []).append(ch)
    inside = events_in(e, ctx.events)
    evs: dict[str, list[Any]] = {}
    for ev in inside:
        evs.setdefault(EVENT_CATEGORY[ev.kind], []).append(ev)
    causes = [score_cause(key, figs.get(key, ()), per_cat.get(key, ()), evs.get(key, ()))
              for key in dict.fromkeys([*figs, *per_cat, *evs]) if key in CATEGORY_BY_KEY]
    ranked = put_first(rank(causes), chain_cause(e, ctx))
    return (ranked[:top] if top is not None else ranked), context_lines(changes, inside, figs)
