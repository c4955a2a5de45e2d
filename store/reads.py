"""The store's reads (``StoreReader``, store/reader.py): listings, events, range queries and the
newest points.

``query`` serves a range from raw samples or a rollup tier, whichever keeps the row count small,
and downsamples in SQL to at most ``max_points`` (the min and the max of each bucket survive, so
spikes do).  A state series (``SHARE_METRICS``: 1 while the accelerator is in that state, else 0)
is the exception: a bucket of it reads its mean, the share of the bucket spent in the state, so a
minute with 10 s of one state and 50 s of another reads 0.17 and 0.83, never 1 and 1 (the minute's
"worst state" is no reading of it).  A rollup tier's not-yet-rolled tail comes from the next finer tier.  Counters come
back as per-second rates with resets handled.  Reads never touch the writer's cache.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine

from triscope.core.samples import parse_label_key
from triscope.store.dialects import SqlDialect, sql_for
from triscope.store.newest import NewestPoints, newest_for
from triscope.store.reader import (
    EventRow,
    FleetLatest,
    LatestValue,
    NodeInfo,
    SeriesData,
    SeriesInfo,
    SeriesKey,
    VerdictRun,
)
from triscope.store.verdicts import STATE_METRIC, read_runs

RAW_POINTS_PER_OUTPUT_POINT = 50   # the tier choice: raw while a range holds at most this many per point (1 Hz)
SMALL_RANGE_POINTS = 4             # a raw range of at most this many seconds per output point is read whole
SHARE_METRICS = frozenset({STATE_METRIC})   # 0/1 series whose buckets read the time share (their mean)


class StoreReads:
    """The read methods of ``Store`` (which is a ``StoreReads`` with a writer)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.sql: SqlDialect = sql_for(self.dialect)
        self._newest: NewestPoints = newest_for(self.dialect)

    # ------------------------------------------------------------------ listings
    def nodes(self) -> list[NodeInfo]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT name, labels, first_seen, last_seen FROM nodes ORDER BY name")).all()
        return [NodeInfo(r[0], json_dict(r[1]), float(r[2]), float(r[3])) for r in rows]

    def series(self, node: str | None = None, metric: str | None = None, prefix: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[SeriesInfo]:
        where, params = ["1=1"], {}
        if node is not None:
            where.append("n.name = :node")
            params["node"] = node
        metric_filter(where, params, metric, prefix)
        sql = (f"SELECT s.id, n.name, s.metric, s.labels, s.kind FROM series s JOIN nodes n ON n.id = s.node_id "
               f"WHERE {' AND '.join(where)} ORDER BY n.name, s.metric, s.labels")
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).all()
        out = [SeriesInfo(int(r[0]), r[1], r[2], parse_label_key(r[3]), r[4]) for r in rows]
        if labels:
            out = [s for s in out if all(s.labels.get(k) == v for k, v in labels.items())]
        return out

    def metric_names(self, node: str | None = None) -> list[str]:
        sql = "SELECT DISTINCT s.metric FROM series s"
        params: dict[str, Any] = {}
        if node is not None:
            sql += " JOIN nodes n ON n.id = s.node_id WHERE n.name = :node"
            params["node"] = node
        with self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(text(sql), params))

    def time_bounds(self, node: str | None = None) -> tuple[float, float] | None:
        sql = self.sql.time_bounds_all_sql if node is None else self.sql.time_bounds_node_sql
        with self.engine.connect() as conn:
            row = conn.execute(text(sql), {} if node is None else {"node": node}).first()
        if row is None or row[0] is None:
            return None
        return float(row[0]), float(row[1])

    def series_keys(self, prefix: str | None = None, metric: str | None = None) -> dict[str, set[SeriesKey]]:
        """node -> {(metric, labelkey)} of every stored series (of ``metric``, or whose name starts
        with ``prefix``) over the whole fleet, in one statement; labels stay in their canonical
        text form (``triscope.core.samples.parse_label_key``), so a fleet-wide listing stays cheap."""
        where: list[str] = ["1=1"]
        params: dict[str, Any] = {}
        metric_filter(where, params, metric, prefix)
        out: dict[str, set[SeriesKey]] = {}
        with self.engine.connect() as conn:
            rows = conn.execute(text(f"SELECT n.name, s.metric, s.labels FROM series s JOIN nodes n ON n.id = s.node_id "
                                     f"WHERE {' AND '.join(where)}"), params)
            for name, m, lk in rows:
                out.setdefault(name, set()).add((m, lk))
        return out

    def verdict_runs(self, node: str, start: float, end: float) -> list[VerdictRun]:
        with self.engine.connect() as conn:
            return read_runs(conn, node, start, end)

    def current_verdicts(self, lookback_s: float, nodes: Sequence[str] | None = None) -> dict[str, list[VerdictRun]]:
        """Each node's runs that end within ``lookback_s`` of its last tick: one statement, each
        node's newest runs found through the (node, end) index of ``verdict_runs``."""
        if nodes is not None and not nodes:
            return {}
        sql = ("SELECT n.name, r.accelerator, r.namespace, r.pod, r.container, r.workload, r.state, r.start_ts, "
               "r.end_ts, r.ticks, r.score_sum, r.score_max FROM nodes n CROSS JOIN verdict_runs r WHERE r.node_id = n.id "
               "AND r.end_ts >= n.last_seen - :lb")   # CROSS JOIN: SQLite loops over the nodes, not every run
        params: dict[str, Any] = {"lb": lookback_s}
        stmt = text(sql + " ORDER BY n.name, r.accelerator, r.start_ts, r.id")
        if nodes is not None:
            stmt = text(sql + " AND n.name IN :nodes ORDER BY n.name, r.accelerator, r.start_ts, r.id").bindparams(
                bindparam("nodes", expanding=True))
            params["nodes"] = list(nodes)
        out: dict[str, list[VerdictRun]] = {}
        with self.engine.connect() as conn:
            for r in conn.execute(stmt, params):
                out.setdefault(str(r[0]), []).append(VerdictRun(
                    str(r[0]), str(r[1]), (r[2], r[3], r[4], r[5]), str(r[6]), float(r[7]), float(r[8]), int(r[9]),
                    float(r[10]) / max(1, int(r[9])), float(r[11])))
        return out

    def events(self, node: str | None = None, start: float | None = None, end: float | None = None,
               kinds: Sequence[str] | None = None, limit: int = 10000) -> list[EventRow]:
        where: list[str] = ["1=1"]
        params: dict[str, Any] = {"lim": limit}
        if node is not None:
            where.append("n.name = :node")
            params["node"] = node
        if start is not None:
            where.append("e.ts >= :a")
            params["a"] = start
        if end is not None:
            where.append("e.ts <= :b")
            params["b"] = end
        if kinds:
            names = []
            for i, k in enumerate(kinds):
                params[f"k{i}"] = k
                names.append(f":k{i}")
            where.append(f"e.kind IN ({', '.join(names)})")
        sql = (f"SELECT e.id, n.name, e.ts, e.kind, e.severity, e.message, e.details FROM events e "
               f"JOIN nodes n ON n.id = e.node_id WHERE {' AND '.join(where)} ORDER BY e.ts, e.id LIMIT :lim")
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).all()
        return [EventRow(int(r[0]), r[1], float(r[2]), r[3], r[4], r[5], json_dict(r[6])) for r in rows]

    # ------------------------------------------------------------------ newest points
    def latest(self, node: str, metric: str | None = None, prefix: str | None = None,
               since: float | None = None) -> list[LatestValue]:
        infos = self.series(node=node, metric=metric, prefix=prefix)
        with self.engine.connect() as conn:
            return self._newest.latest(conn, infos, since)

    def fleet_latest(self, metrics: Sequence[str], since: float | None = None,
                     nodes: Sequence[str] | None = None) -> FleetLatest:
        """The newest point of every series of ``metrics`` on every node (or on ``nodes``), in a
        few fleet-wide statements: node -> {(metric, labelkey): (ts, value)}.

        ``since``: only raw points at or after it (on PostgreSQL the day partitions before it are
        not touched).  Without ``since`` a series with no raw point left falls back to its newest
        1-minute rollup (``last_ts``, ``last``), as ``latest()`` does (store/newest.py)."""
        metrics = list(metrics)
        if not metrics or (nodes is not None and not nodes):
            return {}
        params: dict[str, Any] = {"metrics": metrics}
        where = "s.metric IN :metrics"
        if nodes is not None:
            where += " AND n.name IN :nodes"
            params["nodes"] = list(nodes)
        with self.engine.connect() as conn:
            return self._newest.fleet(conn, where, params, since)

    # ------------------------------------------------------------------ ranges
    def query(self, metric: str, node: str | None = None, labels: Mapping[str, str] | None = None,
              start: float | None = None, end: float | None = None, max_points: int | None = 2000,
              rate: bool | None = None, tier: str | None = None) -> list[SeriesData]:
        """Every series of ``metric`` (on ``node``, matching ``labels``) over [start, end].

        Counters come back as per-second rates (``rate=None``) unless ``rate=False``.
        ``max_points=None`` returns every raw point.  ``tier`` forces ``raw``, ``1m`` or ``1h``.
        """
        infos = self.series(node=node, metric=metric, labels=labels)
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        out: list[SeriesData] = []
        with self.engine.connect() as conn:
            for info in infos:
                as_rate = (info.kind == "counter") if rate is None else rate
                out.append(self._query_one(conn, info, start, end, max_points, as_rate, tier))
        return out

    def query_series(self, info: SeriesInfo, start: float, end: float, max_points: int | None = 2000,
                     rate: bool | None = None, tier: str | None = None) -> SeriesData:
        with self.engine.connect() as conn:
            as_rate = (info.kind == "counter") if rate is None else rate
            return self._query_one(conn, info, start, end, max_points, as_rate, tier)

    def _query_one(self, conn: Connection, info: SeriesInfo, start: float, end: float,
                   max_points: int | None, as_rate: bool, tier: str | None) -> SeriesData:
        tier = tier or choose_tier(start, end, max_points)
        share = not as_rate and info.metric in SHARE_METRICS
        if tier == "raw":
            ts, vals = self._raw(conn, info.id, start, end, as_rate, max_points, share)
            return SeriesData(info, ts, vals, "raw")
        # rollup tier, with the not-yet-rolled tail served from the next finer tier
        width = 60.0 if tier == "1m" else 3600.0
        wm = self._watermark(conn, info.id, tier)
        ts = []
        vals = []
        roll_end = min(end, wm) if wm is not None else start
        if roll_end > start:
            ts, vals = self._rollup_points(conn, tier, width, info.id, start, roll_end, as_rate, share)
        if roll_end < end:
            if tier == "1m":
                t2, v2 = self._raw(conn, info.id, max(start, roll_end), end, as_rate, None)
                if share:
                    t2, v2 = bucket_means(t2, v2, 60.0)
            else:
                wm1 = self._watermark(conn, info.id, "1m")
                mid = min(end, wm1) if wm1 is not None else max(start, roll_end)
                t2, v2 = self._rollup_points(conn, "1m", 60.0, info.id, max(start, roll_end), mid, as_rate, share)
                if mid < end:
                    t3, v3 = self._raw(conn, info.id, max(start, mid), end, as_rate, None)
                    if share:
                        t3, v3 = bucket_means(t3, v3, 60.0)
                    t2, v2 = t2 + t3, v2 + v3
                if share:        # the tail's minutes as hours too: every point then weighs one hour
                    t2, v2 = bucket_means(t2, v2, width)
            ts, vals = ts + t2, vals + v2
        if max_points is not None and len(ts) > max_points:
            ts, vals = (mean_downsample if share else minmax_downsample)(ts, vals, max_points)
        return SeriesData(info, ts, vals, tier)

    def _watermark(self, conn: Connection, series_id: int, tier: str) -> float | None:
        """How far ``tier`` is rolled up for the node of series ``series_id``."""
        row = conn.execute(text("SELECT w.rolled_until FROM rollup_watermarks w JOIN series s ON s.node_id = w.node_id "
                                "WHERE s.id = :s AND w.tier = :t"), {"s": series_id, "t": tier}).first()
        return None if row is None else float(row[0])

    def _raw(self, conn: Connection, sid: int, start: float, end: float, as_rate: bool,
             max_points: int | None, share: bool = False) -> tuple[list[float], list[float]]:
        params = {"s": sid, "a": start, "b": end}
        if as_rate:
            inner = ("SELECT ts, CASE WHEN prev IS NULL OR ts <= pts THEN NULL "
                     "WHEN value >= prev THEN (value - prev) / (ts - pts) ELSE value / (ts - pts) END AS value "
                     "FROM (SELECT ts, value, lag(value) OVER (ORDER BY ts) AS prev, lag(ts) OVER (ORDER BY ts) AS pts "
                     "FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b) r")
            base = f"SELECT ts, value FROM ({inner}) q WHERE value IS NOT NULL"
        else:
            base = "SELECT ts, value FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b"
        if max_points is not None and max_points >= 4 and end - start <= SMALL_RANGE_POINTS * max_points:
            # a short range holds few raw points (1 Hz): one indexed read and min/max per bucket here
            # beat counting, then bucketing in SQL
            rows = conn.execute(text(base + " ORDER BY ts"), params).all()
            down = mean_downsample if share else minmax_downsample
            return down([float(r[0]) for r in rows], [float(r[1]) for r in rows], max_points)
        if max_points is not None and max_points >= 4:
            count = conn.execute(text("SELECT count(*) FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b"),
                                 params).scalar_one()
            if count > max_points:
                return self._sql_downsample(conn, base, params, start, end, max_points, share)
        rows = conn.execute(text(base + " ORDER BY ts"), params).all()
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows]

    def _sql_downsample(self, conn: Connection, base: str, params: dict[str, Any], start: float, end: float,
                        max_points: int, share: bool = False) -> tuple[list[float], list[float]]:
        """Min/max per bucket in SQL (a state series: its mean per bucket): at most ``max_points``
        rows leave the database."""
        nb = max(1, max_points // (1 if share else 2))
        width = max((end - start) / nb, 1e-9)
        p = dict(params, w=width, a0=start)
        sub = f"SELECT ts, value, {self.sql.floor('(ts - :a0)', ':w')} AS b FROM ({base}) x"
        if share:
            means = conn.execute(text(f"SELECT b, avg(value) FROM ({sub}) y GROUP BY b ORDER BY b"), p).all()
            # at the bucket's middle: every state series of one accelerator reads the same instants
            return [start + (float(r[0]) + 0.5) * width for r in means], [float(r[1]) for r in means]
        rows = self.sql.bucket_extremes(conn, sub, p)
        ts: list[float] = []
        vals: list[float] = []
        for _b, vmin, tmin, vmax, tmax in sorted(rows, key=lambda r: r[0]):
            for t, v in sorted({(float(tmin), float(vmin)), (float(tmax), float(vmax))}):
                ts.append(t)
                vals.append(v)
        return ts, vals

    def _rollup_points(self, conn: Connection, tier: str, width: float, sid: int, start: float, end: float,
                       as_rate: bool, share: bool = False) -> tuple[list[float], list[float]]:
        table = f"rollup_{tier}"
        a = math.floor(start / width) * width
        rows = conn.execute(text(f"SELECT bucket, min, max, sum, count, increase FROM {table} "
                                 f"WHERE series_id = :s AND bucket >= :a AND bucket < :b ORDER BY bucket"),
                            {"s": sid, "a": a, "b": end}).all()
        ts: list[float] = []
        vals: list[float] = []
        for bucket, vmin, vmax, vsum, cnt, inc in rows:
            if as_rate:
                ts.append(float(bucket) + width / 2)
                vals.append(float(inc) / width)
            elif share:              # the time share of the bucket in the state, not "was it ever"
                ts.append(float(bucket) + width / 2)
                vals.append(float(vsum) / float(cnt) if cnt else 0.0)
            elif cnt == 1 or vmin == vmax:
                ts.append(float(bucket) + width / 2)
                vals.append(float(vmin))
            else:
                ts.extend((float(bucket) + width * 0.25, float(bucket) + width * 0.75))
                vals.extend((float(vmin), float(vmax)))
        return ts, vals


def choose_tier(start: float, end: float, max_points: int | None) -> str:
    if max_points is None:
        return "raw"
    span = end - start
    # raw while the range holds at most ~50 raw points per output point (1 Hz assumed), then rollups
    if span <= RAW_POINTS_PER_OUTPUT_POINT * max_points:
        return "raw"
    if span <= 60 * RAW_POINTS_PER_OUTPUT_POINT * max_points:
        return "1m"
    return "1h"


def metric_filter(where: list[str], params: dict[str, Any], metric: str | None, prefix: str | None) -> None:
    """SQL conditions on ``series s`` for one metric and/or a metric-name prefix (matched literally)."""
    if metric is not None:
        where.append("s.metric = :metric")
        params["metric"] = metric
    if prefix is not None:
        where.append("s.metric LIKE :prefix ESCAPE '\\'")
        params["prefix"] = prefix.replace("\\", "\\\\").replace("_", r"\_").replace("%", r"\%") + "%"


def json_dict(v: Any) -> dict[str, Any]:
    """A JSON column's value as a dict (SQLite hands back text, PostgreSQL the parsed value)."""
    if v is None:
        return {}
    if isinstance(v, dict):
        return v
    return dict(json.loads(v))


def bucket_means(ts: list[float], vals: list[float], width: float) -> tuple[list[float], list[float]]:
    """The mean of the points in each ``width``-second bucket (aligned like the rollups), at the
    bucket's middle: the not-yet-rolled tail of a state series read like its rolled part."""
    sums: dict[float, list[float]] = {}
    for t, v in zip(ts, vals, strict=True):
        acc = sums.setdefault(math.floor(t / width) * width, [0.0, 0.0])
        acc[0] += v
        acc[1] += 1
    keys = sorted(sums)
    return [k + width / 2 for k in keys], [sums[k][0] / sums[k][1] for k in keys]


def mean_downsample(ts: list[float], vals: list[float], max_points: int) -> tuple[list[float], list[float]]:
    """The mean time and value of each of ``max_points`` equal-count buckets, in time order."""
    n = len(ts)
    if n <= max_points:
        return ts, vals
    out_t: list[float] = []
    out_v: list[float] = []
    for b in range(max_points):
        lo, hi = b * n // max_points, (b + 1) * n // max_points
        if hi > lo:
            out_t.append(sum(ts[lo:hi]) / (hi - lo))
            out_v.append(sum(vals[lo:hi]) / (hi - lo))
    return out_t, out_v


def minmax_downsample(ts: list[float], vals: list[float], max_points: int) -> tuple[list[float], list[float]]:
    """Keep the min and the max of each of ``max_points // 2`` equal-count buckets, in time order."""
    n = len(ts)
    if n <= max_points:
        return ts, vals
    nb = max(1, max_points // 2)
    out_t: list[float] = []
    out_v: list[float] = []
    for b in range(nb):
        lo, hi = b * n // nb, (b + 1) * n // nb
        if hi <= lo:
            continue
        seg = range(lo, hi)
        imin = min(seg, key=vals.__getitem__)
        imax = max(seg, key=vals.__getitem__)
        for i in sorted({imin, imax}):
            out_t.append(ts[i])
            out_v.append(vals[i])
    return out_t, out_v
