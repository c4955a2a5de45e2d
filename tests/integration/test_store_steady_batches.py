"""The steady-state write of several ticks at once (the agent's ``--write-every``: five ticks a
transaction) stores every point once, the last of two at one time, and its 1-minute rollups built
in memory equal what SQL computes from the stored samples (issue 46: the steady path builds its rows
without regrouping them by series and time in Python).  SQLite and the real PostgreSQL server."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text

from tests.integration.test_store import _open, _rollup_rows, _ticks
from triscope.core.samples import Sample, Tick, label_key


def _stored(st) -> dict[tuple[str, str, float], float]:  # type: ignore[no-untyped-def]
    with st.engine.connect() as c:
        rows = c.execute(text("SELECT s.metric, s.labels, p.ts, p.value FROM samples p "
                              "JOIN series s ON s.id = p.series_id")).all()
    return {(r[0], r[1], float(r[2])): float(r[3]) for r in rows}


def test_batches_of_ticks_store_every_point_and_roll_up_as_sql_does(db_url: str) -> None:
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / 60) * 60 + 17
    ticks = _ticks(t0, 600)
    for i, tk in enumerate(ticks):
        if 200 <= i < 400 and i % 3:      # a series in some ticks of a batch only
            tk.samples = [*tk.samples, Sample("triscope_dma_map_total", float(i // 2), {"device": "d0"}, "counter")]
        if i % 13 == 0 and i:             # a value no store carries: no point (NaN and both infinities)
            bad = (float("nan"), float("inf"), float("-inf"))[i % 3]
            tk.samples = [Sample(s.name, bad, s.labels, s.kind) if s.labels.get("gpu") == "1" else s
                          for s in tk.samples]
    batches = [ticks[i:i + 5] for i in range(0, len(ticks), 5)]
    # one batch holds a second tick at the time of another, with other values: the last one wins
    dup = batches[70][2]
    batches[70].append(Tick(dup.ts, [Sample(s.name, s.value + 1000.0, s.labels, s.kind) for s in dup.samples]))
    st.write_ticks("n", [ticks[0]])          # the series and ids: the general path
    for b in batches:
        st.write_ticks("n", [t for t in b if t is not ticks[0]] or b)
    got = _stored(st)
    want: dict[tuple[str, str, float], float] = {}
    for b in batches:
        for t in b:
            for s in t.samples:
                if not math.isfinite(s.value):
                    continue
                want[(s.name, label_key(s.labels), t.ts)] = s.value
    assert got == want
    assert got[("triscope_tcp_retransmits_total", "{}", dup.ts)] == dup.samples[2].value + 1000.0
    rolled = _rollup_rows(st)
    assert len(rolled) > 3 * 8
    with st.engine.begin() as c:
        c.execute(text("DELETE FROM rollup_1m"))
        nid = c.execute(text("SELECT id FROM nodes WHERE name = 'n'")).scalar_one()
        for b in sorted({k[2] for k in rolled}):
            st.rollups.roll(c, nid, "1m", 60.0, "samples", b, b + 60)
    sql = _rollup_rows(st)
    assert set(rolled) == set(sql)
    for k, w in sql.items():
        assert rolled[k] == pytest.approx(w, rel=1e-12, abs=1e-9), k


def test_sqlite_steady_state_takes_new_series_and_events(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite a batch that brings a series not seen before and an event stays on the steady path
    (the general path cost twice as much a sample on the GPU machine's recordings): the series is
    created first, the points and the event stored in one transaction.  PostgreSQL takes the general
    path for them, as before."""
    st = _open(db_url)
    t0 = math.floor(1_700_000_000.0 / 60) * 60 + 5
    ticks = _ticks(t0, 12)
    st.write_ticks("n", ticks[:6])            # the node and its first series: the general path
    general: list[int] = []
    real = st.writer.write_general
    monkeypatch.setattr(st.writer, "write_general", lambda *a, **k: general.append(1) or real(*a, **k))
    batch = ticks[6:11]
    batch[2].samples = [*batch[2].samples, Sample("triscope_new_series", 7.0, {"gpu": "0"})]
    from triscope.core.samples import EventRecord
    batch[3].events = [EventRecord("xid", "XID 79 on GPU 0", "critical", {"gpu": "0"})]
    st.write_ticks("n", batch)
    stored = _stored(st)
    assert stored[("triscope_new_series", label_key({"gpu": "0"}), batch[2].ts)] == 7.0
    assert [(e.kind, e.ts) for e in st.events(node="n")] == [("xid", batch[3].ts)]
    assert len(stored) == sum(len(t.samples) for t in ticks[:11])
    assert general == ([] if st.writer.steady_events else [1])
    st.close()
