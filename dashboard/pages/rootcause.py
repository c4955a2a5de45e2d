"""Root cause: node and window in; out the episode timeline (runs of one state per accelerator
with their workload, each bad one with its ranked causes: ``rca_view.timeline``), the ranked
causes of the whole window with their evidence charts (``triscope.analysis.rca.ranked``), and what the
mismatch detector and the events say about the window."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

import dash
from dash import Input, Output, State, dcc, html

from triscope.dashboard import data, export, figures, rca_view, timeview
from triscope.dashboard.components import (
    empty_state,
    error_note,
    fmt_ts,
    full,
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
    Input(timeview.TZ_STORE, "data"),   # the local-time toggle redraws (the start / end fields stay UTC)
)
def explain(_n: int, value: str, start: str | None, end: str | None, tz: dict[str, Any] | None = None) -> tuple[Any, Any]:
    c = ctx()
    zone = timeview.zone_of(tz)
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
        parts += _episodes(c, node, a, b, zone)
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("the episode timeline", e))
    try:
        res = rca_view.explain(c.store, node, a, b)
    except Exception as e:  # noqa: BLE001
        res = None
        parts.append(error_note("the root-cause query", e))
    if res is not None:
        if res.causes:
            parts.append(html.H3(f"Likely causes over the whole window ({len(res.causes)}; {res.series_examined} series against the "
                                 f"baseline {fmt_ts(res.baseline[0], zone) if res.baseline else ''} to "
                                 f"{fmt_ts(res.baseline[1], zone) if res.baseline else ''} "
                                 f"{timeview.zone_name(zone, b)})"))
            parts.append(html.Ol([_cause(c, node, i, cz, a, b, res.baseline, zone) for i, cz in enumerate(res.causes[:8])],
                                 className="causes", id="rootcause-causes"))
        else:
            parts.append(empty_state("No ranked causes", res.note, id="rootcause-nocauses"))
        if res.context:
            parts.append(_context(res.context, "rootcause-context"))
    try:
        parts += _detector(c, node, a, b, res.mismatch if res is not None else None, zone)
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("reading the window's events", e))
    parts.append(html.Div(f"answered in {(time.perf_counter() - t0) * 1000:.0f} ms", className="status-line"))
    return parts, link


def _episodes(c: Any, node: str, a: float, b: float, zone: Any = None) -> list[Any]:
    """The window's episode timeline and its bad episodes, each with its ranked causes."""
    import functools

    from triscope.dashboard.workload_data import workload_owners

    tv = rca_view.timeline(c.store, node, a, b, owners=functools.partial(workload_owners, c.store))
    fig = export.attach_series(figures.episode_timeline_figure(tv.episodes, (a, b), zone=zone),
                               rca_view.episode_series(tv.episodes, a, b))
    out: list[Any] = [html.H3("Episodes: one state per accelerator"),
                      html.Div(export.chart("rootcause-timeline", fig, "rootcause-timeline", node, a, b, zone,
                                            config={"displaylogo": False}), id="rootcause-timeline")]
    for n in tv.notes:
        out.append(note(n, "info"))
    bad = [e for e in tv.bad if e.end > a and e.start < b]
    if not bad:
        out.append(empty_state("No bad episode in this window", "every accelerator was idle, demand-limited, "
                               "compute-bound or balanced (or no state is stored)", id="rootcause-noepisodes"))
    else:
        out.append(html.Ol([_episode(node, e, zone) for e in bad[:20]], className="episodes causes", id="rootcause-episodes"))
    out.append(html.Div(f"episodes from {tv.source}", className="muted"))
    return out


