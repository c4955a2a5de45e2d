"""PostgreSQL: samples partitioned by day (range on ts); no-op on SQLite

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 18:50:00

On PostgreSQL the plain ``samples`` table becomes a table partitioned by range on ``ts`` with one
partition per UTC day (``samples_pYYYYMMDD``) and a default partition; existing rows are copied
into day partitions created for them, and today's partition plus three days ahead are created.
The logical schema (columns, primary key (series_id, ts)) is unchanged.  Upkeep afterwards: store.partitions.ensure_partitions /
drop_expired_partitions (hourly, from the retention job).  What this revision needs of the
partition helpers is copied into it, as it was at this revision (store/partitions.py may change).
"""
from __future__ import annotations

import time
from datetime import UTC, datetime

from alembic import op
from sqlalchemy import text
from sqlalchemy.engine import Connection

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

AHEAD_DAYS = 3
TABLE = "samples"   # revision 0004 replaces it with sample_rows (one row per node and tick)


# --- what this revision used of store/partitions.py, frozen here: a revision is a record, and
# --- editing the live module must never change what an old revision does
DAY = 86400.0
LOCK_TIMEOUT = "5s"


def _default_name(table: str) -> str:
    return f"{table}_default"


def _partition_name(day_start: float, table: str) -> str:
    return f"{table}_p" + datetime.fromtimestamp(day_start, UTC).strftime("%Y%m%d")


def _day_start(ts: float) -> float:
    d = datetime.fromtimestamp(ts, UTC)
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def _is_partitioned(conn: Connection, table: str) -> bool:
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "WHERE c.relname = :t AND c.relnamespace = to_regnamespace(current_schema())::oid)"), {"t": table}).scalar())


def _create_day_partition(conn: Connection, start: float, table: str) -> str | None:
    """The partition of ``table`` for the UTC day starting at ``start`` (None if it exists); rows
    of that day sitting in the default partition are moved into it."""
    name = _partition_name(start, table)
    default = _default_name(table)
    if conn.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None:
        return None
    end = start + DAY
    conn.execute(text("SELECT set_config('lock_timeout', :t, true)"), {"t": LOCK_TIMEOUT})
    has_default = conn.execute(text("SELECT to_regclass(:n)"), {"n": default}).scalar() is not None
    stray = has_default and conn.execute(
        text(f"SELECT EXISTS (SELECT 1 FROM {default} WHERE ts >= :lo AND ts < :hi)"),
        {"lo": start, "hi": end}).scalar()
    if stray:
        conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {default}"))
    conn.execute(text(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({start!r}) TO ({end!r})"))
    if stray:
        conn.execute(text(f"INSERT INTO {name} SELECT * FROM {default} WHERE ts >= :lo AND ts < :hi"),
                     {"lo": start, "hi": end})
        conn.execute(text(f"DELETE FROM {default} WHERE ts >= :lo AND ts < :hi"), {"lo": start, "hi": end})
        conn.execute(text(f"ALTER TABLE {table} ATTACH PARTITION {default} DEFAULT"))
    return name
# --- end of the frozen copy


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or _is_partitioned(conn, TABLE):
        return
    conn.execute(text("ALTER TABLE samples RENAME TO samples_unpartitioned"))
    conn.execute(text("ALTER TABLE samples_unpartitioned RENAME CONSTRAINT samples_pkey TO samples_unpartitioned_pkey"))
    conn.execute(text(
        "CREATE TABLE samples (series_id integer NOT NULL, ts double precision NOT NULL, "
        "value double precision NOT NULL, CONSTRAINT samples_pkey PRIMARY KEY (series_id, ts)) "
        "PARTITION BY RANGE (ts)"))
    conn.execute(text(f"CREATE TABLE {_default_name(TABLE)} PARTITION OF samples DEFAULT"))
    lo, hi = conn.execute(text("SELECT min(ts), max(ts) FROM samples_unpartitioned")).one()
    now = time.time()
    first = _day_start(min(lo, now) if lo is not None else now)
    last = _day_start(max(hi, now) if hi is not None else now) + AHEAD_DAYS * DAY
    day = first
    while day <= last:
        _create_day_partition(conn, day, TABLE)
        day += DAY
    conn.execute(text("INSERT INTO samples (series_id, ts, value) "
                      "SELECT series_id, ts, value FROM samples_unpartitioned"))
    conn.execute(text("DROP TABLE samples_unpartitioned"))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or not _is_partitioned(conn, TABLE):
        return
    conn.execute(text("ALTER TABLE samples RENAME TO samples_partitioned"))
    conn.execute(text("ALTER TABLE samples_partitioned RENAME CONSTRAINT samples_pkey TO samples_partitioned_pkey"))
    conn.execute(text(
        "CREATE TABLE samples (series_id integer NOT NULL, ts double precision NOT NULL, "
        "value double precision NOT NULL, CONSTRAINT samples_pkey PRIMARY KEY (series_id, ts))"))
    conn.execute(text("INSERT INTO samples SELECT series_id, ts, value FROM samples_partitioned"))
    conn.execute(text("DROP TABLE samples_partitioned"))  # drops every partition with it
