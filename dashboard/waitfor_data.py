"""Where the threads that drive each accelerator spent their time, as the Node page shows it
(docs/waitfor.md; the panel: docs/dashboard.md).

Per accelerator and workload the agent stores the driving threads' time by first hop
(``triscope_workload_driver_seconds_total{state}``) and followed along the chain of waits to
where it ends (``triscope_workload_wait_chain_seconds_total{cause,relation,culprit,...}``), with
the connections' counters and the workload's demand.  ``node_waitfor`` reads those series through
the store's query functions (counters as per-second rates; ``read_plan`` picks raw points for short
ranges and the 1-minute or hourly rollups, whose rates are exact means, for longer ones) and gives:

* the first hop over time: the window cut into ``time_buckets`` equal buckets, each bucket's share
  of the driving threads' time in each state (the sum of the state's rate points in the bucket over
  the sum of every state's), and how many threads' worth of time that was;
* the chain's ends over the whole window, read by the verdict's own functions
  (``triscope.analysis.mismatch.window_feature_list`` over one window as long as the range, then
  ``triscope.analysis.waitverdict.chain_finding``): each end's share, culprit, relation, group
  (staging, network, accelerator, demand, upstream) and words, the group that decides and the
  reason text — what root cause says for an episode over the same span.

Workloads on an accelerator without any wait-for series (an older agent or recording,
``--no-waitfor``) are listed as such: the verdict decided on their host symptoms.  Pure reads: no
SQL here, nothing written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import (
    GPU_BUSY,
    GPU_UTIL,
    NPU_BUSY,
    WAIT_CHAIN,
    WAIT_DRIVER,
    WAIT_KEYED,
    WORKLOAD_METRICS,
    WorkloadEvidence,
)
from triscope.analysis.mismatch import window_feature_list
from triscope.analysis.mismatch_inputs import mismatch_inputs_from_series
from triscope.analysis.reader import points_of
from triscope.analysis.verdict import engaged
from triscope.analysis.waitverdict import NETWORK, STAGING, chain_finding, chain_reasons, no_chain_reason
from triscope.core.vocabulary import AcceleratorId, WorkloadKey, workload_key
from triscope.dashboard.workload_data import (
    INFO_METRIC,
    WORKLOAD_PREFIX,
    OwnerLookup,
    WorkloadRef,
    owners_for,
)
from triscope.store.reader import SeriesData, SeriesInfo, StoreReader

FIRST_HOP_STATES = ("cpu", "cpu_wait", "accelerator", "copy_pageable", "copy_pinned", "lock", "ipc", "network",
                    "disk", "timer", "other")
"""The first-hop states (docs/waitfor.md section 3), in the order they stack."""
DECIDING_GROUP = {"staging-bound": STAGING, "network-bound": NETWORK}
NO_EVIDENCE = "no wait-for evidence: the verdict decided on host symptoms"
"""Said for a workload whose driving threads were not traced (older recordings, ``--no-waitfor``)."""
TIME_BUCKETS = 60             # buckets of the first-hop chart over the range (at least one sample step each)
MAX_WORKLOADS = 4             # workloads drawn per accelerator (the most driving-thread time first)
MAX_ENDS = 8                  # chain ends drawn per workload; the rest summed
MAX_SERIES = 600              # wait-for and workload series read per render, at most
RAW_SPAN_S = 1800.0           # raw points up to this range; 1-minute rollups up to RAW_1M_SPAN_S, hourly beyond
RAW_1M_SPAN_S = 2 * 86400.0
NICE_WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)

Fetch = Callable[[StoreReader, Sequence[SeriesInfo], float, float, str | None], list[SeriesData]]
"""Reads series: (store, series, start, end, tier) -> their points (every point of the tier)."""


@dataclass(frozen=True)
class ChainEnd:
    """One end of a workload's chain over the window (``chain_finding``'s ``ends``)."""

    cause: str                 # cpu, cpu_wait, cpu_throttled, accelerator, copy_*, network, timer, disk, producer, other
    relation: str              # self, process, workload, pod, other, kernel; inbound / outbound for a connection
    culprit: str               # a process / container name, a connection's remote end; "" the rest summed
    culprit_workload: WorkloadKey
    share: float               # of the driving threads' chain time over the window, 0..1
    group: str                 # staging, network, accelerator, demand, upstream; "" not classified
    words: str                 # the verdict's words for it


@dataclass
class DriverTime:
    """One workload's driving threads on one accelerator over the window."""

    accel: AcceleratorId
    ref: WorkloadRef
    bucket_start: list[float] = field(default_factory=list)     # epoch seconds, one per bucket
    width: float = 1.0                                          # bucket width, seconds
    states: dict[str, list[float | None]] = field(default_factory=dict)   # state -> share per bucket (None: no data)
    threads: list[float | None] = field(default_factory=list)   # thread-seconds per second in each bucket
    seconds: float = 0.0      # driving-thread time as the verdict counts it (``WaitEvidence.seconds``: the
    #                           sum of the rate points, seconds at raw resolution)
    first_hop: dict[str, float] = field(default_factory=dict)   # state -> share of the window
    ends: list[ChainEnd] = field(default_factory=list)          # largest first, at most MAX_ENDS (+ the rest)
    groups: dict[str, float] = field(default_factory=dict)      # group -> share of the driving threads' time
    state: str = ""                                             # the chain's state: staging-bound, network-bound, ""
    deciding: str = ""                                          # the group that made it ("" none)
    strength: float = 0.0                                       # the deciding group's share of the working time
    work: float | None = None                                   # share of their time with work (not demand)
    named: WorkloadKey | None = None                            # the workload an I/O state names
    found_by: str = ""                                          # driver_calls, driver_waits, main_thread
    requests_wait: float | None = None                          # its threads' seconds per second waiting for requests
    waited_on: float | None = None                              # its other threads' seconds per second on the driving ones
    reasons: list[str] = field(default_factory=list)            # the verdict's words for the chain
    note: str = ""                                              # why the chain is not read (too little evidence)


