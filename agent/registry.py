"""Which collectors the agent runs, built from its options.

Collectors that cannot run on this host are still listed (``triscope_collector_up`` 0, the reason
logged once); the eBPF retransmit probe replaces the procfs retransmit counter only while it runs.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

from triscope.agent.collectors.base import Availability, BaseCollector, Collector
from triscope.samples import EventRecord, Sample

log = logging.getLogger(__name__)


@dataclass
class AgentOptions:
    proc: str = "/proc"
    sys: str = "/sys"
    scrape: list[str] = field(default_factory=list)
    ebpf: bool = True
    nvml: bool = True
    npu: bool = True
    npu_smi: str | None = None
    scrape_timeout: float = 2.0    # one scrape, connect to last byte
    interval: float = 1.0          # the agent's tick: sets how long a tick waits for a scrape

    @property
    def source_budget(self) -> float:
        """How long a tick waits for a background source's answer: a quarter of the interval, at most
        the source's own timeout."""
        return min(0.25 * self.interval, self.scrape_timeout)

    @property
    def stale_after(self) -> float:
        """How long a source's last good answer stands in for a missing one."""
        return max(3 * self.interval, self.scrape_timeout + self.interval)


class UnavailableCollector(BaseCollector):
    """Stands in for a collector that cannot run here: reports why, yields nothing, stays down."""

    def __init__(self, name: str, reason: str, hint: str = "") -> None:
        self.name = name
        self.reason = reason
        self.hint = hint

    @property
    def down_reason(self) -> str:
        return self.reason + (f" ({self.hint})" if self.hint else "")

    def check(self) -> Availability:
        return Availability(False, self.reason, self.hint)

    def collect(self, now: float) -> list[Sample | EventRecord]:
        raise RuntimeError(self.down_reason)


def _load(module: str, cls: str) -> Any | None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise
    return getattr(mod, cls, None)


def _make(name: str, module: str, cls: str, **kwargs: Any) -> Collector | None:
    factory = _load(module, cls)
    if factory is None:
        return None
    try:
        return factory(**kwargs)
    except Exception as e:  # noqa: BLE001 - a collector that cannot even start degrades, never crashes
        log.error("collector %s cannot start: %s", name, e)
        return UnavailableCollector(name, f"cannot start: {e}")


def build_collectors(opts: AgentOptions) -> list[Collector]:
    collectors: list[Collector] = []
    ebpf = None
    if opts.ebpf:
        ebpf = _make("ebpf", "triscope.agent.collectors.ebpf", "EbpfCollector")
    tcp_probe = bool(ebpf is not None and getattr(ebpf, "attached", {}).get("tcp_retransmit", False))
    for c in (
        _make("tcp", "triscope.agent.collectors.tcp", "TcpCollector", proc=opts.proc, emit_retransmits=not tcp_probe),
        _make("cpu", "triscope.agent.collectors.cpu", "CpuCollector", proc=opts.proc),
        _make("pressure", "triscope.agent.collectors.pressure", "PressureCollector", proc=opts.proc),
        _make("pcie", "triscope.agent.collectors.pcie", "PcieLinkCollector", sys=opts.sys),
        _make("aer", "triscope.agent.collectors.aer", "AerCollector", sys=opts.sys),
        ebpf,
    ):
        if c is not None:
            collectors.append(c)
    if opts.nvml:
        c = _make("nvml", "triscope.agent.collectors.nvml", "NvmlCollector")
        if c is not None:
            collectors.append(c)
    if opts.npu:
        kw = {"npu_smi": opts.npu_smi} if opts.npu_smi else {}
        c = _make("npu", "triscope.agent.collectors.npu", "NpuSmiCollector", **kw)
        if c is not None:
            collectors.append(c)
    for url in opts.scrape:
        try:
            from triscope.agent.collectors.scrape import parse_scrape_url

            name = "scrape:" + parse_scrape_url(url)[1]
        except (ImportError, ValueError):
            name = f"scrape:{url}"
        c = _make(name, "triscope.agent.collectors.scrape", "ScrapeCollector", url=url, timeout=opts.scrape_timeout)
        if c is not None:
            if not isinstance(c, UnavailableCollector):
                from triscope.agent.collectors.background import Background

                c = Background(c, budget=opts.source_budget, stale_after=opts.stale_after)
            collectors.append(c)
    return collectors


def split_available(collectors: list[Collector]) -> tuple[list[Collector], list[tuple[Collector, Availability]]]:
    """Run each collector's check(); collectors that cannot run are replaced by a stand-in that
    keeps reporting ``collector_up 0`` (and the reason is logged once, here)."""
    keep: list[Collector] = []
    off: list[tuple[Collector, Availability]] = []
    for c in collectors:
        if not getattr(c, "check_at_start", True):   # checked by its first read, on its own worker
            keep.append(c)
            continue
        try:
            av = c.check()
        except Exception as e:  # noqa: BLE001
            av = Availability(False, f"check failed: {e}")
        if av.ok or av.transient:
            # e.g. a scraped service that is not up yet: retried every tick, down until then
            keep.append(c)
            if not av.ok:
                log.warning("collector %s: %s (retried every tick)", c.name, av.reason)
        else:
            off.append((c, av))
            log.warning("collector %s is off: %s%s", c.name, av.reason, f" — {av.hint}" if av.hint else "")
            keep.append(UnavailableCollector(c.name, av.reason, av.hint) if not isinstance(c, UnavailableCollector) else c)
            with contextlib.suppress(Exception):
                c.close()
    return keep, off


def build_post_processors() -> list[Any]:
    tracker = _load("triscope.analysis.online", "MismatchTracker")
    if tracker is None:
        return []
    try:
        return [tracker()]
    except Exception as e:  # noqa: BLE001
        log.error("mismatch detector cannot start: %s", e)
        return []
