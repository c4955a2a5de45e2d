"""PostgreSQL fleet store: daily partitions of the raw sample rows (revisions 0003 and 0004,
store/partitions.py).

Real PostgreSQL (the conftest server); the store writes through its normal paths.  ``samples``
counts points (the view), ``sample_rows`` node ticks (the table).
"""

from __future__ import annotations

import time

import pytest
from alembic import command
from sqlalchemy import text

from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store import partitions as P
from triscope.store.db import alembic_config, upgrade

DAY = 86400.0


def _count(st: Store, table: str = "samples") -> int:
    with st.engine.connect() as c:
        return int(c.execute(text(f"SELECT count(*) FROM {table}")).scalar() or 0)


def _ticks(start: float, n: int, step: float = 3600.0) -> list[Tick]:
    return [Tick(ts=start + i * step, samples=[Sample("triscope_cpu_busy_ratio", 0.5, {}, "gauge"),
                                               Sample("triscope_tcp_retransmits_total", float(i), {}, "counter")])
            for i in range(n)]


@pytest.mark.postgres
def test_upgrade_partitions_samples_by_day_and_alembic_sees_no_drift(pg_url: str) -> None:
    upgrade(pg_url)
    st = Store.open(pg_url)
    try:
        now = time.time()
        with st.engine.connect() as c:
            assert P.is_partitioned(c)
            parts = P.list_partitions(c)
        names = [n for n, _, _ in parts]
        assert P.DEFAULT in names
        today = P.day_start(now)
        for i in range(4):   # today + 3 days ahead
            assert P.partition_name(today + i * DAY) in names
        for name, lo, hi in parts:
            if name != P.DEFAULT:
                assert hi - lo == DAY and name == P.partition_name(lo)
        st.write_ticks("node-a", _ticks(now - 5, 3, 1.0))
        with st.engine.connect() as c:
            where = c.execute(text("SELECT DISTINCT tableoid::regclass::text FROM sample_rows")).scalars().all()
        assert where == [P.partition_name(today)]
        # a range query over one day reads one partition (pruning)
        with st.engine.connect() as c:
            plan = "\n".join(c.execute(text("EXPLAIN SELECT * FROM samples WHERE series_id = 1 AND ts >= :a AND ts < :b"),
                                       {"a": today + 10, "b": today + 20}).scalars())
        assert P.partition_name(today) in plan and P.partition_name(today + DAY) not in plan and P.DEFAULT not in plan
        command.check(alembic_config(pg_url))   # partitions (and the samples view) are not drift
    finally:
        st.close()


def _narrow_rows(st: Store, start: float) -> list[tuple[str, str, float, float]]:
    """Before revision 0004: two nodes, one row per sample.  Node a: cpu every hour for 3 days
    and retransmits every other hour; node b: one series, every hour of the first day."""
    with st.engine.begin() as c:
        for name in ("a", "b"):
            c.execute(text("INSERT INTO nodes (name, labels, first_seen, last_seen) VALUES (:n, '{}', :t, :t)"),
                      {"n": name, "t": start})
        ids = {}
        for node, metric, kind in (("a", "triscope_cpu_busy_ratio", "gauge"), ("b", "triscope_cpu_busy_ratio", "gauge"),
                                   ("a", "triscope_tcp_retransmits_total", "counter")):
            ids[(node, metric)] = c.execute(text(
                "INSERT INTO series (node_id, metric, labels, kind) SELECT id, :m, '{}', :k FROM nodes WHERE name = :n "
                "RETURNING id"), {"n": node, "m": metric, "k": kind}).scalar_one()
        rows = [("a", "triscope_cpu_busy_ratio", start + h * 3600, h / 100) for h in range(72)]
        rows += [("a", "triscope_tcp_retransmits_total", start + h * 3600, float(h)) for h in range(0, 72, 2)]
        rows += [("b", "triscope_cpu_busy_ratio", start + h * 3600, 1 + h / 100) for h in range(24)]
        c.execute(text("INSERT INTO samples (series_id, ts, value) VALUES (:s, :t, :v)"),
                  [{"s": ids[(n, m)], "t": t, "v": v} for n, m, t, v in rows])
    return sorted(rows)


