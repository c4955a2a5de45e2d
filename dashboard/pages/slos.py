"""SLOs: per SLO what it promises (from its own queries and objective: ``analysis.slo.describe``),
the SLI, the error budget remaining and its burn-down over the window, burn rates with page/ticket
status, remediation actions marked on the chart.  A window short of data
(``triscope.analysis.slo.BURN_MIN_COVERAGE`` / ``PERIOD_MIN_COVERAGE``) says "not enough data yet
(N % of the W window covered)" where its figure would be.

The page opens on the SLOs' own data (``triscope.dashboard.timerange``): series that ended (a
recording, a service that stopped reporting) are evaluated where they end, and the page says so."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import dash
from dash import Input, Output, dcc, html

from triscope.analysis.slo import NOT_ENOUGH_DATA, AlertState, SLOStatus, WindowFigure, coverage_pct, describe
from triscope.dashboard import data, export, figures, slo_view, timerange, timeview
from triscope.dashboard.components import empty_state, error_note, fmt_ts, note, range_picker, short
from triscope.dashboard.context import ctx
from triscope.dashboard.ids import SlosIds
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/slos", name="SLOs", order=3, title="triscope - SLOs")


def layout(range: str = "", **_: Any) -> html.Div:  # noqa: A002
    c = ctx()
    ss = slo_view.load(c)
    head = html.Div([html.H2("SLOs"), html.Span(str(c.slo_file or ""), className="window-note")], className="page-head")
    if not ss.slos:
        return html.Div([head, empty_state("No SLOs to show", ss.problem, id=SlosIds.EMPTY)])
    preset = range or timerange.default_preset(slo_view.data_bounds(c, ss.slos))
    return html.Div([
        head,
        html.Div([range_picker(SlosIds.PICKER.prefix, preset, custom=False, data=True)], className="toolbar"),
        html.Div(id=SlosIds.NOTE, className="window-note"),
        dcc.Loading(html.Div(id=SlosIds.BODY), delay_show=400, type="dot"),
    ])


def _pct(x: float | None, nd: int = 2) -> str:
    return "no data" if x is None else f"{x * 100:.{nd}f}%"


def _burn(f: WindowFigure) -> str:
    """A window's burn rate, or why there is none ("not enough data yet", "no data")."""
    return f"{f.burn_rate:.2f}x" if f.burn_rate is not None else f.state


def _alert_line(a: AlertState) -> html.Li:
    head = f"{a.severity}: {a.long_window} & {a.short_window} over {a.factor:g}x"
    if not a.enough_data:
        return html.Li(f"{head}: {NOT_ENOUGH_DATA} ({coverage_pct(a.long_coverage)} of the {a.long_window} window "
                       "covered)", className="slo-alert-short")
    return html.Li(f"{head} ({'FIRING' if a.firing else 'ok'})", className="firing" if a.firing else "")


def _budget_kpis(st: SLOStatus) -> list[html.Div]:
    """SLI and budget left over the period, or the period's coverage when it is short of data."""
    note_style = {"fontSize": "14px", "maxWidth": "22em"}
    if st.budget_note:
        return [html.Div([html.Div(f"SLI ({st.slo.period})", className="kpi-label"),
                          html.Div(NOT_ENOUGH_DATA, className="kpi", style=note_style)]),
                html.Div([html.Div("budget left", className="kpi-label"),
                          html.Div(st.budget_note, className="kpi slo-budget", style=note_style)])]
    left = st.budget_remaining
    over = left if left is not None and left < 0 else None   # overspent: below 0
    spent = over is not None
    return [html.Div([html.Div(f"SLI ({st.slo.period})", className="kpi-label"), html.Div(_pct(st.sli, 3), className="kpi")]),
            html.Div([html.Div("budget left", className="kpi-label"),
                      html.Div(_pct(left, 1), className="kpi slo-budget" + (" slo-overspent" if spent else ""),
                               title=f"overspent: {1 - over:.1f}x the period's budget at this error ratio" if over is not None
                               else None)])]


