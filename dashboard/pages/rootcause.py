"""Root cause: node and window in; out the episode timeline (runs of one state per accelerator
with their workload, each bad one with its ranked causes: ``rca_view.timeline``), the ranked
causes of the whole window with their evidence charts (``triscope.analysis.rca.ranked``), the
node's share of time in each state over the window and its baseline (the verdict history, as the
Node and Mismatch pages read it: ``rca_view.history_shares``) and the window's events.

The window opens where every page opens (``timerange``: the last hour of the node's data, all of
it when shorter, ending at now or at its last sample); ``?range=24h`` picks another look-back,
``?start=&end=`` an exact window."""

from __future__ import annotations

import functools
import time
from typing import Any
from urllib.parse import quote, urlencode

import dash
from dash import Input, Output, State, dcc, html, no_update

from triscope.dashboard import data, export, figures, rca_view, timerange, timeview, waitfor_view
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
from triscope.dashboard.context import DashboardContext, ctx
from triscope.dashboard.figures import state_style
from triscope.dashboard.ids import RootcauseIds
from triscope.dashboard.jsontypes import number
from triscope.dashboard.registry import page_callback
from triscope.dashboard.workload_data import workload_owners

dash.register_page(__name__, path="/rootcause", name="Root cause", order=5, title="triscope - root cause")


LOOKBACKS = (*data.PRESETS, data.DATA_PRESET)    # the look-back links: 15m 1h 24h 7d, all data


def default_window(c: DashboardContext, node: str, preset: str = "") -> data.Window:
    """The window the page opens on for ``node`` (``timerange``: ``preset``, else the default one)."""
    b = timerange.node_bounds(c.store, node)
    return timerange.window(preset if preset in LOOKBACKS else timerange.default_preset(b), b, c.now())


def layout(node: str = "", start: str = "", end: str = "", range: str = "", **_: Any) -> html.Div:  # noqa: A002
    c = ctx()
    nodes = [n.name for n in c.store.nodes()]
    if not nodes:
        return html.Div([html.H2("Root cause"), note("no nodes stored yet: start the agent or import a trace", "warn")])
    if node not in nodes:  # default: the first node with an accelerator (the detector has something to say)
        accel = [n for n in nodes if c.store.series(node=n, metric="triscope_gpu_sm_active_ratio")
                 or c.store.series(node=n, metric="triscope_npu_aicore_utilization_ratio")]
        node = (accel or nodes)[0]
    a, b = parse_ts(start), parse_ts(end)
    head: list[Any] = [html.H2("Root cause"),
                       html.Span("what changed on this node in this window, against the preceding window of "
                                 "the same length", className="window-note")]
    if a is None or b is None:  # default (timerange): the last hour of the node's data, all of it when less
        w = default_window(c, node, range)
        a, b = w.start, w.end
        if w.note:
            head.append(html.Span(w.note, className="window-note", id=RootcauseIds.WINDOW_NOTE))
    return html.Div([
        html.Div(head, className="page-head"),
        html.Div([
            dcc.Dropdown(id=RootcauseIds.NODE, options=node_options(nodes), value=node_value(node),
                         clearable=False, className="node-select"),
            dcc.Input(id=RootcauseIds.START, type="text", value=fmt_ts(a), debounce=True, className="ts-input"),
            dcc.Input(id=RootcauseIds.END, type="text", value=fmt_ts(b), debounce=True, className="ts-input"),
            html.Button("Explain", id=RootcauseIds.GO, n_clicks=0, className="btn btn-primary"),
            dcc.Link("open on the node page", href=f"/node/{quote(node)}", id=RootcauseIds.NODELINK, className="btn"),
            _lookbacks(node, range if not (start and end) else ""),
        ], className="toolbar"),
        dcc.Loading(html.Div(id=RootcauseIds.BODY), delay_show=300, type="dot"),
    ])


def _lookbacks(node: str, current: str) -> html.Div:
    """Links to the same node over each look-back, ending where the default window ends."""
    links: list[Any] = [html.Span("look back: ", className="muted")]
    for p in LOOKBACKS:
        text = "all data" if p == data.DATA_PRESET else p
        links.append(html.B(text, className="btn btn-small") if p == current else      # the one shown
                     dcc.Link(text, href="/rootcause?" + urlencode({"node": node, "range": p}), className="btn btn-small"))
    return html.Div(links, className="range-presets", id=RootcauseIds.LOOKBACKS)


