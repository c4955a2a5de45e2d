"""The preprocessing workers: a pool of threads whose size and CPU affinity change at run time.

Threads, not processes: Pillow's decode and resize and numpy's FFT and matrix products release the
GIL, so threads decode in parallel, and ``os.sched_setaffinity(0, cpus)`` called *in a worker thread*
confines that thread alone (Linux applies affinity per task), which is exactly the knob: the
preprocessing confined to one core while the HTTP handlers and the batcher run anywhere.

Each worker applies the affinity in force before its next task (and at least every ``tick_s`` while
idle); a smaller ``workers`` value retires surplus workers after their current task.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("inference.workers")


class Overloaded(RuntimeError):
    """A queue is full: the request is refused (HTTP 503) rather than queued without bound."""


class WorkerPool:
    def __init__(self, workers: int, affinity: tuple[int, ...] | None = None, max_queue: int = 1024,
                 name: str = "preprocess", tick_s: float = 0.2) -> None:
        self.name = name
        self._q: queue.Queue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue()
        self._max_queue = max_queue
        self._tick = tick_s
        self._lock = threading.Lock()
        self._target = max(1, workers)
        self._affinity = affinity
        self._affinity_gen = 0
        try:
            self._all_cpus: set[int] | None = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._all_cpus = None
        self._threads: dict[int, threading.Thread] = {}   # serial -> thread
        self._native: dict[int, int] = {}                 # serial -> native thread id
        self._serial = 0
        self._busy = 0
        self._closed = False
        self.affinity_errors = 0
        self._spawn_to_target()

    # -- control -----------------------------------------------------------------------------
    def resize(self, workers: int) -> None:
        with self._lock:
            self._target = max(1, workers)
        self._spawn_to_target()

    def set_affinity(self, cpus: tuple[int, ...] | None) -> None:
        with self._lock:
            if cpus != self._affinity:
                self._affinity = cpus
                self._affinity_gen += 1

    def _spawn_to_target(self) -> None:
        with self._lock:
            while len(self._threads) < self._target and not self._closed:
                self._serial += 1
                t = threading.Thread(target=self._run, args=(self._serial,), name=f"{self.name}-{self._serial}",
                                     daemon=True)
                self._threads[self._serial] = t
                t.start()

    # -- work --------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError(f"{self.name} pool is closed")
        if self._q.qsize() >= self._max_queue:
            raise Overloaded(f"{self.name} queue full ({self._max_queue} waiting)")
        fut: Future[Any] = Future()
        self._q.put((fut, fn, args))
        return fut

    def depth(self) -> int:
        """Tasks waiting for a worker (not counting those running)."""
        return self._q.qsize()

    def busy(self) -> int:
        return self._busy

    def size(self) -> int:
        return len(self._threads)

    def native_ids(self) -> list[int]:
        with self._lock:
            return list(self._native.values())

    def _apply_affinity(self, cpus: tuple[int, ...] | None) -> None:
        target = set(cpus) if cpus is not None else self._all_cpus
        if target is None:
            return
        try:
            os.sched_setaffinity(0, target)   # pid 0 = this thread
        except (AttributeError, OSError) as e:
            self.affinity_errors += 1
            log.warning("%s: cannot set CPU affinity %s: %s", threading.current_thread().name, sorted(target), e)

    def _run(self, serial: int) -> None:
        with self._lock:
            self._native[serial] = threading.get_native_id()
        seen_gen = -1
        try:
            while True:
                with self._lock:
                    if self._closed or len(self._threads) > self._target:
                        self._threads.pop(serial, None)   # retire now, so no two workers retire for one
                        return
                    gen, cpus = self._affinity_gen, self._affinity
                if gen != seen_gen:
                    self._apply_affinity(cpus)
                    seen_gen = gen
                try:
                    item = self._q.get(timeout=self._tick)
                except queue.Empty:
                    continue
                if item is None:
                    return
                fut, fn, args = item
                if not fut.set_running_or_notify_cancel():
                    continue
                with self._lock:
                    gen, cpus = self._affinity_gen, self._affinity
                if gen != seen_gen:
                    self._apply_affinity(cpus)
                    seen_gen = gen
                with self._lock:
                    self._busy += 1
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - the caller gets whatever the call raised through the future, as concurrent.futures does
                    fut.set_exception(e)
                finally:
                    with self._lock:
                        self._busy -= 1
        finally:
            with self._lock:
                self._threads.pop(serial, None)
                self._native.pop(serial, None)

    def close(self, timeout: float = 2.0) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads.values())
        for _ in threads:
            self._q.put(None)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        while True:  # fail whatever was still queued
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[0].set_running_or_notify_cancel():
                item[0].set_exception(RuntimeError(f"{self.name} pool closed"))
