"""Synthetic node traces with the shapes measured on the H200 host (DESIGN.md), for tests,
benchmarks and demos when no recorded trace is at hand.

``h200_phase_ticks()`` yields 1 Hz ticks of an H200-like node (PCIe Gen5 x16) going through
labelled phases; each phase starts with a ``phase`` event (details: name, expected state).  With
``workload=`` the ticks also carry the agent's per-workload series (docs/workloads.md section 1)
for one workload on the GPU, shaped by each phase's ``feeder`` / ``cpu_wait`` / ``wl_pressure``.
``LIGHT_SERVING`` is a lightly loaded, healthy GPU (SM 4 %, 2.5 GB/s on Gen5 x16, host CPU 5 %,
nothing pegged): ``demand-limited``; ``SERVING_PHASES`` the H200 phases followed by it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from triscope.core.samples import EventRecord, Sample

GB = 1e9
BUS_ID = "0000:1b:00.0"


@dataclass(frozen=True, slots=True)
class PhaseShape:
    name: str
    expected: str              # expected mismatch state
    sm: float                  # GPM SM activity 0..1
    rx: float                  # H2D bytes/s
    tx: float                  # D2H bytes/s
    cpu: float                 # host CPU busy 0..1 (all CPUs)
    dma_maps: float            # DMA maps/s
    retransmits: float = 0.0   # TCP retransmits/s
    psi: float = 0.0           # PSI cpu some avg10
    # the workload's evidence (only with ``workload=``): its busiest thread's share of a core,
    # run-queue wait share, cgroup cpu.pressure some avg10
    feeder: float = 0.05
    cpu_wait: float = 0.01
    wl_pressure: float = 0.0


# what DESIGN.md reports for the H200 host (16 cores: one copying thread is ~6 % of all CPUs);
# with a workload: the copying thread is pegged in the pageable and pin-churn phases
H200_PHASES: tuple[PhaseShape, ...] = (
    PhaseShape("idle", "idle", 0.0, 0.002 * GB, 0.001 * GB, 0.02, 0.0, feeder=0.01),
    PhaseShape("pinned_h2d", "io-saturated", 0.0, 58.5 * GB, 0.05 * GB, 0.07, 0.0, feeder=0.6),
    PhaseShape("pageable_h2d", "staging-bound", 0.0, 23.5 * GB, 0.05 * GB, 0.08, 0.0, feeder=0.99),
    PhaseShape("matmul", "compute-bound", 0.96, 0.05 * GB, 0.02 * GB, 0.07, 0.0, feeder=0.3),
    PhaseShape("pin_churn", "staging-bound", 0.0, 6.0 * GB, 0.05 * GB, 0.09, 1100.0, feeder=0.97),
    PhaseShape("pinned_d2h", "io-saturated", 0.0, 0.05 * GB, 58.0 * GB, 0.07, 0.0, feeder=0.6),
)
# a lightly loaded, healthy serving GPU: the case that read staging-bound (score ~0.96) before the
# verdict asked whether anything waits (issue 18)
LIGHT_SERVING = PhaseShape("light_serving", "demand-limited", 0.04, 2.5 * GB, 0.3 * GB, 0.05, 0.0, feeder=0.08,
                           cpu_wait=0.01)
SERVING_PHASES: tuple[PhaseShape, ...] = (*H200_PHASES, LIGHT_SERVING)
WORKLOAD = {"namespace": "inference", "pod": "llm-0", "container": "server", "workload": ""}


def h200_phase_ticks(start: float = 1_800_000_000.0, phase_s: int = 60, phases: Sequence[PhaseShape] = H200_PHASES,
                     seed: int = 7, noise: float = 0.03, gpu: str = "0", with_link_info: bool = True,
                     workload: dict[str, str] | None = None
                     ) -> Iterator[tuple[float, list[Sample], list[EventRecord]]]:
    """1 Hz ticks (ts, samples, events) through ``phases``, ``phase_s`` seconds each; with
    ``workload`` (its ``namespace``, ``pod``, ``container``, ``workload`` labels) the per-workload
    series of one workload using the GPU."""
    rnd = random.Random(seed)
    rx_total = tx_total = dma_total = rtx_total = 0.0
    cpu_sec = 0.0
    t = start
    lab = {"gpu": gpu}
    for ph in phases:
        for i in range(phase_s):
            def j(x: float) -> float:
                return max(0.0, x * (1 + rnd.uniform(-noise, noise)))

            rx_total += j(ph.rx)
            tx_total += j(ph.tx)
            dma_total += round(j(ph.dma_maps))
            rtx_total += round(j(ph.retransmits))
            cpu = min(1.0, j(ph.cpu))
            cpu_sec += cpu * 16
            s = [
                Sample("triscope_gpu_sm_active_ratio", min(1.0, j(ph.sm)), lab),
                Sample("triscope_gpu_tensor_active_ratio", min(1.0, j(ph.sm * 0.8)), lab),
                Sample("triscope_gpu_utilization_ratio", 1.0 if ph.sm > 0 or ph.rx + ph.tx > 1 * GB else 0.0, lab),
                Sample("triscope_gpu_pcie_rx_bytes_total", rx_total, lab, "counter"),
                Sample("triscope_gpu_pcie_tx_bytes_total", tx_total, lab, "counter"),
                Sample("triscope_gpu_power_watts", 90 + 500 * ph.sm + 40 * (ph.rx + ph.tx) / (60 * GB), lab),
                Sample("triscope_cpu_busy_ratio", cpu),
                Sample("triscope_cpu_seconds_total", cpu_sec, {"mode": "user"}, "counter"),
                Sample("triscope_pressure_ratio", j(ph.psi), {"resource": "cpu", "kind": "some"}),
                Sample("triscope_pressure_ratio", 0.0, {"resource": "memory", "kind": "some"}),
                Sample("triscope_dma_map_total", dma_total, {"device": BUS_ID, "direction": "to_device"}, "counter"),
                Sample("triscope_tcp_retransmits_total", rtx_total, {}, "counter"),
            ]
            if workload is not None:
                wl = {"gpu": gpu, **workload}
                s += [
                    Sample("triscope_accelerator_workload_info", 1.0, {**wl, "uuid": "GPU-synthetic"}),
                    Sample("triscope_workload_processes", 1.0, wl),
                    Sample("triscope_workload_sm_ratio", min(1.0, j(ph.sm)), wl),
                    Sample("triscope_workload_feeder_busy_ratio", min(1.0, j(ph.feeder)), wl),
                    Sample("triscope_workload_cpu_wait_ratio", min(1.0, j(ph.cpu_wait)), wl),
                    Sample("triscope_workload_cpu_pressure_ratio", min(1.0, j(ph.wl_pressure)), wl),
                ]
            if with_link_info:
                s += [
                    Sample("triscope_gpu_info", 1.0, {"gpu": gpu, "name": "NVIDIA H200", "uuid": "GPU-synthetic",
                                                      "bus_id": BUS_ID, "gpm": "1"}),
                    Sample("triscope_pcie_link_speed_gts", 32.0, {"device": BUS_ID, "kind": "current"}),
                    Sample("triscope_pcie_link_width", 16.0, {"device": BUS_ID, "kind": "current"}),
                ]
            # phase edges as the workload logs them (examples/workload/h200_phases.py --phases)
            ev = []
            if i == 0:
                ev.append(EventRecord("phase", f"phase {ph.name} start", "info",
                                      {"phase": ph.name, "edge": "start", "expected": ph.expected}, t))
            if i == phase_s - 1:
                ev.append(EventRecord("phase", f"phase {ph.name} end", "info",
                                      {"phase": ph.name, "edge": "end", "start": t - (phase_s - 1),
                                       "end": t + 1.0}, t + 0.999))
            yield t, s, ev
            t += 1.0


def phase_intervals(phases: Sequence[PhaseShape] = H200_PHASES, start: float = 1_800_000_000.0,
                    phase_s: int = 60) -> list[tuple[str, str, float, float]]:
    """(name, expected state, start, end) of each phase of ``h200_phase_ticks``."""
    return [(p.name, p.expected, start + i * phase_s, start + (i + 1) * phase_s) for i, p in enumerate(phases)]
