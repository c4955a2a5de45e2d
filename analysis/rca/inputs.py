"""What a root-cause query reads, fetched first and in bulk.

``fetch_rca_inputs(store, node, start, end)`` reads every series of the node over baseline +
window with one ``query`` per metric (each returns all of the node's series of that metric; not
one read per series), the window's events, and the stage-histogram counters, into an
``RCAInputs`` that ``triscope.analysis.rca.ranked.rank_causes_from`` ranks without touching the store.
Over more than 12 hours the series come from hourly rollups; the onsets of the leading changes are
then refined from the window's 1-minute rollups, which ``fetch_onset_points`` reads (one ``query``
per metric of the changes to refine, at most ``REFINE_TOP`` series).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from triscope.analysis.counters import CounterReads, fetch_counters
from triscope.analysis.reader import SeriesPoints, StoreReader, points_of
from triscope.store.reader import EventRow

DERIVED_PREFIX = "triscope_mismatch_"   # the detector's own output: not evidence of a cause
STAGE_LABEL = "stage"
MAX_STAGE_METRICS = 3
MAX_EVENTS = 5000


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
    #                                                       own, over [min(starts), max(ends)], counters as rates
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


def fetch_rca_inputs(store: StoreReader, node: str, start: float, end: float,
                     baseline: tuple[float, float] | None = None, max_points: int = 600) -> RCAInputs:
    """Read what ``rank_causes_from`` needs.  Raw points are downsampled to at most
    ``2 * max_points`` per series (min/max preserving) up to an hour; rollups beyond."""
    if end <= start:
        raise ValueError("the window must end after it starts")
    b0, b1 = baseline_of(start, end, baseline)
    lo, hi = min(b0, start), max(b1, end)
    tier = rca_tier(hi - lo)
    infos = store.series(node=node)
    wanted = {i.id for i in infos if not i.metric.startswith(DERIVED_PREFIX)}
    series: list[SeriesPoints] = []
    for metric in dict.fromkeys(i.metric for i in infos if i.id in wanted):
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
