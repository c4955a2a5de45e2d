"""The SQL that differs between SQLite (a node's own store) and PostgreSQL (the fleet store),
for the rollups and the reads: one class per dialect, everything else is the same SQL.

Raw points are ``samples (series_id, ts, value)`` on both: a table on SQLite, a view over the
node rows of ``sample_rows`` on PostgreSQL (store/models.py).  The tick writers are separate
(``store/write_sqlite.py``, ``store/write_pg.py``), as are the newest-point reads
(``store/newest.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

# a rollup row computed again (a late sample, an in-memory minute after a SQL one) replaces the old
ROLLUP_UPSERT = ("ON CONFLICT (series_id, bucket) DO UPDATE SET min = excluded.min, max = excluded.max, "
                 "sum = excluded.sum, count = excluded.count, last = excluded.last, last_ts = excluded.last_ts, "
                 "increase = excluded.increase")
ROLLUP_COLUMNS = "(series_id, bucket, min, max, sum, count, last, last_ts, increase)"
# (series id, bucket, [min, max, sum, count, last, last_ts, increase]): one rollup row
RollupRow = tuple[int, float, list[float]]


class SqlDialect:
    """What the rollups and the reads need to say differently per dialect."""

    name = ""
    raw_table = ""              # the table raw points are stored in (retention deletes from it)
    node_first_ts_sql = ""      # the oldest raw timestamp of node :n
    time_bounds_all_sql = ""    # (min, max) raw timestamp over every node
    time_bounds_node_sql = ""   # the same for the node named :node

    def floor(self, expr: str, width: str) -> str:
        """SQL: ``expr`` rounded down to a multiple of ``width``."""
        raise NotImplementedError

    def last_of(self, value: str, ts: str) -> str:
        """SQL aggregate: ``value`` of the row with the greatest ``ts``."""
        raise NotImplementedError

    def bucket_extremes(self, conn: Connection, sub: str, params: dict[str, Any]) -> Sequence[Any]:
        """(bucket, min value, its ts, max value, its ts) per bucket ``b`` of the rows of ``sub``
        (``ts``, ``value``, ``b``)."""
        raise NotImplementedError

    def upsert_rollup(self, conn: Connection, table: str, rows: Sequence[RollupRow]) -> None:
        """Insert or replace rollup rows in ``table``, in one statement (a row already there is
        replaced)."""
        raise NotImplementedError


class SqliteSql(SqlDialect):
    name = "sqlite"
    raw_table = "samples"
    node_first_ts_sql = "SELECT min(ts) FROM samples WHERE series_id IN (SELECT id FROM series WHERE node_id = :n)"
    time_bounds_all_sql = "SELECT min(s.ts), max(s.ts) FROM samples s"
    time_bounds_node_sql = ("SELECT min(s.ts), max(s.ts) FROM samples s JOIN series se ON se.id = s.series_id "
                            "JOIN nodes n ON n.id = se.node_id WHERE n.name = :node")

    def floor(self, expr: str, width: str) -> str:
        return f"(CAST({expr} / {width} AS INTEGER) * {width})"

    def last_of(self, value: str, ts: str) -> str:
        # the value of the row with the greatest ts, without relying on a bare column beside max()
        return f"CAST(substr(max(printf('%020.6f', {ts}) || '|' || {value}), 22) AS REAL)"

    def bucket_extremes(self, conn: Connection, sub: str, params: dict[str, Any]) -> Sequence[Any]:
        # SQLite documents that a bare column beside a single min()/max() comes from that row
        lows = conn.execute(text(f"SELECT b, min(value), ts FROM ({sub}) y GROUP BY b"), params).all()
        highs = {r[0]: r for r in conn.execute(text(f"SELECT b, max(value), ts FROM ({sub}) y GROUP BY b"), params)}
        return [(b, vmin, tmin, highs[b][1], highs[b][2]) for b, vmin, tmin in lows]

    def upsert_rollup(self, conn: Connection, table: str, rows: Sequence[RollupRow]) -> None:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            cur.executemany(f"INSERT INTO {table} {ROLLUP_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) {ROLLUP_UPSERT}",
                            [(sid, b, r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6]) for sid, b, r in rows])
        finally:
            cur.close()


class PostgresSql(SqlDialect):
    name = "postgresql"
    raw_table = "sample_rows"
    node_first_ts_sql = "SELECT min(ts) FROM sample_rows WHERE node_id = :n"
    time_bounds_all_sql = "SELECT min(r.ts), max(r.ts) FROM sample_rows r"
    time_bounds_node_sql = ("SELECT min(r.ts), max(r.ts) FROM sample_rows r JOIN nodes n ON n.id = r.node_id "
                            "WHERE n.name = :node")

    def floor(self, expr: str, width: str) -> str:
        return f"(floor({expr} / {width}) * {width})"

    def last_of(self, value: str, ts: str) -> str:
        return f"(array_agg({value} ORDER BY {ts} DESC))[1]"

    def bucket_extremes(self, conn: Connection, sub: str, params: dict[str, Any]) -> Sequence[Any]:
        return conn.execute(text(
            f"SELECT b, min(value), (array_agg(ts ORDER BY value ASC, ts))[1], "
            f"max(value), (array_agg(ts ORDER BY value DESC, ts))[1] FROM ({sub}) y GROUP BY b"), params).all()

    def upsert_rollup(self, conn: Connection, table: str, rows: Sequence[RollupRow]) -> None:
        # one statement: each column as one array literal, unnested server-side
        cols = list(zip(*[(sid, b, r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6]) for sid, b, r in rows], strict=True))
        arrays = ["{" + ",".join(map(repr, c)) + "}" for c in cols]
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            cur.execute(f"INSERT INTO {table} {ROLLUP_COLUMNS} "
                        "SELECT * FROM unnest(%s::integer[], %s::float8[], %s::float8[], %s::float8[], %s::float8[], "
                        f"%s::integer[], %s::float8[], %s::float8[], %s::float8[]) {ROLLUP_UPSERT}", arrays)
        finally:
            cur.close()


def sql_for(dialect: str) -> SqlDialect:
    """The dialect's SQL (``sqlite`` or ``postgresql``, as ``engine.dialect.name``)."""
    if dialect == "sqlite":
        return SqliteSql()
    if dialect == "postgresql":
        return PostgresSql()
    raise ValueError(f"unsupported database dialect {dialect!r} (sqlite and postgresql are)")
