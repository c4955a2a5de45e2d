"""The static topology on fixture trees: a two-socket DGX H100 shape (tests/fixtures/make_sysfs_dgx_h100.py
says what it is written from) and the H200 host (one socket, ``numa_node`` -1), and this machine's /sys."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import FIXTURES

from triscope.agent.collectors.topology import (
    PciPlace,
    TopologyCollector,
    link_level,
    read_places,
)
from triscope.core.cpulist import parse_cpulist
from triscope.core.metrics import CATALOGUE

DGX = str(FIXTURES / "sysfs-dgx-h100")
H200 = str(FIXTURES / "sysfs-h200")
S0, S1 = "0-55,112-167", "56-111,168-223"
# GPU -> (NUMA node, local CPUs, root complex, bridges from the root port, its own ConnectX-7)
DGX_GPUS = {
    "0000:1b:00.0": ("0", S0, "pci0000:15", "0000:15:01.0>0000:16:00.0>0000:17:01.0", "0000:1a:00.0"),
    "0000:43:00.0": ("0", S0, "pci0000:3d", "0000:3d:01.0>0000:3e:00.0>0000:3f:01.0", "0000:40:00.0"),
    "0000:51:00.0": ("0", S0, "pci0000:3d", "0000:3d:03.0>0000:4e:00.0>0000:4f:01.0", "0000:50:00.0"),
    "0000:9b:00.0": ("0", S0, "pci0000:97", "0000:97:01.0>0000:98:00.0>0000:99:01.0", "0000:9a:00.0"),
    "0000:c2:00.0": ("1", S1, "pci0000:be", "0000:be:01.0>0000:bf:00.0>0000:c0:01.0", "0000:c1:00.0"),
    "0000:ca:00.0": ("1", S1, "pci0000:be", "0000:be:03.0>0000:c7:00.0>0000:c8:01.0", "0000:c9:00.0"),
    "0000:da:00.0": ("1", S1, "pci0000:d7", "0000:d7:01.0>0000:d8:00.0>0000:d9:01.0", "0000:db:00.0"),
    "0000:e2:00.0": ("1", S1, "pci0000:d7", "0000:d7:03.0>0000:df:00.0>0000:e0:01.0", "0000:e1:00.0"),
}


def _by_name(samples):  # type: ignore[no-untyped-def]
    out: dict[str, list[dict[str, str]]] = {}
    for s in samples:
        assert s.value == 1.0 and s.name in CATALOGUE
        out.setdefault(s.name, []).append(s.labels)
    return out


def test_every_accelerator_of_a_two_socket_server_has_its_numa_node_cpus_and_path() -> None:
    c = TopologyCollector(sys=DGX)
    assert c.check().ok and c.check().reason == "ok (8 accelerators, 8 with a NUMA node, 9 NICs)"
    got = _by_name(c.collect(0.0))
    info = {x["device"]: (x["numa_node"], x["local_cpus"], x["host_bridge"], x["path"])
            for x in got["triscope_accelerator_topology_info"]}
    assert info == {gpu: want[:4] for gpu, want in DGX_GPUS.items()}     # the BMC's VGA is not one
    nics = {x["device"]: (x["nic"], x["link"]) for x in got["triscope_accelerator_nic_info"]}
    assert nics == {gpu: (want[4], "PIX") for gpu, want in DGX_GPUS.items()}
    assert {x["interface"] for x in got["triscope_accelerator_nic_info"]} >= {"ibp26s0,mlx5_0", "ibp225s0,mlx5_7"}


def test_the_links_between_devices_in_nvidia_smi_terms() -> None:
    places = {p.bdf: p for p in read_places(DGX)}
    gpu0, gpu1, gpu7 = places["0000:1b:00.0"], places["0000:43:00.0"], places["0000:e2:00.0"]
    assert link_level(gpu0, places["0000:1a:00.0"]) == "PIX"        # its switch's ConnectX-7
    assert link_level(gpu1, places["0000:50:00.0"]) == "PHB"        # the other switch of its root complex
    assert link_level(gpu0, places["0000:03:00.0"]) == "NODE"       # on-board Ethernet, same socket
    assert link_level(gpu0, places["0000:e1:00.0"]) == "SYS"        # across the sockets
    assert link_level(gpu7, places["0000:03:00.0"]) == "SYS"
    # switches nested under one root port: several bridges, no host bridge
    a = PciPlace("a", "accelerator", "pci0000:00", ("rp", "su", "sd1", "su2", "sd3"), 0, "")
    b = PciPlace("b", "nic", "pci0000:00", ("rp", "su", "sd2"), 0, "")
    assert link_level(a, b) == "PXB"


def test_a_one_socket_vm_reads_unknown_never_remote() -> None:
    c = TopologyCollector(sys=H200)
    got = _by_name(c.collect(0.0))
    assert {x["numa_node"] for x in got["triscope_accelerator_topology_info"]} == {"unknown"}
    assert {x["local_cpus"] for x in got["triscope_accelerator_topology_info"]} == {"unknown"}
    assert {(x["nic"], x["link"]) for x in got["triscope_accelerator_nic_info"]} == {("0000:5d:00.0", "PHB")}
    a = PciPlace("a", "accelerator", "pci0000:00", ("x",), None, "")
    b = PciPlace("b", "nic", "pci0000:80", ("y",), 1, "")
    assert link_level(a, b) == "unknown"                             # not SYS: nothing says it is remote


def test_the_map_is_read_at_start_and_again_only_after_refresh(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(DGX, tree, symlinks=True)
    now = [0.0]
    c = TopologyCollector(sys=str(tree), refresh_s=600.0, clock=lambda: now[0])
    assert len(list(c.collect(0.0))) == 16
    (tree / "bus/pci/devices/0000:e2:00.0").unlink()                 # hot-unplugged
    now[0] = 599.0
    assert len(list(c.collect(0.0))) == 16                           # not re-read on the tick
    now[0] = 600.0
    assert len(list(c.collect(0.0))) == 14


def test_cpulists() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == [] and parse_cpulist("x-1") == []


def test_this_machine_says_why_it_has_no_topology() -> None:
    av = TopologyCollector().check()
    if not av.ok:   # a VM with virtio devices only, as the CPU machines are
        assert "no accelerator" in av.reason and av.hint


def test_sr_iov_virtual_functions_are_not_listed_as_nics(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(DGX, tree, symlinks=True)
    pf = tree / "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:1a:00.0"
    vf = pf.parent / "0000:1a:00.2"
    vf.mkdir()
    (vf / "class").write_text("0x020700\n")
    (vf / "vendor").write_text("0x15b3\n")
    (vf / "physfn").symlink_to("../0000:1a:00.0")
    (tree / "bus/pci/devices/0000:1a:00.2").symlink_to("../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/"
                                                        "0000:17:02.0/0000:1a:00.2")
    nics = {p.bdf for p in read_places(str(tree)) if p.kind == "nic"}
    assert "0000:1a:00.0" in nics and "0000:1a:00.2" not in nics
