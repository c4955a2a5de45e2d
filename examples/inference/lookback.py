"""Root cause at four look-backs over the same recordings: the incidents must not change with the window.

    python -m examples.inference.lookback            # every recording: episodes and top causes per look-back

Each recording is imported into a SQLite store as ``make run`` does (its verdict history built as
the ticks are written), and ``triscope rca`` asked for the last 30 minutes, 6 hours, 24 hours and 7
days before the recording's end.  For every bad episode overlapping a faulty scenario's settled span
(after its first 15 s, by at least 5 s) the top cause is scored against the cause the timeline
expected; an episode naming the healthy instance is counted apart.  ``tests/unit/test_rca_lookback.py``
holds the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import IO_STATES, _workload_name, load_timeline

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "examples" / "traces"
LOOKBACKS = {"30m": 1800.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
SETTLE = 15.0


def _expected(lines: Sequence[dict[str, Any]]) -> list[tuple[str, float, float, str | None, frozenset[str]]]:
    """Per scenario: (name, settled start, end, expected cause, the names of the healthy instance);
    the faulty instance is the line whose role says so (b when none does: the fault may be on the
    heavier a too, the fourth set); on one GPU a neighbour's line is the GPU's expectation (as
    ``report.score_tracks`` has it)."""
    scen = [ln for ln in lines if ln.get("scenario") != "loop_closed"]
    out = []
    for name in dict.fromkeys(ln["scenario"] for ln in scen):
        mine = {ln["instance"]: ln for ln in scen if ln["scenario"] == name}
        b, a = mine.get("b"), mine.get("a")
        if b is None or a is None:
            continue
        faulty, healthy = (a, b) if a.get("role") == "faulty" else (b, a)
        cause = faulty.get("expected_cause")
        hog = mine.get("b:neighbour")
        if hog is not None and a.get("gpu") == b.get("gpu"):
            cause = hog.get("expected_cause")
        names = frozenset(healthy.get("accept") or [healthy["workload"]])
        out.append((name, float(b["start"]) + SETTLE, float(b["end"]), cause, names))
    return out


def _named(workload: Any) -> str:
    """What an episode names: its pod on Kubernetes (the agent leaves ``workload`` empty there), else
    its workload label's name."""
    if not workload:
        return ""
    pod, wl = (workload[1] or ""), (workload[3] or "")
    return _workload_name(wl) if wl or not pod else pod


def episode_rows(tl: Any, lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bad state episode that overlaps a scenario's settled span by 5 s or more: the scenario it
    overlaps most (the first of equals), its state, workload and top cause, whether that is the
    cause the scenario expected on the instance at fault (None: a scenario with no cause to find, not
    judged), and whether it names the healthy instance."""
    exp = _expected(lines)
    out: list[dict[str, Any]] = []
    for e in tl.episodes:
        if e.kind != "state" or e.state not in IO_STATES:
            continue
        over = [(min(e.end, s1) - max(e.start, s0), i) for i, (_n, s0, s1, _c, _h) in enumerate(exp)]
        over = [(o, i) for o, i in over if o >= 5.0]
        if not over:
            continue
        best = max(over, key=lambda oi: (oi[0], -oi[1]))[1]
        name, _s0, _s1, cause, healthy = exp[best]
        wl = _named(e.workload)
        top = e.causes[0].key if e.causes else None
        out.append({"scenario": name, "scenarios": [exp[i][0] for _o, i in over], "state": e.state,
                    "start": round(e.start, 1), "end": round(e.end, 1), "workload": wl, "expected_cause": cause,
                    "top_cause": top, "right": top is not None and top == cause and wl not in healthy,
                    "names_healthy": wl in healthy})
    return out


def lookback_scores(store: Any, node: str, lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from triscope.analysis.rca.timeline import rca_timeline

    end = max(float(ln["end"]) for ln in lines) + 60.0
    out: dict[str, dict[str, Any]] = {}
    for name, span in LOOKBACKS.items():
        tl = rca_timeline(store, node, end - span, end)
        rows = episode_rows(tl, lines)
        judged = [r for r in rows if r["expected_cause"]]
        out[name] = {"episodes": len([e for e in tl.episodes if e.kind == "state" and e.state in IO_STATES]),
                     "judged": len(judged), "right": sum(r["right"] for r in judged),
                     "names_healthy": sum(r["names_healthy"] for r in rows), "rows": rows,
                     "shape": [(e.state, round(e.start), round(e.end), e.causes[0].key if e.causes else None)
                               for e in tl.episodes if e.kind == "state" and e.state in IO_STATES]}
    return out


def score_recording(node: str, traces: Path = TRACES) -> dict[str, dict[str, Any]]:
    from triscope.commands.replay import replay_trace
    from triscope.core.trace import import_trace, read_trace
    from triscope.store import Store

    lines = load_timeline(traces / f"{node}.timeline.jsonl")
    with tempfile.TemporaryDirectory(prefix="lookback-") as td:
        st = Store.open(f"sqlite:///{td}/rec.db")
        st.upgrade()
        try:
            trace = traces / f"{node}.jsonl.gz"
            import_trace(st, trace, trace=replay_trace(read_trace(trace)))     # today's verdicts, as make run loads it
            return lookback_scores(st, node, lines)
        finally:
            st.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.inference.lookback", description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", action="append", help="only this recording (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    nodes = args.node or sorted(p.name.removesuffix(".timeline.jsonl") for p in TRACES.glob("h200-inference-*.timeline.jsonl"))
    res = {n: score_recording(n) for n in nodes}
    if args.json:
        print(json.dumps(res, indent=2, default=str))
        return 0
    print("| recording | " + " | ".join(f"{k}: right / judged (healthy named)" for k in LOOKBACKS) + " |")
    print("|---|" + "---|" * len(LOOKBACKS))
    for n, r in res.items():
        print(f"| {n} | " + " | ".join(f"{r[k]['right']}/{r[k]['judged']} ({r[k]['names_healthy']})" for k in LOOKBACKS)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
