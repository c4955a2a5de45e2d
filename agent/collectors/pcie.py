"""PCIe link state per device from sysfs: negotiated vs maximum speed and width.

For every device under ``/sys/bus/pci/devices`` that has ``current_link_speed``,
``max_link_speed``, ``current_link_width`` and ``max_link_width`` (PCI Express devices; plain
PCI and virtio devices have none and are skipped):

- ``triscope_pcie_link_speed_gts{device,kind=current|max}`` (GT/s),
- ``triscope_pcie_link_width{device,kind=current|max}`` (lanes),
- ``triscope_pcie_link_degraded{device}``: 1 when the link trained below what it could reach,
  where "could reach" is the lower of the device's own maximum and its upstream port's maximum
  (a Gen5 x16 GPU in a Gen4 x8 slot is not degraded at Gen4 x8; it is at Gen3 or x4),
- ``triscope_pcie_link_capacity_bytes_per_second{device}``: the usable one-way bandwidth of the
  negotiated link: GT/s x lanes x encoding / 8, encoding 8b/10b at 2.5 and 5 GT/s, 128b/130b at
  8-32 GT/s, and ~242/256 at 64 GT/s (PCIe 6 FLIT mode).

sysfs speed strings are ``"16.0 GT/s PCIe"`` on current kernels, ``"8 GT/s"`` on old ones, and
``"Unknown"`` / ``"Unknown speed"`` when the link is down or the device does not answer.

Note: many GPUs drop the link to 2.5 GT/s when idle to save power and retrain under load; pass
``degraded_on_speed=False`` to flag only lost lanes.

Cost: each of these files is a read of the device's PCIe capability in config space, which a
virtual machine traps (the H200 machine: ~0.47 ms a tick for its one GPU's four files).  The
negotiated speed and width are read every ``LINK_EVERY`` seconds (5; the last reading in between:
a link that trains down shows within that); the maxima are the device's (and its slot's)
capabilities, fixed while it is plugged in, and are read when a device appears and again every
``CAPS_EVERY`` seconds.  A device's class and place in the tree are read once, and the class filter
is applied before any link file is read; a device without link files (plain PCI, virtio) is
asked again only every ``CAPS_EVERY`` seconds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.core.pcie import link_capacity_bytes_per_second
from triscope.core.samples import Sample

CAPS_EVERY = 60.0      # seconds between reads of what does not change while a device is plugged in
LINK_EVERY = 5.0       # seconds between reads of the negotiated link (the last one in between)
BDF_RE = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
SPEED_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GT/s")

# Friendly names for the ``classes`` filter -> PCI class code prefixes (``class`` file, 0xCCSSPP).
CLASS_ALIASES = {
    "storage": "0x01",
    "network": "0x02",
    "display": "0x03",
    "gpu": "0x03",
    "bridge": "0x0604",
    "accelerator": "0x12",
    "npu": "0x12",
}


def parse_speed(text: str) -> float | None:
    """``"16.0 GT/s PCIe"`` -> 16.0; ``"Unknown"`` -> None."""

    m = SPEED_RE.search(text)
    return float(m.group(1)) if m else None


def parse_width(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


@dataclass(slots=True)
class LinkState:
    device: str
    pci_class: str
    current_speed: float | None
    max_speed: float | None
    current_width: int | None
    max_width: int | None
    upstream: str | None = None


SYSFS_HINT = "mount sysfs, or pass the host's /sys to the agent"


def pci_bus_missing(devices_dir: str) -> Availability | None:
    """Why a collector reading ``/sys/bus/pci/devices`` cannot run when that directory is missing, else None."""

    if not os.path.isdir(devices_dir):
        return Availability(False, f"{devices_dir} not found (sysfs not mounted, or no PCI bus)", SYSFS_HINT)
    return None


def list_pci_devices(devices_dir: str) -> list[str]:
    """The device names (BDFs) under ``/sys/bus/pci/devices``, sorted; CollectorUnavailable when unreadable."""

    try:
        return sorted(os.listdir(devices_dir))
    except OSError as e:
        raise CollectorUnavailable(f"cannot list {devices_dir}: {e.strerror or e}", SYSFS_HINT) from e


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


class PcieLinkCollector(BaseCollector):
    name = "pcie_link"

    def __init__(self, sys: str = "/sys", classes: Iterable[str] | None = None, include_bridges: bool = True,
                 degraded_on_speed: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.sys = sys
        self.devices_dir = os.path.join(sys, "bus/pci/devices")
        self.class_prefixes = None
        if classes is not None:
            prefixes = []
            for c in classes:
                p = CLASS_ALIASES.get(c.lower(), c.lower())
                if not re.fullmatch(r"0x[0-9a-f]{2,6}", p):
                    raise ValueError(f"unknown PCI class {c!r}: use a class code prefix like 0x0302 "
                                     f"or one of {', '.join(sorted(CLASS_ALIASES))}")
                prefixes.append(p)
            self.class_prefixes = tuple(prefixes)
        self.include_bridges = include_bridges
        self.degraded_on_speed = degraded_on_speed
        self.clock = clock
        self._static: dict[str, tuple[str, str | None]] = {}
        # BDF -> (max speed, max width, when read); max speed NaN: the device has no link files
        self._caps: dict[str, tuple[float | None, int | None, float]] = {}
        self._links: list[LinkState] | None = None     # the last reading, reused until LINK_EVERY has passed
        self._links_at = -1e18

    # -- reading -------------------------------------------------------------------------------

    def _wanted(self, pci_class: str) -> bool:
        pci_class = pci_class.lower()
        if not self.include_bridges and pci_class.startswith("0x0604"):
            return False
        return self.class_prefixes is None or pci_class.startswith(self.class_prefixes)

    def _upstream(self, dev_path: str) -> str | None:
        """The upstream port's BDF: the parent directory of the device in the /sys/devices tree."""

        parent = os.path.basename(os.path.dirname(os.path.realpath(dev_path)))
        return parent if BDF_RE.match(parent) else None

    def _caps_of(self, name: str, path: str, now: float) -> tuple[float | None, int | None] | None:
        """The device's maximum speed and width (read again every ``CAPS_EVERY`` s); None: no link files."""
        got = self._caps.get(name)
        if got is None or now - got[2] >= CAPS_EVERY:
            try:
                speed = parse_speed(_read(os.path.join(path, "max_link_speed")))
                width = parse_width(_read(os.path.join(path, "max_link_width")))
            except OSError:
                got = (float("nan"), None, now)   # no PCIe capability (plain PCI, virtio): not asked every tick
            else:
                if not speed or not width:        # a device not answering right now: asked again next time
                    self._caps.pop(name, None)
                    return speed, width
                got = (speed, width, now)
            self._caps[name] = got
        if got[0] is not None and got[0] != got[0]:
            return None
        return got[0], got[1]

    def read_links(self) -> list[LinkState]:
        names = list_pci_devices(self.devices_dir)
        now = self.clock()
        links: list[LinkState] = []
        for name in names:
            path = os.path.join(self.devices_dir, name)
            static = self._static.get(name)
            if static is None:  # class and place in the tree are fixed while the device exists
                try:
                    pci_class = _read(os.path.join(path, "class"))
                except OSError:
                    pci_class = ""
                static = self._static[name] = (pci_class, self._upstream(path))
            if not self._wanted(static[0]):
                continue
            caps = self._caps_of(name, path, now)
            if caps is None:
                continue
            try:
                cur_speed = _read(os.path.join(path, "current_link_speed"))
                cur_width = _read(os.path.join(path, "current_link_width"))
            except OSError:
                continue  # the device is gone or not answering
            links.append(LinkState(name, static[0], parse_speed(cur_speed), caps[0],
                                   parse_width(cur_width), caps[1], static[1]))
        for gone in self._static.keys() - set(names):  # hot-unplugged: forget, a new device may reuse the BDF
            del self._static[gone]
            self._caps.pop(gone, None)
        return links

    # -- protocol ------------------------------------------------------------------------------

    def check(self) -> Availability:
        missing = pci_bus_missing(self.devices_dir)
        if missing is not None:
            return missing
        try:
            links = self.read_links()
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        if not links:
            what = "no PCI Express device with link attributes" + (
                " in the selected classes" if self.class_prefixes else "")
            return Availability(False, f"{what} under {self.devices_dir} (virtual machine with virtio/PCI devices only?)",
                                "nothing to install: PCIe link state needs PCI Express devices "
                                "(GPUs, NICs, NVMe) passed through to this host")
        return Availability(True, f"ok ({len(links)} PCIe links)")

    def collect(self, now: float) -> Iterator[Sample]:
        t = self.clock()
        if self._links is None or t - self._links_at >= LINK_EVERY:
            self._links, self._links_at = self.read_links(), t
        links = self._links
        by_name = {link.device: link for link in links}
        for link in links:
            labels_cur = {"device": link.device, "kind": "current"}
            labels_max = {"device": link.device, "kind": "max"}
            if link.max_speed is not None:
                yield Sample("triscope_pcie_link_speed_gts", link.max_speed, labels_max, "gauge")
            if link.max_width:
                yield Sample("triscope_pcie_link_width", float(link.max_width), labels_max, "gauge")
            # a link that is down reads "Unknown" speed and width 0: report 0 so it shows as degraded
            cur_speed = link.current_speed or 0.0
            cur_width = link.current_width or 0
            yield Sample("triscope_pcie_link_speed_gts", cur_speed, labels_cur, "gauge")
            yield Sample("triscope_pcie_link_width", float(cur_width), labels_cur, "gauge")
            yield Sample("triscope_pcie_link_capacity_bytes_per_second",
                         link_capacity_bytes_per_second(cur_speed, cur_width) if cur_speed and cur_width else 0.0,
                         {"device": link.device}, "gauge")
            reach_speed, reach_width = link.max_speed, link.max_width
            up = by_name.get(link.upstream) if link.upstream else None
            if up is None and link.upstream:
                up = self._read_one(link.upstream)  # upstream port filtered out by class: still use its caps
            if up is not None:
                if up.max_speed and reach_speed:
                    reach_speed = min(reach_speed, up.max_speed)
                if up.max_width and reach_width:
                    reach_width = min(reach_width, up.max_width)
            degraded = bool(reach_width) and cur_width < (reach_width or 0)
            if self.degraded_on_speed and reach_speed:
                degraded = degraded or cur_speed < reach_speed
            yield Sample("triscope_pcie_link_degraded", 1.0 if degraded else 0.0, {"device": link.device}, "gauge")

    def _read_one(self, name: str) -> LinkState | None:
        """An upstream port the class filter left out: only its maxima are used."""
        caps = self._caps_of(name, os.path.join(self.devices_dir, name), self.clock())
        if caps is None:
            return None
        return LinkState(name, "", None, caps[0], None, caps[1])
