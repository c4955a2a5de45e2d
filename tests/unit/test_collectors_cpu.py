"""CPU / memory collector on fixture trees and the real /proc."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.base import CollectorUnavailable
from triscope.agent.collectors.cpu import CpuCollector, parse_meminfo, parse_stat_cpu


def values(samples):
    return {(s.name, s.labels.get("mode", "")): s.value for s in samples}


def test_fixture_seconds_and_memory() -> None:
    got = values(CpuCollector(proc=str(FIXTURES / "proc-host1"), clk_tck=100).collect(1.0))
    assert got[("triscope_cpu_seconds_total", "user")] == pytest.approx(47053.56)
    assert got[("triscope_cpu_seconds_total", "idle")] == pytest.approx(962371.88)
    assert ("triscope_cpu_seconds_total", "guest") not in got  # already inside user
    assert ("triscope_cpu_busy_ratio", "") not in got  # first tick: nothing to compare with
    assert got[("triscope_memory_available_bytes", "")] == 1961330012 * 1024
    assert got[("triscope_memory_total_bytes", "")] == 2113546240 * 1024


def test_busy_ratio_is_the_delta_between_ticks(tmp_path: Path) -> None:
    proc = tmp_path / "p"
    shutil.copytree(FIXTURES / "proc-host1", proc)
    c = CpuCollector(proc=str(proc), clk_tck=100)
    list(c.collect(1.0))
    base = parse_stat_cpu((proc / "stat").read_text())
    # +300 user, +100 system, +500 idle, +100 iowait ticks -> busy 400 / 1000
    new = dict(base, user=base["user"] + 300, system=base["system"] + 100, idle=base["idle"] + 500,
               iowait=base["iowait"] + 100)
    (proc / "stat").write_text("cpu  " + " ".join(str(new[m]) for m in new) + " 0 0\n")
    got = values(c.collect(2.0))
    assert got[("triscope_cpu_busy_ratio", "")] == pytest.approx(0.4)
    # a counter going backwards (CPU unplugged) gives no ratio rather than a wrong one
    (proc / "stat").write_text("cpu  " + " ".join(str(base[m]) for m in base) + " 0 0\n")
    assert ("triscope_cpu_busy_ratio", "") not in values(c.collect(3.0))


def test_parsers_and_missing_proc(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        parse_stat_cpu("cpu0 1 2 3\n")
    assert parse_meminfo("MemAvailable:  10 kB\nHugePages_Total: 4\n") == {"MemAvailable": 10240, "HugePages_Total": 4}
    c = CpuCollector(proc=str(tmp_path))
    assert not c.check().ok and "not found" in c.check().reason
    with pytest.raises(CollectorUnavailable):
        list(c.collect(1.0))


def test_real_proc_busy_ratio_under_load() -> None:
    c = CpuCollector()
    assert c.check().ok
    list(c.collect(time.time()))
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end:
        pass
    got = values(c.collect(time.time()))
    assert 0.2 < got[("triscope_cpu_busy_ratio", "")] <= 1.0  # one of the machine's cores was busy
    assert 0 < got[("triscope_memory_available_bytes", "")] <= got[("triscope_memory_total_bytes", "")]
