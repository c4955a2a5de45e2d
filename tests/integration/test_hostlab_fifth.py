"""The fifth set's structure (examples/hostlab/fifth.py), fast and without starting a process: every
class has its truth written (states, the faulty instance or none, the names a right verdict may give),
the truth is the one written on 2026-12-06 (a digest: an edit after a recording shows here), the
serving code each class starts exists and takes the arguments given, the timeline lines carry the
truth the acceptance scoring reads (a constant classifier and "name the other workload" fail on
them), and each half fits one device call while the whole set does not.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.hostlab import fifth, fourth  # noqa: E402
from examples.hostlab.lab import HEALTHY  # noqa: E402
from examples.inference.report import IO_STATES, Track, score_tracks  # noqa: E402

STATES = {"idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound"}
# sha256 of the truth (name, expected states, faulty instance, both instances' accepted names) of DEVICE and CPU
# as written on 2026-12-06, before any recording: never changed after a recording is made with them
TRUTH_SHA256 = "8b48eb86a5a672dd96fbf88ce3ed5d958abe614e3269cb96fedbcb03aba10f7e"


def truth(scenarios: tuple[fourth.Scenario, ...]) -> list[list[object]]:
    return [[s.name, list(s.expect), s.faulty, s.a.accept, s.b.accept] for s in scenarios]


def digest() -> str:
    text = json.dumps({"device": truth(fifth.DEVICE), "cpu": truth(fifth.CPU)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_truth_is_the_one_written_before_any_recording() -> None:
    assert fifth.WRITTEN == "2026-12-06"
    assert "written on 2026-12-06, before any recording" in " ".join((fifth.__doc__ or "").split())
    assert digest() == TRUTH_SHA256


@pytest.mark.parametrize("scenarios", [fifth.DEVICE, fifth.CPU], ids=["device", "cpu"])
def test_every_class_has_its_truth(scenarios: tuple[fourth.Scenario, ...]) -> None:
    assert [s.name for s in scenarios] == list(fifth.FIFTH)            # the same classes in both labs
    assert len(scenarios) in (7, 8)
    for s in scenarios:
        assert s.expect and set(s.expect) <= STATES, s.name
        assert s.faulty in ("a", "b", None), s.name
        if s.faulty is None:
            assert tuple(s.expect) == HEALTHY, s.name                     # healthy: any non-I/O state
        else:
            assert set(s.expect) <= set(IO_STATES) and s.expect[0] in fifth.EXPECTED_CAUSE, s.name
        assert s.note and s.title, s.name
        a, b = s.a.accept, s.b.accept
        assert a[0] == s.a.pod and b[0] == s.b.pod and not set(a) & set(b), s.name
        for inst in (s.a, s.b):
            assert {p.container for p in inst.procs if p.container} <= set(inst.accept), s.name
            assert sum(p.gpu for p in inst.procs) == 1, s.name                 # one process drives the GPU
        if s.hog is not None:                                                  # the hog is never a right name
            assert not set(s.hog.accept) & (set(a) | set(b)), s.name
            assert not any(p.gpu for p in s.hog.procs), s.name
    faulty = [s.faulty for s in scenarios]
    assert faulty.count("a") >= 2 and faulty.count("b") >= 2 and faulty.count(None) >= 2


def test_the_classes_are_new() -> None:
    from examples.hostlab import h200

    old = set(fourth.DEVICE_BY_NAME) | {s.name for s in h200.SCENARIOS}
    assert not old & set(fifth.FIFTH)
    modules = {p.module for s in fifth.DEVICE for inst in (s.a, s.b) for p in inst.procs}
    for new in ("framedecoder", "video_service", "prep_rpc", "rpc_service", "pool_service", "ambassador",
                "yield_service", "thinkclient"):
        assert new in modules, new


@pytest.mark.parametrize("scenarios", [fifth.DEVICE, fifth.CPU], ids=["device", "cpu"])
def test_each_process_exists_and_takes_its_arguments(scenarios: tuple[fourth.Scenario, ...]) -> None:
    backend_src = (REPO / "examples/hostlab/backend.py").read_text()
    for s in scenarios:
        for inst in (s.a, s.b, *((s.hog,) if s.hog else ())):
            for p in inst.procs:
                src = (REPO / "examples/hostlab" / f"{p.module}.py").read_text()
                flags = {a for a in p.args if a.startswith("--")}
                known = set(re.findall(r'add_argument\("(--[a-z-]+)"', src))
                if "backend.add_args" in src:
                    known |= set(re.findall(r'add_argument\("(--[a-z-]+)"', backend_src))
                assert flags <= known, (s.name, p.module, flags - known)
                assert all("{" not in a or a.split("}")[0].lstrip("{").split("/")[0] in ("run", "busy", "libcuda")
                           for a in p.args), (s.name, p.args)


def test_the_timeline_lines_carry_the_truth_the_acceptance_reads(tmp_path: Path) -> None:
    r = fifth.Runner(tmp_path / "logs", tmp_path / "run", pods_log_dir=tmp_path / "pods")
    lines, t = [], 1000.0
    for s in fifth.DEVICE:
        got = r.lines(s, t, t + 45.0)
        assert [ln["instance"] for ln in got] == ["a", "b"]
        for ln, inst, who in zip(got, (s.a, s.b), "ab", strict=True):
            assert ln["set"] == "fifth" and ln["written"] == fifth.WRITTEN
            assert ln["faulty"] == (s.faulty == who) and ln["accept"] == inst.accept
            assert ln["expected_state"] == list(s.expect)
            assert ln["expected_cause"] == (fifth.EXPECTED_CAUSE[s.expect[0]] if s.faulty == who else None)
            assert ln["service"]["qos"] in ("burstable", None) and "reply_loss" in ln["service"]
        lines += got
        t += 60.0
    mesh = next(ln for ln in lines if ln["scenario"] == "mesh_reply_loss" and ln["instance"] == "b")
    assert mesh["service"]["reply_loss"] == 0.08 and mesh["service"]["reply_port"] == fifth.U_PORT

    def track(pick: object) -> dict[str, Track]:
        pts: dict[float, tuple[str, str]] = {}
        for s in fifth.DEVICE:
            start = next(ln["start"] for ln in lines if ln["scenario"] == s.name)
            for k in range(45):
                pts[start + k] = pick(s)  # type: ignore[operator]
        return {"gpu=0": Track("gpu=0", pts, {})}

    def named(s: fourth.Scenario, inst: fourth.Instance) -> tuple[str, str]:
        return (s.expect[0] if s.faulty else "staging-bound", f"pod:lab/{inst.pod}/{inst.pod}")

    rows = {x["scenario"]: x for x in score_tracks(track(lambda s: named(s, getattr(s, s.faulty or "b"))), lines)}
    oracle = {n: x["right"] for n, x in rows.items()}
    for s in fifth.DEVICE:                          # the truth itself scores its faulty classes, 3 windows each
        assert rows[s.name]["windows"] == 3
        assert oracle[s.name] == (3 if s.faulty else 0), s.name
    idle = {x["scenario"]: x["right"] for x in score_tracks(track(lambda s: ("idle", "")), lines)}
    assert all(idle[s.name] == (0 if s.faulty else 3) for s in fifth.DEVICE)      # constant idle fails the faults
    other = score_tracks(track(lambda s: named(s, s.b if s.faulty == "a" else s.a)), lines)
    for x in other:                                  # "name the other workload": wrong, and a page on a healthy one
        assert x["right"] == 0 and x["pages_on_healthy"] == 3, x["scenario"]


def test_each_half_fits_one_device_call_and_the_whole_set_does_not() -> None:
    from examples.hostlab import h200

    a, b = fifth.SETS["fifth-a"], fifth.SETS["fifth-b"]
    assert sorted(a + b) == sorted(fifth.FIFTH) and not set(a) & set(b)
    assert set(fifth.START_S) == set(fifth.FIFTH)
    for half in (a, b):
        assert {fifth.DEVICE_BY_NAME[n].faulty for n in half} == {"a", "b", None}    # faults on a and b, healthy
        ran, seconds = fifth.device_plan(half, hold=45.0)
        assert ran == list(half) and seconds <= fifth.DEVICE_CALL_S, (half, seconds)
    ran, _ = fifth.device_plan(fifth.FIFTH, hold=45.0)
    assert len(ran) < len(fifth.FIFTH)             # why there are halves
    for name in ("fifth", "fifth-a", "fifth-b"):
        assert h200.SETS[name] == fifth.SETS[name]
    usage = (REPO / "examples/hostlab/h200_record.sh").read_text()
    assert "--only fifth-a" in usage and "fifth-b" in usage
