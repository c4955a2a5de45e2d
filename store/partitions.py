"""Daily range partitions of the raw samples on PostgreSQL (the fleet store).

On PostgreSQL the raw samples live in ``sample_rows`` (revision 0004: one row per node and tick,
the tick's values in one array), partitioned by range on ``ts`` (float epoch seconds), one
partition per UTC day named ``sample_rows_pYYYYMMDD``, plus a ``sample_rows_default`` partition
that catches rows no daily partition covers, so a write never fails for lack of a partition.
Each partition carries the primary key (node_id, ts), the index in query order; a time-range
query touches only the days it spans (partition pruning).  Revision 0003 partitioned the older
one-row-per-sample ``samples`` table the same way; the functions take the parent table's name
for that migration (``table=``).

Upkeep, both idempotent and cheap (call them hourly, from the retention job):

* ``ensure_partitions(engine, now, ahead_days)`` creates today's partition and ``ahead_days``
  more, so midnight never lands rows in the default partition; rows that did land there (an
  agent with a skewed clock, an import of old data) are moved into the day partition created for
  them.
* ``drop_expired_partitions(engine, before_ts)`` drops every daily partition that ends at or
  before ``before_ts``: retention is ``DROP TABLE`` of whole days, never a bulk ``DELETE``.

On SQLite (and on a PostgreSQL table that is not partitioned) both are no-ops that return an
empty list.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

PARENT = "sample_rows"
DEFAULT = "sample_rows_default"
DAY = 86400.0
_NAME = re.compile(r"^(?:sample_rows|samples)_p(\d{8})$")
_BOUND = re.compile(r"FROM \('?(-?[\d.eE+]+)'?\) TO \('?(-?[\d.eE+]+)'?\)")
LOCK_TIMEOUT = "5s"   # DDL on the parent waits at most this long for ingest transactions
# a node row stays in its heap page, uncompressed, up to 8,160 bytes (~1,000 slots), instead of being
# compressed or moved to TOAST past ~2 KB (~250 slots): reading one slot of a TOASTed row would
# decompress the whole array, once per series read (a table option: set on each partition)
STORAGE = {"sample_rows": " WITH (toast_tuple_target = 8160)"}


def _lock_timed_out(e: DBAPIError) -> bool:
    return getattr(e.orig, "sqlstate", None) == "55P03"   # lock_not_available


def is_partition_name(name: str | None) -> bool:
    """True for the partition tables (Alembic's autogenerate / check must ignore them)."""
    return bool(name) and (name in (DEFAULT, "samples_default") or bool(_NAME.match(str(name))))


def default_name(table: str = PARENT) -> str:
    return f"{table}_default"


def partition_name(day_start: float, table: str = PARENT) -> str:
    return f"{table}_p" + datetime.fromtimestamp(day_start, UTC).strftime("%Y%m%d")


def day_start(ts: float) -> float:
    d = datetime.fromtimestamp(ts, UTC)
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def is_partitioned(conn: Connection, table: str = PARENT) -> bool:
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "WHERE c.relname = :t AND c.relnamespace = to_regnamespace(current_schema())::oid)"), {"t": table}).scalar())


def list_partitions(conn: Connection, table: str = PARENT) -> list[tuple[str, float | None, float | None]]:
    """(name, lower bound, upper bound) of every partition of ``table``; None bounds for the default."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE p.relname = :t AND p.relnamespace = to_regnamespace(current_schema())::oid ORDER BY 1"),
        {"t": table}).all()
    out: list[tuple[str, float | None, float | None]] = []
    for name, bound in rows:
        m = _BOUND.search(bound or "")
        out.append((str(name), float(m.group(1)), float(m.group(2))) if m else (str(name), None, None))
    return out


def create_day_partition(conn: Connection, start: float, lock_timeout: str = LOCK_TIMEOUT,
                         table: str = PARENT) -> str | None:
    """Create the partition of ``table`` for the UTC day starting at ``start``; None if it exists
    already.

    Rows for that day that sit in the default partition are moved into it (PostgreSQL refuses to
    create a partition whose range the default partition already holds rows of).
    """
    name = partition_name(start, table)
    default = default_name(table)
    if conn.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None:
        return None
    end = start + DAY
    conn.execute(text("SELECT set_config('lock_timeout', :t, true)"), {"t": lock_timeout})
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


def ensure_partitions(engine: Engine, now: float, ahead_days: int = 3, *, lock_timeout: str = LOCK_TIMEOUT) -> list[str]:
    """Create the daily partitions from today (UTC) to ``ahead_days`` ahead, plus one for every day
    that has rows stranded in the default partition.  Returns the names created (oldest first).
    A day whose DDL cannot get its lock within ``lock_timeout`` is left for the next run."""
    if engine.dialect.name != "postgresql":
        return []
    if ahead_days < 0:
        raise ValueError("ahead_days must be >= 0")
    created: list[str] = []
    with engine.begin() as conn:
        if not is_partitioned(conn):
            return []
        days = {day_start(now) + i * DAY for i in range(ahead_days + 1)}
        if conn.execute(text("SELECT to_regclass(:n)"), {"n": DEFAULT}).scalar() is not None:
            lo, hi = conn.execute(text(f"SELECT min(ts), max(ts) FROM {DEFAULT}")).one()
            if lo is not None:
                d = day_start(lo)
                while d <= hi:
                    days.add(d)
                    d = (datetime.fromtimestamp(d, UTC) + timedelta(days=1)).timestamp()
    for d in sorted(days):
        # one short transaction per day: the DDL's lock on the parent is held briefly
        try:
            with engine.begin() as conn:
                name = create_day_partition(conn, d, lock_timeout)
        except DBAPIError as e:
            if not _lock_timed_out(e):
                raise
            continue
        if name:
            created.append(name)
    return created


def drop_expired_partitions(engine: Engine, before_ts: float, *, lock_timeout: str = LOCK_TIMEOUT) -> list[str]:
    """Drop every daily partition whose whole range ends at or before ``before_ts``.

    Rows in a partition that straddles ``before_ts`` stay until that day has fully expired, so
    raw data is kept up to one day longer than the retention asks (never shorter).  Returns the
    names dropped; a partition whose DROP cannot get its lock within ``lock_timeout`` (a long
    query reading it) is left for the next run."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        expired = [name for name, _lo, hi in list_partitions(conn)
                   if hi is not None and hi <= before_ts and _NAME.match(name)]
    dropped: list[str] = []
    for name in expired:
        try:
            with engine.begin() as conn:
                conn.execute(text("SELECT set_config('lock_timeout', :t, true)"), {"t": lock_timeout})
                conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
        except DBAPIError as e:
            if not _lock_timed_out(e):
                raise
            continue
        dropped.append(name)
    return dropped

