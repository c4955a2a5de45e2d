"""The rules SREs would otherwise use, scored on the same windows as triscope's verdict.

* **DCGM-only** (KempnerPulse's published rules over dcgm-exporter fields): a window is *I/O or data
  loading* when the memory-copy utilisation (``DCGM_FI_DEV_MEM_COPY_UTIL``, NVML's memory
  utilisation: ``triscope_gpu_memory_utilization_ratio``) is at least 40 % or PCIe traffic (both
  directions) at least 1 GB/s, with SM activity under 30 %; *idle* when all of them are under 5 %.
* **SageMaker Debugger**: ``CPUBottleneck`` (node CPU utilisation above 90 % while GPU utilisation
  is under 10 %), ``LowGPUUtilization`` and ``BatchSize`` (GPU and CPU utilisation low: the
  workload asks for little).  Only ``CPUBottleneck`` says the host limits the GPU; it has no
  network rule.

Neither names a workload, and neither tells the I/O states apart (a DCGM "I/O" window could be a
saturated link, host staging or the network), so a peer's window is scored **generously**: right
when it says "I/O / bottleneck" exactly where the scenario expected an I/O state, and nothing where
it expected a healthy one.  triscope's windows are scored as the acceptance does (state and, for
an I/O state, the faulty workload named).  Inputs per tick from the recording, window means over
the same 10 s windows after each scenario's first 15 s (``report.score_tracks``'s windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .report import IO_STATES, scenario_roles

GPU_UTIL = "triscope_gpu_utilization_ratio"
MEM_COPY = "triscope_gpu_memory_utilization_ratio"
SM = "triscope_gpu_sm_active_ratio"
PCIE = ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_pcie_tx_bytes_total")
CPU = "triscope_cpu_busy_ratio"


@dataclass
class PeerInputs:
    """Per tick, one GPU's and the node's values the peers read."""

    ts: list[float] = field(default_factory=list)
    gpu_util: list[float | None] = field(default_factory=list)
    mem_copy: list[float | None] = field(default_factory=list)
    sm: list[float | None] = field(default_factory=list)
    pcie: list[float | None] = field(default_factory=list)      # bytes/s, both directions
    cpu: list[float | None] = field(default_factory=list)


class PeerRecorder:
    """Collects ``PeerInputs`` for one GPU from the recorded ticks (counters as rates)."""

    def __init__(self, gpu: str = "0") -> None:
        self.gpu = gpu
        self.data = PeerInputs()
        self._prev: dict[str, tuple[float, float]] = {}

    def add(self, ts: float, samples: Iterable[Any]) -> None:
        vals: dict[str, float] = {}
        pcie = 0.0
        have_pcie = False
        for s in samples:
            name = getattr(s, "name", None)
            if name == CPU:
                vals[CPU] = float(s.value)
            elif name in (GPU_UTIL, MEM_COPY, SM) and s.labels.get("gpu") == self.gpu:
                vals[name] = float(s.value)
            elif name in PCIE and s.labels.get("gpu") == self.gpu:
                prev = self._prev.get(name)
                self._prev[name] = (ts, float(s.value))
                if prev is not None and ts > prev[0] and s.value >= prev[1]:
                    pcie += (float(s.value) - prev[1]) / (ts - prev[0])
                    have_pcie = True
        d = self.data
        d.ts.append(ts)
        d.gpu_util.append(vals.get(GPU_UTIL))
        d.mem_copy.append(vals.get(MEM_COPY))
        d.sm.append(vals.get(SM))
        d.pcie.append(pcie if have_pcie else None)
        d.cpu.append(vals.get(CPU))


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def dcgm_only(mem_copy: float | None, pcie: float | None, sm: float | None) -> str:
    """KempnerPulse's rules: ``io`` (I/O or data loading), ``idle``, or ``ok``."""
    m, p, s = mem_copy or 0.0, pcie or 0.0, sm or 0.0
    if (m >= 0.40 or p >= 1e9) and s < 0.30:
        return "io"
    if m < 0.05 and s < 0.05 and p < 0.05 * 1e9:
        return "idle"
    return "ok"


def sagemaker(cpu: float | None, gpu_util: float | None) -> str:
    """SageMaker Debugger's rules on one window: ``cpu-bottleneck``, ``batch-size`` /
    ``low-gpu-utilization`` (asks for little: not I/O), or ``ok``."""
    c, g = cpu or 0.0, gpu_util or 0.0
    if c > 0.90 and g < 0.10:
        return "cpu-bottleneck"
    if g < 0.70 and c < 0.70:
        return "batch-size"
    if g < 0.70:
        return "low-gpu-utilization"
    return "ok"


PEER_SAYS_IO = {"dcgm": {"io"}, "sagemaker": {"cpu-bottleneck"}}


def peer_windows(data: PeerInputs, lines: Sequence[dict[str, Any]], settle: float = 15.0,
                 window: float = 10.0) -> dict[str, dict[str, dict[str, int]]]:
    """Per scenario: for each peer, windows and right ones (generous: I/O-ness only)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    scen = [ln for ln in lines if ln.get("scenario") != "loop_closed"]
    for name in dict.fromkeys(ln["scenario"] for ln in scen):
        mine = {ln["instance"]: ln for ln in scen if ln["scenario"] == name}
        b = mine.get("b")
        if b is None or "a" not in mine:
            continue
        faulty, _ = scenario_roles(mine)
        expect = list((faulty or b)["expected_state"])
        hog = next((ln for ln in scen if ln["scenario"] == name and ln["instance"] == "b:neighbour"), None)
        if hog is not None and mine["a"]["gpu"] == b["gpu"]:
            expect = list(hog["expected_state"])
        want_io = any(s in IO_STATES for s in expect)
        row = out.setdefault(name, {p: {"windows": 0, "right": 0} for p in PEER_SAYS_IO})
        t = float(b["start"]) + settle
        end = float(b["end"])
        while t + window <= end + 1e-6:
            idx = [i for i, ts in enumerate(data.ts) if t <= ts < t + window]
            if idx:
                says = {"dcgm": dcgm_only(_mean([data.mem_copy[i] for i in idx]), _mean([data.pcie[i] for i in idx]),
                                          _mean([data.sm[i] for i in idx])),
                        "sagemaker": sagemaker(_mean([data.cpu[i] for i in idx]),
                                               _mean([data.gpu_util[i] for i in idx]))}
                for peer, verdict in says.items():
                    row[peer]["windows"] += 1
                    row[peer]["right"] += int((verdict in PEER_SAYS_IO[peer]) == want_io)
            t += window
    return out
