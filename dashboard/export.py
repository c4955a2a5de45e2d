"""A chart's data as CSV or JSON, from the page's "CSV" / "JSON" buttons.

The download is made from the figure the browser holds (the ``figure`` prop, sent as callback
State), not from a second query: what is downloaded is exactly what is drawn (the same range, the
same downsampling, the points live mode appended since).  Only traces that carry
``meta.labels`` are series (the node lanes'); the state ribbon, the event markers and the
invisible frame traces are drawing aids and stay out.

Timestamps in a file are always UTC (ISO 8601, ``Z``), whatever the page shows: a figure drawn in
local time names its zone in ``layout.meta.tz`` and is converted back (``timeview.to_utc_ts``).

CSV: one row per point, columns ``ts``, ``series``, one per label key (the union over the
series, sorted), ``value``.  Label values come from outside (node names, pod labels): the csv
module quotes commas, quotes and newlines; a cell that a spreadsheet would run as a formula
(``=``, ``+``, ``-``, ``@``, tab, CR first) gets a leading ``'``.  JSON:
``{"chart", "node", "start", "end", "series": [{"name", "labels", "unit", "points": [[ts, value]]}]}``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dash import MATCH, Input, Output, State, dcc, html, no_update

from triscope.dashboard.registry import page_callback
from triscope.dashboard.timeview import TZ_META, localize_figure, to_utc_ts

FORMULA_FIRST = ("=", "+", "-", "@", "\t", "\r")
RESERVED = ("ts", "series", "value")
EXPORT_META = "export"      # layout.meta key: {"chart", "node", "start", "end"} of a chart made with ``chart``
SLUG_CHARS = 48


@dataclass
class Series:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    unit: str = ""
    points: list[tuple[float, float | None]] = field(default_factory=list)   # (epoch s UTC, value)


def iso(ts: float) -> str:
    """Epoch seconds -> ``2026-12-01T15:00:00.000Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def series_from_figure(fig: Mapping[str, Any] | None) -> list[Series]:
    """The figure's series: those attached whole (``attach_series``), then the traces with
    ``meta.labels``, their x strings back in UTC."""
    if not fig:
        return []
    meta = (fig.get("layout") or {}).get("meta")
    zone = meta.get(TZ_META) if isinstance(meta, dict) else None
    out: list[Series] = _attached(meta)
    for tr in fig.get("data") or []:
        tm = tr.get("meta")
        if not isinstance(tm, dict) or not isinstance(tm.get("labels"), dict):
            continue
        pts: list[tuple[float, float | None]] = []
        for x, y in zip(tr.get("x") or [], tr.get("y") or [], strict=False):
            ts = to_utc_ts(x, zone)
            if ts is not None:
                pts.append((ts, _num(y)))
        out.append(Series(name=str(tr.get("name") or ""), labels={str(k): str(v) for k, v in tm["labels"].items()},
                          unit=str(tm.get("unit") or ""), points=pts))
    return out


SERIES_META = "series"      # layout.meta key: series given whole with a chart whose x is not time


def attach_series(fig: Any, series: Sequence[Series]) -> dict[str, Any]:
    """A figure (dict or go.Figure) with ``series`` in its ``layout.meta``: for charts whose x is
    not time (the Mismatch scatter, the state-share bars), built in the same call from the same
    rows as the traces, so the download still holds what is drawn."""
    f = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else dict(fig)
    f = {"data": list(f.get("data") or []), "layout": dict(f.get("layout") or {})}
    meta = f["layout"].get("meta") if isinstance(f["layout"].get("meta"), dict) else {}
    f["layout"]["meta"] = dict(meta, **{SERIES_META: [
        {"name": x.name, "labels": x.labels, "unit": x.unit, "points": [[ts, v] for ts, v in x.points]} for x in series]})
    return f


def _attached(meta: Any) -> list[Series]:
    out: list[Series] = []
    for d in (meta.get(SERIES_META) if isinstance(meta, dict) else None) or []:
        if not isinstance(d, dict):
            continue
        pts = [(float(p[0]), _num(p[1])) for p in d.get("points") or [] if isinstance(p, list | tuple) and len(p) == 2
               and _num(p[0]) is not None]
        out.append(Series(str(d.get("name") or ""), {str(k): str(v) for k, v in (d.get("labels") or {}).items()},
                          str(d.get("unit") or ""), pts))
    return out


def _cell(text: str) -> str:
    return "'" + text if text.startswith(FORMULA_FIRST) else text


def render_csv(series: Sequence[Series]) -> str:
    """One row per point: ts (UTC ISO 8601), series, the labels, value (empty for a gap)."""
    keys = sorted({k for s in series for k in s.labels})
    cols = [f"label_{k}" if k in RESERVED else k for k in keys]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["ts", "series", *(_cell(c) for c in cols), "value"])
    for s in series:
        labels = [_cell(s.labels.get(k, "")) for k in keys]
        name = _cell(s.name)
        for ts, v in s.points:
            w.writerow([iso(ts), name, *labels, "" if v is None else repr(v)])
    return buf.getvalue()


def render_json(chart: str, node: str | None, start: float | None, end: float | None,
                series: Sequence[Series]) -> str:
    """The chart's series as one JSON document (no NaN: a gap is null)."""
    doc = {
        "chart": chart, "node": node,
        "start": iso(start) if start is not None else None, "end": iso(end) if end is not None else None,
        "series": [{"name": s.name, "labels": s.labels, "unit": s.unit,
                    "points": [[iso(ts), v] for ts, v in s.points]} for s in series],
    }
    return json.dumps(doc, allow_nan=False, indent=1)


