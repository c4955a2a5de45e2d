"""The mismatch detector's features, built by one function from one input shape.

``window_features(WindowValues)`` turns one window of per-metric values (each accelerator's busy
and busier-direction PCIe rate per tick, its workloads' series, host CPU busy, PSI, DMA-map and
retransmit rates per series) into the ``WindowFeatures`` the classifier decides on: means (the
score; host, workload, DMA and network evidence), upper medians (the state: always one of the
window's own ticks), coverage (share of the window's ticks with accelerator data), the link
ceiling, each accelerator's dominant workload.  Both the per-tick tracker
(``triscope.analysis.online.MismatchTracker``, over its sliding window of ticks) and the
stored-window classifier (``triscope.analysis.mismatch.window_states``, over windows cut from
stored series) build their features here, so they cannot drift apart.

Also here, shared by both: which series are detector inputs (metric names), the link ceiling
(``effective_ceiling``), the negotiated capacity from link facts (``negotiated_capacity``), and
which DMA-map series belong to the accelerators (``own_dma_series``, ``dma_series_by_accelerator``),
and which accelerator and workload a per-workload series is about (``accelerator_key``,
``workload_key``; docs/workloads.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from triscope.analysis.config import MismatchThresholds
from triscope.core.pcie import link_capacity_bytes_per_second
from triscope.core.vocabulary import (  # noqa: F401 - the vocabulary, re-exported for analysis's callers
    ACCELERATOR_LABELS,
    NO_WORKLOAD,
    WORKLOAD_LABELS,
    WorkloadKey,
    accelerator_labels,
    workload_key,
    workload_labels,
)

# metric names the detector reads
GPU_BUSY = "triscope_gpu_sm_active_ratio"
NPU_BUSY = "triscope_npu_aicore_utilization_ratio"
PCIE_RX = "triscope_gpu_pcie_rx_bytes_total"
PCIE_TX = "triscope_gpu_pcie_tx_bytes_total"
LINK_CAPACITY = ("triscope_gpu_pcie_link_capacity_bytes_per_second", "triscope_pcie_link_capacity_bytes_per_second")
LINK_SPEED = ("triscope_gpu_pcie_link_speed_gts", "triscope_pcie_link_speed_gts")
LINK_WIDTH = ("triscope_gpu_pcie_link_width", "triscope_pcie_link_width")
GPU_INFO = "triscope_gpu_info"
CPU_BUSY = "triscope_cpu_busy_ratio"
PRESSURE = "triscope_pressure_ratio"
DMA_MAPS = "triscope_dma_map_total"
RETRANSMITS = "triscope_tcp_retransmits_total"
# per-workload series (docs/workloads.md section 1): accelerator labels + workload labels
WORKLOAD_INFO = "triscope_accelerator_workload_info"
WORKLOAD_PROCESSES = "triscope_workload_processes"
WORKLOAD_SM = "triscope_workload_sm_ratio"
WORKLOAD_FEEDER = "triscope_workload_feeder_busy_ratio"
WORKLOAD_CPU_WAIT = "triscope_workload_cpu_wait_ratio"
WORKLOAD_CPU_PRESSURE = "triscope_workload_cpu_pressure_ratio"
WORKLOAD_CPU = "triscope_workload_cpu_seconds_total"       # a counter: read as cores (CPU seconds per second)
# CFS bandwidth control of the workload's cgroup (cpu.stat): enforcement periods and throttled ones
WORKLOAD_CPU_PERIODS = "triscope_workload_cpu_periods_total"
WORKLOAD_CPU_THROTTLED = "triscope_workload_cpu_throttled_periods_total"
# the workload's own TCP sockets: segments they retransmitted and segments they sent
WORKLOAD_TCP_RETRANSMITS = "triscope_workload_tcp_retransmits_total"
WORKLOAD_TCP_SEGMENTS = "triscope_workload_tcp_segments_sent_total"
# ... and on the way in: packets that arrived after a gap (the peer retransmits them), data segments received
WORKLOAD_TCP_OOO_IN = "triscope_workload_tcp_out_of_order_received_total"
WORKLOAD_TCP_SEGMENTS_IN = "triscope_workload_tcp_data_segments_received_total"
# where it runs: the share of its CPU time on its accelerator's local CPUs, of its pages on its NUMA node
WORKLOAD_CPU_LOCAL = "triscope_workload_cpu_local_ratio"
WORKLOAD_MEM_LOCAL = "triscope_workload_memory_local_ratio"
WORKLOAD_ALLOWED_LOCAL = "triscope_workload_cpus_allowed_local_ratio"
# wait-for (docs/waitfor.md): the workload's driving threads on the accelerator, where their time
# went and where the chain of waits from them ends
WAIT_DRIVER = "triscope_workload_driver_seconds_total"
WAIT_CHAIN = "triscope_workload_wait_chain_seconds_total"
WAIT_SERVICE = "triscope_workload_service_chain_seconds_total"
WAIT_THREADS = "triscope_workload_driver_threads"
WAIT_REQUESTS = "triscope_workload_requests_wait_seconds_total"
WAIT_WAITED_ON = "triscope_workload_driver_waited_on_seconds_total"
CHAIN_LABELS = ("cause", "relation", "culprit", "culprit_namespace", "culprit_pod", "culprit_container",
                "culprit_workload")
ChainKey = tuple[str, str, str, str, str, str, str]
"""(cause, relation, culprit, culprit namespace, pod, container, workload) of a chain series."""
WAIT_CONNECTION = {"triscope_workload_wait_connection_retransmits_total": "retransmits",
                   "triscope_workload_wait_connection_segments_sent_total": "segments",
                   "triscope_workload_wait_connection_ooo_received_total": "ooo_in",
                   "triscope_workload_wait_connection_segments_received_total": "segments_in"}
WAIT_KEYED: dict[str, tuple[str, tuple[str, ...], bool]] = {
    WAIT_DRIVER: ("driver", ("state",), True),
    WAIT_CHAIN: ("chain", CHAIN_LABELS, True),
    WAIT_SERVICE: ("service", CHAIN_LABELS, True),
    WAIT_THREADS: ("driver_threads", ("found_by",), False),
    **{m: ("conn", ("culprit",), True) for m in WAIT_CONNECTION},
}
"""Per-workload series with labels of their own: metric -> (``WorkloadWindow`` dict field, the labels
keying it, counter?).  A connection series is keyed by (culprit, which counter)."""
WORKLOAD_FIELDS: dict[str, str | None] = {
    WORKLOAD_INFO: None, WORKLOAD_PROCESSES: "processes", WORKLOAD_SM: "sm", WORKLOAD_FEEDER: "feeder",
    WORKLOAD_CPU_WAIT: "cpu_wait", WORKLOAD_CPU_PRESSURE: "cpu_pressure", WORKLOAD_CPU: "cores",
    WORKLOAD_CPU_PERIODS: "periods", WORKLOAD_CPU_THROTTLED: "throttled",
    WORKLOAD_TCP_RETRANSMITS: "retransmits", WORKLOAD_TCP_SEGMENTS: "segments",
    WORKLOAD_TCP_OOO_IN: "ooo_in", WORKLOAD_TCP_SEGMENTS_IN: "segments_in",
    WORKLOAD_CPU_LOCAL: "cpu_local", WORKLOAD_MEM_LOCAL: "mem_local", WORKLOAD_ALLOWED_LOCAL: "allowed_local",
    WAIT_REQUESTS: "requests_wait", WAIT_WAITED_ON: "waited_on"}
"""Per-workload metric -> its ``WorkloadWindow`` field (the info series only says the workload is there)."""
WORKLOAD_COUNTER_FIELDS = frozenset({"cores", "periods", "throttled", "retransmits", "segments", "ooo_in",
                                     "segments_in", "requests_wait", "waited_on"})
"""Fields read from counters: per-second rates (the tracker's consecutive ticks, the store's rate read)."""
WORKLOAD_METRICS = (*WORKLOAD_FIELDS, *WAIT_KEYED)
GPU_UTIL = "triscope_gpu_utilization_ratio"   # NVML: share of time a kernel ran (copies count as busy)
INPUT_METRICS = (GPU_BUSY, NPU_BUSY, GPU_UTIL, PCIE_RX, PCIE_TX, CPU_BUSY, PRESSURE, DMA_MAPS, RETRANSMITS,
                 *LINK_CAPACITY, *LINK_SPEED, *LINK_WIDTH, *WORKLOAD_METRICS)
OTHER_WORKLOAD = "other"     # the agent's sum of the workloads past max_workloads_per_accelerator
# link fact metrics by kind, each tuple in order of preference
LINK_FACT_METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (("speed", LINK_SPEED), ("width", LINK_WIDTH),
                                                              ("cap", LINK_CAPACITY))


# ---------------------------------------------------------------------------------------------- features
@dataclass(slots=True, frozen=True)
class WaitEvidence:
    """Where one workload's driving threads' time went over a window (docs/waitfor.md): shares of
    their thread-seconds, first hop (``states``) and followed along the chain of waits to where it
    ends (``chain``); the seconds behind those shares; demand (``requests_wait``: its threads'
    seconds per second waiting for requests; ``waited_on``: its other threads' seconds per second
    waiting on its driving threads); the network culprits' connections (per second: retransmits,
    segments, ooo_in, segments_in)."""

    seconds: float
    states: dict[str, float]
    chain: dict[ChainKey, float]
    requests_wait: float | None = None
    waited_on: float | None = None
    found_by: str = ""
    connections: dict[str, dict[str, float]] = field(default_factory=dict)
    service: dict[ChainKey, float] = field(default_factory=dict)   # the request path's shares
    service_seconds: float = 0.0                                    # ... and its seconds

    def connection_loss(self, culprit: str) -> tuple[float | None, float | None]:
        """(its own segments retransmitted over segments sent, out-of-order arrivals over data
        segments received) of a network culprit's connection; None where not known."""
        c = self.connections.get(culprit)
        if not c:
            return None, None
        out = c["retransmits"] / c["segments"] if c.get("segments", 0) > 0 and "retransmits" in c else None
        inn = min(1.0, c["ooo_in"] / c["segments_in"]) if c.get("segments_in", 0) > 0 and "ooo_in" in c else None
        return out, inn


