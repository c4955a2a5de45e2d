"""PSI collector on fixture trees and the real /proc/pressure."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.base import CollectorUnavailable
from triscope.agent.collectors.pressure import PressureCollector, parse_pressure
from triscope.core.metrics import CATALOGUE


def by_key(samples):
    return {(s.name, s.labels["resource"], s.labels["kind"]): s for s in samples}


def test_fixture_values() -> None:
    got = by_key(PressureCollector(proc=str(FIXTURES / "proc-host1")).collect(1.0))
    assert got[("triscope_pressure_ratio", "io", "some")].value == pytest.approx(0.3575)
    assert got[("triscope_pressure_ratio", "io", "full")].value == pytest.approx(0.3108)
    assert got[("triscope_pressure_ratio", "cpu", "some")].value == pytest.approx(0.125)
    assert got[("triscope_pressure_stalled_seconds_total", "io", "some")].value == pytest.approx(4410.22719)
    assert got[("triscope_pressure_stalled_seconds_total", "memory", "full")].kind == "counter"
    assert len(got) == 3 * 2 * 2
    for s in got.values():
        assert s.kind == CATALOGUE[s.name].kind


def test_old_kernel_cpu_has_only_some() -> None:
    got = by_key(PressureCollector(proc=str(FIXTURES / "proc-kernel54")).collect(1.0))
    assert ("triscope_pressure_ratio", "cpu", "some") in got
    assert ("triscope_pressure_ratio", "cpu", "full") not in got
    assert got[("triscope_pressure_ratio", "cpu", "some")].value == pytest.approx(0.0204)


def test_no_psi_says_how_to_enable() -> None:
    c = PressureCollector(proc=str(FIXTURES / "proc-nopsi"))
    av = c.check()
    assert not av.ok and "pressure" in av.reason and "psi=1" in av.hint
    with pytest.raises(CollectorUnavailable):
        list(c.collect(1.0))


def test_malformed_file(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "proc-host1", tmp_path / "p")
    (tmp_path / "p/pressure/io").write_text("some avg10=1.0 garbage\n")
    with pytest.raises(CollectorUnavailable, match="pressure/io"):
        list(PressureCollector(proc=str(tmp_path / "p")).collect(1.0))
    with pytest.raises(ValueError):
        parse_pressure("most avg10=1.0\n")


def test_real_proc_pressure_counters_move() -> None:
    c = PressureCollector()
    assert c.check().ok
    first = by_key(c.collect(time.time()))
    assert {"cpu", "memory", "io"} <= {r for _, r, _ in first}
    assert all(0.0 <= s.value <= 1.0 for k, s in first.items() if k[0] == "triscope_pressure_ratio")
    t_end = time.monotonic() + 0.3
    while time.monotonic() < t_end:  # a little CPU so the stall clock has a chance to move
        pass
    second = by_key(c.collect(time.time()))
    assert all(second[k].value >= first[k].value for k in first if k[0].endswith("_total"))
