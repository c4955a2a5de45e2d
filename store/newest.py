"""The newest point of each series (``Store.latest``, ``Store.fleet_latest``), per dialect.

Both answer alike: with ``since`` only raw points at or after it count; without it, a series
with no raw point left falls back to its newest 1-minute rollup (``last_ts``, ``last``).

* SQLite keeps one row per sample: each series costs one backward probe of the primary key
  (series_id, ts).
* PostgreSQL keeps one row per node and tick, so "a series' newest point" is not one index
  descent: each node's newest row (which holds every live series) is read once, and only the
  series missing from it are looked for further (docs/scaling.md, "What a row per node costs
  the reads").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection

from triscope.store.reader import FleetLatest, LatestValue, SeriesInfo

ROLLUP_FALLBACK_CHUNK = 5000   # series ids per statement of the SQLite rollup fallback


class NewestPoints:
    """``where``/``params``: a condition on ``series s JOIN nodes n`` (``:metrics`` and
    ``:nodes`` bound as expanding lists)."""

    def latest(self, conn: Connection, infos: Sequence[SeriesInfo], since: float | None) -> list[LatestValue]:
        raise NotImplementedError

    def fleet(self, conn: Connection, where: str, params: dict[str, Any], since: float | None) -> FleetLatest:
        raise NotImplementedError


class SqliteNewest(NewestPoints):
    def latest(self, conn: Connection, infos: Sequence[SeriesInfo], since: float | None) -> list[LatestValue]:
        out: list[LatestValue] = []
        for info in infos:
            row = conn.execute(text("SELECT ts, value FROM samples WHERE series_id = :s "
                                    + ("AND ts >= :since " if since is not None else "")
                                    + "ORDER BY ts DESC LIMIT 1"), {"s": info.id, "since": since}).first()
            if row is None and since is None:
                row = conn.execute(text("SELECT last_ts, last FROM rollup_1m WHERE series_id = :s "
                                        "ORDER BY bucket DESC LIMIT 1"), {"s": info.id}).first()
            if row is not None:
                out.append(LatestValue(info, float(row[0]), float(row[1])))
        return out

    def fleet(self, conn: Connection, where: str, params: dict[str, Any], since: float | None) -> FleetLatest:
        out: FleetLatest = {}
        params = dict(params)
        bound = ""
        if since is not None:
            bound = " AND ts >= :since"
            params["since"] = float(since)
        sql = (f"SELECT n.name, s.metric, s.labels, s.id, x.ts, x.value FROM series s "
               f"JOIN nodes n ON n.id = s.node_id "
               f"LEFT JOIN samples x ON x.series_id = s.id AND x.ts = "
               f"(SELECT max(ts) FROM samples WHERE series_id = s.id{bound}) WHERE {where}")
        stmt = _expanding(text(sql), params)
        missing: dict[int, tuple[str, str, str]] = {}
        for name, metric, lk, sid, ts, value in conn.execute(stmt, params):
            if ts is None:
                missing[int(sid)] = (name, metric, lk)
            else:
                out.setdefault(name, {})[(metric, lk)] = (float(ts), float(value))
        if since is None and missing:
            ids = list(missing)
            for i in range(0, len(ids), ROLLUP_FALLBACK_CHUNK):
                rows = conn.execute(text(
                    "SELECT r.series_id, r.last_ts, r.last FROM rollup_1m r WHERE r.series_id IN :ids AND r.bucket = "
                    "(SELECT max(bucket) FROM rollup_1m WHERE series_id = r.series_id)"
                ).bindparams(bindparam("ids", expanding=True)), {"ids": ids[i:i + ROLLUP_FALLBACK_CHUNK]})
                for sid, ts, value in rows:
                    name, metric, lk = missing[int(sid)]
                    out.setdefault(name, {})[(metric, lk)] = (float(ts), float(value))
        return out


class PostgresNewest(NewestPoints):
    def latest(self, conn: Connection, infos: Sequence[SeriesInfo], since: float | None) -> list[LatestValue]:
        if not infos:
            return []
        got = self.newest(conn, "s.id = ANY(CAST(:ids AS integer[]))", {"ids": [i.id for i in infos]}, since)
        out: list[LatestValue] = []
        for info in infos:
            p = got.get(info.id)
            if p is not None:
                out.append(LatestValue(info, p[3], p[4]))
        return out

    def fleet(self, conn: Connection, where: str, params: dict[str, Any], since: float | None) -> FleetLatest:
        out: FleetLatest = {}
        for name, metric, lk, ts, value in self.newest(conn, where, params, since).values():
            out.setdefault(name, {})[(metric, lk)] = (ts, value)
        return out

    def newest(self, conn: Connection, where: str, params: dict[str, Any], since: float | None
               ) -> dict[int, tuple[str, str, str, float, float]]:
        """Series id -> (node, metric, label key, ts, value) of the newest point of every series
        matching ``where`` (on ``series s JOIN nodes n``), at or after ``since`` if given.

        Bounded steps instead of a backward probe per series (a series' points are spread over
        its node's rows, so "its newest" is not one index descent any more): each node's newest
        row, which holds every live series; for the rest, the node's rows at or after ``since``.
        Without ``since``: the node's rows not yet rolled up (at or after its 1-minute watermark,
        about two minutes of them), then the newest 1-minute rollup, whose ``last_ts``/``last``
        are the newest raw point before the watermark, so a series that stopped reporting days
        ago costs one rollup probe, not a scan of its node's rows.  Only a series with no rollup
        row at all (rollups kept shorter than raw samples) is looked for in all its node's rows."""
        p = dict(params)
        bound = ""
        if since is not None:
            bound = " AND r.ts >= :since"
            p["since"] = float(since)
        stmt = text(
            f"WITH w AS MATERIALIZED (SELECT s.id, s.node_id, s.slot, n.name, s.metric, s.labels FROM series s "
            f"JOIN nodes n ON n.id = s.node_id WHERE {where}) "
            f"SELECT w.id, w.node_id, w.slot, w.name, w.metric, w.labels, x.ts, x.vals[w.slot + 1] "
            f"FROM (SELECT DISTINCT node_id FROM w) q "
            f"LEFT JOIN LATERAL (SELECT r.ts, r.vals FROM sample_rows r WHERE r.node_id = q.node_id{bound} "
            f"ORDER BY r.ts DESC LIMIT 1) x ON true JOIN w ON w.node_id = q.node_id")
        out: dict[int, tuple[str, str, str, float, float]] = {}
        rest: dict[int, tuple[int, int, str, str, str]] = {}
        for sid, nid, slot, name, metric, lk, ts, value in conn.execute(_expanding(stmt, p), p):
            if value is None:
                rest[int(sid)] = (int(nid), int(slot), name, metric, lk)
            else:
                out[int(sid)] = (name, metric, lk, float(ts), float(value))
        if not rest:
            return out
        ids = list(rest)
        if since is not None:
            lows = [float(since)] * len(ids)
        else:
            wms: dict[int, float] = dict(conn.execute(text(
                "SELECT node_id, rolled_until FROM rollup_watermarks WHERE tier = '1m' "
                "AND node_id = ANY(CAST(:n AS integer[]))"), {"n": sorted({v[0] for v in rest.values()})}).all())
            lows = [float(wms.get(rest[i][0], -math.inf)) for i in ids]
        rows = conn.execute(text(
            "SELECT m.id, x.ts, x.v FROM unnest(CAST(:ids AS integer[]), CAST(:nids AS integer[]), "
            "CAST(:slots AS integer[]), CAST(:lo AS float8[])) AS m(id, nid, slot, lo) "
            "CROSS JOIN LATERAL (SELECT r.ts, r.vals[m.slot + 1] AS v FROM sample_rows r WHERE r.node_id = m.nid "
            "AND r.ts >= m.lo AND r.vals[m.slot + 1] IS NOT NULL ORDER BY r.ts DESC LIMIT 1) x"),
            {"ids": ids, "nids": [rest[i][0] for i in ids], "slots": [rest[i][1] for i in ids],
             "lo": lows}).all()
        for sid, ts, value in rows:
            _nid, _slot, name, metric, lk = rest.pop(int(sid))
            out[int(sid)] = (name, metric, lk, float(ts), float(value))
        if rest and since is None:
            ids = list(rest)
            rows = conn.execute(text(
                "SELECT r.series_id, r.last_ts, r.last FROM rollup_1m r WHERE r.series_id = ANY(CAST(:ids AS integer[])) "
                "AND r.bucket = (SELECT max(bucket) FROM rollup_1m WHERE series_id = r.series_id)"), {"ids": ids}).all()
            for sid, ts, value in rows:
                _nid, _slot, name, metric, lk = rest.pop(int(sid))
                out[int(sid)] = (name, metric, lk, float(ts), float(value))
            # no rollup at all (rollups kept shorter than raw samples, or never rolled): the raw rows
            for sid, (nid, slot, name, metric, lk) in rest.items():
                row = conn.execute(text("SELECT ts, vals[:k] FROM sample_rows WHERE node_id = :n "
                                        "AND vals[:k] IS NOT NULL ORDER BY ts DESC LIMIT 1"),
                                   {"n": nid, "k": slot + 1}).first()
                if row is not None:
                    out[sid] = (name, metric, lk, float(row[0]), float(row[1]))
        return out


def _expanding(stmt: Any, params: dict[str, Any]) -> Any:
    """``stmt`` with ``:metrics`` / ``:nodes`` bound as expanding lists where ``params`` has them."""
    for key in ("metrics", "nodes"):
        if key in params:
            stmt = stmt.bindparams(bindparam(key, expanding=True))
    return stmt


def newest_for(dialect: str) -> NewestPoints:
    return PostgresNewest() if dialect == "postgresql" else SqliteNewest()
