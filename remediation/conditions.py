"""Conditions on stored data: does a rule's ``metric``, ``mismatch`` or ``slo`` condition hold on a node?

They read through the store's read interface only (``StoreReader``):

* ``metric``: every point of a series of the metric (counters as per-second rates) satisfies
  ``op threshold`` for at least ``for``; the newest point must be fresh.
* ``mismatch``: an accelerator's verdict has been state S (naming one workload) for at least ``for``
  and is still published: read from the verdict history (the record root cause and the pages read;
  consecutive runs of one state and workload are one stretch; migration 0008 backfilled it for data
  written before it existed).  The node's roll-up never triggers.
* ``slo``: the SLO's burn-rate status (from ``triscope.analysis.slo`` when it is installed) is ``page``
  (or ``ticket``, which ``page`` also satisfies).

``metric`` and ``mismatch`` conditions hold per series: one per (node, accelerator, workload) for
per-accelerator data, with its workload labels (the series' own, else its accelerator's verdict's).
An accelerator whose verdict is ``idle`` or ``demand-limited`` never triggers.  Which state an
accelerator is in, and which workload its verdict names (a metric trigger's quiet check, an XID's
workload), is read from the verdict history too.

The history is read through a ``VerdictReader``: every node's newest runs in one statement
(``StoreReader.current_verdicts``) for one evaluation of every rule, read again only where a rule
looks further back than the reader has read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from triscope.analysis.slo import SLOSpec, load_slo_file
from triscope.analysis.slo import evaluate as evaluate_slo
from triscope.core.verdict import Verdict
from triscope.core.vocabulary import (
    QUIET_STATES,
    WORKLOAD_LABELS,
    AcceleratorId,
    WorkloadKey,
    accelerator_labels,
)
from triscope.core.vocabulary import workload_labels as key_labels
from triscope.remediation.trigger_forms import OPS, Trigger
from triscope.store.reader import SeriesData, StoreReader, VerdictRun
from triscope.store.verdicts import MAX_GAP_S

MISMATCH_METRIC = "triscope_mismatch_state"


# stored-data conditions --------------------------------------------------------------------------
@dataclass
class Condition:
    holds: bool
    started_at: float | None = None
    value: float | None = None
    detail: str = ""
    series: dict[str, str] = field(default_factory=dict)
    workload: dict[str, str] = field(default_factory=dict)   # the accelerator's workload labels (own or its verdict's)


@dataclass(frozen=True)
class Stretch:
    """One accelerator's newest verdict in the history: consecutive runs of one state naming one
    workload, from the first one's start to the last one's end."""

    accelerator: str              # gpu=0
    state: str
    workload: WorkloadKey
    start: float
    end: float

    @property
    def labels(self) -> dict[str, str]:
        """The labels its ``triscope_mismatch_state`` series carries: state, accelerator, workload."""
        wl = {a: v for a, v in zip(WORKLOAD_LABELS, self.workload, strict=True) if v}
        return {"state": self.state, **accelerator_labels(self.accelerator), **wl}


def _run_start(ts: list[float], vals: list[float], op: str, thr: float) -> tuple[float | None, float | None]:
    """Start of the trailing run of points satisfying ``op thr`` (None when the newest point does not).
    A silence longer than ``MAX_GAP_S`` between two points ends the run: no data is no time in it."""
    f = OPS[op]
    start = None
    for t, v in zip(reversed(ts), reversed(vals), strict=True):
        if v != v or not f(v, thr) or (start is not None and start - t > MAX_GAP_S):  # NaN never satisfies
            break
        start = t
    return start, (vals[-1] if vals else None)


def workload_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The workload labels of a series ({} when it names no pod or workload)."""
    if not (labels.get("pod") or labels.get("workload")):
        return {}
    return {a: labels.get(a) or "" for a in WORKLOAD_LABELS}


# the verdict history -----------------------------------------------------------------------------
def verdict_lookback(for_s: float, stale_s: float) -> float:
    """How far back a ``for_s`` condition first reads (further where a stretch reaches that far)."""
    return max(2.0 * for_s, for_s + 120.0, stale_s * 2)


