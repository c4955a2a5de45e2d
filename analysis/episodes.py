"""A node's window cut into episodes: runs of one coordination state per accelerator, and health
events.  Pure functions over points already read (``triscope.analysis.rca.timeline`` fetches them).

Where the states come from: the verdict history's runs (``store.verdict_runs``; ``run_episodes``):
one run per accelerator and workload, or the node's roll-up; where a node has none, the
stored-window classifier's verdicts (``triscope.analysis.mismatch.window_states`` over the same
points, ``classifier_state_samples``), per accelerator where it gives them (``evidence["accelerators"]``).
A run ends where the state or the workload changes or the data stops for more than ``GAP_STEPS``
sampling steps.  **Flickers** shorter than
``min_episode_s(step)`` (``MIN_EPISODE_S``, 10 s, the detector's window, or two sampling steps on
rollups) are merged into a neighbour, shortest first: into both neighbours when they have the same
state, else into the neighbour of the same kind (I/O state next to I/O state, healthy next to
healthy), else into the longer one.

Health events (``HEALTH_EVENTS``: XID errors, a lost GPU, PCIe AER, IOMMU faults, NPU health
changes, one of the agent's collectors going down) become episodes of their own: events of one
kind on one accelerator (or device) closer than ``HEALTH_MERGE_S`` are one episode; a collector
down lasts until it is back up, and one down again within ``HEALTH_MERGE_S`` of coming back
continues its episode (``collector_episodes``).  A ``scrape:`` collector reads a workload's own
``/metrics``: its late answers are no health incident of the node but events on that workload's
lane (``triscope.analysis.rca.context``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from triscope.analysis.mismatch import AcceleratorState, WindowState
from triscope.analysis.reader import SeriesPoints, label_name
from triscope.core.verdict import Verdict, fold
from triscope.core.vocabulary import (
    IO_STATES,
    NO_WORKLOAD,
    WORKLOAD_LABELS,
    WORST_FIRST,
    WorkloadKey,
    accelerator_name,
)

MIN_EPISODE_S = 10.0          # the one flicker threshold: shorter runs are merged into a neighbour
MIN_EPISODE_STEPS = 2         # ... or two sampling steps, on coarse (rollup) points
GAP_STEPS = 3.0               # no state for more than this many steps ends a run
HEALTH_MERGE_S = 60.0         # health events of one kind and place closer than this are one episode
WORKLOAD_INFO = "triscope_accelerator_workload_info"
NODE = "node"
# worst first: which state a mixed sample takes
STATE_ORDER = WORST_FIRST
HEALTH_EVENTS = {"xid": "gpu_health", "gpu_lost": "gpu_health", "npu_health": "gpu_health", "aer": "pcie_errors",
                 "iommu_fault": "iommu_faults", "collector": "agent"}
SCRAPE_PREFIX = "scrape:"     # a collector reading a workload's own /metrics (``--scrape``)

Workload = WorkloadKey


def is_application_collector(name: str) -> bool:
    """A collector that reads a workload's own endpoint (``--scrape``), not the host or the agent."""
    return name.startswith(SCRAPE_PREFIX)


def is_bad(state: str) -> bool:
    """An I/O state: the accelerator is held back by the link, the host or the network."""
    return state in IO_STATES


def is_healthy(state: str) -> bool:
    return state in STATE_ORDER and state not in IO_STATES


def min_episode_s(step: float) -> float:
    return max(MIN_EPISODE_S, MIN_EPISODE_STEPS * step)


def workload_of(labels: Mapping[str, str]) -> Workload:
    return (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""),
            labels.get("workload", ""))


def workload_dict(w: Workload) -> dict[str, str]:
    return dict(zip(WORKLOAD_LABELS, w, strict=True))


@dataclass(slots=True)
class Episode:
    """One run of a state on one accelerator, or one health incident."""

    start: float
    end: float
    state: str                      # a mismatch state, or for health episodes the event kind
    accelerator: str                # "gpu=0", "chip=0,npu=1", "node"
    workload: Workload = NO_WORKLOAD
    kind: str = "state"             # state | health | slo | event (context on a lane, never bad)
    score: float | None = None      # mean mismatch score (share of the accelerator's time lost to I/O)
    samples: int = 0
    causes: list[Any] = field(default_factory=list)     # ranked causes (``rca.score.Cause``)
    context: list[Any] = field(default_factory=list)    # shown beside them, never ranked (``rca.context.Context``)
    reference: dict[str, Any] | None = None
    events: list[Any] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def bad(self) -> bool:
        return self.kind in ("health", "slo") or (self.kind == "state" and is_bad(self.state))


