"""Figure builders: plain functions from the data classes of ``triscope.dashboard.data`` to Plotly figures.

No Dash, no store, no request: unit-tested without a browser.  Times arrive as epoch seconds
and leave as ``datetime64[ms]`` arrays (UTC) so Plotly serialises them compactly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from triscope.core.names import shorten
from triscope.core.vocabulary import QUIET_STATES, State
from triscope.dashboard.jsontypes import JSON

if TYPE_CHECKING:   # the data classes drawn here (figures import none of their modules at run time)
    from triscope.dashboard.data import EventMark, LaneTrace, MismatchPoint, NodeLanes, Segment
    from triscope.dashboard.rca_view import EpisodeView

Trace: TypeAlias = Mapping[str, JSON]
"""A Plotly trace as a plain dict (``{"type": "scatter", "x": [...], ...}``): Plotly builds the same
trace from it as from ``go.Scatter(...)`` with the same properties."""
FigureDict: TypeAlias = dict[str, JSON]
"""A figure as the plain dict Dash sends (``{"data": [...], "layout": {...}}``)."""


class Figure(Protocol):
    """What the builders and pages use of ``plotly.graph_objects.Figure`` (Plotly ships no type
    hints): traces added as plain dicts, properties as JSON values."""

    def add_trace(self, trace: Trace) -> Figure: ...
    def add_annotation(self, **props: JSON) -> Figure: ...
    def add_shape(self, **props: JSON) -> Figure: ...
    def add_hline(self, y: float, **props: JSON) -> Figure: ...
    def update_layout(self, **props: JSON) -> Figure: ...
    def update_xaxes(self, **props: JSON) -> Figure: ...
    def update_yaxes(self, **props: JSON) -> Figure: ...
    def to_json(self) -> str: ...
    def to_plotly_json(self) -> FigureDict: ...


def new_figure() -> Figure:
    """An empty ``go.Figure``."""
    fig: Figure = go.Figure()
    return fig

NAME_CHARS = 48      # characters of a node name or label value shown; longer ones end in an ellipsis
TITLE_CHARS = 1024   # characters of one shown in full (a tooltip, a hover label)

# one colour per state (``State.colour``, triscope/core/vocabulary.py), in the states' order
STATE_COLORS: dict[str, str] = {s.value: s.colour for s in State}
UNKNOWN_STATE_COLOR = "#bdbdbd"
DARK_INK, LIGHT_INK = "#263238", "#ffffff"
STATE_INK: dict[str, str] = {s: DARK_INK if s in QUIET_STATES else LIGHT_INK for s in STATE_COLORS}
"""The text colour on a state's colour: dark on the pale quiet states, white on the others."""


def state_style(state: str | None) -> dict[str, str]:
    """A state chip's inline style (its colour and a readable text colour); {} for no state."""
    if not state:
        return {}
    return {"backgroundColor": STATE_COLORS.get(state, UNKNOWN_STATE_COLOR),
            "color": STATE_INK.get(state, DARK_INK)}


# One colour per kind of series on the Node page, the same on every node and never a state's (a
# line must not read as a state): (legend title, colour).  Several series of one kind (one per GPU,
# per workload) share the kind's colour in lighter shades and one legend entry.
SERIES_KINDS: dict[str, tuple[str, str]] = {
    "triscope_gpu_sm_active_ratio": ("SM active", "#00838f"),
    "triscope_npu_aicore_utilization_ratio": ("AICore busy", "#00838f"),
    "triscope_gpu_tensor_active_ratio": ("tensor active", "#4dd0e1"),
    "triscope_gpu_utilization_ratio": ("NVML util (coarse)", "#006064"),
    "triscope_workload_feeder_busy_ratio": ("feeder busy", "#f9a825"),
    "triscope_workload_cpu_wait_ratio": ("CPU wait", "#6d4c41"),
    "triscope_gpu_pcie_rx_bytes_total": ("PCIe RX (H2D)", "#c2185b"),
    "triscope_gpu_pcie_tx_bytes_total": ("PCIe TX (D2H)", "#f48fb1"),
    "capacity": ("link capacity", "#616161"),
    "triscope_iommu_map_bytes_total": ("IOMMU map", "#9e9d24"),
    "triscope_dma_map_total": ("DMA maps/s", "#827717"),
    "triscope_tcp_retransmits_total": ("TCP retransmits/s", "#880e4f"),
    "triscope_tcp_sockets": ("TIME_WAIT sockets", "#212121"),
}
OTHER_SERIES_COLOR = "#757575"
HOST_EVIDENCE = frozenset({"triscope_workload_feeder_busy_ratio", "triscope_workload_cpu_wait_ratio"})
"""Per-workload host-side series on the accelerator lane: drawn beneath the accelerator's own lines."""