@page_callback(
    Output(RootcauseIds.BODY, "children"), Output(RootcauseIds.NODELINK, "href"),
    Output(RootcauseIds.LOOKBACKS, "children"),
    Output(RootcauseIds.START, "value"), Output(RootcauseIds.END, "value"),
    Input(RootcauseIds.GO, "n_clicks"), Input(RootcauseIds.NODE, "value"),
    State(RootcauseIds.START, "value"), State(RootcauseIds.END, "value"),
    Input(timeview.TZ_STORE, "data"),   # the local-time toggle redraws (the start / end fields stay UTC)
)
def explain(_n: int, value: str, start: str | None, end: str | None,
            tz: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """The page's answer for a node and window; picking another node opens on its own default window."""
    c = ctx()
    zone = timeview.zone_of(tz)
    node = node_from_value(value, (n.name for n in c.store.nodes()))
    if node is None:
        return note("that node is no longer in the store: pick another", "warn"), "/node", no_update, start, end
    link = f"/node/{quote(node)}"
    looks: Any = no_update
    if _triggered() == RootcauseIds.NODE:    # another node: its own data, as the page opens on it
        w = default_window(c, node)
        start, end = fmt_ts(w.start), fmt_ts(w.end)
        looks = _lookbacks(node, "").children
    a, b = parse_ts(start), parse_ts(end)
    if a is None or b is None or b <= a:
        return (note("give the window as UTC times (2026-11-29 17:00:00) or epoch seconds, start before end", "warn"),
                link, looks, start, end)
    link = f"/node/{quote(node)}?range=custom&start={a:.0f}&end={b:.0f}"
    return answer(c, node, a, b, zone), link, looks, start, end


def _triggered() -> Any:
    try:
        return dash.callback_context.triggered_id
    except dash.exceptions.MissingCallbackContextException:   # called outside a request (benchmark)
        return None


def answer(c: DashboardContext, node: str, a: float, b: float, zone: Any = None) -> list[Any]:
    """Everything the page shows for ``node`` over [a, b]: the recording note, the episode timeline,
    the ranked causes of the whole window, the state shares from the verdict history, the events."""
    t0 = time.perf_counter()
    parts: list[Any] = []
    rec = data.recording_note(c.store, node)
    if rec:
        parts.append(note(rec, "info", id=RootcauseIds.RECORDING_NOTE))
    read = None
    try:
        got, read = _episodes(c, node, a, b, zone)
        parts += got
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("the episode timeline", e))
    try:
        res = rca_view.explain(c.store, node, a, b, inputs=read)   # the timeline's read, where it is the same
    except Exception as e:  # noqa: BLE001
        res = None
        parts.append(error_note("the root-cause query", e))
    if res is not None:
        parts += _causes(c, node, res, a, b, zone)
    try:
        parts += _states(c, node, a, b, res.baseline if res is not None else None, zone)
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("reading the verdict history", e))
    try:
        parts += _events(c, node, a, b, zone)
    except Exception as e:  # noqa: BLE001
        parts.append(error_note("reading the window's events", e))
    parts.append(html.Div(f"answered in {(time.perf_counter() - t0) * 1000:.0f} ms", className="status-line"))
    return parts


def _causes(c: DashboardContext, node: str, res: rca_view.RcaResult, a: float, b: float, zone: Any) -> list[Any]:
    out: list[Any] = []
    if res.causes:
        out.append(html.H3(f"Likely causes over the whole window ({len(res.causes)}; {res.series_examined} series "
                           f"against the baseline {fmt_ts(res.baseline[0], zone) if res.baseline else ''} to "
                           f"{fmt_ts(res.baseline[1], zone) if res.baseline else ''} "
                           f"{timeview.zone_name(zone, b)})"))
        out.append(html.Ol([_cause(c, node, i, cz, a, b, res.baseline, zone) for i, cz in enumerate(res.causes[:8])],
                           className="causes", id=RootcauseIds.CAUSES))
    else:
        out.append(empty_state("No ranked causes", res.note, id=RootcauseIds.NOCAUSES))
    if res.context:
        out.append(_context(res.context, RootcauseIds.CONTEXT))
    return out


