"""The store writer: a thread between the sampler and the store.

The sampler never blocks on the database.  Ticks queue here; the writer writes them in order.
When a write fails the tick goes to the on-disk spool and the writer enters outage mode: new
ticks are appended to the spool, and every ``retry_interval`` seconds it tries to drain the
spool (oldest first).  Only when the spool is empty does it go back to direct writes, so the
store sees ticks in order and nothing is lost short of the spool's size bound.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from agent.spool import Spool
from store.api import RetentionPolicy, Store, Tick

log = logging.getLogger(__name__)


class StoreWriter:
    def __init__(self, store: Store, node: str, spool: Spool, *, retry_interval: float = 2.0,
                 retention: RetentionPolicy | None = None, retention_every: float = 3600.0) -> None:
        self.store = store
        self.node = node
        self.spool = spool
        self.retry_interval = retry_interval
        self.retention = retention or RetentionPolicy()
        self.retention_every = retention_every
        self._q: queue.Queue[Tick | None] = queue.Queue(maxsize=10000)
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self.write_errors = 0
        self.written_samples = 0
        self.outage = not spool.empty()
        self._last_retry = 0.0
        self._last_retention = time.monotonic()
        self._idle = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def submit(self, tick: Tick) -> None:
        try:
            self._q.put_nowait(tick)
        except queue.Full:  # the writer is wedged: keep the sample on disk instead
            self.spool.append([tick])

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is queued (and try the spool once more), then stop."""
        self._q.put(None)
        self._thread.join(timeout)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the queue is empty and the spool drained (or timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._q.unfinished_tasks == 0 and self.spool.empty():
                return True
            time.sleep(0.05)
        return False

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=self.retry_interval)
            except queue.Empty:
                item = None
                if self.outage:
                    self._try_drain()
                self._maybe_retention()
                continue
            try:
                if item is None:
                    if self.outage:
                        self._try_drain(force=True)
                    return
                self._handle(item)
                self._maybe_retention()
            finally:
                self._q.task_done()

    def _handle(self, tick: Tick) -> None:
        if self.outage:
            self.spool.append([tick])
            self._try_drain()
            return
        try:
            self.written_samples += self.store.write_ticks(self.node, [tick])
        except Exception as e:  # noqa: BLE001 - any store failure means: keep it on disk
            self.write_errors += 1
            self.spool.append([tick])
            self.outage = True
            self._last_retry = time.monotonic()
            log.error("store write failed, spooling ticks to %s until it returns: %s", self.spool.dir,
                      _one_line(e))

    def _try_drain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_retry < self.retry_interval:
            return
        self._last_retry = now
        drained = 0
        try:
            for path, ticks in self.spool.segments():
                self.written_samples += self.store.write_ticks(self.node, ticks)
                self.spool.commit(path, ticks)
                drained += sum(len(t.samples) for t in ticks)
        except Exception as e:  # noqa: BLE001
            self.write_errors += 1
            log.warning("store still unreachable (%d samples spooled): %s", self.spool.pending_samples, _one_line(e))
            return
        if self.spool.empty():
            if self.outage:
                log.warning("store is back: wrote %d spooled samples, direct writes resume", drained)
            self.outage = False

    def _maybe_retention(self) -> None:
        if self.outage or time.monotonic() - self._last_retention < self.retention_every:
            return
        self._last_retention = time.monotonic()
        try:
            removed = self.store.apply_retention(self.retention)
            if any(removed.values()):
                log.info("retention removed %s", removed)
        except Exception as e:  # noqa: BLE001
            log.warning("retention job failed: %s", _one_line(e))


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__
