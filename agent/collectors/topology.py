"""The static topology of a node: which NUMA node and PCIe path each accelerator hangs off, and the
NICs that share a switch or a root with it.

From sysfs only (``/sys/bus/pci/devices/BDF`` and where its link points in ``/sys/devices``):

- ``triscope_accelerator_topology_info{device, numa_node, local_cpus, host_bridge, path}`` (1):
  ``numa_node`` from ``numa_node`` (``-1`` — a VM, or firmware that does not say — reads
  ``unknown``, never remote), ``local_cpus`` from ``local_cpulist``, ``host_bridge`` the root
  complex (``pci0000:3d``), ``path`` the bridges from the root port down to the device
  (``0000:3d:01.0>0000:3e:00.0>0000:3f:02.0``);
- ``triscope_accelerator_nic_info{device, nic, interface, link}`` (1) for the NICs nearest the
  accelerator: ``link`` in ``nvidia-smi topo -m``'s terms, ``PIX`` (one PCIe switch between
  them), ``PXB`` (several switches, same root port), ``PHB`` (the host bridge), ``NODE`` (host
  bridges of one NUMA node), ``SYS`` (across NUMA nodes), ``unknown`` (different host bridges
  and no NUMA node to tell).  GPUDirect RDMA wants ``PIX`` or ``PXB``.

Accelerators: PCI class 0x0302 (3D controller: data-centre GPUs), 0x12 (processing accelerators:
Ascend NPUs) and 0x0300 from NVIDIA or AMD; NICs: class 0x02 (Ethernet, InfiniBand).  The map is
read at start and again every ``refresh_s`` (a hot-plug), never on the tick's path otherwise.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.agent.collectors.pcie import BDF_RE, SYSFS_HINT, list_pci_devices, pci_bus_missing
from triscope.core.samples import Sample

GPU_VENDORS = ("0x10de", "0x1002")   # NVIDIA, AMD: a VGA-class device of theirs is an accelerator
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS", "unknown")   # nearest first


@dataclass(frozen=True, slots=True)
class PciPlace:
    """Where one device sits: its root complex, the bridges above it, its NUMA node and local CPUs."""

    bdf: str
    kind: str                 # "accelerator" or "nic"
    host_bridge: str          # "pci0000:3d"
    bridges: tuple[str, ...]  # from the root port down, the device itself excluded
    numa_node: int | None     # None: unknown (-1 or unreadable)
    local_cpus: str           # local_cpulist as the kernel writes it ("" unknown)
    interfaces: tuple[str, ...] = ()   # a NIC's net/ and infiniband/ names

    @property
    def numa_label(self) -> str:
        return "unknown" if self.numa_node is None else str(self.numa_node)


def link_level(a: PciPlace, b: PciPlace) -> str:
    """How two devices reach each other, in ``nvidia-smi topo -m``'s terms (see the module doc)."""
    if a.host_bridge != b.host_bridge:
        if a.numa_node is None or b.numa_node is None:
            return "unknown"
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    common = 0
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"          # different root ports of one root complex
    # below the shared bridges each side has its own downstream port; more than that is another switch
    below = max(len(a.bridges), len(b.bridges)) - common
    return "PIX" if below <= 1 else "PXB"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _kind(pci_class: str, vendor: str) -> str | None:
    c = pci_class.lower()
    if c.startswith(("0x0302", "0x12")) or (c.startswith("0x0300") and vendor.lower() in GPU_VENDORS):
        return "accelerator"
    if c.startswith("0x02"):
        return "nic"
    return None


def device_locality(path: str) -> tuple[int | None, str]:
    """A PCI device's NUMA node (None: -1 or unreadable, i.e. unknown) and ``local_cpulist`` ("" unknown)."""
    try:
        node: int | None = int(_read(os.path.join(path, "numa_node")))
    except (OSError, ValueError):
        node = None
    try:
        cpus = _read(os.path.join(path, "local_cpulist"))
    except OSError:
        cpus = ""
    return (None if node is None or node < 0 else node), cpus