class VerdictReader:
    """The verdict history of every node, read once for one evaluation: each node's runs that end at or
    after ``since`` (``StoreReader.current_verdicts``, one statement for the fleet, bounded by the
    newest node's last tick); a read further back than that reads again, once."""

    def __init__(self, store: StoreReader, since: float | None = None) -> None:
        self.store = store
        self.since = math.inf
        self._runs: dict[str, list[VerdictRun]] = {}
        if since is not None:
            self._read(since)

    def _read(self, since: float) -> None:
        newest = max((n.last_seen for n in self.store.nodes()), default=since)
        self._runs = self.store.current_verdicts(max(0.0, newest - since))
        self.since = since

    def runs(self, node: str, since: float, until: float) -> list[VerdictRun]:
        """``node``'s runs that overlap [since, until], by start."""
        if since < self.since:
            self._read(since)
        return [r for r in self._runs.get(node, []) if r.end >= since and r.start <= until]


def _run_order(r: VerdictRun) -> tuple[float, float]:
    return r.start, r.end


def stretches(store: StoreReader, node: str, since: float, now: float,
              verdicts: VerdictReader | None = None) -> dict[str, Stretch]:
    """Each accelerator's newest verdict on ``node`` from the verdict history, up to ``now``
    (``verdicts``: the evaluation's reader, else one for this read)."""
    runs = (verdicts or VerdictReader(store)).runs(node, since, now)
    by_acc: dict[str, list[VerdictRun]] = {}
    for r in runs:
        if r.accelerator:       # "": the node's roll-up, which never triggers
            by_acc.setdefault(r.accelerator, []).append(r)
    out: dict[str, Stretch] = {}
    for acc, rs in by_acc.items():
        rs.sort(key=_run_order)
        last = rs[-1]
        start = last.start
        for r in reversed(rs[:-1]):
            # an earlier run of the same verdict continues the stretch only across a gap the history
            # itself would have joined: a silence (the agent down) is no time in the state
            if r.state != last.state or r.workload != last.workload or start - r.end > MAX_GAP_S:
                break
            start = r.start
        out[acc] = Stretch(acc, last.state, last.workload, start, min(last.end, now))
    return out


def accelerator_verdicts(store: StoreReader, node: str, now: float, stale_s: float,
                         verdicts: VerdictReader | None = None) -> dict[AcceleratorId, Verdict]:
    """Each accelerator's current verdict on ``node``: its newest stretch in the verdict history, still
    published (within ``stale_s``), as the detector's own ``Verdict`` at the stretch's end."""
    found = stretches(store, node, now - stale_s, now, verdicts)
    out: dict[AcceleratorId, Verdict] = {}
    for st in found.values():
        acc = AcceleratorId.parse(st.accelerator)
        if acc is not None and now - st.end <= stale_s:
            out[acc] = Verdict(st.end, st.state, st.workload, None, st.accelerator)
    return out


def _stretch_condition(st: Stretch, node: str, for_s: float, now: float, stale_s: float) -> Condition:
    labels = st.labels
    what = f"{MISMATCH_METRIC}{fmt_labels(labels)}"
    if now - st.end > stale_s:
        return Condition(False, value=1.0, series=labels, detail=f"{what} on {node}: last published {now - st.end:.0f}s ago")
    held = st.end - st.start
    if held + 1e-6 >= for_s:
        return Condition(True, started_at=st.start, value=1.0, series=labels,
                         detail=f"{what}=1 >= 0.5 for {held:.0f}s on {node}")
    return Condition(False, value=1.0, series=labels,
                     detail=f"{what}=1 >= 0.5 only for {held:.0f}s (needs {for_s:g}s) on {node}")


def verdict_conditions(store: StoreReader, state: str, node: str, for_s: float, now: float, stale_s: float,
                       only: Mapping[str, str] | None = None, verdicts: VerdictReader | None = None) -> list[Condition]:
    """One condition per accelerator of ``node`` whose newest verdict is ``state`` (and whose labels
    include ``only``), from the verdict history."""
    verdicts = verdicts or VerdictReader(store)
    lookback = verdict_lookback(for_s, stale_s)
    out: list[Condition] = []
    for _attempt in range(2):
        found = stretches(store, node, now - lookback, now, verdicts)
        out = [_stretch_condition(st, node, for_s, now, stale_s) for st in found.values() if st.state == state]
        out = [c for c in out if all(c.series.get(a) == v for a, v in (only or {}).items())]
        if not any(c.holds and c.started_at is not None and c.started_at <= now - lookback for c in out):
            break
        lookback *= 4  # a stretch reaches the window's start: look further back for an earlier run of it
    return out