def _points(st: Store) -> list[tuple[str, str, float, float]]:
    with st.engine.connect() as c:
        return sorted((n, m, float(t), float(v)) for n, m, t, v in c.execute(text(
            "SELECT n.name, se.metric, s.ts, s.value FROM samples s JOIN series se ON se.id = s.series_id "
            "JOIN nodes n ON n.id = se.node_id")))


@pytest.mark.postgres
def test_existing_rows_move_into_node_rows_by_day_and_downgrade_restores_them(pg_url: str) -> None:
    upgrade(pg_url, "0003")
    st = Store.open(pg_url)
    try:
        start = P.day_start(time.time()) - 3 * DAY + 1800
        rows = _narrow_rows(st, start)
        assert _points(st) == rows
        upgrade(pg_url)
        with st.engine.connect() as c:
            assert P.is_partitioned(c)
            per_part = dict(c.execute(text("SELECT tableoid::regclass::text, count(*) FROM sample_rows GROUP BY 1")).all())
            # node a's odd hours have no retransmit value: the row ends before that slot (vals[2] is NULL)
            a_rows = c.execute(text("SELECT r.vals FROM sample_rows r JOIN nodes n ON n.id = r.node_id "
                                    "WHERE n.name = 'a' ORDER BY r.ts LIMIT 2")).scalars().all()
            slots = dict(c.execute(text("SELECT n.name || '/' || s.metric, s.slot FROM series s "
                                        "JOIN nodes n ON n.id = s.node_id")).all())
        assert slots == {"a/triscope_cpu_busy_ratio": 0, "a/triscope_tcp_retransmits_total": 1,
                         "b/triscope_cpu_busy_ratio": 0}
        assert a_rows == [[0.0, 0.0], [0.01]]
        # one row per node tick: node a 24 a day, node b 24 on the first day
        assert per_part == {P.partition_name(start): 48, P.partition_name(start + DAY): 24,
                            P.partition_name(start + 2 * DAY): 24}
        assert _points(st) == rows
        data = st.query("triscope_tcp_retransmits_total", node="a", start=start, end=start + 3 * DAY,
                        max_points=None, rate=False)
        assert len(data) == 1 and data[0].values == [float(h) for h in range(0, 72, 2)]
        command.check(alembic_config(pg_url))
        command.downgrade(alembic_config(pg_url), "0003")
        with st.engine.connect() as c:
            assert P.is_partitioned(c, "samples") and not P.is_partitioned(c)
        assert _points(st) == rows
        command.downgrade(alembic_config(pg_url), "0002")
        assert _points(st) == rows
        upgrade(pg_url)
        assert _points(st) == rows
    finally:
        st.close()


@pytest.mark.postgres
def test_a_wide_node_row_stays_inline_and_uncompressed(pg_url: str) -> None:
    """600 series (4.8 KB of values) in one row: past the default 2 KB TOAST threshold, inside
    the partitions' toast_tuple_target, so reading one slot never decompresses the array."""
    upgrade(pg_url)
    st = Store.open(pg_url)
    try:
        now = time.time()
        st.write_ticks("wide", [Tick(now - 1, [Sample(f"m{i}", i + 0.5) for i in range(600)])])
        with st.engine.connect() as c:
            size, toast = c.execute(text(
                "SELECT pg_column_size(r.vals), pg_relation_size(c.reltoastrelid) FROM sample_rows r "
                "JOIN pg_class c ON c.oid = r.tableoid")).one()
            opts = c.execute(text("SELECT reloptions FROM pg_class WHERE relname = :n"),
                             {"n": P.partition_name(P.day_start(now))}).scalar()
        assert size >= 600 * 8 and toast == 0
        assert opts == ["toast_tuple_target=8160"]
        [lv] = st.latest("wide", metric="m599")
        assert lv.value == 599.5
    finally:
        st.close()