def _where(w: data.Window, bounds: timerange.Bounds | None, now: float, zone: ZoneInfo | None) -> str:
    """Where the page evaluates: now, or where the SLOs' series end (and why)."""
    at = f"{fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}"
    if w.live or bounds is None:
        return f"evaluated at {at} (now)" + (f"; {w.note}" if w.note else "")
    ago = max(0.0, now - bounds.last)
    why = "recordings" if bounds.recording else "a recording, or the service stopped reporting"
    return f"not live: the SLOs' series end {_ago(ago)} before now ({why}): evaluated where they end, {at}"


def _ago(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


@page_callback(Output(SlosIds.BODY, "children"), Output(SlosIds.NOTE, "children"),
               Input(SlosIds.PICKER.range, "value"), Input(timeview.TZ_STORE, "data"))
def render(preset: str, tz: dict[str, Any] | None = None) -> Any:
    c = ctx()
    zone = timeview.zone_of(tz)
    ss = slo_view.load(c)
    try:
        now = c.now()
        bounds = slo_view.data_bounds(c, ss.slos)
        w = timerange.window(preset, bounds, now)
        actions = [(float(r.get("ts") or 0),
                    short(f"{r.get('action', '')} {short(r.get('target', ''))} ({r.get('outcome', '')})", 200))
                   for r in data.audit_rows(c.store, w.start, w.end).rows]
        cards: list[html.Div] = []
        if bounds is None:
            cards.append(note("no node has stored these SLOs' series yet (the agent scrapes them with --scrape URL): "
                              "every figure reads no data", "info", id=SlosIds.NO_SERIES))
        for slo in ss.slos:
            st = slo_view.evaluate(c, slo, w.end)
            ts, budget = slo_view.burn_down(c, slo, max(w.start, bounds.first if bounds else w.start), w.end)
            status = st.status
            rows = [html.Tr([html.Td(k), html.Td(_burn(f)), html.Td(_pct(f.error_ratio, 3)),
                             html.Td(coverage_pct(f.coverage))])
                    for k, f in st.windows.items()]
            alerts = [_alert_line(a) for a in st.alerts]
            if st.budget_note and all(b is None for b in budget):
                chart = figures.empty_figure(f"error budget: {st.budget_note}", 300)
            else:
                chart = figures.slo_figure(slo.id, ts, budget, actions)
            headline, detail = describe(slo)
            cards.append(html.Div([
                html.Div([html.H3(f"{slo.service} / {slo.name}"),
                          html.Span(status, className=f"badge badge-{status.replace(' ', '-')}")], className="card-head"),
                html.Div(headline, className="slo-promise"),
                html.Div(detail, className="muted slo-definition"),
                html.Div([
                    html.Div([html.Div("objective", className="kpi-label"), html.Div(f"{slo.objective:g}%", className="kpi")]),
                    *_budget_kpis(st),
                    html.Div([html.Div("data coverage", className="kpi-label"), html.Div(coverage_pct(st.coverage), className="kpi")]),
                ], className="kpis"),
                html.Div([
                    html.Div([html.Div(f"error budget remaining over the {slo.period} window, across the range shown",
                                       className="muted"),
                              export.chart(f"slo-{slo.id}", chart, f"slo-{slo.id}", None, w.start, w.end, zone,
                                           config={"displaylogo": False})], className="grow"),
                    html.Div([html.Table([html.Thead(html.Tr([html.Th("window"), html.Th("burn rate"),
                                                              html.Th("error ratio"), html.Th("coverage")])),
                                          html.Tbody(rows)], className="small-table"),
                              html.Ul(alerts, className="alerts")], className="side"),
                ], className="row"),
            ], className="card slo-card"))
        return cards, _where(w, bounds, now, zone)
    except Exception as e:  # noqa: BLE001
        return error_note("evaluating the SLOs", e), ""
