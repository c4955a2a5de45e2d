"""Store benchmarks: ingest rate (SQLite, PostgreSQL) and downsampled range queries.

Baseline measured in the same run: a naive row-by-row ORM insert (one ``session.add`` per
sample into a one-row-per-sample table, one commit per tick), the way a first version of such a
store is usually written.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Float, Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from bench.common import Row
from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import upgrade

SERIES = 200


def _ticks(t0: float, n: int, series: int = SERIES) -> list[Tick]:
    return [Tick(t0 + i, [Sample(f"m{j % 20}", float(i * j % 97), {"dev": str(j)}) for j in range(series)])
            for i in range(n)]


def _ingest(st: Store, ticks: list[Tick], batch: int, nodes: int = 1) -> float:
    t = time.perf_counter()
    n = 0
    for i in range(0, len(ticks), batch):
        for k in range(nodes):
            n += st.write_ticks(f"node-{k}", ticks[i:i + batch])
    return n / (time.perf_counter() - t)


class _NaiveBase(DeclarativeBase):
    pass


class _NaiveSample(_NaiveBase):
    """The baseline's table: one row per sample, primary key (series_id, ts)."""

    __tablename__ = "bench_naive_samples"

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


def _naive(url: str, ticks: list[Tick]) -> float:
    """The naive way: an ORM object per sample into a one-row-per-sample table, a commit per tick."""
    from sqlalchemy.orm import Session

    st = Store.open(url)
    st.write_ticks("naive", ticks[:1])  # create series ids
    ids = {(s.metric, tuple(sorted(s.labels.items()))): s.id for s in st.series(node="naive")}
    _NaiveBase.metadata.create_all(st.engine)
    try:
        t = time.perf_counter()
        n = 0
        with Session(st.engine) as session:
            for tk in ticks[1:]:
                for s in tk.samples:
                    session.add(_NaiveSample(series_id=ids[(s.name, tuple(sorted(s.labels.items())))], ts=tk.ts,
                                             value=s.value))
                    n += 1
                session.commit()
        return n / (time.perf_counter() - t)
    finally:
        _NaiveBase.metadata.drop_all(st.engine)
        st.close()


def _writer_proc(url: str, node: str, t0: float, n_ticks: int, go, out) -> None:  # type: ignore[no-untyped-def]
    st = Store.open(url)
    ticks = _ticks(t0, n_ticks + 1)
    st.write_ticks(node, ticks[:1])  # ids and caches warm, like an agent after its first tick
    go.wait()
    t = time.perf_counter()
    n = sum(st.write_ticks(node, [tk]) for tk in ticks[1:])
    out.put((n, t, time.perf_counter()))
    st.close()


