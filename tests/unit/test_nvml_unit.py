"""NVML collector without a GPU: the no-driver path for real (this host has no libnvidia-ml), the pure
bookkeeping (rate integration, link-degraded logic, XID counting), and the lost-GPU / no-GPM / XID
paths against a stand-in NVML binding (NVML itself cannot run here; the real thing runs in
tests/integration/test_nvml_gpu.py on the H200)."""

from __future__ import annotations

import ctypes
import queue
import time
from types import SimpleNamespace

import pytest

from triscope.agent.collectors.base import CollectorUnavailable
from triscope.agent.collectors.nvml import (
    NvmlCollector,
    RateIntegrator,
    XidCounter,
    link_degraded,
    normalise_bus_id,
    pcie_capacity_bytes_per_second,
)
from triscope.core.samples import EventRecord, Sample


def test_no_driver_here_for_real():
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this host has an NVIDIA driver")
    c = NvmlCollector()
    av = c.check()
    assert not av.ok
    assert "libnvidia-ml.so.1 not found" in av.reason and "driver" in av.hint
    with pytest.raises(CollectorUnavailable):
        list(c.collect(time.time()))
    c.close()


def test_rate_integrator_never_goes_backwards():
    r = RateIntegrator()
    assert r.add(100.0, 10.0) == 0.0            # first point: no interval yet
    assert r.add(100.0, 12.0) == pytest.approx(200.0)
    assert r.add(-5.0, 13.0) == pytest.approx(200.0)   # bogus negative rate ignored
    assert r.add(float("nan"), 14.0) == pytest.approx(200.0)
    assert r.add(50.0, 14.0) == pytest.approx(200.0)   # zero-length interval
    assert r.add(10.0, 20.0, t_prev=18.0) == pytest.approx(220.0)  # explicit interval (GPM sample pair)


def test_link_degraded_logic():
    assert not link_degraded(5, 5, 16, 16, busy=True)
    assert link_degraded(5, 5, 8, 16, busy=False)       # lost lanes: always degraded
    assert not link_degraded(1, 5, 16, 16, busy=False)  # idle power-saving downshift is normal
    assert link_degraded(3, 5, 16, 16, busy=True)       # busy and below max generation
    assert pcie_capacity_bytes_per_second(5, 16) == pytest.approx(63.015e9, rel=1e-3)
    assert pcie_capacity_bytes_per_second(2, 8) == pytest.approx(4.0e9)


def test_bus_id_normalised_to_sysfs_form():
    assert normalise_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalise_bus_id(b"00000000:00:06.0") == "0000:00:06.0"


def test_xid_counter_per_code_and_events():
    x = XidCounter()
    e1 = x.handle("0", 79, 100.0)
    x.handle("0", 13, 101.0)
    e3 = x.handle("0", 79, 102.0)
    assert e1.kind == "xid" and e1.severity == "critical" and "fallen off the bus" in e1.message
    assert e3.details["count"] == 2 and e3.ts == 102.0
    got = {(s.labels["gpu"], s.labels["xid"]): s.value for s in x.samples()}
    assert got == {("0", "13"): 1.0, ("0", "79"): 2.0}
    assert all(s.kind == "counter" for s in x.samples())


