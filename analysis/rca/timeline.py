"""Root cause as an incident timeline: what happened when on a node, each bad episode explained.

``rca_timeline(store, node, start, end)`` is what ``triscope rca`` answers:

1. **fetch** (``fetch_timeline_inputs``): every series of the node over [start - look-back, end]
   (``inputs.fetch_rca_inputs``; the look-back is the preceding window of the same length, at
   least ``MIN_LOOKBACK_S``, or the baseline given), the verdict history (``store.verdict_runs``,
   every run at full resolution whatever the range; migration 0008 backfilled it for data written
   before it existed) and, for a node with no verdict in it at all (a recording imported without
   its runs: today's classifier decides) where the main read is hourly, the detector's inputs
   (``fetch_mismatch_inputs``);
2. **episodes** (pure, ``timeline_episodes``): runs of one state per accelerator, flickers merged
   (``triscope.analysis.episodes``); health episodes from the events; a scrape target's late
   ``/metrics`` as events on its workload's lane (``context.metrics_late_events``);
3. **references** of other nodes where a bad episode has none on its own accelerator (a second
   fetch, ``reference.fetch_workload_references``, only then);
4. **explain** (pure, ``timeline_from``): each bad episode gets its reference
   (``reference.choose_reference``), is cut into its phases where its cause changes
   (``phases.split_phases``), and each gets its ranked causes and context (``explain.explain``,
   ``score.score_cause``), its evidence read around it at raw resolution (``LocalEvidence``) so it
   does not change with the look-back; SLO burn periods (``slo``) link to the bad episode they
   overlap or follow within their burn window.

Episodes are reported when they overlap [start, end), with their real bounds (one that began in
the look-back says so with ``started_before``).  ``Timeline.as_dict()`` is the JSON of
docs/workloads.md section 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.episodes import (
    HEALTH_EVENTS,
    NODE,
    Episode,
    assign_workloads,
    classifier_state_samples,
    health_episodes,
    is_bad,
    merge_flickers,
    min_episode_s,
    run_episodes,
    state_runs,
    workload_dict,
)
from triscope.analysis.features import GPU_INFO, INPUT_METRICS
from triscope.analysis.mismatch import accelerator_window_states
from triscope.analysis.mismatch_inputs import (
    MismatchInputs,
    fetch_mismatch_inputs,
    mismatch_inputs_from_series,
)
from triscope.analysis.rca.changes import bisect_any
from triscope.analysis.rca.context import context_lines, metrics_late_events
from triscope.analysis.rca.evidence import EvidenceContext, evidence_context
from triscope.analysis.rca.explain import IndexedSeries, explain, index_series
from triscope.analysis.rca.inputs import RCAInputs, data_start_of, fetch_rca_inputs
from triscope.analysis.rca.phases import split_phases
from triscope.analysis.rca.reference import Reference, choose_reference, fetch_workload_references, needs_of
from triscope.analysis.rca.score import rank, score_cause
from triscope.analysis.rca.slo import link_burn, slo_burn_episodes, slo_metrics
from triscope.analysis.reader import SeriesPoints, StoreReader
from triscope.store.reader import VerdictRun

MIN_LOOKBACK_S = 600.0
DETECTOR_METRICS = frozenset(INPUT_METRICS) | {GPU_INFO}
TIMELINE_MAX_POINTS = 1800     # raw reads up to an hour hold every 1 Hz tick


def tracker_lag(th: MismatchThresholds) -> float:
    """How late the agent's stored state is: it is the median tick of the last ``window_s``
    (a change shows once half the window holds it) and is reported after ``state_dwell_s``.  Stored
    states are moved back by this much, so episodes start when the change did."""
    return th.window_s / 2 + th.state_dwell_s


def reference_guard(step: float, th: MismatchThresholds) -> float:
    """Seconds left out at a healthy reference's edges (at most a quarter of it each): half the
    detector's window, or one sampling step on rollups."""
    return max(th.window_s / 2, step)


