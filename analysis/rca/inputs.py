"""What a root-cause query reads, fetched first and in bulk.

``fetch_rca_inputs(store, node, start, end)`` reads every series of the node over baseline +
window with one ``query`` per metric (each returns all of the node's series of that metric; not
one read per series), the window's events, and the stage-histogram counters, into an
``RCAInputs`` that ``triscope.analysis.rca.ranked.rank_causes_from`` ranks without touching the store.
Over more than 12 hours the series come from hourly rollups; the onsets of the leading changes are
then refined from the window's 1-minute rollups, which ``fetch_onset_points`` reads (one ``query``
per metric of the changes to refine, at most ``REFINE_TOP`` series).

A histogram's buckets are not read where the histogram's ``_count`` of the same labels is
(``carried_buckets``): a bucket is never a cause (``noise``: its ``_count`` and ``_sum`` carry the
change), nothing else here looks at one, and its points start and end with its ``_count``'s (one
exposition holds both).  On an inference node they are most of its series (988 of 1,430 on an
H200 recording), so most of the read.  A raw read of a counter (an hour at most: the reads around
bad episodes) reads its cumulative points and turns them into the per-second rates the store would
return (``counter_rates``): SQLite computes those with a window function, at about four times the
cost of the plain read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from triscope.analysis.counters import CounterReads, fetch_counters
from triscope.analysis.reader import SeriesPoints, StoreReader, points_of
from triscope.store.reader import EventRow, SeriesInfo

DERIVED_PREFIX = "triscope_mismatch_"   # the detector's own output: not evidence of a cause
STAGE_LABEL = "stage"
MAX_STAGE_METRICS = 3
MAX_EVENTS = 5000
BUCKET, COUNT, LE = "_bucket", "_count", "le"


def rca_tier(span: float) -> str | None:
    """Store tier for a root-cause read over ``span`` seconds: raw points (downsampled) up to an
    hour, 1-minute rollups up to 12 hours, hourly rollups beyond (counter rates per bucket are
    exact means)."""
    return None if span <= 3600 else "1m" if span <= 12 * 3600 else "1h"


@dataclass(slots=True)
class RCAInputs:
    """Everything a root-cause ranking looks at for one node, window and baseline."""

    node: str
    start: float
    end: float
    baseline_start: float
    baseline_end: float
    tier: str | None                                       # tier the series were read from (``rca_tier``)
    series: list[SeriesPoints] = field(default_factory=list)   # every series of the node but the detector's
    #                                                       own and the buckets ``carried_buckets`` names, over
    #                                                       [min(starts), max(ends)], counters as rates
    series_examined: int = 0                               # series of the node, the detector's own included
    events: list[EventRow] = field(default_factory=list)   # events in [start, end]
    stage_metrics: list[str] = field(default_factory=list)  # stage histograms (base names) the node exports
    stage_counters: CounterReads = field(default_factory=dict)  # their _sum/_count over window and baseline


def data_start_of(series: Sequence[SeriesPoints], read_start: float, grace: float = 5.0) -> float | None:
    """When the node's data starts, if it starts inside the range read (its first point more than
    ``grace`` seconds after ``read_start``); None when data runs from before the read."""
    firsts = [sp.ts[0] for sp in series if len(sp.ts)]
    if not firsts:
        return None
    first = min(firsts)
    return first if first > read_start + grace else None


def data_end_of(series: Sequence[SeriesPoints], read_end: float, grace: float = 5.0) -> float | None:
    """When the node's data ends, if it ends inside the range read; None when it runs on."""
    lasts = [sp.ts[-1] for sp in series if len(sp.ts)]
    if not lasts:
        return None
    last = max(lasts)
    return last if last < read_end - grace else None


def baseline_of(start: float, end: float, baseline: tuple[float, float] | None) -> tuple[float, float]:
    """The baseline: as given, or the preceding window of the same length."""
    return baseline if baseline is not None else (start - (end - start), start)


