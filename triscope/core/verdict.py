"""The verdict as one typed object, and the one way its points become runs.

A ``Verdict`` is what the detector decided for one accelerator at one time: its state, the
workload it named and its score (the share of the accelerator's time lost to I/O).  The agent's
tracker publishes it as gauges (``verdict_samples``: ``triscope_mismatch_state{state=...}`` 1 for
the state, 0 for the others, and ``triscope_mismatch_score``, with the accelerator's and the
workload's labels; without accelerator labels the node's roll-up); ``verdicts_of`` reads a tick's
gauges back into the same verdicts, the store keeps them as runs (store/verdicts.py, ``VerdictRun``
rows), and root cause, the pages and the engine read those runs.

``fold`` turns verdicts in time order into **runs**: one stretch of one state naming one workload,
a verdict of the same state and workload within ``max_gap`` of the run's last one extending it.
The store writes its history with it, and analysis cuts the classifier's windows into runs with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from triscope.core.samples import Sample
from triscope.core.vocabulary import (
    NO_WORKLOAD,
    STATES,
    WorkloadKey,
    accelerator_labels,
    accelerator_name,
    workload_key,
    workload_labels,
)

STATE_METRIC = "triscope_mismatch_state"
SCORE_METRIC = "triscope_mismatch_score"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One accelerator's verdict at ``ts`` (``accelerator`` ``gpu=0``, ``chip=0,npu=1``; "" the node's
    roll-up); ``score`` None where none was given."""

    ts: float
    state: str
    workload: WorkloadKey = NO_WORKLOAD
    score: float | None = None
    accelerator: str = ""


def verdict_samples(v: Verdict) -> list[Sample]:
    """The gauges ``v`` is published as (``verdicts_of`` reads them back): its score, then one state
    gauge per state (1 for its own), labelled with its accelerator and workload (none for the
    node's roll-up, accelerator "")."""
    labels = {**accelerator_labels(v.accelerator), **workload_labels(v.workload)} if v.accelerator else {}
    return [Sample(SCORE_METRIC, 0.0 if v.score is None else v.score, labels, "gauge"),
            *(Sample(STATE_METRIC, 1.0 if st == v.state else 0.0, {"state": st, **labels}, "gauge") for st in STATES)]


def verdicts_of(ts: float, samples: Iterable[Sample]) -> dict[str, Verdict]:
    """accelerator -> the verdict a tick's gauges publish ("" the node's roll-up); a NaN score reads 0."""
    states: dict[str, tuple[str, WorkloadKey]] = {}
    scores: dict[str, float] = {}
    for s in samples:
        if s.name == STATE_METRIC:
            if s.value >= 0.5:
                state = s.labels.get("state", "")
                if state:
                    states[accelerator_name(s.labels) or ""] = (state, workload_key(s.labels))
        elif s.name == SCORE_METRIC:
            v = float(s.value)
            scores[accelerator_name(s.labels) or ""] = v if v == v else 0.0
    return {acc: Verdict(ts, st, wl, scores.get(acc, 0.0), acc) for acc, (st, wl) in states.items()}


@dataclass(slots=True)
class Run:
    """Verdicts of one state naming one workload, from ``start`` to ``end`` (first and last verdict):
    ``ticks`` of them, the score summed and maximal over the ``scored`` ones that had a score."""

    state: str
    workload: WorkloadKey
    start: float
    end: float
    ticks: int = 1
    score_sum: float = 0.0
    score_max: float = 0.0
    scored: int = 0

    @classmethod
    def of(cls, v: Verdict) -> Run:
        s = v.score
        return cls(v.state, v.workload, v.ts, v.ts, 1, s or 0.0, s or 0.0, 0 if s is None else 1)

    @property
    def score_mean(self) -> float | None:
        return self.score_sum / self.scored if self.scored else None

    def joins(self, v: Verdict, max_gap: float) -> bool:
        """Whether ``v`` (later than the run) goes on this run."""
        return v.state == self.state and v.workload == self.workload and v.ts - self.end <= max_gap

    def add(self, v: Verdict) -> None:
        self.end = max(self.end, v.ts)
        self.ticks += 1
        if v.score is not None:
            self.score_max = v.score if not self.scored else max(self.score_max, v.score)
            self.score_sum += v.score
            self.scored += 1


def fold(verdicts: Iterable[Verdict], max_gap: float, open_run: Run | None = None) -> list[Run]:
    """Verdicts in time order as runs: one of the last run's state and workload within ``max_gap``
    of its end extends it, any other starts a run; one at or before the last run's end adds nothing
    (already counted).  ``open_run``: the run to go on from (then the first run answered)."""
    runs: list[Run] = [] if open_run is None else [open_run]
    for v in verdicts:
        last = runs[-1] if runs else None
        if last is not None and v.ts <= last.end:
            continue
        if last is not None and last.joins(v, max_gap):
            last.add(v)
        else:
            runs.append(Run.of(v))
    return runs
