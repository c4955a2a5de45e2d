"""The wait-for chain drawn: the Node page's figure of where each accelerator's driving threads'
time went, and the Root cause page's chain of an episode.  Plain functions from
``triscope.dashboard.waitfor_data`` rows (or the chain evidence of a root-cause answer) to a
Plotly figure dict or Dash components: no store, no request, unit-tested without a browser.

Colours follow the dashboard's (``figures.STATE_COLORS``): a chain end is coloured by the group
the verdict puts it in, and each group takes the colour of the state it makes — staging the
``staging-bound`` orange, network the ``network-bound`` purple, the accelerator the
``compute-bound`` green, demand the ``demand-limited`` grey — so an end reads as the state it
causes; a lossless client-side connection (upstream: a slow peer, never a state of its own) is a
pale indigo.  The first-hop states take the colour of what they are elsewhere: a pageable copy
the staging orange, the accelerator its green, a thread on its CPU the Node page's feeder-busy
amber, waiting for a CPU its CPU-wait brown, the network a lighter network purple (a socket wait
is not a loss until the chain says so), sleeping the demand-limited grey.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dash import dcc, html

from triscope.analysis.features import workload_text
from triscope.core.names import shorten
from triscope.dashboard.components import note
from triscope.dashboard.figures import (
    FONT,
    SERIES_KINDS,
    STATE_COLORS,
    UNKNOWN_STATE_COLOR,
    display_names,
    to_dt,
)
from triscope.dashboard.ids import NodeIds
from triscope.dashboard.jsontypes import JSON
from triscope.dashboard.timeview import localize_figure
from triscope.dashboard.waitfor_data import NO_EVIDENCE, AccelWaitFor, ChainEnd, DriverTime

FIRST_HOP_COLORS: dict[str, str] = {
    "cpu": SERIES_KINDS["triscope_workload_feeder_busy_ratio"][1],      # a thread on its CPU (feeder busy's amber)
    "cpu_wait": SERIES_KINDS["triscope_workload_cpu_wait_ratio"][1],    # runnable without a CPU (CPU wait's brown)
    "accelerator": STATE_COLORS["compute-bound"],                       # waiting on the accelerator
    "copy_pinned": "#81c784",                                           # pinned copies: the accelerator's, lighter
    "copy_pageable": STATE_COLORS["staging-bound"],                     # the CPU staging pageable copies
    "disk": "#ffb74d",                                                  # disk reads: staging's, lighter
    "lock": "#26c6da",                                                  # a futex: another thread of the workload
    "ipc": "#4db6ac",                                                   # pipe, Unix socket, eventfd: a producer
    "network": "#ab47bc",                                               # a network socket (loss or not: the chain says)
    "timer": STATE_COLORS["demand-limited"],                            # sleeping, pacing
    "other": STATE_COLORS["idle"],
}
FIRST_HOP_NAMES: dict[str, str] = {
    "cpu": "on a CPU", "cpu_wait": "waiting for a CPU", "accelerator": "on the accelerator",
    "copy_pinned": "pinned copies", "copy_pageable": "pageable copies", "disk": "disk", "lock": "a lock (futex)",
    "ipc": "a producer (IPC)", "network": "the network", "timer": "sleeping", "other": "other",
}
GROUP_COLORS: dict[str, str] = {
    "staging": STATE_COLORS["staging-bound"],
    "network": STATE_COLORS["network-bound"],
    "accelerator": STATE_COLORS["compute-bound"],
    "demand": STATE_COLORS["demand-limited"],
    "upstream": "#9fa8da",
    "unseen": "#cfd8dc",
    "": UNKNOWN_STATE_COLOR,
}
GROUP_NAMES: dict[str, str] = {
    "staging": "staging (makes staging-bound)",
    "network": "network loss (makes network-bound)",
    "accelerator": "the accelerator (its own limit)",
    "demand": "demand: requests, pacing, idle",
    "upstream": "a slow peer, no loss",
    "unseen": "a producer not followed (left out)",
    "": "not classified",
}
GROUP_SHORT = {"staging": "staging", "network": "network", "accelerator": "accelerator", "demand": "demand",
               "upstream": "upstream", "unseen": "not followed", "": "not classified"}
RELATION_SHORT = {"self": "itself", "process": "same process", "workload": "same workload", "pod": "same pod",
                  "other": "another workload", "kernel": "kernel thread"}
DECIDING_LINE = "#212121"
LABEL_CHARS = 56          # an end's label on the figure; the whole of it in the hover
ROW_PX = 210              # one workload's row
TITLE_PX = 84             # the row's title above it (and the time axis' labels of the row before)
TOP_PX = 84               # the two legends
TIME_DOMAIN = (0.0, 0.5)  # the first-hop chart; the ends' labels sit between it and their bars
ENDS_DOMAIN = (0.80, 0.97)


# ---------------------------------------------------------------------------------------------- words
def end_who(cause: str, relation: str, culprit: str) -> str:
    """What the chain ended on: ``lab-b-prep (same pod)``, ``connection to 10.0.0.5:8080 (outbound)``,
    ``the accelerator``, ``the driving thread``; ``... (summed)`` for the rest of a cause the agent
    summed past its three largest culprits."""
    if cause == "rest":
        return "smaller ends (summed)"
    summed = not culprit and not relation
    if cause == "network":
        if summed:
            return "other connections (summed)"
        peer = culprit or "a peer"
        return {"inbound": f"connection from {peer} (inbound)", "outbound": f"connection to {peer} (outbound)"}.get(
            relation, f"connection {peer}")
    if cause in ("accelerator", "copy_pinned"):
        return "the accelerator"
    if cause == "other":
        return "nothing identifiable"
    if relation == "self":
        return "the driving thread"
    if summed or not culprit:
        return "other threads (summed)" if cause == "timer" else "other producers (summed)"
    return f"{culprit} ({RELATION_SHORT.get(relation, relation or 'unknown')})"


def end_what(cause: str, relation: str, group: str) -> str:
    """What it was doing there: ``held at its CPU limit``, ``loses packets``, ``waiting for requests``."""
    if cause == "cpu":
        if relation == "self":
            return {"accelerator": "on its CPU, launching work", "demand": "on its CPU, polling (nobody waits on it)",
                    "staging": "on its CPU, host work"}.get(group, "on its CPU")
        return "working on a CPU"
    if cause == "network":
        return {"network": "loses packets", "demand": "waiting for requests",
                "upstream": "slow peer, no loss"}.get(group, "")
    return {"cpu_wait": "waiting for a CPU", "cpu_throttled": "held at its CPU limit",
            "copy_pageable": "copying from pageable memory", "copy_pinned": "pinned copies", "disk": "reading disk",
            "producer": "not traced yet", "timer": "sleeping (timer, pacing)"}.get(cause, "")


def end_label(e: ChainEnd | Mapping[str, Any]) -> str:
    """One end in a line: ``lab-b-prep (same pod) — held at its CPU limit``."""
    cause, relation, culprit, group = ((e.cause, e.relation, e.culprit, e.group) if isinstance(e, ChainEnd) else
                                       (str(e.get("cause", "")), str(e.get("relation", "")),
                                        str(e.get("culprit", "")), str(e.get("group", ""))))
    who, what = end_who(cause, relation, shorten(culprit, 40)), end_what(cause, relation, group)
    return f"{who} \u2014 {what}" if what else who


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if x >= 0.01 or x == 0 else "<1%"


# ---------------------------------------------------------------------------------------------- node page
def workload_name(ref: Any) -> str:
    """``lab/lab-b``, with `` / container lab-b-prep`` where the container is not the pod's name."""
    who = str(ref.display or "no workload")
    if ref.container and ref.container != ref.pod:
        who += f" / {ref.container}"
    return who


