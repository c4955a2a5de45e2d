"""``triscope query``: print stored series and events."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from triscope.commands.common import TIME_HELP, add_db_option, db_url, fmt_ts, known_nodes, parse_time
from triscope.core.names import shorten

if TYPE_CHECKING:
    from triscope.store import Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "query", help="print stored points of a metric (or events) for a node and time range",
        description="Print stored points. Counters are printed as they are stored (cumulative) unless "
        "--rate is given. Without --metric, lists the metrics stored for the node. "
        f"Times: {TIME_HELP}; --since -2h and --since=-2h both work.",
    )
    add_db_option(p)
    p.add_argument("--metric", help="metric name, e.g. triscope_tcp_retransmits_total")
    p.add_argument("--node", help="node name (default: all nodes)")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="only series with this label (repeatable)")
    p.add_argument("--since", default="1h", metavar="TIME",
                   help=f"range start (default 1h, one hour ago): {TIME_HELP}; a plain number below 1000000000 "
                        "is that many seconds ago")
    p.add_argument("--start", metavar="TIME", help="range start, same forms as --since (overrides it)")
    p.add_argument("--until", "--end", dest="end", metavar="TIME", help="range end, same forms (default now)")
    p.add_argument("--rate", action="store_true", help="counters as per-second rates")
    p.add_argument("--max-points", type=int, default=0, help="downsample each series to at most N points "
                   "(min/max preserving; default: every raw point)")
    p.add_argument("--events", action="store_true", help="print events instead of samples")
    p.add_argument("--json", action="store_true", help="one JSON object per line: {\"ts\", \"value\", \"labels\"}")
    p.set_defaults(func=cmd_query)


def cmd_query(args: argparse.Namespace) -> int:
    from triscope.core.errors import UserError
    from triscope.store import Store

    now = time.time()
    end = parse_time(args.end, now, "--until") if args.end is not None else now
    start = parse_time(args.start, now, "--start") if args.start is not None else parse_time(args.since, now, "--since")
    if args.max_points < 0:
        raise UserError("--max-points must be 0 (every point) or more")
    st = Store.open(db_url(args))
    st.require_schema()
    if start > end:
        raise UserError("the range starts after it ends")
    if args.node and args.node not in {n.name for n in st.nodes()}:
        raise UserError(f"unknown node {shorten(args.node)!r} (stored nodes: {known_nodes(st)})")
    if args.events:
        _print_events(st, args, start, end)
        return 0
    if not args.metric:
        for m in st.metric_names(args.node):
            print(m)
        return 0
    labels = _labels(args.label)
    if args.metric not in st.metric_names(args.node):
        raise UserError(f"unknown metric {shorten(args.metric)!r}" + (f" on node {args.node!r}" if args.node else "")
                        + " — 'triscope query' without --metric lists the stored ones")
    results = st.query(args.metric, node=args.node, labels=labels or None, start=start, end=end,
                       max_points=args.max_points or None, rate=bool(args.rate))
    for sd in results:
        lab = dict(sd.info.labels)
        if not args.json:
            print(f"# {sd.info.metric}{{{','.join(f'{k}={v!r}' for k, v in sorted(lab.items()))}}} node={sd.info.node} "
                  f"points={len(sd.ts)} tier={sd.tier}")
        for t, v in zip(sd.ts, sd.values, strict=True):
            if args.json:
                print(json.dumps({"ts": t, "value": v, "labels": lab, "node": sd.info.node, "metric": sd.info.metric}))
            else:
                print(f"{fmt_ts(t)}  {v:.6g}")
    return 0


def _labels(pairs: list[str]) -> dict[str, str]:
    """``--label K=V`` arguments as a dict."""
    from triscope.core.errors import UserError

    labels = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep:
            raise UserError(f"--label {kv!r} is not K=V")
        labels[k] = v
    return labels


def _print_events(st: Store, args: argparse.Namespace, start: float, end: float) -> None:
    for e in st.events(node=args.node, start=start, end=end):
        if args.json:
            print(json.dumps({"ts": e.ts, "node": e.node, "kind": e.kind, "severity": e.severity,
                              "message": e.message, "details": e.details}))
        else:
            print(f"{fmt_ts(e.ts)}  {e.node:<16} {e.kind:<18} {e.severity:<8} {e.message}")
