"""The Node page's topology picture: NUMA nodes (sockets), root complexes, PCIe switches, the
accelerators below them and their nearest NICs, from the topology collector's info series
(``triscope_accelerator_topology_info``, ``triscope_accelerator_nic_info``), with where each
accelerator's workloads run (``triscope_workload_cpu_local_ratio`` / ``_memory_local_ratio``).

Read from each series' newest point; a series older than ``STALE_S`` before the node's newest one
is a device gone (hot-unplugged, or an older agent run) and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from triscope.analysis.config import MismatchThresholds
from triscope.dashboard.figures import Figure, new_figure
from triscope.store.reader import LatestValue, StoreReader

TOPO = "triscope_accelerator_topology_info"
NIC = "triscope_accelerator_nic_info"
CPU_LOCAL = "triscope_workload_cpu_local_ratio"
MEM_LOCAL = "triscope_workload_memory_local_ratio"
STALE_S = 1200.0
LINK_COLOURS = {"PIX": "#2e7d32", "PXB": "#2e7d32", "PHB": "#f9a825", "NODE": "#f9a825", "SYS": "#c62828",
                "unknown": "#757575"}
REMOTE_BAR = MismatchThresholds().numa_remote   # the verdict's bar: at or past it a workload is fed from afar


@dataclass
class Device:
    bus: str
    name: str                      # "GPU 0", or the bus id when no gpu_info names it
    numa: str                      # "0", "1", "unknown"
    cpus: str
    host_bridge: str
    path: list[str]
    cpu_local: float | None = None       # the lowest of its workloads' (the one fed from furthest)
    mem_local: float | None = None
    nics: list[tuple[str, str, str]] = field(default_factory=list)   # (nic bus, interface, link)


def _unknown_last(numa: str) -> tuple[bool, str]:
    return numa == "unknown", numa


@dataclass
class Topology:
    devices: list[Device]

    @property
    def sockets(self) -> list[str]:
        return sorted({d.numa for d in self.devices}, key=_unknown_last)


def node_topology(store: StoreReader, node: str) -> Topology:
    newest: dict[str, list[LatestValue]] = {}
    for metric in (TOPO, NIC, CPU_LOCAL, MEM_LOCAL, "triscope_gpu_info"):
        newest[metric] = store.latest(node, metric=metric)
    every = [lv.ts for lvs in newest.values() for lv in lvs]
    if not newest[TOPO]:
        return Topology([])
    fresh_from = max(every) - STALE_S
    names = {str(lv.info.labels.get("bus_id", "")): f"GPU {lv.info.labels.get('gpu', '')}"
             for lv in newest["triscope_gpu_info"]}
    gpu_bus = {str(lv.info.labels.get("gpu", "")): str(lv.info.labels.get("bus_id", ""))
               for lv in newest["triscope_gpu_info"]}
    devices: dict[str, Device] = {}
    for lv in newest[TOPO]:
        if lv.ts < fresh_from:
            continue
        lab = lv.info.labels
        bus = str(lab.get("device", ""))
        devices[bus] = Device(bus, names.get(bus, bus), str(lab.get("numa_node", "unknown")),
                              str(lab.get("local_cpus", "")), str(lab.get("host_bridge", "")),
                              [p for p in str(lab.get("path", "")).split(">") if p])
    for lv in newest[NIC]:
        lab = lv.info.labels
        d = devices.get(str(lab.get("device", "")))
        if d is not None and lv.ts >= fresh_from:
            d.nics.append((str(lab.get("nic", "")), str(lab.get("interface", "")), str(lab.get("link", "unknown"))))
    for metric in (CPU_LOCAL, MEM_LOCAL):
        for lv in newest[metric]:
            d = devices.get(gpu_bus.get(str(lv.info.labels.get("gpu", "")), ""))
            if d is not None and lv.ts >= fresh_from:
                if metric == CPU_LOCAL:
                    d.cpu_local = _least(d.cpu_local, lv.value)
                else:
                    d.mem_local = _least(d.mem_local, lv.value)
    return Topology(sorted(devices.values(), key=_device_order))


def _least(old: float | None, v: float) -> float:
    return v if old is None else min(old, v)


def _device_order(d: Device) -> tuple[bool, str, str, list[str]]:
    return d.numa == "unknown", d.numa, d.host_bridge, d.path


def _switch(d: Device) -> str:
    """The switch a device hangs off: its root port's child (the switch's upstream port), else the root port."""
    return d.path[1] if len(d.path) >= 2 else (d.path[0] if d.path else d.host_bridge)


def topology_figure(t: Topology, height: int = 340) -> Figure:
    """Sockets at the top, then root complexes, switches, and the accelerators and NICs at the bottom;
    an accelerator is red when a workload on it runs (or keeps its pages) mostly off its NUMA node."""
    xs: dict[str, float] = {}
    slot = 0.0
    edges: list[tuple[str, str, str]] = []        # (from, to, colour)
    labels: dict[str, tuple[float, str, str, str]] = {}   # key -> (y, text, hover, colour)
    placed_nics: set[str] = set()
    for sock in t.sockets:
        sk = f"socket:{sock}"
        in_sock = [d for d in t.devices if d.numa == sock]
        cpus = next((d.cpus for d in in_sock if d.cpus and d.cpus != "unknown"), "")
        labels[sk] = (3, f"NUMA {sock}" if sock != "unknown" else "NUMA unknown",
                      f"CPUs {cpus}" if cpus else "the kernel gives no NUMA node (numa_node -1: a VM?)", "#37474f")
        for hb in sorted({d.host_bridge for d in in_sock}):
            hk = f"hb:{hb}"
            labels[hk] = (2, hb, f"root complex {hb}", "#546e7a")
            edges.append((sk, hk, "#90a4ae"))
            for sw in sorted({_switch(d) for d in in_sock if d.host_bridge == hb}):
                wk = f"sw:{sw}"
                labels[wk] = (1, "switch" if sw not in (hb,) else hb, f"PCIe bridge {sw}", "#78909c")
                edges.append((hk, wk, "#90a4ae"))
                for d in (x for x in in_sock if x.host_bridge == hb and _switch(x) == sw):
                    dk = f"dev:{d.bus}"
                    remote = [v for v in (d.cpu_local, d.mem_local) if v is not None and 1 - v >= REMOTE_BAR]
                    where = []
                    if d.cpu_local is not None:
                        where.append(f"its workloads' CPU time local {d.cpu_local:.0%}")
                    if d.mem_local is not None:
                        where.append(f"host pages local {d.mem_local:.0%}")
                    labels[dk] = (0, d.name, f"{d.name} {d.bus}<br>NUMA {d.numa}, local CPUs {d.cpus or 'unknown'}"
                                  + (f"<br>{'; '.join(where)}" if where else ""),
                                  "#c62828" if remote else "#1565c0")
                    xs[dk] = slot
                    slot += 1
                    edges.append((wk, dk, "#90a4ae"))
                    for nic, iface, link in d.nics:
                        nk = f"nic:{nic}"
                        if nic not in placed_nics:
                            placed_nics.add(nic)
                            labels[nk] = (0, (iface.split(",")[0] or nic), f"NIC {nic} {iface}", "#6a1b9a")
                            xs[nk] = slot
                            slot += 1
                        edges.append((dk, nk, LINK_COLOURS.get(link, "#757575") + "|" + link))
                xs[wk] = _mean([xs[k] for a, k, _c in edges if a == wk and k in xs])
            xs[hk] = _mean([xs[k] for a, k, _c in edges if a == hk and k in xs])
        xs[sk] = _mean([xs[k] for a, k, _c in edges if a == sk and k in xs])
    fig = new_figure()
    for a, b, colour in edges:
        if a not in xs or b not in xs:
            continue
        colour, _, link = colour.partition("|")
        ya, yb = labels[a][0], labels[b][0]
        if link:    # accelerator -> NIC: a curve below the row, labelled with the link
            fig.add_trace({"type": "scatter", "x": [xs[a], (xs[a] + xs[b]) / 2, xs[b]], "y": [ya, -0.45, yb],
                           "mode": "lines+text", "line": {"color": colour, "width": 2, "shape": "spline"},
                           "text": ["", link, ""], "textposition": "bottom center", "hoverinfo": "skip",
                           "showlegend": False})
        else:
            fig.add_trace({"type": "scatter", "x": [xs[a], xs[b]], "y": [ya, yb], "mode": "lines",
                           "line": {"color": colour, "width": 1}, "hoverinfo": "skip", "showlegend": False})
    keys = [k for k in labels if k in xs]
    fig.add_trace({
        "type": "scatter", "x": [xs[k] for k in keys], "y": [labels[k][0] for k in keys], "mode": "markers+text",
        "marker": {"size": [22 if k.startswith("dev:") else 16 for k in keys], "color": [labels[k][3] for k in keys],
                   "symbol": ["square" if k.startswith("dev:") else "circle" for k in keys]},
        "text": [labels[k][1] for k in keys], "textposition": "top center", "hovertext": [labels[k][2] for k in keys],
        "hoverinfo": "text", "showlegend": False, "name": "topology"})
    fig.update_layout(height=height, margin={"l": 20, "r": 20, "t": 30, "b": 20}, plot_bgcolor="white",
                      xaxis={"visible": False, "range": [-0.8, max(slot, 1) - 0.2]},
                      yaxis={"visible": False, "range": [-0.9, 3.6]},
                      title={"text": "red: a workload on it runs or keeps its pages mostly off its NUMA node; "
                                     "NIC links in nvidia-smi topo terms", "font": {"size": 12}})
    return fig


def _mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else 0.0
