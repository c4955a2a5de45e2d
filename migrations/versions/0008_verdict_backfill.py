"""verdict_runs backfilled from the stored verdict gauges, for data written before the history existed

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 15:00:00

A data migration (no schema change).  Revision 0007 created ``verdict_runs`` empty: every tick
written since then recorded its runs (store/verdicts.py), the ticks before it only as the agent's
gauges, ``triscope_mismatch_state{state, accelerator labels, workload labels}`` (1 for the state
it published, 0 for the others; without accelerator labels the node's roll-up) and
``triscope_mismatch_score``.  This revision turns those gauges into runs, so the history is the one
record of the verdict whatever the age of the data and no reader needs another way to read it.

Per live node, for its data older than its first run (all of it where it has none):

* raw points (``samples``; on PostgreSQL the view over ``sample_rows``): at each tick the state
  whose gauge reads 1, its workload and the score of the same accelerator, folded into runs
  exactly as the writer folds ticks (same state and workload within ``MAX_GAP_S``);
* where retention already removed the raw points, the 1-minute rollups before them and the hourly
  rollups before those: per bucket the state with the largest share of the bucket (its gauge's
  mean), at the bucket's middle, one "tick" per bucket, a run going on across touching buckets.

Nodes imported from a recording (node label ``triscope.recording``) are left alone: a recording's
verdicts are today's classifier's, recomputed when it is imported (``triscope import-trace
--replay``), never the ones frozen in its gauges.  Downgrade removes nothing (the runs are data).

What this revision needs of store/verdicts.py and triscope/core/vocabulary.py is copied into it,
as it was at this revision: a revision is a record, and editing those modules must never change
what an old revision does.
"""
# no "from __future__ import annotations": Alembic loads a revision outside sys.modules, where a
# dataclass cannot resolve string annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from alembic import op
from sqlalchemy import text
from sqlalchemy.engine import Connection

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

STATE_METRIC = "triscope_mismatch_state"
SCORE_METRIC = "triscope_mismatch_score"
RECORDING_LABEL = "triscope.recording"
MAX_GAP_S = 30.0
ACCELERATOR_LABELS = ("chip", "gpu", "npu")
WORKLOAD_LABELS = ("namespace", "pod", "container", "workload")
# which state a bucket takes when two states share it equally: I/O states first, then the busiest
WORST_FIRST = ("io-saturated", "staging-bound", "network-bound", "balanced", "compute-bound", "demand-limited", "idle")
TIERS = (("rollup_1m", 60.0), ("rollup_1h", 3600.0))

Workload = tuple[str, str, str, str]
Point = tuple[float, str, Workload, float]      # ts, state, workload, score


