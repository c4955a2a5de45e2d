"""Fleet: every node with its current mismatch state, score, accelerators, SLO status and last
remediation; sortable and filterable; a row opens the node page."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from triscope.dashboard import data, slo_view
from triscope.dashboard.components import NAME_CHARS, error_note, fmt_ts, full, note, short
from triscope.dashboard.context import ctx
from triscope.dashboard.figures import STATE_COLORS
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/", name="Fleet", order=0, title="triscope - fleet")

COLUMNS = [
    {"name": "node", "id": "node"},
    {"name": "state", "id": "state"},
    {"name": "score", "id": "score", "type": "numeric"},
    {"name": "accelerators", "id": "accelerators"},
    {"name": "SLO", "id": "slo"},
    {"name": "last remediation", "id": "last_remediation"},
    {"name": "last seen (UTC)", "id": "last_seen"},
]


def layout(**_: Any) -> html.Div:
    c = ctx()
    try:
        rows = data.fleet_rows(c.store, c.now(), slo_view.fleet_status(c))
    except Exception as e:  # noqa: BLE001
        return html.Div([html.H2("Fleet"), error_note("reading the fleet", e)])
    if not rows:
        return html.Div([html.H2("Fleet"), note(
            "no nodes stored yet: start the agent ('triscope agent --db URL' or 'triscope run') or import a "
            "recorded trace ('triscope import-trace'); nodes appear here with their first tick.", "warn", id="fleet-empty")])
    # long node names are shown cut (the whole name in a tooltip); "node_full" (not a column) opens the page
    records = [{
        "node": short(r.node), "node_full": r.node, "state": r.state,
        "score": None if r.score is None else round(r.score, 3),
        "accelerators": short(r.accelerators, 80), "slo": short(r.slo, 80),
        "last_remediation": short(r.last_remediation, 80),
        "last_seen": fmt_ts(r.last_seen) + ("" if r.live else " (not live)"),
    } for r in rows]
    tooltips = [{"node": full(r.node)} if len(r.node) > NAME_CHARS else {} for r in rows]
    style = [{"if": {"filter_query": f'{{state}} = "{s}"', "column_id": "state"},
              "backgroundColor": col, "color": "white", "fontWeight": "600"} for s, col in STATE_COLORS.items()]
    return html.Div([
        html.Div([html.H2("Fleet"), html.Span(f"{len(rows)} node(s); click a row to open the node",
                                              className="window-note")], className="page-head"),
        dcc.Location(id="fleet-nav", refresh="callback-nav"),
        dash_table.DataTable(  # type: ignore[attr-defined]
            id="fleet-table", columns=COLUMNS, data=records, sort_action="native", filter_action="native",
            page_size=50, style_data_conditional=style, row_selectable=False, cell_selectable=True,
            tooltip_data=tooltips, tooltip_duration=None,
            style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px", "textAlign": "left",
                        "cursor": "pointer"},
            style_header={"fontWeight": "600", "backgroundColor": "#eceff1"},
        ),
        html.Div([html.Span("states: ")] + [html.Span(s, className="state-chip", style={"backgroundColor": col})
                                            for s, col in STATE_COLORS.items()], className="legend-line"),
    ])


@page_callback(
    Output("fleet-nav", "href"),
    Input("fleet-table", "active_cell"), State("fleet-table", "derived_viewport_data"),
    prevent_initial_call=True,
)
def open_node(cell: dict[str, Any] | None, viewport: list[dict[str, Any]] | None) -> Any:
    if not cell or not viewport:
        return no_update
    row = cell.get("row")
    if row is None or row >= len(viewport):
        return no_update
    return f"/node/{quote(str(viewport[row].get('node_full') or viewport[row]['node']))}"
