"""Series slots; PostgreSQL keeps raw samples as one row per node and tick

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 00:10:00

Both dialects: ``series.slot``, the series' fixed position among its node's series (0-based, in
order of creation, unique per node).

PostgreSQL: the one-row-per-sample ``samples`` table becomes ``sample_rows`` (node_id, ts, vals
double precision[]), one row per node and tick with ``vals[slot + 1]`` the series' value,
partitioned by UTC day like revision 0003's table (``sample_rows_pYYYYMMDD`` and
``sample_rows_default``).  Existing samples are copied over.  ``samples`` becomes a view with the
old columns (series_id, ts, value), so reads keep their SQL.  Why: a fleet of 1,000 nodes x 200
series put 200,000 insertion points into the old primary key (series_id, ts), and the leaf pages
of all of them split in the same second every ~145 s (docs/scaling.md); the new key (node_id, ts)
has one insertion point per node.

SQLite (a node's local store) keeps its ``samples`` table.

Writers of the old schema cannot insert into the view: agents still running the previous version
spool their ticks (nothing is lost) until they run this version, which writes them back.  The
upgrade locks ``samples`` first, so no row committed during the copy is left behind.
"""
from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from triscope.store import partitions

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

AHEAD_DAYS = 3
VIEW = ("CREATE VIEW samples AS SELECT se.id AS series_id, r.ts, r.vals[se.slot + 1] AS value "
        "FROM sample_rows r JOIN series se ON se.node_id = r.node_id WHERE r.vals[se.slot + 1] IS NOT NULL")


def _day_partitions(conn: sa.Connection, table: str, lo: float | None, hi: float | None) -> None:
    now = time.time()
    day = partitions.day_start(min(lo, now) if lo is not None else now)
    last = partitions.day_start(max(hi, now) if hi is not None else now) + AHEAD_DAYS * partitions.DAY
    while day <= last:
        partitions.create_day_partition(conn, day, table=table)
        day += partitions.DAY


def upgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("series") as b:
        b.add_column(sa.Column("slot", sa.Integer(), nullable=True))
    conn.execute(text("UPDATE series SET slot = r.rn - 1 FROM (SELECT id, row_number() OVER "
                      "(PARTITION BY node_id ORDER BY id) AS rn FROM series) r WHERE r.id = series.id"))
    with op.batch_alter_table("series") as b:
        b.alter_column("slot", existing_type=sa.Integer(), nullable=False)
        b.create_unique_constraint("uq_series_slot", ["node_id", "slot"])
    if conn.dialect.name != "postgresql":
        return
    conn.execute(text("LOCK TABLE samples IN ACCESS EXCLUSIVE MODE"))
    conn.execute(text(
        "CREATE TABLE sample_rows (node_id integer NOT NULL, ts double precision NOT NULL, "
        "vals double precision[] NOT NULL, CONSTRAINT sample_rows_pkey PRIMARY KEY (node_id, ts)) "
        "PARTITION BY RANGE (ts)"))
    conn.execute(text(f"CREATE TABLE {partitions.default_name('sample_rows')} PARTITION OF sample_rows DEFAULT"
                      f"{partitions.STORAGE['sample_rows']}"))
    lo, hi = conn.execute(text("SELECT min(ts), max(ts) FROM samples")).one()
    _day_partitions(conn, "sample_rows", lo, hi)
    # each (node, tick): the slots and values it has, then an array with a NULL for every slot it lacks
    conn.execute(text(
        "INSERT INTO sample_rows (node_id, ts, vals) "
        "SELECT g.node_id, g.ts, ARRAY(SELECT m.v FROM generate_series(0, g.mx) i "
        "  LEFT JOIN unnest(g.sl, g.v) AS m(sl, v) ON m.sl = i ORDER BY i) "
        "FROM (SELECT se.node_id, s.ts, array_agg(se.slot) AS sl, array_agg(s.value) AS v, max(se.slot) AS mx "
        "      FROM samples s JOIN series se ON se.id = s.series_id GROUP BY se.node_id, s.ts) g"))
    conn.execute(text("DROP TABLE samples"))   # its partitions go with it
    conn.execute(text(VIEW))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE sample_rows IN ACCESS EXCLUSIVE MODE"))
        conn.execute(text("DROP VIEW samples"))
        conn.execute(text(
            "CREATE TABLE samples (series_id integer NOT NULL, ts double precision NOT NULL, "
            "value double precision NOT NULL, CONSTRAINT samples_pkey PRIMARY KEY (series_id, ts)) "
            "PARTITION BY RANGE (ts)"))
        conn.execute(text(f"CREATE TABLE {partitions.default_name('samples')} PARTITION OF samples DEFAULT"))
        lo, hi = conn.execute(text("SELECT min(ts), max(ts) FROM sample_rows")).one()
        _day_partitions(conn, "samples", lo, hi)
        conn.execute(text(
            "INSERT INTO samples (series_id, ts, value) SELECT se.id, r.ts, r.vals[se.slot + 1] "
            "FROM sample_rows r JOIN series se ON se.node_id = r.node_id WHERE r.vals[se.slot + 1] IS NOT NULL"))
        conn.execute(text("DROP TABLE sample_rows"))
    with op.batch_alter_table("series") as b:
        b.drop_constraint("uq_series_slot", type_="unique")
        b.drop_column("slot")
