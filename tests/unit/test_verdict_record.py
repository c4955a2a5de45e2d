"""The verdict as one typed object (triscope/core/verdict.py): the gauges the tracker publishes for a
``Verdict`` read back into the same ``Verdict``, and ``fold`` cuts verdicts into runs as the store keeps them."""

from __future__ import annotations

import math

from triscope.core.verdict import Run, Verdict, fold, verdict_samples, verdicts_of

WL = ("inference", "web-0", "app", "Deployment/web")


def test_published_gauges_read_back_into_the_same_verdicts() -> None:
    gpu = Verdict(5.0, "staging-bound", WL, 0.75, "gpu=1")
    npu = Verdict(5.0, "idle", ("", "", "", ""), 0.0, "chip=0,npu=3")
    node = Verdict(5.0, "staging-bound", ("", "", "", ""), 0.75, "")
    samples = [*verdict_samples(gpu), *verdict_samples(npu), *verdict_samples(node)]
    assert verdicts_of(5.0, samples) == {"gpu=1": gpu, "chip=0,npu=3": npu, "": node}
    by_state = {s.labels["state"]: s.value for s in verdict_samples(gpu) if "state" in s.labels}
    assert by_state == {"idle": 0.0, "demand-limited": 0.0, "compute-bound": 0.0, "balanced": 0.0,
                        "io-saturated": 0.0, "staging-bound": 1.0, "network-bound": 0.0}
    assert verdict_samples(node)[0].labels == {} and verdict_samples(gpu)[0].labels["pod"] == "web-0"
    nan = [s if s.name != "triscope_mismatch_score" else type(s)(s.name, math.nan, s.labels) for s in verdict_samples(gpu)]
    assert verdicts_of(5.0, nan)["gpu=1"].score == 0.0


def test_fold_joins_one_state_and_workload_within_the_gap_only() -> None:
    vs = [Verdict(t, "idle", WL, 0.0) for t in (0.0, 1.0, 2.0)] + [Verdict(3.0, "idle", WL, 0.0)] + \
         [Verdict(40.0, "idle", WL, 0.0), Verdict(41.0, "balanced", WL, 0.5), Verdict(42.0, "balanced", WL)]
    runs = fold(vs, 30.0)
    assert [(r.state, r.start, r.end, r.ticks, r.scored) for r in runs] == [
        ("idle", 0.0, 3.0, 4, 4), ("idle", 40.0, 40.0, 1, 1), ("balanced", 41.0, 42.0, 2, 1)]
    assert runs[2].score_mean == 0.5 and Run.of(Verdict(0.0, "idle")).score_mean is None
    # going on from an open run: a verdict at or before its end adds nothing
    open_run = Run("idle", WL, 0.0, 3.0, 4, 0.0, 0.0, 4)
    assert [(r.start, r.end, r.ticks) for r in fold([Verdict(2.0, "idle", WL, 0.0), Verdict(4.0, "idle", WL, 0.0)],
                                                    30.0, open_run)] == [(0.0, 4.0, 5)]
