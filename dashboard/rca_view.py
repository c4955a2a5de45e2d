"""Root-cause results for the dashboard, through the ranked view
(``triscope.analysis.rca.ranked.rank_causes``) and the episode timeline
(``triscope.analysis.rca.timeline.rca_timeline``): both score causes with the one scorer,
``triscope.analysis.rca.score.score_cause``.

``explain(store, node, start, end)`` returns ranked ``Cause`` rows, each with the series that
moved most in its category (for the evidence chart), the baseline window, the detector's
comparison and the context lines (application SLIs, remediation actions, the agent itself: shown,
never ranked).  ``timeline(store, node, start, end)`` returns the window's episodes
(docs/workloads.md section 3): runs of one state per accelerator with their workload, each bad one
with its ranked causes and context; where the timeline fails, the dashboard's own runs from the
stored per-accelerator states, each bad one explained by the ranked view over its span.
``history_shares(store, node, start, end)`` is the node's share of time in each state over a range,
from the verdict history (the Node page's ribbon, the Mismatch page's per-node shares): what the
page says about the window's states, with no detector run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from triscope.analysis.rca.changes import SeriesChange
from triscope.analysis.rca.inputs import RCAInputs
from triscope.analysis.rca.ranked import rank_causes
from triscope.analysis.rca.timeline import fetch_timeline_inputs, rca_timeline
from triscope.core.names import shorten
from triscope.core.vocabulary import AcceleratorId, is_healthy, workload_labels
from triscope.dashboard.data import Segment, Window, mismatch_segments
from triscope.dashboard.export import Series
from triscope.dashboard.jsontypes import JSON, JSONObject, items, obj
from triscope.dashboard.waitfor_view import chain_evidence
from triscope.dashboard.workload_data import OwnerLookup, WorkloadRef, owners_for, run_spans
from triscope.store.reader import StoreReader


@dataclass
class Evidence:
    metric: str
    labels: dict[str, str]
    baseline: float | None
    window: float | None
    direction: str
    onset: float | None


@dataclass
class Cause:
    key: str
    title: str
    summary: str
    score: float | None = None
    onset: float | None = None
    series: list[Evidence] = field(default_factory=list)
    events: list[JSONObject] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    chain: JSONObject | None = None     # the wait-for chain behind it (``waitfor_view.chain_evidence``)


@dataclass
class EpisodeCause:
    """A ranked cause of an episode (``score`` set), or a context line beside them (``score`` None);
    ``chain``: the wait-for chain that made it the top cause (its first evidence item, of type
    ``chain``: ``triscope.analysis.rca.chain``), None for any other cause."""

    key: str
    title: str
    score: float | None
    summary: str = ""
    chain: JSONObject | None = None


@dataclass
class RcaResult:
    causes: list[Cause]
    baseline: tuple[float, float] | None
    note: str
    series_examined: int = 0
    mismatch: JSONObject = field(default_factory=dict)
    context: list[EpisodeCause] = field(default_factory=list)   # shown beside the causes, never ranked


# the detector input to chart for a cause that has no moved series of its own (its evidence is the
# mismatch detector's verdict, which reads these)
CATEGORY_SERIES = {
    "host_staging": ("triscope_cpu_busy_ratio", "triscope_pressure_ratio"),
    "dma_mapping": ("triscope_dma_map_total",),
    "network": ("triscope_tcp_retransmits_total",),
    "pcie_load": ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_pcie_tx_bytes_total"),
    "accelerator_activity": ("triscope_gpu_sm_active_ratio", "triscope_npu_aicore_utilization_ratio"),
}


def explain(store: StoreReader, node: str, start: float, end: float, top: int = 8,
            inputs: RCAInputs | None = None) -> RcaResult:
    """The ranked causes of the whole window; ``inputs``: the timeline's read (``TimelineView.read``),
    which ``rank_causes`` reuses where it is its own (over rollups: a window of more than 30 min)."""
    res = rank_causes(store, node, start, end, inputs=inputs)
    by_cat: dict[str, list[SeriesChange]] = {}
    for ch in sorted(res.changes, key=_by_score):
        by_cat.setdefault(ch.category, []).append(ch)
    causes = []
    for c in res.causes[:top]:
        ev = [Evidence(ch.metric, dict(ch.labels), ch.baseline, ch.window, ch.direction, ch.onset)
              for ch in by_cat.get(c.key, [])[:3]]
        if not ev:
            for metric in CATEGORY_SERIES.get(c.key, ()):
                infos = store.series(node=node, metric=metric)
                if infos:
                    ev.append(Evidence(metric, dict(infos[0].labels), None, None, "detector input", c.onset))
                    break
        causes.append(Cause(c.key, c.title, c.summary, c.score, c.onset, ev, _events(c), list(c.peers), _chain(c)))
    note = "" if causes else (f"nothing moved against the baseline in this window "
                              f"({res.series_examined} series examined)")
    return RcaResult(causes, (res.baseline_start, res.baseline_end), note, res.series_examined, _mismatch(res),
                     [EpisodeCause(c.kind, c.title, None, c.summary) for c in res.context])


class _RankedCause(Protocol):
    """A ranked cause (``triscope.analysis.rca.score.Cause``) as the page reads its evidence: JSON items."""

    @property
    def evidence(self) -> Sequence[JSONObject]: ...


class _RankedResult(Protocol):
    """The ranked view (``triscope.analysis.rca.ranked.RCAResult``) as the page reads the detector's part."""

    @property
    def mismatch(self) -> JSONObject: ...