# ---------------------------------------------------------------------------------------------- states
def classifier_state_samples(windows: Iterable[AcceleratorState | WindowState]) -> dict[str, list[Verdict]]:
    """accelerator -> samples from the stored-window classifier: one sample per window at its
    start.  Takes ``AcceleratorState`` rows (``mismatch.accelerator_window_states``: accelerator,
    state, score, workload) or the node's ``WindowState`` rows (per accelerator where the evidence
    lists them, ``evidence["accelerators"]``, else under the accelerator the evidence names)."""
    out: dict[str, list[Verdict]] = {}
    for w in windows:
        if isinstance(w, AcceleratorState):
            out.setdefault(w.accelerator, []).append(Verdict(w.start, w.state, workload_of(w.workload), w.score))
            continue
        accs = w.evidence.get("accelerators")
        if isinstance(accs, dict) and accs:
            for name, d in accs.items():
                st = d.get("state") if isinstance(d, dict) else None
                if st:
                    out.setdefault(str(name), []).append(Verdict(w.start, str(st), NO_WORKLOAD, d.get("score")))
        else:
            name = w.evidence.get("accelerator") or NODE
            out.setdefault(str(name), []).append(Verdict(w.start, w.state, NO_WORKLOAD, w.score))
    for v in out.values():
        v.sort(key=lambda s: s.ts)
    return out


class RunLike(Protocol):
    """A run of verdicts: ``triscope.core.verdict.Run`` (folded here) or a ``VerdictRun`` of the store."""

    @property
    def state(self) -> str: ...
    @property
    def workload(self) -> Workload: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def ticks(self) -> int: ...
    @property
    def score_mean(self) -> float | None: ...


def run_episodes(accelerator: str, runs: Sequence[RunLike], step: float, lag: float = 0.0,
                 first: float = -math.inf) -> list[Episode]:
    """One accelerator's runs (in time order) as episodes: each moved back by ``lag`` (not before
    ``first``), ending where the next one begins when that is within ``GAP_STEPS`` steps of its
    last verdict, else ``step`` after it (the data stopped: the state held until then)."""
    out: list[Episode] = []
    for i, r in enumerate(runs):
        start = max(first, r.start - lag)
        nxt = runs[i + 1] if i + 1 < len(runs) else None
        if nxt is not None and nxt.start - r.end <= GAP_STEPS * step + 1e-6:
            end = max(start, nxt.start - lag)
        else:
            end = r.end + step
        out.append(Episode(start, end, r.state, accelerator, r.workload, score=r.score_mean, samples=r.ticks))
    return out


def state_runs(samples: Mapping[str, Sequence[Verdict]], step: float) -> list[Episode]:
    """Runs of one (state, workload) per accelerator (``triscope.core.verdict.fold``, a gap of more
    than ``GAP_STEPS`` steps ending one).  A sample stands for [ts, ts + step); a run ends at the
    next run's first sample, or ``step`` after its last one where the data stops."""
    out: list[Episode] = []
    for acc, ss in samples.items():
        out += run_episodes(acc, fold(ss, GAP_STEPS * step), step)
    return out


def _same_kind(a: str, b: str) -> bool:
    return is_bad(a) == is_bad(b)


def merge_flickers(episodes: Sequence[Episode], min_len: float) -> list[Episode]:
    """Merge runs shorter than ``min_len`` into a neighbour on the same accelerator (touching
    runs only), shortest first.  The merged episode keeps the absorbing neighbour's state and
    workload; its score is the sample-weighted mean."""
    by_acc: dict[str, list[Episode]] = {}
    for e in sorted(episodes, key=lambda e: e.start):
        by_acc.setdefault(e.accelerator, []).append(e)
    out: list[Episode] = []
    for eps in by_acc.values():
        eps = list(eps)
        while len(eps) > 1:
            i = min(range(len(eps)), key=lambda k: (eps[k].duration, k))
            e = eps[i]
            if e.duration >= min_len:
                break
            prev = eps[i - 1] if i > 0 and abs(eps[i - 1].end - e.start) < 1e-6 else None
            nxt = eps[i + 1] if i + 1 < len(eps) and abs(eps[i + 1].start - e.end) < 1e-6 else None
            if prev is None and nxt is None:
                eps[i].detail["isolated"] = True   # a short run alone between gaps: keep it
                break
            if prev is not None and nxt is not None and prev.state == nxt.state and prev.workload == nxt.workload:
                _absorb(prev, e)
                _absorb(prev, nxt)
                del eps[i:i + 2]
                continue
            cands = [c for c in (prev, nxt) if c is not None]
            same = [c for c in cands if _same_kind(c.state, e.state)]
            target = max(same or cands, key=lambda c: c.duration)
            _absorb(target, e)
            del eps[i]
        out.extend(eps)
    return sorted(out, key=lambda e: (e.start, e.accelerator))