def series_kind(metric: str) -> tuple[str, str]:
    """(legend title, colour) of a series' kind; unknown metrics are grey, titled by their name."""
    return SERIES_KINDS.get(metric, (metric, OTHER_SERIES_COLOR))


def shade(color: str, i: int) -> str:
    """The ``i``-th shade of a kind's colour: the colour itself, then mixed with white a little
    more each time (at most 60 %), so GPU 0 and GPU 1 of one kind stay one family."""
    k = min(0.6, 0.22 * i)
    r, g, b = (int(color[j:j + 2], 16) for j in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * k):02x}" for c in (r, g, b))
EVENT_SYMBOLS = {"xid": "x", "aer": "diamond", "iommu_fault": "triangle-down", "remediation": "star",
                 "retransmit_burst": "triangle-up", "gpu_lost": "x", "phase": "line-ns-open", "collector": "circle-open"}
SEVERITY_COLORS = {"info": "#546e7a", "warning": "#f9a825", "error": "#c62828", "critical": "#6a1b9a"}
LANE_ROWS = {"accelerators": 2, "io": 3, "network": 4}
LANE_LEGENDS = {1: "legend", 2: "legend2", 3: "legend3", 4: "legend4"}   # the states and events on top; a lane's beside it
FONT: dict[str, JSON] = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def to_dt(ts: Sequence[float]) -> list[str]:
    """Epoch seconds -> ISO 8601 strings (UTC, milliseconds), the form Plotly keeps in its JSON;
    live mode appends strings of the same form."""
    arr = (np.asarray(ts, dtype=float) * 1000.0).astype("datetime64[ms]")
    return [str(x) for x in np.datetime_as_string(arr, unit="ms")]


def display_names(names: Sequence[str], limit: int = NAME_CHARS) -> list[str]:
    """Names cut to ``limit`` characters, kept distinct (two long names with one prefix stay two
    bars): a repeat gets `` #2``, `` #3``..."""
    out: list[str] = []
    seen: set[str] = set()
    for n in names:
        d, k = shorten(n, limit), 2
        while d in seen:
            d = shorten(n, limit - len(f" #{k}")) + f" #{k}"
            k += 1
        seen.add(d)
        out.append(d)
    return out


def _base_layout(fig: Figure, height: int, uirevision: JSON = None) -> Figure:
    fig.update_layout(height=height, margin={"l": 60, "r": 30, "t": 40, "b": 40}, font=FONT, template="plotly_white",
                      uirevision=uirevision, hovermode="x unified",
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "font": {"size": 11}})
    return fig


def empty_figure(message: str, height: int = 260) -> Figure:
    """A figure that says what is missing instead of an empty plot."""
    fig = new_figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#555"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, template="plotly_white", margin={"l": 20, "r": 20, "t": 20, "b": 20}, font=FONT)
    return fig


def ribbon_shapes(segments: Sequence[Segment]) -> tuple[dict[str, list[str | None]], dict[str, list[int | None]],
                                                       dict[str, list[tuple[float, float, float | None]]]]:
    """Per state: the x/y of filled rectangles (None-separated) for one scatter trace each."""
    xs: dict[str, list[str | None]] = {}
    ys: dict[str, list[int | None]] = {}
    hover: dict[str, list[tuple[float, float, float | None]]] = {}
    for s in segments:
        a, b = to_dt([s.start, s.end])
        x = xs.setdefault(s.state, [])
        y = ys.setdefault(s.state, [])
        x.extend([a, a, b, b, a, None])
        y.extend([0, 1, 1, 0, 0, None])
        hover.setdefault(s.state, []).append((s.start, s.end, s.score))
    return xs, ys, hover


# axes of the node figure: row -> (x axis, primary y axis, secondary y axis)
NODE_AXES = {1: ("x", "y", None), 2: ("x2", "y2", None), 3: ("x3", "y3", "y4"), 4: ("x4", "y5", "y6")}


