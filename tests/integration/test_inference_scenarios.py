"""The scenario runner, end to end with the CPU stand-in (``--short``): two real service processes, knobs
set through their admin endpoints, load driven, and a timeline with the expected states written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("PIL", reason="Pillow is in the test extras (pip install -e '.[test]')")
from examples.inference.scenarios import MIN_HOLD_S, SCENARIOS  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO))
STATES = {"idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound"}
CAUSES = {"pcie_load", "host_staging", "dma_mapping", "network", "accelerator_activity"}


def test_table_covers_the_issue_and_uses_known_states_and_causes():
    by = {s.name: s for s in SCENARIOS}
    assert by["pageable"].fault == {"pinned": False, "upload_mib": 512}
    assert (by["pageable"].expect_b.states, by["pageable"].expect_b.cause) == (("staging-bound",), "host_staging")
    assert by["one_core"].fault["workers"] == 2 and by["one_core"].fault["cpu_affinity"] == [0]
    assert (by["one_core"].expect_b.states, by["one_core"].expect_b.cause) == (("staging-bound",), "host_staging")
    assert by["pin_churn"].expect_b.cause == "dma_mapping"
    assert (by["pcie_saturation"].expect_b.states, by["pcie_saturation"].expect_b.cause) == \
        (("io-saturated",), "pcie_load")
    assert (by["net_drop"].expect_b.states, by["net_drop"].expect_b.cause) == (("network-bound",), "network")
    assert set(by["healthy_low"].expect_b.states) == {"demand-limited", "idle"} and not by["healthy_low"].expect_b.page
    assert set(by["healthy_full"].expect_b.states) == {"compute-bound", "balanced", "demand-limited"}  # never an I/O state
    assert not by["healthy_full"].expect_b.page
    for s in SCENARIOS:
        for e in (s.expect_a, s.expect_b, *s.neighbour.values()):
            assert set(e.states) <= STATES and (e.cause is None or e.cause in CAUSES)
            assert e.page == (e.cause in {"pcie_load", "host_staging", "dma_mapping", "network"} and
                              s.name not in ("neighbour_copy", "neighbour_compute"))
        assert s.load_a in ("light", "full", "heavy") and s.load_b in ("light", "full", "heavy")
        if s.name.startswith("neighbour"):
            assert set(s.neighbour) == {"one", "two"}


@pytest.mark.slow
def test_short_run_writes_the_timeline(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    only = ["healthy_low", "one_core", "pin_churn", "net_drop", "neighbour_copy"]
    env = {k: v for k, v in ENV.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    p = subprocess.run([sys.executable, "-m", "examples.inference.scenarios", "--short", "--timeline", str(timeline),
                        "--only", ",".join(only), "--server-arg=--net-tool=off"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"scenarios": 5, "lines": 11, "timeline": str(timeline)}
    lines = [json.loads(x) for x in timeline.read_text().splitlines()]
    assert [(ln["scenario"], ln["instance"]) for ln in lines] == [
        ("healthy_low", "a"), ("healthy_low", "b"), ("one_core", "a"), ("one_core", "b"),
        ("pin_churn", "a"), ("pin_churn", "b"), ("net_drop", "a"), ("net_drop", "b"),
        ("neighbour_copy", "a"), ("neighbour_copy", "b"), ("neighbour_copy", "b:neighbour")]
    by = {(ln["scenario"], ln["instance"]): ln for ln in lines}
    for ln in lines:
        assert ln["end"] - ln["start"] >= 3.0
        assert ln["expected_state"] and isinstance(ln["page"], bool) and ln["knobs"] is not None
        if ln["instance"] != "b:neighbour":
            assert ln["client"]["sent"] > 0 and ln["client"]["ok"] == ln["client"]["sent"], ln
            assert ln["client"]["p50_ms"] is not None and ln["client"]["p99_ms"] >= ln["client"]["p50_ms"]
        if ln["instance"] == "a":
            # the healthy instance always runs its start-up values
            assert ln["knobs"]["workers"] == 4 and ln["knobs"]["cpu_affinity"] is None and ln["knobs"]["pinned"]
    # instances in separate processes, with their own ports
    assert by[("healthy_low", "a")]["url"] != by[("healthy_low", "b")]["url"]
    assert by[("healthy_low", "b")]["expected_state"] == ["demand-limited", "idle"]
    b = by[("one_core", "b")]
    assert b["knobs"]["workers"] == 2 and len(b["knobs"]["cpu_affinity"]) == 1 and b["applied"]["workers"] in (2, 4)
    assert (b["expected_state"], b["expected_cause"], b["page"]) == (["staging-bound"], "host_staging", True)
    b = by[("pin_churn", "b")]
    assert b["knobs"]["pin_churn"] is True and b["knobs"]["upload_mib"] == 8   # capped for the CPU stand-in
    # the network fault was switched off for these servers: the timeline says it was not applied
    b = by[("net_drop", "b")]
    assert b["knobs"]["net_drop"] == 0.05 and b["expected_cause"] == "network"
    assert b["knob_warnings"] == ["net_drop: the network fault is switched off for this service (--net-tool off)"]
    b = by[("neighbour_copy", "b")]
    assert b["knobs"]["noisy_neighbour"] == "copy" and b["applied"]["noisy_neighbour"] == "copy"
    hog = by[("neighbour_copy", "b:neighbour")]
    assert hog["expected_state"] == ["io-saturated"] and hog["note"].startswith("all on one GPU")
    assert hog["client"] is None
    # both server logs record the knob changes they applied
    log_b = (tmp_path / "inference-b.log").read_text()
    assert '"source": "admin"' in log_b and '"noisy_neighbour": "copy"' in log_b
    assert '{"neighbour": "start"' in log_b and '{"neighbour": "stop"' in log_b
    # each service runs one BLAS thread per preprocessing worker (its ready line says so)
    for name in ("inference-a", "inference-b"):
        ready = next(json.loads(x) for x in (tmp_path / f"{name}.log").read_text().splitlines()
                     if x.startswith('{"event": "ready"'))
        assert ready["blas_threads"] == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def test_command_line_refuses_a_short_hold_and_unknown_scenarios(tmp_path):
    p = subprocess.run([sys.executable, "-m", "examples.inference.scenarios", "--hold", "10"], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == (f"scenarios: --hold must be at least {MIN_HOLD_S:g} s (the agent needs several "
                                "windows); --short for a plumbing check")
    p = subprocess.run([sys.executable, "-m", "examples.inference.scenarios", "--short", "--only", "meltdown",
                        "--timeline", str(tmp_path / "t.jsonl")], cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.strip().startswith("scenarios: unknown scenario 'meltdown'")
    p = subprocess.run([sys.executable, "-m", "examples.inference.scenarios", "--list"], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=60)
    names = [json.loads(x)["scenario"] for x in p.stdout.splitlines()]
    assert names == [s.name for s in SCENARIOS]


def test_prep_cost_measures_the_preprocessing_cpu():
    """``calibrate --prep``: the server's own preprocessing at a set rate on worker threads, and its CPU."""
    env = dict(ENV, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "examples.inference.calibrate", "--prep", "--seconds", "1.5",
                        "--rate", "10", "--workers", "2"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["requests"] == 15 and out["workers"] == 2 and out["wall_s"] >= 1.5
    assert out["cores"] > 0 and out["cpu_ms_per_request"] > 0.5   # a JPEG decode alone costs milliseconds
    assert out["blas_threads"] == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