class _ContractTimeline(Protocol):
    """The timeline (``triscope.analysis.rca.timeline.Timeline``) as the contract's JSON."""

    def as_dict(self) -> JSONObject: ...


def _by_score(ch: SeriesChange) -> float:
    return -ch.score


def _events(c: _RankedCause) -> list[JSONObject]:
    """The stored events among a cause's evidence."""
    return [e for e in c.evidence if e.get("type") == "event"]


def _chain(c: _RankedCause) -> JSONObject | None:
    return chain_evidence(c.evidence)


def _mismatch(res: _RankedResult) -> JSONObject:
    return dict(res.mismatch)


def _contract(t: _ContractTimeline) -> JSONObject:
    return t.as_dict()


# ---------------------------------------------------------------------------------------------- episode timeline
@dataclass
class EpisodeView:
    """One episode of docs/workloads.md section 3: a run of one state on one accelerator (or a
    health incident, an SLO burn period), with its ranked causes when it is a bad one."""

    start: float
    end: float
    state: str
    accelerator: str               # "gpu=0", "chip=0,npu=1", "node" (the contract's form)
    accel: AcceleratorId | None            # parsed; None for the node
    workload: WorkloadRef | None
    kind: str = "state"            # state | health | slo | event (context on a lane, never bad)
    bad: bool = False
    score: float | None = None
    causes: list[EpisodeCause] = field(default_factory=list)
    reference: str = ""
    started_before: bool = False
    context: list[EpisodeCause] = field(default_factory=list)   # shown beside the causes, never ranked
    phase: str = ""                # "2 of 3" for an episode cut into phases where its cause changed

    @property
    def where(self) -> str:
        return self.accel.name if self.accel is not None else ("node" if self.accelerator in ("", "node")
                                                               else self.accelerator)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class TimelineView:
    episodes: list[EpisodeView]
    source: str                    # who cut the episodes
    notes: list[str] = field(default_factory=list)
    read: RCAInputs | None = None  # the node's series the timeline read over the window and its look-back

    @property
    def bad(self) -> list[EpisodeView]:
        return [e for e in self.episodes if e.bad]


TIMELINE_FUNCTION = "triscope.analysis.rca.timeline.rca_timeline"
FALLBACK_EXPLAINED = 4     # the dashboard's own timeline ranks causes for this many bad episodes (longest first)
FALLBACK_MIN_S = 10.0      # ... that last at least this long


