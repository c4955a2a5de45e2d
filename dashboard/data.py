"""Everything the pages read, through the store's query functions and the analysis package only.

No SQL here: ``store.Store`` (``nodes``, ``series``, ``query``, ``latest``, ``events``,
``time_bounds``, ``fleet_latest``, ``series_keys``) and ``analysis.*``.  Every series is downsampled by the store
(``max_points``) before it reaches a figure.  Functions return plain dataclasses; the figure
builders in ``triscope.dashboard.figures`` turn them into Plotly figures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any

from triscope.analysis.mismatch import STATES, link_capacity_bytes_per_second
from triscope.core.vocabulary import accelerator_name
from triscope.dashboard import workload_data as wd
from triscope.store.reader import StoreReader

if TYPE_CHECKING:   # the audit tables are read with the store's engine: the whole store, not the read interface
    from triscope.store.api import Store

PRESETS: dict[str, float] = {"15m": 900.0, "1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
DATA_PRESET = "all"
"""The node page's range for a node with less than 15 minutes of data: from its first sample."""
LIVE_SLACK_S = 120.0   # a node whose last sample is this close to now counts as live

GB = 1e9


# ---------------------------------------------------------------------------------------------- time windows
@dataclass(frozen=True)
class Window:
    start: float
    end: float
    live: bool               # anchored at now (True) or at the node's last sample (recorded data)
    note: str = ""

    @property
    def span(self) -> float:
        return self.end - self.start