def _episodes(c: DashboardContext, node: str, a: float, b: float, zone: Any = None) -> tuple[list[Any], Any]:
    """The window's episode timeline and its bad episodes, each with its ranked causes; and what the
    timeline read (``TimelineView.read``)."""
    tv = rca_view.timeline(c.store, node, a, b, owners=functools.partial(workload_owners, c.store))
    fig = export.attach_series(figures.episode_timeline_figure(tv.episodes, (a, b), zone=zone),
                               rca_view.episode_series(tv.episodes, a, b))
    out: list[Any] = [html.H3("Episodes: one state per accelerator"),
                      html.Div(export.chart(RootcauseIds.TIMELINE, fig, RootcauseIds.TIMELINE, node, a, b, zone,
                                            config={"displaylogo": False}), id=RootcauseIds.TIMELINE)]
    for n in tv.notes:
        out.append(note(n, "info"))
    bad = [e for e in tv.bad if e.end > a and e.start < b]
    if not bad:
        out.append(empty_state("No bad episode in this window", "every accelerator was idle, demand-limited, "
                               "compute-bound or balanced (or no state is stored)", id=RootcauseIds.NOEPISODES))
    else:
        out.append(html.Ol([_episode(node, e, zone) for e in bad[:20]], className="episodes causes", id=RootcauseIds.EPISODES))
    out.append(html.Div(f"episodes from {tv.source}", className="muted"))
    return out, tv.read


def _episode(node: str, e: rca_view.EpisodeView, zone: Any = None) -> html.Li:
    wl = e.workload.display if e.workload is not None and e.workload.display else ""
    head = [html.B(e.where), html.Span(short(wl, 80), className="muted", title=full(e.workload.detail))
            if wl and e.workload is not None else None,
            html.Span(e.state, className="state-chip", style=state_style(e.state)),
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
        if e.causes[0].chain:    # the top cause is the verdict's chain: draw it (the others stay as context)
            kids.append(waitfor_view.chain_view(e.causes[0].chain, e.where))
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


def _cause(c: DashboardContext, node: str, i: int, cz: rca_view.Cause, a: float, b: float,
           baseline: tuple[float, float] | None, zone: Any = None) -> html.Li:
    kids: list[Any] = [html.Div([html.Span(short(cz.title, 200), className="cause-title"),
                                 html.Span(f"score {cz.score:.2f}" if cz.score is not None else "", className="badge"),
                                 html.Span(f"onset {fmt_ts(cz.onset, zone)}" if cz.onset else "", className="muted")],
                                className="card-head"),
                       html.Div(short(cz.summary, 600), className="muted")]
    if cz.chain:
        kids.append(waitfor_view.chain_view(cz.chain))
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
        kids.append(html.Ul([html.Li(short(f"{fmt_ts(number(e.get('ts')), zone)} {e.get('kind')}: {e.get('message', '')}", 300))
                             for e in cz.events[:5]], className="events"))
    return html.Li(kids, className="card cause")


def _chips(shares: dict[str, float]) -> list[Any]:
    out = []
    for s, f in sorted(shares.items(), key=lambda kv: -kv[1]):
        attrs: dict[str, Any] = {"data-state": s}
        out.append(html.Span(f"{s} {f:.0%}", className="state-chip", style=state_style(s), **attrs))
    return out


def _states(c: DashboardContext, node: str, a: float, b: float, baseline: tuple[float, float] | None = None,
            zone: Any = None) -> list[Any]:
    """The node's share of time in each state over the window and over its baseline, from the verdict
    history (the Node page's ribbon, the Mismatch page's shares): no detector runs here."""
    out: list[Any] = [html.H3("State over the window (the verdict history)")]
    win = rca_view.history_shares(c.store, node, a, b)
    if not win.shares:
        return out + [note(win.source, "info", id=RootcauseIds.NOSTATES)]
    out.append(html.Div(_chips(win.shares), className="legend-line", id=RootcauseIds.STATES))
    if baseline is not None:
        base = rca_view.history_shares(c.store, node, *baseline)
        if base.shares:
            out.append(html.Div([html.Span("baseline: ", className="muted")] + _chips(base.shares),
                                className="legend-line", id=RootcauseIds.BASELINE_STATES))
    if win.worst is not None:
        w = win.worst
        out.append(html.Div(f"worst stretch {fmt_ts(w.start, zone)} → {fmt_ts(w.end, zone)} "
                            f"{timeview.zone_name(zone, w.end)}: {w.state}"
                            + (f" (score {w.score:.2f})" if w.score is not None else ""), className="muted"))
    out.append(html.Div(f"from the {win.source}", className="muted"))
    return out


def _events(c: DashboardContext, node: str, a: float, b: float, zone: Any = None) -> list[Any]:
    evs = c.store.events(node=node, start=a, end=b, limit=51)
    if not evs:
        return []
    return [html.H3(f"Events in the window ({len(evs) if len(evs) <= 50 else '50+'})"),
            html.Ul([html.Li(short(f"{fmt_ts(e.ts, zone)} {e.kind} ({e.severity}): {e.message}", 300))
                     for e in evs[:50]], className="events")]
