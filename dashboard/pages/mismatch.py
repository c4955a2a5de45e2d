"""Mismatch: link load against accelerator busy (windows of the stored series), coloured by the
state the verdict history holds for them, for a node or the fleet; the share of time in each state
per workload, pooled over the accelerators and nodes it ran on, and per node — all from the verdict
history (``store.verdict_runs``), the record the Node, Fleet and Root cause pages read: no detector
runs here (``data.mismatch_points``, ``workload_data.workload_state_shares``)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from triscope.core.vocabulary import is_healthy
from triscope.dashboard import data, export, figures, timerange, timeview, workload_data
from triscope.dashboard.components import (
    error_note,
    fmt_ts,
    node_from_value,
    node_options,
    node_value,
    note,
    range_picker,
    short,
)
from triscope.dashboard.context import DashboardContext, ctx
from triscope.dashboard.figures import STATE_COLORS, state_style
from triscope.dashboard.ids import MismatchIds
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/mismatch", name="Mismatch", order=2, title="triscope - mismatch")
ALL = "__fleet__"
MAX_FLEET_NODES = 20  # each node's series are read for the scatter: bound the fleet view


def layout(node: str = ALL, range: str = "", **_: Any) -> html.Div:  # noqa: A002
    c = ctx()
    nodes = [n.name for n in c.store.nodes()]
    if not nodes:
        return html.Div([html.H2("Mismatch"), note("no nodes stored yet: start the agent or import a trace", "warn")])
    if not range:   # default (timerange): the last hour of the data shown, all of it when less
        range = timerange.default_preset(  # noqa: A001
            timerange.node_bounds(c.store, node) if node in nodes else timerange.store_bounds(c.store))
    return html.Div([
        html.Div([html.H2("Coordination mismatch"), html.Span(id=MismatchIds.NOTE, className="window-note")],
                 className="page-head"),
        html.Div([
            dcc.Dropdown(id=MismatchIds.NODE, options=[{"label": "whole fleet", "value": ALL}]
                         + node_options(nodes), value=node_value(node) if node in nodes else ALL,
                         clearable=False, className="node-select"),
            range_picker(MismatchIds.PICKER.prefix, range, custom=False, data=True),
        ], className="toolbar"),
        html.Div([html.Span("states: ")] + [html.Span(st, className="state-chip", style=state_style(st),
                                                      title=STATE_HELP.get(st, ""))
                                            for st in STATE_COLORS],
                 className="legend-line", id=MismatchIds.LEGEND),
        dcc.Store(id=MismatchIds.META),
        dcc.Loading([export.buttons(MismatchIds.SCATTER),
                     dcc.Graph(id=MismatchIds.SCATTER, config={"displaylogo": False}),
                     html.H3("Share of time in each state, per workload"),
                     html.Div(id=MismatchIds.WORKLOAD_NOTE, className="muted"),
                     export.buttons(MismatchIds.WORKLOADS),
                     dcc.Graph(id=MismatchIds.WORKLOADS, config={"displaylogo": False}),
                     html.H3("Share of time in each state, per node"),
                     export.buttons(MismatchIds.SHARE),
                     dcc.Graph(id=MismatchIds.SHARE, config={"displaylogo": False})], delay_show=400, type="dot"),
        html.P("Each point is one window of the stored series: accelerator busy is GPM SM activity (or NPU AICore), "
               "link load the busier PCIe direction against the link's effective ceiling; its colour is the state the "
               "agent published for that window (the verdict history, as on the Node and Root cause pages). "
               "io-saturated: starved while the link is near "
               "its ceiling; staging-bound: starved while the link runs well below it and the host copies/pins or a "
               "feeder thread is pegged or waits for a CPU; network-bound: starved while TCP retransmits climb; "
               "demand-limited: not busy, and nothing says I/O or the host holds it back (the workload asks for "
               "little; never a page).", className="muted"),
    ])


STATE_HELP = {
    "idle": "no work on the accelerator",
    "demand-limited": "not busy, and no I/O or host evidence: the workload is not asking for more (never a page)",
    "compute-bound": "the accelerator is busy",
    "balanced": "compute and link both near their ceilings",
    "io-saturated": "starved while the link is near its ceiling",
    "staging-bound": "starved while the host stages copies, pins memory, or a feeder is pegged / waits for a CPU",
    "network-bound": "starved while TCP retransmits climb",
}


@page_callback(
    Output(MismatchIds.SCATTER, "figure"), Output(MismatchIds.SHARE, "figure"), Output(MismatchIds.NOTE, "children"),
    Output(MismatchIds.WORKLOADS, "figure"), Output(MismatchIds.WORKLOAD_NOTE, "children"),
    Output(MismatchIds.META, "data"),
    Input(MismatchIds.NODE, "value"), Input(MismatchIds.PICKER.range, "value"), Input(timeview.TZ_STORE, "data"),
)
def render(value: str, preset: str, tz: dict[str, Any] | None = None) -> tuple[Any, Any, Any, Any, Any, Any]:
    c = ctx()
    zone = timeview.zone_of(tz)
    try:
        all_nodes = sorted(c.store.nodes(), key=lambda n: -n.last_seen)
        node = ALL if value == ALL else node_from_value(value, (n.name for n in all_nodes)) or ALL
        nodes = [n.name for n in all_nodes[:MAX_FLEET_NODES]] if node == ALL else [node]
        bounds = timerange.node_bounds(c.store, node) if node != ALL else timerange.store_bounds(c.store, set(nodes))
        w = timerange.window(preset, bounds, c.now())
        per_node = max(60, 300 // max(1, len(nodes)))
        pts, shares = data.mismatch_points(c.store, nodes, w, max_windows=per_node)
        head = f"{fmt_ts(w.start, zone)} to {fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}" + (
            f" ({w.note})" if w.note else "")
        if node == ALL and len(all_nodes) > MAX_FLEET_NODES:
            head += f"; the {MAX_FLEET_NODES} most recently seen of {len(all_nodes)} nodes (pick one for the others)"
        missing = [n for n in nodes if n not in shares]
        if missing:
            head += f"; no state stored: {', '.join(short(n) for n in missing[:8])}" + (" ..." if len(missing) > 8 else "")
        recs = {n.name: n.recording for n in all_nodes if n.name in nodes and n.recording}
        if recs:
            head += (f"; recording ({next(iter(recs.values()))}), not live" if node != ALL
                     else f"; {len(recs)} of these are recordings, not live: {', '.join(short(n) for n in sorted(recs)[:6])}")
    except Exception as e:  # noqa: BLE001
        msg = figures.empty_figure("the states could not be read over this range (see the note)")
        return msg, msg, error_note("reading the verdict history", e), msg, "", None
    try:
        wfig, wnote = _workloads(c, nodes, w)
    except Exception as e:  # noqa: BLE001
        wfig, wnote = figures.empty_figure("the workloads' states could not be read (see the note)"), \
            error_note("reading the per-accelerator states", e)
    meta = {"node": None if node == ALL else node, "start": w.start, "end": w.end}
    scatter = export.attach_series(figures.mismatch_scatter(pts), _scatter_series(pts))
    share = export.attach_series(figures.state_share_figure(shares), _share_series(shares, w.end, "node"))
    return scatter, share, head, wfig, wnote, meta


for _gid, _chart in ((MismatchIds.SCATTER, "mismatch-windows"), (MismatchIds.WORKLOADS, "mismatch-workload-states"),
                     (MismatchIds.SHARE, "mismatch-node-states")):
    export.register(_gid, _chart, MismatchIds.META)


def _scatter_series(pts: list[data.MismatchPoint]) -> list[export.Series]:
    """The scatter's windows for the download: per node and state, busy and link load (%) at each
    window's time, the score alongside."""
    groups: dict[tuple[str, str], list[data.MismatchPoint]] = {}
    for p in sorted(pts, key=lambda p: p.ts):
        groups.setdefault((p.node, p.state), []).append(p)
    out: list[export.Series] = []
    for (node, state), ps in groups.items():
        for what, unit, get in (("accelerator busy", "%", lambda p: p.busy * 100),
                                ("link load", "% of ceiling", lambda p: p.link_util * 100),
                                ("score", "", lambda p: p.score)):
            out.append(export.Series(f"{state}: {what}", {"node": node, "state": state}, unit,
                                     [(p.ts, get(p)) for p in ps]))
    return out


