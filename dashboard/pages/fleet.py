"""Fleet: every node with its current mismatch state and score, a cell per accelerator (its state
colour and workload), SLO status and last remediation; sortable and filterable; a row opens the
node page, an accelerator's cell the node page on that accelerator."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from triscope.dashboard import data, slo_view, timeview
from triscope.dashboard.components import NAME_CHARS, error_note, fmt_ts, full, note, short
from triscope.dashboard.context import ctx
from triscope.dashboard.figures import STATE_COLORS
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/", name="Fleet", order=0, title="triscope - fleet")

COLUMNS = [
    {"name": ["", "node"], "id": "node"},
    {"name": ["node", "state"], "id": "state"},
    {"name": ["node", "score"], "id": "score", "type": "numeric"},
]
TAIL = [
    {"name": ["", "accelerators"], "id": "accelerators"},
    {"name": ["", "SLO"], "id": "slo"},
    {"name": ["", "last remediation"], "id": "last_remediation"},
    {"name": ["", "last seen (UTC)"], "id": "last_seen"},
]
MAX_ACCEL_COLUMNS = 16     # a node with more shows the rest on its node page
WORKLOAD_CHARS = 30        # a workload's name in a cell; the whole of it in the tooltip
ACCEL_HEAD = "per accelerator: workload, state (click one for its node page)"


def accel_columns(n: int) -> list[dict[str, Any]]:
    return [{"name": [ACCEL_HEAD, str(i)], "id": f"a{i}"} for i in range(n)]


def cell_record(i: int, cell: Any) -> tuple[dict[str, Any], str]:
    """The record fields of accelerator cell ``i`` (text, hidden state for the colour, hidden
    URL parameters for the click) and its tooltip (the accelerator, score, the pod behind a
    resolved workload, the container: short, there is one per accelerator of the fleet)."""
    state = cell.state or ""
    text = short(cell.workload_text(brief=True), WORKLOAD_CHARS) + "\n" + (state or "-")
    w = cell.shown_workload
    tip = cell.accel.name + (f", score {cell.score:.2f}" if cell.score is not None and state else "")
    if not state:
        tip += ", no per-accelerator state stored (the node's is in its state column)"
    if w is not None and w.pod and w.kind_name:   # the cell shows Kind/name: say which pod
        tip += f": {w.namespace}/{w.pod}"
    if w is not None and w.container:
        tip += f" ({w.container})"
    if len(cell.workloads) > 1:
        tip += f"; {len(cell.workloads)} workloads: " + ", ".join(short(x.brief, 40) for x in cell.workloads[:4])
    return {f"a{i}": text, f"s{i}": state, f"q{i}": cell.accel.query}, full(tip)


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
    slots = min(MAX_ACCEL_COLUMNS, max((len(r.cells) for r in rows), default=0))
    # long node names are shown cut (the whole name in a tooltip); "node_full" (not a column) opens the page
    records: list[dict[str, Any]] = []
    tooltips: list[dict[str, Any]] = []
    n_accels = 0
    for r in rows:
        rec: dict[str, Any] = {
            "node": short(r.node), "node_full": r.node, "state": r.state,
            "score": None if r.score is None else round(r.score, 3),
            "accelerators": short(r.accelerators, 80), "slo": short(r.slo, 80),
            "last_remediation": short(r.last_remediation, 80),
            "last_seen": fmt_ts(r.last_seen) + ("" if r.live else " (not live)"),
            "last_seen_ts": r.last_seen, "live": r.live,   # not columns: the local-time toggle rewrites last_seen
        }
        tip: dict[str, Any] = {"node": full(r.node)} if len(r.node) > NAME_CHARS else {}
        n_accels += len(r.cells)
        for i, cell in enumerate(r.cells[:slots]):
            fields, t = cell_record(i, cell)
            rec.update(fields)
            tip[f"a{i}"] = t
        records.append(rec)
        tooltips.append(tip)
    style: list[dict[str, Any]] = [{"if": {"filter_query": f'{{state}} = "{s}"', "column_id": "state"},
                                    "backgroundColor": col, "color": "white", "fontWeight": "600"}
                                   for s, col in STATE_COLORS.items()]
    style += [{"if": {"filter_query": f'{{s{i}}} = "{s}"', "column_id": f"a{i}"}, "backgroundColor": col,
               "color": "white"} for i in range(slots) for s, col in STATE_COLORS.items()]
    head = f"{len(rows)} node(s)" + (f", {n_accels} accelerator(s)" if n_accels else "") + \
        "; click a row to open the node, an accelerator's cell to open the node on it"
    return html.Div([
        html.Div([html.H2("Fleet"), html.Span(head, className="window-note")], className="page-head"),
        dcc.Location(id="fleet-nav", refresh="callback-nav"),
        dash_table.DataTable(  # type: ignore[attr-defined]
            id="fleet-table", columns=COLUMNS + accel_columns(slots) + TAIL, data=records, sort_action="native",
            filter_action="native", page_size=50, style_data_conditional=style, row_selectable=False,
            cell_selectable=True, merge_duplicate_headers=True, tooltip_data=tooltips, tooltip_duration=None,
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px", "textAlign": "left",
                        "cursor": "pointer"},
            style_cell_conditional=[{"if": {"column_id": f"a{i}"}, "whiteSpace": "pre-line", "minWidth": "120px",
                                     "maxWidth": "190px", "fontSize": "12px", "lineHeight": "1.3"}
                                    for i in range(slots)],
            style_header={"fontWeight": "600", "backgroundColor": "#eceff1"},
        ),
        html.Div([html.Span("states: ")] + [html.Span(s, className="state-chip", style={"backgroundColor": col})
                                            for s, col in STATE_COLORS.items()], className="legend-line",
                 id="fleet-legend"),
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
    rec = viewport[row]
    href = f"/node/{quote(str(rec.get('node_full') or rec['node']))}"
    col = str(cell.get("column_id") or "")
    q = rec.get("q" + col[1:]) if col.startswith("a") and col[1:].isdigit() else None
    return href + (f"?{q}" if q else "")


@page_callback(
    Output("fleet-table", "data"), Output("fleet-table", "columns"),
    Input(timeview.TZ_STORE, "data"), State("fleet-table", "data"), State("fleet-table", "columns"),
)
def show_zone(tz: dict[str, Any] | None, records: list[dict[str, Any]] | None,
              columns: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """The "last seen" column in UTC or the browser's zone (the table is built in the layout, which
    cannot read the browser's choice)."""
    if not records or not columns:
        return no_update, no_update
    zone = timeview.zone_of(tz)
    label = f"last seen ({zone.key if zone else 'UTC'})"
    out = [dict(r, last_seen=fmt_ts(r["last_seen_ts"], zone) + ("" if r.get("live") else " (not live)"))
           if r.get("last_seen_ts") is not None else r for r in records]
    cols = [dict(c, name=["", label]) if c.get("id") == "last_seen" else c for c in columns]
    return out, cols
