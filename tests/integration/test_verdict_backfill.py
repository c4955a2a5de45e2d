"""Revision 0008: the verdict history backfilled from the stored verdict gauges for data written
before the history existed, on SQLite and the real PostgreSQL.  A store's runs are deleted and its
schema taken back to 0007 (as a store written before the history looks); the upgrade must give the
runs the writer gave, from the raw points, from the rollups where retention removed them, only
before a node's first recorded run, and never for a node imported from a recording."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import alembic_config, upgrade

T = 1_800_000_000.0          # a minute boundary
STATES = ("idle", "demand-limited", "staging-bound", "network-bound")
Run = tuple[str, str, tuple[str, str, str, str], str, float, float, int, float, float]


def tick(ts: float, per_gpu: dict[str, tuple[str, str]], node_state: str | None = None) -> Tick:
    """One tick as the tracker publishes it: per GPU (state, workload), each state 1 or 0, a score."""
    out: list[Sample] = []
    for gpu, (state, wl) in per_gpu.items():
        lab = {"gpu": gpu, "namespace": "ns", "pod": f"pod-{wl}", "container": "c", "workload": wl}
        out += [Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, **lab}) for s in STATES]
        out.append(Sample("triscope_mismatch_score", 0.5 + (ts - T) % 7 / 20 if state == "staging-bound" else 0.0,
                          lab))
    if node_state is not None:
        out += [Sample("triscope_mismatch_state", 1.0 if s == node_state else 0.0, {"state": s}) for s in STATES]
        out.append(Sample("triscope_mismatch_score", 0.7 if node_state == "staging-bound" else 0.0, {}))
    out.append(Sample("triscope_cpu_busy_ratio", 0.1))
    return Tick(ts, out)


def history(st: Store, node: str) -> list[Run]:
    return [(r.node, r.accelerator, r.workload, r.state, r.start, r.end, r.ticks, round(r.score_mean, 9),
             round(r.score_max, 9)) for r in st.verdict_runs(node, 0, 4e9)]


def before_the_history(url: str, keep_from: float | None = None) -> None:
    """The store as one written before revision 0007 recorded runs (all of them, or those starting
    before ``keep_from``: a store upgraded to 0007 at that time), its schema back at 0007."""
    command.downgrade(alembic_config(url), "0007")
    st = Store.open(url)
    try:
        with st.engine.begin() as c:
            c.execute(text("DELETE FROM verdict_runs WHERE start_ts < :k"), {"k": 4e9 if keep_from is None else keep_from})
    finally:
        st.close()


def write(url: str, node: str, ticks: list[Tick], labels: dict[str, str] | None = None) -> None:
    st = Store.open(url)
    try:
        st.write_ticks(node, ticks)
        if labels:
            st.set_node_labels(node, labels)
    finally:
        st.close()


def runs_of(url: str, node: str) -> list[Run]:
    st = Store.open(url)
    try:
        return history(st, node)
    finally:
        st.close()


def scenario() -> list[Tick]:
    """GPU 0: idle, staging-bound (workload a, then b), a 60 s silence, idle again; GPU 1 demand-limited
    throughout; the node's roll-up."""
    out = [tick(T + i, {"0": ("idle", "a"), "1": ("demand-limited", "z")}, "demand-limited") for i in range(20)]
    out += [tick(T + 20 + i, {"0": ("staging-bound", "a"), "1": ("demand-limited", "z")}, "staging-bound")
            for i in range(15)]
    out += [tick(T + 35 + i, {"0": ("staging-bound", "b"), "1": ("demand-limited", "z")}, "staging-bound")
            for i in range(10)]
    out += [tick(T + 105 + i, {"0": ("idle", "b"), "1": ("demand-limited", "z")}, "demand-limited") for i in range(10)]
    return out


def test_the_backfill_gives_the_runs_the_writer_gave(db_url: str) -> None:
    upgrade(db_url)
    write(db_url, "live", scenario())
    write(db_url, "old", scenario())
    live, old = runs_of(db_url, "live"), runs_of(db_url, "old")
    assert len(live) == 9 and [r[1:] for r in live] == [r[1:] for r in old]
    before_the_history(db_url)
    assert runs_of(db_url, "old") == [] and runs_of(db_url, "live") == []
    upgrade(db_url)
    assert runs_of(db_url, "old") == old
    assert runs_of(db_url, "live") == live
    upgrade(db_url)                                   # at head: nothing runs twice
    assert runs_of(db_url, "old") == old


def test_only_the_data_before_the_first_run_and_never_a_recording(db_url: str) -> None:
    upgrade(db_url)
    write(db_url, "n", scenario())
    write(db_url, "rec", scenario(), {"triscope.recording": "h200.trace"})
    want = runs_of(db_url, "n")
    before_the_history(db_url, keep_from=T + 105)      # runs from the upgrade to 0007 on are kept
    kept, rec = runs_of(db_url, "n"), runs_of(db_url, "rec")
    assert 0 < len(kept) < len(want) and len(rec) == len(kept)
    upgrade(db_url)
    assert runs_of(db_url, "n") == want
    assert runs_of(db_url, "rec") == rec             # a recording: today's classifier when imported again


def test_where_retention_removed_the_raw_points_the_minute_rollups_give_the_runs(db_url: str) -> None:
    """Five minutes staging-bound, five idle (one bad minute of 20 s network-bound inside), then the raw
    points of the first eight minutes removed: those come back as one run per state from the 1-minute
    buckets (the state with the largest share of each), the rest from the raw points."""
    upgrade(db_url)
    ticks = []
    for i in range(660):
        state = "staging-bound" if i < 300 else "network-bound" if 400 <= i < 420 else "idle"
        ticks.append(tick(T + i, {"0": (state, "a")}))
    write(db_url, "n", ticks)
    st = Store.open(db_url)
    try:
        st.rollup_all()
        table = "sample_rows" if st.dialect == "postgresql" else "samples"
        with st.engine.begin() as c:
            c.execute(text(f"DELETE FROM {table} WHERE ts < :c"), {"c": T + 480})
    finally:
        st.close()
    before_the_history(db_url)
    upgrade(db_url)
    got = [(r[3], r[4], r[5], r[6]) for r in runs_of(db_url, "n")]
    assert got == [("staging-bound", T + 30, T + 270, 5), ("idle", T + 330, T + 450, 3),
                   ("idle", T + 480, T + 659, 180)]
    minute = runs_of(db_url, "n")[0]
    assert 0.5 <= minute[7] <= 0.8 and minute[8] <= 0.8          # the buckets' mean scores
