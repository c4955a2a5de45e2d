"""Node: the three lanes (accelerators / I/O / network) on one shared time axis, the mismatch
ribbon and the events above them; presets, custom range, live mode, "explain this window"; an
accelerator picker (``?gpu=1``, ``?npu=3&chip=0``: that accelerator's lanes, state ribbon and
workloads' feeder evidence) and the workloads on the node's accelerators."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

import dash
from dash import Input, Output, Patch, State, dcc, html, no_update

from triscope.core.vocabulary import AcceleratorId
from triscope.dashboard import (
    data,
    export,
    figures,
    timerange,
    timeview,
    topology_view,
    waitfor_data,
    waitfor_view,
    workload_data,
)
from triscope.dashboard.components import error_note, fmt_ts, name_span, note, parse_ts, range_picker, short
from triscope.dashboard.context import DashboardContext, ctx
from triscope.dashboard.ids import NodeIds
from triscope.dashboard.node_parts import accel_picker, workload_panel, workload_states
from triscope.dashboard.registry import page_callback

WAITFOR_LIVE_S = 30.0   # live mode redraws the wait-for panel this often (it reads the whole range again)

dash.register_page(__name__, path="/node", path_template="/node/<node>", name="Node", order=1, title="triscope - node",
                   nav_hidden=True)


def layout(node: str | None = None, range: str = "", start: str = "", end: str = "",  # noqa: A002
           gpu: str = "", npu: str = "", chip: str = "", **_: Any) -> html.Div:
    c = ctx()
    infos = {n.name: n for n in c.store.nodes()}
    known = list(infos)
    if not range and node in infos:  # default (timerange): the last hour of its data, all of it when less
        range = timerange.default_preset(timerange.node_bounds(c.store, node))  # noqa: A001
    if not node or node not in known:
        msg = ("no nodes stored yet: start the agent ('triscope agent --db URL') or import a trace"
               if not known else f"unknown node {short(node)!r}" if node else "pick a node")
        return html.Div([html.H2("Node"), note(msg, "warn"),
                         html.Ul([html.Li(dcc.Link(name_span(n), href=f"/node/{quote(n)}")) for n in known])])
    preset = "custom" if (start and end and range in ("", "custom", "1h", "15m")) and parse_ts(start) and parse_ts(end) \
        else (range or "1h")
    accel = AcceleratorId.from_query(gpu, npu, chip)
    rec = infos[node].recording
    head: list[Any] = [html.H2(name_span(node), className="node-title")]
    if rec:   # a recording says so, next to its name and in a line under it; never "live"
        head.append(html.Span("recording", className="badge badge-recording", id=NodeIds.RECORDING,
                              title=f"imported from {rec}"))
    head.append(html.Span(id=NodeIds.WINDOW_NOTE, className="window-note"))
    return html.Div([
        dcc.Store(id=NodeIds.NAME, data=node),
        dcc.Store(id=NodeIds.ACCEL, data=accel.query if accel is not None else ""),
        dcc.Store(id=NodeIds.META),
        html.Div(head, className="page-head"),
        note(data.recording_note(c.store, node), "info", id=NodeIds.RECORDING_NOTE) if rec else html.Div(),
        html.Div([
            range_picker(NodeIds.PICKER.prefix, preset, start, end, data=True),
            # a recording has no new points to follow: no live mode
            dcc.Checklist(id=NodeIds.LIVE, options=[{"label": " live", "value": "live", "disabled": bool(rec)}],
                          value=[], inline=True, className="live-toggle"),
            html.Div(id=NodeIds.EXPLAIN, className="explain"),
        ], className="toolbar"),
        html.Div(id=NodeIds.ACCELS, className="accel-picker"),
        html.Div(id=NodeIds.WORKLOADS, className="workload-panel"),
        dcc.Interval(id=NodeIds.INTERVAL, interval=int(c.live_interval_s * 1000), disabled=True),
        export.buttons(NodeIds.GRAPH),
        dcc.Loading(dcc.Graph(id=NodeIds.GRAPH, config={"displaylogo": False, "scrollZoom": False},
                              figure=figures.empty_figure("loading...", 820)), delay_show=400, type="dot"),
        html.Div(id=NodeIds.STATUS, className="status-line"),
        # where each accelerator's driving threads' time went (docs/waitfor.md): its own callback, so the
        # lanes draw first; refreshed with them, and every WAITFOR_LIVE_S in live mode
        dcc.Interval(id=NodeIds.WAITFOR_INTERVAL, interval=int(max(WAITFOR_LIVE_S, c.live_interval_s) * 1000),
                     disabled=True),
        dcc.Loading(html.Div(id=NodeIds.WAITFOR, className="waitfor"), delay_show=400, type="dot"),
        _topology(c, node),
    ])


def _topology(c: DashboardContext, node: str) -> Any:
    """The picture of where the node's accelerators sit (nothing when its agent sends no topology)."""
    try:
        t = topology_view.node_topology(c.store, node)
    except Exception as e:  # noqa: BLE001 - say it in the page, never a traceback
        return error_note("reading the node's topology", e)
    if not t.devices:
        return html.Div(id=NodeIds.TOPOLOGY_NONE)
    far = sum(1 for d in t.devices if any(v is not None and 1 - v >= topology_view.REMOTE_BAR
                                          for v in (d.cpu_local, d.mem_local)))
    head = (f"Topology: {len(t.sockets)} NUMA node(s), {len(t.devices)} accelerator(s)"
            + (f", {far} fed from another NUMA node" if far else ""))
    return html.Details([html.Summary(head),
                         dcc.Graph(id=NodeIds.TOPOLOGY, figure=topology_view.topology_figure(t),
                                   config={"displaylogo": False})], open=True, className="topology")


