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

What this revision needs of the partition helpers is copied into it, as it was at this revision
(store/partitions.py may change).
"""
from __future__ import annotations

import time
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

AHEAD_DAYS = 3
VIEW = ("CREATE VIEW samples AS SELECT se.id AS series_id, r.ts, r.vals[se.slot + 1] AS value "
        "FROM sample_rows r JOIN series se ON se.node_id = r.node_id WHERE r.vals[se.slot + 1] IS NOT NULL")


# --- what this revision used of store/partitions.py, frozen here: a revision is a record, and
# --- editing the live module must never change what an old revision does
DAY = 86400.0
LOCK_TIMEOUT = "5s"
# a node row stays in its heap page, uncompressed, up to 8,160 bytes (~1,000 slots) (a table option:
# set on each partition)
STORAGE = {"sample_rows": " WITH (toast_tuple_target = 8160)"}


def _default_name(table: str) -> str:
    return f"{table}_default"


def _partition_name(day_start: float, table: str) -> str:
    return f"{table}_p" + datetime.fromtimestamp(day_start, UTC).strftime("%Y%m%d")


def _day_start(ts: float) -> float:
    d = datetime.fromtimestamp(ts, UTC)
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def _create_day_partition(conn: sa.Connection, start: float, table: str) -> str | None:
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
    conn.execute(text(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({start!r}) TO ({end!r})"
                      f"{STORAGE.get(table, '')}"))
    if stray:
        conn.execute(text(f"INSERT INTO {name} SELECT * FROM {default} WHERE ts >= :lo AND ts < :hi"),
                     {"lo": start, "hi": end})
        conn.execute(text(f"DELETE FROM {default} WHERE ts >= :lo AND ts < :hi"), {"lo": start, "hi": end})
        conn.execute(text(f"ALTER TABLE {table} ATTACH PARTITION {default} DEFAULT"))
    return name
# --- end of the frozen copy


def _day_partitions(conn: sa.Connection, table: str, lo: float | None, hi: float | None) -> None:
    now = time.time()
    day = _day_start(min(lo, now) if lo is not None else now)
    last = _day_start(max(hi, now) if hi is not None else now) + AHEAD_DAYS * DAY
    while day <= last:
        _create_day_partition(conn, day, table)
        day += DAY


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
    conn.execute(text(f"CREATE TABLE {_default_name('sample_rows')} PARTITION OF sample_rows DEFAULT"
                      f"{STORAGE['sample_rows']}"))
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
        conn.execute(text(f"CREATE TABLE {_default_name('samples')} PARTITION OF samples DEFAULT"))
        lo, hi = conn.execute(text("SELECT min(ts), max(ts) FROM sample_rows")).one()
        _day_partitions(conn, "samples", lo, hi)
        conn.execute(text(
            "INSERT INTO samples (series_id, ts, value) SELECT se.id, r.ts, r.vals[se.slot + 1] "
            "FROM sample_rows r JOIN series se ON se.node_id = r.node_id WHERE r.vals[se.slot + 1] IS NOT NULL"))
        conn.execute(text("DROP TABLE sample_rows"))
    with op.batch_alter_table("series") as b:
        b.drop_constraint("uq_series_slot", type_="unique")
        b.drop_column("slot")
