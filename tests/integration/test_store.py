"""The store on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store import Store
from triscope.store.api import RetentionPolicy, minmax_downsample
from triscope.store.db import StoreError, alembic_config, upgrade

HOUR = 3600.0


def _open(url: str) -> Store:
    upgrade(url)
    return Store.open(url)


def _ticks(t0: float, n: int, step: float = 1.0) -> list[Tick]:
    out = []
    for i in range(n):
        out.append(Tick(t0 + i * step, [
            Sample("triscope_gpu_sm_active_ratio", 0.5 + 0.4 * math.sin(i / 50), {"gpu": "0"}),
            Sample("triscope_gpu_sm_active_ratio", 0.1, {"gpu": "1"}),
            # a counter that resets once, at i == 3000
            Sample("triscope_tcp_retransmits_total", float(i * 2 if i < 3000 else (i - 3000) * 2), kind="counter"),
        ]))
    return out


def test_write_and_read_back(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    st.write_ticks("node-a", _ticks(t0, 100))
    [sd] = st.query("triscope_gpu_sm_active_ratio", node="node-a", labels={"gpu": "1"}, start=t0, end=t0 + 100,
                    max_points=None)
    assert sd.ts == [t0 + i for i in range(100)]
    assert set(sd.values) == {0.1}
    assert sd.info.labels == {"gpu": "1"} and sd.info.kind == "gauge"
    assert [n.name for n in st.nodes()] == ["node-a"]
    assert st.nodes()[0].last_seen == t0 + 99
    assert len(st.series(node="node-a")) == 3
    assert {s.metric for s in st.series(prefix="triscope_gpu_")} == {"triscope_gpu_sm_active_ratio"}


def test_rewrite_is_idempotent(db_url: str) -> None:
    """A replayed spool (the same ticks twice) never doubles a point."""
    st = _open(db_url)
    t0 = 1_700_000_000.0
    ticks = _ticks(t0, 50)
    st.write_ticks("n", ticks)
    st.write_ticks("n", ticks[10:30])
    with st.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM samples")).scalar_one() == 150


def test_a_tick_written_in_parts_merges_and_a_stored_point_keeps_its_value(db_url: str) -> None:
    """Two writes at the same timestamp (a second source, a replay that carries a new series):
    points already stored keep their value, new ones join them.  On PostgreSQL both land in the
    same node row; a series created later takes the next slot, and ticks without it read as gaps."""
    st = _open(db_url)
    t0 = 1_700_000_000.0
    st.write_ticks("n", [Tick(t0, [Sample("a", 1.0)]), Tick(t0 + 1, [Sample("a", 2.0)])])
    st.write_ticks("n", [Tick(t0 + 1, [Sample("a", 99.0), Sample("b", 20.0)]),
                         Tick(t0 + 2, [Sample("b", 30.0)])])
    st.write_ticks("n", [Tick(t0 + 3, [Sample("a", 4.0)])])        # the steady path again, b absent
    got = {sd.info.metric: list(zip(sd.ts, sd.values, strict=True))
           for m in ("a", "b") for sd in st.query(m, node="n", start=t0, end=t0 + 10, max_points=None)}
    assert got == {"a": [(t0, 1.0), (t0 + 1, 2.0), (t0 + 3, 4.0)], "b": [(t0 + 1, 20.0), (t0 + 2, 30.0)]}
    with st.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM samples")).scalar_one() == 5
        assert dict(c.execute(text("SELECT metric, slot FROM series")).all()) == {"a": 0, "b": 1}
        if st.dialect == "postgresql":
            rows = c.execute(text("SELECT ts, vals FROM sample_rows ORDER BY ts")).all()
            assert [(ts - t0, vals) for ts, vals in rows] == [
                (0, [1.0]), (1, [2.0, 20.0]), (2, [None, 30.0]), (3, [4.0, None])]
    st.close()


def test_counter_rate_handles_reset(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    st.write_ticks("n", _ticks(t0, 3100))
    [sd] = st.query("triscope_tcp_retransmits_total", node="n", start=t0, end=t0 + 3100, max_points=None)
    # 2 per second everywhere except the reset step, where the new value (0) counts as the increase
    assert len(sd.values) == 3099
    assert sorted(set(sd.values)) == [0.0, 2.0]
    [cum] = st.query("triscope_tcp_retransmits_total", node="n", start=t0, end=t0 + 3100, max_points=None, rate=False)
    assert cum.values[2999] == 5998.0 and cum.values[3000] == 0.0


def test_rollups_follow_writes_and_late_data(db_url: str) -> None:
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / HOUR) * HOUR
    ticks = _ticks(t0, 2 * 3600 + 120)
    # write the second half first, then the first half late (like a drained spool)
    half = len(ticks) // 2
    for i in range(half, len(ticks), 300):
        st.write_ticks("n", ticks[i:i + 300])
    for i in range(0, half, 300):
        st.write_ticks("n", ticks[i:i + 300])
    with st.engine.connect() as c:
        rows = c.execute(text(
            "SELECT r.bucket, r.count, r.min, r.max, r.last, r.increase FROM rollup_1h r JOIN series s ON s.id = r.series_id "
            "WHERE s.metric = 'triscope_tcp_retransmits_total' ORDER BY r.bucket")).all()
        assert [r[0] for r in rows] == [t0, t0 + HOUR]
        assert [r[1] for r in rows] == [3600, 3600]
        # first hour: 0 -> 5998, reset to 0 at i = 3000, then -> 1198: increase 5998 + 0 + 1198
        first, second = rows
        assert (first[2], first[3], first[4]) == (0.0, 5998.0, 1198.0)
        assert first[5] == pytest.approx(5998 + 1198)
        # second hour: i = 3600..7199 -> values (i-3000)*2 = 1200 .. 8398, predecessor 1198: increase 8398 - 1198
        assert second[5] == pytest.approx(8398 - 1198)
        n1m = c.execute(text("SELECT count(*), sum(count) FROM rollup_1m r JOIN series s ON s.id = r.series_id "
                             "WHERE s.metric = 'triscope_tcp_retransmits_total'")).one()
        assert n1m[0] == 121 and n1m[1] == 121 * 60  # every closed minute (the last is open), none doubled


def _rollup_rows(st: Store) -> dict[tuple[str, str, float], tuple[float, ...]]:
    with st.engine.connect() as c:
        rows = c.execute(text(
            "SELECT s.metric, s.labels, r.bucket, r.min, r.max, r.sum, r.count, r.last, r.last_ts, r.increase "
            "FROM rollup_1m r JOIN series s ON s.id = r.series_id")).all()
    return {(r[0], r[1], float(r[2])): tuple(float(x) for x in r[3:]) for r in rows}


def test_minute_rollups_from_memory_equal_the_sql_rollup(db_url: str) -> None:
    """A writer that sees its ticks in order builds the 1-minute rows in memory; they equal what
    the SQL rollup computes from the stored samples (the first, partial minute comes from SQL),
    and a replay in the middle hands the rest back to SQL without a wrong row."""
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / 60) * 60 + 17     # start mid-minute: that minute is SQL's
    ticks = _ticks(t0, 3100)   # the counter resets at i = 3000
    for i, tk in enumerate(ticks):   # a series that comes and goes, a gauge that is NaN at times
        if 400 <= i < 900 and i % 7:
            tk.samples = [*tk.samples, Sample("triscope_dma_map_total", float(i // 3), {"device": "d0"}, "counter")]
        if i % 11 == 0:
            tk.samples = [Sample(s.name, float("nan"), s.labels, s.kind) if s.labels.get("gpu") == "1" else s
                          for s in tk.samples]
    sql_rolls: list[tuple[float, float]] = []
    real_roll = st.rollups.roll

    def watch(conn, nid, tier, width, source, lo, hi):  # type: ignore[no-untyped-def]
        if tier == "1m":
            sql_rolls.append((lo, hi))
        real_roll(conn, nid, tier, width, source, lo, hi)

    st.rollups.roll = watch  # type: ignore[method-assign]
    for tk in ticks[:2000]:
        st.write_ticks("n", [tk])
    st.write_ticks("n", ticks[1500:1510])   # a replay: the accumulator stands down
    for tk in ticks[2000:]:
        st.write_ticks("n", [tk])
    st.rollups.roll = real_roll  # type: ignore[method-assign]
    # the first minute and everything from the replay on came from SQL, the rest from memory
    assert sql_rolls[0][0] == math.floor(t0 / 60) * 60 and sql_rolls[0][1] <= t0 + 60
    assert all(lo > t0 + 1400 for lo, _ in sql_rolls[1:])
    got = _rollup_rows(st)
    assert len(got) > 3 * 50
    # recompute every minute in SQL, one bucket at a time, and compare
    with st.engine.begin() as c:
        c.execute(text("DELETE FROM rollup_1m"))
        nid = c.execute(text("SELECT id FROM nodes WHERE name = 'n'")).scalar_one()
        for b in sorted({k[2] for k in got}):
            st.rollups.roll(c, nid, "1m", 60.0, "samples", b, b + 60)
    want = _rollup_rows(st)
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k] == pytest.approx(w, rel=1e-12, abs=1e-9), k


def test_downsampling_keeps_spikes(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    ticks = [Tick(t0 + i, [Sample("g", 1.0 if i != 43_210 else 99.0)]) for i in range(86_400)]
    for i in range(0, len(ticks), 10_000):
        st.write_ticks("n", ticks[i:i + 10_000], rollup=False)
    [sd] = st.query("g", node="n", start=t0, end=t0 + 86_400, max_points=2000, tier="raw")
    assert len(sd.ts) <= 2000
    assert max(sd.values) == 99.0 and min(sd.values) == 1.0
    assert t0 + 43_210 in sd.ts
    assert sd.ts == sorted(sd.ts)


def test_tier_choice_and_stitching(db_url: str) -> None:
    """A range longer than raw serves from rollups; the not-yet-rolled tail comes from raw."""
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / HOUR) * HOUR
    ticks = [Tick(t0 + i * 10, [Sample("g", float(i % 7))]) for i in range(3 * 360 + 30)]  # 3h05m at 0.1 Hz
    st.write_ticks("n", ticks)
    [sd] = st.query("g", node="n", start=t0, end=t0 + 3 * HOUR + 300, max_points=50)
    assert sd.tier in ("1m", "1h")
    assert len(sd.ts) <= 50
    assert max(sd.ts) > t0 + 3 * HOUR  # the tail after the last closed bucket is there


def test_latest_and_events(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    ev = EventRecord("xid", "XID 79 on GPU 0", "critical", {"gpu": "0", "xid": 79})
    st.write_ticks("n", [Tick(t0, [Sample("g", 1.0)]), Tick(t0 + 1, [Sample("g", 2.0)], [ev])])
    st.add_events("n", [EventRecord("remediation", "dry-run restart", details={"rule": "r1"})], ts=t0 + 5)
    [lv] = st.latest("n")
    assert (lv.ts, lv.value) == (t0 + 1, 2.0)
    evs = st.events(node="n", start=t0, end=t0 + 10)
    assert [e.kind for e in evs] == ["xid", "remediation"]
    assert evs[0].details == {"gpu": "0", "xid": 79} and evs[0].ts == t0 + 1
    assert [e.kind for e in st.events(kinds=["remediation"])] == ["remediation"]


def test_retention(db_url: str) -> None:
    st = _open(db_url)
    now = 1_800_000_000.0
    st.write_ticks("n", [Tick(now - 10 * 86400, [Sample("g", 1.0)]), Tick(now - 100, [Sample("g", 2.0)])])
    removed = st.apply_retention(RetentionPolicy(raw=7 * 86400), now=now)
    # SQLite deletes the row; a partitioned PostgreSQL drops the whole expired day instead
    assert removed["samples"] + removed.get("samples_partitions_dropped", 0) >= 1
    [sd] = st.query("g", node="n", start=0, end=now, max_points=None)
    assert sd.values == [2.0]


def test_alembic_check_finds_no_drift(db_url: str) -> None:
    from alembic import command

    upgrade(db_url)
    command.check(alembic_config(db_url))  # raises if models and migrations differ


def test_upgrade_twice_is_safe(db_url: str) -> None:
    upgrade(db_url)
    upgrade(db_url)


def test_unreachable_database_is_one_clear_error(pg_server) -> None:  # type: ignore[no-untyped-def]
    url = f"postgresql://postgres@127.0.0.1:{pg_server.port + 1}/nope"
    with pytest.raises(StoreError, match="unreachable"):
        Store.open(url)


def test_minmax_downsample_pure() -> None:
    ts = list(range(1000))
    vals = [0.0] * 1000
    vals[500] = -5.0
    vals[501] = 7.0
    t2, v2 = minmax_downsample([float(t) for t in ts], vals, 20)
    assert len(t2) <= 20 and -5.0 in v2 and 7.0 in v2 and t2 == sorted(t2)
