"""The store: one database, written through a dialect's tick writer and read through
``StoreReader`` (store/reader.py).

Writes: ``write_ticks(node, ticks)`` inserts each tick's samples in one transaction (idempotent
per (series, ts): a replayed spool never doubles a point; on PostgreSQL one row per node and tick
in ``sample_rows``, on SQLite one row per sample, see store/models.py) and rolls closed buckets
up into ``rollup_1m`` and ``rollup_1h``.  Where the parts live:

* ``store/write.py``: the general write path (ids, events, labels); ``store/write_sqlite.py`` and
  ``store/write_pg.py``: each dialect's samples and its steady-state one-statement tick;
* ``store/cache.py``: everything the writer remembers between transactions, cleared as one when a
  transaction fails;
* ``store/rollups.py``, ``store/retention.py``, ``store/partitions.py``;
* ``store/reads.py`` (``store/newest.py``, ``store/dialects.py``): the reads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from triscope.core.samples import EventRecord, Tick
from triscope.store.cache import WriteCache
from triscope.store.db import StoreError, check_reachable, make_engine, normalise_url
from triscope.store.reader import EventRow, LatestValue, NodeInfo, SeriesData, SeriesInfo, StoreReader
from triscope.store.reads import StoreReads, minmax_downsample
from triscope.store.retention import RetentionPolicy, apply_retention
from triscope.store.rollups import ROLLUP_SPREAD_S, TIERS, Rollups, rollup_delay
from triscope.store.verdicts import VerdictRecorder, VerdictRun
from triscope.store.write import (
    LAST_SEEN_STEP_S,
    MAX_EVENT_DETAILS,
    MAX_EVENT_KIND,
    MAX_EVENT_MESSAGE,
    TickWriter,
)
from triscope.store.write_pg import PgWriter
from triscope.store.write_sqlite import SqliteWriter


class Store(StoreReads):
    """One database.  Thread-safe for one writer and many readers."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._lock = threading.RLock()
        self.cache = WriteCache()
        self.rollups = Rollups(self.sql, self.cache)
        writer = PgWriter if self.dialect == "postgresql" else SqliteWriter
        self.writer: TickWriter = writer(engine, self.cache, self.rollups)
        self.verdicts = VerdictRecorder()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, url: str | None = None, *, check: bool = True, statement_timeout_s: float | None = None) -> Store:
        """``statement_timeout_s``: a bound on every statement (PostgreSQL), for readers only."""
        engine = make_engine(url, statement_timeout_s=statement_timeout_s)
        if check:
            check_reachable(engine)
        return cls(engine)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    def upgrade(self) -> None:
        from triscope.store.db import upgrade

        upgrade(self.url)

    def is_migrated(self) -> bool:
        from sqlalchemy import inspect

        return inspect(self.engine).has_table("samples")

    def require_schema(self) -> None:
        if not self.is_migrated():
            raise StoreError(f"database {self.engine.url.render_as_string(hide_password=True)} has no triscope "
                             "schema: run 'triscope db upgrade --db URL'")

    def close(self) -> None:
        with self._lock:
            self.writer.close()
        self.engine.dispose()

    # ------------------------------------------------------------------ writes
    def write_ticks(self, node: str, ticks: Sequence[Tick], *, rollup: bool = True) -> int:
        """Write ticks for one node in one transaction.  Returns the number of samples written."""
        if not ticks:
            return 0
        with self._lock:
            try:
                n = self.writer.write_ticks(node, ticks, rollup)
            except BaseException:
                self.cache.clear()   # a failed transaction cleared it already; anything else too
                raise
            self._record_verdicts(node, ticks)
            return n

    def _record_verdicts(self, node: str, ticks: Sequence[Tick]) -> None:
        """The verdict history (store/verdicts.py) from the ticks just written: its own transaction,
        after theirs (a failure raises like a failed write, and the re-sent ticks change nothing
        already recorded)."""
        points = self.verdicts.points(ticks)
        if not points:
            return
        try:
            with self.engine.begin() as conn:
                nid = self.cache.node_ids.get(node)
                if nid is None:
                    row = conn.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).first()
                    if row is None:
                        return
                    nid = int(row[0])
                self.verdicts.record(conn, nid, points)
        except BaseException:
            self.verdicts.reset()
            raise

    def add_events(self, node: str, events: Sequence[EventRecord], ts: float | None = None) -> None:
        with self._lock:
            self.writer.add_events(node, events, ts)

    def set_node_labels(self, node: str, labels: Mapping[str, Any]) -> None:
        with self._lock:
            self.writer.set_node_labels(node, labels)

    @property
    def truncated_label_values(self) -> int:
        """Label values (and names) cut to their limit so far (triscope/core/names.py)."""
        return self.writer.truncated_label_values

    @property
    def dropped_samples(self) -> int:
        """Samples dropped so far because their metric name is longer than the column."""
        return self.writer.dropped_samples

    # ------------------------------------------------------------------ rollups and retention
    def rollup_all(self) -> None:
        """Roll every node up to now (used after imports and by the retention job)."""
        with self._lock:
            self.rollups.rollup_all(self.engine)

    def apply_retention(self, policy: RetentionPolicy | None = None, now: float | None = None) -> dict[str, int]:
        """Remove data older than the policy allows (store/retention.py)."""
        return apply_retention(self.engine, self.sql, policy, now, write_lock=self._lock)


def _reads_as_store_reader(store: Store) -> StoreReader:
    return store   # the type checker holds Store to the StoreReader protocol here


__all__ = ["LAST_SEEN_STEP_S", "MAX_EVENT_DETAILS", "MAX_EVENT_KIND", "MAX_EVENT_MESSAGE", "ROLLUP_SPREAD_S", "TIERS",
           "EventRow", "LatestValue", "NodeInfo", "RetentionPolicy", "SeriesData", "SeriesInfo", "Store", "StoreError",
           "StoreReader", "VerdictRun", "minmax_downsample", "normalise_url", "rollup_delay"]