class _NodeFigure:
    """The node page's figure as it is built: the traces, their keys and the annotations."""

    def __init__(self, lanes: NodeLanes) -> None:
        self.lanes = lanes
        self.layout = _node_layout_base()
        self.data: list[dict[str, JSON]] = []
        self.keys: list[str] = []
        self.notes: list[dict[str, JSON]] = []
        self.units: dict[tuple[int, bool], str] = {}
        self.a, self.b = to_dt([lanes.window.start, lanes.window.end])

    def add(self, trace: dict[str, JSON], row: int, key: str, secondary: bool = False) -> None:
        xa, ya, ya2 = NODE_AXES[row]
        trace["xaxis"], trace["yaxis"] = xa, (ya2 if secondary and ya2 else ya)
        self.data.append(trace)
        self.keys.append(key)

    def frames(self) -> None:
        """One invisible trace per row keeps every subplot (and its axes and notes) drawn when a
        lane is empty."""
        for row in NODE_AXES:
            self.add({"type": "scatter", "x": [self.a, self.b], "y": [0, 0], "mode": "lines", "line": {"width": 0},
                      "opacity": 0, "showlegend": False, "hoverinfo": "skip"}, row, f"frame|{row}")

    def ribbon(self) -> None:
        xs, ys, _ = ribbon_shapes(self.lanes.segments)
        for state in [s for s in STATE_COLORS if s in xs] + [s for s in xs if s not in STATE_COLORS]:
            self.add({"type": "scatter", "x": xs[state], "y": ys[state], "fill": "toself", "mode": "lines",
                      "line": {"width": 0}, "fillcolor": STATE_COLORS.get(state, "#bdbdbd"), "name": state,
                      "hoverinfo": "name", "hoveron": "fills"}, 1, f"ribbon|{state}")
        if not self.lanes.segments:
            self.notes.append({**_note(self.lanes.segments_note or "no mismatch state", 1, 11), "x": 0.0, "xanchor": "left"})

    def events(self) -> None:
        """Events as markers on the ribbon row, one trace per kind."""
        by_kind: dict[str, list[EventMark]] = {}
        for e in self.lanes.events:
            by_kind.setdefault(e.kind, []).append(e)
        for kind, evs in by_kind.items():
            self.add({"type": "scatter", "x": to_dt([e.ts for e in evs]), "y": [0.5] * len(evs), "mode": "markers",
                      "name": f"event: {kind}",
                      "marker": {"symbol": EVENT_SYMBOLS.get(kind, "circle"), "size": 11, "line": {"width": 2},
                                 "color": [SEVERITY_COLORS.get(e.severity, "#546e7a") for e in evs]},
                      "text": [shorten(f"{e.kind} ({e.severity}): {e.message}", 300) for e in evs],
                      "hovertemplate": "%{text}<extra></extra>"}, 1, f"events|{kind}")

    def series(self) -> None:
        """The lanes (a lane with only secondary-axis series draws them on its primary axis): each
        series in its kind's colour (a lighter shade for the next GPU or workload of that kind), one
        legend entry per kind in the lane's own legend beside it; hovering a line names the series.
        The workloads' host-side evidence comes first (drawn beneath, thinner and lighter): the
        accelerator's own busy line stays readable over several workloads' feeder and CPU-wait lines."""
        has_primary = {LANE_ROWS[t.lane] for t in self.lanes.traces if not t.secondary}
        seen: dict[str, int] = {}
        entries: list[tuple[dict[str, JSON], int, str, bool]] = []    # one legend entry per kind: toggles all of it
        for t in sorted(self.lanes.traces, key=_evidence_last):
            row = LANE_ROWS[t.lane]
            secondary = bool(t.secondary and NODE_AXES[row][2] and row in has_primary)
            title, color = series_kind(t.metric)
            n = seen.get(title, 0)
            seen[title] = n + 1
            if n == 0:   # the kind's legend entry (added after the series: a lookup by name finds the series)
                entries.append(({"type": "scatter", "x": [None], "y": [None], "mode": "lines", "name": title,
                                 "legendgroup": title, "legend": LANE_LEGENDS[row], "hoverinfo": "skip",
                                 "line": {"width": 2.2, "color": color, "dash": t.dash or "solid"}},
                                row, f"legend|{title}", secondary))
            evidence = t.metric in HOST_EVIDENCE
            self.add({"type": "scatter", "x": to_dt(t.ts), "y": [v * t.scale for v in t.values], "mode": "lines",
                      "name": t.name,
                      "line": {"width": 1.0 if evidence else 1.4, "dash": t.dash or "solid", "shape": t.shape,
                               "color": shade(color, n)}, "opacity": 0.65 if evidence else 1.0,
                      "legendgroup": title, "showlegend": False, "legend": LANE_LEGENDS[row],
                      "hovertemplate": f"%{{y:.3g}} {t.unit}<extra>{t.name}</extra>",
                      # what the export (dashboard/export.py) writes beside each point
                      "meta": {"labels": _labels(t.labels), "unit": t.unit, "metric": t.metric, "kind": title}},
                     row, t.key, secondary)
            self.units.setdefault((row, secondary), t.unit)
        for entry in entries:
            self.add(*entry)

    def lane_notes(self) -> None:
        for lane, row in LANE_ROWS.items():
            msg = self.lanes.missing.get(lane)
            if msg:
                self.notes.append(_note(msg, row, 13))
        titles = {1: "state", 2: "Accelerators", 3: "I/O: PCIe / DMA / IOMMU", 4: "Network"}
        for row, title in titles.items():
            xa, ya, _ = NODE_AXES[row]
            self.notes.append({"text": f"<b>{title}</b>", "xref": f"{xa} domain", "yref": f"{ya} domain", "x": 0,
                               "y": 1, "xanchor": "left", "yanchor": "bottom", "showarrow": False,
                               "font": {"size": 12, "color": "#37474f"}})

    def part(self, key: str) -> dict[str, JSON]:
        """One object of the layout (an axis, a legend), to change in place."""
        got = self.layout[key]
        if not isinstance(got, dict):
            raise TypeError(f"layout.{key} is not an object")
        return got

    def yax(self, row: int, secondary: bool = False) -> dict[str, JSON]:
        _, ya, ya2 = NODE_AXES[row]
        name = ya2 if secondary and ya2 else ya
        return self.part("yaxis" + name[1:])

    def axes(self, height: int, uirevision: JSON) -> None:
        for (row, secondary), unit in self.units.items():
            self.yax(row, secondary).update(title={"text": unit}, rangemode="tozero")
        for row in (3, 4):
            if (row, True) not in self.units:
                self.yax(row, True)["visible"] = False
            if (row, False) not in self.units:
                self.yax(row)["rangemode"] = "tozero"
        self.yax(2)["range"] = [0, 105]
        self.yax(1).update(visible=False, fixedrange=True, range=[0, 1])
        for ax in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
            # live mode moves the range along unless the user zoomed
            self.part(ax).update(type="date", range=[self.a, self.b], showticklabels=ax == "xaxis4")
        for row, name in LANE_LEGENDS.items():   # each lane's legend at its right, level with its top
            if name != "legend":
                dom = self.part("yaxis" + NODE_AXES[row][1][1:])["domain"]
                top = dom[1] if isinstance(dom, list) else 1.0
                self.layout[name] = {"x": 1.01, "xanchor": "left", "y": top, "yanchor": "top", "orientation": "v",
                                     "font": {"size": 11}, "bgcolor": "rgba(255,255,255,0.7)"}
        self.layout.update(height=height, uirevision=uirevision, annotations=self.notes)


