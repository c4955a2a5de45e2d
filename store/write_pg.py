"""The PostgreSQL back-end of the write path (the fleet store): one row per node and tick in
``sample_rows (node_id, ts, vals)``, each series' value at its slot (docs/scaling.md).

Three ways in, cheapest first:

* the steady state (every id cached, no event, no bucket to roll): one statement in one round
  trip on a connection of the writer's own in autocommit mode, which also moves ``last_seen``
  (in steps of ``LAST_SEEN_STEP_S``); the row is sent as one text literal built from ``repr()``
  of each value (exact, and cheaper in Python than COPY rows or a binary array);
* the general path with ``COPY`` of the rows, when nothing of the batch is stored yet;
* a replay (some points stored already): merged into the stored rows element by element, in the
  upsert itself, so a row another writer filled in the meantime keeps its points.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from triscope.core.samples import Tick
from triscope.store.cache import Point, points_by_ts
from triscope.store.db import PG_OPTIONS, pg_connect_defaults, with_url_options
from triscope.store.write import TickWriter, is_unique_violation

_MOVE_LAST_SEEN = "WITH u AS (UPDATE nodes SET last_seen = %(t)s WHERE id = %(n)s AND last_seen < %(t)s) "
# several ticks: their timestamps and their rows (each a float8[] literal) as two parallel arrays
_INSERT_MANY_TS = ("INSERT INTO sample_rows (node_id, ts, vals) SELECT %(n)s, t, v::double precision[] "
                   "FROM unnest(%(ts)s::double precision[], %(v)s::text[]) AS x(t, v)")
_INSERT_ONE_TS = ("INSERT INTO sample_rows (node_id, ts, vals) "
                  "VALUES (%(n)s, %(ts)s::double precision, %(v)s::double precision[])")
# (move last_seen?, one timestamp?) -> the steady-state tick's statement
STEADY_SQL = {(False, False): _INSERT_MANY_TS, (False, True): _INSERT_ONE_TS,
              (True, False): _MOVE_LAST_SEEN + _INSERT_MANY_TS, (True, True): _MOVE_LAST_SEEN + _INSERT_ONE_TS}
# a replay: merge into the stored row, element by element (a stored point keeps its value)
MERGE_ROW = ("INSERT INTO sample_rows (node_id, ts, vals) VALUES (%s, %s, %s::float8[]) "
             "ON CONFLICT (node_id, ts) DO UPDATE SET vals = ARRAY(SELECT coalesce(o, n) FROM "
             "unnest(sample_rows.vals, excluded.vals) WITH ORDINALITY AS u(o, n, i) ORDER BY i)")


class PgWriter(TickWriter):
    direct: Any = None   # the steady state's own psycopg connection, in autocommit mode

    def write_ticks(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int:
        n = self.write_steady(node, ticks, rollup)
        if n is not None:
            return n
        try:
            return self.write_general(node, ticks, rollup, fast=True)
        except Exception as e:  # noqa: BLE001 - the driver's error is classified (unique violation) and re-raised otherwise
            if not is_unique_violation(e):
                raise
        # some points are stored already (a replay): the idempotent path (the failed transaction
        # cleared the cache, so no id from it is used)
        return self.write_general(node, ticks, rollup)

    def write_steady(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int | None:
        """The steady-state tick in one statement and one round trip: a data-modifying CTE moves
        the node's last_seen and the tick goes in as one row of ``sample_rows`` (one statement is
        one transaction: no BEGIN, no COMMIT, no pool checkout ping).  None when the tick needs
        the general path (which then writes it)."""
        got = self.steady_points(node, ticks, rollup)
        if got is None:
            return None
        nid, t_max, per = got
        params: dict[str, Any]
        single = len(per) == 1
        if single:
            params = {"ts": repr(t_max), "v": self.row_literal(nid, per[0][1])}
        else:
            params = {"ts": "{" + ",".join(repr(ts) for ts, _ in per) + "}",
                      "v": "{" + ",".join(['"' + self.row_literal(nid, p) + '"' for _, p in per]) + "}"}
        n = sum(len(p) for _, p in per)
        move = self.moves_last_seen(nid, t_max)
        params["t"], params["n"] = t_max, nid
        try:
            conn = self.connection()
            conn.execute(STEADY_SQL[move, single], params)
        except Exception as e:  # noqa: BLE001 - whatever failed, the general path takes over (and raises what is real)
            self.cache.clear()
            if is_unique_violation(e):
                # some points are stored already (a replay): nothing was written, take the idempotent path
                return self.write_general(node, ticks, rollup)
            # a broken connection (a restarted server) or anything else: drop it, the general path
            # (pool with a liveness check) writes the tick or raises
            self.close()
            return None
        self.steady_written(nid, t_max, move, per)
        return n

    def row_literal(self, node_id: int, points: Mapping[int, float]) -> str:
        """The node's sample row for these points as a float8[] literal: one element per slot,
        NULL where the tick has no value.  repr() of a float round-trips exactly, and joining
        strings costs a fraction of dumping 200 Python numbers one by one."""
        slots = self.cache.slots
        arr = ["NULL"] * self.cache.nslots[node_id]
        for sid, v in points.items():
            arr[slots[sid]] = repr(v)
        return "{" + ",".join(arr) + "}"

    def insert_samples(self, conn: Connection, node_id: int, rows: list[Point], fast: bool = False) -> int:
        if not rows:
            return 0
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur: Any = raw.cursor()
        try:
            by_ts = points_by_ts(rows)
            if fast:
                # the common case: nothing of this batch is stored yet, COPY straight into the table
                with cur.copy("COPY sample_rows (node_id, ts, vals) FROM STDIN") as cp:
                    for ts in sorted(by_ts):
                        cp.write_row((node_id, ts, self.row_literal(node_id, by_ts[ts])))
                return len(rows)
            return self._merge(cur, node_id, by_ts)
        finally:
            cur.close()

    def _merge(self, cur: Any, node_id: int, by_ts: dict[float, dict[int, float]]) -> int:
        """A replay (spool drain, re-import): merge into the rows stored already.  The count of new
        points comes from the rows as read here; the upsert merges element by element again in
        SQL, so a row another writer inserted or filled in the meantime keeps its points too."""
        cur.execute("SELECT ts, vals FROM sample_rows WHERE node_id = %s AND ts = ANY(%s::float8[]) FOR UPDATE",
                    (node_id, "{" + ",".join(map(repr, by_ts)) + "}"))
        stored = {float(ts): list(vals) for ts, vals in cur.fetchall()}
        slots = self.cache.slots
        new = 0
        upserts: list[tuple[int, float, str]] = []
        for ts, points in by_ts.items():
            arr = stored.get(ts, [])
            fresh = False
            for sid, v in points.items():
                k = slots[sid]
                if k < len(arr) and arr[k] is not None:
                    continue
                arr.extend([None] * (k + 1 - len(arr)))
                arr[k] = v
                new += 1
                fresh = True
            if fresh:
                upserts.append((node_id, ts, "{" + ",".join(["NULL" if v is None else repr(float(v)) for v in arr]) + "}"))
        if upserts:
            upserts.sort()   # rows locked in one order by every writer: no deadlock between two replays
            cur.executemany(MERGE_ROW, upserts)
        return new

    def connection(self) -> Any:
        """The writer's own autocommit connection (opened on first use)."""
        if self.direct is None:
            import psycopg

            # the connect arguments SQLAlchemy's dialect gives psycopg for the pool's connections:
            # a multi-host URL (``?host=h1:p1&host=h2:p2&target_session_attrs=read-write``) reaches
            # the same server, the leader, as they do
            _args, kw = self.engine.dialect.create_connect_args(self.engine.url)
            kw.update(autocommit=True, connect_timeout=5, options=with_url_options(PG_OPTIONS, kw),
                      **pg_connect_defaults(kw))
            self.direct = psycopg.connect(**kw)
        return self.direct

    def close(self) -> None:
        conn, self.direct = self.direct, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
