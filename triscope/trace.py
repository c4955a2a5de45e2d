"""Recorded traces: one node's stored series and events as a compact file, and back into a store.

A trace lets the dashboard and the analysis show real GPU data on machines without a GPU
(``examples/traces/h200-phases.jsonl.gz`` was recorded on an H200).

File format (gzip-compressed JSON lines, ``.jsonl.gz``):

* line 1, the header: ``{"format": "triscope-trace", "version": 1, "node": NAME, "start": T0,
  "end": T1, "labels": {...}, "series": [[SID, METRIC, LABELS, KIND], ...]}``;
* then one line per tick: ``{"t": TS, "v": [[SID, VALUE], ...]}`` (counters cumulative, as
  stored), in time order;
* then one line per event: ``{"e": {"ts", "kind", "severity", "message", "details"}}``.

Also here: the workload's phase log (JSON lines ``{"ts", "phase", "edge": "start"|"end", ...}``)
turned into ``phase`` events, and phase spans read back from stored events.
"""

from __future__ import annotations

import gzip
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from triscope.errors import UserError
from triscope.samples import EventRecord, Sample

FORMAT = "triscope-trace"
VERSION = 1
TICKS_PER_BATCH = 120


class TraceError(UserError):
    """A trace file that cannot be read (one clear line)."""


@dataclass
class TraceInfo:
    node: str
    start: float
    end: float
    series: int
    ticks: int
    events: int
    samples: int


# ---------------------------------------------------------------------- phases
def phase_events_from_log(path: Path | str) -> list[EventRecord]:
    """The workload's phase log as ``phase`` events (one per start and per end edge)."""
    out: list[EventRecord] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
            ts, phase, edge = float(rec["ts"]), str(rec["phase"]), str(rec.get("edge", "start"))
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"{path}:{n}: not a phase record ({e})") from None
        details = {k: v for k, v in rec.items() if k != "ts"}
        details.setdefault("edge", edge)
        out.append(EventRecord(kind="phase", message=f"phase {phase} {edge}", severity="info",
                               details=details, ts=ts))
    return out


def phase_spans(events: Iterable[Any]) -> dict[str, tuple[float, float]]:
    """``{phase: (start, end)}`` from stored phase events (EventRow or EventRecord), in start order."""
    starts: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for e in sorted(events, key=lambda e: e.ts):
        if e.kind != "phase":
            continue
        d = e.details or {}
        phase = d.get("phase")
        if not phase:
            continue
        if d.get("edge") == "end":
            s = float(d.get("start", starts.get(phase, e.ts)))
            spans[phase] = (s, float(d.get("end", e.ts)))
        else:
            starts[phase] = e.ts
    for phase, s in starts.items():  # a phase whose end edge never came: open until the next start
        if phase not in spans:
            later = [t for t in starts.values() if t > s]
            spans[phase] = (s, min(later) if later else s)
    return dict(sorted(spans.items(), key=lambda kv: kv[1][0]))


# ---------------------------------------------------------------------- export
def _num(v: float) -> float | int:
    """Integral values as JSON integers (shorter); everything else exactly (shortest repr)."""
    if v == v and abs(v) < 2**53 and v == int(v):
        return int(v)
    return v


def export_trace(store: Any, node: str, path: Path | str, *, start: float | None = None, end: float | None = None,
                 node_labels: dict[str, Any] | None = None, exclude_prefixes: Sequence[str] = ()) -> TraceInfo:
    """Write ``node``'s raw samples and events in [start, end] to ``path`` (gzip JSON lines)."""
    bounds = store.time_bounds(node)
    if bounds is None:
        raise TraceError(f"node {node!r} has no samples in {store.engine.url.render_as_string(hide_password=True)}")
    ev_start, ev_end = start, end  # without a range: every event of the node
    start = bounds[0] if start is None else start
    end = bounds[1] if end is None else end
    infos = [s for s in store.series(node=node) if not any(s.metric.startswith(p) for p in exclude_prefixes)]
    by_ts: dict[float, list[list[float | int]]] = defaultdict(list)
    series_rows: list[list[Any]] = []
    nsamples = 0
    for sid, info in enumerate(infos):
        sd = store.query_series(info, start, end, max_points=None, rate=False, tier="raw")
        if not sd.ts:
            continue
        series_rows.append([sid, info.metric, info.labels, info.kind])
        for t, v in zip(sd.ts, sd.values, strict=True):
            by_ts[t].append([sid, _num(v)])
            nsamples += 1
    events = store.events(node=node, start=ev_start, end=ev_end)
    if node_labels is None:
        node_labels = next((n.labels for n in store.nodes() if n.name == node), {})
    header = {"format": FORMAT, "version": VERSION, "node": node, "start": start, "end": end,
              "labels": node_labels or {}, "created": time.time(), "series": series_rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(header, separators=(",", ":")) + "\n")
        for t in sorted(by_ts):
            f.write(json.dumps({"t": t, "v": by_ts[t]}, separators=(",", ":")) + "\n")
        for e in events:
            f.write(json.dumps({"e": {"ts": e.ts, "kind": e.kind, "severity": e.severity, "message": e.message,
                                      "details": e.details}}, separators=(",", ":")) + "\n")
    return TraceInfo(node, start, end, len(series_rows), len(by_ts), len(events), nsamples)


