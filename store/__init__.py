"""The SQL store: schema, the typed read interface (``StoreReader``), the per-dialect tick
writers, rollups, retention and partitions.  ``Store`` is the one entry point."""

from triscope.store.api import Store
from triscope.store.db import StoreError, default_url
from triscope.store.reader import (
    EventRow,
    FleetLatest,
    LatestValue,
    NodeInfo,
    SeriesData,
    SeriesInfo,
    SeriesKey,
    StoreReader,
)
from triscope.store.retention import RetentionPolicy

__all__ = [
    "EventRow", "FleetLatest", "LatestValue", "NodeInfo", "RetentionPolicy", "SeriesData", "SeriesInfo", "SeriesKey",
    "Store", "StoreError", "StoreReader", "default_url",
]
