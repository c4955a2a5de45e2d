"""SLOs: per SLO the SLI, the error budget remaining and its burn-down over the window, burn
rates with page/ticket status, remediation actions marked on the chart.  A window short of data
(``triscope.analysis.slo.BURN_MIN_COVERAGE`` / ``PERIOD_MIN_COVERAGE``) says "not enough data yet
(N % of the W window covered)" where its figure would be."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from triscope.analysis.slo import NOT_ENOUGH_DATA, coverage_pct
from triscope.dashboard import data, export, figures, slo_view, timeview
from triscope.dashboard.components import empty_state, error_note, fmt_ts, note, range_picker, short
from triscope.dashboard.context import ctx
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/slos", name="SLOs", order=3, title="triscope - SLOs")


def layout(range: str = "24h", **_: Any) -> html.Div:  # noqa: A002
    c = ctx()
    ss = slo_view.load(c)
    head = html.Div([html.H2("SLOs"), html.Span(str(c.slo_file or ""), className="window-note")], className="page-head")
    if not ss.slos:
        return html.Div([head, empty_state("No SLOs to show", ss.problem, id="slos-empty")])
    return html.Div([
        head,
        html.Div([range_picker("slos", range, custom=False)], className="toolbar"),
        dcc.Loading(html.Div(id="slos-body"), delay_show=400, type="dot"),
    ])


def _pct(x: float | None, nd: int = 2) -> str:
    return "no data" if x is None else f"{x * 100:.{nd}f}%"


def _burn(f: Any) -> str:
    """A window's burn rate, or why there is none ("not enough data yet", "no data")."""
    return f"{f.burn_rate:.2f}x" if f.burn_rate is not None else f.state


def _alert_line(a: Any) -> Any:
    head = f"{a.severity}: {a.long_window} & {a.short_window} over {a.factor:g}x"
    if not a.enough_data:
        return html.Li(f"{head}: {NOT_ENOUGH_DATA} ({coverage_pct(a.long_coverage)} of the {a.long_window} window "
                       "covered)", className="slo-alert-short")
    return html.Li(f"{head} ({'FIRING' if a.firing else 'ok'})", className="firing" if a.firing else "")


def _budget_kpis(st: Any) -> list[Any]:
    """SLI and budget left over the period, or the period's coverage when it is short of data."""
    note_style = {"fontSize": "14px", "maxWidth": "22em"}
    if st.budget_note:
        return [html.Div([html.Div(f"SLI ({st.slo.period})", className="kpi-label"),
                          html.Div(NOT_ENOUGH_DATA, className="kpi", style=note_style)]),
                html.Div([html.Div("budget left", className="kpi-label"),
                          html.Div(st.budget_note, className="kpi slo-budget", style=note_style)])]
    return [html.Div([html.Div(f"SLI ({st.slo.period})", className="kpi-label"), html.Div(_pct(st.sli, 3), className="kpi")]),
            html.Div([html.Div("budget left", className="kpi-label"),
                      html.Div(_pct(st.budget_remaining, 1), className="kpi slo-budget")])]


@page_callback(Output("slos-body", "children"), Input("slos-range", "value"), Input(timeview.TZ_STORE, "data"))
def render(preset: str, tz: dict[str, Any] | None = None) -> Any:
    c = ctx()
    zone = timeview.zone_of(tz)
    ss = slo_view.load(c)
    try:
        w = data.resolve_window(c.store, None, preset, c.now())
        actions = [(float(r.get("ts") or 0),
                    short(f"{r.get('action', '')} {short(r.get('target', ''))} ({r.get('outcome', '')})", 200))
                   for r in data.audit_rows(c.store, w.start, w.end).rows]
        cards: list[Any] = []
        if w.note:
            cards.append(note(f"evaluated at {fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}: {w.note}", "info"))
        for slo in ss.slos:
            st = slo_view.evaluate(c, slo, w.end)
            first = min((n.first_seen for n in c.store.nodes()), default=w.start)
            ts, budget = slo_view.burn_down(c, slo, max(w.start, first), w.end)
            status = st.status
            rows = [html.Tr([html.Td(k), html.Td(_burn(f)), html.Td(_pct(f.error_ratio, 3)),
                             html.Td(coverage_pct(f.coverage))])
                    for k, f in st.windows.items()]
            alerts = [_alert_line(a) for a in st.alerts]
            if st.budget_note and all(b is None for b in budget):
                chart = figures.empty_figure(f"error budget: {st.budget_note}", 300)
            else:
                chart = figures.slo_figure(slo.id, ts, budget, actions)
            cards.append(html.Div([
                html.Div([html.H3(f"{slo.service} / {slo.name}"),
                          html.Span(status, className=f"badge badge-{status.replace(' ', '-')}")], className="card-head"),
                html.Div(slo.description or "", className="muted"),
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
        return cards
    except Exception as e:  # noqa: BLE001
        return error_note("evaluating the SLOs", e)