def classifier_window(span: float, tier: str | None, th: MismatchThresholds) -> float:
    """The classifier's window where the node has no verdict history: the detector's own window on
    raw points, at least 2 minutes (and span / 720) on rollups."""
    return th.window_s if tier is None else max(120.0, span / 720.0, th.window_s)


@dataclass(slots=True)
class TimelineInputs:
    rca: RCAInputs                         # the node's series over [lookback start, end], events in [start, end]
    runs: list[VerdictRun] = field(default_factory=list)   # the verdict history (store.verdict_runs) over the range
    mismatch: MismatchInputs | None = None  # the classifier's inputs when no verdict history and rollups
    given: tuple[float, float] | None = None
    window_s: float = 10.0
    slos: list[Any] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.rca.node

    @property
    def lookback_start(self) -> float:
        return min(self.rca.baseline_start, self.rca.start)


def fetch_timeline_inputs(store: StoreReader, node: str, start: float, end: float,
                          baseline: tuple[float, float] | None = None, thresholds: MismatchThresholds | None = None,
                          slos: Sequence[Any] = ()) -> TimelineInputs:
    if end <= start:
        raise ValueError("the window must end after it starts")
    th = thresholds or default_thresholds()
    lookback = baseline or (start - max(end - start, MIN_LOOKBACK_S), start)
    rca = fetch_rca_inputs(store, node, start, end, lookback, TIMELINE_MAX_POINTS, keep=slo_metrics(slos))
    lo = min(lookback[0], start)
    # the verdict history: every run at full resolution whatever the range (store/verdicts.py)
    runs = list(store.verdict_runs(node, lo, end))
    w = classifier_window(end - lo, rca.tier, th)
    mismatch = None
    if not runs and rca.tier == "1h":
        mismatch = fetch_mismatch_inputs(store, node, lo, end, w)
    return TimelineInputs(rca, runs, mismatch, baseline, w, list(slos))


# ---------------------------------------------------------------------------------------------- episodes
def timeline_episodes(inputs: TimelineInputs, ctx: EvidenceContext,
                      th: MismatchThresholds) -> tuple[list[Episode], str, float]:
    """(state episodes over the whole range read, where the states came from, sampling step)."""
    if inputs.runs:
        eps, source, step = history_episodes(inputs.runs, th, inputs.rca.series)
        if source.endswith("(node roll-up)") and len(ctx.accelerators) == 1:
            for e in eps:                 # the roll-up of a one-accelerator node is that accelerator
                if e.accelerator == NODE:
                    e.accelerator = ctx.accelerators[0]
        return eps, source, step
    lo, end = inputs.lookback_start, inputs.rca.end
    mi = inputs.mismatch
    if mi is None:
        detector = [sp for sp in inputs.rca.series if sp.metric in DETECTOR_METRICS]
        mi = mismatch_inputs_from_series(detector, lo, end)
    windows = accelerator_window_states(mi, lo, end, inputs.window_s, th)
    samples = classifier_state_samples(windows)
    source, step = ("classifier" if windows else ""), inputs.window_s
    runs = state_runs(samples, step)
    if NODE in samples and len(ctx.accelerators) == 1:   # the roll-up of a one-accelerator node is that accelerator
        for e in runs:
            e.accelerator = ctx.accelerators[0]
    eps = merge_flickers(runs, min_episode_s(step))
    assign_workloads(eps, inputs.rca.series)        # the classifier names no workload itself
    return eps, source, step


