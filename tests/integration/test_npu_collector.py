"""The npu-smi collector end to end: a real executable that prints captured npu-smi output, run
through the same subprocess path as production; a hung, a failing and a missing npu-smi."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.npu import NpuSmiCollector, SmiError, run_smi
from triscope.core.samples import EventRecord, Sample

NPU = FIXTURES / "npu-smi"


def _fake_smi(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "npu-smi"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return p


def _switchable(tmp_path: Path) -> tuple[Path, Path]:
    """npu-smi that prints the fixture named in ./state (info) or the usages fixture (-t usages)."""
    state = tmp_path / "state"
    state.write_text(str(NPU / "info-910a-24.1.RC2.txt"))
    log = tmp_path / "calls"
    exe = _fake_smi(tmp_path, f"""echo "$*" >> {log}
if [ "$2" = "-t" ] && [ "$3" = "usages" ]; then cat {NPU / 'info-t-usages.txt'}; exit 0; fi
f=$(cat {state})
case "$f" in hang) exec sleep 30;; fail) echo "dcmi module initialize failed. ret is -8005" >&2; exit 1;; esac
cat "$f"
""")
    return exe, state


def _wait_samples(c: NpuSmiCollector, timeout: float = 5.0) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            items = list(c.collect(time.time()))
        except RuntimeError:  # stale / failing until the next good run
            items = []
        if any(isinstance(i, Sample) for i in items):
            return items
        time.sleep(0.05)
    raise AssertionError("collector produced no samples")


def _val(items, name, npu, chip="0"):
    return next(s.value for s in items if isinstance(s, Sample) and s.name == name and s.labels == {"npu": npu, "chip": chip})


def test_end_to_end_through_subprocess(tmp_path):
    exe, _ = _switchable(tmp_path)
    c = NpuSmiCollector(npu_smi=str(exe), interval=0.2, timeout=3.0)
    try:
        av = c.check()
        assert av.ok and "8 NPU(s)" in av.reason and "24.1.RC2" in av.reason
        items = _wait_samples(c)
        assert _val(items, "triscope_npu_health", "3") == 1.0
        assert _val(items, "triscope_npu_power_watts", "7") == pytest.approx(203.2)
        assert _val(items, "triscope_npu_hbm_total_bytes", "2") == 32768 * 1024 * 1024
        # -t usages ran for each NPU and added fields the table does not have
        assert _val(items, "triscope_npu_ctrlcpu_utilization_ratio", "0") == 0.0
        calls = (tmp_path / "calls").read_text().splitlines()
        assert "info -t usages -i 7" in calls
    finally:
        c.close()


def test_health_change_becomes_an_event(tmp_path):
    exe, state = _switchable(tmp_path)
    edited = tmp_path / "edited.txt"
    edited.write_text((NPU / "info-910a-24.1.RC2.txt").read_text().replace(
        "| 0     xxx            | OK     ", "| 0     xxx            | Alarm  ", 1))
    c = NpuSmiCollector(npu_smi=str(exe), interval=0.1, timeout=3.0, usages=False)
    try:
        _wait_samples(c)
        state.write_text(str(edited))
        end = time.monotonic() + 5
        events: list[EventRecord] = []
        while time.monotonic() < end and not events:
            events = [e for e in c.collect(time.time()) if isinstance(e, EventRecord)]
            time.sleep(0.05)
        assert events and events[0].kind == "npu_health"
        assert events[0].details["from"] == "OK" and events[0].details["to"] == "Alarm"
        assert events[0].severity == "error"
        assert _val(_wait_samples(c), "triscope_npu_health", "0") == 2.0
    finally:
        c.close()


def test_hung_npu_smi_never_stalls_the_tick(tmp_path):
    exe, state = _switchable(tmp_path)
    c = NpuSmiCollector(npu_smi=str(exe), interval=0.2, timeout=0.5, stale_after=1.5, usages=False)
    try:
        _wait_samples(c)
        state.write_text("hang")
        worst, err = 0.0, None
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                c.collect(time.time())
            except RuntimeError as e:
                err = e
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.1)
        assert worst < 0.05, f"collect() took {worst:.3f} s while npu-smi hung"
        assert err is not None and "did not answer within 0.5 s" in str(err)
        # npu-smi answers again: fresh samples, no error
        state.write_text(str(NPU / "info-310-21.0.4.txt"))
        items = _wait_samples(c)
        assert _val(items, "triscope_npu_temperature_celsius", "6", "0") == 73
    finally:
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 4.0


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "pids"
    exe = _fake_smi(tmp_path, f"sleep 30 & echo $! > {pidfile}; wait\n")
    t0 = time.monotonic()
    with pytest.raises(SmiError, match="did not answer within 0.3 s"):
        run_smi([str(exe), "info"], 0.3)
    assert time.monotonic() - t0 < 3.0
    child = int(pidfile.read_text())
    time.sleep(0.2)
    status = Path(f"/proc/{child}/status")
    assert not status.exists() or "zombie" in status.read_text().lower(), "grandchild sleep survived"


def test_an_endless_npu_smi_output_is_cut_not_held(tmp_path):
    """100 MB of output used to be read whole (250 MB of RSS): it is read as it comes and the run is
    killed past the cap, with one line saying so."""
    import resource

    exe = _fake_smi(tmp_path, "yes 'NPU     Name      | Health  ' | head -c 100000000\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with pytest.raises(SmiError, match="wrote more than 4 MiB"):
        run_smi([str(exe), "info"], 10.0)
    assert time.monotonic() - t0 < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 40_000      # KiB: far from 100 MB


def test_failing_npu_smi_reports_why(tmp_path):
    exe, state = _switchable(tmp_path)
    state.write_text("fail")
    c = NpuSmiCollector(npu_smi=str(exe), interval=0.1, timeout=2.0)
    try:
        av = c.check()
        assert not av.ok and "exited 1" in av.reason and "dcmi module initialize failed" in av.reason
        end = time.monotonic() + 3
        err = None
        while time.monotonic() < end and err is None:
            try:
                c.collect(time.time())
            except RuntimeError as e:
                err = e
            time.sleep(0.05)
        assert err is not None and "dcmi module initialize failed" in str(err)
    finally:
        c.close()


def test_garbage_output_is_a_parse_error(tmp_path):
    exe = _fake_smi(tmp_path, "echo 'something else entirely'\n")
    av = NpuSmiCollector(npu_smi=str(exe)).check()
    assert not av.ok and "cannot read npu-smi output" in av.reason


def test_missing_npu_smi(tmp_path, monkeypatch):
    av = NpuSmiCollector(npu_smi=str(tmp_path / "nope")).check()
    assert not av.ok and "not found at" in av.reason and "--npu-smi" in av.hint
    monkeypatch.setenv("PATH", str(tmp_path))
    av = NpuSmiCollector().check()
    if not any(os.access(p, os.X_OK) for p in ("/usr/local/sbin/npu-smi", "/usr/local/bin/npu-smi", "/usr/sbin/npu-smi")):
        assert not av.ok and "not found on PATH" in av.reason and "Ascend" in av.hint
    noexec = tmp_path / "npu-smi-noexec"
    noexec.write_text("#!/bin/sh\n")
    av = NpuSmiCollector(npu_smi=str(noexec)).check()
    assert not av.ok and "not executable" in av.reason


def test_the_agent_polls_npu_smi_at_its_own_interval(tmp_path):
    """``triscope agent --interval 3`` runs npu-smi every 3 s, not at the collector's own 1 s
    default: the agent's options build the poller with its interval, and the stand-in npu-smi's
    call log shows the cadence (two runs in the 4.5 s after the first: at 0 and 3 s; at 1 s there
    would be five)."""
    from triscope.agent.registry import build_collectors
    from triscope.cli import build_parser
    from triscope.commands.agent import build_config

    exe, _ = _switchable(tmp_path)
    args = build_parser().parse_args(["agent", "--db", "sqlite:///x.db", "--interval", "3", "--npu-smi", str(exe),
                                      "--no-ebpf", "--no-nvml", "--no-workloads"])
    opts = build_config(args, None).options
    npu = next(c for c in build_collectors(opts) if c.name == "npu")
    assert isinstance(npu, NpuSmiCollector)
    assert npu.interval == 3.0 and npu.stale_after == 9.0          # max(3 x 3, timeout 5 + 3)
    calls = tmp_path / "calls"
    calls.write_text("")                                           # the availability check's run aside
    try:
        _wait_samples(npu)                                         # starts the poller; its first run is done
        time.sleep(4.5)
        runs = [line for line in calls.read_text().splitlines() if line == "info"]
    finally:
        npu.close()
    assert len(runs) == 2, runs
