"""Sources that talk to another process run on their own worker, off the tick's critical path.

``Background(collector)`` wraps a collector whose ``collect()`` waits on something outside the
agent (an application's ``/metrics``): at the start of each tick the sampler calls ``begin(now)``,
which hands one ``collect()`` to the wrapper's own thread (unless the previous one is still
running); the tick reads the other collectors meanwhile and, at the end, ``collect(now)`` waits
for that result at most until ``budget`` seconds after the tick began.  So a fast source lands in
the tick it was asked for — on the same clock as the GPU and kernel samples — and a slow, hung or
trickling one costs the tick at most ``budget``, however long it takes itself (the collector's own
deadline, e.g. the scrape's ``timeout``, bounds its worker).

When this tick's answer is missing or failed, the tick uses the **last good result** while it is
younger than ``stale_after`` (then nothing: a dead service's counters must not read as a quiet
one's) and says so: ``source_status()`` is down with the reason, and the sampler exports
``triscope_collector_up{collector} 0`` and ``triscope_collector_staleness_seconds{collector}``,
the age of the data the tick used.

``every`` (default 1) reads the source at one tick in ``every`` only (``--scrape-interval``): the
ticks between store nothing of it and keep the status of its last read; a read that came in after
its tick's budget lands in the next tick instead of being lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from triscope.agent.collectors.base import Availability, BaseCollector, Collector
from triscope.core.samples import EventRecord, Sample


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What a tick got from a source: fresh and good (``up``), or why not, and how old its data is."""

    up: bool
    reason: str = ""
    staleness: float | None = None   # seconds between the tick and the start of the read it used


@dataclass(slots=True)
class _Result:
    ok: bool
    items: list[Sample | EventRecord]
    error: BaseException | None
    seq: int              # which request it answers
    started: float        # tick time (wall clock) the read was for


class Background(BaseCollector):
    def __init__(self, inner: Collector, *, budget: float = 0.25, stale_after: float = 3.0, every: int = 1) -> None:
        if budget < 0 or stale_after < 0:
            raise ValueError("budget and stale_after must be >= 0")
        if every < 1:
            raise ValueError("every must be a number of ticks >= 1")
        self.inner = inner
        self.every = every          # read at one tick in ``every`` (a target that needs no 1 s resolution)
        self._countdown = 0         # ticks until the next read is due
        self._idle = False          # this tick reads nothing (not due)
        self._delivered = 0         # the last request whose answer a tick used
        self.name = inner.name
        self.budget = budget
        self.stale_after = stale_after
        self._cv = threading.Condition()
        self._seq = 0
        self._want: tuple[int, float] | None = None   # (request, tick time) asked for, not started yet
        self._running_since: float | None = None      # monotonic start of the read in progress
        self._latest: _Result | None = None
        self._good: _Result | None = None
        self._wait_until = 0.0
        self._asked: int | None = None     # this tick's request, None if none was started
        self._status = SourceStatus(False, "not read yet")
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=f"source-{self.name}"[:15], daemon=True)
        self._thread.start()

    # worker --------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._want is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                want, self._want = self._want, None
                if want is None:   # pragma: no cover - the loop above waits for it
                    continue
                seq, now = want
                self._running_since = time.monotonic()
            try:
                items = list(self.inner.collect(now))
                res = _Result(True, items, None, seq, now)
            except Exception as e:  # noqa: BLE001 - reported through status(), never raised into the tick
                res = _Result(False, [], e, seq, now)
            with self._cv:
                self._latest = res
                if res.ok:
                    self._good = res
                self._running_since = None
                self._cv.notify_all()

    # the tick --------------------------------------------------------------------------------------------
    def begin(self, now: float) -> None:
        """Ask for a read for the tick at ``now`` (skipped while the previous read still runs)."""
        with self._cv:
            self._wait_until = time.monotonic() + self.budget
            self._countdown -= 1
            self._idle = self._countdown > 0
            if self._idle or self._running_since is not None:
                self._asked = None       # not due, or the last read still runs (asked again next tick)
                return
            self._countdown = self.every
            self._ask(now)

    def _ask(self, now: float) -> None:
        self._seq += 1
        self._want, self._asked = (self._seq, now), self._seq
        self._cv.notify_all()

    def collect(self, now: float) -> Iterable[Sample | EventRecord]:
        if self._idle:
            return self._between_reads(now)
        with self._cv:
            if self._asked is None and self._running_since is None and self._want is None:
                # called without begin() (a direct caller): ask now and wait the budget from here
                self._wait_until = time.monotonic() + self.budget
                self._ask(now)
            asked = self._asked
            while asked is not None and (self._latest is None or self._latest.seq != asked):
                left = self._wait_until - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            latest, good = self._latest, self._good
            running_since = self._running_since
            self._asked = None
        fresh = latest is not None and asked is not None and latest.seq == asked
        if fresh and latest is not None:
            self._delivered = latest.seq
        if fresh and latest is not None and latest.ok:
            self._status = SourceStatus(True, "", max(0.0, now - latest.started))
            return latest.items
        if fresh and latest is not None and latest.error is not None:
            reason = _describe(latest.error)
        elif running_since is not None:
            reason = (f"no answer within the tick's {self.budget:g} s budget "
                      f"(read running for {time.monotonic() - running_since:.1f} s)")
        else:
            reason = _describe(latest.error) if latest is not None and latest.error is not None else "no answer yet"
        age = None if good is None else max(0.0, now - good.started)
        self._status = SourceStatus(False, reason, age)
        if good is not None and age is not None and age <= self.stale_after:
            return [s for s in good.items if isinstance(s, Sample)]   # events were delivered once already
        return []

    def _between_reads(self, now: float) -> list[Sample | EventRecord]:
        """A tick at which a source read every few ticks is not due: nothing, and the status of its
        last read (up and fresh when it was) -- unless that read came in after its own tick's
        budget: then this tick takes it, late."""
        with self._cv:
            latest = self._latest
            if latest is None or latest.seq == self._delivered or not latest.ok:
                return []
            self._delivered = latest.seq
        self._status = SourceStatus(True, "", max(0.0, now - latest.started))
        return latest.items

    def source_status(self) -> SourceStatus:
        return self._status

    # protocol ---------------------------------------------------------------------------------------------
    def check(self) -> Availability:
        return self.inner.check()

    @property
    def check_at_start(self) -> bool:
        return bool(getattr(self.inner, "check_at_start", True))

    def close(self, timeout: float = 1.0) -> None:
        """Stop the worker (waiting at most ``timeout`` for a read in progress) and close the source."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)
        with contextlib.suppress(Exception):
            self.inner.close()


def _describe(e: BaseException) -> str:
    text = str(getattr(e, "reason", "") or e).strip()
    return text or type(e).__name__
