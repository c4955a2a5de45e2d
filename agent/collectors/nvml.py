"""NVIDIA GPUs through NVML (``nvidia-ml-py``): device-side lane of the node.

What it reads per GPU, per tick (measured on an H200, see docs/gpu-npu.md):

* **GPM** (Hopper and newer): one ``nvmlGpmSampleGet`` per tick and ``nvmlGpmMetricsGet`` between
  it and the previous tick's sample: SM activity, tensor activity, DRAM bandwidth utilization and
  PCIe TX/RX bytes per second.  The PCIe rates are integrated over the time between the two
  samples into the ``triscope_gpu_pcie_{rx,tx}_bytes_total`` counters (the NVML field values
  197/198 are 32-bit and wrap every ~70 ms at line rate, so they are not used).
* **Older GPUs** (no GPM): PCIe throughput from ``nvmlDeviceGetPcieThroughput``, which blocks
  ~20 ms per call, so it runs on a background thread that integrates the rates; the tick only reads
  the running totals.  SM / tensor activity is then *not reported* (never faked from
  ``utilization.gpu``, which counts copy-engine time as busy).
* utilization.gpu / utilization.memory (coarse), memory used/total, PCIe replay counter, PCIe
  generation and width current vs max (link degraded flag), power, temperature, SM clock,
  throttle (clocks-event) reason bitmask, NVLink link state where present.
* **XID errors** arrive from NVML's event API on a background thread: each becomes an ``xid``
  event and increments ``triscope_gpu_xid_errors_total{gpu,xid}``.

A host without the NVIDIA driver: ``check()`` says why and the collector stays off.  A GPU that
stops answering (``NVML_ERROR_GPU_IS_LOST`` and friends): it is marked down
(``triscope_gpu_up`` 0), a ``gpu_lost`` event is recorded once, the other GPUs carry on, and the
lost GPU is probed again every ``lost_retry_s`` seconds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.core.pcie import link_capacity_bytes_per_second
from triscope.core.samples import EventRecord, Sample

log = logging.getLogger(__name__)

MIB = 1024 * 1024
STATIC_EVERY = 60.0   # seconds between reads of what a GPU cannot change while up (its link's maxima)
LINK_EVERY = 5.0      # the negotiated link and the replay counter: each a driver round trip (0.1-0.3 ms on
                      # the H100 machine, py-spy in h200-lab-3), rarely changing: the last value in between
XID_WAIT_MS = 2000    # the XID thread's wait per call (each return cost ~0.1 ms there: 0.5 s waits, 0.22 ms/s)

# PCIe transfer rate per lane in GT/s by generation, and the line-code efficiency.
PCIE_GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def pcie_gts(gen: int) -> float:
    return PCIE_GEN_GTS.get(int(gen), 0.0)


def pcie_capacity_bytes_per_second(gen: int, width: int) -> float:
    """Usable one-way bandwidth of a link: GT/s x lanes x encoding / 8 (gen1-2 8b/10b, gen3-5 128b/130b,
    gen6 FLIT ~242/256)."""
    return link_capacity_bytes_per_second(pcie_gts(gen), width)


def link_degraded(cur_gen: int, max_gen: int, cur_width: int, max_width: int, busy: bool) -> bool:
    """Is the link running below what it negotiated at best?

    Width below the maximum is always a fault (lanes do not power down with load on GPUs).  A lower
    *generation* is normal at idle: GPUs drop to Gen1 to save power and retrain on demand, so a low
    generation only counts while the GPU is busy (moving data or computing).
    """
    if max_width and cur_width and cur_width < max_width:
        return True
    return bool(busy and max_gen and cur_gen and cur_gen < max_gen)


class RateIntegrator:
    """Integrates a rate (units/s) sampled at times t into a monotonically increasing total.

    Rates over an interval are averages (GPM gives the mean rate between two samples), so the
    increase over [t0, t1] is ``rate * (t1 - t0)``.  Negative or non-finite rates are ignored
    (counted as 0) so the total never goes backwards.
    """

    __slots__ = ("total", "last_t")

    def __init__(self) -> None:
        self.total = 0.0
        self.last_t: float | None = None

    def add(self, rate: float, t: float, t_prev: float | None = None) -> float:
        start = self.last_t if t_prev is None else t_prev
        if start is not None and t > start and rate == rate and 0 <= rate < float("inf"):
            self.total += rate * (t - start)
        self.last_t = t
        return self.total


# XIDs that mean the GPU (or its memory) needs attention now, from NVIDIA's XID catalogue.
XID_CRITICAL = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 136, 140, 143}
XID_DESCRIPTIONS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout error",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    136: "link training failed",
    140: "ECC unrecovered error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed",
}


class XidCounter:
    """Turns XID event records into ``xid`` events and per-(gpu, xid) cumulative counters."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}

    def handle(self, gpu: str, xid: int, ts: float, *, uuid: str = "", name: str = "") -> EventRecord:
        key = (gpu, int(xid))
        self.counts[key] = self.counts.get(key, 0) + 1
        desc = XID_DESCRIPTIONS.get(int(xid), "see NVIDIA XID catalogue")
        sev: Literal["error", "critical"] = "critical" if int(xid) in XID_CRITICAL else "error"
        return EventRecord(
            kind="xid",
            message=f"GPU {gpu} XID {xid}: {desc}",
            severity=sev,
            details={"gpu": gpu, "xid": int(xid), "description": desc, "uuid": uuid, "name": name,
                     "count": self.counts[key]},
            ts=ts,
        )

    def samples(self) -> Iterator[Sample]:
        for (gpu, xid), n in sorted(self.counts.items()):
            yield Sample("triscope_gpu_xid_errors_total", float(n), {"gpu": gpu, "xid": str(xid)}, "counter")


