"""``triscope import-trace`` and ``triscope export-trace``: recorded traces in and out of a store."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from triscope.commands.common import TIME_HELP, add_db_option, db_url, parse_time
from triscope.core.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-trace", help="load a recorded trace (e.g. examples/traces/h200-phases.jsonl.gz) into a store",
        description="Load a recorded trace into a store as one node, so the dashboard and the analysis show "
                    "real GPU data on machines without a GPU.  The node is marked a recording (node labels "
                    "triscope.recording and triscope.recording_end): the dashboard says 'recording', never "
                    "'live', until an agent writes newer data under that name.  Loading the same trace twice "
                    "adds nothing.",
    )
    p.add_argument("file", metavar="FILE", help="trace file (.jsonl.gz as written by 'triscope export-trace')")
    add_db_option(p)
    p.add_argument("--node", default=None,
                   help="node name to store it under (default: the node it was recorded on); at most 253 letters, "
                        "digits, '.', '-', '_'")
    p.add_argument("--shift-to-now", action="store_true",
                   help="move every timestamp by the same offset so the trace ends now")
    p.add_argument("--replay", action="store_true",
                   help="recompute the verdicts with this version: replay the recorded inputs through today's "
                        "tracker (what 'triscope run' does with the demo's recordings); the recorded verdicts are "
                        "kept as triscope_recorded_mismatch_* series, the recorded decisions marked 'recorded'")
    p.set_defaults(func=cmd_import)

    e = sub.add_parser(
        "export-trace", help="write one node's stored samples and events to a trace file",
        description="Write one node's raw samples and events over a time range to a compact trace file "
                    "(gzip JSON lines) that 'triscope import-trace' loads.",
    )
    add_db_option(e)
    e.add_argument("--node", required=True, help="node to export")
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write (.jsonl.gz)")
    e.add_argument("--start", default=None, metavar="TIME", help=f"range start (default: first sample): {TIME_HELP}")
    e.add_argument("--end", default=None, metavar="TIME", help="range end, same forms (default: last sample)")
    e.add_argument("--exclude", action="append", default=[], metavar="PREFIX",
                   help="leave out metrics starting with PREFIX (repeatable)")
    e.set_defaults(func=cmd_export)


def cmd_import(args: argparse.Namespace) -> int:
    from triscope.core.names import node_name_problem
    from triscope.core.trace import import_trace, read_trace
    from triscope.store import Store

    if args.node is not None and node_name_problem(args.node):
        raise UserError(f"--node: {node_name_problem(args.node)}")
    trace = read_trace(args.file)   # a bad file is one line before the store is touched
    if args.replay:
        from triscope.commands.replay import replay_trace

        trace = replay_trace(trace)
    st = Store.open(db_url(args))
    try:
        st.upgrade()
        info = import_trace(st, args.file, node=args.node, shift_to_now=args.shift_to_now, trace=trace)
        mark_recording(st, info.node, Path(args.file).name, info.end)
        decided = import_decisions(st, trace, info)
    finally:
        st.close()
    print(f"imported {info.ticks} ticks ({info.samples} samples, {info.series} series), {info.events} new events "
          f"and {decided} remediation decisions as node {info.node!r}, {info.end - info.start:.0f} s of data")
    return 0


def mark_recording(st: Any, node: str, source: str, end: float) -> None:
    """Mark ``node`` as a recording (node labels ``triscope.recording``: the trace file,
    ``triscope.recording_end``: its last tick as imported), keeping its other labels: the pages say
    "recording", never "live", until an agent writes newer data under that name."""
    from triscope.store.reader import RECORDING_END_LABEL, RECORDING_LABEL

    labels = next((dict(n.labels) for n in st.nodes() if n.name == node), {})
    want = {RECORDING_LABEL: source, RECORDING_END_LABEL: f"{end:.3f}"}
    if any(labels.get(k) != v for k, v in want.items()):
        st.set_node_labels(node, {**labels, **want})


def import_decisions(st: Any, trace: Any, info: Any) -> int:
    """The trace's remediation decisions into the audit table, moved as its ticks were and
    pointed at the node it was imported as."""
    from triscope.store import audit

    rows = [{**d, "node": info.node if d.get("node") else d.get("node")} for d in trace.shifted_decisions(info.offset)]
    return audit.import_decisions(st, rows)


def node_decisions(st: Any, node: str, start: float, end: float) -> list[dict[str, Any]]:
    """The audit rows about ``node`` in [start, end] (a decision without a node, e.g. an alert that
    named none, is kept when the store holds only this node), oldest first."""
    from triscope.store import audit

    single = len([n for n in st.nodes()]) <= 1
    rows = audit.audit_log(st, since=start, until=end, limit=1_000_000, newest_first=False)
    return [r.as_dict() for r in rows if r.node == node or (single and not r.node)]


def cmd_export(args: argparse.Namespace) -> int:
    from triscope.core.trace import export_trace
    from triscope.store import Store

    st = Store.open(db_url(args))
    try:
        st.require_schema()
        now = time.time()
        start = parse_time(args.start, now, "--start") if args.start is not None else None
        end = parse_time(args.end, now, "--end") if args.end is not None else None
        bounds = st.time_bounds(args.node)
        decisions = [] if bounds is None else node_decisions(
            st, args.node, start if start is not None else bounds[0] - 60, end if end is not None else bounds[1] + 60)
        info = export_trace(st, args.node, args.output, start=start, end=end, exclude_prefixes=args.exclude,
                            decisions=decisions)
    finally:
        st.close()
    print(f"wrote {args.output}: node {info.node!r}, {info.ticks} ticks, {info.samples} samples, "
          f"{info.series} series, {info.events} events, {info.decisions} remediation decisions")
    return 0
