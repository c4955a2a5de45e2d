"""The SQL store: schema, writes, rollups, retention and the query functions other parts use."""

from triscope.store.api import EventRow, LatestValue, NodeInfo, SeriesData, SeriesInfo, Store, Tick
from triscope.store.db import StoreError, default_url

__all__ = [
    "EventRow", "LatestValue", "NodeInfo", "SeriesData", "SeriesInfo", "Store", "StoreError", "Tick", "default_url",
]