def resolve_window(store: StoreReader, node: str | None, preset: str, now: float,
                   custom: tuple[float, float] | None = None) -> Window:
    """The range a page shows.  Presets end at now for a live node, else at the node's last
    sample (a recorded trace or a node that stopped reporting), and say so."""
    if preset == "custom" and custom is not None:
        a, b = custom
        return Window(min(a, b), max(a, b), False, "custom range")
    span = PRESETS.get(preset, 3600.0)
    last: float | None = None
    if node:
        for n in store.nodes():
            if n.name == node:
                last = n.last_seen
                if preset == DATA_PRESET:   # all the node's data: a short trace or a node just started
                    span = max(60.0, (now if abs(now - n.last_seen) <= LIVE_SLACK_S else n.last_seen)
                               - n.first_seen)
    else:
        # the nodes table knows each node's last sample (time_bounds() would scan every sample)
        last = max((n.last_seen for n in store.nodes()), default=None)
    if last is None or abs(now - last) <= LIVE_SLACK_S:
        return Window(now - span, now, True)
    from datetime import datetime

    when = datetime.fromtimestamp(last, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    what = "data" if preset == DATA_PRESET else f"the {preset} before the last sample"
    return Window(last - span, last + 1.0, False, f"not live: showing {what} ({when})")


# ---------------------------------------------------------------------------------------------- node lanes
LANES = ("accelerators", "io", "network")
LANE_TITLES = {"accelerators": "Accelerators (busy %)", "io": "I/O: PCIe / DMA / IOMMU",
               "network": "Network"}


@dataclass
class LaneTrace:
    key: str                   # "metric|labelkey": stable id, used by live append
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
    accels: list[Any] = field(default_factory=list)           # the node's ``workload_data.Accel``s
    accel: Any = None                                         # the one shown (None: the whole node)


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
    class _D(dict):
        def __missing__(self, k: str) -> str:
            return "?"

    from triscope.core.names import shorten

    return " ".join(title.format_map(_D({k: shorten(str(v), 48) for k, v in labels.items()})).replace("?", "").split())


def _key(metric: str, labels: Mapping[str, str]) -> str:
    return metric + "|" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def node_lanes(store: Store, node: str, window: Window, max_points: int = 1500,
               specs: Sequence[TraceSpec] = NODE_TRACES, max_events: int = 300, accel: Any = None) -> NodeLanes:
    """The three lanes of one node over ``window``, each series downsampled by the store; with
    ``accel`` (a ``workload_data.Accel``) only that accelerator's series, its link, its own DMA
    device when the store knows its bus, its workloads' feeder busy and CPU wait, and its state
    ribbon (the node-wide network lane stays)."""
    out = NodeLanes(node, window, accel=accel)
    listed = store.series(node=node, prefix="triscope_")
    present = {s.metric for s in listed}
    out.accels = wd.node_accels(store, node, listed)
    todo = list(specs)
    if "triscope_gpu_sm_active_ratio" not in present and "triscope_gpu_utilization_ratio" in present:
        todo.insert(0, COARSE_GPU)
    if accel is not None:
        todo += WORKLOAD_TRACES
    own_device = _own_devices(listed, accel)
    jobs: list[tuple[TraceSpec, Any]] = []
    for spec in todo:
        if spec.metric in present:
            for info in store.series(node=node, metric=spec.metric,
                                     labels=dict(spec.only_labels) if spec.only_labels else None):
                if accel is not None and not _shown_for(info, accel, own_device):
                    continue
                jobs.append((spec, info))
    results = fetch_all(store, [info for _, info in jobs], window.start, window.end, max_points)
    by_spec: dict[int, list[Any]] = {}
    for (spec, _), d in zip(jobs, results, strict=True):
        if d.ts:
            by_spec.setdefault(id(spec), []).append(d)
    for spec in todo:
        got = by_spec.get(id(spec), [])
        if len(got) > spec.limit:  # keep the busiest few (by peak)
            got = sorted(got, key=lambda d: -max(d.values))[: spec.limit]
        for d in got:
            lab = dict(d.info.labels)
            ref = wd.WorkloadRef.of(lab)
            name = (_fmt(spec.title, {"workload": ref.pod or ref.workload or "no workload"})
                    if spec.metric.startswith(wd.WORKLOAD_PREFIX) else _fmt(spec.title, lab))
            out.traces.append(LaneTrace(
                _key(spec.metric, d.info.labels), spec.metric, lab, spec.lane, name, spec.unit, spec.scale, d.ts,
                d.values, spec.secondary, spec.dash, d.info.kind == "counter"))
    cap = link_capacity_traces(store, node, window, present)
    out.traces.extend(t for t in cap if accel is None or t.labels.get("gpu") == (accel.index if accel.kind == "gpu" else None))
    has = {t.lane for t in out.traces}
    gpus = "triscope_gpu_info" in present or any(m.startswith("triscope_gpu_") for m in present)
    if "accelerators" not in has:
        out.missing["accelerators"] = ("no GPU or NPU on this node (no NVML / npu-smi series stored)"
                                       if not gpus and not any(m.startswith("triscope_npu_") for m in present)
                                       else f"no series stored for {accel.name} on this node" if accel is not None
                                       and accel not in out.accels
                                       else "accelerator series stored, but no points in this range")
    if "io" not in has:
        out.missing["io"] = ("no PCIe / DMA / IOMMU series stored for this node (GPU PCIe counters need NVML GPM; "
                             "DMA and IOMMU need the eBPF probes)" if not any(
                                 m.startswith(("triscope_gpu_pcie", "triscope_dma", "triscope_iommu")) for m in present)
                             else "I/O series stored, but no points in this range")
    if "network" not in has:
        out.missing["network"] = ("no TCP series stored for this node" if not any(
            m.startswith("triscope_tcp") for m in present) else "TCP series stored, but no points in this range")
    out.segments, out.segments_note = mismatch_segments(store, node, window, max_points, present, accel=accel)
    evs = store.events(node=node, start=window.start, end=window.end, limit=max_events + 1)
    evs = [e for e in evs if e.kind != "mismatch_state"] or evs  # state changes are the ribbon already
    if accel is not None:   # another accelerator's events are not this one's
        evs = [e for e in evs if _event_accel(e.details) in (None, accel)]
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
        marks.sort(key=lambda m: m.ts)
    out.events_truncated = len(marks) > max_events
    out.events = marks[:max_events]
    return out


def _own_devices(listed: Sequence[Any], accel: Any) -> set[str]:
    """The PCI devices (bus ids) of ``accel`` from ``triscope_gpu_info``."""
    if accel is None or accel.kind != "gpu":
        return set()
    return {str(s.labels["bus_id"]) for s in listed if s.metric == "triscope_gpu_info"
            and s.labels.get("gpu") == accel.index and s.labels.get("bus_id")}


def _shown_for(info: Any, accel: Any, own_device: set[str]) -> bool:
    """Whether a series belongs on the lanes of ``accel``: the accelerator's own series; of the
    per-device ones (DMA, IOMMU) its own device's when the store knows its bus, else all of them
    (host-wide context); node-wide series (network) always."""
    a = wd.accel_of(info.labels)
    if a is not None:
        return bool(a == accel)
    if info.metric.startswith(ACCEL_SCOPED):
        return False
    dev = info.labels.get("device")
    if dev and own_device:
        return dev in own_device
    return True


def _event_accel(details: Mapping[str, Any]) -> Any:
    try:
        return wd.accel_of({k: str(details[k]) for k in wd.ACCEL_KEYS if k in details})
    except Exception:  # noqa: BLE001 - odd details: node-wide
        return None


_POOL: Any = None


def fetch_all(store: StoreReader, infos: Sequence[Any], start: float, end: float, max_points: int | None,
              rate: bool | None = None) -> list[Any]:
    """``store.query_series`` for each series, a few at a time on a small thread pool (the
    database works while Python waits: ~2x on a page of 10-15 series, more on PostgreSQL)."""
    global _POOL
    one = _query_small if max_points is not None and end - start <= SMALL_RANGE_FACTOR * max_points else _query
    if len(infos) <= 1:
        return [one(store, i, start, end, max_points, rate) for i in infos]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="triscope-dash-query")
    futs = [_POOL.submit(one, store, i, start, end, max_points, rate) for i in infos]
    return [f.result() for f in futs]