@dataclass
class AccelWaitFor:
    """An accelerator's workloads: those with wait-for series and those without."""

    accel: AcceleratorId
    traced: list[DriverTime] = field(default_factory=list)
    untraced: list[WorkloadRef] = field(default_factory=list)
    more: int = 0                                               # traced workloads not drawn (past MAX_WORKLOADS)


def read_plan(span: float) -> tuple[str | None, int | None]:
    """(tier, max_points) of the wait-for read: every raw point up to ``RAW_SPAN_S`` (a sum of rates
    is exact there), the 1-minute rollups up to two days, hourly ones beyond (a rollup's counter rate
    is the bucket's exact mean): never min/max-downsampled, which would bias the sums."""
    if span <= RAW_SPAN_S:
        return None, None
    return ("1m", None) if span <= RAW_1M_SPAN_S else ("1h", None)


def bucket_width(span: float, step: float = 1.0, buckets: int = TIME_BUCKETS) -> float:
    """A round bucket width (1 s, 2 s, 5 s, 10 s, ... 1 d) giving at most about ``buckets`` buckets
    over ``span`` and at least one sample ``step`` each."""
    want = max(step, span / max(1, buckets))
    return float(next((w for w in NICE_WIDTHS if w >= want), math.ceil(want / 86400.0) * 86400.0))


def _fetch(store: StoreReader, infos: Sequence[SeriesInfo], start: float, end: float, tier: str | None) -> list[SeriesData]:
    return [store.query_series(i, start, end, max_points=None, tier=tier) for i in infos]