def _accelerator(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={labels[k]}" for k in ACCELERATOR_LABELS if labels.get(k) not in (None, ""))


def _workload(labels: dict[str, str]) -> Workload:
    g = labels.get
    return (g("namespace", ""), g("pod", ""), g("container", ""), g("workload", ""))


def _labels(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    return dict(v) if isinstance(v, dict) else dict(json.loads(v))


@dataclass(slots=True)
class _Run:
    state: str
    workload: Workload
    start: float
    end: float
    ticks: int
    score_sum: float
    score_max: float


def fold(points: Iterable[Point], max_gap: float) -> list[_Run]:
    """Points in time order folded into runs as the writer folds ticks: a point of the open run's
    state and workload within ``max_gap`` of its last one extends it, any other starts a run."""
    runs: list[_Run] = []
    for ts, state, wl, score in points:
        run = runs[-1] if runs else None
        if run is not None and ts <= run.end:
            continue
        if run is not None and state == run.state and wl == run.workload and ts - run.end <= max_gap:
            run.end, run.ticks = ts, run.ticks + 1
            run.score_sum += score
            run.score_max = max(run.score_max, score)
            continue
        runs.append(_Run(state, wl, ts, ts, 1, score, score))
    return runs


@dataclass(slots=True)
class _Series:
    id: int
    accelerator: str
    state: str
    workload: Workload


def _node_series(conn: Connection, node_id: int) -> tuple[list[_Series], dict[str, list[int]]]:
    """(the node's state series, accelerator -> its score series ids)."""
    states: list[_Series] = []
    scores: dict[str, list[int]] = {}
    for sid, metric, lk in conn.execute(text("SELECT id, metric, labels FROM series WHERE node_id = :n AND metric IN "
                                             "(:st, :sc) ORDER BY id"),
                                        {"n": node_id, "st": STATE_METRIC, "sc": SCORE_METRIC}):
        lab = {str(k): str(v) for k, v in _labels(lk).items()}
        acc = _accelerator(lab)
        if metric == SCORE_METRIC:
            scores.setdefault(acc, []).append(int(sid))
        elif lab.get("state"):
            states.append(_Series(int(sid), acc, lab["state"], _workload(lab)))
    return states, scores


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(int(i)) for i in ids)      # integers from the series table: safe to inline


def _raw_points(conn: Connection, states: list[_Series], score_ids: list[int], before: float) -> Iterator[Point]:
    by_id = {s.id: s for s in states}
    score: dict[float, float] = {}
    if score_ids:
        for ts, v in conn.execute(text(f"SELECT ts, value FROM samples WHERE series_id IN ({_ids(score_ids)}) "
                                       "AND ts < :b"), {"b": before}):
            score[float(ts)] = float(v) if v == v else 0.0
    last = None
    for sid, ts in conn.execute(text(f"SELECT series_id, ts FROM samples WHERE series_id IN ({_ids(by_id)}) "
                                     "AND ts < :b AND value >= 0.5 ORDER BY ts, series_id"), {"b": before}):
        t = float(ts)
        if t == last:
            continue            # one state per tick (the gauges give one; a second is no other tick)
        last = t
        s = by_id[int(sid)]
        yield t, s.state, s.workload, score.get(t, 0.0)


def _rollup_points(conn: Connection, table: str, width: float, states: list[_Series], score_ids: list[int],
                   before: float) -> list[Point]:
    by_id = {s.id: s for s in states}
    rank = {s: i for i, s in enumerate(WORST_FIRST)}
    score: dict[float, float] = {}
    if score_ids:
        for b, vsum, cnt in conn.execute(text(f"SELECT bucket, sum, count FROM {table} WHERE series_id IN "
                                              f"({_ids(score_ids)}) AND bucket + :w <= :b"), {"w": width, "b": before}):
            if cnt:
                score[float(b)] = float(vsum) / float(cnt) if vsum == vsum else 0.0
    best: dict[float, tuple[float, int, _Series]] = {}
    for sid, b, vsum, cnt in conn.execute(text(f"SELECT series_id, bucket, sum, count FROM {table} WHERE series_id IN "
                                               f"({_ids(by_id)}) AND bucket + :w <= :b"), {"w": width, "b": before}):
        share = float(vsum) / float(cnt) if cnt else 0.0
        if share <= 0:
            continue
        s = by_id[int(sid)]
        cand = (share, -rank.get(s.state, len(rank)), s)
        cur = best.get(float(b))
        if cur is None or cand[:2] > cur[:2]:
            best[float(b)] = cand
    return [(b + width / 2, s.state, s.workload, score.get(b, 0.0)) for b, (_v, _r, s) in sorted(best.items())]


def _first(conn: Connection, sql: str, params: dict[str, Any]) -> float | None:
    v = conn.execute(text(sql), params).scalar()
    return None if v is None else float(v)


def _insert(conn: Connection, node_id: int, acc: str, runs: list[_Run]) -> None:
    for r in runs:
        conn.execute(text(
            "INSERT INTO verdict_runs (node_id, accelerator, namespace, pod, container, workload, state, start_ts, "
            "end_ts, ticks, score_sum, score_max) VALUES (:n, :a, :ns, :pod, :c, :w, :st, :s, :e, :k, :ss, :sm)"),
            {"n": node_id, "a": acc, "ns": r.workload[0], "pod": r.workload[1], "c": r.workload[2], "w": r.workload[3],
             "st": r.state, "s": r.start, "e": r.end, "k": r.ticks, "ss": r.score_sum, "sm": r.score_max})


def backfill_node(conn: Connection, node_id: int) -> int:
    """One node's runs before its first recorded run; returns the runs written."""
    first_run = _first(conn, "SELECT min(start_ts) FROM verdict_runs WHERE node_id = :n", {"n": node_id})
    before = float("inf") if first_run is None else first_run
    states, scores = _node_series(conn, node_id)
    by_acc: dict[str, list[_Series]] = {}
    for s in states:
        by_acc.setdefault(s.accelerator, []).append(s)
    written = 0
    for acc, ss in by_acc.items():
        ids = _ids(s.id for s in ss)
        raw_first = _first(conn, f"SELECT min(ts) FROM samples WHERE series_id IN ({ids}) AND ts < :b", {"b": before})
        runs: list[_Run] = []
        cut = before if raw_first is None else raw_first
        for table, width in TIERS:      # older data first: the 1-minute tier before the raw, the hourly before it
            pts = _rollup_points(conn, table, width, ss, scores.get(acc, []), cut)
            if pts:
                runs = fold(pts, max(MAX_GAP_S, 1.5 * width)) + runs
                cut = pts[0][0] - width / 2
        runs += fold(_raw_points(conn, ss, scores.get(acc, []), before), MAX_GAP_S)
        _insert(conn, node_id, acc, runs)
        written += len(runs)
    return written


def backfill(conn: Connection) -> int:
    written = 0
    for nid, labels in conn.execute(text("SELECT id, labels FROM nodes ORDER BY id")).all():
        if _labels(labels).get(RECORDING_LABEL):
            continue            # a recording: its verdicts come from today's classifier when imported
        written += backfill_node(conn, int(nid))
    return written


def upgrade() -> None:
    backfill(op.get_bind())


def downgrade() -> None:
    pass        # the runs are data: the history stays what the gauges said