# ---------------------------------------------------------------------------------------------- callbacks
export.register(NodeIds.GRAPH, "node", NodeIds.META)   # the chart's CSV / JSON buttons


def _window(c: DashboardContext, node: str, preset: str, start: str | None, end: str | None) -> data.Window:
    custom = None
    if preset == "custom":
        a, b = parse_ts(start), parse_ts(end)
        if a is None or b is None or a == b:
            raise ValueError("custom range needs a start and an end (UTC ISO 8601 or epoch seconds)")
        custom = (a, b)
    return timerange.window(preset, timerange.node_bounds(c.store, node), c.now(), custom)


@page_callback(
    Output(NodeIds.GRAPH, "figure"), Output(NodeIds.META, "data"), Output(NodeIds.WINDOW_NOTE, "children"),
    Output(NodeIds.STATUS, "children"), Output(NodeIds.ACCELS, "children"), Output(NodeIds.WORKLOADS, "children"),
    Input(NodeIds.PICKER.range, "value"), Input(NodeIds.PICKER.apply, "n_clicks"), Input(NodeIds.NAME, "data"),
    State(NodeIds.PICKER.start, "value"), State(NodeIds.PICKER.end, "value"), State(NodeIds.ACCEL, "data"),
    Input(timeview.TZ_STORE, "data"),   # the local-time toggle redraws
)
def render(preset: str, _clicks: int, node: str, start: str | None, end: str | None,
           accel_query: str | None = None, tz: dict[str, Any] | None = None) -> tuple[Any, ...]:
    c = ctx()
    zone = timeview.zone_of(tz)
    t0 = time.perf_counter()
    accel = _accel(accel_query)
    try:
        w = _window(c, node, preset, start, end)
    except ValueError as e:
        return no_update, no_update, "", note(str(e), "warn"), no_update, no_update
    except Exception as e:  # noqa: BLE001 - the store is unreachable: say so
        return figures.empty_figure("the node's data could not be read (see the note below)"), None, "", \
            error_note("reading the node", e), "", ""
    try:
        lanes = data.node_lanes(c.store, node, w, max_points=c.max_points, accel=accel)
        fig, keys = figures.node_lanes_figure(
            lanes, uirevision=f"{node}|{accel_query or ''}|{preset}|{w.start:.0f}|{zone.key if zone else 'UTC'}")
        timeview.localize_figure(fig, zone)
    except Exception as e:  # noqa: BLE001 - say it in the page, never a traceback
        return figures.empty_figure("the node's data could not be read (see the note below)"), None, "", \
            error_note("reading the node's series", e), "", ""
    try:
        picker, panel = _accel_parts(c, node, lanes, w, preset, start, end)
    except Exception as e:  # noqa: BLE001
        picker, panel = "", error_note("reading the node's workloads", e)
    npts = sum(len(t.ts) for t in lanes.traces)
    cursor = max((t.ts[-1] for t in lanes.traces if t.ts and t.metric != "capacity"), default=w.end)
    meta = {"node": node, "keys": keys, "cursor": cursor, "start": w.start, "end": w.end, "live": w.live,
            "tz": zone.key if zone else None, "scale": {t.key: t.scale for t in lanes.traces if t.scale != 1.0}}
    head = f"{fmt_ts(w.start, zone)} to {fmt_ts(w.end, zone)} {timeview.zone_name(zone, w.end)}" + (
        f" ({w.note})" if w.note else "")
    status = (f"{len(lanes.traces)} series, {npts} points after downsampling, {len(lanes.events)} events"
              + (" (more events in range than shown)" if lanes.events_truncated else "")
              + f"; ribbon: {lanes.segments_note}; built in {(time.perf_counter() - t0) * 1000:.0f} ms")
    return fig, meta, head, status, picker, panel