# a range of at most this many seconds per output point holds few raw points (1 Hz ticks): one plain
# indexed read and the store's min/max downsampling in Python beat the SQL bucketing (3 queries)
SMALL_RANGE_FACTOR = 4


def _query(store: StoreReader, info: Any, start: float, end: float, max_points: int | None, rate: bool | None) -> Any:
    return store.query_series(info, start, end, max_points=max_points, rate=rate)


def _query_small(store: StoreReader, info: Any, start: float, end: float, max_points: int | None, rate: bool | None) -> Any:
    from triscope.store.api import minmax_downsample

    d = store.query_series(info, start, end, max_points=None, rate=rate)
    if max_points is not None and len(d.ts) > max_points:
        d.ts, d.values = minmax_downsample(d.ts, d.values, max_points)
    return d


def link_capacity_traces(store: StoreReader, node: str, window: Window, present: set[str]) -> list[LaneTrace]:
    """A step line per GPU link at its negotiated one-way capacity (gen x width, as trained now)."""
    out: list[LaneTrace] = []
    if "triscope_gpu_pcie_rx_bytes_total" not in present and "triscope_gpu_pcie_tx_bytes_total" not in present:
        return out
    bus_of: dict[str, str] = {}
    for info in store.series(node=node, metric="triscope_gpu_info"):
        if info.labels.get("gpu") and info.labels.get("bus_id"):
            bus_of[info.labels["gpu"]] = info.labels["bus_id"]
    gpus = sorted({s.labels.get("gpu", "") for s in store.series(node=node, metric="triscope_gpu_pcie_rx_bytes_total")})
    for gpu in gpus:
        keys = [{"device": bus_of[gpu]}] if gpu in bus_of else []
        keys.append({"gpu": gpu})
        cap = None
        for lab in keys:
            speed = _last(store, node, "triscope_pcie_link_speed_gts", dict(lab, kind="current"), window)
            width = _last(store, node, "triscope_pcie_link_width", dict(lab, kind="current"), window)
            if speed and width:
                cap = link_capacity_bytes_per_second(speed, width)
                break
            c = _last(store, node, "triscope_pcie_link_capacity_bytes_per_second", lab, window)
            if c:
                cap = c
                break
        if cap:
            out.append(LaneTrace(f"capacity|gpu={gpu}", "capacity", {"gpu": gpu}, "io", f"GPU {gpu} link capacity",
                                 "GB/s", 1 / GB, [window.start, window.end], [cap, cap], dash="dash", shape="hv"))
    return out