# ---------------------------------------------------------------------------- stand-in binding
class FakeNvml:
    """The subset of pynvml the collector calls, for two pre-Hopper GPUs (no GPM)."""

    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self):
        self.handles = [ctypes.c_void_p(0x1000), ctypes.c_void_p(0x2000)]
        self.lost: set[int] = set()
        self.xids: queue.SimpleQueue = queue.SimpleQueue()
        self.throughput_calls = 0

    def _idx(self, h):
        i = [x.value for x in self.handles].index(ctypes.cast(h, ctypes.c_void_p).value)
        if i in self.lost:
            raise self.NVMLError(15)  # GPU_IS_LOST
        return i

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlSystemGetDriverVersion(self): return "535.0"
    def nvmlSystemGetNVMLVersion(self): return "12.535"
    def nvmlDeviceGetHandleByIndex(self, i): return self.handles[i]
    def nvmlDeviceGetName(self, h): return "Tesla T4"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{self._idx(h)}"
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=f"00000000:{0x3b + self._idx(h):02X}:00.0".encode())
    def nvmlGpmQueryDeviceSupport(self, h): raise self.NVMLError(3)
    def nvmlDeviceGetNvLinkState(self, h, link): raise self.NVMLError(3)
    def nvmlDeviceGetUtilizationRates(self, h):
        self._idx(h)
        return SimpleNamespace(gpu=100, memory=40)
    def nvmlDeviceGetMemoryInfo(self, h): self._idx(h); return SimpleNamespace(used=2 << 30, total=16 << 30)  # noqa: E702
    def nvmlDeviceGetPcieReplayCounter(self, h): self._idx(h); return 3  # noqa: E702
    def nvmlDeviceGetPowerUsage(self, h): self._idx(h); return 70500  # noqa: E702
    def nvmlDeviceGetTemperature(self, h, s): self._idx(h); return 55  # noqa: E702
    def nvmlDeviceGetClockInfo(self, h, c): self._idx(h); return 1590  # noqa: E702
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): self._idx(h); return 0  # noqa: E702
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return 3 if self._idx(h) == 0 else 1
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): self._idx(h); return 3  # noqa: E702
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return 16 if self._idx(h) == 0 else 8
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): self._idx(h); return 16  # noqa: E702
    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._idx(h)
        self.throughput_calls += 1
        time.sleep(0.02)  # the real call blocks ~20 ms
        return 1_000_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 0  # KB/s -> 1 GB/s RX
    def nvmlEventSetCreate(self): return object()
    def nvmlDeviceRegisterEvents(self, h, types, es): pass
    def nvmlEventSetFree(self, es): pass
    def nvmlEventSetWait_v2(self, es, timeout_ms):
        try:
            dev, xid = self.xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise self.NVMLError(10) from None  # TIMEOUT
        return SimpleNamespace(device=self.handles[dev], eventType=8, eventData=xid)


def _s(items):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in items if isinstance(s, Sample)}


def test_older_gpu_no_gpm_lost_gpu_and_xid():
    nv = FakeNvml()
    c = NvmlCollector(nvml=nv, pcie_poll_s=0.01, lost_retry_s=0.2)
    try:
        av = c.check()
        assert av.ok and "GPM on 0" in av.reason and "no SM activity" in av.reason
        first = list(c.collect(time.time()))
        notes = [e for e in first if isinstance(e, EventRecord) and e.kind == "collector"]
        assert len(notes) == 2 and "SM/tensor activity unavailable" in notes[0].message
        time.sleep(0.5)
        items = list(c.collect(time.time()))
        d = _s(items)
        # never faked: no SM/tensor activity without GPM, even though utilization.gpu reads 100 %
        assert not any(k[0] in ("triscope_gpu_sm_active_ratio", "triscope_gpu_tensor_active_ratio") for k in d)
        assert d[("triscope_gpu_utilization_ratio", (("gpu", "0"),))] == 1.0
        rx = d[("triscope_gpu_pcie_rx_bytes_total", (("gpu", "0"),))]
        assert 0.1e9 < rx < 1.5e9, rx  # ~1 GB/s polled off the tick path for ~0.5 s
        assert nv.throughput_calls > 4
        assert d[("triscope_gpu_power_watts", (("gpu", "1"),))] == 70.5
        # GPU 1 runs x8 of x16: degraded even when idle; GPU 0 is fine
        assert d[("triscope_pcie_link_degraded", (("device", "0000:3c:00.0"),))] == 1.0
        assert d[("triscope_pcie_link_degraded", (("device", "0000:3b:00.0"),))] == 0.0
        # tick path stays cheap although GetPcieThroughput blocks 20 ms per call
        assert max(c.tick_seconds_per_gpu.values()) < 0.015

        # an XID arrives on the event thread
        nv.xids.put((1, 79))
        time.sleep(0.7)
        items = list(c.collect(time.time()))
        xids = [e for e in items if isinstance(e, EventRecord) and e.kind == "xid"]
        assert len(xids) == 1 and xids[0].details["gpu"] == "1" and xids[0].details["xid"] == 79
        assert _s(items)[("triscope_gpu_xid_errors_total", (("gpu", "1"), ("xid", "79")))] == 1.0

        # GPU 1 falls off the bus: marked down once, GPU 0 carries on
        nv.lost.add(1)
        items = list(c.collect(time.time()))
        lost = [e for e in items if isinstance(e, EventRecord) and e.kind == "gpu_lost"]
        assert len(lost) == 1 and lost[0].severity == "critical" and lost[0].details["bus_id"] == "0000:3c:00.0"
        d = _s(items)
        assert d[("triscope_gpu_up", (("gpu", "1"),))] == 0.0
        assert d[("triscope_gpu_up", (("gpu", "0"),))] == 1.0
        assert ("triscope_gpu_power_watts", (("gpu", "1"),)) not in d
        items = list(c.collect(time.time()))
        assert not [e for e in items if isinstance(e, EventRecord) and e.kind == "gpu_lost"]
        assert _s(items)[("triscope_gpu_up", (("gpu", "1"),))] == 0.0
        # the XID counter survives the loss (a counter, not a sticky value)
        assert _s(items)[("triscope_gpu_xid_errors_total", (("gpu", "1"), ("xid", "79")))] == 1.0

        # it answers again: probed after lost_retry_s and back up
        nv.lost.clear()
        time.sleep(0.3)
        items = list(c.collect(time.time()))
        assert _s(items)[("triscope_gpu_up", (("gpu", "1"),))] == 1.0
        assert any(isinstance(e, EventRecord) and "answers NVML again" in e.message for e in items)
    finally:
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 2.5


