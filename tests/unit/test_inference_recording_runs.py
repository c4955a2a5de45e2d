"""The H200 recordings of the inference scenarios after the first, held to docs/inference-validation.md.

``examples/traces/h200-inference-N.jsonl.gz`` (N = 2..5) are runs of
``examples/inference/h200_record.sh`` (one H200, both service instances on it, full load 20
requests/s per instance), each with its timeline.  Run 2's inputs are replayed through the tracker
of its session (the run itself published verdicts before the shared-link naming rule); runs 3, 4
and 5 are as published.  Runs 4 and 5 (third session) run the services with one BLAS thread per
preprocessing worker; run 4 found the pageable fault read ``demand-limited`` once the host had CPUs
to spare (the host-copy evidence came from it), run 5 ran the fixed verdict.  Runs 2, 3 and 5 end
with the closed loop on the hardware: the engine, acting, wrote the faulty instance's knobs file and
the service switched to it.  These tests import each trace as a user would and score it with
``examples/inference/report.py``; run 4 is also replayed through this revision's tracker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from triscope.core.trace import import_trace, read_trace
from triscope.store import Store, audit

TRACES = REPO / "examples" / "traces"
ALL_FAULTS = ("pageable", "one_core", "pin_churn", "pcie_saturation", "net_drop")
RUNS = {
    # node: (least right windows of all, scenarios whose every window is right and names inference-b)
    "h200-inference-2": (22, ("pageable", "one_core", "pin_churn")),
    "h200-inference-3": (12, ("pageable", "pin_churn", "net_drop")),
    "h200-inference-5": (27, ALL_FAULTS),
}
DEMO = ("h200-inference-1", "h200-inference-2", "h200-inference-3", "h200-inference-4", "h200-inference-5",
        "h200-inference-6")


def _lines(node: str) -> list[dict[str, Any]]:
    path = TRACES / f"{node}.timeline.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    from examples.inference.report import build_report
    from triscope.commands.trace import import_decisions

    node = str(request.param)
    trace = TRACES / f"{node}.jsonl.gz"
    st = Store.open(f"sqlite:///{tmp_path_factory.mktemp('run') / 'rec.db'}")
    st.upgrade()
    tr = read_trace(trace)
    info = import_trace(st, trace, trace=tr)
    import_decisions(st, tr, info)
    yield node, st, build_report(st, node, _lines(node))
    st.close()


def _row(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in rep["scenarios"] if r["scenario"] == name)


def test_the_recordings_make_the_demo() -> None:
    """Six runs from three sessions, each its own node, together past 20 minutes; runs 4 and 5 at
    least 8 minutes each (run 6, the last of the session's device time, is shorter)."""
    total = 0.0
    for node in DEMO:
        tr = read_trace(TRACES / f"{node}.jsonl.gz")
        assert tr.header["node"] == node and (TRACES / f"{node}.jsonl.gz").stat().st_size < 3 * 1024 * 1024
        length = tr.header["end"] - tr.header["start"]
        total += length
        assert {ln["scenario"] for ln in _lines(node)} >= {"pageable"}
        if node in ("h200-inference-4", "h200-inference-5"):
            assert length >= 8 * 60, (node, length)
    assert total >= 20 * 60, total


def test_the_faults_are_found_and_pinned_on_the_faulty_instance(run: tuple[str, Any, dict[str, Any]]) -> None:
    node, _, rep = run
    least, exact = RUNS[node]
    assert rep["summary"]["right"] >= least, rep["summary"]
    for name in exact:
        r = _row(rep, name)
        assert r["windows"] >= 3 and r["right"] == r["windows"], (name, r["states"], r["io_named"])
        assert set(r["io_named"]) == {"cmd:inference-b"}, (name, r["io_named"])
    # every I/O verdict in a scenario where b carried a fault names b (or, on a shared link, no one)
    for r in rep["scenarios"]:
        if r["scenario"] in ("pageable", "one_core", "pin_churn", "pcie_saturation", "net_drop"):
            assert set(r["io_named"]) <= {"cmd:inference-b"}, (r["scenario"], r["io_named"])


def test_the_healthy_instance_is_never_named(run: tuple[str, Any, dict[str, Any]]) -> None:
    """Not in any window, not beside a copy hog (the SM share named it there before the shared-link
    rule), not in any root-cause episode."""
    _, _, rep = run
    assert rep["summary"]["pages_on_healthy"] == 0
    for r in rep["scenarios"]:
        assert "cmd:inference-a" not in r["io_named"], r["scenario"]
        assert all(e["workload"] != "cmd:inference-a" for e in r["episodes"]), r["scenario"]
    hog = _row(rep, "neighbour_copy")
    # the shared link names no one, or the hog once its copying thread clearly outworks the services'
    # (run 5: 1.00 of a core against 0.23-0.26; runs 2 and 3: 0.72-0.82 against 0.45-0.60)
    assert set(hog["states"]) == {"io-saturated"} and set(hog["io_named"]) <= {"", "cmd:python3"}
    assert set(_row(rep, "healthy_full")["io_named"]) <= {""}          # host-wide: no workload named


def test_the_loop_closed_on_the_hardware(run: tuple[str, Any, dict[str, Any]]) -> None:
    """The acting engine wrote inference-b's knobs file within 60 s of the fault; the service read it;
    inference-a was never acted on; run 3 (p99 measured after the backlog drained) is back within 20 %."""
    node, st, rep = run
    loop = rep["loop"]
    assert loop["action"] == "dependency_fallback" and loop["target"].endswith("/inference-b.yaml")
    assert loop["onset_to_action_s"] <= 60 and loop["onset_to_service_s"] <= 60
    assert loop["healthy_acted_on"] == 0 and loop["healthy_knobs_file"] is False
    p99 = loop["p99_ms"]
    assert p99["during"] > 2 * p99["before"]                           # the fault hurt
    if "draining" in p99:
        assert loop["after_within_20pct"] is True and p99["after"] <= 1.2 * p99["before"]
    rows = audit.audit_log(st, since=0, limit=1000)
    acted = [r for r in rows if r.outcome == "acted"]
    assert len(acted) == 1 and acted[0].target_key.endswith("inference-b.yaml")
    assert not any("inference-a" in (r.target_key or "") or "python3" in (r.target_key or "") for r in rows)


def test_pin_churn_maps_counted_exactly_bytes_only_estimated(run: tuple[str, Any, dict[str, Any]]) -> None:
    """Maps are counted exactly; bytes past the tracepoint's 128 entry lengths are an estimate that
    missed both ways on the H200 (1.62-1.64x in runs 2 and 3, 0.48x in run 5: docs)."""
    dma = _row(run[2], "pin_churn")["dma"]
    assert dma["registrations"] > 500 and abs(dma["maps"] - dma["registrations"]) <= 0.01 * dma["registrations"]
    assert 0.3 <= dma["mapped_over_pinned"] <= 2.1
    assert (dma["mapped_over_pinned"] < 0.7) == (run[0] == "h200-inference-5")


def test_recording_paths_are_not_this_machines(tmp_path: Path) -> None:
    for node in DEMO:
        text = (TRACES / f"{node}.timeline.jsonl").read_text()
        assert "/work/" not in text and "/root/" not in text


def test_the_host_evidence_the_docs_quote(run: tuple[str, Any, dict[str, Any]]) -> None:
    """docs/inference-validation.md's figures, from the report's per-scenario host evidence.  Runs 2
    and 3 (BLAS pools as wide as the host): at full load both services wait for a CPU alike, 2 GiB
    uploads at 20/s fill two thirds of the link.  Run 5 (one BLAS thread per worker): full load costs
    each service under a core and no CPU wait, 4 GiB uploads fill the link, pageable copies keep the
    faulty service above a core with no thread pegged.  The copy hog fills both directions in all."""
    node, _, rep = run
    full = _row(rep, "healthy_full")["host"]
    services = [full["workloads"][w] for w in ("cmd:inference-a", "cmd:inference-b")]
    up = _row(rep, "pcie_saturation")["host"]["pcie_rx_gbps"]
    if node == "h200-inference-5":
        assert all(w["cores"] <= 1.0 and (w["cpu_wait"] or 0.0) <= 0.05 for w in services), full
        assert up >= 52, up
        pg = _row(rep, "pageable")["host"]["workloads"]["cmd:inference-b"]
        assert pg["cores"] >= 1.2 and pg["busiest_thread"] < 0.6, pg
    else:
        assert all(0.3 <= w["cpu_wait"] <= 0.45 and w["cores"] >= 5 for w in services) and full["sm_active"] <= 0.15
        assert 35 <= up <= 44, up
    hog = _row(rep, "neighbour_copy")["host"]
    assert hog["pcie_rx_gbps"] >= 44 and hog["pcie_tx_gbps"] >= 47, hog


def test_run_4_missed_pageable_copies_and_this_revision_finds_them(tmp_path: Path) -> None:
    """Run 4 published ``demand-limited`` for b's pageable copies (no thread pegged, no CPU wait once
    the host had cores to spare) and its loop never acted; replayed through this revision's tracker,
    the pageable ones are ``staging-bound`` on inference-b."""
    from examples.inference.replay import replay
    from examples.inference.report import build_report
    from triscope.commands.trace import import_decisions

    node = "h200-inference-4"
    trace = TRACES / f"{node}.jsonl.gz"
    src = f"sqlite:///{tmp_path / 'rec.db'}"
    st = Store.open(src)
    st.upgrade()
    tr = read_trace(trace)
    import_decisions(st, tr, import_trace(st, trace, trace=tr))
    recorded = build_report(st, node, _lines(node))
    st.close()
    assert recorded["summary"]["right"] == 24 and recorded["summary"]["windows"] == 27
    assert _row(recorded, "pageable")["states"] == {"demand-limited": 3}
    assert recorded["loop"] is None                                   # the engine never acted
    out = f"sqlite:///{tmp_path / 'replayed.db'}"
    replay(src, node, out)
    st = Store.open(out)
    try:
        rep = build_report(st, node, _lines(node), audit=[])
    finally:
        st.close()
    # every window's state right; the net_drop ones name no workload now: the recording has the
    # node's retransmits only (no per-workload TCP series), and whose they were is not known
    assert rep["summary"]["right"] == 24 and rep["summary"]["pages_on_healthy"] == 0, rep["summary"]
    for name in ALL_FAULTS:
        assert set(_row(rep, name)["io_named"]) == ({""} if name == "net_drop" else {"cmd:inference-b"}), name
    assert _row(rep, "net_drop")["states"] == {"network-bound": 3}
    assert _row(rep, "pageable")["states"] == {"staging-bound": 3}


def test_run_6_the_final_revision_on_the_hardware(tmp_path: Path) -> None:
    """Run 6 ran this revision's final verdict (after the review of the host-copy rule): every window
    right, none naming the healthy instance, and the acting engine wrote inference-b's knobs file
    36.3 s after the loop's fault (the run hit its time limit before the loop's p99 was measured, so
    its timeline has no loop line; the decision is in the trace)."""
    from examples.inference.report import build_report
    from triscope.commands.trace import import_decisions

    node = "h200-inference-6"
    trace = TRACES / f"{node}.jsonl.gz"
    st = Store.open(f"sqlite:///{tmp_path / 'rec.db'}")
    st.upgrade()
    try:
        tr = read_trace(trace)
        import_decisions(st, tr, import_trace(st, trace, trace=tr))
        rep = build_report(st, node, _lines(node))
        rows = audit.audit_log(st, since=0, limit=1000)
    finally:
        st.close()
    assert rep["summary"]["windows"] == 24 and rep["summary"]["right"] == 24 and rep["summary"]["pages_on_healthy"] == 0
    for name in ALL_FAULTS:
        assert set(_row(rep, name)["io_named"]) == {"cmd:inference-b"}, name
    for r in rep["scenarios"]:
        assert all(e["workload"] != "cmd:inference-a" for e in r["episodes"]), r["scenario"]
    acted = [r for r in rows if r.outcome == "acted"]
    assert len(acted) == 1 and acted[0].target_key.endswith("inference-b.yaml")
    assert not any("inference-a" in (r.target_key or "") for r in rows)
    last = max(ln["end"] for ln in _lines(node))      # the loop began after the last scenario
    assert 0 < acted[0].ts - last < 120