@pytest.mark.postgres
def test_retention_drops_whole_days_and_keeps_the_rest(pg_url: str) -> None:
    upgrade(pg_url)
    st = Store.open(pg_url)
    try:
        today = P.day_start(time.time())
        start = today - 5 * DAY
        created = P.ensure_partitions(st.engine, start, ahead_days=5)
        assert created == [P.partition_name(start + i * DAY) for i in range(5)]   # today onwards existed
        assert P.ensure_partitions(st.engine, start, ahead_days=5) == []            # idempotent
        st.write_ticks("node-a", _ticks(start + 600, 5 * 24))                       # 5 past days
        assert _count(st) == 240
        cut = today - 2 * DAY + 3600        # keep the last 2 days minus an hour
        dropped = P.drop_expired_partitions(st.engine, cut)
        assert dropped == [P.partition_name(start + i * DAY) for i in range(3)]
        with st.engine.connect() as c:
            oldest = c.execute(text("SELECT min(ts) FROM samples")).scalar()
            names = [n for n, _, _ in P.list_partitions(c)]
        # the partition straddling the cut stays whole: data is kept up to a day longer, never shorter
        assert oldest == pytest.approx(today - 2 * DAY + 600)
        assert _count(st) == 2 * 48
        assert P.partition_name(today - 2 * DAY) in names and P.partition_name(today - 3 * DAY) not in names
        assert P.drop_expired_partitions(st.engine, cut) == []
        assert st.query("triscope_cpu_busy_ratio", node="node-a", start=today - 2 * DAY, end=today, max_points=None)
    finally:
        st.close()


@pytest.mark.postgres
def test_rows_outside_every_partition_land_in_default_and_are_moved_out(pg_url: str) -> None:
    upgrade(pg_url)
    st = Store.open(pg_url)
    try:
        future = P.day_start(time.time()) + 10 * DAY + 100     # beyond the partitions made ahead
        st.write_ticks("node-skewed", _ticks(future, 4, 60.0))  # a write never fails for lack of a partition
        assert _count(st, P.DEFAULT) == 4        # node ticks
        created = P.ensure_partitions(st.engine, time.time(), ahead_days=3)
        assert created == [P.partition_name(P.day_start(future))]
        assert _count(st, P.DEFAULT) == 0
        assert _count(st, P.partition_name(P.day_start(future))) == 4
        st.write_ticks("node-skewed", _ticks(future, 4, 60.0))  # replay: still idempotent across the move
        assert _count(st) == 8
    finally:
        st.close()


@pytest.mark.postgres
def test_a_busy_partition_is_left_for_the_next_run_instead_of_stalling(pg_url: str) -> None:
    upgrade(pg_url)
    st = Store.open(pg_url)
    try:
        old = P.day_start(time.time()) - 10 * DAY
        P.ensure_partitions(st.engine, old, ahead_days=1)
        st.write_ticks("n", _ticks(old + 60, 2))
        reader = st.engine.connect()
        tx = reader.begin()
        reader.execute(text("SELECT count(*) FROM samples WHERE ts < :t"), {"t": old + DAY})  # holds its lock
        try:
            t0 = time.monotonic()
            assert P.drop_expired_partitions(st.engine, old + 2 * DAY, lock_timeout="200ms") == []
            assert time.monotonic() - t0 < 5
        finally:
            tx.rollback()
            reader.close()
        assert P.drop_expired_partitions(st.engine, old + 2 * DAY, lock_timeout="200ms") == [
            P.partition_name(old), P.partition_name(old + DAY)]
    finally:
        st.close()


def test_sqlite_is_untouched(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    st = Store.open(sqlite_url)
    try:
        assert P.ensure_partitions(st.engine, time.time(), 3) == []
        assert P.drop_expired_partitions(st.engine, time.time()) == []
        st.write_ticks("n", _ticks(time.time(), 2))
        assert _count(st) == 4
        with st.engine.connect() as c:
            from alembic.script import ScriptDirectory

            from triscope.store.db import alembic_config

            head = ScriptDirectory.from_config(alembic_config(sqlite_url)).get_current_head()
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
            assert not c.execute(text("SELECT count(*) FROM sqlite_master WHERE name = 'sample_rows'")).scalar()
    finally:
        st.close()


def test_partition_names_are_recognised() -> None:
    assert P.is_partition_name("sample_rows_p20261129") and P.is_partition_name("sample_rows_default")
    assert P.is_partition_name("samples_p20261129") and P.is_partition_name("samples_default")   # revision 0003's
    assert not P.is_partition_name("samples") and not P.is_partition_name("sample_rows")
    assert not P.is_partition_name("sample_rows_p2026") and not P.is_partition_name(None)
    assert P.partition_name(P.day_start(1764374400.0 + 5000)) == "sample_rows_p20251129"
    assert P.partition_name(P.day_start(1764374400.0), "samples") == "samples_p20251129"