def wait_subkey(metric: str, labels: Mapping[str, str]) -> tuple[str, ...]:
    """A keyed wait-for series' key inside its field (``WAIT_KEYED``): its own labels' values; a
    connection series' (culprit, counter)."""
    _fld, names, _counter = WAIT_KEYED[metric]
    key = tuple(labels.get(n, "") for n in names)
    if metric in WAIT_CONNECTION:
        return (key[0], WAIT_CONNECTION[metric])
    return key


def wait_evidence(w: WorkloadWindow) -> WaitEvidence | None:
    """A workload's ``WaitEvidence`` from its window's series; None without driving-thread series."""
    totals = {k[0]: sum(v) for k, v in w.driver.items() if v}
    seconds = sum(totals.values())
    if seconds <= 0:
        return None
    chain = {k: sum(v) for k, v in w.chain.items() if v}
    csum = sum(chain.values())
    found = max(((sum(v), k[0]) for k, v in w.driver_threads.items() if v), default=(0.0, ""))[1]
    conns: dict[str, dict[str, float]] = {}
    for (culprit, which), vals in w.conn.items():
        m = mean(vals)
        if m is not None:
            conns.setdefault(culprit, {})[which] = m
    service = {k: sum(v) for k, v in w.service.items() if v}
    ssum = sum(service.values())
    return WaitEvidence(seconds, {k: v / seconds for k, v in totals.items()},
                        {k: v / csum for k, v in chain.items()} if csum > 0 else {},  # type: ignore[misc]
                        mean(w.requests_wait), mean(w.waited_on), found, conns,
                        {k: v / ssum for k, v in service.items()} if ssum > 0 else {}, ssum)  # type: ignore[misc]


