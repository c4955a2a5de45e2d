"""The store's typed read interface: what analysis, the dashboard, the remediation engine and
the commands read, and the rows it answers with.

``StoreReader`` lists exactly the read methods those parts call on a ``Store``, with the names
and signatures ``Store`` has.  Code that only reads types its store parameter as ``StoreReader``;
anything with these methods (a ``Store``, an in-memory stand-in built over fetched series, a
caching wrapper) satisfies it.  ``Store`` is checked against it by the type checker
(``store/api.py``) and by a test (``tests/integration/test_store_cache.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from triscope.core.vocabulary import WorkloadKey

# A series within its node: (metric name, canonical label key, ``triscope.core.samples.label_key``).
SeriesKey = tuple[str, str]
# ``fleet_latest``: node -> {(metric, label key): (ts, value)} of each series' newest point.
FleetLatest = dict[str, dict[SeriesKey, tuple[float, float]]]


# A node whose data was imported from a recorded trace (``triscope import-trace``) carries these
# node labels: the trace's file name and the timestamp of its last tick as imported.
RECORDING_LABEL = "triscope.recording"
RECORDING_END_LABEL = "triscope.recording_end"
RECORDING_SLACK_S = 30.0    # data this much newer than the recording's end: an agent writes to the node now


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: dict[str, Any]
    first_seen: float
    last_seen: float

    @property
    def recording(self) -> str | None:
        """The trace file the node's data was imported from, while nothing newer came (an agent that
        writes under the same name later makes it a live node again); None for a node an agent writes."""
        src = self.labels.get(RECORDING_LABEL)
        if not src:
            return None
        try:
            end = float(self.labels.get(RECORDING_END_LABEL, math.inf))
        except (TypeError, ValueError):
            end = math.inf
        return str(src) if self.last_seen <= end + RECORDING_SLACK_S else None


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    node: str
    metric: str
    labels: dict[str, str]
    kind: str


@dataclass(slots=True)
class SeriesData:
    """Points of one series over a range, from ``tier`` (``raw``, ``1m`` or ``1h``)."""

    info: SeriesInfo
    ts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    tier: str = "raw"


@dataclass(frozen=True, slots=True)
class LatestValue:
    info: SeriesInfo
    ts: float
    value: float


@dataclass(frozen=True, slots=True)
class EventRow:
    id: int
    node: str
    ts: float
    kind: str
    severity: str
    message: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class VerdictRun:
    """One run of one accelerator's published state."""

    node: str
    accelerator: str            # "gpu=0"; "" the node's roll-up
    workload: WorkloadKey
    state: str
    start: float                # its first tick
    end: float                  # its last tick
    ticks: int
    score_mean: float
    score_max: float



class StoreReader(Protocol):
    """The reads of a store (``triscope.store.Store`` implements them)."""

    def nodes(self) -> list[NodeInfo]:
        """Every node, by name."""
        ...

    def series(self, node: str | None = None, metric: str | None = None, prefix: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[SeriesInfo]:
        """The series of ``node`` (all nodes if None), of ``metric`` or whose metric starts with
        ``prefix`` (literally), whose labels include ``labels``; ordered by node, metric, labels."""
        ...

    def metric_names(self, node: str | None = None) -> list[str]:
        """The distinct metric names stored (of ``node``), sorted."""
        ...

    def time_bounds(self, node: str | None = None) -> tuple[float, float] | None:
        """(first, last) raw timestamp stored (of ``node``); None when there is none."""
        ...

    def query(self, metric: str, node: str | None = None, labels: Mapping[str, str] | None = None,
              start: float | None = None, end: float | None = None, max_points: int | None = 2000,
              rate: bool | None = None, tier: str | None = None) -> list[SeriesData]:
        """Every series of ``metric`` over [start, end] (default: the last hour), downsampled to
        at most ``max_points`` (None: every raw point); counters as per-second rates unless
        ``rate=False``; ``tier`` forces ``raw``, ``1m`` or ``1h``."""
        ...

    def query_series(self, info: SeriesInfo, start: float, end: float, max_points: int | None = 2000,
                     rate: bool | None = None, tier: str | None = None) -> SeriesData:
        """One series over [start, end], as ``query`` reads each."""
        ...

    def latest(self, node: str, metric: str | None = None, prefix: str | None = None,
               since: float | None = None) -> list[LatestValue]:
        """The newest point of each series of ``node`` (of ``metric`` / ``prefix``); with
        ``since`` only raw points at or after it count, without it a series with no raw point
        left answers with its newest 1-minute rollup's last point."""
        ...

    def fleet_latest(self, metrics: Sequence[str], since: float | None = None,
                     nodes: Sequence[str] | None = None) -> FleetLatest:
        """``latest`` for every series of ``metrics`` on every node (or on ``nodes``) in a few
        fleet-wide statements."""
        ...

    def series_keys(self, prefix: str | None = None, metric: str | None = None) -> dict[str, set[SeriesKey]]:
        """node -> {(metric, label key)} of every series (of ``metric`` / ``prefix``), labels
        left in their canonical text form."""
        ...

    def events(self, node: str | None = None, start: float | None = None, end: float | None = None,
               kinds: Sequence[str] | None = None, limit: int = 10000) -> list[EventRow]:
        """Events (of ``node``, in [start, end], of ``kinds``) in time order, at most ``limit``."""
        ...

    def verdict_runs(self, node: str, start: float, end: float) -> list[VerdictRun]:
        """The verdict history of ``node``: every run of an accelerator's published state that
        overlaps [start, end], at full resolution whatever the range (store/verdicts.py)."""
        ...

    def current_verdicts(self, lookback_s: float, nodes: Sequence[str] | None = None) -> dict[str, list[VerdictRun]]:
        """node -> its verdict runs that end at most ``lookback_s`` before the node's last tick
        (``nodes.last_seen``), for every node (or ``nodes``) in one statement: each accelerator's
        current state, read from the same history as ``verdict_runs``."""
        ...


__all__ = ["RECORDING_END_LABEL", "RECORDING_LABEL", "EventRow", "FleetLatest", "LatestValue", "NodeInfo",
           "SeriesData", "SeriesInfo", "SeriesKey", "StoreReader", "VerdictRun"]