def timeline(store: StoreReader, node: str, start: float, end: float,
             owners: OwnerLookup | None = None) -> TimelineView:
    """The node's episode timeline over [start, end]: ``triscope.analysis.rca.timeline.rca_timeline``
    (its ``as_dict()``, the JSON of docs/workloads.md section 3); where it fails, runs of one state
    per accelerator from the verdict history, each bad one explained by ``rank_causes`` over its
    own span, and a note saying why."""
    try:
        inputs = fetch_timeline_inputs(store, node, start, end)
        got = rca_timeline(store, node, start, end, inputs=inputs)
    except Exception as e:  # noqa: BLE001 - the page keeps working on the stored states; the note says why
        logging.getLogger("dashboard").exception("%s failed", TIMELINE_FUNCTION)
        tv = fallback_timeline(store, node, start, end, owners)
        tv.notes.insert(0, f"{TIMELINE_FUNCTION} failed ({type(e).__name__}: {str(e)[:160]}): episodes from the "
                           "verdict history's per-accelerator runs instead")
        return tv
    tv = timeline_from_dict(_contract(got), owners)
    tv.read = inputs.rca
    return tv


def _reference_text(ref: JSON) -> str:
    if not isinstance(ref, Mapping) or not ref:
        return ""
    kind = str(ref.get("kind", ""))
    if kind == "previous-phase":
        return "against the phase before it (what changed when this one began)"
    if kind == "none":
        return "no healthy reference" + (f": {ref['why']}" if ref.get("why") else "") + " (ranked on absolute evidence)"
    parts = [f"against {kind.replace('_', ' ')}"]
    if ref.get("node"):
        parts.append(f"on {shorten(str(ref['node']), 48)}")
    if ref.get("accelerator"):
        a = AcceleratorId.parse(str(ref["accelerator"]))
        parts.append(a.name if a is not None else str(ref["accelerator"]))
    if ref.get("state"):
        parts.append(f"({ref['state']})")
    return " ".join(parts)


def timeline_from_dict(d: JSONObject, owners: OwnerLookup | None = None) -> TimelineView:
    """The contract's JSON (docs/workloads.md section 3) as the page's episodes."""
    eps = [obj(e) for e in items(d.get("episodes"))]
    found = owners_for(owners, (_labels(e.get("workload")) for e in eps))
    out: list[EpisodeView] = []
    for e in eps:
        wl = _labels(e.get("workload"))
        acc_name = str(e.get("accelerator") or "node")
        out.append(EpisodeView(
            _float(e["start"]), _float(e["end"]), str(e.get("state", "?")), acc_name, AcceleratorId.parse(acc_name),
            WorkloadRef.of(wl, found) if wl else None, str(e.get("kind", "state")),
            bool(e.get("bad", not is_healthy(str(e.get("state") or "")))), _opt_float(e.get("score")),
            [EpisodeCause(str(c.get("cause", "")), str(c.get("title", c.get("cause", ""))), _opt_float(c.get("score")),
                          str(c.get("summary", "")), chain_evidence(items(c.get("evidence"))))
             for c in map(obj, items(e.get("causes")))],
            _reference_text(e.get("reference")), bool(e.get("started_before")),
            [EpisodeCause(str(c.get("context", "")), str(c.get("title", "")), None, str(c.get("summary", "")))
             for c in map(obj, items(e.get("context")))],
            f"{e['phase']} of {e['phases']}" if e.get("phases") else ""))
    src = d.get("states_from")
    return TimelineView(out, f"{TIMELINE_FUNCTION}" + (f" (states from {src})" if src else ""),
                        [str(n) for n in items(d.get("notes"))])


def _float(v: JSON) -> float:
    """A number of the contract (a time): a JSON number, or numeric text."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"not a number: {v!r}")


def _opt_float(v: JSON) -> float | None:
    return None if v is None else _float(v)


def _labels(v: JSON) -> dict[str, str]:
    """A workload's labels from the contract (``{"namespace", "pod", ...}``), as text; {} for none."""
    return {k: str(x) for k, x in obj(v).items() if x is not None}


