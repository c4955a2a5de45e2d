"""The demo shows today's verdicts: ``make run`` (``triscope run``'s ``import_for_demo``) and
``triscope import-trace --replay`` replay each recording's inputs through today's tracker as they load it.

h200-inference-4 is the recording where the two differ: its agent published ``demand-limited`` for
inference-b's pageable copies; today's classifier reads them ``staging-bound`` on inference-b.  After
the demo's import the store's verdict history (what every page, ``triscope rca`` and the engine's
stored-data triggers read) holds today's reading, ``triscope rca`` says it, and the recorded verdicts
are still there, marked: ``triscope_recorded_mismatch_*`` series, ``recorded_*`` events, the
recording engine's decisions with ``engine_id`` ``recorded``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from triscope.store import Store, audit

TRACES = REPO / "examples" / "traces"
NODE = "h200-inference-4"
TRISCOPE = [sys.executable, "-m", "triscope"]


def _pageable(node: str, offset: float) -> tuple[float, float]:
    """The pageable scenario's settled span (after its first 15 s), moved as the import moved it."""
    lines = [json.loads(ln) for ln in (TRACES / f"{node}.timeline.jsonl").read_text().splitlines() if ln.strip()]
    ln = next(x for x in lines if x["scenario"] == "pageable" and x.get("instance", "b") == "b")
    return ln["start"] + 15 + offset, ln["end"] + offset


def _states(runs: list[Any], a: float, b: float) -> dict[tuple[str, str], float]:
    """(state, workload) -> seconds of the accelerator's runs inside [a, b]."""
    out: dict[tuple[str, str], float] = {}
    for r in runs:
        if r.accelerator and r.end >= a and r.start <= b:
            key = (r.state, r.workload[3] or r.workload[2] or r.workload[1])
            out[key] = out.get(key, 0.0) + min(r.end, b) - max(r.start, a)
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, float]:
    from triscope.commands.run import import_for_demo
    from triscope.core.trace import read_trace

    url = f"sqlite:///{tmp_path_factory.mktemp('demo') / 'demo.db'}"
    now = time.time()
    assert import_for_demo(url, TRACES / f"{NODE}.jsonl.gz", now=now) == NODE
    header = read_trace(TRACES / f"{NODE}.jsonl.gz").header
    return url, now - float(header["end"])


def test_the_demo_s_verdict_history_is_today_s(demo: tuple[str, float]) -> None:
    url, offset = demo
    a, b = _pageable(NODE, offset)
    st = Store.open(url)
    try:
        today = _states(st.verdict_runs(NODE, a, b), a, b)
        then: dict[str, int] = {}
        for d in st.query("triscope_recorded_mismatch_state", node=NODE, start=a, end=b, max_points=None):
            if d.info.labels.get("gpu"):
                st_ = d.info.labels["state"]
                then[st_] = then.get(st_, 0) + sum(1 for v in d.values if v >= 0.5)
        labels = next(n.labels for n in st.nodes() if n.name == NODE)
        rows = audit.audit_log(st, since=0, limit=1000)
        kinds = {e.kind for e in st.events(node=NODE, limit=100_000)}
    finally:
        st.close()
    # today's: staging-bound on inference-b all the settled span (a state run's last tick may sit at its edge)
    assert max(today, key=today.__getitem__) == ("staging-bound", "cmd:inference-b"), today
    assert today[("staging-bound", "cmd:inference-b")] >= 0.9 * (b - a - 2), today
    # then: what the recording's agent published, kept and marked
    assert max(then, key=then.__getitem__) == "demand-limited", then
    assert labels["triscope.verdicts"].startswith("replayed by triscope"), labels
    assert rows and all(r.engine_id == "recorded" and r.reason.startswith("recorded:") for r in rows)
    assert {"recorded_mismatch_state", "mismatch_state"} <= kinds, kinds


def test_triscope_rca_says_today_s_verdict(demo: tuple[str, float]) -> None:
    url, offset = demo
    a, b = _pageable(NODE, offset)
    out = subprocess.run([*TRISCOPE, "rca", "--db", url, "--node", NODE, "--start", f"{a:.3f}", "--end", f"{b:.3f}",
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    eps = [e for e in json.loads(out.stdout)["episodes"] if str(e.get("accelerator")).startswith("gpu")]
    assert eps, out.stdout[:2000]
    assert {e["state"] for e in eps} == {"staging-bound"}, eps
    assert all("inference-b" in json.dumps(e.get("workload")) for e in eps), eps


def test_import_trace_replay_keeps_the_recorded_verdicts_apart(tmp_path: Path) -> None:
    """``triscope import-trace --replay``: the same, from the command line (h200-lab-10, a short one)."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    trace = REPO / "examples" / "hostlab" / "traces" / "h200-lab-10.jsonl.gz"
    subprocess.run([*TRISCOPE, "import-trace", str(trace), "--db", url, "--replay"], cwd=REPO, check=True,
                   capture_output=True, timeout=300)
    st = Store.open(url)
    try:
        names = {s.metric for s in st.series(node="h200-lab-10", prefix="triscope_")}
        labels = next(n.labels for n in st.nodes() if n.name == "h200-lab-10")
    finally:
        st.close()
    assert {"triscope_mismatch_state", "triscope_recorded_mismatch_state", "triscope_recorded_mismatch_score"} <= names
    assert labels["triscope.verdicts"].startswith("replayed by triscope")
