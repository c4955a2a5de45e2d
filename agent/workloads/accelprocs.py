"""Who uses each accelerator: sources that list (accelerator, process, SM share).

A source answers ``processes()`` — every process with a context on one of its accelerators — and
``shares()`` — each process's share of SM time since the previous call, where the driver gives
it.  Both are called off the tick, on the workloads collector's refresh worker (every few seconds
and every second), so a source may block briefly.

* ``NvmlProcessSource`` (``agent/workloads/nvml_processes.py``): NVML's compute, graphics and MPS
  process lists and ``nvmlDeviceGetProcessUtilization``.
* ``NpuProcessSource``: the process table of the npu-smi collector's latest run (no npu-smi run of
  its own).
* ``ListedProcessSource``: a list given to it — a stand-in for NVML's list in tests and
  benchmarks, fed with real PIDs of real processes; the code downstream cannot tell.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from triscope.agent.collectors.base import Availability
from triscope.agent.collectors.npu import NpuSmiCollector


@dataclass(frozen=True, slots=True)
class AcceleratorProcess:
    """One process with a context on one accelerator."""

    labels: tuple[tuple[str, str], ...]   # (("gpu", "0"),) or (("npu", "0"), ("chip", "0"))
    uuid: str                             # the GPU's UUID ("GPU-5b1c..."); "" for an NPU
    pid: int
    device_index: str = ""                # what a device plugin's id names: the NPU's index, the GPU's index
    sm_ratio: float | None = None         # the process's share of SM time, when known
    bus_id: str = ""                      # the accelerator's PCI address ("0000:1b:00.0"); "" unknown

    @property
    def kind(self) -> str:
        return self.labels[0][0] if self.labels else ""


class ProcessSource(Protocol):
    name: str

    def check(self) -> Availability: ...

    def processes(self) -> list[AcceleratorProcess]:
        """Every process on this source's accelerators now; raises when the source cannot answer."""
        ...

    def shares(self) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
        """Per accelerator that gives SM shares: {pid: share of SM time since the previous call}
        (a process on it that is not in its map had none: 0).  Accelerators left out give none."""
        ...

    def close(self) -> None: ...


def gpu_labels(index: int | str) -> tuple[tuple[str, str], ...]:
    return (("gpu", str(index)),)


def npu_labels(npu: str, chip: str) -> tuple[tuple[str, str], ...]:
    return (("npu", str(npu)), ("chip", str(chip)))


class ListedProcessSource:
    """A fixed list of (accelerator, process), replaced with ``set()``: NVML's answer, stood in for."""

    def __init__(self, rows: Iterable[AcceleratorProcess] = (), name: str = "listed") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._rows = list(rows)
        self.calls = 0

    def set(self, rows: Iterable[AcceleratorProcess]) -> None:
        with self._lock:
            self._rows = list(rows)

    def check(self) -> Availability:
        return Availability(True, f"{len(self._rows)} listed process(es)")

    def processes(self) -> list[AcceleratorProcess]:
        with self._lock:
            self.calls += 1
            return list(self._rows)

    def shares(self) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
        out: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
        with self._lock:
            for r in self._rows:
                if r.sm_ratio is not None:
                    out.setdefault(r.labels, {})[r.pid] = r.sm_ratio
        return out

    def close(self) -> None:
        return None


class NpuProcessSource:
    """The npu-smi process table, as the npu-smi collector last read it (``NpuSmiCollector``
    runs npu-smi off the tick; this source adds no run of its own).  NPUs give no SM share."""

    name = "npu-smi"

    def __init__(self, npu: NpuSmiCollector) -> None:
        self.npu = npu

    def check(self) -> Availability:
        return self.npu.process_source_check()

    def processes(self) -> list[AcceleratorProcess]:
        table = self.npu.process_table()
        if table is None:
            raise RuntimeError(self.npu.process_table_problem() or "no npu-smi output yet")
        procs, chips = table
        device = {(c.npu, c.chip): c.device for c in chips}
        out = []
        for p in procs:
            idx = device.get((p.npu, p.chip)) or p.npu
            out.append(AcceleratorProcess(npu_labels(p.npu, p.chip), "", p.pid, device_index=idx))
        return out

    def shares(self) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
        return {}

    def close(self) -> None:
        return None


_TRAILING_INDEX = re.compile(r"-(\d+)$")
_DRA_GPU = re.compile(r"^gpu-(\d+)$")


def device_keys(p: AcceleratorProcess) -> Sequence[str]:
    """The keys a device plugin's (or DRA driver's) id of this accelerator maps to (``owner_key``)."""
    if p.kind == "gpu":
        return (p.uuid.lower(), f"gpu-index:{p.device_index}") if p.device_index else (p.uuid.lower(),)
    return (f"npu-index:{p.device_index}",)


def owner_key(resource: str, device_id: str) -> str | None:
    """The key of a pod-resources device id, comparable with ``device_keys``:

    * ``nvidia.com/gpu`` (and ``nvidia.com/*`` shared variants) ``GPU-<uuid>``: the UUID;
    * ``huawei.com/Ascend910`` ``Ascend910-3`` (and vNPU ids ``Ascend910-2c-100-3``): NPU index 3;
    * DRA ``gpu.nvidia.com`` ``gpu-3``: GPU index 3.
    ``MIG-<uuid>`` devices name a MIG instance, not the GPU NVML lists processes on: no key.
    """
    m = _DRA_GPU.match(device_id)
    if m and resource == "gpu.nvidia.com":
        return f"gpu-index:{m.group(1)}"
    if device_id.upper().startswith("GPU-"):
        return device_id.lower()
    if resource.startswith("huawei.com/"):
        m = _TRAILING_INDEX.search(device_id)
        return f"npu-index:{m.group(1)}" if m else None
    return None
