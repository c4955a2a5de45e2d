"""PostgreSQL: samples partitioned by day (range on ts); no-op on SQLite

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 18:50:00

On PostgreSQL the plain ``samples`` table becomes a table partitioned by range on ``ts`` with one
partition per UTC day (``samples_pYYYYMMDD``) and a default partition; existing rows are copied
into day partitions created for them, and today's partition plus three days ahead are created.
The logical schema (columns, primary key (series_id, ts)) is unchanged.  Upkeep afterwards: store.partitions.ensure_partitions /
drop_expired_partitions (hourly, from the retention job).
"""
from __future__ import annotations

import time

from alembic import op
from sqlalchemy import text

from triscope.store import partitions

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

AHEAD_DAYS = 3
TABLE = "samples"   # revision 0004 replaces it with sample_rows (one row per node and tick)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or partitions.is_partitioned(conn, TABLE):
        return
    conn.execute(text("ALTER TABLE samples RENAME TO samples_unpartitioned"))
    conn.execute(text("ALTER TABLE samples_unpartitioned RENAME CONSTRAINT samples_pkey TO samples_unpartitioned_pkey"))
    conn.execute(text(
        "CREATE TABLE samples (series_id integer NOT NULL, ts double precision NOT NULL, "
        "value double precision NOT NULL, CONSTRAINT samples_pkey PRIMARY KEY (series_id, ts)) "
        "PARTITION BY RANGE (ts)"))
    conn.execute(text(f"CREATE TABLE {partitions.default_name(TABLE)} PARTITION OF samples DEFAULT"))
    lo, hi = conn.execute(text("SELECT min(ts), max(ts) FROM samples_unpartitioned")).one()
    now = time.time()
    first = partitions.day_start(min(lo, now) if lo is not None else now)
    last = partitions.day_start(max(hi, now) if hi is not None else now) + AHEAD_DAYS * partitions.DAY
    day = first
    while day <= last:
        partitions.create_day_partition(conn, day, table=TABLE)
        day += partitions.DAY
    conn.execute(text("INSERT INTO samples (series_id, ts, value) "
                      "SELECT series_id, ts, value FROM samples_unpartitioned"))
    conn.execute(text("DROP TABLE samples_unpartitioned"))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or not partitions.is_partitioned(conn, TABLE):
        return
    conn.execute(text("ALTER TABLE samples RENAME TO samples_partitioned"))
    conn.execute(text("ALTER TABLE samples_partitioned RENAME CONSTRAINT samples_pkey TO samples_partitioned_pkey"))
    conn.execute(text(
        "CREATE TABLE samples (series_id integer NOT NULL, ts double precision NOT NULL, "
        "value double precision NOT NULL, CONSTRAINT samples_pkey PRIMARY KEY (series_id, ts))"))
    conn.execute(text("INSERT INTO samples SELECT series_id, ts, value FROM samples_partitioned"))
    conn.execute(text("DROP TABLE samples_partitioned"))  # drops every partition with it