def _last(store: StoreReader, node: str, metric: str, labels: Mapping[str, str], window: Window) -> float | None:
    best: tuple[float, float] | None = None
    for d in store.query(metric, node=node, labels=dict(labels), start=window.start - 86400, end=window.end,
                         max_points=20, rate=False):
        if d.ts and (best is None or d.ts[-1] > best[0]):
            best = (d.ts[-1], d.values[-1])
    return None if best is None else best[1]


def segments_from_points(points: Iterable[tuple[float, str]], end: float, max_gap: float | None = None) -> list[Segment]:
    """Runs of equal state from (ts, state) points sorted or not; a run ends at the next point
    (or ``end``); a gap longer than ``max_gap`` ends a run early (no data is not a state)."""
    pts = sorted(points)
    out: list[Segment] = []
    for i, (t, st) in enumerate(pts):
        nxt = pts[i + 1][0] if i + 1 < len(pts) else end
        if max_gap is not None and nxt - t > max_gap:
            nxt = t + max_gap
        if out and out[-1].state == st and abs(out[-1].end - t) < 1e-6:
            out[-1].end = nxt
        else:
            out.append(Segment(t, nxt, st))
    return out


def history_segments(store: StoreReader, node: str, window: Window, accel: Any = None
                     ) -> tuple[list[Segment], str] | None:
    """The ribbon from the verdict history (``store.verdict_runs``): the node's roll-up runs, or with
    ``accel`` that accelerator's own (a node with one accelerator and no roll-up: that one's); None
    when the node has no history in the range (a store written before it)."""
    runs = store.verdict_runs(node, window.start, window.end)
    if not runs:
        return None
    want = (accelerator_name(accel.labels) or "") if accel is not None else ""
    mine = [r for r in runs if r.accelerator == want]
    if not mine and accel is None:
        accs = sorted({r.accelerator for r in runs})
        if len(accs) == 1:        # one accelerator and no roll-up runs: that accelerator is the node
            mine = [r for r in runs if r.accelerator == accs[0]]
    if not mine:
        return ([], f"no stored state for {accel.name} in this range") if accel is not None else None
    steps = sorted((r.end - r.start) / (r.ticks - 1) for r in mine if r.ticks > 1 and r.end > r.start)
    step = steps[len(steps) // 2] if steps else 1.0
    segs: list[Segment] = []
    for r in sorted(mine, key=lambda r: r.start):
        a, b = max(r.start, window.start), min(r.end + step, window.end)
        if b > a:
            segs.append(Segment(a, b, r.state, r.score_mean))
    # the same words as for the stored state series: the runs are that state, kept as runs
    return segs, (f"{accel.name}'s state stored by the agent" if accel is not None else "state stored by the agent")


def mismatch_segments(store: StoreReader, node: str, window: Window, max_points: int,
                      present: set[str] | None = None, accel: Any = None) -> tuple[list[Segment], str]:
    """The ribbon: the verdict history (``store.verdict_runs``: the node's roll-up, or with ``accel``
    that accelerator's own runs) — the same record root cause reads, at full resolution whatever the
    range; else, for stores written before it, the state the agent stored
    (``triscope_mismatch_state``), else the detector run over the stored series
    (``triscope.analysis.mismatch.node_states``, the node's roll-up)."""
    got = history_segments(store, node, window, accel)
    if got is not None:
        return got
    present = present if present is not None else {s.metric for s in store.series(node=node, prefix="triscope_")}
    if "triscope_mismatch_state" in present:
        pts: list[tuple[float, str]] = []
        step = 0.0
        infos = wd.state_infos(store, node, accel, per_accel=accel is not None)
        for d in fetch_all(store, infos, window.start, window.end, max_points, rate=False):
            st = d.info.labels.get("state", "?")
            pts.extend((t, st) for t, v in zip(d.ts, d.values, strict=False) if v >= 0.5)
            if len(d.ts) > 1:
                step = max(step, (d.ts[-1] - d.ts[0]) / (len(d.ts) - 1))
        if pts:
            what = f"{accel.name}'s state stored by the agent" if accel is not None else "state stored by the agent"
            return segments_from_points(pts, window.end, max_gap=max(30.0, 4 * step)), what
        if accel is not None and infos:
            return [], f"no stored state for {accel.name} in this range"
    if accel is not None:
        return [], f"no per-accelerator state stored for {accel.name} (the node's state: pick the whole node)"
    segs = computed_states(store, node, window)
    if segs:
        return [Segment(s.start, s.end, s.state, s.score) for s in segs], "state computed from the stored series"
    return [], "no mismatch state: no accelerator data in this range"


CEILING_LOOKBACK_S = 3600.0


def computed_states(store: StoreReader, node: str, window: Window, max_windows: int = 400) -> list[Any]:
    """``triscope.analysis.mismatch.node_states`` with a window size that keeps at most ``max_windows``.

    The link ceiling's observed part looks back ``CEILING_LOOKBACK_S`` (1 h) before the range
    instead of the detector's default 24 h: that look-back reads per-second rates from raw
    points, ~1.5 s a series on SQLite for 24 h, too slow for a page (the negotiated gen x width
    capacity still sets the ceiling; only links faster than that estimate are affected)."""
    from triscope.analysis.config import MismatchThresholds
    from triscope.analysis.mismatch import node_states

    th = MismatchThresholds()
    w = max(th.window_s, math.ceil(window.span / max_windows))
    return list(node_states(store, node, window.start, window.end, window=w, thresholds=th,
                            ceiling_lookback_s=CEILING_LOOKBACK_S))


def live_delta(store: StoreReader, node: str, keys: Sequence[str], since: float, until: float) -> dict[str, tuple[list[float], list[float]]]:
    """New raw points per trace key after ``since`` (live mode appends these)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    by_metric: dict[str, set[str]] = {}
    for k in keys:
        m = k.split("|", 1)[0]
        if m != "capacity":
            by_metric.setdefault(m, set()).add(k)
    for metric, ks in by_metric.items():
        # counters need the previous point for their first rate: ask from a little earlier
        for d in store.query(metric, node=node, start=since - 30, end=until, max_points=None):
            k = _key(metric, d.info.labels)
            if k in ks:
                pts = [(t, v) for t, v in zip(d.ts, d.values, strict=False) if t > since]
                out[k] = ([p[0] for p in pts], [p[1] for p in pts])
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
    live: bool
    cells: list[Any] = field(default_factory=list)   # one ``workload_data.AccelNow`` per accelerator


MISMATCH_METRICS = ("triscope_mismatch_state", "triscope_mismatch_score")
FLEET_METRICS = (*MISMATCH_METRICS, "triscope_accelerator_workload_info")
FLEET_RECENT_S = 3600.0      # nodes seen within this of the newest node: one partition-pruned read
FLEET_LOOKBACK_S = 900.0     # their latest mismatch points are looked for this far before their last tick


def fleet_rows(store: Store, now: float, slo_status: Mapping[str, str] | None = None) -> list[FleetRow]:
    """One row per node, with a cell per accelerator (its current state and workload), from a
    handful of fleet-wide store reads (``Store.fleet_latest``, ``Store.series_keys``, the workloads
    table), not a few queries per node: ~0.1 s of SQL at 1,000 nodes."""
    last_actions = last_remediation_by_node(store)
    nodes = store.nodes()
    latest = fleet_mismatch_latest(store, nodes)
    # the GPUs from two small listings (every NVML GPU has triscope_gpu_up; the model is in
    # triscope_gpu_info), not every triscope_gpu_* series (13 a GPU)
    gpu_keys = store.series_keys(metric="triscope_gpu_up")
    for name, keys in store.series_keys(metric="triscope_gpu_info").items():
        gpu_keys.setdefault(name, set()).update(keys)
    npu_keys = store.series_keys(prefix="triscope_npu_")
    rows: list[FleetRow] = []
    nows = [wd.current_from(((m, lk, ts, v) for (m, lk), (ts, v) in latest.get(n.name, {}).items()), parse=_labels)
            for n in nodes]
    wd.with_owners(nows, functools.partial(wd.workload_owners, store))
    for n, cur in zip(nodes, nows, strict=True):
        state, score = cur.state or "no data", cur.score
        gk = gpu_keys.get(n.name, set())
        nk = npu_keys.get(n.name, set())
        if not cur.state:
            state = "not computed" if gk or nk or cur.accels else "no accelerator"
        accels = set(cur.accels)
        for _, lk in (*gk, *nk):
            a = wd.accel_of(_labels(lk))
            if a is not None:
                accels.add(a)
        cells = [cur.accels.get(a) or wd.AccelNow(a) for a in sorted(accels, key=lambda a: a.sort_key)]
        rows.append(FleetRow(n.name, state, score, _accelerator_text(gk, nk),
                             (slo_status or {}).get(n.name, "no SLO file configured" if slo_status is None else "-"),
                             last_actions.get(n.name, "none"), n.last_seen, abs(now - n.last_seen) <= LIVE_SLACK_S,
                             cells))
    return rows


def fleet_mismatch_latest(store: StoreReader, nodes: Sequence[Any],
                          metrics: Sequence[str] = FLEET_METRICS) -> dict[str, dict[tuple[str, str], tuple[float, float]]]:
    """Every node's newest mismatch state and score points (node roll-up and per accelerator)
    and workload-info points.  Nodes that reported within the last hour are read in one
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
        from triscope.core.samples import parse_label_key

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
        from triscope.core.names import shorten

        models = sorted({shorten(m, 40) for m in names.values()}) or ["GPU"]
        parts.append(f"{len(gpus)} x {'/'.join(models)}")
    if npus:
        parts.append(f"{len(npus)} x Ascend NPU")
    return ", ".join(parts) or "none"


def accelerator_summary(store: StoreReader, node: str) -> str:
    """'8 x NVIDIA H200', '2 x Ascend NPU', 'none' for one node."""
    gk = {(s.metric, _label_key_of(s.labels)) for s in store.series(node=node, prefix="triscope_gpu_")}
    nk = {(s.metric, _label_key_of(s.labels)) for s in store.series(node=node, prefix="triscope_npu_")}
    return _accelerator_text(gk, nk)


def _label_key_of(labels: Mapping[str, str]) -> str:
    from triscope.core.samples import label_key

    return label_key(labels)


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
        out[e.node] = e.message[:60] or e.details.get("action", "remediation")
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


def mismatch_points(store: StoreReader, nodes: Sequence[str], window: Window, max_windows: int = 400) -> tuple[list[MismatchPoint], dict[str, dict[str, float]]]:
    """The scatter's windows (accelerator busy and link load, from the stored series) and each
    node's share of time in each state.  Where a node has a verdict history the state is the
    history's — the share its runs' time in each state, each point coloured by the run it falls in —
    so this page says what the Node page and root cause say for the same minutes; the detector's
    own state over the window only for stores written before the history."""
    from triscope.analysis.config import MismatchThresholds
    from triscope.analysis.rca_timeline import tracker_lag

    lag = tracker_lag(MismatchThresholds())
    pts: list[MismatchPoint] = []
    shares: dict[str, dict[str, float]] = {}
    for node in nodes:
        states = computed_states(store, node, window, max_windows=max_windows)
        got = history_segments(store, node, window) if states else None
        segs = got[0] if got is not None else []
        history = bool(segs)

        counts: dict[str, float] = {}
        if history:
            for sg in segs:
                counts[sg.state] = counts.get(sg.state, 0.0) + (sg.end - sg.start)
        for s in states:
            # the state published for a window's middle comes the tracker's lag after it
            st = _state_at(segs, (s.start + s.end) / 2 + lag, s.state) if history else s.state
            if not history:
                counts[st] = counts.get(st, 0.0) + (s.end - s.start)
            busy = s.evidence.get("busy")
            lu = s.evidence.get("link_util")
            if busy is not None:
                pts.append(MismatchPoint(node, s.start, float(busy), float(lu or 0.0), st, s.score))
        if not counts:
            continue
        tot = sum(counts.values()) or 1.0
        shares[node] = {k: counts.get(k, 0.0) / tot for k in STATES if counts.get(k)}
    return pts, shares


def _state_at(segs: Sequence[Segment], t: float, default: str) -> str:
    for sg in segs:
        if sg.start <= t < sg.end:
            return sg.state
    return default


@dataclass
class AuditRows:
    rows: list[dict[str, Any]]
    source: str          # "audit" (remediation engine's table), "events", or "" (none)
    note: str


def audit_rows(store: Store, start: float | None = None, end: float | None = None, limit: int = 1000) -> AuditRows:
    """The remediation audit log: ``triscope.store.audit`` when the engine's table exists, else the
    ``remediation`` events; an explained empty state otherwise."""
    from triscope.store.audit import audit_log

    why = ""
    try:
        recs = audit_log(store, since=start, until=end, limit=limit)
    except Exception as e:  # noqa: BLE001 - the table may not be migrated yet
        recs, why = [], f"audit table unavailable: {str(e).splitlines()[0][:160]}"
    rows = []
    for r in recs:
        d = _as_dict(r)
        d["mode"] = "dry-run" if d.get("dry_run") else "live"
        if d.get("rail"):
            d["outcome"] = f"{d.get('outcome')} ({d['rail']})"
        rows.append(d)
    if rows:
        return AuditRows(rows, "audit", "")
    evs = store.events(kinds=["remediation"], start=start, end=end, limit=limit)
    if evs:
        return AuditRows([{"ts": e.ts, "node": e.node, "rule": e.details.get("rule", ""),
                           "action": e.details.get("action", ""), "target": e.details.get("target", ""),
                           "mode": "dry-run" if e.details.get("dry_run", True) else "live",
                           "outcome": e.details.get("outcome", e.severity), "reason": e.message} for e in evs],
                         "events", "from remediation events (the engine's audit table is not available)")
    note = ("no remediation decisions recorded yet. The remediation engine writes every decision (acted, dry-run, "
            "suppressed, failed) here once it runs: 'triscope remediate --policy FILE' or 'triscope run'.")
    if why:
        note += f" ({why})"
    return AuditRows([], "", note)


def _as_dict(r: Any) -> dict[str, Any]:
    if isinstance(r, Mapping):
        return dict(r)
    if hasattr(r, "__dataclass_fields__"):
        return {k: getattr(r, k) for k in r.__dataclass_fields__}
    if hasattr(r, "_asdict"):
        return dict(r._asdict())
    return {k: v for k, v in vars(r).items() if not k.startswith("_")}
