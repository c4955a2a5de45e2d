"""What a bad episode is compared with: a reference that exists, or none (then it says why).

In order (``choose_reference``):

1. **given**: the caller's baseline range (``triscope rca --baseline-start/--baseline-end``), when
   it holds data;
2. **healthy-before**: the nearest healthy episode (``idle``, ``demand-limited``,
   ``compute-bound``, ``balanced``) before it on the same accelerator, at least ``MIN_REFERENCE_S``
   long; its last ``max(episode length, REFERENCE_SPAN_S)`` seconds;
3. **workload-history**: the most recent healthy run of the same workload anywhere in the store
   (another accelerator of the node, another node) in the ``HISTORY_S`` before the episode;
4. **fleet-peers**: other nodes running the same workload, healthy for at least half of the
   episode, over the same time (at most ``MAX_PEERS``);
5. **none**: ranked on absolute evidence only (``triscope.analysis.rca.evidence``).

3 and 4 need the workload: the verdict history's per-accelerator runs name it (store/verdicts.py,
docs/workloads.md); a workload is matched on ``namespace`` + ``workload`` when the owner is known,
else on ``namespace`` + ``container`` + the pod name without its ReplicaSet / pod suffix.  They
are read in a second fetch (``fetch_workload_references``): per workload, its runs on every node
(``store.verdict_runs``, full resolution whatever the range) over ``HISTORY_S`` before the episode
and over the episode (which hours were healthy where, the most recent candidate hours' runs, the
peers), then one ``query`` per metric on each reference node over the reference range.  Series of
another node or accelerator are matched by name and labels without the accelerator, device and
pod labels (``compare_key``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.episodes import (
    NO_WORKLOAD,
    Episode,
    Workload,
    is_bad,
    is_healthy,
    merge_flickers,
    min_episode_s,
    run_episodes,
    workload_dict,
)
from triscope.analysis.reader import SeriesPoints, StoreReader, points_of
from triscope.core.vocabulary import accelerator_name
from triscope.store.reader import VerdictRun

MIN_REFERENCE_S = 10.0
REFERENCE_SPAN_S = 600.0
HISTORY_S = 7 * 86400.0
MAX_PEERS = 3
PEER_HEALTHY_SHARE = 0.5
DROP_LABELS = frozenset({"gpu", "npu", "chip", "device", "bus_id", "uuid", "instance", "pod", "node"})


@dataclass(slots=True)
class Reference:
    kind: str                                        # given | healthy-before | workload-history | fleet-peers | none
    ranges: list[tuple[float, float]] = field(default_factory=list)
    node: str = ""
    accelerator: str | None = None
    state: str | None = None
    workload: Workload = NO_WORKLOAD
    series: list[SeriesPoints] | None = None         # None: the episode's own node (same series)
    peers: list[str] = field(default_factory=list)   # node/accelerator of each peer
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.ranges:
            d["start"] = min(a for a, _ in self.ranges)
            d["end"] = max(b for _, b in self.ranges)
        if self.kind != "none":
            d.update(node=self.node, accelerator=self.accelerator, state=self.state,
                     workload=workload_dict(self.workload))
        if self.peers:
            d["peers"] = self.peers
        if self.why:
            d["why"] = self.why
        return d


def compare_key(sp: SeriesPoints) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A series' name and labels without the ones that differ between accelerators, devices and
    pods of one workload: how a series is matched on another node or accelerator."""
    return sp.metric, tuple(sorted((k, v) for k, v in sp.labels.items() if k not in DROP_LABELS))


def pod_stem(pod: str) -> str:
    """``infer-7d9f8c6b5-x2x7q`` -> ``infer``; ``db-0`` -> ``db``: the pod's owner's name, roughly."""
    for pat in (r"-[a-z0-9]{6,10}-[a-z0-9]{5}$", r"-[a-z0-9]{5}$", r"-\d+$"):
        if re.search(pat, pod):
            return re.sub(pat, "", pod)
    return pod


WorkloadKey = tuple[str, ...]


def workload_key(w: Workload) -> WorkloadKey | None:
    ns, pod, container, workload = w
    if workload and workload not in ("shared", "other"):
        return ("workload", ns, workload)
    if pod:
        return ("pod", ns, container, pod_stem(pod))
    return None


def _matches(key: WorkloadKey, labels: Mapping[str, str]) -> bool:
    if key[0] == "workload":
        return labels.get("namespace", "") == key[1] and labels.get("workload", "") == key[2]
    return (labels.get("namespace", "") == key[1] and labels.get("container", "") == key[2]
            and pod_stem(labels.get("pod", "")) == key[3])


# ---------------------------------------------------------------------------------------------- same node
def healthy_before(e: Episode, episodes: Sequence[Episode]) -> Episode | None:
    """The nearest healthy episode before ``e`` on its accelerator, at least ``MIN_REFERENCE_S``."""
    best = None
    for h in episodes:
        if (h.kind == "state" and h.accelerator == e.accelerator and is_healthy(h.state)
                and h.end <= e.start + 1e-6 and h.duration >= MIN_REFERENCE_S
                and (best is None or h.end > best.end)):
            best = h
    return best