def slug(text: str | None) -> str:
    """A piece of a file name: ``[A-Za-z0-9._-]`` only, at most SLUG_CHARS characters (a long or
    hostile node name is cut and gets a digest, so two long names stay two files)."""
    t = str(text or "")
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", t).strip("._") or "none"
    if s != t or len(s) > SLUG_CHARS:
        digest = hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
        s = f"{s[:SLUG_CHARS - 9]}-{digest}"
    return s


def filename(chart: str, node: str | None, end: float | None, ext: str) -> str:
    """``triscope-node-h200-node-20261201T1500Z.csv``: what (the chart, the node) and when (the
    range's end, UTC, to the minute)."""
    when = datetime.fromtimestamp(end, UTC).strftime("%Y%m%dT%H%MZ") if end is not None else "now"
    parts = ["triscope", slug(chart)] + ([slug(node)] if node else []) + [when]
    return "-".join(parts) + f".{ext}"


def buttons(graph_id: str) -> html.Div:
    """The "CSV" and "JSON" buttons for the chart ``graph_id`` and the download they fill."""
    return html.Div([
        html.Span("download:", className="muted"),
        html.Button("CSV", id=f"{graph_id}-csv", n_clicks=0, className="btn btn-small",
                    title="this chart's series as CSV (UTC), as drawn"),
        html.Button("JSON", id=f"{graph_id}-json", n_clicks=0, className="btn btn-small",
                    title="this chart's series as JSON (UTC), as drawn"),
        dcc.Download(id=f"{graph_id}-download"),
    ], className="chart-export")


def _file(kind: str, chart: str, node: str | None, start: float | None, end: float | None,
          fig: Mapping[str, Any] | None) -> dict[str, Any]:
    series = series_from_figure(fig)
    if kind == "csv":
        return {"content": render_csv(series), "filename": filename(chart, node, end, "csv"), "type": "text/csv"}
    return {"content": render_json(chart, node, start, end, series), "filename": filename(chart, node, end, "json"),
            "type": "application/json"}


def chart(key: str, figure: Any, chart: str, node: str | None = None, start: float | None = None,
          end: float | None = None, zone: Any = None, **graph_kw: Any) -> html.Div:
    """A chart built inside a page's callback (one per SLO, one per cause) with its download buttons,
    drawn in ``zone`` (``timeview.zone_of``; None: UTC):
    pattern-matching ids keyed by ``key``, one callback (``register_matching``) for all of them; what
    the file names (chart, node, range) rides in the figure's ``layout.meta``."""
    fig = figure.to_plotly_json() if hasattr(figure, "to_plotly_json") else dict(figure)
    fig = {"data": list(fig.get("data") or []), "layout": dict(fig.get("layout") or {})}
    meta = fig["layout"].get("meta") if isinstance(fig["layout"].get("meta"), dict) else {}
    fig["layout"]["meta"] = dict(meta, **{EXPORT_META: {"chart": chart, "node": node, "start": start, "end": end}})
    localize_figure(fig, zone)   # drawn in the page's zone; the download converts back to UTC
    return html.Div([
        html.Div([
            html.Span("download:", className="muted"),
            html.Button("CSV", id={"type": "chart-csv", "key": key}, n_clicks=0, className="btn btn-small"),
            html.Button("JSON", id={"type": "chart-json", "key": key}, n_clicks=0, className="btn btn-small"),
            dcc.Download(id={"type": "chart-download", "key": key}),
        ], className="chart-export"),
        dcc.Graph(id={"type": "chart-graph", "key": key}, figure=fig, **graph_kw),
    ], className="chart-with-export")


@page_callback(
    Output({"type": "chart-download", "key": MATCH}, "data"),
    Input({"type": "chart-csv", "key": MATCH}, "n_clicks"), Input({"type": "chart-json", "key": MATCH}, "n_clicks"),
    State({"type": "chart-graph", "key": MATCH}, "figure"),
    prevent_initial_call=True,
)
def download_matching(n_csv: int, n_json: int, fig: dict[str, Any] | None) -> Any:
    """The download of a chart made with ``chart``."""
    import dash

    trig = dash.callback_context.triggered_id
    if not isinstance(trig, Mapping) or not (n_csv or n_json):
        return no_update
    meta = ((fig or {}).get("layout") or {}).get("meta") or {}
    m = meta.get(EXPORT_META) if isinstance(meta, dict) else None
    m = m if isinstance(m, dict) else {}
    return _file("csv" if trig.get("type") == "chart-csv" else "json", str(m.get("chart") or "chart"), m.get("node"),
                 _num(m.get("start")), _num(m.get("end")), fig)


def register(graph_id: str, chart: str, meta_id: str) -> None:
    """The download callback of one chart: its figure and its page's meta store (``node``,
    ``start``, ``end``) in, a file out.  Called once per chart at import of its page module."""

    @page_callback(
        Output(f"{graph_id}-download", "data"),
        Input(f"{graph_id}-csv", "n_clicks"), Input(f"{graph_id}-json", "n_clicks"),
        State(graph_id, "figure"), State(meta_id, "data"),
        prevent_initial_call=True,
    )
    def _download(_csv: int, _json: int, fig: dict[str, Any] | None, meta: dict[str, Any] | None) -> Any:
        import dash

        trig = dash.callback_context.triggered_id
        if trig not in (f"{graph_id}-csv", f"{graph_id}-json"):
            return no_update
        m = meta or {}
        return _file("csv" if trig.endswith("-csv") else "json", chart, m.get("node"), _num(m.get("start")),
                     _num(m.get("end")), fig)

    _download.__name__ = f"download_{re.sub(r'[^A-Za-z0-9_]', '_', graph_id)}"