def wait_infos(listed: Sequence[SeriesInfo], accel: AcceleratorId | None = None) -> list[SeriesInfo]:
    """The series ``node_waitfor`` reads, from a listing of the node's series: every per-workload
    series of the accelerators (of ``accel``) whose workloads have driving-thread series, and those
    accelerators' busy and utilisation series (the verdict reads the chain against them)."""
    traced = {(AcceleratorId.of(s.labels), workload_key(s.labels)) for s in listed if s.metric == WAIT_DRIVER}
    traced = {t for t in traced if t[0] is not None and (accel is None or t[0] == accel)}
    accels = {a for a, _ in traced}
    out = [s for s in listed if s.metric in WORKLOAD_METRICS and (AcceleratorId.of(s.labels), workload_key(s.labels)) in traced]
    out += [s for s in listed if s.metric in (GPU_BUSY, NPU_BUSY, GPU_UTIL) and AcceleratorId.of(s.labels) in accels]
    return out


def node_waitfor(store: StoreReader, node: str, start: float, end: float, accel: AcceleratorId | None = None,
                 owners: OwnerLookup | None = None, listed: Sequence[SeriesInfo] | None = None,
                 fetch: Fetch | None = None, thresholds: MismatchThresholds | None = None,
                 buckets: int = TIME_BUCKETS) -> list[AccelWaitFor]:
    """Per accelerator of ``node`` (or ``accel`` alone) with workloads, where its workloads' driving
    threads' time went over [start, end]: first hop over time, the chain's ends over the window,
    the verdict's reading of them; the workloads without wait-for series listed apart.  ``listed``:
    the node's series already listed (else listed here); ``fetch(store, infos, start, end, tier)``
    reads series (default one ``query_series`` each, raw points or rollups per ``read_plan``)."""
    if end <= start:
        return []
    if listed is None:
        listed = [*store.series(node=node, prefix=WORKLOAD_PREFIX), *store.series(node=node, metric=INFO_METRIC),
                  *(s for m in (GPU_BUSY, NPU_BUSY, GPU_UTIL) for s in store.series(node=node, metric=m))]
    present: dict[AcceleratorId, set[WorkloadKey]] = {}
    for s in listed:
        if s.metric == INFO_METRIC or s.metric.startswith(WORKLOAD_PREFIX):
            a = AcceleratorId.of(s.labels)
            if a is not None and (accel is None or a == accel):
                present.setdefault(a, set()).add(workload_key(s.labels))
    if not present:
        return []
    infos = wait_infos(listed, accel)[:MAX_SERIES]
    tier, _ = read_plan(end - start)
    datas = (fetch or _fetch)(store, infos, start, end, tier) if infos else []
    found = owners_for(owners, ({"namespace": k[0], "pod": k[1], "container": k[2], "workload": k[3]}
                                for ks in present.values() for k in ks))
    th = thresholds or default_thresholds()
    per = _read(datas, start, end, tier, th, buckets, found)
    out: list[AccelWaitFor] = []
    for a in sorted(present, key=lambda a: a.sort_key):
        got = sorted(per.get(a, []), key=lambda d: -d.seconds)
        keys = {(d.ref.namespace, d.ref.pod, d.ref.container, d.ref.workload) for d in got}
        untraced = sorted((WorkloadRef.of(dict(zip(("namespace", "pod", "container", "workload"), k, strict=True)), found)
                           for k in present[a] - keys if any(k)), key=lambda r: (r.display, r.container))
        out.append(AccelWaitFor(a, got[:MAX_WORKLOADS], untraced, max(0, len(got) - MAX_WORKLOADS)))
    return out


