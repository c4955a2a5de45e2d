"""Realistic demo data for the dashboard's tests, benchmark and screenshots.

``seed_demo(store, end)`` writes two nodes through ``store.write_ticks`` (the agent's path):

* ``h200-node``: an H200-shaped trace (``triscope.analysis.synthetic.h200_phase_ticks``: idle, pinned and
  pageable copies, matmul, pin churn, D2H), run through the agent's own
  ``triscope.analysis.online.MismatchTracker`` so the mismatch state/score series and state-change events
  are stored the way the agent stores them; plus an XID error and a remediation event;
* ``cpu-node``: a host without accelerators (TCP retransmits, TIME_WAIT, DMA maps, CPU).

``seed_bench(store, end, hours)``: one node, 10 series at 1 Hz (the benchmark's shape).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from triscope.samples import EventRecord, Sample, Tick

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


def seed_demo(store: Store, end: float, phase_s: int = 120, cycles: int = 2, with_mismatch: bool = True) -> dict[str, tuple[float, float]]:
    """Write the demo nodes so that their data ends at ``end``; returns node -> (start, end)."""
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
        from triscope.store.audit import record_decision

        for k, (outcome, rail) in enumerate((("dry_run", None), ("suppressed", "cooldown"))):
            record_decision(store, ts=start + span * 0.6 + 30 * k, rule="gpu-xid-restart", trigger_kind="xid",
                            trigger="XID 79 on gpu 0", action="rolling_restart", target="inference/llm-server",
                            target_key="deployment/inference/llm-server", node=H200, namespace="inference",
                            outcome=outcome, rail=rail, dry_run=True,
                            reason="XID 79 (GPU fell off the bus)" + (": target in cooldown" if rail else ""))
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
    return out


def seed_bench(store: Store, end: float, hours: float = 24.0, node: str = "bench-node", batch: int = 3600) -> int:
    """One node, 10 plotted series at 1 Hz (2 GPUs: SM active x2, PCIe RX/TX x2, tensor; DMA maps,
    retransmits, TIME_WAIT) plus the 4 mismatch-state series of the ribbon, over ``hours`` ending at ``end``.  Returns samples written."""

    n = int(hours * 3600)
    start = end - n
    rnd = random.Random(11)
    rx = [0.0, 0.0]
    tx = [0.0, 0.0]
    maps = rtx = 0.0
    states = ("compute-bound", "io-saturated", "staging-bound", "idle")
    written = 0
    ticks: list[Tick] = []
    for i in range(n):
        ts = start + i
        phase = (i // 900) % 4  # 15-minute phases: compute, pinned copy, pageable copy, idle
        smp: list[Sample] = []
        for g in (0, 1):
            lab = {"gpu": str(g)}
            sm = (0.95, 0.02, 0.03, 0.0)[phase] + 0.02 * rnd.random()
            r = (0.1, 58.0, 23.0, 0.01)[phase] * 1e9 * (1 + 0.03 * rnd.random()) / (1 + g)
            rx[g] += r
            tx[g] += r * 0.1
            smp += [Sample("triscope_gpu_sm_active_ratio", min(1.0, sm), lab),
                    Sample("triscope_gpu_pcie_rx_bytes_total", rx[g], lab, "counter"),
                    Sample("triscope_gpu_pcie_tx_bytes_total", tx[g], lab, "counter")]
            if g == 0:
                smp.append(Sample("triscope_gpu_tensor_active_ratio", min(1.0, sm * 0.8), lab))
        maps += rnd.randint(0, 40) + (1100 if phase == 2 else 0)
        rtx += rnd.randint(0, 2)
        smp += [
            Sample("triscope_dma_map_total", maps, {"device": "0000:1b:00.0", "direction": "to_device"}, "counter"),
            Sample("triscope_tcp_retransmits_total", rtx, {}, "counter"),
            Sample("triscope_tcp_sockets", 50 + rnd.randint(0, 20), {"state": "time_wait"}),
        ]
        # the ribbon, stored the way the agent stores it: 1 for the current state, 0 for the others
        smp += [Sample("triscope_mismatch_state", 1.0 if k == phase else 0.0, {"state": st}) for k, st in enumerate(states)]
        ticks.append(Tick(ts, smp))
        if len(ticks) >= batch:
            written += store.write_ticks(node, ticks)
            ticks = []
    if ticks:
        written += store.write_ticks(node, ticks)
    return written