def node_lanes_figure(lanes: NodeLanes, uirevision: JSON = "node", height: int = 860) -> tuple[FigureDict, list[str]]:
    """The node page's figure: the mismatch ribbon and events on top, then the accelerator, I/O
    and network lanes on one shared time axis.  Returns (figure as a plain dict, trace keys in
    figure order); the keys let live mode append to the right traces.

    The layout comes from ``make_subplots``; the traces are plain dicts with list values (no
    per-point validation, and lists that ``dash.Patch`` can extend in live mode)."""
    f = _NodeFigure(lanes)
    f.frames()
    f.ribbon()
    f.events()
    f.series()
    f.lane_notes()
    f.axes(height, uirevision)
    return {"data": f.data, "layout": f.layout}, f.keys


_NODE_LAYOUT: dict[str, JSON] | None = None


def _evidence_last(t: LaneTrace) -> bool:
    return t.metric not in HOST_EVIDENCE


def _labels(labels: Mapping[str, str]) -> dict[str, JSON]:
    return dict(labels)


def _node_layout_base() -> dict[str, JSON]:
    """The node figure's layout without data: built once with make_subplots, copied per figure
    (make_subplots and the update_* calls cost ~40 ms a figure)."""
    global _NODE_LAYOUT
    if _NODE_LAYOUT is None:
        fig: Figure = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.045,
                            row_heights=[0.07, 0.31, 0.31, 0.31],
                            specs=[[{}], [{}], [{"secondary_y": True}], [{"secondary_y": True}]])
        _base_layout(fig, 860)
        fig.update_layout(dragmode="zoom", hovermode="closest",
                          legend={"y": 1.0, "yanchor": "bottom", "x": 0.05, "orientation": "h"},
                          margin={"l": 60, "r": 190, "t": 40, "b": 40})
        layout: dict[str, JSON] = json.loads(fig.to_json())["layout"]
        _NODE_LAYOUT = layout
    return copy.deepcopy(_NODE_LAYOUT)


