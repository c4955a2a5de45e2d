"""The verdict history (store/verdicts.py): every accelerator's published state as runs, written as
ticks are written, on SQLite and the real PostgreSQL; the same runs whatever writes them (a second
store object, a replayed spool, a late tick)."""

from __future__ import annotations

from triscope.core.samples import Sample, Tick
from triscope.store import Store

T = 1_800_000_000.0
STATES = ("idle", "demand-limited", "staging-bound", "network-bound")


def tick(ts: float, per_gpu: dict[str, tuple[str, str]], node_state: str | None = None) -> Tick:
    """One tick as the tracker publishes it: per GPU (state, workload), each state 1 or 0, a score."""
    out: list[Sample] = []
    for gpu, (state, wl) in per_gpu.items():
        lab = {"gpu": gpu, "namespace": "ns", "pod": f"pod-{wl}", "container": "c", "workload": wl}
        out += [Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, **lab}) for s in STATES]
        out.append(Sample("triscope_mismatch_score", 0.9 if state == "staging-bound" else 0.0, lab))
    if node_state is not None:
        out += [Sample("triscope_mismatch_state", 1.0 if s == node_state else 0.0, {"state": s}) for s in STATES]
    out.append(Sample("triscope_cpu_busy_ratio", 0.1))
    return Tick(ts, out)


def runs(st: Store, node: str = "n") -> list[tuple[str, str, str, float, float, int]]:
    return [(r.accelerator, r.state, r.workload[3], r.start, r.end, r.ticks) for r in st.verdict_runs(node, 0, 2e9)]


def test_runs_are_written_as_ticks_are_and_read_whole(db_url: str) -> None:
    st = Store.open(db_url)
    st.upgrade()
    try:
        st.write_ticks("n", [tick(T + i, {"0": ("idle", "a"), "1": ("idle", "b")}, "idle") for i in range(5)])
        # the open run is readable before it closes
        assert ("gpu=0", "idle", "a", T, T + 4, 5) in runs(st)
        st.write_ticks("n", [tick(T + 5 + i, {"0": ("staging-bound", "a"), "1": ("idle", "b")}, "staging-bound")
                             for i in range(5)])
        st.write_ticks("n", [tick(T + 10 + i, {"0": ("idle", "a"), "1": ("idle", "b")}, "idle") for i in range(3)])
        got = runs(st)
        assert [r for r in got if r[0] == "gpu=0"] == [("gpu=0", "idle", "a", T, T + 4, 5),
                                                       ("gpu=0", "staging-bound", "a", T + 5, T + 9, 5),
                                                       ("gpu=0", "idle", "a", T + 10, T + 12, 3)]
        assert [r for r in got if r[0] == "gpu=1"] == [("gpu=1", "idle", "b", T, T + 12, 13)]
        assert [r[1] for r in got if r[0] == ""] == ["idle", "staging-bound", "idle"]       # the node's roll-up
        # a window inside a run reads the whole run
        inside = st.verdict_runs("n", T + 6, T + 7)
        assert {(r.accelerator, r.state, r.start, r.end) for r in inside} >= {("gpu=0", "staging-bound", T + 5, T + 9)}
        bad = next(r for r in inside if r.state == "staging-bound" and r.accelerator == "gpu=0")
        assert bad.score_mean == 0.9 and bad.score_max == 0.9
    finally:
        st.close()


def test_a_replay_a_restart_and_a_late_tick_change_nothing_they_should_not(db_url: str) -> None:
    st = Store.open(db_url)
    st.upgrade()
    try:
        first = [tick(T + i, {"0": ("staging-bound", "a")}) for i in range(5)]
        st.write_ticks("n", first)
        st.write_ticks("n", first)                        # a replayed spool: nothing doubles
        assert runs(st) == [("gpu=0", "staging-bound", "a", T, T + 4, 5)]
    finally:
        st.close()
    again = Store.open(db_url)                            # a new agent: it goes on with the run it finds
    try:
        again.write_ticks("n", [tick(T + 5 + i, {"0": ("staging-bound", "a")}) for i in range(3)])
        assert runs(again) == [("gpu=0", "staging-bound", "a", T, T + 7, 8)]
        # after 60 s of silence the same state is a new run
        again.write_ticks("n", [tick(T + 70, {"0": ("staging-bound", "a")})])
        assert len(runs(again)) == 2
        # a late tick (a spool written back after newer ticks) joins the run it touches
        again.write_ticks("n", [tick(T - 1, {"0": ("staging-bound", "a")})])
        assert runs(again)[0] == ("gpu=0", "staging-bound", "a", T - 1, T + 7, 9)
        # and one of another state where nothing covers it starts its own
        again.write_ticks("n", [tick(T + 40, {"0": ("idle", "a")})])
        assert ("gpu=0", "idle", "a", T + 40, T + 40, 1) in runs(again)
    finally:
        again.close()


def test_a_node_without_verdicts_has_no_history(db_url: str) -> None:
    st = Store.open(db_url)
    st.upgrade()
    try:
        st.write_ticks("quiet", [Tick(T + i, [Sample("triscope_cpu_busy_ratio", 0.1)]) for i in range(3)])
        assert st.verdict_runs("quiet", 0, 2e9) == []
    finally:
        st.close()