@dataclass(slots=True, frozen=True)
class WorkloadEvidence:
    """One workload's host and network evidence on one accelerator over one window (window means,
    counters as per-second rates).  ``None``: no such series in the window."""

    key: WorkloadKey
    feeder: float | None = None          # its busiest thread's share of a core
    cpu_wait: float | None = None        # run-queue wait over (run + wait) of its threads
    cpu_pressure: float | None = None    # its cgroup's cpu.pressure some avg10
    cores: float | None = None           # CPU seconds per second of its whole process set
    periods: float | None = None         # CFS enforcement periods per second (its cgroup has a CPU limit)
    throttled_periods: float | None = None   # ... of which throttled, per second
    retransmits: float | None = None     # its own sockets' retransmitted segments per second
    segments: float | None = None        # ... segments sent per second
    ooo_in: float | None = None          # packets its sockets received out of order (after a gap) per second
    segments_in: float | None = None     # ... data segments received per second
    cpu_local: float | None = None       # share of its CPU time on its accelerator's local CPUs
    mem_local: float | None = None       # share of its host pages on its accelerator's NUMA node
    allowed_local: float | None = None   # share of the CPUs it may run on that are local (0: pinned away)
    wait: WaitEvidence | None = None     # what its driving threads waited on (wait-for probes)

    @property
    def throttled(self) -> float | None:
        """Share of its CFS periods throttled (``None``: no CPU limit, or no period in the window)."""
        if self.periods is None or self.throttled_periods is None or self.periods <= 0:
            return None
        return min(1.0, self.throttled_periods / self.periods)

    @property
    def loss(self) -> float | None:
        """Its retransmitted segments over segments sent (``None``: no TCP series, or nothing sent)."""
        if self.retransmits is None or self.segments is None or self.segments <= 0:
            return None
        return self.retransmits / self.segments

    @property
    def loss_in(self) -> float | None:
        """Packets its sockets received out of order over data segments received: loss on the way in,
        which the peer retransmits (``None``: no such series, or nothing received)."""
        if self.ooo_in is None or self.segments_in is None or self.segments_in <= 0:
            return None
        return min(1.0, self.ooo_in / self.segments_in)

    @property
    def has_host(self) -> bool:
        return self.feeder is not None or self.cpu_wait is not None or self.cpu_pressure is not None

    @property
    def has_tcp(self) -> bool:
        return self.retransmits is not None and self.segments is not None