def _note(text: str, row: int, size: int) -> dict[str, JSON]:
    xa, ya, _ = NODE_AXES[row]
    return {"text": text, "x": 0.5, "y": 0.5, "xref": f"{xa} domain", "yref": f"{ya} domain", "showarrow": False,
            "font": {"size": size, "color": "#666"}}


def mismatch_scatter(points: Sequence[MismatchPoint], height: int = 440) -> Figure:
    """Link load (x) against accelerator busy (y), one point per window, coloured by state."""
    if not points:
        return empty_figure("no mismatch windows: no accelerator data in this range", height)
    fig = new_figure()
    by_state: dict[str, list[MismatchPoint]] = {}
    for p in points:
        by_state.setdefault(p.state, []).append(p)
    for state in [s for s in STATE_COLORS if s in by_state] + [s for s in by_state if s not in STATE_COLORS]:
        pts = by_state[state]
        fig.add_trace({
            "type": "scatter", "x": [p.link_util * 100 for p in pts], "y": [p.busy * 100 for p in pts], "mode": "markers",
            "name": state, "marker": {"color": STATE_COLORS.get(state, "#bdbdbd"), "size": 7, "opacity": 0.75},
            "text": [f"{shorten(p.node, NAME_CHARS)} score {p.score:.2f}" for p in pts],
            "hovertemplate": "link %{x:.0f}% / busy %{y:.0f}%<br>%{text}<extra>" + state + "</extra>"})
    fig.update_xaxes(title_text="link load (% of the link's effective ceiling)", range=[-3, 110])
    fig.update_yaxes(title_text="accelerator busy (SM active / AICore %)", range=[-3, 105])
    _base_layout(fig, height)
    fig.update_layout(hovermode="closest")
    return fig


def state_share_figure(shares: Mapping[str, Mapping[str, float]], height: int | None = None,
                       notes: Mapping[str, str] | None = None,
                       empty: str = "no node has accelerator data in this range") -> Figure:
    """Share of time in each state per node (or per workload): one stacked horizontal bar each,
    in the order given; ``notes`` adds a line to a bar's hover (where a workload ran)."""
    if not shares:
        return empty_figure(empty, 220)
    nodes = list(shares)
    fig = new_figure()
    states = [s for s in STATE_COLORS if any(s in shares[n] for n in nodes)]
    states += sorted({s for n in nodes for s in shares[n]} - set(states))
    shown = display_names(nodes)
    hover = [shorten(n, 253) + (f" ({shorten(notes[n], 200)})" if notes and notes.get(n) else "") for n in nodes]
    for s in states:
        fig.add_trace({"type": "bar", "y": shown, "x": [shares[n].get(s, 0.0) * 100 for n in nodes], "name": s,
                       "orientation": "h", "marker": {"color": STATE_COLORS.get(s, "#bdbdbd")}, "customdata": hover,
                       "hovertemplate": "%{customdata}: %{x:.1f}%<extra>" + s + "</extra>"})
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="share of time (%)", range=[0, 100])
    fig.update_yaxes(autorange="reversed")   # the first given on top
    _base_layout(fig, height or max(200, 90 + 40 * len(nodes)))
    fig.update_layout(hovermode="closest", legend_traceorder="normal")   # the states in their order
    return fig


