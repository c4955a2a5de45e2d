"""Rollups: 1-minute and hourly min, max, sum, count, last and counter increase per series.

A node's closed 1-minute buckets are rolled by its writes (``Rollups.rollup_node``, called in
the write's transaction): from the writer's in-memory accumulator where it saw the whole minute
(``store/minute_acc.py``), otherwise from the raw samples in SQL.  The hourly tier is built from
the 1-minute rows and follows the 1-minute watermark.  ``rollup_watermarks`` says per node and
tier how far the rollups are complete; the reads serve anything after it from the finer tier.

A 1-minute bucket is rolled ``rollup_delay(node)`` = 1..``ROLLUP_SPREAD_S`` seconds after it
ends (CRC-32 of the node name), so a fleet whose agents tick in the same second does not roll
in the same second (docs/scaling.md).
"""

from __future__ import annotations

import math
import time
import zlib

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from triscope.store.cache import WriteCache
from triscope.store.dialects import ROLLUP_COLUMNS, ROLLUP_UPSERT, SqlDialect

ROLLUP_SPREAD_S = 45
TIERS = (("raw", 0.0), ("1m", 60.0), ("1h", 3600.0))


def rollup_delay(node: str) -> float:
    """Seconds after a 1-minute bucket closes at which ``node``'s writes roll it up: 1 to
    ``ROLLUP_SPREAD_S``, stable per node name (CRC-32), so a fleet's rollups spread over the minute."""
    return float(1 + zlib.crc32(node.encode()) % ROLLUP_SPREAD_S)


