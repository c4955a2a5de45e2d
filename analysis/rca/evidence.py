"""Absolute evidence for an episode: how close each suspect is to the limit that would make it the
cause, whatever came before.  Pure functions over points already read.

A change against a reference says *what moved*; it cannot say whether what moved matters (PCIe
traffic rising from 0 to 5 GB/s is nothing on a 55 GB/s link) and there is none where no healthy
reference exists.  So every episode also gets **figures**, each a value against the threshold the
mismatch detector uses for it (``MismatchThresholds``), as a strength (1 = at the threshold):

| cause | figure | threshold |
| --- | --- | --- |
| ``pcie_load`` | link utilisation (typical tick: upper median), busier direction, of the effective ceiling | ``io_saturated_link`` |
| ``host_staging`` | host CPU busy; PSI cpu some; the workload's feeder thread busy, its run-queue wait, its cgroup's CPU pressure (means); the pageable signature (typical tick: accelerator starved, link between ``staging_link_floor`` and saturation, no pin churn; with per-workload series only while a workload keeps ``host_copy_cores`` busy, as the detector) | ``cpu_busy``, ``cpu_pressure``, ``feeder_busy``, ``cpu_wait``, ``workload_cpu_pressure``; the signature counts 1 |
| ``numa_locality`` | the workload's CPU time off its accelerator's local CPUs, its host pages off its NUMA node (1 - the ``*_local_ratio`` means) | ``numa_remote`` |
| ``dma_mapping`` | DMA maps/s on the accelerators' own devices (pin churn); the pageable signature when pin churn explains it | ``pin_churn_rate`` |
| ``network`` | TCP retransmits/s | ``retransmit_rate`` |
| ``host_memory`` / ``host_io`` | PSI memory / io some | ``cpu_pressure`` |
| ``gpu_health`` | XID errors, a GPU lost, thermal or hardware slowdown bits (not the power cap), temperature, NPU alarm | any / ``GPU_HOT_C`` |
| ``pcie_errors`` / ``iommu_faults`` | AER errors, replays, a degraded link / IOMMU faults, DMA map errors | any |
| ``agent`` | collector down, store write errors, dropped samples (``noise.agent_trouble``; context, not a ranked cause) | any |

A host busy feeding a link that is busy with DMA is load, not the limit: with the link at
``LINK_BUSY_SHARE`` of its ceiling or more the host figures (its CPU, its feeders, pin churn) are
capped at ``LIMIT_FLOOR``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.episodes import NODE
from triscope.analysis.features import (
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    WORKLOAD_CPU,
    WORKLOAD_CPU_LOCAL,
    WORKLOAD_CPU_PRESSURE,
    WORKLOAD_CPU_WAIT,
    WORKLOAD_FEEDER,
    WORKLOAD_MEM_LOCAL,
    buses_of_gpus,
    effective_ceiling,
    link_ids,
    negotiated_capacity,
    own_dma_series,
)
from triscope.analysis.mismatch import busier_direction
from triscope.analysis.mismatch_inputs import link_facts_from
from triscope.analysis.rca.noise import agent_trouble, throttle_faults
from triscope.analysis.reader import SeriesPoints, label_name
from triscope.core.vocabulary import accelerator_name

LIMIT_FLOOR = 0.25         # what a suspect far from its limit keeps of its relative score
GPU_HOT_C = 85.0           # GPU temperature that counts as a health figure (H100/H200 slow down near 87-90 C)
LINK_BUSY_SHARE = 0.5
"""A link carrying at least this share of its ceiling (typical tick) is busy with DMA from pinned
memory more than half the time: the driver stages pageable copies at about 40 % of the pinned rate
(23-24 of 57-60 GB/s on the H200, DESIGN.md), so traffic past that is DMA at full rate, and its
share of the ceiling is at least the share of the time the link is busy.  A starved accelerator
then waits on its copies more than on anything else: the link's ``link_busy`` figure is at its
threshold here, and the host side (its CPU, its feeders, pin churn) is load, not the limit: its
figures are capped at ``LIMIT_FLOOR``, and the pageable signature stops here.  (The detector's
``io_saturated_link``, 75 %, still decides the ``io-saturated`` state.)"""
FEEDER, WAIT, WL_PRESSURE = WORKLOAD_FEEDER, WORKLOAD_CPU_WAIT, WORKLOAD_CPU_PRESSURE


@dataclass(slots=True)
class Figure:
    cause: str
    name: str
    value: float
    threshold: float
    strength: float
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"type": "absolute", "figure": self.name, "value": _r(self.value), "threshold": _r(self.threshold),
                "strength": round(self.strength, 3), "detail": self.detail}


def _r(x: float) -> float:
    return x if x == 0 or not math.isfinite(x) else float(f"{x:.4g}")


def _mean(sp: SeriesPoints, a: float, b: float) -> float | None:
    i, j = bisect.bisect_left(sp.ts, a), bisect.bisect_left(sp.ts, b)
    vals = [v for v in sp.values[i:j] if v == v]
    return sum(vals) / len(vals) if vals else None


def _typical(sp: SeriesPoints, a: float, b: float) -> float | None:
    """The upper median over [a, b): the episode's typical tick, as the detector decides states (an
    episode that starts on a ramp is judged on what it mostly was)."""
    vals = sorted(_values(sp, a, b))
    return vals[len(vals) // 2] if vals else None


def _values(sp: SeriesPoints, a: float, b: float) -> list[float]:
    i, j = bisect.bisect_left(sp.ts, a), bisect.bisect_left(sp.ts, b)
    return [v for v in sp.values[i:j] if v == v]


@dataclass(slots=True)
class EvidenceContext:
    """The node's series indexed once for every episode's figures."""

    by_metric: dict[str, list[SeriesPoints]]
    events: Sequence[Any]
    th: MismatchThresholds
    busy: dict[str, SeriesPoints] = field(default_factory=dict)         # accelerator -> SM / AICore
    link: dict[str, SeriesPoints] = field(default_factory=dict)         # accelerator -> busier PCIe direction
    ceiling: dict[str, float] = field(default_factory=dict)             # accelerator -> bytes/s
    buses: dict[str, list[str]] = field(default_factory=dict)           # accelerator -> PCI addresses
    own_dma: list[SeriesPoints] = field(default_factory=list)

    @property
    def accelerators(self) -> list[str]:
        return sorted(self.busy)

    def accelerator_of_device(self) -> dict[str, str]:
        return {b: acc for acc, bs in self.buses.items() for b in bs}


def evidence_context(series: Iterable[SeriesPoints], events: Sequence[Any], th: MismatchThresholds) -> EvidenceContext:
    by_metric: dict[str, list[SeriesPoints]] = {}
    for sp in series:
        by_metric.setdefault(sp.metric, []).append(sp)
    ctx = EvidenceContext(by_metric, events, th)
    gpu_buses = buses_of_gpus(sp.labels for sp in by_metric.get(GPU_INFO, ()))
    for gpu, bs in gpu_buses.items():
        ctx.buses[f"gpu={gpu}"] = list(bs)
    for sp in by_metric.get("triscope_npu_info", ()):
        acc = accelerator_name(sp.labels)
        if acc and sp.labels.get("bus_id"):
            ctx.buses.setdefault(acc, []).append(sp.labels["bus_id"])
    for sp in by_metric.get(GPU_BUSY, []) + by_metric.get(NPU_BUSY, []):
        acc = accelerator_name(sp.labels)
        if acc:
            ctx.busy[acc] = sp
    rx = {label_name(sp.labels): sp for sp in by_metric.get(PCIE_RX, ())}
    tx = {label_name(sp.labels): sp for sp in by_metric.get(PCIE_TX, ())}
    facts = link_facts_from(by_metric)
    for acc, sp in ctx.busy.items():
        name = label_name({k: v for k, v in sp.labels.items() if k in ("gpu", "npu", "chip")})
        merged = busier_direction(rx.get(name), tx.get(name))
        if merged is None:
            continue
        ctx.link[acc] = merged
        observed = max((v for v in merged.values if v == v), default=0.0)
        ctx.ceiling[acc] = effective_ceiling(negotiated_capacity(link_ids(sp.labels, gpu_buses), facts), observed, th)
    dma = by_metric.get(DMA_MAPS, [])
    own = own_dma_series([sp.labels.get("device") for sp in dma], (b for bs in gpu_buses.values() for b in bs))
    ctx.own_dma = [dma[i] for i in own]
    return ctx


def _sum_means(series: Iterable[SeriesPoints], a: float, b: float) -> float | None:
    out = None
    for sp in series:
        m = _mean(sp, a, b)
        if m is not None:
            out = m if out is None else out + m
    return out


def mine(sp: SeriesPoints, acc: str, ctx: EvidenceContext) -> bool:
    """Whether a series belongs to accelerator ``acc`` (or to the node, which sees every one)."""
    if acc == NODE:
        return True
    own = accelerator_name(sp.labels)
    if own is not None:
        return own == acc
    dev = sp.labels.get("device")
    return dev is None or dev in ctx.buses.get(acc, ()) or dev not in ctx.accelerator_of_device()


class _Figures:
    """The figures of one accelerator over [a, b), built family by family (``figures``)."""

    def __init__(self, ctx: EvidenceContext, acc: str, a: float, b: float) -> None:
        self.ctx, self.acc, self.a, self.b, self.th = ctx, acc, a, b, ctx.th
        self.out: dict[str, list[Figure]] = {}

    def add(self, cause: str, name: str, value: float | None, threshold: float, detail: str,
            strength: float | None = None) -> None:
        if value is None or threshold <= 0 and strength is None:
            return
        s = strength if strength is not None else value / threshold
        self.out.setdefault(cause, []).append(Figure(cause, name, value, threshold, s, detail))

    def means(self, metric: str) -> list[float]:
        """The means over [a, b) of the accelerator's series of ``metric``."""
        return [m for sp in self.ctx.by_metric.get(metric, ()) if mine(sp, self.acc, self.ctx)
                for m in [_mean(sp, self.a, self.b)] if m is not None]

    def link(self) -> tuple[tuple[float, str] | None, float | None]:
        """(the busiest link's typical utilisation and its text, the least busy accelerator's typical busy)."""
        ctx, a, b = self.ctx, self.a, self.b
        utils: list[tuple[float, str]] = []
        busies: list[float] = []
        for x in ctx.accelerators if self.acc == NODE else [self.acc]:
            bm = _typical(ctx.busy[x], a, b) if x in ctx.busy else None
            if bm is not None:
                busies.append(bm)
            lk, cap = ctx.link.get(x), ctx.ceiling.get(x)
            lm = _typical(lk, a, b) if lk is not None else None
            if lm is not None and cap:
                utils.append((lm / cap, f"{x}: {lm / 1e9:.1f} GB/s of {cap / 1e9:.1f} GB/s"))
        return (max(utils) if utils else None), (min(busies) if busies else None)

    def host_side(self, cause: str, name: str, value: float | None, threshold: float, detail: str,
                  busy_link: bool, strength: float | None = None) -> None:
        """A figure of the host side (staging, pinning): load, not the limit, while the link is busy
        with DMA (``LINK_BUSY_SHARE``): capped at ``LIMIT_FLOOR``."""
        if value is None:
            return
        s = strength if strength is not None else (value / threshold if threshold > 0 else 0.0)
        if busy_link and s > LIMIT_FLOOR:
            s = LIMIT_FLOOR
            detail += " (the link is busy with DMA: the host keeps up, this is load)"
        self.add(cause, name, value, threshold, detail, strength=s)

    def staging(self, util: tuple[float, str] | None, busy: float | None) -> None:
        """Pin churn, the pageable signature, the host's CPU and the workloads' feeders."""
        th = self.th
        busy_link = util is not None and util[0] >= LINK_BUSY_SHARE
        dma = _sum_means([sp for sp in self.ctx.own_dma if mine(sp, self.acc, self.ctx)], self.a, self.b)
        churn = dma is not None and dma >= th.pin_churn_rate
        self.host_side("dma_mapping", "dma_maps_per_second", dma, th.pin_churn_rate,
                       f"{dma or 0:.1f} DMA maps/s on the accelerators' devices; pin churn from {th.pin_churn_rate:g}/s",
                       busy_link)
        starved = busy is not None and busy < th.starved_busy
        feeders = any(mine(sp, self.acc, self.ctx) for m in (FEEDER, WAIT) for sp in self.ctx.by_metric.get(m, ()))
        cores = self.means(WORKLOAD_CPU)
        # with per-workload series the signature also needs a workload doing the copies' CPU work (as the detector)
        fed = not feeders or (th.host_copy_cores > 0 and bool(cores) and max(cores) >= th.host_copy_cores)
        if starved and fed and util is not None and th.staging_link_floor <= util[0] < LINK_BUSY_SHARE:
            by = f", a workload keeping {max(cores):.2f} cores busy" if feeders else ""
            self.add("dma_mapping" if churn else "host_staging", "pageable_signature", util[0], LINK_BUSY_SHARE,
                     f"accelerator starved (busy {busy:.0%}) while the link carries only {util[0]:.0%} of its "
                     f"ceiling{by}: " + ("pinning host memory per transfer" if churn else
                                         "the host stages the copies (pageable memory)"), strength=1.0)
        psi = self.psi()
        host: list[tuple[str, float | None, float, str]] = [
            ("cpu_busy", _sum_means(self.ctx.by_metric.get(CPU_BUSY, []), self.a, self.b), th.cpu_busy,
             "host CPU busy {v:.0%}"),
            ("cpu_pressure", psi.get("cpu"), th.cpu_pressure, "PSI cpu some {v:.0%}")]
        for metric, name, thr, text in ((FEEDER, "feeder_busy", th.feeder_busy,
                                         "the busiest feeder thread at {v:.0%} of a core"),
                                        (WAIT, "cpu_wait", th.cpu_wait,
                                         "the workload's threads wait for a CPU {v:.0%} of the time"),
                                        (WL_PRESSURE, "workload_cpu_pressure", th.workload_cpu_pressure,
                                         "the workload's cgroup CPU pressure {v:.0%}")):
            vals = self.means(metric)
            host.append((name, max(vals) if vals else None, thr, text))
        for name, v, thr, text in host:
            if v is not None:
                self.host_side("host_staging", name, v, thr, text.format(v=v), busy_link)
        self.numa(cores)

    def psi(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for sp in self.ctx.by_metric.get(PRESSURE, ()):
            if sp.labels.get("kind", "some") != "some":
                continue
            m = _mean(sp, self.a, self.b)
            if m is not None:
                res = sp.labels.get("resource", "")
                out[res] = max(m, out.get(res, 0.0))
        return out

    def numa(self, cores: list[float]) -> None:
        th = self.th
        if th.numa_remote <= 0 or (cores and max(cores) < th.numa_min_cores):
            return          # an idle workload's placement is no feeder's (as the detector)
        for metric, name, what in ((WORKLOAD_CPU_LOCAL, "cpu_remote", "runs {v:.0%} of its CPU time"),
                                   (WORKLOAD_MEM_LOCAL, "memory_remote", "keeps {v:.0%} of its host pages")):
            local = self.means(metric)
            if local:
                v = 1.0 - min(local)
                self.add("numa_locality", name, v, th.numa_remote,
                         f"the workload {what.format(v=v)} off its accelerator's NUMA node: its copies cross the "
                         "socket link")

    def others(self) -> None:
        """Memory and I/O pressure, retransmits, health, the agent."""
        th, ctx = self.th, self.ctx
        psi = self.psi()
        self.add("host_memory", "memory_pressure", psi.get("memory"), th.cpu_pressure,
                 f"PSI memory some {psi.get('memory', 0):.0%}")
        self.add("host_io", "io_pressure", psi.get("io"), th.cpu_pressure, f"PSI io some {psi.get('io', 0):.0%}")
        rtx = _sum_means(ctx.by_metric.get(RETRANSMITS, []), self.a, self.b)
        self.add("network", "retransmits_per_second", rtx, th.retransmit_rate,
                 f"{rtx or 0:.1f} TCP retransmits/s; network-bound from {th.retransmit_rate:g}/s")
        _health_figures(ctx, self.acc, self.a, self.b, self.add)
        trouble = agent_trouble([sp for m in AGENT_TROUBLE_METRICS for sp in ctx.by_metric.get(m, ())],
                                ctx.events, self.a, self.b)
        if trouble:
            self.add("agent", "agent_trouble", float(len(trouble)), 1.0, "; ".join(trouble[:4]), strength=1.0)


AGENT_TROUBLE_METRICS = ("triscope_collector_up", "triscope_store_write_errors_total", "triscope_dropped_samples_total",
                         "triscope_probe_lost_events_total", "triscope_spool_pending_samples")


def figures(ctx: EvidenceContext, acc: str, a: float, b: float) -> dict[str, list[Figure]]:
    """cause key -> its figures over [a, b) for accelerator ``acc`` (``node``: every accelerator,
    the worst one counting)."""
    f = _Figures(ctx, acc, a, b)
    util, busy = f.link()
    th = ctx.th
    if util is not None:
        f.add("pcie_load", "link_util", util[0], th.io_saturated_link,
              f"link at {util[0]:.0%} of its ceiling ({util[1]}); io-saturated from {th.io_saturated_link:.0%}")
        if busy is not None and busy < th.starved_busy:
            f.add("pcie_load", "link_busy", util[0], LINK_BUSY_SHARE,
                  f"the accelerator starves (busy {busy:.0%}) while its link carries {util[0]:.0%} of its ceiling: "
                  f"past {LINK_BUSY_SHARE:.0%} that is DMA at full rate more than half the time, the copies are "
                  "what it waits on")
    f.staging(util, busy)
    f.others()
    return f.out


def _health_figures(ctx: EvidenceContext, acc: str, a: float, b: float, add: Any) -> None:
    def series(metric: str) -> list[SeriesPoints]:
        return [sp for sp in ctx.by_metric.get(metric, ()) if mine(sp, acc, ctx)]

    xid = _sum_means(series("triscope_gpu_xid_errors_total"), a, b)
    if xid:
        add("gpu_health", "xid_errors_per_second", xid, 0.0, f"XID errors ({xid:.2g}/s)", strength=2.0)
    for sp in series("triscope_gpu_up"):
        vals = _values(sp, a, b)
        if vals and min(vals) < 0.5:
            add("gpu_health", "gpu_lost", 0.0, 1.0, f"{accelerator_name(sp.labels)} stopped answering NVML", strength=2.0)
    for sp in series("triscope_gpu_throttle_reasons"):
        share, names = throttle_faults(_values(sp, a, b))
        if names:
            add("gpu_health", "throttle_faults", share, 0.2,
                f"{accelerator_name(sp.labels)} slowed down by {', '.join(names)} in {share:.0%} of ticks "
                "(the power cap is not counted)")
    for metric in ("triscope_gpu_temperature_celsius", "triscope_npu_temperature_celsius"):
        for sp in series(metric):
            vals = _values(sp, a, b)
            if vals and max(vals) >= 0.9 * GPU_HOT_C:
                add("gpu_health", "temperature", max(vals), GPU_HOT_C,
                    f"{accelerator_name(sp.labels)} at {max(vals):.0f} C")
    for sp in series("triscope_npu_health"):
        vals = _values(sp, a, b)
        if vals and max(vals) >= 1:
            add("gpu_health", "npu_health", max(vals), 2.0, f"{accelerator_name(sp.labels)} health {max(vals):.0f}")
    _error_figures(ctx, acc, a, b, add)


def _error_figures(ctx: EvidenceContext, acc: str, a: float, b: float, add: Any) -> None:
    """PCIe AER errors, replays, IOMMU faults, DMA map errors, a degraded link."""
    def series(metric: str) -> list[SeriesPoints]:
        return [sp for sp in ctx.by_metric.get(metric, ()) if mine(sp, acc, ctx)]

    for metric, cause, what in (("triscope_pcie_aer_errors_total", "pcie_errors", "PCIe AER errors"),
                                ("triscope_gpu_pcie_replays_total", "pcie_errors", "PCIe replays"),
                                ("triscope_iommu_page_faults_total", "iommu_faults", "IOMMU page faults"),
                                ("triscope_dma_map_errors_total", "iommu_faults", "DMA map errors")):
        r = _sum_means(series(metric), a, b)
        if r:
            add(cause, metric.removeprefix("triscope_").removesuffix("_total") + "_per_second", r, 0.0,
                f"{what} ({r:.2g}/s)", strength=1.5)
    for sp in series("triscope_pcie_link_degraded"):
        vals = _values(sp, a, b)
        if vals and sum(1 for v in vals if v >= 0.5) >= 0.5 * len(vals):
            add("pcie_errors", "link_degraded", 1.0, 1.0,
                f"link {sp.labels.get('device', '?')} below its maximum speed or width while in use", strength=1.0)


ABS_MIN = 0.5
ABS_CAP = 1.5
LOAD_FAMILIES = frozenset({"pcie_load", "host_staging", "dma_mapping", "network", "host_memory", "host_io"})
FAULT_FAMILIES = frozenset({"gpu_health", "pcie_errors", "iommu_faults"})


def absolute_part(strength: float | None) -> float:
    """A family's absolute part from its strongest figure: past its threshold (the detector's own
    bar) from 1 towards ``ABS_CAP``, the further past the more (``1 + (ABS_CAP - 1) (1 - 1/s)``: two
    families past their limits keep their order, neither drowns what moved); between ``ABS_MIN``
    and the threshold only what it exceeds ``ABS_MIN`` by (supporting evidence, at most 0.5);
    below, nothing."""
    if strength is None or strength < ABS_MIN:
        return 0.0
    if strength >= 1.0:
        return 1.0 + (ABS_CAP - 1.0) * (1.0 - 1.0 / strength)
    return strength - ABS_MIN


def limit_factor(key: str, strength: float | None) -> float:
    """What a family keeps of its relative score (what moved against a reference): its strength
    (at least ``LIMIT_FLOOR``, at most 1) for a family with a figure; ``LIMIT_FLOOR`` for a fault
    family without one; nothing for the agent while it was healthy; everything for symptoms."""
    if key == "agent":
        return 1.0 if strength else 0.0
    if key in FAULT_FAMILIES:
        return max(LIMIT_FLOOR, min(1.0, strength or 0.0))
    if key in LOAD_FAMILIES and strength is not None:
        return max(LIMIT_FLOOR, min(1.0, strength))
    return 1.0
