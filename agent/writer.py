"""The store writer: a thread between the sampler and the store.

The sampler never blocks on the database.  Ticks queue here; the writer writes them in order.
``batch_ticks`` ticks go to the store in one transaction (the agent's ``--write-every``): the
writer thread wakes once per batch instead of once per tick, and the database commits that much
less often.  /metrics does not wait for a batch.
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
                 retention: RetentionPolicy | None = None, retention_every: float = 3600.0,
                 batch_ticks: int = 1) -> None:
        if batch_ticks < 1:
            raise ValueError("batch_ticks must be >= 1")
        self.store = store
        self.node = node
        self.spool = spool
        self.retry_interval = retry_interval
        self.retention = retention or RetentionPolicy()
        self.retention_every = retention_every
        self.batch_ticks = batch_ticks
        self._batch: list[Tick] = []          # ticks submitted, not yet handed to the writer thread
        self._batch_lock = threading.Lock()
        self._q: queue.Queue[list[Tick] | None] = queue.Queue(maxsize=max(1, 10000 // batch_ticks))
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self.write_errors = 0
        self.written_samples = 0
        self.outage = not spool.empty()
        self._last_retry = 0.0
        self._last_retention = time.monotonic()
        self._idle = threading.Event()

    def start(self) -> None:
        self._thread.start()

    @property
    def pending_ticks(self) -> int:
        """Ticks held for the current batch (in memory, not yet queued for the store)."""
        return len(self._batch)

    def submit(self, tick: Tick) -> None:
        with self._batch_lock:
            self._batch.append(tick)
            if len(self._batch) < self.batch_ticks:
                return
            batch, self._batch = self._batch, []
        self._hand_over(batch)

    def _hand_over(self, batch: list[Tick]) -> None:
        try:
            self._q.put_nowait(batch)
        except queue.Full:  # the writer is wedged: keep the samples on disk instead
            self.spool.append(batch)

    def _send_partial(self) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self._hand_over(batch)

    def close(self, timeout: float = 30.0) -> None:
        """Write the partial batch and what is queued (and try the spool once more), then stop."""
        self._send_partial()
        self._q.put(None)
        self._thread.join(timeout)

    def flush(self, timeout: float = 30.0) -> bool:
        """Hand over the partial batch, then wait until the queue is empty and the spool drained (or timeout)."""
        self._send_partial()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._q.unfinished_tasks == 0 and self.spool.empty():
                return True
            time.sleep(0.05)
        return False

    def _wait_seconds(self) -> float | None:
        """How long the thread may sleep with nothing queued: until the next retry while the store
        is down, until the next retention run otherwise (no wake-up that has nothing to do)."""
        if self.outage:
            return self.retry_interval
        if self.retention_every == float("inf"):
            return None
        return max(0.1, self._last_retention + self.retention_every - time.monotonic())

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=self._wait_seconds())
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

    def _handle(self, ticks: list[Tick]) -> None:
        if self.outage:
            self.spool.append(ticks)
            self._try_drain()
            return
        try:
            self.written_samples += self.store.write_ticks(self.node, ticks)
        except Exception as e:  # noqa: BLE001 - any store failure means: keep it on disk
            self.write_errors += 1
            self.spool.append(ticks)
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
