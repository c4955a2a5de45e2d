"""The in-memory minute rollups of the steady path (``MinuteAccumulator.add_tick``: columns while a
minute's ticks have the same series) are exactly the rows the point-by-point path (``add``) makes of
the same ticks: series coming and going, counters resetting, a take in the middle of a minute."""

from __future__ import annotations

import random

from triscope.store.minute_acc import MinuteAccumulator


def _ticks(seed: int, n: int) -> list[tuple[float, dict[int, float]]]:
    rnd = random.Random(seed)
    cum = {sid: 0.0 for sid in range(40)}
    out = []
    ts = 6_000.0 + rnd.random() * 60
    for i in range(n):
        sids = list(range(30))
        if 100 <= i < 160 and i % 5:        # series that come and go within minutes
            sids += [30, 31]
        if i % 97 == 0:
            sids.reverse()                   # the same series in another order
        pts = {}
        for sid in sids:
            if sid % 3 == 0:                 # counters, one resetting now and then
                cum[sid] = 0.0 if rnd.random() < 0.01 else cum[sid] + rnd.random() * 5
                pts[sid] = cum[sid]
            else:
                pts[sid] = rnd.uniform(-1e3, 1e3) if sid % 3 == 1 else rnd.choice((0.0, -0.0, 1.5, 2.5))
        out.append((ts, pts))
        ts += rnd.choice((0.5, 1.0, 1.0, 1.0, 3.0))
    return out


def test_columns_give_the_rows_point_by_point_gives() -> None:
    counters = frozenset(sid for sid in range(40) if sid % 3 == 0)
    for seed in range(4):
        ticks = _ticks(seed, 400)
        rows, cols = MinuteAccumulator(ticks[0][0]), MinuteAccumulator(ticks[0][0])
        got_rows: list = []
        got_cols: list = []
        for i, (ts, pts) in enumerate(ticks):
            rows.add(ts, pts.items(), counters)
            cols.add_tick(ts, pts, counters)
            if i % 50 == 49:        # a roll-up now and then, mid-minute too
                hi = ts - 30 if i % 100 == 49 else ts + 1
                got_rows.append(rows.take(0.0, hi))
                got_cols.append(cols.take(0.0, hi))
        got_rows.append(rows.take(0.0, ticks[-1][0] + 120))
        got_cols.append(cols.take(0.0, ticks[-1][0] + 120))
        assert got_cols == got_rows, seed
        assert sum(len(r) for _, r in got_rows) > 200
        # and -0.0 / 0.0 as the rows keep them (min/max of equal values keep the first)
        assert [repr(x) for _, rr in got_cols for _, _, r in rr for x in r] == \
            [repr(x) for _, rr in got_rows for _, _, r in rr for x in r]
        assert cols.prev == rows.prev


def test_a_minute_of_one_shape_is_read_as_columns() -> None:
    acc = MinuteAccumulator(0.0)
    for k in range(5):
        acc.add_tick(60.0 + k, {1: float(k), 2: 10.0 - k}, frozenset({1}))
    assert acc.cols is not None and not acc.open
    start, rows = acc.take(0.0, 200.0)
    assert start == 60.0 and rows == [(1, 60.0, [0.0, 4.0, 10.0, 5.0, 4.0, 64.0, 4.0]),
                                      (2, 60.0, [6.0, 10.0, 40.0, 5.0, 6.0, 64.0, 0.0])]


def test_a_minute_begun_point_by_point_goes_on_as_columns() -> None:
    """A minute whose first ticks came through ``add`` (the general path) and whose next ones have the
    same series: columns from then on, the same rows in the end."""
    rows, cols = MinuteAccumulator(0.0), MinuteAccumulator(0.0)
    counters = frozenset({1})
    ticks = [(60.0 + k, {1: float(k * 3 % 7), 2: 0.5 * k, 3: -1.0 * k}) for k in range(20)]
    for k, (ts, pts) in enumerate(ticks):
        rows.add(ts, pts.items(), counters)
        if k < 4:
            cols.add(ts, pts.items(), counters)
        else:
            cols.add_tick(ts, pts, counters)
        if k == 5:
            assert cols.cols is not None and not cols.open
    assert cols.take(0.0, 200.0) == rows.take(0.0, 200.0)
    assert cols.prev == rows.prev
