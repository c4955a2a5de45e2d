"""AER collector: parser and collector on sysfs-shaped fixture trees (this kernel has no AER)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.aer import AerCollector, kernel_has_pcieaer, parse_aer_file
from triscope.agent.collectors.base import CollectorUnavailable
from triscope.core.metrics import CATALOGUE
from triscope.core.samples import EventRecord, Sample

H200 = FIXTURES / "sysfs-h200"
GPU0 = "devices/pci0000:00/0000:00:01.0/0000:19:00.0"


def split(items):
    samples = [i for i in items if isinstance(i, Sample)]
    events = [i for i in items if isinstance(i, EventRecord)]
    return samples, events


def values(samples):
    return {(s.name, s.labels["device"], s.labels["severity"], s.labels.get("error", "")): s.value for s in samples}


def test_parse_current_kernel_format() -> None:
    types, total = parse_aer_file((H200 / GPU0 / "aer_dev_correctable").read_text())
    assert total == 3
    assert types["BadTLP"] == 2 and types["Timeout"] == 1 and types["RxErr"] == 0
    assert types["dev_cor_errs_bit[5]"] == 1  # a status bit the kernel has no name for


def test_parse_old_kernel_names_with_spaces() -> None:
    text = (FIXTURES / "sysfs-oldkernel/devices/pci0000:00/0000:00:1c.0/aer_dev_correctable").read_text()
    types, total = parse_aer_file(text)
    assert total == 2 and types["Receiver Error"] == 2 and types["RELAY_NUM Rollover"] == 0


def test_parse_rejects_garbage_and_sums_without_total() -> None:
    with pytest.raises(ValueError, match="unexpected AER counter line"):
        parse_aer_file("RxErr lots\n")
    with pytest.raises(ValueError):
        parse_aer_file("17\n")
    assert parse_aer_file("RxErr 1\nBadTLP 2\n") == ({"RxErr": 1, "BadTLP": 2}, None)


def test_h200_fixture_counters() -> None:
    c = AerCollector(sys=str(H200))
    av = c.check()
    assert av.ok and "4 devices" in av.reason  # two root ports + GPU0 + GPU1
    samples, events = split(list(c.collect(1.0)))
    assert events == []  # first tick is the baseline
    v = values(samples)
    assert v[("triscope_pcie_aer_errors_total", "0000:19:00.0", "correctable", "")] == 3
    assert v[("triscope_pcie_aer_errors_total", "0000:19:00.0", "nonfatal", "")] == 1
    assert v[("triscope_pcie_aer_errors_total", "0000:19:00.0", "fatal", "")] == 0
    assert v[("triscope_pcie_aer_errors_total", "0000:3b:00.0", "fatal", "")] == 1
    assert v[("triscope_pcie_aer_error_types_total", "0000:19:00.0", "correctable", "BadTLP")] == 2
    assert v[("triscope_pcie_aer_error_types_total", "0000:19:00.0", "nonfatal", "CmpltTO")] == 1
    assert v[("triscope_pcie_aer_error_types_total", "0000:3b:00.0", "fatal", "SDES")] == 1
    # zero error types are not emitted (the totals carry the first increment)
    assert ("triscope_pcie_aer_error_types_total", "0000:19:00.0", "correctable", "RxErr") not in v
    assert v[("triscope_pcie_aer_rootport_errors_total", "0000:00:01.0", "correctable", "")] == 3
    # devices without AER files (bridges without the capability, the NIC, the NVMe) have no series
    assert not any(d == "0000:5d:00.0" for _, d, _, _ in v)
    for s in samples:
        spec = CATALOGUE[s.name]
        assert s.kind == spec.kind == "counter" and set(s.labels) == set(spec.labels)


def test_growth_between_ticks_makes_an_event(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    shutil.copytree(H200, sys, symlinks=True)
    c = AerCollector(sys=str(sys))
    list(c.collect(1.0))
    f = sys / GPU0 / "aer_dev_correctable"
    f.write_text(f.read_text().replace("BadTLP 2", "BadTLP 7").replace("TOTAL_ERR_COR 3", "TOTAL_ERR_COR 8"))
    samples, events = split(list(c.collect(2.0)))
    assert values(samples)[("triscope_pcie_aer_errors_total", "0000:19:00.0", "correctable", "")] == 8
    assert len(events) == 1
    e = events[0]
    assert e.kind == "aer" and e.severity == "warning" and e.ts == 2.0
    assert e.details == {"device": "0000:19:00.0", "severity": "correctable", "delta": 5, "total": 8,
                         "types": {"BadTLP": 5}}
    assert "BadTLP +5" in e.message and "0000:19:00.0" in e.message
    fatal = sys / "devices/pci0000:00/0000:00:03.0/0000:3b:00.0/aer_dev_fatal"
    fatal.write_text(fatal.read_text().replace("SDES 1", "SDES 2").replace("TOTAL_ERR_FATAL 1", "TOTAL_ERR_FATAL 2"))
    _, events = split(list(c.collect(3.0)))
    assert [(e.severity, e.details["device"]) for e in events] == [("critical", "0000:3b:00.0")]
    _, events = split(list(c.collect(4.0)))
    assert events == []  # no growth, no event


def test_old_kernel_tree() -> None:
    v = values(split(list(AerCollector(sys=str(FIXTURES / "sysfs-oldkernel")).collect(1.0)))[0])
    assert v[("triscope_pcie_aer_errors_total", "0000:00:1c.0", "nonfatal", "")] == 4
    assert v[("triscope_pcie_aer_error_types_total", "0000:00:1c.0", "nonfatal", "Unsupported Request")] == 4
    assert v[("triscope_pcie_aer_rootport_errors_total", "0000:00:1c.0", "nonfatal", "")] == 4


def test_malformed_counter_file_is_a_clear_error(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    shutil.copytree(H200, sys, symlinks=True)
    (sys / GPU0 / "aer_dev_fatal").write_text("<html>\n")
    with pytest.raises(CollectorUnavailable, match="aer_dev_fatal"):
        list(AerCollector(sys=str(sys)).collect(1.0))


def test_this_kernel_has_no_aer_and_says_why() -> None:
    assert kernel_has_pcieaer("/proc") is False  # /proc/config.gz here: CONFIG_PCIEPORTBUS is not set
    c = AerCollector()
    av = c.check()
    assert not av.ok
    assert av.reason == "no AER counters in sysfs (kernel built without CONFIG_PCIEAER)"
    assert "CONFIG_PCIEAER=y" in av.hint
    with pytest.raises(CollectorUnavailable, match="no AER counters"):
        list(c.collect(1.0))


def test_reason_when_kernel_has_aer_but_no_device(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    with gzip.open(proc / "config.gz", "wt") as f:
        f.write("CONFIG_PCI=y\nCONFIG_PCIEPORTBUS=y\nCONFIG_PCIEAER=y\n")
    av = AerCollector(sys="/sys", proc=str(proc)).check()
    assert not av.ok and "no PCIe device here has an AER capability" in av.reason
    av = AerCollector(sys="/sys", proc=str(tmp_path / "none")).check()  # no config.gz: both causes named
    assert not av.ok and "CONFIG_PCIEAER, or no PCIe device" in av.reason
