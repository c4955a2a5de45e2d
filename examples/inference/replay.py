"""Replay a recording through today's per-tick tracker: the same inputs, the verdicts of this code.

    python -m examples.inference.replay --db sqlite:///h200-inference-1.db --node h200-inference-1 \\
        --out sqlite:///replayed.db [--trace replayed.jsonl.gz] [--label KEY=VALUE ...]

The agent's tracker publishes ``triscope_mismatch_state`` / ``_score`` per tick from that tick's
inputs (GPU activity, PCIe, the workloads' host evidence, DMA maps, retransmits, ...).  A recording
keeps every input, so the verdicts can be computed again with another version of the tracker:
this feeds the recorded ticks, in time order and with their own timestamps, through
``MismatchTracker`` exactly as the agent's sampler does (the tracker's output appended to the
tick), into a new store.  The recorded ``triscope_mismatch_*`` series are left out (they are what
the recording's code said); events and the engine's decisions are carried over.  ``--trace``
writes the result as a trace (``triscope import-trace`` / ``make run`` load it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from triscope.core.samples import EventRecord, Sample, Tick

MISMATCH_PREFIX = "triscope_mismatch_"


def phase_events(timeline: list[dict]) -> list[EventRecord]:
    """The scenarios of a timeline as ``phase`` events (start and end edges, as the workload's phase
    log gives them): the dashboard marks them and ``triscope rca`` lists them."""
    out: list[EventRecord] = []
    for ln in timeline:
        if ln.get("instance") != "b":
            continue
        name = str(ln["scenario"])
        for edge, ts in (("start", float(ln["start"])), ("end", float(ln["end"]))):
            details = {"phase": name, "edge": edge, "title": ln.get("title", "")}
            if ln.get("fault_onset") and edge == "start":
                details["fault_onset"] = ln["fault_onset"]
            out.append(EventRecord(kind="phase", message=f"phase {name} {edge}", severity="info",
                                   details=details, ts=ts))
    return out


def replay(db: str, node: str, out: str, trace: Path | None = None, labels: dict[str, str] | None = None,
           with_decisions: bool = True, phases: list[EventRecord] | None = None) -> dict:
    from triscope.analysis.online import MismatchTracker
    from triscope.commands.trace import node_decisions
    from triscope.core.trace import export_trace, iter_ticks, read_trace
    from triscope.store import Store, audit

    src = Store.open(db)
    try:
        bounds = src.time_bounds(node)
        if bounds is None:
            raise SystemExit(f"replay: node {node!r} has no samples in {db}")
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "raw.jsonl.gz"
            export_trace(src, node, raw, exclude_prefixes=[MISMATCH_PREFIX])
            rec = read_trace(raw)
        decisions = node_decisions(src, node, bounds[0] - 60, bounds[1] + 60)
        node_labels = next((n.labels for n in src.nodes() if n.name == node), {}) or {}
    finally:
        src.close()
    tr = MismatchTracker()
    dst = Store.open(out)
    dst.upgrade()
    ticks: list[Tick] = []
    states = 0
    try:
        for tick in iter_ticks(rec, 0.0):
            samples = list(tick.samples)
            extra = tr.process(tick.ts, samples)
            samples += [s for s in extra if isinstance(s, Sample)]
            events = [e for e in extra if isinstance(e, EventRecord)]
            states += sum(1 for s in extra if isinstance(s, Sample) and s.name == "triscope_mismatch_state"
                          and s.value >= 0.5 and "gpu" in s.labels)
            ticks.append(Tick(tick.ts, samples, events))
            if len(ticks) >= 120:
                dst.write_ticks(node, ticks)
                ticks = []
        if ticks:
            dst.write_ticks(node, ticks)
        if rec.events:
            dst.add_events(node, [EventRecord(kind=str(e["kind"]), message=str(e.get("message", "")),
                                              severity=e.get("severity", "info"), details=e.get("details") or {},
                                              ts=float(e["ts"])) for e in rec.events])
        if phases:
            dst.add_events(node, phases)
        if with_decisions:
            audit.import_decisions(dst, decisions)
        if labels or node_labels:
            dst.set_node_labels(node, {**node_labels, **(labels or {})})
        info = None
        if trace is not None:
            info = export_trace(dst, node, trace, node_labels={**node_labels, **(labels or {})},
                                decisions=node_decisions(dst, node, bounds[0] - 60, bounds[1] + 60))
    finally:
        dst.close()
    return {"node": node, "ticks": len(rec.ticks), "accelerator_states": states, "decisions": len(decisions),
            "trace": str(trace) if trace else None, "trace_samples": info.samples if info else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="the recording's store")
    ap.add_argument("--node", required=True)
    ap.add_argument("--out", required=True, help="the store to write (sqlite:///FILE)")
    ap.add_argument("--trace", type=Path, default=None, help="also write the replayed node as a trace")
    ap.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a node label for the trace")
    ap.add_argument("--timeline", type=Path, default=None, help="the scenarios' timeline: marked as phase events")
    args = ap.parse_args(argv)
    labels = dict(kv.split("=", 1) for kv in args.label)
    phases = None
    if args.timeline:
        import json

        phases = phase_events([json.loads(ln) for ln in args.timeline.read_text().splitlines() if ln.strip()])
    print(replay(args.db, args.node, args.out, args.trace, labels, phases=phases))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def replay_engine(db: str, policy_file: Path, start: float, end: float, knobs_dir: Path,
                  step: float = 5.0) -> list[dict]:
    """Run the remediation engine, acting, over a (replayed) recording as its evaluation clock
    would have: every ``step`` seconds from ``start`` to ``end`` it evaluates the policy's
    stored-data triggers at that time and reverts what is due; the knobs-file fallback writes
    into ``knobs_dir``.  Returns the decisions taken (audit rows as dicts), oldest first.  The
    engine writes its audit rows into ``db``: give it a copy."""
    import time
    from unittest import mock

    from triscope.remediation.engine import Engine
    from triscope.remediation.policy import parse_policy
    from triscope.store import Store, audit

    text = policy_file.read_text().replace("@KNOBS_DIR@", str(knobs_dir))
    st = Store.open(db)
    real = time.time
    clock = {"t": start, "at": real()}

    def now() -> float:   # the recording's time: the step's, plus what really passed since it began
        return clock["t"] + (real() - clock["at"])

    with mock.patch("time.time", now):
        eng = Engine(st, parse_policy(text, str(policy_file)), kube=None, dry_run=False)
        try:
            t = start
            while t <= end:
                clock.update(t=t, at=real())
                eng.evaluate_triggers(t)
                eng.drain(30)
                eng.revert_fallbacks(t)
                t += step
        finally:
            eng.close()
    rows = [r.as_dict() for r in audit.audit_log(st, limit=100_000, newest_first=False)
            if r.engine_id == eng.engine_id and r.outcome != "in_progress"]
    st.close()
    return rows
