"""Accelerators and the workloads on them, as the pages read them (docs/workloads.md).

The agent labels its per-accelerator series with the accelerator (``gpu``, or ``npu`` +
``chip``) and the workload (``namespace``, ``pod``, ``container``, ``workload``); the engine
keeps each pod's owner (``Deployment/name``, ...) in the store's ``workloads`` table.  This
module turns those series into what the Fleet, Node, Mismatch and Root cause pages show: the
accelerators of a node, each one's current state and workload, the workloads' feeder evidence
over a window, the share of time each workload spent in each state, and runs of one state per
accelerator.  Reads go through the store's read functions only (no SQL here).

States come from the verdict history (``store.verdict_runs`` / ``store.current_verdicts``: the
runs of each accelerator's published state, store/verdicts.py), the record root cause reads too
(migration 0008 backfilled it for data written before it existed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from triscope.core.samples import parse_label_key
from triscope.core.vocabulary import (
    WORKLOAD_LABELS,
    AcceleratorId,
    AcceleratorOrder,
    State,
    workload_labels,
)
from triscope.store.reader import SeriesData, SeriesInfo, StoreReader, VerdictRun
from triscope.store.workloads import owners, workloads

if TYPE_CHECKING:   # the workloads table is read with the store's own functions (like the audit log)
    from triscope.store.api import Store

log = logging.getLogger(__name__)

STATE_METRIC = "triscope_mismatch_state"
INFO_METRIC = "triscope_accelerator_workload_info"
WORKLOAD_PREFIX = "triscope_workload_"


# ---------------------------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class WorkloadRef:
    """A workload's labels as the agent wrote them, plus its owner from the workloads table."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    workload: str = ""
    owner: str = ""           # "Deployment/vit-serve" (the engine's resolution), "" when not resolved

    @classmethod
    def of(cls, labels: Mapping[str, str], owners: Mapping[tuple[str, str], str] | None = None) -> WorkloadRef:
        ns, pod = str(labels.get("namespace") or ""), str(labels.get("pod") or "")
        return cls(ns, pod, str(labels.get("container") or ""), str(labels.get("workload") or ""),
                   (owners or {}).get((ns, pod), "") if pod else "")

    @property
    def empty(self) -> bool:
        return not (self.pod or self.workload)

    @property
    def kind_name(self) -> str:
        """``Deployment/name`` when known: the agent's ``workload`` label, else the owner."""
        w = self.workload
        if w and "/" in w and not w.startswith(("unit:", "cmd:")):
            return w
        return self.owner

    @property
    def display(self) -> str:
        """``inference/Deployment/vit-serve`` (resolved), ``inference/vit-serve-6c9d7f8b4-k2x7q``
        (the pod, owner not resolved yet), ``unit:x.service`` / ``cmd:python`` off Kubernetes,
        ``shared`` / ``other``; "" when no process uses the accelerator."""
        kn = self.kind_name
        if kn:
            return f"{self.namespace}/{kn}" if self.namespace else kn
        if self.workload:
            return self.workload
        if self.pod:
            return f"{self.namespace}/{self.pod}" if self.namespace else self.pod
        return ""

    @property
    def brief(self) -> str:
        """``Deployment/vit-serve`` when resolved, else as ``display`` (``namespace/pod``): a fleet cell."""
        return self.kind_name or self.display

    @property
    def detail(self) -> str:
        """Everything known, for a tooltip."""
        parts = [self.display or "no process"]
        if self.kind_name and self.pod:
            parts.append(f"pod {self.pod}")
        if self.container:
            parts.append(f"container {self.container}")
        return ", ".join(parts)


OWNERS_BULK = 500   # above this many pods one read of the whole table beats lookups 500 at a time


