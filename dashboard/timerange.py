"""One default time range for every page: open on the data.

A page opens on the last hour of the data it shows, or on all of it when there is less (a recording
of nine minutes opens on exactly those nine minutes, a node started a minute ago on that minute).
The range ends at the data's newest sample: now while the data is live (its newest sample within
``data.LIVE_SLACK_S`` of now, and not a recording), else at that sample, and the page says
"recording" or "not live" with the time.

``Bounds`` are the data a page shows: a node's (``node_bounds``), the whole store's
(``store_bounds``), an SLO's series (``triscope.dashboard.slo_view.data_bounds``), the audit log's.
A page calls ``default_preset(bounds)`` for its range picker's value when the URL names none, and
``window(preset, bounds, now)`` to turn the picked preset into a ``data.Window``:

    b = timerange.node_bounds(c.store, node)
    preset = range or timerange.default_preset(b)           # "1h", or "all" for less than an hour
    w = timerange.window(preset, b, c.now())                # ends at now, or at the last sample

Presets other than the default (15m, 24h, 7d, "all") end at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from triscope.dashboard.data import DATA_PRESET, LIVE_SLACK_S, PRESETS, Window
from triscope.store.reader import NodeInfo, StoreReader

DEFAULT_PRESET = "1h"
"""What a page opens on when its data spans at least this long; less opens on all of it."""
MIN_SPAN_S = 60.0
"""The shortest range shown (all of a node that reported once)."""


@dataclass(frozen=True)
class Bounds:
    """The data a page shows: its first and newest sample (epoch seconds)."""

    first: float
    last: float
    recording: bool = False     # every node of it is a recording (``NodeInfo.recording``): never live

    def live(self, now: float) -> bool:
        return not self.recording and abs(now - self.last) <= LIVE_SLACK_S


def _recording(n: NodeInfo) -> bool:
    return n.recording is not None    # the node's data was imported from a trace, nothing newer came


def node_bounds(store: StoreReader, node: str) -> Bounds | None:
    """A node's data (the nodes table: no scan of its samples); None for a node not stored."""
    n = next((n for n in store.nodes() if n.name == node), None)
    return None if n is None else Bounds(n.first_seen, n.last_seen, _recording(n))


def store_bounds(store: StoreReader, nodes: set[str] | None = None) -> Bounds | None:
    """Every node's data together (or those of ``nodes``); None for an empty store."""
    ns = [n for n in store.nodes() if nodes is None or n.name in nodes]
    if not ns:
        return None
    return Bounds(min(n.first_seen for n in ns), max(n.last_seen for n in ns), all(_recording(n) for n in ns))


def default_preset(bounds: Bounds | None) -> str:
    """The range a page opens on: ``1h``, or ``all`` when the data spans less than an hour."""
    if bounds is not None and bounds.last - bounds.first < PRESETS[DEFAULT_PRESET]:
        return DATA_PRESET
    return DEFAULT_PRESET


def window(preset: str, bounds: Bounds | None, now: float, custom: tuple[float, float] | None = None) -> Window:
    """The range ``preset`` stands for over ``bounds``: it ends at now while the data is live, else
    at its newest sample (and says so in ``Window.note``); ``all`` spans the data itself."""
    if preset == "custom" and custom is not None:
        a, b = custom
        return Window(min(a, b), max(a, b), False, "custom range")
    if bounds is None:
        return Window(now - PRESETS.get(preset, PRESETS[DEFAULT_PRESET]), now, True)
    live = bounds.live(now)
    end = now if live else bounds.last + 1.0
    if preset == DATA_PRESET:
        span = max(MIN_SPAN_S, end - bounds.first)
    else:
        span = PRESETS.get(preset, PRESETS[DEFAULT_PRESET])
    if live:
        return Window(end - span, end, True)
    when = datetime.fromtimestamp(bounds.last, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    what = "all the data" if preset == DATA_PRESET else f"the {preset} before the last sample"
    return Window(end - span, end, False, f"{'a recording' if bounds.recording else 'not live'}: showing {what} ({when})")
