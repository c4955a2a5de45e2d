"""Which collectors the agent runs, built from its options.

Collectors that cannot run on this host are still listed (``triscope_collector_up`` 0, the reason
logged once); the eBPF retransmit probe replaces the procfs retransmit counter only while it runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triscope.agent.budget import SampleBudget, ScrapeLedger
from triscope.agent.collectors.base import Availability, BaseCollector, Collector
from triscope.agent.ebpf.layout import PROBES
from triscope.core.samples import EventRecord, Sample

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
    workloads: bool = True         # which workload uses each accelerator (needs NVML or npu-smi)
    waitfor: bool = True           # wait-for probes (sched tracepoints) on the workloads' threads
    cuda_probes: bool = True       # uprobes on the CUDA driver (sync, copies): the driving threads
    cuda_launch_probe: bool = False   # ... and on every kernel launch (off: ~1-24 us a launch, bench cuda_uprobes)
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pods_log_dir: str = "/var/log/pods"
    scrape_timeout: float = 2.0    # one scrape, connect to last byte
    interval: float = 1.0          # the agent's tick: sets how long a tick waits for a scrape
    budget: SampleBudget | None = None   # the sample budget the scrape targets (and OTLP) share (agent/budget.py)
    scrape_every: dict[str, int] = field(default_factory=dict)   # --scrape-interval: URL -> ticks between reads

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


def _make(name: str, factory: Callable[[], Collector]) -> Collector:
    """Build one collector; one that cannot even start degrades to a stand-in, never crashes the agent.
    The factories below import their module inside (plain ``import`` statements, so the import
    checker sees the edges): a host without NVML never loads the NVML bindings."""
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - a collector that cannot even start degrades, never crashes
        log.error("collector %s cannot start: %s", name, e)
        return UnavailableCollector(name, f"cannot start: {e}")


def _ebpf(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.ebpf import EbpfCollector

    if opts.waitfor:
        return EbpfCollector()
    return EbpfCollector(probes=[p.name for p in PROBES if not p.name.startswith("waitfor")])


def _tcp(opts: AgentOptions, emit_retransmits: bool) -> Collector:
    from triscope.agent.collectors.tcp import TcpCollector

    return TcpCollector(proc=opts.proc, emit_retransmits=emit_retransmits)


def _cpu(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.cpu import CpuCollector

    return CpuCollector(proc=opts.proc)


def _pressure(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.pressure import PressureCollector

    return PressureCollector(proc=opts.proc)


def _pcie(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.pcie import PcieLinkCollector

    return PcieLinkCollector(sys=opts.sys)


def _topology(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.topology import TopologyCollector

    return TopologyCollector(sys=opts.sys)


def _aer(opts: AgentOptions) -> Collector:
    from triscope.agent.collectors.aer import AerCollector

    return AerCollector(sys=opts.sys)


def _nvml() -> Collector:
    from triscope.agent.collectors.nvml import NvmlCollector

    return NvmlCollector()


def _npu(opts: AgentOptions) -> Collector:
    """npu-smi runs in the background once per agent tick (``--interval``): the tick reads its latest
    parse, and its answer stands for ``max(3 x interval, timeout + interval)``."""
    from triscope.agent.collectors.npu import NpuSmiCollector

    return NpuSmiCollector(npu_smi=opts.npu_smi, interval=opts.interval)


def _workloads(opts: AgentOptions, npu: Collector | None, ebpf: Collector | None = None) -> Collector:
    """Attribution and per-workload host evidence, fed by NVML's process lists and the npu-smi
    collector's process table (no npu-smi run of its own).  Without either it reports itself off
    at the start check (and costs nothing more)."""
    from triscope.agent.collectors.npu import NpuSmiCollector
    from triscope.agent.workloads.accelprocs import NpuProcessSource, ProcessSource
    from triscope.agent.workloads.collector import WorkloadsCollector

    sources: list[ProcessSource] = []
    if opts.nvml:
        from triscope.agent.workloads.nvml_processes import NvmlProcessSource

        sources.append(NvmlProcessSource())
    if isinstance(npu, NpuSmiCollector):
        sources.append(NpuProcessSource(npu))
    waitfor = getattr(ebpf, "waitfor", None) if opts.waitfor else None
    api = None
    if waitfor is not None and opts.nvml and opts.cuda_probes:
        from triscope.agent.collectors.cudacalls import CudaCalls

        try:
            api = CudaCalls(launch_probe=opts.cuda_launch_probe, proc=opts.proc)
        except Exception as e:  # noqa: BLE001 - the driver probes are optional evidence
            log.warning("CUDA driver probes off: %s", e)
    return WorkloadsCollector(sources, proc=opts.proc, sys=opts.sys, pod_resources_socket=opts.pod_resources_socket,
                              pods_log_dir=opts.pods_log_dir, waitfor=waitfor, api=api)


def _scrape(opts: AgentOptions, url: str) -> Collector:
    from triscope.agent.collectors.background import Background
    from triscope.agent.collectors.scrape import ScrapeCollector

    ledger = ScrapeLedger(opts.budget, url) if opts.budget is not None else None
    return Background(ScrapeCollector(url=url, timeout=opts.scrape_timeout, ledger=ledger), budget=opts.source_budget,
                      stale_after=opts.stale_after, every=opts.scrape_every.get(url, 1))


def build_collectors(opts: AgentOptions) -> list[Collector]:
    from triscope.agent.collectors.scrape import parse_scrape_url

    collectors: list[Collector] = []
    ebpf = _make("ebpf", lambda: _ebpf(opts)) if opts.ebpf else None
    tcp_probe = bool(ebpf is not None and getattr(ebpf, "attached", {}).get("tcp_retransmit", False))
    collectors.append(_make("tcp", lambda: _tcp(opts, emit_retransmits=not tcp_probe)))
    collectors.append(_make("cpu", lambda: _cpu(opts)))
    collectors.append(_make("pressure", lambda: _pressure(opts)))
    collectors.append(_make("pcie", lambda: _pcie(opts)))
    collectors.append(_make("aer", lambda: _aer(opts)))
    collectors.append(_make("topology", lambda: _topology(opts)))
    if ebpf is not None:
        collectors.append(ebpf)
    if opts.nvml:
        collectors.append(_make("nvml", _nvml))
    npu = _make("npu", lambda: _npu(opts)) if opts.npu else None
    if npu is not None:
        collectors.append(npu)
    if opts.workloads and (opts.nvml or opts.npu):
        collectors.append(_make("workloads", lambda: _workloads(opts, npu, ebpf)))
    for url in opts.scrape:
        try:
            name = "scrape:" + parse_scrape_url(url)[1]
        except ValueError:
            name = f"scrape:{url}"
        collectors.append(_make(name, lambda url=url: _scrape(opts, url)))  # type: ignore[misc]
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
        except Exception as e:  # noqa: BLE001 - a collector whose check fails is left out, with why; the agent starts
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
    """What sees each tick's samples after the collectors: the online mismatch tracker."""
    try:
        from triscope.analysis.online import MismatchTracker

        return [MismatchTracker()]
    except Exception as e:  # noqa: BLE001 - the agent measures on without its verdict
        log.error("mismatch detector cannot start: %s", e)
        return []