@dataclass(slots=True)
class AcceleratorFeatures:
    """One accelerator over one window.  ``None``: no data."""

    name: str                               # "gpu=0", "npu=1,chip=0"
    busy: float | None                      # mean SM activity / AICore utilisation, 0..1
    link_bytes_per_second: float | None = None  # mean of the busier PCIe direction
    link_ceiling: float | None = None       # effective one-way ceiling, bytes/s
    coverage: float = 1.0                   # share of the window's ticks with busy data
    # the window's typical (median) tick: what the state is decided on, so a window that straddles
    # a change (half idle, half pinned copies) takes one side instead of a made-up middle; the
    # means above give the score (share of time lost).  None: use the means.
    busy_typical: float | None = None
    link_typical_bytes_per_second: float | None = None
    # DMA maps/s on the accelerator's own PCI device(s); None: not told apart, the node's rate counts
    dma_map_rate: float | None = None
    # NVML utilisation (share of time a kernel ran; copies count too), mean and median; None: no series
    util: float | None = None
    util_typical: float | None = None
    # per-workload evidence, the highest window mean over the accelerator's workloads (None: no such
    # series: a recording or agent without per-workload evidence) and whose it is
    feeder_busy: float | None = None
    cpu_wait: float | None = None
    cpu_pressure: float | None = None
    feeder_of: WorkloadKey | None = None
    cpu_wait_of: WorkloadKey | None = None
    cpu_pressure_of: WorkloadKey | None = None
    workload: WorkloadKey = NO_WORKLOAD     # the dominant workload (docs/workloads.md section 2)
    workloads: int = 0                      # workloads seen on the accelerator in the window
    # each workload's own evidence over the window
    per_workload: list[WorkloadEvidence] = field(default_factory=list)
    # each workload's cores (CPU seconds per second of its processes, window mean), shared equally among
    # the accelerators it is on in the window (``window_features``); empty: no series
    workload_cores: dict[WorkloadKey, float] = field(default_factory=dict)

    @property
    def has_workload_evidence(self) -> bool:
        return (self.feeder_busy is not None or self.cpu_wait is not None or self.cpu_pressure is not None
                or any(w.has_host or w.throttled is not None for w in self.per_workload))

    @property
    def has_workload_tcp(self) -> bool:
        """The agent attributed TCP sockets to this accelerator's workloads in the window."""
        return any(w.has_tcp for w in self.per_workload)

    @property
    def has_waitfor(self) -> bool:
        """Some workload on it has wait-for evidence (its driving threads traced) in the window."""
        return any(w.wait is not None for w in self.per_workload)

    @property
    def link_util(self) -> float | None:
        if self.link_bytes_per_second is None or not self.link_ceiling:
            return None
        return min(1.5, self.link_bytes_per_second / self.link_ceiling)

    @property
    def link_util_typical(self) -> float | None:
        if self.link_typical_bytes_per_second is None:
            return self.link_util
        if not self.link_ceiling:
            return None
        return min(1.5, self.link_typical_bytes_per_second / self.link_ceiling)


