"""host_doctor: every host collector with ok / reason / hint, on fixture trees and on this machine."""

from __future__ import annotations

from conftest import FIXTURES, free_port

from triscope.agent.doctor import host_doctor


def test_fixture_host_everything_ok() -> None:
    rows = host_doctor(proc=str(FIXTURES / "proc-host1"), sys=str(FIXTURES / "sysfs-h200"))
    assert [r.collector for r in rows] == ["tcp", "cpu", "pressure", "pcie_link", "aer", "topology"]
    assert all(r.ok for r in rows), rows
    assert "PCIe links" in {r.collector: r for r in rows}["pcie_link"].reason
    assert {r.collector: r for r in rows}["topology"].reason == "ok (3 accelerators, 0 with a NUMA node, 1 NICs)"


def test_this_machine_reasons_and_hints() -> None:
    port = free_port()
    rows = {r.collector: r for r in host_doctor(scrape=[f"http://127.0.0.1:{port}/metrics", "nonsense"])}
    assert rows["tcp"].ok and rows["cpu"].ok and rows["pressure"].ok
    aer = rows["aer"]
    assert not aer.ok and aer.reason == "no AER counters in sysfs (kernel built without CONFIG_PCIEAER)"
    assert "CONFIG_PCIEAER=y" in aer.hint
    assert not rows["pcie_link"].ok and rows["pcie_link"].hint
    assert not rows["topology"].ok and "no accelerator" in rows["topology"].reason
    refused = rows[f"scrape:127.0.0.1:{port}"]
    assert not refused.ok and "connection refused" in refused.reason
    bad = rows["scrape:nonsense"]
    assert not bad.ok and "cannot start" in bad.reason and "scheme must be http or https" in bad.reason


def test_missing_proc_and_sys(tmp_path) -> None:
    rows = host_doctor(proc=str(tmp_path / "proc"), sys=str(tmp_path / "sys"))
    assert not any(r.ok for r in rows)
    assert all(r.reason and r.hint for r in rows), rows