def carried_buckets(infos: Iterable[SeriesInfo], keep: Collection[str] = ()) -> set[int]:
    """The ids of the histogram bucket series (``*_bucket``) whose histogram has its ``_count`` of
    the same labels (``le`` aside) among ``infos``: what a root-cause read leaves out.  ``keep``:
    metrics read whatever they are (an SLO's terms may name a bucket)."""
    infos = list(infos)
    counts = {(i.metric[:-len(COUNT)], _key(i.labels)) for i in infos if i.metric.endswith(COUNT)}
    return {i.id for i in infos if i.metric.endswith(BUCKET) and i.metric not in keep
            and (i.metric[:-len(BUCKET)], _key({k: v for k, v in i.labels.items() if k != LE})) in counts}


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def fetch_rca_inputs(store: StoreReader, node: str, start: float, end: float,
                     baseline: tuple[float, float] | None = None, max_points: int = 600,
                     keep: Collection[str] = ()) -> RCAInputs:
    """Read what ``rank_causes_from`` needs.  Raw points are downsampled to at most
    ``2 * max_points`` per series (min/max preserving) up to an hour; rollups beyond.  Histogram
    buckets carried by their ``_count`` are not read (``carried_buckets``; ``keep``: metrics read
    all the same)."""
    if end <= start:
        raise ValueError("the window must end after it starts")
    b0, b1 = baseline_of(start, end, baseline)
    lo, hi = min(b0, start), max(b1, end)
    tier = rca_tier(hi - lo)
    infos = store.series(node=node)
    skip = carried_buckets(infos, keep)
    wanted = {i.id for i in infos if not i.metric.startswith(DERIVED_PREFIX) and i.id not in skip}
    series: list[SeriesPoints] = []
    by_metric: dict[str, list[SeriesInfo]] = {}
    for i in infos:
        if i.id in wanted:
            by_metric.setdefault(i.metric, []).append(i)
    for metric, mine in by_metric.items():
        if tier is None and hi - lo <= 2 * max_points and all(i.kind == "counter" for i in mine):
            series += _raw_rates(store, metric, node, lo, hi, 2 * max_points, wanted)
            continue
        for sd in store.query(metric, node=node, start=lo, end=hi, max_points=None if tier else 2 * max_points,
                              tier=tier):
            if sd.info.id in wanted:
                series.append(points_of(sd))
    stages = sorted({i.metric[:-4] for i in infos if i.metric.endswith("_sum") and STAGE_LABEL in i.labels})
    stages = stages[:MAX_STAGE_METRICS]
    counters = fetch_counters(store, [m + s for m in stages for s in ("_sum", "_count")],
                              [(start, end), (b0, b1)], node) if stages else {}
    return RCAInputs(node, start, end, b0, b1, tier, series, len(infos),
                     store.events(node=node, start=start, end=end, limit=MAX_EVENTS), stages, counters)


def _raw_rates(store: StoreReader, metric: str, node: str, lo: float, hi: float, max_points: int,
               wanted: Collection[int]) -> list[SeriesPoints]:
    """A counter metric's raw points over [lo, hi] as per-second rates, what ``store.query`` with
    ``max_points`` returns, read as cumulative values and turned into rates here (``counter_rates``):
    on SQLite the rate query's window function costs four times the plain read.  The same points
    where the store would return every rate (no more raw points than ``max_points``, over at most
    ``max_points`` seconds, all finite); any other series is read through the store's own rates."""
    out: list[SeriesPoints] = []
    for sd in store.query(metric, node=node, start=lo, end=hi, max_points=None, rate=False, tier=None):
        i = sd.info
        if i.id not in wanted:
            continue
        got = counter_rates(sd.ts, sd.values) if len(sd.ts) <= max_points else None
        if got is None:
            out.append(points_of(store.query_series(i, lo, hi, max_points)))
        else:
            out.append(SeriesPoints(i.metric, dict(i.labels), got[0], got[1], i.kind, i.node, i.id))
    return out


def counter_rates(ts: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """A counter's per-second rates from its cumulative points, as the store's raw read computes them
    (store/reads.py): each point after the first, ``(v - prev) / (t - prev_t)``, or ``v / (t - prev_t)``
    where the counter fell (a reset); a point not after its predecessor has none.  None where a value
    is not finite (SQL would read NaN as NULL)."""
    t = np.asarray(ts, dtype=float)
    v = np.asarray(values, dtype=float)
    if len(t) < 2:
        return [], []
    if not np.isfinite(v).all():
        return None
    dt = t[1:] - t[:-1]
    cur, prev = v[1:], v[:-1]
    ok = dt > 0
    rate = np.where(cur >= prev, cur - prev, cur)[ok] / dt[ok]
    return t[1:][ok].tolist(), rate.tolist()


class _SeriesRef(Protocol):
    @property
    def series_id(self) -> int: ...

    @property
    def metric(self) -> str: ...

    @property
    def labels(self) -> dict[str, str]: ...


def fetch_onset_points(store: StoreReader, node: str, changes: Iterable[_SeriesRef], start: float,
                       end: float) -> dict[int, SeriesPoints]:
    """The 1-minute rollups over [start, end] of the series of ``changes`` (series id -> points):
    one ``query`` per metric, narrowed by the labels its series share."""
    by_metric: dict[str, list[_SeriesRef]] = {}
    for ch in changes:
        by_metric.setdefault(ch.metric, []).append(ch)
    out: dict[int, SeriesPoints] = {}
    for metric, chs in by_metric.items():
        ids = {c.series_id for c in chs}
        for sd in store.query(metric, node=node, labels=_common(c.labels for c in chs) or None, start=start,
                              end=end, max_points=None, tier="1m"):
            if sd.info.id in ids:
                out[sd.info.id] = points_of(sd)
    return out


def _common(label_sets: Iterable[dict[str, str]]) -> dict[str, str]:
    sets: Sequence[dict[str, str]] = list(label_sets)
    if not sets:
        return {}
    common = set(sets[0].items())
    for lab in sets[1:]:
        common &= set(lab.items())
    return dict(common)
