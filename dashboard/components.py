"""Small layout pieces the pages share: the time-range picker, notes, empty states."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dash import dcc, html

from dashboard.data import PRESETS


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def parse_ts(value: str | None) -> float | None:
    """ISO 8601 (UTC when no zone) or epoch seconds; None when empty or unreadable."""
    if not value:
        return None
    v = str(value).strip()
    try:
        return float(v)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00").replace(" ", "T"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def range_picker(prefix: str, value: str = "1h", start: str = "", end: str = "", custom: bool = True) -> html.Div:
    opts = [{"label": k, "value": k} for k in PRESETS]
    if custom:
        opts.append({"label": "custom", "value": "custom"})
    children: list[Any] = [
        dcc.RadioItems(id=f"{prefix}-range", options=opts, value=value if value in PRESETS or value == "custom" else "1h",
                       inline=True, className="range-presets"),
    ]
    if custom:
        children += [
            dcc.Input(id=f"{prefix}-start", type="text", placeholder="start (UTC, 2026-11-29T17:00:00)", value=start,
                      debounce=True, className="ts-input"),
            dcc.Input(id=f"{prefix}-end", type="text", placeholder="end (UTC)", value=end, debounce=True,
                      className="ts-input"),
            html.Button("Apply", id=f"{prefix}-apply", n_clicks=0, className="btn"),
        ]
    return html.Div(children, className="range-picker")


def note(text: str, kind: str = "info", id: str | None = None) -> html.Div:
    kw: dict[str, Any] = {"id": id} if id else {}
    return html.Div(text, className=f"note note-{kind}", **kw)


def empty_state(title: str, detail: str, id: str | None = None) -> html.Div:
    kw: dict[str, Any] = {"id": id} if id else {}
    return html.Div([html.Div(title, className="empty-title"), html.Div(detail, className="empty-detail")],
                    className="empty-state", **kw)


def error_note(where: str, exc: BaseException) -> html.Div:
    """A failure inside a page, said in one line (the traceback goes to the server log)."""
    import logging

    logging.getLogger("dashboard").exception("%s failed", where)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return note(f"{where} failed: {type(exc).__name__}: {first}", "error")
