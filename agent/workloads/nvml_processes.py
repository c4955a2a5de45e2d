"""The processes on each NVIDIA GPU and their SM share, from NVML (a source for the workloads collector).

* ``nvmlDeviceGetComputeRunningProcesses``, ``…GraphicsRunningProcesses`` and
  ``…MPSComputeRunningProcesses``: every process with a context on the GPU (PIDs of the root PID
  namespace: the agent needs ``hostPID`` to find them in its ``/proc``);
* ``nvmlDeviceGetProcessUtilization(handle, lastSeen)``: the driver's per-process samples since
  the previous call; a process's SM share is the mean ``smUtil`` of its samples.  A listed process
  without a sample used no SM time (0); a GPU whose driver does not give the samples gives no
  share (absent, never a guess).

It keeps its own NVML session (``nvmlInit`` counts references, so it coexists with the NVML
collector's) and is called off the tick by the workloads collector's refresh worker.  Guarded as
``nvml.py`` guards its calls: a query a GPU does not support is remembered and not asked again; a
GPU that is lost (``GPU_IS_LOST`` and friends) is skipped and probed again every ``lost_retry_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triscope.agent.collectors.base import Availability, CollectorUnavailable
from triscope.agent.collectors.nvml import normalise_bus_id
from triscope.agent.workloads.accelprocs import AcceleratorProcess, gpu_labels

log = logging.getLogger(__name__)

_LOST_CODES = {15, 19, 18}          # GPU_IS_LOST, RESET_REQUIRED, IRQ_ISSUE
_UNSUPPORTED_CODES = {3, 2, 13, 4}  # NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND, NO_PERMISSION
_NOT_FOUND = 6                      # no utilization sample since the timestamp given


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    labels: tuple[tuple[str, str], ...]
    bus_id: str = ""
    unsupported: set[str] = field(default_factory=set)
    lost_until: float = 0.0
    last_seen_us: int = 0


def _bus_id(nv: Any, handle: Any) -> str:
    """The GPU's PCI address as sysfs names it ("0000:1b:00.0"); "" when NVML does not say."""
    try:
        return normalise_bus_id(nv.nvmlDeviceGetPciInfo(handle).busId)
    except Exception:  # noqa: BLE001 - the placement is only unknown then
        return ""


class NvmlProcessSource:
    name = "nvml"

    def __init__(self, *, nvml: Any = None, lost_retry_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml_mod = nvml
        self.lost_retry_s = lost_retry_s
        self.clock = clock
        self._nv: Any = None
        self._gpus: list[_Gpu] = []
        self._initialised = False

    def _init(self) -> None:
        if self._initialised:
            return
        nv: Any = self._nvml_mod
        if nv is None:
            try:
                import pynvml
            except ImportError:
                raise CollectorUnavailable("nvidia-ml-py (pynvml) is not installed", "pip install nvidia-ml-py") from None
            nv = pynvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            if _code(e) == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
                raise CollectorUnavailable("NVIDIA driver library libnvidia-ml.so.1 not found (no NVIDIA driver on "
                                           "this host)", "install the NVIDIA driver") from None
            raise CollectorUnavailable(f"nvmlInit failed: {e}") from None
        try:
            gpus = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = nv.nvmlDeviceGetUUID(h)
                gpus.append(_Gpu(i, h, uuid.decode() if isinstance(uuid, bytes) else str(uuid), gpu_labels(i),
                                 _bus_id(nv, h)))
        except nv.NVMLError as e:
            nv.nvmlShutdown()
            raise CollectorUnavailable(f"listing the GPUs failed: {e}") from None
        if not gpus:
            nv.nvmlShutdown()
            raise CollectorUnavailable("NVML found no NVIDIA GPUs")
        self._nv, self._gpus, self._initialised = nv, gpus, True

    def check(self) -> Availability:
        try:
            self._init()
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        return Availability(True, f"{len(self._gpus)} GPU(s)")

    def _call(self, g: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One guarded query: None when unsupported (remembered) or failing; marks a lost GPU."""
        if key in g.unsupported or g.lost_until > self.clock():
            return None
        nv = self._nv
        try:
            return fn(g.handle, *args)
        except nv.NVMLError as e:
            c = _code(e)
            if c in _LOST_CODES:
                g.lost_until = self.clock() + self.lost_retry_s
                log.warning("GPU %s: lost (%s); its processes are not listed for %.0f s", g.index, e, self.lost_retry_s)
            elif c in _UNSUPPORTED_CODES:
                g.unsupported.add(key)
                log.info("GPU %s: %s unsupported (%s)", g.index, key, e)
            elif c != _NOT_FOUND:
                log.debug("GPU %s: %s failed (%s)", g.index, key, e)
            return None

    def processes(self) -> list[AcceleratorProcess]:
        self._init()
        nv = self._nv
        out: list[AcceleratorProcess] = []
        for g in self._gpus:
            pids: dict[int, None] = {}
            for key, name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                              ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
                              ("mps", "nvmlDeviceGetMPSComputeRunningProcesses")):
                fn = getattr(nv, name, None)
                got = self._call(g, key, fn) if fn is not None else None
                for p in got or ():
                    pid = int(getattr(p, "pid", 0) or 0)
                    if pid > 0:
                        pids[pid] = None
            out += [AcceleratorProcess(g.labels, g.uuid, pid, device_index=str(g.index), bus_id=g.bus_id)
                    for pid in pids]
        return out

    def shares(self) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
        """Per GPU that answered: {pid: mean smUtil over the driver's samples since the previous
        call (0..1)}; a listed process without a sample used no SM time.  A GPU whose driver gives
        no per-process samples is left out (its processes get no share, not 0)."""
        self._init()
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetProcessUtilization", None)
        out: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
        if fn is None:
            return out
        for g in self._gpus:
            if "util" in g.unsupported or g.lost_until > self.clock():
                continue
            try:
                samples = fn(g.handle, g.last_seen_us)
            except nv.NVMLError as e:
                if _code(e) == _NOT_FOUND:      # no sample since then: no process used the SMs
                    out[g.labels] = {}
                else:
                    self._call(g, "util", _raise, e)   # classify the error through the guard
                continue
            sums: dict[int, list[float]] = {}
            for smp in samples:
                ts = int(smp.timeStamp)
                if ts <= g.last_seen_us:
                    continue
                acc = sums.setdefault(int(smp.pid), [0.0, 0.0])
                acc[0] += float(smp.smUtil)
                acc[1] += 1
            if samples:
                g.last_seen_us = max(g.last_seen_us, max(int(s.timeStamp) for s in samples))
            out[g.labels] = {pid: max(0.0, min(1.0, total / n / 100.0)) for pid, (total, n) in sums.items()}
        return out

    def close(self) -> None:
        if self._initialised:
            try:
                self._nv.nvmlShutdown()
            except Exception as e:  # noqa: BLE001 - shutting down
                log.debug("nvmlShutdown: %s", e)
            self._initialised = False
            self._gpus = []


def _raise(_handle: Any, e: Exception) -> Any:
    raise e


def _code(e: Exception) -> int | None:
    return getattr(e, "value", None)
