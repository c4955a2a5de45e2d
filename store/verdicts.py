"""The verdict history: every accelerator's published state as runs, one record every reader shares.

The agent's tracker publishes, per tick and accelerator, ``triscope_mismatch_state{state=...}``
(1 for the state it reports, 0 for the others) with the accelerator's labels and the workload the
verdict named, and ``triscope_mismatch_score``; without accelerator labels, the node's roll-up.  As
ticks are written (``Store.write_ticks``), ``VerdictRecorder`` turns them into **runs**: one row of
``verdict_runs`` per stretch of one accelerator in one state naming one workload (accelerator
``""``: the node's roll-up), first and last tick, ticks, score sum and maximum.  A run goes on while
the next tick has the same state and workload within ``MAX_GAP_S``; otherwise a new one starts.

Rows are written as runs grow (an open run's row is extended once per write), so a reader sees the
current run too.  Re-writing a tick already recorded changes nothing (a replayed spool); a tick
older than an accelerator's open run (a spool written back late) joins or starts a run where it
belongs.  The history is small — one row per state change — and read at full resolution whatever
the range (``verdict_runs``): root cause, the pages and the engine read this, never a re-run of the
detector over rollups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from triscope.core.samples import Tick
from triscope.core.verdict import SCORE_METRIC, STATE_METRIC, Run, Verdict, fold, verdicts_of
from triscope.store.reader import VerdictRun

__all__ = ["MAX_GAP_S", "SCORE_METRIC", "STATE_METRIC", "VerdictRecorder", "read_runs"]

MAX_GAP_S = 30.0          # a longer silence ends a run (the agent stopped, the accelerator went away)


@dataclass(slots=True)
class _Open:
    """An accelerator's newest run and its row (``id`` None: not written yet)."""

    id: int | None
    run: Run


