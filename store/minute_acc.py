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
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# one row: [min, max, sum, count, last, last_ts, increase]
Row = list[float]


class MinuteAccumulator:
    __slots__ = ("closed", "known_from", "last_ts", "open", "open_bucket", "prev", "taken_until")

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

    def add(self, ts: float, points: Iterable[tuple[int, float]], counters: set[int] | frozenset[int]) -> None:
        """One tick: (series id, value) pairs at ``ts``; ``ts`` must be later than every earlier tick."""
        if ts <= self.last_ts:
            raise ValueError(f"tick at {ts} is not after {self.last_ts}")
        bucket = math.floor(ts / self.WIDTH) * self.WIDTH
        if bucket != self.open_bucket:
            self._close_open()
            self.open_bucket, self.open = bucket, {}
        if bucket < self.taken_until:   # a minute already handed over: no longer ours to vouch for
            self.known_from = max(self.known_from, bucket + self.WIDTH)
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
        if self.open and self.open_bucket >= self.known_from:
            self.closed[self.open_bucket] = self.open
