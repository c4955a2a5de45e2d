"""Counter increases over time ranges: read in bulk first, computed without the store.

``fetch_counters(store, metrics, ranges, node)`` reads the cumulative values of every series of
``metrics`` over each range (one ``query`` per metric and range; ranges served from raw points
that end together share one read of the widest and are cut from it); ``increase(ts, values,
span, tier)`` is the reset-aware increase and coverage of one series, pure.  SLO evaluation
(``triscope.analysis.slo``), stage skew (``triscope.analysis.stages``) and the dashboard's budget
burn-down use both.

Tiers by range: raw points up to 6 h, 1-minute rollups up to 7 d, hourly rollups beyond; a
rollup bucket contributes its first and last value (min and max of a counter), which keeps the
increase exact unless the counter reset inside a bucket (then it is approximate).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from triscope.analysis.reader import SeriesPoints, StoreReader, points_of

Range = tuple[float, float]
CounterReads = dict[Range, list[SeriesPoints]]
"""(start, end) -> every series of the metrics read, cumulative values in [start, end], in the
store's order (metric, then node and labels)."""


def tier_for(span: float) -> str:
    return "raw" if span <= 6 * 3600 else "1m" if span <= 7 * 86400 else "1h"


def increase(ts: Sequence[float], values: Sequence[float], span: float, tier: str) -> tuple[float, float]:
    """Reset-aware increase of one counter's cumulative values over a range of ``span`` seconds
    and the share of the range its points cover (gaps longer than 3 sampling intervals are not
    covered; the first point stands for one interval).  Pure."""
    if len(ts) < 2 or span <= 0:
        return 0.0, 0.0
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    med = sorted(gaps)[len(gaps) // 2]
    cap = max(3 * med, 60.0 if tier == "1m" else 3600.0 if tier == "1h" else 0.0, 1e-9)
    inc = 0.0
    covered = min(med, cap)
    for i in range(1, len(ts)):
        d = values[i] - values[i - 1]
        inc += d if d >= 0 else values[i]
        covered += min(gaps[i - 1], cap)
    return inc, min(1.0, covered / span)


def fetch_counters(store: StoreReader, metrics: Iterable[str], ranges: Iterable[Range],
                   node: str | None = None) -> CounterReads:
    """Cumulative values (``rate=False``) of every series of ``metrics`` (on ``node``, all nodes
    if None) over each range, from the tier ``tier_for`` picks for the range's length."""
    metrics = list(dict.fromkeys(metrics))
    ranges = list(dict.fromkeys(ranges))
    out: CounterReads = {r: [] for r in ranges}
    raw_by_end: dict[float, list[Range]] = {}
    for r in ranges:
        tier = tier_for(r[1] - r[0])
        if tier == "raw":
            raw_by_end.setdefault(r[1], []).append(r)
            continue
        for m in metrics:
            out[r] += [points_of(sd) for sd in store.query(m, node=node, start=r[0], end=r[1], max_points=None,
                                                           rate=False, tier=tier)]
    for end, rs in raw_by_end.items():
        lo = min(r[0] for r in rs)
        for m in metrics:
            for sd in store.query(m, node=node, start=lo, end=end, max_points=None, rate=False, tier="raw"):
                sp = points_of(sd)
                for r in rs:
                    out[r].append(sp if r[0] == lo else _from(sp, r[0]))
    return out


def _from(sp: SeriesPoints, start: float) -> SeriesPoints:
    i = bisect.bisect_left(sp.ts, start)
    return SeriesPoints(sp.metric, sp.labels, sp.ts[i:], sp.values[i:], sp.kind, sp.node, sp.id)

