"""Remediation: the engine's audit log (time, rule, action, target, dry-run or live, outcome,
reason), filterable; an explained empty state while the engine has recorded nothing."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dash_table, dcc, html

from triscope.dashboard import data, timeview
from triscope.dashboard.components import empty_state, error_note, fmt_ts, full, range_picker, short
from triscope.dashboard.context import ctx
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/remediation", name="Remediation", order=4, title="triscope - remediation")

COLUMNS = [
    {"name": "time (UTC)", "id": "time"},
    {"name": "rule", "id": "rule"},
    {"name": "action", "id": "action"},
    {"name": "target", "id": "target"},
    {"name": "node", "id": "node"},
    {"name": "mode", "id": "mode"},
    {"name": "outcome", "id": "outcome"},
    {"name": "reason", "id": "reason"},
]
OUTCOME_COLORS = {"acted": "#2e7d32", "dry_run": "#1976d2", "suppressed": "#757575", "failed": "#c62828",
                  "in_progress": "#ef6c00"}


def layout(range: str = "7d", **_: Any) -> html.Div:  # noqa: A002
    return html.Div([
        html.Div([html.H2("Remediation audit log"), html.Span(id="remediation-note", className="window-note")],
                 className="page-head"),
        html.Div([range_picker("remediation", range, custom=False)], className="toolbar"),
        dcc.Loading(html.Div(id="remediation-body"), delay_show=400, type="dot"),
    ])


@page_callback(Output("remediation-body", "children"), Output("remediation-note", "children"),
               Input("remediation-range", "value"), Input(timeview.TZ_STORE, "data"))
def render(preset: str, tz: dict[str, Any] | None = None) -> tuple[Any, Any]:
    c = ctx()
    zone = timeview.zone_of(tz)
    try:
        w = data.resolve_window(c.store, None, preset, c.now())
        ar = data.audit_rows(c.store, w.start, w.end)
    except Exception as e:  # noqa: BLE001
        return error_note("reading the audit log", e), ""
    head = f"{fmt_ts(w.start, zone)} to {fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}" + (
        f" ({w.note})" if w.note else "")
    if not ar.rows:
        return empty_state("No remediation decisions in this range", ar.note, id="remediation-empty"), head
    records = [{"time": fmt_ts(r.get("ts"), zone), "rule": short(r.get("rule", "")), "action": short(r.get("action", "")),
                "target": short(r.get("target", ""), 80), "node": short(r.get("node") or ""),
                "mode": short(r.get("mode", "")), "outcome": short(r.get("outcome", "")),
                "reason": short(r.get("reason", ""), 300)} for r in ar.rows]
    tooltips = [{k: full(r.get(k) or "") for k in ("target", "node") if len(str(r.get(k) or "")) > 48}
                for r in ar.rows]
    style = [{"if": {"filter_query": f'{{outcome}} contains "{o}"', "column_id": "outcome"}, "color": col,
              "fontWeight": "600"} for o, col in OUTCOME_COLORS.items()]
    table = dash_table.DataTable(  # type: ignore[attr-defined]
        id="remediation-table", columns=[dict(col, name=f"time ({zone.key if zone else 'UTC'})")
                                         if col["id"] == "time" else col for col in COLUMNS], data=records, sort_action="native", filter_action="native",
        page_size=50, style_data_conditional=style, tooltip_data=tooltips, tooltip_duration=None,
        style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px", "textAlign": "left",
                    "whiteSpace": "normal", "maxWidth": "420px"},
        style_header={"fontWeight": "600", "backgroundColor": "#eceff1"})
    src = "" if ar.source == "audit" else ar.note
    return html.Div([html.Div(src, className="muted"), table]), head + f"; {len(records)} decision(s)"