def _accel(query: str | None) -> AcceleratorId | None:
    from urllib.parse import parse_qs

    q = {k: v[0] for k, v in parse_qs(query or "").items()}
    return AcceleratorId.from_query(q.get("gpu"), q.get("npu"), q.get("chip"))


def _accel_parts(c: DashboardContext, node: str, lanes: data.NodeLanes, w: data.Window, preset: str, start: str | None,
                 end: str | None) -> tuple[Any, Any]:
    """The accelerator picker (links that keep the range) and the workload panel."""
    import functools

    if not lanes.accels:
        return "", ""
    lookup = functools.partial(workload_data.workload_owners, c.store)
    now = workload_data.node_current(c.store, node, lookup)
    keep: dict[str, str] = {"range": preset}
    if preset == "custom" and start and end:
        keep.update(start=str(start), end=str(end))
    rows = workload_data.node_workloads(c.store, node, w.start, w.end, lanes.accel, owners=lookup,
                                        fetch=data.fetch_all, listed=lanes.listed)
    states = workload_states(c.store, node, w.start, w.end)    # each row coloured by its own state
    return accel_picker(node, lanes.accels, lanes.accel, now, keep), workload_panel(rows, lanes.accel, w, states)


@page_callback(Output(NodeIds.INTERVAL, "disabled"), Output(NodeIds.WAITFOR_INTERVAL, "disabled"),
               Input(NodeIds.LIVE, "value"))
def toggle_live(value: list[str] | None) -> tuple[bool, bool]:
    off = "live" not in (value or [])
    return off, off


@page_callback(
    Output(NodeIds.WAITFOR, "children"),
    Input(NodeIds.PICKER.range, "value"), Input(NodeIds.PICKER.apply, "n_clicks"), Input(NodeIds.NAME, "data"),
    Input(NodeIds.WAITFOR_INTERVAL, "n_intervals"),
    State(NodeIds.PICKER.start, "value"), State(NodeIds.PICKER.end, "value"), State(NodeIds.ACCEL, "data"),
    Input(timeview.TZ_STORE, "data"),
)
def render_waitfor(preset: str, _clicks: int, node: str, _n: int | None, start: str | None, end: str | None,
                   accel_query: str | None = None, tz: dict[str, Any] | None = None) -> Any:
    """Per accelerator (the picked one), where its workloads' driving threads' time went over the
    range and where the chain of waits from them ends (``waitfor_data.node_waitfor``)."""
    import functools

    c = ctx()
    zone = timeview.zone_of(tz)
    accel = _accel(accel_query)
    try:
        w = _window(c, node, preset, start, end)
    except ValueError:
        return no_update          # the lanes' callback says what is wrong with the range
    except Exception as e:  # noqa: BLE001 - the store is unreachable: say so
        return error_note("reading the node's wait-for evidence", e)
    try:
        rows = waitfor_data.node_waitfor(c.store, node, w.start, w.end, accel,
                                         owners=functools.partial(workload_data.workload_owners, c.store),
                                         fetch=_fetch_waitfor)
        if not rows and accel is None:
            return ""             # no accelerator with workloads: nothing to say here
        return waitfor_view.node_panel(rows, (w.start, w.end), accel,
                                       uirevision=f"{node}|{accel_query or ''}|{preset}|{zone.key if zone else 'UTC'}",
                                       zone=zone)
    except Exception as e:  # noqa: BLE001 - say it in the page, never a traceback
        return error_note("reading the node's wait-for evidence", e)


def _fetch_waitfor(store: Any, infos: Any, start: float, end: float, tier: str | None) -> list[Any]:
    """The wait-for series on the page's small thread pool (``data.fetch_all``), every point of ``tier``."""
    return data.fetch_all(store, infos, start, end, None, tier=tier)