class Rollups:
    """Rolls a node's closed buckets up, keeping its watermarks in the writer's cache."""

    def __init__(self, sql: SqlDialect, cache: WriteCache) -> None:
        self.sql = sql
        self.cache = cache

    # ------------------------------------------------------------------ watermarks
    def watermark(self, conn: Connection, node_id: int, tier: str) -> float | None:
        """How far ``tier`` is rolled for the node (cached; read once per node and tier)."""
        got = self.cache.watermarks.get((node_id, tier))
        if got is not None:
            return got
        row = conn.execute(text("SELECT rolled_until FROM rollup_watermarks WHERE node_id = :n AND tier = :t"),
                           {"n": node_id, "t": tier}).first()
        if row is None:
            return None
        self.cache.watermarks[(node_id, tier)] = float(row[0])
        return float(row[0])

    def set_watermark(self, conn: Connection, node_id: int, tier: str, until: float) -> None:
        conn.execute(text("INSERT INTO rollup_watermarks (node_id, tier, rolled_until) VALUES (:n, :t, :u) "
                          "ON CONFLICT (node_id, tier) DO UPDATE SET rolled_until = excluded.rolled_until"),
                     {"n": node_id, "t": tier, "u": until})
        self.cache.watermarks[(node_id, tier)] = until

    # ------------------------------------------------------------------ rolling
    def rollup_node(self, conn: Connection, node_id: int, t_min: float, t_max: float, delay: float = 0.0) -> None:
        """Roll closed buckets of this node up; re-roll buckets that late (spooled) samples touched.

        ``delay``: a 1-minute bucket is rolled by the first write whose newest tick is at least
        ``delay`` seconds past the bucket's end (the hourly tier follows the 1-minute watermark),
        so a fleet whose agents tick in the same second does not roll up in the same second.
        Until then the reads serve the bucket from raw samples (the watermark says how far the
        rollups are complete)."""
        for tier, width, source in (("1m", 60.0, "samples"), ("1h", 3600.0, "rollup_1m")):
            wm = self.watermark(conn, node_id, tier)
            # buckets before this are closed (and, for 1m, at least `delay` seconds old)
            closed_until = math.floor((t_max - (delay if tier == "1m" else 0.0)) / width) * width
            if tier == "1h":
                # hourly is built from 1-minute rollups, which are complete up to their own watermark
                wm1 = self.watermark(conn, node_id, "1m") or 0.0
                closed_until = min(closed_until, math.floor(wm1 / width) * width)
            if wm is None:
                first = conn.execute(text(self.sql.node_first_ts_sql), {"n": node_id}).scalar()
                if first is None:
                    continue
                wm = math.floor(float(first) / width) * width
                self.set_watermark(conn, node_id, tier, wm)
            if t_min < wm:  # late (spooled) data below the watermark: re-roll the buckets it touched
                lo = math.floor(t_min / width) * width
                hi = min(wm, math.floor(t_max / width) * width + width)
                if hi > lo:
                    self.roll(conn, node_id, tier, width, source, lo, hi)
            if closed_until > wm:
                if tier == "1m":
                    self.roll_1m(conn, node_id, wm, closed_until)
                else:
                    self.roll(conn, node_id, tier, width, source, wm, closed_until)
                self.set_watermark(conn, node_id, tier, closed_until)

    def roll_1m(self, conn: Connection, node_id: int, lo: float, hi: float) -> None:
        """Roll the 1-minute buckets in [lo, hi): from the accumulator where it vouches for them,
        from the raw samples in SQL before that."""
        acc = self.cache.acc.get(node_id)
        if acc is None:
            self.roll(conn, node_id, "1m", 60.0, "samples", lo, hi)
            return
        start, rows = acc.take(lo, hi)
        if start > lo:
            self.roll(conn, node_id, "1m", 60.0, "samples", lo, start)
        if rows:
            self.sql.upsert_rollup(conn, "rollup_1m", rows)

    def roll(self, conn: Connection, node_id: int, tier: str, width: float, source: str, lo: float, hi: float) -> None:
        """Roll the node's buckets of ``tier`` in [lo, hi) in SQL, from ``source`` (raw
        ``samples`` or ``rollup_1m``)."""
        table = f"rollup_{tier}"
        sql = self.sql
        params = {"n": node_id, "lo": lo, "hi": hi, "w": width}
        if source == "samples":
            # window over [lo - width, hi) so the first sample of the range has its predecessor
            stmt = f"""
            INSERT INTO {table} {ROLLUP_COLUMNS}
            SELECT series_id, bucket, min(value), max(value), sum(value), count(*),
                   {sql.last_of('value', 'ts')}, max(ts),
                   sum(CASE WHEN kind = 'counter' AND prev IS NOT NULL
                            THEN CASE WHEN value >= prev THEN value - prev ELSE value END ELSE 0 END)
            FROM (
                SELECT s.series_id, s.ts, s.value, se.kind,
                       {sql.floor('s.ts', ':w')} AS bucket,
                       lag(s.value) OVER (PARTITION BY s.series_id ORDER BY s.ts) AS prev
                FROM samples s JOIN series se ON se.id = s.series_id
                WHERE se.node_id = :n AND s.ts >= :lo - :w AND s.ts < :hi
            ) w
            WHERE w.ts >= :lo
            GROUP BY series_id, bucket
            {ROLLUP_UPSERT}"""
        else:
            stmt = f"""
            INSERT INTO {table} {ROLLUP_COLUMNS}
            SELECT r.series_id, {sql.floor('r.bucket', ':w')} AS b, min(r.min), max(r.max), sum(r.sum),
                   sum(r.count), {sql.last_of('r.last', 'r.last_ts')}, max(r.last_ts), sum(r.increase)
            FROM rollup_1m r JOIN series se ON se.id = r.series_id
            WHERE se.node_id = :n AND r.bucket >= :lo AND r.bucket < :hi
            GROUP BY r.series_id, b
            {ROLLUP_UPSERT}"""
        conn.execute(text(stmt), params)

    def rollup_all(self, engine: Engine, now: float | None = None) -> None:
        """Roll every node up to ``now`` (after imports, and by the retention job)."""
        now = time.time() if now is None else now
        with self.cache.begin(engine) as conn:
            for (nid,) in conn.execute(text("SELECT id FROM nodes")).all():
                self.rollup_node(conn, int(nid), now, now)