def row_title(d: DriverTime) -> str:
    """A workload's row: who, how many threads' worth, what the verdict reads from its chain."""
    who = workload_name(d.ref)
    threads = [t for t in d.threads if t is not None]
    mean = sum(threads) / len(threads) if threads else 0.0
    found = {"driver_calls": "driver calls", "driver_waits": "waits on the driver", "main_thread": "main thread"}.get(
        d.found_by, d.found_by)
    head = f"<b>{shorten(who, 70)}</b> \u00b7 {mean:.1f} thread(s) of driving time" + (f" (found by {found})" if found else "")
    if d.state:
        named = f", naming {shorten(workload_text(d.named), 60)}" if d.named and d.named != _key(d) else ""
        verdict = f"<b>{d.state}</b>: {d.deciding} holds {d.strength:.0%} of its working time{named}"
    elif d.note:
        verdict = "chain not read by the verdict"
    elif d.work is not None:
        verdict = f"no I/O cause ({d.work:.0%} of its time had work)"
    else:
        verdict = ""
    return head + (f"<br>{verdict}" if verdict else "")


def _key(d: DriverTime) -> tuple[str, str, str, str]:
    return (d.ref.namespace, d.ref.pod, d.ref.container, d.ref.workload)


def driver_time_figure(aw: AccelWaitFor, window: tuple[float, float], uirevision: Any = "waitfor") -> dict[str, Any]:
    """One accelerator's figure: a row per traced workload, on the left its driving threads' first
    hop over time (stacked bars per time bucket, % of their time), on the right the chain's ends
    over the window (a bar each, largest first, coloured by the verdict's group; the deciding
    group's outlined).  A plain dict (plain lists): ``dcc.Graph`` takes it as it is."""
    rows = aw.traced
    if not rows:
        raise ValueError("driver_time_figure needs a traced workload: say NO_EVIDENCE instead")
    n = len(rows)
    height = TOP_PX + 44 + n * (ROW_PX + TITLE_PX) - TITLE_PX + 40
    layout: dict[str, Any] = {
        "height": height, "font": FONT, "template": "plotly_white", "uirevision": uirevision,
        "barmode": "stack", "bargap": 0.25, "hovermode": "closest",
        "margin": {"l": 60, "r": 20, "t": TOP_PX + 44, "b": 40}, "annotations": [],
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 1.0, "yanchor": "top",
                   "font": {"size": 11}, "title": {"text": "first hop:"}},
        "legend2": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 1.0 - 40 / height,
                    "yanchor": "top", "font": {"size": 11}, "title": {"text": "chain ends:"}},
    }
    data: list[dict[str, Any]] = []
    seen_states: set[str] = set()
    seen_groups: set[str] = set()
    plot_h = height - (TOP_PX + 44) - 40
    a, b = to_dt(list(window))
    for r, d in enumerate(rows):
        top = 1.0 - r * (ROW_PX + TITLE_PX) / plot_h
        bottom = max(0.0, top - ROW_PX / plot_h)
        sfx_t, sfx_e = str(2 * r + 1) if r else "", str(2 * r + 2)     # the time chart's axes, the ends'
        xt, yt, xe, ye = f"x{sfx_t}", f"y{sfx_t}", f"x{sfx_e}", f"y{sfx_e}"
        layout[f"xaxis{sfx_t}"] = {"domain": list(TIME_DOMAIN), "anchor": yt, "type": "date", "range": [a, b],
                                   "showgrid": False}
        layout[f"yaxis{sfx_t}"] = {"domain": [bottom, top], "anchor": xt, "range": [0, 100], "ticksuffix": "%",
                                   "fixedrange": True, "title": {"text": "of their time", "font": {"size": 11}}}
        layout[f"xaxis{sfx_e}"] = {"domain": list(ENDS_DOMAIN), "anchor": ye, "range": [0, 118], "ticksuffix": "%",
                                   "fixedrange": True, "showgrid": True}
        layout["annotations"].append({"text": row_title(d), "xref": "paper", "yref": "paper", "x": 0, "y": top,
                                      "xanchor": "left", "yanchor": "bottom", "showarrow": False, "align": "left",
                                      "font": {"size": 12, "color": "#37474f"}})
        layout["annotations"].append({"text": "where the chain ends (over the range)", "xref": "paper",
                                      "yref": "paper", "x": ENDS_DOMAIN[1], "y": top, "xanchor": "right",
                                      "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": "#607d8b"}})
        who = shorten(workload_name(d.ref), 60)
        mid = to_dt([t + d.width / 2 for t in d.bucket_start])
        threads = [None if t is None else round(t, 2) for t in d.threads]
        for state, shares in d.states.items():
            if not any(v for v in shares if v is not None):
                continue
            data.append({
                "type": "bar", "x": mid, "y": [None if v is None else round(v * 100, 2) for v in shares],
                "width": d.width * 1000.0, "xaxis": xt, "yaxis": yt, "name": FIRST_HOP_NAMES.get(state, state),
                "legendgroup": f"hop:{state}", "showlegend": state not in seen_states, "legend": "legend",
                "marker": {"color": FIRST_HOP_COLORS.get(state, UNKNOWN_STATE_COLOR), "line": {"width": 0}},
                "customdata": threads,
                "hovertemplate": f"%{{y:.0f}}% {FIRST_HOP_NAMES.get(state, state)}<br>%{{customdata}} thread-s/s"
                                 f"<extra>{who}</extra>",
                "meta": {"workload": who, "state": state},
            })
            seen_states.add(state)
        _ends_traces(d, xe, ye, who, data, seen_groups)
        labels = display_names([end_label(e) for e in d.ends], LABEL_CHARS)
        layout[f"yaxis{sfx_e}"] = {"domain": [bottom, top], "anchor": xe, "type": "category", "autorange": "reversed",
                                   "categoryorder": "array", "categoryarray": labels, "fixedrange": True,
                                   "tickfont": {"size": 11}}
        if not d.ends:
            layout["annotations"].append({"text": "no chain series in this range", "xref": f"{xe} domain",
                                          "yref": f"{ye} domain", "x": 0.5, "y": 0.5, "showarrow": False,
                                          "font": {"size": 12, "color": "#666"}})
    return {"data": data, "layout": layout}


