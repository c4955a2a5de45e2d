"""Fleet-wide reads (one statement for every node), spread rollups and the steady-state tick
write, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from triscope.core.samples import EventRecord, Sample, Tick, label_key
from triscope.store import Store
from triscope.store.api import LAST_SEEN_STEP_S, ROLLUP_SPREAD_S, rollup_delay
from triscope.store.db import upgrade

STATES = ("idle", "compute-bound", "io-saturated")


def _open(url: str) -> Store:
    upgrade(url)
    return Store.open(url)


def _tick(ts: float, node_idx: int, k: int) -> Tick:
    state = STATES[(node_idx + k // 10) % len(STATES)]
    return Tick(ts, [Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s}) for s in STATES]
                + [Sample("triscope_mismatch_score", node_idx + k / 1000.0),
                   Sample("triscope_gpu_sm_active_ratio", 0.5, {"gpu": "0"}),
                   Sample("triscopeXgpuXlookalike", 1.0)])


def _latest_map(st: Store, node: str, metrics: tuple[str, ...]) -> dict[tuple[str, str], tuple[float, float]]:
    return {(lv.info.metric, label_key(lv.info.labels)): (lv.ts, lv.value)
            for lv in st.latest(node) if lv.info.metric in metrics}


def test_fleet_latest_matches_latest_per_node(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    metrics = ("triscope_mismatch_state", "triscope_mismatch_score")
    for n in range(4):
        # node n stops n * 7 s earlier than node 0: their newest points differ
        st.write_ticks(f"node-{n}", [_tick(t0 + k, n, k) for k in range(40 - n * 7)])
    got = st.fleet_latest(metrics)
    assert sorted(got) == [f"node-{n}" for n in range(4)]
    for n in range(4):
        want = _latest_map(st, f"node-{n}", metrics)
        assert got[f"node-{n}"] == want
        assert len(want) == len(STATES) + 1
        last = 39 - n * 7
        assert want[("triscope_mismatch_score", "{}")] == (t0 + last, n + last / 1000.0)
        on = [lk for (m, lk), (_, v) in want.items() if m == "triscope_mismatch_state" and v == 1.0]
        assert on == [label_key({"state": STATES[(n + last // 10) % len(STATES)]})]
    # a bound in time: only points at or after it, so nodes that stopped before it are absent
    recent = st.fleet_latest(metrics, since=t0 + 30)
    assert sorted(recent) == ["node-0", "node-1"]
    assert recent["node-1"] == got["node-1"]
    assert st.fleet_latest(metrics, since=t0 + 1000) == {}
    # only some nodes, only some metrics
    part = st.fleet_latest(["triscope_mismatch_score"], nodes=["node-2", "node-9"])
    assert part == {"node-2": {("triscope_mismatch_score", "{}"): got["node-2"][("triscope_mismatch_score", "{}")]}}
    assert st.fleet_latest([]) == {} and st.fleet_latest(metrics, nodes=[]) == {}
    st.close()


def test_fleet_latest_falls_back_to_the_newest_rollup(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_040.0 - 1_700_000_040.0 % 60
    st.write_ticks("old", [_tick(t0 + k, 1, k) for k in range(180)])
    st.write_ticks("new", [_tick(t0 + k, 2, k) for k in range(10)])
    with st.engine.connect() as c:
        rolled = c.execute(text("SELECT max(r.bucket) FROM rollup_1m r JOIN series s ON s.id = r.series_id "
                                "JOIN nodes n ON n.id = s.node_id WHERE n.name = 'old'")).scalar()
    assert rolled == t0 + 60   # two closed minutes rolled (the third is open)
    # raw retention expired the old node's samples: its newest rollup stands in, as latest() does
    with st.engine.begin() as c:
        if st.dialect == "postgresql":   # one row per node tick there, under the samples view
            c.execute(text("DELETE FROM sample_rows WHERE node_id = (SELECT id FROM nodes WHERE name = 'old')"))
        else:
            c.execute(text("DELETE FROM samples WHERE series_id IN (SELECT s.id FROM series s JOIN nodes n "
                           "ON n.id = s.node_id WHERE n.name = 'old')"))
    got = st.fleet_latest(["triscope_mismatch_score"])
    assert got["old"] == {("triscope_mismatch_score", "{}"): (t0 + 119, 1 + 119 / 1000.0)}
    assert got["new"] == {("triscope_mismatch_score", "{}"): (t0 + 9, 2 + 9 / 1000.0)}
    assert got["old"] == _latest_map(st, "old", ("triscope_mismatch_score",))
    # with a bound in time only raw points count
    assert "old" not in st.fleet_latest(["triscope_mismatch_score"], since=t0)
    st.close()


def test_latest_of_series_that_stopped_reporting(db_url: str) -> None:
    """A series that is not in its node's newest tick: its newest point comes from the ticks
    after the rollup watermark, or, before it, from the newest 1-minute rollup (which holds that
    very point); with ``since`` only raw points at or after it count."""
    st = _open(db_url)
    t0 = 1_700_000_040.0 - 1_700_000_040.0 % 60
    for k in range(200):
        samples = [Sample("live", float(k))]
        if k < 70:
            samples.append(Sample("gone_early", 1000.0 + k))      # before the 1-minute watermark
        if k < 195:
            samples.append(Sample("gone_late", 2000.0 + k))       # after it
        st.write_ticks("n", [Tick(t0 + k, samples)])
    got = {lv.info.metric: (lv.ts - t0, lv.value) for lv in st.latest("n")}
    assert got == {"live": (199, 199.0), "gone_early": (69, 1069.0), "gone_late": (194, 2194.0)}
    recent = {lv.info.metric: (lv.ts - t0, lv.value) for lv in st.latest("n", since=t0 + 100)}
    assert recent == {"live": (199, 199.0), "gone_late": (194, 2194.0)}
    assert {lv.info.metric for lv in st.latest("n", since=t0 + 69)} == {"live", "gone_early", "gone_late"}
    fleet = st.fleet_latest(["live", "gone_early", "gone_late"])
    assert {m: (ts - t0, v) for (m, _), (ts, v) in fleet["n"].items()} == got
    # rollups kept shorter than raw samples: the raw point is still found
    with st.engine.begin() as c:
        c.execute(text("DELETE FROM rollup_1m WHERE series_id = (SELECT id FROM series WHERE metric = 'gone_early')"))
    assert {lv.info.metric: (lv.ts - t0, lv.value) for lv in st.latest("n")} == got
    st.close()


def test_series_keys_fleet_wide(db_url: str) -> None:
    st = _open(db_url)
    t0 = 1_700_000_000.0
    for n in range(3):
        st.write_ticks(f"node-{n}", [_tick(t0, n, 0)])
    keys = st.series_keys(prefix="triscope_gpu_")
    # '_' in the prefix is literal: 'triscopeXgpuX...' does not match
    assert keys == {f"node-{n}": {("triscope_gpu_sm_active_ratio", label_key({"gpu": "0"}))} for n in range(3)}
    states = st.series_keys(metric="triscope_mismatch_state")
    assert {lk for _, lk in states["node-1"]} == {label_key({"state": s}) for s in STATES}
    assert st.series_keys(prefix="nothing_") == {}
    st.close()


def test_rollup_delay_spreads_the_fleet() -> None:
    delays = [rollup_delay(f"gpu-node-{i:04d}") for i in range(1000)]
    assert min(delays) >= 1 and max(delays) <= ROLLUP_SPREAD_S
    assert len(set(delays)) == ROLLUP_SPREAD_S
    # no second of the minute carries much more than its share of the fleet's rollups
    worst = max(delays.count(d) for d in set(delays))
    assert worst <= 2 * 1000 / ROLLUP_SPREAD_S
    assert rollup_delay("gpu-node-0001") == rollup_delay("gpu-node-0001")


def test_a_bucket_rolls_delay_seconds_after_it_closes(db_url: str) -> None:
    st = _open(db_url)
    node = "gpu-node-0007"
    d = rollup_delay(node)
    t0 = 1_700_000_040.0 - 1_700_000_040.0 % 60
    # the first minute and the next one up to d - 1 s past its end: not rolled yet
    st.write_ticks(node, [_tick(t0 + k, 0, k) for k in range(60 + int(d))])

    def watermark() -> Any:
        with st.engine.connect() as c:
            return c.execute(text("SELECT rolled_until FROM rollup_watermarks w JOIN nodes n ON n.id = w.node_id "
                                  "WHERE n.name = :n AND w.tier = '1m'"), {"n": node}).scalar()

    assert watermark() == t0
    # the not-yet-rolled minute is served from raw through the rollup tier
    [sd] = st.query("triscope_mismatch_score", node=node, start=t0, end=t0 + 60 + d, tier="1m", max_points=None)
    assert sd.ts[0] == t0 and len(sd.ts) == 60 + d
    for k in range(60 + int(d), 60 + int(d) + 2):   # one tick each: d s and d + 1 s past the end
        st.write_ticks(node, [_tick(t0 + k, 0, k)])
    assert watermark() == t0 + 60
    with st.engine.connect() as c:
        row = c.execute(text("SELECT r.count, r.last FROM rollup_1m r JOIN series s ON s.id = r.series_id "
                             "WHERE s.metric = 'triscope_mismatch_score' AND r.bucket = :b"), {"b": t0}).one()
    assert (row[0], row[1]) == (60, 59 / 1000.0)
    [sd] = st.query("triscope_mismatch_score", node=node, start=t0, end=t0 + 62 + d, tier="1m", max_points=None)
    # the rolled minute (its min and max), then raw
    assert sd.ts[:2] == [t0 + 15, t0 + 45] and sd.values[:2] == pytest.approx([0.0, 59 / 1000.0])
    assert sd.ts[2:] == [t0 + 60 + k for k in range(2 + int(d))]
    st.close()


def test_steady_ticks_replays_new_series_and_events(db_url: str) -> None:
    """The ORM-free steady-state write (one statement on PostgreSQL) and the general path agree: replays
    stay idempotent, a new series or an event mid-stream is stored, last_seen follows."""
    st = _open(db_url)
    t0 = 1_700_000_000.0
    node = "gpu-node-0003"
    for k in range(30):
        st.write_ticks(node, [_tick(t0 + k, 0, k)])
    assert st.writer.direct is not None   # the steady state took the ORM-free path (both dialects)
    # there last_seen moves in steps of LAST_SEEN_STEP_S (a hot row otherwise)
    assert t0 + 29 - LAST_SEEN_STEP_S <= st.nodes()[0].last_seen <= t0 + 29
    # a replay of stored ticks (a spool drained twice): no error, nothing doubled
    assert st.write_ticks(node, [_tick(t0 + 28, 0, 28)]) == len(STATES) + 3
    st.write_ticks(node, [_tick(t0 + 29, 0, 29), _tick(t0 + 30, 0, 30)])
    # a new series and an event in a later tick
    tk = _tick(t0 + 31, 0, 31)
    tk.samples.append(Sample("triscope_gpu_sm_active_ratio", 0.9, {"gpu": "1"}))
    tk.events = [EventRecord("xid", "XID 79 on GPU 1", "critical", {"gpu": "1"})]
    st.write_ticks(node, [tk])
    st.write_ticks(node, [_tick(t0 + 32, 0, 32)])
    with st.engine.connect() as c:
        n = c.execute(text("SELECT count(*) FROM samples")).scalar()
        dupes = c.execute(text("SELECT count(*) FROM (SELECT series_id, ts FROM samples GROUP BY series_id, ts "
                               "HAVING count(*) > 1) d")).scalar()
    assert dupes == 0 and n == 33 * (len(STATES) + 3) + 1
    [sd] = st.query("triscope_gpu_sm_active_ratio", node=node, labels={"gpu": "1"}, start=t0, end=t0 + 40,
                    max_points=None)
    assert (sd.ts, sd.values) == ([t0 + 31], [0.9])
    assert [e.kind for e in st.events(node=node)] == ["xid"]
    if st.writer.steady_events:
        # SQLite's steady state took the tick with the event and the new series too: last_seen in steps
        assert t0 + 31 - LAST_SEEN_STEP_S <= st.nodes()[0].last_seen <= t0 + 31
    else:
        # the tick with the event took the general path: last_seen exact there
        assert st.nodes()[0].last_seen >= t0 + 31
    # an older tick never moves last_seen back
    before = st.nodes()[0].last_seen
    st.write_ticks(node, [Tick(t0 + 5, [Sample("late", 1.0)])])
    assert st.nodes()[0].last_seen == before
    st.close()


@pytest.mark.postgres
def test_steady_writes_survive_a_server_restart(pg_server: Any, pg_url: str) -> None:
    """The steady-state tick's own connection breaks with the server: the tick goes through the
    general path (a fresh pooled connection) and the next steady tick reconnects."""
    st = _open(pg_url)
    t0 = 1_700_000_000.0
    node = "gpu-node-0004"
    for k in range(10):
        st.write_ticks(node, [_tick(t0 + k, 0, k)])
    assert st.writer.direct is not None
    pg_server.stop()
    pg_server.start()
    for k in range(10, 15):
        st.write_ticks(node, [_tick(t0 + k, 0, k)])
    assert st.writer.direct is not None and not st.writer.direct.closed
    with st.engine.connect() as c:
        assert c.execute(text("SELECT count(DISTINCT ts) FROM samples")).scalar() == 15
    assert t0 + 14 - LAST_SEEN_STEP_S <= st.nodes()[0].last_seen <= t0 + 14
    st.close()
