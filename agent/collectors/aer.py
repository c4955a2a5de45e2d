"""PCIe Advanced Error Reporting counters from sysfs.

AER-capable devices (kernel with ``CONFIG_PCIEAER``) have three files under
``/sys/bus/pci/devices/<bdf>/``: ``aer_dev_correctable``, ``aer_dev_fatal``, ``aer_dev_nonfatal``,
one error type per line and a total at the end::

    RxErr 0                      (current kernels; 4.19-5.x print "Receiver Error 2",
    BadTLP 3                      "RELAY_NUM Rollover 0": the count is the last word)
    ...
    dev_cor_errs_bit[5] 1        (a status bit the kernel has no name for, shown only when non-zero)
    TOTAL_ERR_COR 3

Root ports also have ``aer_rootport_total_err_cor|fatal|nonfatal`` (one number: the ERR_* messages
received from the hierarchy below).

Emits ``triscope_pcie_aer_errors_total{device,severity}`` from the ``TOTAL_ERR_*`` line (severity
``correctable|nonfatal|fatal``), ``triscope_pcie_aer_error_types_total{device,severity,error}`` for
each error type once it is non-zero, ``triscope_pcie_aer_rootport_errors_total{device,severity}``,
and an ``aer`` event whenever a device's total grows between two ticks.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.agent.collectors.pcie import list_pci_devices, pci_bus_missing
from triscope.core.samples import EventRecord, Sample

# file suffix -> (severity label, TOTAL_ line name)
SEVERITIES = {
    "correctable": ("correctable", "TOTAL_ERR_COR"),
    "nonfatal": ("nonfatal", "TOTAL_ERR_NONFATAL"),
    "fatal": ("fatal", "TOTAL_ERR_FATAL"),
}
ROOTPORT_FILES = {"cor": "correctable", "nonfatal": "nonfatal", "fatal": "fatal"}
EVENT_SEVERITY = {"correctable": "warning", "nonfatal": "error", "fatal": "critical"}

NO_AER_REASON = "no AER counters in sysfs"
NO_AER_HINT = ("use a kernel built with CONFIG_PCIEPORTBUS=y and CONFIG_PCIEAER=y (stock Debian/Ubuntu "
               "kernels have both) on a host with PCIe devices; on firmware-first platforms enable "
               "OS-native AER in the BIOS. Without it AER errors are invisible to triscope")


def parse_aer_file(text: str) -> tuple[dict[str, int], int | None]:
    """One ``aer_dev_*`` file -> (``{error type: count}``, ``TOTAL_ERR_*`` value or None).

    The count is the last whitespace-separated word; the name is everything before it (old kernels
    use names with spaces).  Raises ``ValueError`` on a line whose last word is not a number.
    """

    types: dict[str, int] = {}
    total: int | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, _, count = line.rpartition(" ")
        name = name.strip()
        if not name or not count.isdigit():
            raise ValueError(f"unexpected AER counter line {line!r}")
        if name.startswith("TOTAL_ERR_"):
            total = int(count)
        else:
            types[name] = int(count)
    return types, total


def kernel_has_pcieaer(proc: str = "/proc") -> bool | None:
    """True/False from ``/proc/config.gz`` when the kernel exposes its config, else None."""

    try:
        with gzip.open(os.path.join(proc, "config.gz"), "rt") as f:
            return any(line.startswith("CONFIG_PCIEAER=y") for line in f)
    except (OSError, EOFError):
        return None


class AerCollector(BaseCollector):
    name = "aer"

    def __init__(self, sys: str = "/sys", proc: str = "/proc") -> None:
        self.sys = sys
        self.proc = proc
        self.devices_dir = os.path.join(sys, "bus/pci/devices")
        self._prev: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}

    def read_counters(self) -> tuple[dict[tuple[str, str], tuple[int, dict[str, int]]], dict[tuple[str, str], int]]:
        """``({(device, severity): (total, types)}, {(rootport, severity): total})``."""

        names = list_pci_devices(self.devices_dir)
        dev: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
        root: dict[tuple[str, str], int] = {}
        for name in names:
            base = os.path.join(self.devices_dir, name)
            for suffix, (severity, _total_name) in SEVERITIES.items():
                try:
                    with open(os.path.join(base, f"aer_dev_{suffix}")) as f:
                        text = f.read()
                except OSError:
                    continue
                try:
                    types, total = parse_aer_file(text)
                except ValueError as e:
                    raise CollectorUnavailable(f"{base}/aer_dev_{suffix}: {e}", "unknown AER sysfs format") from e
                dev[(name, severity)] = (total if total is not None else sum(types.values()), types)
            for suffix, severity in ROOTPORT_FILES.items():
                try:
                    with open(os.path.join(base, f"aer_rootport_total_err_{suffix}")) as f:
                        root[(name, severity)] = int(f.read().strip())
                except (OSError, ValueError):
                    continue
        return dev, root

    def _no_aer(self) -> Availability:
        built = kernel_has_pcieaer(self.proc)
        if built is False:
            why = "kernel built without CONFIG_PCIEAER"
        elif built is True:
            why = "the kernel has AER but no PCIe device here has an AER capability, or firmware owns AER"
        else:
            why = "kernel built without CONFIG_PCIEAER, or no PCIe device with an AER capability"
        return Availability(False, f"{NO_AER_REASON} ({why})", NO_AER_HINT)

    def check(self) -> Availability:
        missing = pci_bus_missing(self.devices_dir)
        if missing is not None:
            return missing
        try:
            dev, root = self.read_counters()
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        if not dev and not root:
            return self._no_aer()
        return Availability(True, f"ok ({len({d for d, _ in dev})} devices with AER counters)")

    def collect(self, now: float) -> Iterator[Sample | EventRecord]:
        dev, root = self.read_counters()
        if not dev and not root:
            a = self._no_aer()
            raise CollectorUnavailable(a.reason, a.hint)
        for (device, severity), (total, types) in dev.items():
            yield Sample("triscope_pcie_aer_errors_total", float(total), {"device": device, "severity": severity},
                         "counter")
            prev = self._prev.get((device, severity))
            for error, count in types.items():
                if count or (prev and prev[1].get(error)):
                    yield Sample("triscope_pcie_aer_error_types_total", float(count),
                                 {"device": device, "severity": severity, "error": error}, "counter")
            if prev is not None and total > prev[0]:
                grew = {e: c - prev[1].get(e, 0) for e, c in types.items() if c > prev[1].get(e, 0)}
                what = ", ".join(f"{e} +{d}" for e, d in sorted(grew.items())) or "type not reported"
                yield EventRecord(
                    "aer", f"PCIe AER: {total - prev[0]} {severity} error(s) on {device} ({what})",
                    EVENT_SEVERITY[severity],  # type: ignore[arg-type]
                    {"device": device, "severity": severity, "delta": total - prev[0], "total": total,
                     "types": grew}, now)
        self._prev = dev
        for (device, severity), total in root.items():
            yield Sample("triscope_pcie_aer_rootport_errors_total", float(total),
                         {"device": device, "severity": severity}, "counter")