def _read(datas: Sequence[SeriesData], start: float, end: float, tier: str | None, th: MismatchThresholds,
          buckets: int, owners: Mapping[tuple[str, str], str]) -> dict[AcceleratorId, list[DriverTime]]:
    """The series read, per accelerator: each traced workload's ``DriverTime``."""
    step = 60.0 if tier == "1m" else 3600.0 if tier == "1h" else 1.0
    if tier is not None:
        datas = [per_step(d, step) for d in datas]
    width = bucket_width(end - start, step, buckets)
    n = max(1, math.ceil((end - start) / width))
    driver: dict[tuple[AcceleratorId, WorkloadKey], list[SeriesData]] = {}
    for d in datas:
        a = AcceleratorId.of(d.info.labels)
        if d.info.metric == WAIT_DRIVER and a is not None:
            driver.setdefault((a, workload_key(d.info.labels)), []).append(d)
    if not driver:
        return {}
    findings = _findings(datas, start, end, th)
    out: dict[AcceleratorId, list[DriverTime]] = {}
    for (a, key), sds in driver.items():
        ref = WorkloadRef.of(dict(zip(("namespace", "pod", "container", "workload"), key, strict=True)), owners)
        dt = DriverTime(a, ref, [start + i * width for i in range(n)], width)
        _timeline(dt, sds, start, width, n)
        _chain(dt, findings.get((a.key, key)), datas, a, key, th)
        out.setdefault(a, []).append(dt)
    return out


def per_step(d: SeriesData, step: float) -> SeriesData:
    """A rollup read with one point per ``step``: the store serves a rollup tier's not-yet-rolled
    tail as raw points (one a second), which summed beside the rolled minutes would weigh each
    second of the tail as much as a whole minute; the tail's points become their minute's mean."""
    if len(d.ts) < 2:
        return d
    ts: list[float] = []
    vals: list[float] = []
    cur, acc, n = 0, 0.0, 0
    for t, v in zip(d.ts, d.values, strict=False):
        if v != v:
            continue
        b = math.floor(t / step)
        if b != cur and n:
            ts.append((cur + 0.5) * step)
            vals.append(acc / n)
            acc, n = 0.0, 0
        cur, acc, n = b, acc + v, n + 1
    if n:
        ts.append((cur + 0.5) * step)
        vals.append(acc / n)
    return SeriesData(d.info, ts, vals, d.tier)