def reference_span(h_start: float, h_end: float, e: Episode, guard: float = 0.0) -> tuple[float, float]:
    """The last ``max(episode length, REFERENCE_SPAN_S)`` of a healthy run, less ``guard`` seconds
    at each edge (at most a quarter of the run each): a state is decided over a window and reported
    after a dwell, so a run's edges still hold some of its neighbours."""
    g = min(guard, (h_end - h_start) / 4)
    a, b = h_start + g, h_end - g
    return max(a, b - max(e.duration, REFERENCE_SPAN_S)), b


def choose_reference(e: Episode, episodes: Sequence[Episode], node: str, given: tuple[float, float] | None,
                     given_has_data: bool, workload_refs: Mapping[tuple[str, float], Reference],
                     guard: float = 0.0) -> Reference:
    """The episode's reference (the order in the module's doc); ``guard``: see ``reference_span``."""
    if given is not None and given_has_data:
        return Reference("given", [given], node, e.accelerator, None, NO_WORKLOAD, None, [],
                         "the baseline asked for")
    h = healthy_before(e, episodes)
    if h is not None:
        return Reference("healthy-before", [reference_span(h.start, h.end, e, guard)], node, h.accelerator, h.state,
                         h.workload)
    ref = workload_refs.get((e.accelerator, e.start))
    if ref is not None:
        return ref
    why = f"no healthy period of at least {MIN_REFERENCE_S:g} s before it on {e.accelerator} in the look-back"
    if workload_key(e.workload) is None:
        why += "; no workload labels to find its history or fleet peers"
    else:
        why += "; the workload has no healthy history in the store and no healthy peer at the time"
    return Reference("none", why=why + ": ranked on absolute evidence")


# ---------------------------------------------------------------------------------------------- other nodes
@dataclass(slots=True)
class ReferenceNeed:
    node: str
    episode: Episode


def needs_of(episodes: Iterable[Episode], node: str, start: float, end: float,
             given: tuple[float, float] | None) -> list[ReferenceNeed]:
    """Bad episodes in [start, end) that have no reference on their own accelerator but a workload."""
    eps = list(episodes)
    if given is not None:
        return []
    return [ReferenceNeed(node, e) for e in eps
            if e.kind == "state" and is_bad(e.state) and e.end > start and e.start < end
            and healthy_before(e, eps) is None and workload_key(e.workload) is not None]


def _workload_runs(store: StoreReader, key: WorkloadKey, lo: float, hi: float) -> list[VerdictRun]:
    """The workload's per-accelerator runs on every node that overlap [lo, hi] (the verdict history)."""
    return [r for n in store.nodes() for r in store.verdict_runs(n.name, lo, hi)
            if r.accelerator and _matches(key, workload_dict(r.workload))]


def fetch_workload_references(store: StoreReader, needs: Sequence[ReferenceNeed], metrics: Sequence[str],
                              guard: float = 0.0, lag: float = 0.0) -> dict[tuple[str, float], Reference]:
    """References for ``needs`` from the workload's history or its fleet peers, keyed by
    (accelerator, episode start).  Per workload: its runs in the verdict history on every node over
    ``HISTORY_S`` before the episode and over it, read once; the hours in which it was healthy
    somewhere, the most recent such hours' runs (the healthy run itself, ``HISTORY_CANDIDATES``
    hours at most); without history, its runs over the episode (peers).  ``lag``: the tracker's
    lag, by which runs are moved back as the timeline's own (``timeline.tracker_lag``).  Then
    ``metrics`` of each reference node over the reference range, one ``query`` per metric."""
    out: dict[tuple[str, float], Reference] = {}
    by_key: dict[WorkloadKey, list[ReferenceNeed]] = {}
    for n in needs:
        k = workload_key(n.episode.workload)
        if k is not None:
            by_key.setdefault(k, []).append(n)
    reads: dict[tuple[str, float, float], list[SeriesPoints]] = {}
    for key, ns in by_key.items():
        first = min(n.episode.start for n in ns)
        last = max(n.episode.end for n in ns)
        runs = _workload_runs(store, key, first - HISTORY_S, last)
        hours = _healthy_hours(runs, first - HISTORY_S, first, lag)
        now = _runs_by_place(runs, first, last, lag)
        for n in ns:
            ref = _history(runs, n, hours, guard, lag) or _peers(n, now)
            if ref is None:
                continue
            lo_r = min(a for a, _ in ref.ranges)
            hi_r = max(b for _, b in ref.ranges)
            places = [(ref.node, ref.accelerator or "")] if ref.kind == "workload-history" else \
                [(p.split("/", 1)[0], p.split("/", 1)[1]) for p in ref.peers]
            series: list[SeriesPoints] = []
            for rn in sorted({p[0] for p in places}):
                got = reads.get((rn, lo_r, hi_r))
                if got is None:
                    got = reads[(rn, lo_r, hi_r)] = _read_node(store, rn, metrics, lo_r, hi_r)
                accs = {a for node, a in places if node == rn}
                series += [sp for sp in got if accelerator_name(sp.labels) in accs or accelerator_name(sp.labels) is None]
            ref.series = series
            out[(n.episode.accelerator, n.episode.start)] = ref
    return out