def xid_workload(store: StoreReader, node: str, gpu: str, ts: float, stale_s: float,
                 verdicts: VerdictReader | None = None) -> dict[str, str]:
    """The workload labels of GPU ``gpu``'s verdict at ``ts`` (its newest verdict up to it), {} when none is stored."""
    runs = (verdicts or VerdictReader(store)).runs(node, ts - max(stale_s, 60.0), ts + 5.0)
    mine = [r for r in runs if r.accelerator == f"gpu={gpu}"]
    if not mine:
        return {}
    best = sorted(mine, key=_run_order)[-1]
    return workload_labels(dict(zip(WORKLOAD_LABELS, best.workload, strict=True)))


# series ------------------------------------------------------------------------------------------
def _series_condition(sd: SeriesData, metric: str, node: str, op: str, thr: float, for_s: float, now: float,
                      stale_s: float) -> Condition:
    labels = dict(sd.info.labels)
    if now - sd.ts[-1] > stale_s:
        return Condition(False, detail=f"{metric} on {node}: newest point is {now - sd.ts[-1]:.0f}s old", series=labels)
    start, last = _run_start(sd.ts, sd.values, op, thr)
    if start is None or last is None:
        return Condition(False, value=last, detail=f"{metric}={last:g} on {node}: not {op} {thr:g}", series=labels)
    held = sd.ts[-1] - start
    if held + 1e-6 >= for_s:
        return Condition(True, started_at=start, value=last, series=labels,
                         detail=f"{metric}{fmt_labels(labels)}={last:g} {op} {thr:g} for {held:.0f}s on {node}")
    return Condition(False, value=last, series=labels,
                     detail=f"{metric}={last:g} {op} {thr:g} only for {held:.0f}s (needs {for_s:g}s) on {node}")


def series_conditions(store: StoreReader, metric: str, node: str, labels: Mapping[str, str], op: str, thr: float,
                      for_s: float, now: float, stale_s: float) -> list[Condition]:
    """One condition per series of ``metric`` on ``node`` (whose labels include ``labels``): does it
    satisfy ``op thr`` for at least ``for_s`` up to now?"""
    lookback = max(2.0 * for_s, for_s + 120.0, stale_s * 2)
    out: list[Condition] = []
    for _attempt in range(2):
        data = store.query(metric, node=node, labels=labels or None, start=now - lookback, end=now, max_points=None)
        out, extend = [], False
        for sd in data:
            if not sd.ts:
                continue
            c = _series_condition(sd, metric, node, op, thr, for_s, now, stale_s)
            if c.holds and c.started_at is not None and c.started_at <= sd.ts[0]:
                extend = True
            out.append(c)
        if not extend:
            break
        lookback *= 4  # a run covers the whole window: look further back for its real start
    return out


def _started(c: Condition) -> float:
    return c.started_at or 0.0


def best_of(conds: list[Condition], none: str) -> Condition:
    """The holding condition that started first, else the first one that does not hold."""
    holding = sorted((c for c in conds if c.holds), key=_started)
    if holding:
        return holding[0]
    return conds[0] if conds else Condition(False, detail=none)


def fmt_labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else ""


def _acc_text(acc: AcceleratorId) -> str:
    return " ".join(f"{a} {v}" for a, v in sorted(acc.labels.items()) if v)


def _mismatch_conditions(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float,
                         only: Mapping[str, str] | None, verdicts: VerdictReader | None) -> list[Condition]:
    conds = verdict_conditions(store, trigger.state, node, trigger.for_s, now, stale_s, only, verdicts)
    for c in conds:
        c.workload = workload_labels(c.series)
    return conds


