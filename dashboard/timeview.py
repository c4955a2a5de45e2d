"""UTC or the browser's local time on the page.

The store, the queries, the downloads and the URLs stay in UTC; only what the page *shows* moves.
A checkbox in the top bar (``tz-local``) writes the browser's preference into a ``dcc.Store``
(``tz-pref``, ``storage_type="local"``: it survives navigation and reloads) as
``{"local": bool, "zone": "Asia/Tokyo"}``; the zone is the browser's own IANA name
(``Intl.DateTimeFormat().resolvedOptions().timeZone``), read in a clientside callback because the
server cannot know it.  Page callbacks take ``tz-pref`` as an input and format with ``zone_of``.

Plotly has no time zones: a date axis draws the strings it is given.  ``localize_figure`` rewrites
a figure's x strings (UTC, as ``figures.to_dt`` writes them) into the zone's wall time and records
the zone in ``layout.meta.tz``, so the export (``triscope.dashboard.export``) can turn what is drawn
back into UTC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dash import Input, Output, State, dcc, html

TZ_STORE = "tz-pref"
TZ_TOGGLE = "tz-local"
TZ_META = "tz"          # layout.meta key naming the zone a figure's x strings are in

# The checkbox and the store are one callback (Dash allows a callback to be its own input): on load
# the store's modified_timestamp sets the checkbox; a click writes the store with the browser's zone.
_SYNC_JS = """
function(checked, _ts, pref) {
    const trig = (dash_clientside.callback_context.triggered || []).map(t => t.prop_id);
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
    if (trig.some(p => p.startsWith('tz-local.'))) {
        return [{local: (checked || []).includes('local'), zone: zone}, dash_clientside.no_update];
    }
    const on = !!(pref && pref.local);
    if (on && pref.zone !== zone) {   // the browser moved: follow it
        return [{local: true, zone: zone}, ['local']];
    }
    return [dash_clientside.no_update, on ? ['local'] : []];
}
"""


def toggle() -> html.Div:
    """The top bar's "local time" checkbox and the store that keeps the choice (off: UTC)."""
    return html.Div([
        dcc.Store(id=TZ_STORE, storage_type="local"),
        dcc.Checklist(id=TZ_TOGGLE, options=[{"label": " local time", "value": "local"}], value=[], inline=True,
                      className="tz-toggle", inputStyle={"marginRight": "4px"}),
    ], className="tz-box", title="show times in this browser's time zone (downloads stay UTC)")


def attach(app: Any) -> None:
    """The clientside callback that syncs the checkbox, the browser's zone and the store."""
    app.clientside_callback(
        _SYNC_JS,
        Output(TZ_STORE, "data"), Output(TZ_TOGGLE, "value"),
        Input(TZ_TOGGLE, "value"), Input(TZ_STORE, "modified_timestamp"), State(TZ_STORE, "data"),
    )


def zone_of(pref: Mapping[str, Any] | None) -> ZoneInfo | None:
    """The zone to show times in; None for UTC (the toggle off, or a zone this host does not know)."""
    if not pref or not pref.get("local"):
        return None
    name = str(pref.get("zone") or "")
    if not name or name == "UTC" or len(name) > 64:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def zone_name(zone: ZoneInfo | None, ts: float | None = None) -> str:
    """``UTC`` or ``Asia/Tokyo (UTC+09:00)`` (the offset at ``ts``, default now)."""
    if zone is None:
        return "UTC"
    at = datetime.fromtimestamp(ts if ts is not None else datetime.now(UTC).timestamp(), zone)
    off = at.strftime("%z")
    return f"{zone.key} (UTC{off[:3]}:{off[3:]})"


def fmt(ts: float | None, zone: ZoneInfo | None = None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in UTC or in ``zone``; ``-`` for None."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, zone or UTC).strftime("%Y-%m-%d %H:%M:%S")


def _parse_naive(s: str) -> datetime | None:
    try:
        return datetime.fromisoformat(str(s).replace(" ", "T").rstrip("Z"))
    except ValueError:
        return None


def shift_str(s: Any, zone: ZoneInfo) -> Any:
    """One x string, UTC wall time -> ``zone``'s wall time (same form, milliseconds); others as they are."""
    if not isinstance(s, str):
        return s
    dt = _parse_naive(s)
    if dt is None:
        return s
    local = dt.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
    return local.isoformat(timespec="milliseconds")


def to_display(strings: Sequence[Any], zone: ZoneInfo | None) -> list[Any]:
    """``figures.to_dt`` output in the zone shown (unchanged for UTC)."""
    if zone is None:
        return list(strings)
    return [shift_str(s, zone) for s in strings]


def to_utc_ts(s: Any, zone_key: str | None) -> float | None:
    """A drawn x string (wall time in ``zone_key``, UTC when None) -> epoch seconds.  In the hour a
    DST change repeats, the first of the two is taken (fold=0)."""
    dt = _parse_naive(s) if isinstance(s, str) else None
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=ZoneInfo(zone_key) if zone_key and zone_key != "UTC" else UTC)
    return dt.timestamp()


def localize_figure(fig: dict[str, Any], zone: ZoneInfo | None) -> dict[str, Any]:
    """Rewrite a figure dict's date x values and x axis ranges into ``zone`` (in place) and name the
    zone in ``layout.meta``; UTC figures only get the meta."""
    layout = fig.setdefault("layout", {})
    meta = layout.get("meta") if isinstance(layout.get("meta"), dict) else {}
    layout["meta"] = dict(meta, **{TZ_META: zone.key if zone is not None else "UTC"})
    if zone is None:
        return fig
    for tr in fig.get("data", []):
        if isinstance(tr.get("x"), list | tuple):
            tr["x"] = to_display(tr["x"], zone)
    for k, ax in layout.items():
        if k.startswith("xaxis") and isinstance(ax, dict) and isinstance(ax.get("range"), list | tuple):
            ax["range"] = to_display(ax["range"], zone)
    # shapes and notes placed on the time axis (an evidence chart's shaded window, its onset line)
    for item in [*(layout.get("shapes") or []), *(layout.get("annotations") or [])]:
        if isinstance(item, dict) and str(item.get("xref", "x")).startswith("x") and "domain" not in str(item.get("xref")):
            for k in ("x", "x0", "x1"):
                if k in item:
                    item[k] = shift_str(item[k], zone)
    return fig
