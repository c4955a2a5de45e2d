"""1-minute rollups kept in the writer's memory as its ticks go by.

A node's writer sees every sample of the node in time order, so it can keep min, max, sum,
count, last and a counter's reset-aware increase per series for the open minute, and hand the
finished rows to the store when the minute is rolled up: the database then inserts 200 rollup
rows per node and minute instead of reading back the 12,000 raw samples it was just given
(docs/scaling.md shows what that changed under fleet load).

The accumulator only vouches for minutes it saw from their first second: a minute already
under way when it started (an agent restart) is rolled from the raw samples in SQL as before,
and so is anything after an out-of-order or replayed write (the store drops the accumulator
then).  The rows equal what the SQL rollup computes from the same samples (a test holds them
to it); a counter's first sample in a minute takes its increase from the series' previous
sample, as the SQL window does.

A tick of the steady write path (``add_tick``: a dict of series id -> value) whose series are the
ones of the minute's first tick, in the same order -- every tick of a scrape or a collector that
says the same series -- updates the minute's rows as columns, one ``map`` per field (``min``,
``max``, ``+``, a counter's increase where none reset), not one Python step per point; the columns
become rows when a tick brings other series, and when the minute is closed or taken.  The numbers
are the rows' own: the same operations on the same values in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from operator import add, itemgetter, sub

# one row: [min, max, sum, count, last, last_ts, increase]
Row = list[float]


class _Columns:
    """The open minute's rows as columns, while every tick has the series of its first, in order."""

    __slots__ = ("count", "cpos", "inc", "last", "last_ts", "mn", "mx", "pick", "prev", "sids", "sm")

    def __init__(self, ts: float, sids: list[int], vals: list[float], cpos: list[int], inc: list[float],
                 prev: list[float]) -> None:
        self.sids = sids
        self.mn = self.mx = self.sm = self.last = vals     # never changed in place: each tick makes new lists
        self.count = 1.0
        self.last_ts = ts
        self.cpos = cpos                 # where the counters are
        self.pick = itemgetter(*cpos) if len(cpos) > 1 else None
        self.inc = inc                   # the counters' increase so far
        self.prev = prev                 # and their last values

    def counters_of(self, vals: list[float]) -> list[float]:
        if self.pick is not None:
            return list(self.pick(vals))
        return [vals[i] for i in self.cpos]


