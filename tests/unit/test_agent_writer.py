"""The store writer's batches: ticks go to the store every ``batch_ticks`` ticks, in order, and
nothing held for a batch is lost at flush or at close.  (A batch that meets a database outage:
tests/e2e/test_agent_outage.py, where the agent runs with batches of 10 ticks against a real server.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from triscope.agent.runtime import batch_ticks
from triscope.agent.spool import Spool
from triscope.agent.writer import StoreWriter
from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import upgrade

T0 = 1_700_000_000.0


def _tick(i: int) -> Tick:
    return Tick(T0 + i, [Sample("triscope_ticks_total", float(i + 1), kind="counter")])


def _stored(st: Store) -> list[float]:
    got = st.query("triscope_ticks_total", node="n", start=0, end=T0 + 1e6, max_points=None, rate=False)
    return sorted(v for sd in got for v in sd.values)


def _writer(sqlite_url: str, tmp_path: Path, n: int) -> tuple[Store, StoreWriter]:
    upgrade(sqlite_url)
    st = Store.open(sqlite_url)
    w = StoreWriter(st, "n", Spool(tmp_path / "spool", 1 << 20), batch_ticks=n)
    w.start()
    return st, w


def test_a_batch_is_written_when_it_is_full(sqlite_url: str, tmp_path: Path) -> None:
    st, w = _writer(sqlite_url, tmp_path, 3)
    try:
        w.submit(_tick(0))
        w.submit(_tick(1))
        time.sleep(0.3)   # the writer thread has nothing yet: the two ticks wait for the third
        assert _stored(st) == []
        w.submit(_tick(2))
        deadline = time.monotonic() + 10
        while _stored(st) != [1.0, 2.0, 3.0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stored(st) == [1.0, 2.0, 3.0]
        w.submit(_tick(3))
        assert w.flush(10)   # flush hands over a partial batch too
        assert _stored(st) == [1.0, 2.0, 3.0, 4.0]
    finally:
        w.close()


def test_close_writes_the_partial_batch(sqlite_url: str, tmp_path: Path) -> None:
    st, w = _writer(sqlite_url, tmp_path, 10)
    for i in range(4):
        w.submit(_tick(i))
    w.close()
    assert _stored(st) == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(("every", "interval", "n"), [(5.0, 1.0, 5), (0.0, 1.0, 1), (5.0, 10.0, 1), (5.0, 0.5, 10),
                                                       (2.0, 0.3, 7)])
def test_batch_size_from_the_options(every: float, interval: float, n: int) -> None:
    assert batch_ticks(every, interval) == n


def test_batch_of_zero_ticks_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    upgrade(sqlite_url)
    with pytest.raises(ValueError, match="batch_ticks"):
        StoreWriter(Store.open(sqlite_url), "n", Spool(tmp_path / "s", 1 << 20), batch_ticks=0)


def test_the_queue_is_bounded_in_samples_and_sheds_to_the_spool(sqlite_url: str, tmp_path: Path) -> None:
    """A store that cannot keep up (here: another connection holds SQLite's write lock) and ticks of
    very different sizes: the in-memory queue holds at most its cap of samples, the rest go to the
    on-disk spool (counted), and once the store answers every tick is stored once."""
    import sqlite3

    upgrade(sqlite_url)
    st = Store.open(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    lock = sqlite3.connect(path, timeout=0.1)
    lock.execute("BEGIN EXCLUSIVE")
    w = StoreWriter(st, "n", Spool(tmp_path / "spool", 64 << 20), batch_ticks=1, max_queued_samples=5_000)
    w.start()
    try:
        big = [Tick(T0 + i, [Sample("triscope_ticks_total", float(i + 1), kind="counter")]
                    + [Sample("triscope_wide", 1.0, {"k": str(j)}) for j in range(2_000)]) for i in range(10)]
        for t in big:
            w.submit(t)
        assert w._queued_samples <= 5_000 + 2_001           # at most one tick past the cap (the first one is always taken)
        assert w.spilled_ticks >= 6
    finally:
        lock.rollback()
        lock.close()
    assert w.flush(60)
    w.close()
    assert _stored(st) == [float(i + 1) for i in range(10)]
    st.close()


def test_ticks_appended_while_a_segment_is_written_back_are_kept(tmp_path: Path) -> None:
    """The drain reads a segment, writes it to the store, then removes it; a tick another thread
    spools in between (the agent's tick thread sheds to the spool while the writer drains it) must
    land in a new segment, not in the one about to be removed."""
    sp = Spool(tmp_path / "spool", 64 << 20)
    sp.append([_tick(0)])
    it = sp.segments()
    path, ticks = next(it)
    sp.append([_tick(1)])              # arrives while segment 1 is being written to the store
    sp.commit(path, ticks, replayed=True)
    left = [t for _, ts in sp.segments() for t in ts]
    assert [s.value for t in left for s in t.samples] == [2.0]
    assert sp.pending_samples == 1
