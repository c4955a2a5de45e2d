"""``triscope rca``: what changed on a node in a time window, ranked likely causes with evidence."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from triscope.commands.common import TIME_HELP, add_db_option, db_url, fmt_ts, known_nodes, parse_time
from triscope.names import shorten


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rca", help="historical root-cause query: ranked likely causes of what changed on a node",
        description="Compare every stored series of NODE in [--start, --end] with a baseline (by default the "
        "preceding window of the same length), rank the changes by how far and how early they moved, merge "
        "the window's events (XID, AER, IOMMU faults, retransmit bursts with their peers, mismatch state "
        "changes, remediation actions) and print the likely causes with their evidence. "
        f"Times: {TIME_HELP}.",
    )
    add_db_option(p)   # also lets relative times like -2h through as option values
    p.add_argument("--node", required=True, help="node name as stored (see 'triscope query')")
    p.add_argument("--start", required=True, metavar="TIME", help="window start (e.g. -2h, 2026-11-29T17:00:00Z)")
    p.add_argument("--end", default="now", metavar="TIME", help="window end (default now)")
    p.add_argument("--baseline-start", help="baseline start (default: the preceding window of the same length)")
    p.add_argument("--baseline-end", help="baseline end (default: the window's start)")
    p.add_argument("--top", type=int, default=8, help="how many causes to print (default 8)")
    p.add_argument("--evidence", type=int, default=4, help="evidence lines per cause (default 4)")
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    p.set_defaults(func=cmd_rca)


def cmd_rca(args: argparse.Namespace) -> int:
    from triscope.analysis.rca import rank_causes
    from triscope.errors import UserError
    from triscope.store import Store

    now = time.time()
    start = parse_time(args.start, now, "--start")
    end = parse_time(args.end, now, "--end")
    if end <= start:
        raise UserError(f"the window is empty: --start {args.start} is not before --end {args.end}")
    baseline = None
    if args.baseline_start is not None or args.baseline_end is not None:
        b0 = (parse_time(args.baseline_start, now, "--baseline-start") if args.baseline_start is not None
              else start - (end - start))
        b1 = parse_time(args.baseline_end, now, "--baseline-end") if args.baseline_end is not None else start
        if b1 <= b0:
            raise UserError("the baseline is empty: --baseline-start must be before --baseline-end")
        baseline = (b0, b1)
    if args.top < 1:
        raise UserError("--top must be at least 1")
    st = Store.open(db_url(args))
    st.require_schema()
    if args.node not in {n.name for n in st.nodes()}:
        raise UserError(f"unknown node {shorten(args.node)!r} (stored nodes: {known_nodes(st)})")
    res = rank_causes(st, args.node, start, end, baseline=baseline, top=args.top)
    st.close()
    if args.json:
        print(json.dumps(res.as_dict(), default=str))
        return 0
    print(f"node {res.node}  window {fmt_ts(res.start)} .. {fmt_ts(res.end)}  "
          f"baseline {fmt_ts(res.baseline_start)} .. {fmt_ts(res.baseline_end)}")
    print(f"{res.series_examined} series examined, {len(res.changes)} changed, {len(res.events)} event(s)")
    if res.mismatch:
        ws = ", ".join(f"{k} {v:.0%}" for k, v in res.mismatch.get("window_states", {}).items())
        bs = ", ".join(f"{k} {v:.0%}" for k, v in res.mismatch.get("baseline_states", {}).items()) or "no data"
        print(f"mismatch state: {ws} (baseline: {bs})"
              + (f"; pin churn in {res.mismatch['pin_churn_share']:.0%} of windows"
                 if res.mismatch.get("pin_churn_share") else ""))
    for metric, sv in res.stages.items():
        w, b = sv["window"], sv["baseline"]
        line = (f"stages ({metric}): bottleneck {w['bottleneck']}, skew {w['skew']:.2f}, "
                f"pipeline bubbles {w['bubble_fraction']:.0%}")
        if b:
            line += f" (baseline: {b['bottleneck']}, skew {b['skew']:.2f}, bubbles {b['bubble_fraction']:.0%})"
        print(line)
    if not res.causes:
        print("nothing changed beyond the baseline's noise")
        return 0
    for i, c in enumerate(res.causes, 1):
        onset = f"  onset {fmt_ts(c.onset)}" if c.onset is not None else ""
        print(f"{i}. {c.title}  [score {c.score:.2f}]{onset}")
        if c.peers:
            print(f"     peers: {', '.join(c.peers[:5])}")
        for e in c.evidence[: args.evidence]:
            print("     - " + _evidence_line(e))
    return 0


def _evidence_line(e: dict[str, Any]) -> str:
    from triscope.analysis.rca import _fmt

    if e.get("type") == "series":
        if e["direction"] in ("appeared", "vanished"):
            what = e["direction"]
        else:
            what = f"{_fmt(e['baseline'])} -> {_fmt(e['window'])}"
            if e.get("peak") is not None and e["peak"] != e["window"]:
                what += f" (peak {_fmt(e['peak'])})"
        onset = f", from {fmt_ts(e['onset'])}" if e.get("onset") else ""
        return f"{e['series']}: {what} (z {e['z']:.1f}{onset})"
    if e.get("type") == "event":
        return f"{fmt_ts(e['ts'])} {e['kind']} [{e['severity']}] {e['message']}"
    return str(e.get("detail", e))
