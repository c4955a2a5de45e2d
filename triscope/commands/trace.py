"""``triscope import-trace`` and ``triscope export-trace``: recorded traces in and out of a store."""

from __future__ import annotations

import argparse

from triscope.commands.common import add_db_option, db_url, parse_time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-trace", help="load a recorded trace (e.g. examples/traces/h200-phases.jsonl.gz) into a store",
        description="Load a recorded trace into a store as one node, so the dashboard and the analysis show "
                    "real GPU data on machines without a GPU.  Loading the same trace twice adds nothing.",
    )
    p.add_argument("file", metavar="FILE", help="trace file (.jsonl.gz as written by 'triscope export-trace')")
    add_db_option(p)
    p.add_argument("--node", default=None, help="node name to store it under (default: the node it was recorded on)")
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
    e.add_argument("--start", default=None, help="range start: ISO 8601, epoch seconds, -2h, now (default: first sample)")
    e.add_argument("--end", default=None, help="range end (default: last sample)")
    e.add_argument("--exclude", action="append", default=[], metavar="PREFIX",
                   help="leave out metrics starting with PREFIX (repeatable)")
    e.set_defaults(func=cmd_export)


def cmd_import(args: argparse.Namespace) -> int:
    from store import Store
    from triscope.trace import import_trace

    st = Store.open(db_url(args))
    try:
        st.upgrade()
        info = import_trace(st, args.file, node=args.node, shift_to_now=args.shift_to_now)
    finally:
        st.close()
    print(f"imported {info.ticks} ticks ({info.samples} samples, {info.series} series) and {info.events} new events "
          f"as node {info.node!r}, {info.end - info.start:.0f} s of data")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from store import Store
    from triscope.trace import export_trace

    st = Store.open(db_url(args))
    try:
        st.require_schema()
        start = parse_time(args.start) if args.start else None
        end = parse_time(args.end) if args.end else None
        info = export_trace(st, args.node, args.output, start=start, end=end, exclude_prefixes=args.exclude)
    finally:
        st.close()
    print(f"wrote {args.output}: node {info.node!r}, {info.ticks} ticks, {info.samples} samples, "
          f"{info.series} series, {info.events} events")
    return 0
