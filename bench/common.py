"""What every benchmark returns: rows of one table (``make bench`` prints them together)."""

from __future__ import annotations

import platform
from dataclasses import dataclass


@dataclass
class Row:
    benchmark: str          # e.g. "ingest sqlite"
    figure: str             # what was measured, e.g. "samples/s (batched, agent tick)"
    value: float
    unit: str
    target: str = ""        # e.g. ">= 100000"
    baseline: str = ""      # named baseline measured in the same run, e.g. "naive ORM row-by-row"
    baseline_value: float | None = None
    ok: bool | None = None  # target met?


def machine() -> str:
    import os

    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}, kernel {platform.release()}"
