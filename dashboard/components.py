"""Small layout pieces the pages share: the time-range picker, notes, empty states."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any
from zoneinfo import ZoneInfo

from dash import dcc, html

from triscope.core.names import shorten
from triscope.core.timeparse import TimeParseError, parse_time
from triscope.dashboard import timeview
from triscope.dashboard.data import DATA_PRESET, PRESETS
from triscope.dashboard.figures import NAME_CHARS, TITLE_CHARS

# Node names and label values come from outside (an agent's --node, an application's labels): on
# the page they are cut to NAME_CHARS characters with an ellipsis, the whole text in a tooltip.
# A 10 KB node name in a dropdown or a table cell otherwise stalls the browser for minutes.


def short(text: Any, limit: int = NAME_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis."""
    return shorten(str(text), limit)


def full(text: Any) -> str:
    """The text for a tooltip: whole, up to TITLE_CHARS characters."""
    return shorten(str(text), TITLE_CHARS)


def name_span(text: Any, limit: int = NAME_CHARS, **kw: Any) -> html.Span:
    """A name shown short, the whole of it in the element's title (tooltip) when it was cut."""
    t = str(text)
    if len(t) > limit:
        kw.setdefault("title", full(t))
    return html.Span(short(t, limit), **kw)


VALUE_CHARS = 64
"""Node names up to this long are their own dropdown value; longer ones go by a digest."""


def node_value(name: str) -> str:
    """The dropdown value of a node.  dcc.Dropdown indexes every substring of each option's value
    and label for its search box (js-search's AllSubstringsIndexStrategy): a 10 KB value is 50
    million index entries, minutes of a frozen tab.  A long name goes by ``~`` and a digest."""
    if len(name) <= VALUE_CHARS:
        return name
    return "~" + hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def node_from_value(value: str | None, names: Iterable[str]) -> str | None:
    """The node a dropdown value stands for (None: none of ``names``)."""
    if value is None:
        return None
    if not value.startswith("~") or len(value) <= 1:
        return value
    return next((n for n in names if node_value(n) == value), None)


def node_options(nodes: Iterable[str]) -> list[dict[str, Any]]:
    """Dropdown options for node names: the label short, the value short (``node_value``), the
    whole name (up to TITLE_CHARS) as the option's tooltip."""
    return [{"label": short(n), "value": node_value(n), "title": full(n)} for n in nodes]


def fmt_ts(ts: float | None, zone: ZoneInfo | None = None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in UTC, or in ``zone`` (``timeview.zone_of`` of the local-time toggle)."""
    return timeview.fmt(ts, zone)


def parse_ts(value: str | None) -> float | None:
    """A time field or URL parameter: every form of the CLI's time arguments (ISO 8601, UTC when
    no zone; epoch seconds; ``now``; ``-2h``), ``triscope.core.timeparse``; None when empty or
    unreadable."""
    if not value:
        return None
    try:
        return parse_time(str(value))
    except TimeParseError:
        return None


def range_picker(prefix: str, value: str = "1h", start: str = "", end: str = "", custom: bool = True,
                 data: bool = False) -> html.Div:
    """Preset ranges; ``data`` adds "all data" (the node's whole span), ``custom`` start/end fields."""
    opts = [{"label": k, "value": k} for k in PRESETS]
    if data:
        opts.append({"label": "all data", "value": DATA_PRESET})
    if custom:
        opts.append({"label": "custom", "value": "custom"})
    children: list[Any] = [
        dcc.RadioItems(id=f"{prefix}-range", options=opts, value=value if value in PRESETS or value in ("custom", DATA_PRESET) else "1h",
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