def _concurrent(url: str, writers: int, n_ticks: int, t0: float) -> float:
    """Several agents at once, each writing its own node's ticks one per transaction (a fleet's shape)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer_proc, args=(url, f"agent-{i}", t0, n_ticks, go, out)) for i in range(writers)]
    for p in procs:
        p.start()
    time.sleep(2.0)
    go.set()
    res = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    total = sum(r[0] for r in res)
    return total / (max(r[2] for r in res) - min(r[1] for r in res))


def _query_bench(st: Store, node: str, start: float, end: float, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        res = st.query("q", node=node, start=start, end=end, max_points=2000)
        times.append(time.perf_counter() - t)
        assert res and len(res[0].ts) <= 2000
    return statistics.median(times) * 1000


RECORDED = Path(__file__).resolve().parents[1] / "examples" / "hostlab" / "traces" / "h200-lab-17.jsonl.gz"


def _recorded_batches(path: Path, offset: float) -> list[list[Tick]]:
    """A recorded agent's ticks (its samples and, in the tick nearest each, its events) in the agent's
    batches of five (``--write-every 5``)."""
    from triscope.core.samples import EventRecord
    from triscope.core.trace import iter_ticks, read_trace

    rec = read_trace(path)
    ticks = list(iter_ticks(rec, offset))
    times = [t.ts for t in ticks]
    events: dict[int, list[EventRecord]] = {}
    for e in rec.events:
        at = float(e["ts"]) + offset
        i = min(range(len(times)), key=lambda k: abs(times[k] - at))
        events.setdefault(i, []).append(EventRecord(str(e["kind"]), str(e.get("message", "")),
                                                    e.get("severity", "info"), dict(e.get("details") or {})))
    ticks = [Tick(t.ts, t.samples, tuple(events.get(i, ()))) for i, t in enumerate(ticks)]
    return [ticks[i:i + 5] for i in range(0, len(ticks), 5)]


def _recorded_cost(d: str, tag: str, steady_all: bool) -> tuple[float, float]:
    """(CPU us a sample, share of batches on the general path) writing the recorded agent's batches
    into a fresh SQLite store, its steady state taking events and new series (``steady_all``) or
    sending those batches down the general path (the store before)."""
    url = f"sqlite:///{Path(d) / f'rec-{tag}.db'}"
    upgrade(url)
    st = Store.open(url)
    w = st.writer
    w.steady_events = w.steady_new_series = steady_all
    general = [0]
    real = w.write_general

    def counted(*a: object, **k: object) -> int:
        general[0] += 1
        return real(*a, **k)  # type: ignore[arg-type]

    w.write_general = counted  # type: ignore[method-assign]
    batches = _recorded_batches(RECORDED, time.time() - 3600.0)
    st.write_ticks("rec", batches[0])
    general[0] = 0
    n = sum(len(t.samples) for b in batches[1:] for t in b)
    t0 = time.thread_time()
    for b in batches[1:]:
        st.write_ticks("rec", b)
    cpu = time.thread_time() - t0
    st.close()
    return cpu * 1e6 / n, general[0] / (len(batches) - 1)


def recorded_agent(d: str, rounds: int = 3) -> list[Row]:
    """The store's write of a recorded agent's batches on the GPU machine (h200-lab-17: wait-for
    series appearing as causes and culprits change, state-change events), alternated with the
    general path for batches with events or new series, as the store took them before."""
    if not RECORDED.exists():
        return [Row("ingest sqlite recorded", "needs examples/hostlab/traces/h200-lab-17.jsonl.gz", float("nan"), "")]
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for r in range(rounds):
        for steady_all in (False, True):
            got[steady_all].append(_recorded_cost(d, f"{r}{int(steady_all)}", steady_all))
    on = [g[0] for g in got[True]]
    off = [g[0] for g in got[False]]
    share_on, share_off = got[True][0][1], got[False][0][1]
    return [Row("ingest sqlite recorded", "CPU us a sample, h200-lab-17's batches of 5 "
                f"ticks replayed (events and new series on the steady path; {share_on:.0%} of batches on the general "
                f"path; median of {rounds} alternating, min {min(on):.2f}, max {max(on):.2f})",
                round(statistics.median(on), 2), "us/sample", "",
                f"the same batches, those with events or new series on the general path ({share_off:.0%} of them; "
                f"min {min(off):.2f}, max {max(off):.2f})", round(statistics.median(off), 2), None)]


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    n_ticks = 60 if quick else 300
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'b.db'}"
        upgrade(url)
        st = Store.open(url)
        t0 = 1_800_000_000.0
        ticks = _ticks(t0, n_ticks)
        agent_rate = _ingest(st, ticks, batch=1)
        naive = _naive(url, _ticks(t0 + 10_000, 20 if quick else 60))
        rows.append(Row("ingest sqlite", "samples/s, one tick (200 series) per transaction", agent_rate, "samples/s",
                        ">= 100000", "naive ORM row-by-row", naive, agent_rate >= 100_000))
        # queries: one series, 24 h at 1 Hz, and 30 days through the rollups
        day = 86_400
        qt0 = 1_700_000_000.0 - 30 * day
        qticks = [Tick(qt0 + i, [Sample("q", math.sin(i / 300) + (5 if i % 10_007 == 0 else 0))])
                  for i in range(30 * day if not quick else 3 * day)]
        for i in range(0, len(qticks), 20_000):
            st.write_ticks("qnode", qticks[i:i + 20_000])
        end = qticks[-1].ts
        q24 = _query_bench(st, "qnode", end - day, end, 5 if quick else 20)
        rows.append(Row("query sqlite 24h", "1 series, 86,400 points -> <= 2,000 (median)", q24, "ms", "<= 100", "", None, q24 <= 100))
        if not quick:
            q30 = _query_bench(st, "qnode", end - 30 * day, end, 20)
            rows.append(Row("query sqlite 30d", "1 series, 30 days via rollups -> <= 2,000 (median)", q30, "ms", "<= 200", "", None, q30 <= 200))
        st.close()
    # PostgreSQL, the real server started like the tests start it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import PostgresServer  # type: ignore[import-not-found]

    srv = PostgresServer()
    try:
        url = srv.create_database("bench")
        upgrade(url)
        st = Store.open(url)
        ticks = _ticks(1_800_000_000.0, n_ticks)
        one = _ingest(st, ticks, batch=1)
        st2 = Store.open(url)
        many = _ingest(st2, _ticks(1_800_100_000.0, n_ticks), batch=n_ticks // 2 if quick else 50, nodes=4)
        naive = _naive(url, _ticks(1_800_200_000.0, 20 if quick else 60))
        conc = _concurrent(url, 4, n_ticks, 1_800_300_000.0)
        # the target is a fleet's (1,000 agents writing at once): the concurrent row carries it; one
        # agent writing alone, one round trip after another, is shown for what it is
        rows.append(Row("ingest postgresql", "samples/s, 4 agents at once, one tick per transaction each", conc,
                        "samples/s", ">= 200000", "naive ORM row-by-row", naive, conc >= 200_000))
        rows.append(Row("ingest postgresql", "samples/s, one agent alone, one tick per transaction (not the fleet's "
                        "shape: one connection, sequential)", one, "samples/s", "", "naive ORM row-by-row", naive))
        rows.append(Row("ingest postgresql", "samples/s, 50 ticks per transaction (spool drain / gateway)", many,
                        "samples/s", ">= 200000", "naive ORM row-by-row", naive, many >= 200_000))
        st.close()
        st2.close()
    finally:
        srv.destroy()
    # last, in a folder of its own: its stores and the trace it decodes stay out of the rows above
    with tempfile.TemporaryDirectory() as d:
        rows += recorded_agent(d, 1 if quick else 3)
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
