"""The Remediation page's rows over a real recording's decisions (h200-inference-5: a dry-run
fallback, its revert, a live one): times inside the reasons move with the recording, the revert
names its node, each decision has its accelerator, its episode link and its outcome from the
verdict history."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from triscope.core.trace import import_trace, read_trace, shift_times_in
from triscope.store import Store

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "examples" / "traces" / "h200-inference-5.jsonl.gz"
NOW = 1_900_000_000.0


@pytest.fixture
def imported(sqlite_url: str):  # type: ignore[no-untyped-def]
    from triscope.commands.trace import import_decisions

    st = Store.open(sqlite_url)
    st.upgrade()
    tr = read_trace(RECORDING)
    info = import_trace(st, RECORDING, shift_to_now=True, now=NOW, trace=tr)
    assert import_decisions(st, tr, info) == 3
    yield st, tr, info
    st.close()


def test_shift_times_in_text_keeps_the_form() -> None:
    assert shift_times_in("until 2026-12-01T21:19:02Z.", 3600) == "until 2026-12-01T22:19:02Z."
    assert shift_times_in({"r": ["2026-12-01 21:19:02.250+02:00"]}, -60) == {"r": ["2026-12-01 21:18:02.250+02:00"]}
    assert shift_times_in("2026-12-01T21:19:02 has no zone", 60) == "2026-12-01T21:19:02 has no zone"
    assert shift_times_in(5, 60) == 5


def test_reason_times_move_with_the_recording(imported) -> None:  # type: ignore[no-untyped-def]
    from triscope.store.audit import audit_log

    st, tr, info = imported
    assert info.offset > 3600
    acted = [r for r in audit_log(st, limit=10) if r.outcome == "acted"]
    assert len(acted) == 1
    r = acted[0]
    m = re.search(r"until (\S+Z)", r.reason)
    assert m, r.reason
    until = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    # the recorded decision wrote the file for its ttl: the time in its reason is its own time + ttl
    assert until == pytest.approx(r.ts + float(r.params["ttl"]), abs=2.0), (until, r.ts)
    original = next(d for d in tr.decisions if d["outcome"] == "acted")
    assert original["reason"] != r.reason     # the text did move


def test_rows_name_node_accelerator_episode_and_outcome(imported) -> None:  # type: ignore[no-untyped-def]
    from triscope.dashboard import data, remediation_view

    st, _tr, info = imported
    rows = data.audit_rows(st, info.start - 60, info.end + 60).rows
    assert len(rows) == 3
    revert = next(r for r in rows if r.get("trigger_kind") == "revert")
    assert not revert.get("node")                       # the engine wrote none
    ds = remediation_view.decisions(st, rows)
    assert [d.node for d in ds] == [info.node] * 3       # the revert takes its decision's node
    assert revert["node_from"] == "the decision it reverts"
    assert [d.accelerator for d in ds] == ["gpu=0"] * 3     # the revert's: the fallback's GPU
    fallbacks = [d for d in ds if d.row.get("trigger_kind") == "mismatch"]
    for d in fallbacks:
        assert d.outcome is not None and d.outcome.before == "staging-bound", d.outcome
        assert d.outcome.text().startswith("staging-bound"), d.outcome.text()
        ts = float(d.row["ts"])
        q = parse_qs(urlparse(remediation_view.episode_link(d.node, ts, d.outcome.episode)).query)
        assert q["node"] == [info.node] and float(q["start"][0]) < ts < float(q["end"][0])
        # the episode is the run the decision was made in: it starts before the trigger's 20 s
        assert float(q["start"][0]) <= ts - 20
        node_q = parse_qs(urlparse(remediation_view.node_link(d.node, ts, d.accelerator)).query)
        assert node_q["gpu"] == ["0"] and node_q["range"] == ["custom"]


def test_outcome_from_runs() -> None:
    from triscope.dashboard.remediation_view import outcome
    from triscope.store.reader import VerdictRun

    wl = ("", "", "", "cmd:a")
    runs = [VerdictRun("n", "gpu=0", wl, "balanced", 0, 99, 100, 0.1, 0.2),
            VerdictRun("n", "gpu=0", wl, "staging-bound", 100, 160, 60, 0.8, 0.9),
            VerdictRun("n", "gpu=0", wl, "balanced", 161, 400, 240, 0.1, 0.2),
            VerdictRun("n", "gpu=1", wl, "io-saturated", 0, 400, 400, 0.9, 0.9)]
    o = outcome(runs, "gpu=0", 130, 400)
    assert (o.before, o.after, o.after_s, o.episode) == ("staging-bound", "balanced", 31, (100, 160))
    assert o.better is True and o.text() == "staging-bound \u2192 balanced after 31 s"
    still = outcome(runs, "gpu=1", 130, 400)
    assert still.after == "" and still.better is False and still.text() == "still io-saturated 4.5 min later"
    assert outcome(runs, "gpu=0", -5, 400).text() == "no verdict stored around it"
