"""The one-socket topology measurement on the H200 machine: where sysfs puts the GPU, and pinned H2D with the feeder on each CPU set.

    python -m examples.hostlab.h200_topology --out OUTDIR        # on the H200 machine, as root

Writes ``topology.json``: every accelerator's and NIC's place as the agent's topology collector reads
it (``read_places``: NUMA node, ``local_cpulist``, root complex, bridges), the raw sysfs values beside
it, the machine's NUMA nodes, the collector's own samples, and for each CPU set a feeder may run on
(each NUMA node's CPUs, the GPU's local CPUs, two halves of the machine, one CPU) the pinned
host-to-device bandwidth of 256 MiB copies and the latency of 64 KiB ones, with the pinned buffer
allocated while the feeder ran there (first touch puts its pages on that CPU's node).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from triscope.agent.collectors.topology import TopologyCollector, read_places
from triscope.core.cpulist import parse_cpulist


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"<{e.strerror}>"


def numa_nodes() -> dict[str, str]:
    base = "/sys/devices/system/node"
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return {}
    return {n: _read(f"{base}/{n}/cpulist") for n in names}


def cpu_sets(local: str, nodes: dict[str, str]) -> dict[str, set[int]]:
    allowed = sorted(os.sched_getaffinity(0))
    half = len(allowed) // 2
    sets: dict[str, set[int]] = {"all": set(allowed)}
    for name, cpus in nodes.items():
        sets[f"{name} ({cpus})"] = set(parse_cpulist(cpus))
    if local:
        sets[f"local_cpulist ({local})"] = set(parse_cpulist(local))
    if half:
        sets[f"first half ({allowed[0]}-{allowed[half - 1]})"] = set(allowed[:half])
        sets[f"second half ({allowed[half]}-{allowed[-1]})"] = set(allowed[half:])
    sets[f"one CPU ({allowed[-1]})"] = {allowed[-1]}
    return {k: v & set(allowed) for k, v in sets.items() if v & set(allowed)}


def h2d(sets: dict[str, set[int]], mib: int = 256, reps: int = 12) -> list[dict[str, Any]]:
    import torch

    dev = torch.device("cuda")
    dst = torch.empty(mib << 20, dtype=torch.uint8, device=dev)
    small_dst = torch.empty(64 << 10, dtype=torch.uint8, device=dev)
    out = []
    for name, cpus in sets.items():
        os.sched_setaffinity(0, cpus)
        time.sleep(0.05)
        src = torch.empty(mib << 20, dtype=torch.uint8).pin_memory()
        src.fill_(1)                        # touched by the feeder, on its CPUs
        small = torch.ones(64 << 10, dtype=torch.uint8).pin_memory()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            rates.append((mib << 20) / (time.perf_counter() - t0) / 1e9)
        lat = []
        for _ in range(200):
            t0 = time.perf_counter()
            small_dst.copy_(small, non_blocking=True)
            torch.cuda.synchronize()
            lat.append((time.perf_counter() - t0) * 1e6)
        out.append({"cpus": name, "n_cpus": len(cpus), "h2d_gbps_median": round(statistics.median(rates), 2),
                    "h2d_gbps_min": round(min(rates), 2), "h2d_gbps_max": round(max(rates), 2),
                    "copy_64k_us_median": round(statistics.median(lat), 1),
                    "copy_64k_us_p99": round(sorted(lat)[int(len(lat) * 0.99) - 1], 1)})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
        del src, small
    os.sched_setaffinity(0, sets["all"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.hostlab.h200_topology", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    places = read_places("/sys")
    raw = {}
    for p in places:
        base = f"/sys/bus/pci/devices/{p.bdf}"
        raw[p.bdf] = {"numa_node": _read(f"{base}/numa_node"), "local_cpulist": _read(f"{base}/local_cpulist"),
                      "realpath": os.path.realpath(base), "link": f"{_read(f'{base}/current_link_speed')} "
                      f"x{_read(f'{base}/current_link_width')}"}
    nodes = numa_nodes()
    samples = []
    try:
        col = TopologyCollector()
        samples = [{"metric": s.name, "labels": dict(s.labels), "value": s.value} for s in col.collect(time.time())]
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: the sysfs reads above stand on their own
        samples = [{"error": f"{type(e).__name__}: {e}"}]
    accel = [p for p in places if p.kind == "accelerator"]
    local = accel[0].local_cpus if accel else ""
    result: dict[str, Any] = {"places": [{"bdf": p.bdf, "kind": p.kind, "host_bridge": p.host_bridge,
                                          "bridges": list(p.bridges), "numa_node": p.numa_label,
                                          "local_cpus": p.local_cpus, "interfaces": list(p.interfaces)}
                                         for p in places],
                              "sysfs": raw, "numa_nodes": nodes, "nproc": os.cpu_count(), "collector": samples}
    try:
        result["h2d"] = h2d(cpu_sets(local, nodes))
    except Exception as e:  # noqa: BLE001 - the map above is still worth bringing back
        result["h2d_error"] = f"{type(e).__name__}: {e}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "topology.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "collector"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