def accelerator_conditions(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float,
                           only: Mapping[str, str] | None = None,
                           verdicts: VerdictReader | None = None) -> list[Condition]:
    """The ``metric`` / ``mismatch`` condition of each series on ``node``, with the workload it is about.

    ``mismatch``: each accelerator whose verdict is the state (the node's roll-up, which has no
    accelerator labels, never triggers); the workload is the one the verdict names.  ``metric``: every
    series of the metric; the workload is the series' own labels, else its accelerator's verdict's.
    A series of an accelerator whose verdict is ``idle`` or ``demand-limited`` does not hold: such an
    accelerator is not held back by anything.  ``only``: just the series with these labels (a recheck).
    ``verdicts``: the evaluation's reader of the verdict history (else one for this call).
    """
    if trigger.kind == "mismatch":
        return _mismatch_conditions(store, trigger, node, now, stale_s, only, verdicts)
    want = {**dict(trigger.labels), **(only or {})}
    conds = series_conditions(store, trigger.metric, node, want, trigger.op, trigger.threshold, trigger.for_s, now,
                              stale_s)
    current: dict[AcceleratorId, Verdict] | None = None
    for c in conds:
        acc = AcceleratorId.of(c.series)
        own = workload_labels(c.series)
        if acc is None:
            c.workload = own
            continue
        if current is None:
            current = accelerator_verdicts(store, node, now, stale_s, verdicts)
        v = current.get(acc)
        if v is not None and v.state in QUIET_STATES and c.holds:
            c.holds = False
            c.detail = f"{c.detail}; but {_acc_text(acc)} is {v.state}: an accelerator that is {v.state} never triggers"
        c.workload = own or (workload_labels(key_labels(v.workload)) if v is not None else {})
    return conds


_SLO_CACHE: dict[str, tuple[float, dict[str, SLOSpec]]] = {}


def _slo_specs(path: str) -> dict[str, SLOSpec]:
    mtime = os.stat(path).st_mtime
    hit = _SLO_CACHE.get(path)
    if hit is None or hit[0] != mtime:
        specs = {s.id: s for s in load_slo_file(path)}
        specs.update({s.name: s for s in list(specs.values())})
        hit = (mtime, specs)
        _SLO_CACHE[path] = hit
    return hit[1]


def _slo_status(store: StoreReader, trigger: Trigger, node: str, now: float) -> tuple[str | None, str]:
    """The SLO's multi-window burn-rate status on ``node`` from ``triscope.analysis.slo`` (page / ticket / ok /
    no data / not enough data yet: only page and ticket hold)."""
    try:
        spec = _slo_specs(trigger.slo_file).get(trigger.slo)
        if spec is None:
            return None, f"no SLO {trigger.slo!r} in {trigger.slo_file}"
        st = evaluate_slo(store, spec, now, node=node)
    except Exception as e:  # noqa: BLE001 - a broken spec file, no data...: the condition does not hold, says why
        return None, f"SLO {trigger.slo}: {type(e).__name__}: {e}"
    # a window short of data has no burn rate and decides no alert (so no page / ticket status)
    burns: dict[str, str | float] = {k: (w.state if w.burn_rate is None else round(w.burn_rate, 2))
                                     for k, w in st.windows.items()}
    return st.status, f"SLO {spec.id} on {node}: {st.status} (burn rates {burns})"


def evaluate_condition(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float,
                       verdicts: VerdictReader | None = None) -> Condition:
    """The condition on ``node`` as a whole (any series holding; for ``mismatch`` and ``metric`` see
    :func:`accelerator_conditions` for one per series)."""
    if trigger.kind in ("metric", "mismatch"):
        what = trigger.metric if trigger.kind == "metric" else f"{MISMATCH_METRIC}{{state={trigger.state}}}"
        return best_of(accelerator_conditions(store, trigger, node, now, stale_s, verdicts=verdicts),
                       f"no data for {what} on {node}")
    if trigger.kind == "slo":
        status, detail = _slo_status(store, trigger, node, now)
        holds = status == "page" or (trigger.slo_status == "ticket" and status == "ticket")
        return Condition(holds, started_at=now if holds else None, detail=detail)
    raise ValueError(f"not a stored-data condition: {trigger.kind}")
