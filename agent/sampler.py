"""The sampler: one tick per interval, every collector once, on one clock.

Each tick's samples and events go to the store writer as one batch and to the exporter.  A
failing collector never stops the others: it shows as ``triscope_collector_up{collector} 0``
and one log line says why (and one more when it recovers), not one per tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.collectors.base import Collector
from store.api import Tick
from triscope.samples import EventRecord, Sample

log = logging.getLogger(__name__)


class PostProcessor(Protocol):
    """Sees each tick's samples after the collectors ran (e.g. the online mismatch detector)."""

    def process(self, now: float, samples: list[Sample]) -> Iterable[Sample | EventRecord]: ...


class TickSink(Protocol):
    def submit(self, tick: Tick) -> None: ...


@dataclass
class CollectorState:
    collector: Collector
    up: bool = True
    reason: str = ""
    duration: float = 0.0


@dataclass
class SamplerStats:
    ticks: int = 0
    last_tick_seconds: float = 0.0
    tick_seconds: list[float] = field(default_factory=list)


class Sampler:
    def __init__(self, collectors: Sequence[Collector], sinks: Sequence[TickSink] = (), *,
                 interval: float = 1.0, post: Sequence[PostProcessor] = (),
                 clock: Callable[[], float] = time.time,
                 self_metrics: Callable[[], list[Sample]] | None = None,
                 on_tick: Callable[[Tick], None] | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.states = [CollectorState(c) for c in collectors]
        for st in self.states:  # known to be off (already logged once by whoever found out)
            reason = getattr(st.collector, "down_reason", None)
            if reason:
                st.up, st.reason = False, _one_line(RuntimeError(reason))
        self.sinks = list(sinks)
        self.interval = interval
        self.post = list(post)
        self.clock = clock
        self.self_metrics = self_metrics
        self.on_tick = on_tick
        self.stats = SamplerStats()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> Tick:
        t0 = time.perf_counter()
        now = self.clock()
        samples: list[Sample] = []
        events: list[EventRecord] = []
        for st in self.states:
            c0 = time.perf_counter()
            try:
                for item in st.collector.collect(now):
                    if isinstance(item, Sample):
                        samples.append(item)
                    else:
                        events.append(item)
                if not st.up:
                    log.warning("collector %s is back up", st.collector.name)
                    events.append(EventRecord("collector", f"collector {st.collector.name} is back up",
                                              details={"collector": st.collector.name, "up": True}))
                st.up, st.reason = True, ""
            except Exception as e:  # noqa: BLE001 - one collector never stops the others
                reason = _one_line(e)
                if st.up or reason != st.reason:
                    log.error("collector %s failed: %s", st.collector.name, reason)
                    events.append(EventRecord("collector", f"collector {st.collector.name} down: {reason}",
                                              "warning", {"collector": st.collector.name, "up": False,
                                                          "reason": reason}))
                st.up, st.reason = False, reason
            st.duration = time.perf_counter() - c0
        for p in self.post:
            try:
                for item in p.process(now, samples):
                    if isinstance(item, Sample):
                        samples.append(item)
                    else:
                        events.append(item)
            except Exception as e:  # noqa: BLE001
                log.error("post-processor %s failed: %s", type(p).__name__, _one_line(e))
        for st in self.states:
            samples.append(Sample("triscope_collector_up", 1.0 if st.up else 0.0, {"collector": st.collector.name}))
            samples.append(Sample("triscope_collector_duration_seconds", st.duration, {"collector": st.collector.name}))
        self.stats.ticks += 1
        samples.append(Sample("triscope_ticks_total", float(self.stats.ticks), kind="counter"))
        samples.append(Sample("triscope_tick_duration_seconds", self.stats.last_tick_seconds))
        if self.self_metrics is not None:
            samples.extend(self.self_metrics())
        tick = Tick(now, samples, events)
        for sink in self.sinks:
            sink.submit(tick)
        if self.on_tick is not None:
            self.on_tick(tick)
        self.stats.last_tick_seconds = time.perf_counter() - t0
        return tick

    def run(self, duration: float = 0.0) -> None:
        """Tick on a fixed grid every ``interval`` seconds for ``duration`` seconds (0 = until stop())."""
        start = time.monotonic()
        n = 0
        while not self._stop.is_set():
            self.tick()
            n += 1
            next_at = start + n * self.interval
            now = time.monotonic()
            if next_at < now:  # fell behind: skip the missed slots, keep the grid
                n += int((now - next_at) // self.interval) + 1
                next_at = start + n * self.interval
            if duration and next_at - start > duration + 1e-9:
                break
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                break

    def close(self) -> None:
        for st in self.states:
            try:
                st.collector.close()
            except Exception as e:  # noqa: BLE001
                log.warning("closing collector %s: %s", st.collector.name, _one_line(e))


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0]}" if s else type(e).__name__