def history_episodes(runs: Sequence[VerdictRun], th: MismatchThresholds, series: Sequence[SeriesPoints] = ()
                     ) -> tuple[list[Episode], str, float]:
    """Episodes from the verdict history: each run (``VerdictRun``: accelerator, workload, state,
    first and last tick) moved back by the tracker's lag like stored states, ending where the next
    run of its accelerator begins (or a step after its last tick where the data stopped), flickers
    merged at the raw step.  The runs are the same whatever the range read, so are the episodes."""
    per_acc = [r for r in runs if r.accelerator]
    use = per_acc or [r for r in runs if not r.accelerator]
    source = "verdict history" if per_acc else "verdict history (node roll-up)"
    steps = sorted((r.end - r.start) / (r.ticks - 1) for r in use if r.ticks > 1 and r.end > r.start)
    step = steps[len(steps) // 2] if steps else 1.0
    lag = tracker_lag(th)
    first = min((r.start for r in use), default=0.0)
    by_acc: dict[str, list[VerdictRun]] = {}
    for r in sorted(use, key=lambda r: (r.accelerator, r.start)):
        by_acc.setdefault(r.accelerator or NODE, []).append(r)
    eps: list[Episode] = []
    for acc, rs in by_acc.items():
        eps += run_episodes(acc, rs, step, lag, first)
    eps = [e for e in eps if e.end > e.start]
    merged = merge_flickers(eps, min_episode_s(step))
    if not per_acc:
        assign_workloads(merged, series)
    return merged, source, step


# ---------------------------------------------------------------------------------------------- result
@dataclass(slots=True)
class Timeline:
    node: str
    start: float
    end: float
    lookback_start: float
    source: str                     # where the states came from
    step: float
    min_episode_s: float
    episodes: list[Episode]
    series_examined: int
    notes: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[Episode]:
        return [e for e in self.episodes if e.bad]

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "start": self.start, "end": self.end,
                "lookback": {"start": self.lookback_start, "end": self.start},
                "states_from": self.source or None, "step_s": self.step, "min_episode_s": self.min_episode_s,
                "series_examined": self.series_examined,
                "summary": {"episodes": len(self.episodes), "bad": len(self.bad),
                            "states": _state_shares(self.episodes, self.start, self.end)},
                "notes": self.notes,
                "episodes": [episode_dict(e, self.start) for e in self.episodes]}