@dataclass(slots=True)
class WindowFeatures:
    """Everything the classifier looks at for one window of one node."""

    accelerators: list[AcceleratorFeatures]
    cpu_busy: float | None = None           # 0..1, all CPUs
    pressure: float | None = None           # max of PSI cpu/memory "some" avg10, 0..1
    dma_map_rate: float | None = None       # DMA maps/s, the accelerators' devices
    retransmit_rate: float | None = None    # TCP retransmits/s, node-wide (every process's)


# ---------------------------------------------------------------------------------------------- input shape
@dataclass(slots=True)
class WorkloadWindow:
    """One workload's series on one accelerator over one window, one value per tick (counters as
    per-second rates)."""

    key: WorkloadKey
    last_ts: float                          # its newest point in the window (any of its series)
    sm: Sequence[float] = ()                # triscope_workload_sm_ratio
    processes: Sequence[float] = ()         # triscope_workload_processes
    feeder: Sequence[float] = ()            # triscope_workload_feeder_busy_ratio
    cpu_wait: Sequence[float] = ()          # triscope_workload_cpu_wait_ratio
    cpu_pressure: Sequence[float] = ()      # triscope_workload_cpu_pressure_ratio
    cores: Sequence[float] = ()             # triscope_workload_cpu_seconds_total, per second
    periods: Sequence[float] = ()           # triscope_workload_cpu_periods_total, per second
    throttled: Sequence[float] = ()         # triscope_workload_cpu_throttled_periods_total, per second
    retransmits: Sequence[float] = ()       # triscope_workload_tcp_retransmits_total, per second
    segments: Sequence[float] = ()          # triscope_workload_tcp_segments_sent_total, per second
    ooo_in: Sequence[float] = ()            # triscope_workload_tcp_out_of_order_received_total, per second
    segments_in: Sequence[float] = ()       # triscope_workload_tcp_data_segments_received_total, per second
    cpu_local: Sequence[float] = ()         # triscope_workload_cpu_local_ratio
    mem_local: Sequence[float] = ()         # triscope_workload_memory_local_ratio
    allowed_local: Sequence[float] = ()     # triscope_workload_cpus_allowed_local_ratio
    requests_wait: Sequence[float] = ()     # triscope_workload_requests_wait_seconds_total, per second
    waited_on: Sequence[float] = ()         # triscope_workload_driver_waited_on_seconds_total, per second
    # keyed wait-for series (WAIT_KEYED), per second: state -> values; ChainKey -> values;
    # found_by -> driving threads; (culprit, counter) -> values
    driver: dict[tuple[str, ...], Sequence[float]] = field(default_factory=dict)
    chain: dict[tuple[str, ...], Sequence[float]] = field(default_factory=dict)
    service: dict[tuple[str, ...], Sequence[float]] = field(default_factory=dict)
    driver_threads: dict[tuple[str, ...], Sequence[float]] = field(default_factory=dict)
    conn: dict[tuple[str, ...], Sequence[float]] = field(default_factory=dict)