def read_places(sys_root: str = "/sys") -> list[PciPlace]:
    """Every accelerator and NIC under ``sys_root``, with its place in the PCIe tree."""
    devices_dir = os.path.join(sys_root, "bus/pci/devices")
    out: list[PciPlace] = []
    for bdf in list_pci_devices(devices_dir):
        path = os.path.join(devices_dir, bdf)
        try:
            kind = _kind(_read(os.path.join(path, "class")), _read(os.path.join(path, "vendor")))
        except OSError:
            continue
        if kind is None or (kind == "nic" and os.path.exists(os.path.join(path, "physfn"))):
            continue     # an SR-IOV virtual function sits under its physical NIC: that one is listed
        parts = os.path.realpath(path).split(os.sep)
        hosts = [i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p]
        if not hosts:
            continue
        host_at = hosts[-1]
        bridges = tuple(p for p in parts[host_at + 1:-1] if BDF_RE.match(p))
        node, cpus = device_locality(path)
        names: list[str] = []
        for sub in ("net", "infiniband"):
            with contextlib.suppress(OSError):
                names += sorted(os.listdir(os.path.join(path, sub)))
        out.append(PciPlace(bdf, kind, parts[host_at], bridges, node, cpus, tuple(names)))
    return out


def nearest_nics(acc: PciPlace, nics: list[PciPlace]) -> list[tuple[PciPlace, str]]:
    """The NICs at the nearest link level from ``acc`` (all of them when several share it)."""
    if not nics:
        return []
    ranked = [(LEVELS.index(link_level(acc, n)), n) for n in nics]
    best = min(r for r, _ in ranked)
    return [(n, LEVELS[r]) for r, n in ranked if r == best]


class TopologyCollector(BaseCollector):
    name = "topology"

    def __init__(self, sys: str = "/sys", refresh_s: float = 600.0, clock: object = time.monotonic) -> None:
        self.sys = sys
        self.devices_dir = os.path.join(sys, "bus/pci/devices")
        self.refresh_s = refresh_s
        self._clock = clock
        self._samples: list[Sample] = []
        self._read_at: float | None = None

    def check(self) -> Availability:
        missing = pci_bus_missing(self.devices_dir)
        if missing is not None:
            return missing
        try:
            places = read_places(self.sys)
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        accs = [p for p in places if p.kind == "accelerator"]
        if not accs:
            return Availability(False, f"no accelerator (PCI class 0x0302, 0x12, or an NVIDIA/AMD 0x0300) under "
                                f"{self.devices_dir}", SYSFS_HINT)
        known = sum(1 for p in accs if p.numa_node is not None)
        return Availability(True, f"ok ({len(accs)} accelerators, {known} with a NUMA node, "
                                  f"{sum(1 for p in places if p.kind == 'nic')} NICs)")

    def places(self) -> list[PciPlace]:
        return read_places(self.sys)

    def _build(self) -> list[Sample]:
        places = self.places()
        nics = [p for p in places if p.kind == "nic"]
        out: list[Sample] = []
        for acc in (p for p in places if p.kind == "accelerator"):
            out.append(Sample("triscope_accelerator_topology_info", 1.0, {
                "device": acc.bdf, "numa_node": acc.numa_label, "local_cpus": acc.local_cpus or "unknown",
                "host_bridge": acc.host_bridge, "path": ">".join(acc.bridges)}, "gauge"))
            for nic, level in nearest_nics(acc, nics):
                out.append(Sample("triscope_accelerator_nic_info", 1.0, {
                    "device": acc.bdf, "nic": nic.bdf, "interface": ",".join(nic.interfaces), "link": level},
                    "gauge"))
        return out

    def collect(self, now: float) -> Iterator[Sample]:
        t = self._clock()  # type: ignore[operator]
        if self._read_at is None or t - self._read_at >= self.refresh_s:
            self._samples = self._build()
            self._read_at = t
        yield from self._samples
