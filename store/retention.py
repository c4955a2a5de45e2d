"""Retention: how long each tier is kept, and the job that removes what is older.

Raw points are kept ``raw`` seconds, 1-minute rollups ``rollup_1m``, hourly rollups and events
``rollup_1h``.  On a partitioned PostgreSQL, raw rows expire by dropping whole day partitions of
``sample_rows`` (never a bulk ``DELETE``: no dead tuples, no vacuum debt) and the partitions of
the next days are created ahead (store/partitions.py); raw data is then kept up to one day
longer than configured, never shorter.  Elsewhere each table is a ``DELETE`` of the rows older
than its cut.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from triscope.store import partitions
from triscope.store.dialects import SqlDialect
from triscope.store.ha import is_standby

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long each tier is kept (seconds).  Defaults: raw 7 d, 1-minute 90 d, hourly 2 years."""

    raw: float = 7 * 86400
    rollup_1m: float = 90 * 86400
    rollup_1h: float = 730 * 86400


def apply_retention(engine: Engine, sql: SqlDialect, policy: RetentionPolicy | None = None,
                    now: float | None = None, *,
                    write_lock: AbstractContextManager[Any] | None = None) -> dict[str, int]:
    """Remove data older than the policy allows.  Returns rows (or partitions) removed per table:
    ``samples`` counts raw rows deleted on both dialects (on PostgreSQL those are node-tick rows),
    ``samples_partitions_dropped`` the day partitions dropped.  ``write_lock`` is held around the
    deletes (not around the partition DDL, which waits at most its own lock timeout).

    Upkeep runs on the leader only: on a hot standby (a client that reached a replica) it does
    nothing, says so in the log, and returns ``{"skipped_standby": 1}``."""
    policy = policy or RetentionPolicy()
    now = now if now is not None else time.time()
    out: dict[str, int] = {}
    with engine.connect() as conn:
        if is_standby(conn):
            log.info("retention and partition upkeep skipped: %s is a standby (it runs on the leader)",
                     engine.url.render_as_string(hide_password=True))
            return {"skipped_standby": 1}
        partitioned = partitions.is_partitioned(conn)   # False on SQLite
    tables = [("rollup_1m", policy.rollup_1m, "bucket"), ("rollup_1h", policy.rollup_1h, "bucket"),
              ("events", policy.rollup_1h, "ts"), ("verdict_runs", policy.rollup_1h, "end_ts")]
    if partitioned:
        partitions.ensure_partitions(engine, now)
        out["samples_partitions_dropped"] = len(partitions.drop_expired_partitions(engine, now - policy.raw))
        with engine.begin() as conn:  # rows that sat in the default partition
            res = conn.execute(text(f"DELETE FROM {partitions.DEFAULT} WHERE ts < :cut"), {"cut": now - policy.raw})
            out["samples"] = int(res.rowcount or 0)
    else:
        tables.insert(0, (sql.raw_table, policy.raw, "ts"))
    with write_lock or nullcontext(), engine.begin() as conn:
        for table, keep, col in tables:
            res = conn.execute(text(f"DELETE FROM {table} WHERE {col} < :cut"), {"cut": now - keep})
            out["samples" if table == sql.raw_table else table] = int(res.rowcount or 0)
    return out
