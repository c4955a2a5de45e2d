"""The writer's cache (store/cache.py) is forgotten as one when a transaction fails, on SQLite
and on a real PostgreSQL server.

The failures are real: a trigger in the database makes the transaction fail after it created
new series (or a new node) and inserted their points.  After the rollback those ids do not
exist (SQLite gives the next row the same id, PostgreSQL the same slot), so a writer that kept
any of them would attach later points to the wrong series or node.
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store import Store, StoreReader
from triscope.store.cache import WriteCache
from triscope.store.db import upgrade
from triscope.store.minute_acc import MinuteAccumulator
from triscope.store.rollups import rollup_delay

BOOM = "boom"


def _empty(cache: WriteCache) -> bool:
    """Nothing remembered: a fresh or cleared cache (the floor of the accumulators aside)."""
    return not any(getattr(cache, name) for name in WriteCache.__slots__ if name != "acc_floor")


def _open(url: str) -> Store:
    upgrade(url)
    return Store.open(url)


def _fail_when(st: Store, table: str, condition_sqlite: str, condition_pg: str) -> None:
    """A trigger that aborts the statement (and so the transaction) inserting a matching row."""
    with st.engine.begin() as c:
        if st.dialect == "sqlite":
            c.execute(text(f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} WHEN {condition_sqlite} "
                           f"BEGIN SELECT RAISE(ABORT, 'injected failure'); END"))
        else:
            c.execute(text(f"CREATE FUNCTION fail_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                           f"IF {condition_pg} THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$"))
            c.execute(text(f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} FOR EACH ROW "
                           f"EXECUTE FUNCTION fail_{table}()"))


def _rollup_rows(st: Store) -> dict[tuple[str, float], tuple[float, ...]]:
    with st.engine.connect() as c:
        rows = c.execute(text(
            "SELECT s.metric, r.bucket, r.min, r.max, r.sum, r.count, r.last, r.last_ts, r.increase "
            "FROM rollup_1m r JOIN series s ON s.id = r.series_id")).all()
    return {(r[0], float(r[1])): tuple(float(x) for x in r[2:]) for r in rows}


def _points(st: Store, metric: str, node: str = "n") -> list[tuple[float, float]]:
    [sd] = st.query(metric, node=node, start=0, end=4e9, max_points=None, rate=False)
    return list(zip(sd.ts, sd.values, strict=True))


def _tick(ts: float, *samples: Sample, events: list[EventRecord] | None = None) -> Tick:
    return Tick(ts, list(samples), events or [])


def test_a_failed_transaction_forgets_new_series_ids_slots_and_counters(db_url: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that created a counter series fails after inserting its points; the next write
    creates a gauge, which takes the rolled-back series' id (SQLite) or slot (PostgreSQL).  The
    counter, written again later, gets a series of its own, every point sits on its own
    series, and the in-memory minute rollups equal the SQL rollup of the stored points (a stale
    'counter' id would give the gauge an increase; stale points in the accumulator a count)."""
    st = _open(db_url)
    _fail_when(st, "events", f"NEW.message = '{BOOM}'", f"NEW.message = '{BOOM}'")
    t0 = math.floor(1_700_000_000.0 / 60) * 60
    a = lambda k: Sample("a", float(k % 13))                         # noqa: E731
    g2 = lambda k: Sample("g2", 100.0 + k)                           # noqa: E731
    x = lambda k: Sample("x_total", float(3 * k), kind="counter")    # noqa: E731
    assert rollup_delay("n") == 22.0   # minute m is rolled by the first tick 22 s after it ends
    sql_rolled: list[tuple[float, float]] = []
    real_roll = st.rollups.roll

    def watch(conn: Connection, nid: int, tier: str, width: float, source: str, lo: float, hi: float) -> None:
        if tier == "1m":
            sql_rolled.append((lo - t0, hi - t0))
        real_roll(conn, nid, tier, width, source, lo, hi)

    monkeypatch.setattr(st.rollups, "roll", watch)   # watch which minutes are rolled in SQL
    for k in range(90):
        st.write_ticks("n", [_tick(t0 + k, a(k))])
    assert st.writer.direct is not None
    with pytest.raises(Exception, match="injected failure"):
        st.write_ticks("n", [_tick(t0 + 90, a(90), x(90), events=[EventRecord("xid", BOOM)])])
    assert _empty(st.cache)
    assert {s.metric for s in st.series(node="n")} == {"a"}           # the counter series rolled back
    for k in range(90, 100):
        st.write_ticks("n", [_tick(t0 + k, a(k), g2(k))])
    for k in range(100, 270):   # minutes 2 and 3 rolled from memory (rollup_delay("n") = 22 s)
        st.write_ticks("n", [_tick(t0 + k, a(k), g2(k), x(k))])
    monkeypatch.undo()
    # the minute of the failure came from SQL; minutes 2 and 3 from the accumulator started after it
    assert sql_rolled and all(hi <= 120 for _, hi in sql_rolled), sql_rolled
    with st.engine.connect() as c:
        series = {m: (int(i), int(s)) for m, i, s in c.execute(text("SELECT metric, id, slot FROM series"))}
        kinds: dict[str, str] = dict(c.execute(text("SELECT metric, kind FROM series")).tuples().all())
        orphans = c.execute(text("SELECT count(*) FROM samples WHERE series_id NOT IN (SELECT id FROM series)")).scalar()
        if st.dialect == "postgresql":
            widest = c.execute(text("SELECT max(array_length(vals, 1)) FROM sample_rows")).scalar()
            assert widest == 3
    assert sorted(series) == ["a", "g2", "x_total"]
    assert [series[m][1] for m in ("a", "g2", "x_total")] == [0, 1, 2]   # g2 took the rolled-back slot
    assert len({i for i, _ in series.values()}) == 3
    assert kinds == {"a": "gauge", "g2": "gauge", "x_total": "counter"}
    assert orphans == 0
    assert _points(st, "a") == [(t0 + k, float(k % 13)) for k in range(270)]
    assert _points(st, "g2") == [(t0 + k, 100.0 + k) for k in range(90, 270)]
    assert _points(st, "x_total") == [(t0 + k, float(3 * k)) for k in range(100, 270)]
    # the writer's ids now are the database's
    assert {m: sid for (_nid, m, _lk), sid in st.cache.series_ids.items()} == {m: i for m, (i, _) in series.items()}
    assert st.cache.counters == {series["x_total"][0]}
    # minute rollups (from memory where the accumulator saw the minute) equal SQL's
    got = _rollup_rows(st)
    assert {m for m, _ in got} == {"a", "g2", "x_total"}
    assert {b - t0 for m, b in got if m == "g2"} == {60.0, 120.0, 180.0}
    assert all(v[6] == 0.0 for (m, _), v in got.items() if m == "g2")
    with st.engine.begin() as c:
        c.execute(text("DELETE FROM rollup_1m"))
        nid = c.execute(text("SELECT id FROM nodes WHERE name = 'n'")).scalar_one()
        for b in sorted({b for _, b in got}):
            st.rollups.roll(c, nid, "1m", 60.0, "samples", b, b + 60)
    want = _rollup_rows(st)
    assert set(got) == set(want)
    for key, w in want.items():
        assert got[key] == pytest.approx(w, rel=1e-12, abs=1e-9), key
    st.close()