def _state_shares(eps: Sequence[Episode], start: float, end: float) -> dict[str, float]:
    tot: dict[str, float] = {}
    span = max(end - start, 1e-9)
    for e in eps:
        if e.kind == "state":
            tot[e.state] = tot.get(e.state, 0.0) + max(0.0, min(e.end, end) - max(e.start, start))
    accs = max(1, len({e.accelerator for e in eps if e.kind == "state"}))
    return {k: round(v / span / accs, 4) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


def episode_dict(e: Episode, window_start: float) -> dict[str, Any]:
    d: dict[str, Any] = {"start": e.start, "end": e.end, "state": e.state, "accelerator": e.accelerator,
                         "workload": workload_dict(e.workload), "kind": e.kind, "bad": e.bad,
                         "duration_s": round(e.duration, 3)}
    if e.score is not None:
        d["score"] = round(e.score, 4)
    if e.start < window_start:
        d["started_before"] = True
    d["causes"] = [c.as_dict() for c in e.causes]
    if e.context:
        d["context"] = [c.as_dict() for c in e.context]
    d["reference"] = e.reference
    if e.events:
        d["events"] = [{"ts": x.ts, "kind": x.kind, "severity": x.severity, "message": x.message,
                        "details": x.details} for x in e.events[:20]]
    d.update({k: v for k, v in e.detail.items() if k not in d})
    return d


# ---------------------------------------------------------------------------------------------- pure part
Around = tuple[EvidenceContext, list[IndexedSeries], float | None]


def timeline_from(inputs: TimelineInputs, thresholds: MismatchThresholds | None = None, top: int | None = 5,
                  workload_refs: Mapping[tuple[str, float], Reference] | None = None,
                  prepared: tuple[EvidenceContext, list[Episode], str, float] | None = None,
                  local: LocalEvidence | None = None) -> Timeline:
    """The timeline from what was read.  Pure but for ``local`` (the reads around each bad
    episode, ``rca_timeline`` passes them where the range was read from rollups).  ``prepared``:
    the evidence context and ``timeline_episodes`` already computed from these inputs."""
    th = thresholds or default_thresholds()
    r = inputs.rca
    start, end, lo = r.start, r.end, inputs.lookback_start
    if prepared is None:
        ctx = evidence_context(r.series, r.events, th)
        eps, source, step = timeline_episodes(inputs, ctx, th)
    else:
        ctx, eps, source, step = prepared
    own: Around = (ctx, index_series(r.series), data_start_of(r.series, lo))
    given = inputs.given
    given_has_data = given is not None and any(bisect_any(sp.ts, *given) for sp in r.series if sp.ts)
    notes: list[str] = []
    if not source:
        notes.append("no accelerator data in the range: no coordination states, only health events")
    shown: list[Episode] = []
    bad: list[tuple[Episode, Reference]] = []
    for e in eps:
        if e.end <= start or e.start >= end:
            continue
        if not is_bad(e.state):
            shown.append(e)
            continue
        bad.append((e, choose_reference(e, eps, r.node, given, given_has_data, workload_refs or {},
                                        reference_guard(step, th))))
    if local is not None:
        local.plan([local.span(e, ref) for e, ref in bad])
    for e, ref in bad:
        around = local.around(e, ref, r.events) if local is not None else None
        shown += explain_episode(e, ref, around or own, th, top, r, local_read=around is not None,
                                 raw=around is not None or r.tier is None)
    for h in health_episodes(r.events, ctx.accelerator_of_device()):
        _explain_health(h)
        shown.append(h)
    shown += [x for x in metrics_late_events(r.events, r.series, eps) if x.end >= start and x.start < end]
    if inputs.slos:
        for s in slo_burn_episodes(inputs.slos, r.series, start, end, series_step(r.tier, step)):
            link_burn(s, shown)
            shown.append(s)
    shown.sort(key=lambda e: (e.start, e.kind != "state", e.accelerator))
    return Timeline(r.node, start, end, lo, source, step, min_episode_s(step), shown, r.series_examined, notes)


def explain_episode(e: Episode, ref: Reference, around: Around, th: MismatchThresholds, top: int | None,
                    r: RCAInputs, local_read: bool = False, raw: bool = True) -> list[Episode]:
    """One bad episode: its phases (``phases.split_phases``; only where ``raw`` evidence was read:
    rollups would cut other phases than a raw read, and the answer would change with the look-back),
    each with its reference, ranked causes, context and the detector's reasons.  A later phase is
    compared with the phase before it: what changed at its start is what made it a phase of its own."""
    ctx, index, data_start = around
    out = split_phases(e, ctx, th.window_s) if raw else [e]
    for i, p in enumerate(out):
        pref = ref if i == 0 else previous_phase(out[i - 1], r.node)
        p.reference = pref.as_dict()
        p.causes, p.context = explain(p, pref, ctx, index, data_start, top)
        if local_read:
            p.detail["evidence_read"] = "raw points around the episode"
        p.detail["verdict"] = _verdict(p, r.events)
    return out


def previous_phase(prev: Episode, node: str) -> Reference:
    return Reference("previous-phase", [(prev.start, prev.end)], node, prev.accelerator, prev.state, prev.workload)


def series_step(tier: str | None, step: float) -> float:
    """The sampling step of the series read: a rollup's bucket, else the states' step."""
    return {"1m": 60.0, "1h": 3600.0}.get(tier or "", step)


def _verdict(e: Episode, events: Sequence[Any]) -> list[str]:
    """The agent's reasons for the state, from its ``mismatch_state`` event that opened the episode
    (or, for a later phase, the one nearest its start)."""
    best = None
    lo = min(e.start, float((e.detail.get("episode") or {}).get("start", e.start)))
    for ev in events:
        d = ev.details or {}
        if ev.kind == "mismatch_state" and d.get("to") == e.state and lo - 15 <= ev.ts < e.end:
            best = ev if best is None or abs(ev.ts - e.start) < abs(best.ts - e.start) else best
    if best is None:
        return []
    reasons = ((best.details or {}).get("evidence") or {}).get("reasons") or []
    return [str(x) for x in reasons][:6]


def _explain_health(h: Episode) -> None:
    """A health incident's cause from its events (``score_cause``); the agent's own collectors down
    are context (the agent itself), not a cause."""
    key = HEALTH_EVENTS[h.events[0].kind]
    h.causes = rank([score_cause(key, events=h.events)])
    h.context = context_lines([], h.events, {})


# ---------------------------------------------------------------------------------------------- evidence around an episode
class LocalEvidence:
    """The evidence of each bad episode read around it at the resolution a query of the last half
    hour would use — whatever range the timeline covers — so an episode's causes do not change with
    the look-back.  The read spans the episode, its reference and ``MIN_LOOKBACK_S`` before both,
    raw points up to an hour (``fetch_rca_inputs``).  ``plan`` joins the spans that overlap into
    one read while the joined span stays within ``MAX_READ_S`` (the episodes of a burst, each with
    its look-back, read once, not once each); a span inside an earlier read shares it; at most
    ``max_reads`` reads, the rest explained from the range's own read."""

    MAX_READ_S = 3600.0

    def __init__(self, store: StoreReader, node: str, th: MismatchThresholds, max_reads: int = 24) -> None:
        self.store, self.node, self.th, self.max_reads = store, node, th, max_reads
        self._reads: list[tuple[float, float, Around]] = []
        self._planned: list[tuple[float, float]] = []

    def span(self, e: Episode, ref: Reference) -> tuple[float, float]:
        """What explaining ``e`` against ``ref`` reads: from ``MIN_LOOKBACK_S`` before the earlier of
        the episode and its reference on this node, to one classifier window past its end."""
        lo = e.start
        if ref.series is None:      # the reference is on this node: its ranges are read too
            for a, _b in ref.ranges:
                lo = min(lo, a)
        return lo - MIN_LOOKBACK_S, e.end + self.th.window_s

    def plan(self, spans: Sequence[tuple[float, float]]) -> None:
        """The reads for ``spans``: overlapping ones joined while the join lasts at most ``MAX_READ_S``."""
        planned: list[tuple[float, float]] = []
        for lo, hi in sorted(s for s in spans if s[1] - s[0] <= self.MAX_READ_S):
            if planned and lo <= planned[-1][1] and max(hi, planned[-1][1]) - planned[-1][0] <= self.MAX_READ_S:
                planned[-1] = (planned[-1][0], max(hi, planned[-1][1]))
            else:
                planned.append((lo, hi))
        self._planned = planned

    def around(self, e: Episode, ref: Reference, events: Sequence[Any]) -> Around | None:
        lo, hi = self.span(e, ref)
        for a, b, read in self._reads:
            if a <= lo and hi <= b:
                return read
        if hi - lo > self.MAX_READ_S or len(self._reads) >= self.max_reads:
            return None
        lo, hi = next(((a, b) for a, b in self._planned if a <= lo and hi <= b), (lo, hi))
        rca = fetch_rca_inputs(self.store, self.node, lo, hi, (lo, lo), TIMELINE_MAX_POINTS)
        ctx = evidence_context(rca.series, events, self.th)
        index = index_series(rca.series)
        got: Around = (ctx, index, data_start_of(rca.series, lo))
        self._reads.append((lo, hi, got))
        return got


# ---------------------------------------------------------------------------------------------- entry point
def rca_timeline(store: StoreReader, node: str, start: float, end: float, baseline: tuple[float, float] | None = None,
                 thresholds: MismatchThresholds | None = None, top: int | None = 5,
                 slos: Sequence[Any] = (), inputs: TimelineInputs | None = None) -> Timeline:
    """Fetch, cut into episodes, fetch the references of other nodes where needed, explain.
    ``inputs``: ``fetch_timeline_inputs`` of these same arguments, read already (a caller that
    shares the read with ``rank_causes``)."""
    th = thresholds or default_thresholds()
    if inputs is None:
        inputs = fetch_timeline_inputs(store, node, start, end, baseline, th, slos)
    refs: dict[tuple[str, float], Reference] = {}
    ctx = evidence_context(inputs.rca.series, inputs.rca.events, th)
    eps, source, step = timeline_episodes(inputs, ctx, th)
    needs = needs_of(eps, node, start, end, baseline)
    if needs:
        metrics = sorted({sp.metric for sp in inputs.rca.series})
        refs = fetch_workload_references(store, needs, metrics, reference_guard(step, th), tracker_lag(th))
    local = LocalEvidence(store, node, th) if inputs.rca.tier is not None else None
    return timeline_from(inputs, th, top, refs, (ctx, eps, source, step), local)
