"""What a running dashboard knows: its store, its SLO file, its options.

``create_app`` puts one ``DashboardContext`` in the Flask app's config; layouts and callbacks run
inside a request and fetch it with ``ctx()``, so several apps can live in one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triscope.dashboard.slo_view import SloSet
    from triscope.dashboard.timerange import Bounds
    from triscope.store.api import Store

CONFIG_KEY = "TRISCOPE_DASHBOARD"


@dataclass
class SloCache:
    """What the SLO views keep between requests (``triscope.dashboard.slo_view``)."""

    slos: tuple[float | None, SloSet] | None = None          # (the file's mtime, what it declared)
    bounds: dict[str, tuple[float, Bounds | None]] = field(default_factory=dict)   # metrics -> (monotonic, bounds)
    fleet: tuple[float, dict[str, str]] | None = None       # (monotonic, node -> worst status)


@dataclass
class DashboardContext:
    store: Store                                    # reads series through StoreReader, audit rows with the store
    slo_file: Path | None = None
    live_interval_s: float = 5.0
    max_points: int = 1000                  # per series, before Plotly (the chart is ~1,100 px wide)
    clock: Callable[[], float] = time.time
    cache: SloCache = field(default_factory=SloCache)

    def now(self) -> float:
        return float(self.clock())


def ctx() -> DashboardContext:
    from flask import current_app

    got: DashboardContext = current_app.config[CONFIG_KEY]
    return got