def _ends_traces(d: DriverTime, xe: str, ye: str, who: str, data: list[dict[str, Any]], seen: set[str]) -> None:
    """The ends of one workload's chain: one bar trace per group (its legend entry), in share order."""
    labels = display_names([end_label(e) for e in d.ends], LABEL_CHARS)
    by_group: dict[str, list[tuple[str, ChainEnd]]] = {}
    for lab, e in zip(labels, d.ends, strict=True):
        by_group.setdefault(e.group, []).append((lab, e))
    for g in [g for g in GROUP_COLORS if g in by_group] + [g for g in by_group if g not in GROUP_COLORS]:
        items = by_group[g]
        deciding = [bool(d.deciding) and e.group == d.deciding for _, e in items]
        data.append({
            "type": "bar", "orientation": "h", "x": [round(e.share * 100, 2) for _, e in items],
            "y": [lab for lab, _ in items], "xaxis": xe, "yaxis": ye, "name": GROUP_NAMES.get(g, g),
            "legendgroup": f"group:{g}", "showlegend": g not in seen, "legend": "legend2",
            "marker": {"color": GROUP_COLORS.get(g, UNKNOWN_STATE_COLOR),
                       "line": {"color": DECIDING_LINE, "width": [2.5 if x else 0 for x in deciding]}},
            "text": [_pct(e.share) for _, e in items], "textposition": "outside", "cliponaxis": False,
            "customdata": [[shorten(e.words or end_label(e), 200), GROUP_SHORT.get(e.group, e.group),
                            " \u2014 decides" if dec else ""] for (_, e), dec in zip(items, deciding, strict=True)],
            "hovertemplate": "%{x:.1f}% %{customdata[0]}<br>group: %{customdata[1]}%{customdata[2]}"
                             f"<extra>{who}</extra>",
            "meta": {"workload": who, "group": g, "culprits": [e.culprit for _, e in items],
                     "relations": [e.relation for _, e in items], "causes": [e.cause for _, e in items],
                     "deciding": deciding},
        })
        seen.add(g)


