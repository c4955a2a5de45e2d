"""Which host collectors can run here, and for each that cannot, why and what to install.

``host_doctor(proc, sys)`` runs every host collector's ``check()`` (procfs / sysfs collectors, and
``--scrape`` endpoints when given) and returns one row per collector; ``pod_resources_doctor(path)``
says whether the kubelet's pod-resources socket answers (workload attribution names pods through
it).  ``triscope doctor`` prints these next to the eBPF / NVML / npu-smi / workloads rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from triscope.agent.collectors.aer import AerCollector
from triscope.agent.collectors.base import Availability, Collector
from triscope.agent.collectors.cpu import CpuCollector
from triscope.agent.collectors.pcie import PcieLinkCollector
from triscope.agent.collectors.pressure import PressureCollector
from triscope.agent.collectors.scrape import ScrapeCollector
from triscope.agent.collectors.tcp import TcpCollector
from triscope.agent.collectors.topology import TopologyCollector
from triscope.agent.workloads.podresources import probe


class DoctorRow(NamedTuple):
    collector: str
    ok: bool
    reason: str
    hint: str


def _row(name: str, make: Callable[[], Collector]) -> DoctorRow:
    try:
        c = make()
    except Exception as e:  # noqa: BLE001 - a collector that cannot even be built is a finding, not a crash
        return DoctorRow(name, False, f"cannot start: {e}", "")
    try:
        av = c.check()
    except Exception as e:  # noqa: BLE001 - a check that fails is a finding, not a crash
        av = Availability(False, f"check failed: {e}", "")
    finally:
        with contextlib.suppress(Exception):
            c.close()
    return DoctorRow(c.name or name, bool(av.ok), av.reason, av.hint)


def host_doctor(proc: str = "/proc", sys: str = "/sys", scrape: Iterable[str] = (),
                scrape_timeout: float = 2.0) -> list[DoctorRow]:

    rows = [
        _row("tcp", lambda: TcpCollector(proc=proc)),
        _row("cpu", lambda: CpuCollector(proc=proc)),
        _row("pressure", lambda: PressureCollector(proc=proc)),
        _row("pcie_link", lambda: PcieLinkCollector(sys=sys)),
        _row("aer", lambda: AerCollector(sys=sys, proc=proc)),
        _row("topology", lambda: TopologyCollector(sys=sys)),
    ]
    for url in scrape:
        rows.append(_row(f"scrape:{url}", lambda url=url: ScrapeCollector(url, timeout=scrape_timeout)))  # type: ignore[misc]
    return rows


def pod_resources_doctor(path: str = "/var/lib/kubelet/pod-resources/kubelet.sock",
                         timeout: float = 2.0) -> DoctorRow:
    """Is the kubelet's pod-resources socket reachable (workload attribution names pods through it)?"""

    try:
        ok, reason, hint = probe(path, timeout)
    except Exception as e:  # noqa: BLE001 - a finding, not a crash
        ok, reason, hint = False, f"check failed: {e}", ""
    return DoctorRow("pod-resources", ok, reason, hint)
