"""``triscope import-trace`` and ``triscope export-trace``: recorded traces in and out of a store."""

from __future__ import annotations

import argparse
import time

from triscope.commands.common import TIME_HELP, add_db_option, db_url, parse_time
from triscope.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-trace", help="load a recorded trace (e.g. examples/traces/h200-phases.jsonl.gz) into a store",
        description="Load a recorded trace into a store as one node, so the dashboard and the analysis show "
                    "real GPU data on machines without a GPU.  Loading the same trace twice adds nothing.",
    )
    p.add_argument("file", metavar="FILE", help="trace file (.jsonl.gz as written by 'triscope export-trace')")
    add_db_option(p)
    p.add_argument("--node", default=None,
                   help="node name to store it under (default: the node it was recorded on); at most 253 letters, "
                        "digits, '.', '-', '_'")
    p.add_argument("--shift-to-now", action="store_true",
                   help="move every timestamp by the same offset so the trace ends now")
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
    from triscope.names import node_name_problem
    from triscope.store import Store
    from triscope.trace import import_trace, read_trace

    if args.node is not None and node_name_problem(args.node):
        raise UserError(f"--node: {node_name_problem(args.node)}")
    trace = read_trace(args.file)   # a bad file is one line before the store is touched
    st = Store.open(db_url(args))
    try:
        st.upgrade()
        info = import_trace(st, args.file, node=args.node, shift_to_now=args.shift_to_now, trace=trace)
    finally:
        st.close()
    print(f"imported {info.ticks} ticks ({info.samples} samples, {info.series} series) and {info.events} new events "
          f"as node {info.node!r}, {info.end - info.start:.0f} s of data")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from triscope.store import Store
    from triscope.trace import export_trace

    st = Store.open(db_url(args))
    try:
        st.require_schema()
        now = time.time()
        start = parse_time(args.start, now, "--start") if args.start is not None else None
        end = parse_time(args.end, now, "--end") if args.end is not None else None
        info = export_trace(st, args.node, args.output, start=start, end=end, exclude_prefixes=args.exclude)
    finally:
        st.close()
    print(f"wrote {args.output}: node {info.node!r}, {info.ticks} ticks, {info.samples} samples, "
          f"{info.series} series, {info.events} events")
    return 0
