"""The collector protocol: one ``collect(now)`` per tick that yields typed samples and events.

Collectors know nothing of the store or the exporter.  Host paths (``/proc``, ``/sys``) and
clocks are constructor parameters so tests point them at fixture trees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from triscope.samples import EventRecord, Sample


class CollectorUnavailable(Exception):
    """Raised by ``check()`` / ``collect()`` when a collector cannot run on this host.

    ``reason`` says why, ``hint`` what to install or change.
    """

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


@dataclass(slots=True)
class Availability:
    ok: bool
    reason: str = "ok"
    hint: str = ""
    # not ok *yet*: the thing it reads may come up later (a scraped service still starting), so the
    # agent keeps the collector and retries every tick instead of switching it off for the run
    transient: bool = False


@runtime_checkable
class Collector(Protocol):
    """What the sampler drives.  ``name`` labels ``triscope_collector_up{collector=name}``."""

    name: str

    def check(self) -> Availability:
        """Can this collector run here?  Cheap; used by ``triscope doctor`` and at agent start."""
        ...

    def collect(self, now: float) -> Iterable[Sample | EventRecord]:
        """Read once.  ``now`` is the tick's time (float epoch seconds) on the sampler's clock."""
        ...

    def close(self) -> None:
        """Release threads, file descriptors, child processes."""
        ...


class BaseCollector:
    """Convenience base: ``check`` says ok, ``close`` does nothing."""

    name = "base"

    def check(self) -> Availability:
        return Availability(True)

    def collect(self, now: float) -> Iterable[Sample | EventRecord]:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        return None