def _episode(node: str, e: rca_view.EpisodeView, zone: Any = None) -> html.Li:
    wl = e.workload.display if e.workload is not None and e.workload.display else ""
    head = [html.B(e.where), html.Span(short(wl, 80), className="muted", title=full(e.workload.detail))
            if wl and e.workload is not None else None,
            html.Span(e.state, className="state-chip", style={"backgroundColor": STATE_COLORS.get(e.state, "#9e9e9e")}),
            html.Span(f"{fmt_ts(e.start, zone)} → {fmt_ts(e.end, zone)} {timeview.zone_name(zone, e.end)} "
                      f"({figures._dur(e.duration)})"
                      + (" (began before the window)" if e.started_before else ""), className="ep-span"),
            html.Span(f"score {e.score:.2f}" if e.score is not None else "", className="badge") if e.score is not None
            else None,
            html.Span(f"phase {e.phase}", className="muted", title="the episode's cause changed part-way: each phase "
                      "is explained on its own") if e.phase else None,
            dcc.Link("explain this episode →", href="/rootcause?" + urlencode(
                {"node": node, "start": f"{e.start:.0f}", "end": f"{e.end:.0f}"}), className="btn")]
    kids: list[Any] = [html.Div([h for h in head if h is not None], className="ep-head")]
    if e.causes:
        kids.append(html.Ol([html.Li([html.Span(short(cz.title, 120), className="cause-title"),
                                      html.Span(f" score {cz.score:.2f}" if cz.score is not None else "", className="muted")],
                                     title=short(cz.summary, 600) or None)
                             for cz in e.causes[:3]], className="ep-causes"))
    if e.context:
        kids.append(_context(e.context))
    if e.reference:
        kids.append(html.Div(short(e.reference, 300), className="muted"))
    data_attrs: dict[str, Any] = {"data-accelerator": e.accelerator, "data-state": e.state,
                                  "data-start": f"{e.start:.0f}", "data-end": f"{e.end:.0f}"}
    return html.Li(kids, className="card episode", **data_attrs)


def _context(lines: list[rca_view.EpisodeCause], id: str = "") -> html.Ul:
    """Context beside the causes (application SLIs, remediation actions, the agent itself): shown, not ranked."""
    items = [html.Li([html.Span("context: ", className="muted"), html.Span(short(x.title, 120)),
                      html.Span(" — " + short(x.summary, 300), className="muted")]) for x in lines]
    return html.Ul(items, className="ep-context", id=id) if id else html.Ul(items, className="ep-context")


def _cause(c: Any, node: str, i: int, cz: rca_view.Cause, a: float, b: float,
           baseline: tuple[float, float] | None, zone: Any = None) -> html.Li:
    kids: list[Any] = [html.Div([html.Span(short(cz.title, 200), className="cause-title"),
                                 html.Span(f"score {cz.score:.2f}" if cz.score is not None else "", className="badge"),
                                 html.Span(f"onset {fmt_ts(cz.onset, zone)}" if cz.onset else "", className="muted")],
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
            fig = figures.evidence_figure(title, sd.ts, sd.values, (a, b), baseline or (lo, a), ev.onset,
                                          labels={"metric": ev.metric, **ev.labels})
            kids.append(export.chart(f"cause-{i}", fig, "rootcause-evidence", node, lo, b, zone,
                                     config={"displaylogo": False}, className="evidence"))
    elif cz.events:
        kids.append(html.Ul([html.Li(short(f"{fmt_ts(e.get('ts'), zone)} {e.get('kind')}: {e.get('message', '')}", 300))
                             for e in cz.events[:5]], className="events"))
    return html.Li(kids, className="card cause")


def _chips(shares: dict[str, float]) -> list[Any]:
    return [html.Span(f"{s} {f:.0%}", className="state-chip", style={"backgroundColor": STATE_COLORS.get(s, "#9e9e9e")})
            for s, f in sorted(shares.items(), key=lambda kv: -kv[1])]


def _detector(c: Any, node: str, a: float, b: float, mismatch: dict[str, Any] | None = None,
              zone: Any = None) -> list[Any]:
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
                out.append(html.Div(f"worst window {fmt_ts(worst.start, zone)}: {worst.state} (score {worst.score:.2f}): "
                                    + "; ".join(reasons), className="muted"))
    evs = c.store.events(node=node, start=a, end=b, limit=51)
    if evs:
        out.append(html.H3(f"Events in the window ({len(evs) if len(evs) <= 50 else '50+'})"))
        out.append(html.Ul([html.Li(short(f"{fmt_ts(e.ts, zone)} {e.kind} ({e.severity}): {e.message}", 300))
                            for e in evs[:50]],
                           className="events"))
    return out
