"""Decoding the agent's stored state series (``triscope_mismatch_state`` / ``_score``) into verdicts,
as root cause read them before the verdict history (store/verdicts.py) replaced them: no reader of
the project decodes them now; the tests that read state series back (the store's time shares) use
these, moved here unchanged from ``triscope.analysis.episodes``, ``triscope.analysis.rca.reference``
and ``triscope.dashboard.workload_data`` (``current_from``: a node's current state from the newest
points of its series, as the Fleet read it before ``current_from_runs``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from triscope.analysis.episodes import NODE, STATE_ORDER, Workload, is_healthy, workload_of
from triscope.analysis.reader import SeriesPoints
from triscope.core.verdict import Verdict
from triscope.core.vocabulary import AcceleratorId, accelerator_name
from triscope.dashboard.workload_data import (
    INFO_METRIC,
    AccelNow,
    LabelParser,
    NodeNow,
    WorkloadRef,
    _add_workloads,
    _labels_of,
    _rollup_if_missing,
)

STATE_METRIC = "triscope_mismatch_state"
SCORE_METRIC = "triscope_mismatch_score"


def _step(ts: Sequence[float]) -> float:
    if len(ts) < 2:
        return 1.0
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1.0


def stored_state_samples(series: Iterable[SeriesPoints]) -> tuple[str, dict[str, list[Verdict]], float]:
    """(source, accelerator -> samples in time order, sampling step) from stored
    ``triscope_mismatch_state`` and ``triscope_mismatch_score`` series; source "" when there are
    none.  Per-accelerator series win over the node-level roll-up."""
    states = [sp for sp in series if sp.metric == STATE_METRIC and sp.labels.get("state")]
    scores = [sp for sp in series if sp.metric == SCORE_METRIC]
    per_acc = [sp for sp in states if accelerator_name(sp.labels)]
    if per_acc:
        source, use = "per-accelerator state series", per_acc
    else:
        use = [sp for sp in states if accelerator_name(sp.labels) is None]
        source = "node state series" if use else ""
    rank = {s: i for i, s in enumerate(STATE_ORDER)}
    best: dict[str, dict[float, tuple[float, int, str, Workload]]] = {}
    all_ts: list[float] = []
    for sp in use:
        acc = accelerator_name(sp.labels) or NODE
        state = sp.labels["state"]
        w = workload_of(sp.labels)
        got = best.setdefault(acc, {})
        r = rank.get(state, len(rank))
        for t, v in zip(sp.ts, sp.values, strict=True):
            if v > 0:          # the largest share at t; a tie goes to the worse state
                cur = got.get(t)
                if cur is None or (v, -r) > (cur[0], -cur[1]):
                    got[t] = (v, r, state, w)
        all_ts.extend(sp.ts)
    score_at: dict[tuple[str, float], float] = {}
    for sp in scores:
        acc = accelerator_name(sp.labels) or NODE
        if (acc == NODE) != (source == "node state series"):
            continue
        for t, v in zip(sp.ts, sp.values, strict=True):
            if v == v:
                score_at[(acc, t)] = max(v, score_at.get((acc, t), 0.0))
    out = {acc: [Verdict(t, s, w, score_at.get((acc, t))) for t, (_v, _r, s, w) in sorted(got.items())]
           for acc, got in best.items()}
    return source, out, _step(sorted(set(all_ts)))


def _healthy_hours(state_series: Sequence[SeriesPoints]) -> list[tuple[float, str]]:
    """(hour start, node) in which a healthy state was seen, most recent first."""
    got: set[tuple[float, str]] = set()
    for sp in state_series:
        if not is_healthy(sp.labels.get("state", "")):
            continue
        for t, v in zip(sp.ts, sp.values, strict=True):
            if v > 0:          # a coarse read holds the hour's share in the state: any share is "seen"
                got.add((t // 3600 * 3600, sp.node))
    return sorted(got, reverse=True)


def current_from(entries: Iterable[tuple[str, Mapping[str, str] | str, float, float]],
                 owners: Mapping[tuple[str, str], str] | None = None,
                 parse: LabelParser | None = None) -> NodeNow:
    """A node's current roll-up and per-accelerator state from the newest point of each of its
    mismatch and workload-info series: ``(metric, labels, ts, value)``, labels as a dict or (with
    ``parse``) as the store's label-key text, parsed only for the entries that matter."""
    out = NodeNow()
    info: dict[AcceleratorId, list[tuple[float, WorkloadRef]]] = {}
    scores: dict[AcceleratorId, tuple[float, float]] = {}
    node_score_ts = -1.0
    for metric, lk, ts, value in entries:
        if metric == STATE_METRIC and value < 0.5:
            continue
        lab = _labels_of(lk, parse)
        acc = AcceleratorId.of(lab)
        if metric == STATE_METRIC:
            if acc is None:
                if ts > out.ts:
                    out.state, out.ts = str(lab.get("state", "?")), ts
                continue
            now = out.accels.setdefault(acc, AccelNow(acc))
            if ts > now.ts:
                now.state, now.ts, now.workload = str(lab.get("state", "?")), ts, WorkloadRef.of(lab, owners)
        elif metric == SCORE_METRIC:
            if acc is None:
                if ts >= node_score_ts:
                    out.score, node_score_ts = value, ts
            elif ts >= scores.get(acc, (-1.0, 0.0))[0]:
                scores[acc] = (ts, value)
        elif metric == INFO_METRIC and acc is not None and value >= 0.5:
            info.setdefault(acc, []).append((ts, WorkloadRef.of(lab, owners)))
    for acc, (_ts, v) in scores.items():
        out.accels.setdefault(acc, AccelNow(acc)).score = v
    _add_workloads(out, info)
    _rollup_if_missing(out)
    return out
