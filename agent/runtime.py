"""Putting the agent together: store, spool, writer, collectors, sampler, exporter."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triscope.agent import hugepages
from triscope.agent.budget import BudgetOptions, SampleBudget
from triscope.agent.exporter import make_sources, serve
from triscope.agent.registry import AgentOptions, build_collectors, build_post_processors, split_available
from triscope.agent.sampler import Sampler
from triscope.agent.spool import Spool, adopt_legacy_spool, default_spool_root, spool_dir_for, survey
from triscope.agent.writer import StoreWriter
from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import StoreError, check_sqlite_file, sqlite_path
from triscope.web.auth import WebConfig

if TYPE_CHECKING:
    from triscope.agent.otlp import OtlpOptions, OtlpReceiver

log = logging.getLogger("triscope.agent")


@dataclass
class AgentConfig:
    db_url: str
    node: str = field(default_factory=socket.gethostname)
    interval: float = 1.0
    write_every: float = 5.0   # seconds of ticks per store transaction (at least one tick)
    listen: tuple[str, int] | None = ("127.0.0.1", 9464)
    spool_dir: str = field(default_factory=lambda: str(default_spool_root()))   # the root: per node and database below
    spool_max_bytes: int = 256 << 20
    migrate: bool = True
    retention: bool = True  # run the store's retention job hourly from this agent
    huge_pages: bool = False  # --huge-pages: the heap on transparent huge pages (agent/hugepages.py)
    web: WebConfig | None = None  # --web.config.file: TLS and basic auth on /metrics (triscope/web/config.py)
    options: AgentOptions = field(default_factory=AgentOptions)
    otlp: OtlpOptions | None = None   # --otlp-listen: the OTLP/HTTP receiver (agent/otlp.py), off by default
    budget: BudgetOptions = field(default_factory=BudgetOptions)   # --budget-*: what OTLP senders and scrapes may fill


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        check_sqlite_file(cfg.db_url)   # a directory, an unwritable place, not a database: refused now
        if cfg.migrate:
            migrate_in_child(cfg.db_url)
        # the store may be down at start: the spool takes the ticks until it returns
        self.store = Store.open(cfg.db_url, check=False)
        own = spool_dir_for(cfg.spool_dir, cfg.node, cfg.db_url)
        adopted = adopt_legacy_spool(cfg.spool_dir, cfg.node, cfg.db_url)   # an upgrade keeps what it can
        if adopted:
            log.warning("%s", adopted)
        self.spool = Spool(own, cfg.spool_max_bytes, database=cfg.db_url)
        elsewhere = survey(cfg.spool_dir, own)
        if elsewhere:
            log.warning("spooled ticks for another database left in place, not replayed here: %s",
                        "; ".join(f"{e.path} ({e.database}; node {e.node}: {e.segments} segments, "
                                  f"{e.bytes / 1e6:.1f} MB)" for e in elsewhere))
        if not self.spool.empty():
            log.info("spool %s: %d samples an earlier run kept for this database, replayed in slices while the "
                     "store answers", own, self.spool.pending_samples)
        self.writer = StoreWriter(self.store, cfg.node, self.spool,
                                  retention_every=3600.0 if cfg.retention else float("inf"),
                                  batch_ticks=batch_ticks(cfg.write_every, cfg.interval),
                                  sqlite_file=sqlite_path(cfg.db_url), reopen=self._reopen_store)
        self.budget = SampleBudget(cfg.budget)   # shared by the scrape targets and the OTLP receiver
        cfg.options.budget = self.budget
        collectors = build_collectors(cfg.options)
        self.otlp: OtlpReceiver | None = None
        if cfg.otlp is not None:
            from triscope.agent.otlp import OtlpReceiver

            self.otlp = OtlpReceiver(cfg.otlp, budget=self.budget)
            collectors.append(self.otlp.collector)
        self.collectors, self.off = split_available(collectors)
        self.process_metrics, self.tick_collector = make_sources()
        self.sampler = Sampler(self.collectors, [self.writer], interval=cfg.interval,
                               post=build_post_processors(), self_metrics=self._self_metrics,
                               on_tick=self._on_tick)
        self.server: Any = None
        self.last_tick: Tick | None = None

    def _reopen_store(self, old: Store) -> Store:
        """The SQLite file was deleted or replaced: a new one, with the schema, and a store on it."""
        with contextlib.suppress(Exception):
            old.close()
        check_sqlite_file(self.cfg.db_url)
        migrate_in_child(self.cfg.db_url)
        self.store = Store.open(self.cfg.db_url, check=True)
        return self.store

    def _self_metrics(self) -> list[Sample]:
        return [
            Sample("triscope_spool_pending_samples", float(self.spool.pending_samples)),
            Sample("triscope_spooled_samples_total", float(self.spool.spooled_samples_total), kind="counter"),
            Sample("triscope_dropped_samples_total", float(self.spool.dropped_samples), kind="counter"),
            Sample("triscope_store_write_errors_total", float(self.writer.write_errors), kind="counter"),
            Sample("triscope_spool_replayed_samples_total", float(self.spool.replayed_samples), kind="counter"),
            Sample("triscope_store_last_write_age_seconds", max(0.0, time.monotonic() - self.writer.last_write)),
            Sample("triscope_store_queue_spilled_ticks_total", float(self.writer.spilled_ticks), kind="counter"),
            *self.budget.samples(),
        ]

    def _on_tick(self, tick: Tick) -> None:
        n = self.sampler.stats.ticks
        if n == 10:
            _freeze_startup_objects()
        if self.cfg.huge_pages and heap_advice_due(n):
            self._advise_heap()
        self.last_tick = tick
        self.tick_collector.update(tick.samples)
        if self.server is not None:   # scraped every tick or so: render now, while this wake-up is warm
            self.server[0].prerender(self.cfg.interval)

    def _advise_heap(self) -> None:
        """After the first ticks (and again later, for what the heap grew since), the dense parts
        of the heap go onto huge pages: a tick touches fewer pages (agent/hugepages.py)."""
        try:
            res = hugepages.advise_heap()
        except Exception as e:  # noqa: BLE001 - an optimisation never stops the agent
            log.warning("huge pages for the heap: %s", e)
            self.cfg.huge_pages = False
            return
        first = self.sampler.stats.ticks == 10
        log.log(logging.INFO if first else logging.DEBUG, "%s", hugepages.describe(None, res))

    def start_exporter(self) -> None:
        if self.cfg.listen is not None:
            host, port = self.cfg.listen
            # a body rendered at a tick serves the scrapes until the next one (slack for a late tick)
            self.server = serve(self.process_metrics, host, port, self.tick_collector, max_age=self.cfg.interval * 1.5,
                                web=self.cfg.web)

    def start_otlp(self) -> None:
        """Bind and serve the OTLP receiver, if configured (an address in use raises OSError here)."""
        if self.otlp is not None and self.otlp.http is None:
            self.otlp.start()

    def run(self, duration: float = 0.0) -> None:
        self.writer.start()
        self.start_exporter()
        self.start_otlp()
        names = ", ".join(f"{c.name}" + ("" if not getattr(c, "down_reason", None) else " (off)") for c in self.collectors)
        log.warning("agent for node %s: interval %.3gs, collectors: %s", self.cfg.node, self.cfg.interval, names)
        try:
            self.sampler.run(duration)
        finally:
            self.shutdown()

    def start_background(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="agent", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.sampler.stop()

    def shutdown(self, timeout: float = 4.0) -> None:
        """Every tick taken is written (or, if the store does not answer within ``timeout``, kept in
        the spool); then the collectors and the exporter stop.  Bounded: SIGTERM ends the agent in
        a few seconds whatever the store or a source is doing."""
        deadline = time.monotonic() + timeout
        self.writer.close(timeout=max(0.5, timeout - 1.0))
        self.sampler.close(timeout=max(0.2, deadline - time.monotonic()))
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server[0].shutdown()
        if self.otlp is not None:
            with contextlib.suppress(Exception):
                self.otlp.shutdown()
        # the agent's own record of what it produced: what a gap in the store is checked against
        spool = self.writer.spool
        log.warning("agent for node %s stopped: %d ticks taken; %d samples left in the spool %s for the next start "
                    "(%d ticks); %d ticks (%d samples) dropped", self.cfg.node, self.sampler.stats.ticks,
                    spool.pending_samples, spool.dir, spool.pending_ticks, spool.dropped_ticks, spool.dropped_samples)


def _freeze_startup_objects() -> None:
    """Once warm, everything allocated so far (modules, caches, the compiled SQL) leaves the
    garbage collector's reach (``gc.freeze``): a full collection then walks what the ticks
    allocated since, not the whole process (it took 20-60 ms of CPU a minute here)."""
    import gc

    gc.collect()
    gc.freeze()


def heap_advice_due(ticks: int) -> bool:
    """After which ticks the heap's dense ranges go onto huge pages: once warm, once settled, then
    every 3600 ticks (an hour at 1 s) for what the heap grew since."""
    return ticks in (10, 60) or ticks % 3600 == 0


def batch_ticks(write_every: float, interval: float) -> int:
    """Ticks per store transaction for ``--write-every`` seconds at ``--interval`` (at least 1)."""
    return max(1, round(write_every / interval))


def migrate_in_child(url: str) -> None:
    """Upgrade the schema in a short-lived child so Alembic never stays in the agent's memory.

    An unreachable database is not fatal: the agent starts and spools until it returns.
    """
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "triscope", "db", "upgrade", "--db", url],
                         capture_output=True, text=True, timeout=300)
    if res.returncode == 0:
        return
    msg = (res.stderr.strip().splitlines() or ["schema upgrade failed"])[-1]
    msg = msg.removeprefix("triscope db: error: ")
    if "unreachable" in msg:
        log.error("%s — starting anyway, ticks wait in the spool", msg)
        return
    raise StoreError(msg)


def default_spool_dir() -> str:
    """The spool's root: ``$TRISCOPE_SPOOL_DIR``, else a state directory (``agent/spool.py``)."""
    return str(default_spool_root())