def workload_owners(store: Store, pods: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> ``Kind/name`` for ``pods`` from the engine's ``workloads`` table
    (``triscope.store.workloads``); empty when this store has no such table yet."""

    pairs = {(ns, pod) for ns, pod in pods if pod}
    if not pairs:
        return {}
    try:
        if len(pairs) <= OWNERS_BULK:
            return owners(store, pairs)
        return {(w.namespace, w.pod): w.workload for w in workloads(store, limit=1_000_000)
                if (w.namespace, w.pod) in pairs}
    except Exception as e:  # noqa: BLE001 - not migrated yet / older store: the pods are shown unresolved
        log.debug("workloads table unavailable: %s", e)
        return {}


OwnerLookup = Callable[[Iterable[tuple[str, str]]], Mapping[tuple[str, str], str]]
"""(namespace, pod) pairs -> their ``Kind/name``: ``functools.partial(workload_owners, store)``."""


def owners_for(lookup: OwnerLookup | None, labels: Iterable[Mapping[str, str]]) -> dict[tuple[str, str], str]:
    """One lookup for the pods the label sets name (those without a ``Kind/name`` of their own)."""
    if lookup is None:
        return {}
    pairs = {(str(lab.get("namespace") or ""), str(lab.get("pod") or "")) for lab in labels
             if lab.get("pod") and not WorkloadRef.of(lab).kind_name}
    return dict(lookup(pairs)) if pairs else {}


def with_owners(nows: Sequence[NodeNow], lookup: OwnerLookup | None) -> None:
    """Fill in the owners of every workload of ``nows`` (in place, one lookup for all)."""
    if lookup is None:
        return
    refs: set[WorkloadRef] = set()
    for n in nows:
        for a in n.accels.values():
            if a.workload is not None:
                refs.add(a.workload)
            refs.update(a.workloads)
    pairs = {(r.namespace, r.pod) for r in refs if r.pod and not r.kind_name}
    found = lookup(pairs) if pairs else {}
    if not found:
        return

    fixed: dict[WorkloadRef, WorkloadRef] = {}
    for r in refs:
        o = found.get((r.namespace, r.pod))
        if o and not r.kind_name:
            fixed[r] = WorkloadRef(r.namespace, r.pod, r.container, r.workload, o)
    for n in nows:
        for a in n.accels.values():
            if a.workload is not None:
                a.workload = fixed.get(a.workload, a.workload)
            a.workloads = [fixed.get(w, w) for w in a.workloads]


def workload_of(labels: Mapping[str, str], owners: Mapping[tuple[str, str], str] | None = None) -> WorkloadRef:
    return WorkloadRef.of(labels, owners)


# ---------------------------------------------------------------------------------------------- current state
@dataclass
class AccelNow:
    """An accelerator's newest stored state, score and workloads."""

    accel: AcceleratorId
    state: str = ""            # "" when the agent stores no per-accelerator state for it
    score: float | None = None
    ts: float = -1.0
    workload: WorkloadRef | None = None             # the dominant one (the state series' labels)
    workloads: list[WorkloadRef] = field(default_factory=list)   # every one with a process on it now

    @property
    def shown_workload(self) -> WorkloadRef | None:
        return self.workload if self.workload is not None and not self.workload.empty else (
            self.workloads[0] if self.workloads else self.workload)

    def workload_text(self, brief: bool = False) -> str:
        """The workload shown for it (``+N`` when more share the accelerator), "no process"."""
        w = self.shown_workload
        text = (w.brief if brief else w.display) if w is not None else ""
        extra = len(set(self.workloads) - {w})
        return (text or "no process") + (f" +{extra}" if extra else "")


@dataclass
class NodeNow:
    state: str = ""
    score: float | None = None
    ts: float = -1.0
    accels: dict[AcceleratorId, AccelNow] = field(default_factory=dict)


LabelParser = Callable[[str], Mapping[str, str]]
"""The store's label-key text -> its labels (``triscope.core.samples.parse_label_key``, or a caching one)."""
SeriesFetch = Callable[[StoreReader, Sequence[SeriesInfo], float, float, int], list[SeriesData]]
"""Reads several series at once (``triscope.dashboard.data.fetch_all``): store, infos, start, end, max points."""


def _labels_of(lk: Mapping[str, str] | str, parse: LabelParser | None) -> Mapping[str, str]:
    """An entry's labels: as they are, or parsed from the store's label-key text."""
    return (parse or parse_label_key)(lk) if isinstance(lk, str) else lk


INFO_SLACK_S = 30.0   # workloads whose info point is this close to the newest one count as present now


def _by_workload_name(item: tuple[float, WorkloadRef]) -> tuple[str, str]:
    return item[1].display, item[1].container


def _by_end(r: VerdictRun) -> tuple[float, float]:
    return r.end, r.start


def _by_start(r: VerdictRun) -> tuple[float, float]:
    return r.start, r.end


def _add_workloads(out: NodeNow, info: Mapping[AcceleratorId, list[tuple[float, WorkloadRef]]]) -> None:
    """Every workload with a process on each accelerator now (its info point near the newest)."""
    for acc, items in info.items():
        newest = max(t for t, _ in items)
        now = out.accels.setdefault(acc, AccelNow(acc))
        seen: set[WorkloadRef] = set()
        for t, w in sorted(items, key=_by_workload_name):
            if t >= newest - INFO_SLACK_S and w not in seen and not w.empty:
                seen.add(w)
                now.workloads.append(w)


def _rollup_if_missing(out: NodeNow) -> None:
    if not out.state and any(a.state for a in out.accels.values()):  # no roll-up stored: the worst accelerator
        worst = rollup(list(out.accels.values()))
        if worst is not None:
            out.state, out.score = worst.state, worst.score


CURRENT_LOOKBACK_S = 900.0   # a node's current state: its runs that end this close to its last tick
STRETCH_GAP_S = 30.0         # runs of one state this close together are one stretch (the current score)


def current_run(runs: Sequence[VerdictRun]) -> tuple[str, float, float, tuple[str, str, str, str]]:
    """(state, score, last tick, workload) of one accelerator's newest runs: the newest run's state;
    the score over the whole current stretch of that state (its runs differ by workload only; a
    one-tick run's score alone says little); its newest named workload."""
    rs = sorted(runs, key=_by_end)
    newest = rs[-1]
    stretch = [newest]
    for r in reversed(rs[:-1]):
        if r.state != newest.state or stretch[-1].start - r.end > STRETCH_GAP_S:
            break
        stretch.append(r)
    ticks = sum(max(1, r.ticks) for r in stretch)
    score = sum(r.score_mean * max(1, r.ticks) for r in stretch) / ticks
    wl = next((r.workload for r in stretch if any(r.workload)), newest.workload)
    return newest.state, score, newest.end, wl


def current_from_runs(runs: Iterable[VerdictRun], info: Iterable[tuple[str, Mapping[str, str] | str, float, float]] = (),
                      owners: Mapping[tuple[str, str], str] | None = None, parse: LabelParser | None = None) -> NodeNow:
    """A node's current roll-up and per-accelerator state from its newest verdict runs
    (``store.current_verdicts``), its workloads from the newest workload-info points (``info``:
    ``(metric, labels, ts, value)``, labels as a dict or, with ``parse``, the store's label-key text)."""
    out = NodeNow()
    by_acc: dict[str, list[VerdictRun]] = {}
    for r in runs:
        by_acc.setdefault(r.accelerator, []).append(r)
    for name, rs in by_acc.items():
        state, score, ts, wl = current_run(rs)
        acc = AcceleratorId.parse(name)
        if not name:
            out.state, out.score, out.ts = state, score, ts
        elif acc is not None:
            out.accels[acc] = AccelNow(acc, state, score, ts, WorkloadRef.of(workload_labels(wl), owners))
    present: dict[AcceleratorId, list[tuple[float, WorkloadRef]]] = {}
    for metric, lk, ts, value in info:
        if metric != INFO_METRIC or value < 0.5:
            continue
        lab = _labels_of(lk, parse)
        acc = AcceleratorId.of(lab)
        if acc is not None:
            present.setdefault(acc, []).append((ts, WorkloadRef.of(lab, owners)))
    _add_workloads(out, present)
    _rollup_if_missing(out)
    return out


def rollup(accels: Sequence[AccelNow]) -> AccelNow | None:
    """The worst accelerator: I/O states first (by score), then by the states' order (``State.order``)."""
    have = [a for a in accels if a.state]
    if not have:
        return None

    def key(a: AccelNow) -> tuple[int, float, int]:
        st = State.of(a.state)
        io = st is not None and st.io
        return (0 if io else 1, -(a.score or 0.0) if io else 0.0, st.order if st is not None else len(State))

    return min(have, key=key)


def node_current(store: StoreReader, node: str, owners: OwnerLookup | None = None) -> NodeNow:
    """One node's current state from its verdict history (``current_from_runs``: the same record the
    Fleet page reads), its workloads from the newest workload-info points; owners looked up."""
    info: list[tuple[str, Mapping[str, str], float, float]] = [
        (lv.info.metric, lv.info.labels, lv.ts, lv.value) for lv in store.latest(node, metric=INFO_METRIC)]
    now = current_from_runs(store.current_verdicts(CURRENT_LOOKBACK_S, nodes=[node]).get(node, []), info)
    with_owners([now], owners)
    return now


def node_accels(store: StoreReader, node: str, infos: Sequence[SeriesInfo] | None = None) -> list[AcceleratorId]:
    """Every accelerator the node's series name (GPU and NPU series, per-accelerator verdicts,
    workload info), sorted GPUs first by index."""
    seen: set[AcceleratorId] = set()
    for s in infos if infos is not None else store.series(node=node, prefix="triscope_"):
        if s.metric.startswith(("triscope_gpu_", "triscope_npu_", "triscope_mismatch_", "triscope_accelerator_",
                                WORKLOAD_PREFIX)):
            a = AcceleratorId.of(s.labels)
            if a is not None:
                seen.add(a)
    return sorted(seen)


# ---------------------------------------------------------------------------------------------- the node's workloads
WORKLOAD_METRICS = ("processes", "sm_ratio", "cpu_seconds_total", "feeder_busy_ratio", "cpu_wait_ratio",
                    "cpu_pressure_ratio")


@dataclass
class WorkloadRow:
    """One workload on one accelerator over a window: its labels and the host-side evidence."""

    accel: AcceleratorId
    ref: WorkloadRef
    uuid: str = ""
    processes: float | None = None     # newest
    sm_share: float | None = None      # mean (0..1)
    cpu_cores: float | None = None     # mean CPU seconds per second
    feeder_busy: float | None = None   # mean (0..1)
    feeder_busy_peak: float | None = None
    cpu_wait: float | None = None      # mean (0..1)
    cpu_wait_peak: float | None = None
    cpu_pressure: float | None = None  # mean (0..1)
    last_seen: float | None = None


def _row_order(r: WorkloadRow) -> tuple[AcceleratorOrder, str, str]:
    return r.accel.sort_key, r.ref.display, r.ref.container


def _wkey(acc: AcceleratorId, labels: Mapping[str, str]) -> tuple[AcceleratorId, tuple[str, ...]]:
    return acc, tuple(str(labels.get(k) or "") for k in WORKLOAD_LABELS)


def node_workloads(store: StoreReader, node: str, start: float, end: float, accel: AcceleratorId | None = None,
                   owners: OwnerLookup | None = None, max_points: int = 240,
                   fetch: SeriesFetch | None = None, max_series: int = 200, listed: Sequence[SeriesInfo] | None = None) -> list[WorkloadRow]:
    """The workloads on the node's accelerators (or on ``accel``) over [start, end], with their
    processes, SM share, CPU, feeder busy, CPU wait and CPU pressure (``triscope_workload_*``);
    ``listed``: the node's series already listed (else they are listed here)."""
    if listed is None:
        infos = [s for s in store.series(node=node, prefix=WORKLOAD_PREFIX)] + store.series(node=node, metric=INFO_METRIC)
    else:
        infos = [s for s in listed if s.metric.startswith(WORKLOAD_PREFIX)] + [s for s in listed if s.metric == INFO_METRIC]
    infos = [s for s in infos if AcceleratorId.of(s.labels) is not None and (accel is None or accel.matches(s.labels))]
    infos = infos[:max_series]
    if not infos:
        return []
    found = owners_for(owners, (i.labels for i in infos))
    if fetch is None:
        datas = [store.query_series(i, start, end, max_points=max_points) for i in infos]
    else:
        datas = fetch(store, infos, start, end, max_points)
    rows: dict[tuple[AcceleratorId, tuple[str, ...]], WorkloadRow] = {}
    for info, d in zip(infos, datas, strict=True):
        acc = AcceleratorId.of(info.labels)
        if acc is None or not d.values:
            continue
        k = _wkey(acc, info.labels)
        row = rows.get(k)
        if row is None:
            row = rows[k] = WorkloadRow(acc, WorkloadRef.of(info.labels, found))
        row.last_seen = max(row.last_seen or d.ts[-1], d.ts[-1])
        vals = d.values
        mean = sum(vals) / len(vals)
        m = info.metric.removeprefix(WORKLOAD_PREFIX)
        if info.metric == INFO_METRIC:
            row.uuid = str(info.labels.get("uuid") or row.uuid)
        elif m == "processes":
            row.processes = vals[-1]
        elif m == "sm_ratio":
            row.sm_share = mean
        elif m == "cpu_seconds_total":
            row.cpu_cores = mean
        elif m == "feeder_busy_ratio":
            row.feeder_busy, row.feeder_busy_peak = mean, max(vals)
        elif m == "cpu_wait_ratio":
            row.cpu_wait, row.cpu_wait_peak = mean, max(vals)
        elif m == "cpu_pressure_ratio":
            row.cpu_pressure = mean
    return sorted(rows.values(), key=_row_order)


# ---------------------------------------------------------------------------------------------- the mismatch page
@dataclass
class WorkloadShares:
    """Share of time in each state per workload, over the accelerators and nodes it ran on."""

    shares: dict[str, dict[str, float]] = field(default_factory=dict)    # workload -> state -> share
    seconds: dict[str, float] = field(default_factory=dict)              # workload -> accelerator-seconds
    where: dict[str, set[tuple[str, AcceleratorId]]] = field(default_factory=dict)  # workload -> (node, accel)
    runs_read: int = 0            # verdict runs read (the history)
    series_read: int = 0          # state series read: none (every verdict is in the history)


NO_WORKLOAD = "(no workload attributed)"


def run_spans(runs: Sequence[VerdictRun], start: float, end: float) -> list[tuple[VerdictRun, float, float]]:
    """Each run with the span it covers in [start, end]: from its first tick to one sampling step
    past its last (the state held until the next tick), in time order; the step is the runs' median
    tick interval."""
    steps = sorted((r.end - r.start) / (r.ticks - 1) for r in runs if r.ticks > 1 and r.end > r.start)
    step = steps[len(steps) // 2] if steps else 1.0
    out: list[tuple[VerdictRun, float, float]] = []
    for r in sorted(runs, key=_by_start):
        a, b = max(r.start, start), min(r.end + step, end)
        if b > a:
            out.append((r, a, b))
    return out


def workload_state_shares(store: StoreReader, nodes: Sequence[str], start: float, end: float,
                          owners: OwnerLookup | None = None) -> WorkloadShares:
    """Over [start, end], each workload's share of accelerator time in each state, pooled over
    every (node, accelerator) it ran on, from the verdict history's per-accelerator runs (the runs
    root cause and the Node page read).  Workloads group by their resolved owner
    (``Deployment/name``) when the workloads table has it, else by pod."""
    out = WorkloadShares()
    spans: list[tuple[str, AcceleratorId, Mapping[str, str], str, float, float]] = []
    for node in nodes:
        runs = [r for r in store.verdict_runs(node, start, end) if r.accelerator]
        out.runs_read += len(runs)
        for r, a, b in run_spans(runs, start, end):
            acc = AcceleratorId.parse(r.accelerator)
            if acc is not None:
                spans.append((node, acc, workload_labels(r.workload), r.state, a, b))
    found = owners_for(owners, (lab for _, _, lab, _, _, _ in spans))
    secs: dict[str, dict[str, float]] = {}
    for node, acc, lab, state, a, b in spans:
        name = WorkloadRef.of(lab, found).display or NO_WORKLOAD
        d = secs.setdefault(name, {})
        d[state] = d.get(state, 0.0) + (b - a)
        out.where.setdefault(name, set()).add((node, acc))
    for name, d in secs.items():
        tot = sum(d.values())
        out.seconds[name] = tot
        out.shares[name] = {k: v / tot for k, v in d.items()} if tot > 0 else {}
    return out
