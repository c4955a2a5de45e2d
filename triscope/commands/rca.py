"""``triscope rca``: what happened on a node in a time window, as an incident timeline: episodes of
one coordination state per accelerator (cut into phases where the cause changes), health events,
workload-lane events and SLO burn periods, each bad episode with its ranked causes against a
reference that exists and its context (application SLIs, remediation actions, the agent itself:
shown, never ranked).  ``--ranked`` keeps the older single ranked list of what changed against a
baseline, scored by the same ``score_cause``."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from triscope.commands.common import TIME_HELP, add_db_option, db_url, fmt_ts, known_nodes, parse_time
from triscope.core.names import shorten


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rca", help="historical root cause: a node's window as an incident timeline with ranked causes",
        description="Cut NODE's window [--start, --end] into episodes (runs of one coordination state per "
        "accelerator, health events such as XID errors, PCIe AER and collectors going down, SLO burn periods) "
        "and explain each bad episode: its likely causes, ranked on absolute evidence (link utilisation against "
        "its ceiling, pin churn, retransmits, host CPU and feeder threads) and on what moved against a reference "
        "that exists (the healthy period before it on the same accelerator, else the workload's healthy history, "
        "else fleet peers running the same workload; else none, and it says so). "
        f"Times: {TIME_HELP}.",
    )
    add_db_option(p)   # also lets relative times like -2h through as option values
    p.add_argument("--node", required=True, help="node name as stored (see 'triscope query')")
    p.add_argument("--start", required=True, metavar="TIME", help="window start (e.g. -2h, 2026-11-29T17:00:00Z)")
    p.add_argument("--end", default="now", metavar="TIME", help="window end (default now)")
    p.add_argument("--baseline-start", help="compare every bad episode with this range instead (default: "
                   "references found per episode; with --ranked the preceding window of the same length)")
    p.add_argument("--baseline-end", help="end of that range (default: the window's start)")
    p.add_argument("--top", type=int, default=None, help="causes per episode (default 3; with --ranked, causes: 8)")
    p.add_argument("--evidence", type=int, default=3, help="evidence lines per cause (default 3)")
    p.add_argument("--slo", type=Path, default=None, metavar="FILE",
                   help="SLOs whose burn periods go on the timeline (default $TRISCOPE_SLO_FILE or "
                        "deploy/slo.example.yaml, when there)")
    p.add_argument("--ranked", action="store_true",
                   help="one ranked list of what changed in the window against the baseline (the older view)")
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    p.set_defaults(func=cmd_rca)


def cmd_rca(args: argparse.Namespace) -> int:
    from triscope.core.errors import UserError
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
    if args.top is not None and args.top < 1:
        raise UserError("--top must be at least 1")
    slos = [] if args.ranked else _slos(args.slo)
    st = Store.open(db_url(args))
    try:
        st.require_schema()
        if args.node not in {n.name for n in st.nodes()}:
            raise UserError(f"unknown node {shorten(args.node)!r} (stored nodes: {known_nodes(st)})")
        if args.ranked:
            return _ranked(st, args, start, end, baseline)
        from triscope.analysis.rca.timeline import rca_timeline

        tl = rca_timeline(st, args.node, start, end, baseline=baseline, top=args.top or 3, slos=slos)
    finally:
        st.close()
    if args.json:
        print(json.dumps(tl.as_dict(), default=str))
        return 0
    for line in timeline_lines(tl.as_dict(), args.evidence):
        print(line)
    return 0


def _slos(path: Path | None) -> list[Any]:
    from triscope.analysis.slo import SLOSpecError, default_slo_file, load_slo_file
    from triscope.core.errors import UserError

    path = path or default_slo_file()
    if path is None or not Path(path).exists():
        return []
    try:
        return list(load_slo_file(path))
    except SLOSpecError as e:
        raise UserError(str(e)) from None


# ---------------------------------------------------------------------------------------------- the timeline
def _clock(ts: float, day: str) -> str:
    d = datetime.fromtimestamp(ts, UTC)
    text = d.strftime("%H:%M:%S")
    return text if d.strftime("%Y-%m-%d") == day else d.strftime("%Y-%m-%d ") + text


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _workload(w: dict[str, str]) -> str:
    if not any(w.values()):
        return ""
    name = w.get("workload") or w.get("pod") or w.get("container")
    ns = w.get("namespace")
    return f"  {ns + '/' if ns else ''}{name}" + (f" (pod {w['pod']})" if w.get("pod") and w.get("workload") else "")


def timeline_lines(d: dict[str, Any], evidence: int = 3) -> list[str]:
    """The timeline as text: a header, then one block per episode in time order."""
    day = datetime.fromtimestamp(d["start"], UTC).strftime("%Y-%m-%d")
    src = {"verdict history": "the verdict history (each accelerator's published states, as runs)",
           "verdict history (node roll-up)": "the verdict history (the node's roll-up: the node as one accelerator)",
           "per-accelerator state series": "the agent's per-accelerator states",
           "node state series": "the agent's node-level state (the node as one accelerator)",
           "classifier": "the stored-window classifier"}.get(d.get("states_from") or "", "no coordination states")
    out = [f"node {d['node']}  {day} {_clock(d['start'], day)} .. {_clock(d['end'], day)} UTC",
           f"states from {src}; runs under {d['min_episode_s']:g} s merged into their neighbours; "
           f"{d['series_examined']} series examined",
           f"{d['summary']['episodes']} episode(s), {d['summary']['bad']} to explain"]
    out += [f"note: {n}" for n in d.get("notes", [])]
    for e in d["episodes"]:
        out.append("")
        when = f"{_clock(e['start'], day)} .. {_clock(e['end'], day)}  {_dur(e['duration_s']):>7}"
        score = f"  score {e['score']:.2f}" if e.get("score") is not None and e["bad"] else ""
        extra = ""
        if e["kind"] == "slo":
            extra = f"  {e.get('slo')}: burn rate up to {e.get('peak_burn_rate')}x (page at {e.get('page_factor')}x)"
        elif e["kind"] == "health" and e.get("events"):
            extra = f"  {e['events'][0]['message']}"
        if e.get("phases"):
            extra += f"  (phase {e['phase']} of {e['phases']})"
        out.append(f"{when}  {e['accelerator']}  {e['state']}{score}{_workload(e['workload'])}{extra}")
        if e["kind"] == "event":
            out.append(f"    context: {_event_text(e)}")
            continue
        if not e["bad"]:
            continue
        out += _bad_lines(e, day, evidence)
    return out


def _event_text(e: dict[str, Any]) -> str:
    """A workload-lane event (a scrape target's late /metrics) in one line."""
    blips = e.get("blips", 1)
    last = e["events"][0]["message"] if e.get("events") else ""
    return (f"the workload's own /metrics ({e.get('target', '?')}) answered late or not at all"
            + (f", {blips} times" if blips > 1 else "") + (" (still down)" if e.get("still_down") else "")
            + (f": {last}" if last else ""))


def _bad_lines(e: dict[str, Any], day: str, evidence: int) -> list[str]:
    out = [f"    detector: {v}" for v in e.get("verdict") or []]
    ref = e.get("reference")
    if e["kind"] == "slo":     # its causes are those of the episode it is linked to, printed there
        if ref and ref.get("kind") == "episode":
            top = e["causes"][0]["title"] if e["causes"] else "no cause stands out"
            how = "after" if ref.get("link") == "follows" else "during"
            out.append(f"    {how} the {ref['state']} episode on {ref['accelerator']} "
                       f"({_clock(ref['start'], day)} .. {_clock(ref['end'], day)}): {top}")
        else:
            out.append("    " + (ref or {}).get("why", "no bad coordination episode at the time"))
        return out
    if ref:
        out.append("    reference: " + _reference(ref, day))
    if not e["causes"] and e["kind"] == "state":
        out.append("    no cause stands out")
    for i, c in enumerate(e["causes"], 1):
        out.append(f"    {i}. {c['title']}  [{c['score']:.2f}]")
        if c.get("peers"):
            out.append(f"         peers: {', '.join(c['peers'][:5])}")
        for x in c["evidence"][:evidence]:
            out.append("         - " + _evidence_line(x))
    for c in e.get("context") or []:
        out.append(f"    context: {c['title']}: {c['summary']}")
    return out


def _reference(ref: dict[str, Any], day: str) -> str:
    kind = ref["kind"]
    if kind == "none":
        return "none: " + ref.get("why", "")
    if kind == "episode":
        return f"the {ref['state']} episode on {ref['accelerator']} it overlaps"
    if kind == "previous-phase":
        return (f"the phase before it ({_clock(ref['start'], day)} .. {_clock(ref['end'], day)}): "
                "what changed when this one began")
    span = f"{_clock(ref['start'], day)} .. {_clock(ref['end'], day)}" if "start" in ref else ""
    what = {"healthy-before": "the healthy period before it", "workload-history": "the workload's healthy history",
            "fleet-peers": "fleet peers at the same time", "given": "the baseline given"}.get(kind, kind)
    where = f"{ref.get('state') or ''} on {ref['node'] + '/' if ref.get('node') else ''}{ref.get('accelerator') or ''}"
    if ref.get("peers"):
        where = "peers " + ", ".join(ref["peers"])
    return f"{what}: {where.strip()}, {span}"


def _evidence_line(e: dict[str, Any]) -> str:
    from triscope.analysis.rca.changes import fmt as _fmt

    if e.get("type") == "absolute":
        return str(e["detail"])
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


# ---------------------------------------------------------------------------------------------- --ranked
def _ranked(st: Any, args: argparse.Namespace, start: float, end: float, baseline: tuple[float, float] | None) -> int:
    from triscope.analysis.rca.ranked import rank_causes

    top = args.top or 8
    res = rank_causes(st, args.node, start, end, baseline=baseline, top=top)
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
    for x in res.context:
        print(f"context: {x.title}: {x.summary}")
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