@page_callback(
    Output(NodeIds.GRAPH, "figure", allow_duplicate=True), Output(NodeIds.META, "data", allow_duplicate=True),
    Input(NodeIds.INTERVAL, "n_intervals"), State(NodeIds.META, "data"), State(NodeIds.GRAPH, "relayoutData"),
    prevent_initial_call=True,
)
def live_append(_n: int, meta: dict[str, Any] | None, relayout: dict[str, Any] | None) -> tuple[Any, Any]:
    """Append the points stored since the last render / append.  Without a user zoom the time
    axis moves along with the newest point; a user's zoom stays (uirevision, and the range is
    left alone)."""
    if not meta or not meta.get("keys"):
        return no_update, no_update
    c = ctx()
    since = float(meta["cursor"])
    zone = timeview.zone_of({"local": True, "zone": meta["tz"]}) if meta.get("tz") else None
    try:
        delta = data.live_delta(c.store, meta["node"], meta["keys"], since, c.now() + 1)
    except Exception as e:  # noqa: BLE001 - a store hiccup: keep the chart, try again next interval
        import logging

        logging.getLogger("dashboard").warning("live append for %s failed: %s", meta["node"], e)
        return no_update, no_update
    if not any(ts for ts, _ in delta.values()):
        return no_update, no_update
    scale = meta.get("scale") or {}
    p = Patch()
    newest = since
    for i, key in enumerate(meta["keys"]):
        if key not in delta:
            continue
        ts, vals = delta[key]
        if not ts:
            continue
        k = float(scale.get(key, 1.0))
        p["data"][i]["x"].extend(timeview.to_display(figures.to_dt(ts), zone))
        p["data"][i]["y"].extend([v * k for v in vals])
        newest = max(newest, ts[-1])
    zoomed = any(k.startswith("xaxis") and ".range" in k for k in (relayout or {}))
    if not zoomed and meta.get("live"):
        span = float(meta["end"]) - float(meta["start"])
        rng = timeview.to_display(figures.to_dt([newest + 1 - span, newest + 1]), zone)
        for ax in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
            p["layout"][ax]["range"] = rng
    meta = dict(meta, cursor=newest)
    return p, meta


@page_callback(
    Output(NodeIds.EXPLAIN, "children"),
    Input(NodeIds.GRAPH, "relayoutData"), Input(NodeIds.GRAPH, "selectedData"), Input(NodeIds.META, "data"),
)
def explain_link(relayout: dict[str, Any] | None, selected: dict[str, Any] | None, meta: dict[str, Any] | None) -> Any:
    """Offer "explain this window" for the zoomed / selected span (else the whole range)."""
    if not meta:
        return ""
    a, b = float(meta["start"]), float(meta["end"])
    tz = meta.get("tz")   # the zone the axes are drawn in (None: UTC); the link's URL stays epoch seconds
    zone = timeview.zone_of({"local": True, "zone": tz}) if tz else None
    picked = False
    try:
        trig = dash.callback_context.triggered_id
    except dash.exceptions.MissingCallbackContextException:  # called outside a request (benchmark)
        trig = NodeIds.GRAPH
    if trig == NodeIds.GRAPH and selected and selected.get("range"):
        xr = next(iter(selected["range"].values()), None)
        if xr and len(xr) == 2:
            a, b, picked = *_span(xr[0], xr[1], a, b, tz), True
    elif relayout:
        for k, v in relayout.items():
            if k.startswith("xaxis") and k.endswith(".range[0]"):
                hi = relayout.get(k.replace("[0]", "[1]"))
                a, b, picked = *_span(v, hi, a, b, tz), True
                break
            if k.startswith("xaxis") and k.endswith(".range") and isinstance(v, list) and len(v) == 2:
                a, b, picked = *_span(v[0], v[1], a, b, tz), True
                break
    href = "/rootcause?" + urlencode({"node": meta["node"], "start": f"{a:.0f}", "end": f"{b:.0f}"})
    what = "the selected span" if picked else "this range"
    span = f"{fmt_ts(a, zone)} to {fmt_ts(b, zone)} {timeview.zone_name(zone, b)}"
    return dcc.Link(f"Explain {what} ({span}) \u2192", href=href, id=NodeIds.EXPLAIN_LINK, className="btn btn-primary")


def _span(x0: Any, x1: Any, a: float, b: float, tz: str | None = None) -> tuple[float, float]:
    """An axis span (drawn in ``tz``'s wall time, UTC when None) as epoch seconds; (a, b) when unreadable."""
    lo, hi = (timeview.to_utc_ts(str(x), tz) if tz else parse_ts(str(x)) for x in (x0, x1))
    if lo is None or hi is None or hi <= lo:
        return a, b
    return lo, hi