def slo_figure(name: str, ts: Sequence[float], budget_remaining: Sequence[float | None],
               actions: Sequence[tuple[float, str]] = (), height: int = 300) -> Figure:
    """Error budget remaining (%) over the window, with remediation actions as vertical markers."""
    if not ts or all(v is None for v in budget_remaining):
        return empty_figure("no SLI data in this window: the SLO's series are not stored for it (no traffic is "
                            "'no data', not 0)", height)
    fig = new_figure()
    y = [None if v is None else v * 100 for v in budget_remaining]
    fig.add_trace({"type": "scatter", "x": to_dt(ts), "y": y, "mode": "lines+markers", "name": "error budget remaining",
                   "line": {"width": 2}, "connectgaps": False, "hovertemplate": "%{y:.1f}%<extra></extra>",
                   "meta": {"labels": {"slo": name}, "unit": "%"}})
    fig.add_hline(y=0, line={"color": "#c62828", "dash": "dash", "width": 1})
    if actions:
        fig.add_trace({"type": "scatter", "x": to_dt([a[0] for a in actions]), "y": [100] * len(actions),
                       "mode": "markers", "name": "remediation",
                       "marker": {"symbol": "star", "size": 12, "color": "#6a1b9a"},
                       "text": [a[1] for a in actions], "hovertemplate": "%{text}<extra></extra>"})
    fig.update_yaxes(title_text="budget left (%)")
    _base_layout(fig, height)
    fig.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 1, "xanchor": "right"},
                      margin={"l": 60, "r": 20, "t": 30, "b": 40})
    return fig


def evidence_figure(title: str, ts: Sequence[float], values: Sequence[float], window: tuple[float, float],
                    baseline: tuple[float, float] | None = None, onset: float | None = None,
                    unit: str = "", height: int = 220, labels: Mapping[str, str] | None = None) -> Figure:
    """One cause's series with the baseline and the window shaded and the onset marked."""
    if not ts:
        return empty_figure(f"{title}: no points stored for this series", height)
    fig = new_figure()
    fig.add_trace({"type": "scatter", "x": to_dt(ts), "y": list(values), "mode": "lines", "name": title,
                   "line": {"width": 1.5}, "hovertemplate": f"%{{y:.3g}} {unit}<extra></extra>",
                   "meta": {"labels": _labels(labels or {}), "unit": unit}})
    spans = [("baseline", baseline, "#90a4ae")] if baseline is not None else []
    spans.append(("window", window, "#ef6c00"))
    for label, span, color in spans:
        a, b = to_dt(span)
        fig.add_shape(type="rect", x0=a, x1=b, y0=0, y1=1, xref="x", yref="paper", fillcolor=color,
                      opacity=0.13, line_width=0, layer="below")
        fig.add_annotation(x=a, y=1, xref="x", yref="paper", text=label, showarrow=False, xanchor="left",
                           yanchor="top", font={"size": 10, "color": "#555"})
    if onset is not None:
        o = to_dt([onset])[0]
        fig.add_shape(type="line", x0=o, x1=o, y0=0, y1=1, xref="x", yref="paper",
                      line={"color": "#c62828", "dash": "dash", "width": 1})
    fig.update_yaxes(title_text=unit)
    _base_layout(fig, height)
    fig.update_layout(showlegend=False, title={"text": title, "font": {"size": 12}})
    return fig


# the timeline's markers by episode kind: health incidents loud (a fault), SLO burns a red star, lane
# events (a scrape target's late /metrics: context, never a bad episode) a small quiet grey ring
EPISODE_MARKS: dict[str, dict[str, JSON]] = {
    "health": {"symbol": "x", "size": 12, "color": "#c62828", "line": {"width": 1}},
    "slo": {"symbol": "star", "size": 12, "color": "#c62828", "line": {"width": 1}},
    "event": {"symbol": "circle-open", "size": 8, "color": "#78909c", "line": {"width": 1.5}},
}
EPISODE_MARK_NAMES = {"health": "health incident", "slo": "SLO burn", "event": "event (context)"}