def fallback_timeline(store: StoreReader, node: str, start: float, end: float,
                      owners: OwnerLookup | None = None) -> TimelineView:
    """The verdict history's per-accelerator runs over [start, end] (``run_spans``); the longest
    bad ones explained by ``rank_causes`` over their span (baseline: the preceding window)."""
    runs = [r for r in store.verdict_runs(node, start, end) if r.accelerator]
    found = owners_for(owners, (workload_labels(r.workload) for r in runs))
    out: list[EpisodeView] = []
    for r, a, b in run_spans(runs, start, end):
        acc = AcceleratorId.parse(r.accelerator)
        if acc is not None:
            out.append(EpisodeView(a, b, r.state, r.accelerator, acc,
                                   WorkloadRef.of(workload_labels(r.workload), found), bad=not is_healthy(r.state)))
    notes = [] if out else ["no per-accelerator state stored in this range"]
    todo = sorted((e for e in out if e.bad and e.duration >= FALLBACK_MIN_S), key=_longest_first)
    for e in todo[:FALLBACK_EXPLAINED]:
        res = rank_causes(store, node, max(e.start, start), min(e.end, end))
        e.causes = [EpisodeCause(c.key, c.title, c.score, c.summary) for c in res.causes[:3]]
        e.context = [EpisodeCause(c.kind, c.title, None, c.summary) for c in res.context]
        e.reference = "against the preceding window of the same length"
    if len(todo) > FALLBACK_EXPLAINED:
        notes.append(f"{len(todo) - FALLBACK_EXPLAINED} more bad episode(s) not explained here: open one")
    out.sort(key=lambda e: (e.start, e.accelerator))
    return TimelineView(out, "the verdict history's per-accelerator runs (the dashboard's own episodes)", notes)


def _longest_first(e: EpisodeView) -> float:
    return -e.duration


def episode_series(episodes: Sequence[EpisodeView], a: float, b: float) -> list[Series]:
    """The episode timeline for its download: one series per episode drawn (clipped to the window),
    its one point at the episode's start, valued its length in seconds; the accelerator, state,
    workload, whether it is a bad one and its top cause as labels."""
    out: list[Series] = []
    for e in episodes:
        s0, s1 = max(e.start, a), min(e.end, b)
        if s1 < s0 or (e.kind == "state" and s1 == s0):
            continue
        wl = e.workload.display if e.workload is not None and e.workload.display else ""
        out.append(Series(f"{e.where}: {e.state}", {
            "accelerator": e.accelerator, "state": e.state, "kind": e.kind, "workload": wl,
            "bad": "true" if e.bad else "false", "top_cause": e.causes[0].key if e.causes else ""},
            "seconds (episode length, at its start)", [(s0, round(s1 - s0, 3))]))
    return out


# ---------------------------------------------------------------------------------------------- states from the history
@dataclass
class StateShares:
    shares: dict[str, float]       # state -> share of the range's stored state time
    worst: Segment | None          # the bad stretch with the highest score (None: no bad one)
    source: str                    # where the states came from, or why there are none


def _badness(sg: Segment) -> tuple[float, float]:
    return sg.score or 0.0, sg.end - sg.start


def history_shares(store: StoreReader, node: str, start: float, end: float, max_points: int = 600) -> StateShares:
    """The node's time in each state over [start, end]: the verdict history's roll-up runs (a node
    with one accelerator and no roll-up: that one's) — the segments the Node page's ribbon draws (``data.mismatch_segments``)."""
    segs, source = mismatch_segments(store, node, Window(start, end, False), max_points)
    counts: dict[str, float] = {}
    for sg in segs:
        counts[sg.state] = counts.get(sg.state, 0.0) + (sg.end - sg.start)
    total = sum(counts.values())
    shares = {k: v / total for k, v in counts.items() if v > 0} if total > 0 else {}
    bad = [sg for sg in segs if not is_healthy(sg.state)]
    worst = max(bad, key=_badness, default=None)
    return StateShares(shares, worst, source)