def _absorb(into: Episode, other: Episode) -> None:
    n1, n2 = into.samples, other.samples
    if into.score is not None or other.score is not None:
        s1 = into.score if into.score is not None else 0.0
        s2 = other.score if other.score is not None else 0.0
        into.score = (s1 * n1 + s2 * n2) / max(1, n1 + n2)
    into.samples = n1 + n2
    into.start = min(into.start, other.start)
    into.end = max(into.end, other.end)
    into.detail["merged_flickers"] = into.detail.get("merged_flickers", 0) + 1 + other.detail.get("merged_flickers", 0)


def assign_workloads(episodes: Iterable[Episode], info: Iterable[SeriesPoints]) -> None:
    """Episodes without workload labels take the workload with the most points of
    ``triscope_accelerator_workload_info`` on their accelerator (any accelerator for ``node``)
    inside the episode."""
    infos = [sp for sp in info if sp.metric == WORKLOAD_INFO]
    if not infos:
        return
    for e in episodes:
        if e.workload != NO_WORKLOAD or e.kind != "state":
            continue
        counts: dict[Workload, int] = {}
        for sp in infos:
            if e.accelerator != NODE and accelerator_name(sp.labels) != e.accelerator:
                continue
            i, j = bisect.bisect_left(sp.ts, e.start), bisect.bisect_left(sp.ts, e.end)
            n = sum(1 for v in sp.values[i:j] if v >= 0.5)
            if n:
                w = workload_of(sp.labels)
                counts[w] = counts.get(w, 0) + n
        if counts:
            e.workload = max(counts.items(), key=lambda kv: kv[1])[0]


# ---------------------------------------------------------------------------------------------- health
def collector_episodes(events: Iterable[Any], keep: Callable[[str], bool]) -> list[Episode]:
    """Each collector named by ``keep`` down until it is back up (``collector`` events, ``details.up``),
    on the node.  Down again within ``HEALTH_MERGE_S`` of coming back continues the episode (a
    flapping collector is one episode, its blips counted in ``detail["blips"]``); one still down at
    the end of the events says so (``still_down``)."""
    open_: dict[str, Episode] = {}
    closed: dict[str, Episode] = {}     # a collector's last episode that came back up
    out: list[Episode] = []
    for e in sorted(events, key=lambda e: e.ts):
        d = e.details or {}
        name = str(d.get("collector", "?"))
        if e.kind != "collector" or not keep(name) or d.get("up") not in (True, False):
            continue
        if d.get("up") is True:       # back up: closes the down episode
            ep = open_.pop(name, None)
            if ep is not None:
                ep.end = e.ts
                ep.events.append(e)
                closed[name] = ep
            continue
        ep = open_.get(name)
        if ep is None and name in closed and e.ts - closed[name].end <= HEALTH_MERGE_S:
            ep = open_[name] = closed.pop(name)
            ep.detail["blips"] = ep.detail.get("blips", 1) + 1
        if ep is None:
            ep = open_[name] = Episode(e.ts, e.ts, "collector-down", NODE, kind="health")
            ep.detail["collector"] = name
            out.append(ep)
        ep.events.append(e)
        ep.end = max(ep.end, e.ts)
    for ep in open_.values():
        ep.detail["still_down"] = True     # no "back up" event in the range
    for ep in out:
        ep.samples = len(ep.events)
    return out


def health_episodes(events: Iterable[Any], accelerator_of_device: Mapping[str, str] | None = None) -> list[Episode]:
    """Health incidents from the store's events (``EventRow``-like: ts, kind, severity, message,
    details).  The place is the accelerator (``details.gpu``; an AER device mapped through
    ``accelerator_of_device``), else the device, else the node.  The agent's own collectors down
    (``collector_episodes``); a scrape target's late ``/metrics`` is no health incident (it is an
    event on that workload's lane, ``triscope.analysis.rca.context.metrics_late_events``)."""
    dev_map = accelerator_of_device or {}
    events = list(events)
    out = collector_episodes(events, lambda name: not is_application_collector(name))
    open_: dict[tuple[str, str], Episode] = {}
    for e in sorted(events, key=lambda e: e.ts):
        if e.kind not in HEALTH_EVENTS or e.kind == "collector":
            continue
        d = e.details or {}
        if e.kind == "npu_health" and e.severity not in ("warning", "error", "critical"):
            continue
        if "gpu" in d:
            where = f"gpu={d['gpu']}"
        elif "npu" in d:
            where = label_name({k: str(d[k]) for k in ("npu", "chip") if k in d})
        elif d.get("device"):
            where = dev_map.get(str(d["device"]), f"device={d['device']}")
        else:
            where = NODE
        key = (e.kind, where)
        ep = open_.get(key)
        if ep is None or e.ts - ep.end > HEALTH_MERGE_S:
            ep = open_[key] = Episode(e.ts, e.ts, e.kind, where, kind="health")
            out.append(ep)
        ep.events.append(e)
        ep.end = max(ep.end, e.ts)
        ep.samples = len(ep.events)
    return sorted(out, key=lambda e: e.start)
