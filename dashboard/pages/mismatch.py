"""Mismatch: link load against accelerator busy, coloured by state, for a node or the fleet; the
share of time in each state per node (``triscope.analysis.mismatch.node_states`` over stored series)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from triscope.dashboard import data, figures
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
from triscope.dashboard.context import ctx
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/mismatch", name="Mismatch", order=2, title="triscope - mismatch")
ALL = "__fleet__"
MAX_FLEET_NODES = 20  # the detector runs per node over stored series: bound the fleet view


def layout(node: str = ALL, range: str = "1h", **_: Any) -> html.Div:  # noqa: A002
    c = ctx()
    nodes = [n.name for n in c.store.nodes()]
    if not nodes:
        return html.Div([html.H2("Mismatch"), note("no nodes stored yet: start the agent or import a trace", "warn")])
    return html.Div([
        html.Div([html.H2("Coordination mismatch"), html.Span(id="mismatch-note", className="window-note")],
                 className="page-head"),
        html.Div([
            dcc.Dropdown(id="mismatch-node", options=[{"label": "whole fleet", "value": ALL}]
                         + node_options(nodes), value=node_value(node) if node in nodes else ALL,
                         clearable=False, className="node-select"),
            range_picker("mismatch", range, custom=False),
        ], className="toolbar"),
        dcc.Loading([dcc.Graph(id="mismatch-scatter", config={"displaylogo": False}),
                     html.H3("Share of time in each state"),
                     dcc.Graph(id="mismatch-share", config={"displaylogo": False})], delay_show=400, type="dot"),
        html.P("Each point is one detector window: accelerator busy is GPM SM activity (or NPU AICore), link load the "
               "busier PCIe direction against the link's effective ceiling. io-saturated: starved while the link is near "
               "its ceiling; staging-bound: starved while the link runs well below it and the host copies/pins; "
               "network-bound: starved while TCP retransmits climb.", className="muted"),
    ])


@page_callback(
    Output("mismatch-scatter", "figure"), Output("mismatch-share", "figure"), Output("mismatch-note", "children"),
    Input("mismatch-node", "value"), Input("mismatch-range", "value"),
)
def render(value: str, preset: str) -> tuple[Any, Any, Any]:
    c = ctx()
    try:
        all_nodes = sorted(c.store.nodes(), key=lambda n: -n.last_seen)
        node = ALL if value == ALL else node_from_value(value, (n.name for n in all_nodes)) or ALL
        nodes = [n.name for n in all_nodes[:MAX_FLEET_NODES]] if node == ALL else [node]
        w = data.resolve_window(c.store, None if node == ALL else node, preset, c.now())
        per_node = max(60, 300 // max(1, len(nodes)))
        pts, shares = data.mismatch_points(c.store, nodes, w, max_windows=per_node)
        head = f"{fmt_ts(w.start)} to {fmt_ts(w.end)} UTC" + (f" ({w.note})" if w.note else "")
        if node == ALL and len(all_nodes) > MAX_FLEET_NODES:
            head += f"; the {MAX_FLEET_NODES} most recently seen of {len(all_nodes)} nodes (pick one for the others)"
        missing = [n for n in nodes if n not in shares]
        if missing:
            head += f"; no accelerator data: {', '.join(short(n) for n in missing[:8])}" + (" ..." if len(missing) > 8 else "")
        return figures.mismatch_scatter(pts), figures.state_share_figure(shares), head
    except Exception as e:  # noqa: BLE001
        msg = figures.empty_figure("the detector could not run over this range (see the note)")
        return msg, msg, error_note("running the mismatch detector", e)