def normalise_bus_id(bus_id: str | bytes) -> str:
    """NVML ``00000000:1B:00.0`` -> sysfs ``0000:1b:00.0`` (the ``device`` label of the PCIe metrics)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    bus_id = bus_id.strip().lower()
    dom, _, rest = bus_id.partition(":")
    if rest and len(dom) > 4:
        dom = dom[-4:]
    return f"{dom}:{rest}" if rest else bus_id


# GPM metric ids (nvml.h); kept here so the collector works with older nvidia-ml-py that lacks names.
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60
GPM_NVLINK_TOTAL_TX_PER_SEC = 61
# the GPM metrics stored as ratios (percent / 100), in the order they are added
GPM_RATIOS = ((GPM_SM_UTIL, "triscope_gpu_sm_active_ratio"), (GPM_SM_OCCUPANCY, "triscope_gpu_sm_occupancy_ratio"),
              (GPM_ANY_TENSOR_UTIL, "triscope_gpu_tensor_active_ratio"), (GPM_DRAM_BW_UTIL, "triscope_gpu_dram_bw_ratio"))

# Errors that mean "this GPU is gone", not "this query is unsupported".
_LOST_CODES = {15, 19, 18}  # GPU_IS_LOST, RESET_REQUIRED, IRQ_ISSUE
_UNSUPPORTED_CODES = {3, 2, 13, 4}  # NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND, NO_PERMISSION


@dataclass
class _Gpu:
    index: int
    handle: Any
    label: str
    name: str
    uuid: str
    bus_id: str
    gpm: bool
    up: bool = True
    lost_at: float = 0.0
    next_probe: float = 0.0
    unsupported: set[str] = field(default_factory=set)
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_cur: int = 0
    gpm_prev_t: float | None = None
    pcie_rx: RateIntegrator = field(default_factory=RateIntegrator)
    pcie_tx: RateIntegrator = field(default_factory=RateIntegrator)
    nvlink_rx: RateIntegrator = field(default_factory=RateIntegrator)
    nvlink_tx: RateIntegrator = field(default_factory=RateIntegrator)
    nvlinks: list[int] = field(default_factory=list)
    last_read_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    static: dict[str, tuple[Any, float]] = field(default_factory=dict)   # key -> (value, when read)


class NvmlCollector(BaseCollector):
    """NVML collector.

    ``nvml``: the NVML binding module (default: ``pynvml`` from nvidia-ml-py), a parameter so the
    pure bookkeeping can be exercised against a stand-in on hosts without a GPU.
    ``use_gpm``: ``"auto"`` (GPM where ``nvmlGpmQueryDeviceSupport`` says so), ``True`` or ``False``.
    ``xid_events``: run the NVML event thread for XID errors.
    ``pcie_poll_s``: pause between background ``GetPcieThroughput`` polls on GPUs without GPM.
    ``lost_retry_s``: how often a lost GPU is probed again.
    ``clock``: monotonic clock used for integration intervals.
    """

    name = "nvml"

    def __init__(
        self,
        *,
        nvml: Any = None,
        use_gpm: bool | str = "auto",
        xid_events: bool = True,
        pcie_poll_s: float = 0.05,
        lost_retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml_mod = nvml
        self.use_gpm = use_gpm
        self.xid_events = xid_events
        self.pcie_poll_s = pcie_poll_s
        self.lost_retry_s = lost_retry_s
        self.clock = clock
        self._nv: Any = None
        self._initialised = False
        self._gpus: list[_Gpu] = []
        self._xid = XidCounter()
        self._xid_queue: queue.SimpleQueue[tuple[str, int, float]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pending_events: list[EventRecord] = []
        self._events_lock = threading.Lock()
        self.driver_version = ""
        self.nvml_version = ""
        self.tick_seconds_per_gpu: dict[str, float] = {}

    # ------------------------------------------------------------------ setup
    def _module(self) -> Any:
        if self._nv is not None:
            return self._nv
        if self._nvml_mod is not None:
            self._nv = self._nvml_mod
            return self._nv
        try:
            import pynvml
        except ImportError as e:
            raise CollectorUnavailable("nvidia-ml-py (pynvml) is not installed",
                                       "pip install nvidia-ml-py") from e
        self._nv = pynvml
        return pynvml

    def _init(self) -> None:
        if self._initialised:
            return
        nv = self._module()
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
                raise CollectorUnavailable(
                    "NVIDIA driver library libnvidia-ml.so.1 not found (no NVIDIA driver on this host)",
                    "install the NVIDIA driver (it ships libnvidia-ml.so.1)") from None
            if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
                raise CollectorUnavailable("NVIDIA kernel driver is not loaded",
                                           "load the nvidia kernel module (modprobe nvidia)") from None
            if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
                raise CollectorUnavailable("no permission to open the NVIDIA devices",
                                           "run the agent as a user with access to /dev/nvidia*") from None
            raise CollectorUnavailable(f"nvmlInit failed: {e}") from None
        try:
            n = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            nv.nvmlShutdown()
            raise CollectorUnavailable(f"nvmlDeviceGetCount failed: {e}") from None
        if n == 0:
            nv.nvmlShutdown()
            raise CollectorUnavailable("NVML found no NVIDIA GPUs")
        self.driver_version = _text(_try(nv.nvmlSystemGetDriverVersion) or "")
        self.nvml_version = _text(_try(nv.nvmlSystemGetNVMLVersion) or "")
        for i in range(n):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(_try(nv.nvmlDeviceGetName, h) or "")
            uuid = _text(_try(nv.nvmlDeviceGetUUID, h) or "")
            pci = _try(nv.nvmlDeviceGetPciInfo, h)
            bus = normalise_bus_id(pci.busId) if pci is not None else ""
            g = _Gpu(index=i, handle=h, label=str(i), name=name, uuid=uuid, bus_id=bus, gpm=False)
            g.gpm = self._gpm_supported(g)
            if g.gpm:
                try:
                    g.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                    nv.nvmlGpmSampleGet(h, g.gpm_samples[0])
                    g.gpm_prev_t = self.clock()
                    g.gpm_cur = 0
                except nv.NVMLError as e:
                    log.warning("GPU %s: GPM unusable (%s); falling back", i, e)
                    g.gpm = False
            g.nvlinks = self._active_nvlinks(g)
            self._gpus.append(g)
            if not g.gpm:
                self._pending_events.append(EventRecord(
                    kind="collector", severity="info",
                    message=f"GPU {i} ({name}): no GPM; SM/tensor activity unavailable, PCIe throughput "
                            "polled off the tick path",
                    details={"collector": self.name, "gpu": str(i), "gpm": False}))
        self._initialised = True
        self._start_threads()

    def _gpm_supported(self, g: _Gpu) -> bool:
        if self.use_gpm is False:
            return False
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return False
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice)
        except nv.NVMLError:
            return False

    def _active_nvlinks(self, g: _Gpu) -> list[int]:
        nv = self._nv
        links = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(g.handle, link) == 1:
                    links.append(link)
            except nv.NVMLError as e:
                if _code(e) in (3, 2) and link == 0:  # no NVLink at all
                    break
                continue
        return links

    def _start_threads(self) -> None:
        if self.xid_events:
            t = threading.Thread(target=self._xid_loop, name="nvml-xid", daemon=True)
            t.start()
            self._threads.append(t)
        if any(not g.gpm for g in self._gpus):
            t = threading.Thread(target=self._pcie_loop, name="nvml-pcie", daemon=True)
            t.start()
            self._threads.append(t)

    # ------------------------------------------------------------------ protocol
    def check(self) -> Availability:
        try:
            self._init()
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        gpm = sum(1 for g in self._gpus if g.gpm)
        reason = (f"{len(self._gpus)} GPU(s), driver {self.driver_version}, GPM on {gpm}"
                  + ("" if gpm == len(self._gpus) else " (others: no SM activity, PCIe polled)"))
        return Availability(True, reason)

    def collect(self, now: float) -> Iterable[Sample | EventRecord]:
        self._init()
        with self._events_lock:
            out: list[Sample | EventRecord] = list(self._pending_events)
            self._pending_events.clear()
        for g in self._gpus:
            t0 = time.perf_counter()
            out.extend(self._collect_gpu(g, now))
            g.last_read_s = time.perf_counter() - t0
            self.tick_seconds_per_gpu[g.label] = g.last_read_s
        # XIDs gathered by the event thread since the last tick
        while True:
            try:
                gpu, xid, ts = self._xid_queue.get_nowait()
            except queue.Empty:
                break
            src = next((x for x in self._gpus if x.label == gpu), None)
            out.append(self._xid.handle(gpu, xid, ts, uuid=src.uuid if src else "", name=src.name if src else ""))
        out.extend(self._xid.samples())
        return out

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=XID_WAIT_MS / 1000 + 1.0)
        self._threads.clear()
        if self._initialised:
            nv = self._nv
            for g in self._gpus:
                for s in g.gpm_samples:
                    _try(nv.nvmlGpmSampleFree, s)
                g.gpm_samples = []
            _try(nv.nvmlShutdown)
            self._initialised = False
            self._gpus = []

    # ------------------------------------------------------------------ per GPU
    def _collect_gpu(self, g: _Gpu, now: float) -> list[Sample | EventRecord]:
        nv = self._nv
        lab = {"gpu": g.label}
        out: list[Sample | EventRecord] = []
        if not g.up:
            if time.monotonic() >= g.next_probe:
                g.next_probe = time.monotonic() + self.lost_retry_s
                try:
                    nv.nvmlDeviceGetPowerUsage(g.handle)
                    g.up = True
                    g.static.clear()     # back from lost (a reset, a new link training): read afresh
                    out.append(EventRecord(kind="collector", severity="info",
                                           message=f"GPU {g.label} answers NVML again",
                                           details={"collector": self.name, "gpu": g.label}))
                except nv.NVMLError:
                    pass
            if not g.up:
                return [Sample("triscope_gpu_up", 0.0, lab)]
        try:
            out.extend(self._read_gpu(g, lab))
        except _GpuLost as e:
            g.up = False
            g.lost_at = now
            g.next_probe = time.monotonic() + self.lost_retry_s
            out = [s for s in out if isinstance(s, EventRecord)]
            out.append(EventRecord(
                kind="gpu_lost", severity="critical",
                message=f"GPU {g.label} ({g.name}, {g.bus_id}) stopped answering NVML: {e}",
                details={"gpu": g.label, "uuid": g.uuid, "bus_id": g.bus_id, "error": str(e)}))
            out.append(Sample("triscope_gpu_up", 0.0, lab))
            return out
        out.append(Sample("triscope_gpu_up", 1.0, lab))
        return out

    def _q(self, g: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML query: None when unsupported (remembered, not asked again); _GpuLost when gone."""
        if key in g.unsupported:
            return None
        nv = self._nv
        try:
            return fn(g.handle, *args)
        except nv.NVMLError as e:
            c = _code(e)
            if c in _LOST_CODES:
                raise _GpuLost(str(e)) from None
            if c in _UNSUPPORTED_CODES:
                g.unsupported.add(key)
                log.info("GPU %s: %s unsupported (%s)", g.label, key, e)
            else:
                log.debug("GPU %s: %s failed (%s)", g.label, key, e)
            return None

    def _q_every(self, g: _Gpu, key: str, every: float, fn: Callable[..., Any], *args: Any) -> Any:
        """``_q`` asked again only every ``every`` seconds, the last answer in between: for what the
        GPU cannot change while it is up (its link's maxima, ``STATIC_EVERY``) and what changes
        rarely and is read for its level, not its moment (the negotiated link, the replay counter:
        ``LINK_EVERY``)."""
        now = self.clock()
        got = g.static.get(key)
        if got is None or now - got[1] >= every:
            value = self._q(g, key, fn, *args)
            if value is None:           # failed or unsupported: nothing kept (an unsupported one is
                g.static.pop(key, None)  # remembered by _q and costs nothing next time)
                return None
            got = g.static[key] = (value, now)
        return got[0]

    def _read_gpu(self, g: _Gpu, lab: dict[str, str]) -> list[Sample]:
        nv = self._nv
        out: list[Sample] = []
        add = out.append

        util = self._q(g, "util", nv.nvmlDeviceGetUtilizationRates)
        busy = False
        if util is not None:
            add(Sample("triscope_gpu_utilization_ratio", util.gpu / 100.0, lab))
            add(Sample("triscope_gpu_memory_utilization_ratio", util.memory / 100.0, lab))
            busy = util.gpu > 0
        mem = self._q(g, "mem", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            add(Sample("triscope_gpu_memory_used_bytes", float(mem.used), lab))
            add(Sample("triscope_gpu_memory_total_bytes", float(mem.total), lab))
        replays = self._q_every(g, "replay", LINK_EVERY, nv.nvmlDeviceGetPcieReplayCounter)
        if replays is not None:
            add(Sample("triscope_gpu_pcie_replays_total", float(replays), lab, "counter"))
        power = self._q(g, "power", nv.nvmlDeviceGetPowerUsage)
        if power is not None:
            add(Sample("triscope_gpu_power_watts", power / 1000.0, lab))
        temp = self._q(g, "temp", nv.nvmlDeviceGetTemperature, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            add(Sample("triscope_gpu_temperature_celsius", float(temp), lab))
        clk = self._q(g, "smclk", nv.nvmlDeviceGetClockInfo, getattr(nv, "NVML_CLOCK_SM", 1))
        if clk is not None:
            add(Sample("triscope_gpu_sm_clock_hertz", clk * 1e6, lab))
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = self._q(g, "throttle", reasons_fn)
        if reasons is not None:
            add(Sample("triscope_gpu_throttle_reasons", float(reasons), lab))

        # GPM (or the background PCIe integrator)
        if g.gpm:
            gpm_busy = self._read_gpm(g, lab, out)
            busy = busy or gpm_busy
        else:
            with g.lock:
                rx, tx = g.pcie_rx.total, g.pcie_tx.total
            add(Sample("triscope_gpu_pcie_rx_bytes_total", rx, lab, "counter"))
            add(Sample("triscope_gpu_pcie_tx_bytes_total", tx, lab, "counter"))

        if g.bus_id:
            out += self._read_link(g, busy)
        # NVLink
        if g.nvlinks:
            up = 0
            for link in g.nvlinks:
                st = self._q(g, f"nvlink{link}", nv.nvmlDeviceGetNvLinkState, link)
                up += 1 if st == 1 else 0
            add(Sample("triscope_gpu_nvlink_links_up", float(up), lab))
        add(Sample("triscope_gpu_info", 1.0, {"gpu": g.label, "name": g.name, "uuid": g.uuid,
                                               "bus_id": g.bus_id, "gpm": "1" if g.gpm else "0"}))
        return out

    def _read_link(self, g: _Gpu, busy: bool) -> list[Sample]:
        """The GPU's PCIe link: speed and width (current and max), degraded or not, its capacity."""
        nv = self._nv
        cg = self._q_every(g, "curgen", LINK_EVERY, nv.nvmlDeviceGetCurrPcieLinkGeneration)
        mg = self._q_every(g, "maxgen", STATIC_EVERY, nv.nvmlDeviceGetMaxPcieLinkGeneration)
        if busy and cg is not None and mg is not None and cg < mg:
            # a generation kept from an idle moment (GPUs drop the link when idle) is not evidence
            # against a busy GPU: ask again now (rare: only while it reads below its maximum)
            g.static.pop("curgen", None)
            cg = self._q_every(g, "curgen", LINK_EVERY, nv.nvmlDeviceGetCurrPcieLinkGeneration)
        cw = self._q_every(g, "curwidth", LINK_EVERY, nv.nvmlDeviceGetCurrPcieLinkWidth)
        mw = self._q_every(g, "maxwidth", STATIC_EVERY, nv.nvmlDeviceGetMaxPcieLinkWidth)
        dev = {"device": g.bus_id}
        out: list[Sample] = []
        if cg is not None:
            out.append(Sample("triscope_pcie_link_speed_gts", pcie_gts(cg), {**dev, "kind": "current"}))
        if mg is not None:
            out.append(Sample("triscope_pcie_link_speed_gts", pcie_gts(mg), {**dev, "kind": "max"}))
        if cw is not None:
            out.append(Sample("triscope_pcie_link_width", float(cw), {**dev, "kind": "current"}))
        if mw is not None:
            out.append(Sample("triscope_pcie_link_width", float(mw), {**dev, "kind": "max"}))
        if None not in (cg, mg, cw, mw):
            out.append(Sample("triscope_pcie_link_degraded", 1.0 if link_degraded(cg, mg, cw, mw, busy) else 0.0, dev))
            out.append(Sample("triscope_pcie_link_capacity_bytes_per_second", pcie_capacity_bytes_per_second(mg, mw), dev))
        return out

    def _read_gpm(self, g: _Gpu, lab: dict[str, str], out: list[Sample]) -> bool:
        nv = self._nv
        nxt = 1 - g.gpm_cur
        try:
            nv.nvmlGpmSampleGet(g.handle, g.gpm_samples[nxt])
        except nv.NVMLError as e:
            if _code(e) in _LOST_CODES:
                raise _GpuLost(str(e)) from None
            log.debug("GPU %s: GPM sample failed: %s", g.label, e)
            return False
        t = self.clock()
        ids = [GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL,
               GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC]
        if g.nvlinks:
            ids += [GPM_NVLINK_TOTAL_RX_PER_SEC, GPM_NVLINK_TOTAL_TX_PER_SEC]
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(ids)
        mg.sample1 = g.gpm_samples[g.gpm_cur]
        mg.sample2 = g.gpm_samples[nxt]
        for i, mid in enumerate(ids):
            mg.metrics[i].metricId = mid
        t_prev = g.gpm_prev_t
        g.gpm_cur = nxt
        g.gpm_prev_t = t
        try:
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as e:
            log.debug("GPU %s: GPM metrics failed: %s", g.label, e)
            return False
        vals: dict[int, float] = {}
        for i, mid in enumerate(ids):
            m = mg.metrics[i]
            if m.nvmlReturn == 0:
                vals[mid] = float(m.value)
        out += [Sample(name, _pct(vals[mid]), lab) for mid, name in GPM_RATIOS if mid in vals]
        busy = vals.get(GPM_SM_UTIL, 0.0) > 1.0
        rx = vals.get(GPM_PCIE_RX_PER_SEC)
        tx = vals.get(GPM_PCIE_TX_PER_SEC)
        if rx is not None:
            g.pcie_rx.add(rx * MIB, t, t_prev)
            busy = busy or rx * MIB > 1e8
        if tx is not None:
            g.pcie_tx.add(tx * MIB, t, t_prev)
            busy = busy or tx * MIB > 1e8
        out.append(Sample("triscope_gpu_pcie_rx_bytes_total", g.pcie_rx.total, lab, "counter"))
        out.append(Sample("triscope_gpu_pcie_tx_bytes_total", g.pcie_tx.total, lab, "counter"))
        if g.nvlinks:
            nrx = vals.get(GPM_NVLINK_TOTAL_RX_PER_SEC)
            ntx = vals.get(GPM_NVLINK_TOTAL_TX_PER_SEC)
            if nrx is not None:
                g.nvlink_rx.add(nrx * MIB, t, t_prev)
            if ntx is not None:
                g.nvlink_tx.add(ntx * MIB, t, t_prev)
            out.append(Sample("triscope_gpu_nvlink_rx_bytes_total", g.nvlink_rx.total, lab, "counter"))
            out.append(Sample("triscope_gpu_nvlink_tx_bytes_total", g.nvlink_tx.total, lab, "counter"))
        return busy

    # ------------------------------------------------------------------ threads
    def _pcie_loop(self) -> None:
        """GPUs without GPM: GetPcieThroughput (KB/s over a 20 ms window, blocks ~20 ms) in a loop."""
        nv = self._nv
        while not self._stop.is_set():
            for g in self._gpus:
                if g.gpm or not g.up or "pcie_tp" in g.unsupported:
                    continue
                try:
                    tx = nv.nvmlDeviceGetPcieThroughput(g.handle, nv.NVML_PCIE_UTIL_TX_BYTES)
                    rx = nv.nvmlDeviceGetPcieThroughput(g.handle, nv.NVML_PCIE_UTIL_RX_BYTES)
                except nv.NVMLError as e:
                    if _code(e) in _UNSUPPORTED_CODES:
                        g.unsupported.add("pcie_tp")
                    continue
                t = self.clock()
                with g.lock:
                    # the rate is a sample of the window just ended; treat it as the mean since last poll
                    g.pcie_tx.add(tx * 1000.0, t)
                    g.pcie_rx.add(rx * 1000.0, t)
            self._stop.wait(self.pcie_poll_s)

    def _xid_loop(self) -> None:
        nv = self._nv
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("NVML event set unavailable, no XID events: %s", e)
            return
        by_handle: dict[int, str] = {}
        registered = 0
        for g in self._gpus:
            try:
                nv.nvmlDeviceRegisterEvents(g.handle, nv.nvmlEventTypeXidCriticalError, es)
                registered += 1
                by_handle[_handle_key(g.handle)] = g.label
            except nv.NVMLError as e:
                log.warning("GPU %s: cannot register for XID events: %s", g.label, e)
        if not registered:
            with self._events_lock:
                self._pending_events.append(EventRecord(
                    kind="collector", severity="warning", message="NVML XID events unavailable on every GPU",
                    details={"collector": self.name}))
            _try(nv.nvmlEventSetFree, es)
            return
        try:
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(es, XID_WAIT_MS)
                except nv.NVMLError as e:
                    if _code(e) == 10:  # timeout
                        continue
                    if _code(e) in _LOST_CODES:
                        # the tick path notices and reports the lost GPU; avoid a hot loop
                        self._stop.wait(1.0)
                        continue
                    log.debug("nvmlEventSetWait: %s", e)
                    self._stop.wait(0.5)
                    continue
                if data.eventType & nv.nvmlEventTypeXidCriticalError:
                    gpu = by_handle.get(_handle_key(data.device), "?")
                    self._xid_queue.put((gpu, int(data.eventData), time.time()))
        finally:
            _try(nv.nvmlEventSetFree, es)

    # ------------------------------------------------------------------ introspection
    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [{"index": g.index, "name": g.name, "uuid": g.uuid, "bus_id": g.bus_id, "gpm": g.gpm,
                 "up": g.up, "nvlinks": list(g.nvlinks), "unsupported": sorted(g.unsupported)}
                for g in self._gpus]


class _GpuLost(Exception):
    pass


def _pct(v: float) -> float:
    return max(0.0, min(1.0, v / 100.0))


def _code(e: Exception) -> int | None:
    return getattr(e, "value", None)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _handle_key(h: Any) -> int:
    """A hashable identity of an NVML device handle (a ctypes pointer)."""
    import ctypes

    try:
        return ctypes.cast(h, ctypes.c_void_p).value or 0
    except ctypes.ArgumentError:   # not a pointer: the object's own identity
        return id(h)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it raises: names, versions and frees asked for on the way."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - best effort: NVML's errors, its bindings' (ctypes) and a missing entry point alike leave the value out, never the collector
        return None
