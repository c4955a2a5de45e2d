"""The SQLite back-end of the write path (a node's own store): one row per sample in
``samples (series_id, ts, value)``, ``INSERT OR IGNORE`` so a replayed point keeps the value
stored first.

The steady-state tick (no bucket to roll) goes in one transaction on the store's own ``sqlite3``
connection, without SQLAlchemy: an agent writes one tick a second and that must cost next to
nothing.  Its events go in the same transaction; series it brings that are not cached yet are
created first, in a short transaction of their own.  Everything else (a node's first write, a
bucket to roll, a replay) takes the general path (``TickWriter.write_general``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from triscope.core.samples import Tick
from triscope.store.cache import Point
from triscope.store.db import sqlite_on_connect
from triscope.store.write import TickWriter, event_rows, sorted_rows

INSERT_OR_IGNORE = "INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)"
INSERT_EVENT = "INSERT INTO events (node_id, ts, kind, severity, message, details) VALUES (?, ?, ?, ?, ?, ?)"
WRITER_CACHE_KIB = 512     # the steady-state writer's own page cache (SQLite's default: 2,000 KiB)


class SqliteWriter(TickWriter):
    direct: sqlite3.Connection | None = None   # the steady state's own connection (file databases only)
    # a state change or a collector's note in a batch, or a series appearing (a new waker, a new
    # connection), is common on a busy node: the steady state takes both (the general path's
    # SQLAlchemy transaction cost about twice as much a sample on the GPU machine's recordings)
    steady_events = True
    steady_new_series = True

    def write_ticks(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int:
        n = self.write_steady(node, ticks, rollup)
        return n if n is not None else self.write_general(node, ticks, rollup)

    def insert_samples(self, conn: Connection, node_id: int, rows: list[Point], fast: bool = False) -> int:
        if not rows:
            return 0
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            cur.executemany(INSERT_OR_IGNORE, rows)
            return int(cur.rowcount)
        finally:
            cur.close()

    def write_steady(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int | None:
        """The steady-state tick in one transaction on the writer's own connection; None when the
        write needs the general path (which then writes it)."""
        got = self.steady_points(node, ticks, rollup)
        if got is None:
            return None
        nid, t_max, per = got
        rows, n = sorted_rows(per)
        move = self.moves_last_seen(nid, t_max)
        con = self.connection()
        if con is None:
            return None
        con.execute("BEGIN IMMEDIATE")
        try:
            cur = con.executemany(INSERT_OR_IGNORE, rows)
            new = cur.rowcount
            events = [(t.ts, e) for t in ticks for e in t.events]
            if events:
                con.executemany(INSERT_EVENT, event_rows(nid, events))
            if move:
                con.execute("UPDATE nodes SET last_seen = ? WHERE id = ? AND last_seen < ?", (t_max, nid, t_max))
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                con.execute("ROLLBACK")
            self.cache.clear()
            with contextlib.suppress(Exception):
                self.drop_created()
            raise
        self.created_for_steady = []
        if new == n:
            self.steady_written(nid, t_max, move, per)
        else:   # some points were stored already (a replay)
            if move:
                self.cache.last_seen[nid] = t_max
            self.cache.drop_acc(nid, t_max)
        return n

    def connection(self) -> sqlite3.Connection | None:
        """The writer's own connection to the database file (None for in-memory databases)."""
        if self.direct is None:
            path = self.engine.url.database
            if not path or path == ":memory:" or path.startswith("file:"):
                return None
            con = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
            sqlite_on_connect(con, None)
            # an append-mostly writer touches one page per series a tick: SQLite's default 2 MB page
            # cache only fills with pages it will not read again (the agent's RSS kept growing by it
            # for minutes); 512 KiB holds the index's upper levels
            con.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            self.direct = con
        return self.direct

    def close(self) -> None:
        con, self.direct = self.direct, None
        if con is not None:
            with contextlib.suppress(Exception):
                con.close()
