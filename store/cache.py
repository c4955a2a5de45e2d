"""What a store's writer remembers between transactions, in one owner that forgets it as one.

A writer that looked every id up again on each tick would cost a few statements per tick; so
it keeps the node ids, series ids and slots, which series are counters, the label keys it
built, the rollup watermarks, the ``last_seen`` it last wrote, the in-memory 1-minute rollups
(``store/minute_acc.py``) and the steady-state lookup from a sample's metric and label pairs
to its series id.  Every one of them can come from a transaction that rolled back: a node or a
series created in it does not exist afterwards (and SQLite hands its id to the next row it
inserts), a watermark moved in it did not move, an accumulator fed in it counted points that
were never stored.  So every write transaction runs in ``WriteCache.begin``, and any failure
clears the whole cache (``clear``): the next write looks everything up again, as a freshly
opened store does.

The accumulators get one more guard: a cleared cache does not build a new one for any node
until a tick later than every tick it had accounted for (``acc_floor``), so no accumulator
vouches for a minute that already holds points it did not see.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from triscope.core.samples import Sample, Tick
from triscope.store.minute_acc import MinuteAccumulator

# (metric, label pairs in the order the collector gave them): the steady-state tick's series lookup
RawKey = tuple[str, tuple[tuple[str, str], ...]]
# (series id, ts, value): one point
Point = tuple[int, float, float]
_INF = math.inf
MAX_LABEL_KEYS = 200_000     # label sets canonicalised and kept (more: a collector bug, stop keeping)
MAX_RAW_SIDS = 50_000        # per node, the same


class WriteCache:
    """Ids, watermarks and in-memory rollups of one store's writer.  Not thread-safe by itself:
    the store holds its write lock around every use."""

    __slots__ = ("acc", "acc_after", "acc_floor", "counters", "label_keys", "last_seen", "node_ids", "nslots",
                 "raw_sids", "series_ids", "slots", "watermarks")

    def __init__(self) -> None:
        self.node_ids: dict[str, int] = {}                       # node name -> id
        self.series_ids: dict[tuple[int, str, str], int] = {}    # (node id, metric, label key) -> series id
        self.slots: dict[int, int] = {}        # series id -> slot (its position in the node's sample rows)
        self.nslots: dict[int, int] = {}       # node id -> slots in use (the length of a full sample row)
        self.counters: set[int] = set()        # series ids of kind 'counter'
        self.raw_sids: dict[int, dict[RawKey, int]] = {}        # node id -> steady-state lookup
        self.label_keys: dict[tuple[tuple[str, str], ...], str] = {}   # sorted label pairs -> label key
        self.watermarks: dict[tuple[int, str], float] = {}      # (node id, tier) -> rolled until
        self.last_seen: dict[int, float] = {}  # node id -> last_seen this store last wrote
        self.acc: dict[int, MinuteAccumulator] = {}              # node id -> its open 1-minute rollups
        self.acc_after: dict[int, float] = {}  # node id -> no accumulator until a tick later than this
        self.acc_floor = -_INF                 # every node: no accumulator until a tick later than this

    # ------------------------------------------------------------------ forgetting
    def clear(self) -> None:
        """Forget everything (a transaction failed: any of it may come from that transaction)."""
        floor = self.acc_floor
        for acc in self.acc.values():
            floor = max(floor, acc.last_ts)
        for t in self.acc_after.values():
            floor = max(floor, t)
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, dict | set):
                value.clear()
        self.acc_floor = floor

    @contextlib.contextmanager
    def begin(self, engine: Engine) -> Iterator[Connection]:
        """``engine.begin()``, and the whole cache cleared if the transaction fails."""
        try:
            with engine.begin() as conn:
                yield conn
        except BaseException:
            self.clear()
            raise

    # ------------------------------------------------------------------ series ids
    def add_series(self, node_id: int, rows: Iterator[Any] | Sequence[Any]) -> None:
        """Remember a node's series from (id, metric, label key, kind, slot) rows."""
        width = 0
        # the rows bring new strings per row; one metric name and one label key is kept per distinct
        # value (a workload's ten metrics share its label set).  With ``remember_raw``'s shared label
        # tuples: 0.38 MB less in the agent's heap for the workloads bench's 780 series (tracemalloc)
        names: dict[str, str] = {}
        for sid, metric, lk, kind, slot in rows:
            self.series_ids[(node_id, names.setdefault(metric, metric), names.setdefault(lk, lk))] = int(sid)
            self.slots[int(sid)] = int(slot)
            width = max(width, int(slot) + 1)
            if kind == "counter":
                self.counters.add(int(sid))
        self.nslots[node_id] = width

    def remember_raw(self, node_id: int, sids: Mapping[tuple[str, str], int],
                     pending: Sequence[tuple[float, Sample, str]]) -> None:
        """Fill the steady-state lookup from the (ts, sample, label key) a general write resolved."""
        cache = self.raw_sids.setdefault(node_id, {})
        if len(cache) > MAX_RAW_SIDS:   # label sets that never repeat (a collector bug): start over
            cache.clear()
        # one tuple of label pairs per label set, shared by the metrics that carry it (a workload's
        # ten series), not a tuple of its own for each
        shared: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
        for _, smp, lk in pending:
            lb = smp.labels
            pairs = tuple(lb.items()) if lb else ()
            cache[(smp.name, shared.setdefault(pairs, pairs))] = sids[(smp.name, lk)]

    def tick_points(self, node_id: int, tick: Tick) -> dict[int, float] | None:
        """series id -> value of one tick's finite samples (the last wins), when every series id is
        cached; None otherwise.  Keyed by the metric and the label pairs in the order the collector
        gave them, so the steady state never sorts or serialises a label set."""
        cache = self.raw_sids.get(node_id)
        if cache is None:
            return None
        points: dict[int, float] = {}
        for s in tick.samples:
            lb = s.labels
            sid = cache.get((s.name, tuple(lb.items()) if lb else ()))
            if sid is None:
                return None
            v = float(s.value)
            if v == v and v != _INF and v != -_INF:
                points[sid] = v
        return points

    # ------------------------------------------------------------------ in-memory 1-minute rollups
    def feed(self, node_id: int, rows: Sequence[Point]) -> None:
        """Newly stored points of one node into its accumulator (one is started if none runs and
        the points are later than anything it may have missed; out of order: it stands down)."""
        if not rows:
            return
        by_ts = points_by_ts(rows)
        t_lo, t_hi = min(by_ts), max(by_ts)
        acc = self.acc.get(node_id)
        if acc is None:
            after = max(self.acc_after.get(node_id, -_INF), self.acc_floor)
            if t_lo <= after:
                self.acc_after[node_id] = max(t_hi, after)
                return
            acc = self.acc[node_id] = MinuteAccumulator(t_lo)
        elif t_lo <= acc.last_ts:   # out of order: rolled from the raw samples in SQL from now on
            self.drop_acc(node_id, t_hi)
            return
        counters = self.counters
        for ts in sorted(by_ts):
            acc.add(ts, by_ts[ts].items(), counters)

    def feed_tick(self, node_id: int, ts: float, points: Mapping[int, float]) -> None:
        """One tick's points (the steady state: no dict of timestamps to build)."""
        acc = self.acc.get(node_id)
        if acc is not None and ts > acc.last_ts:
            acc.add(ts, points.items(), self.counters)
        else:
            self.feed(node_id, [(sid, ts, v) for sid, v in points.items()])

    def drop_acc(self, node_id: int, t: float) -> None:
        """Stop the node's accumulator: points up to ``t`` were stored without it seeing them all."""
        acc = self.acc.pop(node_id, None)
        last = acc.last_ts if acc is not None else -_INF
        self.acc_after[node_id] = max(t, last, self.acc_after.get(node_id, -_INF))


def points_by_ts(rows: Sequence[Point]) -> dict[float, dict[int, float]]:
    """(series id, ts, value) points -> ts -> {series id: value}."""
    out: dict[float, dict[int, float]] = {}
    for sid, ts, v in rows:
        pts = out.get(ts)
        if pts is None:
            out[ts] = {sid: v}
        else:
            pts[sid] = v
    return out