def test_a_failed_transaction_forgets_a_node_it_created(db_url: str) -> None:
    """The first write of node 'ghost' fails; node 'real' is created next (SQLite hands it the
    id 'ghost' had).  'ghost' written again is a node of its own, with its own series."""
    st = _open(db_url)
    _fail_when(st, "events", f"NEW.message = '{BOOM}'", f"NEW.message = '{BOOM}'")
    t0 = 1_700_000_000.0
    with pytest.raises(Exception, match="injected failure"):
        st.write_ticks("ghost", [_tick(t0, Sample("g", 1.0), events=[EventRecord("xid", BOOM)])])
    assert _empty(st.cache) and st.nodes() == []
    st.write_ticks("real", [_tick(t0 + k, Sample("r", 10.0 + k)) for k in range(3)])
    st.write_ticks("ghost", [_tick(t0 + k, Sample("g", 1.0 + k)) for k in range(1, 4)])
    for k in range(4, 6):   # the steady path too
        st.write_ticks("ghost", [_tick(t0 + k, Sample("g", 1.0 + k))])
        st.write_ticks("real", [_tick(t0 + k, Sample("r", 10.0 + k))])
    assert [n.name for n in st.nodes()] == ["ghost", "real"]
    assert [s.metric for s in st.series(node="ghost")] == ["g"]
    assert [s.metric for s in st.series(node="real")] == ["r"]
    assert _points(st, "g", "ghost") == [(t0 + k, 1.0 + k) for k in (1, 2, 3, 4, 5)]
    assert _points(st, "r", "real") == [(t0 + k, 10.0 + k) for k in (0, 1, 2, 4, 5)]
    st.close()


