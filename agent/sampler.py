"""The sampler: one tick per interval, every collector once, on one clock.

Each tick's samples and events go to the store writer as one batch and to the exporter.  A
failing collector never stops the others: it shows as ``triscope_collector_up{collector} 0``
and one log line says why (and one more when it recovers), not one per tick.  Sources that talk
to another process (``triscope.agent.collectors.background``) start at the beginning of the tick on their
own workers and are read at its end, waiting at most their budget: a slow or dead one never holds
the tick up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from triscope.agent.collectors.base import Collector
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.core.textsafe import one_line

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
    staleness: float | None = None   # age of the data a background source's last tick used


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
        # sources on their own workers start now and answer at the end, within their budget
        background = [st for st in self.states if hasattr(st.collector, "begin")]
        for st in background:
            try:
                st.collector.begin(now)  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - a collector's failure is its own: the tick goes on
                log.error("collector %s: begin failed: %s", st.collector.name, one_line(_one_line(e)))
        for st in [st for st in self.states if not hasattr(st.collector, "begin")] + background:
            self._collect(st, now, samples, events)
        for p in self.post:
            try:
                _split(p.process(now, samples), samples, events)
            except Exception as e:  # noqa: BLE001 - a post-processor's failure is its own: the tick goes on
                log.error("post-processor %s failed: %s", type(p).__name__, one_line(_one_line(e)))
        samples += self._own_samples()
        tick = Tick(now, samples, events)
        for sink in self.sinks:
            sink.submit(tick)
        if self.on_tick is not None:
            self.on_tick(tick)
        self.stats.last_tick_seconds = time.perf_counter() - t0
        return tick

    def _collect(self, st: CollectorState, now: float, samples: list[Sample], events: list[EventRecord]) -> None:
        """One collector's items for this tick, its state (up, or down and why) and its duration."""
        c0 = time.perf_counter()
        up, reason = True, ""
        try:
            _split(st.collector.collect(now), samples, events)
        except Exception as e:  # noqa: BLE001 - one collector never stops the others
            up, reason = False, _one_line(e)
        status = getattr(st.collector, "source_status", None)
        if up and status is not None:
            src = status()
            up, reason = src.up, src.reason
            st.staleness = src.staleness
        self._note_state(st, up, reason, events)
        st.duration = time.perf_counter() - c0

    def _own_samples(self) -> list[Sample]:
        """The sampler's own series: each collector's state and duration, the tick count and time."""
        out: list[Sample] = []
        for st in self.states:
            labels = {"collector": st.collector.name}
            out.append(Sample("triscope_collector_up", 1.0 if st.up else 0.0, labels))
            out.append(Sample("triscope_collector_duration_seconds", st.duration, labels))
            if st.staleness is not None:
                out.append(Sample("triscope_collector_staleness_seconds", st.staleness, labels))
        self.stats.ticks += 1
        out.append(Sample("triscope_ticks_total", float(self.stats.ticks), kind="counter"))
        out.append(Sample("triscope_tick_duration_seconds", self.stats.last_tick_seconds))
        if self.self_metrics is not None:
            out.extend(self.self_metrics())
        return out

    @staticmethod
    def _note_state(st: CollectorState, up: bool, reason: str, events: list[EventRecord]) -> None:
        """Log and record a collector's state once per change (up <-> down), not once per tick or per
        new error text: a failing target's text can change every tick, and it is not ours to log
        verbatim (control characters escaped, length bounded)."""
        name = st.collector.name
        if up and not st.up:
            log.warning("collector %s is back up", name)
            events.append(EventRecord("collector", f"collector {name} is back up",
                                      details={"collector": name, "up": True}))
        elif not up and st.up:
            safe = one_line(reason)
            log.error("collector %s is down: %s", name, safe)
            events.append(EventRecord("collector", f"collector {name} down: {safe}", "warning",
                                      {"collector": name, "up": False, "reason": safe}))
        elif not up and reason != st.reason:
            log.debug("collector %s still down: %s", name, one_line(reason))
        st.up, st.reason = up, reason

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

    def close(self, timeout: float = 5.0) -> None:
        """Close every collector, all at once, waiting at most ``timeout`` in all (a collector stuck
        in a read of its own is left to the process's exit)."""
        def close_one(c: Collector) -> None:
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - one collector's close never keeps the others open
                log.warning("closing collector %s: %s", c.name, _one_line(e))

        threads = [threading.Thread(target=close_one, args=(st.collector,), daemon=True,
                                    name=f"close-{st.collector.name}"[:15]) for st in self.states]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            log.warning("collectors still closing after %.1f s, left behind: %s", timeout, ", ".join(stuck))


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0]}" if s else type(e).__name__


def _split(items: Iterable[Sample | EventRecord], samples: list[Sample], events: list[EventRecord]) -> None:
    """Samples to ``samples``, events to ``events``, in order."""
    for item in items:
        if isinstance(item, Sample):
            samples.append(item)
        else:
            events.append(item)