def untraced_note(refs: Sequence[Any]) -> str:
    """The line for workloads without wait-for series: never an empty chart."""
    names = ", ".join(shorten(workload_name(r), 60) for r in refs[:6]) + (
        f" and {len(refs) - 6} more" if len(refs) > 6 else "")
    return f"{names}: {NO_EVIDENCE}"


# ---------------------------------------------------------------------------------------------- root cause
def chain_evidence(evidence: Sequence[JSON] | None) -> dict[str, JSON] | None:
    """A cause's chain (``triscope.analysis.rca.chain``): its first evidence item when that is of
    type ``chain``; None otherwise."""
    if not evidence:
        return None
    first = evidence[0]
    return dict(first) if isinstance(first, Mapping) and first.get("type") == "chain" else None


def _key4(v: Any) -> tuple[str, str, str, str] | None:
    """A workload key from the evidence's JSON list; None when it is not one."""
    if not isinstance(v, list | tuple) or len(v) != 4:
        return None
    return (str(v[0]), str(v[1]), str(v[2]), str(v[3]))


def chain_view(ev: Mapping[str, Any], where: str = "", id: str | None = None) -> html.Div:  # noqa: A002
    """An episode's chain: the driving thread, then what it waited on (each end with its share,
    culprit, relation and what it was doing, a bar in its group's colour; the deciding group's ends
    marked), the groups' shares, and the verdict's reason (``detail``)."""
    state = str(ev.get("state") or "")
    deciding = {"staging-bound": "staging", "network-bound": "network"}.get(state, "")
    wl, named = _key4(ev.get("workload")), _key4(ev.get("named"))
    who = workload_text(wl) if wl is not None else "its workload"
    source = html.Div([html.Div((where + " \u00b7 ") if where else "", className="wf-where"),
                       html.Div(shorten(who, 80), className="wf-driver", title=who),
                       html.Div("driving thread waited on \u2192", className="muted")], className="wf-source")
    items = []
    for e in list(ev.get("ends") or [])[:6]:
        g = str(e.get("group", ""))
        share = float(e.get("share") or 0.0)
        dec = bool(deciding) and g == deciding
        li_attrs: dict[str, Any] = {"data-culprit": str(e.get("culprit", "")), "data-relation": str(e.get("relation", "")),
                                    "data-cause": str(e.get("cause", "")), "data-group": g, "data-share": f"{share:.4f}"}
        items.append(html.Li([
            html.Span(_pct(share), className="wf-share"),
            html.Span(html.Span(className="wf-bar", style={"width": f"{max(1.0, min(100.0, share * 100)):.1f}%",
                                                           "backgroundColor": GROUP_COLORS.get(g, UNKNOWN_STATE_COLOR)}),
                      className="wf-track"),
            html.Span(shorten(end_label(e), 90), className="wf-label", title=str(e.get("words") or "")),
            html.Span(GROUP_SHORT.get(g, g) + (" \u2014 decides" if dec else ""), className="wf-group",
                      style={"borderColor": GROUP_COLORS.get(g, UNKNOWN_STATE_COLOR)}),
        ], className="wf-end" + (" wf-deciding" if dec else ""), **li_attrs))
    groups = dict(ev.get("groups") or {})
    chips = [html.Span(f"{GROUP_SHORT.get(g, g)} {_pct(float(v))}" + (" (decides)" if g == deciding else ""),
                       className="wf-group-chip" + (" wf-deciding" if g == deciding else ""),
                       style={"borderColor": GROUP_COLORS.get(g, UNKNOWN_STATE_COLOR)})
             for g, v in sorted(groups.items(), key=lambda kv: -float(kv[1])) if float(v) >= 0.005]
    head = f"The chain: {state or 'no I/O state'}"
    if named is not None and named != wl:
        head += f", naming {workload_text(named)}"
    kids: list[Any] = [html.Div(head, className="wf-chain-head"),
                       html.Div([source, html.Ol(items, className="wf-ends")], className="wf-flow")]
    if chips:
        kids.append(html.Div([html.Span("of the driving thread's time: ", className="muted"), *chips],
                             className="wf-groups"))
    if ev.get("detail"):
        kids.append(html.Div(str(ev["detail"]), className="wf-detail"))
    attrs: dict[str, Any] = {"data-state": state, "data-named": workload_text(named) if named is not None else ""}
    if id:
        attrs["id"] = id
    return html.Div(kids, className="wf-chain", **attrs)