HISTORY_CANDIDATES = 3


def _healthy_hours(runs: Sequence[VerdictRun], lo: float, hi: float, lag: float) -> list[tuple[float, str]]:
    """(hour start, node) in [lo, hi) in which a healthy run was seen, most recent first."""
    got: set[tuple[float, str]] = set()
    for r in runs:
        a, b = max(lo, r.start - lag), min(hi, r.end)
        if not is_healthy(r.state) or b < a:
            continue
        h = a // 3600 * 3600
        while h <= b:
            got.add((h, r.node))
            h += 3600
    return sorted(got, reverse=True)


def _history(runs: Sequence[VerdictRun], n: ReferenceNeed, hours: Sequence[tuple[float, str]],
             guard: float, lag: float) -> Reference | None:
    """The most recent healthy run of the workload before the episode, from the candidate hours."""
    e = n.episode
    for hour, node in [h for h in hours if h[0] < e.start][:HISTORY_CANDIDATES]:
        by_place = _runs_by_place([r for r in runs if r.node == node], hour, min(hour + 3600, e.start), lag)
        best = None
        for (_node, _acc), eps in by_place.items():
            for h in eps:
                if (is_healthy(h.state) and h.duration >= MIN_REFERENCE_S and h.end <= e.start + 1e-6
                        and (best is None or h.end > best.end)):
                    best = h
        if best is not None:
            here = (" on another node" if node != n.node else
                    " on another accelerator of this node" if best.accelerator != e.accelerator else
                    " here, before the look-back")
            return Reference("workload-history", [reference_span(best.start, best.end, e, guard)], node,
                             best.accelerator, best.state, best.workload, None, [],
                             "the same workload's most recent healthy run" + here)
    return None


def _read_node(store: StoreReader, node: str, metrics: Sequence[str], lo: float, hi: float) -> list[SeriesPoints]:
    span = hi - lo
    tier = None if span <= 3600 else "1m" if span <= 12 * 3600 else "1h"
    out: list[SeriesPoints] = []
    for m in metrics:
        out += [points_of(sd) for sd in store.query(m, node=node, start=lo, end=hi,
                                                    max_points=None if tier else 3600, tier=tier)]
    return out


def _runs_by_place(runs: Sequence[VerdictRun], lo: float, hi: float, lag: float) -> dict[tuple[str, str], list[Episode]]:
    """(node, accelerator) -> its runs as episodes (moved back by ``lag``) cut to [lo, hi], merged
    as the timeline merges its own (``merge_flickers`` at the runs' step)."""
    by_place: dict[tuple[str, str], list[VerdictRun]] = {}
    for r in sorted(runs, key=lambda r: (r.node, r.accelerator, r.start)):
        by_place.setdefault((r.node, r.accelerator), []).append(r)
    out: dict[tuple[str, str], list[Episode]] = {}
    for (node, acc), rs in by_place.items():
        steps = sorted((r.end - r.start) / (r.ticks - 1) for r in rs if r.ticks > 1 and r.end > r.start)
        step = steps[len(steps) // 2] if steps else 1.0
        eps = []
        for e in run_episodes(acc, rs, step, lag):
            e.start, e.end = max(e.start, lo), min(e.end, hi)
            if e.end > e.start:
                eps.append(e)
        if eps:
            out[(node, acc)] = merge_flickers(eps, min_episode_s(step))
    return out


def _peers(n: ReferenceNeed, runs: Mapping[tuple[str, str], Sequence[Episode]]) -> Reference | None:
    """Other nodes running the workload, healthy for at least ``PEER_HEALTHY_SHARE`` of the episode."""
    e = n.episode
    peers: list[tuple[float, str, str, str]] = []
    for (node, acc), eps in runs.items():
        if node == n.node:
            continue
        healthy = [h for h in eps if is_healthy(h.state)]
        overlap = sum(max(0.0, min(h.end, e.end) - max(h.start, e.start)) for h in healthy)
        if healthy and overlap > 0 and overlap >= PEER_HEALTHY_SHARE * e.duration:
            st = max(healthy, key=lambda h: min(h.end, e.end) - max(h.start, e.start)).state
            peers.append((overlap, node, acc, st))
    if not peers:
        return None
    peers.sort(key=lambda p: (-p[0], p[1], p[2]))
    peers = peers[:MAX_PEERS]
    return Reference("fleet-peers", [(e.start, e.end)], "", None, peers[0][3], e.workload, None,
                     [f"{p[1]}/{p[2]}" for p in peers],
                     f"{len(peers)} node(s) running the same workload, healthy over the same time")
