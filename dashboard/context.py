"""What a running dashboard knows: its store, its SLO file, its options.

``create_app`` puts one ``DashboardContext`` in the Flask app's config; layouts and callbacks run
inside a request and fetch it with ``ctx()``, so several apps can live in one process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triscope.store.api import Store

CONFIG_KEY = "TRISCOPE_DASHBOARD"


@dataclass
class DashboardContext:
    store: Store                                    # reads series through StoreReader, audit rows with the store
    slo_file: Path | None = None
    live_interval_s: float = 5.0
    max_points: int = 1000                  # per series, before Plotly (the chart is ~1,100 px wide)
    clock: Any = time.time
    cache: dict[str, Any] = field(default_factory=dict)

    def now(self) -> float:
        return float(self.clock())


def ctx() -> DashboardContext:
    from flask import current_app

    return current_app.config[CONFIG_KEY]