class MinuteAccumulator:
    __slots__ = ("closed", "cols", "known_from", "last_ts", "open", "open_bucket", "prev", "taken_until")

    WIDTH = 60.0

    def __init__(self, first_ts: float) -> None:
        # minutes from here on went through this accumulator from their first sample
        self.known_from = math.floor(first_ts / self.WIDTH) * self.WIDTH + self.WIDTH
        self.last_ts = -math.inf
        self.open_bucket = -math.inf
        self.open: dict[int, Row] = {}
        self.closed: dict[float, dict[int, Row]] = {}
        self.prev: dict[int, float] = {}     # counters: the last value seen per series
        self.taken_until = -math.inf         # minutes before this were handed over already
        self.cols: _Columns | None = None     # the open minute as columns (``add_tick``)

    def add(self, ts: float, points: Iterable[tuple[int, float]], counters: set[int] | frozenset[int]) -> None:
        """One tick: (series id, value) pairs at ``ts``; ``ts`` must be later than every earlier tick."""
        self._enter(ts)
        self._flush_columns()
        self._add_rows(ts, points, counters)

    def add_tick(self, ts: float, points: Mapping[int, float], counters: set[int] | frozenset[int]) -> None:
        """``add`` for one tick's {series id: value}: as columns while the minute's ticks have the
        series of its first tick, in the same order."""
        self._enter(ts)
        cols = self.cols
        if cols is not None and list(points) == cols.sids:
            self._add_columns(cols, ts, list(points.values()))
        elif cols is None and not self.open and points:
            self.cols = self._new_columns(ts, points, counters)
            self.last_ts = ts
        elif cols is None and self.open and list(self.open) == list(points) and self._rows_to_columns(counters):
            self._add_columns(self.cols, ts, list(points.values()))   # type: ignore[arg-type]
        else:
            self._flush_columns()
            self._add_rows(ts, points.items(), counters)

    def _enter(self, ts: float) -> None:
        if ts <= self.last_ts:
            raise ValueError(f"tick at {ts} is not after {self.last_ts}")
        bucket = math.floor(ts / self.WIDTH) * self.WIDTH
        if bucket != self.open_bucket:
            self._close_open()
            self.open_bucket, self.open = bucket, {}
        if bucket < self.taken_until:   # a minute already handed over: no longer ours to vouch for
            self.known_from = max(self.known_from, bucket + self.WIDTH)

    def _new_columns(self, ts: float, points: Mapping[int, float], counters: set[int] | frozenset[int]) -> _Columns:
        sids = list(points)
        vals = list(points.values())
        prev = self.prev
        cpos = [i for i, sid in enumerate(sids) if sid in counters]
        inc = []
        for i in cpos:
            p = prev.get(sids[i])
            v = vals[i]
            inc.append(0.0 if p is None else (v - p if v >= p else v))
        return _Columns(ts, sids, vals, cpos, inc, [vals[i] for i in cpos])

    def _rows_to_columns(self, counters: set[int] | frozenset[int]) -> bool:
        """The open minute's rows as columns, when every row has seen the same ticks (a minute begun
        point by point whose ticks now have one shape); False, rows kept, otherwise."""
        rows = list(self.open.values())
        n, last_ts = rows[0][3], rows[0][5]
        if any(r[3] != n or r[5] != last_ts for r in rows):
            return False
        sids = list(self.open)
        cpos = [i for i, sid in enumerate(sids) if sid in counters]
        if any(sids[i] not in self.prev for i in cpos):
            return False
        cols = _Columns(last_ts, sids, [r[4] for r in rows], cpos, [rows[i][6] for i in cpos],
                        [self.prev[sids[i]] for i in cpos])
        cols.mn, cols.mx, cols.sm, cols.count = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], n
        self.cols, self.open = cols, {}
        return True

    def _add_columns(self, cols: _Columns, ts: float, vals: list[float]) -> None:
        cols.mn = list(map(min, cols.mn, vals))
        cols.mx = list(map(max, cols.mx, vals))
        cols.sm = list(map(add, cols.sm, vals))
        cols.last = vals
        cols.count += 1.0
        cols.last_ts = ts
        if cols.cpos:
            now = cols.counters_of(vals)
            d = list(map(sub, now, cols.prev))
            if min(d) >= 0.0:
                cols.inc = list(map(add, cols.inc, d))
            else:               # a counter reset: its increase is its value
                cols.inc = [i + (v - p if v >= p else v) for i, v, p in zip(cols.inc, now, cols.prev, strict=True)]
            cols.prev = now
        self.last_ts = ts

    def _flush_columns(self) -> None:
        """The columns into the open minute's rows (and the counters' last values)."""
        cols = self.cols
        if cols is None:
            return
        self.cols = None
        inc = [0.0] * len(cols.sids)
        prev = self.prev
        sids = cols.sids
        for k, i in enumerate(cols.cpos):
            inc[i] = cols.inc[k]
            prev[sids[i]] = cols.prev[k]
        n, last_ts, rows = cols.count, cols.last_ts, self.open
        for sid, lo, hi, total, last, grew in zip(sids, cols.mn, cols.mx, cols.sm, cols.last, inc, strict=True):
            rows[sid] = [lo, hi, total, n, last, last_ts, grew]

    def _add_rows(self, ts: float, points: Iterable[tuple[int, float]], counters: set[int] | frozenset[int]) -> None:
        rows = self.open
        prev = self.prev
        for sid, v in points:
            inc = 0.0
            if sid in counters:
                p = prev.get(sid)
                if p is not None:
                    inc = v - p if v >= p else v
                prev[sid] = v
            r = rows.get(sid)
            if r is None:
                rows[sid] = [v, v, v, 1.0, v, ts, inc]
            else:
                if v < r[0]:
                    r[0] = v
                if v > r[1]:
                    r[1] = v
                r[2] += v
                r[3] += 1.0
                r[4] = v
                r[5] = ts
                r[6] += inc
        self.last_ts = ts

    def take(self, lo: float, hi: float) -> tuple[float, list[tuple[int, float, Row]]]:
        """The finished rows of the minutes in [lo, hi) this accumulator vouches for, as
        (series id, bucket, row), and where they start: [lo, start) is left to the SQL rollup.
        Minutes before ``hi`` are forgotten."""
        if self.open_bucket < hi:       # the open minute is over too (a roll-up of everything up to now)
            self._close_open()
            self.open = {}
        self.taken_until = max(self.taken_until, hi)
        start = max(lo, self.known_from)
        out: list[tuple[int, float, Row]] = []
        for bucket in sorted(b for b in self.closed if b < hi):
            rows = self.closed.pop(bucket)
            if bucket >= start:
                out.extend((sid, bucket, r) for sid, r in rows.items())
        return min(start, hi), out

    def _close_open(self) -> None:
        self._flush_columns()
        if self.open and self.open_bucket >= self.known_from:
            self.closed[self.open_bucket] = self.open
