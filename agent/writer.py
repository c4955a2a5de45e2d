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

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from triscope.agent.spool import Spool
from triscope.core.samples import Tick
from triscope.store.api import RetentionPolicy, Store

log = logging.getLogger(__name__)


class StoreFileChanged(Exception):
    """The SQLite file the store writes was deleted or replaced under the running agent."""


class FileIdentity:
    """Which file a path names, by (device, inode): tells when a SQLite file was deleted or replaced
    while connections still write into the old one (the writes would vanish with its inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ident = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def changed(self) -> str | None:
        """None while the path still names the file first seen; else 'deleted' or 'replaced'."""
        now = self._stat()
        if now == self.ident:
            return None
        return "deleted" if now is None else "replaced"

    def reset(self) -> None:
        self.ident = self._stat()


MAX_QUEUED_SAMPLES = 250_000
"""Samples queued in memory for the writer at most; past it
ticks go to the on-disk spool, which has its own size cap."""


class StoreWriter:
    def __init__(self, store: Store, node: str, spool: Spool, *, retry_interval: float = 2.0,
                 retention: RetentionPolicy | None = None, retention_every: float = 3600.0,
                 batch_ticks: int = 1, sqlite_file: Path | None = None,
                 reopen: Callable[[Store], Store] | None = None, max_queued_samples: int = MAX_QUEUED_SAMPLES) -> None:
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
        # the queue is bounded in samples too: ticks are not all alike (one hostile OTLP sender can
        # make a tick of 100,000 series), and memory goes by samples
        self.max_queued_samples = max(1, max_queued_samples)
        self._queued_samples = 0
        self.spilled_ticks = 0                # ticks sent to the spool because the queue was full
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self.write_errors = 0
        self.written_samples = 0
        self.last_write = time.monotonic()     # the last write that reached the store (start: now)
        self._last_crash_log = -1e18
        # ticks an earlier run spooled for this database: replayed in slices while the store answers,
        # never ahead of this run's own ticks (``_replay_slice``)
        self.outage = False
        self.backlog = not spool.empty()
        self.replay_budget = 0.5          # seconds of replay at a time
        self._draining = False
        self._last_retry = 0.0
        self._last_still_logged = 0.0
        # the spool emptied during an outage without a write reaching the store (every tick of it
        # was dropped: a full disk): direct writes are tried, and "store is back" waits for one
        self._unconfirmed = False
        self._last_retention = time.monotonic()
        self._idle = threading.Event()
        self._current: list[Tick] | None = None   # the batch being written now
        # a SQLite store's file, watched before and after every write; ``reopen`` recreates it
        self.file = FileIdentity(sqlite_file) if sqlite_file is not None and reopen is not None else None
        self.reopen = reopen

    def start(self) -> None:
        self._thread.start()

    def submit(self, tick: Tick) -> None:
        with self._batch_lock:
            self._batch.append(tick)
            if len(self._batch) < self.batch_ticks:
                return
            batch, self._batch = self._batch, []
        self._hand_over(batch)

    def _hand_over(self, batch: list[Tick]) -> None:
        n = sum(len(t.samples) for t in batch)
        with self._batch_lock:
            room = self._queued_samples + n <= self.max_queued_samples or self._queued_samples == 0
            if room:
                self._queued_samples += n
        try:
            if not room:
                raise queue.Full
            self._q.put_nowait(batch)
        except queue.Full:  # the writer is behind or wedged: keep the samples on disk instead
            if room:
                with self._batch_lock:
                    self._queued_samples -= n
            self.spilled_ticks += len(batch)
            if self.spilled_ticks == len(batch) or self.spilled_ticks % 100 < len(batch):
                log.warning("store writer behind: %d samples queued (cap %d); %d ticks kept in the spool %s instead",
                            self._queued_samples, self.max_queued_samples, self.spilled_ticks, self.spool.dir)
            self.spool.append(batch)
            self.outage = True      # drained from the spool (in order) once the writer catches up

    def _send_partial(self) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self._hand_over(batch)

    def close(self, timeout: float = 30.0) -> None:
        """Write the partial batch and what is queued (and try the spool once more), then stop.

        Bounded by ``timeout``: when the store does not answer in time (a hung server, a connect
        timeout), what is still queued — and the batch being written, whose outcome is unknown —
        goes to the on-disk spool instead, to be written at the next start (writes are idempotent,
        so a batch that did land is not doubled)."""
        deadline = time.monotonic() + timeout
        self._send_partial()
        with contextlib.suppress(queue.Full):
            self._q.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._spool_leftovers()

    def _spool_leftovers(self) -> None:
        left: list[Tick] = []
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                left.extend(item)
        current = self._current
        if current:
            left = list(current) + left
        if left:
            self.spool.append(left)
            log.warning("store did not answer in time at shutdown: %d ticks kept in the spool %s",
                        len(left), self.spool.dir)

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
        if self._draining or (self.backlog and not self.outage):
            return 0.05                 # the spool is being written back: the next slice soon
        if self.outage:
            return self.retry_interval
        if self.retention_every == float("inf"):
            return None
        return max(0.1, self._last_retention + self.retention_every - time.monotonic())

    def _run(self) -> None:
        """The writer thread: it never dies.  Anything a step raises (a full disk under the spool, a
        bug) is logged, counted in ``write_errors`` and the loop goes on; the ticks of a failed step
        stay where they were (queued, spooled) or are counted as dropped by the spool."""
        while True:
            try:
                if self._step():
                    return
            except Exception as e:  # noqa: BLE001 - the thread must outlive any one failure
                self.write_errors += 1
                self._current = None
                now = time.monotonic()
                if now - self._last_crash_log >= 60.0:
                    self._last_crash_log = now
                    log.error("store writer: %s (going on)", _one_line(e), exc_info=True)
                time.sleep(min(1.0, self.retry_interval))

    def _step(self) -> bool:
        """One wait-and-handle; True when the writer is to stop."""
        try:
            item = self._q.get(timeout=self._wait_seconds())
        except queue.Empty:
            if self.outage:
                self._try_drain()
            elif self.backlog:
                self._replay_slice()
            self._maybe_retention()
            return False
        try:
            if item is None:
                if self.outage:      # this run's own ticks wait in the spool: all of them now
                    self._try_drain(force=True, budget=float("inf"))
                return True
            with self._batch_lock:
                self._queued_samples = max(0, self._queued_samples - sum(len(t.samples) for t in item))
            self._current = item
            self._handle(item)
            self._current = None
            self._maybe_retention()
            return False
        finally:
            self._q.task_done()

    def _handle(self, ticks: list[Tick]) -> None:
        if self.outage:
            self.spool.append(ticks)
            self._try_drain()
            return
        try:
            self.written_samples += self._write(ticks)
            self.last_write = time.monotonic()
        except Exception as e:  # noqa: BLE001 - any store failure means: keep it on disk
            self.write_errors += 1
            self.spool.append(ticks)
            self.outage = True
            self._last_retry = time.monotonic()
            if self._unconfirmed:            # the same outage: its first line was logged already
                self._still_unreachable(self._last_retry, e)
            else:
                self._last_still_logged = self._last_retry
                log.error("store write failed, spooling ticks to %s until it returns: %s", self.spool.dir,
                          _one_line(e))
            return
        if self._unconfirmed:
            self._unconfirmed = False
            log.warning("store is back: a write reached it, direct writes resume")

    def _write(self, ticks: list[Tick]) -> int:
        self._check_file()
        n = self.store.write_ticks(self.node, ticks)
        if self.file is not None and self.file.changed():
            # gone while this batch was written: it went into the old file; into the spool with it
            raise StoreFileChanged(f"SQLite file {self.file.path} changed during a write")
        return n

    def _check_file(self) -> None:
        """Before a write: the SQLite file is still the one the store has open, or it is recreated
        now (schema included) and the store reopened on it; if that fails, the caller spools."""
        if self.file is None or self.reopen is None:
            return
        what = self.file.changed()
        if what is None:
            return
        old = self.store
        try:
            self.store = self.reopen(old)
        except Exception as e:  # noqa: BLE001 - recreating can fail in any layer (OS, SQLAlchemy, Alembic): each means spool and try again, never a dead writer
            raise StoreFileChanged(f"SQLite file {self.file.path} was {what} under the running agent and "
                                   f"cannot be recreated yet: {_one_line(e)}") from None
        self.file.reset()
        log.error("SQLite file %s was %s under the running agent: recreated it with the schema; writing "
                  "continues there (what the old file held is gone with it)", self.file.path, what)

    def _replay_slice(self) -> None:
        """Write back segments an earlier run spooled for this database, for at most
        ``replay_budget`` seconds; this run's ticks are written directly meanwhile (they never
        wait behind the backlog).  A failure is an outage like any other."""
        if self.outage:
            return
        t0 = time.monotonic()
        try:
            for path, ticks in self.spool.segments():
                self.written_samples += self._write(ticks)
                self.spool.commit(path, ticks, replayed=True)
                if time.monotonic() - t0 >= self.replay_budget:
                    return
        except Exception as e:  # noqa: BLE001 - any store failure means: keep it on disk
            self.spool.release()
            self.write_errors += 1
            self.outage = True
            log.warning("store write failed while replaying the spool (%d samples left): %s",
                        self.spool.pending_samples, _one_line(e))
            return
        if self.spool.empty():
            self.backlog = False
            log.info("spool replayed: %d samples an earlier run kept for this database are stored",
                     self.spool.replayed_samples)

    def _try_drain(self, force: bool = False, budget: float = 2.0) -> None:
        now = time.monotonic()
        if not force and not self._draining and now - self._last_retry < self.retry_interval:
            return
        self._last_retry = now
        drained = 0
        wrote = False             # a write reached the store (ticks of events only count too)
        self._draining = False
        try:
            for path, ticks in self.spool.segments():
                self.written_samples += self._write(ticks)
                self.last_write = time.monotonic()
                self.spool.commit(path, ticks, replayed=True)
                drained += sum(len(t.samples) for t in ticks)
                wrote = True
                if time.monotonic() - now >= budget:
                    self._draining = True    # more to write: the next slice soon, new ticks behind it
                    return
        except Exception as e:  # noqa: BLE001 - any store failure means: keep it on disk, retry later
            self.spool.release()
            self.write_errors += 1
            self._still_unreachable(now, e)
            return
        if self.spool.empty():
            if self.outage and wrote:
                log.warning("store is back: wrote %d spooled samples, direct writes resume", drained)
            elif self.outage:
                # nothing was written: the spool emptied because it could keep nothing (a full disk),
                # not because the store answered.  Direct writes are tried; the first that lands says so
                self._unconfirmed = True
            self.outage = False
            self.backlog = False

    def _still_unreachable(self, now: float, e: BaseException) -> None:
        if now - self._last_still_logged >= 60.0:   # once a minute, not at every retry
            self._last_still_logged = now
            log.warning("store still unreachable (%d samples spooled): %s", self.spool.pending_samples,
                        _one_line(e))

    def _maybe_retention(self) -> None:
        if self.outage or time.monotonic() - self._last_retention < self.retention_every:
            return
        self._last_retention = time.monotonic()
        try:
            removed = self.store.apply_retention(self.retention)
            if any(removed.values()):
                log.info("retention removed %s", removed)
        except Exception as e:  # noqa: BLE001 - retention is housekeeping: a failure is logged, the next run tries again
            log.warning("retention job failed: %s", _one_line(e))


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__
