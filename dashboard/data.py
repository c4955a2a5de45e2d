"""Everything the pages read, through the store's query functions and the analysis package only.

No SQL here: ``store.Store`` (``nodes``, ``series``, ``query_series``, ``latest``, ``events``,
``fleet_latest``, ``series_keys``, ``verdict_runs``, ``current_verdicts``) and ``analysis.*``.  Every
series is downsampled by the store (``max_points``) before it reaches a figure; every state shown is
the verdict history's (no detector runs here).  A render lists a node's series once and keys its
traces by ``SeriesInfo.id``.  Functions return plain dataclasses; the figure builders in
``triscope.dashboard.figures`` turn them into Plotly figures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import (
    GPU_BUSY,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    buses_of_gpus,
    effective_ceiling,
    link_ids,
    negotiated_capacity,
)
from triscope.analysis.mismatch_inputs import link_facts_from
from triscope.analysis.reader import SeriesPoints
from triscope.core.names import shorten
from triscope.core.samples import parse_label_key
from triscope.core.vocabulary import ACCELERATOR_LABELS, STATES, AcceleratorId
from triscope.dashboard import workload_data as wd
from triscope.dashboard.jsontypes import HasDetails, text
from triscope.store.audit import AuditRow, audit_log
from triscope.store.reader import NodeInfo, SeriesData, SeriesInfo, StoreReader, VerdictRun

if TYPE_CHECKING:   # the audit tables are read with the store's engine: the whole store, not the read interface
    from concurrent.futures import ThreadPoolExecutor

    from triscope.store.api import Store

PRESETS: dict[str, float] = {"15m": 900.0, "1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
DATA_PRESET = "all"
"""A page's range over all of its data, from the first sample (``timerange.default_preset`` opens on it
for data of less than an hour)."""
LIVE_SLACK_S = 120.0   # an agent's node whose last sample is this close to now counts as live

GB = 1e9


# ---------------------------------------------------------------------------------------------- time windows
@dataclass(frozen=True)
class Window:
    """The range a page shows (``triscope.dashboard.timerange.window``: the one default policy)."""

    start: float
    end: float
    live: bool               # anchored at now (True) or at the node's last sample (recorded data)
    note: str = ""

    @property
    def span(self) -> float:
        return self.end - self.start


# ---------------------------------------------------------------------------------------------- recordings
def recordings(store: StoreReader) -> dict[str, str]:
    """node -> the trace file it was imported from, for every node that is a recording
    (``NodeInfo.recording``: the node labels ``triscope import-trace`` and ``make run`` write)."""
    return {n.name: rec for n in store.nodes() if (rec := n.recording)}


def recording_note(store: StoreReader, node: str | None = None) -> str:
    """What a page says about recordings: for ``node``, that it is one (and from which file); for
    the whole fleet (None), which of its nodes are.  "" when there is nothing to say."""
    recs = recordings(store)
    if node is not None:
        rec = recs.get(node)
        return (f"recording: {node} holds data imported from {rec} ('triscope import-trace'), not a live agent; "
                "its states are the recording's") if rec else ""
    if not recs:
        return ""

    names = sorted(recs)
    shown = ", ".join(shorten(n, 40) for n in names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return (f"{len(names)} recording(s): {shown} hold data imported from recorded traces, not live agents; "
            "their states are the recordings'")


# ---------------------------------------------------------------------------------------------- node lanes
LANES = ("accelerators", "io", "network")
LANE_TITLES = {"accelerators": "Accelerators (busy %)", "io": "I/O: PCIe / DMA / IOMMU",
               "network": "Network"}


@dataclass
class LaneTrace:
    key: str                   # the store's series id (``SeriesInfo.id``) as text, "capacity|gpu=N": live append's key
    metric: str
    labels: dict[str, str]
    lane: str
    name: str
    unit: str
    scale: float               # multiply stored values by this for display
    ts: list[float]
    values: list[float]
    secondary: bool = False
    dash: str | None = None
    as_rate: bool = False
    shape: str = "linear"      # "hv" for step lines (capacity)


@dataclass
class Segment:
    start: float
    end: float
    state: str
    score: float | None = None


@dataclass
class EventMark:
    ts: float
    kind: str
    severity: str
    message: str


@dataclass
class NodeLanes:
    node: str
    window: Window
    traces: list[LaneTrace] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)     # lane -> what is missing
    segments: list[Segment] = field(default_factory=list)
    segments_note: str = ""
    events: list[EventMark] = field(default_factory=list)
    events_truncated: bool = False
    accels: list[AcceleratorId] = field(default_factory=list)      # the node's accelerators
    accel: AcceleratorId | None = None                             # the one shown (None: the whole node)
    listed: list[SeriesInfo] = field(default_factory=list)    # the node's series: the render's one listing


@dataclass(frozen=True)
class TraceSpec:
    metric: str
    lane: str
    title: str                 # format with labels, e.g. "GPU {gpu} SM active"
    unit: str
    scale: float = 1.0
    secondary: bool = False
    dash: str | None = None
    only_labels: Mapping[str, str] | None = None
    limit: int = 8

    def wants(self, info: SeriesInfo) -> bool:
        return info.metric == self.metric and (
            not self.only_labels or all(info.labels.get(k) == v for k, v in self.only_labels.items()))


NODE_TRACES: tuple[TraceSpec, ...] = (
    TraceSpec("triscope_gpu_sm_active_ratio", "accelerators", "GPU {gpu} SM active", "%", 100.0),
    TraceSpec("triscope_gpu_tensor_active_ratio", "accelerators", "GPU {gpu} tensor active", "%", 100.0, dash="dot"),
    TraceSpec("triscope_npu_aicore_utilization_ratio", "accelerators", "NPU {npu}/{chip} AICore", "%", 100.0),
    TraceSpec("triscope_gpu_pcie_rx_bytes_total", "io", "GPU {gpu} PCIe RX (H2D)", "GB/s", 1 / GB),
    TraceSpec("triscope_gpu_pcie_tx_bytes_total", "io", "GPU {gpu} PCIe TX (D2H)", "GB/s", 1 / GB),
    TraceSpec("triscope_iommu_map_bytes_total", "io", "IOMMU map {device}", "GB/s", 1 / GB, dash="dash", limit=4),
    TraceSpec("triscope_dma_map_total", "io", "DMA maps/s {device} {direction}", "maps/s", 1.0, secondary=True,
              dash="dot", limit=4),
    TraceSpec("triscope_tcp_retransmits_total", "network", "TCP retransmits/s", "/s", 1.0),
    TraceSpec("triscope_tcp_sockets", "network", "TIME_WAIT sockets", "sockets", 1.0, secondary=True, dash="dot",
              only_labels={"state": "time_wait"}),
)
# older GPUs without GPM: only the coarse NVML figure (copies count as busy) is there
COARSE_GPU = TraceSpec("triscope_gpu_utilization_ratio", "accelerators", "GPU {gpu} NVML util (coarse)", "%", 100.0,
                       dash="dash")
# one accelerator picked: its workloads' host-side evidence on the accelerator lane (docs/workloads.md)
WORKLOAD_TRACES: tuple[TraceSpec, ...] = (
    TraceSpec("triscope_workload_feeder_busy_ratio", "accelerators", "{workload} feeder busy", "%", 100.0, dash="dashdot"),
    TraceSpec("triscope_workload_cpu_wait_ratio", "accelerators", "{workload} CPU wait", "%", 100.0, dash="dot"),
)
ACCEL_SCOPED = ("triscope_gpu_", "triscope_npu_", "triscope_workload_")


def _fmt(title: str, labels: Mapping[str, str]) -> str:
    class _D(dict[str, str]):
        def __missing__(self, k: str) -> str:
            return "?"

    return " ".join(title.format_map(_D({k: shorten(str(v), 48) for k, v in labels.items()})).replace("?", "").split())


def node_lanes(store: Store, node: str, window: Window, max_points: int = 1500,
               specs: Sequence[TraceSpec] = NODE_TRACES, max_events: int = 300, accel: AcceleratorId | None = None) -> NodeLanes:
    """The three lanes of one node over ``window``, each series downsampled by the store; with
    ``accel`` (a ``AcceleratorId``) only that accelerator's series, its link, its own DMA
    device when the store knows its bus, its workloads' feeder busy and CPU wait, and its state
    ribbon (the node-wide network lane stays).  The node's series are listed once (``listed``,
    kept for the rest of the render); each trace's key is its series' id."""
    listed = store.series(node=node, prefix="triscope_")
    out = NodeLanes(node, window, accel=accel, listed=listed)
    present = {s.metric for s in listed}
    out.accels = wd.node_accels(store, node, listed)
    todo = list(specs)
    if "triscope_gpu_sm_active_ratio" not in present and "triscope_gpu_utilization_ratio" in present:
        todo.insert(0, COARSE_GPU)
    if accel is not None:
        todo += WORKLOAD_TRACES
    own_device = _own_devices(listed, accel)
    jobs = [(spec, info) for spec in todo for info in listed
            if spec.wants(info) and (accel is None or _shown_for(info, accel, own_device))]
    results = fetch_all(store, [info for _, info in jobs], window.start, window.end, max_points)
    by_spec: dict[int, list[SeriesData]] = {}
    for (spec, _), d in zip(jobs, results, strict=True):
        if d.ts:
            by_spec.setdefault(id(spec), []).append(d)
    for spec in todo:
        got = by_spec.get(id(spec), [])
        if len(got) > spec.limit:  # keep the busiest few (by peak)
            got = sorted(got, key=_peak_first)[: spec.limit]
        for d in got:
            lab = dict(d.info.labels)
            ref = wd.WorkloadRef.of(lab)
            name = (_fmt(spec.title, {"workload": ref.pod or ref.workload or "no workload"})
                    if spec.metric.startswith(wd.WORKLOAD_PREFIX) else _fmt(spec.title, lab))
            out.traces.append(LaneTrace(
                str(d.info.id), spec.metric, lab, spec.lane, name, spec.unit, spec.scale, d.ts,
                d.values, spec.secondary, spec.dash, d.info.kind == "counter"))
    cap = link_capacity_traces(store, node, window, listed)
    out.traces.extend(t for t in cap if accel is None or t.labels.get("gpu") == (accel.index if accel.kind == "gpu" else None))
    out.missing = _missing_lanes({t.lane for t in out.traces}, present, out.accels, accel)
    out.segments, out.segments_note = mismatch_segments(store, node, window, max_points, listed, accel=accel)
    out.events, out.events_truncated = _event_marks(store, node, window, accel, max_events)
    return out


def _peak_first(d: SeriesData) -> float:
    return -max(d.values)


def _missing_lanes(has: set[str], present: set[str], accels: Sequence[AcceleratorId], accel: AcceleratorId | None) -> dict[str, str]:
    """lane -> why it is empty: nothing of the kind stored, or nothing in this range."""
    out: dict[str, str] = {}
    gpus = "triscope_gpu_info" in present or any(m.startswith("triscope_gpu_") for m in present)
    if "accelerators" not in has:
        out["accelerators"] = ("no GPU or NPU on this node (no NVML / npu-smi series stored)"
                               if not gpus and not any(m.startswith("triscope_npu_") for m in present)
                               else f"no series stored for {accel.name} on this node" if accel is not None
                               and accel not in accels
                               else "accelerator series stored, but no points in this range")
    if "io" not in has:
        out["io"] = ("no PCIe / DMA / IOMMU series stored for this node (GPU PCIe counters need NVML GPM; "
                     "DMA and IOMMU need the eBPF probes)" if not any(
                         m.startswith(("triscope_gpu_pcie", "triscope_dma", "triscope_iommu")) for m in present)
                     else "I/O series stored, but no points in this range")
    if "network" not in has:
        out["network"] = ("no TCP series stored for this node" if not any(
            m.startswith("triscope_tcp") for m in present) else "TCP series stored, but no points in this range")
    return out


def _event_marks(store: Store, node: str, window: Window, accel: AcceleratorId | None, max_events: int) -> tuple[list[EventMark], bool]:
    """The node's events in the window (state changes left out: the ribbon shows them), another
    accelerator's left out, with the engine's remediation decisions from its audit log."""
    evs = store.events(node=node, start=window.start, end=window.end, limit=max_events + 1)
    evs = [e for e in evs if e.kind != "mismatch_state"] or evs  # state changes are the ribbon already
    if accel is not None:   # another accelerator's events are not this one's
        evs = [e for e in evs if _event_accel(e) in (None, accel)]
    marks = [EventMark(e.ts, e.kind, e.severity, e.message) for e in evs]
    # remediation decisions from the engine's audit log (they replace its "remediation" events)
    audit = [r for r in audit_rows(store, window.start, window.end, limit=max_events).rows
             if r.get("node") == node and r.get("ts") is not None]
    if audit:
        marks = [m for m in marks if m.kind != "remediation"]
        sev = {"failed": "error", "acted": "warning"}
        marks += [EventMark(float(r["ts"]), "remediation", sev.get(str(r.get("outcome", "")).split(" ")[0], "info"),
                            f"{r.get('rule', '')}: {r.get('action', '')} {r.get('target', '')} ({r.get('mode', '')}, "
                            f"{r.get('outcome', '')})") for r in audit]
        marks.sort(key=_mark_ts)
    return marks[:max_events], len(marks) > max_events


def _mark_ts(m: EventMark) -> float:
    return m.ts


def _own_devices(listed: Sequence[SeriesInfo], accel: AcceleratorId | None) -> set[str]:
    """The PCI devices (bus ids) of ``accel`` from ``triscope_gpu_info``."""
    if accel is None or accel.kind != "gpu":
        return set()
    return {str(s.labels["bus_id"]) for s in listed if s.metric == "triscope_gpu_info"
            and s.labels.get("gpu") == accel.index and s.labels.get("bus_id")}


def _shown_for(info: SeriesInfo, accel: AcceleratorId, own_device: set[str]) -> bool:
    """Whether a series belongs on the lanes of ``accel``: the accelerator's own series; of the
    per-device ones (DMA, IOMMU) its own device's when the store knows its bus, else all of them
    (host-wide context); node-wide series (network) always."""
    a = AcceleratorId.of(info.labels)
    if a is not None:
        return bool(a == accel)
    if info.metric.startswith(ACCEL_SCOPED):
        return False
    dev = info.labels.get("device")
    if dev and own_device:
        return dev in own_device
    return True


def _event_accel(event: HasDetails) -> AcceleratorId | None:
    details = event.details
    try:
        return AcceleratorId.of({k: str(details[k]) for k in ACCELERATOR_LABELS if k in details})
    except Exception:  # noqa: BLE001 - odd details: node-wide
        return None


_POOL: ThreadPoolExecutor | None = None


def fetch_all(store: StoreReader, infos: Sequence[SeriesInfo], start: float, end: float, max_points: int | None,
              rate: bool | None = None, tier: str | None = None) -> list[SeriesData]:
    """``store.query_series`` for each series (the store downsamples; ``tier`` forces a tier), a few
    at a time on a small thread pool (the database works while Python waits: ~2x on a page of 10-15
    series, more on PostgreSQL)."""
    global _POOL
    if len(infos) <= 1:
        return [store.query_series(i, start, end, max_points=max_points, rate=rate, tier=tier) for i in infos]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="triscope-dash-query")
    futs = [_POOL.submit(store.query_series, i, start, end, max_points, rate, tier) for i in infos]
    return [f.result() for f in futs]


def link_capacities(store: StoreReader, node: str, listed: Sequence[SeriesInfo]) -> dict[str, float]:
    """gpu -> its link's negotiated one-way capacity (gen x width as trained now, else the stored
    capacity), from the newest link facts (``store.latest``: one read) of the GPUs with PCIe series."""

    gpus = sorted({s.labels["gpu"] for s in listed if s.metric in (PCIE_RX, PCIE_TX) and s.labels.get("gpu")})
    if not gpus:
        return {}
    by_metric: dict[str, list[SeriesPoints]] = {}
    for prefix in sorted({p for p in LINK_FACT_PREFIXES if any(s.metric.startswith(p) for s in listed)}):
        for lv in store.latest(node, prefix=prefix):
            by_metric.setdefault(lv.info.metric, []).append(
                SeriesPoints(lv.info.metric, dict(lv.info.labels), [lv.ts], [lv.value]))
    facts = link_facts_from(by_metric)
    buses = buses_of_gpus(s.labels for s in listed if s.metric == "triscope_gpu_info")
    out: dict[str, float] = {}
    for gpu in gpus:
        cap = negotiated_capacity(link_ids({"gpu": gpu}, buses), facts)
        if cap:
            out[gpu] = cap
    return out


LINK_FACT_PREFIXES = ("triscope_pcie_link_", "triscope_gpu_pcie_link_")


def link_capacity_traces(store: StoreReader, node: str, window: Window, listed: Sequence[SeriesInfo]) -> list[LaneTrace]:
    """A step line per GPU link at its negotiated one-way capacity (gen x width, as trained now)."""
    return [LaneTrace(f"capacity|gpu={gpu}", "capacity", {"gpu": gpu}, "io", f"GPU {gpu} link capacity", "GB/s", 1 / GB,
                      [window.start, window.end], [cap, cap], dash="dash", shape="hv")
            for gpu, cap in link_capacities(store, node, listed).items()]


def history_segments(store: StoreReader, node: str, window: Window, accel: AcceleratorId | None = None,
                     runs: Sequence[VerdictRun] | None = None) -> tuple[list[Segment], str] | None:
    """The ribbon from the verdict history (``store.verdict_runs``, or ``runs`` already read): the
    node's roll-up runs, or with ``accel`` that accelerator's own (a node with one accelerator and no
    roll-up: that one's); None when the node has no history in the range."""
    runs = store.verdict_runs(node, window.start, window.end) if runs is None else runs
    if not runs:
        return None
    want = accel.key if accel is not None else ""
    mine = [r for r in runs if r.accelerator == want]
    if not mine and accel is None:
        accs = sorted({r.accelerator for r in runs})
        if len(accs) == 1:        # one accelerator and no roll-up runs: that accelerator is the node
            mine = [r for r in runs if r.accelerator == accs[0]]
    if not mine:
        return ([], f"no stored state for {accel.name} in this range") if accel is not None else None
    segs = [Segment(a, b, r.state, r.score_mean) for r, a, b in wd.run_spans(mine, window.start, window.end)]
    return segs, (f"{accel.name}'s state stored by the agent" if accel is not None else "state stored by the agent")


def mismatch_segments(store: StoreReader, node: str, window: Window, max_points: int,
                      listed: Sequence[SeriesInfo] | None = None, accel: AcceleratorId | None = None,
                      runs: Sequence[VerdictRun] | None = None) -> tuple[list[Segment], str]:
    """The ribbon: the verdict history (``store.verdict_runs``: the node's roll-up, or with ``accel``
    that accelerator's own runs) — the same record root cause and the other pages read, at full
    resolution whatever the range.  The detector is never re-run here; where the history holds
    nothing in the range, the note says what the node's series are (``listed``: its series already
    listed)."""
    got = history_segments(store, node, window, accel, runs)
    if got is not None:
        return got
    listed = listed if listed is not None else store.series(node=node, prefix="triscope_")
    verdicts = [s for s in listed if s.metric == wd.STATE_METRIC
                and (AcceleratorId.of(s.labels) is None if accel is None else accel.matches(s.labels))]
    if verdicts:
        return [], (f"no stored state for {accel.name} in this range" if accel is not None
                    else "no state stored in this range")
    if accel is not None:
        return [], f"no per-accelerator state stored for {accel.name} (the node's state: pick the whole node)"
    if not any(s.metric.startswith(("triscope_gpu_", "triscope_npu_")) for s in listed):
        return [], "no mismatch state: no accelerator data in this range"
    return [], "no mismatch state stored for this node (its agent publishes no verdict)"


LIVE_LOOKBACK_S = 30.0   # counters need the point before the first new one for its rate


def live_delta(store: StoreReader, node: str, keys: Sequence[str], since: float, until: float) -> dict[str, tuple[list[float], list[float]]]:
    """New raw points after ``since`` per trace key (live mode appends these).  The keys are the
    series' ids (``LaneTrace.key``); other keys (capacity lines, the ribbon) have nothing to add."""
    ids = {int(k) for k in keys if k.isdigit()}
    if not ids:
        return {}
    infos = [s for s in store.series(node=node, prefix="triscope_") if s.id in ids]
    out: dict[str, tuple[list[float], list[float]]] = {}
    for d in fetch_all(store, infos, since - LIVE_LOOKBACK_S, until, None):
        pts = [(t, v) for t, v in zip(d.ts, d.values, strict=False) if t > since]
        out[str(d.info.id)] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


# ---------------------------------------------------------------------------------------------- fleet
@dataclass
class FleetRow:
    node: str
    state: str                 # the node's roll-up: the worst accelerator
    score: float | None
    accelerators: str
    slo: str
    last_remediation: str
    last_seen: float
    live: bool                 # an agent's node whose last tick is recent (a recording never is)
    cells: list[wd.AccelNow] = field(default_factory=list)   # one per accelerator
    recording: str = ""        # the trace file a recording was imported from ("" for an agent's node)


FLEET_METRICS = (wd.INFO_METRIC,)
FLEET_RECENT_S = 3600.0      # nodes seen within this of the newest node: one partition-pruned read
FLEET_LOOKBACK_S = wd.CURRENT_LOOKBACK_S   # a node's current state: what it published this close to its last tick


def fleet_rows(store: Store, now: float, slo_status: Mapping[str, str] | None = None) -> list[FleetRow]:
    """One row per node, with a cell per accelerator (its current state and workload), from a
    handful of fleet-wide store reads, not a few queries per node: each node's current runs of
    the verdict history (``Store.current_verdicts``, the record every page reads), the newest
    workload-info points (``Store.fleet_latest``), the accelerator listings (``Store.series_keys``)
    and the workloads table."""
    last_actions = last_remediation_by_node(store)
    nodes = store.nodes()
    verdicts = store.current_verdicts(FLEET_LOOKBACK_S)
    latest = fleet_workload_latest(store, nodes)
    # the GPUs from two small listings (every NVML GPU has triscope_gpu_up; the model is in
    # triscope_gpu_info), not every triscope_gpu_* series (13 a GPU)
    gpu_keys = store.series_keys(metric="triscope_gpu_up")
    for name, keys in store.series_keys(metric="triscope_gpu_info").items():
        gpu_keys.setdefault(name, set()).update(keys)
    npu_keys = store.series_keys(prefix="triscope_npu_")
    rows: list[FleetRow] = []
    nows = []
    for n in nodes:
        entries = ((m, lk, ts, v) for (m, lk), (ts, v) in latest.get(n.name, {}).items())
        nows.append(wd.current_from_runs(verdicts.get(n.name, []), entries, parse=_labels))
    wd.with_owners(nows, functools.partial(wd.workload_owners, store))
    for n, cur in zip(nodes, nows, strict=True):
        state, score = cur.state or "no data", cur.score
        gk = gpu_keys.get(n.name, set())
        nk = npu_keys.get(n.name, set())
        if not cur.state:
            state = "not computed" if gk or nk or cur.accels else "no accelerator"
        accels = set(cur.accels)
        for _, lk in (*gk, *nk):
            a = AcceleratorId.of(_labels(lk))
            if a is not None:
                accels.add(a)
        cells = [cur.accels.get(a) or wd.AccelNow(a) for a in sorted(accels)]
        rec = n.recording or ""
        rows.append(FleetRow(n.name, state, score, _accelerator_text(gk, nk),
                             (slo_status or {}).get(n.name, "no SLO file configured" if slo_status is None else "-"),
                             last_actions.get(n.name, "none"), n.last_seen,
                             not rec and abs(now - n.last_seen) <= LIVE_SLACK_S, cells, rec))
    return rows


def fleet_workload_latest(store: StoreReader, nodes: Sequence[NodeInfo],
                          metrics: Sequence[str] = FLEET_METRICS) -> dict[str, dict[tuple[str, str], tuple[float, float]]]:
    """Every node's newest workload-info points (which workloads are on each accelerator now).  Nodes that reported within the last hour are read in one
    statement bounded in time (only the newest day partitions are probed); the rest, and any
    recent node whose series have nothing that recent, in a second one without a bound (their
    newest point whenever it was, as ``Store.latest`` gives; nodes without such series add
    nothing to it)."""
    if not nodes:
        return {}
    newest = max(n.last_seen for n in nodes)
    recent = [n for n in nodes if n.last_seen >= newest - FLEET_RECENT_S]
    since = min(n.last_seen for n in recent) - FLEET_LOOKBACK_S
    out = store.fleet_latest(metrics, since=since)
    recent_names = {n.name for n in recent}
    # the rest: a node that has none of these series answers with no rows (the metric filter
    # comes first), so no listing of who has them is needed
    again = [n.name for n in nodes if n.name not in recent_names or n.name not in out]
    if again:
        out.update(store.fleet_latest(metrics, nodes=again))
    return out


_LABELS: dict[str, dict[str, str]] = {}


def _labels(lk: str) -> dict[str, str]:
    """Parsed label key; the few distinct keys of a fleet are parsed once."""
    got = _LABELS.get(lk)
    if got is None:
        got = parse_label_key(lk)
        if len(_LABELS) < 100_000:
            _LABELS[lk] = got
    return got


def _accelerator_text(gpu_keys: Iterable[tuple[str, str]], npu_keys: Iterable[tuple[str, str]]) -> str:
    names: dict[str, str] = {}
    gpus: set[str] = set()
    for metric, lk in gpu_keys:
        lab = _labels(lk)
        if metric == "triscope_gpu_info":
            names[lab.get("gpu", "?")] = lab.get("name", "GPU")
        if lab.get("gpu"):
            gpus.add(lab["gpu"])
    npus = {(_labels(lk).get("npu"), _labels(lk).get("chip")) for _, lk in npu_keys if _labels(lk).get("npu") is not None}
    parts = []
    if gpus:
        models = sorted({shorten(m, 40) for m in names.values()}) or ["GPU"]
        parts.append(f"{len(gpus)} x {'/'.join(models)}")
    if npus:
        parts.append(f"{len(npus)} x Ascend NPU")
    return ", ".join(parts) or "none"


def last_remediation_by_node(store: Store) -> dict[str, str]:
    out: dict[str, str] = {}
    rows = audit_rows(store, limit=500)
    if rows.rows:
        for r in rows.rows:
            node = str(r.get("node") or r.get("target_node") or "")
            if node:  # rows come newest first
                out.setdefault(node, f"{r.get('action', '?')} ({r.get('outcome', '?')})")
        return out
    for e in store.events(kinds=["remediation"], limit=2000):
        out[e.node] = e.message[:60] or _detail(e, "action", "remediation")
    return out


# ---------------------------------------------------------------------------------------------- mismatch page
@dataclass
class MismatchPoint:
    node: str
    ts: float
    busy: float
    link_util: float
    state: str
    score: float
    accelerator: str = ""      # "GPU 0"; "" the node


def mismatch_points(store: StoreReader, nodes: Sequence[str], window: Window, max_windows: int = 400) -> tuple[list[MismatchPoint], dict[str, dict[str, float]]]:
    """The scatter's points and each node's share of time in each state, both from the verdict
    history (``store.verdict_runs``) — so this page says what the Node page, the Fleet page and root
    cause say for the same minutes — and no detector run.  A node's shares are its ribbon's time in
    each state (``mismatch_segments``: the history); a point is one window of the stored series (accelerator busy, and the busier PCIe
    direction against the link's effective ceiling), coloured by the state its accelerator
    published for that window (the history read ``tracker_lag`` later: the tracker's state for a
    window comes that long after it)."""

    th = MismatchThresholds()
    lag = th.window_s / 2 + th.state_dwell_s   # root cause's tracker_lag: the median tick of a window, then the dwell
    width = max(th.window_s, window.span / max(1, max_windows))
    pts: list[MismatchPoint] = []
    shares: dict[str, dict[str, float]] = {}
    for node in nodes:
        runs = store.verdict_runs(node, window.start, window.end + lag)
        listed = store.series(node=node, prefix="triscope_")
        segs, _ = mismatch_segments(store, node, window, max_windows, listed, runs=runs)
        counts: dict[str, float] = {}
        for sg in segs:
            counts[sg.state] = counts.get(sg.state, 0.0) + (sg.end - sg.start)
        if counts:
            tot = sum(counts.values()) or 1.0
            shares[node] = {k: counts.get(k, 0.0) / tot for k in STATES if counts.get(k)}
        by_acc: dict[str, list[Segment]] = {}
        for r, a, b in wd.run_spans(runs, -math.inf, math.inf):
            by_acc.setdefault(r.accelerator, []).append(Segment(a, b, r.state, r.score_mean))
        at = {k: _SegmentIndex(v) for k, v in by_acc.items()}
        none = _SegmentIndex([])
        ribbon = _SegmentIndex(segs)
        for acc, t, busy, lu in _evidence_windows(store, node, listed, window, width, th):
            mid = t + width / 2
            got = (at.get(acc.key if acc else "", none).at(mid + lag)
                   or at.get("", none).at(mid + lag) or ribbon.at(mid))
            if got is not None:
                pts.append(MismatchPoint(node, t, busy, lu, got.state, got.score or 0.0, acc.name if acc else ""))
    return pts, shares


class _SegmentIndex:
    """Segments in time order, not overlapping: the one that holds a time, by bisection."""

    def __init__(self, segs: Sequence[Segment]) -> None:
        self.segs = list(segs)
        self.starts = [sg.start for sg in self.segs]

    def at(self, t: float) -> Segment | None:
        import bisect

        i = bisect.bisect_right(self.starts, t) - 1
        return self.segs[i] if i >= 0 and t < self.segs[i].end else None


def _evidence_windows(store: StoreReader, node: str, listed: Sequence[SeriesInfo], window: Window, width: float,
                      th: MismatchThresholds) -> list[tuple[AcceleratorId | None, float, float, float]]:
    """(accelerator, window start, busy 0..1, link load 0..1 of the effective ceiling) per window of
    ``width`` seconds, from the stored series as the store downsamples them: SM activity (else the
    coarse NVML figure, or NPU AICore) and the busier PCIe direction."""

    busy = [s for s in listed if s.metric in (GPU_BUSY, NPU_BUSY)] or [
        s for s in listed if s.metric == COARSE_GPU.metric]
    links = [s for s in listed if s.metric in (PCIE_RX, PCIE_TX) and s.labels.get("gpu")]
    if not busy:
        return []
    n = max(1, math.ceil(window.span / width))
    datas = fetch_all(store, busy + links, window.start, window.end, 2 * n)
    caps = link_capacities(store, node, listed) if links else {}
    rates: dict[str, dict[int, float]] = {}
    peak: dict[str, float] = {}
    for d in datas[len(busy):]:
        gpu = d.info.labels["gpu"]
        for i, v in _bucket_means(d, window.start, width).items():
            rates.setdefault(gpu, {})[i] = max(rates.get(gpu, {}).get(i, 0.0), v)
        peak[gpu] = max([peak.get(gpu, 0.0), *d.values])
    out: list[tuple[AcceleratorId | None, float, float, float]] = []
    for d in datas[:len(busy)]:
        acc = AcceleratorId.of(d.info.labels)
        gpu = d.info.labels.get("gpu", "")
        ceiling = effective_ceiling(caps.get(gpu), peak.get(gpu), th) if gpu in rates else None
        for i, v in sorted(_bucket_means(d, window.start, width).items()):
            lu = rates.get(gpu, {}).get(i, 0.0) / ceiling if ceiling else 0.0
            out.append((acc, window.start + i * width, min(1.0, max(0.0, v)), min(1.5, lu)))
    return out


def _bucket_means(d: SeriesData, start: float, width: float) -> dict[int, float]:
    """Window index -> the mean of the series' points in it (as the store returned them)."""
    sums: dict[int, list[float]] = {}
    for t, v in zip(d.ts, d.values, strict=False):
        acc = sums.setdefault(int((t - start) // width), [0.0, 0.0])
        acc[0] += v
        acc[1] += 1
    return {i: s / c for i, (s, c) in sums.items() if c}


class AuditRecord(TypedDict, total=False):
    """One remediation decision as the pages show it: an audit row's columns
    (``triscope.store.audit.RemediationAudit``) with ``mode``; a row from a ``remediation`` event
    has the first few; ``node_from`` and ``accelerator`` are filled in by the Remediation page."""

    id: int
    ts: float
    engine_id: str
    rule: str
    trigger_kind: str
    trigger: str
    trigger_key: str
    action: str
    target: str
    target_key: str
    node: str | None
    namespace: str | None
    outcome: str
    rail: str | None
    reason: str
    dry_run: bool
    params: Mapping[str, object]      # the audit table's JSON columns, typed as the store types them
    response: Mapping[str, object]
    received_ts: float | None
    issued_ts: float | None
    finished_ts: float | None
    mode: str                          # "dry-run" or "live"
    node_from: str                     # where a revert's node came from (the decision it reverts)
    accelerator: str


def audit_record(r: AuditRow) -> AuditRecord:
    """An audit row's columns, in the table's order, and its ``mode``; a suppressed decision's
    outcome names its rail."""
    d = AuditRecord(id=r.id, ts=r.ts, engine_id=r.engine_id, rule=r.rule, trigger_kind=r.trigger_kind,
                    trigger=r.trigger, trigger_key=r.trigger_key, action=r.action, target=r.target,
                    target_key=r.target_key, node=r.node, namespace=r.namespace, outcome=r.outcome, rail=r.rail,
                    reason=r.reason, dry_run=r.dry_run, params=r.params, response=r.response,
                    received_ts=r.received_ts, issued_ts=r.issued_ts, finished_ts=r.finished_ts)
    d["mode"] = "dry-run" if r.dry_run else "live"
    if r.rail:
        d["outcome"] = f"{r.outcome} ({r.rail})"
    return d


def _detail(e: HasDetails, key: str, default: str = "") -> str:
    """One of an event's details as text (``default`` when it has none)."""
    return text(e.details.get(key, default))


def _event_record(e: HasDetails, ts: float, node: str, severity: str, message: str) -> AuditRecord:
    """A ``remediation`` event as a decision (a store without the engine's audit table)."""
    dry = e.details.get("dry_run", True)
    return AuditRecord(ts=ts, node=node, rule=_detail(e, "rule"), action=_detail(e, "action"),
                       target=_detail(e, "target"), mode="dry-run" if dry else "live",
                       outcome=_detail(e, "outcome", severity), reason=message)


@dataclass
class AuditRows:
    rows: list[AuditRecord]
    source: str          # "audit" (remediation engine's table), "events", or "" (none)
    note: str


def audit_rows(store: Store, start: float | None = None, end: float | None = None, limit: int = 1000) -> AuditRows:
    """The remediation audit log: ``triscope.store.audit`` when the engine's table exists, else the
    ``remediation`` events; an explained empty state otherwise."""

    why = ""
    try:
        recs = audit_log(store, since=start, until=end, limit=limit)
    except Exception as e:  # noqa: BLE001 - the table may not be migrated yet
        recs, why = [], f"audit table unavailable: {str(e).splitlines()[0][:160]}"
    rows = [audit_record(r) for r in recs]
    if rows:
        return AuditRows(rows, "audit", "")
    evs = store.events(kinds=["remediation"], start=start, end=end, limit=limit)
    if evs:
        return AuditRows([_event_record(e, e.ts, e.node, e.severity, e.message) for e in evs],
                         "events", "from remediation events (the engine's audit table is not available)")
    note = ("no remediation decisions recorded yet. The remediation engine writes every decision (acted, dry-run, "
            "suppressed, failed) here once it runs: 'triscope remediate --policy FILE' or 'triscope run'.")
    if why:
        note += f" ({why})"
    return AuditRows([], "", note)
