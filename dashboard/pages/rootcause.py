"""Root cause: node and window in, ranked causes with their evidence charts out
(``triscope.analysis.rca``), next to what the mismatch detector and the events say about the window."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, State, dcc, html

from triscope.dashboard import data, figures, rca_view
from triscope.dashboard.components import (
    empty_state,
    error_note,
    fmt_ts,
    node_from_value,
    node_options,
    node_value,
    note,
    parse_ts,
    short,
)
from triscope.dashboard.context import ctx
from triscope.dashboard.figures import STATE_COLORS
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/rootcause", name="Root cause", order=5, title="triscope - root cause")


def layout(node: str = "", start: str = "", end: str = "", **_: Any) -> html.Div:
    c = ctx()
    nodes = [n.name for n in c.store.nodes()]
    if not nodes:
        return html.Div([html.H2("Root cause"), note("no nodes stored yet: start the agent or import a trace", "warn")])
    if node not in nodes:  # default: the first node with an accelerator (the detector has something to say)
        accel = [n for n in nodes if c.store.series(node=n, metric="triscope_gpu_sm_active_ratio")
                 or c.store.series(node=n, metric="triscope_npu_aicore_utilization_ratio")]
        node = (accel or nodes)[0]
    a, b = parse_ts(start), parse_ts(end)
    if a is None or b is None:  # default: the node's last 15 minutes of data
        last = next(n.last_seen for n in c.store.nodes() if n.name == node)
        b = min(c.now(), last + 1)
        a = b - 900
    return html.Div([
        html.Div([html.H2("Root cause"), html.Span("what changed on this node in this window, against the "
                                                    "preceding window of the same length", className="window-note")],
                 className="page-head"),
        html.Div([
            dcc.Dropdown(id="rootcause-node", options=node_options(nodes), value=node_value(node),
                         clearable=False, className="node-select"),
            dcc.Input(id="rootcause-start", type="text", value=fmt_ts(a), debounce=True, className="ts-input"),
            dcc.Input(id="rootcause-end", type="text", value=fmt_ts(b), debounce=True, className="ts-input"),
            html.Button("Explain", id="rootcause-go", n_clicks=0, className="btn btn-primary"),
            dcc.Link("open on the node page", href=f"/node/{quote(node)}", id="rootcause-nodelink", className="btn"),
        ], className="toolbar"),
        dcc.Loading(html.Div(id="rootcause-body"), delay_show=300, type="dot"),
    ])


@page_callback(
    Output("rootcause-body", "children"), Output("rootcause-nodelink", "href"),
    Input("rootcause-go", "n_clicks"), Input("rootcause-node", "value"),
    State("rootcause-start", "value"), State("rootcause-end", "value"),
)
def explain(_n: int, value: str, start: str | None, end: str | None) -> tuple[Any, Any]:
    c = ctx()
    node = node_from_value(value, (n.name for n in c.store.nodes()))
    if node is None:
        return note("that node is no longer in the store: pick another", "warn"), "/node"
    link = f"/node/{quote(node)}"
    a, b = parse_ts(start), parse_ts(end)
    if a is None or b is None or b <= a:
        return note("give the window as UTC times (2026-11-29 17:00:00) or epoch seconds, start before end", "warn"), link
    link = f"/node/{quote(node)}?range=custom&start={a:.0f}&end={b:.0f}"
    t0 = time.perf_counter()
    parts: list[Any] = []
    try:
        res = rca_view.explain(c.store, node, a, b)
    except Exception as e:  # noqa: BLE001
        res = None
        parts.append(error_note("the root-cause query", e))
    if res is not None:
        if res.causes:
            parts.append(html.H3(f"Likely causes ({len(res.causes)}; {res.series_examined} series against the "
                                 f"baseline {fmt_ts(res.baseline[0]) if res.baseline else ''} to "
                                 f"{fmt_ts(res.baseline[1]) if res.baseline else ''})"))
            parts.append(html.Ol([_cause(c, node, i, cz, a, b, res.baseline) for i, cz in enumerate(res.causes[:8])],
                                 className="causes", id="rootcause-causes"))
        else:
            parts.append(empty_state("No ranked causes", res.note, id="rootcause-nocauses"))
    try:
        parts += _detector(c, node, a, b, res.mismatch if res is not None else None)
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("reading the window's events", e))
    parts.append(html.Div(f"answered in {(time.perf_counter() - t0) * 1000:.0f} ms", className="status-line"))
    return parts, link


def _cause(c: Any, node: str, i: int, cz: rca_view.Cause, a: float, b: float,
           baseline: tuple[float, float] | None) -> html.Li:
    kids: list[Any] = [html.Div([html.Span(short(cz.title, 200), className="cause-title"),
                                 html.Span(f"score {cz.score:.2f}" if cz.score is not None else "", className="badge"),
                                 html.Span(f"onset {fmt_ts(cz.onset)}" if cz.onset else "", className="muted")],
                                className="card-head"),
                       html.Div(short(cz.summary, 600), className="muted")]
    if cz.peers:
        kids.append(html.Div("peers: " + ", ".join(short(p) for p in cz.peers[:5]), className="muted"))
    if cz.series and i < 5:  # evidence chart of the series that moved most, baseline and window shaded
        ev = cz.series[0]
        lo = baseline[0] if baseline else a - (b - a)
        sds = c.store.query(ev.metric, node=node, labels=ev.labels or None, start=lo, end=b, max_points=600)
        sds = [sd for sd in sds if sd.info.labels == ev.labels] or sds
        if sds:
            sd = sds[0]
            lab = ",".join(f"{k}={short(v)}" for k, v in sorted(ev.labels.items()))
            title = (f"{ev.metric}{{{lab}}}" if lab else ev.metric) + (" (per second)" if sd.info.kind == "counter" else "")
            kids.append(dcc.Graph(figure=figures.evidence_figure(title, sd.ts, sd.values, (a, b), baseline or (lo, a),
                                                                 ev.onset), config={"displaylogo": False},
                                  className="evidence"))
    elif cz.events:
        kids.append(html.Ul([html.Li(short(f"{fmt_ts(e.get('ts'))} {e.get('kind')}: {e.get('message', '')}", 300))
                             for e in cz.events[:5]], className="events"))
    return html.Li(kids, className="card cause")


def _chips(shares: dict[str, float]) -> list[Any]:
    return [html.Span(f"{s} {f:.0%}", className="state-chip", style={"backgroundColor": STATE_COLORS.get(s, "#9e9e9e")})
            for s, f in sorted(shares.items(), key=lambda kv: -kv[1])]


def _detector(c: Any, node: str, a: float, b: float, mismatch: dict[str, Any] | None = None) -> list[Any]:
    """The detector's verdict over the window: from the root-cause result when it carries it (the
    RCA already ran the detector over the window and its baseline), else run here."""
    out: list[Any] = [html.H3("Mismatch detector over the window")]
    if mismatch and mismatch.get("window_states"):
        out.append(html.Div(_chips(mismatch["window_states"]), className="legend-line", id="rootcause-states"))
        if mismatch.get("baseline_states"):
            out.append(html.Div([html.Span("baseline: ", className="muted")] + _chips(mismatch["baseline_states"]),
                                className="legend-line"))
    else:
        try:
            states = data.computed_states(c.store, node, data.Window(a, b, False), max_windows=200)
        except Exception as e:  # noqa: BLE001
            return out + [error_note("the mismatch detector", e)]
        if not states:
            out.append(note("no accelerator data in this window: the detector has nothing to classify", "info"))
        else:
            from triscope.analysis.mismatch import state_fractions

            out.append(html.Div(_chips(state_fractions(states)), className="legend-line", id="rootcause-states"))
            worst = max(states, key=lambda s: s.score)
            reasons = worst.evidence.get("reasons") or []
            if reasons:
                out.append(html.Div(f"worst window {fmt_ts(worst.start)}: {worst.state} (score {worst.score:.2f}): "
                                    + "; ".join(reasons), className="muted"))
    evs = c.store.events(node=node, start=a, end=b, limit=51)
    if evs:
        out.append(html.H3(f"Events in the window ({len(evs) if len(evs) <= 50 else '50+'})"))
        out.append(html.Ul([html.Li(short(f"{fmt_ts(e.ts)} {e.kind} ({e.severity}): {e.message}", 300))
                            for e in evs[:50]],
                           className="events"))
    return out