def episode_timeline_figure(episodes: Sequence[EpisodeView], window: tuple[float, float], height: int | None = None,
                            zone: tzinfo | None = None) -> Figure:
    """The episode timeline: a row per accelerator (its workload in the row label), each run of one
    state a bar in the state's colour, health incidents and SLO burn periods as red markers, lane
    events (never bad) as quiet grey rings (``EPISODE_MARKS``).  ``episodes`` carry ``start``,
    ``end``, ``state``, ``kind``, ``bad``, ``where`` (the row), ``workload`` (``display``) and
    ``causes`` (``title``)."""
    if not episodes:
        return empty_figure("no episodes in this window: no accelerator state and no health event stored", 200)
    a, b = window
    rows: list[str] = []
    labels: dict[str, str] = {}
    for e in episodes:
        row = "SLO" if e.kind == "slo" else e.where
        if row not in rows:
            rows.append(row)
        wl = e.workload.display if e.workload is not None else ""
        if e.kind == "state" and wl and row not in labels:
            labels[row] = f"{row} \u00b7 {shorten(wl, 36)}"
    y_of = {r: i for i, r in enumerate(rows)}
    xs: dict[str, list[str | None]] = {}
    ys: dict[str, list[float | None]] = {}
    mid_x: list[str] = []
    mid_y: list[float] = []
    mid_text: list[str] = []
    marks: dict[str, tuple[list[str], list[float], list[str]]] = {}
    for e in episodes:
        s0, s1 = max(e.start, a), min(e.end, b)
        row = "SLO" if e.kind == "slo" else e.where
        y = y_of[row]
        top = [c.title for c in e.causes[:2]]
        text = (f"{e.where}: {e.state} {_hm(e.start, zone)}\u2013{_hm(e.end, zone)} ({_dur(e.end - e.start)})"
                + (f"<br>{shorten(e.workload.display, 80)}" if e.workload is not None and e.workload.display else "")
                + (f"<br>likely: {'; '.join(shorten(t, 60) for t in top)}" if top else ""))
        if e.kind != "state":
            x, yv, tx = marks.setdefault(e.kind, ([], [], []))
            x.append(to_dt([s0])[0])
            yv.append(y)
            tx.append(text)
            continue
        if s1 <= s0:
            continue
        x0, x1 = to_dt([s0, s1])
        xs.setdefault(e.state, []).extend([x0, x0, x1, x1, x0, None])
        lo, hi = y - 0.38, y + 0.38
        ys.setdefault(e.state, []).extend([lo, hi, hi, lo, lo, None])
        mid_x.append(to_dt([(s0 + s1) / 2])[0])
        mid_y.append(y)
        mid_text.append(text)
    fig = new_figure()
    for state in [s for s in STATE_COLORS if s in xs] + [s for s in xs if s not in STATE_COLORS]:
        fig.add_trace({"type": "scatter", "x": xs[state], "y": ys[state], "fill": "toself", "mode": "lines",
                       "name": state, "line": {"width": 0}, "fillcolor": STATE_COLORS.get(state, "#bdbdbd"),
                       "hoverinfo": "skip"})
    fig.add_trace({"type": "scatter", "x": mid_x, "y": mid_y, "mode": "markers", "marker": {"size": 14, "opacity": 0},
                   "showlegend": False, "text": mid_text, "hovertemplate": "%{text}<extra></extra>", "name": "episodes"})
    for kind, (x, yv, tx) in marks.items():
        fig.add_trace({"type": "scatter", "x": x, "y": yv, "mode": "markers", "name": EPISODE_MARK_NAMES.get(kind, kind),
                       "marker": EPISODE_MARKS.get(kind, EPISODE_MARKS["health"]), "text": tx,
                       "hovertemplate": "%{text}<extra></extra>"})
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=[labels.get(r, r) for r in rows],
                     range=[len(rows) - 0.5, -0.5], fixedrange=True)
    fig.update_xaxes(type="date", range=to_dt([a, b]))
    _base_layout(fig, height or 110 + 46 * len(rows))
    fig.update_layout(hovermode="closest", margin={"l": 20, "r": 20, "t": 40, "b": 30})
    fig.update_yaxes(automargin=True)
    return fig


def _hm(ts: float, zone: tzinfo | None = None) -> str:
    """``HH:MM:SS`` in UTC, or in ``zone`` (a tzinfo: the page's local-time view)."""
    if zone is None:
        return to_dt([ts])[0][11:19]
    return datetime.fromtimestamp(ts, zone).strftime("%H:%M:%S")


def _dur(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
