"""Remediation: the engine's audit log (time, rule, action, target, node, dry-run or live,
outcome, reason), filterable, each decision linked to its episode on the Root cause page and to
its node, with its effect: the verdict of its accelerator before and after it, from the verdict
history (``triscope.dashboard.remediation_view``).  A recording's decisions (imported with its
trace) are marked as the recording's: the engine that made them is not this store's.  An
explained empty state while the engine has recorded nothing.

The page opens on the decisions (``triscope.dashboard.timerange``): the last hour of them, or all
of them when they span less, ending at the store's newest sample when that came after them."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dash_table, dcc, html

from triscope.dashboard import data, remediation_view, timerange, timeview
from triscope.dashboard.components import empty_state, error_note, fmt_ts, full, note, range_picker, short
from triscope.dashboard.context import DashboardContext, ctx
from triscope.dashboard.ids import RemediationIds
from triscope.dashboard.registry import page_callback
from triscope.store.audit import audit_log

dash.register_page(__name__, path="/remediation", name="Remediation", order=4, title="triscope - remediation")

COLUMNS = [
    {"name": "time (UTC)", "id": "time"},
    {"name": "rule", "id": "rule"},
    {"name": "action", "id": "action"},
    {"name": "target", "id": "target"},
    {"name": "node", "id": "node", "presentation": "markdown"},
    {"name": "mode", "id": "mode"},
    {"name": "outcome", "id": "outcome"},
    {"name": "verdict before \u2192 after", "id": "effect"},
    {"name": "episode", "id": "episode", "presentation": "markdown"},
    {"name": "reason", "id": "reason"},
]
OUTCOME_COLORS = {"acted": "#2e7d32", "dry_run": "#1976d2", "suppressed": "#757575", "failed": "#c62828",
                  "in_progress": "#ef6c00"}
TARGET_CHARS = 300     # a target names its workload last: never cut before it
WIDTHS = {"time": "90px", "rule": "170px", "target": "230px", "node": "130px", "effect": "170px", "reason": "300px"}


def _bounds(c: DashboardContext) -> timerange.Bounds | None:
    """The decisions' span, reaching to the store's newest sample when that comes within the default
    range after the newest decision (the engine runs on: the page ends now)."""

    try:
        newest = audit_log(c.store, limit=1)
        oldest = audit_log(c.store, limit=1, newest_first=False)
    except Exception:  # noqa: BLE001 - the audit table may not be migrated yet: the store's span
        newest = oldest = []
    sb = timerange.store_bounds(c.store)
    if not newest or not oldest:
        return sb
    first, last = float(oldest[0].ts), float(newest[0].ts)
    if sb is not None and sb.last >= last and sb.last - last <= data.PRESETS[timerange.DEFAULT_PRESET]:
        return timerange.Bounds(first, sb.last, sb.recording)
    return timerange.Bounds(first, last)


def layout(range: str = "", **_: Any) -> html.Div:  # noqa: A002
    preset = range or timerange.default_preset(_bounds(ctx()))
    return html.Div([
        html.Div([html.H2("Remediation audit log"), html.Span(id=RemediationIds.NOTE, className="window-note")],
                 className="page-head"),
        html.Div([range_picker(RemediationIds.PICKER.prefix, preset, custom=False, data=True)], className="toolbar"),
        dcc.Loading(html.Div(id=RemediationIds.BODY), delay_show=400, type="dot"),
    ])


def _mode(d: remediation_view.Decision) -> str:
    mode = "dry-run" if d.row.get("dry_run") or d.row.get("mode") == "dry-run" else "live"
    return f"{mode}, in the recording" if d.recorded else mode


def _record(d: remediation_view.Decision, zone: Any) -> dict[str, Any]:
    r = d.row
    ts = float(r.get("ts") or 0.0)
    node = d.node
    oc = d.outcome
    node_cell = (f"[{short(node)}]({remediation_view.node_link(node, ts, d.accelerator)})" if node else "")
    if node and d.accelerator:
        node_cell += f" {d.accelerator}"
    return {"time": fmt_ts(r.get("ts"), zone), "rule": short(r.get("rule", "")), "action": short(r.get("action", "")),
            "target": short(r.get("target", ""), TARGET_CHARS), "node": node_cell, "mode": _mode(d),
            "outcome": short(r.get("outcome", "")), "effect": oc.text() if oc is not None else "no node named",
            "better": "" if oc is None or oc.better is None else "better" if oc.better else "same",
            "episode": f"[root cause]({remediation_view.episode_link(node, ts, oc.episode if oc else None)})"
                       if node else "",
            "reason": short(r.get("reason", ""), 300)}


def _recorded_note(ds: list[remediation_view.Decision]) -> Any:
    rec = sorted({d.node for d in ds if d.recorded})
    if not rec:
        return html.Div()
    engines = sorted({str(d.row.get("engine_id") or "?") for d in ds if d.recorded})
    live = sum(1 for d in ds if d.recorded and not d.row.get("dry_run"))
    return note(f"{sum(1 for d in ds if d.recorded)} decision(s) on recordings ({', '.join(short(n, 40) for n in rec)}) "
                f"came with their traces: made by the engine that ran while they were recorded "
                f"({', '.join(short(e, 24) for e in engines)}; {live} of them live there), not by an engine on this "
                "store, whatever mode it runs in. Their times are moved with the recording's.", "info",
                id=RemediationIds.RECORDED)


@page_callback(Output(RemediationIds.BODY, "children"), Output(RemediationIds.NOTE, "children"),
               Input(RemediationIds.PICKER.range, "value"), Input(timeview.TZ_STORE, "data"))
def render(preset: str, tz: dict[str, Any] | None = None) -> tuple[Any, Any]:
    c = ctx()
    zone = timeview.zone_of(tz)
    try:
        w = timerange.window(preset, _bounds(c), c.now())
        ar = data.audit_rows(c.store, w.start, w.end)
        ds = remediation_view.decisions(c.store, ar.rows) if ar.source == "audit" else [
            remediation_view.Decision(r, str(r.get("node") or ""), "", "", None) for r in ar.rows]
    except Exception as e:  # noqa: BLE001
        return error_note("reading the audit log", e), ""
    head = f"{fmt_ts(w.start, zone)} to {fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}" + (
        f" ({w.note})" if w.note else "")
    if not ds:
        return empty_state("No remediation decisions in this range", ar.note, id=RemediationIds.EMPTY), head
    records = [_record(d, zone) for d in ds]
    tooltips = [{k: full(d.row.get(k) or "") for k in ("target", "reason") if len(str(d.row.get(k) or "")) > 60}
                | ({"node": f"node from {d.row['node_from']}"} if d.row.get("node_from") else {})
                for d in ds]
    style = [{"if": {"filter_query": f'{{outcome}} contains "{o}"', "column_id": "outcome"}, "color": col,
              "fontWeight": "600"} for o, col in OUTCOME_COLORS.items()]
    style += [{"if": {"filter_query": '{better} = "better"', "column_id": "effect"}, "color": "#2e7d32", "fontWeight": "600"},
              {"if": {"filter_query": '{better} = "same"', "column_id": "effect"}, "color": "#ef6c00", "fontWeight": "600"},
              {"if": {"filter_query": '{mode} contains "recording"', "column_id": "mode"}, "color": "#6a1b9a"}]
    table = dash_table.DataTable(  # type: ignore[attr-defined]
        id=RemediationIds.TABLE, columns=[dict(col, name=f"time ({zone.key if zone else 'UTC'})")
                                         if col["id"] == "time" else col for col in COLUMNS], data=records,
        sort_action="native", filter_action="native", page_size=50, style_data_conditional=style,
        tooltip_data=tooltips, tooltip_duration=None, markdown_options={"link_target": "_self"},
        style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px", "textAlign": "left",
                    "whiteSpace": "normal", "maxWidth": "420px"},
        style_cell_conditional=[{"if": {"column_id": c}, "minWidth": w} for c, w in WIDTHS.items()],
        style_table={"overflowX": "auto"},
        style_header={"fontWeight": "600", "backgroundColor": "#eceff1"})
    src = "" if ar.source == "audit" else ar.note
    return html.Div([html.Div(src, className="muted"), _recorded_note(ds), table]), head + f"; {len(records)} decision(s)"
