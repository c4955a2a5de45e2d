"""PCIe link collector on sysfs-shaped fixture trees (an H200 host, an old kernel) and the real /sys."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.pcie import PcieLinkCollector, parse_speed
from triscope.core.metrics import CATALOGUE
from triscope.core.pcie import encoding_efficiency, link_capacity_bytes_per_second

H200 = str(FIXTURES / "sysfs-h200")


def table(samples):
    return {(s.name, s.labels["device"], s.labels.get("kind", "")): s.value for s in samples}


def test_speed_strings_of_every_kernel_generation() -> None:
    assert parse_speed("32.0 GT/s PCIe") == 32.0
    assert parse_speed("2.5 GT/s PCIe") == 2.5
    assert parse_speed("8 GT/s") == 8.0
    assert parse_speed("64.0 GT/s PCIe") == 64.0
    assert parse_speed("Unknown") is None
    assert parse_speed("Unknown speed") is None


def test_capacity_by_generation() -> None:
    assert encoding_efficiency(2.5) == encoding_efficiency(5.0) == 0.8
    assert encoding_efficiency(8.0) == encoding_efficiency(32.0) == 128 / 130
    assert encoding_efficiency(64.0) == pytest.approx(242 / 256)
    # Gen5 x16: ~63.0 GB/s one way; Gen3 x16: ~15.75 GB/s; Gen1 x1: 250 MB/s
    assert link_capacity_bytes_per_second(32.0, 16) == pytest.approx(63.015e9, rel=1e-4)
    assert link_capacity_bytes_per_second(8.0, 16) == pytest.approx(15.754e9, rel=1e-4)
    assert link_capacity_bytes_per_second(2.5, 1) == pytest.approx(250e6)


def test_h200_host_links() -> None:
    c = PcieLinkCollector(sys=H200)
    assert c.check().ok
    samples = list(c.collect(1.0))
    got = table(samples)
    devices = {d for _, d, _ in got}
    # host bridge and ISA bridge have no link attributes: skipped
    assert "0000:00:00.0" not in devices and "0000:00:1f.0" not in devices
    assert {"0000:19:00.0", "0000:3b:00.0", "0000:5d:00.0", "0000:6e:00.0", "0000:9a:00.0", "0000:00:01.0"} <= devices
    gpu0 = "0000:19:00.0"
    assert got[("triscope_pcie_link_speed_gts", gpu0, "current")] == 32.0
    assert got[("triscope_pcie_link_speed_gts", gpu0, "max")] == 32.0
    assert got[("triscope_pcie_link_width", gpu0, "current")] == 16
    assert got[("triscope_pcie_link_degraded", gpu0, "")] == 0
    assert got[("triscope_pcie_link_capacity_bytes_per_second", gpu0, "")] == pytest.approx(63.015e9, rel=1e-4)
    # GPU1 trained at x8 of x16: degraded, half the capacity
    assert got[("triscope_pcie_link_degraded", "0000:3b:00.0", "")] == 1
    assert got[("triscope_pcie_link_capacity_bytes_per_second", "0000:3b:00.0", "")] == pytest.approx(31.5e9, rel=1e-3)
    # a Gen5 x16 NIC in a Gen4 x8 slot runs as well as the slot allows: not degraded
    assert got[("triscope_pcie_link_speed_gts", "0000:5d:00.0", "max")] == 32.0
    assert got[("triscope_pcie_link_degraded", "0000:5d:00.0", "")] == 0
    # NVMe with its link down: speed "Unknown", width 0 -> 0 and degraded
    assert got[("triscope_pcie_link_speed_gts", "0000:6e:00.0", "current")] == 0
    assert got[("triscope_pcie_link_capacity_bytes_per_second", "0000:6e:00.0", "")] == 0
    assert got[("triscope_pcie_link_degraded", "0000:6e:00.0", "")] == 1
    # GPU2 at 2.5 GT/s of 32: degraded by speed
    assert got[("triscope_pcie_link_degraded", "0000:9a:00.0", "")] == 1
    for s in samples:
        spec = CATALOGUE[s.name]
        assert s.kind == spec.kind and set(s.labels) == set(spec.labels)


def test_speed_downshift_can_be_ignored() -> None:
    got = table(PcieLinkCollector(sys=H200, degraded_on_speed=False).collect(1.0))
    assert got[("triscope_pcie_link_degraded", "0000:9a:00.0", "")] == 0  # idle GPU at Gen1: lanes intact
    assert got[("triscope_pcie_link_degraded", "0000:3b:00.0", "")] == 1  # lost lanes still count


def test_class_filter_and_bridges() -> None:
    gpus = {d for _, d, _ in table(PcieLinkCollector(sys=H200, classes=["gpu"]).collect(1.0))}
    assert gpus == {"0000:19:00.0", "0000:3b:00.0", "0000:9a:00.0"}
    nvme_net = {d for _, d, _ in table(PcieLinkCollector(sys=H200, classes=["0x0108", "network"]).collect(1.0))}
    assert nvme_net == {"0000:6e:00.0", "0000:5d:00.0"}
    no_bridges = {d for _, d, _ in table(PcieLinkCollector(sys=H200, include_bridges=False).collect(1.0))}
    assert not any(d.startswith("0000:00:") for d in no_bridges) and "0000:19:00.0" in no_bridges
    # the upstream port's caps still apply when the port itself is filtered out
    got = table(PcieLinkCollector(sys=H200, classes=["network"]).collect(1.0))
    assert got[("triscope_pcie_link_degraded", "0000:5d:00.0", "")] == 0
    with pytest.raises(ValueError, match="unknown PCI class"):
        PcieLinkCollector(sys=H200, classes=["graphics card"])
    av = PcieLinkCollector(sys=H200, classes=["0x0c03"]).check()
    assert not av.ok and "selected classes" in av.reason


def test_old_kernel_integer_speeds() -> None:
    got = table(PcieLinkCollector(sys=str(FIXTURES / "sysfs-oldkernel")).collect(1.0))
    assert got[("triscope_pcie_link_speed_gts", "0000:02:00.0", "current")] == 5.0
    assert got[("triscope_pcie_link_speed_gts", "0000:02:00.0", "max")] == 8.0
    # x16 card in an x4 slot at Gen2 of Gen3: degraded by speed, not by width
    assert got[("triscope_pcie_link_degraded", "0000:02:00.0", "")] == 1
    got2 = table(PcieLinkCollector(sys=str(FIXTURES / "sysfs-oldkernel"), degraded_on_speed=False).collect(1.0))
    assert got2[("triscope_pcie_link_degraded", "0000:02:00.0", "")] == 0


def test_real_sys(tmp_path) -> None:
    devices = Path("/sys/bus/pci/devices")
    with_links = [d.name for d in devices.iterdir() if (d / "current_link_speed").exists()] if devices.is_dir() else []
    c = PcieLinkCollector()
    av = c.check()
    got = table(c.collect(1.0))
    if with_links:  # a host with PCI Express devices (the H200 machine)
        assert av.ok and {d for _, d, _ in got} == set(with_links)
    else:  # this Firecracker VM: virtio / plain PCI devices only
        assert not av.ok and "no PCI Express device" in av.reason and av.hint
        assert got == {}
    missing = PcieLinkCollector(sys=str(tmp_path))
    assert not missing.check().ok and "not found" in missing.check().reason


def test_maxima_are_read_again_only_every_caps_every_seconds(tmp_path) -> None:
    """The negotiated link is read every LINK_EVERY seconds (the last reading in between); the maxima
    (config-space reads a VM traps) are kept until CAPS_EVERY has passed."""
    import shutil

    from triscope.agent.collectors import pcie

    shutil.copytree(H200, tmp_path / "sys", symlinks=True)
    dev = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:9a:00.0"
    now = [100.0]
    c = PcieLinkCollector(sys=str(tmp_path / "sys"), classes=["gpu"], clock=lambda: now[0])
    first = table(c.collect(now[0]))
    assert first[("triscope_pcie_link_width", "0000:9a:00.0", "max")] == 16
    cur = first[("triscope_pcie_link_width", "0000:9a:00.0", "current")]
    (dev / "max_link_width").write_text("8\n")
    (dev / "current_link_width").write_text("4\n")
    now[0] += 1.0
    held = table(c.collect(now[0]))
    assert held[("triscope_pcie_link_width", "0000:9a:00.0", "current")] == cur     # the last reading
    now[0] += pcie.LINK_EVERY
    second = table(c.collect(now[0]))
    assert second[("triscope_pcie_link_width", "0000:9a:00.0", "current")] == 4      # read again
    assert second[("triscope_pcie_link_width", "0000:9a:00.0", "max")] == 16         # kept
    assert second[("triscope_pcie_link_degraded", "0000:9a:00.0", "")] == 1
    now[0] += pcie.CAPS_EVERY
    third = table(c.collect(now[0]))
    assert third[("triscope_pcie_link_width", "0000:9a:00.0", "max")] == 8           # read again