def test_link_maxima_are_asked_once_a_minute_the_negotiated_link_every_few_seconds():
    """The maximum generation and width cannot change while the GPU is up: asked when first read and
    every STATIC_EVERY seconds; the current ones (a link that trains down) every LINK_EVERY seconds,
    the last answer published in between."""
    from triscope.agent.collectors import nvml as nvml_mod

    nv = FakeNvml()
    asked = {"max": 0, "cur": 0}
    real_max, real_cur = nv.nvmlDeviceGetMaxPcieLinkWidth, nv.nvmlDeviceGetCurrPcieLinkWidth

    def max_width(h):
        asked["max"] += 1
        return real_max(h)

    def cur_width(h):
        asked["cur"] += 1
        return real_cur(h)

    nv.nvmlDeviceGetMaxPcieLinkWidth, nv.nvmlDeviceGetCurrPcieLinkWidth = max_width, cur_width
    now = [1000.0]
    c = NvmlCollector(nvml=nv, xid_events=False, pcie_poll_s=0.01, clock=lambda: now[0])
    try:
        assert c.check().ok
        for _ in range(int(nvml_mod.LINK_EVERY)):
            d = _s(c.collect(time.time()))
            assert d[("triscope_pcie_link_width", (("device", "0000:3c:00.0"), ("kind", "current")))] == 8
            now[0] += 1.0
        assert d[("triscope_pcie_link_width", (("device", "0000:3c:00.0"), ("kind", "max")))] == 16
        assert asked == {"max": 2, "cur": 2}          # two GPUs: each asked once over LINK_EVERY ticks
        list(c.collect(time.time()))
        assert asked == {"max": 2, "cur": 4}
        now[0] += nvml_mod.STATIC_EVERY
        list(c.collect(time.time()))
        assert asked["max"] == 4
    finally:
        c.close()


def test_a_busy_gpu_is_not_called_degraded_on_a_generation_kept_from_an_idle_moment():
    """GPUs drop the link when idle: a generation read while idle and kept for LINK_EVERY must not
    make the same GPU degraded the moment it is busy; it is asked again then."""
    nv = FakeNvml()
    gen = {"v": 1}
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: (nv._idx(h), gen["v"])[1]
    busy = {"v": 0}
    nv.nvmlDeviceGetUtilizationRates = lambda h: (nv._idx(h), SimpleNamespace(gpu=busy["v"], memory=0))[1]
    now = [1000.0]
    c = NvmlCollector(nvml=nv, xid_events=False, pcie_poll_s=0.01, clock=lambda: now[0])
    try:
        assert c.check().ok
        idle = _s(c.collect(time.time()))
        assert idle[("triscope_pcie_link_degraded", (("device", "0000:3b:00.0"),))] == 0.0   # idle at Gen1: fine
        gen["v"], busy["v"] = 3, 100            # it trains up as the work starts
        now[0] += 1.0
        got = _s(c.collect(time.time()))
        assert got[("triscope_pcie_link_degraded", (("device", "0000:3b:00.0"),))] == 0.0
        assert got[("triscope_pcie_link_speed_gts", (("device", "0000:3b:00.0"), ("kind", "current")))] == 8.0
        gen["v"] = 1                            # busy and really at Gen1: degraded, within LINK_EVERY
        from triscope.agent.collectors import nvml as nvml_mod
        now[0] += nvml_mod.LINK_EVERY
        got = _s(c.collect(time.time()))
        assert got[("triscope_pcie_link_degraded", (("device", "0000:3b:00.0"),))] == 1.0
    finally:
        c.close()