def test_a_failed_steady_state_tick_forgets_the_cache_and_the_next_tick_lands(db_url: str) -> None:
    """The one-statement steady-state tick (every id cached) fails in the database: nothing of
    it is stored, the cache is forgotten, and the following ticks (new series among them) are
    stored on the right series."""
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / 60) * 60
    bad = t0 + 30
    _fail_when(st, "samples" if st.dialect == "sqlite" else "sample_rows", f"NEW.ts = {bad!r}", f"NEW.ts = {bad!r}")
    for k in range(30):
        st.write_ticks("n", [_tick(t0 + k, Sample("a", float(k)))])
    assert st.writer.direct is not None   # the steady path has been taken
    with pytest.raises(Exception, match="injected failure"):
        st.write_ticks("n", [_tick(bad, Sample("a", 30.0))])
    assert _empty(st.cache)
    for k in range(31, 170):   # past the second minute's end + the node's rollup delay (<= 45 s)
        st.write_ticks("n", [_tick(t0 + k, Sample("a", float(k)), Sample("b", -float(k)))])
    assert _points(st, "a") == [(t0 + k, float(k)) for k in range(170) if k != 30]
    assert _points(st, "b") == [(t0 + k, -float(k)) for k in range(31, 170)]
    with st.engine.connect() as c:
        counts = {(float(b) - t0, m): int(n) for b, m, n in c.execute(text(
            "SELECT r.bucket, s.metric, r.count FROM rollup_1m r JOIN series s ON s.id = r.series_id"))}
    # the first minute without the failed tick, the second (rolled from memory) whole
    assert counts == {(0.0, "a"): 59, (0.0, "b"): 29, (60.0, "a"): 60, (60.0, "b"): 60}
    st.close()


def test_clear_forgets_every_field_and_keeps_a_floor_for_the_accumulators() -> None:
    cache = WriteCache()
    cache.node_ids["n"] = 1
    cache.series_ids[(1, "m", "{}")] = 7
    cache.slots[7] = 0
    cache.nslots[1] = 1
    cache.counters.add(7)
    cache.raw_sids[1] = {("m", ()): 7}
    cache.label_keys[()] = "{}"
    cache.watermarks[(1, "1m")] = 60.0
    cache.last_seen[1] = 100.0
    cache.acc[1] = MinuteAccumulator(60.0)
    cache.acc[1].add(100.0, [(7, 1.0)], cache.counters)
    cache.acc_after[2] = 150.0
    for name in WriteCache.__slots__:   # every field is filled: clear() has nothing to skip
        assert getattr(cache, name), name
    cache.clear()
    assert _empty(cache)
    assert cache.acc_floor == 150.0
    # no accumulator vouches for a minute that may hold points it did not see ...
    cache.feed(1, [(7, 140.0, 2.0)])
    assert cache.acc == {} and cache.acc_after[1] == 150.0
    # ... until a tick later than everything accounted for
    cache.feed(1, [(7, 151.0, 2.0)])
    assert cache.acc[1].known_from == 180.0


def test_store_is_a_store_reader(sqlite_url: str) -> None:
    """Every read of the protocol exists on Store with the same signature (the type checker
    holds it to the protocol too: store/api.py)."""
    import inspect

    reads = [n for n, v in vars(StoreReader).items() if callable(v) and not n.startswith("_")]
    assert sorted(reads) == sorted(["nodes", "series", "metric_names", "time_bounds", "query", "query_series",
                                    "latest", "fleet_latest", "series_keys", "events", "verdict_runs",
                                    "current_verdicts"])
    for name in reads:
        want = inspect.signature(getattr(StoreReader, name))
        got = inspect.signature(getattr(Store, name))
        assert got == want, (name, got, want)
    st = _open(sqlite_url)
    reader: StoreReader = st
    st.write_ticks("n", [_tick(1_700_000_000.0, Sample("a", 1.0))])
    assert [n.name for n in reader.nodes()] == ["n"] and reader.time_bounds("n") == (1_700_000_000.0,) * 2
    st.close()
