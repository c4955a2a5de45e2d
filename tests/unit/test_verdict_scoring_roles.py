"""Scoring a window (examples/inference/report.py): the faulty instance may be a or b, a verdict on a
Kubernetes pod is matched by its pod or container names, and a page is an I/O window naming an
instance that carried no fault, whichever it is.  The fourth set's definitions (examples/hostlab/
fourth.py) hold the truth the wait-for verdict will be scored on: pinned here, so an edit shows."""

from __future__ import annotations

from typing import Any

from examples.hostlab import fourth
from examples.inference.report import HEALTHY_STATES, Track, identity, identity_names, score_tracks


def lines(faulty: str | None, expect: list[str], accept_b: list[str] | None = None) -> list[dict[str, Any]]:
    out = []
    for who in ("a", "b"):
        ln: dict[str, Any] = {"scenario": "s", "start": 0.0, "end": 45.0, "instance": who, "workload": f"lab-{who}",
                              "gpu": 0, "faulty": faulty == who, "knobs": {"x": 1} if faulty == who else {},
                              "expected_state": expect}
        if who == "b" and accept_b:
            ln["accept"] = accept_b
        out.append(ln)
    return out


def track(*windows: tuple[str, str]) -> dict[str, Track]:
    """One verdict per window of 10 s after the first 15 s (ticks at 15..44)."""
    pts = {}
    for i, (state, who) in enumerate(windows):
        for t in range(15 + 10 * i, 25 + 10 * i):
            pts[float(t)] = (state, who)
    return {"gpu=0": Track("gpu=0", pts, {})}


def test_identity_is_the_workload_label_else_the_pod() -> None:
    assert identity({"workload": "cmd:lab-b", "pod": ""}) == "cmd:lab-b"
    assert identity({"namespace": "lab", "pod": "lab-b", "container": "", "workload": ""}) == "pod:lab/lab-b"
    assert identity({"namespace": "lab", "pod": "lab-b", "container": "lab-b-prep", "workload": ""}) == \
        "pod:lab/lab-b/lab-b-prep"
    assert identity({"workload": ""}) == ""
    assert identity_names("pod:lab/lab-b/lab-b-prep") == {"lab-b", "lab-b-prep", "lab/lab-b"}
    assert identity_names("cmd:inference-b") == {"inference-b"}
    assert identity_names("Deployment/inference-b") == {"inference-b"}
    assert identity_names("") == set()


def test_the_fault_on_a_is_scored_on_a_and_naming_b_is_a_page() -> None:
    row, = score_tracks(track(("staging-bound", "pod:lab/lab-a"), ("staging-bound", "cmd:lab-a"),
                              ("staging-bound", "pod:lab/lab-b")), lines("a", ["staging-bound"]))
    assert (row["windows"], row["right"], row["pages_on_healthy"], row["faulty"]) == (3, 2, 1, "a")


def test_a_sidecar_container_of_the_faulty_pod_is_an_accepted_name() -> None:
    row, = score_tracks(track(("staging-bound", "pod:lab/lab-b/lab-b-prep"), ("staging-bound", "cmd:lab-b-prep"),
                              ("staging-bound", "pod:lab/lab-hog")),
                        lines("b", ["staging-bound"], accept_b=["lab-b", "lab-b-prep"]))
    assert (row["right"], row["pages_on_healthy"]) == (2, 0)      # the hog is neither instance: wrong, no page


def test_in_a_healthy_scenario_an_io_window_naming_either_instance_is_a_page() -> None:
    row, = score_tracks(track(("idle", ""), ("network-bound", "pod:lab/lab-b"), ("staging-bound", "cmd:lab-a")),
                        lines(None, list(HEALTHY_STATES)))
    assert (row["right"], row["pages_on_healthy"], row["faulty"]) == (1, 2, None)


def test_inference_timelines_keep_b_as_the_faulty_one_by_its_knobs() -> None:
    ls = lines(None, ["staging-bound"])
    for ln in ls:
        del ln["faulty"]
    ls[1]["knobs"] = {"workers": 1}           # off its default: b carries the fault
    row, = score_tracks(track(("staging-bound", "cmd:lab-b"), ("staging-bound", "cmd:lab-a")), ls)
    assert (row["right"], row["pages_on_healthy"], row["faulty"]) == (1, 1, "b")


# the fourth set's truth (written 2026-12-06, before the wait-for rules were fixed): class -> (faulty
# instance, expected states, the names a right I/O verdict may give)
HEALTHY = set(HEALTHY_STATES)
TRUTH = {
    "sidecar_shm": ("b", {"staging-bound"}, ["lab-b", "lab-b-prep"]),
    "sidecar_tcp": ("b", {"staging-bound"}, ["lab-b", "lab-b-prep"]),
    "spin_poll": (None, HEALTHY, []),
    "upstream_loss": ("b", {"network-bound"}, ["lab-b"]),
    "contention_weight": ("a", {"staging-bound"}, ["lab-a"]),
    "launch_bound": (None, HEALTHY, []),
    "upstream_loss_heavy": ("a", {"network-bound"}, ["lab-a"]),
    "healthy_pool_bursty": (None, HEALTHY, []),
}


def test_the_fourth_set_is_what_was_written_before_any_recording() -> None:
    for defs in (fourth.DEVICE, fourth.CPU):
        assert [s.name for s in defs] == list(TRUTH)
        for sc in defs:
            who, expect, accept = TRUTH[sc.name]
            assert (sc.faulty, set(sc.expect)) == (who, expect), sc.name
            if who is not None:
                assert getattr(sc, who).accept == accept, sc.name
            assert sc.a.pod == "lab-a" and sc.b.pod == "lab-b"
            assert sum(p.gpu for p in sc.a.procs) == 1 and sum(p.gpu for p in sc.b.procs) == 1, sc.name
    assert fourth.SETS["fourth-a"] + fourth.SETS["fourth-b"] == fourth.SETS["fourth"] == tuple(TRUTH)


def test_fourth_set_timeline_lines_score_the_faulty_instance(tmp_path: Any) -> None:
    r = fourth.Runner(tmp_path / "logs", tmp_path / "run")
    for sc in fourth.DEVICE:
        ls = r.lines(sc, 0.0, 45.0)
        assert [ln["instance"] for ln in ls] == ["a", "b"]
        assert [ln["faulty"] for ln in ls] == [sc.faulty == "a", sc.faulty == "b"]
        who, expect, accept = TRUTH[sc.name]
        state = next(iter(expect)) if who else "idle"
        named = f"pod:lab/{accept[-1]}" if who else ""
        row, = score_tracks(track((state, named), (state, named), (state, named)), ls)
        assert (row["right"], row["pages_on_healthy"]) == (3, 0), sc.name
        if who is not None:        # the other instance named instead: wrong, and a page
            other = "lab-b" if who == "a" else "lab-a"
            row, = score_tracks(track((state, f"pod:lab/{other}")), ls)
            assert (row["right"], row["pages_on_healthy"]) == (0, 1), sc.name