# ---------------------------------------------------------------------- import
@dataclass
class Trace:
    header: dict[str, Any]
    ticks: list[tuple[float, list[tuple[int, float]]]]
    events: list[dict[str, Any]]


def _open(path: Path) -> IO[str]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_trace(path: Path | str) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    ticks: list[tuple[float, list[tuple[int, float]]]] = []
    events: list[dict[str, Any]] = []
    try:
        with _open(path) as f:
            first = f.readline()
            try:
                header = json.loads(first)
            except ValueError:
                raise TraceError(f"{path} is not a triscope trace (first line is not JSON)") from None
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise TraceError(f"{path} is not a triscope trace (no '{FORMAT}' header)")
            if int(header.get("version", 0)) > VERSION:
                raise TraceError(f"{path}: trace version {header.get('version')} is newer than this triscope "
                                 f"understands ({VERSION})")
            known = {int(s[0]) for s in header.get("series", [])}
            for n, line in enumerate(f, 2):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    if "t" in rec:
                        vals = [(int(sid), float(v)) for sid, v in rec["v"]]
                        bad = [sid for sid, _ in vals if sid not in known]
                        if bad:
                            raise ValueError(f"unknown series id {bad[0]}")
                        ticks.append((float(rec["t"]), vals))
                    elif "e" in rec:
                        e = rec["e"]
                        float(e["ts"])
                        str(e["kind"])
                        events.append(e)
                    else:
                        raise ValueError("neither a tick nor an event")
                except (ValueError, KeyError, TypeError) as err:
                    raise TraceError(f"{path}:{n}: bad trace line ({err})") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    return Trace(header, ticks, events)


def _shift_details(details: dict[str, Any], offset: float, lo: float, hi: float) -> dict[str, Any]:
    """Shift the timestamps phase events carry in their details (start/end/ts) along with the event."""
    out = dict(details)
    for k in ("start", "end", "ts"):
        v = out.get(k)
        if isinstance(v, (int, float)) and lo - 3600 <= v <= hi + 3600:
            out[k] = v + offset
    return out


def iter_ticks(trace: Trace, offset: float = 0.0) -> Iterator[Any]:
    from store.api import Tick

    series = {int(s[0]): (str(s[1]), dict(s[2]), str(s[3])) for s in trace.header["series"]}
    for t, vals in trace.ticks:
        samples = []
        for sid, v in vals:
            metric, labels, kind = series[sid]
            samples.append(Sample(metric, v, labels, "counter" if kind == "counter" else "gauge"))
        yield Tick(t + offset, samples, ())


def import_trace(store: Any, path: Path | str, *, node: str | None = None, shift_to_now: bool = False,
                 now: float | None = None) -> TraceInfo:
    """Load a trace into ``store`` under ``node`` (default: the node it was recorded on).

    ``shift_to_now`` moves every timestamp by the same offset so the trace ends now.  Loading the
    same trace twice (without shifting) adds nothing: samples are idempotent per (series, ts) and
    events already present (same ts, kind, message) are skipped.
    """
    trace = read_trace(path)
    node = node or str(trace.header.get("node") or "trace")
    start = float(trace.header.get("start") or (trace.ticks[0][0] if trace.ticks else 0.0))
    end = float(trace.header.get("end") or (trace.ticks[-1][0] if trace.ticks else start))
    offset = 0.0
    if shift_to_now:
        offset = (time.time() if now is None else now) - end
    batch: list[Any] = []
    nsamples = 0
    for tick in iter_ticks(trace, offset):
        batch.append(tick)
        nsamples += len(tick.samples)
        if len(batch) >= TICKS_PER_BATCH:
            store.write_ticks(node, batch)
            batch = []
    if batch:
        store.write_ticks(node, batch)
    labels = trace.header.get("labels") or {}
    if labels and hasattr(store, "set_node_labels"):
        store.set_node_labels(node, {**labels, "trace": Path(path).name})
    existing = {(round(e.ts, 6), e.kind, e.message)
                for e in store.events(node=node, start=start + offset - 1, end=end + offset + 1)}
    new: list[EventRecord] = []
    for e in trace.events:
        ts = float(e["ts"]) + offset
        key = (round(ts, 6), str(e["kind"]), str(e.get("message", "")))
        if key in existing:
            continue
        new.append(EventRecord(kind=str(e["kind"]), message=str(e.get("message", "")),
                               severity=e.get("severity", "info"),
                               details=_shift_details(e.get("details") or {}, offset, start, end), ts=ts))
    if new:
        store.add_events(node, new)
    return TraceInfo(node, start + offset, end + offset, len(trace.header["series"]), len(trace.ticks),
                     len(new), nsamples)


def import_for_demo(url: str, path: Path | str, node: str | None = None, now: float | None = None) -> str:
    """``make run``'s second node: load the trace shifted to end now, unless a copy loaded earlier is
    still within the last trace-length of time (then nothing is added).  Returns the node name."""
    from store import Store

    trace_node = node or str(read_trace(path).header.get("node") or "trace")
    st = Store.open(url)
    try:
        st.upgrade()
        now = time.time() if now is None else now
        tr = read_trace(path)
        span = float(tr.header.get("end", 0) or 0) - float(tr.header.get("start", 0) or 0)
        bounds = st.time_bounds(trace_node)
        if bounds is not None and bounds[1] >= now - max(span, 60.0):
            return trace_node
        import_trace(st, path, node=trace_node, shift_to_now=True, now=now)
        return trace_node
    finally:
        st.close()