def accel_slug(a: Any) -> str:
    """``gpu0``, ``npu3-0``: an accelerator in an element id."""
    return "".join(ch if ch.isalnum() else "-" for ch in f"{a.kind}{a.index}" + (f"-{a.chip}" if a.chip else ""))


def node_panel(rows: Sequence[AccelWaitFor], window: tuple[float, float], picked: Any = None,
               uirevision: Any = "waitfor", zone: Any = None) -> html.Div:
    """The Node page's wait-for section: per accelerator its figure (``driver_time_figure``) with the
    verdict's reading of each workload's chain under it; workloads without wait-for series in one
    line each (``NO_EVIDENCE``), never an empty chart."""
    where = picked.name if picked is not None else "each accelerator"
    kids: list[Any] = [html.H3(f"Where the driving threads' time went, {where}")]
    if any(aw.traced for aw in rows):
        kids.append(html.Div("the threads that issue the accelerator's work (docs/waitfor.md): left, where their "
                             "time went over the range (the first hop, % of their time per time bucket); right, "
                             "where the chain of waits from them ends over the whole range, each end coloured by "
                             "the state it makes (staging orange, network loss purple, the accelerator green, "
                             "demand grey) and the ends that decide the verdict outlined", className="muted"))
    if not rows:
        kids.append(note(f"no workload on {where} in this range", "info", id=NodeIds.WAITFOR_NONE))
    for aw in rows:
        slug = accel_slug(aw.accel)
        part: list[Any] = [html.H4(aw.accel.name, className="wf-accel-name")]
        if aw.traced:
            fig = driver_time_figure(aw, window, uirevision=f"{uirevision}|{slug}")
            localize_figure(fig, zone)
            part.append(dcc.Graph(id=NodeIds.waitfor_graph(slug), figure=fig, config={"displaylogo": False},
                                  className="wf-graph"))
            lines = []
            for d in aw.traced:
                text = (d.reasons[:2] if d.reasons else []) + ([d.note] if d.note else [])
                if text:
                    lines.append(html.Li([html.B(shorten(d.ref.display or "no workload", 60) + ": "),
                                          html.Span("; ".join(text))]))
            if lines:
                part.append(html.Ul(lines, className="wf-reasons", id=NodeIds.waitfor_reasons(slug)))
            if aw.more:
                part.append(html.Div(f"{aw.more} more traced workload(s) on {aw.accel.name} not drawn (the "
                                     "ones with the most driving-thread time are)", className="muted"))
        if aw.untraced:
            part.append(note(untraced_note(aw.untraced), "info", id=NodeIds.waitfor_untraced(slug)))
        elif not aw.traced:
            part.append(note(f"no workload attributed on {aw.accel.name} in this range", "info",
                             id=NodeIds.waitfor_untraced(slug)))
        div_attrs: dict[str, Any] = {"data-accel": aw.accel.name}
        kids.append(html.Div(part, className="wf-accel", id=NodeIds.waitfor_accel(slug), **div_attrs))
    return html.Div(kids, id=NodeIds.WAITFOR_PANEL)
