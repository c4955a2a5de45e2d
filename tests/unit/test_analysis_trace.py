"""Acceptance on the trace recorded on the H200 (examples/traces/h200-phases.jsonl.gz, written by
examples/workload/h200_record.sh and loaded with 'triscope import-trace'): the mismatch state per
labelled phase, the pin-churn flag, and the RCA ranking for the pageable and pin-churn phases.

These tests run whenever the trace file is in the tree (it is committed with the GPU work)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triscope.analysis.mismatch import sliding_states, state_fractions
from triscope.analysis.online import MismatchTracker
from triscope.analysis.rca.ranked import rank_causes
from triscope.store import Store

REPO = Path(__file__).resolve().parents[2]
TRACES = sorted((REPO / "examples" / "traces").glob("h200-phases.*"))
TRACE = next((p for p in TRACES if p.name.endswith(".jsonl.gz")), TRACES[0] if TRACES else None)
if os.environ.get("TRISCOPE_H200_TRACE"):  # check another recording (or a synthetic one) the same way
    TRACE = Path(os.environ["TRISCOPE_H200_TRACE"])



def test_the_recorded_trace_is_in_the_tree() -> None:
    """The acceptance tests below run on the committed H200 recording; it must be there."""
    assert TRACE is not None and TRACE.exists(), "examples/traces/h200-phases.* is missing"

EXPECTED = {
    "idle": "idle",
    "idle_end": "idle",
    "pinned_h2d": "io-saturated",
    "pinned_d2h": "io-saturated",
    "pageable_h2d": "staging-bound",
    "compute_bf16": "compute-bound",
}
TRIM_START = 2.0  # the first tick inside a phase still averages the second before it
TRIM_END = 1.0


@pytest.fixture(scope="module")
def trace_store(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from triscope.core.trace import import_trace, phase_spans

    url = f"sqlite:///{tmp_path_factory.mktemp('trace') / 'h200.db'}"
    st = Store.open(url)
    st.upgrade()
    info = import_trace(st, TRACE)
    spans = phase_spans(st.events(node=info.node, kinds=["phase"]))
    assert spans, "the trace carries no phase events"
    yield st, info.node, spans
    st.close()


def test_each_phase_gets_its_expected_state(trace_store) -> None:  # type: ignore[no-untyped-def]
    st, node, spans = trace_store
    assert set(EXPECTED) <= set(spans), f"phases in the trace: {sorted(spans)}"
    report = {}
    for phase, exp in EXPECTED.items():
        a, b = spans[phase]
        ws = sliding_states(st, node, a + TRIM_START, b - TRIM_END)
        assert ws, phase
        frac = state_fractions(ws)
        report[phase] = frac
        assert frac.get(exp, 0.0) >= 0.9, (phase, exp, frac, ws[0].evidence)


def test_pin_churn_phase_is_flagged(trace_store) -> None:  # type: ignore[no-untyped-def]
    st, node, spans = trace_store
    a, b = spans["pin_churn"]
    ws = sliding_states(st, node, a + TRIM_START, b - TRIM_END)
    assert ws
    flagged = sum(w.pin_churn for w in ws) / len(ws)
    assert flagged >= 0.9, [w.evidence.get("dma_map_rate") for w in ws]
    # and no other phase is
    for phase in ("compute_bf16", "pinned_h2d", "idle"):
        a, b = spans[phase]
        assert not any(w.pin_churn for w in sliding_states(st, node, a + TRIM_START, b - TRIM_END)), phase


def test_online_tracker_replaying_the_trace(trace_store) -> None:  # type: ignore[no-untyped-def]
    from triscope.core.trace import iter_ticks, read_trace

    st, node, spans = trace_store
    tr = MismatchTracker()
    states: dict[str, list[str]] = {p: [] for p in EXPECTED}
    for tick in iter_ticks(read_trace(TRACE), 0.0):
        tr.process(tick.ts, list(tick.samples))
        for phase in EXPECTED:
            a, b = spans[phase]
            if a + TRIM_START + tr.th.window_s <= tick.ts <= b - TRIM_END and tr.state is not None:
                states[phase].append(tr.state)
    for phase, exp in EXPECTED.items():
        got = states[phase]
        assert got, phase
        assert got.count(exp) / len(got) >= 0.9, (phase, exp, {s: got.count(s) for s in set(got)})


def test_rca_on_the_trace(trace_store) -> None:  # type: ignore[no-untyped-def]
    st, node, spans = trace_store
    a, b = spans["pageable_h2d"]
    res = rank_causes(st, node, a, b)
    keys = [c.key for c in res.causes]
    assert "host_staging" in keys, [(c.key, round(c.score, 2)) for c in res.causes]
    for k in ("network", "network_traffic"):
        if k in keys:
            assert keys.index("host_staging") < keys.index(k)
    a, b = spans["pin_churn"]
    res = rank_causes(st, node, a, b)
    assert res.causes and res.causes[0].key == "dma_mapping", [(c.key, round(c.score, 2), c.summary)
                                                                for c in res.causes]


def test_per_accelerator_states_on_the_trace(trace_store) -> None:  # type: ignore[no-untyped-def]
    """The recording has one GPU and no per-workload series (an older agent): one state per
    window for ``gpu=0`` with empty workload labels, the node's roll-up the same; the pageable
    phase is staging-bound on the link's share alone (above ``staging_link_floor``), the idle
    phases are idle, never demand-limited."""
    from triscope.analysis.config import MismatchThresholds
    from triscope.analysis.mismatch import accelerator_states, node_states

    st, node, spans = trace_store
    th = MismatchThresholds()
    for phase, exp in EXPECTED.items():
        a, b = spans[phase]
        per = accelerator_states(st, node, a + TRIM_START, b - TRIM_END, thresholds=th)
        roll = node_states(st, node, a + TRIM_START, b - TRIM_END, thresholds=th)
        assert per and [p.accelerator for p in per] == ["gpu=0"] * len(roll)
        assert [p.state for p in per] == [w.state for w in roll] and {p.state for p in per} == {exp}, phase
        assert all(p.workload == {"namespace": "", "pod": "", "container": "", "workload": ""} for p in per)
        if phase == "pageable_h2d":
            for p in per:
                assert th.staging_link_floor <= p.evidence["link_util_median"] < th.io_saturated_link
                assert any("copies staged by the host" in r for r in p.evidence["reasons"]), p.evidence["reasons"]
