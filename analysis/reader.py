"""What analysis reads from the store, and the plain shape it reads series into.

Analysis is pure functions over inputs fetched first: each analysis has a ``fetch_*`` function
that takes a ``triscope.store.StoreReader`` (the store's typed read interface: ``series``,
``query``, ``events``, ``metric_names``, ...) and returns plain dataclasses of lists, and a
function over those inputs that does the math (no store, no I/O, no clock).  The old entry
points (``node_states(store, ...)``, ``rank_causes(store, ...)``, ``slo.evaluate(store, ...)``)
are a fetch followed by the pure function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from triscope.store.reader import SeriesData, StoreReader

__all__ = ["SeriesPoints", "StoreReader", "label_name", "points_of"]


@dataclass(slots=True)
class SeriesPoints:
    """One stored series over a range: what it is and its points, sorted by time.  Counters are
    per-second rates when read with the store's default (``rate=None``), cumulative values when
    read raw (``rate=False``, what counter increases are computed from)."""

    metric: str
    labels: dict[str, str]
    ts: Sequence[float]
    values: Sequence[float]
    kind: str = "gauge"
    node: str = ""
    id: int = 0


def points_of(sd: SeriesData) -> SeriesPoints:
    """A store read result as plain points (the lists are shared, not copied)."""
    i = sd.info
    return SeriesPoints(i.metric, dict(i.labels), sd.ts, sd.values, i.kind, i.node, i.id)


def label_name(labels: Mapping[str, str]) -> str:
    """``gpu=0``, ``chip=0,npu=1``: a label set as one stable name (accelerators, series keys)."""
    if len(labels) <= 1:  # the common case, on the tracker's per-sample path
        for k, v in labels.items():
            return f"{k}={v}"
        return ""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