def _timeline(dt: DriverTime, sds: Sequence[SeriesData], start: float, width: float, n: int) -> None:
    """The first hop per bucket: each state's share of the bucket's driving-thread time."""
    sums: dict[str, list[float]] = {}
    ticks: list[set[float]] = [set() for _ in range(n)]
    total_by_state: dict[str, float] = {}
    for sd in sds:
        state = str(sd.info.labels.get("state") or "other")
        row = sums.setdefault(state, [0.0] * n)
        for t, v in zip(sd.ts, sd.values, strict=False):
            if v != v or v < 0:     # NaN or a negative rate: nothing to count
                continue
            i = int((t - start) // width)
            if 0 <= i < n:
                row[i] += v
                ticks[i].add(t)
                total_by_state[state] = total_by_state.get(state, 0.0) + v
    totals = [sum(r[i] for r in sums.values()) for i in range(n)]
    order = [s for s in FIRST_HOP_STATES if s in sums] + sorted(s for s in sums if s not in FIRST_HOP_STATES)
    dt.states = {s: [sums[s][i] / totals[i] if totals[i] > 0 else None for i in range(n)] for s in order}
    dt.threads = [totals[i] / len(ticks[i]) if ticks[i] and totals[i] > 0 else None for i in range(n)]
    whole = sum(total_by_state.values())
    dt.first_hop = {s: total_by_state.get(s, 0.0) / whole for s in order} if whole > 0 else {}


def _findings(datas: Sequence[SeriesData], start: float, end: float, th: MismatchThresholds
              ) -> dict[tuple[str, WorkloadKey], tuple[WorkloadEvidence, float]]:
    """(accelerator name, workload) -> (its evidence over the whole window, how engaged the
    accelerator was): the verdict's features of one window as long as the range."""
    series = [points_of(d) for d in datas]
    if not any(sp.metric in (GPU_BUSY, NPU_BUSY) for sp in series):
        return {}
    inputs = mismatch_inputs_from_series(series, start, end)
    out: dict[tuple[str, WorkloadKey], tuple[WorkloadEvidence, float]] = {}
    for _ws, _we, f in window_feature_list(inputs, start, end, max(1.0, end - start), th):
        for acc in f.accelerators:
            e = engaged(acc)
            for w in acc.per_workload:
                out[(acc.name, w.key)] = (w, e)
    return out


def _chain(dt: DriverTime, got: tuple[WorkloadEvidence, float] | None, datas: Sequence[SeriesData], a: AcceleratorId,
           key: WorkloadKey, th: MismatchThresholds) -> None:
    """The chain's ends over the window with the verdict's groups and words; where the verdict has
    no reading (no busy series, too little evidence), the ends' shares alone, not classified."""
    w, eng = got if got is not None else (None, 0.0)
    ev = w.wait if w is not None else None
    if ev is not None:
        dt.seconds = ev.seconds
        dt.found_by = ev.found_by
        dt.requests_wait, dt.waited_on = ev.requests_wait, ev.waited_on
    f = chain_finding(w, eng, th) if w is not None else None
    if f is not None and w is not None:
        dt.ends = _ends([_end_row(x.as_dict()) for x in f.ends])
        dt.groups, dt.work, dt.state, dt.strength = dict(f.groups), f.work, f.state, f.strength
        dt.deciding = DECIDING_GROUP.get(f.state, "")
        dt.named = f.named if f.state else None
        dt.reasons = chain_reasons(f, a.name, eng, w, th)
        return
    # not read by the verdict: the chain's shares from the series themselves
    sums: dict[tuple[str, ...], float] = {}
    secs = 0.0
    for d in datas:
        if AcceleratorId.of(d.info.labels) != a or workload_key(d.info.labels) != key:
            continue
        vals = [v for v in d.values if v == v and v >= 0]
        if d.info.metric == WAIT_CHAIN:
            k = tuple(str(d.info.labels.get(n, "")) for n in WAIT_KEYED[WAIT_CHAIN][1])
            sums[k] = sums.get(k, 0.0) + sum(vals)
        elif d.info.metric == WAIT_DRIVER:
            secs += sum(vals)
    total = sum(sums.values())
    if ev is None:
        dt.seconds = secs
    dt.ends = _ends([(k[0], k[1], k[2], (k[3], k[4], k[5], k[6]), v / total, "", "") for k, v in sums.items()
                     if v > 0]) if total > 0 else []
    dt.note = (f"too little wait-for evidence in this range ({dt.seconds:.1f} s of driving-thread time, the "
               f"verdict reads the chain from {th.waitfor_min_seconds:g} s): {no_chain_reason(True).split(': ')[-1]}"
               if dt.seconds < th.waitfor_min_seconds else
               "the verdict has no reading of this chain (no accelerator busy series in this range)")


def _end_row(x: Mapping[str, object]) -> tuple[str, str, str, Any, float, str, str]:
    """One of ``chain_finding``'s ends as (cause, relation, culprit, culprit workload, share, group, words)."""
    share = x.get("share")
    return (str(x.get("cause", "")), str(x.get("relation", "")), str(x.get("culprit", "")), x.get("workload") or (),
            float(share) if isinstance(share, int | float) else 0.0, str(x.get("group", "")), str(x.get("words", "")))


def _ends(rows: Sequence[tuple[str, str, str, Any, float, str, str]]) -> list[ChainEnd]:
    """The largest ``MAX_ENDS`` ends, the rest summed into one (cause ``rest``)."""
    rows = sorted(rows, key=lambda r: -r[4])
    out = [ChainEnd(c, r, cu, (str(wl[0]), str(wl[1]), str(wl[2]), str(wl[3])) if len(wl) == 4 else ("", "", "", ""),
                    s, g, w) for c, r, cu, wl, s, g, w in rows[:MAX_ENDS]]
    rest = sum(r[4] for r in rows[MAX_ENDS:])
    if rest > 0:
        out.append(ChainEnd("rest", "", "", ("", "", "", ""), rest, "", f"{len(rows) - MAX_ENDS} smaller ends"))
    return out