@dataclass(slots=True)
class AcceleratorWindow:
    """One accelerator's values over one window, one per tick (finite, in time order)."""

    name: str
    busy: Sequence[float]                   # GPM SM activity / AICore utilisation, 0..1
    link: Sequence[float] | None = None     # busier PCIe direction, bytes/s; None: no PCIe series
    ceiling: float | None = None            # effective one-way ceiling (``effective_ceiling``)
    expected: float = 1.0                   # ticks a full window holds: coverage = len(busy) / expected
    # DMA-map rates of its own PCI device(s), one list per series; None: not told apart (the node's)
    dma_map_rates: Sequence[Sequence[float]] | None = None
    workloads: Sequence[WorkloadWindow] = ()
    util: Sequence[float] | None = None     # NVML utilisation; None: no series


@dataclass(slots=True)
class WindowValues:
    """One window of one node's detector inputs: per-metric values, one per tick.

    Host series come one list per series: CPU busy values are pooled, PSI takes the highest
    series mean (``resource`` cpu or memory, ``kind=some``), DMA-map and retransmit rates sum
    the series means (maps/s of the accelerators' own devices, retransmits/s)."""

    accelerators: list[AcceleratorWindow]
    cpu_busy: Sequence[float] = ()
    pressure: Sequence[Sequence[float]] = ()
    dma_map_rates: Sequence[Sequence[float]] = ()
    retransmit_rates: Sequence[Sequence[float]] = ()


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def upper_median(values: Sequence[float]) -> float | None:
    """The upper median: always one of the values, so a window split half and half takes one
    side rather than the average of both."""
    if not values:
        return None
    return sorted(values)[len(values) // 2]


def _summed_means(per_series: Iterable[Sequence[float]]) -> float | None:
    out: float | None = None
    for vals in per_series:
        m = mean(vals)
        if m is not None:
            out = m if out is None else out + m
    return out


def _highest_mean(per_series: Iterable[Sequence[float]]) -> float | None:
    out: float | None = None
    for vals in per_series:
        m = mean(vals)
        if m is not None and (out is None or m > out):
            out = m
    return out


def _highest_of(workloads: Sequence[WorkloadWindow], attr: str) -> tuple[float | None, WorkloadKey | None]:
    """The highest window mean of one per-workload series over the accelerator's workloads."""
    best: float | None = None
    who: WorkloadKey | None = None
    for w in workloads:
        m = mean(getattr(w, attr))
        if m is not None and (best is None or m > best):
            best, who = m, w.key
    return best, who


def dominant_workload(workloads: Sequence[WorkloadWindow]) -> WorkloadKey:
    """The workload an accelerator's verdict is labelled with: of those on it at the newest tick
    that has any (a workload gone since is left out), the largest mean SM share, else the most
    processes; a named workload before the agent's ``other`` sum; ``NO_WORKLOAD`` when none."""
    if not workloads:
        return NO_WORKLOAD
    end = max(w.last_ts for w in workloads)
    best: tuple[bool, float, float, WorkloadKey] | None = None
    for w in workloads:
        if w.last_ts < end:
            continue
        sm, procs = mean(w.sm), mean(w.processes)
        rank = (w.key[3] != OTHER_WORKLOAD, -1.0 if sm is None else sm, 0.0 if procs is None else procs, w.key)
        if best is None or rank > best:
            best = rank
    return NO_WORKLOAD if best is None else best[3]


def window_features(values: WindowValues) -> WindowFeatures:
    """The features of one window.  Accelerators without busy values in the window are left out
    (no verdict from them); the classifier drops those below ``min_coverage``."""
    node_dma = _summed_means(values.dma_map_rates)
    # a workload's processes are listed under every accelerator they hold, each time with all their
    # CPU: one process driving eight GPUs would count its cores eight times.  Shared equally among
    # them (a pod running one process per GPU is then under-counted: the side that pages no one)
    spread: dict[WorkloadKey, int] = {}
    for a in values.accelerators:
        for w in a.workloads:
            if w.cores:
                spread[w.key] = spread.get(w.key, 0) + 1
    accs: list[AcceleratorFeatures] = []
    for a in values.accelerators:
        if not a.busy:
            continue
        link = a.link or None
        f = AcceleratorFeatures(
            a.name, mean(a.busy), mean(link) if link else None, a.ceiling or None,
            min(1.0, len(a.busy) / max(a.expected, 1.0)), upper_median(a.busy),
            upper_median(link) if link else None,
            dma_map_rate=node_dma if a.dma_map_rates is None else (_summed_means(a.dma_map_rates) or 0.0),
            util=mean(a.util) if a.util else None, util_typical=upper_median(a.util) if a.util else None)
        if a.workloads:
            ws = a.workloads
            f.feeder_busy, f.feeder_of = _highest_of(ws, "feeder")
            f.cpu_wait, f.cpu_wait_of = _highest_of(ws, "cpu_wait")
            f.cpu_pressure, f.cpu_pressure_of = _highest_of(ws, "cpu_pressure")
            f.workload = dominant_workload(ws)
            f.workloads = len(ws)
            f.workload_cores = {w.key: c / spread.get(w.key, 1) for w in ws if (c := mean(w.cores)) is not None}
            f.per_workload = [WorkloadEvidence(w.key, mean(w.feeder), mean(w.cpu_wait), mean(w.cpu_pressure),
                                               f.workload_cores.get(w.key), mean(w.periods), mean(w.throttled),
                                               mean(w.retransmits), mean(w.segments), mean(w.ooo_in),
                                               mean(w.segments_in), mean(w.cpu_local), mean(w.mem_local),
                                               mean(w.allowed_local), wait_evidence(w))
                              for w in ws]
        accs.append(f)
    return WindowFeatures(accs, cpu_busy=mean(values.cpu_busy), pressure=_highest_mean(values.pressure),
                          dma_map_rate=node_dma, retransmit_rate=_summed_means(values.retransmit_rates))


# ---------------------------------------------------------------------------------------------- links
def effective_ceiling(negotiated: float | None, observed_max: float | None, th: MismatchThresholds) -> float:
    """The rate a link can really carry: the negotiated capacity x efficiency, raised to the
    highest rate actually seen on it (links that beat the efficiency estimate), or, with no
    negotiated capacity, the observed maximum (floored) or the configured fallback."""
    obs = observed_max or 0.0
    if negotiated and negotiated > 0:
        return max(negotiated * th.link_efficiency, obs)
    if th.fallback_link_bytes_per_second > 0:
        return max(th.fallback_link_bytes_per_second, obs)
    return max(obs, th.min_ceiling_bytes_per_second)


LinkFacts = dict[str, dict[str, float]]
"""link id (``device=<PCI address>`` or ``gpu=<n>``) -> {"speed": GT/s, "width": lanes, "cap": bytes/s}."""


def link_id(labels: Mapping[str, str]) -> str | None:
    """The link a link-fact series describes: its PCI address, else its GPU."""
    if "device" in labels:
        return f"device={labels['device']}"
    if "gpu" in labels:
        return f"gpu={labels['gpu']}"
    return None


def is_current(labels: Mapping[str, str]) -> bool:
    """Link facts as trained now (``kind="current"``), not the maximum the link could train to."""
    return labels.get("kind", "current") == "current"


def link_ids(acc_labels: Mapping[str, str], buses_of_gpu: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The link ids that identify an accelerator's PCIe link, best first: its PCI addresses (from
    ``triscope_gpu_info{gpu,bus_id}``), then its ``gpu`` label.  None for an accelerator that is no GPU."""
    gpu = acc_labels.get("gpu")
    if gpu is None:
        return ()
    return (*(f"device={b}" for b in buses_of_gpu.get(gpu, ())), f"gpu={gpu}")


def buses_of_gpus(gpu_info: Iterable[Mapping[str, str]]) -> dict[str, list[str]]:
    """gpu -> its PCI addresses, from the labels of ``triscope_gpu_info`` series (first seen first)."""
    out: dict[str, list[str]] = {}
    for lab in gpu_info:
        gpu, bus = lab.get("gpu"), lab.get("bus_id")
        if gpu is not None and bus and bus not in out.setdefault(gpu, []):
            out[gpu].append(bus)
    return out


def negotiated_capacity(ids: Sequence[str], facts: LinkFacts) -> float | None:
    """gen x width capacity of the first of ``ids`` that has link facts (or its capacity metric)."""
    for lid in ids:
        f = facts.get(lid)
        if not f:
            continue
        speed, width = f.get("speed"), f.get("width")
        if speed and width:
            return link_capacity_bytes_per_second(speed, width)
        if f.get("cap"):
            return f["cap"]
    return None


def own_dma_series(devices: Sequence[str | None], bus_ids: Iterable[str]) -> list[int]:
    """Indices of the DMA-map series of the accelerators' own PCI devices when they can be told
    apart (a NIC maps per packet, which is not pin churn); all of them otherwise."""
    bus = set(bus_ids)
    mine = [i for i, d in enumerate(devices) if d in bus]
    return mine if mine else list(range(len(devices)))


def dma_series_by_accelerator(devices: Sequence[str | None], buses_of_gpu: Mapping[str, Sequence[str]]
                              ) -> dict[str, list[int]] | None:
    """Accelerator name (``gpu=N``) -> indices of the DMA-map series on its own PCI device(s), when
    the series can be told apart by device (at least one is on an accelerator's address); None
    otherwise (then each accelerator counts the node's rate, ``own_dma_series``).  An accelerator
    without a known address is left out (it counts the node's rate)."""
    out: dict[str, list[int]] = {}
    for gpu, buses in buses_of_gpu.items():
        mine = set(buses)
        out[f"gpu={gpu}"] = [i for i, d in enumerate(devices) if d in mine]
    return out if any(out.values()) else None


def accelerator_key(labels: Mapping[str, str]) -> str | None:
    """The accelerator a per-workload series is about, named as its busy series is (``gpu=0``,
    ``chip=0,npu=1``); None when the series carries no accelerator label."""
    parts = [f"{k}={labels[k]}" for k in ACCELERATOR_LABELS if k in labels]
    return ",".join(parts) if parts else None


def workload_text(key: WorkloadKey | None) -> str:
    """A workload as people read it: ``ns/pod/container (Deployment/x)``, ``cmd:python``."""
    if not key or key == NO_WORKLOAD:
        return "no workload"
    ns, pod, ctr, wl = key
    where = "/".join(p for p in (ns, pod, ctr) if p)
    if where and wl:
        return f"{where} ({wl})"
    return where or wl


def is_pressure_input(labels: Mapping[str, str]) -> bool:
    """PSI series the detector reads: cpu or memory, ``some``."""
    return labels.get("resource") in ("cpu", "memory") and labels.get("kind", "some") == "some"