def _share_series(shares: Any, end: float, key: str) -> list[export.Series]:
    """The share bars for the download: one point per (row, state), at the range's end."""
    return [export.Series(f"{short(k)}: {state}", {key: k, "state": state}, "% of time", [(end, f * 100)])
            for k, sh in shares.items() for state, f in sh.items()]


def _workloads(c: DashboardContext, nodes: list[str], w: data.Window) -> tuple[Any, Any]:
    """Per workload: the share of its accelerator time in each state, worst (most I/O) first."""
    import functools

    ws = workload_data.workload_state_shares(c.store, nodes, w.start, w.end,
                                             owners=functools.partial(workload_data.workload_owners, c.store))
    if not ws.shares:
        return figures.empty_figure("no per-accelerator verdict stored in this range (the agent's tracker labels its "
                                    "per-accelerator verdicts with the workload; older agents store the node's state "
                                    "only)", 220), ""
    bad = {k: sum(v for st, v in sh.items() if not is_healthy(st)) for k, sh in ws.shares.items()}
    order = sorted(ws.shares, key=lambda k: (-bad[k], k))
    where = {}
    for k in order:
        accs = ws.where.get(k, set())
        nn = len({n for n, _ in accs})
        where[k] = f"{len(accs)} accelerator(s) on {nn} node(s), {ws.seconds.get(k, 0.0) / 3600:.2f} accelerator-hours"
    fig = export.attach_series(figures.state_share_figure({k: ws.shares[k] for k in order}, notes=where),
                               _share_series({k: ws.shares[k] for k in order}, w.end, "workload"))
    msg = (f"{len(order)} workload(s) from {ws.runs_read} verdict run(s) of the history; grouped by owner "
           "(Deployment/name, from the engine's workloads table) where resolved, else by pod")
    return fig, msg
