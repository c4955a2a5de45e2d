#!/usr/bin/env python3
"""Check, from a triscope store, that each phase of ``h200_phases.py`` shows what it should.

    check_phases.py --db sqlite:///h200.db --node h200 [--phases phases.jsonl --record] [--json]

Phases come from the store's ``phase`` events (``--record`` first writes them there from the
workload's ``--phases`` log).  For each phase, over its middle (edges trimmed), it computes PCIe
RX/TX bytes/s (from the GPM-integrated counters) against the link's capacity, SM and tensor
activity, NVML's coarse utilization, and the DMA map rate (eBPF ``triscope_dma_map_total``), then
checks the expectations below.  Exit status 1 when one fails, 2 when the data is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triscope.core.trace import phase_events_from_log, phase_spans  # noqa: E402
from triscope.store import Store  # noqa: E402


def _counter_rate(store: Store, metric: str, node: str, a: float, b: float, labels: dict | None = None) -> float | None:
    """Sum over matching series of (last - first) / (t_last - t_first) of the cumulative values."""
    total, any_ = 0.0, False
    for sd in store.query(metric, node=node, labels=labels, start=a, end=b, max_points=None, rate=False):
        if len(sd.ts) < 2 or sd.ts[-1] <= sd.ts[0]:
            continue
        inc = 0.0
        for x, y in zip(sd.values, sd.values[1:], strict=False):
            inc += y - x if y >= x else y  # reset-aware
        total += inc / (sd.ts[-1] - sd.ts[0])
        any_ = True
    return total if any_ else None


def _gauge_mean(store: Store, metric: str, node: str, a: float, b: float, labels: dict | None = None) -> float | None:
    vals = [v for sd in store.query(metric, node=node, labels=labels, start=a, end=b, max_points=None) for v in sd.values]
    return sum(vals) / len(vals) if vals else None


def measure(store: Store, node: str, trim: float = 2.0) -> dict[str, dict[str, float | None]]:
    spans = phase_spans(store.events(node=node, kinds=["phase"]))
    if not spans:
        raise SystemExit(f"check_phases: no phase events in the store for node {node!r} (use --phases FILE --record)")
    out: dict[str, dict[str, float | None]] = {}
    cap = _gauge_mean(store, "triscope_pcie_link_capacity_bytes_per_second", node, 0, 1e12)
    for name, (s, e) in spans.items():
        a, b = s + trim, e - 1.0
        if b - a < 2:
            a, b = s, e
        out[name] = {
            "start": s, "end": e,
            "pcie_rx_Bps": _counter_rate(store, "triscope_gpu_pcie_rx_bytes_total", node, a, b, {"gpu": "0"}),
            "pcie_tx_Bps": _counter_rate(store, "triscope_gpu_pcie_tx_bytes_total", node, a, b, {"gpu": "0"}),
            "link_capacity_Bps": cap,
            "sm_active": _gauge_mean(store, "triscope_gpu_sm_active_ratio", node, a, b, {"gpu": "0"}),
            "tensor_active": _gauge_mean(store, "triscope_gpu_tensor_active_ratio", node, a, b, {"gpu": "0"}),
            "utilization": _gauge_mean(store, "triscope_gpu_utilization_ratio", node, a, b, {"gpu": "0"}),
            "dma_map_per_s": _counter_rate(store, "triscope_dma_map_total", node, a, b),
            "dma_map_bytes_per_s": _counter_rate(store, "triscope_dma_map_bytes_total", node, a, b),
            "requests_per_s": _counter_rate(store, "inference_requests_total", node, a, b),
        }
    return out


def _lt(v: float | None, limit: float) -> bool:
    return v is not None and v < limit


def checks(m: dict[str, dict[str, float | None]]) -> list[tuple[str, bool, str]]:
    res: list[tuple[str, bool, str]] = []

    def chk(name: str, cond: bool, detail: str) -> None:
        res.append((name, bool(cond), detail))

    def g(phase: str, key: str) -> float | None:
        return m.get(phase, {}).get(key)

    def gbs(v: float | None) -> str:
        return "n/a" if v is None else f"{v / 1e9:.1f} GB/s"

    cap = g("pinned_h2d", "link_capacity_Bps") or 0.0
    if "idle" in m:
        io = (g("idle", "pcie_rx_Bps") or 0) + (g("idle", "pcie_tx_Bps") or 0)
        chk("idle: PCIe quiet", g("idle", "pcie_rx_Bps") is not None and io < 0.5e9, gbs(io))
        chk("idle: SMs quiet", _lt(g("idle", "sm_active"), 0.05), f"sm {g('idle', 'sm_active')}")
    if "pinned_h2d" in m:
        rx = g("pinned_h2d", "pcie_rx_Bps")
        chk("pinned_h2d: PCIe RX >= 70% of the link", rx is not None and cap > 0 and rx >= 0.7 * cap,
            f"{gbs(rx)} of {gbs(cap)}")
        chk("pinned_h2d: SMs idle (copy engines only)", _lt(g("pinned_h2d", "sm_active"), 0.1),
            f"sm {g('pinned_h2d', 'sm_active')}")
        chk("pinned_h2d: NVML utilization.gpu calls the copy busy", (g("pinned_h2d", "utilization") or 0) > 0.5,
            f"util {g('pinned_h2d', 'utilization')}")
    if "pinned_d2h" in m:
        tx = g("pinned_d2h", "pcie_tx_Bps")
        chk("pinned_d2h: PCIe TX >= 70% of the link", tx is not None and cap > 0 and tx >= 0.7 * cap,
            f"{gbs(tx)} of {gbs(cap)}")
    if "pageable_h2d" in m and "pinned_h2d" in m:
        rx, prx = g("pageable_h2d", "pcie_rx_Bps"), g("pinned_h2d", "pcie_rx_Bps")
        chk("pageable_h2d: moving, but below pinned (CPU staging)",
            rx is not None and prx is not None and 0.5e9 < rx < 0.7 * prx, f"{gbs(rx)} vs pinned {gbs(prx)}")
    if "compute_bf16" in m:
        chk("compute_bf16: SMs busy", (g("compute_bf16", "sm_active") or 0) >= 0.8, f"sm {g('compute_bf16', 'sm_active')}")
        chk("compute_bf16: tensor cores busy", (g("compute_bf16", "tensor_active") or 0) >= 0.5,
            f"tensor {g('compute_bf16', 'tensor_active')}")
        io = (g("compute_bf16", "pcie_rx_Bps") or 0) + (g("compute_bf16", "pcie_tx_Bps") or 0)
        chk("compute_bf16: PCIe nearly idle", g("compute_bf16", "pcie_rx_Bps") is not None and io < 0.05 * max(cap, 1.0),
            gbs(io))
    if "pin_churn" in m:
        d = g("pin_churn", "dma_map_per_s")
        others = [g(p, "dma_map_per_s") or 0.0 for p in m if p != "pin_churn"]
        chk("pin_churn: DMA mappings seen (eBPF dma:dma_map_*)", d is not None and d >= 10,
            "no DMA metrics in the store (eBPF probes not running?)" if d is None else f"{d:.1f} maps/s")
        chk("pin_churn: DMA map rate >= 10x every other phase", d is not None and d >= 10 * max(others + [0.1]),
            f"{d} vs max other {max(others + [0.0]):.2f}/s")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="store URL")
    ap.add_argument("--node", required=True, help="node the agent stored the run under")
    ap.add_argument("--phases", type=Path, help="the workload's phase log (JSON lines)")
    ap.add_argument("--record", action="store_true", help="write the phase log into the store as phase events")
    ap.add_argument("--json", action="store_true", help="print figures and results as JSON")
    args = ap.parse_args(argv)
    store = Store.open(args.db)
    try:
        if args.record:
            if not args.phases:
                ap.error("--record needs --phases FILE")
            have = {(round(e.ts, 3), e.details.get("phase"), e.details.get("edge"))
                    for e in store.events(node=args.node, kinds=["phase"])}
            new = [ev for ev in phase_events_from_log(args.phases)
                   if (round(ev.ts, 3), ev.details.get("phase"), ev.details.get("edge")) not in have]
            if new:
                store.add_events(args.node, new)
        m = measure(store, args.node)
    finally:
        store.close()
    res = checks(m)
    if args.json:
        print(json.dumps({"figures": m, "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in res]}, indent=1))
    else:
        print(f"{'phase':14s} {'RX GB/s':>8s} {'TX GB/s':>8s} {'SM':>5s} {'tensor':>6s} {'util':>5s} {'DMA map/s':>9s} {'req/s':>7s}")
        for p, f in m.items():
            def fmt(v, scale=1.0, w=8, d=2):  # type: ignore[no-untyped-def]
                return f"{'n/a':>{w}s}" if v is None else f"{v / scale:>{w}.{d}f}"
            print(f"{p:14s} {fmt(f['pcie_rx_Bps'], 1e9)} {fmt(f['pcie_tx_Bps'], 1e9)} {fmt(f['sm_active'], w=5)} "
                  f"{fmt(f['tensor_active'], w=6)} {fmt(f['utilization'], w=5)} {fmt(f['dma_map_per_s'], w=9, d=1)} "
                  f"{fmt(f['requests_per_s'], w=7, d=1)}")
        for n, ok, d in res:
            print(f"{'PASS' if ok else 'FAIL'}  {n}: {d}")
    return 0 if all(ok for _, ok, _ in res) else 1


if __name__ == "__main__":
    sys.exit(main())
