"""Realistic demo data for the dashboard's tests (a test helper, not part of the product: the
dashboard only reads).

``seed_demo(store, end)`` writes two nodes through ``store.write_ticks`` (the agent's path):

* ``h200-node``: an H200-shaped trace (``triscope.analysis.synthetic.h200_phase_ticks``: idle, pinned and
  pageable copies, matmul, pin churn, D2H), run through the agent's own
  ``triscope.analysis.online.MismatchTracker`` so the mismatch state/score series and state-change events
  are stored the way the agent stores them; plus an XID error and a remediation event;
* ``cpu-node``: a host without accelerators (TCP retransmits, TIME_WAIT, DMA maps, CPU).

``seed_workloads(store, end)`` (also ``seed_demo(..., with_workloads=True)``): ``dual-gpu-node``,
two GPUs with the per-accelerator series of docs/workloads.md: GPU 0 runs
``inference/vit-serve-…`` and is staging-bound for a stretch (pageable copies, a pegged feeder
thread waiting for a CPU), GPU 1 runs ``inference/whisper-asr-…`` and is demand-limited
throughout; ``triscope_accelerator_workload_info``, ``triscope_workload_*``, per-accelerator
``triscope_mismatch_state`` / ``_score`` and the node roll-up; each pod's owner in the
``workloads`` table when the store has one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from triscope.core.samples import EventRecord, Sample, Tick

if TYPE_CHECKING:
    from triscope.store.api import Store

H200 = "h200-node"
CPU = "cpu-node"


def _batches(ticks: Iterator[Tick], n: int = 600) -> Iterator[list[Tick]]:
    buf: list[Tick] = []
    for t in ticks:
        buf.append(t)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf


def seed_demo(store: Store, end: float, phase_s: int = 120, cycles: int = 2, with_mismatch: bool = True,
              with_workloads: bool = False) -> dict[str, tuple[float, float]]:
    """Write the demo nodes so that their data ends at ``end``; returns node -> (start, end)
    (with ``with_workloads`` also ``dual-gpu-node`` and its ``staging-bound`` stretch)."""
    from triscope.analysis.online import MismatchTracker
    from triscope.analysis.synthetic import H200_PHASES, h200_phase_ticks

    phases = tuple(H200_PHASES) * cycles
    span = phase_s * len(phases)
    start = end - span
    tracker = MismatchTracker()
    out: dict[str, tuple[float, float]] = {}

    sli = {"ok": 0.0, "late": 0.0, "err": 0.0, "count": 0.0, "fast": 0.0}
    expected = "idle"

    def h200() -> Iterator[Tick]:
        nonlocal expected
        for i, (ts, samples, events) in enumerate(h200_phase_ticks(start=start, phase_s=phase_s, phases=phases)):
            extra = tracker.process(ts, samples) if with_mismatch else []
            evs = list(events) + [e for e in extra if isinstance(e, EventRecord)]
            smp = list(samples) + [s for s in extra if isinstance(s, Sample)]
            for e in events:
                if e.kind == "phase":
                    expected = e.details.get("expected", expected)
            # inference SLIs (deploy/slo.example.yaml): requests miss deadlines while the GPU is starved
            starved = expected == "staging-bound"
            n = 200.0
            late = 3.0 if starved else 0.2
            sli["ok"] += n - late
            sli["late"] += late
            sli["err"] += 0.05
            sli["count"] += n
            sli["fast"] += n - (2.0 if starved else 0.3)
            smp += [
                Sample("inference_requests_total", sli["ok"], {"status": "ok"}, "counter"),
                Sample("inference_requests_total", sli["late"], {"status": "deadline_exceeded"}, "counter"),
                Sample("inference_request_errors_total", sli["err"], {}, "counter"),
                Sample("inference_request_duration_seconds_count", sli["count"], {}, "counter"),
                Sample("inference_request_duration_seconds_bucket", sli["fast"], {"le": "0.25"}, "counter"),
                Sample("inference_request_duration_seconds_bucket", sli["count"], {"le": "+Inf"}, "counter"),
            ]
            smp.append(Sample("triscope_tcp_sockets", 40 + 10 * math.sin(i / 50), {"state": "time_wait"}))
            if i == int(span * 0.55):
                evs.append(EventRecord("xid", "XID 79: GPU has fallen off the bus", "critical", {"gpu": "0", "xid": 79}))
            if i == int(span * 0.6):
                evs.append(EventRecord("remediation", "dry-run: rolling restart of inference/llm-server", "info",
                                       {"rule": "gpu-xid", "action": "rolling_restart", "target": "inference/llm-server",
                                        "dry_run": True, "outcome": "dry_run"}))
            yield Tick(ts, smp, evs)

    for batch in _batches(h200()):
        store.write_ticks(H200, batch)
    out[H200] = (start, end)
    try:  # the remediation engine's audit log, when its tables exist
        from triscope.store.audit import AuditRow, record_decision

        for k, (outcome, rail) in enumerate((("dry_run", None), ("suppressed", "cooldown"))):
            record_decision(store, AuditRow(
                ts=start + span * 0.6 + 30 * k, rule="gpu-xid-restart", trigger_kind="xid",
                trigger="XID 79 on gpu 0", action="rolling_restart", target="inference/llm-server",
                target_key="deployment/inference/llm-server", node=H200, namespace="inference",
                outcome=outcome, rail=rail, dry_run=True,
                reason="XID 79 (GPU fell off the bus)" + (": target in cooldown" if rail else "")))
    except Exception:  # noqa: BLE001 - no audit table in this store: the events above stand in
        pass

    rnd = random.Random(3)

    def cpu() -> Iterator[Tick]:
        rtx = maps = 0.0
        for i in range(span):
            ts = start + i
            burst = (i // 60) % 5 == 3
            rtx += rnd.randint(8, 20) if burst else rnd.randint(0, 1)
            maps += rnd.randint(5, 30)
            evs = [EventRecord("retransmit_burst", "retransmits above threshold (peer 10.0.0.7:8443)", "warning",
                               {"peer": "10.0.0.7:8443"})] if burst and i % 60 == 0 else []
            yield Tick(ts, [
                Sample("triscope_tcp_retransmits_total", rtx, {}, "counter"),
                Sample("triscope_tcp_sockets", 120 + rnd.randint(-10, 10), {"state": "time_wait"}),
                Sample("triscope_tcp_sockets", 35, {"state": "established"}),
                Sample("triscope_dma_map_total", maps, {"device": "0000:00:04.0", "direction": "bidirectional"}, "counter"),
                Sample("triscope_cpu_busy_ratio", 0.2 + 0.1 * rnd.random()),
            ], evs)

    for batch in _batches(cpu()):
        store.write_ticks(CPU, batch)
    out[CPU] = (start, end)
    if with_workloads:
        out.update(seed_workloads(store, end, span_s=min(span, 1200)))
    return out


# ---------------------------------------------------------------------------------------------- workloads
DUAL = "dual-gpu-node"
VIT = {"namespace": "inference", "pod": "vit-serve-6c9d7f8b4-k2x7q", "container": "vit", "workload": ""}
WHISPER = {"namespace": "inference", "pod": "whisper-asr-5b8c9d6f7-p4m2n", "container": "whisper", "workload": ""}
OWNERS = {("inference", VIT["pod"]): ("Deployment", "vit-serve"),
          ("inference", WHISPER["pod"]): ("Deployment", "whisper-asr")}


class _Gpu(NamedTuple):
    workload: dict[str, str]
    sm: float
    rx: float          # bytes/s host to device
    feeder: float
    wait: float
    psi: float
    cores: float
    state: str
    score: float


# dual-gpu-node's place of each GPU (the topology collector's info series)
TOPOLOGY = {
    "0": {"numa_node": "0", "local_cpus": "0-27,56-83", "host_bridge": "pci0000:15",
          "path": "0000:15:01.0>0000:16:00.0>0000:17:01.0"},
    "1": {"numa_node": "1", "local_cpus": "28-55,84-111", "host_bridge": "pci0000:26",
          "path": "0000:26:01.0>0000:27:00.0>0000:28:01.0"},
}
NICS = {"0": {"nic": "0000:19:00.0", "interface": "ens1f0,mlx5_0", "link": "PIX"},
        "1": {"nic": "0000:2b:00.0", "interface": "ens2f0,mlx5_1", "link": "PIX"}}

WORKLOAD_STATES = ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound",
                   "network-bound")


def seed_workloads(store: Store, end: float, span_s: int = 1200, node: str = DUAL,
                   staging: tuple[float, float] = (0.35, 0.7), owners: bool = True) -> dict[str, tuple[float, float]]:
    """A two-GPU node whose data ends at ``end``: GPU 0 runs ``inference/vit-serve-…``, compute-bound
    but staging-bound over the ``staging`` fraction of the span (pageable H2D copies at ~23 GB/s of a
    63 GB/s link, SM starved, its feeder thread pegged and waiting for a CPU); GPU 1 runs
    ``inference/whisper-asr-…``, demand-limited (little SM, little link, idle feeders).  Series as
    docs/workloads.md names them, per-accelerator states as the agent's tracker stores them (the
    dominant workload's labels) and the node roll-up (the worst accelerator).  Returns
    ``{node: (start, end), "staging-bound": (start, end) of GPU 0's stretch}``."""
    rnd = random.Random(7)
    start = end - span_s
    sa, sb = start + staging[0] * span_s, start + staging[1] * span_s
    gb = 1e9
    bus = {"0": "0000:18:00.0", "1": "0000:2a:00.0"}
    uuid = {"0": "GPU-5f1c2a9e-0000-4d6b-9a51-0c1d2e3f4a50", "1": "GPU-5f1c2a9e-0001-4d6b-9a51-0c1d2e3f4a51"}
    rx = {"0": 0.0, "1": 0.0}
    tx = {"0": 0.0, "1": 0.0}
    cpu_s = {"0": 0.0, "1": 0.0}
    maps = rtx = 0.0

    def j(x: float, r: float = 0.04) -> float:
        return max(0.0, x * (1 + r * (2 * rnd.random() - 1)))

    def ticks() -> Iterator[Tick]:
        nonlocal maps, rtx
        for i in range(span_s):
            ts = start + i
            staged = sa <= ts < sb
            smp: list[Sample] = []
            # GPU 0 (vit): compute-bound, staging-bound over the stretch; GPU 1 (whisper): demand-limited
            per = {
                "0": _Gpu(VIT, 0.12, 23 * gb, 0.99, 0.32, 0.28, 2.4, "staging-bound", 0.71) if staged
                else _Gpu(VIT, 0.84, 6 * gb, 0.35, 0.03, 0.02, 1.2, "compute-bound", 0.03),
                "1": _Gpu(WHISPER, 0.14, 0.4 * gb, 0.06, 0.01, 0.01, 0.2, "demand-limited", 0.0),
            }
            for g, p in per.items():
                acc = {"gpu": g}
                wl = {**acc, **p.workload}
                sm = min(1.0, j(p.sm))
                rx[g] += j(p.rx)
                tx[g] += j(p.rx * 0.08)
                cpu_s[g] += j(p.cores)
                smp += [
                    Sample("triscope_gpu_sm_active_ratio", sm, acc),
                    Sample("triscope_gpu_tensor_active_ratio", sm * 0.7, acc),
                    Sample("triscope_gpu_utilization_ratio", 0.97 if g == "0" else 0.22, acc),
                    Sample("triscope_gpu_pcie_rx_bytes_total", rx[g], acc, "counter"),
                    Sample("triscope_gpu_pcie_tx_bytes_total", tx[g], acc, "counter"),
                    Sample("triscope_gpu_memory_used_bytes", (38 if g == "0" else 11) * gb, acc),
                    # attribution and the host-side evidence (docs/workloads.md section 1)
                    Sample("triscope_accelerator_workload_info", 1.0, {**wl, "uuid": uuid[g]}),
                    Sample("triscope_workload_processes", 1.0, wl),
                    Sample("triscope_workload_sm_ratio", sm, wl),
                    Sample("triscope_workload_cpu_seconds_total", cpu_s[g], wl, "counter"),
                    Sample("triscope_workload_feeder_busy_ratio", min(1.0, j(p.feeder, 0.02)), wl),
                    Sample("triscope_workload_cpu_wait_ratio", min(1.0, j(p.wait)), wl),
                    Sample("triscope_workload_cpu_pressure_ratio", min(1.0, j(p.psi)), wl),
                    # the verdict per accelerator, with the dominant workload's labels (section 2)
                    Sample("triscope_mismatch_score", p.score, wl),
                ]
                smp += [Sample("triscope_mismatch_state", 1.0 if st == p.state else 0.0, {**wl, "state": st})
                        for st in WORKLOAD_STATES]
                if i % 60 == 0:
                    smp += [Sample("triscope_gpu_info", 1.0, {"gpu": g, "name": "NVIDIA H200", "uuid": uuid[g],
                                                              "bus_id": bus[g]}),
                            # a two-socket box: each GPU behind a PCIe switch it shares with one NIC
                            Sample("triscope_accelerator_topology_info", 1.0, {"device": bus[g], **TOPOLOGY[g]}),
                            Sample("triscope_accelerator_nic_info", 1.0, {"device": bus[g], **NICS[g]}),
                            Sample("triscope_pcie_link_speed_gts", 32.0, {"device": bus[g], "kind": "current"}),
                            Sample("triscope_pcie_link_width", 16.0, {"device": bus[g], "kind": "current"})]
            # the node roll-up, the worst accelerator: GPU 0 (staging-bound, else compute-bound over
            # GPU 1's demand-limited)
            worst = per["0"]
            smp.append(Sample("triscope_mismatch_score", worst.score))
            smp += [Sample("triscope_mismatch_state", 1.0 if st == worst.state else 0.0, {"state": st})
                    for st in WORKLOAD_STATES]
            maps += 3 + (i % 4 == 0)
            rtx += rnd.random() < 0.02
            smp += [
                Sample("triscope_cpu_busy_ratio", j(0.58 if staged else 0.24)),
                Sample("triscope_pressure_ratio", j(0.26 if staged else 0.02), {"resource": "cpu", "kind": "some"}),
                Sample("triscope_dma_map_total", maps, {"device": bus["0"], "direction": "to_device"}, "counter"),
                Sample("triscope_tcp_retransmits_total", rtx, {}, "counter"),
                Sample("triscope_tcp_sockets", 30 + rnd.randint(0, 5), {"state": "time_wait"}),
            ]
            evs = []
            if ts <= sa < ts + 1:
                evs.append(EventRecord("mismatch_state", "GPU 0 coordination state compute-bound -> staging-bound",
                                       "warning", {"gpu": "0", "from": "compute-bound", "to": "staging-bound"}))
            yield Tick(ts, smp, evs)

    for batch in _batches(ticks()):
        store.write_ticks(node, batch)
    if owners:
        record_owners(store, OWNERS, end)
    return {node: (start, end), "staging-bound": (sa, sb)}


def record_owners(store: Store, owners: dict[tuple[str, str], tuple[str, str]], ts: float) -> int:
    """Each pod's owner in the engine's ``workloads`` table (``triscope.store.workloads``), as the
    engine resolves it from ownerReferences; 0 when this store has no such table."""
    from triscope.store.workloads import WorkloadRow, upsert_workloads

    try:
        return upsert_workloads(store, [WorkloadRow(ns, pod, kind, name, ts) for (ns, pod), (kind, name) in owners.items()])
    except Exception:  # noqa: BLE001 - not migrated in this store: the pods stay unresolved
        return 0

