"""A micro-batcher: requests for one model wait until ``batch_size`` of them are queued or the oldest
has waited ``max_wait_ms``, then run as one batch on the batcher's own thread.

The limits are read from a callable before every batch, so knob changes apply to the next batch.
A batch never holds more than ``batch_size`` items; a lone request never waits much past
``max_wait_ms`` once the batcher is free (while a batch runs, new requests queue behind it, as in
any batching server).  A full queue refuses new work (``Overloaded``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .workers import Overloaded


@dataclass(slots=True)
class Pending:
    payload: Any
    future: Future[Any]
    enqueued: float          # time.perf_counter() at submit


@dataclass(frozen=True, slots=True)
class BatchInfo:
    size: int
    started: float           # perf_counter when the batch left the queue
    finished: float


@dataclass(frozen=True, slots=True)
class Done:
    """What a request's future resolves to: its output and the batch it ran in."""

    output: Any
    queue_s: float
    batch: BatchInfo


RunBatch = Callable[[Sequence[Any]], Sequence[Any]]


class MicroBatcher:
    def __init__(self, name: str, run_batch: RunBatch, limits: Callable[[], tuple[int, float]],
                 max_queue: int = 1024, on_batch: Callable[[BatchInfo, list[float]], None] | None = None) -> None:
        """``limits()`` returns (batch_size, max_wait seconds); ``on_batch(info, queue_waits)`` after each batch."""
        self.name = name
        self._run_batch = run_batch
        self._limits = limits
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._q: collections.deque[Pending] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.batches = 0
        self.items = 0
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    def submit(self, payload: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError(f"batcher {self.name} is closed")
            if len(self._q) >= self._max_queue:
                raise Overloaded(f"batch queue {self.name} full ({self._max_queue} waiting)")
            self._q.append(Pending(payload, fut, time.perf_counter()))
            self._cv.notify()
        return fut

    def depth(self) -> int:
        return len(self._q)

    def _take(self) -> list[Pending] | None:
        with self._cv:
            while True:
                if self._closed and not self._q:
                    return None
                if not self._q:
                    self._cv.wait(0.5)
                    continue
                size, wait = self._limits()
                size = max(1, int(size))
                deadline = self._q[0].enqueued + max(0.0, wait)
                now = time.perf_counter()
                if len(self._q) >= size or now >= deadline or self._closed:
                    return [self._q.popleft() for _ in range(min(size, len(self._q)))]
                self._cv.wait(deadline - now)

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            started = time.perf_counter()
            waits = [started - p.enqueued for p in batch]
            try:
                outputs = list(self._run_batch([p.payload for p in batch]))
                if len(outputs) != len(batch):
                    raise RuntimeError(f"batch of {len(batch)} gave {len(outputs)} outputs")
            except BaseException as e:  # noqa: BLE001 - every request of the batch gets the error through its future, as concurrent.futures passes on whatever the call raised
                for p in batch:
                    p.future.set_exception(e)
                continue
            info = BatchInfo(size=len(batch), started=started, finished=time.perf_counter())
            self.batches += 1
            self.items += len(batch)
            if self._on_batch is not None:
                with contextlib.suppress(Exception):  # metrics must not fail requests
                    self._on_batch(info, waits)
            for p, out, w in zip(batch, outputs, waits, strict=True):
                p.future.set_result(Done(output=out, queue_s=w, batch=info))

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking work, finish what is queued, join the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)