class VerdictRecorder:
    """The open run of every (node, accelerator), kept between writes; ``reset()`` forgets them (a
    failed transaction: the next write reads the last runs back)."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, str], _Open | None] = {}

    def reset(self) -> None:
        self._open.clear()

    @staticmethod
    def points(ticks: Sequence[Tick]) -> dict[str, list[Verdict]]:
        """accelerator -> the verdict of every tick, in time order; empty when the ticks publish no
        verdict (then there is nothing to record)."""
        by_acc: dict[str, list[Verdict]] = {}
        for t in sorted(ticks, key=lambda t: t.ts):
            for acc, v in verdicts_of(t.ts, t.samples).items():
                by_acc.setdefault(acc, []).append(v)
        return by_acc

    def record(self, conn: Connection, node_id: int, by_acc: dict[str, list[Verdict]]) -> int:
        """Fold one node's ``points`` into the runs (``triscope.core.verdict.fold``); returns the rows
        written."""
        written = 0
        for acc, points in by_acc.items():
            key = (node_id, acc)
            if key not in self._open:
                self._open[key] = self._last(conn, node_id, acc)
            cur = self._open[key]
            if cur is not None:
                for v in points:
                    if v.ts < cur.run.start:
                        written += self._late(conn, node_id, acc, v)
                ticks = cur.run.ticks
                runs = fold((v for v in points if v.ts > cur.run.end), MAX_GAP_S, cur.run)
                if cur.run.ticks != ticks:
                    written += self._write(conn, node_id, acc, cur)
                runs = runs[1:]
            else:
                runs = fold(points, MAX_GAP_S)
            for r in runs:
                cur = _Open(None, r)
                written += self._write(conn, node_id, acc, cur)
            self._open[key] = cur
        return written

    @staticmethod
    def _last(conn: Connection, node_id: int, acc: str) -> _Open | None:
        row = conn.execute(text(
            "SELECT id, state, namespace, pod, container, workload, start_ts, end_ts, ticks, score_sum, score_max "
            "FROM verdict_runs WHERE node_id = :n AND accelerator = :a ORDER BY end_ts DESC LIMIT 1"),
            {"n": node_id, "a": acc}).first()
        if row is None:
            return None
        return _Open(int(row[0]), Run(str(row[1]), (row[2], row[3], row[4], row[5]), float(row[6]), float(row[7]),
                                      int(row[8]), float(row[9]), float(row[10]), int(row[8])))

    @staticmethod
    def _write(conn: Connection, node_id: int, acc: str, cur: _Open) -> int:
        run = cur.run
        params = {"n": node_id, "a": acc, "ns": run.workload[0], "pod": run.workload[1], "c": run.workload[2],
                  "w": run.workload[3], "st": run.state, "s": run.start, "e": run.end, "k": run.ticks,
                  "ss": run.score_sum, "sm": run.score_max}
        if cur.id is None:
            cur.id = int(conn.execute(text(
                "INSERT INTO verdict_runs (node_id, accelerator, namespace, pod, container, workload, state, start_ts, "
                "end_ts, ticks, score_sum, score_max) VALUES (:n, :a, :ns, :pod, :c, :w, :st, :s, :e, :k, :ss, :sm) "
                "RETURNING id"), params).scalar_one())
        else:
            conn.execute(text("UPDATE verdict_runs SET end_ts = :e, ticks = :k, score_sum = :ss, score_max = :sm "
                              "WHERE id = :id"), {**params, "id": cur.id})
        return 1

    @staticmethod
    def _late(conn: Connection, node_id: int, acc: str, v: Verdict) -> int:
        """A tick older than the open run (a spool written back after newer ticks): it joins the run
        of its state and workload that it touches, if one does and none covers it, else starts one."""
        ts, wl, score = v.ts, v.workload, v.score or 0.0
        p = {"n": node_id, "a": acc, "t": ts, "g": MAX_GAP_S}
        covered = conn.execute(text("SELECT 1 FROM verdict_runs WHERE node_id = :n AND accelerator = :a AND "
                                    "start_ts <= :t AND end_ts >= :t LIMIT 1"), p).first()
        if covered is not None:
            return 0
        near = conn.execute(text(
            "SELECT id, start_ts, end_ts FROM verdict_runs WHERE node_id = :n AND accelerator = :a AND state = :st "
            "AND namespace = :ns AND pod = :pod AND container = :c AND workload = :w AND start_ts - :g <= :t "
            "AND end_ts + :g >= :t ORDER BY id LIMIT 1"),
            {**p, "st": v.state, "ns": wl[0], "pod": wl[1], "c": wl[2], "w": wl[3]}).first()
        if near is not None:
            conn.execute(text("UPDATE verdict_runs SET start_ts = CASE WHEN start_ts > :t THEN :t ELSE start_ts END, "
                              "end_ts = CASE WHEN end_ts < :t THEN :t ELSE end_ts END, ticks = ticks + 1, "
                              "score_sum = score_sum + :sc, score_max = CASE WHEN score_max < :sc THEN :sc "
                              "ELSE score_max END WHERE id = :id"), {"t": ts, "sc": score, "id": int(near[0])})
            return 1
        conn.execute(text(
            "INSERT INTO verdict_runs (node_id, accelerator, namespace, pod, container, workload, state, start_ts, "
            "end_ts, ticks, score_sum, score_max) VALUES (:n, :a, :ns, :pod, :c, :w, :st, :t, :t, 1, :sc, :sc)"),
            {**p, "ns": wl[0], "pod": wl[1], "c": wl[2], "w": wl[3], "st": v.state, "sc": score})
        return 1


def read_runs(conn: Connection, node: str, start: float, end: float) -> list[VerdictRun]:
    """The runs of ``node`` that overlap [start, end], by accelerator and start."""
    rows = conn.execute(text(
        "SELECT r.accelerator, r.namespace, r.pod, r.container, r.workload, r.state, r.start_ts, r.end_ts, r.ticks, "
        "r.score_sum, r.score_max FROM verdict_runs r JOIN nodes n ON n.id = r.node_id "
        "WHERE n.name = :node AND r.end_ts >= :s AND r.start_ts <= :e ORDER BY r.accelerator, r.start_ts, r.id"),
        {"node": node, "s": start, "e": end}).all()
    return [VerdictRun(node, str(r[0]), (r[1], r[2], r[3], r[4]), str(r[5]), float(r[6]), float(r[7]), int(r[8]),
                       float(r[9]) / max(1, int(r[8])), float(r[10])) for r in rows]
